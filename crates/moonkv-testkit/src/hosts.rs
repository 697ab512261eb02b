//! Several "hosts" on one machine: network namespaces joined by veth pairs to one bridge, each
//! with its own address, so a test runs master, nodes and clients as on separate machines and
//! cuts the link of one of them.
//!
//! ```text
//!   test process (root namespace) 10.N.0.254 ── bridge ──┬── host 0  10.N.0.1
//!                                                         ├── host 1  10.N.0.2
//!                                                         └── ...
//! ```
//!
//! Needs root and `ip` (iproute2). [`Hosts::create`] says why when it cannot build the hosts;
//! tests then skip with that reason, except where `MOONKV_REQUIRE_HOSTS=1` (CI) makes it a
//! failure. Every namespace, veth pair and bridge made is removed when [`Hosts`] drops, also when
//! the test panics. Links are cut with `ip link set … down` on the bridge side of a host's veth:
//! its packets are then dropped both ways, and its sockets see nothing (no reset), as when a
//! cable is pulled.
//!
//! This kernel may lack `netem`; links are therefore not delayed or made lossy here.

use crate::KitError;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

static SETS: AtomicU32 = AtomicU32::new(0);

/// A set of hosts on one bridge; removed on drop.
pub struct Hosts {
    bridge: String,
    subnet: u8,
    hosts: Vec<Host>,
}

/// One host: a network namespace with one interface on the bridge.
pub struct Host {
    namespace: String,
    /// The bridge side of its veth pair (what [`Hosts::cut`] takes down).
    link: String,
    address: Ipv4Addr,
}

fn ip(args: &[&str]) -> Result<(), KitError> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(KitError::io(format!("ip {}", args.join(" "))))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(KitError::Host(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

impl Hosts {
    /// Builds `n` hosts (at most 200) on a fresh bridge, or says why it cannot.
    pub fn create(n: usize) -> Result<Hosts, KitError> {
        assert!((1..=200).contains(&n), "1 to 200 hosts");
        if effective_uid() != 0 {
            return Err(KitError::Host(
                "network namespaces need root (run the tests as root, as CI does)".into(),
            ));
        }
        // Names unique per process and set; interface names stay under 16 bytes.
        let set = SETS.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{:x}{set:x}", std::process::id() % 0xffff);
        let subnet = (100 + (std::process::id() + set * 7) % 150) as u8;
        let mut hosts = Hosts {
            bridge: format!("mkb{tag}"),
            subnet,
            hosts: Vec::new(),
        };
        ip(&["link", "add", &hosts.bridge, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("10.{subnet}.0.254/24"),
            "dev",
            &hosts.bridge,
        ])?;
        ip(&["link", "set", &hosts.bridge, "up"])?;
        for i in 0..n {
            let namespace = format!("mk{tag}h{i}");
            let link = format!("mk{tag}v{i}");
            let peer = format!("mk{tag}p{i}");
            let address = Ipv4Addr::new(10, subnet, 0, i as u8 + 1);
            ip(&["netns", "add", &namespace])?;
            hosts.hosts.push(Host {
                namespace: namespace.clone(),
                link: link.clone(),
                address,
            });
            ip(&["link", "add", &link, "type", "veth", "peer", "name", &peer])?;
            ip(&["link", "set", &peer, "netns", &namespace])?;
            ip(&["-n", &namespace, "link", "set", &peer, "name", "eth0"])?;
            ip(&[
                "-n",
                &namespace,
                "addr",
                "add",
                &format!("{address}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &namespace, "link", "set", "eth0", "up"])?;
            ip(&["-n", &namespace, "link", "set", "lo", "up"])?;
            ip(&["link", "set", &link, "master", &hosts.bridge])?;
            ip(&["link", "set", &link, "up"])?;
        }
        Ok(hosts)
    }

    /// Hosts of this set.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Whether the set is empty (never, once created).
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The address of host `i`.
    pub fn address(&self, i: usize) -> Ipv4Addr {
        self.hosts[i].address
    }

    /// The address the test process itself has on the bridge (it acts as one more host).
    pub fn own_address(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.subnet, 0, 254)
    }

    /// The network namespace of host `i`.
    pub fn namespace(&self, i: usize) -> &str {
        &self.hosts[i].namespace
    }

    /// `program args…` to run inside host `i`.
    pub fn command(&self, i: usize, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.hosts[i].namespace, program]);
        cmd
    }

    /// Cuts host `i` off the bridge: its packets are dropped both ways.
    pub fn cut(&self, i: usize) -> Result<(), KitError> {
        ip(&["link", "set", &self.hosts[i].link, "down"])
    }

    /// Puts host `i` back on the bridge.
    pub fn heal(&self, i: usize) -> Result<(), KitError> {
        ip(&["link", "set", &self.hosts[i].link, "up"])
    }

    /// Partitions hosts `i` and `j` from each other only: each drops what it would send to the
    /// other (a blackhole route), so no packet passes between them either way, while both keep
    /// every other link. New connections between them fail and established ones go silent.
    pub fn cut_between(&self, i: usize, j: usize) -> Result<(), KitError> {
        self.route_between(i, j, "add")
    }

    /// Ends [`Hosts::cut_between`] for `i` and `j`.
    pub fn heal_between(&self, i: usize, j: usize) -> Result<(), KitError> {
        self.route_between(i, j, "del")
    }

    /// Cuts one direction only: what host `from` sends to host `to` is dropped, while `to`
    /// still reaches `from` (an asymmetric fault: `to` sees `from`'s silence, not its absence).
    /// A TCP connection between them then fails either way, since its acknowledgements are
    /// lost; datagrams from `to` still arrive.
    pub fn cut_one_way(&self, from: usize, to: usize) -> Result<(), KitError> {
        self.blackhole(from, to, "add")
    }

    /// Ends [`Hosts::cut_one_way`].
    pub fn heal_one_way(&self, from: usize, to: usize) -> Result<(), KitError> {
        self.blackhole(from, to, "del")
    }

    fn route_between(&self, i: usize, j: usize, verb: &str) -> Result<(), KitError> {
        self.blackhole(i, j, verb)?;
        self.blackhole(j, i, verb)
    }

    fn blackhole(&self, from: usize, to: usize, verb: &str) -> Result<(), KitError> {
        assert_ne!(from, to, "a host is never cut from itself");
        let to = format!("{}/32", self.hosts[to].address);
        ip(&[
            "-n",
            &self.hosts[from].namespace,
            "route",
            verb,
            "blackhole",
            &to,
        ])
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for host in &self.hosts {
            // The veth pair goes with its namespace.
            let _ = ip(&["link", "del", &host.link]);
            let _ = ip(&["netns", "del", &host.namespace]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// Builds `n` hosts for a test, or returns `None` after saying why the test is skipped; with
/// `MOONKV_REQUIRE_HOSTS=1` a failure to build them fails the test instead.
pub fn for_test(n: usize) -> Option<Hosts> {
    match Hosts::create(n) {
        Ok(hosts) => Some(hosts),
        Err(why) if std::env::var("MOONKV_REQUIRE_HOSTS").as_deref() != Ok("1") => {
            eprintln!("skipped: cannot build {n} hosts in network namespaces: {why}");
            None
        }
        Err(why) => panic!("cannot build {n} hosts in network namespaces: {why}"),
    }
}

fn effective_uid() -> u32 {
    // The owner of this process's /proc entry is its effective uid.
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends one UDP datagram from host `from` to host `to` and says whether it arrived.
    fn datagram_arrives(hosts: &Hosts, from: usize, to: usize) -> bool {
        let port = 40_000 + (std::process::id() % 20_000) as u16;
        let listen = format!(
            "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
             s.bind(('{}', {port})); s.settimeout(2); print('ready', flush=True)\n\
             try:\n    s.recvfrom(16); print('got')\nexcept OSError:\n    print('none')",
            hosts.address(to)
        );
        let mut receiver = hosts
            .command(to, "python3")
            .args(["-c", &listen])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 in the host");
        let mut out = std::io::BufReader::new(receiver.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        let send = format!(
            "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('{}', {port}))",
            hosts.address(to)
        );
        // A blackholed destination makes the sender's own send fail; that is a loss too.
        let _ = hosts.command(from, "python3").args(["-c", &send]).status();
        line.clear();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        let _ = receiver.wait();
        line.trim() == "got"
    }

    #[test]
    fn a_one_way_cut_drops_one_direction_and_heals() {
        let Some(hosts) = for_test(2) else {
            return;
        };
        assert!(datagram_arrives(&hosts, 0, 1) && datagram_arrives(&hosts, 1, 0));
        hosts.cut_one_way(0, 1).unwrap();
        assert!(!datagram_arrives(&hosts, 0, 1), "0 -> 1 is cut");
        assert!(datagram_arrives(&hosts, 1, 0), "1 -> 0 still flows");
        hosts.heal_one_way(0, 1).unwrap();
        assert!(datagram_arrives(&hosts, 0, 1));
        hosts.cut_between(0, 1).unwrap();
        assert!(!datagram_arrives(&hosts, 0, 1) && !datagram_arrives(&hosts, 1, 0));
        hosts.heal_between(0, 1).unwrap();
        assert!(datagram_arrives(&hosts, 1, 0));
    }
}
