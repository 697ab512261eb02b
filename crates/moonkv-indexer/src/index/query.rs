//! The walk: follow a chain of block hashes through a partition and measure, for each worker,
//! how many leading blocks it holds in the GPU tier, in GPU or CPU, and in any tier.

use super::Partition;
use crate::ids::{BlockHash, Tier};

/// How many blocks ahead of the one it looks at the walk already asked for (prefetched) the
/// slot of: time enough for the memory to answer, and little work wasted past the first miss.
pub const WALK_AHEAD: usize = 32;

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

impl Active {
    /// Counts one more block held in the tiers `m`; false when the worker holds it in none
    /// (its run ends).
    #[inline]
    fn extend(&mut self, m: u8) -> bool {
        if self.gpu_open {
            self.gpu_open = m & GPU != 0;
            self.run.gpu += u32::from(self.gpu_open);
        }
        if self.cpu_open {
            self.cpu_open = m & GPU_OR_CPU != 0;
            self.run.cpu += u32::from(self.cpu_open);
        }
        if m == 0 {
            return false;
        }
        self.run.disk += 1;
        true
    }
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
    // hashes taken from `hashes` and prefetched, not yet looked at: `ring[head..tail]`
    let mut ring = [BlockHash(0); WALK_AHEAD];
    let (mut head, mut tail) = (0usize, 0usize);
    let mut more = true;
    loop {
        while more && tail - head < WALK_AHEAD {
            match hashes.next() {
                Some(h) => {
                    partition.prefetch(h);
                    ring[tail % WALK_AHEAD] = h;
                    tail += 1;
                }
                None => more = false,
            }
        }
        if head == tail {
            break;
        }
        let hash = ring[head % WALK_AHEAD];
        head += 1;
        let found = partition.holders(hash);
        let holders = found.as_deref().unwrap_or_default();
        // The usual case, one worker still matching and one holder: no lists to build.
        if let ([a], [h]) = (active.as_mut_slice(), holders) {
            let m = match worker_of.get(h.source.0 as usize) {
                Some(&Some(w)) if w == a.worker => h.tiers.0,
                _ => 0,
            };
            if !a.extend(m) {
                out.push((a.worker, a.run));
                return;
            }
            continue;
        }
        block_masks.clear();
        for h in holders {
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
            if a.extend(m) {
                return true;
            }
            out.push((a.worker, a.run));
            false
        });
        if active.is_empty() {
            return;
        }
    }
    out.extend(active.iter().map(|a| (a.worker, a.run)));
}
