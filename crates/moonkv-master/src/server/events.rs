//! The bridge from engine availability changes to the KV event publisher.

use super::config::KvEventsSettings;
use crate::engine::{AvailabilitySink, Medium};
use moonkv_events::{EventConfig, KvEvent, Publisher, PublisherStatus};
use moonkv_proto::TenantId;
use parking_lot::RwLock;

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
        let ev = if stored {
            KvEvent::stored(tenant.as_str(), key, m)
        } else {
            KvEvent::removed(tenant.as_str(), key, m)
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
        self.with(|p| p.publish(KvEvent::cleared(tenant.as_str())));
    }

    fn last_event_id(&self) -> u64 {
        self.with(|p| p.last_event_id()).unwrap_or(0)
    }
}
