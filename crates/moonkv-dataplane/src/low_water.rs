//! Long payloads read with a receive low-water mark (`SO_RCVLOWAT`).
//!
//! A reader on a socket wakes at every segment that arrives: on loopback, a 1 MiB payload
//! wakes the node's task five or six times, and each wake-up of an idle vCPU costs tens of µs
//! on a VM. While a payload of known length is read, [`LowWater`] asks the kernel to report the
//! socket readable only once up to 256 KiB (never more than the bytes still to come) have
//! arrived, so the reader wakes a few times per MiB and reads large chunks (docs/data-plane.md,
//! *Waking for whole chunks*). Payloads under 128 KiB are read without a mark.
//!
//! The mark never exceeds the bytes the peer still owes for the payload being read
//! ([`read_payload`] keeps it so), so a wait never depends on bytes that will not come; the
//! kernel also wakes a reader whose buffer is under memory pressure, and at the end of the
//! stream. The mark is set back to one byte when the guard is dropped, before the connection
//! reads its next header. Plain TCP only: over TLS the bytes on the socket are
//! records, not the payload, and nothing is changed.
//!
//! Unsafe code: one `setsockopt` call on a socket the caller's stream owns for the whole life of
//! the guard, with a pointer to a local `c_int` and its size.

#![allow(unsafe_code)]

use crate::stream::Stream;
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Most bytes a reader waits for before it is woken.
pub const LOW_WATER_MAX: u64 = 256 << 10;

/// Fewest bytes worth a mark: a payload tail shorter than this arrives in a segment or two, and
/// a mark would only cost its `setsockopt` calls.
pub const LOW_WATER_MIN: u64 = 64 << 10;

/// The receive low-water mark of one socket while a payload is read; back to one byte on drop.
///
/// Made from a stream and used only while that stream lives (within one function that reads
/// the payload from it).
#[derive(Debug)]
pub struct LowWater {
    #[cfg(unix)]
    fd: Option<std::os::fd::RawFd>,
    /// The mark set now (1: the kernel's default).
    set: u64,
}

impl LowWater {
    /// A guard for `stream`'s socket; a no-op over TLS.
    pub fn of(stream: &Stream) -> LowWater {
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            let fd = match stream {
                Stream::Plain(tcp) => Some(tcp.as_raw_fd()),
                // A Unix socket reports itself readable at every arrival whatever the mark.
                Stream::Local(_) | Stream::LocalServed(_) => None,
                #[cfg(feature = "tls")]
                Stream::Tls(_) => None,
            };
            LowWater { fd, set: 1 }
        }
        #[cfg(not(unix))]
        {
            let _ = stream;
            LowWater { set: 1 }
        }
    }

    /// A guard that never changes the socket's mark: [`read_payload`] with it reads as
    /// `read_exact` does.
    pub fn unmarked() -> LowWater {
        LowWater {
            #[cfg(unix)]
            fd: None,
            set: 1,
        }
    }

    /// The mark set now.
    pub fn mark(&self) -> u64 {
        self.set
    }

    /// `left` bytes of the payload are still to come: wake the reader once
    /// `min(left, LOW_WATER_MAX)` (at least one) have arrived. A socket that refuses the option
    /// keeps the default for the rest of the guard's life.
    pub fn want(&mut self, left: u64) {
        let mark = left.clamp(1, LOW_WATER_MAX);
        if mark == self.set {
            return;
        }
        #[cfg(unix)]
        {
            let Some(fd) = self.fd else { return };
            let value = mark as libc::c_int;
            // SAFETY: `fd` is the socket of a stream that outlives this guard (see the type's
            // documentation); the option value is a live local `c_int` and its exact size.
            let rc = unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_RCVLOWAT,
                    (&value as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc == 0 {
                self.set = mark;
            } else {
                self.fd = None;
            }
        }
    }
}

impl Drop for LowWater {
    fn drop(&mut self) {
        self.want(1);
    }
}

/// Fills `buf` from `reader`; `left` bytes of the payload are still to come, `buf`'s
/// included (`left` may count fewer, never more, than the peer will send).
pub async fn read_payload<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut [u8],
    mut left: u64,
    mark: &mut LowWater,
) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        mark.want(follow(mark.mark(), left));
        let n = reader.read(&mut buf[at..]).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        at += n;
        left = left.saturating_sub(n as u64);
    }
    Ok(())
}

/// The mark to read with, given the one set now (`now`) and the payload's bytes still to come
/// (`left`): never above `left`, and changed seldom, since each change is a system call.
/// - A mark above `left` would wait for bytes that are not coming: it drops to half of `left`,
///   or to one byte once that half is under [`LOW_WATER_MIN`]. A payload of many small keys
///   thus changes it a few times, not once per key.
/// - The default (one byte) is raised, to `min(left, LOW_WATER_MAX)`, only while at least twice
///   [`LOW_WATER_MIN`] is to come: small payloads never pay for a mark, and a mark dropped to
///   one byte near a payload's end is not raised again (`left` only shrinks).
/// - Otherwise the mark stays.
fn follow(now: u64, left: u64) -> u64 {
    if now > left {
        let half = left / 2;
        if half >= LOW_WATER_MIN {
            half
        } else {
            1
        }
    } else if now == 1 && left >= 2 * LOW_WATER_MIN {
        left.min(LOW_WATER_MAX)
    } else {
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    #[cfg(target_os = "linux")]
    fn kernel_mark(fd: std::os::fd::RawFd) -> libc::c_int {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: a live socket; `value` and `len` are live locals of the right size.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        value
    }

    #[tokio::test]
    #[cfg(target_os = "linux")]
    async fn the_mark_follows_the_bytes_left_and_is_reset_on_drop() {
        let (_client, server) = pair().await;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&server);
        let server = Stream::Plain(server);
        let mut mark = LowWater::of(&server);
        mark.want(1 << 20);
        assert_eq!(kernel_mark(fd), LOW_WATER_MAX as libc::c_int);
        mark.want(5000);
        assert_eq!(kernel_mark(fd), 5000);
        mark.want(0);
        assert_eq!(kernel_mark(fd), 1, "never below one byte");
        mark.want(70_000);
        assert_eq!(mark.mark(), 70_000);
        drop(mark);
        assert_eq!(
            kernel_mark(fd),
            1,
            "the next header is read with the default"
        );
    }

    /// A payload sent in small pieces with pauses, then a header-sized message that must still
    /// be readable at once: every byte arrives, in order, and nothing waits for bytes that do
    /// not come (the test has a deadline).
    #[tokio::test]
    async fn a_payload_in_dribs_is_read_whole_and_the_next_message_is_not_held_back() {
        let (mut client, server) = pair().await;
        let mut server = Stream::Plain(server);
        let payload: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
        let sent = payload.clone();
        let writer = tokio::spawn(async move {
            for chunk in sent.chunks(50_000) {
                client.write_all(chunk).await.unwrap();
                tokio::task::yield_now().await;
            }
            // What follows the payload on the connection: a short message, after a pause in
            // which the reader has everything of the payload and nothing more.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            client.write_all(b"next").await.unwrap();
            client
        });
        let read = async {
            let mut got = vec![0u8; payload.len()];
            {
                let mut mark = LowWater::of(&server);
                // Two reads of one payload, as the node reads a key in halves.
                let half = got.len() / 2;
                let total = got.len() as u64;
                read_payload(&mut server, &mut got[..half], total, &mut mark)
                    .await
                    .unwrap();
                read_payload(
                    &mut server,
                    &mut got[half..],
                    total - half as u64,
                    &mut mark,
                )
                .await
                .unwrap();
            }
            let mut next = [0u8; 4];
            server.read_exact(&mut next).await.unwrap();
            (got, next)
        };
        let (got, next) = tokio::time::timeout(std::time::Duration::from_secs(10), read)
            .await
            .expect("a read waited for bytes that were never sent");
        assert!(got == payload, "the payload arrived changed");
        assert_eq!(&next, b"next");
        drop(writer.await.unwrap());
    }

    /// Follows a payload of `keys` keys of `size` bytes read whole, key by key, as the node
    /// reads a batch: the marks set, in order.
    fn marks_over(keys: u64, size: u64) -> Vec<u64> {
        let (mut now, mut left, mut set) = (1, keys * size, Vec::new());
        for _ in 0..keys {
            let next = follow(now, left);
            assert!(
                next == 1 || next <= left,
                "a mark of {next} with {left} left"
            );
            if next != now {
                set.push(next);
                now = next;
            }
            left -= size;
        }
        set
    }

    #[test]
    fn small_payloads_pay_for_no_mark_and_many_small_keys_change_it_a_few_times() {
        // A payload that arrives in a segment or two: no mark, so no system call.
        assert!(marks_over(1, 4096).is_empty());
        assert!(marks_over(1, 2 * LOW_WATER_MIN - 1).is_empty());
        assert!(marks_over(16, 4096).is_empty());
        // 128 keys of 4 KiB (512 KiB): raised once, then lowered by halves, not per key.
        let batch = marks_over(128, 4096);
        assert_eq!(batch.first(), Some(&LOW_WATER_MAX));
        assert_eq!(batch.last(), Some(&1));
        assert!(batch.len() <= 4, "{batch:?}");
        // One large key: the mark rises to the most and ends at one byte.
        assert_eq!(follow(1, 1 << 20), LOW_WATER_MAX);
        assert_eq!(follow(LOW_WATER_MAX, 1 << 20), LOW_WATER_MAX);
        assert_eq!(follow(LOW_WATER_MAX, 200_000), 100_000);
        assert_eq!(follow(100_000, 90_000), 1);
        // Lowered to one byte near the end, it is not raised again.
        assert_eq!(follow(1, 2 * LOW_WATER_MIN - 1), 1);
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn an_unmarked_guard_reads_a_long_payload_whole_and_leaves_the_socket_alone() {
        use std::os::fd::AsRawFd;
        let (mut client, server) = pair().await;
        let fd = server.as_raw_fd();
        let mut server = Stream::Plain(server);
        let payload: Vec<u8> = (0..600_000u32).map(|i| i as u8).collect();
        let sent = payload.clone();
        let writer = tokio::spawn(async move {
            for piece in sent.chunks(100_000) {
                client.write_all(piece).await.unwrap();
            }
            client
        });
        let mut mark = LowWater::unmarked();
        let mut buf = vec![0u8; payload.len()];
        read_payload(&mut server, &mut buf, payload.len() as u64, &mut mark)
            .await
            .unwrap();
        assert!(buf == payload);
        assert_eq!(mark.mark(), 1);
        assert_eq!(kernel_mark(fd), 1, "an unmarked guard set a mark");
        drop(writer.await.unwrap());
    }

    #[tokio::test]
    async fn a_payload_cut_short_is_an_error_not_a_hang() {
        let (mut client, server) = pair().await;
        let mut server = Stream::Plain(server);
        client.write_all(&[7u8; 1000]).await.unwrap();
        drop(client);
        let mut mark = LowWater::of(&server);
        let mut buf = vec![0u8; 300_000];
        let result = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            read_payload(&mut server, &mut buf, 300_000, &mut mark),
        )
        .await
        .expect("a closed connection must end the read");
        assert_eq!(result.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
