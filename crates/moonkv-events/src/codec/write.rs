//! The encoder's view of `rmp::encode`: the handful of values the event stream writes.
//!
//! rmp picks the smallest form for every integer, string and container header, as msgpack-c
//! and Python `msgpack` do; that shared choice is what keeps the golden vectors byte-exact.
//! Writing into a `ByteBuf` cannot fail, and rmp's error type for it is uninhabited, so
//! these wrappers discard nothing.

use std::convert::Infallible;

use rmp::encode::{self, ByteBuf, ValueWriteError};

fn written<T>(result: Result<T, ValueWriteError<Infallible>>) {
    match result {
        Ok(_) => {}
        Err(
            ValueWriteError::InvalidMarkerWrite(never) | ValueWriteError::InvalidDataWrite(never),
        ) => match never {},
    }
}

pub(crate) fn nil(out: &mut ByteBuf) {
    match encode::write_nil(out) {
        Ok(()) => {}
        Err(never) => match never {},
    }
}

pub(crate) fn uint(out: &mut ByteBuf, v: u64) {
    written(encode::write_uint(out, v));
}

/// Non-negative values take the unsigned forms, as msgpack-c does.
pub(crate) fn sint(out: &mut ByteBuf, v: i64) {
    written(encode::write_sint(out, v));
}

/// rmp truncates a length above `u32::MAX` silently; callers (the master) bound key and
/// name lengths far below that.
pub(crate) fn str(out: &mut ByteBuf, s: &str) {
    debug_assert!(
        u32::try_from(s.len()).is_ok(),
        "string longer than msgpack allows"
    );
    written(encode::write_str(out, s));
}

pub(crate) fn opt_str(out: &mut ByteBuf, s: Option<&str>) {
    match s {
        Some(s) => str(out, s),
        None => nil(out),
    }
}

pub(crate) fn array_len(out: &mut ByteBuf, len: u32) {
    written(encode::write_array_len(out, len));
}

pub(crate) fn map_len(out: &mut ByteBuf, len: u32) {
    written(encode::write_map_len(out, len));
}

/// Runs `f` on `out` as an rmp buffer; the bytes stay in `out`, nothing is copied.
pub(crate) fn appending(out: &mut Vec<u8>, f: impl FnOnce(&mut ByteBuf)) {
    let mut buf = ByteBuf::from_vec(std::mem::take(out));
    f(&mut buf);
    *out = buf.into_vec();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(f: impl FnOnce(&mut ByteBuf)) -> Vec<u8> {
        let mut out = Vec::new();
        appending(&mut out, f);
        out
    }

    // The golden vectors only cover the values they happen to contain; these pin the
    // smallest-form rule at every boundary, which Python `msgpack` follows too.
    #[test]
    fn uint_uses_smallest_form_at_every_boundary() {
        let cases: [(u64, &[u8]); 9] = [
            (0, &[0x00]),
            (127, &[0x7f]),
            (128, &[0xcc, 0x80]),
            (255, &[0xcc, 0xff]),
            (256, &[0xcd, 0x01, 0x00]),
            (65_535, &[0xcd, 0xff, 0xff]),
            (65_536, &[0xce, 0, 1, 0, 0]),
            (u64::from(u32::MAX), &[0xce, 0xff, 0xff, 0xff, 0xff]),
            (1 << 32, &[0xcf, 0, 0, 0, 1, 0, 0, 0, 0]),
        ];
        for (v, want) in cases {
            assert_eq!(bytes(|o| uint(o, v)), want, "{v}");
        }
    }

    #[test]
    fn sint_uses_unsigned_forms_when_non_negative() {
        let cases: [(i64, &[u8]); 9] = [
            (0, &[0x00]),
            (200, &[0xcc, 0xc8]),
            (
                1_739_145_600_000,
                &[0xcf, 0, 0, 1, 0x94, 0xed, 0x27, 0xdc, 0],
            ),
            (-1, &[0xff]),
            (-32, &[0xe0]),
            (-33, &[0xd0, 0xdf]),
            (-129, &[0xd1, 0xff, 0x7f]),
            (-32_769, &[0xd2, 0xff, 0xff, 0x7f, 0xff]),
            (i64::MIN, &[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0]),
        ];
        for (v, want) in cases {
            assert_eq!(bytes(|o| sint(o, v)), want, "{v}");
        }
    }

    #[test]
    fn strings_switch_headers_at_32_256_and_65536() {
        let cases: [(usize, &[u8]); 5] = [
            (31, &[0xbf]),
            (32, &[0xd9, 32]),
            (255, &[0xd9, 255]),
            (256, &[0xda, 0x01, 0x00]),
            (65_536, &[0xdb, 0, 1, 0, 0]),
        ];
        for (len, header) in cases {
            let s = "x".repeat(len);
            let out = bytes(|o| str(o, &s));
            assert_eq!(&out[..header.len()], header, "len {len}");
            assert_eq!(&out[header.len()..], s.as_bytes());
        }
        assert_eq!(bytes(|o| opt_str(o, None)), [0xc0]);
    }

    #[test]
    fn container_headers_switch_at_16_and_65536() {
        assert_eq!(bytes(|o| array_len(o, 15)), [0x9f]);
        assert_eq!(bytes(|o| array_len(o, 16)), [0xdc, 0, 16]);
        assert_eq!(bytes(|o| array_len(o, 65_536)), [0xdd, 0, 1, 0, 0]);
        assert_eq!(bytes(|o| map_len(o, 15)), [0x8f]);
        assert_eq!(bytes(|o| map_len(o, 20)), [0xde, 0, 20]);
        assert_eq!(bytes(|o| map_len(o, 65_536)), [0xdf, 0, 1, 0, 0]);
    }

    #[test]
    fn appends_to_what_the_buffer_already_holds() {
        let mut out = vec![0x01, 0x02];
        appending(&mut out, |o| uint(o, 3));
        assert_eq!(out, [0x01, 0x02, 0x03]);
    }
}
