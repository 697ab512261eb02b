//! Local sockets: Unix stream sockets in the abstract namespace that a node (for data) and a
//! master (for RPC) offer to callers on the same machine beside their TCP port
//! (`docs/data-plane.md`, *The local socket*). An abstract socket is reachable from its network
//! namespace only and goes away with its process; its name ends in 32 random hex digits, which
//! no other program can take first. A name is written `@` and the abstract name, as `ss -xl`
//! lists it. It admits nothing by itself: what is spoken over it passes the same handshake as
//! over TCP.

use std::io;
use std::os::unix::net::UnixListener;

/// How a local socket's name is written: this character, then the abstract name.
pub const PREFIX: char = '@';

/// How a node's local socket name begins (after [`PREFIX`]).
pub const NODE: &str = "moonkv-node-";

/// How a master's local socket name begins (after [`PREFIX`]).
pub const MASTER: &str = "moonkv-master-";

/// Binds a local socket named `start` and 32 random hex digits; non-blocking, for an async
/// runtime to take. Returns its name as written (`@…`) and the listener.
pub fn bind(start: &str) -> io::Result<(String, UnixListener)> {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("{start}{:032x}", rand::random::<u128>());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let listener = UnixListener::bind_addr(&addr)?;
    listener.set_nonblocking(true)?;
    Ok((format!("{PREFIX}{name}"), listener))
}

/// Whether `name` is a local socket name of the form [`bind`] gives for `start`: [`PREFIX`],
/// `start` and 32 hex digits. Callers connect to no other name a peer hands them, so a peer
/// cannot point them at another program's socket.
pub fn is_name(name: &str, start: &str) -> bool {
    name.strip_prefix(PREFIX)
        .and_then(|n| n.strip_prefix(start))
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_name_has_its_form_and_only_such_names_are_taken() {
        let (name, listener) = bind(MASTER).expect("bind");
        assert!(is_name(&name, MASTER), "{name}");
        assert!(!is_name(&name, NODE));
        // Another bind gets another name.
        let (other, _second) = bind(MASTER).expect("bind");
        assert_ne!(name, other);
        drop(listener);
        let hex = "0123456789abcdef0123456789abcdef";
        assert!(is_name(&format!("@moonkv-master-{hex}"), MASTER));
        for bad in [
            format!("moonkv-master-{hex}"),
            format!("@moonkv-master-{hex}0"),
            format!("@moonkv-master-{}", &hex[1..]),
            format!("@moonkv-master-{}g", &hex[1..]),
            "@/tmp/socket".to_string(),
            "@".to_string(),
            String::new(),
        ] {
            assert!(!is_name(&bad, MASTER), "{bad:?}");
        }
    }
}
