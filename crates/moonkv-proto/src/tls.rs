//! Optional TLS for the master protocol and the data plane: where the PEM files are, and (with
//! the `tls` feature) how they become rustls configurations and how handshake failures are
//! explained to an operator.
//!
//! TLS wraps the whole connection; the shared-secret handshake and grants run unchanged inside
//! it. The file settings exist without the feature, so configs and flags parse everywhere; a
//! build without it refuses them with a message saying so.

use std::path::PathBuf;

/// Environment variable naming the PEM file of the CA that signed the servers' certificates.
pub const CA_FILE_ENV: &str = "MOONKV_TLS_CA_FILE";
/// Environment variable naming the client certificate (PEM) for servers that require one.
pub const CERT_FILE_ENV: &str = "MOONKV_TLS_CERT_FILE";
/// Environment variable naming the private key (PEM) of the client certificate.
pub const KEY_FILE_ENV: &str = "MOONKV_TLS_KEY_FILE";
/// Environment variable overriding the name the server certificate must carry.
pub const SERVER_NAME_ENV: &str = "MOONKV_TLS_SERVER_NAME";

/// Whether this build can speak TLS.
pub const AVAILABLE: bool = cfg!(feature = "tls");

/// How a client verifies servers, and the certificate it shows when they require one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsClientConfig {
    /// PEM file of the CA (or CAs) server certificates must chain to.
    pub ca_file: PathBuf,
    /// Client certificate chain (PEM), for servers that require client certificates.
    pub cert_file: Option<PathBuf>,
    /// Private key (PEM) of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Name the server certificate must carry; default: the host part of the address.
    pub server_name: Option<String>,
}

impl TlsClientConfig {
    /// Verifies servers against the CA in `ca_file`.
    pub fn new(ca_file: impl Into<PathBuf>) -> Self {
        Self {
            ca_file: ca_file.into(),
            ..Self::default()
        }
    }

    /// From `MOONKV_TLS_CA_FILE` (and `MOONKV_TLS_CERT_FILE`, `MOONKV_TLS_KEY_FILE`,
    /// `MOONKV_TLS_SERVER_NAME`); `None` when no CA is named.
    pub fn from_env() -> Option<Self> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let ca_file = var(CA_FILE_ENV)?;
        Some(Self {
            ca_file: ca_file.into(),
            cert_file: var(CERT_FILE_ENV).map(PathBuf::from),
            key_file: var(KEY_FILE_ENV).map(PathBuf::from),
            server_name: var(SERVER_NAME_ENV).and_then(|v| v.into_string().ok()),
        })
    }
}

/// The certificate a server presents, and the CA its clients must chain to when required.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsServerConfig {
    /// Certificate chain (PEM), leaf first.
    pub cert_file: PathBuf,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// When set, clients must present a certificate signed by this CA (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
}

/// True for the first byte of a TLS record (handshake or alert): a plaintext peer that reads
/// one of these is talking to a TLS endpoint.
pub fn looks_like_tls(first_byte: u8) -> bool {
    matches!(first_byte, 0x15 | 0x16)
}

/// Why TLS settings could not be loaded; every message names the file or setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    /// Built without the `tls` feature.
    #[error("this moonkv was built without TLS support (cargo feature `tls`)")]
    Unsupported,
    /// A PEM file could not be read or parsed.
    #[error("{}: {source}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What the PEM reader said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A PEM file holds nothing usable of what was asked for.
    #[error("{}: {what}", path.display())]
    Unusable {
        /// The file.
        path: PathBuf,
        /// What is missing or wrong.
        what: String,
    },
    /// The files are readable but rustls refused the combination.
    #[error("{context}: {source}")]
    Refused {
        /// Which files or setting.
        context: String,
        /// The rustls error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A setting is missing or malformed.
    #[error("{0}")]
    Setting(String),
}

#[cfg(not(feature = "tls"))]
impl TlsServerConfig {
    /// Without the `tls` feature every TLS setting is refused.
    pub fn check(&self) -> Result<(), TlsConfigError> {
        Err(TlsConfigError::Unsupported)
    }
}

#[cfg(not(feature = "tls"))]
impl TlsClientConfig {
    /// Without the `tls` feature every TLS setting is refused.
    pub fn check(&self) -> Result<(), TlsConfigError> {
        Err(TlsConfigError::Unsupported)
    }
}

#[cfg(feature = "tls")]
pub use with_rustls::*;

#[cfg(feature = "tls")]
mod with_rustls {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use rustls::server::WebPkiClientVerifier;
    use rustls::{CertificateError, ClientConfig, RootCertStore, ServerConfig};
    use std::path::Path;
    use std::sync::Arc;

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// Every certificate in a PEM file; an empty or unreadable file is an error naming it.
    pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
        let bad = |e: rustls::pki_types::pem::Error| TlsConfigError::Pem {
            path: path.to_path_buf(),
            source: Box::new(e),
        };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(bad)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad)?;
        if certs.is_empty() {
            return Err(TlsConfigError::Unusable {
                path: path.to_path_buf(),
                what: "no PEM certificate in the file".into(),
            });
        }
        Ok(certs)
    }

    /// The first private key in a PEM file.
    pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsConfigError> {
        PrivateKeyDer::from_pem_file(path).map_err(|e| TlsConfigError::Unusable {
            path: path.to_path_buf(),
            what: format!("no usable PEM private key ({e})"),
        })
    }

    fn roots(path: &Path) -> Result<RootCertStore, TlsConfigError> {
        let mut roots = RootCertStore::empty();
        for cert in load_certs(path)? {
            roots.add(cert).map_err(|e| TlsConfigError::Unusable {
                path: path.to_path_buf(),
                what: format!("not a usable CA certificate: {e}"),
            })?;
        }
        Ok(roots)
    }

    fn refused(
        context: String,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> TlsConfigError {
        TlsConfigError::Refused {
            context,
            source: Box::new(e),
        }
    }

    fn protocols(e: rustls::Error) -> TlsConfigError {
        refused("TLS protocol versions".into(), e)
    }

    impl TlsServerConfig {
        /// Loads the files into a rustls server configuration.
        pub fn load(&self) -> Result<Arc<ServerConfig>, TlsConfigError> {
            let certs = load_certs(&self.cert_file)?;
            let key = load_key(&self.key_file)?;
            let builder = ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(protocols)?;
            let builder = match &self.client_ca_file {
                None => builder.with_no_client_auth(),
                Some(ca) => {
                    let verifier = WebPkiClientVerifier::builder_with_provider(
                        Arc::new(roots(ca)?),
                        provider(),
                    )
                    .build()
                    .map_err(|e| refused(ca.display().to_string(), e))?;
                    builder.with_client_cert_verifier(verifier)
                }
            };
            let config = builder.with_single_cert(certs, key).map_err(|e| {
                let files = format!(
                    "{} / {}: certificate and key do not fit together",
                    self.cert_file.display(),
                    self.key_file.display()
                );
                refused(files, e)
            })?;
            Ok(Arc::new(config))
        }

        /// Loads the files once, to stop a process at start when one is bad.
        pub fn check(&self) -> Result<(), TlsConfigError> {
            self.load().map(drop)
        }
    }

    impl TlsClientConfig {
        /// Loads the files into a rustls client configuration.
        pub fn load(&self) -> Result<Arc<ClientConfig>, TlsConfigError> {
            let builder = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(protocols)?
                .with_root_certificates(roots(&self.ca_file)?);
            let config = match (&self.cert_file, &self.key_file) {
                (None, None) => builder.with_no_client_auth(),
                (Some(cert), Some(key)) => builder
                    .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
                    .map_err(|e| {
                        let files = format!(
                            "{} / {}: certificate and key do not fit together",
                            cert.display(),
                            key.display()
                        );
                        refused(files, e)
                    })?,
                _ => {
                    return Err(TlsConfigError::Setting(format!(
                        "a client certificate needs both {CERT_FILE_ENV} and {KEY_FILE_ENV}"
                    )))
                }
            };
            Ok(Arc::new(config))
        }

        /// Loads the files once, to stop a process at start when one is bad.
        pub fn check(&self) -> Result<(), TlsConfigError> {
            self.load().map(drop)
        }

        /// The name the server at `addr` (`host:port`) must prove: the override, or the host.
        pub fn server_name(&self, addr: &str) -> Result<ServerName<'static>, TlsConfigError> {
            let host = match &self.server_name {
                Some(name) => name.as_str(),
                None => host_of(addr),
            };
            ServerName::try_from(host.to_string()).map_err(|_| {
                TlsConfigError::Setting(format!(
                    "{host:?} is not a valid TLS server name; set {SERVER_NAME_ENV}"
                ))
            })
        }
    }

    /// The host part of `host:port`, without the brackets of an IPv6 literal.
    fn host_of(addr: &str) -> &str {
        let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
        host.trim_start_matches('[').trim_end_matches(']')
    }

    /// What an operator should do about a TLS failure seen by a client talking to a `peer`
    /// ("master" or "node") at `addr`; `None` when the error is not a TLS one.
    pub fn explain_client_error(e: &std::io::Error, peer: &str, addr: &str) -> Option<String> {
        let tls = e.get_ref()?.downcast_ref::<rustls::Error>()?;
        use rustls::AlertDescription as Alert;
        let hint = match tls {
            rustls::Error::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer | CertificateError::BadSignature => format!(
                    "the certificate of the {peer} at {addr} is not signed by the CA in \
                     {CA_FILE_ENV}; point it at the CA that issued the {peer}'s certificate"
                ),
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => {
                    format!(
                        "the certificate of the {peer} at {addr} is not valid for that name; \
                         connect by a name the certificate carries or set {SERVER_NAME_ENV} ({c:?})"
                    )
                }
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    format!("the certificate of the {peer} at {addr} has expired")
                }
                other => format!("the certificate of the {peer} at {addr} was refused: {other:?}"),
            },
            rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
                format!(
                "the {peer} at {addr} does not speak TLS; enable TLS on it or unset {CA_FILE_ENV}"
            )
            }
            rustls::Error::AlertReceived(Alert::CertificateRequired)
            | rustls::Error::AlertReceived(Alert::HandshakeFailure) => {
                format!(
                    "the {peer} at {addr} requires a client certificate; set {CERT_FILE_ENV} and \
                     {KEY_FILE_ENV} to a certificate its client CA signed ({tls})"
                )
            }
            rustls::Error::AlertReceived(
                Alert::UnknownCA | Alert::BadCertificate | Alert::CertificateUnknown,
            ) => format!(
                "the {peer} at {addr} refused this client's certificate: it is not signed by the \
                 {peer}'s client CA ({tls})"
            ),
            other => format!("TLS with the {peer} at {addr} failed: {other}"),
        };
        Some(hint)
    }
}
