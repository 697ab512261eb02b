//! The keyed hash of the chain cache's fast keys ([`super::chains`]).
//!
//! A fast key must be cheap (a 32 k-token query computes 2,048 of them) and must not collide
//! for two different blocks, with a key nobody outside the process sees. The construction:
//!
//! - the block's token ids, two to a 64-bit word, go through **NH**, the universal hash of
//!   UMAC: `Σ (w[2i] + k[2i]) · (w[2i+1] + k[2i+1])`, 64-bit additions and full 128-bit
//!   products summed modulo 2^128. For two different inputs of the same length the sums
//!   collide with a probability of at most 2^-64 over the key. The products are independent
//!   of each other, so the processor runs them side by side;
//! - each chunk of [`CHUNK_TOKENS`] tokens is compressed into a running 64-bit state with a
//!   *folded multiply* (the two halves of a 128-bit product XORed), which starts from a word
//!   that covers the block's extra keys and its token count ([`FastHasher::prefix`]);
//! - the parent's fast key enters last, through one more folded multiply. Only that step
//!   waits for the block before, so consecutive blocks' token work overlaps.
//!
//! A partition's blocks all have the same token count, which the prefix covers; a shorter
//! last word or chunk is padded with zeros, and the count tells `[t, 0]` from `[t]`.
//!
//! Against SipHash-1-3 over the same words (14 dependent rounds a 16-token block, ~23 ns on
//! a 2-vCPU EPYC VM), this is four independent products and two dependent folds
//! (docs/benchmarks.md, *Prefix index*).

use std::hash::BuildHasher;

/// Key words NH uses: one per token word, so a chunk is twice as many tokens.
const NH_WORDS: usize = 64;

/// Tokens one NH sum covers before it is folded into the state.
pub const CHUNK_TOKENS: usize = 2 * NH_WORDS;

/// The halves of `a · b` (128 bits) XORed.
#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    p as u64 ^ (p >> 64) as u64
}

/// Two token ids as one word, the first in the low half.
#[inline(always)]
fn word(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | u64::from(hi) << 32
}

/// The random key of one process's fast keys.
#[derive(Clone)]
pub struct FastHasher {
    nh: [u64; NH_WORDS],
    fin: [u64; 6],
}

impl std::fmt::Debug for FastHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FastHasher { .. }")
    }
}

/// The start of every fast key of blocks with the same extra keys and token count.
#[derive(Clone, Copy, Debug)]
pub struct FastPrefix(u64);

impl FastHasher {
    /// A key drawn from `keys` (a randomly keyed `RandomState`).
    pub fn new(keys: &impl BuildHasher) -> FastHasher {
        let mut draw = (0u64..).map(|i| keys.hash_one((b"moonkv fast key", i)));
        FastHasher {
            nh: std::array::from_fn(|_| draw.next().unwrap_or_default()),
            fin: std::array::from_fn(|_| draw.next().unwrap_or_default()),
        }
    }

    /// The state before a block's tokens: its extra keys' word and its token count.
    pub fn prefix(&self, extra: u64, tokens: usize) -> FastPrefix {
        FastPrefix(fold(extra ^ self.fin[0], tokens as u64 ^ self.fin[1]))
    }

    /// The fast key of a block with `tokens` (as many as `prefix` was made for) after the
    /// block whose fast key is `parent`.
    #[inline]
    pub fn key(&self, prefix: FastPrefix, parent: u64, tokens: &[u32]) -> u64 {
        let mut state = prefix.0;
        for chunk in tokens.chunks(CHUNK_TOKENS) {
            let (lo, hi) = self.nh_sum(chunk);
            state = fold(state ^ lo ^ self.fin[2], hi ^ self.fin[3]);
        }
        fold(state ^ self.fin[4], parent ^ self.fin[5])
    }

    /// NH of up to [`CHUNK_TOKENS`] tokens, as its low and high words.
    #[inline(always)]
    fn nh_sum(&self, chunk: &[u32]) -> (u64, u64) {
        debug_assert!(chunk.len() <= CHUNK_TOKENS);
        let mut sum = 0u128;
        let mut quads = chunk.chunks_exact(4);
        let mut keys = self.nh.chunks_exact(2);
        for (q, k) in (&mut quads).zip(&mut keys) {
            let a = word(q[0], q[1]).wrapping_add(k[0]);
            let b = word(q[2], q[3]).wrapping_add(k[1]);
            sum = sum.wrapping_add(u128::from(a) * u128::from(b));
        }
        let rest = quads.remainder();
        if let (false, Some(k)) = (rest.is_empty(), keys.next()) {
            let mut t = [0u32; 4];
            t[..rest.len()].copy_from_slice(rest);
            let a = word(t[0], t[1]).wrapping_add(k[0]);
            let b = word(t[2], t[3]).wrapping_add(k[1]);
            sum = sum.wrapping_add(u128::from(a) * u128::from(b));
        }
        (sum as u64, (sum >> 64) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::RandomState;
    use std::collections::HashSet;

    fn tokens(n: usize, seed: u32) -> Vec<u32> {
        (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) ^ seed)
            .collect()
    }

    #[test]
    fn every_input_moves_the_key() {
        let h = FastHasher::new(&RandomState::new());
        for n in [1usize, 2, 3, 4, 5, 15, 16, 17, 64, 127, 128, 129, 256, 300] {
            let t = tokens(n, 7);
            let p = h.prefix(11, n);
            let base = h.key(p, 99, &t);
            assert_eq!(base, h.key(p, 99, &t), "deterministic, {n} tokens");
            assert_ne!(base, h.key(p, 98, &t), "parent, {n} tokens");
            assert_ne!(base, h.key(h.prefix(12, n), 99, &t), "extra, {n} tokens");
            for i in 0..n {
                let mut u = t.clone();
                u[i] ^= 1 << (i % 32);
                assert_ne!(base, h.key(p, 99, &u), "token {i} of {n}");
            }
            if n >= 8 {
                // swapping two token pairs, or two words between positions
                let mut u = t.clone();
                u.swap(0, 4);
                u.swap(1, 5);
                assert_ne!(base, h.key(p, 99, &u), "swapped words, {n} tokens");
            }
        }
    }

    #[test]
    fn a_zero_padded_block_differs_from_the_shorter_one() {
        let h = FastHasher::new(&RandomState::new());
        let short = [5u32, 6, 7];
        let padded = [5u32, 6, 7, 0];
        assert_ne!(
            h.key(h.prefix(0, 3), 1, &short),
            h.key(h.prefix(0, 4), 1, &padded)
        );
        let long: Vec<u32> = tokens(CHUNK_TOKENS, 3);
        let mut longer = long.clone();
        longer.push(0);
        assert_ne!(
            h.key(h.prefix(0, long.len()), 1, &long),
            h.key(h.prefix(0, longer.len()), 1, &longer)
        );
    }

    #[test]
    fn the_key_depends_on_the_process_key() {
        let a = FastHasher::new(&RandomState::new());
        let b = FastHasher::new(&RandomState::new());
        let t = tokens(16, 1);
        assert_ne!(a.key(a.prefix(0, 16), 0, &t), b.key(b.prefix(0, 16), 0, &t));
    }

    #[test]
    fn a_chain_of_near_identical_blocks_has_no_collision_and_spreads_over_the_bits() {
        // 400 k chained blocks whose tokens differ in one low bit at one place: the inputs
        // most alike that a chain produces.
        let h = FastHasher::new(&RandomState::new());
        let p = h.prefix(0, 16);
        let mut seen = HashSet::new();
        let mut ones = [0u32; 64];
        let mut parent = 0u64;
        let n = 400_000u32;
        for i in 0..n {
            let mut t = [0u32; 16];
            t[(i % 16) as usize] = i / 16;
            parent = h.key(p, parent, &t);
            assert!(seen.insert(parent), "collision at block {i}");
            for (bit, count) in ones.iter_mut().enumerate() {
                *count += (parent >> bit) as u32 & 1;
            }
        }
        // each bit set in half of the keys, within 1% (one standard deviation is 0.08%)
        for (bit, count) in ones.iter().enumerate() {
            let share = f64::from(*count) / f64::from(n);
            assert!(
                (share - 0.5).abs() < 0.01,
                "bit {bit} set in {share} of the keys"
            );
        }
    }
}
