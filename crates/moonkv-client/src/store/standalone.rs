//! Standalone clients: a process that knows only a node on its machine (the data-plane address
//! `moonkv node` or `moonkv up` prints) asks that node which master it mounts on, then works as
//! a pure client of that master. Same-host copies make the node move the bytes straight between
//! its segments and this process's memory.

use super::{Store, StoreConfig};
use moonkv_dataplane::stream::TlsConnector;
use moonkv_dataplane::DataConnection;
use moonkv_proto::{Error, ErrorCode, Result};

impl Store {
    /// Connects through the node at `node_endpoint`: its STATS answer names its master, which
    /// replaces `config.master_addr`.
    /// A node that takes whole puts or gets (`put_local`, `get_local` in its STATS) gets them
    /// ([`StoreConfig::put_local_node`], [`StoreConfig::get_local_node`]) while same-host
    /// copies are on.
    pub async fn connect_via_node(node_endpoint: &str, mut config: StoreConfig) -> Result<Store> {
        let stats = node_stats(node_endpoint, &config).await?;
        config.master_addr = master_in(node_endpoint, &stats)?;
        if stats.put_local && config.same_host {
            config.put_local_node = Some(node_endpoint.to_string());
        }
        if stats.get_local && config.same_host {
            config.get_local_node = Some(node_endpoint.to_string());
        }
        Store::connect(config).await
    }
}

/// The master the node at `endpoint` mounts its segments on.
pub async fn master_of_node(endpoint: &str, config: &StoreConfig) -> Result<String> {
    master_in(endpoint, &node_stats(endpoint, config).await?)
}

/// The master named in the STATS answer of the node at `endpoint`.
fn master_in(endpoint: &str, stats: &moonkv_dataplane::NodeStats) -> Result<String> {
    stats
        .master
        .clone()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            Error::new(
                ErrorCode::NOT_SUPPORTED,
                format!(
                "node {endpoint} does not say which master it uses (a node older than this client)"
            ),
            )
        })
}

/// The STATS answer of the node at `endpoint`.
async fn node_stats(endpoint: &str, config: &StoreConfig) -> Result<moonkv_dataplane::NodeStats> {
    let tls = TlsConnector::load_if_set(config.tls.as_ref())
        .map_err(|e| Error::new(ErrorCode::INVALID_PARAMS, format!("TLS settings: {e}")))?;
    let mut conn = DataConnection::connect_with_tls(
        endpoint,
        config.connect_timeout,
        config.auth_secret.as_ref(),
        tls.as_ref(),
    )
    .await?;
    let stats = tokio::time::timeout(config.rpc_timeout, conn.stats())
        .await
        .map_err(|_| {
            Error::new(
                ErrorCode::RPC_TIMEOUT,
                format!(
                    "node {endpoint} did not answer within {:?}",
                    config.rpc_timeout
                ),
            )
        })??;
    Ok(stats)
}
