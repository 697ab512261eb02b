//! Object bytes a test can check: self-describing payloads (a torn or stale read is detected),
//! position-dependent patterns, and a small deterministic generator for test choices.

/// Self-checking object bytes: every byte depends on (key id, version, offset), and objects of
/// 16 bytes or more start with `key id u32 · version u64 · length u32` (big-endian), so a torn
/// object (bytes of two versions) or a stale one (another version) is detected on read.
pub fn payload(key_id: u32, version: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let seed = (u64::from(key_id) << 40) ^ version.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut word = 0u64;
    while out.len() < len {
        out.extend_from_slice(&splitmix(seed ^ word).to_le_bytes());
        word += 1;
    }
    out.truncate(len);
    if len >= 16 {
        out[0..4].copy_from_slice(&key_id.to_be_bytes());
        out[4..12].copy_from_slice(&version.to_be_bytes());
        out[12..16].copy_from_slice(&(len as u32).to_be_bytes());
    }
    out
}

/// Reads the (key id, version, length) header of a payload of 16 bytes or more.
pub fn payload_header(bytes: &[u8]) -> Option<(u32, u64, u32)> {
    if bytes.len() < 16 {
        return None;
    }
    let key = u32::from_be_bytes(bytes[0..4].try_into().ok()?);
    let version = u64::from_be_bytes(bytes[4..12].try_into().ok()?);
    let len = u32::from_be_bytes(bytes[12..16].try_into().ok()?);
    Some((key, version, len))
}

/// splitmix64: a fast, well-mixed hash of one word.
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A tiny deterministic generator for test choices (no extra dependency).
pub struct Rng(pub u64);

impl Rng {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix(self.0)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Deterministic, position-dependent bytes (a shifted or torn copy never matches).
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .rotate_left(seed as u32 % 32) as u8
                ^ seed
        })
        .collect()
}
