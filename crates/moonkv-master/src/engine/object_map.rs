//! The objects of one tenant in one shard, by key: one allocation per object. A record holds
//! its key (inline up to [`INLINE_KEY`] bytes, which covers typical cache keys such as 29-byte
//! bench keys; longer keys keep a heap copy) beside its metadata, and a table slot is a pointer
//! and the key's hash. Against a map of boxed key to boxed record this saves the key's own
//! allocation and a third of every slot, including the empty slots a table keeps after it grows.

use super::keyhash::KeyHashState;
use super::object::ObjectMeta;
use hashbrown::HashTable;
use std::hash::BuildHasher;

/// Longest key stored inside its record.
pub(crate) const INLINE_KEY: usize = 30;

/// A key, inline when short.
enum Key {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<str>),
}

impl Key {
    fn new(key: &str) -> Key {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0u8; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key.as_bytes());
            Key::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            Key::Heap(key.into())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Key::Heap(key) => key.as_bytes(),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // Made from a `&str`, so always valid UTF-8; the fallback is never taken.
            Key::Inline { .. } => std::str::from_utf8(self.as_bytes()).unwrap_or_default(),
            Key::Heap(key) => key,
        }
    }
}

/// One object: its key and its metadata.
struct Record {
    key: Key,
    meta: ObjectMeta,
}

/// A table slot: the record and its key's hash. With the hash beside the pointer, a table's
/// growth moves slots without reading a single record (at millions of objects per table, reading
/// each record again held the table's shard for tens of milliseconds), and a probe follows the
/// pointer only for a slot whose whole hash matches.
struct Slot {
    hash: u64,
    record: Box<Record>,
}

/// Key → object metadata.
pub(crate) struct ObjectMap {
    table: HashTable<Slot>,
    state: KeyHashState,
}

impl Default for ObjectMap {
    fn default() -> Self {
        Self {
            table: HashTable::new(),
            state: KeyHashState::default(),
        }
    }
}

impl std::fmt::Debug for ObjectMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectMap")
            .field("len", &self.len())
            .finish()
    }
}

impl Slot {
    fn matches(&self, hash: u64, key: &str) -> bool {
        self.hash == hash && self.record.key.as_bytes() == key.as_bytes()
    }
}

impl ObjectMap {
    fn hash(&self, key: &[u8]) -> u64 {
        self.state.hash_one(key)
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut ObjectMeta> {
        let hash = self.hash(key.as_bytes());
        self.table
            .find_mut(hash, |s| s.matches(hash, key))
            .map(|s| &mut s.record.meta)
    }

    pub(crate) fn remove(&mut self, key: &str) -> Option<ObjectMeta> {
        let hash = self.hash(key.as_bytes());
        let entry = self.table.find_entry(hash, |s| s.matches(hash, key)).ok()?;
        let (slot, _) = entry.remove();
        Some(slot.record.meta)
    }

    /// Inserts `meta` under `key`, replacing (and returning) what was there.
    pub(crate) fn insert(&mut self, key: &str, meta: ObjectMeta) -> Option<ObjectMeta> {
        let hash = self.hash(key.as_bytes());
        if let Some(slot) = self.table.find_mut(hash, |s| s.matches(hash, key)) {
            return Some(std::mem::replace(&mut slot.record.meta, meta));
        }
        let record = Box::new(Record {
            key: Key::new(key),
            meta,
        });
        self.table
            .insert_unique(hash, Slot { hash, record }, |s| s.hash);
        None
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &ObjectMeta)> {
        self.table
            .iter()
            .map(|s| (s.record.key.as_str(), &s.record.meta))
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut ObjectMeta)> {
        self.table.iter_mut().map(|s| {
            let r = &mut *s.record;
            (r.key.as_str(), &mut r.meta)
        })
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> {
        self.table.iter().map(|s| s.record.key.as_str())
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &ObjectMeta> {
        self.table.iter().map(|s| &s.record.meta)
    }

    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut ObjectMeta> {
        self.table.iter_mut().map(|s| &mut s.record.meta)
    }

    /// Keeps the objects `f` answers true for.
    pub(crate) fn retain(&mut self, mut f: impl FnMut(&str, &mut ObjectMeta) -> bool) {
        self.table.retain(|s| {
            let r = &mut *s.record;
            f(r.key.as_str(), &mut r.meta)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moonkv_proto::ClientId;

    fn meta(size: u64) -> ObjectMeta {
        ObjectMeta::new(size, ClientId::new(1, 1), 0, Default::default(), false)
    }

    #[test]
    fn short_and_long_keys_are_found_replaced_removed_and_kept_apart() {
        let mut map = ObjectMap::default();
        let long = "k".repeat(INLINE_KEY + 1);
        let edge = "e".repeat(INLINE_KEY);
        for (i, key) in ["", "a", edge.as_str(), long.as_str(), "ü-utf8"]
            .iter()
            .enumerate()
        {
            assert!(map.insert(key, meta(i as u64)).is_none(), "{key}");
        }
        assert_eq!(map.len(), 5);
        assert_eq!(map.get_mut(&long).unwrap().size, 3);
        assert_eq!(map.get_mut(&edge).unwrap().size, 2);
        assert!(map.get_mut(&"k".repeat(INLINE_KEY)).is_none());
        assert_eq!(map.insert("a", meta(10)).unwrap().size, 1, "replaced");
        assert_eq!(map.len(), 5);
        let mut keys: Vec<&str> = map.keys().collect();
        keys.sort();
        assert_eq!(keys, ["", "a", edge.as_str(), long.as_str(), "ü-utf8"]);
        assert_eq!(map.remove("a").unwrap().size, 10);
        assert!(map.remove("a").is_none());
        map.retain(|key, obj| {
            obj.size += 100;
            key != "ü-utf8"
        });
        let mut left: Vec<(String, u64)> =
            map.iter().map(|(k, o)| (k.to_string(), o.size)).collect();
        left.sort();
        assert_eq!(
            left,
            [
                (String::new(), 100),
                (edge.clone(), 102),
                (long.clone(), 103)
            ]
        );
        // Many keys: growth rehashes every record by its own key.
        for i in 0..10_000u64 {
            map.insert(&format!("key-{i}"), meta(i));
        }
        assert_eq!(map.len(), 10_003);
        assert!((0..10_000u64).all(|i| map.get_mut(&format!("key-{i}")).map(|o| o.size) == Some(i)));
        assert_eq!(map.values().count(), 10_003);
        map.values_mut().for_each(|o| o.size = 0);
        assert!(map.iter_mut().all(|(_, o)| o.size == 0));
    }

    #[test]
    fn a_slot_is_a_pointer_and_a_hash() {
        assert_eq!(std::mem::size_of::<Slot>(), 16);
    }

    #[test]
    fn a_record_is_one_small_allocation() {
        // 136 bytes: a 144-byte malloc chunk, against 112 (record) + 48 (29-byte key) before.
        assert!(
            std::mem::size_of::<Record>() <= 136,
            "{}",
            std::mem::size_of::<Record>()
        );
    }
}
