//! Feeds a parsed document to the derived `Deserialize` of [`super::keys::ConfigInput`] one entry
//! at a time, so an error knows its key and an unknown key is told apart from a bad value
//! (deserializing a `serde_json::Value` directly reports both as bare text).

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt::Display;

/// Why a document did not read.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReadError {
    #[error("unknown key `{0}`")]
    UnknownKey(String),
    #[error("`{key}`: {reason}")]
    BadValue { key: String, reason: String },
    /// A rule of the document as a whole, e.g. a key given twice under two names.
    #[error("{0}")]
    Document(String),
}

impl de::Error for ReadError {
    fn custom<T: Display>(msg: T) -> Self {
        ReadError::Document(msg.to_string())
    }

    fn unknown_field(field: &str, _expected: &'static [&'static str]) -> Self {
        ReadError::UnknownKey(field.to_string())
    }
}

/// The entries of a mapping, as a serde deserializer.
pub(super) struct Entries {
    entries: serde_json::map::IntoIter,
    /// The entry whose key was just read and whose value is next.
    pending: Option<(String, Value)>,
}

impl Entries {
    pub(super) fn new(map: Map<String, Value>) -> Self {
        Self {
            entries: map.into_iter(),
            pending: None,
        }
    }
}

impl<'de> de::Deserializer<'de> for Entries {
    type Error = ReadError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_map(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

impl<'de> MapAccess<'de> for Entries {
    type Error = ReadError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, ReadError> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        let field = seed.deserialize(IntoDeserializer::<ReadError>::into_deserializer(
            key.as_str(),
        ))?;
        self.pending = Some((key, value));
        Ok(Some(field))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, ReadError> {
        let (key, value) = self
            .pending
            .take()
            .ok_or_else(|| ReadError::Document("a value was read before its key".into()))?;
        seed.deserialize(value).map_err(|e| ReadError::BadValue {
            key,
            reason: e.to_string(),
        })
    }
}
