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

use crate::{LockError, Outcome, Token};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedStore {
    entries: BTreeMap<String, Entry>,
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

    /// Applies `change` to `key` if `token` is not below the key's fence,
    /// and raises the fence to `token`. `max_keys` bounds new keys.
    pub(crate) fn apply(
        &mut self,
        key: &str,
        token: Token,
        change: Change<'_>,
        max_keys: usize,
    ) -> Result<Outcome, LockError> {
        if let Some(entry) = self.entries.get(key) {
            if token < entry.fence {
                return Err(LockError::StaleFence {
                    key: key.to_owned(),
                    presented: token,
                    fence: entry.fence,
                });
            }
        } else if self.entries.len() >= max_keys {
            return Err(LockError::TooManyKeys { limit: max_keys });
        }
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
