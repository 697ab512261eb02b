//! A real cluster inside the test process: the master server on loopback ephemeral ports, real
//! nodes and real stores.

use moonkv_client::{LocalSegments, Store, StoreConfig};
use moonkv_master::server::{self, MasterConfig, MasterHandle};
use moonkv_node::{Node, NodeConfig, NodeHandle};
use std::future::Future;
use std::time::Duration;

/// Upper bound for any single test body.
pub const LIMIT: Duration = Duration::from_secs(120);

/// Runs `body` under [`LIMIT`], failing the test instead of hanging.
pub async fn bounded<F: Future<Output = ()>>(body: F) {
    tokio::time::timeout(LIMIT, body)
        .await
        .expect("test exceeded its time limit");
}

/// A two-worker runtime for tests whose own thread blocks (plain `#[test]`s driving a cluster
/// or a store from outside any runtime).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a test runtime")
}

/// Master plus nodes.
pub struct Cluster {
    pub master: Option<MasterHandle>,
    pub nodes: Vec<Option<NodeHandle>>,
    pub addr: String,
    /// The nodes' segments, for stores that copy in-process.
    pub local: LocalSegments,
}

impl Cluster {
    /// A master with default settings and `nodes` nodes of one `segment_size` segment each.
    pub async fn start(nodes: usize, segment_size: u64) -> Cluster {
        Self::start_with(MasterConfig::ephemeral(), nodes, segment_size).await
    }

    /// Like [`Cluster::start`] with a custom master configuration.
    pub async fn start_with(config: MasterConfig, nodes: usize, segment_size: u64) -> Cluster {
        let master = server::start(config).await.expect("master starts");
        let addr = master.rpc_addr().to_string();
        let mut cluster = Cluster {
            master: Some(master),
            nodes: Vec::new(),
            addr,
            local: LocalSegments::new(),
        };
        for _ in 0..nodes {
            cluster.add_node(segment_size).await;
        }
        cluster
    }

    /// Starts one more node.
    pub async fn add_node(&mut self, segment_size: u64) -> usize {
        let mut config = NodeConfig::new(self.addr.clone(), segment_size);
        config.ping_interval = Duration::from_millis(200);
        config.local_segments = self.local.clone();
        let node = Node::start(config).await.expect("node starts");
        self.nodes.push(Some(node));
        self.nodes.len() - 1
    }

    /// A store over the network (no in-process shortcut), default tenant.
    pub async fn store(&self) -> Store {
        self.store_with(|_| {}).await
    }

    /// A store with adjusted configuration.
    pub async fn store_with(&self, adjust: impl FnOnce(&mut StoreConfig)) -> Store {
        let mut config = StoreConfig::new(self.addr.clone());
        config.transfer_timeout = Duration::from_secs(30);
        adjust(&mut config);
        Store::connect(config).await.expect("store connects")
    }

    /// Takes node `i` out of the cluster.
    pub fn take_node(&mut self, i: usize) -> NodeHandle {
        self.nodes[i].take().expect("node still running")
    }

    /// Body of a 200 answer to `GET path` on the master's admin port; panics on any other.
    pub async fn admin_get(&self, path: &str) -> String {
        let addr = self
            .master
            .as_ref()
            .expect("master running")
            .admin_addr()
            .to_string();
        let what = format!("GET {path} on the admin port");
        let path = path.to_string();
        // The master runs on this test's runtime; the blocking request must not hold its thread.
        let answer =
            tokio::task::spawn_blocking(move || crate::admin::http(&addr, "GET", &path, ""))
                .await
                .expect("admin request");
        assert_eq!(answer.0, 200, "{what}: {}", answer.1);
        answer.1
    }

    /// Stops everything.
    pub async fn shutdown(mut self) {
        for node in self.nodes.drain(..).flatten() {
            node.shutdown().await;
        }
        if let Some(master) = self.master.take() {
            master.shutdown().await;
        }
    }
}
