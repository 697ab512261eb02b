//! High availability vocabulary shared by masters, clients and nodes: the `etcd://` master
//! address, the etcd keys of a cluster, the leader record stored under the leader key, and the
//! refusal a standby answers with (`docs/operations.md`, HA).

use crate::{Error, ErrorCode};
use std::fmt;

/// The cluster id used when none is given (upstream's default `cluster_id`).
pub const DEFAULT_CLUSTER_ID: &str = "mooncake_cluster";

/// Every refusal of a master that is not the serving leader starts with this text (code
/// `UNAVAILABLE_IN_CURRENT_MODE`), so a client can tell it from other uses of that code.
pub const NOT_LEADER_PREFIX: &str = "not the leader";

/// Where a client finds the master: one fixed address, or the leader registered in etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MasterAddr {
    /// `host:port` of one master.
    Direct(String),
    /// `etcd://host:port[;host:port...][/cluster_id]`: the leader of `cluster_id`.
    Etcd {
        /// etcd client endpoints, `host:port` each.
        endpoints: Vec<String>,
        /// The cluster whose leader key is read.
        cluster_id: String,
    },
}

impl MasterAddr {
    /// Parses a master address; `etcd://` forms need at least one endpoint.
    pub fn parse(text: &str) -> Result<MasterAddr, Error> {
        let Some(rest) = text.strip_prefix("etcd://") else {
            if text.contains("://") {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("master address {text:?}: only host:port and etcd://host:port[;host:port...] are supported"),
                ));
            }
            return Ok(MasterAddr::Direct(text.to_string()));
        };
        let (hosts, cluster_id) = match rest.split_once('/') {
            Some((hosts, id)) if !id.is_empty() => (hosts, id.to_string()),
            Some((hosts, _)) => (hosts, DEFAULT_CLUSTER_ID.to_string()),
            None => (rest, DEFAULT_CLUSTER_ID.to_string()),
        };
        let endpoints = parse_endpoints(hosts).map_err(|why| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("master address {text:?}: {why}"),
            )
        })?;
        validate_cluster_id(&cluster_id).map_err(|why| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("master address {text:?}: {why}"),
            )
        })?;
        Ok(MasterAddr::Etcd {
            endpoints,
            cluster_id,
        })
    }
}

impl fmt::Display for MasterAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MasterAddr::Direct(addr) => f.write_str(addr),
            MasterAddr::Etcd {
                endpoints,
                cluster_id,
            } => write!(f, "etcd://{}/{cluster_id}", endpoints.join(";")),
        }
    }
}

/// Why an HA setting or an etcd record is not usable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HaError {
    /// An etcd endpoint without a host and a numeric port.
    #[error("etcd endpoint {0:?} is not host:port")]
    BadEndpoint(String),
    /// An endpoint list with nothing in it.
    #[error("no etcd endpoint given")]
    NoEndpoint,
    /// A cluster id that cannot name etcd keys.
    #[error("cluster id {0:?} must be 1 to 128 characters of A-Z a-z 0-9 _ - .")]
    BadClusterId(String),
    /// A leader key whose value is not a leader record.
    #[error("leader record {0}")]
    BadLeaderRecord(&'static str),
}

/// Splits `host:port;host:port` (an `http://` prefix on an endpoint is accepted and dropped,
/// as upstream configs write it); at least one endpoint, each with a port.
pub fn parse_endpoints(text: &str) -> Result<Vec<String>, HaError> {
    let mut endpoints = Vec::new();
    for part in text.split([';', ',']) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let bare = part.strip_prefix("http://").unwrap_or(part);
        let port_ok = bare
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(HaError::BadEndpoint(part.to_string()));
        }
        endpoints.push(bare.to_string());
    }
    if endpoints.is_empty() {
        return Err(HaError::NoEndpoint);
    }
    Ok(endpoints)
}

/// A cluster id names etcd keys: non-empty, at most 128 bytes of `[A-Za-z0-9_.-]`.
pub fn validate_cluster_id(id: &str) -> Result<(), HaError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(HaError::BadClusterId(id.to_string()))
    }
}

/// The etcd key naming the current leader (attached to its lease).
pub fn leader_key(cluster_id: &str) -> String {
    format!("/moonkv/{cluster_id}/leader")
}

/// The etcd key holding the last term any leader of the cluster took.
pub fn term_key(cluster_id: &str) -> String {
    format!("/moonkv/{cluster_id}/term")
}

/// What the leader key holds: who leads, for which term, and where to reach it. Stored as
/// `name=value` lines so `etcdctl get` shows it readably.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderRecord {
    /// Grows with every election of the cluster (kept in etcd under [`term_key`]).
    pub term: u64,
    /// The leader's RPC address, `host:port`.
    pub rpc_addr: String,
    /// The leader's admin HTTP address, `host:port`.
    pub admin_addr: String,
    /// The leader's KV event endpoint, when its events are on.
    pub events_endpoint: Option<String>,
}

impl LeaderRecord {
    /// The value written under the leader key.
    pub fn render(&self) -> String {
        let mut text = format!(
            "term={}\nrpc={}\nadmin={}\n",
            self.term, self.rpc_addr, self.admin_addr
        );
        if let Some(events) = &self.events_endpoint {
            text.push_str(&format!("events={events}\n"));
        }
        text
    }

    /// Reads a value written by [`LeaderRecord::render`]; unknown lines are ignored.
    pub fn parse(value: &[u8]) -> Result<LeaderRecord, HaError> {
        let text =
            std::str::from_utf8(value).map_err(|_| HaError::BadLeaderRecord("is not UTF-8"))?;
        let (mut term, mut rpc, mut admin, mut events) = (None, None, None, None);
        for line in text.lines() {
            match line.split_once('=') {
                Some(("term", v)) => term = v.parse::<u64>().ok(),
                Some(("rpc", v)) => rpc = Some(v.to_string()),
                Some(("admin", v)) => admin = Some(v.to_string()),
                Some(("events", v)) => events = Some(v.to_string()),
                _ => {}
            }
        }
        Ok(LeaderRecord {
            term: term.ok_or(HaError::BadLeaderRecord("has no numeric term"))?,
            rpc_addr: rpc.ok_or(HaError::BadLeaderRecord("has no rpc address"))?,
            admin_addr: admin.ok_or(HaError::BadLeaderRecord("has no admin address"))?,
            events_endpoint: events,
        })
    }
}

/// The refusal of a master that does not serve: it names the leader when one is known.
pub fn not_leader_error(leader: Option<&LeaderRecord>, why: &str) -> Error {
    let message = match leader {
        Some(l) => format!(
            "{NOT_LEADER_PREFIX} ({why}); the leader is {} (term {}, admin {})",
            l.rpc_addr, l.term, l.admin_addr
        ),
        None => format!("{NOT_LEADER_PREFIX} ({why}); no leader is elected right now"),
    };
    Error::new(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE, message)
}

/// Whether an error is a standby's (or a deposed leader's) refusal.
pub fn is_not_leader(e: &Error) -> bool {
    e.code == ErrorCode::UNAVAILABLE_IN_CURRENT_MODE && e.message.starts_with(NOT_LEADER_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_addresses_parse() {
        assert_eq!(
            MasterAddr::parse("127.0.0.1:50051").unwrap(),
            MasterAddr::Direct("127.0.0.1:50051".into())
        );
        assert_eq!(
            MasterAddr::parse("etcd://10.0.0.1:2379;10.0.0.2:2379").unwrap(),
            MasterAddr::Etcd {
                endpoints: vec!["10.0.0.1:2379".into(), "10.0.0.2:2379".into()],
                cluster_id: DEFAULT_CLUSTER_ID.into()
            }
        );
        let with_id = MasterAddr::parse("etcd://h:1/prod-a").unwrap();
        assert_eq!(with_id.to_string(), "etcd://h:1/prod-a");
        for bad in [
            "etcd://",
            "etcd://h",
            "etcd://h:x",
            "etcd://h:1/a b",
            "redis://h:1",
        ] {
            let err = MasterAddr::parse(bad).unwrap_err();
            assert_eq!(err.code, ErrorCode::INVALID_PARAMS, "{bad}");
        }
    }

    #[test]
    fn leader_records_round_trip_and_refuse_garbage() {
        let record = LeaderRecord {
            term: 7,
            rpc_addr: "127.0.0.1:1".into(),
            admin_addr: "127.0.0.1:2".into(),
            events_endpoint: Some("tcp://127.0.0.1:3".into()),
        };
        assert_eq!(
            LeaderRecord::parse(record.render().as_bytes()).unwrap(),
            record
        );
        assert!(LeaderRecord::parse(b"rpc=a\nadmin=b\n").is_err());
        assert!(LeaderRecord::parse(b"term=x\nrpc=a\nadmin=b\n").is_err());
        assert!(LeaderRecord::parse(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn refusals_name_the_leader_and_are_recognised() {
        let record = LeaderRecord {
            term: 3,
            rpc_addr: "10.1.1.1:50051".into(),
            admin_addr: "10.1.1.1:9003".into(),
            events_endpoint: None,
        };
        let e = not_leader_error(Some(&record), "standby");
        assert!(is_not_leader(&e));
        assert!(e.message.contains("10.1.1.1:50051"), "{e}");
        assert!(is_not_leader(&not_leader_error(None, "etcd unreachable")));
        let other = Error::new(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE, "quotas are off");
        assert!(!is_not_leader(&other));
    }
}
