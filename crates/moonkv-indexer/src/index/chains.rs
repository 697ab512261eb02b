//! The chain cache: block digests the indexer already computed, found again without SHA-256.
//!
//! Every block whose digest the indexer computes from token ids (at ingest, and on the query
//! path) is remembered under a *fast key*, a keyed SipHash chained like the digest itself:
//!
//! ```text
//! fast(-1) = SipHash_k(partition key, profile, its root digest)
//! fast(i)  = SipHash_k(fast(i-1), block i's token ids, block i's extra keys as CBOR)
//! ```
//!
//! `k` is a random key drawn once per process (`std`'s `RandomState`). The fast key covers
//! everything the block's digest depends on (the profile, the parent chain, the tokens and
//! the extra keys, byte for byte as the digest reads them), so a given fast key can only ever
//! stand for one digest. An entry also keeps its parent's fast key, and a lookup must present
//! the same parent, so a false hit needs two blocks under one parent whose 64-bit keyed hashes
//! collide (about 2^-64 per lookup, with a key no outsider sees). A miss is always safe: the
//! query computes SHA-256 from there on and records what it computed.
//!
//! Memory is bounded: entries go into the current generation; when it holds
//! [`ChainCache::generation_blocks`] entries it becomes the previous one and the one before
//! is dropped whole. A hit in the previous generation is copied into the current one, so
//! blocks in use survive. Both generations together hold at most twice that many entries.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};

use parking_lot::{RwLock, RwLockReadGuard};

use prometheus_client::metrics::counter::Counter;

use super::PassThroughHasher;
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

type FastMap<V> = HashMap<u64, V, BuildHasherDefault<PassThroughHasher>>;

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

    /// Inserts (or replaces) `key`. Returns the generation that had to go, if one did, so the
    /// caller can free it after releasing any lock.
    pub fn insert(&mut self, key: u64, value: V) -> Option<FastMap<V>> {
        if self.per_generation == 0 {
            return None;
        }
        let mut retired = None;
        if self.current.len() >= self.per_generation && !self.current.contains_key(&key) {
            // reserved whole so the table never rehashes while readers wait
            let fresh = FastMap::with_capacity_and_hasher(self.per_generation, Default::default());
            let full = std::mem::replace(&mut self.current, fresh);
            retired = Some(std::mem::replace(&mut self.previous, full));
        }
        self.current.insert(key, value);
        retired
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.current = FastMap::default();
        self.previous = FastMap::default();
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
        ChainCache {
            keys: std::collections::hash_map::RandomState::new(),
            enabled: blocks > 0,
            map: RwLock::new(Generations::new(blocks.div_ceil(2))),
            stats: ChainStats::default(),
        }
    }

    /// The size [`CHAIN_CACHE_ENV`] asks for, else [`DEFAULT_CHAIN_CACHE_BLOCKS`].
    pub fn blocks_from_env() -> Result<usize, String> {
        match std::env::var(CHAIN_CACHE_ENV) {
            Err(_) => Ok(DEFAULT_CHAIN_CACHE_BLOCKS),
            Ok(v) => v
                .trim()
                .replace('_', "")
                .parse()
                .map_err(|_| format!("{CHAIN_CACHE_ENV}={v:?} is not a block count")),
        }
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
        let old = std::mem::replace(
            &mut *self.map.write(),
            Generations::new(self.generation_blocks()),
        );
        drop(old);
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

    /// The fast key of a block after `parent` with `tokens` and extra keys `extra_cbor` (as
    /// [`Extra::encode_for`] writes them).
    pub fn fast_key(&self, parent: u64, tokens: &[u32], extra_cbor: &[u8]) -> u64 {
        let mut h = self.keys.build_hasher();
        h.write_u64(parent);
        h.write_usize(tokens.len());
        let mut pairs = tokens.chunks_exact(2);
        for p in &mut pairs {
            h.write_u64(u64::from(p[0]) | u64::from(p[1]) << 32);
        }
        if let [last] = pairs.remainder() {
            h.write_u32(*last);
        }
        extra_cbor.hash(&mut h);
        h.finish()
    }

    /// Remembers computed blocks: `(fast key, entry)` pairs.
    pub fn record(&self, blocks: &[(u64, ChainEntry)]) {
        if !self.enabled || blocks.is_empty() {
            return;
        }
        let mut retired = Vec::new();
        {
            let mut map = self.map.write();
            for &(k, e) in blocks {
                retired.extend(map.insert(k, e));
            }
        }
        // freed outside the lock
        drop(retired);
    }

    /// A lookup handle for one query (none when the cache is off).
    fn reader(&self) -> Option<RwLockReadGuard<'_, Generations<ChainEntry>>> {
        self.enabled.then(|| self.map.read())
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
    extra_first: Vec<u8>,
    extra_rest: Vec<u8>,
    fast: u64,
    parent: Option<Digest32>,
    next: usize,
    scratch: Vec<u8>,
    computed: Vec<(u64, ChainEntry)>,
    hits: u64,
}

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
            extra_first,
            extra_rest,
            fast: root,
            parent: None,
            next: 0,
            scratch: Vec::with_capacity(64 + 5 * block_size),
            computed: Vec::new(),
            hits: 0,
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
            &self.extra_first
        } else {
            &self.extra_rest
        };
        let parent_fast = self.fast;
        let fast = if self.cache.enabled {
            self.cache.fast_key(parent_fast, block, extra)
        } else {
            0
        };
        let cached = self.reader.as_ref().and_then(|r| r.get(fast));
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
