//! Same-host copies (`docs/data-plane.md`, *Same-host copies*): a caller on the node's machine
//! asks the node to attach its connection; from then on the node copies each request's bytes
//! straight between its segment and the caller's memory (`process_vm_readv` /
//! `process_vm_writev`), so a byte is copied once instead of twice through socket buffers.
//!
//! Each same-host request carries a deadline on the machine's monotonic clock, which the node
//! and the caller share: the node copies nothing once it has passed, and the caller stops
//! waiting only later, so a node that stalled never writes into memory a caller has already
//! given back to its user.

use std::time::Duration;

/// Bytes per request to a node that copies straight to and from the caller (when the store's
/// chunk size is smaller): with no socket to keep busy, splitting an object only adds round
/// trips, so objects up to this size go as one request and larger ones still spread over a
/// few connections, each copied by its own node thread.
pub const SAME_HOST_CHUNK: usize = 2 << 20;

/// A call whose same-host bytes reach this marks its requests
/// [`LONG_CALL`](crate::header::LocalPlan::LONG_CALL).
pub const LONG_CALL_BYTES: usize = 8 << 20;

/// An object at least this large, in a request the node serves whole (PUT_LOCAL, GET_LOCAL),
/// is copied by two of the node's threads at once, as a long call's copy requests are.
pub const SPLIT_COPY_BYTES: usize = 8 << 20;

/// Environment variable that turns same-host copies off for a store (`0`, `false`, `off`).
pub const SAME_HOST_ENV: &str = "MOONKV_SAME_HOST";

/// A value of [`SAME_HOST_ENV`] that is neither on nor off.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?}: expected 1/0, true/false or on/off")]
pub struct SameHostEnvError {
    /// The variable ([`SAME_HOST_ENV`]).
    pub variable: &'static str,
    /// Its value, trimmed and lowercased.
    pub value: String,
}

/// Whether same-host copies are enabled by the environment (default: yes). A value other
/// than `0`/`1`/`true`/`false`/`on`/`off` (or `yes`/`no`) is an error naming the variable.
pub fn enabled_by_env() -> Result<bool, SameHostEnvError> {
    match std::env::var(SAME_HOST_ENV) {
        Err(_) => Ok(true),
        Ok(v) => parse_enabled(&v),
    }
}

/// Reads a value of [`SAME_HOST_ENV`].
fn parse_enabled(value: &str) -> Result<bool, SameHostEnvError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        other => Err(SameHostEnvError {
            variable: SAME_HOST_ENV,
            value: other.to_string(),
        }),
    }
}

/// The machine's monotonic clock (`CLOCK_MONOTONIC`) in nanoseconds: the same clock in every
/// process of one kernel, unlike `std::time::Instant`, whose values cannot be sent.
pub fn monotonic_now_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The deadline a burst waiting `step` per answer puts on its same-host requests: a quarter of
/// `step` before the earliest moment the caller could give up on them.
pub fn deadline_for(step: Duration) -> u64 {
    let margin = step / 4;
    let ns = u64::try_from((step - margin).as_nanos()).unwrap_or(u64::MAX);
    monotonic_now_ns().saturating_add(ns)
}

/// How long past a plan's deadline a caller that gave up waits for the node to let go: the
/// node checks the deadline before every step, so at most one step (a few milliseconds of
/// copying) can still be under way then.
pub const LET_GO_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

/// The caller's memory named by same-host requests of one burst, lent to the node until it has
/// answered them all. Dropped before [`Lent::returned`] (the burst's future was dropped, or the
/// burst broke off), it does not let the memory go back to the caller until the node provably
/// stopped touching it: it shuts down the sending side of the connection, which the node checks
/// before every step (and then refuses the rest), and waits, blocking, for the node to close the
/// connection, or for the plans' deadline (plus [`LET_GO_GRACE`]) to pass.
#[must_use = "dropping it waits for the node"]
pub(crate) struct Lent {
    socket: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    deadline_ns: u64,
}

impl Lent {
    /// Lends for plans with this deadline, over the connection whose socket is `socket`.
    pub(crate) fn new(socket: std::sync::Arc<std::os::fd::OwnedFd>, deadline_ns: u64) -> Lent {
        Lent {
            socket: Some(socket),
            deadline_ns,
        }
    }

    /// Every request was answered: the node touches none of the memory any more.
    pub(crate) fn returned(mut self) {
        self.socket = None;
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(socket) = self.socket.take() {
            wait_for_node_to_let_go(&socket, self.deadline_ns);
        }
    }
}

fn wait_for_node_to_let_go(socket: &std::os::fd::OwnedFd, deadline_ns: u64) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    use rustix::io::Errno;
    let until = deadline_ns.saturating_add(LET_GO_GRACE.as_nanos() as u64);
    // An error is ignored: a connection already gone ends the wait below at once.
    let _ = rustix::net::shutdown(socket, rustix::net::Shutdown::Write);
    let mut drain = [0u8; 16 << 10];
    loop {
        let now = monotonic_now_ns();
        if now >= until {
            return;
        }
        let wait_ms = ((until - now) / 1_000_000).clamp(1, i32::MAX as u64);
        let wait = Timespec {
            tv_sec: (wait_ms / 1_000) as i64,
            tv_nsec: ((wait_ms % 1_000) * 1_000_000) as i64,
        };
        let mut fds = [PollFd::new(socket, PollFlags::IN)];
        match poll(&mut fds, Some(&wait)) {
            Ok(0) | Err(Errno::INTR) => continue,
            Ok(_) => {}
            Err(_) => return,
        }
        // Non-blocking: a duplicate of the connection's socket shares its flags.
        match rustix::io::read(socket, &mut drain[..]) {
            // The node closed the connection: it stopped, and answers no more.
            Ok(0) => return,
            Ok(_) | Err(Errno::WOULDBLOCK | Errno::INTR) => continue,
            // Reset: the node is gone.
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_clock_moves_forward_and_deadlines_leave_a_margin() {
        let a = monotonic_now_ns();
        let d = deadline_for(Duration::from_secs(8));
        let b = monotonic_now_ns();
        assert!(b >= a);
        assert!(d >= a + 6_000_000_000 && d <= b + 6_000_000_000);
    }

    #[test]
    fn the_environment_switch_reads_on_and_off_and_names_a_bad_value() {
        assert_eq!(parse_enabled(" On "), Ok(true));
        assert_eq!(parse_enabled("0"), Ok(false));
        let bad = parse_enabled("Maybe").unwrap_err();
        assert_eq!(bad.value, "maybe");
        assert_eq!(
            bad.to_string(),
            "MOONKV_SAME_HOST=\"maybe\": expected 1/0, true/false or on/off"
        );
    }

    /// A connected pair of loopback sockets and the lent duplicate of the caller's.
    fn lending() -> (std::net::TcpStream, std::sync::Arc<std::os::fd::OwnedFd>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let caller = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (node, _) = listener.accept().unwrap();
        caller.set_nonblocking(true).unwrap();
        let socket = std::os::fd::AsFd::as_fd(&caller)
            .try_clone_to_owned()
            .unwrap();
        // The caller's own descriptor may go: the lent duplicate keeps the connection.
        drop(caller);
        (node, std::sync::Arc::new(socket))
    }

    #[test]
    fn dropped_lent_memory_waits_for_the_node_to_close_the_connection() {
        let (mut node, socket) = lending();
        let lent = Lent::new(socket, deadline_for(Duration::from_secs(20)));
        let closer = std::thread::spawn(move || {
            // The caller shut its sending side: the node sees the end, stops and closes.
            let mut rest = Vec::new();
            std::io::Read::read_to_end(&mut node, &mut rest).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            drop(node);
        });
        let since = std::time::Instant::now();
        drop(lent);
        let waited = since.elapsed();
        closer.join().unwrap();
        assert!(waited >= Duration::from_millis(40), "{waited:?}");
        assert!(waited < Duration::from_secs(10), "{waited:?}");
    }

    #[test]
    fn dropped_lent_memory_of_a_silent_node_waits_out_the_deadline_and_grace() {
        let (node, socket) = lending();
        let lent = Lent::new(socket, monotonic_now_ns());
        let since = std::time::Instant::now();
        drop(lent);
        let waited = since.elapsed();
        assert!(
            waited >= LET_GO_GRACE - Duration::from_millis(5),
            "{waited:?}"
        );
        assert!(waited < LET_GO_GRACE + Duration::from_secs(5), "{waited:?}");
        drop(node);
        // Returned in time, nothing is waited for.
        let (_node, socket) = lending();
        let since = std::time::Instant::now();
        Lent::new(socket, deadline_for(Duration::from_secs(20))).returned();
        assert!(since.elapsed() < Duration::from_secs(1));
    }
}
