//! Watermark eviction of memory replicas, and tenant-scoped eviction for quota admission.
//!
//! One round: objects with an evictable memory replica form the base; candidates are those not
//! hard-pinned and not leased. Pass 1 evicts `ceil(base × target)` unpinned candidates, oldest
//! lease first; expired parked buffers are released; pass 2 tops up to `ceil(base × lower)`,
//! falling back to soft-pinned candidates (oldest first) only when allowed. A grouped object is
//! evicted together with its group, and only if no member holds a lease.
//!
//! With a disk tier, evicting the last memory copy of an object whose node has disk room starts
//! an offload instead (`offload.rs`). Offloads still in flight count toward a round's target, so
//! rounds do not evict more while they land; but once an allocation has failed while offloads
//! are pending, the next round evicts plainly (no new offloads), so a slow node cannot stall
//! writers.

use super::admin::EvictionReport;
use super::shard::After;
use super::Engine;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

#[derive(Debug)]
struct Candidate {
    lease: u64,
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
}

impl Engine {
    /// One watermark eviction round, if memory use is above the high watermark or an allocation
    /// failed since the last round.
    pub fn run_eviction(&self) -> EvictionReport {
        // Read before the usage: an offload landing in between then shows as freed memory,
        // never as a finished offload whose memory still counts.
        let pending = self.pending_offloads.load(Ordering::Acquire);
        let capacity = self.usage.capacity.load(Ordering::Acquire);
        let allocated = self.usage.allocated.load(Ordering::Acquire);
        let used = if capacity == 0 {
            0.0
        } else {
            allocated as f64 / capacity as f64
        };
        let (hw, ratio) = (
            self.config.eviction_high_watermark_ratio,
            self.config.eviction_ratio,
        );
        let flagged = self.need_eviction.load(Ordering::Acquire) && ratio > 0.0;
        if !(used > hw || flagged) {
            return EvictionReport::default();
        }
        // The flag is consumed by this round; the next failed allocation raises it again.
        self.need_eviction.store(false, Ordering::Release);
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
        let plain = flagged && pending > 0;
        let credit = if plain { 0 } else { pending };
        let allow_pinned = self.config.allow_evict_soft_pinned_objects;
        let mut round = Round::new(&scan);
        round.offload = !plain;
        let unpinned = scan.order(false);
        let pinned = if allow_pinned {
            scan.order(true)
        } else {
            Vec::new()
        };

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
        tracing::debug!(
            used,
            evicted = round.keys,
            offloads = round.offloads,
            released,
            "eviction round"
        );
        report
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
                        shard: i,
                        tenant: name.clone(),
                        key: key.clone(),
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
        let offload = round.offload;
        let mut shard = self.lock_shard(c.shard);
        let freed = self.with_object(&mut shard, &c.tenant, &c.key, |tenant, obj| {
            if obj.hard_pinned
                || obj.lease_active(now)
                || !obj.has_evictable_memory()
                || obj.has_offload()
            {
                return (None, After::Keep);
            }
            if offload && self.try_start_offload(tenant, &c.key, obj, now) {
                return (Some(None), After::Keep);
            }
            let bytes = self.drop_memory_copies(tenant, &c.key, obj);
            let after = if obj.replicas.is_empty() {
                After::Erase
            } else {
                After::Keep
            };
            (Some(Some(bytes)), after)
        });
        match freed {
            Some(Some(Some(bytes))) => {
                round.keys += 1;
                round.bytes += bytes;
            }
            Some(Some(None)) => {
                round.keys += 1;
                round.offloads += 1;
            }
            _ => {}
        }
    }
}

impl Scan {
    /// Candidate indexes of one pin class, oldest lease first (ties by tenant, key).
    fn order(&self, soft_pinned: bool) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.candidates.len())
            .filter(|i| self.candidates[*i].soft_pinned == soft_pinned)
            .collect();
        order.sort_by(|a, b| {
            let (x, y) = (&self.candidates[*a], &self.candidates[*b]);
            (x.lease, &x.tenant, &x.key).cmp(&(y.lease, &y.tenant, &y.key))
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
        }
    }
}
