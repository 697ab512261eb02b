//! The election: campaign for the leader key, keep its lease alive, step down when it lapses.
//!
//! One task per master. As a standby it reads the leader key, watches it (with a periodic
//! re-read so a silent etcd is noticed) and campaigns when the key is gone. As leader it sends a
//! keep-alive every third of the TTL; each success moves the write deadline to
//! `sent + ttl - margin`. When the deadline passes without a success the gate closes, the
//! metadata is dropped and the task goes back to standby. Every etcd call has a timeout, so no
//! step of the loop waits forever.

use super::gate::{Gate, HaState};
use super::HaSettings;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, PutOptions, Txn, TxnOp, WatchOptions,
};
use moonkv_proto::ha::{leader_key, term_key, LeaderRecord};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Fault point: a leader whose write deadline passed does not step down (as if its election
/// task had not run yet), so the gate must refuse requests by the deadline alone.
pub const HOLD_AFTER_DEADLINE: &str = "master::ha_hold_after_deadline";

/// Whether [`HOLD_AFTER_DEADLINE`] is set (never without the `failpoints` feature).
fn hold_after_deadline() -> bool {
    #[cfg(feature = "failpoints")]
    if fail::eval(HOLD_AFTER_DEADLINE, |_| ()).is_some() {
        return true;
    }
    false
}

/// Why one pass of the loop failed.
#[derive(Debug, thiserror::Error)]
enum StepError {
    /// etcd answered with an error.
    /// (Printed with its cause, as it is only logged and shown in `/ha/status`.)
    #[error("{doing}: {error}")]
    Etcd {
        doing: &'static str,
        error: etcd_client::Error,
    },
    /// etcd did not answer in time.
    #[error("{doing}: etcd did not answer within {limit:?}")]
    Timeout {
        doing: &'static str,
        limit: Duration,
    },
    /// etcd answered something unusable.
    #[error("{0}")]
    Unusable(String),
}

/// How one pass of the loop ended.
type Step = Result<(), StepError>;

/// What a master advertises in the leader key, minus the term.
#[derive(Clone, Debug)]
pub(crate) struct Advertised {
    pub rpc_addr: String,
    pub admin_addr: String,
    pub events_endpoint: Option<String>,
}

/// Runs until `stop` flips.
pub(crate) async fn run(
    settings: HaSettings,
    me: Advertised,
    gate: Arc<Gate>,
    mut stop: watch::Receiver<bool>,
) {
    let mut election = Election {
        settings,
        me,
        gate,
        client: None,
        stale_lease: None,
    };
    let mut backoff = Duration::from_millis(100);
    loop {
        let pass = tokio::select! {
            step = election.pass() => step,
            _ = stop.changed() => break,
        };
        match pass {
            Ok(()) => backoff = Duration::from_millis(100),
            Err(why) => {
                tracing::warn!(error = %why, "HA: etcd step failed");
                election.client = None;
                election
                    .gate
                    .observe(HaState::Standby, None, &format!("etcd unreachable: {why}"));
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => break,
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
    election.resign().await;
}

struct Election {
    settings: HaSettings,
    me: Advertised,
    gate: Arc<Gate>,
    client: Option<Client>,
    /// A lease this master held when it lost contact; revoked once etcd answers again, so the
    /// cluster need not wait for it to expire.
    stale_lease: Option<i64>,
}

impl Election {
    fn call_timeout(&self) -> Duration {
        self.settings.call_timeout()
    }

    async fn client(&mut self) -> Result<Client, StepError> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(self.call_timeout())
            .with_timeout(self.call_timeout());
        let client = tokio::time::timeout(
            self.call_timeout() * 2,
            Client::connect(&self.settings.endpoints, Some(options)),
        )
        .await
        .map_err(|_| StepError::Timeout {
            doing: "connecting to etcd",
            limit: self.call_timeout() * 2,
        })?
        .map_err(|error| StepError::Etcd {
            doing: "connecting to etcd",
            error,
        })?;
        self.client = Some(client.clone());
        Ok(client)
    }

    /// One round: find the leader; campaign if there is none; lead while the lease lives.
    async fn pass(&mut self) -> Step {
        let mut client = self.client().await?;
        if let Some(lease) = self.stale_lease.take() {
            // Best effort: if it fails the lease expires by itself within its TTL.
            let _ = tokio::time::timeout(self.call_timeout(), client.lease_revoke(lease)).await;
        }
        let key = leader_key(&self.settings.cluster_id);
        let got = timed(
            "reading the leader key",
            self.call_timeout(),
            client.get(key.as_str(), None),
        )
        .await?;
        let revision = got.header().map(|h| h.revision()).unwrap_or(0);
        if let Some(kv) = got.kvs().first() {
            let leader = LeaderRecord::parse(kv.value()).ok();
            self.gate.observe(HaState::Standby, leader, "standby");
            return self.wait_for_vacancy(&mut client, &key, revision).await;
        }
        self.gate
            .observe(HaState::Candidate, None, "campaigning for the leader key");
        match self.campaign(&mut client, &key).await? {
            Some((lease, term, deadline)) => self.lead(&mut client, lease, term, deadline).await,
            None => Ok(()),
        }
    }

    /// Watches the leader key until it is deleted; re-reads it every TTL so a dead etcd or a
    /// lost watch ends the wait instead of hanging it.
    async fn wait_for_vacancy(&mut self, client: &mut Client, key: &str, revision: i64) -> Step {
        let options = WatchOptions::new().with_start_revision(revision + 1);
        let mut stream = timed(
            "watching the leader key",
            self.call_timeout(),
            client.watch(key, Some(options)),
        )
        .await?;
        let resync = self.settings.lease_ttl();
        let until = Instant::now() + resync;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let Ok(message) = tokio::time::timeout(left, stream.message()).await else {
                return Ok(());
            };
            let Some(response) = message.map_err(|error| StepError::Etcd {
                doing: "watching the leader key",
                error,
            })?
            else {
                return Ok(());
            };
            for event in response.events() {
                match event.event_type() {
                    EventType::Delete => return Ok(()),
                    EventType::Put => {
                        let leader = event
                            .kv()
                            .and_then(|kv| LeaderRecord::parse(kv.value()).ok());
                        self.gate.observe(HaState::Standby, leader, "standby");
                    }
                }
            }
        }
    }

    /// Grants a lease and takes the leader key with it if the key is absent, bumping the term
    /// stored in etcd in the same transaction. `None`: another master won.
    async fn campaign(
        &mut self,
        client: &mut Client,
        key: &str,
    ) -> Result<Option<(i64, u64, Instant)>, StepError> {
        let ttl = self.settings.lease_ttl_sec;
        let sent = Instant::now();
        let lease = timed(
            "granting a lease",
            self.call_timeout(),
            client.lease_grant(ttl, None),
        )
        .await?;
        let lease_id = lease.id();
        let granted = Duration::from_secs(lease.ttl().clamp(1, ttl) as u64);
        let term_key = term_key(&self.settings.cluster_id);
        let current = timed(
            "reading the term key",
            self.call_timeout(),
            client.get(term_key.as_str(), None),
        )
        .await?;
        let (last_term, term_guard) = match current.kvs().first() {
            Some(kv) => {
                let last = std::str::from_utf8(kv.value())
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| StepError::Unusable(format!("{term_key} holds no number")))?;
                (
                    last,
                    Compare::mod_revision(term_key.as_str(), CompareOp::Equal, kv.mod_revision()),
                )
            }
            None => (
                0,
                Compare::create_revision(term_key.as_str(), CompareOp::Equal, 0),
            ),
        };
        // Strictly greater than every earlier term, and never below the wall clock in ms, so a
        // leader's writes also order after those of a master that ran without HA (its epoch is
        // its start time): re-adoption keeps the newest version by (epoch, write).
        let term = (last_term + 1).max(moonkv_proto::grant::unix_now_ms());
        let record = self.record(term);
        let txn = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::Equal, 0),
                term_guard,
            ])
            .and_then([
                TxnOp::put(term_key.as_str(), term.to_string(), None),
                TxnOp::put(
                    key,
                    record.render(),
                    Some(PutOptions::new().with_lease(lease_id)),
                ),
            ]);
        let outcome = timed("campaigning", self.call_timeout(), client.txn(txn)).await;
        match outcome {
            Ok(answer) if answer.succeeded() => {
                let deadline = sent + granted.saturating_sub(self.settings.margin());
                tracing::info!(term, lease = lease_id, "HA: elected leader");
                Ok(Some((lease_id, term, deadline)))
            }
            other => {
                let _ =
                    tokio::time::timeout(self.call_timeout(), client.lease_revoke(lease_id)).await;
                other.map(|_| None)
            }
        }
    }

    fn record(&self, term: u64) -> LeaderRecord {
        LeaderRecord {
            term,
            rpc_addr: self.me.rpc_addr.clone(),
            admin_addr: self.me.admin_addr.clone(),
            events_endpoint: self.me.events_endpoint.clone(),
        }
    }

    /// Serves as leader of `term` until the write deadline passes without a keep-alive.
    async fn lead(
        &mut self,
        client: &mut Client,
        lease: i64,
        term: u64,
        deadline: Instant,
    ) -> Step {
        self.gate.become_leader(term, deadline, self.record(term));
        let mut deadline = deadline;
        let reason = self.keep_alive(client, lease, term, &mut deadline).await;
        while hold_after_deadline() {
            tokio::time::sleep(self.settings.keep_alive_period()).await;
        }
        self.gate
            .step_down(&format!("stepped down from term {term}: {reason}"));
        tracing::warn!(term, %reason, "HA: stepped down; metadata dropped");
        // Give the key up at once when etcd still answers; otherwise revoke it later.
        let revoked = tokio::time::timeout(self.call_timeout(), client.lease_revoke(lease)).await;
        if !matches!(revoked, Ok(Ok(_))) {
            self.stale_lease = Some(lease);
            self.client = None;
        }
        Ok(())
    }

    /// Keeps the lease alive; returns why leadership ended.
    async fn keep_alive(
        &mut self,
        client: &mut Client,
        lease: i64,
        term: u64,
        deadline: &mut Instant,
    ) -> String {
        let period = self.settings.keep_alive_period();
        let ttl = self.settings.lease_ttl();
        let margin = self.settings.margin();
        let mut channel = None;
        loop {
            let now = Instant::now();
            if now >= *deadline {
                return "the lease could not be renewed before the write deadline".into();
            }
            let sent = now;
            let limit = deadline
                .saturating_duration_since(now)
                .min(self.call_timeout());
            let renewed = tokio::time::timeout(limit, async {
                if channel.is_none() {
                    channel = Some(client.lease_keep_alive(lease).await.map_err(|error| {
                        StepError::Etcd {
                            doing: "opening the keep-alive stream",
                            error,
                        }
                    })?);
                }
                let Some((keeper, stream)) = channel.as_mut() else {
                    return Err(StepError::Unusable("no keep-alive stream".into()));
                };
                keeper.keep_alive().await.map_err(|error| StepError::Etcd {
                    doing: "keep-alive",
                    error,
                })?;
                match stream.message().await {
                    Ok(Some(answer)) => Ok(answer.ttl()),
                    Ok(None) => Err(StepError::Unusable("the keep-alive stream closed".into())),
                    Err(error) => Err(StepError::Etcd {
                        doing: "keep-alive",
                        error,
                    }),
                }
            })
            .await;
            match renewed {
                Ok(Ok(left)) if left > 0 => {
                    let granted = Duration::from_secs(left as u64).min(ttl);
                    *deadline = (*deadline).max(sent + granted.saturating_sub(margin));
                    self.gate.extend(term, *deadline);
                }
                Ok(Ok(_)) => return "etcd says the lease expired".into(),
                Ok(Err(why)) => {
                    tracing::debug!(error = %why, "HA: keep-alive failed");
                    channel = None;
                }
                Err(_) => channel = None,
            }
            let next = (sent + period).min(*deadline);
            tokio::time::sleep_until(next.into()).await;
        }
    }

    /// On shutdown: a leader gives its key up so a standby takes over without waiting.
    async fn resign(&mut self) {
        let was_leader = self.gate.term() != 0;
        self.gate.step_down("shutting down");
        if !was_leader {
            return;
        }
        let Some(mut client) = self.client.clone() else {
            return;
        };
        let key = leader_key(&self.settings.cluster_id);
        let Ok(Ok(got)) =
            tokio::time::timeout(self.call_timeout(), client.get(key.as_str(), None)).await
        else {
            return;
        };
        if let Some(kv) = got.kvs().first() {
            let ours =
                LeaderRecord::parse(kv.value()).is_ok_and(|r| r.rpc_addr == self.me.rpc_addr);
            if ours {
                let _ = tokio::time::timeout(self.call_timeout(), client.lease_revoke(kv.lease()))
                    .await;
            }
        }
    }
}

/// An etcd call (`doing`) within `limit`.
async fn timed<T>(
    doing: &'static str,
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, StepError> {
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(StepError::Etcd { doing, error }),
        Err(_) => Err(StepError::Timeout { doing, limit }),
    }
}
