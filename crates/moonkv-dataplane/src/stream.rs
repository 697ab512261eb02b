//! Optional TLS for the master connection and the data plane (`docs/operations.md`, Security).
//!
//! [`Stream`] is a plain TCP, TLS or local (Unix socket) connection behind one
//! `AsyncRead`/`AsyncWrite` type, so the protocol code (hello, shared-secret handshake, grants,
//! requests) runs unchanged inside TLS and over a node's local socket (`docs/data-plane.md`,
//! *The local socket*).
//! Without the `tls` feature only the plain variant exists and any TLS setting is refused when
//! it is loaded.

use crate::local_stream::LocalStream;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

pub use moonkv_proto::tls::{TlsClientConfig, TlsServerConfig};

/// A connection to or from a master or node: plain TCP, TLS, or a node's local socket.
pub enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// A caller's end of a node's or a master's local socket: a Unix stream socket in the
    /// abstract namespace, reachable from this machine's (network namespace's) processes only.
    /// It hears of writing space only while a write waits for it ([`LocalStream`]).
    Local(LocalStream),
    /// A node's end of its local socket, registered as the runtime registers any socket (for
    /// reading and writing space): served that way, 4 KiB same-host gets and puts measured
    /// faster than over a [`LocalStream`] (`docs/benchmarks.md`, *A caller's local socket
    /// registered for reading only*).
    LocalServed(UnixStream),
    /// TLS, either side (tokio-rustls' own client/server stream).
    #[cfg(feature = "tls")]
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

macro_rules! each {
    ($self:ident, $s:ident => $body:expr) => {
        match $self.get_mut() {
            Stream::Plain($s) => $body,
            Stream::Local($s) => $body,
            Stream::LocalServed($s) => $body,
            #[cfg(feature = "tls")]
            Stream::Tls($s) => $body,
        }
    };
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Local(s) => s.is_write_vectored(),
            Stream::LocalServed(s) => s.is_write_vectored(),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_shutdown(cx))
    }
}

/// Why TLS could not be set up or established.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// This build has no TLS (cargo feature `tls`).
    #[error("this moonkv was built without TLS support (cargo feature `tls`)")]
    Unsupported,
    /// A certificate, key or CA file could not be used, or the address has no name a
    /// certificate could be checked against; the error names the file or setting at fault.
    #[error(transparent)]
    Settings(#[from] moonkv_proto::tls::TlsConfigError),
    /// The TLS handshake with the peer failed.
    #[error("{explained}")]
    Handshake {
        /// What to fix when that is known (see [`explain`]), else the I/O error's text.
        explained: String,
        /// The failure as the TLS stream reported it.
        #[source]
        source: io::Error,
    },
}

/// Client-side TLS settings, loaded once and shared by every connection.
#[derive(Clone)]
pub struct TlsConnector {
    config: TlsClientConfig,
    #[cfg(feature = "tls")]
    inner: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector")
            .field("config", &self.config)
            .finish()
    }
}

impl TlsConnector {
    /// Reads the CA (and client certificate) files; the error names the file at fault.
    pub fn load(config: &TlsClientConfig) -> Result<TlsConnector, TlsError> {
        #[cfg(feature = "tls")]
        {
            Ok(TlsConnector {
                config: config.clone(),
                inner: tokio_rustls::TlsConnector::from(config.load().map_err(TlsError::Settings)?),
            })
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = config;
            Err(TlsError::Unsupported)
        }
    }

    /// Loads `config` when given; a bad file is an error for the caller to report.
    pub fn load_if_set(config: Option<&TlsClientConfig>) -> Result<Option<TlsConnector>, TlsError> {
        config.map(Self::load).transpose()
    }
}

/// Server-side TLS (a node's data plane), loaded once.
#[derive(Clone)]
pub struct TlsAcceptor {
    #[cfg(feature = "tls")]
    inner: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsAcceptor")
    }
}

impl TlsAcceptor {
    /// Reads the certificate and key files; the error names the file at fault.
    pub fn load(config: &TlsServerConfig) -> Result<TlsAcceptor, TlsError> {
        #[cfg(feature = "tls")]
        {
            Ok(TlsAcceptor {
                inner: tokio_rustls::TlsAcceptor::from(config.load().map_err(TlsError::Settings)?),
            })
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = config;
            Err(TlsError::Unsupported)
        }
    }

    /// Performs the server side of the handshake within `limit`.
    pub async fn accept(&self, stream: TcpStream, limit: Duration) -> io::Result<Stream> {
        #[cfg(feature = "tls")]
        {
            let accepted = tokio::time::timeout(limit, self.inner.accept(stream))
                .await
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                })??;
            Ok(Stream::Tls(Box::new(accepted.into())))
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = (stream, limit);
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                TlsError::Unsupported,
            ))
        }
    }
}

/// How a failed connection went wrong, for the caller's error message.
#[derive(Debug, thiserror::Error)]
pub enum ConnectFailure {
    /// TCP connect (or socket option) failed.
    #[error("TCP connect failed")]
    Tcp(#[source] io::Error),
    /// TLS could not be established; the text says what to fix when that is known.
    #[error(transparent)]
    Tls(TlsError),
}

/// The shortest bound [`unacked_bound`] gives: TCP's minimum retransmission timeout is 200 ms,
/// so a bound near it would close healthy connections on a lossy link.
pub const MIN_UNACKED: Duration = Duration::from_secs(1);

/// How long sent bytes may stay unacknowledged by the peer's kernel before a connection counts
/// as dead, for a caller whose connect timeout is `connect_timeout`: the same, at least
/// [`MIN_UNACKED`].
pub fn unacked_bound(connect_timeout: Duration) -> Duration {
    connect_timeout.max(MIN_UNACKED)
}

/// Opens a TCP connection to `addr` with `TCP_NODELAY` and, with `tls`, performs the TLS
/// handshake, verifying the `peer` ("master" or "node") against the configured CA.
///
/// `unacked` sets `TCP_USER_TIMEOUT`: bytes sent that the peer's kernel has not acknowledged
/// within it close the connection with `ETIMEDOUT`. A peer process that is merely slow still
/// acknowledges at the TCP level, so only a host that is gone or cut off trips it; without
/// it a request on a pooled connection to such a host would wait out the whole transfer
/// timeout (the kernel's own bound is about 15 minutes).
pub async fn connect(
    addr: &str,
    tls: Option<&TlsConnector>,
    peer: &str,
    unacked: Option<Duration>,
) -> Result<Stream, ConnectFailure> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(ConnectFailure::Tcp)?;
    stream.set_nodelay(true).map_err(ConnectFailure::Tcp)?;
    if let Some(unacked) = unacked {
        let ms = u32::try_from(unacked.as_millis())
            .unwrap_or(u32::MAX)
            .max(1);
        rustix::net::sockopt::set_tcp_user_timeout(&stream, ms)
            .map_err(|e| ConnectFailure::Tcp(e.into()))?;
    }
    let Some(tls) = tls else {
        return Ok(Stream::Plain(stream));
    };
    #[cfg(feature = "tls")]
    {
        let name = tls
            .config
            .server_name(addr)
            .map_err(|why| ConnectFailure::Tls(TlsError::Settings(why)))?;
        match tls.inner.connect(name, stream).await {
            Ok(s) => Ok(Stream::Tls(Box::new(s.into()))),
            Err(source) => Err(ConnectFailure::Tls(TlsError::Handshake {
                explained: explain(&source, peer, addr),
                source,
            })),
        }
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = (tls, peer);
        Err(ConnectFailure::Tls(TlsError::Unsupported))
    }
}

/// How a local socket's name is written: `@`, then the abstract name.
pub const LOCAL_PREFIX: char = moonkv_proto::local_socket::PREFIX;

/// How every node's local socket name begins (after [`LOCAL_PREFIX`]); 32 hex digits follow.
pub const LOCAL_NAME_START: &str = moonkv_proto::local_socket::NODE;

/// Whether `name`, as a STATS answer gives it, names a node's local socket: `@`,
/// [`LOCAL_NAME_START`] and 32 hex digits. Callers connect to no other name a node gives, so a
/// node cannot point them at another program's socket.
pub fn is_local_name(name: &str) -> bool {
    moonkv_proto::local_socket::is_name(name, LOCAL_NAME_START)
}

/// Opens a connection to a node's local socket `name` (as its STATS answer gives it: `@` and
/// an abstract name). Refused (`ECONNREFUSED`) when no socket of that name listens, as after
/// the node stopped.
pub async fn connect_local(name: &str) -> io::Result<Stream> {
    let Some(abstract_name) = name.strip_prefix(LOCAL_PREFIX).filter(|n| !n.is_empty()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a local socket name (`@` and an abstract name)"),
        ));
    };
    // tokio reads a leading NUL as the abstract namespace.
    let path = format!("\0{abstract_name}");
    Ok(Stream::Local(LocalStream::connect(&path).await?))
}

/// An I/O error on a connection to a `peer` at `addr`, with the TLS fix spelled out when the
/// error came from TLS (a refused client certificate surfaces on the first read).
pub fn explain(e: &io::Error, peer: &str, addr: &str) -> String {
    #[cfg(feature = "tls")]
    if let Some(hint) = moonkv_proto::tls::explain_client_error(e, peer, addr) {
        return hint;
    }
    let _ = (peer, addr);
    e.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_bounds_how_long_its_bytes_may_stay_unacknowledged() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let bound = unacked_bound(Duration::from_millis(2500));
        // Irrefutable without the `tls` feature.
        #[allow(irrefutable_let_patterns)]
        let Stream::Plain(tcp) = connect(&addr, None, "node", Some(bound)).await.unwrap() else {
            panic!("a plain connection");
        };
        assert_eq!(
            rustix::net::sockopt::tcp_user_timeout(&tcp).unwrap(),
            2500,
            "TCP_USER_TIMEOUT follows the connect timeout"
        );
        // Below TCP's retransmission floor the bound stays at one second.
        assert_eq!(unacked_bound(Duration::from_millis(100)), MIN_UNACKED);
        #[allow(irrefutable_let_patterns)]
        let Stream::Plain(tcp) = connect(&addr, None, "node", None).await.unwrap() else {
            panic!("a plain connection");
        };
        assert_eq!(rustix::net::sockopt::tcp_user_timeout(&tcp).unwrap(), 0);
    }

    #[test]
    fn only_a_node_local_socket_name_is_taken() {
        assert!(is_local_name(
            "@moonkv-node-0123456789abcdef0123456789ABCDEF"
        ));
        for bad in [
            "moonkv-node-0123456789abcdef0123456789abcdef",
            "@moonkv-node-0123456789abcdef0123456789abcde",
            "@moonkv-node-0123456789abcdef0123456789abcdefa",
            "@moonkv-node-0123456789abcdef0123456789abcdeg",
            "@/tmp/.X11-unix/X0",
            "@",
            "",
        ] {
            assert!(!is_local_name(bad), "{bad:?}");
        }
    }
}
