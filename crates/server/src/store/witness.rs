//! [`Witness`]: a small file beside the log and the database that
//! remembers how far they had come, so that a start on data that went back
//! is refused instead of served.
//!
//! Why: a `cp` of an old copy, a log segment lost, a lost write, or redb
//! falling back (silently) to its previous commit slot when the newest
//! fails its checksum can hand a node an older log or vote than the one it
//! acknowledged: the last grant gone and its token issued again, or a vote
//! forgotten so that a follower votes twice in a term. Checksums cannot see
//! that (the old state is intact); only a record kept elsewhere can.
//!
//! The witness holds the directory's identity (a random instance id, the
//! node id, the format) and a high-water mark: the last log id the log
//! holds and the vote the database saved. Each is rewritten only *after*
//! what it records is durable, so the log and the database are always at
//! or past the witness, and data found behind it lost something. A vote is
//! recorded before openraft hears it is saved; the log's end a moment
//! after each append (`log_store.rs`, `LazyWitness`: a torn or damaged log
//! record is told apart by the log's own mirrored copies).
//!
//! Torn writes: the record alternates between two slots in different 4 KiB
//! blocks, each with a sequence number and a checksum. A write torn by a
//! power cut damages only the slot being written; the other still holds the
//! previous mark, which the log and the database have also passed.

use crate::raft_types::NodeId;
use openraft::{LogId, Vote};
use rand::Rng;
use redb::StorageBackend;
use serde::{Deserialize, Serialize};
use std::io;

/// The file's name inside a data directory.
pub const WITNESS_FILE: &str = "deadbolt.witness";

/// Bytes of each slot, and the distance between them (one 4 KiB block each).
const SLOT: u64 = 4096;
const MAGIC: &[u8; 8] = b"DBWITNS1";
/// Magic, sequence number and body length.
const HEADER: usize = 8 + 8 + 4;

/// What the witness remembers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Witness {
    /// Drawn at random when the directory was initialized; the database
    /// holds the same id, so a database from elsewhere is recognized.
    pub instance: u128,
    pub node_id: NodeId,
    /// The last log id the database holds (as far as the witness knows).
    pub last_log: Option<LogId<NodeId>>,
    /// The vote the database saved last.
    pub vote: Option<Vote<NodeId>>,
}

impl Witness {
    pub fn new(node_id: NodeId) -> Self {
        Witness {
            // The node's random numbers (the host's on a real node, as
            // `rand::random`'s): the simulation seeds them. The id is in the
            // database's bytes, so an id of the host's made a simulated disk
            // fault land elsewhere in each run of one seed.
            instance: crate::runtime::node_rng().gen(),
            node_id,
            last_log: None,
            vote: None,
        }
    }

    /// Whether the database was ever written past its creation: then a
    /// missing or empty database is a loss, not a directory being set up.
    pub fn saw_data(&self) -> bool {
        self.last_log.is_some() || self.vote.is_some()
    }

    /// Checks that a database whose last log id is `last_log` and whose vote
    /// is `vote` has not gone back behind this witness. The reason if it has.
    pub fn check(
        &self,
        last_log: Option<LogId<NodeId>>,
        vote: Option<&Vote<NodeId>>,
    ) -> Result<(), String> {
        if last_log < self.last_log {
            return Err(format!(
                "the raft log ends at {} but had reached {} (the database went back to an older state)",
                show(last_log),
                show(self.last_log)
            ));
        }
        if let Some(witnessed) = &self.vote {
            // Votes only ever move forward; an incomparable one is as wrong
            // as an older one.
            if !vote.is_some_and(|vote| vote >= witnessed) {
                return Err(format!(
                    "the saved vote is {} but had been {witnessed} (the database went back to an older state)",
                    vote.map_or("none".to_owned(), ToString::to_string)
                ));
            }
        }
        Ok(())
    }
}

fn show(log_id: Option<LogId<NodeId>>) -> String {
    log_id.map_or("nothing".to_owned(), |id| {
        format!("index {} (term {})", id.index, id.leader_id.term)
    })
}

/// The witness on its storage: a file, or a simulated disk.
#[derive(Debug)]
pub struct WitnessFile {
    backend: Box<dyn StorageBackend>,
    /// Sequence number of the newest slot written.
    sequence: u64,
    current: Witness,
}

impl WitnessFile {
    /// Reads the newest intact slot. `Ok(None)` for empty storage (a
    /// witness never written); an error if no slot is intact.
    pub fn read(backend: Box<dyn StorageBackend>) -> io::Result<Option<WitnessFile>> {
        if backend.len()? == 0 {
            return Ok(None);
        }
        let newest = [0, SLOT]
            .into_iter()
            .filter_map(|offset| read_slot(backend.as_ref(), offset))
            .max_by_key(|(sequence, _)| *sequence);
        match newest {
            Some((sequence, current)) => Ok(Some(WitnessFile {
                backend,
                sequence,
                current,
            })),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "neither of its two records is intact",
            )),
        }
    }

    /// Writes a new witness into empty storage, durably.
    pub fn create(backend: Box<dyn StorageBackend>, witness: Witness) -> io::Result<WitnessFile> {
        backend.set_len(2 * SLOT)?;
        let mut file = WitnessFile {
            backend,
            sequence: 0,
            current: witness.clone(),
        };
        file.write(witness)?;
        Ok(file)
    }

    pub fn current(&self) -> &Witness {
        &self.current
    }

    /// Records that the database's log now ends at `last_log`. Durable
    /// when this returns.
    pub fn record_last_log(&mut self, last_log: Option<LogId<NodeId>>) -> io::Result<()> {
        let witness = Witness {
            last_log,
            ..self.current.clone()
        };
        self.write(witness)
    }

    /// Records that the database saved `vote`. Durable when this returns.
    pub fn record_vote(&mut self, vote: Vote<NodeId>) -> io::Result<()> {
        let witness = Witness {
            vote: Some(vote),
            ..self.current.clone()
        };
        self.write(witness)
    }

    fn write(&mut self, witness: Witness) -> io::Result<()> {
        let sequence = self.sequence + 1;
        let body = bincode::serialize(&witness).map_err(io::Error::other)?;
        assert!(
            HEADER + body.len() + 4 <= SLOT as usize,
            "witness record too large"
        );
        let mut slot = Vec::with_capacity(HEADER + body.len() + 4);
        slot.extend_from_slice(MAGIC);
        slot.extend_from_slice(&sequence.to_le_bytes());
        slot.extend_from_slice(&(body.len() as u32).to_le_bytes());
        slot.extend_from_slice(&body);
        slot.extend_from_slice(&crc32fast::hash(&slot).to_le_bytes());
        self.backend.write((sequence % 2) * SLOT, &slot)?;
        self.backend.sync_data(false)?;
        self.sequence = sequence;
        self.current = witness;
        Ok(())
    }
}

/// One slot's sequence number and witness, if it is intact.
fn read_slot(backend: &dyn StorageBackend, offset: u64) -> Option<(u64, Witness)> {
    if backend.len().ok()? < offset + SLOT {
        return None;
    }
    let slot = backend.read(offset, SLOT as usize).ok()?;
    let (magic, rest) = slot.split_first_chunk::<8>()?;
    let (sequence, rest) = rest.split_first_chunk::<8>()?;
    let (len, rest) = rest.split_first_chunk::<4>()?;
    let len = u32::from_le_bytes(*len) as usize;
    if magic != MAGIC || len + 4 > rest.len() {
        return None;
    }
    let (body, rest) = rest.split_at(len);
    let checksum = rest.first_chunk::<4>()?;
    if crc32fast::hash(&slot[..HEADER + len]) != u32::from_le_bytes(*checksum) {
        return None;
    }
    Some((
        u64::from_le_bytes(*sequence),
        bincode::deserialize(body).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::shared_memory::SharedMemory as Shared;
    use openraft::CommittedLeaderId;

    fn log_id(term: u64, index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(term, 1), index))
    }

    #[test]
    fn the_newest_intact_slot_wins_and_a_torn_write_falls_back_one_step() {
        let disk = Shared::default();
        let mut file = WitnessFile::create(Box::new(disk.clone()), Witness::new(1)).unwrap();
        file.record_last_log(log_id(1, 5)).unwrap();
        file.record_last_log(log_id(1, 6)).unwrap();
        let read = WitnessFile::read(Box::new(disk.clone())).unwrap().unwrap();
        assert_eq!(read.current().last_log, log_id(1, 6));
        assert_eq!(read.current().instance, file.current().instance);

        // Tear the newest slot (sequence 3, slot 1): the previous mark is read.
        disk.write(SLOT + 20, &[0xff; 3]).unwrap();
        let read = WitnessFile::read(Box::new(disk.clone())).unwrap().unwrap();
        assert_eq!(read.current().last_log, log_id(1, 5));

        // Both damaged: refused, not taken for a fresh directory.
        disk.write(20, &[0xff; 3]).unwrap();
        assert!(WitnessFile::read(Box::new(disk)).is_err());
    }

    proptest::proptest! {
        /// A witness file is read from disk, where anything may have
        /// happened to it: any bytes give a witness or a refusal, never a
        /// panic.
        #[test]
        fn untrusted_witness_files_of_random_bytes_never_panic(
            bytes in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..(2 * SLOT as usize + 64)),
        ) {
            let disk = Shared::default();
            disk.set_len(bytes.len() as u64).unwrap();
            disk.write(0, &bytes).unwrap();
            let _ = WitnessFile::read(Box::new(disk));
        }
    }

    #[test]
    fn a_database_behind_the_witness_is_refused() {
        let mut witness = Witness::new(1);
        witness.last_log = log_id(2, 10);
        witness.vote = Some(Vote::new(2, 1));
        let vote = Vote::new(2, 1);
        assert!(witness.check(log_id(2, 10), Some(&vote)).is_ok());
        assert!(witness.check(log_id(2, 11), Some(&Vote::new(3, 2))).is_ok());
        assert!(witness.check(log_id(2, 9), Some(&vote)).is_err());
        // Same index, older term: the log was rolled back past a truncation.
        assert!(witness.check(log_id(1, 10), Some(&vote)).is_err());
        assert!(witness
            .check(log_id(2, 10), Some(&Vote::new(1, 1)))
            .is_err());
        assert!(witness.check(log_id(2, 10), None).is_err());
        assert!(witness.check(None, Some(&vote)).is_err());
    }
}
