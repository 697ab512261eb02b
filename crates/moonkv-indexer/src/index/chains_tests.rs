//! The chain cache must never change an answer: digests taken from it equal SHA-256's, for
//! any tokens, extras, partitions, cache sizes, ingest orders and partial knowledge.

use proptest::prelude::*;

use super::*;
use crate::api::{EngineHashes, HashQueryRequest, QueryRequest, SourceSpec, SourceType, TokenIds};
use crate::hash::{Chain, ExtraKey};
use crate::keys::KeyFormat;
use crate::source::engine::EngineBlocks;
use crate::state::Indexer;
use crate::wire::{EngineEvent, StoredBlocks};

const BS: usize = 2;

fn key(lora: &str, tenant: &str) -> PartitionKey {
    PartitionKey {
        tenant_id: tenant.into(),
        model: "m".into(),
        lora_name: lora.into(),
        block_size: BS as u32,
        additional_salt: String::new(),
    }
}

/// Prompts over a tiny alphabet, so that they share prefixes and blocks repeat.
fn prompts() -> impl Strategy<Value = Vec<Vec<u32>>> {
    proptest::collection::vec(proptest::collection::vec(0u32..3, 0..24), 1..6)
}

fn name(i: u8) -> Option<&'static str> {
    [None, Some("a"), Some("b")][usize::from(i % 3)]
}

fn sha_chain(
    p: &HashProfile,
    tokens: &[u32],
    lora: Option<&str>,
    salt: Option<&str>,
) -> Vec<Digest32> {
    let mut c = Chain::new(p, tokens, BS, lora, salt);
    std::iter::from_fn(|| c.next_digest()).collect()
}

#[test]
fn a_second_query_takes_every_digest_from_the_cache() {
    let cache = ChainCache::new(1024);
    let p = HashProfile::vllm("0");
    let root = cache.root(&key("", "default"), &p);
    let tokens: Vec<u32> = (0..21).collect();
    let expected = sha_chain(&p, &tokens, Some("l"), Some("s"));
    for round in 0..2 {
        let mut c = CachedChain::new(&cache, root, &p, &tokens, BS, Some("l"), Some("s"));
        let got: Vec<_> = std::iter::from_fn(|| c.next_digest()).collect();
        assert_eq!(got, expected);
        assert_eq!(c.hits(), if round == 0 { 0 } else { 10 });
        c.finish();
    }
    assert_eq!(cache.stats().hits.get(), 10);
    assert_eq!(cache.stats().misses.get(), 10);
    assert_eq!(cache.len(), 10);
}

#[test]
fn partitions_and_profiles_have_their_own_roots() {
    let cache = ChainCache::new(16);
    let (p0, p1) = (HashProfile::vllm("0"), HashProfile::vllm("1"));
    let roots = [
        cache.root(&key("", "default"), &p0),
        cache.root(&key("", "default"), &p1),
        cache.root(&key("a", "default"), &p0),
        cache.root(&key("", "other"), &p0),
        cache.root(&key("", "default"), &HashProfile::SglangSha256),
    ];
    for i in 0..roots.len() {
        for j in 0..i {
            assert_ne!(roots[i], roots[j], "{i} {j}");
        }
    }
    // another process draws another key
    assert_ne!(ChainCache::new(16).root(&key("", "default"), &p0), roots[0]);
}

#[test]
fn generations_are_bounded_and_keep_what_is_used() {
    let mut g = Generations::new(4);
    for k in 0..4u64 {
        g.insert(k, k);
    }
    // the fifth entry starts a new generation; the full one becomes the previous
    g.insert(4, 4);
    assert_eq!(g.len(), 5);
    assert_eq!(g.get(0), Some((0, true)));
    assert_eq!(g.get(4), Some((4, false)));
    for k in 5..8 {
        g.insert(k, k);
    }
    // full again: 0..4 are dropped, and their table is reused for 8 on
    g.insert(8, 8);
    assert_eq!(g.get(0), None);
    assert_eq!(g.get(5), Some((5, true)));
    assert_eq!(g.get(8), Some((8, false)));
    assert_eq!(g.len(), 5);
    for k in 9..12 {
        g.insert(k, k);
    }
    g.insert(12, 12);
    assert_eq!(g.get(4), None);
    assert_eq!(g.get(8), Some((8, true)));
    assert_eq!(g.len(), 5);
    let mut off = Generations::new(0);
    off.insert(1, 1);
    assert!(off.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any interleaving of partial and whole queries, over prompts sharing prefixes, with
    /// LoRA names and salts, two profiles and a cache small enough to evict: every digest the
    /// cached chain yields is SHA-256's.
    #[test]
    fn cached_chains_yield_the_sha_digests(
        prompts in prompts(),
        steps in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), 0usize..16, any::<bool>()), 1..40),
        capacity in 0usize..40,
    ) {
        let cache = ChainCache::new(capacity);
        let profiles = [HashProfile::vllm("0"), HashProfile::SglangSha256];
        for (which, lora, salt, take, sglang) in steps {
            let tokens = &prompts[usize::from(which) % prompts.len()];
            let p = &profiles[usize::from(sglang)];
            let (lora, salt) = (name(lora), name(salt));
            let (lora, salt) = if p.hashes_extras() { (lora, salt) } else { (None, None) };
            let root = cache.root(&key(lora.unwrap_or_default(), "default"), p);
            let expected = sha_chain(p, tokens, lora, salt);
            let mut c = CachedChain::new(&cache, root, p, tokens, BS, lora, salt);
            for want in expected.iter().take(take) {
                prop_assert_eq!(c.next_digest(), Some(*want));
            }
            c.finish();
            prop_assert!(cache.len() <= capacity.div_ceil(2) * 2);
        }
    }
}

fn spec(i: u32, mode: EngineHashes, lora: Option<&str>) -> SourceSpec {
    SourceSpec {
        endpoint: format!("tcp://e{i}:1"),
        replay_endpoint: None,
        source_type: SourceType::Vllm,
        modelname: "m".into(),
        lora_name: lora.map(str::to_owned),
        tenant_id: None,
        instance_id: format!("e{i}"),
        block_size: BS as u32,
        dp_rank: 0,
        additionalsalt: None,
        hash_profile: None,
        engine_hashes: mode,
        key_format: KeyFormat::Auto,
        admin: None,
    }
}

/// One engine's store: blocks `from..to` of a prompt (true hashes; `tokens`: whether the event
/// carries them; `lie`: a trusted engine reporting hashes of another profile).
#[derive(Debug, Clone)]
struct Store {
    engine: u8,
    prompt: u8,
    lora: u8,
    /// A cache salt, reported in `extra_keys` (with the LoRA name) when the chain starts here.
    salt: u8,
    from: usize,
    len: usize,
    tokens: bool,
    lie: bool,
}

fn store() -> impl Strategy<Value = Store> {
    (
        (0u8..4, any::<u8>(), any::<u8>(), any::<u8>()),
        (
            0usize..12,
            1usize..12,
            any::<bool>(),
            proptest::bool::weighted(0.1),
        ),
    )
        .prop_map(
            |((engine, prompt, lora, salt), (from, len, tokens, lie))| Store {
                engine,
                prompt,
                lora,
                salt,
                from,
                len,
                tokens,
                lie,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Engines in `recompute` and `trust` mode store chains in random order (parents missing,
    /// tokens sometimes absent, a lying engine), with LoRA partitions and a small cache; every
    /// query's answer equals the one from SHA-256 hashes walked through `/query_by_hash`.
    #[test]
    fn answers_with_the_cache_equal_answers_from_sha(
        prompts in prompts(),
        stores in proptest::collection::vec(store(), 0..30),
        queries in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), 0usize..6), 1..20),
        capacity in prop_oneof![Just(0usize), 1usize..16, Just(4096)],
    ) {
        let ix = Indexer::with_chain_cache(capacity);
        let profile = HashProfile::vllm("0");
        let liar = HashProfile::vllm("1");
        let mut engines: Vec<EngineBlocks> = Vec::new();
        for i in 0..4u32 {
            // 0, 1: recompute; 2, 3: trust
            let mode = if i < 2 { EngineHashes::Recompute } else { EngineHashes::Trust };
            let s = spec(i, mode, None);
            let slot = ix.add(s.clone(), &profile).unwrap();
            engines.push(EngineBlocks::new(slot, s, profile.clone()));
        }
        for st in &stores {
            let tokens = &prompts[usize::from(st.prompt) % prompts.len()];
            let lora = name(st.lora);
            let p = if st.lie { &liar } else { &profile };
            let salt = name(st.salt).filter(|_| st.from == 0);
            let chain: Vec<BlockHash> = Chain::new(p, tokens, BS, lora, salt).collect();
            let to = (st.from + st.len).min(chain.len());
            if st.from >= to {
                continue;
            }
            let extra_keys = salt.map(|s| {
                (st.from..to)
                    .map(|i| {
                        let keys: Vec<ExtraKey> = lora
                            .into_iter()
                            .chain((i == 0).then_some(s))
                            .map(|k| ExtraKey::Text(k.into()))
                            .collect();
                        (!keys.is_empty()).then_some(keys)
                    })
                    .collect()
            });
            let ev = EngineEvent::Stored(StoredBlocks {
                block_hashes: chain[st.from..to].to_vec(),
                parent: st.from.checked_sub(1).map(|i| chain[i]),
                token_ids: if st.tokens || usize::from(st.engine) < 2 {
                    tokens[st.from * BS..to * BS].to_vec()
                } else {
                    Vec::new()
                },
                block_size: Some(BS as u32),
                lora_name: lora.map(str::to_owned),
                medium: None,
                extra_keys,
            });
            // refusals (unknown parents) are part of the game
            let _ = engines[usize::from(st.engine)].apply(ix.index(), &ev);
        }
        for (which, lora, salt, cut) in queries {
            let base = &prompts[usize::from(which) % prompts.len()];
            let tokens: Vec<u32> = base[..base.len().saturating_sub(cut)].to_vec();
            let (lora, salt) = (name(lora), name(salt));
            let req = QueryRequest {
                model: "m".into(),
                block_size: BS as u32,
                token_ids: TokenIds(tokens.clone()),
                tenant_id: None,
                instance_id: None,
                lora_name: lora.map(str::to_owned),
                cache_salt: salt.map(str::to_owned),
                additional_salt: None,
            };
            let by_hash = HashQueryRequest {
                model: "m".into(),
                block_size: BS as u32,
                seq_hashes: Chain::new(&profile, &tokens, BS, lora, salt).map(|h| h.0).collect(),
                tenant_id: None,
                instance_id: None,
                lora_name: lora.map(str::to_owned),
                additional_salt: None,
            };
            // twice: cold, then with whatever the first recorded
            for _ in 0..2 {
                prop_assert_eq!(ix.query(&req).unwrap(), ix.query_by_hash(&by_hash).unwrap());
            }
        }
    }
}
