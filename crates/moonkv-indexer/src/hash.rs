//! Block hashing profiles: how token ids become the chained block hashes the index is keyed by.
//!
//! - [`HashProfile::VllmSha256Cbor`]: vLLM v1's `sha256_cbor` prefix-caching hash. The root
//!   (`NONE_HASH`) is `sha256(cbor(PYTHONHASHSEED as text))`; block `i` is
//!   `sha256(cbor([parent digest as bytes, token ids as an array, extra keys or null]))` with
//!   the root as the first block's parent. Extra keys, when any, are an array: the LoRA name on
//!   every block, then the request's cache salt on the first block only (vLLM's order; its
//!   multimodal and prompt-embedding keys come from events, see [`ExtraKey`]).
//! - [`HashProfile::SglangSha256`]: SGLang HiCache's page hash, the hash its Mooncake keys
//!   carry: `sha256(previous digest || token ids as little-endian u32)`, nothing before the
//!   first page.
//!
//! Either way the index keeps [`BlockHash::from_digest`], the low 64 bits big-endian, which is
//! also what vLLM publishes with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1` (its default).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cbor;
use crate::error::IndexerError;
use crate::ids::BlockHash;

/// A full 32-byte block digest (the parent of the next block).
pub type Digest32 = [u8; 32];

/// The registration form of a profile: `{"name": "vllm_sha256_cbor", "seed": "0"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HashProfileSpec {
    /// `vllm_sha256_cbor` or `sglang_sha256`.
    pub name: String,
    /// vLLM's `PYTHONHASHSEED` (the engines must all run with the same one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<String>,
}

impl Default for HashProfileSpec {
    fn default() -> Self {
        HashProfileSpec {
            name: VLLM_SHA256_CBOR.into(),
            seed: Some(DEFAULT_SEED.into()),
        }
    }
}

/// Name of the vLLM profile.
pub const VLLM_SHA256_CBOR: &str = "vllm_sha256_cbor";
/// Name of the SGLang HiCache page profile.
pub const SGLANG_SHA256: &str = "sglang_sha256";
/// The seed assumed when a registration names none (engines started with `PYTHONHASHSEED=0`).
pub const DEFAULT_SEED: &str = "0";

/// A hashing profile, ready to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashProfile {
    /// vLLM v1 `sha256_cbor` with the root derived from `seed`.
    VllmSha256Cbor {
        /// The `PYTHONHASHSEED` text.
        seed: String,
        /// `sha256(cbor(seed))`.
        root: Digest32,
    },
    /// SGLang HiCache's page hash chain.
    SglangSha256,
}

impl HashProfile {
    /// The vLLM profile for `seed`.
    pub fn vllm(seed: &str) -> HashProfile {
        let mut h = Sha256::new();
        cbor::text(&mut h, seed);
        HashProfile::VllmSha256Cbor {
            seed: seed.to_owned(),
            root: h.finalize().into(),
        }
    }

    /// Builds a profile from its registration form.
    pub fn from_spec(spec: &HashProfileSpec) -> Result<HashProfile, IndexerError> {
        match spec.name.as_str() {
            VLLM_SHA256_CBOR => Ok(HashProfile::vllm(
                spec.seed.as_deref().unwrap_or(DEFAULT_SEED),
            )),
            SGLANG_SHA256 if spec.seed.is_none() => Ok(HashProfile::SglangSha256),
            SGLANG_SHA256 => Err(IndexerError::BadRequest(
                "hash profile sglang_sha256 takes no seed".into(),
            )),
            other => Err(IndexerError::BadRequest(format!(
                "unknown hash profile {other:?}; known: {VLLM_SHA256_CBOR}, {SGLANG_SHA256}"
            ))),
        }
    }

    /// The registration form.
    pub fn spec(&self) -> HashProfileSpec {
        match self {
            HashProfile::VllmSha256Cbor { seed, .. } => HashProfileSpec {
                name: VLLM_SHA256_CBOR.into(),
                seed: Some(seed.clone()),
            },
            HashProfile::SglangSha256 => HashProfileSpec {
                name: SGLANG_SHA256.into(),
                seed: None,
            },
        }
    }

    /// The parent of the first block, if the profile has one.
    pub fn root(&self) -> Option<Digest32> {
        match self {
            HashProfile::VllmSha256Cbor { root, .. } => Some(*root),
            HashProfile::SglangSha256 => None,
        }
    }

    /// Hashes one full block after `parent` (`None`: the first block).
    pub fn block(&self, parent: Option<&Digest32>, tokens: &[u32], extra: Extra<'_>) -> Digest32 {
        self.block_with(&mut Vec::new(), parent, tokens, extra)
    }

    /// [`HashProfile::block`] with a reusable buffer: the whole input is encoded first and
    /// hashed in one call, which halves the cost of a block against many small updates.
    pub fn block_with(
        &self,
        scratch: &mut Vec<u8>,
        parent: Option<&Digest32>,
        tokens: &[u32],
        extra: Extra<'_>,
    ) -> Digest32 {
        scratch.clear();
        match self {
            HashProfile::VllmSha256Cbor { root, .. } => {
                cbor::array(scratch, 3);
                cbor::bytes(scratch, parent.unwrap_or(root));
                cbor::token_array(scratch, tokens);
                extra.write(scratch);
            }
            HashProfile::SglangSha256 => {
                if let Some(p) = parent {
                    scratch.extend_from_slice(p);
                }
                for t in tokens {
                    scratch.extend_from_slice(&t.to_le_bytes());
                }
            }
        }
        Sha256::digest(scratch.as_slice()).into()
    }

    /// Whether the profile reads LoRA names and cache salts into the hash.
    pub fn hashes_extras(&self) -> bool {
        matches!(self, HashProfile::VllmSha256Cbor { .. })
    }
}

/// The extra keys of one block.
#[derive(Debug, Clone, Copy)]
pub enum Extra<'a> {
    /// A request's LoRA name and cache salt (the salt only on the first block).
    Request {
        /// LoRA adapter name, if any.
        lora_name: Option<&'a str>,
        /// The request's cache salt, if this is the first block and one was given.
        cache_salt: Option<&'a str>,
    },
    /// Keys exactly as an engine reported them for this block (`extra_keys` of vLLM's
    /// `BlockStored`); `None` is vLLM's `None`.
    Reported(Option<&'a [ExtraKey]>),
}

impl Extra<'_> {
    /// Appends the CBOR of these extra keys, exactly as `profile`'s block hash reads them
    /// (nothing for a profile that ignores extras).
    pub fn encode_for(&self, profile: &HashProfile, out: &mut Vec<u8>) {
        if profile.hashes_extras() {
            self.write(out);
        }
    }

    fn write(&self, h: &mut impl cbor::Sink) {
        match *self {
            Extra::Request {
                lora_name,
                cache_salt,
            } => {
                let lora = lora_name.filter(|s| !s.is_empty());
                let salt = cache_salt.filter(|s| !s.is_empty());
                let n = usize::from(lora.is_some()) + usize::from(salt.is_some());
                if n == 0 {
                    cbor::null(h);
                    return;
                }
                cbor::array(h, n);
                for key in [lora, salt].into_iter().flatten() {
                    cbor::text(h, key);
                }
            }
            Extra::Reported(None) => cbor::null(h),
            Extra::Reported(Some(keys)) => {
                cbor::array(h, keys.len());
                for k in keys {
                    k.write(h);
                }
            }
        }
    }
}

/// One extra-key value as an engine reports it (a MessagePack value of the kinds vLLM puts
/// there: strings, integers, byte strings, tuples, `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtraKey {
    /// `None`.
    Nil,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A string (LoRA name, cache salt, multimodal identifier).
    Text(String),
    /// A byte string (prompt-embedding digest).
    Bytes(Vec<u8>),
    /// A tuple (multimodal `(identifier, offset)`).
    Array(Vec<ExtraKey>),
}

impl ExtraKey {
    fn write(&self, h: &mut impl cbor::Sink) {
        match self {
            ExtraKey::Nil => cbor::null(h),
            ExtraKey::Bool(b) => cbor::boolean(h, *b),
            ExtraKey::Int(i) => cbor::int(h, *i),
            ExtraKey::Text(s) => cbor::text(h, s),
            ExtraKey::Bytes(b) => cbor::bytes(h, b),
            ExtraKey::Array(items) => {
                cbor::array(h, items.len());
                for i in items {
                    i.write(h);
                }
            }
        }
    }
}

/// Walks a token sequence block by block, yielding each full block's [`BlockHash`] (a trailing
/// partial block yields nothing). Lazy, so a query can stop at the first miss.
pub struct Chain<'a> {
    profile: &'a HashProfile,
    tokens: &'a [u32],
    block_size: usize,
    lora_name: Option<&'a str>,
    cache_salt: Option<&'a str>,
    parent: Option<Digest32>,
    next: usize,
    scratch: Vec<u8>,
}

impl<'a> Chain<'a> {
    /// A chain over `tokens`. `block_size` must be positive.
    pub fn new(
        profile: &'a HashProfile,
        tokens: &'a [u32],
        block_size: usize,
        lora_name: Option<&'a str>,
        cache_salt: Option<&'a str>,
    ) -> Chain<'a> {
        Chain {
            profile,
            tokens,
            block_size: block_size.max(1),
            lora_name,
            cache_salt,
            parent: None,
            next: 0,
            scratch: Vec::with_capacity(64 + 5 * block_size),
        }
    }

    /// Full blocks in the sequence.
    pub fn len(&self) -> usize {
        self.tokens.len() / self.block_size
    }

    /// True when there is no full block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next block's full digest.
    pub fn next_digest(&mut self) -> Option<Digest32> {
        if self.next >= self.len() {
            return None;
        }
        let start = self.next * self.block_size;
        let block = &self.tokens[start..start + self.block_size];
        let extra = Extra::Request {
            lora_name: self.lora_name,
            cache_salt: if self.next == 0 {
                self.cache_salt
            } else {
                None
            },
        };
        let digest = self
            .profile
            .block_with(&mut self.scratch, self.parent.as_ref(), block, extra);
        self.parent = Some(digest);
        self.next += 1;
        Some(digest)
    }
}

impl Iterator for Chain<'_> {
    type Item = BlockHash;

    fn next(&mut self) -> Option<BlockHash> {
        self.next_digest().map(|d| BlockHash::from_digest(&d))
    }
}

/// Lower-case hex of a digest.
pub fn hex(digest: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(digest.len() * 2);
    for b in digest {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(bytes: &[u8]) -> Digest32 {
        Sha256::digest(bytes).into()
    }

    #[test]
    fn vllm_root_is_the_hash_of_the_seed_as_cbor_text() {
        let HashProfile::VllmSha256Cbor { root, .. } = HashProfile::vllm("0") else {
            unreachable!()
        };
        // cbor("0") = 0x61 '0'
        assert_eq!(root, sha(&[0x61, b'0']));
    }

    #[test]
    fn vllm_block_input_is_the_canonical_tuple() {
        let p = HashProfile::vllm("42");
        let root = p.root().unwrap();
        let d = p.block(None, &[1, 300], Extra::Reported(None));
        let mut expected = vec![0x83, 0x58, 0x20];
        expected.extend_from_slice(&root);
        expected.extend_from_slice(&[0x82, 0x01, 0x19, 0x01, 0x2c, 0xf6]);
        assert_eq!(d, sha(&expected));
        // a salted LoRA request on its first block
        let d = p.block(
            Some(&root),
            &[7],
            Extra::Request {
                lora_name: Some("a"),
                cache_salt: Some("s"),
            },
        );
        let mut expected = vec![0x83, 0x58, 0x20];
        expected.extend_from_slice(&root);
        expected.extend_from_slice(&[0x81, 0x07, 0x82, 0x61, b'a', 0x61, b's']);
        assert_eq!(d, sha(&expected));
    }

    #[test]
    fn reported_extras_equal_request_extras_when_they_say_the_same() {
        let p = HashProfile::vllm("0");
        let keys = [ExtraKey::Text("lora".into()), ExtraKey::Text("salt".into())];
        let a = p.block(None, &[5; 16], Extra::Reported(Some(&keys)));
        let b = p.block(
            None,
            &[5; 16],
            Extra::Request {
                lora_name: Some("lora"),
                cache_salt: Some("salt"),
            },
        );
        assert_eq!(a, b);
        let empty = Extra::Request {
            lora_name: Some(""),
            cache_salt: None,
        };
        assert_eq!(
            p.block(None, &[5; 16], empty),
            p.block(None, &[5; 16], Extra::Reported(None))
        );
    }

    #[test]
    fn chain_salts_only_the_first_block_and_skips_the_partial_tail() {
        let p = HashProfile::vllm("0");
        let tokens: Vec<u32> = (0..40).collect();
        let salted: Vec<BlockHash> = Chain::new(&p, &tokens, 16, None, Some("x")).collect();
        let plain: Vec<BlockHash> = Chain::new(&p, &tokens, 16, None, None).collect();
        assert_eq!(salted.len(), 2);
        assert_ne!(salted[0], plain[0]);
        // block 1 differs only through its parent
        let root = p.root().unwrap();
        let first = p.block(
            None,
            &tokens[..16],
            Extra::Request {
                lora_name: None,
                cache_salt: Some("x"),
            },
        );
        let from_root = p.block(
            Some(&root),
            &tokens[..16],
            Extra::Request {
                lora_name: None,
                cache_salt: Some("x"),
            },
        );
        assert_eq!(first, from_root);
        let second = p.block(Some(&first), &tokens[16..32], Extra::Reported(None));
        assert_eq!(salted[1], BlockHash::from_digest(&second));
    }

    #[test]
    fn sglang_pages_chain_raw_digests_over_little_endian_tokens() {
        let p = HashProfile::SglangSha256;
        let first = p.block(None, &[1, 2], Extra::Reported(None));
        assert_eq!(first, sha(&[1, 0, 0, 0, 2, 0, 0, 0]));
        let second = p.block(Some(&first), &[3], Extra::Reported(None));
        let mut input = first.to_vec();
        input.extend_from_slice(&[3, 0, 0, 0]);
        assert_eq!(second, sha(&input));
        assert!(!p.hashes_extras());
    }

    #[test]
    fn specs_round_trip_and_reject_unknown_names() {
        for spec in [
            HashProfileSpec::default(),
            HashProfileSpec {
                name: SGLANG_SHA256.into(),
                seed: None,
            },
        ] {
            assert_eq!(HashProfile::from_spec(&spec).unwrap().spec(), spec);
        }
        let bad = HashProfileSpec {
            name: "md5".into(),
            seed: None,
        };
        assert!(HashProfile::from_spec(&bad).is_err());
        assert_eq!(hex(&[0x0a, 0xff]), "0aff");
    }
}
