//! [`Table`]: the hash table of the index and the chain cache, keyed by `u64`s that are
//! already uniformly distributed (block hashes, fast keys), which a query can *prefetch*.
//!
//! A long query looks up one block after another in tables of hundreds of MiB, and nearly every
//! lookup misses the CPU caches. Issued one after another, those misses bound the query. The
//! key of block `i + d` is known long before block `i` is done, though, so the query asks
//! [`Table::prefetch`] for it early and finds the slot in the cache when it gets there. A
//! general-purpose map (hashbrown) does not say where a key's slot is, so this one exists.
//!
//! Layout: open addressing with linear probing over a power-of-two number of slots, at most 3/4
//! full. A slot holds the key and the value side by side, so a lookup usually reads one cache
//! line. Data a lookup does not need (a chain entry's full digest) can go in a *cold* array
//! `C` beside the slots, moved with them, read only by the caller who asks for it. Key `0`
//! marks an empty slot, so a real key `0` is kept aside. A key's home slot is a multiplicative hash of the key and a per-table random word, so keys
//! chosen to pile up in one place (a source can send any block hash) do not know where they
//! land. Keys are placed Robin Hood style (a key further from its home takes the slot of one
//! nearer to its own), so keys stored last are no further from home than any other, and a
//! lookup stops as soon as it passes where its key would have to be. Removal shifts the rest
//! of the run back (no tombstones), so lookups never slow down with churn.
//!
//! Memory comes from [`HugePages`]: tables of 4 MiB and more lie on 2 MiB pages.

use allocator_api2::vec::Vec;

use super::HugePages;

/// At most 3 of every 4 slots hold a key.
const MAX_LOAD_NUM: usize = 3;
const MAX_LOAD_DEN: usize = 4;

/// Keys are the slot's mark: this one means "empty".
const EMPTY: u64 = 0;

/// Fibonacci hashing's multiplier (2^64 / φ, odd).
const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// A map from `u64` keys to `V`, with cold data `C` per key (see the module's text).
/// `Default` fills empty slots.
pub struct Table<V, C = ()> {
    slots: Vec<(u64, V), HugePages>,
    cold: Vec<C, HugePages>,
    /// The value of key `0`, which cannot live in a slot.
    zero: Option<(V, C)>,
    /// Keys in slots (not counting `zero`).
    len: usize,
    /// `64 - log2(slots)`.
    shift: u32,
    seed: u64,
}

impl<V, C> std::fmt::Debug for Table<V, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("len", &(self.len + usize::from(self.zero.is_some())))
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl<V: Default, C: Default> Default for Table<V, C> {
    fn default() -> Self {
        Table::new()
    }
}

fn seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(0x0074_6162_6c65_u64)
}

impl<V: Default> Table<V> {
    /// Sets `key` to `value`; returns the value it replaced.
    pub fn insert(&mut self, key: u64, value: V) -> Option<V> {
        self.insert_with(key, value, ()).map(|(v, ())| v)
    }

    /// Removes `key`; returns its value.
    pub fn remove(&mut self, key: u64) -> Option<V> {
        self.remove_with(key).map(|(v, ())| v)
    }
}

impl<V: Default, C: Default> Table<V, C> {
    /// An empty table; the first insertion allocates.
    pub fn new() -> Table<V, C> {
        Table {
            slots: Vec::new_in(HugePages),
            cold: Vec::new_in(HugePages),
            zero: None,
            len: 0,
            shift: 64,
            seed: seed(),
        }
    }

    /// An empty table that holds `entries` keys without growing.
    pub fn with_capacity(entries: usize) -> Table<V, C> {
        let mut t = Table::new();
        t.reserve(entries);
        t
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.len + usize::from(self.zero.is_some())
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots allocated.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Keys the table holds before it must grow.
    pub fn room(&self) -> usize {
        self.capacity() / MAX_LOAD_DEN * MAX_LOAD_NUM
    }

    /// Bytes of the slot arrays.
    pub fn heap_bytes(&self) -> usize {
        self.capacity() * (std::mem::size_of::<(u64, V)>() + std::mem::size_of::<C>())
    }

    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        // `shift` is 64 only while no slot exists, and no caller asks then
        ((key ^ self.seed).wrapping_mul(MULTIPLIER) >> self.shift) as usize
    }

    /// Starts loading the cache lines where `key` would be, so that a lookup of it soon after
    /// does not wait for memory. Changes nothing; a no-op on an empty table.
    #[inline]
    pub fn prefetch(&self, key: u64) {
        if self.slots.is_empty() {
            return;
        }
        // The home slot and the one after it (a key is found there or close by), which may
        // reach into the next cache line.
        let slot = self
            .slots
            .as_ptr()
            .wrapping_add(self.home(key))
            .cast::<u8>();
        prefetch(slot);
        let in_line = slot as usize % 64;
        if in_line + 2 * std::mem::size_of::<(u64, V)>() > 64 {
            prefetch(slot.wrapping_add(64));
        }
    }

    /// The slot holding `key` (not `0`).
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        self.search(key).ok()
    }

    /// `Ok(slot)` of `key` (not `0`), or `Err((slot, distance))`: where its lookup stopped,
    /// which is where [`Table::place_at`] puts it, that many slots past its home.
    #[inline]
    fn search(&self, key: u64) -> Result<usize, (usize, usize)> {
        if self.slots.is_empty() {
            return Err((0, 0));
        }
        let mask = self.mask();
        let mut i = self.home(key);
        let mut dist = 0;
        loop {
            let k = self.slots[i].0;
            if k == key {
                return Ok(i);
            }
            // Robin Hood order: a key further from home than the one here would sit here
            if k == EMPTY || self.dist(k, i) < dist {
                return Err((i, dist));
            }
            i = (i + 1) & mask;
            dist += 1;
        }
    }

    /// How far slot `i`, holding `key`, lies past `key`'s home.
    #[inline]
    fn dist(&self, key: u64, i: usize) -> usize {
        i.wrapping_sub(self.home(key)) & self.mask()
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<&V> {
        if key == EMPTY {
            return self.zero.as_ref().map(|(v, _)| v);
        }
        self.find(key).map(|i| &self.slots[i].1)
    }

    /// The value and the cold data of `key`.
    pub fn get_with(&self, key: u64) -> Option<(&V, &C)> {
        if key == EMPTY {
            return self.zero.as_ref().map(|(v, c)| (v, c));
        }
        self.find(key).map(|i| (&self.slots[i].1, &self.cold[i]))
    }

    /// The value of `key`, to change in place.
    pub fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        if key == EMPTY {
            return self.zero.as_mut().map(|(v, _)| v);
        }
        self.find(key).map(|i| &mut self.slots[i].1)
    }

    /// True when `key` is held.
    pub fn contains_key(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    /// Sets `key` to `value` and its cold data to `cold`; returns what it replaced.
    pub fn insert_with(&mut self, key: u64, value: V, cold: C) -> Option<(V, C)> {
        if key == EMPTY {
            return self.zero.replace((value, cold));
        }
        let at = match self.search(key) {
            Ok(i) => {
                let v = std::mem::replace(&mut self.slots[i].1, value);
                return Some((v, std::mem::replace(&mut self.cold[i], cold)));
            }
            Err(at) => at,
        };
        self.add(key, value, cold, at);
        None
    }

    /// Adds an absent key whose lookup stopped at `at` (see [`Table::search`]); returns its
    /// slot.
    fn add(&mut self, key: u64, value: V, cold: C, at: (usize, usize)) -> usize {
        self.len += 1;
        if self.len > self.room() {
            self.grow_to(self.len);
            let i = self.home(key);
            return self.place_at(i, 0, key, value, cold);
        }
        self.place_at(at.0, at.1, key, value, cold)
    }

    /// Puts an absent key in its Robin Hood place: along its run, it takes the slot of the
    /// first key nearer its own home than it is, which then moves on the same way. So every
    /// key ends about equally far from home, and keys stored late (the ones a query asks for
    /// most) are not pushed to the ends of long runs. The search starts at slot `i`, `dist`
    /// past the key's home, where no earlier slot can take it. Returns the key's slot.
    fn place_at(&mut self, mut i: usize, mut dist: usize, key: u64, value: V, cold: C) -> usize {
        let mask = self.mask();
        let mut carried = (key, value);
        let mut carried_cold = cold;
        let mut first = None;
        loop {
            let k = self.slots[i].0;
            if k == EMPTY {
                self.slots[i] = carried;
                self.cold[i] = carried_cold;
                return first.unwrap_or(i);
            }
            let theirs = self.dist(k, i);
            if theirs < dist {
                std::mem::swap(&mut self.slots[i], &mut carried);
                std::mem::swap(&mut self.cold[i], &mut carried_cold);
                first.get_or_insert(i);
                dist = theirs;
            }
            i = (i + 1) & mask;
            dist += 1;
        }
    }

    /// The value of `key`, inserted from `make` if absent; true when it was inserted.
    pub fn get_or_insert_with(&mut self, key: u64, make: impl FnOnce() -> V) -> (&mut V, bool) {
        if key == EMPTY {
            let inserted = self.zero.is_none();
            let (v, _) = self.zero.get_or_insert_with(|| (make(), C::default()));
            return (v, inserted);
        }
        match self.search(key) {
            Ok(i) => (&mut self.slots[i].1, false),
            Err(at) => {
                let i = self.add(key, make(), C::default(), at);
                (&mut self.slots[i].1, true)
            }
        }
    }

    /// Removes `key`; returns its value and cold data.
    pub fn remove_with(&mut self, key: u64) -> Option<(V, C)> {
        if key == EMPTY {
            return self.zero.take();
        }
        let i = self.find(key)?;
        Some(self.remove_at(i))
    }

    /// Empties slot `i` and moves the rest of its run back so every key stays reachable.
    fn remove_at(&mut self, i: usize) -> (V, C) {
        let mask = self.mask();
        let value = std::mem::take(&mut self.slots[i].1);
        let cold = std::mem::take(&mut self.cold[i]);
        self.slots[i].0 = EMPTY;
        self.len -= 1;
        // Move the rest of the run back one slot, up to an empty slot or a key at home: the
        // Robin Hood order holds and every key stays reachable.
        let mut hole = i;
        loop {
            let j = (hole + 1) & mask;
            let k = self.slots[j].0;
            if k == EMPTY || self.dist(k, j) == 0 {
                return (value, cold);
            }
            self.slots.swap(hole, j);
            self.cold.swap(hole, j);
            hole = j;
        }
    }

    /// Keeps the entries `keep` returns true for; calls it once per entry.
    pub fn retain(&mut self, mut keep: impl FnMut(u64, &mut V) -> bool) {
        if let Some((v, _)) = self.zero.as_mut() {
            if !keep(EMPTY, v) {
                self.zero = None;
            }
        }
        if self.len == 0 {
            return;
        }
        let mask = self.mask();
        // Start right after an empty slot: runs never wrap past it, so the entries moved back
        // by a removal land at or after the cursor, never on a slot already visited.
        let start = (0..self.slots.len())
            .find(|&i| self.slots[i].0 == EMPTY)
            .expect("a table at most 3/4 full has an empty slot");
        let mut step = 0;
        while step < self.slots.len() {
            let i = (start + step) & mask;
            let (k, v) = &mut self.slots[i];
            if *k != EMPTY && !keep(*k, v) {
                self.remove_at(i);
                // an entry may have moved into `i`: look at it again
                continue;
            }
            step += 1;
        }
    }

    /// Every value, in no particular order.
    #[cfg(test)]
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.slots
            .iter()
            .filter(|(k, _)| *k != EMPTY)
            .map(|(_, v)| v)
            .chain(self.zero.iter().map(|(v, _)| v))
    }

    /// Drops every entry and keeps the slots.
    pub fn clear(&mut self) {
        if std::mem::needs_drop::<V>() || std::mem::needs_drop::<C>() {
            for (i, (k, v)) in self.slots.iter_mut().enumerate() {
                if *k != EMPTY {
                    *v = V::default();
                    self.cold[i] = C::default();
                }
            }
        }
        // One pass of plain stores (the cold array needs none: an empty key hides it).
        self.slots.fill_with(|| (EMPTY, V::default()));
        self.zero = None;
        self.len = 0;
    }

    /// Makes room for `additional` more keys without growing.
    pub fn reserve(&mut self, additional: usize) {
        let want = self.len + additional;
        if want > self.room() {
            self.grow_to(want);
        }
    }

    /// Moves every entry into a table with room for `entries` keys.
    fn grow_to(&mut self, entries: usize) {
        let slots = (entries * MAX_LOAD_DEN)
            .div_ceil(MAX_LOAD_NUM)
            .next_power_of_two()
            .max(16);
        let mut new = Vec::with_capacity_in(slots, HugePages);
        new.resize_with(slots, || (EMPTY, V::default()));
        let mut cold = Vec::with_capacity_in(slots, HugePages);
        cold.resize_with(slots, C::default);
        let old = std::mem::replace(&mut self.slots, new);
        let old_cold = std::mem::replace(&mut self.cold, cold);
        self.shift = 64 - slots.trailing_zeros();
        for ((k, v), c) in old.into_iter().zip(old_cold) {
            if k != EMPTY {
                let i = self.home(k);
                self.place_at(i, 0, k, v, c);
            }
        }
    }
}

/// Asks the processor to load the cache line at `p` (a hint: never faults, changes nothing).
#[inline(always)]
#[allow(unsafe_code)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` only hints the cache; it reads no byte the program sees and cannot
    // fault, whatever the address. SSE is part of every x86-64 processor.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u32),
        Remove(u64),
        Retain(u32),
        Clear,
    }

    /// Keys from a small range (so removals hit and runs form), plus `0` and `u64::MAX`.
    fn key() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..200, Just(0u64), Just(u64::MAX)]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (key(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            4 => key().prop_map(Op::Remove),
            1 => (1u32..5).prop_map(Op::Retain),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        #[test]
        fn behaves_as_a_map_through_inserts_removals_and_retains(
            ops in proptest::collection::vec(op(), 1..400),
        ) {
            let mut t: Table<u32> = Table::new();
            let mut m: HashMap<u64, u32> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(t.insert(k, v), m.insert(k, v)),
                    Op::Remove(k) => prop_assert_eq!(t.remove(k), m.remove(&k)),
                    Op::Retain(d) => {
                        let mut seen = Vec::new();
                        t.retain(|k, v| { seen.push(k); *v % d != 0 });
                        seen.sort_unstable();
                        let mut before: Vec<u64> = m.keys().copied().collect();
                        before.sort_unstable();
                        // called once for each entry, no more
                        prop_assert_eq!(seen, before);
                        m.retain(|_, v| *v % d != 0);
                    }
                    Op::Clear => { t.clear(); m.clear(); }
                }
                prop_assert_eq!(t.len(), m.len());
                prop_assert!(t.len() <= t.room() + 1);
                robin_hood_order(&t)?;
                for k in 0u64..200 {
                    prop_assert_eq!(t.get(k), m.get(&k));
                }
                prop_assert_eq!(t.get(u64::MAX), m.get(&u64::MAX));
                let mut vals: Vec<u32> = t.values().copied().collect();
                let mut want: Vec<u32> = m.values().copied().collect();
                vals.sort_unstable();
                want.sort_unstable();
                prop_assert_eq!(vals, want);
            }
        }
    }

    /// The order lookups stop by: along a run, no key is nearer its home than the key
    /// before it, less one slot, and no key sits past an empty slot after its home.
    fn robin_hood_order(t: &Table<u32>) -> Result<(), TestCaseError> {
        let n = t.capacity();
        for i in 0..n {
            let k = t.slots[i].0;
            if k == EMPTY {
                continue;
            }
            let d = t.dist(k, i);
            if d > 0 {
                let prev = (i + n - 1) % n;
                let pk = t.slots[prev].0;
                prop_assert!(pk != EMPTY, "slot {i} is {d} past home after an empty slot");
                prop_assert!(t.dist(pk, prev) + 1 >= d, "slot {i} breaks the order");
            }
        }
        Ok(())
    }

    #[test]
    fn removing_from_a_run_that_wraps_past_the_end_keeps_every_key() {
        // Twelve keys whose home is the last of 16 slots: one run that wraps round.
        let mut t: Table<u64> = Table::with_capacity(12);
        assert_eq!(t.capacity(), 16);
        let keys: std::vec::Vec<u64> = (1..).filter(|&k| t.home(k) == 15).take(12).collect();
        for &k in &keys {
            t.insert(k, k * 10);
        }
        assert_eq!(t.slots[0].0, keys[1], "the run wraps");
        for (n, &k) in keys.iter().enumerate() {
            assert_eq!(t.remove(k), Some(k * 10));
            for &rest in &keys[n + 1..] {
                assert_eq!(
                    t.get(rest),
                    Some(&(rest * 10)),
                    "lost {rest} after removing {k}"
                );
            }
        }
        assert!(t.is_empty());
    }

    #[test]
    fn values_that_own_memory_are_dropped_by_clear_and_retain() {
        let mut t: Table<std::vec::Vec<u8>> = Table::new();
        for k in 1..100u64 {
            t.insert(k, vec![k as u8; 8]);
        }
        t.retain(|k, _| k % 2 == 0);
        assert_eq!(t.len(), 49);
        assert!(t.values().all(|v| v[0] % 2 == 0));
        t.clear();
        assert!(t.is_empty());
        assert!(t.values().next().is_none());
        t.insert(7, vec![1]);
        assert_eq!(t.get(7), Some(&vec![1]));
    }

    #[test]
    fn prefetching_changes_nothing() {
        let mut t: Table<u32> = Table::new();
        t.prefetch(5);
        t.insert(5, 1);
        t.prefetch(5);
        t.prefetch(6);
        assert_eq!(t.get(5), Some(&1));
        assert_eq!(t.get(6), None);
    }
}
