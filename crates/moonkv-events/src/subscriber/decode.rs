//! Tolerant decoding of KV event messages.
//!
//! Envelope problems (frame count, sequence width, payload shape, truncation) reject the
//! whole message. Inside a well-formed batch each event is judged on its own, so one odd
//! event does not cost the other 63. Fields are read by name; unknown fields, the legacy
//! aliases and the upstream master's variants (`dp_rank` nil, `base_block_idx` 0, signed
//! `block_hashes`) are accepted.

use std::fmt::Write as _;

use serde::Serialize;

use super::reader::{Reader, Token};
use crate::codec::{EventKind, MAX_EVENTS_PER_MESSAGE};
use crate::error::DecodeError;

/// One event as read from the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DecodedEvent {
    /// Per-publisher-process event id, if the producer sends one.
    pub event_id: Option<u64>,
    /// The event's `timestamp`, in milliseconds.
    #[serde(rename = "timestamp")]
    pub timestamp_ms: Option<i64>,
    /// Stored, removed or cleared (from `event_type`, or the legacy `type`).
    #[serde(rename = "event_type")]
    pub kind: EventKind,
    /// The tenant the event belongs to.
    pub tenant_id: Option<String>,
    /// The store that emitted it.
    pub backend_id: Option<String>,
    /// The medium as sent (`cpu` / `disk` from moonkv and Mooncake).
    pub medium: Option<String>,
    /// The raw object key.
    pub object_key: Option<String>,
    /// The object's group (an integer group is rendered in decimal).
    pub group_id: Option<String>,
    /// `model_name` from the producer's configuration.
    pub model_name: Option<String>,
    /// `block_size` from the producer's configuration.
    pub block_size: Option<u64>,
    /// `additional_salt` from the producer's configuration.
    pub additional_salt: Option<String>,
    /// `lora_name` from the producer's configuration.
    pub lora_name: Option<String>,
    /// `dp_rank` from the producer's configuration.
    pub dp_rank: Option<u64>,
}

/// One decoded ZMQ message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedMessage {
    /// Frame 1, the transport sequence number.
    pub sequence: u64,
    /// Payload element 0 in milliseconds (a float is taken as seconds and converted).
    pub timestamp_ms: i64,
    /// Payload element 2, absent in 2-element batches or nil.
    pub dp_rank: Option<i64>,
    /// Events that decoded, in stream order.
    pub events: Vec<DecodedEvent>,
    /// Events inside the batch that were rejected and skipped.
    pub rejected_events: u32,
    /// Why the first rejected event was rejected.
    pub first_rejection: Option<DecodeError>,
}

/// Decodes a three-frame message into its sequence number and events; rejected events
/// inside an otherwise valid batch are skipped (see [`decode_message_detailed`] to count them).
pub fn decode_message<F: AsRef<[u8]>>(
    frames: &[F],
) -> Result<(u64, Vec<DecodedEvent>), DecodeError> {
    let msg = decode_message_detailed(frames)?;
    Ok((msg.sequence, msg.events))
}

/// Decodes a three-frame message, reporting rejected events as well.
pub fn decode_message_detailed<F: AsRef<[u8]>>(
    frames: &[F],
) -> Result<DecodedMessage, DecodeError> {
    if frames.len() != 3 {
        return Err(DecodeError::FrameCount(frames.len()));
    }
    let seq = frames[1].as_ref();
    let seq: [u8; 8] = seq
        .try_into()
        .map_err(|_| DecodeError::SequenceLength(seq.len()))?;
    let mut msg = decode_payload(frames[2].as_ref())?;
    msg.sequence = u64::from_be_bytes(seq);
    Ok(msg)
}

/// Decodes a payload `[timestamp, [event, ...], dp_rank?]` (sequence left at 0).
pub fn decode_payload(payload: &[u8]) -> Result<DecodedMessage, DecodeError> {
    let mut r = Reader::new(payload);
    let items = match r.next()? {
        Token::Array(n @ 2..=3) => n,
        Token::Array(n) => return Err(DecodeError::BatchShape(n)),
        t => return Err(unexpected("payload", "array", t)),
    };
    let timestamp_ms = match r.next()? {
        Token::Uint(v) => i64::try_from(v).unwrap_or(i64::MAX),
        Token::Int(v) => v,
        Token::Float(secs) => (secs * 1000.0) as i64,
        t => return Err(unexpected("payload timestamp", "number", t)),
    };
    let count = match r.next()? {
        Token::Array(n) => n,
        t => return Err(unexpected("payload events", "array", t)),
    };
    // `count` is bounded by the payload size, but an event decodes to far more memory than
    // its minimum encoding, so reserve for a normal batch only and let a larger one grow.
    let mut msg = DecodedMessage {
        sequence: 0,
        timestamp_ms,
        dp_rank: None,
        events: Vec::with_capacity((count as usize).min(MAX_EVENTS_PER_MESSAGE)),
        rejected_events: 0,
        first_rejection: None,
    };
    for _ in 0..count {
        match decode_event(&mut r)? {
            Ok(ev) => msg.events.push(ev),
            Err(e) => {
                msg.rejected_events += 1;
                msg.first_rejection.get_or_insert(e);
            }
        }
    }
    if items == 3 {
        msg.dp_rank = match r.next()? {
            Token::Uint(v) => Some(i64::try_from(v).unwrap_or(i64::MAX)),
            Token::Int(v) => Some(v),
            Token::Nil => None,
            t => return Err(unexpected("payload dp_rank", "integer or nil", t)),
        };
    }
    if r.remaining() != 0 {
        return Err(DecodeError::TrailingBytes(r.remaining()));
    }
    Ok(msg)
}

fn unexpected(field: &'static str, expected: &'static str, found: Token<'_>) -> DecodeError {
    DecodeError::UnexpectedType {
        field,
        expected,
        found: found.kind_name(),
    }
}

/// Fields the decoder recognizes; the discriminant doubles as a duplicate-detection bit.
#[derive(Clone, Copy)]
enum Field {
    EventId,
    Timestamp,
    EventType,
    LegacyType,
    TenantId,
    BackendId,
    Medium,
    ObjectKey,
    GroupId,
    ModelName,
    BlockSize,
    AdditionalSalt,
    LoraName,
    DpRank,
}

impl Field {
    /// Every event carries about twenty keys, so the lookup narrows by length and first
    /// and last byte (unique across the known names) before one full comparison.
    fn from_key(key: &[u8]) -> Option<(Field, &'static str)> {
        let (&first, &last) = (key.first()?, key.last()?);
        let (field, name) = match (key.len(), first, last) {
            (8, b'e', b'd') => (Field::EventId, "event_id"),
            (9, b't', b'p') => (Field::Timestamp, "timestamp"),
            (10, b'e', b'e') => (Field::EventType, "event_type"),
            (4, b't', b'e') => (Field::LegacyType, "type"),
            (9, b't', b'd') => (Field::TenantId, "tenant_id"),
            (10, b'b', b'd') => (Field::BackendId, "backend_id"),
            (6, b'm', b'm') => (Field::Medium, "medium"),
            (10, b'o', b'y') => (Field::ObjectKey, "object_key"),
            (8, b'g', b'd') => (Field::GroupId, "group_id"),
            (10, b'm', b'e') => (Field::ModelName, "model_name"),
            (10, b'b', b'e') => (Field::BlockSize, "block_size"),
            (15, b'a', b't') => (Field::AdditionalSalt, "additional_salt"),
            (9, b'l', b'e') => (Field::LoraName, "lora_name"),
            (7, b'd', b'k') => (Field::DpRank, "dp_rank"),
            _ => return None,
        };
        (key == name.as_bytes()).then_some((field, name))
    }
}

#[derive(Default)]
struct EventFields {
    event_id: Option<u64>,
    timestamp_ms: Option<i64>,
    event_type: Option<EventKind>,
    legacy_type: Option<EventKind>,
    tenant_id: Option<String>,
    backend_id: Option<String>,
    medium: Option<String>,
    object_key: Option<String>,
    group_id: Option<String>,
    model_name: Option<String>,
    block_size: Option<u64>,
    additional_salt: Option<String>,
    lora_name: Option<String>,
    dp_rank: Option<u64>,
}

/// Decodes one event in a single pass. The outer error is structural and fatal for the
/// message; the inner one rejects only this event, whose bytes have then been consumed.
fn decode_event(r: &mut Reader<'_>) -> Result<Result<DecodedEvent, DecodeError>, DecodeError> {
    let entries = match r.next()? {
        Token::Map(n) => n,
        t => {
            r.skip_contents(t)?;
            return Ok(Err(unexpected("event", "map", t)));
        }
    };
    let mut f = EventFields::default();
    let mut seen: u32 = 0;
    let mut rejection = None;
    for _ in 0..entries {
        let key = r.next()?;
        r.skip_contents(key)?;
        let value = r.next()?;
        r.skip_contents(value)?;
        // a non-string key cannot name a field we know
        let Some((field, name)) = (match key {
            Token::Str(k) => Field::from_key(k),
            _ => None,
        }) else {
            continue;
        };
        if rejection.is_some() {
            continue; // keep consuming the map so the next event starts in the right place
        }
        let bit = 1u32 << field as u32;
        if seen & bit != 0 {
            rejection = Some(DecodeError::DuplicateField(name));
            continue;
        }
        seen |= bit;
        let read = if matches!(value, Token::Array(_) | Token::Map(_)) {
            Err(unexpected(name, "scalar", value))
        } else {
            read_field(&mut f, field, name, value)
        };
        if let Err(e) = read {
            rejection = Some(e);
        }
    }
    Ok(match rejection {
        Some(e) => Err(e),
        None => finish_event(f),
    })
}

fn read_field(
    f: &mut EventFields,
    field: Field,
    name: &'static str,
    value: Token<'_>,
) -> Result<(), DecodeError> {
    match field {
        Field::EventId => f.event_id = opt_uint(name, value)?,
        Field::Timestamp => {
            f.timestamp_ms = match value {
                Token::Uint(v) => Some(i64::try_from(v).unwrap_or(i64::MAX)),
                Token::Int(v) => Some(v),
                Token::Float(v) => Some(v as i64),
                Token::Nil => None,
                t => return Err(unexpected(name, "integer", t)),
            }
        }
        Field::EventType => f.event_type = Some(kind(value, name, EventKind::parse)?),
        Field::LegacyType => f.legacy_type = Some(kind(value, name, EventKind::parse_legacy)?),
        Field::TenantId => f.tenant_id = opt_str(name, value)?,
        Field::BackendId => f.backend_id = opt_str(name, value)?,
        Field::Medium => f.medium = opt_str(name, value)?,
        Field::ObjectKey => f.object_key = opt_str(name, value)?,
        Field::GroupId => {
            f.group_id = match value {
                Token::Uint(v) => Some(v.to_string()),
                Token::Int(v) => Some(v.to_string()),
                other => opt_str(name, other)?,
            }
        }
        Field::ModelName => f.model_name = opt_str(name, value)?,
        Field::BlockSize => f.block_size = opt_uint(name, value)?,
        Field::AdditionalSalt => f.additional_salt = opt_str(name, value)?,
        Field::LoraName => f.lora_name = opt_str(name, value)?,
        Field::DpRank => f.dp_rank = opt_uint(name, value)?,
    }
    Ok(())
}

fn finish_event(f: EventFields) -> Result<DecodedEvent, DecodeError> {
    let kind = match (f.event_type, f.legacy_type) {
        (Some(a), Some(b)) if a != b => return Err(DecodeError::ConflictingEventType),
        (Some(k), _) | (None, Some(k)) => k,
        (None, None) => return Err(DecodeError::MissingEventType),
    };
    Ok(DecodedEvent {
        event_id: f.event_id,
        timestamp_ms: f.timestamp_ms,
        kind,
        tenant_id: f.tenant_id,
        backend_id: f.backend_id,
        medium: f.medium,
        object_key: f.object_key,
        group_id: f.group_id,
        model_name: f.model_name,
        block_size: f.block_size,
        additional_salt: f.additional_salt,
        lora_name: f.lora_name,
        dp_rank: f.dp_rank,
    })
}

fn kind(
    value: Token<'_>,
    name: &'static str,
    parse: fn(&[u8]) -> Option<EventKind>,
) -> Result<EventKind, DecodeError> {
    match value {
        Token::Str(s) => parse(s).ok_or_else(|| {
            let shown = &s[..s.len().min(32)];
            DecodeError::UnknownEventType(String::from_utf8_lossy(shown).into_owned())
        }),
        t => Err(unexpected(name, "string", t)),
    }
}

fn opt_str(field: &'static str, value: Token<'_>) -> Result<Option<String>, DecodeError> {
    match value {
        Token::Nil => Ok(None),
        Token::Str(s) => std::str::from_utf8(s)
            .map(|s| Some(s.to_owned()))
            .map_err(|_| DecodeError::InvalidUtf8 { field }),
        t => Err(unexpected(field, "string or nil", t)),
    }
}

fn opt_uint(field: &'static str, value: Token<'_>) -> Result<Option<u64>, DecodeError> {
    match value {
        Token::Nil => Ok(None),
        Token::Uint(v) => Ok(Some(v)),
        Token::Int(_) => Err(DecodeError::NegativeInteger { field }),
        t => Err(unexpected(field, "unsigned integer or nil", t)),
    }
}

/// One human-readable line for an event, as `moonkv events tail` prints it.
///
/// Example: `id=7 ts=1739145600000 stored backend=b1 tenant=default medium=cpu group=- key="k"`.
pub fn format_event_line(ev: &DecodedEvent) -> String {
    fn or_dash(s: &Option<String>) -> &str {
        s.as_deref().unwrap_or("-")
    }
    let mut line = String::with_capacity(96);
    let _ = match ev.event_id {
        Some(id) => write!(line, "id={id}"),
        None => write!(line, "id=-"),
    };
    let _ = match ev.timestamp_ms {
        Some(ts) => write!(line, " ts={ts}"),
        None => write!(line, " ts=-"),
    };
    let _ = write!(
        line,
        " {} backend={} tenant={}",
        ev.kind.as_str(),
        or_dash(&ev.backend_id),
        or_dash(&ev.tenant_id)
    );
    if ev.kind != EventKind::Cleared {
        let _ = write!(
            line,
            " medium={} group={}",
            or_dash(&ev.medium),
            or_dash(&ev.group_id)
        );
        let _ = match &ev.object_key {
            Some(key) => write!(line, " key={key:?}"),
            None => write!(line, " key=-"),
        };
    }
    line
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
