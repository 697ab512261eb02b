//! High availability on etcd: several masters, one leader elected through an etcd lease.
//!
//! - [`gate`]: whether this master serves right now (the write deadline, the fencing rule) and
//!   the engine of the current term; the RPC and admin servers ask it on every request.
//! - `elect`: the task that campaigns, keeps the lease alive and steps down.
//!
//! A new leader starts on an empty engine; nodes re-mount on it (their master client follows the
//! leader key) and re-announce what they hold. The term, strictly greater than every earlier
//! leader's, is [`Gate::term`].

mod elect;
pub mod gate;

pub use elect::HOLD_AFTER_DEADLINE;
pub(crate) use elect::{run, Advertised};
pub use gate::{Gate, HaState, HaView};

use std::time::Duration;

/// Lease TTL when `ha_lease_ttl_sec` is not given.
pub const DEFAULT_LEASE_TTL_SEC: i64 = 3;

/// The HA keys of the master config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HaSettings {
    /// `etcd_endpoints`, `host:port` each.
    pub endpoints: Vec<String>,
    /// `cluster_id`: names the etcd keys (`/moonkv/<cluster_id>/...`).
    pub cluster_id: String,
    /// `ha_lease_ttl_sec`: the leader's lease; a dead leader is replaced within about this long.
    pub lease_ttl_sec: i64,
}

impl HaSettings {
    /// The lease TTL.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_secs(self.lease_ttl_sec.max(1) as u64)
    }

    /// Keep-alives are sent every third of the TTL.
    pub fn keep_alive_period(&self) -> Duration {
        self.lease_ttl() / 3
    }

    /// How much earlier than etcd's expiry the leader stops serving: a sixth of the TTL, at
    /// least 300 ms. It covers clock-rate differences between this host and etcd's and the time
    /// between the deadline check and the answer leaving.
    pub fn margin(&self) -> Duration {
        (self.lease_ttl() / 6).max(Duration::from_millis(300))
    }

    /// Deadline of one etcd call.
    pub fn call_timeout(&self) -> Duration {
        (self.lease_ttl() / 3).max(Duration::from_millis(500))
    }
}
