//! Which replica owns which byte range of a segment, as far as this node has seen.
//!
//! A grant lives longer than its replica can: the master frees a range at once on remove or
//! replace and may hand it to another tenant's write while the old write grant is still valid.
//! So the first write of a replica (over the network, or an in-process copy) claims the
//! replica's whole range for it, and every later request is checked against the claims:
//!
//! - a request whose grant was issued before the range's current claim (a freed or replaced
//!   replica) is refused (`Superseded`), so an old grant neither overwrites nor reads the bytes
//!   of the replica that replaced it;
//! - a read is served only from a range its own replica has claimed (`Unwritten`), so a fresh
//!   allocation never shows the freed bytes of whoever held the range before.
//!
//! Grants are ordered by `(issued_ms, replica id)` ([`Grant::issue_order`]): replica ids grow
//! within one master's life and the issue time orders grants across master restarts. Claims
//! only exist when the node checks grants (it has a grant key); an open node has none.

use moonkv_proto::grant::{unix_now_ms, Grant, Refusal, READ, WRITE};
use moonkv_proto::SegmentId;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};

/// One claimed range: `[start, end)` belongs to the replica of the grant issued at `order`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Claim {
    end: u64,
    replica: u64,
    order: (u64, u64),
}

/// The claims of every segment of a node.
#[derive(Debug, Default)]
pub struct Claims {
    segments: Mutex<HashMap<SegmentId, BTreeMap<u64, Claim>>>,
}

impl Claims {
    /// The check of a memory read or write of `[address, address + len)` carrying `grant`
    /// (its MAC already verified): expiry and right, the granted range, then the claims. The
    /// data-plane server and the in-process copy path both call this.
    pub fn admit_range(
        &self,
        segment: SegmentId,
        grant: &Grant,
        address: u64,
        len: u64,
        write: bool,
    ) -> Result<(), Refusal> {
        let right = if write { WRITE } else { READ };
        grant.permits_range(right, address, len, unix_now_ms())?;
        self.admit(segment, grant, write)
    }

    /// Checks a memory request carrying `grant` on `segment` (already verified: MAC, expiry,
    /// rights, range); a write also claims the grant's range for its replica.
    pub fn admit(&self, segment: SegmentId, grant: &Grant, write: bool) -> Result<(), Refusal> {
        let start = grant.address;
        let end = grant.address.saturating_add(grant.size);
        let order = grant.issue_order();
        let mut segments = self.segments.lock();
        let claims = segments.entry(segment).or_default();
        let overlapping: Vec<(u64, Claim)> = claims
            .range(..end)
            .rev()
            .take_while(|(_, c)| c.end > start)
            .map(|(s, c)| (*s, *c))
            .collect();
        if overlapping
            .iter()
            .any(|(_, c)| c.replica != grant.replica && c.order > order)
        {
            return Err(Refusal::Superseded);
        }
        if !write {
            let owned = overlapping
                .iter()
                .any(|(s, c)| c.replica == grant.replica && *s <= start && c.end >= end);
            return if owned {
                Ok(())
            } else {
                Err(Refusal::Unwritten)
            };
        }
        for (s, c) in &overlapping {
            if c.replica != grant.replica || (*s, c.end) != (start, end) {
                claims.remove(s);
            }
        }
        claims.insert(
            start,
            Claim {
                end,
                replica: grant.replica,
                order,
            },
        );
        Ok(())
    }

    /// Forgets a segment's claims (it was unmounted).
    pub fn forget(&self, segment: SegmentId) {
        self.segments.lock().remove(&segment);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: SegmentId = SegmentId::new(1, 2);

    fn grant(replica: u64, issued_ms: u64, address: u64, size: u64) -> Grant {
        Grant::new(READ | WRITE, u64::MAX, address, size, "t").for_replica(replica, issued_ms)
    }

    #[test]
    fn a_freed_replicas_grant_loses_the_range_to_the_next_writer() {
        let claims = Claims::default();
        let old = grant(10, 1_000, 0, 4096);
        claims.admit(SEG, &old, true).unwrap();
        claims.admit(SEG, &old, false).unwrap();
        // The range is freed and handed to another tenant's replica, issued later.
        let new = grant(11, 2_000, 0, 4096);
        claims.admit(SEG, &new, true).unwrap();
        assert_eq!(claims.admit(SEG, &old, true), Err(Refusal::Superseded));
        assert_eq!(claims.admit(SEG, &old, false), Err(Refusal::Superseded));
        claims.admit(SEG, &new, false).unwrap();
    }

    #[test]
    fn an_overlapping_newer_claim_also_supersedes() {
        let claims = Claims::default();
        let old = grant(10, 1_000, 0, 8192);
        claims.admit(SEG, &old, true).unwrap();
        claims
            .admit(SEG, &grant(11, 2_000, 4096, 100), true)
            .unwrap();
        assert_eq!(claims.admit(SEG, &old, false), Err(Refusal::Superseded));
        // A disjoint range of the same segment is unaffected.
        let other = grant(12, 1_500, 9000, 10);
        claims.admit(SEG, &other, true).unwrap();
        claims.admit(SEG, &other, false).unwrap();
    }

    #[test]
    fn reads_need_their_replica_to_have_written() {
        let claims = Claims::default();
        let earlier = grant(10, 1_000, 0, 4096);
        claims.admit(SEG, &earlier, true).unwrap();
        // A new replica over the same range, not written yet: its grant cannot read the
        // previous owner's bytes.
        let fresh = grant(11, 2_000, 0, 4096);
        assert_eq!(claims.admit(SEG, &fresh, false), Err(Refusal::Unwritten));
        assert_eq!(
            claims.admit(SEG, &grant(12, 3_000, 0, 16), false),
            Err(Refusal::Unwritten)
        );
    }

    #[test]
    fn a_later_master_orders_by_issue_time_even_with_smaller_ids() {
        let claims = Claims::default();
        claims
            .admit(SEG, &grant(u64::MAX - 5, 1_000, 0, 64), true)
            .unwrap();
        // A restarted master seeds a new, smaller id; its grants were issued later.
        let restarted = grant(7, 5_000, 0, 64);
        claims.admit(SEG, &restarted, true).unwrap();
        assert_eq!(
            claims.admit(SEG, &grant(u64::MAX - 5, 1_000, 0, 64), false),
            Err(Refusal::Superseded)
        );
        claims.forget(SEG);
        assert_eq!(
            claims.admit(SEG, &restarted, false),
            Err(Refusal::Unwritten)
        );
    }
}
