//! The chain cache: block digests the indexer already computed, found again without SHA-256.
//!
//! Every block whose digest the indexer computes from token ids (at ingest, and on the query
//! path) is remembered under a *fast key*, a keyed SipHash chained like the digest itself:
//!
//! ```text
//! fast(-1) = SipHash_k(partition key, profile, its root digest)
//! fast(i)  = SipHash-1-3_k'(fast(i-1), SipHash_k(block i's extra keys as CBOR), token count,
//!                           block i's token ids)
//! ```
//!
//! `k` is a random key drawn once per process (`std`'s `RandomState`), `k'` derived from it.
//! The fast key covers everything the block's digest depends on (the profile, the parent
//! chain, the tokens and the extra keys, byte for byte as the digest reads them), so a given
//! fast key stands for one digest unless two keyed 64-bit hashes collide. An entry also keeps its parent's fast key, and a lookup must present
//! the same parent, so a false hit needs two blocks under one parent whose 64-bit keyed hashes
//! collide (about 2^-64 per lookup, with a key no outsider sees). A miss is always safe: the
//! query computes SHA-256 from there on and records what it computed.
//!
//! Memory is bounded: entries go into the current generation; when it holds
//! [`ChainCache::generation_blocks`] entries it becomes the previous one and the one before
//! is dropped whole. A hit in the previous generation is copied into the current one, so
//! blocks in use survive. Both generations together hold at most twice that many entries.

use std::hash::{BuildHasher, BuildHasherDefault};

use parking_lot::{RwLock, RwLockReadGuard};

use prometheus_client::metrics::counter::Counter;

use super::{HugePages, PassThroughHasher};
use crate::hash::{Digest32, Extra, HashProfile};
use crate::ids::{BlockHash, PartitionKey};

/// Entries both generations hold at most by default: two generations of 1,835,008 entries,
/// each filling a 2^21-slot table exactly (about 100 MiB each, 49 bytes a slot).
pub const DEFAULT_CHAIN_CACHE_BLOCKS: usize = 2 * (7 << 18);

/// The environment variable that sets the chain cache's size in blocks (`0` turns it off).
pub const CHAIN_CACHE_ENV: &str = "MOONKV_INDEXER_CHAIN_CACHE_BLOCKS";

/// A remembered block: its parent's fast key (checked on lookup) and its digest.
#[derive(Debug, Clone, Copy)]
pub struct ChainEntry {
    /// The fast key of the block before it (the partition's root for a first block).
    pub parent: u64,
    /// The block's full digest.
    pub digest: Digest32,
}

type FastMap<V> = hashbrown::HashMap<u64, V, BuildHasherDefault<PassThroughHasher>, HugePages>;

/// Two generations of a map keyed by uniformly distributed `u64`s, `per_generation` entries
/// each at most.
#[derive(Debug)]
pub struct Generations<V> {
    per_generation: usize,
    current: FastMap<V>,
    previous: FastMap<V>,
}

impl<V: Copy> Generations<V> {
    /// Empty, holding at most `2 * per_generation` entries (`0`: nothing is kept).
    pub fn new(per_generation: usize) -> Generations<V> {
        Generations {
            per_generation,
            current: FastMap::default(),
            previous: FastMap::default(),
        }
    }

    /// The value of `key` and whether it was found in the previous generation.
    pub fn get(&self, key: u64) -> Option<(V, bool)> {
        if let Some(v) = self.current.get(&key) {
            return Some((*v, false));
        }
        self.previous.get(&key).map(|v| (*v, true))
    }

    /// Inserts (or replaces) `key`. When the current generation is full, the previous one's
    /// entries go and its table, emptied, becomes the current one: tables are allocated once
    /// and then reused, so rotating never waits for fresh memory to be faulted in.
    pub fn insert(&mut self, key: u64, value: V) {
        if self.per_generation == 0 {
            return;
        }
        if self.current.len() >= self.per_generation && !self.current.contains_key(&key) {
            let mut next = std::mem::take(&mut self.previous);
            next.clear();
            if next.capacity() < self.per_generation {
                // reserved whole so the table never rehashes while readers wait
                next = FastMap::with_capacity_and_hasher_in(
                    self.per_generation,
                    Default::default(),
                    HugePages,
                );
            }
            self.previous = std::mem::replace(&mut self.current, next);
        }
        self.current.insert(key, value);
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every entry (the tables keep their room).
    pub fn clear(&mut self) {
        self.current.clear();
        self.previous.clear();
    }

    /// Estimated heap bytes of both tables.
    pub fn heap_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(u64, V)>() + 1;
        (self.current.capacity() + self.previous.capacity()) * slot
    }
}

/// Counters of the chain cache (exported by [`crate::metrics::Metrics`]).
#[derive(Debug, Default, Clone)]
pub struct ChainStats {
    /// Query blocks whose digest came from the cache.
    pub hits: Counter,
    /// Query blocks hashed with SHA-256 (not in the cache, or after the first that was not).
    pub misses: Counter,
    /// Blocks a `trust` source stored whose recomputed hash differs from the one it sent (the
    /// engine does not run the partition's profile); such chains are not remembered.
    pub trusted_mismatches: Counter,
}

/// The process's chain cache, shared by every partition (each has its own root).
#[derive(Debug)]
pub struct ChainCache {
    keys: std::collections::hash_map::RandomState,
    /// SipHash-1-3 key of the fast keys, drawn from `keys`.
    sip: [u64; 2],
    enabled: bool,
    map: RwLock<Generations<ChainEntry>>,
    stats: ChainStats,
}

impl Default for ChainCache {
    fn default() -> Self {
        ChainCache::new(DEFAULT_CHAIN_CACHE_BLOCKS)
    }
}

impl ChainCache {
    /// A cache holding at most `blocks` entries (`0` turns it off).
    pub fn new(blocks: usize) -> ChainCache {
        let keys = std::collections::hash_map::RandomState::new();
        ChainCache {
            sip: [keys.hash_one(0u64), keys.hash_one(1u64)],
            keys,
            enabled: blocks > 0,
            map: RwLock::new(Generations::new(blocks.div_ceil(2))),
            stats: ChainStats::default(),
        }
    }

    /// The size [`CHAIN_CACHE_ENV`] asks for, else [`DEFAULT_CHAIN_CACHE_BLOCKS`].
    pub fn blocks_from_env() -> Result<usize, String> {
        match std::env::var(CHAIN_CACHE_ENV) {
            Err(_) => Ok(DEFAULT_CHAIN_CACHE_BLOCKS),
            Ok(v) => Self::parse_blocks(&v).map_err(|e| format!("{CHAIN_CACHE_ENV}={e}")),
        }
    }

    /// A cache size in blocks, `_` allowed between digits (`3_670_016`).
    pub fn parse_blocks(value: &str) -> Result<usize, String> {
        value
            .trim()
            .replace('_', "")
            .parse()
            .map_err(|_| format!("{value:?} is not a block count"))
    }

    /// Whether anything is remembered at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Entries per generation.
    pub fn generation_blocks(&self) -> usize {
        self.map.read().per_generation
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Estimated heap bytes.
    pub fn heap_bytes(&self) -> usize {
        self.map.read().heap_bytes()
    }

    /// Forgets every entry (the next queries take the SHA-256 path).
    pub fn clear(&self) {
        self.map.write().clear();
    }

    /// The counters.
    pub fn stats(&self) -> &ChainStats {
        &self.stats
    }

    /// The fast key before a partition's first block.
    pub fn root(&self, key: &PartitionKey, profile: &HashProfile) -> u64 {
        let spec = profile.spec();
        self.keys.hash_one((
            b"moonkv chain root",
            key,
            spec.name,
            spec.seed,
            profile.root(),
        ))
    }

    /// The word that stands for a block's extra keys (`extra_cbor` as [`Extra::encode_for`]
    /// writes them) in its fast key: a keyed hash of the bytes.
    pub fn extra_word(&self, extra_cbor: &[u8]) -> u64 {
        self.keys.hash_one(extra_cbor)
    }

    /// The fast key of a block after `parent` with `tokens` and extra keys `extra_cbor`.
    pub fn fast_key(&self, parent: u64, tokens: &[u32], extra_cbor: &[u8]) -> u64 {
        self.fast_key_with(parent, tokens, self.extra_word(extra_cbor))
    }

    /// [`ChainCache::fast_key`] with the extra keys' word already computed: SipHash-1-3 over
    /// the words `parent`, `extra`, the token count, then the tokens two to a word.
    pub fn fast_key_with(&self, parent: u64, tokens: &[u32], extra: u64) -> u64 {
        let mut h = Sip13::new(self.sip);
        h.word(parent);
        h.word(extra);
        h.word(tokens.len() as u64);
        let mut pairs = tokens.chunks_exact(2);
        for p in &mut pairs {
            h.word(u64::from(p[0]) | u64::from(p[1]) << 32);
        }
        if let [last] = pairs.remainder() {
            h.word(u64::from(*last));
        }
        h.finish()
    }

    /// Remembers computed blocks: `(fast key, entry)` pairs.
    pub fn record(&self, blocks: &[(u64, ChainEntry)]) {
        if !self.enabled || blocks.is_empty() {
            return;
        }
        let mut map = self.map.write();
        for &(k, e) in blocks {
            map.insert(k, e);
        }
    }

    /// A lookup handle for one query (none when the cache is off).
    fn reader(&self) -> Option<RwLockReadGuard<'_, Generations<ChainEntry>>> {
        self.enabled.then(|| self.map.read())
    }
}

/// SipHash-1-3 over a sequence of 64-bit words (the words as little-endian bytes, then the
/// usual length block), without the byte buffering of `std`'s hasher.
struct Sip13 {
    v: [u64; 4],
    words: u64,
}

impl Sip13 {
    fn new([k0, k1]: [u64; 2]) -> Sip13 {
        Sip13 {
            v: [
                k0 ^ 0x736f_6d65_7073_6575,
                k1 ^ 0x646f_7261_6e64_6f6d,
                k0 ^ 0x6c79_6765_6e65_7261,
                k1 ^ 0x7465_6462_7974_6573,
            ],
            words: 0,
        }
    }

    #[inline(always)]
    fn round(&mut self) {
        let [v0, v1, v2, v3] = &mut self.v;
        *v0 = v0.wrapping_add(*v1);
        *v1 = v1.rotate_left(13) ^ *v0;
        *v0 = v0.rotate_left(32);
        *v2 = v2.wrapping_add(*v3);
        *v3 = v3.rotate_left(16) ^ *v2;
        *v0 = v0.wrapping_add(*v3);
        *v3 = v3.rotate_left(21) ^ *v0;
        *v2 = v2.wrapping_add(*v1);
        *v1 = v1.rotate_left(17) ^ *v2;
        *v2 = v2.rotate_left(32);
    }

    #[inline(always)]
    fn word(&mut self, m: u64) {
        self.v[3] ^= m;
        self.round();
        self.v[0] ^= m;
        self.words += 1;
    }

    fn finish(mut self) -> u64 {
        let b = (self.words.wrapping_mul(8) & 0xff) << 56;
        self.v[3] ^= b;
        self.round();
        self.v[0] ^= b;
        self.v[2] ^= 0xff;
        self.round();
        self.round();
        self.round();
        self.v[0] ^ self.v[1] ^ self.v[2] ^ self.v[3]
    }
}

/// A query's chain: like [`crate::hash::Chain`], but each block's digest is taken from the
/// [`ChainCache`] while its fast key is there; from the first block that is not, SHA-256 is
/// computed for it and every later block. [`CachedChain::finish`] records what was computed.
pub struct CachedChain<'a> {
    cache: &'a ChainCache,
    reader: Option<RwLockReadGuard<'a, Generations<ChainEntry>>>,
    profile: &'a HashProfile,
    tokens: &'a [u32],
    block_size: usize,
    lora_name: Option<&'a str>,
    cache_salt: Option<&'a str>,
    extra_first: u64,
    extra_rest: u64,
    fast: u64,
    parent: Option<Digest32>,
    next: usize,
    scratch: Vec<u8>,
    computed: Vec<(u64, ChainEntry)>,
    hits: u64,
    ahead: [(u64, Option<(ChainEntry, bool)>); LOOK_AHEAD],
    ahead_from: usize,
    ahead_len: usize,
}

/// Blocks whose cache entries are looked up together.
pub const LOOK_AHEAD: usize = 16;

impl<'a> CachedChain<'a> {
    /// A chain over `tokens` in the partition whose root fast key is `root`.
    pub fn new(
        cache: &'a ChainCache,
        root: u64,
        profile: &'a HashProfile,
        tokens: &'a [u32],
        block_size: usize,
        lora_name: Option<&'a str>,
        cache_salt: Option<&'a str>,
    ) -> CachedChain<'a> {
        let mut extra_first = Vec::new();
        Extra::Request {
            lora_name,
            cache_salt,
        }
        .encode_for(profile, &mut extra_first);
        let mut extra_rest = Vec::new();
        Extra::Request {
            lora_name,
            cache_salt: None,
        }
        .encode_for(profile, &mut extra_rest);
        CachedChain {
            cache,
            reader: cache.reader(),
            profile,
            tokens,
            block_size: block_size.max(1),
            lora_name,
            cache_salt,
            extra_first: cache.extra_word(&extra_first),
            extra_rest: cache.extra_word(&extra_rest),
            fast: root,
            parent: None,
            next: 0,
            scratch: Vec::with_capacity(64 + 5 * block_size),
            computed: Vec::new(),
            hits: 0,
            ahead: [(0, None); LOOK_AHEAD],
            ahead_from: 0,
            ahead_len: 0,
        }
    }

    /// Full blocks in the sequence.
    pub fn len(&self) -> usize {
        self.tokens.len() / self.block_size
    }

    /// True when there is no full block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next block's full digest.
    pub fn next_digest(&mut self) -> Option<Digest32> {
        if self.next >= self.len() {
            return None;
        }
        let i = self.next;
        let block = &self.tokens[i * self.block_size..(i + 1) * self.block_size];
        let extra = if i == 0 {
            self.extra_first
        } else {
            self.extra_rest
        };
        let parent_fast = self.fast;
        let (fast, cached) = if self.reader.is_some() {
            if !(self.ahead_from..self.ahead_from + self.ahead_len).contains(&i) {
                self.look_ahead(i);
            }
            self.ahead[i - self.ahead_from]
        } else if self.cache.enabled {
            (self.cache.fast_key_with(parent_fast, block, extra), None)
        } else {
            (0, None)
        };
        let digest = match cached {
            Some((e, old)) if e.parent == parent_fast => {
                self.hits += 1;
                if old {
                    self.computed.push((fast, e));
                }
                e.digest
            }
            _ => {
                // from here on every block is hashed
                self.reader = None;
                let extra = Extra::Request {
                    lora_name: self.lora_name,
                    cache_salt: if i == 0 { self.cache_salt } else { None },
                };
                let digest =
                    self.profile
                        .block_with(&mut self.scratch, self.parent.as_ref(), block, extra);
                if self.cache.enabled {
                    self.computed.push((
                        fast,
                        ChainEntry {
                            parent: parent_fast,
                            digest,
                        },
                    ));
                }
                digest
            }
        };
        self.fast = fast;
        self.parent = Some(digest);
        self.next += 1;
        Some(digest)
    }

    /// Computes the fast keys of the blocks from `i` on (up to [`LOOK_AHEAD`]) and looks them
    /// all up before any is used, so that their memory accesses overlap.
    fn look_ahead(&mut self, i: usize) {
        let Some(reader) = self.reader.as_ref() else {
            return;
        };
        let n = LOOK_AHEAD.min(self.len() - i);
        let mut fast = self.fast;
        for j in 0..n {
            let b = i + j;
            let block = &self.tokens[b * self.block_size..(b + 1) * self.block_size];
            let extra = if b == 0 {
                self.extra_first
            } else {
                self.extra_rest
            };
            fast = self.cache.fast_key_with(fast, block, extra);
            self.ahead[j].0 = fast;
        }
        for slot in self.ahead.iter_mut().take(n) {
            slot.1 = reader.get(slot.0);
        }
        self.ahead_from = i;
        self.ahead_len = n;
    }

    /// Blocks taken from the cache so far.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Releases the cache, records the blocks computed (and the previous generation's hits),
    /// and counts hits and misses.
    pub fn finish(mut self) {
        self.reader = None;
        let misses = self.next as u64 - self.hits;
        let stats = &self.cache.stats;
        if self.hits > 0 {
            stats.hits.inc_by(self.hits);
        }
        if misses > 0 {
            stats.misses.inc_by(misses);
        }
        self.cache.record(&self.computed);
    }
}

impl Iterator for CachedChain<'_> {
    type Item = BlockHash;

    fn next(&mut self) -> Option<BlockHash> {
        self.next_digest().map(|d| BlockHash::from_digest(&d))
    }
}

#[cfg(test)]
#[path = "chains_tests.rs"]
mod tests;
