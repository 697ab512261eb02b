//! Where objects are readable: (backend, tenant, object key) → set of media.
//!
//! Stored and removed are idempotent per medium; an object disappears once its last medium
//! is removed; cleared drops a whole backend + tenant. A set, not a count, is kept because
//! the publisher does not deduplicate retractions.

use std::collections::HashMap;

use serde::ser::SerializeSeq;
use serde::{Serialize, Serializer};

use super::decode::DecodedEvent;
use crate::codec::{EventKind, Medium};

/// A set of media, at most `{cpu, disk}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MediaSet(u8);

impl MediaSet {
    /// The empty set.
    pub const EMPTY: MediaSet = MediaSet(0);

    fn bit(m: Medium) -> u8 {
        match m {
            Medium::Cpu => 1,
            Medium::Disk => 2,
        }
    }

    /// A set holding the given media.
    pub fn of(media: &[Medium]) -> MediaSet {
        let mut s = MediaSet::EMPTY;
        for &m in media {
            s.insert(m);
        }
        s
    }

    /// Whether `m` is in the set.
    pub fn contains(self, m: Medium) -> bool {
        self.0 & Self::bit(m) != 0
    }

    /// Adds `m`; true if it was new.
    pub fn insert(&mut self, m: Medium) -> bool {
        let new = !self.contains(m);
        self.0 |= Self::bit(m);
        new
    }

    /// Removes `m`; true if it was present.
    pub fn remove(&mut self, m: Medium) -> bool {
        let had = self.contains(m);
        self.0 &= !Self::bit(m);
        had
    }

    /// True when no medium is present.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The media present, cpu first.
    pub fn iter(self) -> impl Iterator<Item = Medium> {
        [Medium::Cpu, Medium::Disk]
            .into_iter()
            .filter(move |m| self.contains(*m))
    }
}

impl Serialize for MediaSet {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(None)?;
        for m in self.iter() {
            seq.serialize_element(m.as_str())?;
        }
        seq.end()
    }
}

/// What applying one event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// The index changed.
    Changed,
    /// The event was valid but already reflected (idempotent repeat).
    Unchanged,
    /// The event lacks what indexing needs (backend, tenant, key or a cpu/disk medium).
    Unindexable(&'static str),
}

/// One object's placement, as listed by [`PlacementIndex::entries`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlacementEntry {
    /// The store.
    pub backend_id: String,
    /// The tenant.
    pub tenant_id: String,
    /// The raw key.
    pub object_key: String,
    /// Where it is readable.
    pub media: MediaSet,
}

type Objects = HashMap<String, MediaSet>;

/// The placement index built from the event stream (and snapshots).
#[derive(Debug, Clone, Default)]
pub struct PlacementIndex {
    backends: HashMap<String, HashMap<String, Objects>>,
    objects: usize,
}

impl PlacementIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one decoded event.
    pub fn apply(&mut self, ev: &DecodedEvent) -> ApplyOutcome {
        let (Some(backend), Some(tenant)) = (ev.backend_id.as_deref(), ev.tenant_id.as_deref())
        else {
            return ApplyOutcome::Unindexable("missing backend_id or tenant_id");
        };
        if ev.kind == EventKind::Cleared {
            return changed(self.clear_tenant(backend, tenant) > 0);
        }
        let Some(key) = ev.object_key.as_deref() else {
            return ApplyOutcome::Unindexable("missing object_key");
        };
        let Some(medium) = ev.medium.as_deref().and_then(Medium::parse) else {
            return ApplyOutcome::Unindexable("medium is not cpu or disk");
        };
        changed(match ev.kind {
            EventKind::Stored => self.store(backend, tenant, key, medium),
            _ => self.remove(backend, tenant, key, medium),
        })
    }

    /// Marks `key` readable on `medium`; true if that is new.
    pub fn store(&mut self, backend: &str, tenant: &str, key: &str, medium: Medium) -> bool {
        let objects = self.tenant_entry(backend, tenant);
        match objects.get_mut(key) {
            Some(media) => media.insert(medium),
            None => {
                objects.insert(key.to_owned(), MediaSet::of(&[medium]));
                self.objects += 1;
                true
            }
        }
    }

    /// Retracts `medium` for `key`, dropping the object when no medium remains; true if
    /// anything changed.
    pub fn remove(&mut self, backend: &str, tenant: &str, key: &str, medium: Medium) -> bool {
        let Some(objects) = self
            .backends
            .get_mut(backend)
            .and_then(|t| t.get_mut(tenant))
        else {
            return false;
        };
        let Some(media) = objects.get_mut(key) else {
            return false;
        };
        let had = media.remove(medium);
        if media.is_empty() {
            objects.remove(key);
            self.objects -= 1;
        }
        had
    }

    /// Drops every object of `backend` + `tenant`; returns how many there were.
    pub fn clear_tenant(&mut self, backend: &str, tenant: &str) -> usize {
        let removed = self
            .backends
            .get_mut(backend)
            .and_then(|t| t.remove(tenant))
            .map_or(0, |o| o.len());
        self.objects -= removed;
        removed
    }

    /// Drops every object of `backend`; returns how many there were.
    pub fn clear_backend(&mut self, backend: &str) -> usize {
        let removed = self
            .backends
            .remove(backend)
            .map_or(0, |t| t.values().map(HashMap::len).sum());
        self.objects -= removed;
        removed
    }

    /// Drops every object of `tenant` under any backend; returns how many there were.
    pub fn clear_tenant_everywhere(&mut self, tenant: &str) -> usize {
        let removed: usize = self
            .backends
            .values_mut()
            .filter_map(|t| t.remove(tenant))
            .map(|o| o.len())
            .sum();
        self.objects -= removed;
        removed
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        self.backends.clear();
        self.objects = 0;
    }

    /// The media `key` is readable on (empty if unknown).
    pub fn media(&self, backend: &str, tenant: &str, key: &str) -> MediaSet {
        self.backends
            .get(backend)
            .and_then(|t| t.get(tenant))
            .and_then(|o| o.get(key))
            .copied()
            .unwrap_or(MediaSet::EMPTY)
    }

    /// Number of objects with at least one medium.
    pub fn len(&self) -> usize {
        self.objects
    }

    /// True when no object is indexed.
    pub fn is_empty(&self) -> bool {
        self.objects == 0
    }

    /// Every object, sorted by backend, tenant and key.
    pub fn entries(&self) -> Vec<PlacementEntry> {
        let mut out = Vec::with_capacity(self.objects);
        for (backend, tenants) in &self.backends {
            for (tenant, objects) in tenants {
                for (key, media) in objects {
                    out.push(PlacementEntry {
                        backend_id: backend.clone(),
                        tenant_id: tenant.clone(),
                        object_key: key.clone(),
                        media: *media,
                    });
                }
            }
        }
        out.sort_by(|a, b| {
            (&a.backend_id, &a.tenant_id, &a.object_key).cmp(&(
                &b.backend_id,
                &b.tenant_id,
                &b.object_key,
            ))
        });
        out
    }

    fn tenant_entry(&mut self, backend: &str, tenant: &str) -> &mut Objects {
        // Look up by &str first so the steady state allocates nothing.
        if !self.backends.contains_key(backend) {
            self.backends.insert(backend.to_owned(), HashMap::new());
        }
        let tenants = self.backends.get_mut(backend).expect("inserted above");
        if !tenants.contains_key(tenant) {
            tenants.insert(tenant.to_owned(), HashMap::new());
        }
        tenants.get_mut(tenant).expect("inserted above")
    }
}

fn changed(yes: bool) -> ApplyOutcome {
    if yes {
        ApplyOutcome::Changed
    } else {
        ApplyOutcome::Unchanged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(
        kind: EventKind,
        tenant: &str,
        key: Option<&str>,
        medium: Option<&str>,
    ) -> DecodedEvent {
        DecodedEvent {
            event_id: None,
            timestamp_ms: None,
            kind,
            tenant_id: Some(tenant.into()),
            backend_id: Some("b".into()),
            medium: medium.map(Into::into),
            object_key: key.map(Into::into),
            group_id: None,
            model_name: None,
            block_size: None,
            additional_salt: None,
            lora_name: None,
            dp_rank: None,
        }
    }

    #[test]
    fn stored_and_removed_are_idempotent_per_medium() {
        let mut idx = PlacementIndex::new();
        let st = |m| event(EventKind::Stored, "t", Some("k"), Some(m));
        let rm = |m| event(EventKind::Removed, "t", Some("k"), Some(m));
        assert_eq!(idx.apply(&st("cpu")), ApplyOutcome::Changed);
        assert_eq!(idx.apply(&st("cpu")), ApplyOutcome::Unchanged);
        assert_eq!(idx.apply(&st("disk")), ApplyOutcome::Changed);
        assert_eq!(idx.len(), 1);
        // a cpu retraction leaves the disk copy
        assert_eq!(idx.apply(&rm("cpu")), ApplyOutcome::Changed);
        assert_eq!(idx.apply(&rm("cpu")), ApplyOutcome::Unchanged);
        assert_eq!(idx.media("b", "t", "k"), MediaSet::of(&[Medium::Disk]));
        assert_eq!(idx.apply(&rm("disk")), ApplyOutcome::Changed);
        assert!(idx.is_empty());
        assert_eq!(idx.apply(&rm("disk")), ApplyOutcome::Unchanged);
        assert!(idx.entries().is_empty());
    }

    #[test]
    fn cleared_drops_only_its_backend_and_tenant() {
        let mut idx = PlacementIndex::new();
        idx.store("b", "t1", "x", Medium::Cpu);
        idx.store("b", "t1", "y", Medium::Disk);
        idx.store("b", "t2", "x", Medium::Cpu);
        idx.store("other", "t1", "x", Medium::Cpu);
        assert_eq!(
            idx.apply(&event(EventKind::Cleared, "t1", None, None)),
            ApplyOutcome::Changed
        );
        assert_eq!(idx.len(), 2);
        assert!(idx.media("b", "t1", "x").is_empty());
        assert!(idx.media("other", "t1", "x").contains(Medium::Cpu));
        assert_eq!(
            idx.apply(&event(EventKind::Cleared, "t1", None, None)),
            ApplyOutcome::Unchanged
        );
        assert_eq!(idx.clear_backend("b"), 1);
        assert_eq!(idx.clear_tenant_everywhere("t1"), 1);
        assert!(idx.is_empty());
    }

    #[test]
    fn unindexable_events_are_reported_not_applied() {
        let mut idx = PlacementIndex::new();
        let no_key = event(EventKind::Stored, "t", None, Some("cpu"));
        assert!(matches!(idx.apply(&no_key), ApplyOutcome::Unindexable(_)));
        let gpu = event(EventKind::Stored, "t", Some("k"), Some("GPU"));
        assert!(matches!(idx.apply(&gpu), ApplyOutcome::Unindexable(_)));
        let mut no_backend = event(EventKind::Cleared, "t", None, None);
        no_backend.backend_id = None;
        assert!(matches!(
            idx.apply(&no_backend),
            ApplyOutcome::Unindexable(_)
        ));
        // medium spelling is case-insensitive
        assert_eq!(
            idx.apply(&event(EventKind::Stored, "t", Some("k"), Some("CPU"))),
            ApplyOutcome::Changed
        );
    }

    #[test]
    fn entries_are_sorted_and_serialize_media_as_names() {
        let mut idx = PlacementIndex::new();
        idx.store("b", "t", "z", Medium::Disk);
        idx.store("b", "t", "a", Medium::Disk);
        idx.store("b", "t", "a", Medium::Cpu);
        let entries = idx.entries();
        assert_eq!(entries[0].object_key, "a");
        let json = serde_json::to_string(&entries[0]).expect("serializable");
        assert_eq!(
            json,
            r#"{"backend_id":"b","tenant_id":"t","object_key":"a","media":["cpu","disk"]}"#
        );
    }
}
