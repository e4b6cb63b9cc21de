//! [`FenceGates`]: one [`FenceGate`] per key, for a resource made of many
//! independently locked parts (files, accounts, rows).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use crate::gate::{FenceGate, Stale};

/// A high-water mark per key: a token admitted for one key says nothing
/// about another, since each key is protected by its own lock.
///
/// Gates are created on first use and never forgotten. Forgetting a key's
/// mark would let a stale holder of that key back in, so memory grows by one
/// entry per key ever seen; for an unbounded key space keep the marks next to
/// the data instead (see the `postgres` module).
#[derive(Debug)]
pub struct FenceGates<K> {
    gates: Mutex<HashMap<K, Arc<FenceGate>>>,
}

impl<K> Default for FenceGates<K> {
    fn default() -> Self {
        FenceGates {
            gates: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash> FenceGates<K> {
    /// No keys yet: every key starts with a gate that admits any token.
    pub fn new() -> Self {
        Self::default()
    }

    /// The gate of `key`, created if this is the first time it is seen. Use
    /// it for [`FenceGate::admit_with`], or to keep the gate of a hot key at
    /// hand without looking it up again.
    pub fn gate<Q>(&self, key: &Q) -> Arc<FenceGate>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        // The map lock is held only for the lookup; the token check happens
        // on the key's own gate, so keys never wait for each other.
        let mut gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(gate) = gates.get(key) {
            return Arc::clone(gate);
        }
        let gate = Arc::new(FenceGate::new());
        gates.insert(key.to_owned(), Arc::clone(&gate));
        gate
    }

    /// Admits `token` for `key`: see [`FenceGate::admit`].
    pub fn admit<Q>(&self, key: &Q, token: u64) -> Result<(), Stale>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.gate(key).admit(token)
    }

    /// The highest token admitted for `key`; 0 if none (without creating
    /// a gate for it).
    pub fn highest<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        gates.get(key).map_or(0, |gate| gate.highest())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_independent_marks() {
        let gates = FenceGates::<String>::new();
        assert_eq!(gates.admit("a", 10), Ok(()));
        assert_eq!(gates.admit("b", 3), Ok(()), "b never saw token 10");
        assert_eq!(
            gates.admit("a", 4),
            Err(Stale {
                presented: 4,
                highest: 10
            })
        );
        assert_eq!(gates.highest("a"), 10);
        assert_eq!(gates.highest("b"), 3);
        assert_eq!(gates.highest("never-seen"), 0);
    }

    #[test]
    fn gate_returns_the_shared_gate_of_a_key() {
        let gates = FenceGates::<u32>::new();
        gates.gate(&1).admit(5).unwrap();
        assert_eq!(gates.highest(&1), 5);
        assert!(gates.admit(&1, 4).is_err());
    }
}
