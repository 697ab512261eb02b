//! Finding the leader of an HA cluster: the `etcd://` master address names etcd endpoints and a
//! cluster id; the leader key there holds the leader's RPC address (`docs/operations.md`, HA).

use moonkv_proto::ha::{leader_key, LeaderRecord};
use moonkv_proto::{Error, ErrorCode, Result};
use std::time::Duration;

/// Reads the leader key of one cluster; keeps its etcd connection between lookups.
pub(super) struct LeaderLookup {
    endpoints: Vec<String>,
    cluster_id: String,
    client: tokio::sync::Mutex<Option<etcd_client::Client>>,
}

impl LeaderLookup {
    pub(super) fn new(endpoints: Vec<String>, cluster_id: String) -> LeaderLookup {
        LeaderLookup {
            endpoints,
            cluster_id,
            client: tokio::sync::Mutex::new(None),
        }
    }

    /// The leader registered now; `RPC_FAIL` when etcd cannot be reached or no leader is
    /// elected (both pass with time, so callers retry).
    pub(super) async fn resolve(&self, timeout: Duration) -> Result<LeaderRecord> {
        let mut slot = self.client.lock().await;
        let mut client = match slot.as_ref() {
            Some(client) => client.clone(),
            None => {
                let options = etcd_client::ConnectOptions::new()
                    .with_connect_timeout(timeout)
                    .with_timeout(timeout);
                let connect = etcd_client::Client::connect(&self.endpoints, Some(options));
                let client = tokio::time::timeout(timeout, connect)
                    .await
                    .map_err(|_| self.unreachable("no answer"))?
                    .map_err(|e| self.unreachable(&e.to_string()))?;
                *slot = Some(client.clone());
                client
            }
        };
        let key = leader_key(&self.cluster_id);
        let got = match tokio::time::timeout(timeout, client.get(key.as_str(), None)).await {
            Ok(Ok(got)) => got,
            Ok(Err(e)) => {
                *slot = None;
                return Err(self.unreachable(&e.to_string()));
            }
            Err(_) => {
                *slot = None;
                return Err(self.unreachable("no answer"));
            }
        };
        let Some(kv) = got.kvs().first() else {
            return Err(Error::new(
                ErrorCode::RPC_FAIL,
                format!(
                    "no master leads cluster {:?} right now (etcd key {key} is empty)",
                    self.cluster_id
                ),
            ));
        };
        LeaderRecord::parse(kv.value()).map_err(|why| {
            Error::new(
                ErrorCode::RPC_FAIL,
                format!("etcd key {key} holds no leader record: {why}"),
            )
        })
    }

    fn unreachable(&self, why: &str) -> Error {
        Error::new(
            ErrorCode::RPC_FAIL,
            format!(
                "cannot read the leader of cluster {:?} from etcd {}: {why}",
                self.cluster_id,
                self.endpoints.join(";")
            ),
        )
    }
}
