//! The 1 s ping loop that keeps a segment owner alive on the master and remounts its segments
//! when the master has forgotten them.

use super::{Inner, MasterClient};
use moonkv_proto::msg::{PingRequest, ReMountSegmentRequest};
use moonkv_proto::types::ClientStatus;
use std::sync::Weak;
use std::time::Duration;

/// Runs until the client is dropped (the weak reference dies) or the task is aborted.
pub(super) async fn run(inner: Weak<Inner>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failures: u32 = 0;
    loop {
        ticker.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let client = MasterClient { inner };
        match beat(&client).await {
            Ok(()) => {
                if failures > 0 {
                    tracing::info!(after_failures = failures, "master heartbeat recovered");
                }
                failures = 0;
            }
            Err(e) => {
                failures += 1;
                // Log the first failure and then every tenth, not every second.
                if failures == 1 || failures.is_multiple_of(10) {
                    tracing::warn!(error = %e, failures, "master heartbeat failed");
                }
            }
        }
    }
}

async fn beat(client: &MasterClient) -> moonkv_proto::Result<()> {
    let timeout = client
        .config()
        .ping_interval
        .max(Duration::from_millis(500))
        * 2;
    let mounted = client.inner.segments.lock().len() as u32;
    let request = moonkv_proto::msg::Request::Ping(PingRequest {
        client_id: client.client_id(),
        mounted_segments: mounted,
    });
    let answer: moonkv_proto::PingResponse = client.call_with_timeout(request, timeout).await?;
    if answer.client_status == ClientStatus::NeedRemount {
        let segments = client.inner.segments.lock().clone();
        tracing::info!(
            segments = segments.len(),
            "master asked for a remount; re-registering segments"
        );
        let hook = client.inner.remount_hook.lock().clone();
        client
            .remount_segment(ReMountSegmentRequest {
                segments,
                client_id: client.client_id(),
                adopt: hook.is_some(),
            })
            .await?;
        if let Some(hook) = hook {
            let run = tokio::spawn(hook.remounted(
                client.clone(),
                answer.master_epoch,
                answer.merges_returning,
            ));
            if let Some(previous) = client.inner.hook_task.lock().replace(run) {
                previous.abort();
            }
        }
    }
    Ok(())
}
