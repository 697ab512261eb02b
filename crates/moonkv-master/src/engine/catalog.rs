//! What each node knows about its committed memory replicas, so a master that lost its
//! metadata (restart, failover) can rebuild it from the nodes (`docs/operations.md`, "Restart
//! and re-adoption").
//!
//! The master keeps one mailbox of notices per node: `Commit` when a PutEnd/UpsertEnd makes a
//! memory replica COMPLETE, `Drop` when a committed replica leaves its object (removed,
//! replaced, evicted). The node long-polls its mailbox (`SyncCatalog`) and acknowledges what it
//! applied with its next poll. Nothing here touches the hot path beyond a queue push: a commit
//! is acknowledged to the writer before its notice reaches the node (the window a crash can
//! lose), while a remove or replacement waits (bounded) until the drop notices it caused were
//! acknowledged, so an acknowledged removal cannot come back (see [`CatalogFence`]).

use moonkv_proto::msg::{CatalogNotice, SyncCatalogResponse};
use moonkv_proto::{ClientId, ReplicaId};
use parking_lot::{Mutex, RwLock};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Most notices one node's mailbox holds unacknowledged; beyond that its catalog is reset
/// (the node forgets it: nothing wrong can be re-adopted, only less).
pub(crate) const MAX_PENDING_NOTICES: usize = 1 << 20;

/// Replacement notes ([`CatalogBook::hold_replaced`]) held before old ones are pruned.
const REPLACED_PRUNE_AT: usize = 4096;
/// Age past which a replacement note is pruned: a write still open this long has been swept.
const REPLACED_MAX_AGE_MS: u64 = 3_600_000;

/// Most notices one SyncCatalog answer carries.
pub(crate) const MAX_NOTICES_PER_SYNC: usize = 16 * 1024;

#[derive(Debug, Default)]
struct Mailbox {
    /// Sequence of the last notice the node acknowledged; `notices[0]` is `acked + 1`.
    acked: u64,
    notices: VecDeque<CatalogNotice>,
    /// Highest sequence of a `Drop` notice (a fence waits for it).
    last_drop: u64,
    /// Set until the node acknowledged a sequence at or past it: tell it to forget its catalog.
    reset_until: Option<u64>,
    /// When the node last asked (ms, the engine clock).
    last_poll_ms: u64,
    /// This master knew the node's catalog and dropped its replicas when its heartbeat expired:
    /// should it come back, its announcements only give replicas back to objects this master
    /// still holds at the same version, never create or replace one. Whatever this master
    /// removed or replaced meanwhile stays so.
    merge_only: bool,
}

impl Mailbox {
    fn tail(&self) -> u64 {
        self.acked + self.notices.len() as u64
    }

    /// Whether the pending notices should leave at once: an unacknowledged drop (a removal may
    /// be waiting for it), a reset, or a full answer's worth. Commits alone may wait a moment
    /// to travel together.
    fn is_urgent(&self) -> bool {
        self.last_drop > self.acked
            || self.reset_until.is_some()
            || self.notices.len() >= MAX_NOTICES_PER_SYNC
    }
}

/// Drops a fence must wait for: node → sequence of its last drop notice.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CatalogFence(pub(crate) Vec<(ClientId, u64)>);

impl CatalogFence {
    /// True when no drop notice needs waiting for.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Nodes waited for.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Adds the drops of `other`.
    pub fn extend(&mut self, other: CatalogFence) {
        for (client, seq) in other.0 {
            match self.0.iter_mut().find(|(c, _)| *c == client) {
                Some((_, s)) => *s = (*s).max(seq),
                None => self.0.push((client, seq)),
            }
        }
    }
}

thread_local! {
    /// Drop notices pushed by the engine call running on this thread (see [`fence_scope`]).
    static DROPS: RefCell<Option<Vec<(ClientId, u64)>>> = const { RefCell::new(None) };
}

/// Where the drop notices pushed by the running engine call end so far (see [`drops_since`]).
pub(crate) fn drops_mark() -> usize {
    DROPS.with(|d| d.borrow().as_ref().map_or(0, Vec::len))
}

/// The drop notices pushed by the running engine call since `mark`.
pub(crate) fn drops_since(mark: usize) -> CatalogFence {
    let drops = DROPS.with(|d| {
        d.borrow()
            .as_ref()
            .map(|v| v.get(mark..).unwrap_or_default().to_vec())
            .unwrap_or_default()
    });
    let mut fence = CatalogFence::default();
    fence.extend(CatalogFence(drops));
    fence
}

/// Makes the running engine call's answer wait for `fence` too (as if it had pushed those
/// drops itself).
pub(crate) fn add_to_scope(fence: &CatalogFence) {
    DROPS.with(|d| {
        if let Some(v) = d.borrow_mut().as_mut() {
            v.extend(fence.0.iter().copied());
        }
    });
}

/// Runs `f` and returns, with its result, the fence of the drop notices it pushed.
pub fn fence_scope<R>(f: impl FnOnce() -> R) -> (R, CatalogFence) {
    DROPS.with(|d| *d.borrow_mut() = Some(Vec::new()));
    let result = f();
    let drops = DROPS.with(|d| d.borrow_mut().take()).unwrap_or_default();
    let mut fence = CatalogFence::default();
    fence.extend(CatalogFence(drops));
    (result, fence)
}

/// The mailboxes of every node.
pub(crate) struct CatalogBook {
    epoch: u64,
    mailboxes: Mutex<HashMap<ClientId, Mailbox>>,
    /// Whether any mailbox was ever opened, at a mount or a poll (none is ever closed): while
    /// none was, notices go nowhere and [`CatalogBook::push`] takes no lock (a master whose
    /// only node is the one of `moonkv up`, which keeps no catalog).
    any_open: std::sync::atomic::AtomicBool,
    /// Drops an UpsertStart caused (the value it replaced), by the replica ids of the write
    /// that replaces it, with when they were noted: that write's End waits for them
    /// ([`CatalogBook::hold_replaced`]).
    replaced: Mutex<HashMap<ReplicaId, (CatalogFence, u64)>>,
    /// Entries in `replaced`, readable without its lock: Ends and Revokes of writes that
    /// replaced nothing (nearly all of them) skip the lock.
    replaced_len: std::sync::atomic::AtomicUsize,
    waker: RwLock<Option<CatalogWaker>>,
}

/// Told that a notice was queued, and whether its node's notices must now leave at once.
pub type CatalogWaker = Arc<dyn Fn(bool) + Send + Sync>;

/// What a node's poll would be answered ([`CatalogBook::acknowledge`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PendingNotices {
    /// Nothing: the poll waits for a notice.
    Nothing,
    /// Commits alone: they may wait a moment for more to travel with.
    MayWait,
    /// Notices that must leave at once: a drop, a reset, or a full answer's worth.
    Urgent,
}

impl std::fmt::Debug for CatalogBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogBook")
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl CatalogBook {
    pub(crate) fn new(epoch: u64) -> Self {
        Self {
            epoch,
            mailboxes: Mutex::new(HashMap::new()),
            any_open: std::sync::atomic::AtomicBool::new(false),
            replaced: Mutex::new(HashMap::new()),
            replaced_len: std::sync::atomic::AtomicUsize::new(0),
            waker: RwLock::new(None),
        }
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Notes that the write with replica `ids` replaced a value whose drop notices are
    /// `fence`: its End answers only once they are acknowledged, so the replacement is not
    /// acknowledged before the old value can no longer be re-adopted. The Start itself need
    /// not wait: until that End, the old value coming back after a crash is the last
    /// acknowledged one. Notes older than [`REPLACED_MAX_AGE_MS`] (writes abandoned without
    /// an End or a Revoke) are forgotten once many have piled up.
    pub(crate) fn hold_replaced(&self, ids: &[ReplicaId], fence: CatalogFence, now_ms: u64) {
        if fence.is_empty() {
            return;
        }
        let mut held = self.replaced.lock();
        if held.len() >= REPLACED_PRUNE_AT {
            held.retain(|_, (_, at)| now_ms.saturating_sub(*at) < REPLACED_MAX_AGE_MS);
        }
        for id in ids {
            held.insert(*id, (fence.clone(), now_ms));
        }
        self.replaced_len
            .store(held.len(), std::sync::atomic::Ordering::Release);
    }

    /// The drops the write with replica `ids` must wait for before its End is acknowledged
    /// (forgotten here either way).
    pub(crate) fn take_replaced(&self, ids: &[ReplicaId]) -> CatalogFence {
        let mut fence = CatalogFence::default();
        // The Start that held a fence for these ids was answered before their End or Revoke
        // could be sent, so its store is visible here.
        if self.replaced_len.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return fence;
        }
        let mut held = self.replaced.lock();
        for id in ids {
            if let Some((f, _)) = held.remove(id) {
                fence.extend(f);
            }
        }
        self.replaced_len
            .store(held.len(), std::sync::atomic::Ordering::Release);
        fence
    }

    pub(crate) fn set_waker(&self, waker: CatalogWaker) {
        *self.waker.write() = Some(waker);
    }

    /// Opens `node`'s mailbox (if it has none): from now on notices for it are queued. Called
    /// for owners that keep a catalog, at their mount and poll.
    pub(crate) fn open(&self, node: ClientId) {
        self.mailbox(&mut self.mailboxes.lock(), node);
    }

    /// `node`'s mailbox in `boxes` (the locked `mailboxes`), opened if it had none.
    fn mailbox<'b>(
        &self,
        boxes: &'b mut HashMap<ClientId, Mailbox>,
        node: ClientId,
    ) -> &'b mut Mailbox {
        boxes.entry(node).or_insert_with(|| {
            // Set under the lock: a push that sees it unset ran before this mailbox existed.
            self.any_open
                .store(true, std::sync::atomic::Ordering::Release);
            Mailbox::default()
        })
    }

    /// Nodes whose heartbeat expired: their replicas were dropped here without notices, and
    /// what they announce should they come back may only merge ([`CatalogBook::is_merge_only`]).
    /// Their catalogs are kept, so the replicas of objects unchanged here come back with them.
    pub(crate) fn expired(&self, nodes: &[ClientId]) {
        let mut boxes = self.mailboxes.lock();
        for node in nodes {
            if let Some(mb) = boxes.get_mut(node) {
                mb.merge_only = true;
            }
        }
    }

    /// Whether `node`'s announcements may only merge into objects held here at the same
    /// version (see [`Mailbox::merge_only`]).
    pub(crate) fn is_merge_only(&self, node: ClientId) -> bool {
        self.mailboxes
            .lock()
            .get(&node)
            .is_some_and(|mb| mb.merge_only)
    }

    /// Queues a notice for `node`; nothing when it keeps no catalog (it never opened a
    /// mailbox), so owners that never poll cost no memory per object.
    /// The notice is made by `notice`, called only when there is a mailbox to queue it in: a
    /// commit's notice copies its tenant and key, which an owner without a catalog (the node of
    /// `moonkv up`) would pay for every key it is sent.
    pub(crate) fn push(&self, node: ClientId, notice: impl FnOnce() -> CatalogNotice) {
        if !self.any_open.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let (is_drop, seq, urgent) = {
            let mut boxes = self.mailboxes.lock();
            let Some(mb) = boxes.get_mut(&node) else {
                return;
            };
            let notice = notice();
            let is_drop = matches!(notice, CatalogNotice::Drop { .. });
            if mb.notices.len() >= MAX_PENDING_NOTICES {
                // The node is not keeping up (or not connected): rather than grow without
                // bound, its catalog starts over.
                mb.acked = mb.tail();
                mb.notices.clear();
                mb.reset_until = Some(mb.acked + 1);
            }
            mb.notices.push_back(notice);
            let seq = mb.tail();
            if is_drop {
                mb.last_drop = seq;
            }
            (is_drop, seq, mb.is_urgent())
        };
        if is_drop {
            DROPS.with(|d| {
                if let Some(v) = d.borrow_mut().as_mut() {
                    v.push((node, seq));
                }
            });
        }
        if let Some(wake) = self.waker.read().as_ref() {
            wake(urgent);
        }
    }

    /// A node's poll: forgets what it acknowledged, answers what is pending (possibly
    /// nothing; the server then waits and asks again).
    pub(crate) fn sync(
        &self,
        node: ClientId,
        epoch: u64,
        acked: u64,
        now_ms: u64,
    ) -> SyncCatalogResponse {
        let mut boxes = self.mailboxes.lock();
        let mb = self.acknowledge_in(&mut boxes, node, epoch, acked, now_ms);
        let count = mb.notices.len().min(MAX_NOTICES_PER_SYNC);
        SyncCatalogResponse {
            epoch: self.epoch,
            last: mb.acked + count as u64,
            reset: mb.reset_until.is_some(),
            notices: mb.notices.iter().take(count).cloned().collect(),
        }
    }

    /// A node's poll, without its answer: forgets what it acknowledged. Returns what an answer
    /// would carry, so that a poll about to wait for more does not copy the notices it will
    /// copy again when it answers.
    pub(crate) fn acknowledge(
        &self,
        node: ClientId,
        epoch: u64,
        acked: u64,
        now_ms: u64,
    ) -> PendingNotices {
        let mut boxes = self.mailboxes.lock();
        let mb = self.acknowledge_in(&mut boxes, node, epoch, acked, now_ms);
        if mb.is_urgent() {
            PendingNotices::Urgent
        } else if mb.notices.is_empty() {
            PendingNotices::Nothing
        } else {
            PendingNotices::MayWait
        }
    }

    /// `node`'s mailbox, opened if it had none (its poll says it keeps a catalog), with what
    /// it acknowledged removed.
    fn acknowledge_in<'b>(
        &self,
        boxes: &'b mut HashMap<ClientId, Mailbox>,
        node: ClientId,
        epoch: u64,
        acked: u64,
        now_ms: u64,
    ) -> &'b mut Mailbox {
        let own_epoch = self.epoch;
        let mb = self.mailbox(boxes, node);
        mb.last_poll_ms = now_ms;
        if epoch == own_epoch && acked > mb.acked {
            let done = (acked.min(mb.tail()) - mb.acked) as usize;
            mb.notices.drain(..done);
            mb.acked += done as u64;
        }
        if mb.reset_until.is_some_and(|r| mb.acked >= r) {
            mb.reset_until = None;
        }
        mb
    }

    /// Whether `node`'s pending notices should leave at once, without acknowledging anything
    /// (tests; a poll learns it from [`CatalogBook::acknowledge`]).
    #[cfg(test)]
    pub(crate) fn urgent(&self, node: ClientId) -> bool {
        self.mailboxes
            .lock()
            .get(&node)
            .is_some_and(Mailbox::is_urgent)
    }

    /// Whether every drop of `fence` was acknowledged, or cannot be waited for: the node's
    /// mailbox is gone (it expired) or the node has not polled for `stale_ms`.
    pub(crate) fn fence_passed(&self, fence: &CatalogFence, now_ms: u64, stale_ms: u64) -> bool {
        let boxes = self.mailboxes.lock();
        fence.0.iter().all(|(node, seq)| match boxes.get(node) {
            None => true,
            Some(mb) => mb.acked >= *seq || now_ms.saturating_sub(mb.last_poll_ms) > stale_ms,
        })
    }

    /// Unacknowledged notices over every node (metrics).
    pub(crate) fn pending_total(&self) -> u64 {
        self.mailboxes
            .lock()
            .values()
            .map(|mb| mb.notices.len() as u64)
            .sum()
    }
}
