//! The node side of the disk tier: mounting the disk on the master (handing back the files found
//! in the directory), then polling for offload tasks and file deletions.
//!
//! Every `disk_poll_interval` the node asks `OffloadHeartbeat`: it deletes the listed files,
//! copies each task's memory replica (a segment of this node) into a file — up to
//! [`PARALLEL_COPIES`] at a time, each reported with `NotifyOffload` as soon as its group is
//! done — and asks again at once while tasks keep coming, so a backlog drains at disk speed
//! rather than one heartbeat at a time. A file the master refuses is deleted. When the master no
//! longer knows the disk (it restarted, or expired this node), the node rescans the directory and
//! mounts it again.

use crate::disk::{with_cause, DiskStore};
use crate::server::SegmentTable;
use moonkv_client::master_client::MasterClient;
use moonkv_proto::msg::{MountDiskSegmentRequest, NotifyOffloadRequest, OffloadHeartbeatRequest};
use moonkv_proto::types::{DiskFile, DiskSegment, OffloadResult, OffloadTask, PromotionTask};
use moonkv_proto::{ErrorCode, Result};
use std::sync::Arc;
use std::time::Duration;

/// Offload copies one node runs at once (their file syncs overlap).
pub(crate) const PARALLEL_COPIES: usize = 4;

/// What the loop needs.
pub(crate) struct DiskAgent {
    pub master: MasterClient,
    pub disk: Arc<DiskStore>,
    pub info: DiskSegment,
    pub segments: SegmentTable,
}

impl DiskAgent {
    /// Mounts the disk with `existing` files; deletes the files the master refused.
    pub async fn mount(&self, existing: Vec<DiskFile>) -> Result<()> {
        let answer = self
            .master
            .mount_disk_segment(MountDiskSegmentRequest {
                client_id: self.master.client_id(),
                disk: self.info.clone(),
                existing,
            })
            .await?;
        if !answer.rejected.is_empty() {
            tracing::info!(
                files = answer.rejected.len(),
                "deleting disk files the master no longer knows"
            );
        }
        for id in answer.rejected {
            self.disk.delete(id.0);
        }
        Ok(())
    }

    /// Polls until the task is aborted.
    pub async fn run(self, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failures = 0u32;
        let mut busy = false;
        // Deletions carried out and not yet acknowledged to the master.
        let mut deleted: Vec<u64> = Vec::new();
        loop {
            if !busy {
                ticker.tick().await;
            }
            busy = false;
            match self.poll(&mut deleted).await {
                Ok(more) => {
                    failures = 0;
                    // Offload tasks, or deletions to acknowledge: ask again at once.
                    busy = more || !deleted.is_empty();
                }
                Err(e) => {
                    failures += 1;
                    if failures == 1 || failures.is_multiple_of(50) {
                        tracing::warn!(error = %e, failures, "disk heartbeat failed");
                    }
                }
            }
        }
    }

    /// One heartbeat and its work; true when it brought offload tasks. `deleted` goes out as
    /// acknowledgments and comes back with the deletions this heartbeat carried out (kept for
    /// the next one if the heartbeat failed).
    async fn poll(&self, deleted: &mut Vec<u64>) -> Result<bool> {
        let request = OffloadHeartbeatRequest {
            client_id: self.master.client_id(),
            deleted: deleted.clone(),
        };
        let work = match self.master.offload_heartbeat(request).await {
            Ok(work) => {
                deleted.clear();
                work
            }
            Err(e) if e.code == ErrorCode::SEGMENT_NOT_FOUND => {
                tracing::info!("the master does not know this disk; mounting it again");
                let (files, _) = self.disk.scan(false)?;
                return self.mount(files).await.map(|()| false);
            }
            Err(e) => return Err(e),
        };
        if !work.deletions.is_empty() {
            // Acknowledged only once the files are gone for good (directory synced): the master
            // holds the removal's answer until then.
            self.disk.delete_all(&work.deletions).await;
            deleted.extend_from_slice(&work.deletions);
        }
        let busy = !work.tasks.is_empty() || !work.promotions.is_empty();
        for group in work.tasks.chunks(PARALLEL_COPIES) {
            self.offload_group(group).await?;
        }
        if !work.promotions.is_empty() {
            self.promote_all(&work.promotions).await?;
        }
        Ok(busy)
    }

    /// Fills each promotion's memory replica from its file and reports them. A refused report
    /// needs nothing undone: the master owns the memory.
    async fn promote_all(&self, tasks: &[PromotionTask]) -> Result<()> {
        let mut results = Vec::with_capacity(tasks.len());
        for task in tasks {
            results.push(OffloadResult {
                tenant: task.tenant.clone(),
                key: task.key.clone(),
                disk_replica_id: task.target.id,
                ok: self.promote(task).await,
            });
        }
        self.master
            .notify_offload(NotifyOffloadRequest {
                client_id: self.master.client_id(),
                results,
            })
            .await
            .map(|_| ())
    }

    /// Reads one file (verified) into a memory replica of this node.
    async fn promote(&self, task: &PromotionTask) -> bool {
        let (source, target) = (&task.source, &task.target);
        let segment = self.segments.read().get(&target.segment_id).cloned();
        let Some(segment) = segment else {
            tracing::warn!(key = %task.key, "promotion target is not a segment of this node");
            return false;
        };
        if source.size != target.size {
            return false;
        }
        let mut file = match self.disk.open_stream(source.address, source.size).await {
            Ok(file) => file,
            Err(e) => {
                tracing::warn!(key = %task.key, error = %with_cause(&e), "promotion source unreadable");
                return false;
            }
        };
        // Straight from the file into the segment; the checksum decides whether it counts.
        let written = match segment.write_view(target.address, target.size).await {
            Ok(mut view) => {
                let mut at = 0usize;
                let mut ok = true;
                while file.remaining() > 0 {
                    match file.next(&mut view[at..]).await {
                        Ok(chunk) => at += chunk.len(),
                        Err(e) => {
                            tracing::warn!(key = %task.key, error = %with_cause(&e), "promotion read failed");
                            ok = false;
                            break;
                        }
                    }
                }
                ok
            }
            Err(status) => {
                tracing::warn!(key = %task.key, error = status.describe(), "promotion target unwritable");
                false
            }
        };
        if !written {
            return false;
        }
        match file.finish() {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(key = %task.key, error = %with_cause(&e), "promotion source corrupt");
                false
            }
        }
    }

    /// Copies a group of tasks concurrently and reports them.
    async fn offload_group(&self, group: &[OffloadTask]) -> Result<()> {
        let mut copies = tokio::task::JoinSet::new();
        for (i, task) in group.iter().enumerate() {
            let copier = Copier {
                disk: self.disk.clone(),
                segments: self.segments.clone(),
            };
            let task = task.clone();
            copies.spawn(async move { (i, copier.offload(&task).await) });
        }
        let mut done = vec![false; group.len()];
        while let Some(joined) = copies.join_next().await {
            if let Ok((i, ok)) = joined {
                done[i] = ok;
            }
        }
        let results: Vec<OffloadResult> = group
            .iter()
            .zip(done)
            .map(|(task, ok)| OffloadResult {
                tenant: task.tenant.clone(),
                key: task.key.clone(),
                disk_replica_id: task.disk_replica_id,
                ok,
            })
            .collect();
        let answers = self
            .master
            .notify_offload(NotifyOffloadRequest {
                client_id: self.master.client_id(),
                results: results.clone(),
            })
            .await?;
        for (result, answer) in results.iter().zip(answers) {
            if result.ok && answer.0.is_err() {
                // The object changed while we copied it: the file is not wanted.
                self.disk.delete(result.disk_replica_id.0);
            }
        }
        Ok(())
    }
}

/// What one offload copy needs.
struct Copier {
    disk: Arc<DiskStore>,
    segments: SegmentTable,
}

impl Copier {
    /// Copies one memory replica of this node into a disk file, straight from the segment (the
    /// range stays read-locked while it streams to the file).
    async fn offload(&self, task: &OffloadTask) -> bool {
        let source = &task.source;
        let segment = self.segments.read().get(&source.segment_id).cloned();
        let Some(segment) = segment else {
            tracing::warn!(key = %task.key, "offload source is not a segment of this node");
            return false;
        };
        let view = match segment.read_view(source.address, source.size).await {
            Ok(view) => view,
            Err(status) => {
                tracing::warn!(key = %task.key, error = status.describe(), "offload source unreadable");
                return false;
            }
        };
        let written = self
            .disk
            .write_from(
                task.disk_replica_id.0,
                &task.tenant,
                &task.key,
                source.size,
                &mut &view[..],
            )
            .await;
        drop(view);
        match written {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(key = %task.key, error = %with_cause(&e), "offload to disk failed");
                false
            }
        }
    }
}
