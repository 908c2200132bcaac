//! A hash map split into shards behind `Arc`s: cloning it (every published snapshot does)
//! copies only the shard pointers, and changing one entry copies only that entry's shard.
//! That keeps a one-object update to a 10,000-machine index in microseconds while readers
//! keep their own immutable snapshot.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Shards per map: about 40 entries each at 10,000 entries.
const SHARDS: usize = 256;

/// A persistent-ish map; see the module documentation.
#[derive(Clone, Debug)]
pub struct ShardedMap<K, V> {
    shards: Vec<Arc<HashMap<K, V>>>,
    len: usize,
}

impl<K, V> Default for ShardedMap<K, V> {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Arc::new(HashMap::new())).collect(),
            len: 0,
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> ShardedMap<K, V> {
    fn shard<Q: Hash + ?Sized>(key: &Q) -> usize {
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        (hasher.finish() as usize) % SHARDS
    }

    /// The value for `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards[Self::shard(key)].get(key)
    }

    /// True when `key` has a value.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key).is_some()
    }

    /// Sets `key` to `value` (copying its shard if another snapshot shares it).
    pub fn insert(&mut self, key: K, value: V) {
        let shard = Arc::make_mut(&mut self.shards[Self::shard(&key)]);
        if shard.insert(key, value).is_none() {
            self.len += 1;
        }
    }

    /// Removes `key`.
    pub fn remove<Q>(&mut self, key: &Q)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let index = Self::shard(key);
        if self.shards[index].contains_key(key) {
            Arc::make_mut(&mut self.shards[index]).remove(key);
            self.len -= 1;
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True without entries.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets `key` to `value` unless it holds an equal value already (then its shard stays
    /// shared with earlier clones).
    pub fn insert_if_changed(&mut self, key: K, value: V)
    where
        V: PartialEq,
    {
        if self.get(&key) != Some(&value) {
            self.insert(key, value);
        }
    }

    /// True when every shard of `self` is the very shard of `other` (a clone neither changed):
    /// then both hold the same entries. Cheap: a pointer comparison per shard.
    pub fn same_shards(&self, other: &Self) -> bool {
        self.shards.len() == other.shards.len()
            && self
                .shards
                .iter()
                .zip(&other.shards)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.shards.iter().flat_map(|s| s.values())
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.shards.iter().flat_map(|s| s.iter())
    }
}

impl<K: Hash + Eq + Clone, V: Clone + PartialEq> PartialEq for ShardedMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().all(|(k, v)| other.get(k) == Some(v))
    }
}

impl<K: Hash + Eq + Clone, V: Clone> FromIterator<(K, V)> for ShardedMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut map = Self::default();
        for (k, v) in iter {
            map.insert(k, v);
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_shards_until_one_changes() {
        let mut a: ShardedMap<String, u32> = (0..1000).map(|i| (format!("k{i}"), i)).collect();
        let b = a.clone();
        a.insert("k1".into(), 7);
        a.remove("k2");
        a.insert("new".into(), 1);
        assert_eq!(b.get("k1"), Some(&1), "the old snapshot is unchanged");
        assert_eq!(b.get("k2"), Some(&2));
        assert_eq!((a.get("k1"), a.get("k2"), a.len()), (Some(&7), None, 1000));
        let shared = a
            .shards
            .iter()
            .zip(&b.shards)
            .filter(|(x, y)| Arc::ptr_eq(x, y))
            .count();
        assert!(
            shared >= SHARDS - 3,
            "only touched shards were copied: {shared}"
        );
        assert_eq!(a.values().count(), 1000);
        assert_ne!(a, b);
    }
}
