//! Watermark eviction of memory replicas, and tenant-scoped eviction for quota admission.
//!
//! One round: objects with an evictable memory replica form the base; candidates are those not
//! hard-pinned and not leased. Pass 1 evicts `ceil(base × target)` unpinned candidates, oldest
//! lease first; expired parked buffers are released; pass 2 tops up to `ceil(base × lower)`,
//! falling back to soft-pinned candidates (oldest first) only when allowed. A grouped object is
//! evicted together with its group, and only if no member holds a lease.
//!
//! With a disk tier, memory is made room in ahead of demand: above
//! `offload_high_watermark_ratio` (memory use less the offloads in flight) a round offloads the
//! oldest objects until the offload low watermark is reached, and it never drops an object
//! there. Above the eviction watermark, or after a failed allocation, evicting the last memory
//! copy of an object whose node has a disk starts an offload instead (`offload.rs`); an object
//! whose disk is short of room waits for disk eviction (`pressure.rs`) to free it, and only an
//! object no disk can take is dropped. Offloads still in flight count toward a round's target,
//! so rounds do not evict more while they land. Puts that find no memory meanwhile wait for the
//! offloads (`pressure.rs`); one that gives up marks the tier stalled and the next round evicts
//! plainly, so a slow disk never blocks writers for longer than `put_space_wait_ms`.

use super::admin::EvictionReport;
use super::offload::OffloadStart;
use super::shard::After;
use super::Engine;
use moonkv_proto::SegmentId;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

#[derive(Debug)]
struct Candidate {
    lease: u64,
    put_start: u64,
    shard: usize,
    tenant: String,
    key: Box<str>,
    group: Option<Box<str>>,
    soft_pinned: bool,
}

#[derive(Debug, Default)]
struct Scan {
    base: usize,
    candidates: Vec<Candidate>,
    /// (tenant, group) with at least one leased member: never evicted this round.
    blocked: HashSet<(String, Box<str>)>,
}

/// Per-round bookkeeping.
struct Round<'a> {
    scan: &'a Scan,
    members: HashMap<(&'a str, &'a str), Vec<usize>>,
    done: Vec<bool>,
    keys: u64,
    bytes: u64,
    /// Start offloads instead of dropping last memory copies where possible.
    offload: bool,
    /// Offloads started (counted in `keys` too: they are the round's progress).
    offloads: u64,
    /// Object bytes of the offloads started.
    offload_bytes: u64,
    /// Only offload: never drop (the round makes room ahead of demand).
    offload_only: bool,
    /// Bytes each disk lacked for an offload.
    deficits: HashMap<SegmentId, u64>,
}

impl Engine {
    /// One watermark eviction round, if memory use is above the high watermark or an allocation
    /// failed since the last round.
    pub fn run_eviction(&self) -> EvictionReport {
        // Read before the usage: an offload landing in between then shows as freed memory,
        // never as a finished offload whose memory still counts.
        let pending = self.pending_offloads.count();
        let pending_bytes = self.pending_offloads.bytes();
        let capacity = self.usage.capacity.load(Ordering::Acquire);
        let allocated = self.usage.allocated.load(Ordering::Acquire);
        let ratio_of = |bytes: u64| {
            if capacity == 0 {
                0.0
            } else {
                bytes as f64 / capacity as f64
            }
        };
        let used = ratio_of(allocated);
        let (hw, ratio) = (
            self.config.eviction_high_watermark_ratio,
            self.config.eviction_ratio,
        );
        let flagged = self.need_eviction.load(Ordering::Acquire) && ratio > 0.0;
        let disks = self.any_disk_mounted();
        let effective = allocated.saturating_sub(pending_bytes);
        let offload_due = disks
            && (ratio_of(effective) > self.config.offload_high_watermark_ratio
                || (flagged && pending == 0));
        let evict_due = ratio_of(effective) > hw || flagged;
        if !(offload_due || evict_due) {
            if disks {
                self.run_disk_eviction(&HashMap::new());
            }
            return EvictionReport::default();
        }
        // The flags are consumed by this round; the next failed allocation raises them again.
        self.need_eviction.store(false, Ordering::Release);
        let stalled = self.offload_stalled.swap(false, Ordering::AcqRel);
        self.counters
            .attempted_evictions
            .fetch_add(1, Ordering::Relaxed);
        let target = ratio.max(used - hw + ratio);
        let lower = (target / 2.0).max(used - hw);
        let now = self.now();
        let scan = self.scan(None, now);
        let mut report = EvictionReport {
            triggered: true,
            ..Default::default()
        };
        if scan.base == 0 {
            return report;
        }
        let allow_pinned = self.config.allow_evict_soft_pinned_objects;
        let mut round = Round::new(&scan);
        let unpinned = scan.order(false);
        let pinned = if allow_pinned {
            scan.order(true)
        } else {
            Vec::new()
        };
        if offload_due && !stalled {
            // Ahead of demand: move the oldest objects to disk down to the low watermark.
            let low = (capacity as f64 * self.config.offload_low_watermark_ratio) as u64;
            let goal = effective.saturating_sub(low).max(1);
            round.offload = true;
            round.offload_only = true;
            for &i in unpinned.iter().chain(pinned.iter()) {
                if round.offload_bytes >= goal {
                    break;
                }
                self.evict_candidate(&mut round, i, now, allow_pinned);
            }
            round.offload_only = false;
            round.done.iter_mut().for_each(|d| *d = false);
        }
        if !evict_due {
            self.finish_round(&mut report, &round, 0);
            self.run_disk_eviction(&round.deficits);
            return report;
        }
        let plain = stalled;
        // Offloads started above are in `round.keys` already.
        let credit = if plain { 0 } else { pending };
        round.offload = !plain;
        let want = ((scan.base as f64 * target).ceil() as u64).saturating_sub(credit);
        for &i in &unpinned {
            if round.keys >= want {
                break;
            }
            self.evict_candidate(&mut round, i, now, allow_pinned);
        }
        let released = self.release_parked(now) as u64;
        let floor = (scan.base as f64 * lower).ceil() as u64;
        let need = floor.saturating_sub(round.keys + released + credit);
        if need > 0 {
            let goal = round.keys + need;
            for &i in unpinned.iter().chain(pinned.iter()) {
                if round.keys >= goal {
                    break;
                }
                self.evict_candidate(&mut round, i, now, allow_pinned);
            }
        }
        self.finish_round(&mut report, &round, released);
        if disks {
            self.run_disk_eviction(&round.deficits);
        }
        tracing::debug!(
            used,
            evicted = round.keys,
            offloads = round.offloads,
            released,
            "eviction round"
        );
        report
    }

    fn finish_round(&self, report: &mut EvictionReport, round: &Round<'_>, released: u64) {
        report.evicted_keys = round.keys;
        report.evicted_bytes = round.bytes;
        report.released_buffers = released;
        report.offloads_started = round.offloads;
        self.counters
            .evicted_key_count
            .fetch_add(round.keys - round.offloads, Ordering::Relaxed);
        self.counters
            .evicted_size_bytes
            .fetch_add(round.bytes, Ordering::Relaxed);
        if round.keys + released > 0 {
            self.counters
                .evictions_total
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Evicts the tenant's own evictable objects (unpinned first, oldest lease first) until
    /// `deficit` quota bytes are freed or candidates run out. Returns the bytes freed.
    pub(crate) fn evict_for_tenant(&self, tenant: &str, deficit: u64) -> u64 {
        let now = self.now();
        let scan = self.scan(Some(tenant), now);
        let allow_pinned = self.config.allow_evict_soft_pinned_objects;
        let mut round = Round::new(&scan);
        let mut order = scan.order(false);
        if allow_pinned {
            order.extend(scan.order(true));
        }
        for i in order {
            if round.bytes >= deficit {
                break;
            }
            self.evict_candidate(&mut round, i, now, allow_pinned);
        }
        self.counters
            .evicted_key_count
            .fetch_add(round.keys, Ordering::Relaxed);
        self.counters
            .evicted_size_bytes
            .fetch_add(round.bytes, Ordering::Relaxed);
        round.bytes
    }

    fn scan(&self, only_tenant: Option<&str>, now: u64) -> Scan {
        let mut scan = Scan::default();
        for i in 0..self.shards.len() {
            let shard = self.lock_shard(i);
            for (name, t) in shard.tenants.iter() {
                if only_tenant.is_some_and(|only| only != name) {
                    continue;
                }
                for (key, obj) in t.objects.iter() {
                    if let Some(g) = obj.group() {
                        if obj.lease_active(now) {
                            scan.blocked.insert((name.clone(), Box::from(g)));
                        }
                    }
                    if obj.hard_pinned || !obj.has_evictable_memory() {
                        continue;
                    }
                    scan.base += 1;
                    if obj.lease_active(now) || obj.has_offload() {
                        continue;
                    }
                    scan.candidates.push(Candidate {
                        lease: obj.lease_deadline_ms,
                        put_start: obj.put_start_ms,
                        shard: i,
                        tenant: name.clone(),
                        key: Box::from(key),
                        group: obj.group().map(Box::from),
                        soft_pinned: obj.soft_pinned(now),
                    });
                }
            }
        }
        scan
    }

    /// Evicts candidate `i` (with its whole group when grouped).
    fn evict_candidate(&self, round: &mut Round<'_>, i: usize, now: u64, allow_pinned: bool) {
        if round.done[i] {
            return;
        }
        let scan = round.scan;
        let c = &scan.candidates[i];
        let Some(group) = c.group.as_deref() else {
            round.done[i] = true;
            self.evict_one(round, i, now);
            return;
        };
        round.done[i] = true;
        if scan.blocked.contains(&(c.tenant.clone(), Box::from(group))) {
            return;
        }
        let members = round
            .members
            .get(&(c.tenant.as_str(), group))
            .cloned()
            .unwrap_or_default();
        self.evict_one(round, i, now);
        for m in members {
            if m != i && !round.done[m] && (allow_pinned || !scan.candidates[m].soft_pinned) {
                round.done[m] = true;
                self.evict_one(round, m, now);
            }
        }
    }

    /// Drops the evictable memory replicas of one object after re-checking it under its lock,
    /// or starts its offload to disk.
    fn evict_one(&self, round: &mut Round<'_>, i: usize, now: u64) {
        let c = &round.scan.candidates[i];
        let (offload, offload_only) = (round.offload, round.offload_only);
        let mut shard = self.lock_shard(c.shard);
        let outcome = self.with_object(&mut shard, &c.tenant, &c.key, |tenant, obj| {
            if obj.hard_pinned
                || obj.lease_active(now)
                || !obj.has_evictable_memory()
                || obj.has_offload()
            {
                return (Evicted::Nothing, After::Keep);
            }
            if offload {
                match self.try_start_offload(tenant, &c.key, obj, now) {
                    OffloadStart::Started => return (Evicted::Offload(obj.size), After::Keep),
                    OffloadStart::NeedsRoom(disk, bytes) => {
                        return (Evicted::NeedsRoom(disk, bytes), After::Keep)
                    }
                    OffloadStart::Impossible if offload_only => {
                        return (Evicted::Nothing, After::Keep)
                    }
                    OffloadStart::Impossible => {}
                }
            }
            let bytes = self.drop_memory_copies(tenant, &c.key, obj);
            let after = if obj.replicas.is_empty() {
                After::Erase
            } else {
                After::Keep
            };
            (Evicted::Dropped(bytes), after)
        });
        match outcome {
            Some(Evicted::Dropped(bytes)) => {
                round.keys += 1;
                round.bytes += bytes;
            }
            Some(Evicted::Offload(bytes)) => {
                round.keys += 1;
                round.offloads += 1;
                round.offload_bytes += bytes;
            }
            Some(Evicted::NeedsRoom(disk, bytes)) => {
                *round.deficits.entry(disk).or_default() += bytes;
            }
            Some(Evicted::Nothing) | None => {}
        }
    }
}

/// What evicting one candidate did.
enum Evicted {
    Nothing,
    Dropped(u64),
    /// An offload of this many object bytes started.
    Offload(u64),
    /// Its disk lacks room: neither dropped nor offloaded this round.
    NeedsRoom(SegmentId, u64),
}

impl Scan {
    /// Candidate indexes of one pin class, oldest lease first (ties by tenant, key).
    fn order(&self, soft_pinned: bool) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.candidates.len())
            .filter(|i| self.candidates[*i].soft_pinned == soft_pinned)
            .collect();
        order.sort_by(|a, b| {
            let (x, y) = (&self.candidates[*a], &self.candidates[*b]);
            (x.lease, x.put_start, &x.tenant, &x.key).cmp(&(
                y.lease,
                y.put_start,
                &y.tenant,
                &y.key,
            ))
        });
        order
    }
}

impl<'a> Round<'a> {
    fn new(scan: &'a Scan) -> Self {
        let mut members: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
        for (i, c) in scan.candidates.iter().enumerate() {
            if let Some(g) = c.group.as_deref() {
                members.entry((c.tenant.as_str(), g)).or_default().push(i);
            }
        }
        Round {
            scan,
            members,
            done: vec![false; scan.candidates.len()],
            keys: 0,
            bytes: 0,
            offload: false,
            offloads: 0,
            offload_bytes: 0,
            offload_only: false,
            deficits: HashMap::new(),
        }
    }
}
