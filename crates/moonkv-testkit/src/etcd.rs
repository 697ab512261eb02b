//! A real single-member etcd (Debian's `etcd-server`, `/usr/bin/etcd`) for HA tests: loopback
//! ephemeral ports, a temporary data directory, killed and removed when dropped. It can be
//! killed and started again on the same ports and data, as an etcd outage.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long etcd may take to answer its health check on a loaded machine.
const HEALTHY_WITHIN: Duration = Duration::from_secs(30);

static DIRS: AtomicU64 = AtomicU64::new(0);

/// The etcd binary: `MOONKV_ETCD_BIN`, else `etcd` on the PATH.
pub fn etcd_binary() -> String {
    std::env::var("MOONKV_ETCD_BIN").unwrap_or_else(|_| "etcd".to_string())
}

/// A running (or stopped, between [`Etcd::kill`] and [`Etcd::restart`]) etcd member.
pub struct Etcd {
    child: Option<Child>,
    /// The address it listens on (`127.0.0.1`, or a host's address of [`crate::hosts`]).
    address: std::net::Ipv4Addr,
    /// `ip netns exec NAMESPACE`, when it runs inside a host of [`crate::hosts`].
    namespace: Option<String>,
    client_port: u16,
    peer_port: u16,
    dir: PathBuf,
}

impl Etcd {
    /// Starts etcd and waits until it reports healthy; panics with its log otherwise.
    pub fn start() -> Etcd {
        Self::start_at(std::net::Ipv4Addr::LOCALHOST, None)
    }

    /// Starts etcd inside host `host` of `hosts`, on that host's address, and waits until it
    /// reports healthy (the test process reaches it over the bridge).
    pub fn start_in(hosts: &crate::hosts::Hosts, host: usize) -> Etcd {
        Self::start_at(hosts.address(host), Some(hosts.namespace(host).to_string()))
    }

    fn start_at(address: std::net::Ipv4Addr, namespace: Option<String>) -> Etcd {
        let [client_port, peer_port] = crate::free_ports::<2>();
        let dir = std::env::temp_dir().join(format!(
            "moonkv-etcd-{}-{}",
            std::process::id(),
            DIRS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the etcd directory");
        let mut etcd = Etcd {
            child: None,
            address,
            namespace,
            client_port,
            peer_port,
            dir,
        };
        etcd.restart();
        etcd
    }

    /// `ADDRESS:PORT` of the client endpoint (`127.0.0.1:PORT` unless started in a host).
    pub fn endpoint(&self) -> String {
        format!("{}:{}", self.address, self.client_port)
    }

    /// The master address clients and nodes give to follow the leader of `cluster_id`.
    pub fn master_addr(&self, cluster_id: &str) -> String {
        format!("etcd://{}/{cluster_id}", self.endpoint())
    }

    /// SIGKILLs etcd (its data stays for [`Etcd::restart`]).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd again on the same ports and data directory and waits until it is healthy.
    pub fn restart(&mut self) {
        self.kill();
        let client = format!("http://{}:{}", self.address, self.client_port);
        let peer = format!("http://{}:{}", self.address, self.peer_port);
        let log = std::fs::File::create(self.dir.join("etcd.log")).expect("create the etcd log");
        let mut command = match &self.namespace {
            Some(namespace) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", namespace, &etcd_binary()]);
                c
            }
            None => Command::new(etcd_binary()),
        };
        let child = command
            .args(["--name", "moonkv-test"])
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("moonkv-test={peer}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} (install Debian's etcd-server): {e}",
                    etcd_binary()
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + HEALTHY_WITHIN;
        loop {
            let health = crate::http_get(&self.endpoint(), "/health");
            if health.is_some_and(|body| body.contains("\"health\":\"true\"")) {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("etcd exited with {status}: {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "etcd not healthy within {HEALTHY_WITHIN:?}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What etcd logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
