//! Big-endian field access for the wire formats.
//!
//! Every multi-byte integer on the wire is big-endian (network order). Host types never hold
//! wire bytes: encoders write through [`Writer`], decoders read through [`Reader`], and both only
//! ever see fixed offsets, so a short or hostile input can produce an error but never a panic.

use crate::error::DecodeError;

/// Bounds-checked big-endian reader over a byte slice.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let end = self.pos.checked_add(N).ok_or(DecodeError::Truncated {
            need: usize::MAX,
            got: self.buf.len(),
        })?;
        let bytes = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated {
            need: end,
            got: self.buf.len(),
        })?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        self.pos = end;
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.take()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take()?))
    }

    pub(crate) fn bytes4(&mut self) -> Result<[u8; 4], DecodeError> {
        self.take()
    }

    /// Reads a reserved field of `n` bytes, which must be zero.
    pub(crate) fn reserved(&mut self, n: usize) -> Result<(), DecodeError> {
        for _ in 0..n {
            let offset = self.pos;
            if self.u8()? != 0 {
                return Err(DecodeError::ReservedNonZero { offset });
            }
        }
        Ok(())
    }
}

/// Big-endian writer into a fixed-size array; offsets are compile-time layouts, so running past
/// the end is a bug in this crate (caught by the round-trip tests), not a property of the input.
pub(crate) struct Writer<const N: usize> {
    buf: [u8; N],
    pos: usize,
}

impl<const N: usize> Writer<N> {
    pub(crate) fn new() -> Self {
        Writer {
            buf: [0u8; N],
            pos: 0,
        }
    }

    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.pos..self.pos + bytes.len()].copy_from_slice(bytes);
        self.pos += bytes.len();
    }

    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.put(&[v]);
        self
    }

    pub(crate) fn u16(&mut self, v: u16) -> &mut Self {
        self.put(&v.to_be_bytes());
        self
    }

    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.put(&v.to_be_bytes());
        self
    }

    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.put(&v.to_be_bytes());
        self
    }

    pub(crate) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.put(v);
        self
    }

    pub(crate) fn zeros(&mut self, n: usize) -> &mut Self {
        self.pos += n;
        self
    }

    /// Returns the buffer; `len` is how far the writer got (the rest is zero).
    pub(crate) fn finish(&self) -> ([u8; N], usize) {
        (self.buf, self.pos)
    }
}

/// Checks the padding rule shared by every decoder: a message has a fixed length for its
/// (version, kind); the input may be longer (rdma_cm hands over its whole private-data area), but
/// every byte past the message must be zero.
pub(crate) fn check_padding(input: &[u8], msg_len: usize) -> Result<(), DecodeError> {
    match input.get(msg_len..) {
        None => Err(DecodeError::Truncated {
            need: msg_len,
            got: input.len(),
        }),
        Some(tail) => match tail.iter().position(|&b| b != 0) {
            Some(i) => Err(DecodeError::TrailingBytes {
                offset: msg_len + i,
            }),
            None => Ok(()),
        },
    }
}
