//! Shared-secret authentication: HMAC-SHA256 challenge-response, mutual.
//!
//! The secret never crosses the wire. The master sends a random challenge; the client answers
//! with its own nonce and `HMAC(secret, "moonkv client" ‖ challenge ‖ client_nonce)`; the master
//! answers with `HMAC(secret, "moonkv server" ‖ challenge ‖ client_nonce)`. Both sides compare in
//! constant time. Without TLS this authenticates but does not encrypt.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use std::path::Path;

/// Length of challenges and nonces, in bytes.
pub const NONCE_LEN: usize = 16;
/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;
/// Environment variable holding the secret for clients and nodes.
pub const SECRET_ENV: &str = "MOONKV_AUTH_SECRET";
/// Environment variable naming a file that holds the secret.
pub const SECRET_FILE_ENV: &str = "MOONKV_AUTH_SECRET_FILE";
/// Environment variable holding the grant secret of the master and the nodes (never clients).
pub const GRANT_SECRET_ENV: &str = "MOONKV_GRANT_SECRET";
/// Environment variable naming a file that holds the grant secret.
pub const GRANT_SECRET_FILE_ENV: &str = "MOONKV_GRANT_SECRET_FILE";

/// Why a secret could not be had. The message never contains secret bytes.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Shorter than [`MIN_SECRET_LEN`].
    #[error("the secret must be at least {MIN_SECRET_LEN} bytes long")]
    TooShort,
    /// The secret file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The secret in this file is unusable.
    #[error("{}: {source}", path.display())]
    InFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with its content.
        #[source]
        source: Box<SecretError>,
    },
    /// The secret in this environment variable is unusable.
    #[error("{var}: {source}")]
    InVar {
        /// The variable.
        var: String,
        /// What is wrong with its value.
        #[source]
        source: Box<SecretError>,
    },
}

/// A shared secret. Its `Debug` and `Display` never show the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// Wraps secret bytes, refusing ones too short to resist guessing.
    pub fn new(bytes: Vec<u8>) -> Result<Self, SecretError> {
        if bytes.len() < MIN_SECRET_LEN {
            return Err(SecretError::TooShort);
        }
        Ok(Self(bytes))
    }

    /// Reads a secret from a file; one trailing newline is ignored.
    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        let mut bytes = std::fs::read(path).map_err(|source| SecretError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        Self::new(bytes).map_err(|e| SecretError::InFile {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    /// The secret from `MOONKV_AUTH_SECRET` or the file named by `MOONKV_AUTH_SECRET_FILE`.
    pub fn from_env() -> Result<Option<Self>, SecretError> {
        Self::from_env_vars(SECRET_ENV, SECRET_FILE_ENV)
    }

    /// The grant secret from `MOONKV_GRANT_SECRET` or the file named by
    /// `MOONKV_GRANT_SECRET_FILE`.
    pub fn grant_secret_from_env() -> Result<Option<Self>, SecretError> {
        Self::from_env_vars(GRANT_SECRET_ENV, GRANT_SECRET_FILE_ENV)
    }

    fn from_env_vars(value_var: &str, file_var: &str) -> Result<Option<Self>, SecretError> {
        if let Ok(value) = std::env::var(value_var) {
            if !value.is_empty() {
                return Self::new(value.into_bytes())
                    .map(Some)
                    .map_err(|e| SecretError::InVar {
                        var: value_var.to_string(),
                        source: Box::new(e),
                    });
            }
        }
        match std::env::var(file_var) {
            Ok(path) if !path.is_empty() => Self::from_file(Path::new(&path)).map(Some),
            _ => Ok(None),
        }
    }

    fn mac(&self, label: &[u8], challenge: &[u8], client_nonce: &[u8]) -> Hmac<Sha256> {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(label);
        mac.update(challenge);
        mac.update(client_nonce);
        mac
    }

    /// The client's proof for a challenge.
    pub fn client_proof(&self, challenge: &[u8], client_nonce: &[u8]) -> Vec<u8> {
        self.mac(b"moonkv client", challenge, client_nonce)
            .finalize()
            .into_bytes()
            .to_vec()
    }

    /// The master's proof for a challenge.
    pub fn server_proof(&self, challenge: &[u8], client_nonce: &[u8]) -> Vec<u8> {
        self.mac(b"moonkv server", challenge, client_nonce)
            .finalize()
            .into_bytes()
            .to_vec()
    }

    /// HMAC-SHA256 of the concatenated `parts` under the secret (capability grants).
    pub fn tag(&self, parts: &[&[u8]]) -> [u8; 32] {
        self.tagger(parts).finalize().into_bytes().into()
    }

    /// Checks a [`Secret::tag`] in constant time.
    pub fn verify_tag(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.tagger(parts).verify_slice(tag).is_ok()
    }

    fn tagger(&self, parts: &[&[u8]]) -> Hmac<Sha256> {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        for part in parts {
            mac.update(part);
        }
        mac
    }

    /// Checks a client proof in constant time.
    pub fn verify_client(&self, challenge: &[u8], client_nonce: &[u8], proof: &[u8]) -> bool {
        self.mac(b"moonkv client", challenge, client_nonce)
            .verify_slice(proof)
            .is_ok()
    }

    /// The `Authorization` header value the admin HTTP port expects (`Bearer <secret>`), when
    /// the secret is text. It carries the secret itself: send it only to the admin port.
    pub fn bearer_header(&self) -> Option<String> {
        std::str::from_utf8(&self.0)
            .ok()
            .map(|text| format!("Bearer {text}"))
    }

    /// Whether `candidate` is the secret itself (constant time in the secret's bytes); used
    /// by the admin HTTP `Authorization: Bearer` check.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        if candidate.len() != self.0.len() {
            return false;
        }
        self.0
            .iter()
            .zip(candidate)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    /// Checks a master proof in constant time.
    pub fn verify_server(&self, challenge: &[u8], client_nonce: &[u8], proof: &[u8]) -> bool {
        self.mac(b"moonkv server", challenge, client_nonce)
            .verify_slice(proof)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_verify_only_with_the_same_secret_and_inputs() {
        let a = Secret::new(b"0123456789abcdef".to_vec()).unwrap();
        let b = Secret::new(b"0123456789abcdeX".to_vec()).unwrap();
        let (challenge, nonce) = ([1u8; NONCE_LEN], [2u8; NONCE_LEN]);
        let proof = a.client_proof(&challenge, &nonce);
        assert!(a.verify_client(&challenge, &nonce, &proof));
        assert!(!b.verify_client(&challenge, &nonce, &proof));
        assert!(!a.verify_client(&[3u8; NONCE_LEN], &nonce, &proof));
        assert!(
            !a.verify_server(&challenge, &nonce, &proof),
            "client and server proofs differ"
        );
        assert!(!a.verify_client(&challenge, &nonce, &proof[..31]));
    }

    #[test]
    fn secrets_are_redacted_and_must_be_long_enough() {
        let s = Secret::new(b"super-secret-value-123".to_vec()).unwrap();
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
        assert!(Secret::new(b"short".to_vec()).is_err());
        assert!(s.matches(b"super-secret-value-123"));
        assert!(!s.matches(b"super-secret-value-124"));
        assert!(!s.matches(b"super"));
    }
}
