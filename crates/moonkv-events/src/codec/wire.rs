//! The small subset of MessagePack the event stream uses, written and read by hand.
//!
//! The writer always picks the smallest encoding (as msgpack-c and Python `msgpack` do), which
//! is what makes the golden vectors byte-exact. The reader works on a borrowed slice, never
//! recurses, and never sizes an allocation from a length header: every length is checked
//! against the bytes that remain before anything is reserved.

use crate::error::DecodeError;

pub(crate) const NIL: u8 = 0xc0;
const FALSE: u8 = 0xc2;
const TRUE: u8 = 0xc3;

/// Appends an unsigned integer in its smallest MessagePack form.
pub(crate) fn write_uint(out: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        out.push(v as u8);
    } else if v <= u64::from(u8::MAX) {
        out.extend_from_slice(&[0xcc, v as u8]);
    } else if v <= u64::from(u16::MAX) {
        out.push(0xcd);
        out.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v <= u64::from(u32::MAX) {
        out.push(0xce);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// Appends a signed integer; non-negative values use the unsigned forms, as msgpack-c does.
pub(crate) fn write_int(out: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        write_uint(out, v as u64);
    } else if v >= -32 {
        out.push(v as i8 as u8);
    } else if v >= i64::from(i8::MIN) {
        out.extend_from_slice(&[0xd0, v as i8 as u8]);
    } else if v >= i64::from(i16::MIN) {
        out.push(0xd1);
        out.extend_from_slice(&(v as i16).to_be_bytes());
    } else if v >= i64::from(i32::MIN) {
        out.push(0xd2);
        out.extend_from_slice(&(v as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// Appends a UTF-8 string. Lengths above `u32::MAX` cannot be represented in MessagePack;
/// callers (the master) bound key and name lengths far below that.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    let len = s.len();
    if len < 32 {
        out.push(0xa0 | len as u8);
    } else if len <= usize::from(u8::MAX) {
        out.extend_from_slice(&[0xd9, len as u8]);
    } else if len <= usize::from(u16::MAX) {
        out.push(0xda);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        debug_assert!(
            u32::try_from(len).is_ok(),
            "string longer than msgpack allows"
        );
        out.push(0xdb);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
}

/// Appends a string or nil.
pub(crate) fn write_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => write_str(out, s),
        None => out.push(NIL),
    }
}

/// Appends an array header.
pub(crate) fn write_array_len(out: &mut Vec<u8>, len: u32) {
    if len < 16 {
        out.push(0x90 | len as u8);
    } else if len <= u32::from(u16::MAX) {
        out.push(0xdc);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&len.to_be_bytes());
    }
}

/// Appends a map header.
pub(crate) fn write_map_len(out: &mut Vec<u8>, len: u32) {
    if len < 16 {
        out.push(0x80 | len as u8);
    } else if len <= u32::from(u16::MAX) {
        out.push(0xde);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdf);
        out.extend_from_slice(&len.to_be_bytes());
    }
}

/// One decoded scalar or container header.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Token<'a> {
    Nil,
    Bool(bool),
    Uint(u64),
    Int(i64),
    Float(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(u32),
    Map(u32),
    Ext,
}

impl Token<'_> {
    /// A short name for error messages.
    pub(crate) fn kind_name(&self) -> &'static str {
        match self {
            Token::Nil => "nil",
            Token::Bool(_) => "bool",
            Token::Uint(_) | Token::Int(_) => "integer",
            Token::Float(_) => "float",
            Token::Str(_) => "string",
            Token::Bin(_) => "binary",
            Token::Array(_) => "array",
            Token::Map(_) => "map",
            Token::Ext => "extension",
        }
    }
}

/// A forward-only cursor over a MessagePack buffer.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not yet consumed.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated);
        }
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn len8(&mut self) -> Result<usize, DecodeError> {
        Ok(usize::from(self.byte()?))
    }

    fn len16(&mut self) -> Result<usize, DecodeError> {
        Ok(usize::from(u16::from_be_bytes(self.be()?)))
    }

    fn len32(&mut self) -> Result<usize, DecodeError> {
        Ok(u32::from_be_bytes(self.be()?) as usize)
    }

    /// Container lengths: each element needs at least one byte, so a header that promises
    /// more elements than bytes remain is rejected before anyone allocates for it.
    fn container(
        &mut self,
        len: usize,
        per_item: usize,
        map: bool,
    ) -> Result<Token<'a>, DecodeError> {
        if len.saturating_mul(per_item) > self.remaining() {
            return Err(DecodeError::LengthOverrun {
                declared: len as u64,
            });
        }
        let len = len as u32;
        Ok(if map {
            Token::Map(len)
        } else {
            Token::Array(len)
        })
    }

    /// Reads the next token; containers yield only their header.
    pub(crate) fn next(&mut self) -> Result<Token<'a>, DecodeError> {
        let marker = self.byte()?;
        Ok(match marker {
            0x00..=0x7f => Token::Uint(u64::from(marker)),
            0x80..=0x8f => return self.container(usize::from(marker & 0x0f), 2, true),
            0x90..=0x9f => return self.container(usize::from(marker & 0x0f), 1, false),
            0xa0..=0xbf => Token::Str(self.take(usize::from(marker & 0x1f))?),
            NIL => Token::Nil,
            0xc1 => return Err(DecodeError::InvalidMarker(marker)),
            FALSE => Token::Bool(false),
            TRUE => Token::Bool(true),
            0xc4 => {
                let n = self.len8()?;
                Token::Bin(self.take(n)?)
            }
            0xc5 => {
                let n = self.len16()?;
                Token::Bin(self.take(n)?)
            }
            0xc6 => {
                let n = self.len32()?;
                Token::Bin(self.take(n)?)
            }
            0xc7 => self.skip_ext(1, None)?,
            0xc8 => self.skip_ext(2, None)?,
            0xc9 => self.skip_ext(4, None)?,
            0xca => Token::Float(f64::from(f32::from_be_bytes(self.be()?))),
            0xcb => Token::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Token::Uint(u64::from(self.byte()?)),
            0xcd => Token::Uint(u64::from(u16::from_be_bytes(self.be()?))),
            0xce => Token::Uint(u64::from(u32::from_be_bytes(self.be()?))),
            0xcf => Token::Uint(u64::from_be_bytes(self.be()?)),
            0xd0 => Token::Int(i64::from(self.byte()? as i8)),
            0xd1 => Token::Int(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => Token::Int(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => Token::Int(i64::from_be_bytes(self.be()?)),
            0xd4 => self.skip_ext(0, Some(1))?,
            0xd5 => self.skip_ext(0, Some(2))?,
            0xd6 => self.skip_ext(0, Some(4))?,
            0xd7 => self.skip_ext(0, Some(8))?,
            0xd8 => self.skip_ext(0, Some(16))?,
            0xd9 => {
                let n = self.len8()?;
                Token::Str(self.take(n)?)
            }
            0xda => {
                let n = self.len16()?;
                Token::Str(self.take(n)?)
            }
            0xdb => {
                let n = self.len32()?;
                Token::Str(self.take(n)?)
            }
            0xdc => {
                let n = self.len16()?;
                return self.container(n, 1, false);
            }
            0xdd => {
                let n = self.len32()?;
                return self.container(n, 1, false);
            }
            0xde => {
                let n = self.len16()?;
                return self.container(n, 2, true);
            }
            0xdf => {
                let n = self.len32()?;
                return self.container(n, 2, true);
            }
            0xe0..=0xff => Token::Int(i64::from(marker as i8)),
        })
    }

    fn skip_ext(
        &mut self,
        len_bytes: usize,
        fixed: Option<usize>,
    ) -> Result<Token<'a>, DecodeError> {
        let n = match (fixed, len_bytes) {
            (Some(n), _) => n,
            (None, 1) => self.len8()?,
            (None, 2) => self.len16()?,
            (None, _) => self.len32()?,
        };
        self.take(1 + n)?; // type byte + data
        Ok(Token::Ext)
    }

    /// Skips one complete value of any shape, iteratively, so hostile nesting cannot
    /// exhaust the stack.
    #[cfg(test)]
    pub(crate) fn skip_value(&mut self) -> Result<(), DecodeError> {
        let token = self.next()?;
        self.skip_contents(token)
    }

    /// Skips the elements of a container whose header `token` was just read (a no-op for
    /// scalars).
    pub(crate) fn skip_contents(&mut self, token: Token<'_>) -> Result<(), DecodeError> {
        let mut pending: u64 = match token {
            Token::Array(n) => u64::from(n),
            Token::Map(n) => 2 * u64::from(n),
            _ => return Ok(()),
        };
        while pending > 0 {
            pending -= 1;
            match self.next()? {
                Token::Array(n) => pending += u64::from(n),
                Token::Map(n) => pending += 2 * u64::from(n),
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uint_bytes(v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        write_uint(&mut out, v);
        out
    }

    #[test]
    fn uint_uses_smallest_form_at_every_boundary() {
        assert_eq!(uint_bytes(0), [0x00]);
        assert_eq!(uint_bytes(127), [0x7f]);
        assert_eq!(uint_bytes(128), [0xcc, 0x80]);
        assert_eq!(uint_bytes(255), [0xcc, 0xff]);
        assert_eq!(uint_bytes(256), [0xcd, 0x01, 0x00]);
        assert_eq!(uint_bytes(65_535), [0xcd, 0xff, 0xff]);
        assert_eq!(uint_bytes(65_536), [0xce, 0, 1, 0, 0]);
        assert_eq!(
            uint_bytes(u64::from(u32::MAX)),
            [0xce, 0xff, 0xff, 0xff, 0xff]
        );
        assert_eq!(uint_bytes(1 << 32), [0xcf, 0, 0, 0, 1, 0, 0, 0, 0]);
    }

    #[test]
    fn negative_ints_use_signed_forms() {
        let cases: [(i64, &[u8]); 6] = [
            (-1, &[0xff]),
            (-32, &[0xe0]),
            (-33, &[0xd0, 0xdf]),
            (-129, &[0xd1, 0xff, 0x7f]),
            (-32_769, &[0xd2, 0xff, 0xff, 0x7f, 0xff]),
            (i64::MIN, &[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0]),
        ];
        for (v, want) in cases {
            let mut out = Vec::new();
            write_int(&mut out, v);
            assert_eq!(out, want, "{v}");
            assert_eq!(Reader::new(&out).next(), Ok(Token::Int(v)));
        }
    }

    #[test]
    fn strings_switch_headers_at_32_256_and_65536() {
        for (len, header) in [(31usize, 1usize), (32, 2), (255, 2), (256, 3), (65_536, 5)] {
            let s = "x".repeat(len);
            let mut out = Vec::new();
            write_str(&mut out, &s);
            assert_eq!(out.len(), len + header, "len {len}");
            assert_eq!(Reader::new(&out).next(), Ok(Token::Str(s.as_bytes())));
        }
    }

    #[test]
    fn containers_round_trip_and_headers_are_bounded_by_input() {
        let mut out = Vec::new();
        write_array_len(&mut out, 16);
        out.extend_from_slice(&[0xc0; 16]);
        assert_eq!(Reader::new(&out).next(), Ok(Token::Array(16)));
        let mut r = Reader::new(&out);
        assert_eq!(r.skip_value(), Ok(()));
        assert_eq!(r.remaining(), 0);

        // array32 claiming four billion elements in a 5-byte buffer
        let hostile = [0xdd, 0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            Reader::new(&hostile).next(),
            Err(DecodeError::LengthOverrun { .. })
        ));
        let hostile_map = [0xdf, 0x00, 0x00, 0x00, 0x02, 0xc0, 0xc0, 0xc0];
        assert!(matches!(
            Reader::new(&hostile_map).next(),
            Err(DecodeError::LengthOverrun { .. })
        ));
    }

    #[test]
    fn deep_nesting_is_skipped_without_recursion() {
        let mut deep = vec![0x91; 1_000_000];
        deep.push(0xc0);
        let mut r = Reader::new(&deep);
        assert_eq!(r.skip_value(), Ok(()));
        let truncated = vec![0x91; 1000];
        // the innermost header promises an element no byte is left for
        assert!(matches!(
            Reader::new(&truncated).skip_value(),
            Err(DecodeError::LengthOverrun { declared: 1 })
        ));
    }

    #[test]
    fn ext_and_bin_values_are_skippable() {
        let buf = [
            0xd4, 0x01, 0x02, 0xc7, 0x02, 0x05, 0xaa, 0xbb, 0xc4, 0x01, 0x09, 0xcb, 0, 0, 0, 0, 0,
            0, 0, 0,
        ];
        let mut r = Reader::new(&buf);
        for _ in 0..4 {
            r.skip_value().expect("valid input");
        }
        assert_eq!(r.remaining(), 0);
        assert_eq!(
            Reader::new(&[0xc1]).next(),
            Err(DecodeError::InvalidMarker(0xc1))
        );
    }
}
