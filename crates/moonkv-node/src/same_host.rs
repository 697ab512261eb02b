//! The node's side of same-host copies (`docs/data-plane.md`, *Same-host copies*).
//!
//! A caller on the node's machine attaches its connection. Before the node touches a process's
//! memory it makes sure the process really is the caller. Over the node's local socket (a Unix
//! socket, `docs/data-plane.md`, *The local socket*) the kernel names the process that
//! connected (`SO_PEERPIDFD`, or `SO_PEERCRED` on kernels before 6.5), and the process id the
//! request names is not used. Over TCP the request names its process id, the connection's peer
//! must be a loopback address, and the peer end of this very TCP connection (found in
//! `/proc/net/tcp`) must be an open file of that process (`/proc/PID/fd`). Either way the node
//! must then read the probe bytes the caller sent out of the caller's memory. A caller therefore cannot make
//! the node read or write any process but itself. The process is then held by a pidfd, so a
//! caller that exits is noticed before each copy, and its id can never lead to another process.
//!
//! The copies themselves are `process_vm_readv` / `process_vm_writev` between the segment bytes
//! (under the same range lock as a socket request) and the caller's ranges. The kernel allows
//! them only where it already lets the node's user trace the caller (same user, or a
//! privileged node); anywhere else the attach is declined and the caller keeps using the socket.
//!
//! Unsafe code here, and why it is sound: the copies are raw system calls whose local side is
//! always a slice borrowed for the duration of the call (only read when the node sends, and
//! written only through an exclusive borrow when it receives; in the server it is a locked
//! segment view), while their remote side lies in another process, where the kernel itself
//! refuses (`EFAULT`) any address that process has not mapped; the process is the verified
//! caller, held by its pidfd. The other unsafe operation borrows the connection's raw
//! descriptor, which [`Ends`] guarantees open while the connection is served, longer than any
//! [`Peer`] watching it.

#![allow(unsafe_code)]

use crate::shared_pool::SharedPools;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::process::{pidfd_open, Pid, PidfdFlags};
use std::fs;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};

/// How a connection that may attach reaches the node, and its socket.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ends {
    /// Plain TCP between these two addresses.
    Tcp {
        peer: SocketAddr,
        local: SocketAddr,
        /// The connection's socket; valid while the connection is served (longer than any
        /// `Peer` made from it).
        socket: RawFd,
    },
    /// The node's local socket.
    Local {
        /// As [`Ends::Tcp`]'s.
        socket: RawFd,
    },
}

/// The node's side of one copy: the bytes sent to the caller, or the buffer filled from it.
pub(crate) enum Local<'a> {
    Out(&'a [u8]),
    In(&'a mut [u8]),
}

/// A poll that does not wait.
const NO_WAIT: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 0,
};

/// The caller's pool ids as read once for one request (see [`Peer::read_many_seen`]).
#[derive(Default)]
pub(crate) struct PoolIds(parking_lot::Mutex<Vec<(u64, [u8; crate::shared_pool::ID_LEN])>>);

/// An attached caller process.
#[derive(Debug)]
pub(crate) struct Peer {
    pid: Pid,
    pidfd: OwnedFd,
    /// The connection it attached (see [`Ends::socket`]).
    socket: RawFd,
    /// Its shared pools, copied with `memcpy` ([`crate::shared_pool`]).
    pools: SharedPools,
}

impl Peer {
    /// The same caller, watched on its connection's socket (see [`Peer::waiting`]).
    pub(crate) fn watching(mut self, socket: RawFd) -> Peer {
        self.socket = socket;
        self
    }

    /// Whether the caller still waits for a request whose deadline is `deadline_ns`: the
    /// deadline has not passed, its process runs, and it has not given up the connection it
    /// is watched on. A caller gives up by shutting down its sending side: it abandoned its
    /// calls and waits, before it frees or reuses the memory they named, for this node to stop
    /// (`POLLRDHUP`).
    ///
    /// Both questions take one `poll` of the caller's pidfd and its connection together: this
    /// check runs before and after every same-host copy, where a system call is a few percent
    /// of a small request.
    pub(crate) fn waiting(&self, deadline_ns: u64) -> bool {
        if moonkv_dataplane::same_host::monotonic_now_ns() >= deadline_ns {
            return false;
        }
        // Not watching a connection (poll would ignore a negative descriptor).
        if self.socket < 0 {
            return self.alive();
        }
        // SAFETY: a non-negative `socket` is the descriptor of the connection this caller
        // attached, which stays open while the connection is served, longer than `self`.
        let socket = unsafe { BorrowedFd::borrow_raw(self.socket) };
        let mut fds = [
            PollFd::new(&self.pidfd, PollFlags::IN),
            PollFd::from_borrowed_fd(socket, PollFlags::RDHUP),
        ];
        if poll(&mut fds, Some(&NO_WAIT)).is_err() {
            return false;
        }
        let exited = !fds[0].revents().is_empty();
        let gave_up = fds[1]
            .revents()
            .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR);
        !exited && !gave_up
    }

    /// Whether the caller process still runs (its pidfd is not yet readable).
    pub(crate) fn alive(&self) -> bool {
        let mut fds = [PollFd::new(&self.pidfd, PollFlags::IN)];
        matches!(poll(&mut fds, Some(&NO_WAIT)), Ok(0))
    }

    /// Copies `src` into the caller's `ranges` (whose lengths add up to `src.len()`);
    /// `stream`: with streaming stores.
    pub(crate) fn write_to(
        &self,
        src: &[u8],
        ranges: &[(u64, u64)],
        stream: bool,
    ) -> io::Result<()> {
        self.copy(Local::Out(src), ranges, stream)
    }

    /// Copies each of `parts` (the node's bytes, and the caller's ranges whose lengths add up
    /// to theirs) into the caller's memory, for one request of many keys (a GET_LOCAL's): the
    /// caller's pool ids are read once for all of them (`seen`), the parts in its shared pools
    /// are copied with `memcpy`, and all the others with as few system calls as the kernel's
    /// iovec limit allows (one for up to [`IOV_MAX`] parts and ranges), not one per part.
    pub(crate) fn write_many_seen<'a>(
        &self,
        parts: impl Iterator<Item = (&'a [u8], &'a [(u64, u64)])>,
        stream: bool,
        seen: &PoolIds,
    ) -> io::Result<()> {
        let parts = parts.map(|(src, r)| (Local::Out(src), r));
        self.copy_many(parts, stream, Some(seen))
    }

    /// Fills `dst` from the caller's `ranges` (whose lengths add up to `dst.len()`).
    pub(crate) fn read_from(
        &self,
        dst: &mut [u8],
        ranges: &[(u64, u64)],
        stream: bool,
    ) -> io::Result<()> {
        self.copy(Local::In(dst), ranges, stream)
    }

    /// [`Peer::write_many_seen`] the other way: fills each part's bytes from its caller ranges
    /// (a PUT_LOCAL's keys).
    pub(crate) fn read_many_seen<'a>(
        &self,
        parts: impl Iterator<Item = (&'a mut [u8], &'a [(u64, u64)])>,
        stream: bool,
        seen: &PoolIds,
    ) -> io::Result<()> {
        let parts = parts.map(|(dst, r)| (Local::In(dst), r));
        self.copy_many(parts, stream, Some(seen))
    }

    /// `stream`: the copy's stores, into `local` or into the caller's pool, are streaming
    /// stores (`crate::copy`).
    fn copy(&self, local: Local<'_>, ranges: &[(u64, u64)], stream: bool) -> io::Result<()> {
        self.copy_many(std::iter::once((local, ranges)), stream, None)
    }

    /// Makes every copy of `parts`, all of them the same way (into the caller's memory or out
    /// of it): those in the caller's shared pools with `memcpy`, the rest by
    /// `process_vm_readv` / `process_vm_writev`, as few calls as the iovec limit allows.
    fn copy_many<'a>(
        &self,
        parts: impl Iterator<Item = Part<'a>>,
        stream: bool,
        seen: Option<&PoolIds>,
    ) -> io::Result<()> {
        let read_id = |at: u64| {
            let mut id = [0u8; crate::shared_pool::ID_LEN];
            self.copy_syscall(
                Local::In(&mut id),
                &[(at, crate::shared_pool::ID_LEN as u64)],
            )
            .ok()
            .map(|()| id)
        };
        let current = |at: u64| match seen {
            None => read_id(at),
            Some(seen) => {
                if let Some((_, id)) = seen.0.lock().iter().find(|(a, _)| *a == at) {
                    return Some(*id);
                }
                let id = read_id(at)?;
                seen.0.lock().push((at, id));
                Some(id)
            }
        };
        let mut by_call = Iovecs::default();
        for (mut part, ranges) in parts {
            if !self.pools.copy(&mut part, ranges, current, stream) {
                by_call.push(part, ranges);
            }
        }
        self.copy_iovecs(by_call)
    }

    /// [`Peer::copy`] by `process_vm_readv` / `process_vm_writev`.
    fn copy_syscall(&self, local: Local<'_>, ranges: &[(u64, u64)]) -> io::Result<()> {
        let mut by_call = Iovecs::default();
        by_call.push(local, ranges);
        self.copy_iovecs(by_call)
    }

    /// Makes the copies `by_call` names (the same number of bytes on both sides), [`IOV_MAX`]
    /// iovecs of each side at most per system call, until every byte moved.
    fn copy_iovecs(&self, by_call: Iovecs) -> io::Result<()> {
        let Iovecs {
            out,
            mut local,
            mut remote,
        } = by_call;
        let len: usize = local.iter().map(|v| v.iov_len).sum();
        let (mut done, mut first_local, mut first_remote) = (0usize, 0usize, 0usize);
        while done < len {
            let locals = &local[first_local..(first_local + IOV_MAX).min(local.len())];
            let remotes = &remote[first_remote..(first_remote + IOV_MAX).min(remote.len())];
            // SAFETY: the local iovecs point into the slices the parts lent ([`Iovecs`]), which
            // outlive this call: only read (process_vm_writev) when `out`, written
            // (process_vm_readv) only when the parts are exclusive `In` slices. The remote
            // iovecs name the other process's memory, which the kernel checks itself.
            let n = unsafe {
                if out {
                    libc::process_vm_writev(
                        self.pid.as_raw_nonzero().get(),
                        locals.as_ptr(),
                        locals.len() as libc::c_ulong,
                        remotes.as_ptr(),
                        remotes.len() as libc::c_ulong,
                        0,
                    )
                } else {
                    libc::process_vm_readv(
                        self.pid.as_raw_nonzero().get(),
                        locals.as_ptr(),
                        locals.len() as libc::c_ulong,
                        remotes.as_ptr(),
                        remotes.len() as libc::c_ulong,
                        0,
                    )
                }
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the caller's memory took no bytes",
                ));
            }
            let n = n as usize;
            done += n;
            // Skip what the call filled on both sides, and shorten a partly filled iovec.
            advance(&mut local, &mut first_local, n);
            advance(&mut remote, &mut first_remote, n);
        }
        Ok(())
    }
}

/// Most iovecs on either side of one `process_vm_readv` / `process_vm_writev` (Linux's
/// `UIO_MAXIOV`).
pub(crate) const IOV_MAX: usize = 1024;

/// One part of a copy of many ([`Peer::copy_many`]): the node's bytes and the caller's ranges
/// for them.
type Part<'a> = (Local<'a>, &'a [(u64, u64)]);

/// Copies to make by system call ([`Peer::copy_iovecs`]): the node's side, the caller's, and
/// which way (`out`: into the caller's memory). The node's iovecs point into the slices the
/// parts lent, which outlive the copy: only read when `out`, written only when the parts are
/// exclusive `In` slices.
#[derive(Default)]
struct Iovecs {
    out: bool,
    local: Vec<libc::iovec>,
    remote: Vec<libc::iovec>,
}

impl Iovecs {
    /// Adds `part`, copied from or to the caller's `ranges` (every part of one copy goes the
    /// same way).
    fn push(&mut self, part: Local<'_>, ranges: &[(u64, u64)]) {
        let (out, base, len) = match part {
            Local::Out(src) => (true, src.as_ptr().cast_mut(), src.len()),
            Local::In(dst) => (false, dst.as_mut_ptr(), dst.len()),
        };
        debug_assert!(
            self.local.is_empty() || self.out == out,
            "a copy goes one way"
        );
        self.out = out;
        self.local.push(libc::iovec {
            iov_base: base.cast(),
            iov_len: len,
        });
        self.remote
            .extend(ranges.iter().map(|&(address, len)| libc::iovec {
                iov_base: address as usize as *mut libc::c_void,
                iov_len: len as usize,
            }));
    }
}

/// Moves `first` past the iovecs `n` copied bytes filled, and shortens a partly filled one.
fn advance(iovecs: &mut [libc::iovec], first: &mut usize, mut n: usize) {
    while *first < iovecs.len() && (n > 0 || iovecs[*first].iov_len == 0) {
        let v = &mut iovecs[*first];
        let take = n.min(v.iov_len);
        v.iov_base = (v.iov_base as usize + take) as *mut libc::c_void;
        v.iov_len -= take;
        n -= take;
        if v.iov_len == 0 {
            *first += 1;
        }
    }
}

/// Why a connection was not attached for same-host copies (the caller then keeps using the
/// socket). Only logged by the node: the caller is answered `LOCAL_REFUSED` whatever the reason.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AttachError {
    /// The node declines same-host copies on this connection (TLS, refused by configuration, or
    /// its ends unknown).
    #[error("same-host copies are off on this connection")]
    Off,
    /// The request's process id is zero or out of range.
    #[error("{0} is not a process id")]
    NotAProcessId(u64),
    /// The connection does not come from this machine.
    #[error("peer {0} is not a loopback address")]
    NotLoopback(SocketAddr),
    /// `pidfd_open` failed: no such process (or none this node may see).
    #[error("no process {pid} here: {source}")]
    NoProcess { pid: Pid, source: io::Error },
    /// The kernel's table of TCP sockets could not be read.
    #[error("cannot read {table}: {source}")]
    SocketTable {
        table: &'static str,
        source: io::Error,
    },
    /// The kernel's table of TCP sockets has a line this node cannot read.
    #[error("bad inode in {table}: {line}")]
    BadInode { table: &'static str, line: String },
    /// The caller's end of the connection is not in this machine's table.
    #[error("the caller's end {0} of this connection is not a socket of this machine")]
    NotLocal(SocketAddr),
    /// The process's open files could not be listed.
    #[error("cannot list the files of process {pid}: {source}")]
    Files { pid: Pid, source: io::Error },
    /// The process holds no descriptor of this connection.
    #[error("process {pid} does not hold this connection (its socket {socket})")]
    NotHolder { pid: Pid, socket: String },
    /// The process ended during the checks.
    #[error("process {0} has exited")]
    Exited(Pid),
    /// The node may not read the process's memory (or the probe address is not mapped).
    #[error("cannot read the memory of process {pid}: {source}")]
    Memory { pid: Pid, source: io::Error },
    /// The probe bytes in the process are not the ones the caller sent.
    #[error("the probe at {address:#x} in process {pid} does not match")]
    ProbeMismatch { pid: Pid, address: u64 },
    /// The process belongs to another user, and the node attaches its own user's only.
    #[error("process {pid} runs as uid {uid}, not as the node's uid {node}")]
    OtherUser { pid: Pid, uid: u32, node: u32 },
    /// The kernel would not name the process at the other end of the local socket.
    #[error("cannot tell which process connected: {0}")]
    PeerUnknown(#[source] io::Error),
    /// The blocking task that ran the checks failed.
    #[error("verification failed: {0}")]
    Verification(#[source] tokio::task::JoinError),
}

/// Refuses a process of another user than the node's: a node that may reach any process's
/// memory (root, `CAP_SYS_PTRACE`) would otherwise copy into processes that merely inherited a
/// caller's socket. The owner of `/proc/PID` is the process's effective uid.
pub(crate) fn same_user(pid: Pid) -> Result<(), AttachError> {
    use std::os::unix::fs::MetadataExt;
    let uid = fs::metadata(format!("/proc/{pid}"))
        .map_err(|source| AttachError::Files { pid, source })?
        .uid();
    let node = rustix::process::geteuid().as_raw();
    if uid == node {
        Ok(())
    } else {
        Err(AttachError::OtherUser { pid, uid, node })
    }
}

/// Checks that process `pid` is the caller at the other end of the connection `local ↔ peer`
/// and that its memory can be reached (the 16 `probe` bytes lie at `probe_address` there).
/// Blocking: reads `/proc`.
pub(crate) fn verify(
    pid: u32,
    peer: SocketAddr,
    local: SocketAddr,
    probe_address: u64,
    probe: [u8; 16],
    other_users: bool,
) -> Result<Peer, AttachError> {
    // An IPv4 caller of a node listening on `[::]` shows as `::ffff:127.0.0.1`.
    if !peer.ip().to_canonical().is_loopback() {
        return Err(AttachError::NotLoopback(peer));
    }
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .and_then(Pid::from_raw)
        .ok_or(AttachError::NotAProcessId(pid.into()))?;
    // Hold the process before checking it, so the checks are about the process held.
    let pidfd = pidfd_open(pid, PidfdFlags::empty()).map_err(|e| AttachError::NoProcess {
        pid,
        source: e.into(),
    })?;
    if !other_users {
        same_user(pid)?;
    }
    let inode = peer_socket_inode(peer, local)?;
    let wanted = format!("socket:[{inode}]");
    let fds = fs::read_dir(format!("/proc/{pid}/fd"))
        .map_err(|source| AttachError::Files { pid, source })?;
    let holds = fds.flatten().any(|entry| {
        fs::read_link(entry.path()).is_ok_and(|target| target.as_os_str() == wanted.as_str())
    });
    if !holds {
        return Err(AttachError::NotHolder {
            pid,
            socket: wanted,
        });
    }
    attached(pid, pidfd, probe_address, probe)
}

/// The caller `pid` (held by `pidfd`), once the node read the `probe` bytes at
/// `probe_address` out of its memory.
fn attached(
    pid: Pid,
    pidfd: OwnedFd,
    probe_address: u64,
    probe: [u8; 16],
) -> Result<Peer, AttachError> {
    let mut peer = Peer {
        pid,
        pidfd,
        socket: -1,
        pools: SharedPools::default(),
    };
    if !peer.alive() {
        return Err(AttachError::Exited(pid));
    }
    let mut seen = [0u8; 16];
    peer.read_from(&mut seen, &[(probe_address, 16)], false)
        .map_err(|source| AttachError::Memory { pid, source })?;
    if seen != probe {
        return Err(AttachError::ProbeMismatch {
            pid,
            address: probe_address,
        });
    }
    peer.pools = SharedPools::discover(pid);
    if !peer.pools.is_empty() {
        tracing::debug!(%pid, pools = ?peer.pools, "caller pools mapped for same-host copies");
    }
    Ok(peer)
}

/// The process at the other end of the node's local socket `socket` (see [`Ends::socket`]),
/// held by a pidfd: the process the kernel says connected it. Does not block; called by the
/// task serving the connection, so the socket is open for the call.
pub(crate) fn local_caller(socket: RawFd) -> Result<(Pid, OwnedFd), AttachError> {
    // SAFETY: `socket` is the socket of the connection the calling task serves, open for
    // the duration of this synchronous call.
    let socket = unsafe { BorrowedFd::borrow_raw(socket) };
    let pid = peer_pid(socket).map_err(AttachError::PeerUnknown)?;
    // The kernel's own pidfd of the connecting process cannot name a later process that reused
    // its id. Before Linux 6.5 there is none; a process that took over the id then could not
    // show the probe bytes.
    let pidfd = match peer_pidfd(socket) {
        Ok(pidfd) => pidfd,
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => {
            pidfd_open(pid, PidfdFlags::empty()).map_err(|e| AttachError::NoProcess {
                pid,
                source: e.into(),
            })?
        }
        Err(source) => return Err(AttachError::NoProcess { pid, source }),
    };
    Ok((pid, pidfd))
}

/// Checks the caller `pid` (held by `pidfd`, from [`local_caller`]) of the node's local
/// socket: its memory must hold the 16 `probe` bytes at `probe_address`. The process id the
/// request named is not used. Blocking: reads `/proc`.
pub(crate) fn verify_local(
    (pid, pidfd): (Pid, OwnedFd),
    probe_address: u64,
    probe: [u8; 16],
    other_users: bool,
) -> Result<Peer, AttachError> {
    if !other_users {
        same_user(pid)?;
    }
    attached(pid, pidfd, probe_address, probe)
}

/// Reads the socket option `option` of `socket` into a `T` (a plain C value).
fn socket_option<T: Copy>(
    socket: BorrowedFd<'_>,
    option: libc::c_int,
    mut value: T,
) -> io::Result<T> {
    use std::os::fd::AsRawFd;
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes, the size of the `T` it is given (a plain C
    // value, valid for any bytes), and `socket` is open for the call.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            std::ptr::addr_of_mut!(value).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

/// `SO_PEERCRED`: the process that connected `socket`, as this node's pid namespace numbers
/// it (none when that process is not visible there).
fn peer_pid(socket: BorrowedFd<'_>) -> io::Result<Pid> {
    let blank = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let cred = socket_option(socket, libc::SO_PEERCRED, blank)?;
    Pid::from_raw(cred.pid).ok_or_else(|| {
        io::Error::other("the connecting process is not visible in this node's pid namespace")
    })
}

/// `SO_PEERPIDFD`: a pidfd of the process that connected `socket` (Linux 6.5+; elsewhere
/// `ENOPROTOOPT`, as from an older kernel).
fn peer_pidfd(socket: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // The option's number in the kernel's generic socket options, which these use.
    const SO_PEERPIDFD: libc::c_int = 77;
    let generic = cfg!(any(
        target_arch = "x86_64",
        target_arch = "x86",
        target_arch = "aarch64",
        target_arch = "arm",
        target_arch = "riscv64",
        target_arch = "loongarch64"
    ));
    if !generic {
        return Err(io::Error::from_raw_os_error(libc::ENOPROTOOPT));
    }
    let fd: libc::c_int = socket_option(socket, SO_PEERPIDFD, -1)?;
    if fd < 0 {
        return Err(io::Error::other("SO_PEERPIDFD gave no descriptor"));
    }
    // SAFETY: the call succeeded, so `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The inode of the caller's end of the TCP connection `local ↔ peer` (this node's end is
/// `local`), from `/proc/net/tcp` or `/proc/net/tcp6` of the node's network namespace.
fn peer_socket_inode(peer: SocketAddr, local: SocketAddr) -> Result<u64, AttachError> {
    let table = match peer.ip() {
        IpAddr::V4(_) => "/proc/net/tcp",
        IpAddr::V6(_) => "/proc/net/tcp6",
    };
    let text =
        fs::read_to_string(table).map_err(|source| AttachError::SocketTable { table, source })?;
    let (want_local, want_remote) = (proc_address(peer), proc_address(local));
    for line in text.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() > 9 && fields[1] == want_local && fields[2] == want_remote {
            return fields[9].parse().map_err(|_| AttachError::BadInode {
                table,
                line: line.to_string(),
            });
        }
    }
    Err(AttachError::NotLocal(peer))
}

/// How `/proc/net/tcp{,6}` writes an address: the address as 32-bit words in the machine's
/// byte order, in hex, then the port.
fn proc_address(addr: SocketAddr) -> String {
    let words: Vec<u32> = match addr.ip() {
        IpAddr::V4(ip) => vec![u32::from_ne_bytes(ip.octets())],
        IpAddr::V6(ip) => ip
            .octets()
            .chunks_exact(4)
            .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
            .collect(),
    };
    let mut out: String = words.iter().map(|w| format!("{w:08X}")).collect();
    out.push_str(&format!(":{:04X}", addr.port()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_addresses_are_written_as_the_kernel_writes_them() {
        let v4: SocketAddr = "127.0.0.1:50051".parse().unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(proc_address(v4), "0100007F:C383");
            let v6: SocketAddr = "[::1]:80".parse().unwrap();
            assert_eq!(proc_address(v6), "00000000000000000000000001000000:0050");
        }
    }

    #[test]
    fn a_process_is_verified_only_for_a_connection_it_holds() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, peer) = listener.accept().unwrap();
        let local = server.local_addr().unwrap();
        let probe: Box<[u8; 16]> = Box::new(*b"0123456789abcdef");
        let me = std::process::id();
        let at = probe.as_ptr() as u64;
        let attached = verify(me, peer, local, at, *probe, false).unwrap();
        assert!(attached.alive());
        // A wrong probe, another process, and a connection this process does not hold.
        assert!(matches!(
            verify(me, peer, local, at, [0; 16], false),
            Err(AttachError::ProbeMismatch { .. })
        ));
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let other = verify(child.id(), peer, local, at, *probe, false).unwrap_err();
        assert!(matches!(other, AttachError::NotHolder { .. }), "{other}");
        assert!(other.to_string().contains("does not hold"), "{other}");
        child.kill().unwrap();
        child.wait().unwrap();
        let elsewhere: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(matches!(
            verify(me, elsewhere, local, at, *probe, false),
            Err(AttachError::NotLocal(_))
        ));
        assert!(matches!(
            verify(0, peer, local, at, *probe, false),
            Err(AttachError::NotAProcessId(0))
        ));
        let remote: SocketAddr = "10.1.2.3:4000".parse().unwrap();
        assert!(matches!(
            verify(me, remote, local, at, *probe, false),
            Err(AttachError::NotLoopback(_))
        ));
        drop(client);
    }

    #[test]
    fn a_caller_whose_process_exited_is_not_waiting_whether_or_not_its_connection_is_watched() {
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(child.id() as i32).unwrap();
        let peer = |socket: RawFd| Peer {
            pid,
            pidfd: pidfd_open(pid, PidfdFlags::empty()).unwrap(),
            socket,
            pools: SharedPools::default(),
        };
        let (watched, unwatched) = (peer(server.as_raw_fd()), peer(-1));
        let far = moonkv_dataplane::same_host::monotonic_now_ns() + 60_000_000_000;
        assert!(watched.waiting(far) && unwatched.waiting(far));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!watched.alive() && !unwatched.alive());
        assert!(!watched.waiting(far), "exited, its connection still open");
        assert!(!unwatched.waiting(far), "exited, no connection watched");
    }

    #[test]
    fn a_caller_that_shuts_its_sending_side_has_given_up() {
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, peer) = listener.accept().unwrap();
        let probe: Box<[u8; 16]> = Box::new([3; 16]);
        let me = std::process::id();
        let at = probe.as_ptr() as u64;
        let unwatched = verify(me, peer, server.local_addr().unwrap(), at, *probe, false).unwrap();
        let far = moonkv_dataplane::same_host::monotonic_now_ns() + 60_000_000_000;
        assert!(unwatched.waiting(far), "no connection watched");
        let attached = unwatched.watching(server.as_raw_fd());
        assert!(attached.waiting(far));
        assert!(!attached.waiting(moonkv_dataplane::same_host::monotonic_now_ns()));
        client.shutdown(std::net::Shutdown::Write).unwrap();
        let since = std::time::Instant::now();
        while attached.waiting(far) {
            assert!(since.elapsed() < std::time::Duration::from_secs(5));
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(
            attached.alive(),
            "the process still runs: its connection alone ended the wait"
        );
        drop(attached);
        drop(server);
    }

    /// This process attached as a caller over a loopback connection (kept open by the
    /// returned pair).
    fn attached_to_self() -> (Peer, (std::net::TcpStream, std::net::TcpStream)) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, peer) = listener.accept().unwrap();
        let probe: Box<[u8; 16]> = Box::new([7; 16]);
        let at = probe.as_ptr() as u64;
        let local = server.local_addr().unwrap();
        let attached = verify(std::process::id(), peer, local, at, *probe, false).unwrap();
        (attached, (client, server))
    }

    #[test]
    fn copies_follow_the_caller_ranges() {
        let (attached, _connection) = attached_to_self();
        let source: Vec<u8> = (0..100u8).collect();
        let (mut a, mut b) = (vec![0u8; 30], vec![0u8; 70]);
        let ranges = [(a.as_mut_ptr() as u64, 30), (b.as_mut_ptr() as u64, 70)];
        attached.write_to(&source, &ranges, false).unwrap();
        assert_eq!(a, source[..30]);
        assert_eq!(b, source[30..]);
        let mut back = vec![0u8; 100];
        attached.read_from(&mut back, &ranges, false).unwrap();
        assert_eq!(back, source);
        // An unmapped caller range fails the copy instead of touching anything else.
        let err = attached
            .write_to(&source[..8], &[(8, 8)], true)
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EFAULT));
    }

    #[test]
    fn copies_of_many_parts_fill_every_part_from_its_ranges_past_the_iovec_limit() {
        let (attached, _connection) = attached_to_self();
        // 1,500 parts of 1–7 bytes, each from two caller ranges of its own (3,000 ranges:
        // more than one system call's iovecs on either side), some of them empty.
        let n = 1_500;
        let lens: Vec<usize> = (0..n).map(|i| 1 + i % 7).collect();
        let caller: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                (0..lens[i] as u8)
                    .map(|b| b.wrapping_mul(31) ^ i as u8)
                    .collect()
            })
            .collect();
        let ranges: Vec<[(u64, u64); 2]> = caller
            .iter()
            .map(|c| {
                let split = c.len() / 2;
                [
                    (c.as_ptr() as u64, split as u64),
                    (c.as_ptr() as u64 + split as u64, (c.len() - split) as u64),
                ]
            })
            .collect();
        let mut node: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l]).collect();
        let seen = PoolIds::default();
        let parts = node
            .iter_mut()
            .zip(&ranges)
            .map(|(dst, r)| (&mut dst[..], &r[..]));
        attached.read_many_seen(parts, false, &seen).unwrap();
        assert_eq!(node, caller);
        // And back out, into cleared caller memory.
        let mut out: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l]).collect();
        let out_ranges: Vec<[(u64, u64); 1]> = out
            .iter_mut()
            .map(|o| [(o.as_mut_ptr() as u64, o.len() as u64)])
            .collect();
        let parts = node
            .iter()
            .zip(&out_ranges)
            .map(|(src, r)| (&src[..], &r[..]));
        attached.write_many_seen(parts, false, &seen).unwrap();
        assert_eq!(out, caller);
        // One unmapped range fails the whole copy.
        let mut dst = [0u8; 8];
        let bad = [(8u64, 8u64)];
        let err = attached
            .read_many_seen(std::iter::once((&mut dst[..], &bad[..])), false, &seen)
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EFAULT));
    }

    #[test]
    fn advancing_past_copied_bytes_skips_filled_and_empty_iovecs_and_shortens_a_partial_one() {
        let mut buf = [0u8; 64];
        let base = buf.as_mut_ptr() as usize;
        let iov = |at: usize, len: usize| libc::iovec {
            iov_base: (base + at) as *mut libc::c_void,
            iov_len: len,
        };
        let mut v = vec![iov(0, 4), iov(4, 0), iov(4, 10), iov(14, 6)];
        let mut first = 0;
        advance(&mut v, &mut first, 7);
        assert_eq!(first, 2);
        assert_eq!((v[2].iov_base as usize - base, v[2].iov_len), (7, 7));
        advance(&mut v, &mut first, 7);
        assert_eq!(first, 3);
        advance(&mut v, &mut first, 6);
        assert_eq!(first, 4);
    }
}
