//! How the snapshot database holds its one snapshot: the sealed record
//! (`codec.rs`) cut into chunks of just under 1 MiB, keyed by their
//! position, all replaced in one transaction.
//!
//! Why not one value, as data format 10 kept it: redb gives a value a page
//! of a power-of-two size (a 112.5 MiB snapshot took 128 MiB), reuses a page a
//! commit frees only after the commit after it, and doubles a file that has
//! no room. Replaced every `--snapshot-every` entries, a full table's
//! snapshot (112.5 MiB) grew its file to 1,028 MiB, then 898 MiB, eight
//! times the snapshot (docs/performance.md). In chunks of one page size,
//! every page freed fits a chunk of the next snapshot, and with the empty
//! commit in [`write`] the file holds two snapshots at most: the one being
//! written and the one it replaces. redb's doubling then keeps the file
//! under four times the largest snapshot, plus a few MiB of its own pages
//! (measured: 385 MiB, 3.4 times).
//!
//! The chunks are not sealed one by one: their concatenation is the sealed
//! record, so a chunk damaged, lost or left over fails its checksum.

use super::{META, SNAPSHOT_KEY};
use redb::{Database, ReadTransaction, ReadableTable, ReadableTableMetadata, TableDefinition};

/// The chunks of the sealed snapshot, in order.
pub(super) const CHUNKS: TableDefinition<u64, &[u8]> = TableDefinition::new("snapshot_chunks");

/// A chunk's length: a leaf page holding one chunk is then exactly 1 MiB
/// (redb adds 16 bytes: the page's header, the value's length, the key).
/// One byte more, and each chunk would take a page of 2 MiB.
const CHUNK_BYTES: usize = (1 << 20) - 16;

/// The sealed snapshot `txn` sees, if any: its chunks, or a value of
/// format 10 not yet cut into chunks.
pub(super) fn read(txn: &ReadTransaction) -> Result<Option<Vec<u8>>, redb::Error> {
    let chunks = match txn.open_table(CHUNKS) {
        Ok(chunks) => chunks,
        Err(redb::TableError::TableDoesNotExist(_)) => return one_value(txn),
        Err(err) => return Err(err.into()),
    };
    let count = chunks.len()?;
    if count == 0 {
        return one_value(txn);
    }
    // The count is only a hint: one damaged beyond what memory holds must
    // not abort the start-up check, which reads the chunks there are and
    // finds their checksum wrong.
    let mut sealed = Vec::new();
    let _ = sealed.try_reserve_exact(
        usize::try_from(count)
            .unwrap_or(usize::MAX)
            .saturating_mul(CHUNK_BYTES),
    );
    for chunk in chunks.iter()? {
        sealed.extend_from_slice(chunk?.1.value());
    }
    Ok(Some(sealed))
}

fn one_value(txn: &ReadTransaction) -> Result<Option<Vec<u8>>, redb::Error> {
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(err) => return Err(err.into()),
    };
    Ok(meta.get(SNAPSHOT_KEY)?.map(|value| value.value().to_vec()))
}

/// Replaces the snapshot in `db` with `sealed` (and format 10's value, if
/// `db` still holds one); fsync'd when this returns `Ok`.
pub(super) fn write(db: &Database, sealed: &[u8]) -> Result<(), redb::Error> {
    // The pages the previous write freed (the snapshot before the current
    // one) become reusable only at the commit after it: without this empty
    // one, this write would find them still held, and the file would have
    // to hold three snapshots.
    db.begin_write()?.commit()?;
    let txn = db.begin_write()?;
    {
        let mut chunks = txn.open_table(CHUNKS)?;
        let mut count = 0;
        for chunk in sealed.chunks(CHUNK_BYTES) {
            chunks.insert(count, chunk)?;
            count += 1;
        }
        // A longer snapshot before this one left chunks past its end.
        chunks.retain_in(count.., |_, _| false)?;
        txn.open_table(META)?.remove(SNAPSHOT_KEY)?;
    }
    Ok(txn.commit()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::codec;

    /// A snapshot of three chunks, written as a node writes it.
    fn three_chunks() -> (tempfile::TempDir, Database, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("snapshots.redb")).unwrap();
        let body: Vec<u8> = (0..2 * CHUNK_BYTES + 5).map(|i| i as u8).collect();
        let sealed = codec::seal(&body);
        write(&db, &sealed).unwrap();
        assert_eq!(
            read(&db.begin_read().unwrap()).unwrap(),
            Some(sealed.clone())
        );
        (dir, db, sealed)
    }

    /// Changes the chunks of `db` in a transaction of their own.
    fn change(db: &Database, edit: impl FnOnce(&mut redb::Table<u64, &[u8]>)) {
        let txn = db.begin_write().unwrap();
        edit(&mut txn.open_table(CHUNKS).unwrap());
        txn.commit().unwrap();
    }

    fn unseals(db: &Database) -> bool {
        let sealed = read(&db.begin_read().unwrap()).unwrap().unwrap();
        codec::unseal(&sealed).is_ok()
    }

    #[test]
    fn a_chunk_lost_damaged_or_left_over_fails_the_snapshots_checksum() {
        let (_dir, db, _) = three_chunks();
        change(&db, |chunks| {
            chunks.remove(1).unwrap();
        });
        assert!(!unseals(&db), "a chunk lost");

        let (_dir, db, _) = three_chunks();
        change(&db, |chunks| {
            let mut damaged = chunks.get(1).unwrap().unwrap().value().to_vec();
            damaged[100] ^= 1;
            chunks.insert(1, damaged.as_slice()).unwrap();
        });
        assert!(!unseals(&db), "a chunk damaged");

        let (_dir, db, _) = three_chunks();
        change(&db, |chunks| {
            chunks.insert(3, [0; 10].as_slice()).unwrap();
        });
        assert!(!unseals(&db), "a chunk left over");
    }

    #[test]
    fn a_shorter_snapshot_leaves_no_chunk_of_the_longer_one_before_it() {
        let (_dir, db, _) = three_chunks();
        let shorter = codec::seal(b"a table");
        write(&db, &shorter).unwrap();
        assert_eq!(read(&db.begin_read().unwrap()).unwrap(), Some(shorter));
    }
}
