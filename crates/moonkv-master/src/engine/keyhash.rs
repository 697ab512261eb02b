//! The hash function of the shard choice and of the per-shard object maps.
//!
//! SipHash (std's default) cost about a fifth of a put's instructions. This is a folded-multiply
//! hash in the style of foldhash and wyhash: each 16 bytes of input cost one 64×64→128-bit
//! multiply whose halves are XORed together. Keys come from clients, so the function is keyed
//! with random seeds drawn once per process (and separately for the shard choice): which keys
//! collide depends on seeds an attacker cannot see. It is not a cryptographic PRF; it is the
//! same level of protection hashbrown's default hasher (foldhash) gives.

use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

/// A keyed hash function: [`BuildHasher`] for the engine's maps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyHashState {
    seeds: [u64; 3],
}

impl KeyHashState {
    /// A function with fresh random seeds (the shard choice gets its own, so the objects of one
    /// shard do not share the low bits their map indexes by).
    pub(crate) fn new_random() -> Self {
        Self {
            seeds: rand::random(),
        }
    }
}

impl Default for KeyHashState {
    /// The process-wide function of the per-shard maps (seeded on first use).
    fn default() -> Self {
        static PROCESS_SEEDS: OnceLock<KeyHashState> = OnceLock::new();
        *PROCESS_SEEDS.get_or_init(Self::new_random)
    }
}

impl BuildHasher for KeyHashState {
    type Hasher = KeyHasher;

    fn build_hasher(&self) -> KeyHasher {
        KeyHasher {
            acc: self.seeds[2],
            seeds: [self.seeds[0], self.seeds[1]],
        }
    }
}

/// The running state of one hash computation.
#[derive(Clone, Debug)]
pub(crate) struct KeyHasher {
    acc: u64,
    seeds: [u64; 2],
}

/// The 128-bit product of `a` and `b`, folded to 64 bits.
#[inline]
fn fold_mul(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

#[inline]
fn read_u64(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(word)
}

#[inline]
fn read_u32(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[..4]);
    u64::from(u32::from_le_bytes(word))
}

/// The last 0–15 bytes as two words. The reads may overlap; with the input length mixed in,
/// distinct tails of one length still give distinct words.
#[inline]
fn tail_words(rest: &[u8]) -> (u64, u64) {
    let n = rest.len();
    if n >= 8 {
        (read_u64(rest), read_u64(&rest[n - 8..]))
    } else if n >= 4 {
        (read_u32(rest), read_u32(&rest[n - 4..]))
    } else if n > 0 {
        let spread =
            u64::from(rest[0]) | u64::from(rest[n / 2]) << 8 | u64::from(rest[n - 1]) << 16;
        (spread, 0)
    } else {
        (0, 0)
    }
}

impl Hasher for KeyHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let [s0, s1] = self.seeds;
        let mut acc = self.acc;
        let mut blocks = bytes.chunks_exact(16);
        for block in &mut blocks {
            acc = fold_mul(acc ^ read_u64(block) ^ s0, read_u64(&block[8..]) ^ s1);
        }
        let (lo, hi) = tail_words(blocks.remainder());
        self.acc = fold_mul(acc ^ lo ^ s0, hi ^ s1 ^ bytes.len() as u64);
    }

    #[inline]
    fn write_u8(&mut self, byte: u8) {
        self.write_u64(u64::from(byte));
    }

    #[inline]
    fn write_u64(&mut self, word: u64) {
        let [s0, s1] = self.seeds;
        self.acc = fold_mul(self.acc ^ word ^ s0, s1.rotate_left(32));
    }

    #[inline]
    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash_str(state: &KeyHashState, s: &str) -> u64 {
        state.hash_one(s)
    }

    #[test]
    fn equal_keys_hash_equal_and_seeds_matter() {
        let a = KeyHashState::new_random();
        let b = KeyHashState::new_random();
        assert_eq!(hash_str(&a, "tenant/key-1"), hash_str(&a, "tenant/key-1"));
        assert_ne!(hash_str(&a, "tenant/key-1"), hash_str(&b, "tenant/key-1"));
        assert_eq!(
            KeyHashState::default().hash_one("k"),
            KeyHashState::default().hash_one("k")
        );
    }

    #[test]
    fn nearby_keys_spread_over_buckets() {
        // Every length from 0 to 40 (all tail shapes), keys differing in one byte, and tuple
        // splits that concatenate to the same bytes: no collisions, and the low bits (what a
        // table indexes by) take many values.
        let state = KeyHashState::new_random();
        let mut seen = std::collections::HashSet::new();
        let mut low = std::collections::HashSet::new();
        let keys: std::collections::BTreeSet<String> = (0..=40)
            .flat_map(|len| ['a', 'b', '\0'].map(|fill| fill.to_string().repeat(len)))
            .collect();
        for key in &keys {
            let h = hash_str(&state, key);
            assert!(seen.insert(h), "collision at {key:?}");
            low.insert(h & 0xff);
        }
        assert!(low.len() > 80, "low bits poorly spread: {}", low.len());
        assert_ne!(state.hash_one(("ab", "c")), state.hash_one(("a", "bc")));
    }
}
