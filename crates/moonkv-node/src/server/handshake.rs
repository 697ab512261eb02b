//! What a connection establishes before, or besides, its requests: the authentication hello
//! and proof (`greet`), the refusal that ends an unauthenticated connection, and ATTACH, which
//! lets the node copy same-host requests straight to and from the caller's memory.

use super::{respond, Conn, Served, MAX_DRAIN_BYTES};
use crate::same_host::{local_caller, AttachError, Ends, Peer};
use moonkv_dataplane::handshake::{self, Answer, Mode, HELLO_LEN, HELLO_MAGIC, PROOF_LEN};
use moonkv_dataplane::header::{AttachRequest, DataStatus, RequestHeader};
use moonkv_proto::auth::NONCE_LEN;
use std::io;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers a hello (its magic already read): open without a secret; with one, sends the
/// challenge and the node's proof, then checks the caller's proof. A failed handshake is
/// answered `UNAUTHENTICATED` and ends the connection (`Err`).
pub(super) async fn greet(stream: &mut Conn, served: &Served) -> io::Result<()> {
    let mut hello = [0u8; HELLO_LEN];
    hello[..HELLO_MAGIC.len()].copy_from_slice(&HELLO_MAGIC);
    stream.read_exact(&mut hello[HELLO_MAGIC.len()..]).await?;
    let Some(client_nonce) = handshake::hello_nonce(&hello) else {
        respond(stream, DataStatus::BadHeader, 0).await?;
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad data-plane hello",
        ));
    };
    let Some(secret) = served.access.secret.as_ref() else {
        return stream.write_all(&Answer::open().encode()).await;
    };
    let challenge: [u8; NONCE_LEN] = rand::random();
    let mut server_proof = [0u8; PROOF_LEN];
    server_proof.copy_from_slice(&secret.server_proof(&challenge, &client_nonce));
    let answer = Answer {
        mode: Mode::ProofRequired,
        challenge,
        server_proof,
    };
    stream.write_all(&answer.encode()).await?;
    // The caller waits for the answer before it sends its proof.
    stream.flush().await?;
    let mut proof = [0u8; PROOF_LEN];
    stream.read_exact(&mut proof).await?;
    if !secret.verify_client(&challenge, &client_nonce, &proof) {
        served.metrics.refused_handshake();
        return refuse_connection(stream, 0, "wrong handshake proof").await;
    }
    Ok(())
}

/// Answers `UNAUTHENTICATED` and ends the connection. What the caller already sent is read
/// (bounded) first, so the answer is not lost to a connection reset.
pub(super) async fn refuse_connection(
    stream: &mut Conn,
    request_id: u64,
    why: &str,
) -> io::Result<()> {
    respond(stream, DataStatus::Unauthenticated, request_id).await?;
    let _ = stream.shutdown().await;
    let drain = async {
        let mut scratch = [0u8; 16 * 1024];
        let mut left = MAX_DRAIN_BYTES;
        while left > 0 {
            match stream.read(&mut scratch).await {
                Ok(n) if n > 0 => left = left.saturating_sub(n as u64),
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drain).await;
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        why.to_string(),
    ))
}

/// Runs the blocking `check` of a caller on a blocking thread; the caller it passes is watched
/// on `socket`, its connection's.
async fn off_thread(
    socket: std::os::fd::RawFd,
    check: impl FnOnce() -> Result<Peer, AttachError> + Send + 'static,
) -> Result<Peer, AttachError> {
    tokio::task::spawn_blocking(move || check().map(|peer| peer.watching(socket)))
        .await
        .unwrap_or_else(|e| Err(AttachError::Verification(e)))
}

/// Answers an ATTACH request: verifies that the process it names is the caller at the other
/// end of this connection and that its memory can be reached (see [`crate::same_host`]).
/// Returns the attached caller, or `None` (answered `LOCAL_REFUSED`) when same-host copies are
/// off, the connection is not from this machine, or the check fails.
pub(super) async fn attach(
    stream: &mut Conn,
    h: &RequestHeader,
    ends: Option<crate::same_host::Ends>,
    served: &Served,
) -> io::Result<Option<crate::same_host::Peer>> {
    let pid = h.length;
    let other_users = served.access.same_host_other_users;
    let verified = match (ends, AttachRequest::from_header(h)) {
        (_, None) => Err(AttachError::NotAProcessId(h.length)),
        (None, _) => Err(AttachError::Off),
        (Some(Ends::Local { socket }), Some(request)) => match local_caller(socket) {
            Err(why) => Err(why),
            Ok(caller) => {
                off_thread(socket, move || {
                    let (address, probe) = (request.probe_address, request.probe);
                    crate::same_host::verify_local(caller, address, probe, other_users)
                })
                .await
            }
        },
        (
            Some(Ends::Tcp {
                peer,
                local,
                socket,
            }),
            Some(request),
        ) => {
            off_thread(socket, move || {
                let (address, probe) = (request.probe_address, request.probe);
                crate::same_host::verify(request.pid, peer, local, address, probe, other_users)
            })
            .await
        }
    };
    match verified {
        Ok(peer) => {
            tracing::debug!(pid, "data-plane connection attached for same-host copies");
            respond(stream, DataStatus::Ok, h.request_id).await?;
            Ok(Some(peer))
        }
        Err(why) => {
            served.metrics.refused_attach();
            tracing::debug!(pid, %why, "same-host attach declined");
            respond(stream, DataStatus::LocalRefused, h.request_id).await?;
            Ok(None)
        }
    }
}
