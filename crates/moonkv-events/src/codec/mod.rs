//! Event types and the byte-exact MessagePack encoder for the KV event stream.
//!
//! Field order is fixed and documented in `docs/events.md`; it follows the upstream
//! publisher's layout where one exists. Map headers are sized by [`entry_count`], the same
//! function whose flags decide which pairs are written, so count and content cannot drift.

pub(crate) mod write;

use rmp::encode::ByteBuf;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

use crate::error::EventsError;

/// Most events one ZMQ message carries.
pub const MAX_EVENTS_PER_MESSAGE: usize = 64;

/// Default bound of the publisher queue, in events.
pub const DEFAULT_QUEUE_CAPACITY: usize = 65_536;

pub use moonkv_proto::Medium;

/// What happened to an object (or, for `Cleared`, to a whole tenant).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// The object became readable on the event's medium.
    Stored,
    /// The object stopped being readable on the event's medium.
    Removed,
    /// Every object under the event's backend and tenant is gone.
    Cleared,
}

impl EventKind {
    /// The `event_type` value: `stored`, `removed` or `cleared`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Stored => "stored",
            EventKind::Removed => "removed",
            EventKind::Cleared => "cleared",
        }
    }

    /// The legacy `type` value: `BlockStored`, `BlockRemoved` or `AllBlocksCleared`.
    pub fn legacy_name(self) -> &'static str {
        match self {
            EventKind::Stored => "BlockStored",
            EventKind::Removed => "BlockRemoved",
            EventKind::Cleared => "AllBlocksCleared",
        }
    }

    /// Parses an `event_type` value.
    pub fn parse(s: &[u8]) -> Option<EventKind> {
        match s {
            b"stored" => Some(EventKind::Stored),
            b"removed" => Some(EventKind::Removed),
            b"cleared" => Some(EventKind::Cleared),
            _ => None,
        }
    }

    /// Parses a legacy `type` value.
    pub fn parse_legacy(s: &[u8]) -> Option<EventKind> {
        match s {
            b"BlockStored" => Some(EventKind::Stored),
            b"BlockRemoved" => Some(EventKind::Removed),
            b"AllBlocksCleared" => Some(EventKind::Cleared),
            _ => None,
        }
    }
}

/// One change the master reports, before it is given an id and a timestamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEvent {
    /// Stored, removed or cleared.
    pub kind: EventKind,
    /// The object's tenant, written verbatim (borrowed when it is a static name, as the
    /// `default` tenant is: no copy per event).
    pub tenant_id: Cow<'static, str>,
    /// The raw Store key; `None` for cleared. A per-object event without one is not sent.
    pub object_key: Option<String>,
    /// The object's group; `None` (or empty) is sent as nil.
    pub group_id: Option<String>,
    /// The medium gained or lost; `None` for cleared.
    pub medium: Option<Medium>,
}

impl KvEvent {
    /// A `stored` event for one medium of one object.
    pub fn stored(
        tenant_id: impl Into<Cow<'static, str>>,
        object_key: impl Into<String>,
        medium: Medium,
    ) -> Self {
        Self::per_object(
            EventKind::Stored,
            tenant_id.into(),
            object_key.into(),
            medium,
        )
    }

    /// A `removed` event for one medium of one object.
    pub fn removed(
        tenant_id: impl Into<Cow<'static, str>>,
        object_key: impl Into<String>,
        medium: Medium,
    ) -> Self {
        Self::per_object(
            EventKind::Removed,
            tenant_id.into(),
            object_key.into(),
            medium,
        )
    }

    /// A `cleared` event: every object of the tenant is gone.
    pub fn cleared(tenant_id: impl Into<Cow<'static, str>>) -> Self {
        KvEvent {
            kind: EventKind::Cleared,
            tenant_id: tenant_id.into(),
            object_key: None,
            group_id: None,
            medium: None,
        }
    }

    /// The same event with a group id.
    pub fn with_group(mut self, group_id: impl Into<String>) -> Self {
        self.group_id = Some(group_id.into());
        self
    }

    fn per_object(
        kind: EventKind,
        tenant_id: Cow<'static, str>,
        object_key: String,
        medium: Medium,
    ) -> Self {
        KvEvent {
            kind,
            tenant_id,
            object_key: Some(object_key),
            group_id: None,
            medium: Some(medium),
        }
    }
}

/// Publisher configuration (the master's `kv_events_*` settings).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventConfig {
    /// Identifies this store in every event; must be non-empty.
    pub backend_id: String,
    /// Sent as `model_name`; `None` or empty is nil.
    pub model_name: Option<String>,
    /// Sent as `block_size`; 0 is nil.
    pub block_size: u32,
    /// Sent as `additional_salt`; `None` or empty is nil.
    pub additional_salt: Option<String>,
    /// Sent as `lora_name`; `None` or empty is nil.
    pub lora_name: Option<String>,
    /// Sent as `dp_rank` in every event and as the payload's third element.
    pub dp_rank: u32,
    /// Also emit the legacy `type`, `block_hashes` and `parent_block_hash` fields.
    pub emit_legacy_compat: bool,
    /// Emit `object_key`; when false, stored and removed are suppressed entirely.
    pub emit_object_key: bool,
    /// Queue bound in events; when full the oldest event is dropped. 0 means unbounded.
    pub queue_capacity: usize,
    /// ZMQ endpoint the PUB socket binds, e.g. `tcp://*:5557` or `tcp://127.0.0.1:0`.
    pub bind_endpoint: String,
}

impl Default for EventConfig {
    fn default() -> Self {
        EventConfig {
            backend_id: String::new(),
            model_name: None,
            block_size: 0,
            additional_salt: None,
            lora_name: None,
            dp_rank: 0,
            emit_legacy_compat: true,
            emit_object_key: true,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            bind_endpoint: String::new(),
        }
    }
}

impl EventConfig {
    /// Defaults plus the two settings that have none.
    pub fn new(backend_id: impl Into<String>, bind_endpoint: impl Into<String>) -> Self {
        EventConfig {
            backend_id: backend_id.into(),
            bind_endpoint: bind_endpoint.into(),
            ..Self::default()
        }
    }

    /// Rejects a configuration the publisher cannot run with.
    pub fn validate(&self) -> Result<(), EventsError> {
        if self.backend_id.is_empty() {
            return Err(EventsError::Config("backend_id must be non-empty".into()));
        }
        if self.bind_endpoint.trim().is_empty() {
            return Err(EventsError::Config("bind_endpoint must be set".into()));
        }
        Ok(())
    }
}

/// An event with the id and timestamp the publisher assigned when it was enqueued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StampedEvent {
    /// Monotonic per publisher process, starting at 1.
    pub event_id: u64,
    /// Milliseconds since the Unix epoch at enqueue time.
    pub timestamp_ms: i64,
    /// The event itself.
    pub event: KvEvent,
}

/// Number of map entries one event is written with; the writer consults the same flags.
pub fn entry_count(kind: EventKind, emit_legacy_compat: bool, emit_object_key: bool) -> u32 {
    let legacy = u32::from(emit_legacy_compat);
    let envelope = 11 + legacy; // + `type`
    match kind {
        EventKind::Cleared => envelope,
        EventKind::Removed | EventKind::Stored => {
            // group_id, seq_hashes, base_block_idx, [object_key], [block_hashes]
            let per_object = 3 + u32::from(emit_object_key) + legacy;
            // parent_hash, token_ids, [parent_block_hash]
            let stored = if kind == EventKind::Stored {
                2 + legacy
            } else {
                0
            };
            envelope + per_object + stored
        }
    }
}

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

fn pre_encode(f: impl FnOnce(&mut ByteBuf)) -> Vec<u8> {
    let mut out = Vec::new();
    write::appending(&mut out, f);
    out
}

/// Copies bytes [`pre_encode`] produced.
fn copy(out: &mut ByteBuf, pre_encoded: &[u8]) {
    out.as_mut_vec().extend_from_slice(pre_encoded);
}

/// Encodes events and batches for one publisher configuration.
///
/// The configuration-derived fields are pre-encoded once, so encoding an event writes only
/// what varies per event and allocates nothing beyond growing the caller's buffer.
#[derive(Debug, Clone)]
pub struct Encoder {
    emit_legacy_compat: bool,
    emit_object_key: bool,
    dp_rank: u32,
    /// `model_name`, `block_size`, `additional_salt`, `lora_name` pairs.
    config_pairs: Vec<u8>,
    /// The `backend_id` pair.
    backend_pair: Vec<u8>,
    /// The `dp_rank` pair.
    dp_rank_pair: Vec<u8>,
}

impl Encoder {
    /// Pre-encodes the configuration's constant fields.
    pub fn new(cfg: &EventConfig) -> Self {
        let config_pairs = pre_encode(|out| {
            write::str(out, "model_name");
            write::opt_str(out, non_empty(&cfg.model_name));
            write::str(out, "block_size");
            match cfg.block_size {
                0 => write::nil(out),
                n => write::uint(out, u64::from(n)),
            }
            write::str(out, "additional_salt");
            write::opt_str(out, non_empty(&cfg.additional_salt));
            write::str(out, "lora_name");
            write::opt_str(out, non_empty(&cfg.lora_name));
        });
        let backend_pair = pre_encode(|out| {
            write::str(out, "backend_id");
            write::str(out, &cfg.backend_id);
        });
        let dp_rank_pair = pre_encode(|out| {
            write::str(out, "dp_rank");
            write::uint(out, u64::from(cfg.dp_rank));
        });

        Encoder {
            emit_legacy_compat: cfg.emit_legacy_compat,
            emit_object_key: cfg.emit_object_key,
            dp_rank: cfg.dp_rank,
            config_pairs,
            backend_pair,
            dp_rank_pair,
        }
    }

    /// Appends one event map.
    pub fn encode_event(&self, out: &mut Vec<u8>, stamped: &StampedEvent) {
        write::appending(out, |out| self.write_event(out, stamped));
    }

    fn write_event(&self, out: &mut ByteBuf, stamped: &StampedEvent) {
        let ev = &stamped.event;
        let legacy = self.emit_legacy_compat;
        write::map_len(out, entry_count(ev.kind, legacy, self.emit_object_key));

        write::str(out, "event_id");
        write::uint(out, stamped.event_id);
        write::str(out, "timestamp");
        write::sint(out, stamped.timestamp_ms);
        write::str(out, "event_type");
        write::str(out, ev.kind.as_str());
        if legacy {
            write::str(out, "type");
            write::str(out, ev.kind.legacy_name());
        }
        copy(out, &self.config_pairs);
        write::str(out, "tenant_id");
        write::str(out, &ev.tenant_id);
        copy(out, &self.backend_pair);
        write::str(out, "medium");
        match (ev.kind, ev.medium) {
            (EventKind::Stored | EventKind::Removed, Some(m)) => write::str(out, m.as_str()),
            _ => write::nil(out),
        }
        copy(out, &self.dp_rank_pair);
        if ev.kind == EventKind::Cleared {
            return;
        }

        write::str(out, "group_id");
        write::opt_str(out, non_empty(&ev.group_id));
        if self.emit_object_key {
            write::str(out, "object_key");
            write::opt_str(out, ev.object_key.as_deref());
        }
        // moonkv never parses keys into token blocks, so the hash lists are always empty
        write::str(out, "seq_hashes");
        write::array_len(out, 0);
        if legacy {
            write::str(out, "block_hashes");
            write::array_len(out, 0);
        }
        write::str(out, "base_block_idx");
        write::nil(out);
        if ev.kind == EventKind::Stored {
            write::str(out, "parent_hash");
            write::nil(out);
            write::str(out, "token_ids");
            write::nil(out);
            if legacy {
                write::str(out, "parent_block_hash");
                write::nil(out);
            }
        }
    }

    /// Appends one message payload: `[timestamp_ms, [event_map, ...], dp_rank]`.
    ///
    /// The publisher never passes more than [`MAX_EVENTS_PER_MESSAGE`] events; the encoder
    /// itself writes whatever it is given.
    pub fn encode_batch(&self, out: &mut Vec<u8>, timestamp_ms: i64, events: &[StampedEvent]) {
        write::appending(out, |out| {
            write::array_len(out, 3);
            write::sint(out, timestamp_ms);
            write::array_len(out, u32::try_from(events.len()).unwrap_or(u32::MAX));
            for ev in events {
                self.write_event(out, ev);
            }
            write::uint(out, u64::from(self.dp_rank));
        });
    }
}

/// Encodes one payload for `cfg` into a fresh buffer (convenience over [`Encoder`]).
pub fn encode_batch(cfg: &EventConfig, timestamp_ms: i64, events: &[StampedEvent]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 320);
    Encoder::new(cfg).encode_batch(&mut out, timestamp_ms, events);
    out
}

/// The second frame of a message: the sequence number, 8 bytes big-endian.
pub fn sequence_frame(sequence: u64) -> [u8; 8] {
    sequence.to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subscriber::decode_message;
    use crate::subscriber::reader::{Reader, Token};

    fn cfg(legacy: bool, key: bool) -> EventConfig {
        EventConfig {
            emit_legacy_compat: legacy,
            emit_object_key: key,
            ..EventConfig::new("b1", "tcp://127.0.0.1:0")
        }
    }

    fn stamped(event: KvEvent) -> StampedEvent {
        StampedEvent {
            event_id: 1,
            timestamp_ms: 1_739_145_600_000,
            event,
        }
    }

    #[test]
    fn map_sizes_match_the_documented_counts() {
        // (kind, legacy, object_key) -> entries, as tabulated in docs/events.md
        let table = [
            (EventKind::Stored, [[20, 19], [17, 16]]),
            (EventKind::Removed, [[17, 16], [15, 14]]),
            (EventKind::Cleared, [[12, 12], [11, 11]]),
        ];
        for (kind, by_legacy) in table {
            for (legacy, by_key) in [true, false].into_iter().zip(by_legacy) {
                for (key, want) in [true, false].into_iter().zip(by_key) {
                    assert_eq!(
                        entry_count(kind, legacy, key),
                        want,
                        "{kind:?} legacy={legacy} key={key}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_shape_decodes_with_its_declared_entry_count() {
        let events = [
            KvEvent::stored("t", "k", Medium::Cpu).with_group("g"),
            KvEvent::removed("t", "k", Medium::Disk),
            KvEvent::cleared("t"),
        ];
        for legacy in [false, true] {
            for key in [false, true] {
                let enc = Encoder::new(&cfg(legacy, key));
                for ev in &events {
                    let mut out = Vec::new();
                    enc.encode_event(&mut out, &stamped(ev.clone()));
                    let mut r = Reader::new(&out);
                    let want = entry_count(ev.kind, legacy, key);
                    assert_eq!(r.next(), Ok(Token::Map(want)));
                    let mut r = Reader::new(&out);
                    r.skip_value().expect("well-formed map");
                    assert_eq!(r.remaining(), 0, "{ev:?} legacy={legacy} key={key}");
                }
            }
        }
    }

    #[test]
    fn batch_round_trips_through_the_decoder() {
        let enc = Encoder::new(&cfg(true, true));
        let events: Vec<_> = (1..=64u64)
            .map(|i| StampedEvent {
                event_id: i,
                timestamp_ms: 5,
                event: KvEvent::stored("tenant", format!("key-{i}"), Medium::Disk),
            })
            .collect();
        let mut payload = Vec::new();
        enc.encode_batch(&mut payload, 7, &events);
        let frames: [&[u8]; 3] = [b"", &sequence_frame(9), &payload];
        let (seq, decoded) = decode_message(&frames).expect("decodes");
        assert_eq!(seq, 9);
        assert_eq!(decoded.len(), 64);
        assert_eq!(decoded[63].object_key.as_deref(), Some("key-64"));
        assert_eq!(decoded[63].event_id, Some(64));
        assert_eq!(decoded[0].medium.as_deref(), Some("disk"));
    }

    #[test]
    fn empty_config_strings_and_zero_block_size_are_nil() {
        let mut c = cfg(false, true);
        c.model_name = Some(String::new());
        c.lora_name = Some("lora".into());
        let enc = Encoder::new(&c);
        let want: &[u8] =
            b"\xaamodel_name\xc0\xaablock_size\xc0\xafadditional_salt\xc0\xa9lora_name\xa4lora";
        assert_eq!(enc.config_pairs, want);
    }

    #[test]
    fn medium_and_kind_spellings() {
        assert_eq!(Medium::parse("CPU"), Some(Medium::Cpu));
        assert_eq!(Medium::parse("disk"), Some(Medium::Disk));
        assert_eq!(Medium::parse("gpu"), None);
        for k in [EventKind::Stored, EventKind::Removed, EventKind::Cleared] {
            assert_eq!(EventKind::parse(k.as_str().as_bytes()), Some(k));
            assert_eq!(EventKind::parse_legacy(k.legacy_name().as_bytes()), Some(k));
        }
    }

    #[test]
    fn config_validation() {
        assert!(EventConfig::default().validate().is_err());
        assert!(EventConfig::new("", "tcp://*:1").validate().is_err());
        assert!(EventConfig::new("b", " ").validate().is_err());
        assert!(EventConfig::new("b", "tcp://*:1").validate().is_ok());
    }
}
