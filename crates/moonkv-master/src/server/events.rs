//! The bridge from engine availability changes to the KV event publisher.

use super::config::KvEventsSettings;
use crate::engine::{AvailabilitySink, Medium};
use moonkv_events::{EventConfig, KvEvent, Publisher, PublisherStatus};
use moonkv_proto::TenantId;
use parking_lot::RwLock;
use std::borrow::Cow;

/// Owns the publisher (if events are on) and turns engine callbacks into events.
///
/// The publisher sits behind a read-write lock only so that shutdown can take it out; the hot
/// path takes the uncontended read side.
pub struct EventHook {
    publisher: RwLock<Option<Publisher>>,
}

impl std::fmt::Debug for EventHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventHook").finish_non_exhaustive()
    }
}

fn to_event_config(s: &KvEventsSettings) -> EventConfig {
    let opt = |v: &str| {
        if v.is_empty() {
            None
        } else {
            Some(v.to_string())
        }
    };
    EventConfig {
        backend_id: s.backend_id.clone(),
        model_name: opt(&s.model_name),
        block_size: s.block_size,
        additional_salt: opt(&s.additional_salt),
        lora_name: opt(&s.lora_name),
        dp_rank: s.dp_rank,
        emit_legacy_compat: s.emit_legacy_compat,
        emit_object_key: s.emit_object_key,
        queue_capacity: s.queue_capacity,
        bind_endpoint: s.bind_endpoint.clone(),
    }
}

/// The KV event publisher did not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the KV event publisher on {endpoint}")]
pub struct EventsStartError {
    /// The endpoint it was to bind.
    pub endpoint: String,
    /// Why it did not.
    #[source]
    pub source: moonkv_events::EventsError,
}

impl EventHook {
    /// A hook that drops every change (events disabled).
    pub fn disabled() -> Self {
        Self {
            publisher: RwLock::new(None),
        }
    }

    /// Starts the publisher when the settings enable it.
    pub fn start(settings: &KvEventsSettings) -> Result<Self, EventsStartError> {
        if !settings.enabled {
            return Ok(Self::disabled());
        }
        let publisher =
            Publisher::start(to_event_config(settings)).map_err(|source| EventsStartError {
                endpoint: settings.bind_endpoint.clone(),
                source,
            })?;
        Ok(Self {
            publisher: RwLock::new(Some(publisher)),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&Publisher) -> T) -> Option<T> {
        let guard = self.publisher.read();
        guard.as_ref().map(f)
    }

    /// The endpoint the publisher is bound to, if events are on.
    pub fn endpoint(&self) -> Option<String> {
        self.with(|p| p.endpoint().to_string())
    }

    /// Status for `/kv_events/status` and metrics.
    pub fn status(&self) -> PublisherStatus {
        self.with(|p| p.status())
            .unwrap_or_else(PublisherStatus::disabled)
    }

    /// Random id of this publisher run (0 when disabled).
    pub fn epoch(&self) -> u64 {
        self.with(|p| p.epoch()).unwrap_or(0)
    }

    /// Drains the queue and stops the publisher thread; later changes are not published.
    pub fn shutdown(&self) {
        let taken = self.publisher.write().take();
        if let Some(p) = taken {
            p.shutdown();
        }
    }

    fn per_object(
        tenant: &TenantId,
        key: &str,
        group_id: Option<&str>,
        medium: Medium,
        stored: bool,
    ) -> KvEvent {
        let m = medium;
        // The default tenant's name is static: its events borrow it instead of copying it.
        let tenant: Cow<'static, str> = if tenant.as_str() == TenantId::DEFAULT {
            Cow::Borrowed(TenantId::DEFAULT)
        } else {
            Cow::Owned(tenant.as_str().to_owned())
        };
        let ev = if stored {
            KvEvent::stored(tenant, key, m)
        } else {
            KvEvent::removed(tenant, key, m)
        };
        match group_id {
            Some(g) if !g.is_empty() => ev.with_group(g),
            _ => ev,
        }
    }
}

impl AvailabilitySink for EventHook {
    fn stored(&self, tenant: &TenantId, key: &str, group_id: Option<&str>, medium: Medium) {
        self.with(|p| p.publish(Self::per_object(tenant, key, group_id, medium, true)));
    }

    fn removed(&self, tenant: &TenantId, key: &str, group_id: Option<&str>, medium: Medium) {
        self.with(|p| p.publish(Self::per_object(tenant, key, group_id, medium, false)));
    }

    fn cleared(&self, tenant: &TenantId) {
        self.with(|p| p.publish(KvEvent::cleared(tenant.as_str().to_owned())));
    }

    fn last_event_id(&self) -> u64 {
        self.with(|p| p.last_event_id()).unwrap_or(0)
    }

    fn inline(&self, work: &mut dyn FnMut()) {
        // The handle, not the lock: `work` publishes through `with` itself.
        match self.with(Publisher::inline) {
            Some(sender) => sender.scope(work),
            None => work(),
        }
    }

    fn inline_deferred(&self, work: &mut dyn FnMut()) -> Option<Box<dyn Send>> {
        match self.with(Publisher::inline) {
            Some(sender) => {
                let ((), deferred) = sender.scope_deferred(work);
                deferred.map(|d| Box::new(d) as Box<dyn Send>)
            }
            None => {
                work();
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, EngineConfig, SystemClock};
    use moonkv_proto::msg::{BatchEndRequest, BatchPutStartRequest, EndItem, MountSegmentRequest};
    use moonkv_proto::{ClientId, ReplicaType, ReplicateConfig, Segment, SegmentId};
    use std::sync::Arc;

    #[test]
    fn the_events_of_work_reported_inline_have_left_when_it_returns() {
        let settings = KvEventsSettings {
            enabled: true,
            bind_endpoint: "tcp://127.0.0.1:0".into(),
            backend_id: "b".into(),
            ..KvEventsSettings::default()
        };
        let hook = Arc::new(EventHook::start(&settings).expect("publisher"));
        let engine = Engine::new(EngineConfig::default(), Arc::new(SystemClock), hook.clone());
        let writer = ClientId::new(7, 1);
        engine
            .mount_segment(&MountSegmentRequest {
                segment: Segment {
                    id: SegmentId::new(7, 1),
                    name: "s".into(),
                    base: 1 << 40,
                    size: 1 << 30,
                    endpoint: "127.0.0.1:1".into(),
                    protocol: "tcp".into(),
                    host_id: "h".into(),
                },
                client_id: writer,
                keeps_catalog: false,
            })
            .expect("mount");
        for round in 0..20u64 {
            let keys: Vec<String> = (0..100).map(|i| format!("k{round}-{i}")).collect();
            let started = engine
                .batch_put_start(&BatchPutStartRequest {
                    client_id: writer,
                    tenant: String::new(),
                    keys: keys.clone(),
                    sizes: vec![4096; keys.len()],
                    config: ReplicateConfig::default(),
                })
                .expect("start");
            let end = BatchEndRequest {
                client_id: writer,
                tenant: String::new(),
                replica_type: ReplicaType::All,
                items: keys
                    .iter()
                    .zip(started)
                    .map(|(key, r)| EndItem {
                        key: key.clone(),
                        replica_ids: r.0.expect("replicas").iter().map(|d| d.id).collect(),
                        checksum: None,
                    })
                    .collect(),
            };
            let ended = engine.reporting_inline(|| engine.batch_put_end(&end).expect("end"));
            assert!(ended.iter().all(|r| r.0.is_ok()));
            // Sent by this thread before `reporting_inline` returned: none waits for the
            // socket thread.
            let status = hook.status();
            assert_eq!(status.last_event_id, 100 * (round + 1));
            assert_eq!(
                (status.published_events, status.queue_len),
                (status.last_event_id, 0),
                "{status:?}"
            );
        }
    }
}
