//! The RPC port's optional TLS: an accepted socket becomes a reader and a writer half, over
//! plain TCP or over TLS, so the protocol code runs unchanged on either.
//!
//! A TLS port answers a plaintext client with one protocol error frame naming the fix, instead
//! of leaving it to guess from a dropped connection.

use std::io;
#[cfg(feature = "tls")]
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Reading half of a connection.
pub(crate) type Reader = Box<dyn AsyncRead + Send + Unpin>;
/// Writing half of a connection.
pub(crate) type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// How long a new connection may take to send its first bytes and finish the TLS handshake.
#[cfg(feature = "tls")]
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The RPC port's TLS settings, loaded.
#[derive(Clone)]
pub(crate) struct RpcTls {
    #[cfg(feature = "tls")]
    acceptor: tokio_rustls::TlsAcceptor,
    #[cfg(not(feature = "tls"))]
    _never: std::convert::Infallible,
}

/// The RPC port's certificate, key or client CA could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("TLS: {0}")]
pub struct TlsLoadError(#[source] pub moonkv_proto::tls::TlsConfigError);

impl RpcTls {
    /// Loads the certificate, key and optional client CA.
    pub fn load(config: &moonkv_proto::tls::TlsServerConfig) -> Result<RpcTls, TlsLoadError> {
        #[cfg(feature = "tls")]
        {
            Ok(RpcTls {
                acceptor: tokio_rustls::TlsAcceptor::from(config.load().map_err(TlsLoadError)?),
            })
        }
        #[cfg(not(feature = "tls"))]
        {
            config.check().map_err(TlsLoadError)?;
            unreachable!("check refuses every TLS setting without the feature")
        }
    }
}

/// Splits an accepted connection, performing the TLS handshake when the port requires it.
pub(crate) async fn accept(
    stream: TcpStream,
    tls: Option<&RpcTls>,
) -> io::Result<(Reader, Writer)> {
    let Some(tls) = tls else {
        let (reader, writer) = stream.into_split();
        return Ok((Box::new(reader), Box::new(writer)));
    };
    accept_tls(stream, tls).await
}

#[cfg(not(feature = "tls"))]
async fn accept_tls(_: TcpStream, tls: &RpcTls) -> io::Result<(Reader, Writer)> {
    match tls._never {}
}

#[cfg(feature = "tls")]
async fn accept_tls(stream: TcpStream, tls: &RpcTls) -> io::Result<(Reader, Writer)> {
    let timed_out = || io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out");
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first))
        .await
        .map_err(|_| timed_out())??;
    if peeked == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "closed before the TLS handshake",
        ));
    }
    if !moonkv_proto::tls::looks_like_tls(first[0]) {
        refuse_plaintext(stream).await;
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "plaintext client on the TLS port",
        ));
    }
    let tls_stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(stream))
        .await
        .map_err(|_| timed_out())?
        .inspect_err(|e| tracing::warn!(error = %e, "TLS handshake with a client failed"))?;
    let (reader, writer) = tokio::io::split(tls_stream);
    Ok((Box::new(reader), Box::new(writer)))
}

/// Answers a plaintext hello with an error frame saying the port speaks TLS, then closes.
#[cfg(feature = "tls")]
async fn refuse_plaintext(mut stream: TcpStream) {
    use moonkv_proto::{frame, Error, ErrorCode};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = stream
        .local_addr()
        .map_or_else(|_| "this address".to_string(), |a| a.to_string());
    let msg = format!(
        "the master at {addr} only accepts TLS; set {} to the CA that signed its certificate",
        moonkv_proto::tls::CA_FILE_ENV
    );
    let mut out = Vec::new();
    frame::encode_err(&mut out, 0, &Error::new(ErrorCode::ILLEGAL_CLIENT, msg));
    // Read the hello first: closing with unread bytes resets the connection, and the client
    // would lose the answer.
    let grace = Duration::from_secs(1);
    let mut scratch = vec![0u8; 64 * 1024];
    let _ = tokio::time::timeout(grace, stream.read(&mut scratch)).await;
    let _ = tokio::time::timeout(grace, stream.write_all(&out)).await;
    let _ = stream.shutdown().await;
    let drain = async { while matches!(stream.read(&mut scratch).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(grace, drain).await;
}
