//! Why a test-kit step failed: the process, request or signal it was about and what went wrong.

/// A failed step of the test kit. Tests print it with `{}` (in `panic!`), so each variant names
/// the underlying error itself.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    /// An operating-system call failed while `doing` something.
    #[error("{doing}: {error}")]
    Io {
        /// What the kit was doing, e.g. `spawn "moonkv" "master"`.
        doing: String,
        /// The error the system gave.
        error: std::io::Error,
    },
    /// An HTTP request got no answer.
    #[error("{doing}: {error}")]
    Http {
        /// The request, e.g. `GET http://127.0.0.1:9003/health`.
        doing: String,
        /// The HTTP library's error.
        error: ureq::Error,
    },
    /// A process exited or printed something else before its ready line.
    #[error("{what} did not become ready (first line {first_line:?}): {log}")]
    NotReady {
        /// The command.
        what: String,
        /// What it printed first on stdout.
        first_line: String,
        /// Its stderr.
        log: String,
    },
    /// Hosts in network namespaces could not be built or changed.
    #[error("{0}")]
    Host(String),
    /// A signal could not be delivered.
    #[error("kill -s {signal} {pid} failed")]
    Signal {
        /// The signal's name, e.g. `STOP`.
        signal: String,
        /// The target.
        pid: u32,
    },
}

impl KitError {
    pub(crate) fn io(doing: impl Into<String>) -> impl FnOnce(std::io::Error) -> KitError {
        let doing = doing.into();
        move |error| KitError::Io { doing, error }
    }

    pub(crate) fn http(doing: impl Into<String>) -> impl FnOnce(ureq::Error) -> KitError {
        let doing = doing.into();
        move |error| KitError::Http { doing, error }
    }
}
