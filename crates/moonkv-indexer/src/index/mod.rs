//! The prefix index: per partition, a hashed chain `block hash → holders`, where a holder is a
//! source slot and the tiers that source has the block in.
//!
//! A block hash names the whole prefix up to that block (every profile chains its parent), so a
//! lookup per block, stopping at the first block nobody holds, finds every worker's longest
//! prefix without storing parent links. Sources only ever set or clear their own bits, and
//! dropping a source clears exactly its bits, so removals, clears, unregistering and a source's
//! lost history all leave the index as if the source had never reported the dropped blocks.
//!
//! - `huge.rs`: [`HugePages`], the large tables' allocator (2 MiB pages).
//! - `mod.rs`: [`Partition`] (the map and its holder lists) and [`PrefixIndex`] (partitions by
//!   [`PartitionKey`], each behind its own lock).
//! - `table.rs`: [`Table`], the hash table both the partitions and the chain cache keep their
//!   blocks in, which a query can prefetch.
//! - `query.rs`: the walk that turns a chain of hashes into per-worker, per-tier matches.
//! - `chains.rs`: the [`ChainCache`] that gives queries the digests of blocks already hashed
//!   without computing SHA-256 again.

pub mod chains;
pub mod fast;
pub mod huge;
mod query;
pub mod table;

pub use chains::{CachedChain, ChainCache};
pub use huge::HugePages;
pub use query::{walk, WorkerRun, WALK_AHEAD};
pub use table::Table;

use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::hash::HashProfile;
use crate::ids::{BlockHash, PartitionKey, SourceSlot, Tier, TierMask};

/// Block hashes are already uniformly distributed digests; hashing them again is wasted work.
#[derive(Default, Clone, Copy)]
pub struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by `u64` keys; fold anything else in so it stays correct.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// One source's hold on a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// The source.
    pub source: SourceSlot,
    /// The tiers it has the block in (never empty inside the index).
    pub tiers: TierMask,
}

/// The holders of one block in 8 bytes, so that a block's slot in the index is 16 and a lookup
/// reads one cache line: almost always one holder, inline (source in the low 32 bits, tiers in
/// the next 8); otherwise [`MANY`] and the index of the list in the partition's [`Spill`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Holders(u64);

/// The mark of a spilled holder list.
const MANY: u64 = 1 << 63;

impl Holders {
    fn one(h: Holder) -> Holders {
        Holders(u64::from(h.source.0) | u64::from(h.tiers.0) << 32)
    }

    fn many(list: u32) -> Holders {
        Holders(MANY | u64::from(list))
    }

    /// The inline holder, or the index of the spilled list.
    fn get(self) -> Result<Holder, usize> {
        if self.0 & MANY != 0 {
            return Err((self.0 & 0xffff_ffff) as usize);
        }
        Ok(Holder {
            source: SourceSlot(self.0 as u32),
            tiers: TierMask((self.0 >> 32) as u8),
        })
    }
}

/// The holder lists of blocks held by more than one source, reused through a free list.
#[derive(Debug, Default)]
struct Spill {
    lists: Vec<Vec<Holder>>,
    free: Vec<u32>,
}

impl Spill {
    fn add(&mut self, list: Vec<Holder>) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.lists[i as usize] = list;
                i
            }
            None => {
                self.lists.push(list);
                (self.lists.len() - 1) as u32
            }
        }
    }

    fn release(&mut self, i: usize) {
        self.lists[i] = Vec::new();
        self.free.push(i as u32);
    }

    /// Applies `change` to `source`'s tiers in `holders`; returns whether anything changed and
    /// whether the block is now held by nobody.
    fn update(
        &mut self,
        holders: &mut Holders,
        source: SourceSlot,
        change: impl Fn(TierMask) -> TierMask,
    ) -> (bool, bool) {
        match holders.get() {
            Ok(h) if h.source == source => {
                let new = change(h.tiers);
                *holders = Holders::one(Holder { source, tiers: new });
                (new != h.tiers, new.is_empty())
            }
            Ok(h) => {
                let new = change(TierMask::EMPTY);
                if new.is_empty() {
                    return (false, h.tiers.is_empty());
                }
                *holders = Holders::many(self.add(vec![h, Holder { source, tiers: new }]));
                (true, false)
            }
            Err(i) => {
                let v = &mut self.lists[i];
                let changed = match v.iter().position(|h| h.source == source) {
                    Some(j) => {
                        let new = change(v[j].tiers);
                        let changed = new != v[j].tiers;
                        if new.is_empty() {
                            v.swap_remove(j);
                        } else {
                            v[j].tiers = new;
                        }
                        changed
                    }
                    None => {
                        let new = change(TierMask::EMPTY);
                        if !new.is_empty() {
                            v.push(Holder { source, tiers: new });
                        }
                        !new.is_empty()
                    }
                };
                let empty = v.is_empty();
                if v.len() <= 1 {
                    *holders = v.first().map_or(Holders::default(), |&h| Holders::one(h));
                    self.release(i);
                }
                (changed, empty)
            }
        }
    }

    fn heap_bytes(&self) -> usize {
        self.lists.capacity() * std::mem::size_of::<Vec<Holder>>()
            + self
                .lists
                .iter()
                .map(|v| v.capacity() * std::mem::size_of::<Holder>())
                .sum::<usize>()
            + self.free.capacity() * 4
    }
}

/// The holders of a block, as [`Partition::holders`] gives them.
#[derive(Debug, Clone, Copy)]
pub enum HolderList<'a> {
    /// One holder (the usual case).
    One([Holder; 1]),
    /// Several.
    Many(&'a [Holder]),
}

impl std::ops::Deref for HolderList<'_> {
    type Target = [Holder];

    fn deref(&self) -> &[Holder] {
        match self {
            HolderList::One(h) => h,
            HolderList::Many(v) => v,
        }
    }
}

/// The blocks of one partition and the profile its queries hash with.
#[derive(Debug)]
pub struct Partition {
    profile: HashProfile,
    chain_root: u64,
    blocks: Table<Holders>,
    spill: Spill,
}

impl Partition {
    /// An empty partition hashed with `profile`, whose chains start from the fast key
    /// `chain_root` in the [`ChainCache`].
    pub fn new(profile: HashProfile, chain_root: u64) -> Partition {
        Partition {
            profile,
            chain_root,
            blocks: Table::new(),
            spill: Spill::default(),
        }
    }

    /// The profile queries of this partition hash with.
    pub fn profile(&self) -> &HashProfile {
        &self.profile
    }

    /// The fast key before the partition's first block ([`ChainCache::root`]).
    pub fn chain_root(&self) -> u64 {
        self.chain_root
    }

    /// Marks `hash` as held by `source` in `tier`; true if that is new.
    pub fn store(&mut self, hash: BlockHash, source: SourceSlot, tier: Tier) -> bool {
        let tiers = TierMask::EMPTY.with(tier);
        let (holders, inserted) = self
            .blocks
            .get_or_insert_with(hash.0, || Holders::one(Holder { source, tiers }));
        inserted || self.spill.update(holders, source, |m| m.with(tier)).0
    }

    /// Clears `source`'s `tier` for `hash`; true if it was set.
    pub fn remove(&mut self, hash: BlockHash, source: SourceSlot, tier: Tier) -> bool {
        self.set_tiers(hash, source, |m| m.without(tier))
    }

    /// Clears every tier `source` holds `hash` in; true if any was set.
    pub fn remove_all_tiers(&mut self, hash: BlockHash, source: SourceSlot) -> bool {
        self.set_tiers(hash, source, |_| TierMask::EMPTY)
    }

    fn set_tiers(
        &mut self,
        hash: BlockHash,
        source: SourceSlot,
        change: impl Fn(TierMask) -> TierMask,
    ) -> bool {
        let Some(holders) = self.blocks.get_mut(hash.0) else {
            return false;
        };
        let (changed, empty) = self.spill.update(holders, source, change);
        if empty {
            self.blocks.remove(hash.0);
        }
        changed
    }

    /// Drops every block hold of `source`; returns how many blocks it held.
    pub fn remove_source(&mut self, source: SourceSlot) -> usize {
        let mut dropped = 0;
        let spill = &mut self.spill;
        self.blocks.retain(|_, holders| {
            let (changed, empty) = spill.update(holders, source, |_| TierMask::EMPTY);
            dropped += usize::from(changed);
            !empty
        });
        dropped
    }

    /// Starts loading the slot of `hash` (see [`Table::prefetch`]).
    #[inline]
    pub fn prefetch(&self, hash: BlockHash) {
        self.blocks.prefetch(hash.0);
    }

    /// The holders of `hash`, if anyone holds it.
    #[inline]
    pub fn holders(&self, hash: BlockHash) -> Option<HolderList<'_>> {
        let h = self.blocks.get(hash.0)?;
        Some(match h.get() {
            Ok(one) => HolderList::One([one]),
            Err(i) => HolderList::Many(&self.spill.lists[i]),
        })
    }

    /// Blocks held by anyone.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// True when no block is held.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// An estimate of the heap bytes the partition uses (table slots plus spilled holder lists).
    pub fn heap_bytes(&self) -> usize {
        self.blocks.heap_bytes() + self.spill.heap_bytes()
    }

    /// Reserves room for `additional` more blocks.
    pub fn reserve(&mut self, additional: usize) {
        self.blocks.reserve(additional);
    }
}

/// Every partition, each behind its own lock so queries of one model never wait for the
/// writers of another.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    partitions: RwLock<HashMap<PartitionKey, Arc<RwLock<Partition>>>>,
    chains: ChainCache,
}

/// Why a partition could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileMismatch {
    /// The profile the partition already has.
    pub existing: HashProfile,
}

impl PrefixIndex {
    /// An empty index with a chain cache of the default size.
    pub fn new() -> PrefixIndex {
        PrefixIndex::default()
    }

    /// An empty index whose chain cache holds at most `chain_cache_blocks` blocks (`0`: none).
    pub fn with_chain_cache(chain_cache_blocks: usize) -> PrefixIndex {
        PrefixIndex {
            partitions: RwLock::default(),
            chains: ChainCache::new(chain_cache_blocks),
        }
    }

    /// The chain cache.
    pub fn chains(&self) -> &ChainCache {
        &self.chains
    }

    /// The partition for `key`, if it exists.
    pub fn partition(&self, key: &PartitionKey) -> Option<Arc<RwLock<Partition>>> {
        self.partitions.read().get(key).cloned()
    }

    /// The partition for `key`, created with `profile` if missing. An existing partition with
    /// another profile is refused: its hashes could never match the new source's.
    pub fn partition_or_create(
        &self,
        key: &PartitionKey,
        profile: &HashProfile,
    ) -> Result<Arc<RwLock<Partition>>, ProfileMismatch> {
        if let Some(p) = self.partition(key) {
            return check_profile(p, profile);
        }
        let mut map = self.partitions.write();
        let p = map
            .entry(key.clone())
            .or_insert_with(|| {
                let root = self.chains.root(key, profile);
                Arc::new(RwLock::new(Partition::new(profile.clone(), root)))
            })
            .clone();
        drop(map);
        check_profile(p, profile)
    }

    /// Drops every hold of `source` in every partition; returns the blocks it held. Empty
    /// partitions stay (their profile was agreed by registration).
    pub fn remove_source(&self, source: SourceSlot) -> usize {
        let parts: Vec<_> = self.partitions.read().values().cloned().collect();
        parts.iter().map(|p| p.write().remove_source(source)).sum()
    }

    /// Blocks held, over all partitions.
    pub fn blocks(&self) -> usize {
        self.partitions
            .read()
            .values()
            .map(|p| p.read().len())
            .sum()
    }

    /// Estimated heap bytes, over all partitions.
    pub fn heap_bytes(&self) -> usize {
        self.partitions
            .read()
            .values()
            .map(|p| p.read().heap_bytes())
            .sum()
    }

    /// The partition keys, sorted.
    pub fn keys(&self) -> Vec<PartitionKey> {
        let mut keys: Vec<_> = self.partitions.read().keys().cloned().collect();
        keys.sort();
        keys
    }
}

fn check_profile(
    p: Arc<RwLock<Partition>>,
    profile: &HashProfile,
) -> Result<Arc<RwLock<Partition>>, ProfileMismatch> {
    let existing = p.read().profile().clone();
    if &existing == profile {
        Ok(p)
    } else {
        Err(ProfileMismatch { existing })
    }
}

#[cfg(test)]
mod tests;
