//! The replica list of an object, with its first replica stored inline.

use super::object::Replica;
use std::ops::{Deref, DerefMut};

/// The replicas of an object: the first inline (almost every object has exactly one), more on
/// the heap. Reads and updates go through the slice it dereferences to.
#[derive(Debug)]
pub(crate) enum ReplicaList {
    One(Replica),
    /// Zero, or two and more.
    Many(Vec<Replica>),
}

impl Default for ReplicaList {
    fn default() -> Self {
        Self::Many(Vec::new())
    }
}

impl From<Vec<Replica>> for ReplicaList {
    fn from(mut replicas: Vec<Replica>) -> Self {
        if replicas.len() == 1 {
            if let Some(only) = replicas.pop() {
                return Self::One(only);
            }
        }
        Self::Many(replicas)
    }
}

impl Deref for ReplicaList {
    type Target = [Replica];

    fn deref(&self) -> &[Replica] {
        match self {
            Self::One(r) => std::slice::from_ref(r),
            Self::Many(v) => v,
        }
    }
}

impl DerefMut for ReplicaList {
    fn deref_mut(&mut self) -> &mut [Replica] {
        match self {
            Self::One(r) => std::slice::from_mut(r),
            Self::Many(v) => v,
        }
    }
}

impl IntoIterator for ReplicaList {
    type Item = Replica;
    type IntoIter = std::iter::Chain<std::option::IntoIter<Replica>, std::vec::IntoIter<Replica>>;

    fn into_iter(self) -> Self::IntoIter {
        match self {
            Self::One(r) => Some(r).into_iter().chain(Vec::new()),
            Self::Many(v) => None.into_iter().chain(v),
        }
    }
}

impl ReplicaList {
    pub(crate) fn push(&mut self, replica: Replica) {
        match self {
            Self::Many(v) if !v.is_empty() => v.push(replica),
            Self::Many(_) => *self = Self::One(replica),
            Self::One(_) => {
                if let Self::One(first) = std::mem::take(self) {
                    *self = Self::Many(vec![first, replica]);
                }
            }
        }
    }

    /// Keeps the replicas `keep` accepts, in order.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Replica) -> bool) {
        match self {
            Self::One(r) => {
                if !keep(r) {
                    *self = Self::default();
                }
            }
            Self::Many(v) => {
                v.retain(|r| keep(r));
                if v.len() <= 1 {
                    *self = Self::from(std::mem::take(v));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::disk::{DiskHandle, DiskMemory, DiskSlot};
    use crate::engine::object::Placement;
    use moonkv_proto::{ClientId, DiskSegment, ReplicaId, ReplicaStatus, SegmentId};
    use std::sync::Arc;

    #[test]
    fn replica_list_keeps_one_inline() {
        let mut list = ReplicaList::default();
        assert!(list.is_empty());
        list.push(disk_replica(1));
        assert!(matches!(list, ReplicaList::One(_)));
        list.push(disk_replica(2));
        list.push(disk_replica(3));
        assert_eq!(ids(&list), [1, 2, 3]);
        list.retain(|r| r.id != ReplicaId(2));
        assert_eq!(ids(&list), [1, 3]);
        list.retain(|r| r.id == ReplicaId(3));
        assert!(matches!(list, ReplicaList::One(_)));
        assert_eq!(ids(&list), [3]);
        let owned: Vec<Replica> = std::mem::take(&mut list).into_iter().collect();
        assert_eq!(owned.len(), 1);
        assert!(list.is_empty());
        list.retain(|_| false);
        assert!(list.is_empty());
        assert!(matches!(ReplicaList::from(owned), ReplicaList::One(_)));
    }

    fn ids(list: &ReplicaList) -> Vec<u64> {
        list.iter().map(|r| r.id.0).collect()
    }

    fn disk_replica(id: u64) -> Replica {
        let info = DiskSegment {
            id: SegmentId::new(1, 1),
            name: "d".into(),
            endpoint: "e".into(),
            capacity_bytes: 1 << 20,
        };
        let memory = Arc::new(DiskMemory::default());
        let slot = Arc::new(DiskSlot::new(info, ClientId::new(1, 1), memory));
        Replica {
            id: ReplicaId(id),
            status: ReplicaStatus::Complete,
            placement: Placement::Disk(Box::new(DiskHandle::reserved(slot, id, 0))),
        }
    }
}
