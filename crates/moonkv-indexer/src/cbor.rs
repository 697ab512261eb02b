//! The canonical CBOR subset vLLM's block hash reads: unsigned and negative integers, byte and
//! text strings, arrays, null and booleans, each with the shortest head (RFC 8949 §4.2.1, which
//! is what `cbor2.dumps(..., canonical=True)` writes for these types).
//!
//! Why by hand and not through a CBOR crate: a 32 k-token query hashes about two thousand
//! blocks, each a tuple `(parent digest, token ids, extra keys)`. Writing the heads straight
//! into the SHA-256 state keeps that path free of allocation and serde traversal; the whole
//! subset is one head encoder and five item kinds. The tests check it byte for byte against
//! `ciborium`, and `tests/python` against `cbor2` itself.

use sha2::{Digest, Sha256};

/// Where encoded bytes go: a hash state, or a buffer in tests.
pub trait Sink {
    /// Appends `bytes`.
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Sha256 {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

const UINT: u8 = 0;
const NEGINT: u8 = 1;
const BYTES: u8 = 2;
const TEXT: u8 = 3;
const ARRAY: u8 = 4;

/// Writes a head: major type and argument, in the shortest form.
fn head(out: &mut impl Sink, major: u8, value: u64) {
    let m = major << 5;
    if value < 24 {
        out.put(&[m | value as u8]);
    } else if value <= u64::from(u8::MAX) {
        out.put(&[m | 24, value as u8]);
    } else if value <= u64::from(u16::MAX) {
        let b = (value as u16).to_be_bytes();
        out.put(&[m | 25, b[0], b[1]]);
    } else if value <= u64::from(u32::MAX) {
        let b = (value as u32).to_be_bytes();
        out.put(&[m | 26, b[0], b[1], b[2], b[3]]);
    } else {
        let mut buf = [0u8; 9];
        buf[0] = m | 27;
        buf[1..].copy_from_slice(&value.to_be_bytes());
        out.put(&buf);
    }
}

/// An unsigned integer.
pub fn uint(out: &mut impl Sink, value: u64) {
    head(out, UINT, value);
}

/// A signed integer (negative values use major type 1, argument `-1 - value`).
pub fn int(out: &mut impl Sink, value: i64) {
    if value >= 0 {
        head(out, UINT, value as u64);
    } else {
        head(out, NEGINT, !(value as u64));
    }
}

/// A byte string.
pub fn bytes(out: &mut impl Sink, value: &[u8]) {
    head(out, BYTES, value.len() as u64);
    out.put(value);
}

/// A text string.
pub fn text(out: &mut impl Sink, value: &str) {
    head(out, TEXT, value.len() as u64);
    out.put(value.as_bytes());
}

/// The head of an array of `len` items; the items follow.
pub fn array(out: &mut impl Sink, len: usize) {
    head(out, ARRAY, len as u64);
}

/// `null` (Python `None`).
pub fn null(out: &mut impl Sink) {
    out.put(&[0xf6]);
}

/// `true` or `false`.
pub fn boolean(out: &mut impl Sink, value: bool) {
    out.put(&[if value { 0xf5 } else { 0xf4 }]);
}

/// An array of token ids, as Python writes a tuple of ints.
pub fn token_array(out: &mut impl Sink, tokens: &[u32]) {
    array(out, tokens.len());
    // Group small heads into one update: most token ids take three bytes.
    let mut buf = [0u8; 5 * 32];
    for chunk in tokens.chunks(32) {
        let mut n = 0;
        for &t in chunk {
            n += write_uint_into(&mut buf[n..], t);
        }
        out.put(&buf[..n]);
    }
}

/// Writes the shortest unsigned head for a 32-bit value into `buf`; returns its length.
fn write_uint_into(buf: &mut [u8], value: u32) -> usize {
    if value < 24 {
        buf[0] = value as u8;
        1
    } else if value <= 0xff {
        buf[0] = 24;
        buf[1] = value as u8;
        2
    } else if value <= 0xffff {
        buf[0] = 25;
        buf[1..3].copy_from_slice(&(value as u16).to_be_bytes());
        3
    } else {
        buf[0] = 26;
        buf[1..5].copy_from_slice(&value.to_be_bytes());
        5
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_bytes::Bytes;

    fn ciborium_bytes<T: serde::Serialize>(value: &T) -> Vec<u8> {
        let mut out = Vec::new();
        ciborium::into_writer(value, &mut out).unwrap();
        out
    }

    #[test]
    fn known_heads() {
        let mut v = Vec::new();
        for x in [
            0u64,
            23,
            24,
            255,
            256,
            65_535,
            65_536,
            u64::from(u32::MAX) + 1,
        ] {
            uint(&mut v, x);
        }
        assert_eq!(
            v,
            [
                &[0x00][..],
                &[0x17],
                &[0x18, 24],
                &[0x18, 0xff],
                &[0x19, 1, 0],
                &[0x19, 0xff, 0xff],
                &[0x1a, 0, 1, 0, 0],
                &[0x1b, 0, 0, 0, 1, 0, 0, 0, 0],
            ]
            .concat()
        );
        let mut v = Vec::new();
        int(&mut v, -1);
        int(&mut v, -25);
        text(&mut v, "a");
        null(&mut v);
        boolean(&mut v, true);
        assert_eq!(v, [0x20, 0x38, 24, 0x61, b'a', 0xf6, 0xf5]);
    }

    proptest! {
        #[test]
        fn token_arrays_match_ciborium(tokens in proptest::collection::vec(any::<u32>(), 0..300)) {
            let mut ours = Vec::new();
            token_array(&mut ours, &tokens);
            prop_assert_eq!(ours, ciborium_bytes(&tokens));
        }

        #[test]
        fn block_tuples_match_ciborium(
            parent in proptest::array::uniform32(any::<u8>()),
            tokens in proptest::collection::vec(0u32..200_000, 0..64),
            extras in proptest::option::of(proptest::collection::vec("[a-z0-9é]{0,30}", 1..3)),
            n in any::<i64>(),
        ) {
            let mut ours = Vec::new();
            array(&mut ours, 3);
            bytes(&mut ours, &parent);
            token_array(&mut ours, &tokens);
            match &extras {
                None => null(&mut ours),
                Some(keys) => {
                    array(&mut ours, keys.len() + 1);
                    for k in keys { text(&mut ours, k); }
                    int(&mut ours, n);
                }
            }
            let extra_value = extras.as_ref().map(|keys| {
                let mut items: Vec<ciborium::Value> =
                    keys.iter().map(|k| ciborium::Value::Text(k.clone())).collect();
                items.push(ciborium::Value::Integer(n.into()));
                ciborium::Value::Array(items)
            });
            let theirs = ciborium_bytes(&(Bytes::new(&parent), &tokens, extra_value));
            prop_assert_eq!(ours, theirs);
        }
    }
}
