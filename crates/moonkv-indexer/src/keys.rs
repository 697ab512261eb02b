//! Connector keys: the block hash that an engine's storage connector wrote into a moonkv
//! object key. moonkv's stream forwards keys verbatim (the seed subscriber guide: keys are not
//! interpreted, `seq_hashes` is empty), so the indexer reads them, by exact grammar only:
//!
//! - vLLM `MooncakeStoreConnector`:
//!   `[prefix@]model@tp_rank:N@pcpN@dcpN@pp_rank:N[@group:N]@<hex digest>`, and the vLLM Ascend
//!   forms `model@pcpN@dcpN@head_or_tp_rank:N[@pp_rank:N]@<hex digest>[@layer]`. The digest is
//!   even-length hex of at least 8 bytes (optional `0x`); its rightmost 16 hex digits are the
//!   block hash.
//! - SGLang HiCache page keys: 64 lower-case hex digits (the page's SHA-256) and a physical
//!   suffix: `_k` (MLA), `_<rank>_k`, `_<rank>_v`, `_<rank>_temporal`, `_<rank>_conv_<n>`,
//!   `_<rank>_b<n>`. Every suffix of one page names the same block.
//! - LMCache chunk keys: `model@world_size@worker_id@<chunk hash hex>@<dtype>[@layer][@tag%v...]`;
//!   the chunk hash (possibly negative, two's complement) is cut to its low 64 bits.
//! - Raw keys (upstream Mooncake's own convention): a decimal or `0x` hexadecimal u64.
//!
//! A key that fits none of these is counted by the caller and never guessed at.

use serde::{Deserialize, Serialize};

use crate::ids::BlockHash;

/// Which grammar a source's keys follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum KeyFormat {
    /// Any of the grammars below (they cannot both match one key).
    #[default]
    Auto,
    /// vLLM `MooncakeStoreConnector` (and vLLM Ascend) keys.
    Vllm,
    /// SGLang HiCache page keys.
    Sglang,
    /// LMCache chunk keys.
    Lmcache,
    /// Decimal or `0x` hexadecimal u64 keys.
    Raw,
}

impl KeyFormat {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyFormat::Auto => "auto",
            KeyFormat::Vllm => "vllm",
            KeyFormat::Sglang => "sglang",
            KeyFormat::Lmcache => "lmcache",
            KeyFormat::Raw => "raw",
        }
    }
}

/// What a recognized key says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorKey<'a> {
    /// The grammar that matched.
    pub format: KeyFormat,
    /// The block hash (low 64 bits of the connector's digest).
    pub hash: BlockHash,
    /// The model named in the key, for the grammars that carry one.
    pub model: Option<&'a str>,
}

/// Reads `key` with `format`; `None` when it does not fit.
pub fn recognize(format: KeyFormat, key: &str) -> Option<ConnectorKey<'_>> {
    match format {
        KeyFormat::Vllm => vllm(key),
        KeyFormat::Sglang => sglang(key),
        KeyFormat::Lmcache => lmcache(key),
        KeyFormat::Raw => raw(key),
        KeyFormat::Auto => vllm(key)
            .or_else(|| sglang(key))
            .or_else(|| lmcache(key))
            .or_else(|| raw(key)),
    }
}

fn digits(s: &str) -> bool {
    !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit())
}

fn after<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    s.strip_prefix(prefix).filter(|rest| digits(rest))
}

/// A vLLM rank segment; returns whether it is a tensor-parallel one.
fn rank_segment(seg: &str) -> Option<bool> {
    if after(seg, "tp_rank:").is_some() || after(seg, "head_or_tp_rank:").is_some() {
        Some(true)
    } else if after(seg, "pcp").is_some()
        || after(seg, "dcp").is_some()
        || after(seg, "pp_rank:").is_some()
        || after(seg, "group:").is_some()
    {
        Some(false)
    } else {
        None
    }
}

/// Low 64 bits of an even-length hex digest of at least 8 bytes (optional `0x`).
fn connector_digest(s: &str) -> Option<BlockHash> {
    let hex = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if hex.len() < 16 || !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    u64::from_str_radix(&hex[hex.len() - 16..], 16)
        .ok()
        .map(BlockHash)
}

fn vllm(key: &str) -> Option<ConnectorKey<'_>> {
    let segs: Vec<&str> = key.split('@').collect();
    let first_rank = segs.iter().position(|s| rank_segment(s).is_some())?;
    if first_rank == 0 || segs[first_rank - 1].is_empty() {
        return None;
    }
    let model = segs[first_rank - 1];
    // rank segments run up to the digest, which is last or followed by an Ascend layer id
    let mut end = first_rank;
    let mut tensor_rank = false;
    while end < segs.len() {
        match rank_segment(segs[end]) {
            Some(tp) => tensor_rank |= tp,
            None => break,
        }
        end += 1;
    }
    if !tensor_rank {
        return None;
    }
    let hash = match &segs[end..] {
        [digest] => connector_digest(digest)?,
        [digest, layer] if digits(layer) => connector_digest(digest)?,
        _ => return None,
    };
    Some(ConnectorKey {
        format: KeyFormat::Vllm,
        hash,
        model: Some(model),
    })
}

fn sglang(key: &str) -> Option<ConnectorKey<'_>> {
    if key.len() < 66 || !key.is_char_boundary(64) {
        return None;
    }
    let (digest, suffix) = key.split_at(64);
    if !digest
        .bytes()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    let suffix = suffix.strip_prefix('_')?;
    let valid = suffix == "k" || {
        let (rank, part) = suffix.split_once('_')?;
        digits(rank)
            && (part == "k"
                || part == "v"
                || part == "temporal"
                || after(part, "conv_").is_some()
                || after(part, "b").is_some())
    };
    if !valid {
        return None;
    }
    Some(ConnectorKey {
        format: KeyFormat::Sglang,
        hash: connector_digest(digest)?,
        model: None,
    })
}

/// Torch dtypes LMCache writes into its keys.
const LMCACHE_DTYPES: &[&str] = &[
    "half",
    "bfloat16",
    "float",
    "double",
    "int8",
    "uint8",
    "int16",
    "int32",
    "int64",
    "bool",
    "fp8_e4m3fn",
    "fp8_e4m3fnuz",
    "fp8_e5m2",
    "fp8_e5m2fnuz",
];

fn lmcache(key: &str) -> Option<ConnectorKey<'_>> {
    let segs: Vec<&str> = key.split('@').collect();
    let [model, world, worker, chunk, dtype, rest @ ..] = segs.as_slice() else {
        return None;
    };
    if model.is_empty() || !digits(world) || !digits(worker) || !LMCACHE_DTYPES.contains(dtype) {
        return None;
    }
    let tags = match rest {
        [layer, tags @ ..] if digits(layer) => tags,
        tags => tags,
    };
    if !tags.iter().all(|t| t.split_once('%').is_some()) {
        return None;
    }
    let (negative, hex) = match chunk.strip_prefix('-') {
        Some(h) => (true, h),
        None => (false, *chunk),
    };
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let low = u64::from_str_radix(&hex[hex.len().saturating_sub(16)..], 16).ok()?;
    // Python's `f"{x:x}"` writes a negative hash as '-' and its magnitude.
    let low = if negative { low.wrapping_neg() } else { low };
    Some(ConnectorKey {
        format: KeyFormat::Lmcache,
        hash: BlockHash(low),
        model: Some(model),
    })
}

fn raw(key: &str) -> Option<ConnectorKey<'_>> {
    let value = match key.strip_prefix("0x").or_else(|| key.strip_prefix("0X")) {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u64::from_str_radix(hex, 16).ok()?
        }
        Some(_) => return None,
        None if !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()) => key.parse().ok()?,
        None => return None,
    };
    Some(ConnectorKey {
        format: KeyFormat::Raw,
        hash: BlockHash(value),
        model: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DIGEST: &str = "00112233445566778899aabbccddeeff0011223344556677f0e1d2c3b4a59687";

    fn hash_of(format: KeyFormat, key: &str) -> Option<(KeyFormat, u64, Option<&str>)> {
        recognize(format, key).map(|k| (k.format, k.hash.0, k.model))
    }

    #[test]
    fn vllm_keys_in_every_documented_form() {
        let low = 0xf0e1_d2c3_b4a5_9687;
        for key in [
            format!("m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:1@{DIGEST}"),
            format!("m@tp_rank:3@pcp0@dcp0@pp_rank:0@{DIGEST}"),
            format!("prefix@m@tp_rank:0@pcp0@dcp0@pp_rank:0@0x{DIGEST}"),
            format!("m@pcp0@dcp0@head_or_tp_rank:2@pp_rank:0@{DIGEST}"),
            format!("m@pcp0@dcp0@head_or_tp_rank:2@{DIGEST}@17"),
        ] {
            assert_eq!(
                hash_of(KeyFormat::Auto, &key),
                Some((KeyFormat::Vllm, low, Some("m"))),
                "{key}"
            );
        }
        for bad in [
            format!("m@pcp0@dcp0@pp_rank:0@{DIGEST}"), // no tensor rank
            format!("@tp_rank:0@{DIGEST}"),            // no model
            "m@tp_rank:0@0123".to_string(),            // digest too short
            format!("m@tp_rank:0@{}", &DIGEST[1..]),   // odd length
            format!("m@tp_rank:x@{DIGEST}"),
            format!("m@tp_rank:0@{DIGEST}@extra"),
        ] {
            assert_eq!(hash_of(KeyFormat::Vllm, &bad), None, "{bad}");
            assert_eq!(hash_of(KeyFormat::Auto, &bad), None, "{bad}");
        }
    }

    #[test]
    fn sglang_page_keys_with_each_physical_suffix() {
        for suffix in ["_k", "_0_k", "_3_v", "_1_temporal", "_0_conv_2", "_0_b1"] {
            let key = format!("{DIGEST}{suffix}");
            assert_eq!(
                hash_of(KeyFormat::Auto, &key),
                Some((KeyFormat::Sglang, 0xf0e1_d2c3_b4a5_9687, None)),
                "{key}"
            );
        }
        for bad in [
            DIGEST.to_string(),
            format!("{DIGEST}_"),
            format!("{DIGEST}_0_q"),
            format!("{}_0_k", DIGEST.to_uppercase()),
            format!("{}_0_k", &DIGEST[2..]),
        ] {
            assert_eq!(hash_of(KeyFormat::Sglang, &bad), None, "{bad}");
        }
    }

    #[test]
    fn lmcache_chunk_keys_including_negative_hashes_layers_and_tags() {
        assert_eq!(
            hash_of(KeyFormat::Auto, "llama@2@0@1f@bfloat16"),
            Some((KeyFormat::Lmcache, 0x1f, Some("llama")))
        );
        assert_eq!(
            hash_of(KeyFormat::Auto, "llama@1@0@-1@half@3@user%alice"),
            Some((KeyFormat::Lmcache, u64::MAX, Some("llama")))
        );
        assert_eq!(
            hash_of(KeyFormat::Lmcache, "m@1@0@123456789abcdef0123@half").map(|h| h.1),
            Some(0x4567_89ab_cdef_0123)
        );
        for bad in [
            "m@1@0@zz@half",
            "m@1@0@1f@float17",
            "m@x@0@1f@half",
            "m@1@0@1f@half@tag",
            "@1@0@1f@half",
        ] {
            assert_eq!(hash_of(KeyFormat::Lmcache, bad), None, "{bad}");
        }
    }

    #[test]
    fn raw_keys_and_explicit_formats_do_not_cross() {
        assert_eq!(
            hash_of(KeyFormat::Auto, "42"),
            Some((KeyFormat::Raw, 42, None))
        );
        assert_eq!(
            hash_of(KeyFormat::Auto, "0xff"),
            Some((KeyFormat::Raw, 255, None))
        );
        assert_eq!(hash_of(KeyFormat::Raw, "0x"), None);
        assert_eq!(hash_of(KeyFormat::Raw, "18446744073709551616"), None);
        assert_eq!(hash_of(KeyFormat::Auto, "my-object"), None);
        assert_eq!(hash_of(KeyFormat::Sglang, "42"), None);
        assert_eq!(hash_of(KeyFormat::Vllm, "llama@2@0@1f@bfloat16"), None);
    }

    proptest! {
        /// Arbitrary text never panics the recognizers, and a key recognized under `auto`
        /// is recognized the same way under its own format.
        #[test]
        fn recognition_is_total_and_consistent(key in "\\PC{0,120}") {
            if let Some(k) = recognize(KeyFormat::Auto, &key) {
                let again = recognize(k.format, &key);
                prop_assert_eq!(again, Some(k));
            }
        }

        #[test]
        fn every_vllm_digest_projects_to_its_last_sixteen_digits(
            digest in "[0-9a-f]{8}([0-9a-f]{2}){4,28}", tp in 0u32..64,
        ) {
            let key = format!("model@tp_rank:{tp}@pcp0@dcp0@pp_rank:0@{digest}");
            let k = recognize(KeyFormat::Auto, &key).unwrap();
            let expected = u64::from_str_radix(&digest[digest.len() - 16..], 16).unwrap();
            prop_assert_eq!(k.hash, BlockHash(expected));
        }
    }
}
