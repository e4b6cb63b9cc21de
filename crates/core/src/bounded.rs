//! Decoding the persistent maps without trusting their encoded length.
//!
//! Why: `imbl`'s own `Deserialize` reserves a `Vec` of the length the input
//! claims before reading a single entry, and bincode hands it that length
//! as is. A snapshot, backup, table image or peer message with a huge count
//! in a map's header (crafted, or a flipped bit) then made a node panic on
//! capacity overflow, or abort on an allocation of terabytes (issue 58).
//! Here entries are read one at a time, so a map costs what its bytes hold
//! and a false count ends as the decoder's clear "unexpected end" error.
//! The encoding is unchanged: a map is still its length, then its entries.

use imbl::OrdMap;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use std::fmt;
use std::marker::PhantomData;

/// `#[serde(deserialize_with = "crate::bounded::ord_map")]` for an
/// `imbl::OrdMap` field.
pub(crate) fn ord_map<'de, D, K, V>(deserializer: D) -> Result<OrdMap<K, V>, D::Error>
where
    D: Deserializer<'de>,
    K: Deserialize<'de> + Ord + Clone,
    V: Deserialize<'de> + Clone,
{
    deserializer.deserialize_map(EntryByEntry(PhantomData))
}

struct EntryByEntry<K, V>(PhantomData<(K, V)>);

impl<'de, K, V> Visitor<'de> for EntryByEntry<K, V>
where
    K: Deserialize<'de> + Ord + Clone,
    V: Deserialize<'de> + Clone,
{
    type Value = OrdMap<K, V>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Self::Value, A::Error> {
        // No reservation from `entries.size_hint()`: that is the claim.
        let mut map = OrdMap::new();
        while let Some((key, value)) = entries.next_entry()? {
            map.insert(key, value);
        }
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    #[derive(Debug, PartialEq, Serialize, serde::Deserialize)]
    struct Holder {
        #[serde(deserialize_with = "ord_map")]
        map: OrdMap<String, u64>,
    }

    #[test]
    fn a_map_decodes_as_imbl_encodes_it() {
        let holder = Holder {
            map: [("a".to_owned(), 1u64), ("b".to_owned(), 2u64)]
                .into_iter()
                .collect(),
        };
        let bytes = bincode::serialize(&holder).unwrap();
        assert_eq!(bincode::deserialize::<Holder>(&bytes).unwrap(), holder);
    }

    // The regression of issue 58: a count of 2^62 entries in eight bytes
    // was reserved before the first entry was read.
    #[test]
    fn a_huge_count_is_an_error_not_a_reservation() {
        let mut bytes = bincode::serialize(&Holder { map: OrdMap::new() }).unwrap();
        bytes[..8].copy_from_slice(&(1u64 << 62).to_le_bytes());
        assert!(bincode::deserialize::<Holder>(&bytes).is_err());
    }

    /// Every eight bytes of an encoded table overwritten with a huge count
    /// in turn (every map's and list's length is somewhere among them):
    /// decoding answers, with a table or an error, and never panics. Before
    /// the maps were read entry by entry, the count of the first map
    /// panicked ("capacity overflow").
    #[test]
    fn a_table_with_any_length_made_huge_decodes_or_errs_without_panicking() {
        use crate::{Command, LockTable, SecretHash};
        let mut table = LockTable::new();
        for n in 0..3u8 {
            let opened = table.apply(&Command::OpenSession {
                ttl_ms: 10_000,
                secret: SecretHash([n; 32]),
                owner: Some(format!("owner-{n}")),
            });
            let Ok(crate::Outcome::SessionOpened { session, .. }) = opened.outcome else {
                panic!("{:?}", opened.outcome);
            };
            table.apply(&Command::Acquire {
                session,
                lock: format!("lock-{n}"),
                wait: true,
                attempt: 1,
                lock_delay_ms: 0,
            });
        }
        let bytes = bincode::serialize(&table).unwrap();
        assert!(bincode::deserialize::<LockTable>(&bytes).is_ok());
        for huge in [1u64 << 62, u64::MAX, 1 << 35] {
            for at in 0..bytes.len().saturating_sub(8) {
                let mut mutated = bytes.clone();
                mutated[at..at + 8].copy_from_slice(&huge.to_le_bytes());
                let decoded = std::panic::catch_unwind(|| {
                    let _ = bincode::deserialize::<LockTable>(&mutated);
                });
                assert!(decoded.is_ok(), "a count of {huge} at byte {at} panicked");
            }
        }
    }
}
