//! vLLM and SGLang KV event payloads: `[timestamp, [event, ...], dp_rank?]` where each event
//! is a tagged array (`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//! lora_id, medium, lora_name, extra_keys, ...]`, the layout of vLLM up to 0.23 and of SGLang)
//! or a tagged map (`{"type": "BlockStored", ...}`, vLLM after 0.23). Hashes may be unsigned,
//! signed (reinterpreted) or a `bin` digest (its last eight bytes, big-endian).
//!
//! The envelope is checked as a whole; each event is then decoded from its own byte range, so
//! one odd event is rejected alone. Nothing here panics on any input (fuzzed in the tests).

use rmp::Marker;
use thiserror::Error;

use crate::hash::ExtraKey;
use crate::ids::BlockHash;

/// Most blocks one event may carry (vLLM batches are far smaller).
pub const MAX_BLOCKS_PER_EVENT: usize = 1 << 16;
/// Deepest nesting accepted inside an event (extra keys are at most three levels deep).
const MAX_DEPTH: u32 = 16;

/// Why a payload or one event was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// The bytes end inside a value.
    #[error("truncated MessagePack")]
    Truncated,
    /// A byte that starts no MessagePack value this decoder accepts.
    #[error("unsupported MessagePack marker 0x{0:02x}")]
    Marker(u8),
    /// A field of the wrong kind.
    #[error("{field}: expected {expected}")]
    Unexpected {
        /// The field.
        field: &'static str,
        /// What was expected.
        expected: &'static str,
    },
    /// The batch is not a 2- or 3-element array.
    #[error("batch must be an array of 2 or 3 items, got {0}")]
    BatchShape(u32),
    /// An event tag that is not one of the three.
    #[error("unknown event tag {0:?}")]
    UnknownTag(String),
    /// Nesting deeper than any producer writes.
    #[error("values nested too deeply")]
    TooDeep,
    /// More blocks than one event may carry.
    #[error("{0} blocks in one event (limit {MAX_BLOCKS_PER_EVENT})")]
    TooManyBlocks(usize),
    /// Bytes left after the batch.
    #[error("{0} trailing bytes after the batch")]
    Trailing(usize),
}

/// One engine event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineEvent {
    /// Consecutive blocks became cached.
    Stored(StoredBlocks),
    /// Blocks were evicted.
    Removed {
        /// The engine's hashes of the evicted blocks.
        block_hashes: Vec<BlockHash>,
        /// Where they were evicted from (`None`: the engine's GPU cache).
        medium: Option<String>,
    },
    /// The engine dropped its whole cache.
    Cleared,
}

/// The body of a `BlockStored`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredBlocks {
    /// The engine's hashes of the new blocks, in chain order.
    pub block_hashes: Vec<BlockHash>,
    /// The engine's hash of the block before the first one (`None`: they start the sequence).
    pub parent: Option<BlockHash>,
    /// The tokens of all the blocks.
    pub token_ids: Vec<u32>,
    /// Tokens per block, if sent.
    pub block_size: Option<u32>,
    /// The LoRA adapter, if any.
    pub lora_name: Option<String>,
    /// Where the blocks are (`None`: the engine's GPU cache).
    pub medium: Option<String>,
    /// Per block, the extra keys the engine hashed (vLLM 0.11+ `extra_keys`), if sent.
    pub extra_keys: Option<Vec<Option<Vec<ExtraKey>>>>,
}

/// One decoded payload.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineBatch {
    /// The batch's data-parallel rank, if present and not nil.
    pub dp_rank: Option<i64>,
    /// Events that decoded, in order.
    pub events: Vec<EngineEvent>,
    /// Events rejected alone, with the first reason.
    pub rejected: Vec<WireError>,
}

#[derive(Debug, Clone, Copy)]
enum Val<'a> {
    Nil,
    Bool(bool),
    Uint(u64),
    Int(i64),
    Float,
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(u32),
    Map(u32),
}

struct Cur<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cur<'a> {
    fn new(buf: &'a [u8]) -> Cur<'a> {
        Cur { buf, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).ok_or(WireError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(WireError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn len(&mut self, width: usize) -> Result<usize, WireError> {
        Ok(match width {
            1 => usize::from(self.be::<1>()?[0]),
            2 => usize::from(u16::from_be_bytes(self.be()?)),
            _ => u32::from_be_bytes(self.be()?) as usize,
        })
    }

    fn val(&mut self) -> Result<Val<'a>, WireError> {
        let byte = self.be::<1>()?[0];
        Ok(match Marker::from_u8(byte) {
            Marker::Null => Val::Nil,
            Marker::True => Val::Bool(true),
            Marker::False => Val::Bool(false),
            Marker::FixPos(v) => Val::Uint(u64::from(v)),
            Marker::FixNeg(v) => Val::Int(i64::from(v)),
            Marker::U8 => Val::Uint(u64::from(self.be::<1>()?[0])),
            Marker::U16 => Val::Uint(u64::from(u16::from_be_bytes(self.be()?))),
            Marker::U32 => Val::Uint(u64::from(u32::from_be_bytes(self.be()?))),
            Marker::U64 => Val::Uint(u64::from_be_bytes(self.be()?)),
            Marker::I8 => Val::Int(i64::from(i8::from_be_bytes(self.be()?))),
            Marker::I16 => Val::Int(i64::from(i16::from_be_bytes(self.be()?))),
            Marker::I32 => Val::Int(i64::from(i32::from_be_bytes(self.be()?))),
            Marker::I64 => Val::Int(i64::from_be_bytes(self.be()?)),
            Marker::F32 => {
                self.take(4)?;
                Val::Float
            }
            Marker::F64 => {
                self.take(8)?;
                Val::Float
            }
            Marker::FixStr(n) => Val::Str(self.take(usize::from(n))?),
            Marker::Str8
            | Marker::Bin8
            | Marker::Str16
            | Marker::Bin16
            | Marker::Str32
            | Marker::Bin32 => {
                let (width, is_str) = match Marker::from_u8(byte) {
                    Marker::Str8 => (1, true),
                    Marker::Bin8 => (1, false),
                    Marker::Str16 => (2, true),
                    Marker::Bin16 => (2, false),
                    Marker::Str32 => (4, true),
                    _ => (4, false),
                };
                let n = self.len(width)?;
                let s = self.take(n)?;
                if is_str {
                    Val::Str(s)
                } else {
                    Val::Bin(s)
                }
            }
            Marker::FixArray(n) => Val::Array(u32::from(n)),
            Marker::Array16 => Val::Array(u32::from(u16::from_be_bytes(self.be()?))),
            Marker::Array32 => Val::Array(u32::from_be_bytes(self.be()?)),
            Marker::FixMap(n) => Val::Map(u32::from(n)),
            Marker::Map16 => Val::Map(u32::from(u16::from_be_bytes(self.be()?))),
            Marker::Map32 => Val::Map(u32::from_be_bytes(self.be()?)),
            _ => return Err(WireError::Marker(byte)),
        })
    }

    /// Skips the contents of a container whose header was read.
    fn skip(&mut self, v: Val<'a>, depth: u32) -> Result<(), WireError> {
        let items = match v {
            Val::Array(n) => u64::from(n),
            Val::Map(n) => 2 * u64::from(n),
            _ => return Ok(()),
        };
        if depth > MAX_DEPTH {
            return Err(WireError::TooDeep);
        }
        for _ in 0..items {
            let inner = self.val()?;
            self.skip(inner, depth + 1)?;
        }
        Ok(())
    }
}

fn unexpected(field: &'static str, expected: &'static str) -> WireError {
    WireError::Unexpected { field, expected }
}

/// Decodes one vLLM/SGLang payload.
pub fn decode_batch(payload: &[u8]) -> Result<EngineBatch, WireError> {
    let mut c = Cur::new(payload);
    let items = match c.val()? {
        Val::Array(n @ 2..=3) => n,
        Val::Array(n) => return Err(WireError::BatchShape(n)),
        _ => return Err(unexpected("batch", "array")),
    };
    match c.val()? {
        Val::Float | Val::Uint(_) | Val::Int(_) => {}
        _ => return Err(unexpected("timestamp", "number")),
    }
    let count = match c.val()? {
        Val::Array(n) => n,
        _ => return Err(unexpected("events", "array")),
    };
    let mut batch = EngineBatch {
        dp_rank: None,
        events: Vec::with_capacity(count.min(1024) as usize),
        rejected: Vec::new(),
    };
    for _ in 0..count {
        let start = c.pos;
        let header = c.val()?;
        c.skip(header, 0)?;
        match decode_event(&payload[start..c.pos]) {
            Ok(ev) => batch.events.push(ev),
            Err(e) => batch.rejected.push(e),
        }
    }
    if items == 3 {
        batch.dp_rank = match c.val()? {
            Val::Nil => None,
            Val::Uint(v) => Some(i64::try_from(v).unwrap_or(i64::MAX)),
            Val::Int(v) => Some(v),
            _ => return Err(unexpected("dp_rank", "integer or nil")),
        };
    }
    if c.pos != payload.len() {
        return Err(WireError::Trailing(payload.len() - c.pos));
    }
    Ok(batch)
}

#[derive(Clone, Copy)]
enum Tag {
    Stored,
    Removed,
    Cleared,
}

fn tag(v: Val<'_>) -> Result<Tag, WireError> {
    match v {
        Val::Str(b"BlockStored") => Ok(Tag::Stored),
        Val::Str(b"BlockRemoved") => Ok(Tag::Removed),
        Val::Str(b"AllBlocksCleared") => Ok(Tag::Cleared),
        Val::Str(s) => Err(WireError::UnknownTag(
            String::from_utf8_lossy(&s[..s.len().min(40)]).into_owned(),
        )),
        _ => Err(unexpected("event tag", "string")),
    }
}

/// Stored fields in the array layout's order (after the tag).
const STORED_ORDER: [&str; 8] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
];
/// Removed fields in the array layout's order (after the tag).
const REMOVED_ORDER: [&str; 2] = ["block_hashes", "medium"];

fn decode_event(bytes: &[u8]) -> Result<EngineEvent, WireError> {
    let mut c = Cur::new(bytes);
    let mut fields = Fields::default();
    let kind = match c.val()? {
        Val::Array(0) => return Err(unexpected("event", "non-empty tagged array")),
        Val::Array(n) => {
            let kind = tag(c.val()?)?;
            let order: &[&str] = match kind {
                Tag::Stored => &STORED_ORDER,
                Tag::Removed => &REMOVED_ORDER,
                Tag::Cleared => &[],
            };
            for i in 1..n as usize {
                match order.get(i - 1) {
                    Some(name) => fields.read(name, &mut c)?,
                    None => {
                        let v = c.val()?;
                        c.skip(v, 1)?;
                    }
                }
            }
            kind
        }
        Val::Map(n) => {
            let mut kind = None;
            for _ in 0..n {
                let key = match c.val()? {
                    Val::Str(k) => k,
                    other => {
                        c.skip(other, 1)?;
                        let v = c.val()?;
                        c.skip(v, 1)?;
                        continue;
                    }
                };
                if key == b"type" {
                    kind = Some(tag(c.val()?)?);
                } else {
                    match std::str::from_utf8(key) {
                        Ok(name) if STORED_ORDER.contains(&name) => fields.read(name, &mut c)?,
                        _ => {
                            let v = c.val()?;
                            c.skip(v, 1)?;
                        }
                    }
                }
            }
            kind.ok_or(unexpected("type", "an event tag"))?
        }
        _ => return Err(unexpected("event", "tagged array or map")),
    };
    fields.finish(kind)
}

#[derive(Default)]
struct Fields {
    block_hashes: Option<Vec<BlockHash>>,
    parent: Option<BlockHash>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    lora_name: Option<String>,
    medium: Option<String>,
    extra_keys: Option<Vec<Option<Vec<ExtraKey>>>>,
}

impl Fields {
    fn read(&mut self, name: &str, c: &mut Cur<'_>) -> Result<(), WireError> {
        match name {
            "block_hashes" => {
                let n = array_len(c, "block_hashes")?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(hash(c.val()?, "block_hashes")?);
                }
                self.block_hashes = Some(v);
            }
            "parent_block_hash" => {
                self.parent = match c.val()? {
                    Val::Nil => None,
                    v => Some(hash(v, "parent_block_hash")?),
                }
            }
            "token_ids" => {
                let n = match c.val()? {
                    Val::Array(n) => n as usize,
                    Val::Nil => 0,
                    _ => return Err(unexpected("token_ids", "array of integers")),
                };
                if n > MAX_BLOCKS_PER_EVENT * 1024 {
                    return Err(WireError::TooManyBlocks(n / 1024));
                }
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    match c.val()? {
                        Val::Uint(t) if t <= u64::from(u32::MAX) => v.push(t as u32),
                        _ => return Err(unexpected("token_ids", "unsigned 32-bit integers")),
                    }
                }
                self.token_ids = Some(v);
            }
            "block_size" => {
                self.block_size = match c.val()? {
                    Val::Nil => None,
                    Val::Uint(v) if v > 0 && v <= u64::from(u32::MAX) => Some(v as u32),
                    _ => return Err(unexpected("block_size", "positive integer")),
                }
            }
            "lora_name" | "medium" => {
                let s = match c.val()? {
                    Val::Nil => None,
                    Val::Str(s) => Some(
                        std::str::from_utf8(s)
                            .map_err(|_| unexpected("string field", "UTF-8"))?
                            .to_owned(),
                    ),
                    _ => return Err(unexpected("lora_name/medium", "string or nil")),
                };
                if name == "medium" {
                    self.medium = s;
                } else {
                    self.lora_name = s;
                }
            }
            "extra_keys" => {
                self.extra_keys = match c.val()? {
                    Val::Nil => None,
                    Val::Array(n) => {
                        let mut per_block = Vec::with_capacity((n as usize).min(4096));
                        for _ in 0..n {
                            per_block.push(match c.val()? {
                                Val::Nil => None,
                                Val::Array(k) => Some(extra_items(c, k, 1)?),
                                _ => return Err(unexpected("extra_keys", "arrays or nil")),
                            });
                        }
                        Some(per_block)
                    }
                    _ => return Err(unexpected("extra_keys", "array or nil")),
                }
            }
            // lora_id: deprecated, superseded by lora_name
            _ => {
                let v = c.val()?;
                c.skip(v, 1)?;
            }
        }
        Ok(())
    }

    fn finish(self, kind: Tag) -> Result<EngineEvent, WireError> {
        Ok(match kind {
            Tag::Cleared => EngineEvent::Cleared,
            Tag::Removed => EngineEvent::Removed {
                block_hashes: self
                    .block_hashes
                    .ok_or(unexpected("block_hashes", "present"))?,
                medium: self.medium,
            },
            Tag::Stored => EngineEvent::Stored(StoredBlocks {
                block_hashes: self
                    .block_hashes
                    .ok_or(unexpected("block_hashes", "present"))?,
                parent: self.parent,
                token_ids: self.token_ids.unwrap_or_default(),
                block_size: self.block_size,
                lora_name: self.lora_name.filter(|s| !s.is_empty()),
                medium: self.medium,
                extra_keys: self.extra_keys,
            }),
        })
    }
}

fn array_len(c: &mut Cur<'_>, field: &'static str) -> Result<usize, WireError> {
    match c.val()? {
        Val::Array(n) if n as usize <= MAX_BLOCKS_PER_EVENT => Ok(n as usize),
        Val::Array(n) => Err(WireError::TooManyBlocks(n as usize)),
        _ => Err(unexpected(field, "array")),
    }
}

fn hash(v: Val<'_>, field: &'static str) -> Result<BlockHash, WireError> {
    match v {
        Val::Uint(h) => Ok(BlockHash(h)),
        Val::Int(h) => Ok(BlockHash(h as u64)),
        Val::Bin(d) if !d.is_empty() => Ok(BlockHash::from_digest(d)),
        _ => Err(unexpected(field, "integer or bin hash")),
    }
}

fn extra_items(c: &mut Cur<'_>, n: u32, depth: u32) -> Result<Vec<ExtraKey>, WireError> {
    if depth > 4 {
        return Err(WireError::TooDeep);
    }
    let mut out = Vec::with_capacity((n as usize).min(64));
    for _ in 0..n {
        out.push(match c.val()? {
            Val::Nil => ExtraKey::Nil,
            Val::Bool(b) => ExtraKey::Bool(b),
            Val::Uint(v) => ExtraKey::Int(
                i64::try_from(v).map_err(|_| unexpected("extra_keys", "integers below 2^63"))?,
            ),
            Val::Int(v) => ExtraKey::Int(v),
            Val::Str(s) => ExtraKey::Text(
                std::str::from_utf8(s)
                    .map_err(|_| unexpected("extra_keys", "UTF-8 strings"))?
                    .to_owned(),
            ),
            Val::Bin(b) => ExtraKey::Bytes(b.to_vec()),
            Val::Array(k) => ExtraKey::Array(extra_items(c, k, depth + 1)?),
            _ => {
                return Err(unexpected(
                    "extra_keys",
                    "strings, integers, bytes or tuples",
                ))
            }
        });
    }
    Ok(out)
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
