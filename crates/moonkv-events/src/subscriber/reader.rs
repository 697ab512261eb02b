//! A bounded, forward-only MessagePack tokenizer over a borrowed payload, on `rmp::decode`.
//!
//! rmp reads the markers, lengths and numbers. What it leaves to the caller is kept here:
//! strings are borrowed rather than copied, a container header that promises more elements
//! than bytes remain is rejected before anyone allocates for it, and skipping never recurses,
//! so hostile nesting cannot exhaust the stack. Each token is one peeked marker and one rmp
//! call, so the decoder can accept whatever type a field happens to arrive in.

use rmp::decode;
use rmp::Marker;

use crate::error::DecodeError;

/// rmp's `TypeMismatch` cannot happen here, as every call follows a peek at the marker it
/// expects, and neither can `OutOfRange`, as unsigned markers are read as `u64` and signed
/// ones as `i64`. What remains is running out of bytes.
fn ran_out<E>(_: E) -> DecodeError {
    DecodeError::Truncated
}

/// One decoded scalar or container header.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Token<'a> {
    Nil,
    Bool(bool),
    Uint(u64),
    /// From a signed marker, whatever its value.
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
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { rest: buf }
    }

    /// Bytes not yet consumed.
    pub(crate) fn remaining(&self) -> usize {
        self.rest.len()
    }

    fn take(&mut self, n: u32) -> Result<&'a [u8], DecodeError> {
        let n = usize::try_from(n).map_err(|_| DecodeError::Truncated)?;
        if self.rest.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (bytes, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(bytes)
    }

    /// Every element needs at least one byte (two per map entry), so a header that
    /// promises more than remain is rejected here.
    fn bounded(&self, len: u32, per_item: u64) -> Result<u32, DecodeError> {
        if u64::from(len) * per_item > self.rest.len() as u64 {
            return Err(DecodeError::LengthOverrun {
                declared: u64::from(len),
            });
        }
        Ok(len)
    }

    /// Reads the next token; containers yield only their header.
    pub(crate) fn next(&mut self) -> Result<Token<'a>, DecodeError> {
        let &first = self.rest.first().ok_or(DecodeError::Truncated)?;
        let rd = &mut self.rest;
        Ok(match Marker::from_u8(first) {
            Marker::Reserved => return Err(DecodeError::InvalidMarker(first)),
            Marker::Null => {
                decode::read_nil(rd).map_err(ran_out)?;
                Token::Nil
            }
            Marker::True | Marker::False => Token::Bool(decode::read_bool(rd).map_err(ran_out)?),
            Marker::FixPos(_) | Marker::U8 | Marker::U16 | Marker::U32 | Marker::U64 => {
                Token::Uint(decode::read_int(rd).map_err(ran_out)?)
            }
            Marker::FixNeg(_) | Marker::I8 | Marker::I16 | Marker::I32 | Marker::I64 => {
                Token::Int(decode::read_int(rd).map_err(ran_out)?)
            }
            Marker::F32 => Token::Float(f64::from(decode::read_f32(rd).map_err(ran_out)?)),
            Marker::F64 => Token::Float(decode::read_f64(rd).map_err(ran_out)?),
            Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                let len = decode::read_str_len(rd).map_err(ran_out)?;
                Token::Str(self.take(len)?)
            }
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => {
                let len = decode::read_bin_len(rd).map_err(ran_out)?;
                Token::Bin(self.take(len)?)
            }
            Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
                let len = decode::read_array_len(rd).map_err(ran_out)?;
                Token::Array(self.bounded(len, 1)?)
            }
            Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
                let len = decode::read_map_len(rd).map_err(ran_out)?;
                Token::Map(self.bounded(len, 2)?)
            }
            Marker::FixExt1
            | Marker::FixExt2
            | Marker::FixExt4
            | Marker::FixExt8
            | Marker::FixExt16
            | Marker::Ext8
            | Marker::Ext16
            | Marker::Ext32 => {
                // the meta read covers the type byte too; only the data remains
                let meta = decode::read_ext_meta(rd).map_err(ran_out)?;
                self.take(meta.size)?;
                Token::Ext
            }
        })
    }

    /// Skips one complete value of any shape.
    #[cfg(test)]
    pub(crate) fn skip_value(&mut self) -> Result<(), DecodeError> {
        let token = self.next()?;
        self.skip_contents(token)
    }

    /// Skips the elements of a container whose header `token` was just read (a no-op for
    /// scalars), counting pending elements instead of recursing.
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

    fn one(bytes: &[u8]) -> Result<Token<'_>, DecodeError> {
        let mut r = Reader::new(bytes);
        let token = r.next();
        if token.is_ok() {
            assert_eq!(r.remaining(), 0, "{bytes:02x?} not consumed whole");
        }
        token
    }

    #[test]
    fn every_integer_width_reads_back() {
        let cases: [(&[u8], Token); 12] = [
            (&[0x7f], Token::Uint(127)),
            (&[0xcc, 0x80], Token::Uint(128)),
            (&[0xcd, 0x01, 0x00], Token::Uint(256)),
            (&[0xce, 0, 1, 0, 0], Token::Uint(65_536)),
            (
                &[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
                Token::Uint(u64::MAX),
            ),
            (&[0xff], Token::Int(-1)),
            (&[0xe0], Token::Int(-32)),
            (&[0xd0, 0xdf], Token::Int(-33)),
            (&[0xd1, 0xff, 0x7f], Token::Int(-129)),
            (&[0xd2, 0xff, 0xff, 0x7f, 0xff], Token::Int(-32_769)),
            (&[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0], Token::Int(i64::MIN)),
            // a signed marker stays signed, whatever the value
            (&[0xd0, 0x05], Token::Int(5)),
        ];
        for (bytes, want) in cases {
            assert_eq!(one(bytes), Ok(want), "{bytes:02x?}");
        }
    }

    #[test]
    fn scalars_strings_and_binaries() {
        assert_eq!(one(&[0xc0]), Ok(Token::Nil));
        assert_eq!(one(&[0xc2]), Ok(Token::Bool(false)));
        assert_eq!(one(&[0xc3]), Ok(Token::Bool(true)));
        assert_eq!(one(&[0xca, 0x3f, 0xc0, 0, 0]), Ok(Token::Float(1.5)));
        assert_eq!(
            one(&[0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0]),
            Ok(Token::Float(1.5))
        );
        assert_eq!(one(&[0xa2, b'h', b'i']), Ok(Token::Str(b"hi")));
        assert_eq!(one(&[0xd9, 1, b'x']), Ok(Token::Str(b"x")));
        assert_eq!(one(&[0xda, 0, 1, b'x']), Ok(Token::Str(b"x")));
        assert_eq!(one(&[0xdb, 0, 0, 0, 1, b'x']), Ok(Token::Str(b"x")));
        assert_eq!(one(&[0xc4, 1, 9]), Ok(Token::Bin(&[9])));
        assert_eq!(one(&[0xc5, 0, 1, 9]), Ok(Token::Bin(&[9])));
        assert_eq!(one(&[0xc6, 0, 0, 0, 1, 9]), Ok(Token::Bin(&[9])));
    }

    #[test]
    fn every_ext_form_is_consumed_whole() {
        let cases: [&[u8]; 8] = [
            &[0xd4, 0x01, 0xaa],
            &[0xd5, 0x01, 0xaa, 0xbb],
            &[0xd6, 0x01, 1, 2, 3, 4],
            &[0xd7, 0x01, 1, 2, 3, 4, 5, 6, 7, 8],
            &[
                0xd8, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
            ],
            &[0xc7, 0x02, 0x05, 0xaa, 0xbb],
            &[0xc8, 0x00, 0x01, 0x05, 0xaa],
            &[0xc9, 0x00, 0x00, 0x00, 0x01, 0x05, 0xaa],
        ];
        for bytes in cases {
            assert_eq!(one(bytes), Ok(Token::Ext), "{bytes:02x?}");
            assert_eq!(one(&bytes[..bytes.len() - 1]), Err(DecodeError::Truncated));
        }
    }

    #[test]
    fn every_truncated_scalar_is_an_error() {
        let whole: [&[u8]; 8] = [
            &[0xcd, 0x01, 0x00],
            &[0xcf, 0, 0, 0, 0, 0, 0, 0, 1],
            &[0xd2, 0xff, 0xff, 0x7f, 0xff],
            &[0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0],
            &[0xa2, b'h', b'i'],
            &[0xda, 0, 1, b'x'],
            &[0xc5, 0, 1, 9],
            &[0xdc, 0, 1, 0xc0],
        ];
        for bytes in whole {
            for cut in 0..bytes.len() {
                let mut r = Reader::new(&bytes[..cut]);
                let got = r.skip_value();
                assert!(got.is_err(), "{:02x?} cut at {cut}", bytes);
            }
        }
        assert_eq!(one(&[]), Err(DecodeError::Truncated));
    }

    #[test]
    fn containers_round_trip_and_headers_are_bounded_by_input() {
        let mut out = vec![0xdc, 0x00, 0x10];
        out.extend_from_slice(&[0xc0; 16]);
        assert_eq!(Reader::new(&out).next(), Ok(Token::Array(16)));
        let mut r = Reader::new(&out);
        assert_eq!(r.skip_value(), Ok(()));
        assert_eq!(r.remaining(), 0);

        // array32 claiming four billion elements in a 5-byte buffer
        let hostile = [0xdd, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(
            Reader::new(&hostile).next(),
            Err(DecodeError::LengthOverrun {
                declared: u64::from(u32::MAX)
            })
        );
        // two pairs need at least four bytes; three remain
        let hostile_map = [0xdf, 0x00, 0x00, 0x00, 0x02, 0xc0, 0xc0, 0xc0];
        assert_eq!(
            Reader::new(&hostile_map).next(),
            Err(DecodeError::LengthOverrun { declared: 2 })
        );
        let exact_map = [0x82, 0xc0, 0xc0, 0xc0, 0xc0];
        assert_eq!(Reader::new(&exact_map).next(), Ok(Token::Map(2)));
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
