//! Reclamation of stalled writes and release of parked buffers.
//!
//! Unlike upstream, where the sweep piggybacks on eviction and a stalled write can survive about
//! twice the release timeout without memory pressure, this sweep runs on its own every time it
//! is called, so a write stalled past `put_start_release_timeout` is reclaimed within one sweep
//! period.

use super::object::{PinIntent, Replica};
use super::{Engine, ParkedBuffer};
use std::sync::atomic::Ordering;

impl Engine {
    /// Reclaims writes started more than `put_start_release_timeout` ago (their PROCESSING
    /// replicas are freed; an object left empty disappears) and releases parked buffers whose
    /// deadline passed, and cancels offloads not reported by their deadline. Returns writes
    /// reclaimed plus buffers released plus offloads cancelled.
    pub fn sweep_stalled_writes(&self) -> usize {
        let now = self.now();
        let release = self.config.put_start_release_timeout_ms;
        let mut reclaimed = 0usize;
        for i in 0..self.shards.len() {
            let mut guard = self.lock_shard(i);
            let shard = &mut *guard;
            if shard.oldest_in_flight_ms == u64::MAX
                || shard.oldest_in_flight_ms.saturating_add(release) >= now
            {
                continue;
            }
            let mut oldest = u64::MAX;
            for t in shard.tenants.values_mut() {
                let tid = &t.tenant;
                t.objects.retain(|key, obj| {
                    if !obj.in_flight {
                        return true;
                    }
                    if obj.put_start_ms.saturating_add(release) >= now {
                        oldest = oldest.min(obj.put_start_ms);
                        return true;
                    }
                    let before = obj.media();
                    // Past the release deadline nobody may still be writing: free at once.
                    obj.replicas.retain(|r| !r.is_processing());
                    obj.in_flight = false;
                    obj.set_pin_intent(PinIntent::Preserve);
                    self.placement_changed(tid, key, obj, before);
                    reclaimed += 1;
                    if obj.replicas.iter().any(Replica::handle_valid) {
                        return true;
                    }
                    self.erase_in_place(tid, key, obj);
                    false
                });
            }
            shard.oldest_in_flight_ms = oldest;
        }
        if reclaimed > 0 {
            self.counters
                .stalled_writes_reclaimed
                .fetch_add(reclaimed as u64, Ordering::Relaxed);
            tracing::info!(reclaimed, "reclaimed stalled writes");
        }
        reclaimed + self.release_parked(now) + self.expire_offloads(now)
    }

    /// Returns parked buffers whose deadline passed to their segments.
    pub(crate) fn release_parked(&self, now: u64) -> usize {
        self.release_parked_where(|p| p.release_at_ms <= now)
    }

    /// ReleaseParked: frees at once the parked replicas of writes `req.client_id` revoked as
    /// unsettled; other ids are ignored. Answers how many buffers were freed.
    pub fn release_parked_replicas(
        &self,
        req: &moonkv_proto::msg::ReleaseParkedRequest,
    ) -> moonkv_proto::Result<u32> {
        use moonkv_proto::msg::MAX_RELEASED_REPLICAS;
        if req.replica_ids.len() > MAX_RELEASED_REPLICAS {
            return Err(moonkv_proto::Error::new(
                moonkv_proto::ErrorCode::INVALID_PARAMS,
                format!(
                    "ReleaseParked names {} replicas; the limit is {MAX_RELEASED_REPLICAS}",
                    req.replica_ids.len()
                ),
            ));
        }
        let ids: std::collections::HashSet<_> = req.replica_ids.iter().collect();
        let freed = self.release_parked_where(|p| {
            p.revoked
                .is_some_and(|(writer, id)| writer == req.client_id && ids.contains(&id))
        });
        Ok(freed as u32)
    }

    fn release_parked_where(&self, due: impl Fn(&ParkedBuffer) -> bool) -> usize {
        let due: Vec<ParkedBuffer> = {
            let mut parked = self.parked.lock();
            if !parked.iter().any(&due) {
                return 0;
            }
            let (due, keep): (Vec<ParkedBuffer>, Vec<ParkedBuffer>) = std::mem::take(&mut *parked)
                .into_iter()
                .partition(|p| due(p));
            *parked = keep;
            due
        };
        let bytes: u64 = due.iter().map(|p| p.buffer.len()).sum();
        self.counters
            .discarded_staging_bytes
            .fetch_sub(bytes, Ordering::Relaxed);
        self.counters
            .put_start_release_cnt
            .fetch_add(due.len() as u64, Ordering::Relaxed);
        // Dropping the buffers frees them (outside the parked lock).
        due.len()
    }
}
