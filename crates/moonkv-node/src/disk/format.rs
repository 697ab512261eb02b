//! On-disk layout of one replica file and the CRC-32 that guards it.
//!
//! The checksum is CRC-32/IEEE (reflected, as zlib and `crc32fast` compute it); files written by
//! earlier builds verify unchanged.
//!
//! All integers big-endian:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `MKVF` |
//! | 4 | 2 | version `1` |
//! | 6 | 2 | tenant length `T` |
//! | 8 | 4 | key length `K` |
//! | 12 | 8 | file id (the replica id it was written for) |
//! | 20 | 8 | payload length `N` |
//! | 28 | 4 | CRC-32 of the payload |
//! | 32 | 4 | CRC-32 of bytes 0..32, the tenant and the key |
//! | 36 | T | tenant, UTF-8 |
//! | 36+T | K | key, UTF-8 |
//! | 36+T+K | N | payload |
//!
//! A file is valid only if both checksums match and its length is exactly `36 + T + K + N`.

/// File magic.
pub const FILE_MAGIC: [u8; 4] = *b"MKVF";
/// File format version.
pub const FILE_VERSION: u16 = 1;
/// Fixed part of the header.
pub const FIXED_LEN: usize = 36;
/// Longest tenant name a file may carry.
pub const MAX_TENANT_LEN: usize = 1024;

/// The decoded header of a replica file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileHeader {
    /// Tenant of the object.
    pub tenant: String,
    /// Object key.
    pub key: String,
    /// File id.
    pub file_id: u64,
    /// Payload length.
    pub size: u64,
    /// CRC-32 of the payload.
    pub payload_crc: u32,
}

impl FileHeader {
    /// Header length on disk.
    pub fn header_len(&self) -> usize {
        FIXED_LEN + self.tenant.len() + self.key.len()
    }

    /// Whole file length.
    pub fn file_len(&self) -> u64 {
        self.header_len() as u64 + self.size
    }

    /// Encodes the header (checksummed).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.header_len());
        out.extend_from_slice(&FILE_MAGIC);
        out.extend_from_slice(&FILE_VERSION.to_be_bytes());
        out.extend_from_slice(&(self.tenant.len() as u16).to_be_bytes());
        out.extend_from_slice(&(self.key.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.file_id.to_be_bytes());
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.payload_crc.to_be_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&out[..32]);
        crc.update(self.tenant.as_bytes());
        crc.update(self.key.as_bytes());
        out.extend_from_slice(&crc.finalize().to_be_bytes());
        out.extend_from_slice(self.tenant.as_bytes());
        out.extend_from_slice(self.key.as_bytes());
        out
    }

    /// Lengths of the variable part, from the fixed part; `None` if the fixed part is invalid.
    pub fn variable_len(fixed: &[u8; FIXED_LEN]) -> Option<(usize, usize)> {
        if fixed[0..4] != FILE_MAGIC || u16::from_be_bytes([fixed[4], fixed[5]]) != FILE_VERSION {
            return None;
        }
        let tenant = u16::from_be_bytes([fixed[6], fixed[7]]) as usize;
        let key = u32::from_be_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]) as usize;
        (tenant <= MAX_TENANT_LEN && key <= moonkv_proto::MAX_KEY_LEN).then_some((tenant, key))
    }

    /// Decodes and verifies a whole header (`fixed` plus the variable part).
    pub fn decode(fixed: &[u8; FIXED_LEN], variable: &[u8]) -> Option<FileHeader> {
        let (t, k) = Self::variable_len(fixed)?;
        if variable.len() != t + k {
            return None;
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(&fixed[..32]);
        crc.update(variable);
        if crc.finalize() != be_u32(&fixed[32..36]) {
            return None;
        }
        Some(FileHeader {
            tenant: String::from_utf8(variable[..t].to_vec()).ok()?,
            key: String::from_utf8(variable[t..].to_vec()).ok()?,
            file_id: be_u64(&fixed[12..20]),
            size: be_u64(&fixed[20..28]),
            payload_crc: be_u32(&fixed[28..32]),
        })
    }
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be_u64(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_be_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_values() {
        // CRC-32/IEEE check values (the catalogue's "check" and zlib's results): a different
        // polynomial, reflection or final xor would make every existing file unreadable.
        assert_eq!(crc32fast::hash(b""), 0);
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
        assert_eq!(
            crc32fast::hash(b"The quick brown fox jumps over the lazy dog"),
            0x414F_A339
        );
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 31) as u8).collect();
        assert_eq!(crc32fast::hash(&data), 0x91F4_3DEC);
        // The writer checksums the payload step by step; any split must give the same value.
        for cut in [0, 1, 7, 8, 13, 64, 999, 1000] {
            let mut split = crc32fast::Hasher::new();
            split.update(&data[..cut]);
            split.update(&data[cut..]);
            assert_eq!(split.finalize(), crc32fast::hash(&data), "split at {cut}");
        }
    }

    #[test]
    fn headers_encode_to_the_documented_bytes() {
        // Built field by field from the table in the module doc, with CRCs from zlib.
        let golden = concat!(
            "4d4b5646",                                   // magic
            "0001",                                       // version
            "0008",                                       // tenant length
            "00000015",                                   // key length
            "0102030405060708",                           // file id
            "00000000000003e8",                           // payload length
            "91f43dec",                                   // payload CRC
            "61bcfbe7",                                   // header CRC
            "74656e616e742d61",                           // "tenant-a"
            "6d6f64656c2f6c617965722d302f626c6f636b2d37", // "model/layer-0/block-7"
        );
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 31) as u8).collect();
        let h = FileHeader {
            tenant: "tenant-a".into(),
            key: "model/layer-0/block-7".into(),
            file_id: 0x0102_0304_0506_0708,
            size: payload.len() as u64,
            payload_crc: crc32fast::hash(&payload),
        };
        let hex: String = h.encode().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, golden);
        let mut fixed = [0u8; FIXED_LEN];
        fixed.copy_from_slice(&h.encode()[..FIXED_LEN]);
        assert_eq!(
            FileHeader::decode(&fixed, &h.encode()[FIXED_LEN..]),
            Some(h)
        );
    }

    #[test]
    fn headers_round_trip_and_reject_any_flipped_bit() {
        let h = FileHeader {
            tenant: "t".into(),
            key: "key/1".into(),
            file_id: 42,
            size: 1000,
            payload_crc: 7,
        };
        let bytes = h.encode();
        assert_eq!(bytes.len(), h.header_len());
        let split = |b: &[u8]| {
            let mut fixed = [0u8; FIXED_LEN];
            fixed.copy_from_slice(&b[..FIXED_LEN]);
            (fixed, b[FIXED_LEN..].to_vec())
        };
        let (fixed, var) = split(&bytes);
        assert_eq!(FileHeader::decode(&fixed, &var), Some(h));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            let (fixed, var) = split(&bad);
            assert_eq!(FileHeader::decode(&fixed, &var), None, "bit flip at {i}");
        }
    }
}
