//! A scripted fake master: speaks the real frame protocol on loopback and answers each request
//! as a closure decides, for the cases a real master cannot be steered into on demand. It uses
//! only `moonkv-proto` types, so `moonkv-client`'s own unit tests can run against it.

use moonkv_proto::frame::{self, FrameKind};
use moonkv_proto::msg::{HelloAck, Request};
use moonkv_proto::Error;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the fake master does with one request.
pub enum Reply {
    /// Answer with this encoded success body after `delay`.
    Ok(Vec<u8>, Duration),
    /// Answer with an error.
    Err(Error),
    /// Never answer.
    Silent,
    /// Close the connection.
    Hangup,
}

/// A success answer carrying `value`, sent at once.
pub fn ok<T: serde::Serialize>(value: &T) -> Reply {
    Reply::Ok(rmp_serde::to_vec(value).unwrap(), Duration::ZERO)
}

/// Decides the fake master's answer to each request.
pub type Handler = Arc<dyn Fn(Request) -> Reply + Send + Sync>;

/// Starts a fake master; returns its address and the number of connections it accepted.
pub async fn fake_master(handler: Handler) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(stream, handler.clone()));
        }
    });
    (addr, accepted)
}

async fn serve(stream: tokio::net::TcpStream, handler: Handler) {
    let (mut reader, writer) = stream.into_split();
    let writer = Arc::new(tokio::sync::Mutex::new(writer));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Ok(Some((f, used))) = frame::decode(&buf, 1 << 20) {
            let mut out = Vec::new();
            match f.kind {
                FrameKind::Hello => {
                    let ack = HelloAck {
                        protocol_version: 1,
                        server_version: "fake".into(),
                        max_frame_bytes: 1 << 20,
                        challenge: None,
                        server_proof: None,
                        admin_addr: None,
                        local_socket: None,
                    };
                    frame::encode_ok(&mut out, 0, &ack).unwrap();
                    writer.lock().await.write_all(&out).await.unwrap();
                }
                _ => {
                    let id = f.request_id;
                    let reply = handler(frame::decode_request(&f).unwrap());
                    let writer = writer.clone();
                    match reply {
                        Reply::Ok(body, delay) => {
                            tokio::spawn(async move {
                                tokio::time::sleep(delay).await;
                                let _ = writer
                                    .lock()
                                    .await
                                    .write_all(&raw_response(id, &body))
                                    .await;
                            });
                        }
                        Reply::Err(e) => {
                            frame::encode_err(&mut out, id, &e);
                            writer.lock().await.write_all(&out).await.unwrap();
                        }
                        Reply::Silent => {}
                        Reply::Hangup => return,
                    }
                }
            }
            buf.drain(..used);
        }
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A success response frame around an already encoded body (layout of `docs/protocol.md`).
fn raw_response(request_id: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(17 + body.len());
    out.extend_from_slice(&(13 + body.len() as u32).to_be_bytes());
    out.push(FrameKind::Response as u8);
    out.extend_from_slice(&request_id.to_be_bytes());
    out.extend_from_slice(&0i32.to_be_bytes());
    out.extend_from_slice(body);
    out
}
