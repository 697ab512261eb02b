//! The small values the index is made of: block hashes, tiers, source slots and partitions.

use serde::{Deserialize, Serialize};

/// A block's 64-bit identity in the index: the low 64 bits (big-endian) of its chained digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BlockHash(pub u64);

impl BlockHash {
    /// The projection every producer agrees on: the last eight bytes of a digest, big-endian.
    /// Shorter inputs are left-padded with zeros.
    pub fn from_digest(digest: &[u8]) -> BlockHash {
        let mut low = [0u8; 8];
        let take = digest.len().min(8);
        low[8 - take..].copy_from_slice(&digest[digest.len() - take..]);
        BlockHash(u64::from_be_bytes(low))
    }
}

/// A cache tier as routers see it. Order matters: a block in a faster tier counts for the
/// slower tiers' cumulative matches too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Accelerator memory of an engine.
    Gpu,
    /// Host memory: an engine's CPU offload or the pool's memory replicas.
    Cpu,
    /// Disk-class storage: the pool's disk replicas, an engine's external storage.
    Disk,
}

impl Tier {
    /// Every tier, fastest first.
    pub const ALL: [Tier; 3] = [Tier::Gpu, Tier::Cpu, Tier::Disk];

    /// This tier's bit in a [`TierMask`].
    pub const fn bit(self) -> u8 {
        match self {
            Tier::Gpu => 1,
            Tier::Cpu => 2,
            Tier::Disk => 4,
        }
    }

    /// Maps a producer's `medium` string, case-insensitively: vLLM's `GPU`/`CPU`/`STORAGE`,
    /// SGLang's `GPU`/`CPU_PINNED`/`DISK`/`EXTERNAL`, moonkv's and Mooncake's `cpu`/`disk`.
    pub fn from_medium(medium: &str) -> Option<Tier> {
        let m = medium.trim();
        let eq = |s: &str| m.eq_ignore_ascii_case(s);
        if eq("gpu") || eq("device") || eq("hbm") || eq("npu") {
            Some(Tier::Gpu)
        } else if eq("cpu") || eq("cpu_pinned") || eq("host") || eq("dram") {
            Some(Tier::Cpu)
        } else if eq("disk") || eq("storage") || eq("external") || eq("ssd") {
            Some(Tier::Disk)
        } else {
            None
        }
    }

    /// The lower-case name used in metrics and dumps.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Gpu => "gpu",
            Tier::Cpu => "cpu",
            Tier::Disk => "disk",
        }
    }
}

/// A set of tiers as bits (`Tier::bit`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TierMask(pub u8);

impl TierMask {
    /// No tier.
    pub const EMPTY: TierMask = TierMask(0);

    /// Whether `tier` is in the set.
    pub fn contains(self, tier: Tier) -> bool {
        self.0 & tier.bit() != 0
    }

    /// True when no tier is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The set with `tier` added.
    pub fn with(self, tier: Tier) -> TierMask {
        TierMask(self.0 | tier.bit())
    }

    /// The set with `tier` removed.
    pub fn without(self, tier: Tier) -> TierMask {
        TierMask(self.0 & !tier.bit())
    }
}

/// A registered source's slot in the index: what a block's holder list refers to. Slots are
/// never reused while the process lives, so a stale slot can never name a new source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct SourceSlot(pub u32);

/// Where a router sends a request: an instance and the data-parallel rank inside it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Worker {
    /// The router-facing instance id given at registration.
    pub instance_id: String,
    /// The data-parallel rank.
    pub dp_rank: u32,
}

/// The namespace one prefix index covers: blocks from different partitions never match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct PartitionKey {
    /// Tenant (`default` when not given).
    pub tenant_id: String,
    /// Model name.
    pub model: String,
    /// LoRA adapter name; empty for the base model.
    pub lora_name: String,
    /// Tokens per block.
    pub block_size: u32,
    /// The deployment's additional salt (a namespace, not a hash input); empty for none.
    pub additional_salt: String,
}

/// The tenant used when a request or registration names none.
pub const DEFAULT_TENANT: &str = "default";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projection_takes_the_last_eight_bytes_big_endian() {
        let mut digest = [0u8; 32];
        digest[24..].copy_from_slice(&0x0123_4567_89ab_cdefu64.to_be_bytes());
        digest[0] = 0xff;
        assert_eq!(
            BlockHash::from_digest(&digest),
            BlockHash(0x0123_4567_89ab_cdef)
        );
        assert_eq!(BlockHash::from_digest(&[1, 2]), BlockHash(0x0102));
        assert_eq!(BlockHash::from_digest(&[]), BlockHash(0));
    }

    #[test]
    fn media_map_to_tiers_case_insensitively() {
        assert_eq!(Tier::from_medium("GPU"), Some(Tier::Gpu));
        assert_eq!(Tier::from_medium("CPU_PINNED"), Some(Tier::Cpu));
        assert_eq!(Tier::from_medium("cpu"), Some(Tier::Cpu));
        assert_eq!(Tier::from_medium("STORAGE"), Some(Tier::Disk));
        assert_eq!(Tier::from_medium("External"), Some(Tier::Disk));
        assert_eq!(Tier::from_medium("tape"), None);
        let m = TierMask::EMPTY.with(Tier::Gpu).with(Tier::Disk);
        assert!(m.contains(Tier::Gpu) && !m.contains(Tier::Cpu) && m.contains(Tier::Disk));
        assert!(m.without(Tier::Gpu).without(Tier::Disk).is_empty());
    }
}
