//! On-disk layout of one replica file and the CRC-32 that guards it.
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
        let mut crc = Crc32::new();
        crc.update(&out[..32]);
        crc.update(self.tenant.as_bytes());
        crc.update(self.key.as_bytes());
        out.extend_from_slice(&crc.finish().to_be_bytes());
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
        let mut crc = Crc32::new();
        crc.update(&fixed[..32]);
        crc.update(variable);
        if crc.finish() != be_u32(&fixed[32..36]) {
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

/// CRC-32 (IEEE 802.3, reflected, as zlib computes it), eight bytes per step.
#[derive(Clone, Copy, Debug)]
pub struct Crc32(u32);

const fn crc_tables() -> [[u32; 256]; 8] {
    let mut tables = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut bit = 0;
        while bit < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            bit += 1;
        }
        tables[0][i] = c;
        i += 1;
    }
    let mut t = 1;
    while t < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = tables[t - 1][i];
            tables[t][i] = (prev >> 8) ^ tables[0][(prev & 0xff) as usize];
            i += 1;
        }
        t += 1;
    }
    tables
}

static TABLES: [[u32; 256]; 8] = crc_tables();

impl Crc32 {
    /// A fresh checksum.
    pub fn new() -> Self {
        Crc32(!0)
    }

    /// Adds `data`.
    pub fn update(&mut self, data: &[u8]) {
        let mut c = self.0;
        let mut chunks = data.chunks_exact(8);
        for w in &mut chunks {
            let lo = c ^ u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            c = TABLES[7][(lo & 0xff) as usize]
                ^ TABLES[6][((lo >> 8) & 0xff) as usize]
                ^ TABLES[5][((lo >> 16) & 0xff) as usize]
                ^ TABLES[4][(lo >> 24) as usize]
                ^ TABLES[3][w[4] as usize]
                ^ TABLES[2][w[5] as usize]
                ^ TABLES[1][w[6] as usize]
                ^ TABLES[0][w[7] as usize];
        }
        for b in chunks.remainder() {
            c = TABLES[0][((c ^ *b as u32) & 0xff) as usize] ^ (c >> 8);
        }
        self.0 = c;
    }

    /// The checksum of everything added.
    pub fn finish(self) -> u32 {
        !self.0
    }

    /// Checksum of one buffer.
    pub fn of(data: &[u8]) -> u32 {
        let mut c = Crc32::new();
        c.update(data);
        c.finish()
    }
}

impl Default for Crc32 {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_values() {
        assert_eq!(Crc32::of(b""), 0);
        assert_eq!(Crc32::of(b"123456789"), 0xCBF4_3926);
        assert_eq!(
            Crc32::of(b"The quick brown fox jumps over the lazy dog"),
            0x414F_A339
        );
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 31) as u8).collect();
        let mut split = Crc32::new();
        split.update(&data[..13]);
        split.update(&data[13..]);
        assert_eq!(split.finish(), Crc32::of(&data));
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
