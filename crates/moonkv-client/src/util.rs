//! Small shared helpers: fresh ids, secrets from the environment, key checks (sizes are
//! re-exported from `moonkv_proto::units`).

use moonkv_proto::{Error, ErrorCode, Result};

pub use moonkv_proto::units::{format_size, parse_size};

/// The shared secret from `MOONKV_AUTH_SECRET[_FILE]`; a bad one is logged and ignored, so
/// the failure surfaces as an authentication error naming the variables.
pub fn secret_from_env() -> Option<moonkv_proto::auth::Secret> {
    logged(moonkv_proto::auth::Secret::from_env())
}

/// The grant secret from `MOONKV_GRANT_SECRET[_FILE]`, like [`secret_from_env`].
pub fn grant_secret_from_env() -> Option<moonkv_proto::auth::Secret> {
    logged(moonkv_proto::auth::Secret::grant_secret_from_env())
}

fn logged(
    found: std::result::Result<Option<moonkv_proto::auth::Secret>, moonkv_proto::auth::SecretError>,
) -> Option<moonkv_proto::auth::Secret> {
    match found {
        Ok(secret) => secret,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring a secret from the environment");
            None
        }
    }
}

/// Checks a key before it is sent anywhere.
pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::new(ErrorCode::INVALID_KEY, "the key is empty"));
    }
    if key.len() > moonkv_proto::MAX_KEY_LEN {
        return Err(Error::new(
            ErrorCode::INVALID_KEY,
            format!(
                "the key is {} bytes long; the limit is {}",
                key.len(),
                moonkv_proto::MAX_KEY_LEN
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        assert!(check_key("a").is_ok());
        assert_eq!(check_key("").unwrap_err().code, ErrorCode::INVALID_KEY);
        assert_eq!(
            check_key(&"x".repeat(5000)).unwrap_err().code,
            ErrorCode::INVALID_KEY
        );
    }
}

/// Why a tokio runtime could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the async runtime: {0}")]
pub struct RuntimeError(#[source] std::io::Error);

/// A multi-threaded tokio runtime with I/O and timers (`worker_threads` 0 = one per core), as
/// the binary, the benchmarks and blocking callers run the store in.
pub fn runtime(
    worker_threads: usize,
) -> std::result::Result<tokio::runtime::Runtime, RuntimeError> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if worker_threads > 0 {
        builder.worker_threads(worker_threads);
    }
    builder.enable_all().build().map_err(RuntimeError)
}
