//! [`LogFile`]: the Raft log in segment files of its own, instead of a
//! redb table.
//!
//! Why: an append to redb is a copy-on-write transaction (new B-tree
//! pages, their checksums, a commit header) before its fsync, 0.19–0.23 ms
//! in all; a record written into a zero-filled file and `fdatasync`'d costs
//! the fsync and little else (docs/performance.md, "What the log's storage
//! costs").
//!
//! A log is a sequence of segments, numbered upwards. Each is created full
//! of zeros (so that an fdatasync never has to record a new size or newly
//! allocated blocks) and holds records back to back, **each written twice**:
//! once in the segment's first half and once as far into its second, both
//! in the same fdatasync:
//!
//! ```text
//! magic "DBLg" | payload length u32 | first index u64 | CRC-32 of the three before and the payload | payload
//! ```
//!
//! The payload is the bincode of the record's entries, which start at its
//! first index. A record **replaces every entry from its first index on**:
//! an append is a record at the log's end, and a truncation a record
//! without entries at the truncation point, so neither ever rewrites
//! bytes already written, and the log is simply every record replayed in
//! order.
//!
//! Why two copies: to tell a record torn by a crash from one damaged
//! later without the witness's second fsync on every append. A crash
//! mid-write leaves neither copy complete only if the record was never
//! fsync'd, so never acknowledged: dropped. Damage at rest (a flipped bit,
//! a bad page) hits one copy, 8 MiB from the other: the record is read
//! from the intact one. Two intact copies that differ are refused.
//!
//! Reading stops, in each segment, at the first record neither of whose
//! copies is intact. Whether what that dropped had been acknowledged is
//! also the witness's to say (`witness.rs`: the log must still reach the
//! end it recorded, which follows the log's a moment behind); a segment
//! that lost records in its middle leaves a gap before the next one, which
//! is refused here. New records never go after such an end, where leftover
//! bytes of the torn record (a user's stored value, say) could later read
//! as a record: the next record opens a new segment instead.
//!
//! Purging deletes whole segments; the purge marker (in redb, with the
//! vote) says which entries of the first remaining one are gone.
//!
//! Over 800 lines only with its tests (about 220): the segment format, its
//! reader and its writer are about 800.

use crate::raft_types::{NodeId, TypeConfig};
use openraft::{Entry, LogId};
use redb::StorageBackend;
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

const MAGIC: &[u8; 4] = b"DBLg";
/// The entries kept in memory after they are appended ([`LogIndex`]'s
/// `recent`), at most: their number and their encoded bytes.
const RECENT_ENTRIES: usize = 4096;
const RECENT_BYTES: usize = 16 << 20;
/// Magic, payload length, first index, checksum.
const HEADER: usize = 4 + 4 + 8 + 4;
/// The payload of one record at most: an append of more entries is cut
/// into several records (openraft hands a follower hundreds at once).
const MAX_PAYLOAD: usize = 8 << 20;

/// Where a node's log segments are kept: files in its data directory, or
/// simulated disks.
pub trait SegmentDir: Send + Sync + 'static {
    /// A new segment's size. A record too big for one gets a segment of
    /// its own.
    fn segment_bytes(&self) -> u64;
    /// Whether the next segment is created ahead, on a thread of its own
    /// (a real disk), or when it is needed (the simulation: another thread
    /// would make a run depend on the host's scheduler).
    fn creates_ahead(&self) -> bool;
    /// Segment `number`'s name, for messages.
    fn describe(&self, number: u64) -> String;
    /// The segments there are, by number, ascending.
    fn list(&self) -> io::Result<Vec<u64>>;
    fn open(&self, number: u64) -> io::Result<Arc<dyn StorageBackend>>;
    /// Makes the names of the segments there are durable.
    fn sync_names(&self) -> io::Result<()>;
    /// Creates segment `number`, `len` zero bytes, its bytes and its name
    /// durable when this returns. A crash part-way leaves a segment of
    /// zeros, shorter or not, which reads as holding no record.
    fn create(&self, number: u64, len: u64) -> io::Result<Arc<dyn StorageBackend>>;
    fn remove(&self, number: u64) -> io::Result<()>;
}

/// Where a record stands, and which of its entries are still the log's.
#[derive(Debug, Clone, Copy)]
struct Place {
    segment: u64,
    offset: u64,
    /// The index of its first entry.
    first: u64,
    /// How many of its entries are still the log's (a later record
    /// may have replaced the rest).
    count: u64,
}

/// The log's records by first index, and the segments they are in: what
/// every reader shares.
#[derive(Debug, Default)]
pub struct LogIndex {
    places: BTreeMap<u64, Place>,
    segments: BTreeMap<u64, Arc<dyn StorageBackend>>,
    /// Entries up to here are gone, even those of a record still kept for
    /// the entries after them.
    purged: Option<u64>,
    /// The newest entries as appended, with their encoded sizes: a
    /// contiguous run up to the log's end. Nearly every read (applying a
    /// commit, sending it to a follower) asks for them right after they
    /// were written; served from here they cost no read and no decoding.
    recent: VecDeque<(Entry<TypeConfig>, usize)>,
    recent_bytes: usize,
}

impl LogIndex {
    /// The index of the last entry, if any.
    pub fn last_index(&self) -> Option<u64> {
        let (_, place) = self.places.last_key_value()?;
        Some(place.first + place.count - 1)
    }

    pub fn first_index(&self) -> Option<u64> {
        self.places.first_key_value().map(|(first, _)| *first)
    }

    /// Refuses a log with entries missing: a segment that lost records in
    /// its middle (the rest of it unread) before one that goes on, or one
    /// lost altogether. Records replaced later may leave gaps on the way;
    /// only the gaps left in the end are refused.
    fn check_contiguous(&self, purged: Option<u64>, dir: &dyn SegmentDir) -> io::Result<()> {
        let Some(mut expected) = purged.map(|purged| purged + 1).or(self.first_index()) else {
            return Ok(());
        };
        for place in self.places.values() {
            if place.first > expected {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "entries {expected} to {} are missing from the log ({} goes on after them)",
                        place.first - 1,
                        dir.describe(place.segment)
                    ),
                ));
            }
            expected = place.first + place.count;
        }
        Ok(())
    }

    /// Replaces every entry from `first` on with `count` entries at `place`
    /// (none: a truncation).
    fn replace_from(&mut self, first: u64, place: Option<Place>) {
        while let Some((entry, bytes)) = self.recent.back() {
            if entry.log_id.index < first {
                break;
            }
            self.recent_bytes -= bytes;
            self.recent.pop_back();
        }
        self.places.split_off(&first);
        if let Some(mut before) = self.places.last_entry() {
            let before = before.get_mut();
            before.count = before.count.min(first - before.first);
        }
        if let Some(place) = place {
            self.places.insert(first, place);
        }
    }

    /// Forgets the entries up to `index`; the numbers of the segments that
    /// no longer hold any entry of the log.
    fn forget_up_to(&mut self, index: u64) -> Vec<u64> {
        self.purged = self.purged.max(Some(index));
        self.forget_recent_while(|entry| entry.log_id.index <= index);
        let kept = self.places.split_off(&(index + 1));
        let straddling = self
            .places
            .last_key_value()
            .filter(|(_, place)| place.first + place.count > index + 1)
            .map(|(&first, &place)| (first, place));
        self.places = kept;
        if let Some((first, place)) = straddling {
            self.places.insert(first, place);
        }
        // Places in index order are in segment order too: a record goes
        // into the newest segment, and replaces every place after its first
        // index.
        let oldest_needed = self
            .places
            .first_key_value()
            .map(|(_, place)| place.segment);
        self.segments
            .keys()
            .copied()
            .filter(|&segment| oldest_needed.is_none_or(|oldest| segment < oldest))
            .collect()
    }

    /// Keeps `entries`, just appended after the last of `recent`, each of
    /// about `bytes` encoded, dropping the oldest beyond the bounds.
    fn remember(&mut self, entries: &[Entry<TypeConfig>], bytes: usize) {
        for entry in entries {
            self.recent.push_back((entry.clone(), bytes));
            self.recent_bytes += bytes;
        }
        while self.recent.len() > RECENT_ENTRIES || self.recent_bytes > RECENT_BYTES {
            let (_, bytes) = self.recent.pop_front().expect("over a bound, so not empty");
            self.recent_bytes -= bytes;
        }
    }

    fn forget_recent_while(&mut self, mut forget: impl FnMut(&Entry<TypeConfig>) -> bool) {
        while let Some((entry, bytes)) = self.recent.front() {
            if !forget(entry) {
                break;
            }
            self.recent_bytes -= bytes;
            self.recent.pop_front();
        }
    }

    /// The entries in `range` (and not replaced), in order.
    pub fn read(&self, range: impl RangeBounds<u64>) -> io::Result<Vec<Entry<TypeConfig>>> {
        let start = match range.start_bound() {
            Bound::Included(&start) => start,
            Bound::Excluded(&start) => start + 1,
            Bound::Unbounded => 0,
        };
        let recent_first = self.recent.front().map(|(entry, _)| entry.log_id.index);
        if let Some(skip) = recent_first.and_then(|first| start.checked_sub(first)) {
            return Ok(self
                .recent
                .range(
                    usize::try_from(skip)
                        .unwrap_or(usize::MAX)
                        .min(self.recent.len())..,
                )
                .map(|(entry, _)| entry)
                .take_while(|entry| range.contains(&entry.log_id.index))
                .cloned()
                .collect());
        }
        // The record holding `start`, if it began before it.
        let from = self
            .places
            .range(..=start)
            .next_back()
            .map_or(start, |(&first, _)| first);
        let mut entries = Vec::new();
        for place in self.places.range(from..).map(|(_, place)| place) {
            let past_end = match range.end_bound() {
                Bound::Included(&end) => place.first > end,
                Bound::Excluded(&end) => place.first >= end,
                Bound::Unbounded => false,
            };
            if past_end {
                break;
            }
            let wanted = (place.first..place.first + place.count)
                .filter(|&index| range.contains(&index) && Some(index) > self.purged)
                .count();
            if wanted == 0 {
                continue;
            }
            let segment = self.segments.get(&place.segment).ok_or_else(|| {
                io::Error::other(format!("segment {} of the log is gone", place.segment))
            })?;
            let record = read_record(segment.as_ref(), place.offset)
                .map_err(|e| at_place(e, place.segment, place.offset))?
                .ok_or_else(|| {
                    at_place(
                        io::Error::new(io::ErrorKind::InvalidData, "no longer intact"),
                        place.segment,
                        place.offset,
                    )
                })?;
            entries.extend(
                record
                    .entries
                    .into_iter()
                    .take(place.count as usize)
                    .filter(|entry| {
                        range.contains(&entry.log_id.index)
                            && Some(entry.log_id.index) > self.purged
                    }),
            );
        }
        Ok(entries)
    }

    /// The id of the entry at `index`, if the log holds it.
    fn log_id_at(&self, index: u64) -> io::Result<Option<LogId<NodeId>>> {
        Ok(self.read(index..=index)?.first().map(|entry| entry.log_id))
    }
}

/// `error`, said of the record at `offset` of segment `number`.
fn at_place(error: io::Error, number: u64, offset: u64) -> io::Error {
    io::Error::new(
        error.kind(),
        format!("the log record at byte {offset} of segment {number}: {error}"),
    )
}

fn undecodable(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// A record as read back.
struct Record {
    first: u64,
    payload_len: u32,
    checksum: u32,
    entries: Vec<Entry<TypeConfig>>,
}

/// The record at `offset` in the half of `segment` that ends at `end`, if
/// an intact one starts there. An error only if the storage cannot be read
/// or an intact record does not decode.
fn read_copy(segment: &dyn StorageBackend, offset: u64, end: u64) -> io::Result<Option<Record>> {
    if offset + HEADER as u64 > end {
        return Ok(None);
    }
    let header = segment.read(offset, HEADER)?;
    let (magic, rest) = header.split_at(4);
    let payload_len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
    let first = u64::from_le_bytes(rest[4..12].try_into().expect("8 bytes"));
    let checksum = u32::from_le_bytes(rest[12..16].try_into().expect("4 bytes"));
    if magic != MAGIC
        || payload_len as usize > MAX_PAYLOAD
        || offset + (HEADER as u64) + u64::from(payload_len) > end
    {
        return Ok(None);
    }
    let payload = segment.read(offset + HEADER as u64, payload_len as usize)?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&header[4..16]);
    crc.update(&payload);
    if crc.finalize() != checksum {
        return Ok(None);
    }
    // A record whose checksum matches but whose payload does not decode
    // was written by another build: not a torn write, so not skipped.
    let entries = decode_entries(&payload)
        .map_err(|e| undecodable(format!("its checksum matches but it does not decode ({e})")))?;
    let follows = entries
        .iter()
        .enumerate()
        .all(|(at, entry)| entry.log_id.index == first + at as u64);
    if !follows {
        return Err(undecodable(format!(
            "its entries are not numbered from its first index {first}"
        )));
    }
    Ok(Some(Record {
        first,
        payload_len,
        checksum,
        entries,
    }))
}

/// The record at `offset` of `segment`'s first half, from whichever of its
/// two copies is intact; `None` if neither is (a torn write, or the end).
/// Two intact copies that differ are damage no crash makes.
fn read_record(segment: &dyn StorageBackend, offset: u64) -> io::Result<Option<Record>> {
    let half = segment.len()? / 2;
    let first = read_copy(segment, offset, half)?;
    let second = read_copy(segment, half + offset, 2 * half)?;
    match (first, second) {
        (Some(first), Some(second))
            if (first.first, first.payload_len, first.checksum)
                != (second.first, second.payload_len, second.checksum) =>
        {
            Err(undecodable(
                "its two copies are intact but differ".to_owned(),
            ))
        }
        (Some(record), _) | (None, Some(record)) => Ok(Some(record)),
        (None, None) => Ok(None),
    }
}

/// A record's entries, from its payload (`untrusted.rs` lists it).
pub(crate) fn decode_entries(payload: &[u8]) -> bincode::Result<Vec<Entry<TypeConfig>>> {
    bincode::deserialize(payload)
}

/// A record's bytes: header and payload.
fn encode_record(first: u64, payload: &[u8]) -> Vec<u8> {
    let payload_len = u32::try_from(payload.len()).expect("payload under MAX_PAYLOAD");
    let mut bytes = Vec::with_capacity(HEADER + payload.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&payload_len.to_le_bytes());
    bytes.extend_from_slice(&first.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes[4..16]);
    crc.update(payload);
    bytes.extend_from_slice(&crc.finalize().to_le_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// The log as read from its segments.
pub struct Scanned {
    pub index: LogIndex,
    /// The id of the last entry, if any.
    pub last: Option<LogId<NodeId>>,
    /// The last segment, and where its records end; `None` if there is no
    /// segment.
    end: Option<(u64, u64)>,
    /// Whether bytes other than zeros follow that end (a record torn by a
    /// crash): new records must then go into a new segment.
    torn: bool,
}

/// Reads every segment of `dir` and replays its records, with the entries
/// up to `purged` already compacted away. Changes nothing.
pub fn scan(dir: &dyn SegmentDir, purged: Option<LogId<NodeId>>) -> io::Result<Scanned> {
    let mut index = LogIndex::default();
    let mut end = None;
    let purged_index = purged.map(|id| id.index);
    for number in dir.list()? {
        let segment = dir.open(number)?;
        let mut offset = 0;
        while let Some(record) = read_record(segment.as_ref(), offset).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{}, byte {offset}: {e}", dir.describe(number)),
            )
        })? {
            let count = record.entries.len() as u64;
            let place = Place {
                segment: number,
                offset,
                first: record.first,
                count,
            };
            index.replace_from(record.first, (count > 0).then_some(place));
            offset += HEADER as u64 + u64::from(record.payload_len);
        }
        end = Some((number, offset));
        index.segments.insert(number, segment);
    }
    // Only the last segment is written to again, and only if nothing but
    // zeros follows its records in either half.
    let torn = match end {
        Some((number, offset)) => {
            let segment = &index.segments[&number];
            let half = segment.len()? / 2;
            !all_zeros(segment.as_ref(), offset, half)?
                || !all_zeros(segment.as_ref(), half + offset, 2 * half)?
        }
        None => false,
    };
    // Entries up to the purge marker are gone, whatever the segments say.
    if let Some(purged) = purged_index {
        index.forget_up_to(purged);
    }
    index.check_contiguous(purged_index, dir)?;
    let last = match index.last_index() {
        Some(last_index) => index.log_id_at(last_index)?,
        None => None,
    };
    Ok(Scanned {
        index,
        last,
        end,
        torn,
    })
}

/// Whether bytes `from..to` of `segment` are all zero.
fn all_zeros(segment: &dyn StorageBackend, from: u64, to: u64) -> io::Result<bool> {
    const CHUNK: usize = 1 << 20;
    // Compared as slices, which is one `memcmp` even in a debug build: a
    // byte-by-byte loop made every start (and every `deadbolt data check` of
    // the storage_damage sweeps) walk the empty half of a 16 MiB segment at
    // debug speed.
    static ZEROS: [u8; CHUNK] = [0; CHUNK];
    let mut at = from;
    while at < to {
        let len = CHUNK.min((to - at) as usize);
        if segment.read(at, len)? != ZEROS[..len] {
            return Ok(false);
        }
        at += len as u64;
    }
    Ok(true)
}

/// The segment records go into.
struct Active {
    number: u64,
    segment: Arc<dyn StorageBackend>,
    /// Where the next record starts (in the first half; its copy is as far
    /// into the second).
    offset: u64,
    /// Half the segment's size, read once.
    half: u64,
}

impl Active {
    fn new(number: u64, segment: Arc<dyn StorageBackend>, offset: u64) -> io::Result<Self> {
        Ok(Active {
            half: segment.len()? / 2,
            number,
            segment,
            offset,
        })
    }
}

/// A segment being created on a thread of its own.
type Creating = std::thread::JoinHandle<io::Result<Arc<dyn StorageBackend>>>;

/// The log's writer: appends, truncations and purges, one at a time. The
/// index it shares with readers changes only after the bytes are durable.
pub struct LogFile {
    dir: Arc<dyn SegmentDir>,
    index: Arc<std::sync::RwLock<LogIndex>>,
    /// The segment records go into and where the next one starts; `None`
    /// until the first record (or after a torn end) opens a segment.
    active: Option<Active>,
    next_segment: u64,
    /// The segment after the active one, being created (zero-filled and
    /// synced, some tens of milliseconds) on a thread of its own once the
    /// active one is half full, so that no append waits for it.
    ahead: Option<(u64, Creating)>,
    last: Option<LogId<NodeId>>,
    purged: Option<LogId<NodeId>>,
}

impl LogFile {
    /// Opens the log in `dir` for writing, after [`scan`]ning it.
    pub fn open(dir: Arc<dyn SegmentDir>, purged: Option<LogId<NodeId>>) -> io::Result<LogFile> {
        let scanned = scan(dir.as_ref(), purged)?;
        let active = match scanned.end {
            Some((number, offset)) if !scanned.torn => scanned
                .index
                .segments
                .get(&number)
                .map(|segment| Active::new(number, segment.clone(), offset))
                .transpose()?,
            _ => None,
        };
        if active.is_some() {
            // It may be one whose creation a crash cut short, before its
            // name was synced: records fsync'd into it must not vanish with
            // it.
            dir.sync_names()?;
        }
        let next_segment = scanned.end.map_or(1, |(number, _)| number + 1);
        let mut file = LogFile {
            dir,
            index: Arc::new(std::sync::RwLock::new(scanned.index)),
            active,
            next_segment,
            ahead: None,
            last: scanned.last,
            purged,
        };
        // Segments a purge emptied but a crash kept.
        file.remove_unneeded()?;
        Ok(file)
    }

    /// What readers share.
    pub fn index(&self) -> Arc<std::sync::RwLock<LogIndex>> {
        self.index.clone()
    }

    /// The id of the log's last entry, or the purge marker if it holds
    /// none: openraft's `last_log_id`.
    pub fn last_log_id(&self) -> Option<LogId<NodeId>> {
        self.last.or(self.purged)
    }

    /// The id of the entry at `index`, or the purge marker if that is
    /// where the log ends at or below it.
    pub fn log_id_at_or_purged(&self, index: u64) -> io::Result<Option<LogId<NodeId>>> {
        if let Some(purged) = self.purged.filter(|purged| purged.index >= index) {
            return Ok(Some(purged));
        }
        self.index
            .read()
            .expect("log index lock poisoned")
            .log_id_at(index)
    }

    fn end_index(&self) -> Option<u64> {
        self.last_log_id().map(|id| id.index)
    }

    /// Appends `entries`, durable when this returns. They follow the log's
    /// end, or replace entries from their first on (openraft truncates
    /// first, but its storage suite also appends over entries already
    /// there); a gap before them is refused: the log must have no hole.
    pub fn append(&mut self, entries: &[Entry<TypeConfig>]) -> io::Result<()> {
        let Some(first) = entries.first() else {
            return Ok(());
        };
        let next = self.end_index().map_or(first.log_id.index, |end| end + 1);
        if first.log_id.index > next {
            return Err(io::Error::other(format!(
                "an append at index {} would leave a hole after the log's end at {}",
                first.log_id.index,
                next - 1
            )));
        }
        let mut written = Vec::new();
        for chunk in chunks(entries)? {
            let first = chunk.first().expect("chunks are never empty").log_id.index;
            let payload = bincode::serialize(chunk).map_err(io::Error::other)?;
            let place = self.write(first, &payload, chunk.len() as u64)?;
            written.push((place, chunk, payload.len() / chunk.len()));
        }
        let places: Vec<Place> = written.iter().map(|(place, ..)| *place).collect();
        self.sync(&places)?;
        let mut index = self.index.write().expect("log index lock poisoned");
        for (place, chunk, bytes_each) in written {
            index.replace_from(place.first, Some(place));
            index.remember(chunk, bytes_each);
        }
        // Entries appended at or below the purge marker are gone at once,
        // as they will be when read back.
        if let Some(purged) = self.purged.filter(|p| p.index >= first.log_id.index) {
            index.forget_up_to(purged.index);
        }
        drop(index);
        self.last = entries.last().map(|entry| entry.log_id);
        Ok(())
    }

    /// Removes the entries from `index` on, durably.
    pub fn truncate(&mut self, from: u64) -> io::Result<()> {
        let no_entries: &[Entry<TypeConfig>] = &[];
        let payload = bincode::serialize(no_entries).map_err(io::Error::other)?;
        let place = self.write(from, &payload, 0)?;
        self.sync(&[place])?;
        let mut index = self.index.write().expect("log index lock poisoned");
        index.replace_from(from, None);
        self.last = match index.last_index() {
            Some(last) => index.log_id_at(last)?,
            None => None,
        };
        Ok(())
    }

    /// Forgets the entries up to `log_id` (the purge marker is already
    /// durable elsewhere) and deletes the segments left without any entry.
    pub fn purge(&mut self, log_id: LogId<NodeId>) -> io::Result<()> {
        self.purged = Some(log_id);
        if self.last.is_some_and(|last| last.index <= log_id.index) {
            self.last = None;
        }
        self.remove_unneeded()
    }

    fn remove_unneeded(&mut self) -> io::Result<()> {
        let Some(purged) = self.purged else {
            return Ok(());
        };
        let unneeded = self
            .index
            .write()
            .expect("log index lock poisoned")
            .forget_up_to(purged.index);
        for number in unneeded {
            if self
                .active
                .as_ref()
                .is_some_and(|active| active.number == number)
            {
                continue;
            }
            self.dir.remove(number)?;
            self.index
                .write()
                .expect("log index lock poisoned")
                .segments
                .remove(&number);
        }
        Ok(())
    }

    /// Writes one record (not yet synced) and says where it stands.
    fn write(&mut self, first: u64, payload: &[u8], count: u64) -> io::Result<Place> {
        let bytes = encode_record(first, payload);
        let needed = bytes.len() as u64;
        let fits = |active: &Active| active.offset + needed <= active.half;
        if !self.active.as_ref().is_some_and(fits) {
            let (number, segment) = self.next_segment(needed)?;
            self.index
                .write()
                .expect("log index lock poisoned")
                .segments
                .insert(number, segment.clone());
            self.active = Some(Active::new(number, segment, 0)?);
        }
        let active = self.active.as_mut().expect("a segment to write to");
        active.segment.write(active.offset, &bytes)?;
        active.segment.write(active.half + active.offset, &bytes)?;
        let place = Place {
            segment: active.number,
            offset: active.offset,
            first,
            count,
        };
        active.offset += needed;
        self.create_ahead()?;
        Ok(place)
    }

    /// A new segment for records to go into, of room for at least `needed`
    /// bytes: the one created ahead if there is one (and it is big enough).
    fn next_segment(&mut self, needed: u64) -> io::Result<(u64, Arc<dyn StorageBackend>)> {
        let ahead = match self.ahead.take() {
            Some((number, creating)) => {
                let created = creating
                    .join()
                    .map_err(|_| io::Error::other("creating a log segment panicked"))?
                    // Its number is taken again by the next try (a full
                    // disk's), and nothing of it is left (`create`).
                    .inspect_err(|_| self.next_segment = number)?;
                Some((number, created))
            }
            None => None,
        };
        let (number, segment) = match ahead {
            Some((number, segment)) if segment.len()? / 2 >= needed => (number, segment),
            // None created ahead, or too small (it stays, empty).
            _ => {
                let number = self.next_segment;
                let len = self.dir.segment_bytes().max(2 * needed);
                let segment = self.dir.create(number, len)?;
                self.next_segment += 1;
                (number, segment)
            }
        };
        Ok((number, segment))
    }

    /// Starts creating the segment after the active one, on a thread of its
    /// own, once the active one is half full (so that a node that writes
    /// little never has a second).
    fn create_ahead(&mut self) -> io::Result<()> {
        let half_full = self
            .active
            .as_ref()
            .is_some_and(|active| active.offset > active.half / 2);
        if !self.dir.creates_ahead() || self.ahead.is_some() || !half_full {
            return Ok(());
        }
        let (dir, ahead) = (self.dir.clone(), self.next_segment);
        self.next_segment += 1;
        let creating = std::thread::Builder::new()
            .name("log-segment".into())
            .spawn(move || dir.create(ahead, dir.segment_bytes()))?;
        self.ahead = Some((ahead, creating));
        Ok(())
    }

    /// Makes the segments `written` went into durable.
    fn sync(&self, written: &[Place]) -> io::Result<()> {
        let mut numbers: Vec<u64> = written.iter().map(|place| place.segment).collect();
        numbers.dedup();
        let segments: Vec<Arc<dyn StorageBackend>> = {
            let index = self.index.read().expect("log index lock poisoned");
            numbers
                .iter()
                .map(|number| index.segments[number].clone())
                .collect()
        };
        for segment in segments {
            // Never a full disk, whatever the kernel's reason: a failed
            // fsync is not tried again (`disk_space.rs`).
            segment
                .sync_data(false)
                .map_err(|err| io::Error::other(format!("the log's fsync failed: {err}")))?;
        }
        Ok(())
    }
}

/// `entries` cut into runs whose encoding stays under [`MAX_PAYLOAD`].
fn chunks(entries: &[Entry<TypeConfig>]) -> io::Result<Vec<&[Entry<TypeConfig>]>> {
    let mut chunks = Vec::new();
    let (mut start, mut bytes) = (0, 8u64);
    for (at, entry) in entries.iter().enumerate() {
        let size = bincode::serialized_size(entry).map_err(io::Error::other)?;
        if size + 8 > MAX_PAYLOAD as u64 {
            return Err(io::Error::other(format!(
                "log entry {} is {size} bytes, more than a log record holds",
                entry.log_id.index
            )));
        }
        if bytes + size > MAX_PAYLOAD as u64 {
            chunks.push(&entries[start..at]);
            (start, bytes) = (at, 8);
        }
        bytes += size;
    }
    chunks.push(&entries[start..]);
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::segments::SimulatedSegments;
    use crate::store::shared_memory::SharedMemory as Memory;
    use openraft::{CommittedLeaderId, EntryPayload};
    use std::sync::atomic::{AtomicI64, Ordering};

    type Segments = SimulatedSegments<Memory>;

    /// A record's payload as a log of every kind of entry writes it: a
    /// blank, a batch of commands, a membership.
    fn every_kind_of_entry() -> Vec<Entry<TypeConfig>> {
        use crate::raft_types::Batch;
        use deadbolt_core::{Command, SessionId, Token};
        let batch = Batch {
            commands: vec![
                Command::Release {
                    session: SessionId(7),
                    lock: "jobs/a".into(),
                    token: Token(42),
                },
                Command::Acl(deadbolt_core::AclCommand::DenyIdentity {
                    identity: "laptop-7".into(),
                }),
            ]
            .into(),
            at_ms: 1_764_000_000_000,
        };
        let members = std::collections::BTreeMap::from([(1, openraft::BasicNode::new("a:1"))]);
        let membership = openraft::Membership::new(vec![[1].into()], members);
        let log_id = |index| LogId::new(CommittedLeaderId::new(2, 1), index);
        vec![
            entry(2, 5),
            Entry {
                log_id: log_id(6),
                payload: EntryPayload::Normal(batch),
            },
            Entry {
                log_id: log_id(7),
                payload: EntryPayload::Membership(membership),
            },
        ]
    }

    // Issue 58, part 1: a record whose checksum matches (anyone who can
    // write the file can compute one) but whose lengths are made huge.
    #[test]
    fn every_length_in_a_log_record_is_bounded() {
        let payload = bincode::serialize(&every_kind_of_entry()).unwrap();
        crate::huge_lengths::assert_every_length_bounded(
            "a log record",
            &payload,
            crate::untrusted::log_record,
        );
    }

    fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    fn entries(term: u64, indexes: std::ops::RangeInclusive<u64>) -> Vec<Entry<TypeConfig>> {
        indexes.map(|index| entry(term, index)).collect()
    }

    fn open(segments: &Segments, purged: Option<u64>) -> io::Result<LogFile> {
        LogFile::open(
            Arc::new(segments.clone()),
            purged.map(|i| entry(1, i).log_id),
        )
    }

    fn ids(log: &LogFile, range: std::ops::RangeFrom<u64>) -> Vec<(u64, u64)> {
        log.index()
            .read()
            .unwrap()
            .read(range)
            .unwrap()
            .iter()
            .map(|entry| (entry.log_id.leader_id.term, entry.log_id.index))
            .collect()
    }

    #[test]
    fn appends_truncations_and_purges_read_back_the_same_after_a_reopen() {
        let segments = Segments::default();
        let mut log = open(&segments, None).unwrap();
        log.append(&entries(1, 0..=9)).unwrap();
        log.truncate(6).unwrap();
        assert_eq!(log.last_log_id(), Some(entry(1, 5).log_id));
        log.append(&entries(2, 6..=12)).unwrap();
        log.purge(entry(1, 3).log_id).unwrap();
        let expected: Vec<(u64, u64)> = (4..=5)
            .map(|i| (1, i))
            .chain((6..=12).map(|i| (2, i)))
            .collect();
        assert_eq!(ids(&log, 0..), expected);
        drop(log);

        let log = open(&segments, Some(3)).unwrap();
        assert_eq!(ids(&log, 0..), expected);
        assert_eq!(log.last_log_id(), Some(entry(2, 12).log_id));
        assert_eq!(
            log.log_id_at_or_purged(2).unwrap(),
            Some(entry(1, 3).log_id)
        );
    }

    #[test]
    fn a_purge_deletes_the_segments_it_emptied_and_keeps_the_rest() {
        let segments = Segments::default();
        let mut log = open(&segments, None).unwrap();
        fill(&mut log, 8000);
        let before = segments.list().unwrap().len();
        log.purge(entry(1, 7990).log_id).unwrap();
        let after = segments.list().unwrap();
        assert!(
            before > after.len() && !after.is_empty(),
            "{before} → {after:?}"
        );
        drop(log);
        let log = open(&segments, Some(7990)).unwrap();
        assert_eq!(
            ids(&log, 0..),
            (7991..8000).map(|i| (1, i)).collect::<Vec<_>>()
        );
    }

    /// Appends entries 0 to `count` - 1, 20 to a record: more than two
    /// 64 KiB simulated segments hold.
    fn fill(log: &mut LogFile, count: u64) {
        for first in (0..count).step_by(20) {
            log.append(&entries(1, first..=first + 19)).unwrap();
        }
    }

    /// The bytes of segment `number`.
    fn bytes_of(segments: &Segments, number: u64) -> Memory {
        segments
            .each()
            .into_iter()
            .find(|(n, _)| *n == number)
            .expect("the segment")
            .1
    }

    #[test]
    fn a_torn_last_record_is_dropped_and_the_next_goes_into_a_new_segment() {
        let segments = Segments::default();
        let mut log = open(&segments, None).unwrap();
        log.append(&entries(1, 0..=4)).unwrap();
        log.append(&entries(1, 5..=6)).unwrap();
        let last = log.active.as_ref().expect("a segment written").number;
        let disk = bytes_of(&segments, last);
        drop(log);
        // Tear the second record: the last bytes of its copy in the second
        // half reached the disk, and those of the first did not: read back
        // from the intact copy.
        let end = (0..disk.len().unwrap())
            .rev()
            .find(|&at| disk.read(at, 1).unwrap()[0] != 0)
            .unwrap();
        let half = disk.len().unwrap() / 2;
        disk.write(end - half - 3, &[0; 4]).unwrap();
        let log = open(&segments, None).unwrap();
        assert_eq!(log.last_log_id(), Some(entry(1, 6).log_id));
        drop(log);
        // Neither copy complete: never acknowledged, dropped.
        disk.write(end - 3, &[0; 4]).unwrap();
        let mut log = open(&segments, None).unwrap();
        assert_eq!(log.last_log_id(), Some(entry(1, 4).log_id));
        log.append(&entries(2, 5..=5)).unwrap();
        assert_eq!(
            segments.list().unwrap().len(),
            2,
            "a new segment after a torn end"
        );
        drop(log);
        let log = open(&segments, None).unwrap();
        assert_eq!(
            ids(&log, 0..),
            (0..=4).map(|i| (1, i)).chain([(2, 5)]).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_record_damaged_in_one_copy_is_read_from_the_other_and_in_both_is_refused() {
        let segments = Segments::default();
        let mut log = open(&segments, None).unwrap();
        fill(&mut log, 8000);
        drop(log);
        assert!(segments.list().unwrap().len() >= 2);
        let first = bytes_of(&segments, 1);
        let half = first.len().unwrap() / 2;
        let flip = |at: u64| {
            let byte = first.read(at, 1).unwrap()[0];
            first.write(at, &[byte ^ 0x10]).unwrap();
        };
        // The second record of the first segment, one copy damaged: read
        // from the other.
        let second = read_record(&first, 0).unwrap().unwrap();
        let at = HEADER as u64 + u64::from(second.payload_len) + HEADER as u64 + 2;
        flip(at);
        let log = open(&segments, None).unwrap();
        assert_eq!(log.last_log_id(), Some(entry(1, 7999).log_id));
        drop(log);
        // Both copies: the rest of the segment is unread, and the next one
        // goes on after a gap.
        flip(half + at);
        let err = open(&segments, None).err().expect("refused");
        assert!(err.to_string().contains("missing from the log"), "{err}");
    }

    proptest::proptest! {
        /// A segment is read from disk, where anything may have happened to
        /// it: any bytes give records or a refusal, never a panic.
        #[test]
        fn untrusted_segments_of_random_bytes_never_panic(
            bytes in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..2048),
        ) {
            let segments = Segments::default();
            let disk = Memory::default();
            disk.set_len(bytes.len() as u64).unwrap();
            disk.write(0, &bytes).unwrap();
            segments.replace(1, disk);
            let _ = open(&segments, None);
        }

        /// The log is what the appends and truncations acknowledged say,
        /// however they are cut into records and segments.
        #[test]
        fn the_log_reads_back_as_a_model_of_it_says(
            steps in proptest::collection::vec((0u8..4, 1u64..40), 1..60),
        ) {
            let segments = Segments::default();
            let mut log = open(&segments, None).unwrap();
            let mut model: Vec<(u64, u64)> = Vec::new();
            let mut term = 1;
            for (kind, n) in steps {
                match kind {
                    0 if !model.is_empty() => {
                        let from = n % model.len() as u64;
                        log.truncate(from).unwrap();
                        model.truncate(from as usize);
                        term += 1;
                    }
                    _ => {
                        let next = model.len() as u64;
                        let batch: Vec<_> = (next..next + n).map(|i| entry(term, i)).collect();
                        log.append(&batch).unwrap();
                        model.extend((next..next + n).map(|i| (term, i)));
                    }
                }
                proptest::prop_assert_eq!(ids(&log, 0..), model.clone());
            }
            drop(log);
            let log = open(&segments, None).unwrap();
            proptest::prop_assert_eq!(ids(&log, 0..), model.clone());
            proptest::prop_assert_eq!(
                log.last_log_id().map(|id| (id.leader_id.term, id.index)),
                model.last().copied()
            );
        }

        /// The disk fills at any write (a record's first copy, its second,
        /// a new segment) and the append or truncation that met it is tried
        /// again once space is back, as `LogStore` does: the log is then
        /// what the acknowledged operations say, and reads back so.
        #[test]
        fn an_append_tried_again_after_a_full_disk_leaves_the_log_whole(
            steps in proptest::collection::vec((0u8..4, 1u64..40, proptest::option::of(0i64..4)), 1..60),
        ) {
            let segments = FullSegments::default();
            let mut log = LogFile::open(Arc::new(segments.clone()), None).unwrap();
            let mut model: Vec<(u64, u64)> = Vec::new();
            let mut term = 1;
            for (kind, n, writes_before_full) in steps {
                WRITES_LEFT.store(writes_before_full.unwrap_or(-1), Ordering::SeqCst);
                let mut until_done = |step: &mut dyn FnMut(&mut LogFile) -> io::Result<()>| {
                    if let Err(err) = step(&mut log) {
                        assert!(crate::store::disk_space::is_disk_full(&err), "{err}");
                        WRITES_LEFT.store(-1, Ordering::SeqCst);
                        step(&mut log).expect("space is back");
                    }
                };
                match kind {
                    0 if !model.is_empty() => {
                        let from = n % model.len() as u64;
                        until_done(&mut |log| log.truncate(from));
                        model.truncate(from as usize);
                        term += 1;
                    }
                    _ => {
                        let next = model.len() as u64;
                        let batch: Vec<_> = (next..next + n).map(|i| entry(term, i)).collect();
                        until_done(&mut |log| log.append(&batch));
                        model.extend((next..next + n).map(|i| (term, i)));
                    }
                }
                proptest::prop_assert_eq!(ids(&log, 0..), model.clone());
            }
            WRITES_LEFT.store(-1, Ordering::SeqCst);
            drop(log);
            let log = LogFile::open(Arc::new(segments), None).unwrap();
            proptest::prop_assert_eq!(ids(&log, 0..), model);
        }
    }

    /// Writes left before [`FillsUp`] disks are full; negative: never.
    /// Only the full-disk property test uses them, one case at a time.
    static WRITES_LEFT: AtomicI64 = AtomicI64::new(-1);

    type FullSegments = SimulatedSegments<FillsUp>;

    /// A simulated disk that refuses writes (and growth) once
    /// [`WRITES_LEFT`] runs out, as a full file system does.
    #[derive(Debug, Clone, Default)]
    struct FillsUp(Memory);

    impl FillsUp {
        fn room_for_one_more() -> io::Result<()> {
            match WRITES_LEFT.load(Ordering::SeqCst) {
                0 => Err(io::Error::from(io::ErrorKind::StorageFull)),
                left => {
                    if left > 0 {
                        WRITES_LEFT.fetch_sub(1, Ordering::SeqCst);
                    }
                    Ok(())
                }
            }
        }
    }

    impl StorageBackend for FillsUp {
        fn len(&self) -> io::Result<u64> {
            self.0.len()
        }
        fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
            self.0.read(offset, len)
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            Self::room_for_one_more()?;
            self.0.set_len(len)
        }
        fn sync_data(&self, eventual: bool) -> io::Result<()> {
            self.0.sync_data(eventual)
        }
        fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            Self::room_for_one_more()?;
            self.0.write(offset, data)
        }
    }
}
