//! The serving gate: whether this master may answer data and metadata requests right now, and
//! which engine holds its metadata.
//!
//! Without HA the gate is always open and holds one engine for the life of the process. With HA
//! it opens only while this master is leader *and* before its write deadline: the monotonic
//! time the last successful lease keep-alive was sent, plus the lease TTL, minus a margin. etcd
//! counts the lease from when it *received* that keep-alive, so the deadline always falls before
//! etcd can expire the lease and let another master win (the fencing argument in
//! `docs/operations.md`). The hot path reads two atomics and compares with a time the RPC server
//! takes anyway; it never talks to etcd.

use crate::engine::Engine;
use moonkv_proto::ha::{not_leader_error, LeaderRecord};
use moonkv_proto::Error;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Where a master is in its HA life (upstream's `/ha_status` words).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HaState {
    /// Not yet in contact with etcd.
    Starting,
    /// Another master leads, or none does and this one waits to campaign.
    Standby,
    /// Trying to take the leader key.
    Candidate,
    /// Leader: serving requests.
    Serving,
}

impl HaState {
    /// The text `/ha_status` answers.
    pub fn as_str(self) -> &'static str {
        match self {
            HaState::Starting => "starting",
            HaState::Standby => "standby",
            HaState::Candidate => "candidate",
            HaState::Serving => "serving",
        }
    }
}

/// What the gate knows about the cluster, for refusals and the admin endpoints.
#[derive(Clone, Debug)]
pub struct HaView {
    /// This master's state.
    pub state: HaState,
    /// The leader last seen in etcd (this master itself while it serves).
    pub leader: Option<LeaderRecord>,
    /// Why this master does not serve, when it does not (for refusals and logs).
    pub reason: String,
}

/// Builds the empty engine of a new term (HA only: without HA the one engine lives on).
type EngineFactory = Option<Box<dyn Fn(u64) -> Engine + Send + Sync>>;

/// Shared by the RPC server, the admin server, the maintenance thread and the election task.
pub struct Gate {
    ha: bool,
    base: Instant,
    /// Nanoseconds after `base` before which requests are admitted; 0 = closed.
    deadline_ns: AtomicU64,
    /// The term being served (0 without HA or while closed).
    term: AtomicU64,
    engine: RwLock<(u64, Arc<Engine>)>,
    make_engine: EngineFactory,
    view: RwLock<HaView>,
}

impl Gate {
    /// A gate that is always open, around one engine (HA off).
    pub fn always_open(engine: Arc<Engine>) -> Gate {
        Gate {
            ha: false,
            base: Instant::now(),
            deadline_ns: AtomicU64::new(u64::MAX),
            term: AtomicU64::new(0),
            engine: RwLock::new((0, engine)),
            make_engine: None,
            view: RwLock::new(HaView {
                state: HaState::Serving,
                leader: None,
                reason: String::new(),
            }),
        }
    }

    /// A closed HA gate; `make_engine(term)` builds the empty engine of each new term (0: the
    /// standby's, which serves nothing).
    pub fn for_ha(make_engine: impl Fn(u64) -> Engine + Send + Sync + 'static) -> Gate {
        let engine = Arc::new(make_engine(0));
        Gate {
            ha: true,
            base: Instant::now(),
            deadline_ns: AtomicU64::new(0),
            term: AtomicU64::new(0),
            engine: RwLock::new((0, engine)),
            make_engine: Some(Box::new(make_engine)),
            view: RwLock::new(HaView {
                state: HaState::Starting,
                leader: None,
                reason: "not yet in contact with etcd".into(),
            }),
        }
    }

    /// Whether HA is on.
    pub fn is_ha(&self) -> bool {
        self.ha
    }

    fn nanos(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// Admits a request that starts at `now`: the term it runs under, or the refusal.
    #[inline]
    pub fn admit(&self, now: Instant) -> Result<u64, Error> {
        if !self.ha {
            return Ok(0);
        }
        let deadline = self.deadline_ns.load(Ordering::Acquire);
        let term = self.term.load(Ordering::Acquire);
        if self.nanos(now) < deadline && term != 0 {
            return Ok(term);
        }
        Err(self.refusal())
    }

    /// Whether an answer to a request admitted under `term` may still be sent at `now`.
    #[inline]
    pub fn still_serving(&self, term: u64, now: Instant) -> bool {
        if !self.ha {
            return true;
        }
        self.term.load(Ordering::Acquire) == term
            && self.nanos(now) < self.deadline_ns.load(Ordering::Acquire)
    }

    /// The refusal a request gets while the gate is closed, naming the leader if known.
    pub fn refusal(&self) -> Error {
        let view = self.view.read();
        let leader = view
            .leader
            .as_ref()
            .filter(|_| view.state != HaState::Serving);
        let why = if view.reason.is_empty() {
            "this master's lease lapsed"
        } else {
            view.reason.as_str()
        };
        not_leader_error(leader, why)
    }

    /// The engine of the current term and that term.
    pub fn current(&self) -> (u64, Arc<Engine>) {
        let slot = self.engine.read();
        (slot.0, slot.1.clone())
    }

    /// The engine of the current term (an empty one while not serving).
    pub fn engine(&self) -> Arc<Engine> {
        self.engine.read().1.clone()
    }

    /// Whether requests are admitted now.
    pub fn serving(&self) -> bool {
        self.admit(Instant::now()).is_ok()
    }

    /// The term being served; 0 without HA or while not serving.
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Acquire)
    }

    /// A copy of what the gate knows.
    pub fn view(&self) -> HaView {
        self.view.read().clone()
    }

    /// Records what a standby saw in etcd.
    pub fn observe(&self, state: HaState, leader: Option<LeaderRecord>, reason: &str) {
        let mut view = self.view.write();
        view.state = state;
        view.leader = leader;
        view.reason = reason.to_string();
    }

    /// Opens the gate for `term` with an empty engine, until `deadline`.
    ///
    /// The re-adoption of replicas by nodes that re-mount happens on this fresh engine; the term
    /// (strictly greater than every earlier leader's) is what orders their versions.
    pub fn become_leader(&self, term: u64, deadline: Instant, record: LeaderRecord) {
        let Some(make_engine) = &self.make_engine else {
            return;
        };
        *self.engine.write() = (term, Arc::new(make_engine(term)));
        *self.view.write() = HaView {
            state: HaState::Serving,
            leader: Some(record),
            reason: String::new(),
        };
        self.term.store(term, Ordering::Release);
        self.deadline_ns
            .store(self.nanos(deadline), Ordering::Release);
    }

    /// Moves the write deadline of `term` forward (never back) after a successful keep-alive.
    pub fn extend(&self, term: u64, deadline: Instant) {
        if self.term.load(Ordering::Acquire) == term {
            self.deadline_ns
                .fetch_max(self.nanos(deadline), Ordering::AcqRel);
        }
    }

    /// Closes the gate at once and drops the metadata of the term, which is stale from now on.
    pub fn step_down(&self, reason: &str) {
        let Some(make_engine) = &self.make_engine else {
            return;
        };
        self.deadline_ns.store(0, Ordering::Release);
        self.term.store(0, Ordering::Release);
        {
            let mut view = self.view.write();
            view.state = HaState::Standby;
            view.leader = None;
            view.reason = reason.to_string();
        }
        *self.engine.write() = (0, Arc::new(make_engine(0)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineConfig, ManualClock, NoopSink};
    use moonkv_proto::ha::is_not_leader;
    use std::time::Duration;

    fn gate() -> Gate {
        Gate::for_ha(|_| {
            Engine::new(
                EngineConfig::default(),
                Arc::new(ManualClock::new(0)),
                Arc::new(NoopSink),
            )
        })
    }

    fn record(term: u64) -> LeaderRecord {
        LeaderRecord {
            term,
            rpc_addr: "127.0.0.1:1".into(),
            admin_addr: "127.0.0.1:2".into(),
            events_endpoint: None,
        }
    }

    #[test]
    fn admits_only_before_the_deadline_of_the_current_term() {
        let g = gate();
        let t0 = Instant::now();
        assert!(is_not_leader(&g.admit(t0).unwrap_err()));
        g.become_leader(5, t0 + Duration::from_secs(2), record(5));
        assert_eq!(g.admit(t0 + Duration::from_secs(1)).unwrap(), 5);
        assert!(g.still_serving(5, t0 + Duration::from_millis(1999)));
        // A request that crosses the deadline may not be answered OK.
        assert!(!g.still_serving(5, t0 + Duration::from_secs(2)));
        assert!(g.admit(t0 + Duration::from_secs(2)).is_err());
        g.extend(5, t0 + Duration::from_secs(4));
        assert!(g.admit(t0 + Duration::from_secs(3)).is_ok());
        // The deadline never moves back, and another term cannot extend this one.
        g.extend(5, t0 + Duration::from_secs(1));
        g.extend(6, t0 + Duration::from_secs(60));
        assert!(g.admit(t0 + Duration::from_secs(3)).is_ok());
        assert!(g.admit(t0 + Duration::from_secs(5)).is_err());
    }

    #[test]
    fn stepping_down_closes_at_once_and_drops_the_metadata() {
        let g = gate();
        let t0 = Instant::now();
        g.become_leader(2, t0 + Duration::from_secs(60), record(2));
        let before = g.engine();
        g.step_down("etcd unreachable");
        assert!(!g.still_serving(2, t0));
        let e = g.admit(t0).unwrap_err();
        assert!(e.message.contains("etcd unreachable"), "{e}");
        assert!(!Arc::ptr_eq(&before, &g.engine()));
        g.observe(HaState::Standby, Some(record(3)), "standby");
        assert!(g.admit(t0).unwrap_err().message.contains("127.0.0.1:1"));
        // A new term starts on a fresh engine; requests of the old term may not be answered.
        g.become_leader(4, t0 + Duration::from_secs(60), record(4));
        assert!(!g.still_serving(2, t0));
        assert_eq!(g.current().0, 4);
    }

    #[test]
    fn without_ha_the_gate_is_always_open() {
        let engine = Arc::new(Engine::new(
            EngineConfig::default(),
            Arc::new(ManualClock::new(0)),
            Arc::new(NoopSink),
        ));
        let g = Gate::always_open(engine.clone());
        assert_eq!(g.admit(Instant::now()).unwrap(), 0);
        assert!(g.still_serving(0, Instant::now() + Duration::from_secs(1 << 30)));
        assert!(Arc::ptr_eq(&engine, &g.engine()));
    }
}
