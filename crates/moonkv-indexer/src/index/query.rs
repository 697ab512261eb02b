//! The walk: follow a chain of block hashes through a partition and measure, for each worker,
//! how many leading blocks it holds in the GPU tier, in GPU or CPU, and in any tier.

use super::{Holder, Partition};
use crate::ids::{BlockHash, Tier};

/// Hashes looked up together: independent lookups let the processor overlap their cache
/// misses, and a chunk this small wastes little work past the first miss.
pub const WALK_CHUNK: usize = 16;

/// One worker's matched prefix, in blocks, cumulative by tier: `gpu ≤ cpu ≤ disk`, and `disk`
/// is the longest prefix held in any tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerRun {
    /// Leading blocks held in the GPU tier.
    pub gpu: u32,
    /// Leading blocks held in the GPU or CPU tier.
    pub cpu: u32,
    /// Leading blocks held in any tier.
    pub disk: u32,
}

struct Active {
    worker: u32,
    run: WorkerRun,
    gpu_open: bool,
    cpu_open: bool,
}

const GPU: u8 = Tier::Gpu.bit();
const GPU_OR_CPU: u8 = Tier::Gpu.bit() | Tier::Cpu.bit();

/// Walks `hashes` through `partition`. `worker_of[slot]` names the worker a source slot
/// reports for (`None`: leave that source out, for example another instance's). Appends one
/// entry per worker that holds at least the first block, in no particular order.
pub fn walk(
    partition: &Partition,
    mut hashes: impl Iterator<Item = BlockHash>,
    worker_of: &[Option<u32>],
    out: &mut Vec<(u32, WorkerRun)>,
) {
    let mut active: Vec<Active> = Vec::new();
    let mut started = false;
    let mut block_masks: Vec<(u32, u8)> = Vec::with_capacity(8);
    let mut chunk = [BlockHash(0); WALK_CHUNK];
    loop {
        let mut n = 0;
        while n < WALK_CHUNK {
            match hashes.next() {
                Some(h) => {
                    chunk[n] = h;
                    n += 1;
                }
                None => break,
            }
        }
        if n == 0 {
            break;
        }
        let mut found: [Option<&[Holder]>; WALK_CHUNK] = [None; WALK_CHUNK];
        for i in 0..n {
            found[i] = partition.holders(chunk[i]);
        }
        for holders in found.iter().take(n) {
            block_masks.clear();
            for h in holders.unwrap_or_default() {
                let Some(&Some(w)) = worker_of.get(h.source.0 as usize) else {
                    continue;
                };
                match block_masks.iter_mut().find(|(x, _)| *x == w) {
                    Some((_, m)) => *m |= h.tiers.0,
                    None => block_masks.push((w, h.tiers.0)),
                }
            }
            if !started {
                started = true;
                active.extend(block_masks.iter().map(|&(worker, _)| Active {
                    worker,
                    run: WorkerRun::default(),
                    gpu_open: true,
                    cpu_open: true,
                }));
            }
            active.retain_mut(|a| {
                let m = block_masks
                    .iter()
                    .find(|(w, _)| *w == a.worker)
                    .map_or(0, |x| x.1);
                if a.gpu_open {
                    a.gpu_open = m & GPU != 0;
                    a.run.gpu += u32::from(a.gpu_open);
                }
                if a.cpu_open {
                    a.cpu_open = m & GPU_OR_CPU != 0;
                    a.run.cpu += u32::from(a.cpu_open);
                }
                if m == 0 {
                    out.push((a.worker, a.run));
                    return false;
                }
                a.run.disk += 1;
                true
            });
            if active.is_empty() {
                return;
            }
        }
    }
    out.extend(active.iter().map(|a| (a.worker, a.run)));
}
