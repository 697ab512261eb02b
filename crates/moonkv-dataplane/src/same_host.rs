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

/// Environment variable that turns same-host copies off for a store (`0`, `false`, `off`).
pub const SAME_HOST_ENV: &str = "MOONKV_SAME_HOST";

/// Whether same-host copies are enabled by the environment (default: yes). A value other
/// than `0`/`1`/`true`/`false`/`on`/`off` is an error naming the variable.
pub fn enabled_by_env() -> Result<bool, String> {
    match std::env::var(SAME_HOST_ENV) {
        Err(_) => Ok(true),
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "on" | "yes" => Ok(true),
            "0" | "false" | "off" | "no" => Ok(false),
            other => Err(format!(
                "{SAME_HOST_ENV}={other:?}: expected 1/0, true/false or on/off"
            )),
        },
    }
}

/// The machine's monotonic clock (`CLOCK_MONOTONIC`) in nanoseconds: the same clock in every
/// process of one kernel, unlike `std::time::Instant`, whose values cannot be sent.
pub fn monotonic_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0);
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
}
