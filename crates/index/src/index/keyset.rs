//! The sets of keys the index's reverse indexes map to.

use std::borrow::Borrow;

/// An ordered set of keys kept as a sorted vector. Most reverse-index entries hold a single
/// key (a provider ID names one Machine, a Node name one Node): a `BTreeSet` allocates room
/// for eleven keys even then; this allocates room for what it holds (one key: exactly one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeySet<V>(Vec<V>);

impl<V> Default for KeySet<V> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<V: Ord> KeySet<V> {
    /// Adds `key`; false when it was already there.
    pub fn insert(&mut self, key: V) -> bool {
        match self.0.binary_search(&key) {
            Ok(_) => false,
            Err(at) => {
                if self.0.is_empty() {
                    self.0.reserve_exact(1);
                }
                self.0.insert(at, key);
                true
            }
        }
    }

    /// Removes `key`; false when it was not there.
    pub fn remove<R>(&mut self, key: &R) -> bool
    where
        V: Borrow<R>,
        R: Ord + ?Sized,
    {
        match self.0.binary_search_by(|k| k.borrow().cmp(key)) {
            Ok(at) => {
                self.0.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    /// True when the set holds no key.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The keys, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, V> {
        self.0.iter()
    }
}

impl<'a, V> IntoIterator for &'a KeySet<V> {
    type Item = &'a V;
    type IntoIter = std::slice::Iter<'a, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stay_sorted_and_unique_and_one_key_takes_room_for_one() {
        let mut set = KeySet::default();
        assert!(set.insert("b".to_string()));
        assert_eq!(set.0.capacity(), 1);
        assert!(set.insert("a".to_string()));
        assert!(set.insert("c".to_string()));
        assert!(!set.insert("b".to_string()));
        assert_eq!(set.iter().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(set.remove("b"));
        assert!(!set.remove("b"));
        assert_eq!(set.iter().count(), 2);
        assert!(set.remove("a") && set.remove("c"));
        assert!(set.is_empty());
    }
}
