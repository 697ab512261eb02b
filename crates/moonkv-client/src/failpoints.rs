//! Named fault points of the client (see `moonkv_node::failpoints`, which lists them all and
//! adds the node's). Compiled in only with the `failpoints` feature.

/// A store has its replicas from PutStart (or BatchPutStart), before writing any byte.
pub const AFTER_PUT_START: &str = "store::after_put_start";

/// Exit code of a process ended at a fault point by a `return` action.
pub const EXIT_CODE: i32 = 86;

/// Passes the point `name`: no-op unless configured; `return` ends the process here.
#[inline]
pub fn hit(name: &str) {
    #[cfg(feature = "failpoints")]
    if fail::eval(name, |_| ()).is_some() {
        eprintln!("failpoint {name}: exiting");
        std::process::exit(EXIT_CODE);
    }
    let _ = name;
}

/// Whether the point `name` fires (a `return` action), for points where the caller decides
/// what firing means, such as a task that stops there while the process goes on.
#[inline]
pub fn fires(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    return fail::eval(name, |_| ()).is_some();
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        false
    }
}

/// Why `FAILPOINTS` could not be applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FailpointError {
    /// An entry without `=`.
    #[error("FAILPOINTS entry '{0}' is not name=actions")]
    NotNameActions(String),
    /// Actions the fault-point library refused.
    #[error("FAILPOINTS entry '{entry}': {why}")]
    BadActions {
        /// The entry as given.
        entry: String,
        /// The library's reason.
        why: String,
    },
    /// `FAILPOINTS` is set but this build has no fault points.
    #[error("this moonkv was built without fault points (cargo feature `failpoints`)")]
    NotBuilt,
}

/// Configures the points named in `FAILPOINTS` (`name=actions;...`); an error names the entry
/// at fault. Without the `failpoints` feature a set `FAILPOINTS` is an error, so a test never
/// passes by accident against a build that ignores it.
pub fn configure_from_env() -> Result<(), FailpointError> {
    let Ok(spec) = std::env::var("FAILPOINTS") else {
        return Ok(());
    };
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, actions) = entry
            .split_once('=')
            .ok_or_else(|| FailpointError::NotNameActions(entry.to_string()))?;
        configure(entry, name.trim(), actions.trim())?;
    }
    Ok(())
}

#[cfg(feature = "failpoints")]
fn configure(entry: &str, name: &str, actions: &str) -> Result<(), FailpointError> {
    fail::cfg(name, actions).map_err(|why| FailpointError::BadActions {
        entry: entry.to_string(),
        why,
    })
}

#[cfg(not(feature = "failpoints"))]
fn configure(_: &str, _: &str, _: &str) -> Result<(), FailpointError> {
    Err(FailpointError::NotBuilt)
}
