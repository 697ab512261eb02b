//! Fixed binary headers of the data plane (layout in `docs/data-plane.md`).
//!
//! All integers are big-endian. A request header is followed, for writes, by exactly `length`
//! raw payload bytes; a response header is followed, for successful reads, by exactly `length`
//! raw bytes. Payload bytes are never re-encoded.

use moonkv_proto::SegmentId;

/// Request header length in bytes.
pub const REQUEST_LEN: usize = 48;
/// Response header length in bytes.
pub const RESPONSE_LEN: usize = 24;
/// First four bytes of every request: `MKVD`.
pub const REQUEST_MAGIC: [u8; 4] = *b"MKVD";
/// First four bytes of every response: `MKVR`.
pub const RESPONSE_MAGIC: [u8; 4] = *b"MKVR";
/// Version of the data-plane headers.
pub const VERSION: u8 = 1;

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataOp {
    /// Send `length` bytes of the segment starting at `address` back to the caller.
    Read = 1,
    /// Store the `length` payload bytes that follow the header at `address`.
    Write = 2,
    /// Send the payload of disk file `address` (its id), which must be exactly `length` bytes,
    /// after verifying the file. `segment_id` is the node's disk id.
    FileRead = 3,
    /// Write disk file `address` (its id) from the payload that follows: a file-meta prefix
    /// (see [`FileMeta`]) then the object bytes; `length` counts both.
    FileWrite = 4,
    /// Send the node's data-plane counters as a JSON object ([`NodeStats`]); the request has
    /// length 0, segment and address are ignored.
    Stats = 5,
    /// Same-host read: the node copies `length` bytes at `address` straight into the caller's
    /// memory, at the places a [`LocalPlan`] (which follows the header and grant) lists. Only on
    /// a connection the node has attached ([`DataOp::Attach`]); answered with no payload.
    ReadLocal = 6,
    /// Same-host write: the node copies `length` bytes from the caller's memory, at the places
    /// the [`LocalPlan`] lists, to `address`. No payload travels.
    WriteLocal = 7,
    /// Asks the node to copy this connection's bytes straight between its segments and the
    /// caller's memory from now on; an [`AttachRequest`] carried in the header, no payload.
    Attach = 8,
    /// Same-host put through the node: the node places the objects at its master as the
    /// caller (start), copies them from the caller's memory at the places the [`LocalPlan`]
    /// lists into its own segments, and ends them (or revokes them). A `u32` body length and a
    /// MessagePack body (`(upsert: bool, moonkv_proto::msg::BatchPutStartRequest)`) follow the
    /// plan; `length` is the objects' bytes, laid end to end in the plan. Answered with a
    /// MessagePack `Vec<ItemResult<()>>`, one per key; a key the node could not write itself
    /// (a replica elsewhere) comes back `NOT_SUPPORTED`, revoked. Only on an attached
    /// connection, and only by a node that says so in STATS ([`NodeStats::put_local`]).
    PutLocal = 9,
    /// Same-host get through the node: the node asks its master for the keys' replicas in the
    /// caller's tenant, copies each object held in its own memory segments into the caller's
    /// buffers, at the places the [`LocalPlan`] lists (every key's buffer laid end to end, each
    /// filled from its start), and confirms with the master any read whose lease ran out. A
    /// `u32` body length and a MessagePack body (`(tenant: String, keys: Vec<String>,
    /// capacities: Vec<u64>)`, each key's buffer size) follow the plan; `length` is the
    /// buffers' bytes. Answered with a MessagePack `Vec<ItemResult<u64>>`, each key's size; a
    /// key the node could not read itself (no replica in its memory, a buffer too small) comes
    /// back `NOT_SUPPORTED`, with nothing written. The caller's memory is lent until the
    /// answer. Only on an attached connection, and only by a node that says so in STATS
    /// ([`NodeStats::get_local`]).
    GetLocal = 10,
    /// Put through the node over the socket: the node places the objects at its master as the
    /// caller (start), reads their bytes from the connection straight into its own segments,
    /// and ends them (or revokes them). A `u32` body length and the same MessagePack body as
    /// [`DataOp::PutLocal`] follow the header; then the payload: the objects' bytes laid end to
    /// end, `length` of them. Answered like PUT_LOCAL: a MessagePack `Vec<ItemResult<()>>`,
    /// one per key, a key placed anywhere but this node's memory coming back `NOT_SUPPORTED`,
    /// revoked. Only by a node that says so in STATS ([`NodeStats::put_whole`]); any other
    /// node answers after draining the payload, or closes the connection.
    PutWhole = 11,
    /// Get through the node over the socket: the node asks its master for the replicas of the
    /// keys in the caller's tenant and sends the bytes of each object it holds in its own
    /// memory. A `u32` body length and the MessagePack body of [`DataOp::GetLocal`]
    /// (`(tenant, keys, capacities)`, the most bytes the caller takes for each key) follow the
    /// header; `length` is the capacities' sum, at most 64 MiB. Answered OK with `length`
    /// bytes: a `u32` answer length, a MessagePack `Vec<ItemResult<`[`GotWhole`]`>>`, one per
    /// key, then the bytes of every key answered [`GotWhole::Bytes`], in key order. A key the
    /// node does not hold, or that is larger than its capacity, comes back
    /// [`GotWhole::Elsewhere`] with its replica list, which the caller reads the usual way.
    /// Only by a node that says so in STATS ([`NodeStats::get_whole`]).
    GetWhole = 12,
}

/// One key's answer to a [`DataOp::GetWhole`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum GotWhole {
    /// This many bytes of the key follow the answer.
    Bytes(u64),
    /// The node did not read the key (no complete replica in its memory, or larger than the
    /// caller's capacity): its replica list, with the read lease the master granted.
    Elsewhere(moonkv_proto::types::GetReplicaListResponse),
}

impl DataOp {
    /// The socket op a same-host op stands for (READ for READ_LOCAL, WRITE for WRITE_LOCAL):
    /// grants, bounds and locks are checked as for it.
    pub fn as_socket_op(op: u8) -> u8 {
        match op {
            o if o == DataOp::ReadLocal as u8 => DataOp::Read as u8,
            o if o == DataOp::WriteLocal as u8 => DataOp::Write as u8,
            o => o,
        }
    }

    /// Whether `op` is a same-host copy (its [`LocalPlan`] follows the header and grant).
    pub fn is_local(op: u8) -> bool {
        op == DataOp::ReadLocal as u8 || op == DataOp::WriteLocal as u8
    }
}

/// Largest body of a [`DataOp::PutLocal`] or [`DataOp::GetLocal`] request, and of its answer.
pub const MAX_PUT_LOCAL_BODY: u32 = 16 << 20;

/// Most caller ranges one [`LocalPlan`] may list (the kernel's `IOV_MAX`).
pub const MAX_LOCAL_RANGES: usize = 1024;

/// Where in the caller's memory a same-host request's bytes go (READ_LOCAL) or come from
/// (WRITE_LOCAL), and until when the caller still waits for them.
///
/// Layout (big-endian): `deadline_ns: u64` (`CLOCK_MONOTONIC` of the machine both run on),
/// `count: u32`, `0: u32`, then `count` pairs `address: u64, length: u64`. The lengths add up to
/// the header's `length`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalPlan {
    /// The node copies nothing once the machine's monotonic clock has passed this.
    pub deadline_ns: u64,
    /// Caller ranges `(address, length)`, in order.
    pub ranges: Vec<(u64, u64)>,
    /// Hints about the call the request belongs to ([`LocalPlan::LONG_CALL`]); a node ignores
    /// bits it does not know.
    pub flags: u32,
}

impl LocalPlan {
    /// Fixed part of the encoding.
    pub const FIXED_LEN: usize = 16;

    /// Flag: the request is part of a call whose same-host bytes reach
    /// [`crate::same_host::LONG_CALL_BYTES`]. Bytes that large rarely stay in a cache, so the
    /// node writes them into its segment with streaming stores.
    pub const LONG_CALL: u32 = 1;

    /// Appends the encoding to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.deadline_ns.to_be_bytes());
        out.extend_from_slice(&(self.ranges.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        for (address, len) in &self.ranges {
            out.extend_from_slice(&address.to_be_bytes());
            out.extend_from_slice(&len.to_be_bytes());
        }
    }

    /// Reads the range count from the fixed part; `None` when it exceeds [`MAX_LOCAL_RANGES`].
    pub fn count(fixed: &[u8; Self::FIXED_LEN]) -> Option<usize> {
        let count = u32::from_be_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]) as usize;
        (count <= MAX_LOCAL_RANGES).then_some(count)
    }

    /// Decodes the fixed part and `count` ranges; `None` when the ranges do not add up to
    /// `length` (or overflow).
    pub fn decode(fixed: &[u8; Self::FIXED_LEN], ranges: &[u8], length: u64) -> Option<LocalPlan> {
        let plan = LocalPlan {
            deadline_ns: be_u64(fixed, 0),
            ranges: ranges
                .chunks_exact(16)
                .map(|pair| (be_u64(pair, 0), be_u64(pair, 8)))
                .collect(),
            flags: u32::from_be_bytes([fixed[12], fixed[13], fixed[14], fixed[15]]),
        };
        let total = plan.ranges.iter().try_fold(0u64, |sum, (address, len)| {
            address.checked_add(*len)?;
            sum.checked_add(*len)
        })?;
        (total == length).then_some(plan)
    }
}

/// An ATTACH request: who the caller is, and a probe the node must read out of the caller's
/// memory to show it can reach it. It travels entirely in the request header, with no
/// payload, so a node that does not know the op answers `BAD_OP` and stays in step: the
/// probe bytes in `segment_id`, `probe_address` in `address`, the pid in `length`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachRequest {
    /// The caller's process id, as the node's `/proc` sees it.
    pub pid: u32,
    /// Where the probe bytes lie in the caller's memory.
    pub probe_address: u64,
    /// The probe bytes.
    pub probe: [u8; 16],
}

impl AttachRequest {
    /// The request header carrying this request.
    pub fn header(&self, request_id: u64) -> RequestHeader {
        let mut hi = [0u8; 8];
        let mut lo = [0u8; 8];
        hi.copy_from_slice(&self.probe[..8]);
        lo.copy_from_slice(&self.probe[8..]);
        RequestHeader::new(
            DataOp::Attach,
            request_id,
            SegmentId::new(u64::from_be_bytes(hi), u64::from_be_bytes(lo)),
            self.probe_address,
            u64::from(self.pid),
        )
    }

    /// The request an ATTACH header carries; `None` when its pid does not fit.
    pub fn from_header(h: &RequestHeader) -> Option<AttachRequest> {
        let mut probe = [0u8; 16];
        probe[..8].copy_from_slice(&h.segment_id.0.hi.to_be_bytes());
        probe[8..].copy_from_slice(&h.segment_id.0.lo.to_be_bytes());
        Some(AttachRequest {
            pid: u32::try_from(h.length).ok()?,
            probe_address: h.address,
            probe,
        })
    }
}

/// What a node reports to a STATS request.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeStats {
    /// Data-plane connections accepted since the node started.
    pub connections_opened: u64,
    /// Data-plane connections open now.
    pub connections_open: u64,
    /// Requests answered since the node started.
    pub requests: u64,
    /// Same-host requests served (bytes copied straight to or from a caller on this machine).
    #[serde(default)]
    pub same_host_requests: u64,
    /// Of `connections_opened`, those accepted on the node's local socket.
    #[serde(default)]
    pub local_connections_opened: u64,
    /// The master this node mounts its segments on (`host:port`, or an `etcd://` cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master: Option<String>,
    /// The node takes same-host puts whole ([`DataOp::PutLocal`]): it starts and ends them at
    /// its master itself, so a caller's put crosses processes once.
    #[serde(default)]
    pub put_local: bool,
    /// The node takes same-host gets whole ([`DataOp::GetLocal`]): it asks its master for the
    /// replicas itself, so a caller's get crosses processes once.
    #[serde(default)]
    pub get_local: bool,
    /// The node takes puts whole over the socket ([`DataOp::PutWhole`]): it starts and ends
    /// them at its master itself, so a caller's small put is one round trip.
    #[serde(default)]
    pub put_whole: bool,
    /// The node takes gets whole over the socket ([`DataOp::GetWhole`]): it asks its master for
    /// the replicas itself, so a caller's small get is one round trip.
    #[serde(default)]
    pub get_whole: bool,
    /// The node's local socket, for callers on this machine: `@` and an abstract name
    /// (`docs/data-plane.md`, *The local socket*). Absent when the node offers none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_socket: Option<String>,
}

/// Largest STATS answer a caller accepts.
pub const MAX_STATS_LEN: u64 = 64 << 10;

/// Outcome of one request, carried in the response header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataStatus {
    /// Done: read bytes follow, or written bytes are in memory.
    Ok = 0,
    /// No segment with this id is mounted by the node.
    UnknownSegment = 1,
    /// `[address, address + length)` is not inside the segment.
    OutOfRange = 2,
    /// `address + length` does not fit in 64 bits.
    AddressOverflow = 3,
    /// The op byte is neither read nor write.
    BadOp = 4,
    /// A refused write is too long to drain; the node closes the connection after answering.
    TooLarge = 5,
    /// Wrong magic or version; the node closes the connection after answering.
    BadHeader = 6,
    /// No disk file with this id.
    FileNotFound = 7,
    /// The disk file's header, length or checksum is wrong; nothing was sent.
    FileCorrupt = 8,
    /// The disk file could not be written or synced.
    FileWriteFail = 9,
    /// The node's disk budget has no room for the file.
    DiskFull = 10,
    /// The disk file could not be read.
    FileReadFail = 11,
    /// The node requires the authentication handshake and it was missing or wrong; the node
    /// closes the connection after answering.
    Unauthenticated = 12,
    /// The request's grant is missing, forged, expired, of the wrong kind or does not cover the
    /// range; the node keeps serving.
    Forbidden = 13,
    /// A same-host request or attach the node would not or could not carry out (the connection
    /// is not attached, the caller's deadline passed, the caller's memory could not be reached,
    /// or the caller is not a process on the node's machine); the request's bytes were not all
    /// copied, and the node keeps serving.
    LocalRefused = 14,
}

impl DataStatus {
    /// Maps the wire byte back; unknown bytes are treated as a malformed header.
    pub fn from_u8(byte: u8) -> DataStatus {
        match byte {
            0 => DataStatus::Ok,
            1 => DataStatus::UnknownSegment,
            2 => DataStatus::OutOfRange,
            3 => DataStatus::AddressOverflow,
            4 => DataStatus::BadOp,
            5 => DataStatus::TooLarge,
            7 => DataStatus::FileNotFound,
            8 => DataStatus::FileCorrupt,
            9 => DataStatus::FileWriteFail,
            10 => DataStatus::DiskFull,
            11 => DataStatus::FileReadFail,
            12 => DataStatus::Unauthenticated,
            13 => DataStatus::Forbidden,
            14 => DataStatus::LocalRefused,
            _ => DataStatus::BadHeader,
        }
    }

    /// A sentence for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            DataStatus::Ok => "ok",
            DataStatus::UnknownSegment => "the node has no such segment mounted",
            DataStatus::OutOfRange => "the range is outside the segment",
            DataStatus::AddressOverflow => "address plus length overflows",
            DataStatus::BadOp => "unknown operation",
            DataStatus::TooLarge => "refused write too long to drain",
            DataStatus::BadHeader => "malformed request header",
            DataStatus::FileNotFound => "the disk file does not exist",
            DataStatus::FileCorrupt => "the disk file is corrupt (bad header, length or checksum)",
            DataStatus::FileWriteFail => "the disk file could not be written",
            DataStatus::DiskFull => "the node's disk is full",
            DataStatus::FileReadFail => "the disk file could not be read",
            DataStatus::Unauthenticated => {
                "the node requires authentication: set MOONKV_AUTH_SECRET or \
                 MOONKV_AUTH_SECRET_FILE to the cluster's shared secret"
            }
            DataStatus::Forbidden => {
                "no valid grant for this range (missing, forged, expired or for another range)"
            }
            DataStatus::LocalRefused => {
                "the same-host copy was refused (connection not attached, deadline passed, or \
                 the caller's memory unreachable)"
            }
        }
    }
}

/// The prefix of a FILE_WRITE payload: what the file header records about the object.
/// Layout: `tenant_len: u32, key_len: u32, tenant, key` (big-endian lengths, UTF-8 text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMeta {
    /// Tenant of the object.
    pub tenant: String,
    /// Object key.
    pub key: String,
}

impl FileMeta {
    /// Fixed part of the prefix.
    pub const FIXED_LEN: usize = 8;

    /// Encoded prefix length.
    pub fn encoded_len(&self) -> usize {
        Self::FIXED_LEN + self.tenant.len() + self.key.len()
    }

    /// Encodes the prefix.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        out.extend_from_slice(&(self.tenant.len() as u32).to_be_bytes());
        out.extend_from_slice(&(self.key.len() as u32).to_be_bytes());
        out.extend_from_slice(self.tenant.as_bytes());
        out.extend_from_slice(self.key.as_bytes());
        out
    }
}

/// A decoded request header. `op` is kept raw so a bad op can be answered precisely.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    /// A [`DataOp`] number; anything else is answered with [`DataStatus::BadOp`].
    pub op: u8,
    /// Echoed in the response.
    pub request_id: u64,
    /// Target segment.
    pub segment_id: SegmentId,
    /// Absolute address inside the segment.
    pub address: u64,
    /// Bytes to read or write.
    pub length: u64,
    /// Length of the grant that follows the header: 0 or [`moonkv_proto::grant::GRANT_LEN`].
    pub grant_len: u16,
}

impl RequestHeader {
    /// Builds a request header.
    pub fn new(
        op: DataOp,
        request_id: u64,
        segment_id: SegmentId,
        address: u64,
        length: u64,
    ) -> Self {
        Self {
            op: op as u8,
            request_id,
            segment_id,
            address,
            length,
            grant_len: 0,
        }
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut out = [0u8; REQUEST_LEN];
        out[0..4].copy_from_slice(&REQUEST_MAGIC);
        out[4] = VERSION;
        out[5] = self.op;
        out[6..8].copy_from_slice(&self.grant_len.to_be_bytes());
        out[8..16].copy_from_slice(&self.request_id.to_be_bytes());
        out[16..24].copy_from_slice(&self.segment_id.0.hi.to_be_bytes());
        out[24..32].copy_from_slice(&self.segment_id.0.lo.to_be_bytes());
        out[32..40].copy_from_slice(&self.address.to_be_bytes());
        out[40..48].copy_from_slice(&self.length.to_be_bytes());
        out
    }

    /// Decodes a header; `Err` carries the request id (0 if unreadable) for the answer.
    pub fn decode(bytes: &[u8; REQUEST_LEN]) -> Result<RequestHeader, u64> {
        let request_id = be_u64(bytes, 8);
        if bytes[0..4] != REQUEST_MAGIC || bytes[4] != VERSION {
            return Err(request_id);
        }
        Ok(RequestHeader {
            op: bytes[5],
            request_id,
            segment_id: SegmentId::new(be_u64(bytes, 16), be_u64(bytes, 24)),
            address: be_u64(bytes, 32),
            length: be_u64(bytes, 40),
            grant_len: u16::from_be_bytes([bytes[6], bytes[7]]),
        })
    }
}

/// A response header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseHeader {
    /// Outcome.
    pub status: DataStatus,
    /// Request id being answered.
    pub request_id: u64,
    /// Raw bytes following this header (the read length on a successful read, else 0).
    pub length: u64,
}

impl ResponseHeader {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; RESPONSE_LEN] {
        let mut out = [0u8; RESPONSE_LEN];
        out[0..4].copy_from_slice(&RESPONSE_MAGIC);
        out[4] = VERSION;
        out[5] = self.status as u8;
        out[8..16].copy_from_slice(&self.request_id.to_be_bytes());
        out[16..24].copy_from_slice(&self.length.to_be_bytes());
        out
    }

    /// Decodes a header; `None` when the magic or version is wrong.
    pub fn decode(bytes: &[u8; RESPONSE_LEN]) -> Option<ResponseHeader> {
        if bytes[0..4] != RESPONSE_MAGIC || bytes[4] != VERSION {
            return None;
        }
        Some(ResponseHeader {
            status: DataStatus::from_u8(bytes[5]),
            request_id: be_u64(bytes, 8),
            length: be_u64(bytes, 16),
        })
    }
}

fn be_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(word)
}

/// Checks `[address, address + length)` against a segment `[base, base + size)` and returns the
/// offset of `address` inside the segment.
pub fn check_range(base: u64, size: u64, address: u64, length: u64) -> Result<usize, DataStatus> {
    let end = address
        .checked_add(length)
        .ok_or(DataStatus::AddressOverflow)?;
    let segment_end = base.checked_add(size).ok_or(DataStatus::OutOfRange)?;
    if address < base || end > segment_end {
        return Err(DataStatus::OutOfRange);
    }
    usize::try_from(address - base).map_err(|_| DataStatus::OutOfRange)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_header_has_the_documented_layout() {
        let h = RequestHeader::new(DataOp::Write, 7, SegmentId::new(1, 2), 0x1000, 16);
        let bytes = h.encode();
        let mut expected = Vec::new();
        expected.extend_from_slice(b"MKVD");
        expected.extend_from_slice(&[1, 2, 0, 0]);
        expected.extend_from_slice(&7u64.to_be_bytes());
        expected.extend_from_slice(&1u64.to_be_bytes());
        expected.extend_from_slice(&2u64.to_be_bytes());
        expected.extend_from_slice(&0x1000u64.to_be_bytes());
        expected.extend_from_slice(&16u64.to_be_bytes());
        assert_eq!(bytes.to_vec(), expected);
        assert_eq!(RequestHeader::decode(&bytes), Ok(h));
    }

    #[test]
    fn response_header_round_trips() {
        let h = ResponseHeader {
            status: DataStatus::OutOfRange,
            request_id: 9,
            length: 0,
        };
        let bytes = h.encode();
        assert_eq!(&bytes[0..6], b"MKVR\x01\x02");
        assert_eq!(ResponseHeader::decode(&bytes), Some(h));
    }

    #[test]
    fn bad_magic_or_version_is_refused() {
        let mut bytes = RequestHeader::new(DataOp::Read, 5, SegmentId::new(0, 1), 0, 1).encode();
        bytes[0] = b'X';
        assert_eq!(RequestHeader::decode(&bytes), Err(5));
        let mut bytes = RequestHeader::new(DataOp::Read, 5, SegmentId::new(0, 1), 0, 1).encode();
        bytes[4] = 2;
        assert_eq!(RequestHeader::decode(&bytes), Err(5));
        let mut resp = ResponseHeader {
            status: DataStatus::Ok,
            request_id: 1,
            length: 0,
        }
        .encode();
        resp[1] = 0;
        assert_eq!(ResponseHeader::decode(&resp), None);
    }

    #[test]
    fn ranges_are_bounds_checked() {
        let base = 0x10_0000;
        assert_eq!(check_range(base, 4096, base, 4096), Ok(0));
        assert_eq!(check_range(base, 4096, base + 100, 10), Ok(100));
        assert_eq!(check_range(base, 4096, base + 4096, 0), Ok(4096));
        assert_eq!(
            check_range(base, 4096, base + 1, 4096),
            Err(DataStatus::OutOfRange)
        );
        assert_eq!(
            check_range(base, 4096, base - 1, 1),
            Err(DataStatus::OutOfRange)
        );
        assert_eq!(
            check_range(base, 4096, base, u64::MAX),
            Err(DataStatus::AddressOverflow)
        );
        assert_eq!(
            check_range(base, 4096, u64::MAX, 2),
            Err(DataStatus::AddressOverflow)
        );
        assert_eq!(
            check_range(base, 4096, base + 5000, 0),
            Err(DataStatus::OutOfRange)
        );
    }

    #[test]
    fn unknown_status_bytes_read_as_bad_header() {
        assert_eq!(DataStatus::from_u8(0), DataStatus::Ok);
        assert_eq!(DataStatus::from_u8(200), DataStatus::BadHeader);
    }

    #[test]
    fn a_plan_round_trips_with_its_flags_and_old_plans_read_as_unflagged() {
        let plan = LocalPlan {
            deadline_ns: 123_456_789,
            ranges: vec![(4096, 100), (1 << 40, 28)],
            flags: LocalPlan::LONG_CALL | 0x8000_0000,
        };
        let mut bytes = Vec::new();
        plan.encode_into(&mut bytes);
        assert_eq!(bytes.len(), LocalPlan::FIXED_LEN + 32);
        let fixed: [u8; LocalPlan::FIXED_LEN] = bytes[..LocalPlan::FIXED_LEN].try_into().unwrap();
        assert_eq!(LocalPlan::count(&fixed), Some(2));
        let back = LocalPlan::decode(&fixed, &bytes[LocalPlan::FIXED_LEN..], 128).unwrap();
        assert_eq!(back, plan);
        // A plan from a caller that predates the flags carries zero there.
        let mut old = fixed;
        old[12..16].copy_from_slice(&[0; 4]);
        let back = LocalPlan::decode(&old, &bytes[LocalPlan::FIXED_LEN..], 128).unwrap();
        assert_eq!(back.flags & LocalPlan::LONG_CALL, 0);
        // Ranges that do not add up to the length are refused, flags or not.
        assert!(LocalPlan::decode(&fixed, &bytes[LocalPlan::FIXED_LEN..], 127).is_none());
    }
}
