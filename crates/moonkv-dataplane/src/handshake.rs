//! The authentication handshake that opens a data-plane connection when the caller has the
//! shared secret (layout in `docs/data-plane.md`). One round trip: the caller's hello carries
//! its nonce; the node answers with its challenge and its own proof; the caller's proof then
//! goes out ahead of its first request, without waiting.

use moonkv_proto::auth::NONCE_LEN;

/// First four bytes of a hello and of its answer: `MKVH`.
pub const HELLO_MAGIC: [u8; 4] = *b"MKVH";
/// Hello length in bytes.
pub const HELLO_LEN: usize = 24;
/// Answer length in bytes.
pub const ANSWER_LEN: usize = 56;
/// Length of the caller's proof, sent after the answer when the node asks for it.
pub const PROOF_LEN: usize = 32;
/// Version of the handshake layout.
pub const HANDSHAKE_VERSION: u8 = 1;

/// What the node's answer asks of the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The node has no secret: requests follow directly.
    Open = 0,
    /// The caller must send its proof before its first request.
    ProofRequired = 1,
}

/// Encodes a hello: `MKVH`, version, three zero bytes, the caller's nonce.
pub fn hello(client_nonce: &[u8; NONCE_LEN]) -> [u8; HELLO_LEN] {
    let mut out = [0u8; HELLO_LEN];
    out[0..4].copy_from_slice(&HELLO_MAGIC);
    out[4] = HANDSHAKE_VERSION;
    out[8..24].copy_from_slice(client_nonce);
    out
}

/// The caller's nonce from a hello; `None` for a wrong magic or version.
pub fn hello_nonce(bytes: &[u8; HELLO_LEN]) -> Option<[u8; NONCE_LEN]> {
    if bytes[0..4] != HELLO_MAGIC || bytes[4] != HANDSHAKE_VERSION {
        return None;
    }
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&bytes[8..24]);
    Some(nonce)
}

/// The node's answer to a hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// Whether a proof is required.
    pub mode: Mode,
    /// The node's random challenge (zeros when open).
    pub challenge: [u8; NONCE_LEN],
    /// `HMAC(secret, "moonkv server" ‖ challenge ‖ client_nonce)` (zeros when open).
    pub server_proof: [u8; PROOF_LEN],
}

impl Answer {
    /// The answer of a node without a secret.
    pub fn open() -> Self {
        Self {
            mode: Mode::Open,
            challenge: [0; NONCE_LEN],
            server_proof: [0; PROOF_LEN],
        }
    }

    /// Encodes the answer: `MKVH`, version, mode, two zero bytes, challenge, server proof.
    pub fn encode(&self) -> [u8; ANSWER_LEN] {
        let mut out = [0u8; ANSWER_LEN];
        out[0..4].copy_from_slice(&HELLO_MAGIC);
        out[4] = HANDSHAKE_VERSION;
        out[5] = self.mode as u8;
        out[8..24].copy_from_slice(&self.challenge);
        out[24..56].copy_from_slice(&self.server_proof);
        out
    }

    /// Decodes an answer; `None` for a wrong magic, version or mode.
    pub fn decode(bytes: &[u8; ANSWER_LEN]) -> Option<Answer> {
        if bytes[0..4] != HELLO_MAGIC || bytes[4] != HANDSHAKE_VERSION {
            return None;
        }
        let mode = match bytes[5] {
            0 => Mode::Open,
            1 => Mode::ProofRequired,
            _ => return None,
        };
        let mut answer = Answer::open();
        answer.mode = mode;
        answer.challenge.copy_from_slice(&bytes[8..24]);
        answer.server_proof.copy_from_slice(&bytes[24..56]);
        Some(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_and_answer_have_the_documented_layout() {
        let h = hello(&[5; NONCE_LEN]);
        assert_eq!(&h[..8], b"MKVH\x01\x00\x00\x00");
        assert_eq!(hello_nonce(&h), Some([5; NONCE_LEN]));
        let a = Answer {
            mode: Mode::ProofRequired,
            challenge: [1; NONCE_LEN],
            server_proof: [2; PROOF_LEN],
        };
        let bytes = a.encode();
        assert_eq!(&bytes[..8], b"MKVH\x01\x01\x00\x00");
        assert_eq!(&bytes[8..24], &[1; NONCE_LEN]);
        assert_eq!(&bytes[24..], &[2; PROOF_LEN]);
        assert_eq!(Answer::decode(&bytes), Some(a));
        let mut bad = bytes;
        bad[5] = 9;
        assert_eq!(Answer::decode(&bad), None);
        let mut bad = h;
        bad[4] = 2;
        assert_eq!(hello_nonce(&bad), None);
    }
}
