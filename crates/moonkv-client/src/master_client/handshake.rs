//! The hello exchange of the master protocol (`docs/protocol.md`) as pure steps: which hello to
//! send and what each answer means. The async connection and the [`super::blocking`] client do
//! the I/O around it, so the rules (the first hello, the challenge, the mutual proof) live here
//! once.

use moonkv_proto::auth::{Secret, NONCE_LEN, SECRET_ENV, SECRET_FILE_ENV};
use moonkv_proto::msg::{Hello, HelloAck, HelloAuth};
use moonkv_proto::{Error, ErrorCode, Result, PROTOCOL_MAGIC, PROTOCOL_VERSION};

/// One client's side of a hello exchange.
pub struct Handshake<'a> {
    client_name: String,
    secret: Option<&'a Secret>,
    /// The challenge answered and the nonce mixed into the proof, once the proof was sent.
    proving: Option<(Vec<u8>, [u8; NONCE_LEN])>,
}

/// What to do after an answer.
#[derive(Debug)]
pub enum Step {
    /// Send this hello and hand its answer to [`Handshake::answer`].
    Send(Hello),
    /// The master accepted the client; its answer carries its version and frame limit.
    Done(HelloAck),
}

impl<'a> Handshake<'a> {
    /// A handshake that proves `secret` if the master asks for it.
    pub fn new(client_name: &str, secret: Option<&'a Secret>) -> Self {
        Self {
            client_name: client_name.to_string(),
            secret,
            proving: None,
        }
    }

    /// The first hello of a connection (no proof: the master has not challenged yet).
    pub fn first_hello(&self) -> Hello {
        Hello {
            magic: PROTOCOL_MAGIC.to_string(),
            protocol_version: PROTOCOL_VERSION,
            client_name: self.client_name.clone(),
            auth: None,
        }
    }

    /// Judges the master's answer to the last hello; `addr` names the master in errors.
    ///
    /// At most one [`Step::Send`] comes back (the proof), so a loop over this ends.
    pub fn answer(&mut self, ack: HelloAck, addr: &str) -> Result<Step> {
        if let Some((challenge, client_nonce)) = &self.proving {
            let proven = match (self.secret, ack.server_proof.as_deref()) {
                (Some(secret), Some(proof)) => secret.verify_server(challenge, client_nonce, proof),
                _ => false,
            };
            if !proven {
                return Err(Error::new(
                    ErrorCode::ILLEGAL_CLIENT,
                    format!("the master at {addr} could not prove it holds the shared secret"),
                ));
            }
            return Ok(Step::Done(ack));
        }
        let Some(challenge) = ack.challenge.clone() else {
            return Ok(Step::Done(ack));
        };
        let Some(secret) = self.secret else {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                format!(
                    "the master at {addr} requires authentication: set {SECRET_ENV} or \
                     {SECRET_FILE_ENV}"
                ),
            ));
        };
        let client_nonce: [u8; NONCE_LEN] = rand::random();
        let proof = secret.client_proof(&challenge, &client_nonce);
        self.proving = Some((challenge, client_nonce));
        Ok(Step::Send(Hello {
            auth: Some(HelloAuth {
                client_nonce: client_nonce.to_vec(),
                proof,
            }),
            ..self.first_hello()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(text: &str) -> Secret {
        Secret::new(text.as_bytes().to_vec()).unwrap()
    }

    fn ack(challenge: Option<Vec<u8>>, server_proof: Option<Vec<u8>>) -> HelloAck {
        HelloAck {
            protocol_version: PROTOCOL_VERSION,
            server_version: "test".into(),
            max_frame_bytes: 1 << 20,
            challenge,
            server_proof,
            admin_addr: None,
            local_socket: None,
        }
    }

    /// Answers the proof the way the master does, with `master_secret`.
    fn master_answer(hello: &Hello, challenge: &[u8], master_secret: &Secret) -> HelloAck {
        let auth = hello
            .auth
            .as_ref()
            .expect("the second hello carries a proof");
        assert!(master_secret.verify_client(challenge, &auth.client_nonce, &auth.proof));
        let proof = master_secret.server_proof(challenge, &auth.client_nonce);
        ack(None, Some(proof))
    }

    #[test]
    fn an_open_master_accepts_the_first_hello() {
        let mut hs = Handshake::new("c", None);
        let hello = hs.first_hello();
        assert_eq!(hello.magic, PROTOCOL_MAGIC);
        assert_eq!(hello.protocol_version, PROTOCOL_VERSION);
        assert_eq!(hello.client_name, "c");
        assert!(hello.auth.is_none());
        assert!(matches!(
            hs.answer(ack(None, None), "m").unwrap(),
            Step::Done(_)
        ));
    }

    #[test]
    fn a_challenge_is_proven_and_the_master_must_prove_back() {
        let s = secret("0123456789abcdef");
        let challenge = vec![7u8; NONCE_LEN];
        let mut hs = Handshake::new("c", Some(&s));
        let Step::Send(second) = hs.answer(ack(Some(challenge.clone()), None), "m").unwrap() else {
            panic!("a challenge asks for a second hello");
        };
        assert_eq!(second.client_name, "c");
        let nonce = second.auth.as_ref().unwrap().client_nonce.clone();
        assert_eq!(nonce.len(), NONCE_LEN);
        let answer = master_answer(&second, &challenge, &s);
        assert!(matches!(hs.answer(answer, "m").unwrap(), Step::Done(_)));

        // Nonces are fresh per handshake.
        let mut again = Handshake::new("c", Some(&s));
        let Step::Send(other) = again.answer(ack(Some(challenge), None), "m").unwrap() else {
            panic!("a challenge asks for a second hello");
        };
        assert_ne!(other.auth.unwrap().client_nonce, nonce);
    }

    #[test]
    fn a_master_without_the_secret_is_refused() {
        let s = secret("0123456789abcdef");
        let challenge = vec![7u8; NONCE_LEN];
        for server_proof in [None, Some(vec![0u8; 32])] {
            let mut hs = Handshake::new("c", Some(&s));
            assert!(matches!(
                hs.answer(ack(Some(challenge.clone()), None), "m").unwrap(),
                Step::Send(_)
            ));
            let e = hs.answer(ack(None, server_proof), "m").unwrap_err();
            assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT);
            assert!(e.message.contains("could not prove"), "{e}");
        }
        // A master proving a different secret.
        let mut hs = Handshake::new("c", Some(&s));
        let Step::Send(second) = hs.answer(ack(Some(challenge.clone()), None), "m").unwrap() else {
            panic!("a challenge asks for a second hello");
        };
        let nonce = second.auth.unwrap().client_nonce;
        let other = secret("another-secret-of-16");
        let forged = ack(None, Some(other.server_proof(&challenge, &nonce)));
        assert_eq!(
            hs.answer(forged, "m").unwrap_err().code,
            ErrorCode::ILLEGAL_CLIENT
        );
    }

    #[test]
    fn a_challenge_without_a_secret_names_the_variables() {
        let mut hs = Handshake::new("c", None);
        let e = hs
            .answer(ack(Some(vec![1; NONCE_LEN]), None), "m:1")
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT);
        assert!(
            e.message.contains("m:1")
                && e.message.contains(SECRET_ENV)
                && e.message.contains(SECRET_FILE_ENV),
            "{e}"
        );
    }
}
