//! The chain cache: block digests the indexer already computed, found again without SHA-256.
//!
//! Every block whose digest the indexer computes from token ids (at ingest, and on the query
//! path) is remembered under a *fast key*, a keyed hash chained like the digest itself:
//!
//! ```text
//! fast(-1) = SipHash_k(partition key, profile, its root digest)
//! fast(i)  = F_k'(SipHash_k(block i's extra keys as CBOR), token count,
//!                 block i's token ids, fast(i-1))
//! ```
//!
//! `k` is a random key drawn once per process (`std`'s `RandomState`), `k'` derived from it;
//! `F` is NH over the token ids with folded multiplies around it ([`super::fast`]).
//! The fast key covers everything the block's digest depends on (the profile, the parent
//! chain, the tokens and the extra keys, byte for byte as the digest reads them), so a given
//! fast key stands for one digest unless two keyed 64-bit hashes collide: a lookup compares its
//! key with the two or three keys near its home slot, so a false hit has a chance of about
//! 2^-62 per lookup, with a key no outsider sees. A miss is always safe: the query computes
//! SHA-256 from there on and records what it computed.
//!
//! A lookup reads one 16-byte slot: the fast key and the block's index hash. The full digest
//! lies in a cold array beside the slots, read only where a query goes on with SHA-256 after
//! its last hit (see [`Table`]).
//!
//! Memory is bounded: entries go into the current generation; when it holds
//! [`ChainCache::generation_blocks`] entries it becomes the previous one and the one before
//! is dropped whole. A hit in the previous generation is copied into the current one, so
//! blocks in use survive. Both generations together hold at most twice that many entries.

use std::hash::BuildHasher;

use parking_lot::{RwLock, RwLockReadGuard};

use prometheus_client::metrics::counter::Counter;

use super::fast::{FastHasher, FastPrefix};
use super::Table;
use crate::hash::{Digest32, Extra, HashProfile};
use crate::ids::{BlockHash, PartitionKey};

/// Entries both generations hold at most by default: two generations of 1,572,864 entries,
/// each filling a 2^21-slot table to its 3/4 limit (96 MiB each: 16 bytes a slot and 32 of
/// digest).
pub const DEFAULT_CHAIN_CACHE_BLOCKS: usize = 2 * (3 << 19);

/// The environment variable that sets the chain cache's size in blocks (`0` turns it off).
pub const CHAIN_CACHE_ENV: &str = "MOONKV_INDEXER_CHAIN_CACHE_BLOCKS";

/// Two generations of a map keyed by uniformly distributed `u64`s, `per_generation` entries
/// each at most, with cold data `C` per entry (see [`Table`]).
#[derive(Debug)]
pub struct Generations<V, C = ()> {
    per_generation: usize,
    current: Table<V, C>,
    previous: Table<V, C>,
}

impl<V: Copy + Default> Generations<V> {
    /// Inserts (or replaces) `key` (see [`Generations::insert_with`]).
    pub fn insert(&mut self, key: u64, value: V) {
        self.insert_with(key, value, ());
    }
}

impl<V: Copy + Default, C: Copy + Default> Generations<V, C> {
    /// Empty, holding at most `2 * per_generation` entries (`0`: nothing is kept).
    pub fn new(per_generation: usize) -> Generations<V, C> {
        Generations {
            per_generation,
            current: Table::new(),
            previous: Table::new(),
        }
    }

    /// The value of `key` and whether it was found in the previous generation.
    #[inline]
    pub fn get(&self, key: u64) -> Option<(V, bool)> {
        if let Some(v) = self.current.get(key) {
            return Some((*v, false));
        }
        self.previous.get(key).map(|v| (*v, true))
    }

    /// The value and the cold data of `key`, and whether it was found in the previous
    /// generation.
    pub fn get_with(&self, key: u64) -> Option<(V, C, bool)> {
        if let Some((v, c)) = self.current.get_with(key) {
            return Some((*v, *c, false));
        }
        self.previous.get_with(key).map(|(v, c)| (*v, *c, true))
    }

    /// Starts loading where `key` would be in the current generation (see
    /// [`Table::prefetch`]).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        self.current.prefetch(key);
    }

    /// Inserts (or replaces) `key` with its cold data. When the current generation is full,
    /// the previous one's entries go and its table, emptied, becomes the current one: tables
    /// are allocated once and then reused, so rotating never waits for fresh memory to be
    /// faulted in.
    pub fn insert_with(&mut self, key: u64, value: V, cold: C) {
        if self.per_generation == 0 {
            return;
        }
        if self.current.len() >= self.per_generation && !self.current.contains_key(key) {
            let mut next = std::mem::take(&mut self.previous);
            next.clear();
            if next.room() < self.per_generation {
                // reserved whole so the table never grows while readers wait
                next = Table::with_capacity(self.per_generation);
            }
            self.previous = std::mem::replace(&mut self.current, next);
        }
        self.current.insert_with(key, value, cold);
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
        self.current.heap_bytes() + self.previous.heap_bytes()
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
    /// The key of the fast keys' hash, drawn from `keys`.
    fast: FastHasher,
    enabled: bool,
    map: RwLock<Generations<u64, Digest32>>,
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
            fast: FastHasher::new(&keys),
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

    /// [`ChainCache::fast_key`] with the extra keys' word already computed.
    pub fn fast_key_with(&self, parent: u64, tokens: &[u32], extra: u64) -> u64 {
        self.fast_key_after(&self.fast_prefix(extra, tokens.len()), parent, tokens)
    }

    /// The start of the fast keys of blocks with this extra keys' word and token count, the
    /// same for every block of a query but the first.
    fn fast_prefix(&self, extra: u64, tokens: usize) -> FastPrefix {
        self.fast.prefix(extra, tokens)
    }

    /// [`ChainCache::fast_key_with`] from the prefix [`ChainCache::fast_prefix`] gave for this
    /// block's extra word and token count.
    #[inline]
    fn fast_key_after(&self, prefix: &FastPrefix, parent: u64, tokens: &[u32]) -> u64 {
        self.fast.key(*prefix, parent, tokens)
    }

    /// Remembers computed blocks: `(fast key, digest)` pairs.
    pub fn record(&self, blocks: &[(u64, Digest32)]) {
        if !self.enabled || blocks.is_empty() {
            return;
        }
        let mut map = self.map.write();
        for (i, &(k, digest)) in blocks.iter().enumerate() {
            if let Some(&(ahead, _)) = blocks.get(i + RECORD_AHEAD) {
                map.prefetch(ahead);
            }
            map.insert_with(k, BlockHash::from_digest(&digest).0, digest);
        }
    }

    /// A lookup handle for one query (none when the cache is off).
    fn reader(&self) -> Option<RwLockReadGuard<'_, Generations<u64, Digest32>>> {
        self.enabled.then(|| self.map.read())
    }
}

/// A query's chain: like [`crate::hash::Chain`], but each block's digest is taken from the
/// [`ChainCache`] while its fast key is there; from the first block that is not, SHA-256 is
/// computed for it and every later block. [`CachedChain::finish`] records what was computed.
pub struct CachedChain<'a> {
    cache: &'a ChainCache,
    reader: Option<RwLockReadGuard<'a, Generations<u64, Digest32>>>,
    profile: &'a HashProfile,
    tokens: &'a [u32],
    block_size: usize,
    lora_name: Option<&'a str>,
    cache_salt: Option<&'a str>,
    prefix_first: FastPrefix,
    prefix_rest: FastPrefix,
    parent: Parent,
    next: usize,
    scratch: Vec<u8>,
    computed: Vec<(u64, Digest32)>,
    hits: u64,
    /// Fast keys of the blocks `next..ahead` (block `b` at `b % RING`).
    ring: [u64; RING],
    /// Blocks whose fast keys are computed.
    ahead: usize,
    /// The fast key of block `ahead - 1` (the root before any).
    ahead_fast: u64,
}

/// How many entries ahead of the one it inserts [`ChainCache::record`] prefetches the slot of.
const RECORD_AHEAD: usize = 8;

/// Where the digest of the block before the next one is.
#[derive(Clone, Copy)]
enum Parent {
    /// There is none: the next block is the first.
    Root,
    /// Computed.
    Digest(Digest32),
    /// In the chain cache under this fast key (read only if a later block needs SHA-256).
    Cached(u64),
}

/// How many blocks ahead of the one it returns the chain has computed the fast key of, and
/// asked the cache to prefetch: time enough for memory to answer before the entry is read.
pub const LOOK_AHEAD: usize = 32;

const RING: usize = 2 * LOOK_AHEAD;

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
            prefix_first: cache.fast_prefix(cache.extra_word(&extra_first), block_size.max(1)),
            prefix_rest: cache.fast_prefix(cache.extra_word(&extra_rest), block_size.max(1)),
            parent: Parent::Root,
            next: 0,
            scratch: Vec::with_capacity(64 + 5 * block_size),
            computed: Vec::new(),
            hits: 0,
            ring: [0; RING],
            ahead: 0,
            ahead_fast: root,
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
        self.next_hash()?;
        Some(self.parent_digest())
    }

    /// The next block's index hash. A block found in the cache costs one lookup there; its
    /// digest stays in the cache until a later block has to be hashed from it.
    pub fn next_hash(&mut self) -> Option<BlockHash> {
        if self.next >= self.len() {
            return None;
        }
        let i = self.next;
        let (fast, cached) = if self.cache.enabled {
            self.look_ahead(i);
            let fast = self.ring[i % RING];
            (fast, self.reader.as_ref().and_then(|r| r.get(fast)))
        } else {
            (0, None)
        };
        let hash = match cached {
            Some((hash, old)) => {
                self.hits += 1;
                if old {
                    // used again: copied into the current generation by `finish`
                    let digest = self.cached_digest(fast);
                    self.computed.push((fast, digest));
                }
                self.parent = Parent::Cached(fast);
                BlockHash(hash)
            }
            _ => {
                let parent = match self.parent {
                    Parent::Root => None,
                    Parent::Digest(d) => Some(d),
                    Parent::Cached(f) => Some(self.cached_digest(f)),
                };
                // from here on every block is hashed
                self.reader = None;
                let block = &self.tokens[i * self.block_size..(i + 1) * self.block_size];
                let extra = Extra::Request {
                    lora_name: self.lora_name,
                    cache_salt: if i == 0 { self.cache_salt } else { None },
                };
                let digest =
                    self.profile
                        .block_with(&mut self.scratch, parent.as_ref(), block, extra);
                if self.cache.enabled {
                    self.computed.push((fast, digest));
                }
                self.parent = Parent::Digest(digest);
                BlockHash::from_digest(&digest)
            }
        };
        self.next += 1;
        Some(hash)
    }

    /// The digest of the block just returned (called only after one was).
    fn parent_digest(&mut self) -> Digest32 {
        match self.parent {
            Parent::Digest(d) => d,
            Parent::Cached(f) => self.cached_digest(f),
            Parent::Root => Digest32::default(),
        }
    }

    /// The digest the cache holds under `fast`, a block this query found there. The read
    /// lock is held from that lookup to now, so the entry is still there; should it not be,
    /// the chain is hashed again from its first block.
    fn cached_digest(&mut self, fast: u64) -> Digest32 {
        if let Some((_, digest, _)) = self.reader.as_ref().and_then(|r| r.get_with(fast)) {
            return digest;
        }
        let mut parent = None;
        for b in 0..self.next {
            let block = &self.tokens[b * self.block_size..(b + 1) * self.block_size];
            let extra = Extra::Request {
                lora_name: self.lora_name,
                cache_salt: if b == 0 { self.cache_salt } else { None },
            };
            parent =
                Some(
                    self.profile
                        .block_with(&mut self.scratch, parent.as_ref(), block, extra),
                );
        }
        parent.unwrap_or_default()
    }

    /// Computes the fast keys up to [`LOOK_AHEAD`] blocks past `i` and asks the cache to
    /// prefetch their entries, so that memory works on later blocks while this one is used.
    fn look_ahead(&mut self, i: usize) {
        let horizon = (i + 1 + LOOK_AHEAD).min(self.len());
        while self.ahead < horizon {
            let b = self.ahead;
            let prefix = if b == 0 {
                &self.prefix_first
            } else {
                &self.prefix_rest
            };
            let fast = self
                .cache
                .fast_key_after(prefix, self.ahead_fast, self.block(b));
            self.push_fast(b, fast);
        }
    }

    /// The tokens of block `b`.
    fn block(&self, b: usize) -> &'a [u32] {
        &self.tokens[b * self.block_size..(b + 1) * self.block_size]
    }

    /// Keeps block `b`'s fast key and asks the cache to prefetch its entry.
    fn push_fast(&mut self, b: usize, fast: u64) {
        if let Some(reader) = self.reader.as_ref() {
            reader.prefetch(fast);
        }
        self.ring[b % RING] = fast;
        self.ahead_fast = fast;
        self.ahead = b + 1;
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
        self.next_hash()
    }
}

#[cfg(test)]
#[path = "chains_tests.rs"]
mod tests;
