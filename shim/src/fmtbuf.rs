//! A fixed-size formatting buffer: `core::fmt` into a caller-provided array, never allocating.
//! Used by logging (a stack buffer per message) and the stats writer.

use core::fmt;

/// Formats into `N` bytes on the stack; output beyond that is dropped and `overflowed` is set.
pub struct FixedBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
    overflowed: bool,
}

impl<const N: usize> Default for FixedBuf<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> FixedBuf<N> {
    pub const fn new() -> Self {
        Self {
            buf: [0; N],
            len: 0,
            overflowed: false,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether some output did not fit.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    pub fn clear(&mut self) {
        self.len = 0;
        self.overflowed = false;
    }

    /// Appends raw bytes, truncating at capacity.
    pub fn push_bytes(&mut self, b: &[u8]) {
        let room = N.saturating_sub(self.len);
        let n = b.len().min(room);
        if let (Some(dst), Some(src)) = (self.buf.get_mut(self.len..self.len + n), b.get(..n)) {
            dst.copy_from_slice(src);
            self.len += n;
        }
        if n < b.len() {
            self.overflowed = true;
        }
    }

    /// The contents followed by a NUL, for passing to C; `None` if there is no room for the NUL.
    pub fn as_c_bytes(&mut self) -> Option<&[u8]> {
        if self.len >= N {
            return None;
        }
        *self.buf.get_mut(self.len)? = 0;
        self.buf.get(..=self.len)
    }
}

impl<const N: usize> fmt::Write for FixedBuf<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_bytes(s.as_bytes());
        // Never report an error: a truncated log line is better than none, and the stats writer
        // checks `overflowed()`.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write;

    #[test]
    fn truncates() {
        let mut b = FixedBuf::<8>::new();
        write!(b, "{}-{}", 1234, 56789).unwrap();
        assert_eq!(b.as_bytes(), b"1234-567");
        assert!(b.overflowed());
        assert!(b.as_c_bytes().is_none());
        let mut c = FixedBuf::<8>::new();
        write!(c, "ab{}", 1).unwrap();
        assert_eq!(c.as_c_bytes().unwrap(), b"ab1\0");
        assert!(!c.overflowed());
    }
}
