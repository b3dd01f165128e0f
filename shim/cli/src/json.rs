//! The few JSON values `rdmashim doctor --json` prints, written out by hand (RFC 8259): the
//! launcher has no dependency but libc.

use std::fmt;

/// A JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Num(u64),
    Str(String),
    Arr(Vec<Value>),
    /// Members in the order given.
    Obj(Vec<(&'static str, Value)>),
    /// Members in the order given, with names known only at run time.
    Map(Vec<(String, Value)>),
}

impl Value {
    pub fn str(s: impl Into<String>) -> Value {
        Value::Str(s.into())
    }

    /// `null` for `None`.
    pub fn opt<T>(v: Option<T>, f: impl FnOnce(T) -> Value) -> Value {
        v.map_or(Value::Null, f)
    }
}

fn write_str(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    f.write_str("\"")?;
    for c in s.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            c if u32::from(c) < 0x20 => write!(f, "\\u{:04x}", u32::from(c))?,
            c => write!(f, "{c}")?,
        }
    }
    f.write_str("\"")
}

fn write_members<'a>(
    f: &mut fmt::Formatter<'_>,
    m: impl Iterator<Item = (&'a str, &'a Value)>,
) -> fmt::Result {
    f.write_str("{")?;
    for (i, (k, x)) in m.enumerate() {
        if i > 0 {
            f.write_str(",")?;
        }
        write_str(f, k)?;
        write!(f, ":{x}")?;
    }
    f.write_str("}")
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Num(n) => write!(f, "{n}"),
            Value::Str(s) => write_str(f, s),
            Value::Arr(v) => {
                f.write_str("[")?;
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{x}")?;
                }
                f.write_str("]")
            }
            Value::Obj(m) => write_members(f, m.iter().map(|(k, v)| (*k, v))),
            Value::Map(m) => write_members(f, m.iter().map(|(k, v)| (k.as_str(), v))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Value::*;
    use super::*;

    #[test]
    fn writes_json() {
        let v = Obj(vec![
            ("a", Arr(vec![Num(1), Bool(false), Null])),
            ("s", Value::str("q\"b\\s\n\u{1}é")),
            ("e", Obj(vec![])),
            ("o", Value::opt(None::<u64>, Num)),
            ("m", Map(vec![("k\"".into(), Num(2))])),
        ]);
        assert_eq!(
            v.to_string(),
            r#"{"a":[1,false,null],"s":"q\"b\\s\n\u0001é","e":{},"o":null,"m":{"k\"":2}}"#
        );
    }
}
