//! The HTTP API's bodies (Mooncake's indexer RFC #1403 names, as Conductor and Dynamo's
//! standalone indexer use them), in JSON or MessagePack.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::hash::HashProfileSpec;
use crate::keys::KeyFormat;

/// What publishes a source's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum SourceType {
    /// A vLLM engine's ZMQ publisher (optionally with its replay ROUTER).
    #[serde(rename = "vLLM")]
    Vllm,
    /// An SGLang engine's ZMQ publisher.
    #[serde(rename = "SGLang")]
    Sglang,
    /// A moonkv master's stream (snapshot recovery through its admin port when `admin` is set).
    #[serde(rename = "moonkv")]
    Moonkv,
    /// An upstream Mooncake master's stream (no snapshot: a gap drops the source's blocks).
    #[serde(rename = "Mooncake")]
    Mooncake,
}

impl SourceType {
    /// The registration name.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceType::Vllm => "vLLM",
            SourceType::Sglang => "SGLang",
            SourceType::Moonkv => "moonkv",
            SourceType::Mooncake => "Mooncake",
        }
    }

    /// Engines publish block hashes and tokens; stores publish object keys.
    pub fn is_engine(self) -> bool {
        matches!(self, SourceType::Vllm | SourceType::Sglang)
    }
}

impl<'de> Deserialize<'de> for SourceType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.to_ascii_lowercase().as_str() {
            "vllm" => Ok(SourceType::Vllm),
            "sglang" => Ok(SourceType::Sglang),
            "moonkv" => Ok(SourceType::Moonkv),
            "mooncake" => Ok(SourceType::Mooncake),
            _ => Err(de::Error::custom(format!(
                "unknown source type {s:?}; expected vLLM, SGLang, moonkv or Mooncake"
            ))),
        }
    }
}

/// How an engine source's block hashes become index hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum EngineHashes {
    /// Recompute each block's hash from its tokens with the partition's profile (works
    /// whatever hash the engine uses; needs `token_ids` in `BlockStored`).
    #[default]
    Recompute,
    /// Use the engine's hashes as they are (the engine runs the partition's profile).
    Trust,
}

/// `POST /register`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceSpec {
    /// The ZMQ PUB endpoint to subscribe to.
    pub endpoint: String,
    /// vLLM/SGLang: the replay ROUTER endpoint, used to repair gaps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_endpoint: Option<String>,
    /// The publisher type.
    #[serde(rename = "type")]
    pub source_type: SourceType,
    /// The model.
    #[serde(alias = "model_name", alias = "model")]
    pub modelname: String,
    /// LoRA adapter; empty or absent for the base model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_name: Option<String>,
    /// Tenant (`default` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    /// The router-facing instance id.
    pub instance_id: String,
    /// Tokens per block.
    pub block_size: u32,
    /// Data-parallel rank.
    #[serde(default)]
    pub dp_rank: u32,
    /// Deployment salt (a namespace, not a hash input).
    #[serde(
        default,
        alias = "additional_salt",
        skip_serializing_if = "Option::is_none"
    )]
    pub additionalsalt: Option<String>,
    /// The partition's hash profile (default: vLLM sha256_cbor with seed `0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_profile: Option<HashProfileSpec>,
    /// Engine sources: recompute hashes from tokens (default) or trust the engine's.
    #[serde(default)]
    pub engine_hashes: EngineHashes,
    /// Store sources: the connector key grammar (default: any recognized one).
    #[serde(default)]
    pub key_format: KeyFormat,
    /// moonkv sources: the master's admin address, for snapshot recovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin: Option<String>,
}

/// `POST /unregister`: every source of `instance_id` in `tenant_id` (and `dp_rank`, `type`,
/// `endpoint` when given).
#[derive(Debug, Clone, Deserialize)]
pub struct UnregisterRequest {
    /// The instance.
    pub instance_id: String,
    /// Tenant (`default` when absent).
    #[serde(default)]
    pub tenant_id: Option<String>,
    /// Only this rank.
    #[serde(default)]
    pub dp_rank: Option<u32>,
    /// Only this source type.
    #[serde(default, rename = "type")]
    pub source_type: Option<SourceType>,
    /// Only the source on this endpoint.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Accepted and ignored (RFC #1403 sends them).
    #[serde(default, alias = "model_name", alias = "model")]
    pub modelname: Option<String>,
    /// Accepted and ignored.
    #[serde(default)]
    pub lora_name: Option<String>,
    /// Accepted and ignored.
    #[serde(default)]
    pub block_size: Option<u32>,
}

/// Token ids: a JSON or MessagePack array of integers, or (MessagePack) a `bin` of
/// little-endian int32.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenIds(pub Vec<u32>);

impl<'de> Deserialize<'de> for TokenIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TokenIds;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of token ids or little-endian int32 bytes")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TokenIds, A::Error> {
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
                let mut i = 0usize;
                while let Some(t) = seq.next_element::<i64>()? {
                    v.push(u32::try_from(t).map_err(|_| {
                        de::Error::custom(format!("token_ids[{i}] = {t} is not a token id"))
                    })?);
                    i += 1;
                }
                Ok(TokenIds(v))
            }

            fn visit_bytes<E: de::Error>(self, b: &[u8]) -> Result<TokenIds, E> {
                if !b.len().is_multiple_of(4) {
                    return Err(E::custom(format!(
                        "token_ids bin of {} bytes is not whole int32 values",
                        b.len()
                    )));
                }
                b.chunks_exact(4)
                    .enumerate()
                    .map(|(i, c)| {
                        let t = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        u32::try_from(t).map_err(|_| {
                            E::custom(format!("token_ids[{i}] = {t} is not a token id"))
                        })
                    })
                    .collect::<Result<_, _>>()
                    .map(TokenIds)
            }

            fn visit_byte_buf<E: de::Error>(self, b: Vec<u8>) -> Result<TokenIds, E> {
                self.visit_bytes(&b)
            }
        }
        d.deserialize_any(V)
    }
}

/// `POST /query`.
#[derive(Debug, Clone, Deserialize)]
pub struct QueryRequest {
    /// The model.
    #[serde(alias = "modelname", alias = "model_name")]
    pub model: String,
    /// Tokens per block.
    pub block_size: u32,
    /// The prompt's token ids (only whole blocks count).
    pub token_ids: TokenIds,
    /// Tenant (`default` when absent).
    #[serde(default)]
    pub tenant_id: Option<String>,
    /// Only this instance.
    #[serde(default)]
    pub instance_id: Option<String>,
    /// LoRA adapter; absent or empty for the base model.
    #[serde(default)]
    pub lora_name: Option<String>,
    /// The request's cache salt (vLLM hashes it into the first block).
    #[serde(default)]
    pub cache_salt: Option<String>,
    /// The deployment salt the sources registered with.
    #[serde(default, alias = "additionalsalt")]
    pub additional_salt: Option<String>,
}

/// `POST /query_by_hash`: the rolling hashes instead of tokens.
#[derive(Debug, Clone, Deserialize)]
pub struct HashQueryRequest {
    /// The model.
    #[serde(alias = "modelname", alias = "model_name")]
    pub model: String,
    /// Tokens per block.
    pub block_size: u32,
    /// The prompt's block hashes, in order.
    #[serde(alias = "block_hash", alias = "block_hashes")]
    pub seq_hashes: Vec<u64>,
    /// Tenant (`default` when absent).
    #[serde(default)]
    pub tenant_id: Option<String>,
    /// Only this instance.
    #[serde(default)]
    pub instance_id: Option<String>,
    /// LoRA adapter.
    #[serde(default)]
    pub lora_name: Option<String>,
    /// The deployment salt the sources registered with.
    #[serde(default, alias = "additionalsalt")]
    pub additional_salt: Option<String>,
}

/// One instance's answer, in tokens: `GPU ≤ CPU ≤ DISK = longest_matched`, each the longest
/// prefix held in that tier or a faster one, the maximum over the instance's DP ranks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct InstanceMatch {
    /// Longest prefix held in any tier.
    pub longest_matched: u64,
    /// Held in GPU.
    #[serde(rename = "GPU")]
    pub gpu: u64,
    /// Held in GPU or CPU.
    #[serde(rename = "CPU")]
    pub cpu: u64,
    /// Held in any tier.
    #[serde(rename = "DISK")]
    pub disk: u64,
    /// Longest prefix per data-parallel rank.
    #[serde(rename = "DP")]
    pub dp: BTreeMap<String, u64>,
}

/// A query's answer: tenant → instance → match. Instances without a matched block are left out.
pub type QueryAnswer = BTreeMap<String, BTreeMap<String, InstanceMatch>>;
