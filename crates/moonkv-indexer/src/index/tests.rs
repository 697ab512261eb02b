//! Model-based tests: random stores, removals, source drops and queries against the index and
//! a deliberately simple reference, comparing every query's answer.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use super::*;
use crate::hash::HashProfile;

/// Chains sharing prefixes: 0 and 1 share three blocks, 2 shares one with both.
const CHAINS: [[u64; 6]; 3] = [
    [11, 12, 13, 14, 15, 16],
    [11, 12, 13, 24, 25, 26],
    [11, 32, 33, 34, 35, 36],
];

/// Slot → worker: slots 0 and 1 report for worker 0 (an engine and the pool), 2 for worker 1,
/// 3 for worker 2.
const WORKER_OF: [Option<u32>; 4] = [Some(0), Some(0), Some(1), Some(2)];

#[derive(Debug, Clone)]
enum Op {
    Store {
        slot: u32,
        chain: usize,
        depth: usize,
        tier: Tier,
    },
    Remove {
        slot: u32,
        chain: usize,
        depth: usize,
        tier: Tier,
    },
    DropSource {
        slot: u32,
    },
    Query {
        chain: usize,
        len: usize,
    },
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![Just(Tier::Gpu), Just(Tier::Cpu), Just(Tier::Disk)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u32..4, 0usize..3, 0usize..6, tier())
            .prop_map(|(slot, chain, depth, tier)| Op::Store { slot, chain, depth, tier }),
        3 => (0u32..4, 0usize..3, 0usize..6, tier())
            .prop_map(|(slot, chain, depth, tier)| Op::Remove { slot, chain, depth, tier }),
        1 => (0u32..4).prop_map(|slot| Op::DropSource { slot }),
        3 => (0usize..3, 0usize..7).prop_map(|(chain, len)| Op::Query { chain, len }),
    ]
}

/// The reference: a set of (slot, hash, tier) and a per-block scan.
#[derive(Default)]
struct Model {
    held: BTreeSet<(u32, u64, Tier)>,
}

impl Model {
    fn mask(&self, worker: u32, hash: u64) -> (bool, bool, bool) {
        let mut m = (false, false, false);
        for (slot, w) in WORKER_OF.iter().enumerate() {
            if *w != Some(worker) {
                continue;
            }
            let has = |t| self.held.contains(&(slot as u32, hash, t));
            m.0 |= has(Tier::Gpu);
            m.1 |= has(Tier::Gpu) || has(Tier::Cpu);
            m.2 |= has(Tier::Gpu) || has(Tier::Cpu) || has(Tier::Disk);
        }
        m
    }

    fn query(&self, hashes: &[u64], contiguous: bool) -> BTreeMap<u32, WorkerRun> {
        let mut out = BTreeMap::new();
        for worker in 0..3 {
            let mut run = WorkerRun::default();
            let (mut g, mut c, mut d) = (true, true, true);
            for &h in hashes {
                let (hg, hc, hd) = self.mask(worker, h);
                // `contiguous == false` is the planted bug: counting holes as matches
                g = (g || !contiguous) && hg;
                c = (c || !contiguous) && hc;
                d = (d || !contiguous) && hd;
                run.gpu += u32::from(g);
                run.cpu += u32::from(c);
                run.disk += u32::from(d);
            }
            if run.disk > 0 {
                out.insert(worker, run);
            }
        }
        out
    }
}

fn run_ops(ops: &[Op], contiguous_model: bool) -> Result<(), TestCaseError> {
    let mut part = Partition::new(HashProfile::vllm("0"), 0);
    let mut model = Model::default();
    for op in ops {
        match *op {
            Op::Store {
                slot,
                chain,
                depth,
                tier,
            } => {
                let h = CHAINS[chain][depth];
                let new = model.held.insert((slot, h, tier));
                prop_assert_eq!(part.store(BlockHash(h), SourceSlot(slot), tier), new);
            }
            Op::Remove {
                slot,
                chain,
                depth,
                tier,
            } => {
                let h = CHAINS[chain][depth];
                let had = model.held.remove(&(slot, h, tier));
                prop_assert_eq!(part.remove(BlockHash(h), SourceSlot(slot), tier), had);
            }
            Op::DropSource { slot } => {
                let blocks: BTreeSet<u64> = model
                    .held
                    .iter()
                    .filter(|(s, _, _)| *s == slot)
                    .map(|(_, h, _)| *h)
                    .collect();
                model.held.retain(|(s, _, _)| *s != slot);
                prop_assert_eq!(part.remove_source(SourceSlot(slot)), blocks.len());
            }
            Op::Query { chain, len } => {
                let hashes = &CHAINS[chain][..len];
                let mut got = Vec::new();
                walk(
                    &part,
                    hashes.iter().map(|&h| BlockHash(h)),
                    &WORKER_OF,
                    &mut got,
                );
                let got: BTreeMap<u32, WorkerRun> = got.into_iter().collect();
                prop_assert_eq!(got, model.query(hashes, contiguous_model), "{:?}", ops);
            }
        }
        let distinct: BTreeSet<u64> = model.held.iter().map(|(_, h, _)| *h).collect();
        prop_assert_eq!(part.len(), distinct.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config { cases: 512, ..Config::default() })]

    #[test]
    fn index_answers_like_the_reference(ops in proptest::collection::vec(op(), 1..80)) {
        run_ops(&ops, true)?;
    }
}

/// The harness must notice a wrong answer: against a reference that counts holes as matches
/// it has to fail.
#[test]
fn harness_catches_a_planted_bug() {
    let mut runner = TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&proptest::collection::vec(op(), 1..80), |ops| {
        run_ops(&ops, false)
    });
    assert!(result.is_err(), "the planted bug went unnoticed");
}

#[test]
fn tiers_are_cumulative_and_stop_at_the_first_miss() {
    let mut part = Partition::new(HashProfile::vllm("0"), 0);
    let c = CHAINS[0];
    // worker 0: gpu 2 blocks (slot 0), then cpu and disk from the pool (slot 1)
    for (depth, tier) in [
        (0, Tier::Gpu),
        (1, Tier::Gpu),
        (2, Tier::Cpu),
        (3, Tier::Disk),
    ] {
        part.store(
            BlockHash(c[depth]),
            SourceSlot(if tier == Tier::Gpu { 0 } else { 1 }),
            tier,
        );
    }
    // block 4 missing, block 5 present: not counted
    part.store(BlockHash(c[5]), SourceSlot(0), Tier::Gpu);
    let mut out = Vec::new();
    walk(&part, c.iter().map(|&h| BlockHash(h)), &WORKER_OF, &mut out);
    assert_eq!(
        out,
        vec![(
            0,
            WorkerRun {
                gpu: 2,
                cpu: 3,
                disk: 4
            }
        )]
    );
    // leaving the pool's slot out leaves only the engine's gpu run
    let mut out = Vec::new();
    walk(
        &part,
        c.iter().map(|&h| BlockHash(h)),
        &[Some(0), None],
        &mut out,
    );
    assert_eq!(
        out,
        vec![(
            0,
            WorkerRun {
                gpu: 2,
                cpu: 2,
                disk: 2
            }
        )]
    );
}

#[test]
fn many_holders_shrink_back_and_size_is_estimated() {
    let mut part = Partition::new(HashProfile::vllm("0"), 0);
    for s in 0..4 {
        assert!(part.store(BlockHash(1), SourceSlot(s), Tier::Cpu));
    }
    assert_eq!(part.holders(BlockHash(1)).unwrap().len(), 4);
    assert!(part.heap_bytes() > 0);
    for s in 0..3 {
        assert!(part.remove_all_tiers(BlockHash(1), SourceSlot(s)));
    }
    assert_eq!(part.holders(BlockHash(1)).unwrap().len(), 1);
    assert!(!part.remove(BlockHash(1), SourceSlot(3), Tier::Gpu));
    assert!(part.remove(BlockHash(1), SourceSlot(3), Tier::Cpu));
    assert!(part.is_empty());
}

#[test]
fn a_partition_keeps_its_profile() {
    let index = PrefixIndex::new();
    let key = PartitionKey {
        tenant_id: "default".into(),
        model: "m".into(),
        lora_name: String::new(),
        block_size: 16,
        additional_salt: String::new(),
    };
    let a = HashProfile::vllm("0");
    let b = HashProfile::vllm("1");
    index.partition_or_create(&key, &a).unwrap();
    assert_eq!(
        index.partition_or_create(&key, &b).unwrap_err(),
        ProfileMismatch {
            existing: a.clone()
        }
    );
    index.partition_or_create(&key, &a).unwrap().write().store(
        BlockHash(5),
        SourceSlot(9),
        Tier::Gpu,
    );
    assert_eq!(index.blocks(), 1);
    assert_eq!(index.remove_source(SourceSlot(9)), 1);
    assert_eq!(index.blocks(), 0);
    assert_eq!(index.keys(), vec![key]);
}
