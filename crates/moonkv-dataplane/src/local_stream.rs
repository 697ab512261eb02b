//! A caller's connection over a local (Unix stream) socket that asks to hear of writing space
//! only while a write waits for it.
//!
//! When a Unix stream socket's reader takes bytes off it, the kernel tells the writing side that
//! space freed up: it wakes every waiter on the writer's socket that asked for writing space,
//! whether or not anything waits to be written. A socket registered with the async runtime the
//! usual way (tokio's `UnixStream`) asks for both readable and writable events for its whole
//! life, so each request a node read woke its caller, asleep until the answer, for nothing: on
//! a two-CPU machine that wake-up preempted the very thread serving the request, two context
//! switches and a few microseconds of every long same-host call (`docs/benchmarks.md`, *A
//! caller's local socket registered for reading only*). Over TCP the kernel reports space only
//! to a writer that found none (`SOCK_NOSPACE`), so only local sockets need this.
//!
//! [`LocalStream`] registers its socket for reading only. Writes go straight to the socket; one
//! that finds it full registers a duplicate of the descriptor for writable events and waits;
//! that registration lasts until a write takes all it was offered, so a caller waiting for an
//! answer is woken by the answer alone. The duplicate is a second descriptor of the same
//! socket: epoll keys its registrations by descriptor, so it does not disturb the first, and a
//! new registration reports the socket's state at once (no space that freed up between the
//! full write and the registration goes unnoticed).
//!
//! Callers only: the node's end of its local socket keeps the runtime's usual registration
//! ([`crate::Stream::LocalServed`]), which measured faster for small requests.
//!
//! Unsafe code: two calls of tokio's `ReadBuf` API that hand out and mark initialized its
//! spare capacity, around a `recv` that rustix fills through a `MaybeUninit` slice (the kernel
//! wrote exactly the bytes it reports); and tokio's registration of a descriptor, which must
//! stay open while registered (it is an `OwnedFd` the registration owns).

#![allow(unsafe_code)]

use rustix::net::{RecvFlags, SendFlags};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// A local socket connection registered for readable events only (see the module's doc).
/// Cheap to share: [`LocalStream::split`] hands out halves that read and write concurrently.
/// As with any socket's poll API, one task at a time reads and one writes through
/// `AsyncRead`/`AsyncWrite`; [`LocalStream::try_write`] may be called from anywhere.
#[derive(Clone)]
pub struct LocalStream(Arc<Shared>);

struct Shared {
    /// The socket, registered for readable events (and its end) only.
    io: AsyncFd<OwnedFd>,
    /// A duplicate of the socket registered for writable events while a write waits for space.
    space: Mutex<Option<AsyncFd<OwnedFd>>>,
    /// Whether `space` holds a registration (read without the lock on every write).
    waiting: AtomicBool,
}

impl std::fmt::Debug for LocalStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalStream")
            .field("fd", &self.0.io.get_ref().as_raw_fd())
            .finish()
    }
}

impl LocalStream {
    /// Takes over a connected socket from the runtime's `UnixStream` (which stops watching it).
    /// Must be called inside a tokio runtime with I/O enabled.
    pub fn from_tokio(stream: tokio::net::UnixStream) -> io::Result<LocalStream> {
        let std = stream.into_std()?;
        std.set_nonblocking(true)?;
        Self::from_fd(OwnedFd::from(std))
    }

    /// Takes a connected, non-blocking Unix stream socket.
    pub fn from_fd(fd: OwnedFd) -> io::Result<LocalStream> {
        Ok(LocalStream(Arc::new(Shared {
            io: register(fd, Interest::READABLE)?,
            space: Mutex::new(None),
            waiting: AtomicBool::new(false),
        })))
    }

    /// Connects to `path` (a leading NUL names the abstract namespace, as tokio reads it).
    pub async fn connect(path: &str) -> io::Result<LocalStream> {
        Self::from_tokio(tokio::net::UnixStream::connect(path).await?)
    }

    /// Two handles on the connection: one to read with, one to write with. Each may be used
    /// from its own task; the socket closes when the last handle is dropped.
    pub fn split(self) -> (LocalStream, LocalStream) {
        (self.clone(), self)
    }

    /// Writes what the socket takes now, without waiting (`WouldBlock` when it is full).
    pub fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        send(self.0.io.get_ref().as_fd(), bytes)
    }

    fn poll_recv(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        // No room: nothing to read into (a `recv` of nothing would read as the end of stream).
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            let mut guard = ready!(self.0.io.poll_read_ready(cx))?;
            // SAFETY: the spare capacity is only written (by the kernel, through rustix), never
            // read, and never de-initialized.
            let spare = unsafe { buf.unfilled_mut() };
            let wanted = spare.len();
            let received = guard.try_io(|fd| {
                rustix::net::recv(fd.get_ref(), spare, RecvFlags::empty())
                    .map(|((filled, _), _)| filled.len())
                    .map_err(io::Error::from)
            });
            match received {
                Ok(Ok(n)) => {
                    // Fewer bytes than there was room for: the socket is drained, and the next
                    // read waits for more without first finding nothing.
                    if n > 0 && n < wanted {
                        guard.clear_ready();
                    }
                    // SAFETY: `recv` reported these `n` bytes written, from the start of the
                    // unfilled part.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                // Nothing to read after all: readiness cleared, wait again.
                Err(_would_block) => continue,
            }
        }
    }

    /// One write of `offered` bytes with `op`: straight to the socket; once it was full, through
    /// the registration for writing space, which lasts until a write takes all it was offered
    /// (the end of a long payload: one registration per payload, not per socket buffer).
    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        offered: usize,
        mut op: impl FnMut(BorrowedFd<'_>) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        let fd = self.0.io.get_ref().as_fd();
        if !self.0.waiting.load(Ordering::Acquire) {
            match op(fd) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return Poll::Ready(done),
            }
        }
        let mut space = self.0.space.lock().unwrap_or_else(PoisonError::into_inner);
        let registration = match &mut *space {
            Some(registration) => registration,
            none => {
                // Registered now, it reports writing space that came since the write above.
                let registration = register(fd.try_clone_to_owned()?, Interest::WRITABLE)?;
                self.0.waiting.store(true, Ordering::Release);
                none.insert(registration)
            }
        };
        let written = loop {
            let mut guard = ready!(registration.poll_write_ready(cx))?;
            if let Ok(done) = guard.try_io(|_| op(fd)) {
                break done;
            }
        };
        if written.as_ref().is_ok_and(|&n| n == offered) {
            *space = None;
            self.0.waiting.store(false, Ordering::Release);
        }
        Poll::Ready(written)
    }
}

/// Registers `fd` with the runtime for `interest`.
fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` stays open, and names the same descriptor, for as long as it is
    // owned, here by the `AsyncFd`.
    Ok(unsafe { AsyncFd::register_with_interest(fd, interest) }?)
}

/// `send` without `SIGPIPE` (a peer that closed its end is an `EPIPE` error).
fn send(fd: BorrowedFd<'_>, bytes: &[u8]) -> io::Result<usize> {
    rustix::net::send(fd, bytes, SendFlags::NOSIGNAL).map_err(io::Error::from)
}

impl AsRawFd for LocalStream {
    fn as_raw_fd(&self) -> RawFd {
        self.0.io.get_ref().as_raw_fd()
    }
}

impl AsFd for LocalStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.io.get_ref().as_fd()
    }
}

impl AsyncRead for LocalStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.poll_recv(cx, buf)
    }
}

impl AsyncWrite for LocalStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_send(cx, buf.len(), |fd| send(fd, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let offered = bufs.iter().map(|b| b.len()).sum();
        self.poll_send(cx, offered, |fd| {
            rustix::net::sendmsg(
                fd,
                bufs,
                &mut rustix::net::SendAncillaryBuffer::default(),
                SendFlags::NOSIGNAL,
            )
            .map_err(io::Error::from)
        })
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let done = rustix::net::shutdown(self.0.io.get_ref(), rustix::net::Shutdown::Write);
        Poll::Ready(done.map_err(io::Error::from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream as StdUnix;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const EPOLLIN: u32 = 0x1;
    const EPOLLOUT: u32 = 0x4;

    /// What this process's epoll instances watch on the socket `socket` refers to: one event
    /// mask per registration (of `socket` or of a duplicate of it), from `/proc/self/fdinfo`
    /// (an epoll instance open under two descriptors lists its registrations under both).
    fn registrations(socket: RawFd) -> Vec<u32> {
        let target = std::fs::read_link(format!("/proc/self/fd/{socket}")).expect("socket link");
        let mut masks = std::collections::BTreeSet::new();
        for entry in std::fs::read_dir("/proc/self/fd")
            .expect("fd list")
            .flatten()
        {
            let Ok(link) = std::fs::read_link(entry.path()) else {
                continue;
            };
            if link.to_string_lossy() != "anon_inode:[eventpoll]" {
                continue;
            }
            let name = entry.file_name();
            let Ok(info) =
                std::fs::read_to_string(format!("/proc/self/fdinfo/{}", name.to_string_lossy()))
            else {
                continue;
            };
            for line in info.lines().filter(|l| l.starts_with("tfd:")) {
                let mut words = line.split_whitespace();
                let tfd: RawFd = words.nth(1).and_then(|w| w.parse().ok()).expect("tfd");
                let events = words
                    .nth(1)
                    .and_then(|w| u32::from_str_radix(w, 16).ok())
                    .expect("events");
                let same =
                    std::fs::read_link(format!("/proc/self/fd/{tfd}")).is_ok_and(|l| l == target);
                if same {
                    masks.insert((tfd, events));
                }
            }
        }
        masks.into_iter().map(|(_, events)| events).collect()
    }

    fn pair() -> (LocalStream, StdUnix) {
        let (ours, peer) = StdUnix::pair().expect("socket pair");
        ours.set_nonblocking(true).expect("non-blocking");
        (LocalStream::from_fd(ours.into()).expect("register"), peer)
    }

    #[tokio::test]
    async fn the_socket_is_watched_for_reading_only_until_a_write_waits_for_space() {
        let (mut stream, mut peer) = pair();
        let fd = stream.as_raw_fd();
        let watched = registrations(fd);
        assert_eq!(watched.len(), 1, "{watched:x?}");
        assert_eq!(watched[0] & (EPOLLIN | EPOLLOUT), EPOLLIN, "{watched:x?}");

        // A small request goes straight out, and the peer's read of it (which tells the socket
        // that space freed up) leaves nothing registered for writing.
        stream.write_all(b"request").await.expect("write");
        let mut got = [0u8; 7];
        peer.read_exact(&mut got).expect("peer read");
        assert_eq!(&got, b"request");
        assert_eq!(registrations(fd).len(), 1);

        // A payload larger than the socket's buffers waits for space: then, and only while it
        // waits, a second registration asks for writing space.
        let payload: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
        let mut write = std::pin::pin!(stream.write_all(&payload));
        let first = std::future::poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await;
        assert!(first.is_pending(), "8 MiB fit in the socket's buffers");
        let waiting = registrations(fd);
        assert_eq!(waiting.len(), 2, "{waiting:x?}");
        assert!(waiting.iter().any(|m| m & EPOLLOUT != 0), "{waiting:x?}");
        assert!(waiting.iter().any(|m| m & (EPOLLIN | EPOLLOUT) == EPOLLIN));

        let reader = std::thread::spawn(move || {
            let mut all = vec![0u8; 8 << 20];
            peer.read_exact(&mut all).map(|()| (all, peer))
        });
        write
            .await
            .expect("the payload is written once the peer reads");
        let (all, _peer) = reader.join().expect("reader").expect("peer read");
        assert!(all == payload, "the payload arrived whole and in order");
        let after = registrations(fd);
        assert_eq!(
            after.len(),
            1,
            "the registration for space ends with the write: {after:x?}"
        );
        assert_eq!(after[0] & (EPOLLIN | EPOLLOUT), EPOLLIN);
    }

    #[tokio::test]
    async fn a_write_dropped_while_it_waits_for_space_leaves_the_connection_usable_and_closable() {
        let (mut stream, mut peer) = pair();
        let fd = stream.as_raw_fd();
        // A caller gives up on a long write (its future is dropped, as a timeout does) while the
        // socket is full.
        let payload = vec![1u8; 8 << 20];
        {
            let mut write = std::pin::pin!(stream.write_all(&payload));
            let first = std::future::poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await;
            assert!(first.is_pending(), "8 MiB fit in the socket's buffers");
        }
        assert_eq!(
            registrations(fd).len(),
            2,
            "the wait's registration outlives the drop"
        );
        // The peer takes what was sent; the next write goes out whole and ends the wait's
        // registration.
        let drain = std::thread::spawn(move || {
            let mut sent = vec![0u8; 1 << 20];
            let mut total = 0usize;
            loop {
                let n = peer.read(&mut sent).expect("peer read");
                total += n;
                if n == 0 || sent[..n].ends_with(b"next") {
                    return (total, peer);
                }
            }
        });
        stream
            .write_all(b"next")
            .await
            .expect("a write after the dropped one");
        assert_eq!(registrations(fd).len(), 1);
        // Dropped without shutdown: the peer sees the end of the stream.
        drop(stream);
        let (total, mut peer) = drain.join().expect("drain");
        assert!(total > 4 && total < (8 << 20) + 4, "{total}");
        let mut rest = [0u8; 1];
        assert_eq!(peer.read(&mut rest).expect("peer read"), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn split_halves_move_long_payloads_both_ways_at_once() {
        let (ours, theirs) = StdUnix::pair().expect("socket pair");
        ours.set_nonblocking(true).expect("non-blocking");
        theirs.set_nonblocking(true).expect("non-blocking");
        let (mut reader, mut writer) = LocalStream::from_fd(ours.into()).expect("register").split();
        let mut peer = tokio::net::UnixStream::from_std(theirs).expect("peer");
        let up: Vec<u8> = (0..6u32 << 20).map(|i| (i % 253) as u8).collect();
        let down: Vec<u8> = (0..5u32 << 20).map(|i| (i % 241) as u8).collect();
        let (up2, down2) = (up.clone(), down.clone());
        let ours_send = tokio::spawn(async move {
            writer.write_all(&up2).await.expect("send");
            writer.shutdown().await.expect("shutdown");
        });
        let ours_recv = tokio::spawn(async move {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).await.expect("receive");
            got
        });
        let (mut peer_read, mut peer_write) = peer.split();
        let peer_side = async {
            let mut got = Vec::new();
            let (read, wrote) = tokio::join!(peer_read.read_to_end(&mut got), async {
                peer_write.write_all(&down2).await?;
                peer_write.shutdown().await
            });
            read.expect("peer receive");
            wrote.expect("peer send");
            got
        };
        let got_up = peer_side.await;
        ours_send.await.expect("sender");
        let got_down = ours_recv.await.expect("receiver");
        assert!(got_up == up, "caller to peer: whole and in order");
        assert!(got_down == down, "peer to caller: whole and in order");
    }

    #[tokio::test]
    async fn a_peer_that_went_away_is_an_end_of_stream_and_a_broken_pipe_not_a_signal() {
        let (mut stream, peer) = pair();
        drop(peer);
        let mut buf = [0u8; 16];
        assert_eq!(stream.read(&mut buf).await.expect("read"), 0);
        let err = stream.write_all(b"anyone?").await.expect_err("no peer");
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe, "{err}");
        let err = stream.try_write(b"anyone?").expect_err("no peer");
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe, "{err}");
    }

    #[tokio::test]
    async fn a_full_socket_is_would_block_for_try_write_and_bytes_written_arrive() {
        let (stream, mut peer) = pair();
        let chunk = vec![7u8; 64 << 10];
        let mut sent = 0usize;
        loop {
            match stream.try_write(&chunk) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("try_write: {e}"),
            }
            assert!(sent < 64 << 20, "the socket never filled");
        }
        assert!(sent > 0);
        let mut got = vec![0u8; sent];
        peer.read_exact(&mut got).expect("peer read");
        assert!(got.iter().all(|&b| b == 7));
        // Room again: a write goes straight out.
        assert_eq!(stream.try_write(b"more").expect("room"), 4);
        peer.write_all(b"x").expect("peer write");
    }
}
