//! A second thread for the node's same-host copies (`docs/data-plane.md`, *Copies on two
//! threads*).
//!
//! One copy thread copies a cold destination at about 15 GB/s on the 2-vCPU development VM; two
//! reach about 24. While a same-host caller waits on its request, the machine's other CPU is
//! usually idle. So a copy of [`SPLIT_MIN`] bytes or more is cut into pieces that the request's
//! thread and this process's one helper thread take in turn, each the next piece not yet taken,
//! until none is left. If the helper is late (asleep, or busy with another request's copy), the
//! request's thread takes its pieces: the helper never makes a copy slower than one thread.
//!
//! Waking a sleeping thread costs about 50 µs on that VM, as long as a 4 MiB copy takes, so the
//! helper is woken when a request that will copy arrives ([`warm`]), before its master round
//! trip, and it spins for up to [`ARRIVAL`] after each such call, [`ARRIVAL`] again after the
//! request is answered ([`answered`]), and [`LINGER`] after each piece of work, before it
//! sleeps again. It spins by yielding its CPU: a same-host caller whose
//! answer was just sent is often woken on the helper's CPU, and a plain spin kept it waiting
//! for the rest of [`LINGER`] (about 47 µs of each 32 × 128 KiB get, in `perf sched
//! timehist`). A machine with a single CPU gets no helper, nor does a process started with
//! `MOONKV_COPY_HELPER=off`. While one copy is under way in the process, a second one gets no
//! help: the other CPU is busy then.
//!
//! Unsafe code here, and why it is sound: [`Helper::split`] hands the helper a reference to a
//! closure on its own stack, with its lifetime erased, and returns (or unwinds) only after it
//! took the reference back out of the slot and saw the helper leave the closure (`in_job`
//! false). The helper reads the slot and sets `in_job` under the slot's lock, so it cannot start
//! the closure after the slot was emptied. `current_cpu` calls libc's `sched_getcpu`, which
//! takes no arguments.

#![allow(unsafe_code)]

use parking_lot::{Condvar, Mutex};
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Copies shorter than this stay on one thread. A 1 MiB copy was slower with the helper: it
/// takes about as long as the helper takes to join, and the helper's spinning then delays the
/// caller's next request.
pub(crate) const SPLIT_MIN: usize = 2 << 20;

/// How long the helper spins for more work after each piece of work.
const LINGER: Duration = Duration::from_micros(60);

/// How long the helper spins for the copy of a request that just arrived ([`warm`]): longer
/// than the master takes to answer a batch before its copy (a 32-key start took 75–100 µs in
/// place on the development VM, past [`LINGER`], and the helper then joined that copy about
/// 50 µs late), and long enough to still be awake for the next request of a caller that sends
/// large requests back to back.
const ARRIVAL: Duration = Duration::from_micros(500);

/// Copies under way in this process (see [`split`]): while one is, the machine's other CPU is
/// not idle, and a second one gets no help.
static COPYING: AtomicUsize = AtomicUsize::new(0);

/// The piece size for a copy of `len` bytes: about 16 pieces, each 64 KiB to 2 MiB, in whole
/// 64 KiB.
pub(crate) fn piece_len(len: usize) -> usize {
    const UNIT: usize = 64 << 10;
    (len / 16).clamp(UNIT, 2 << 20).div_ceil(UNIT) * UNIT
}

/// The work posted to the helper: a closure on the poster's stack, lifetime erased.
#[derive(Clone, Copy)]
struct JobRef(*const (dyn Fn() + Sync + 'static));

// SAFETY: the closure behind the pointer is `Sync`, and it is called only while the poster
// waits for it (see the module doc).
unsafe impl Send for JobRef {}

/// The process's copy helper.
pub(crate) struct Helper {
    /// Bumped each time a job is posted.
    posted: AtomicU64,
    slot: Mutex<Option<JobRef>>,
    /// The helper is inside a posted closure.
    in_job: AtomicBool,
    /// A request holds the helper (one at a time; others copy on their own thread).
    busy: AtomicBool,
    /// Until when (ns after `epoch`) the helper spins instead of sleeping.
    warm_until: AtomicU64,
    /// The CPU the helper last spun on (`usize::MAX`: not known yet).
    cpu: AtomicUsize,
    /// The helper thread's id (0 until it runs).
    tid: std::sync::atomic::AtomicI32,
    /// The CPUs the helper thread was allowed on when it started.
    allowed: OnceLock<rustix::thread::CpuSet>,
    /// The helper sleeps (under this lock) until notified.
    parked: Mutex<bool>,
    wake: Condvar,
    epoch: Instant,
}

/// The process's helper, started at its first use; `None` on a machine with one CPU, with
/// `MOONKV_COPY_HELPER=off` (or `0`) in the environment, or when no thread could be started.
fn helper() -> Option<&'static Helper> {
    static HELPER: OnceLock<Option<Arc<Helper>>> = OnceLock::new();
    HELPER
        .get_or_init(|| {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            let off = std::env::var("MOONKV_COPY_HELPER").is_ok_and(|v| v == "0" || v == "off");
            if cpus < 2 || off {
                return None;
            }
            spawn()
        })
        .as_deref()
}

/// A helper on a thread of its own; `None` when no thread could be started.
fn spawn() -> Option<Arc<Helper>> {
    let helper = Arc::new(Helper {
        posted: AtomicU64::new(0),
        slot: Mutex::new(None),
        in_job: AtomicBool::new(false),
        busy: AtomicBool::new(false),
        warm_until: AtomicU64::new(0),
        cpu: AtomicUsize::new(usize::MAX),
        tid: std::sync::atomic::AtomicI32::new(0),
        allowed: OnceLock::new(),
        parked: Mutex::new(false),
        wake: Condvar::new(),
        epoch: Instant::now(),
    });
    let runs = helper.clone();
    std::thread::Builder::new()
        .name("moonkv-copy".into())
        .spawn(move || runs.run())
        .ok()
        .map(|_| helper)
}

/// A request that copied at least [`SPLIT_MIN`] bytes was answered: the helper stays awake
/// for [`ARRIVAL`] more, so that the caller's next request, which often follows within a
/// hundred microseconds, finds it awake. Waking it from its sleep (a futex wake, which sends
/// the other CPU an interrupt) took 20–45 µs of the request's own thread on the development VM,
/// where a 32 × 128 KiB batch, which outlasts [`ARRIVAL`], paid it on every request.
pub(crate) fn answered(bytes: u64) {
    warm(bytes);
}

/// A request that will copy at least [`SPLIT_MIN`] bytes arrived: the helper should be awake
/// by the time its copy starts.
pub(crate) fn warm(bytes: u64) {
    if bytes < SPLIT_MIN as u64 {
        return;
    }
    if let Some(helper) = helper() {
        if !helper.busy.load(Ordering::Relaxed) && COPYING.load(Ordering::Relaxed) == 0 {
            helper.keep_warm(ARRIVAL);
        }
    }
}

/// Runs `copy` on every item, on this thread and, with `share`, on the helper when it is free
/// and no other copy is under way: each thread takes the next item not yet taken. Stops taking
/// items at the first error, which it returns.
pub(crate) fn split<T: Send>(
    items: Vec<T>,
    share: bool,
    copy: impl Fn(T) -> io::Result<()> + Sync,
) -> io::Result<()> {
    let n = items.len();
    let cells: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<io::Error>> = Mutex::new(None);
    let stop = AtomicBool::new(false);
    let work = || loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(item) = cells.get(i).and_then(|cell| cell.lock().take()) else {
            return;
        };
        let done = catch_unwind(AssertUnwindSafe(|| copy(item)))
            .unwrap_or_else(|_| Err(io::Error::other("a copy piece panicked")));
        if let Err(e) = done {
            stop.store(true, Ordering::Relaxed);
            failed.lock().get_or_insert(e);
            return;
        }
    };
    let others = COPYING.fetch_add(1, Ordering::Relaxed);
    let _copying = Copying;
    let helper = helper()
        .filter(|h| share && n >= 2 && others == 0 && !h.busy.swap(true, Ordering::Acquire));
    match helper {
        Some(helper) => {
            helper.move_off_this_cpu();
            let posted = Posted::post(helper, &work);
            work();
            drop(posted);
        }
        None => work(),
    }
    match failed.into_inner() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The CPU this thread runs on (`usize::MAX` when unknown). glibc's `sched_getcpu` reads it
/// without a system call (vDSO or `rdpid`), where rustix's makes one.
fn current_cpu() -> usize {
    // SAFETY: `sched_getcpu` takes no arguments and only reads the calling thread's state.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).unwrap_or(usize::MAX)
}

/// Counts a copy in [`COPYING`] while it lives.
struct Copying;

impl Drop for Copying {
    fn drop(&mut self) {
        COPYING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A job in the helper's slot; dropping it (also on unwind) takes the job back and waits until
/// the helper is out of it, then frees the helper for other requests.
struct Posted<'h> {
    helper: &'h Helper,
}

impl<'h> Posted<'h> {
    fn post<'a>(helper: &'h Helper, job: &'a (dyn Fn() + Sync + 'a)) -> Posted<'h> {
        let job: *const (dyn Fn() + Sync + 'a) = job;
        // SAFETY: only the lifetime changes. The pointer leaves the slot, and the helper leaves
        // the closure, before `Posted` is dropped, which happens before `'a` ends: `split`
        // drops it (or unwinds through it) while the closure is still on its stack.
        let job: *const (dyn Fn() + Sync + 'static) = unsafe { std::mem::transmute(job) };
        *helper.slot.lock() = Some(JobRef(job));
        helper.posted.fetch_add(1, Ordering::Release);
        helper.keep_warm(LINGER);
        Posted { helper }
    }
}

impl Drop for Posted<'_> {
    fn drop(&mut self) {
        *self.helper.slot.lock() = None;
        let mut spins = 0u32;
        while self.helper.in_job.load(Ordering::Acquire) {
            spins += 1;
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        self.helper.busy.store(false, Ordering::Release);
    }
}

impl Helper {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Moves the helper off the calling thread's CPU when it last spun there. Waiting to run
    /// behind the caller, it would take no piece of the copy while the other CPU sits idle: the
    /// scheduler does not pull a thread that just ran over to an idle CPU (on the 2-vCPU VM of
    /// `docs/benchmarks.md`, 1–10% of 4 MiB copies ran on one thread this way, at twice the
    /// time). The helper may then run on every CPU but this one, until a copy finds it on its
    /// CPU again. Costs one system call, only then; a refusal (a cpuset, say) changes nothing.
    fn move_off_this_cpu(&self) {
        let here = current_cpu();
        let tid = self.tid.load(Ordering::Relaxed);
        if here == usize::MAX || tid == 0 || self.cpu.load(Ordering::Relaxed) != here {
            return;
        }
        let Some(mut allowed) = self.allowed.get().cloned() else {
            return;
        };
        allowed.unset(here);
        if allowed.count() == 0 {
            return;
        }
        let Some(tid) = rustix::process::Pid::from_raw(tid) else {
            return;
        };
        if rustix::thread::sched_setaffinity(Some(tid), &allowed).is_ok() {
            self.cpu.store(usize::MAX, Ordering::Relaxed);
        }
    }

    /// Keeps the helper spinning for `window` from now, waking it if it sleeps.
    fn keep_warm(&self, window: Duration) {
        let until = self.now_ns() + window.as_nanos() as u64;
        self.warm_until.fetch_max(until, Ordering::Relaxed);
        let parked = self.parked.lock();
        if *parked {
            self.wake.notify_one();
        }
    }

    /// The helper thread: waits for a posted job (spinning while warm, asleep otherwise), runs
    /// its share of it, and goes back to waiting.
    fn run(&self) {
        if let Ok(allowed) = rustix::thread::sched_getaffinity(None) {
            let _ = self.allowed.set(allowed);
        }
        self.tid.store(
            rustix::thread::gettid().as_raw_nonzero().get(),
            Ordering::Relaxed,
        );
        let mut seen = 0u64;
        loop {
            // Wait for a job posted after the last one seen.
            loop {
                let now = self.posted.load(Ordering::Acquire);
                if now != seen {
                    seen = now;
                    break;
                }
                if self.now_ns() >= self.warm_until.load(Ordering::Relaxed) {
                    let mut parked = self.parked.lock();
                    *parked = true;
                    while self.posted.load(Ordering::Acquire) == seen
                        && self.now_ns() >= self.warm_until.load(Ordering::Relaxed)
                    {
                        self.wake.wait(&mut parked);
                    }
                    *parked = false;
                    continue;
                }
                // Spinning only hopes for work: any thread that can run on this CPU runs first.
                // Above all the caller a same-host answer just woke, which its scheduler often
                // queues on this CPU, behind the helper.
                std::thread::yield_now();
                self.cpu.store(current_cpu(), Ordering::Relaxed);
            }
            let job = {
                let slot = self.slot.lock();
                let job = *slot;
                if job.is_some() {
                    self.in_job.store(true, Ordering::Relaxed);
                }
                job
            };
            if let Some(JobRef(job)) = job {
                // SAFETY: the poster waits for `in_job` to be false before the closure goes
                // away (see `Posted`); `in_job` was set under the slot's lock while the job was
                // still in it.
                let job = unsafe { &*job };
                let _ = catch_unwind(AssertUnwindSafe(job));
                self.in_job.store(false, Ordering::Release);
            }
            let until = self.now_ns() + LINGER.as_nanos() as u64;
            self.warm_until.fetch_max(until, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_found_spinning_on_the_posting_cpu_is_moved_off_it() {
        use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
        // A helper of its own, which no other test wakes.
        let Some(helper) = spawn() else {
            return;
        };
        let all = sched_getaffinity(None).unwrap();
        let Some(here) = (0..CpuSet::MAX_CPU).find(|&c| all.is_set(c)) else {
            return;
        };
        if all.count() < 2 {
            return;
        }
        // This thread stays on one CPU, so the helper can be said to spin there.
        let mut one = CpuSet::new();
        one.set(here);
        sched_setaffinity(None, &one).unwrap();
        helper.keep_warm(Duration::from_millis(50));
        let since = Instant::now();
        let tid = loop {
            let tid = helper.tid.load(Ordering::Relaxed);
            if tid != 0 {
                break rustix::process::Pid::from_raw(tid).unwrap();
            }
            assert!(
                since.elapsed() < Duration::from_secs(5),
                "the helper never ran"
            );
            std::thread::yield_now();
        };
        // Asleep, it no longer records where it spins.
        helper.warm_until.store(0, Ordering::Relaxed);
        while !*helper.parked.lock() {
            assert!(
                since.elapsed() < Duration::from_secs(5),
                "the helper never slept"
            );
            std::thread::yield_now();
        }
        helper.cpu.store(here, Ordering::Relaxed);
        helper.move_off_this_cpu();
        let moved = sched_getaffinity(Some(tid)).unwrap();
        assert!(
            !moved.is_set(here),
            "still allowed on the posting CPU {here}"
        );
        assert_eq!(
            moved.count(),
            all.count() - 1,
            "every other CPU stays allowed"
        );
        // Found elsewhere, it is left where it is.
        helper.cpu.store(usize::MAX, Ordering::Relaxed);
        sched_setaffinity(Some(tid), &all).unwrap();
        helper.move_off_this_cpu();
        assert_eq!(sched_getaffinity(Some(tid)).unwrap().count(), all.count());
        sched_setaffinity(None, &all).unwrap();
    }

    #[test]
    fn pieces_are_whole_64k_units_between_64k_and_2m() {
        assert_eq!(piece_len(128 << 10), 64 << 10);
        assert_eq!(piece_len(4 << 20), 256 << 10);
        assert_eq!(piece_len(64 << 20), 2 << 20);
        assert_eq!(piece_len(3 << 20), 192 << 10);
        assert_eq!(piece_len((3 << 20) + 16), 256 << 10);
    }

    #[test]
    fn every_item_is_copied_exactly_once_from_many_threads() {
        let src: Vec<u8> = (0..(8 << 20)).map(|i| (i % 251) as u8).collect();
        std::thread::scope(|s| {
            for t in 0..4 {
                let src = &src;
                s.spawn(move || {
                    for round in 0..50 {
                        let mut dst = vec![0u8; src.len() - t * 4096 - round];
                        let len = dst.len();
                        let piece = piece_len(len);
                        let items: Vec<(usize, &mut [u8])> = dst
                            .chunks_mut(piece)
                            .enumerate()
                            .map(|(i, p)| (i * piece, p))
                            .collect();
                        let copies = AtomicUsize::new(0);
                        split(items, true, |(at, p)| {
                            copies.fetch_add(1, Ordering::Relaxed);
                            p.copy_from_slice(&src[at..at + p.len()]);
                            Ok(())
                        })
                        .unwrap();
                        assert_eq!(copies.into_inner(), len.div_ceil(piece));
                        assert!(dst == src[..len], "thread {t} round {round}");
                    }
                });
            }
        });
    }

    #[test]
    fn the_first_error_is_returned_and_later_items_are_not_taken() {
        let taken = AtomicUsize::new(0);
        let items: Vec<usize> = (0..64).collect();
        let e = split(items, true, |i| {
            taken.fetch_add(1, Ordering::Relaxed);
            if i == 3 {
                Err(io::Error::other("piece 3 failed"))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "piece 3 failed");
        // Items after the failure are not started (at most one in flight on the other thread).
        assert!(taken.into_inner() <= 6);
    }

    #[test]
    fn a_panicking_piece_is_an_error_and_the_helper_survives_it() {
        let e = split(vec![0, 1, 2, 3], true, |i| {
            if i == 1 {
                panic!("piece 1 panics");
            }
            Ok(())
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "a copy piece panicked");
        let sum = AtomicUsize::new(0);
        split((1..=100).collect(), true, |i: usize| {
            sum.fetch_add(i, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert_eq!(sum.into_inner(), 5050);
    }
}
