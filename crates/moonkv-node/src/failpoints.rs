//! Named fault points, so a test can stop a node at an exact moment instead of killing it
//! "probably" mid-transfer after a sleep.
//!
//! Compiled in only with the `failpoints` feature (the `fail` crate); without it every point is
//! a no-op. A process configures them at start from `FAILPOINTS=name=actions;...`
//! ([`configure_from_env`]), with `fail`'s actions: `sleep(ms)` stalls the thread at the point,
//! `return` ends the process there with exit code [`EXIT_CODE`], as a kill would, and counts
//! such as `3*off->return` pick the occurrence.

/// A node has read half of a write's payload into segment memory (a WRITE, or one key of a
/// PUT_WHOLE).
pub const WRITE_MID_PAYLOAD: &str = "node::write_mid_payload";
/// A node has sent the answer header and half of a read's bytes.
pub const READ_MID_PAYLOAD: &str = "node::read_mid_payload";
/// A node has written and synced a disk replica's temporary file, before renaming it.
pub const DISK_BEFORE_RENAME: &str = "node::disk_before_rename";
/// A node re-mounted on a new master has announced the first chunk of a segment's catalog
/// (`AdoptReplicas` answered) and more remain. `return` here stops the announcement for good
/// while the node goes on serving and heartbeating (a node stuck mid-announcement).
pub const ANNOUNCE_MID_CATALOG: &str = "node::announce_mid_catalog";
/// A node checked a same-host step (the caller's deadline, process and connection) and is
/// about to copy it. `sleep(ms)` stalls it there, as a node descheduled between its checks and
/// the copy.
pub const LOCAL_STEP_STALL: &str = "node::local_step_stall";
/// A node serving a GET_WHOLE has its master's replica lists, before it locks the ranges it
/// reads. `sleep(ms)` stalls it there, as a node descheduled while the read leases run.
pub const GET_WHOLE_LISTED: &str = "node::get_whole_listed";
/// A store has its replicas from PutStart (or BatchPutStart), before writing any byte.
pub const AFTER_PUT_START: &str = moonkv_client::failpoints::AFTER_PUT_START;

/// Exit code of a process ended by a `return` action.
pub const EXIT_CODE: i32 = moonkv_client::failpoints::EXIT_CODE;

/// Passes the point `name`: no-op unless configured.
#[inline]
pub(crate) fn hit(name: &str) {
    moonkv_client::failpoints::hit(name)
}

/// Whether the point `name` fires, for points that stop a task rather than the process.
#[inline]
pub(crate) fn fires(name: &str) -> bool {
    moonkv_client::failpoints::fires(name)
}

/// Configures the points named in `FAILPOINTS`; an error names the entry at fault.
pub fn configure_from_env() -> Result<(), moonkv_client::failpoints::FailpointError> {
    moonkv_client::failpoints::configure_from_env()
}
