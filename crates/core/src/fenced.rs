//! [`FencedStore`]: small replicated values that only the newest lock holder
//! can change: checkpoints, "job done" markers, counters.
//!
//! Every key has a *fence*, the highest fencing token it has accepted. A
//! write (or delete) with a lower token is refused, an equal one accepted (one
//! holder writes many times with one token). A fenced read advances the
//! fence too: otherwise holder A (token n) reads, pauses, holder B (n+1)
//! reads the same value and writes, A wakes and writes its stale update, and
//! B's update is lost although A's write alone was not "stale". With the read
//! fenced, A's late write is refused.
//!
//! A deleted key keeps its fence (a tombstone), so that a paused holder
//! cannot recreate it with an old token.
//!
//! The store is bounded in keys and in bytes ([`Limits`]); a change that
//! would grow it past either is refused, the same way on every replica.

use crate::{Limits, LockError, Outcome, Token};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Entries")]
pub struct FencedStore {
    /// Persistent, as the lock table's maps are: cloned in O(1) for a snapshot.
    /// Decoded through [`Entries`].
    entries: imbl::OrdMap<String, Entry>,
    /// Bytes of keys and values, kept with every change. Not stored: a
    /// snapshot holds the entries alone, as before the limit, and loading
    /// one counts them again.
    #[serde(skip)]
    bytes: usize,
}

/// What a snapshot holds of a [`FencedStore`]: the same shape as the
/// store's serialized form.
#[derive(Deserialize)]
struct Entries {
    #[serde(deserialize_with = "crate::bounded::ord_map")]
    entries: imbl::OrdMap<String, Entry>,
}

impl From<Entries> for FencedStore {
    fn from(Entries { entries }: Entries) -> Self {
        let bytes = count(&entries);
        FencedStore { entries, bytes }
    }
}

fn count(entries: &imbl::OrdMap<String, Entry>) -> usize {
    entries
        .iter()
        .map(|(key, entry)| size(key, entry.value.as_deref()))
        .sum()
}

/// What one key costs against [`Limits::max_store_bytes`].
fn size(key: &str, value: Option<&str>) -> usize {
    key.len() + value.map_or(0, str::len)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    /// `None`: deleted, or only ever read with a token.
    value: Option<String>,
    fence: Token,
}

/// A key's value and fence, as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredValue {
    pub value: Option<String>,
    pub fence: Token,
}

/// The change a fenced command makes to a key, once admitted.
pub(crate) enum Change<'a> {
    Put(&'a str),
    Read,
    Delete,
}

impl FencedStore {
    /// A key's value and fence; `None` if it was never written or read
    /// with a token.
    pub fn get(&self, key: &str) -> Option<StoredValue> {
        self.entries.get(key).map(|entry| StoredValue {
            value: entry.value.clone(),
            fence: entry.fence,
        })
    }

    /// Every key with its fence, in key order.
    pub fn fences(&self) -> impl Iterator<Item = (&str, Token)> + '_ {
        self.entries
            .iter()
            .map(|(key, entry)| (key.as_str(), entry.fence))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of keys and values held, deleted keys' names included.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Panics unless the byte count is the entries' sum (see
    /// [`crate::LockTable::check_invariants`]). Not checked against the
    /// limit: a store written before the limit existed may be over it, and
    /// must still load (it can only shrink until it is under).
    pub(crate) fn check_bytes(&self) {
        assert_eq!(
            self.bytes,
            count(&self.entries),
            "the store's byte count is off"
        );
    }

    /// Applies `change` to `key` if `token` is not below the key's fence,
    /// and raises the fence to `token`. `limits` bound new keys and bytes:
    /// a change that would pass `max_store_bytes` is refused only if it
    /// grows the store (a smaller value or a delete always goes through).
    pub(crate) fn apply(
        &mut self,
        key: &str,
        token: Token,
        change: Change<'_>,
        limits: Limits,
    ) -> Result<Outcome, LockError> {
        let existing = self.entries.get(key);
        if let Some(entry) = existing {
            if token < entry.fence {
                return Err(LockError::StaleFence {
                    key: key.to_owned(),
                    presented: token,
                    fence: entry.fence,
                });
            }
        } else if self.entries.len() >= limits.max_keys {
            return Err(LockError::TooManyKeys {
                limit: limits.max_keys,
            });
        }
        let before = existing.map_or(0, |entry| size(key, entry.value.as_deref()));
        let after = match (&change, existing) {
            (Change::Put(value), _) => size(key, Some(value)),
            (Change::Read, Some(_)) => before,
            (Change::Read | Change::Delete, None) | (Change::Delete, Some(_)) => size(key, None),
        };
        let bytes = self.bytes - before + after;
        if after > before && bytes > limits.max_store_bytes {
            return Err(LockError::StoreFull {
                bytes,
                limit: limits.max_store_bytes,
            });
        }
        self.bytes = bytes;
        let entry = self.entries.entry(key.to_owned()).or_insert(Entry {
            value: None,
            fence: token,
        });
        debug_assert!(token >= entry.fence);
        entry.fence = token;
        Ok(match change {
            Change::Put(value) => {
                entry.value = Some(value.to_owned());
                Outcome::Stored { fence: token }
            }
            Change::Read => Outcome::Read(StoredValue {
                value: entry.value.clone(),
                fence: token,
            }),
            Change::Delete => Outcome::Deleted {
                existed: entry.value.take().is_some(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Room for 10 bytes of keys and values.
    const SMALL: Limits = Limits {
        max_store_bytes: 10,
        ..Limits::STANDARD
    };

    fn put(store: &mut FencedStore, key: &str, value: &str) -> Result<Outcome, LockError> {
        store.apply(key, Token(1), Change::Put(value), SMALL)
    }

    #[test]
    fn a_change_that_would_pass_the_byte_limit_is_refused_and_changes_nothing() {
        let mut store = FencedStore::default();
        put(&mut store, "a", "12345").unwrap();
        assert_eq!(store.bytes(), 6);
        let before = store.clone();
        let refused = put(&mut store, "b", "12345").unwrap_err();
        assert_eq!(
            refused,
            LockError::StoreFull {
                bytes: 12,
                limit: 10
            }
        );
        assert!(refused.to_string().contains("limit is 10"), "{refused}");
        assert_eq!(store, before);
        // Growing a value past the limit is refused too, a new key's name alone is not.
        assert!(put(&mut store, "a", "1234567890").is_err());
        store.apply("b", Token(1), Change::Read, SMALL).unwrap();
        assert_eq!(store.bytes(), 7);
        store.check_bytes();
    }

    #[test]
    fn shrinking_and_deleting_always_go_through_and_free_room() {
        let mut store = FencedStore::default();
        put(&mut store, "a", "123456789").unwrap();
        // Over the limit already (say, the limit was lowered): a smaller
        // value and a delete are still accepted.
        let tight = Limits {
            max_store_bytes: 5,
            ..SMALL
        };
        store
            .apply("a", Token(1), Change::Put("1234"), tight)
            .unwrap();
        assert_eq!(store.bytes(), 5);
        store.apply("a", Token(1), Change::Delete, tight).unwrap();
        assert_eq!(store.bytes(), 1, "a deleted key keeps its name (and fence)");
        put(&mut store, "b", "1234567").unwrap();
        store.check_bytes();
    }

    #[test]
    fn a_loaded_snapshot_counts_its_bytes_again() {
        let mut store = FencedStore::default();
        put(&mut store, "a", "12345").unwrap();
        store.apply("b", Token(1), Change::Delete, SMALL).unwrap();
        let json = serde_json::to_string(&store).unwrap();
        assert!(!json.contains("bytes"), "the count is not stored: {json}");
        let loaded: FencedStore = serde_json::from_str(&json).unwrap();
        assert_eq!(loaded.bytes(), 7);
        assert_eq!(loaded, store);
    }
}
