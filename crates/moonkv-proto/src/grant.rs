//! Capability grants: when the master runs with a shared secret, every replica descriptor it
//! hands out carries a grant for exactly that replica, and a node serves a data-plane request
//! only if it carries a grant covering it. A grant is a fixed 82-byte token (big-endian):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 1 | version, `2` |
//! | 1 | 1 | rights: bit 0 read, bit 1 write, bit 2 file (a disk file id rather than a byte range) |
//! | 2 | 8 | expires_ms: UNIX milliseconds after which the grant is void |
//! | 10 | 8 | address: first byte of the range, or the file id |
//! | 18 | 8 | size: bytes of the range, or the object size of the file |
//! | 26 | 8 | tenant digest: first 8 bytes of SHA-256(tenant) |
//! | 34 | 8 | replica id the grant was issued for |
//! | 42 | 8 | issued_ms: the master's UNIX milliseconds when it issued the grant |
//! | 50 | 32 | HMAC-SHA256(grant key, `"moonkv grant"` ‖ segment_id.hi ‖ segment_id.lo ‖ bytes 0..50) |
//!
//! The replica id and issue time let a node tell a grant for the replica that now owns a range
//! from a stale one for a replica that was freed there (see `moonkv_node::claims`).
//!
//! The grant key is the grant secret of the master and the nodes when they have one, otherwise
//! the shared secret. The segment id is covered by the MAC but not carried: the node takes it
//! from the request, so a grant for one segment (or disk) is worthless on another.

use crate::auth::Secret;
use crate::ids::SegmentId;
use sha2::{Digest, Sha256};

/// Length of a grant token in bytes.
pub const GRANT_LEN: usize = 82;
/// Version byte of the token layout.
pub const GRANT_VERSION: u8 = 2;
/// Right to read the range (READ, FILE_READ).
pub const READ: u8 = 1;
/// Right to write the range (WRITE, FILE_WRITE).
pub const WRITE: u8 = 2;
/// The grant names a disk file (`address` is its id) rather than a memory byte range.
pub const FILE: u8 = 4;
/// How far past `expires_ms` a node still honours a grant, to absorb clock differences between
/// the master and the node.
pub const CLOCK_SKEW_MS: u64 = 2_000;

const LABEL: &[u8] = b"moonkv grant";
const BODY_LEN: usize = 50;

/// Why a node refuses a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request carried no grant.
    Missing,
    /// Wrong length or version.
    Malformed,
    /// The MAC does not match: forged, altered, or for another segment or secret.
    BadMac,
    /// Past its expiry (plus the allowed clock skew).
    Expired,
    /// The grant lacks the right the operation needs, or is of the other kind (file vs range).
    WrongRight,
    /// The request reaches outside the granted range (or names another file).
    OutOfRange,
    /// The range now belongs to a replica issued after this grant's: the grant's replica was
    /// freed or replaced.
    Superseded,
    /// A read of a range its replica has not written yet (it may still hold freed bytes).
    Unwritten,
}

impl Refusal {
    /// A phrase for logs.
    pub fn describe(self) -> &'static str {
        match self {
            Refusal::Missing => "no grant",
            Refusal::Malformed => "malformed grant",
            Refusal::BadMac => "grant MAC mismatch",
            Refusal::Expired => "grant expired",
            Refusal::WrongRight => "grant lacks the right",
            Refusal::OutOfRange => "request outside the granted range",
            Refusal::Superseded => "grant for a replica that was freed or replaced",
            Refusal::Unwritten => "read of a range its replica has not written",
        }
    }
}

/// The fields of a grant, before sealing or after a successful [`Grant::open`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// [`READ`] | [`WRITE`] | [`FILE`] bits.
    pub rights: u8,
    /// UNIX milliseconds after which the grant is void.
    pub expires_ms: u64,
    /// First byte of the range, or the file id.
    pub address: u64,
    /// Bytes of the range, or the object size of the file.
    pub size: u64,
    /// First 8 bytes of SHA-256 of the tenant the grant was issued to.
    pub tenant_digest: [u8; 8],
    /// The replica the grant was issued for (0: none named).
    pub replica: u64,
    /// When the master issued it (UNIX milliseconds).
    pub issued_ms: u64,
}

/// The tenant digest carried by grants.
pub fn tenant_digest(tenant: &str) -> [u8; 8] {
    let full = Sha256::digest(tenant.as_bytes());
    let mut out = [0u8; 8];
    out.copy_from_slice(&full[..8]);
    out
}

impl Grant {
    /// A grant of `rights` over `[address, address + size)` (or file `address`) for `tenant`.
    pub fn new(rights: u8, expires_ms: u64, address: u64, size: u64, tenant: &str) -> Self {
        Self {
            rights,
            expires_ms,
            address,
            size,
            tenant_digest: tenant_digest(tenant),
            replica: 0,
            issued_ms: 0,
        }
    }

    /// The same grant, naming the replica it is for and when it was issued.
    pub fn for_replica(mut self, replica: u64, issued_ms: u64) -> Self {
        self.replica = replica;
        self.issued_ms = issued_ms;
        self
    }

    /// The order of issue: a grant with a larger key was issued later (replica ids grow within
    /// a master's life; the issue time orders grants across master restarts).
    pub fn issue_order(&self) -> (u64, u64) {
        (self.issued_ms, self.replica)
    }

    fn body(&self) -> [u8; BODY_LEN] {
        let mut body = [0u8; BODY_LEN];
        body[0] = GRANT_VERSION;
        body[1] = self.rights;
        body[2..10].copy_from_slice(&self.expires_ms.to_be_bytes());
        body[10..18].copy_from_slice(&self.address.to_be_bytes());
        body[18..26].copy_from_slice(&self.size.to_be_bytes());
        body[26..34].copy_from_slice(&self.tenant_digest);
        body[34..42].copy_from_slice(&self.replica.to_be_bytes());
        body[42..50].copy_from_slice(&self.issued_ms.to_be_bytes());
        body
    }

    /// The token for `segment` (a memory segment id, or the disk id for file grants).
    pub fn seal(&self, secret: &Secret, segment: SegmentId) -> Vec<u8> {
        let body = self.body();
        let (hi, lo) = segment_bytes(segment);
        let mac = secret.tag(&[LABEL, &hi, &lo, &body]);
        let mut token = Vec::with_capacity(GRANT_LEN);
        token.extend_from_slice(&body);
        token.extend_from_slice(&mac);
        token
    }

    /// Decodes a token presented for `segment` and checks its MAC (not its expiry or range).
    pub fn open(secret: &Secret, segment: SegmentId, token: &[u8]) -> Result<Grant, Refusal> {
        if token.is_empty() {
            return Err(Refusal::Missing);
        }
        if token.len() != GRANT_LEN || token[0] != GRANT_VERSION {
            return Err(Refusal::Malformed);
        }
        let (body, mac) = token.split_at(BODY_LEN);
        let (hi, lo) = segment_bytes(segment);
        if !secret.verify_tag(&[LABEL, &hi, &lo, body], mac) {
            return Err(Refusal::BadMac);
        }
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&body[at..at + 8]);
            u64::from_be_bytes(w)
        };
        let mut tenant_digest = [0u8; 8];
        tenant_digest.copy_from_slice(&body[26..34]);
        Ok(Grant {
            rights: body[1],
            expires_ms: word(2),
            address: word(10),
            size: word(18),
            tenant_digest,
            replica: word(34),
            issued_ms: word(42),
        })
    }

    fn usable(&self, right: u8, file: bool, now_ms: u64) -> Result<(), Refusal> {
        if now_ms > self.expires_ms.saturating_add(CLOCK_SKEW_MS) {
            return Err(Refusal::Expired);
        }
        if self.rights & right != right || (self.rights & FILE != 0) != file {
            return Err(Refusal::WrongRight);
        }
        Ok(())
    }

    /// Whether the grant allows `right` on `[address, address + length)` of a memory segment.
    pub fn permits_range(
        &self,
        right: u8,
        address: u64,
        length: u64,
        now_ms: u64,
    ) -> Result<(), Refusal> {
        self.usable(right, false, now_ms)?;
        let end = address.checked_add(length).ok_or(Refusal::OutOfRange)?;
        let granted_end = self
            .address
            .checked_add(self.size)
            .ok_or(Refusal::OutOfRange)?;
        if address < self.address || end > granted_end {
            return Err(Refusal::OutOfRange);
        }
        Ok(())
    }

    /// Whether the grant allows `right` on disk file `file_id`; the caller checks the length
    /// against [`Grant::size`].
    pub fn permits_file(&self, right: u8, file_id: u64, now_ms: u64) -> Result<(), Refusal> {
        self.usable(right, true, now_ms)?;
        if file_id != self.address {
            return Err(Refusal::OutOfRange);
        }
        Ok(())
    }
}

/// The local clock in UNIX milliseconds, as nodes compare it with `expires_ms` (a clock set
/// before 1970 reads 0).
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn segment_bytes(segment: SegmentId) -> ([u8; 8], [u8; 8]) {
    (segment.0.hi.to_be_bytes(), segment.0.lo.to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(tail: u8) -> Secret {
        let mut bytes = b"grant-test-secret-0".to_vec();
        bytes.push(tail);
        Secret::new(bytes).unwrap()
    }

    #[test]
    fn a_sealed_grant_has_the_documented_layout_and_opens() {
        let s = secret(1);
        let seg = SegmentId::new(7, 9);
        let g = Grant::new(READ | WRITE, 1_000, 0x1000, 64, "alice").for_replica(77, 900);
        let token = g.seal(&s, seg);
        assert_eq!(token.len(), GRANT_LEN);
        assert_eq!(token[0], 2);
        assert_eq!(token[1], 3);
        assert_eq!(&token[2..10], &1_000u64.to_be_bytes());
        assert_eq!(&token[10..18], &0x1000u64.to_be_bytes());
        assert_eq!(&token[18..26], &64u64.to_be_bytes());
        assert_eq!(&token[26..34], &tenant_digest("alice"));
        assert_eq!(&token[34..42], &77u64.to_be_bytes());
        assert_eq!(&token[42..50], &900u64.to_be_bytes());
        let mut mac_input = b"moonkv grant".to_vec();
        mac_input.extend_from_slice(&7u64.to_be_bytes());
        mac_input.extend_from_slice(&9u64.to_be_bytes());
        mac_input.extend_from_slice(&token[..50]);
        assert_eq!(&token[50..], &s.tag(&[&mac_input]));
        assert_eq!(Grant::open(&s, seg, &token), Ok(g));
    }

    #[test]
    fn forged_altered_or_misplaced_grants_are_refused() {
        let (s, seg) = (secret(1), SegmentId::new(7, 9));
        let token = Grant::new(READ, 1_000, 0x1000, 64, "alice").seal(&s, seg);
        assert_eq!(Grant::open(&s, seg, &[]), Err(Refusal::Missing));
        assert_eq!(
            Grant::open(&s, seg, &token[..GRANT_LEN - 1]),
            Err(Refusal::Malformed)
        );
        assert_eq!(
            Grant::open(&secret(2), seg, &token),
            Err(Refusal::BadMac),
            "another secret"
        );
        assert_eq!(
            Grant::open(&s, SegmentId::new(7, 10), &token),
            Err(Refusal::BadMac),
            "another segment"
        );
        for at in [1, 2, 10, 18, 26, 34, 42, 60] {
            let mut altered = token.clone();
            altered[at] ^= 0x80;
            assert_eq!(Grant::open(&s, seg, &altered), Err(Refusal::BadMac), "{at}");
        }
    }

    #[test]
    fn descriptors_encode_the_grant_only_when_present() {
        use crate::types::{ReplicaDescriptor, ReplicaKind, ReplicaStatus};
        let mut d = ReplicaDescriptor {
            id: crate::ReplicaId(1),
            kind: ReplicaKind::Memory,
            status: ReplicaStatus::Complete,
            size: 4,
            segment_id: SegmentId::new(1, 2),
            segment_name: "s".into(),
            endpoint: "e".into(),
            address: 8,
            grant: None,
        };
        let plain = rmp_serde::to_vec(&d).unwrap();
        assert_eq!(plain[0], 0x98, "eight fields, as before grants existed");
        assert_eq!(
            rmp_serde::from_slice::<ReplicaDescriptor>(&plain).unwrap(),
            d
        );
        d.grant = Some(vec![0xab; GRANT_LEN]);
        let granted = rmp_serde::to_vec(&d).unwrap();
        assert_eq!(granted[0], 0x99, "nine fields");
        assert_eq!(
            &granted[plain.len()..plain.len() + 2],
            &[0xc4, GRANT_LEN as u8]
        );
        assert_eq!(
            rmp_serde::from_slice::<ReplicaDescriptor>(&granted).unwrap(),
            d
        );
    }

    #[test]
    fn ranges_rights_and_expiry_are_enforced() {
        let g = Grant::new(READ, 10_000, 0x1000, 64, "t");
        assert_eq!(g.permits_range(READ, 0x1000, 64, 10_000), Ok(()));
        assert_eq!(g.permits_range(READ, 0x1010, 16, 0), Ok(()));
        assert_eq!(g.permits_range(READ, 0x1040, 0, 0), Ok(()));
        assert_eq!(
            g.permits_range(READ, 0x1001, 64, 0),
            Err(Refusal::OutOfRange)
        );
        assert_eq!(g.permits_range(READ, 0xfff, 2, 0), Err(Refusal::OutOfRange));
        assert_eq!(
            g.permits_range(READ, u64::MAX, 2, 0),
            Err(Refusal::OutOfRange)
        );
        assert_eq!(
            g.permits_range(WRITE, 0x1000, 1, 0),
            Err(Refusal::WrongRight)
        );
        assert_eq!(
            g.permits_file(READ, 0x1000, 0),
            Err(Refusal::WrongRight),
            "a range grant is not a file grant"
        );
        assert_eq!(
            g.permits_range(READ, 0x1000, 1, 10_000 + CLOCK_SKEW_MS),
            Ok(())
        );
        assert_eq!(
            g.permits_range(READ, 0x1000, 1, 10_001 + CLOCK_SKEW_MS),
            Err(Refusal::Expired)
        );
        let f = Grant::new(READ | WRITE | FILE, 10_000, 42, 100, "t");
        assert_eq!(f.permits_file(WRITE, 42, 0), Ok(()));
        assert_eq!(f.permits_file(READ, 43, 0), Err(Refusal::OutOfRange));
        assert_eq!(f.permits_range(READ, 42, 1, 0), Err(Refusal::WrongRight));
    }
}
