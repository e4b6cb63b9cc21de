//! Opening the data directory, and refusing one that is not ours or that
//! lost what it held.
//!
//! A wrong `--data-dir` must fail loudly at start, never be "repaired" into
//! an empty lock service. A directory holds the database (the log, the vote),
//! its witness (`witness.rs`), written first when the directory is
//! initialized, and the snapshot database. The snapshot has a file of its
//! own so that writing a whole table (100 MB at a million locks) never holds
//! the log database's one writer: an append waited for it, and for redb
//! freeing the pages of the snapshot it replaced, for up to 0.6 s
//! (docs/performance.md). At every start, before anything is written:
//! - a database missing or empty next to a witness that saw data is a loss;
//! - a database without its witness, or of another instance, is refused;
//! - both databases are opened on a [`ReadOnlyOverlay`] (recovery and repair
//!   write to memory only), their pages checked by redb, and every record read
//!   and checked ([`verify`]) against its checksum and the witness, with a
//!   panic of the storage library caught and reported; the snapshot must
//!   reach every log entry compacted away, so a snapshot file that is lost
//!   or went back is refused, not replaced by a shorter history;
//! - only then is it opened for writing.
//!
//! Over 800 lines only with its tests (about 350): opening, checking and
//! migrating a data directory is about 710.

use super::disk_space::{DiskSpace, WaitsForSpace};
use super::log_file::{LogFile, SegmentDir};
use super::overlay::ReadOnlyOverlay;
use super::segments::{DirSegments, SimulatedSegments};
use super::state_machine::upgrade_format_9;
use super::verify::{entries_in_table, verify, DataReport, Refusal};
use super::witness::{Witness, WitnessFile, WITNESS_FILE};
use super::{
    encode, read_meta, snapshot_chunks, At, FORMAT, FORMAT_KEY, FORMAT_LOG_IN_DATABASE,
    FORMAT_SNAPSHOT_IN_LOG, FORMAT_SNAPSHOT_IN_ONE_VALUE, INSTANCE_KEY, LOG, META, PURGED_KEY,
    SNAPSHOT_KEY,
};
use crate::raft_types::NodeId;
use openraft::{ErrorSubject, ErrorVerb};
use redb::backends::FileBackend;
use redb::{Database, DatabaseError, ReadableTable, ReadableTableMetadata, StorageBackend};
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The database file inside a data directory.
const DB_FILE: &str = "deadbolt.redb";
/// The snapshot database beside it.
pub const SNAPSHOTS_FILE: &str = "deadbolt-snapshots.redb";

/// What to do about a data directory that lost or damaged its data.
const RECOVERY: &str = "Nothing was changed. \
    If this node is one of a cluster, rebuild it from its peers: `deadbolt cluster remove ID`, \
    move the directory aside, start the node again with --join, then `deadbolt cluster add ID ADDRESS`. \
    A single node: restore the directory from a backup, or move it aside and start afresh \
    (its locks and sessions are gone, but tokens never go back: each is at least the wall-clock \
    time of its grant in microseconds). `deadbolt data check --data-dir DIR` shows what is wrong; \
    docs/safety.md, \"Storage faults\", explains.";

/// Why a data directory was refused.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("cannot create data directory {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is not a Deadbolt data directory: it holds {found:?} but no {DB_FILE}; \
         point --data-dir at an empty or Deadbolt directory"
    )]
    Foreign { path: PathBuf, found: String },
    #[error("{path} holds no Deadbolt data")]
    Empty { path: PathBuf },
    #[error("{path} is already in use by another Deadbolt process")]
    InUse { path: PathBuf },
    #[error(
        "{path} is missing or empty, but its witness says this directory held \
         the data of node {node_id} up to log index {last_index}: the database was deleted, \
         truncated or replaced. {RECOVERY}"
    )]
    Lost {
        path: PathBuf,
        node_id: NodeId,
        last_index: u64,
    },
    #[error(
        "{path} has no witness ({WITNESS_FILE}) beside it, which every Deadbolt \
         data directory of this format has, so it cannot tell whether the database went back to an \
         older state (a directory written before data format 8 has none: this build cannot read it). \
         {RECOVERY}"
    )]
    WitnessMissing { path: PathBuf },
    #[error("{path} is damaged ({reason}). {RECOVERY}")]
    Damaged { path: PathBuf, reason: String },
    /// A write or fsync that failed once every check had passed: the disk's
    /// fault, not the data's. Told apart from [`DataDirError::Damaged`],
    /// whose advice (rebuild the node, or start it afresh) would throw away
    /// a directory that is sound (found by `tests/fsync_errors.rs`).
    #[error(
        "cannot write {path} ({reason}), although every check of the directory passed: the disk \
         failed a write or an fsync, and a failed fsync is never retried. Nothing acknowledged is \
         lost (a write that failed was never acknowledged): check the disk (dmesg, free space), \
         then start the node again"
    )]
    WriteFailed { path: PathBuf, reason: String },
    #[error(
        "cannot open {path}: {source}; check its permissions and that its file system is mounted"
    )]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} holds the data of node {found}, not of node {expected}: check --node-id and --data-dir"
    )]
    NodeMismatch {
        path: PathBuf,
        found: NodeId,
        expected: NodeId,
    },
    #[error(
        "{path} holds data of format {found:?}, and this build ({release}) reads {expected:?} and \
         the formats before it back to \"deadbolt-data/9\": {advice}",
        release = crate::RELEASE,
        advice = format_advice(found)
    )]
    WrongFormat {
        path: PathBuf,
        found: String,
        expected: String,
    },
}

/// What to do about a data directory of a format this build does not read:
/// a newer one came from a newer release (there is no downgrade of data,
/// `docs/upgrading.md`), anything else is not a Deadbolt data directory of a
/// release this build knows.
fn format_advice(found: &str) -> &'static str {
    let number = found
        .strip_prefix("deadbolt-data/")
        .and_then(|number| number.parse::<u32>().ok());
    match number {
        Some(number) if number > super::DATA_FORMAT => {
            "a newer release wrote it; run that release (or a newer one) on it, or restore a \
             backup this release reads (docs/upgrading.md, \"Downgrades\")"
        }
        _ => "point --data-dir at this node's own data directory, or an empty one",
    }
}

/// A data directory's databases, opened for writing after every check, and
/// the witness.
pub struct OpenedData {
    pub db: Database,
    pub log: LogFile,
    pub snapshots: Database,
    pub witness: WitnessFile,
    /// What the database held; `None` for a new directory.
    pub report: Option<DataReport>,
    /// Whether the disk is full: its writes wait for space meanwhile.
    pub space: DiskSpace,
}

/// One of the two databases of a data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Db {
    /// The log, the vote, the purge marker.
    Log,
    /// The latest snapshot.
    Snapshots,
}

impl Db {
    fn file(self) -> &'static str {
        match self {
            Db::Log => DB_FILE,
            Db::Snapshots => SNAPSHOTS_FILE,
        }
    }
}

/// Where a node's data lives: a directory, or simulated disks.
trait Disk {
    /// A database's name in messages.
    fn name(&self, db: Db) -> PathBuf;
    /// A database's size, 0 if there is none yet.
    fn db_len(&self, db: Db) -> io::Result<u64>;
    /// A database's storage, only to be read.
    fn db_read_only(&self, db: Db) -> Result<Box<dyn StorageBackend>, DataDirError>;
    /// A database, opened (or created) for writing.
    fn open_db(&self, db: Db) -> Result<Database, DatabaseError>;
    /// The witness's storage, if it exists, locked against other processes.
    fn witness(&self, create: bool) -> Result<Option<Box<dyn StorageBackend>>, DataDirError>;
    /// The log's segments; `writable` only once every check has passed.
    fn segments(&self, writable: bool) -> Arc<dyn SegmentDir>;
    /// Makes new files' names durable.
    fn sync_names(&self) -> io::Result<()>;
    /// Whether the disk is full, shared by everything written to it.
    fn space(&self) -> DiskSpace;
}

struct DirDisk {
    dir: PathBuf,
    /// The databases and the witness wait for space through it.
    space: DiskSpace,
}

impl DirDisk {
    fn in_use_or(&self, err: DatabaseError, file: &str) -> DataDirError {
        match err {
            DatabaseError::DatabaseAlreadyOpen => DataDirError::InUse {
                path: self.dir.clone(),
            },
            other => DataDirError::Damaged {
                path: self.dir.join(file),
                reason: other.to_string(),
            },
        }
    }
}

impl Disk for DirDisk {
    fn name(&self, db: Db) -> PathBuf {
        self.dir.join(db.file())
    }

    fn db_len(&self, db: Db) -> io::Result<u64> {
        match std::fs::metadata(self.name(db)) {
            Ok(meta) => Ok(meta.len()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(err) => Err(err),
        }
    }

    fn db_read_only(&self, db: Db) -> Result<Box<dyn StorageBackend>, DataDirError> {
        let file = File::open(self.name(db)).map_err(|source| DataDirError::Open {
            path: self.name(db),
            source,
        })?;
        Ok(Box::new(
            FileBackend::new(file).map_err(|e| self.in_use_or(e, db.file()))?,
        ))
    }

    /// As `Database::create` opens it, behind [`WaitsForSpace`]: redb
    /// never sees a write fail on a full disk.
    fn open_db(&self, db: Db) -> Result<Database, DatabaseError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.name(db))?;
        let backend = WaitsForSpace::new(FileBackend::new(file)?, self.space.clone());
        Database::builder().create_with_backend(backend)
    }

    fn witness(&self, create: bool) -> Result<Option<Box<dyn StorageBackend>>, DataDirError> {
        let path = self.dir.join(WITNESS_FILE);
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(&path)
        {
            Ok(file) => file,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(DataDirError::Open { path, source }),
        };
        let backend = FileBackend::new(file).map_err(|e| self.in_use_or(e, WITNESS_FILE))?;
        Ok(Some(Box::new(WaitsForSpace::new(
            backend,
            self.space.clone(),
        ))))
    }

    fn segments(&self, writable: bool) -> Arc<dyn SegmentDir> {
        Arc::new(DirSegments::new(&self.dir, writable))
    }

    fn sync_names(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }

    fn space(&self) -> DiskSpace {
        self.space.clone()
    }
}

/// One simulated disk: a redb storage backend whose clones share its
/// bytes (a new one is empty). The name lets the embedding API
/// (`embedded.rs`) take a disk without naming redb itself: only `store/`
/// knows the database.
pub trait SimulatedDisk: StorageBackend + Clone + Default {}

impl<D: StorageBackend + Clone + Default> SimulatedDisk for D {}

/// A node's simulated disks, one per file of a data directory.
#[derive(Debug, Clone, Default)]
pub struct SimulatedDisks<D> {
    pub db: D,
    pub witness: D,
    pub snapshots: D,
    pub log: SimulatedSegments<D>,
}

impl<D: Clone> SimulatedDisks<D> {
    /// The same change to each disk: a crash, a synced image.
    pub fn map(&self, mut change: impl FnMut(&D) -> D) -> Self {
        SimulatedDisks {
            db: change(&self.db),
            witness: change(&self.witness),
            snapshots: change(&self.snapshots),
            log: self.log.map(change),
        }
    }

    fn disk(&self, db: Db) -> &D {
        match db {
            Db::Log => &self.db,
            Db::Snapshots => &self.snapshots,
        }
    }
}

impl<D: SimulatedDisk> Disk for SimulatedDisks<D> {
    fn name(&self, db: Db) -> PathBuf {
        PathBuf::from(format!("<simulated disk of {}>", db.file()))
    }

    fn db_len(&self, db: Db) -> io::Result<u64> {
        self.disk(db).len()
    }

    fn db_read_only(&self, db: Db) -> Result<Box<dyn StorageBackend>, DataDirError> {
        Ok(Box::new(self.disk(db).clone()))
    }

    fn open_db(&self, db: Db) -> Result<Database, DatabaseError> {
        Database::builder().create_with_backend(self.disk(db).clone())
    }

    fn witness(&self, _create: bool) -> Result<Option<Box<dyn StorageBackend>>, DataDirError> {
        Ok(Some(Box::new(self.witness.clone())))
    }

    fn segments(&self, _writable: bool) -> Arc<dyn SegmentDir> {
        Arc::new(self.log.clone())
    }

    fn sync_names(&self) -> io::Result<()> {
        Ok(())
    }

    /// Memory is never full.
    fn space(&self) -> DiskSpace {
        DiskSpace::default()
    }
}

/// Opens (creating if needed) the data in `dir` for node `node_id`.
pub fn open_data_dir(dir: &Path, node_id: NodeId) -> Result<OpenedData, DataDirError> {
    std::fs::create_dir_all(dir).map_err(|source| DataDirError::Create {
        path: dir.to_owned(),
        source,
    })?;
    let disk = DirDisk {
        dir: dir.to_owned(),
        space: DiskSpace::default(),
    };
    let is_new = disk.db_len(Db::Log).unwrap_or(0) == 0 && !dir.join(WITNESS_FILE).exists();
    if is_new {
        refuse_foreign(dir)?;
    }
    open(&disk, node_id)
}

/// Opens the data on simulated disks (the deterministic simulation's
/// memory that survives a simulated crash), with the same checks as a data
/// directory.
pub fn open_simulated_disk<D: SimulatedDisk>(
    disks: &SimulatedDisks<D>,
    node_id: NodeId,
) -> Result<OpenedData, DataDirError> {
    open(disks, node_id)
}

/// Checks the data in `dir` without changing it: `deadbolt data check`.
pub fn check_data_dir(dir: &Path) -> Result<DataReport, DataDirError> {
    let disk = DirDisk {
        dir: dir.to_owned(),
        space: DiskSpace::default(),
    };
    let witness = disk.witness(false)?;
    let db_len = disk.db_len(Db::Log).map_err(|e| damaged(&disk, e))?;
    match (witness, db_len) {
        (None, 0) => Err(DataDirError::Empty {
            path: dir.to_owned(),
        }),
        (None, _) => Err(missing_witness(&disk)),
        (Some(witness), db_len) => {
            let witness = read_witness(&disk, witness)?;
            if db_len == 0 {
                return Err(lost(&disk, witness.current()));
            }
            check(&disk, witness.current())
        }
    }
}

fn open(disk: &dyn Disk, node_id: NodeId) -> Result<OpenedData, DataDirError> {
    let db_len = disk.db_len(Db::Log).map_err(|e| damaged(disk, e))?;
    let witness = disk.witness(db_len == 0)?;
    let existing = match witness {
        Some(backend) if backend.len().map_err(|e| damaged(disk, e))? > 0 => {
            Some(read_witness(disk, backend)?)
        }
        Some(backend) if db_len == 0 => {
            // A new directory: the witness first, then the database.
            let witness = WitnessFile::create(backend, Witness::new(node_id))
                .map_err(|e| damaged(disk, e))?;
            disk.sync_names().map_err(|e| damaged(disk, e))?;
            return create(disk, witness);
        }
        _ => None,
    };
    let Some(witness) = existing else {
        return Err(missing_witness(disk));
    };
    let found = witness.current().node_id;
    if found != node_id {
        return Err(DataDirError::NodeMismatch {
            path: disk.name(Db::Log),
            found,
            expected: node_id,
        });
    }
    if db_len == 0 {
        if witness.current().saw_data() {
            return Err(lost(disk, witness.current()));
        }
        // Initialization stopped between the witness and the database.
        return create(disk, witness);
    }
    let report = check(disk, witness.current())?;
    open_for_writing(disk, witness, Some(report))
}

/// Creates the databases of a new directory, under its witness.
fn create(disk: &dyn Disk, witness: WitnessFile) -> Result<OpenedData, DataDirError> {
    let opened = open_for_writing(disk, witness, None)?;
    disk.sync_names()
        .map_err(|e| write_failed(disk, Db::Log, e))?;
    Ok(opened)
}

/// Opens (creating, in a new directory) both databases for writing.
fn open_for_writing(
    disk: &dyn Disk,
    witness: WitnessFile,
    report: Option<DataReport>,
) -> Result<OpenedData, DataDirError> {
    let instance = witness.current().instance;
    let mut snapshots = disk
        .open_db(Db::Snapshots)
        .map_err(|e| write_failed(disk, Db::Snapshots, e))?;
    prepare_snapshots(&snapshots, instance, disk)?;
    let mut db = disk
        .open_db(Db::Log)
        .map_err(|e| write_failed(disk, Db::Log, e))?;
    let log_in_database = prepare(&db, &mut snapshots, instance, disk)?;
    let segments = disk.segments(true);
    if log_in_database {
        move_log_into_segments(&mut db, segments.clone()).map_err(|e| damaged(disk, e))?;
    }
    let purged = read_meta(&db, PURGED_KEY, ErrorSubject::Logs).map_err(|e| damaged(disk, e))?;
    // Every record was read by the checks; what fails here is creating the
    // next segment, or its fsync.
    let log = LogFile::open(segments, purged).map_err(|e| write_failed(disk, Db::Log, e))?;
    Ok(OpenedData {
        db,
        log,
        snapshots,
        witness,
        report,
        space: disk.space(),
    })
}

/// Moves a format-11 log out of its database table into segments (any
/// left by a move a crash interrupted are replaced), and only then raises
/// the format marker and drops the table, in one transaction: a crash
/// before it leaves format 11, which moves the log again.
fn move_log_into_segments(
    db: &mut Database,
    segments: Arc<dyn SegmentDir>,
) -> Result<(), Box<dyn std::error::Error>> {
    let at = At(ErrorSubject::Logs, ErrorVerb::Read);
    let purged: Option<openraft::LogId<NodeId>> = read_meta(db, PURGED_KEY, ErrorSubject::Logs)?;
    let entries = entries_in_table(&db.begin_read()?, purged, &at)?;
    for number in segments.list()? {
        segments.remove(number)?;
    }
    LogFile::open(segments, purged)?.append(&entries)?;
    let txn = db.begin_write()?;
    txn.delete_table(LOG)?;
    txn.open_table(META)?.insert(FORMAT_KEY, FORMAT)?;
    txn.commit()?;
    db.compact()?;
    Ok(())
}

/// Opens a database on a read-only overlay and has redb check its pages;
/// `None` if it does not exist (yet).
fn checked_read_only(disk: &dyn Disk, which: Db) -> Result<Option<Database>, Refusal> {
    if disk.db_len(which).map_err(|e| e.to_string())? == 0 {
        return Ok(None);
    }
    let refusal = |reason: String| match which {
        Db::Log => Refusal::Damaged(reason),
        Db::Snapshots => Refusal::SnapshotDamaged(reason),
    };
    let base = disk
        .db_read_only(which)
        .map_err(|e| refusal(e.to_string()))?;
    let overlay = ReadOnlyOverlay::new(base).map_err(|e| refusal(e.to_string()))?;
    let mut db = Database::builder()
        .create_with_backend(overlay)
        .map_err(|e| refusal(e.to_string()))?;
    match db.check_integrity() {
        Ok(true) => Ok(Some(db)),
        Ok(false) => Err(refusal("its page checksums fail".to_owned())),
        Err(err) => Err(refusal(err.to_string())),
    }
}

/// Opens both databases on read-only overlays, has redb check their pages,
/// and reads every record: nothing is written, and a panic is a refusal.
fn check(disk: &dyn Disk, witness: &Witness) -> Result<DataReport, DataDirError> {
    let checked = crate::quiet_panic::catch_quietly(|| {
        let db = checked_read_only(disk, Db::Log)?
            .ok_or_else(|| Refusal::Damaged("it is empty".to_owned()))?;
        let snapshots = checked_read_only(disk, Db::Snapshots)?;
        verify(
            &db,
            snapshots.as_ref(),
            disk.segments(false).as_ref(),
            witness,
        )
    });
    let (which, reason) = match checked {
        Ok(Ok(report)) => return Ok(report),
        Ok(Err(Refusal::Damaged(reason))) => (Db::Log, reason),
        Ok(Err(Refusal::SnapshotDamaged(reason))) => (Db::Snapshots, reason),
        Ok(Err(Refusal::WrongFormat(found))) => {
            return Err(DataDirError::WrongFormat {
                path: disk.name(Db::Log),
                found,
                expected: String::from_utf8_lossy(FORMAT).into_owned(),
            })
        }
        Err(panic) => (
            Db::Log,
            format!(
                "the storage library failed on it: {}",
                crate::quiet_panic::message(&*panic)
            ),
        ),
    };
    Err(damaged_db(disk, which, reason))
}

fn read_witness(
    disk: &dyn Disk,
    backend: Box<dyn StorageBackend>,
) -> Result<WitnessFile, DataDirError> {
    match WitnessFile::read(backend) {
        Ok(Some(witness)) => Ok(witness),
        Ok(None) => Err(missing_witness(disk)),
        Err(err) => Err(DataDirError::Damaged {
            path: disk.name(Db::Log).with_file_name(WITNESS_FILE),
            reason: err.to_string(),
        }),
    }
}

fn lost(disk: &dyn Disk, witness: &Witness) -> DataDirError {
    DataDirError::Lost {
        path: disk.name(Db::Log),
        node_id: witness.node_id,
        last_index: witness.last_log.map_or(0, |id| id.index),
    }
}

fn missing_witness(disk: &dyn Disk) -> DataDirError {
    DataDirError::WitnessMissing {
        path: disk.name(Db::Log),
    }
}

fn damaged(disk: &dyn Disk, err: impl std::fmt::Display) -> DataDirError {
    damaged_db(disk, Db::Log, err)
}

fn damaged_db(disk: &dyn Disk, which: Db, err: impl std::fmt::Display) -> DataDirError {
    DataDirError::Damaged {
        path: disk.name(which),
        reason: err.to_string(),
    }
}

fn write_failed(disk: &dyn Disk, which: Db, err: impl std::fmt::Display) -> DataDirError {
    DataDirError::WriteFailed {
        path: disk.name(which),
        reason: err.to_string(),
    }
}

/// A directory about to be initialized must hold nothing of anyone else's.
fn refuse_foreign(dir: &Path) -> Result<(), DataDirError> {
    let found = std::fs::read_dir(dir)
        .map_err(|source| DataDirError::Create {
            path: dir.to_owned(),
            source,
        })?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        // A fresh file system's mount point is a fine place for data, and an
        // empty database file is nothing to lose.
        .find(|name| name != "lost+found" && name != DB_FILE && name != SNAPSHOTS_FILE);
    match found {
        Some(found) => Err(DataDirError::Foreign {
            path: dir.to_owned(),
            found,
        }),
        None => Ok(()),
    }
}

/// Checks the format marker and instance id (writing both into a new
/// database) and creates the tables. A database of an older format has its
/// snapshot moved to `snapshots` (format 9) or cut into chunks there
/// (format 10) first, then its marker raised to format 11: a crash in
/// between leaves the old format, which does it again. Whether the log is
/// still in the database (format 11), to be moved into segments.
fn prepare(
    db: &Database,
    snapshots: &mut Database,
    instance: u128,
    disk: &dyn Disk,
) -> Result<bool, DataDirError> {
    // Every check has passed: what fails from here is a write (or its
    // fsync), except a snapshot of an old format that does not decode.
    let failed = |reason: String| write_failed(disk, Db::Log, reason);
    let at = At(ErrorSubject::Store, ErrorVerb::Write);
    let txn = db.begin_write().map_err(|e| failed(e.to_string()))?;
    let mut log_in_database = false;
    {
        let mut meta = txn.open_table(META).map_err(|e| failed(e.to_string()))?;
        let found = meta
            .get(FORMAT_KEY)
            .map_err(|e| failed(e.to_string()))?
            .map(|v| v.value().to_vec());
        match found {
            Some(found) if found == FORMAT => {}
            Some(found) if found == FORMAT_LOG_IN_DATABASE => log_in_database = true,
            Some(found) if found == FORMAT_SNAPSHOT_IN_LOG => {
                log_in_database = true;
                let snapshot = meta
                    .remove(SNAPSHOT_KEY)
                    .map_err(|e| failed(e.to_string()))?
                    .map(|v| v.value().to_vec());
                if let Some(snapshot) = snapshot {
                    // Format 9's table had no limits: re-encoded on the way.
                    let snapshot = upgrade_format_9(&snapshot)
                        .map_err(|e| damaged(disk, format!("its snapshot: {e}")))?;
                    snapshot_chunks::write(snapshots, &snapshot)
                        .map_err(|e| write_failed(disk, Db::Snapshots, e))?;
                }
                meta.insert(FORMAT_KEY, FORMAT_LOG_IN_DATABASE)
                    .map_err(|e| failed(e.to_string()))?;
            }
            Some(found) if found == FORMAT_SNAPSHOT_IN_ONE_VALUE => {
                log_in_database = true;
                cut_into_chunks(snapshots).map_err(|e| damaged_db(disk, Db::Snapshots, e))?;
                meta.insert(FORMAT_KEY, FORMAT_LOG_IN_DATABASE)
                    .map_err(|e| failed(e.to_string()))?;
            }
            Some(found) => {
                return Err(DataDirError::WrongFormat {
                    path: disk.name(Db::Log),
                    found: String::from_utf8_lossy(&found).into_owned(),
                    expected: String::from_utf8_lossy(FORMAT).into_owned(),
                })
            }
            None if meta.len().map_err(|e| failed(e.to_string()))? == 0 => {
                meta.insert(FORMAT_KEY, FORMAT)
                    .map_err(|e| failed(e.to_string()))?;
                let instance = encode(&instance, &at).map_err(|e| failed(e.to_string()))?;
                meta.insert(INSTANCE_KEY, instance.as_slice())
                    .map_err(|e| failed(e.to_string()))?;
            }
            None => return Err(damaged(disk, "no format marker")),
        }
    }
    txn.commit().map_err(|e| failed(e.to_string()))?;
    Ok(log_in_database)
}

/// Rewrites format 10's snapshot, one value, in chunks, and gives back the
/// space the values took (up to nine times the snapshot: see
/// `snapshot_chunks.rs`), once, on the way to this format.
fn cut_into_chunks(snapshots: &mut Database) -> Result<(), redb::Error> {
    let sealed = snapshot_chunks::read(&snapshots.begin_read()?)?;
    if let Some(sealed) = sealed {
        snapshot_chunks::write(snapshots, &sealed)?;
    }
    snapshots.compact()?;
    Ok(())
}

/// Checks the snapshot database's instance id (writing it into a new
/// one) and creates its table.
fn prepare_snapshots(db: &Database, instance: u128, disk: &dyn Disk) -> Result<(), DataDirError> {
    let failed = |reason: String| write_failed(disk, Db::Snapshots, reason);
    let at = At(ErrorSubject::Store, ErrorVerb::Write);
    let txn = db.begin_write().map_err(|e| failed(e.to_string()))?;
    {
        let mut meta = txn.open_table(META).map_err(|e| failed(e.to_string()))?;
        if meta
            .get(INSTANCE_KEY)
            .map_err(|e| failed(e.to_string()))?
            .is_none()
        {
            let instance = encode(&instance, &at).map_err(|e| failed(e.to_string()))?;
            meta.insert(INSTANCE_KEY, instance.as_slice())
                .map_err(|e| failed(e.to_string()))?;
        }
    }
    txn.commit().map_err(|e| failed(e.to_string()))
}

#[cfg(test)]
#[path = "data_dir/killed_migrations.rs"]
mod killed_migrations;

#[cfg(test)]
mod tests {
    use super::*;

    /// `deadbolt version` reports the number in the marker every data
    /// directory is checked against, not a copy that could drift.
    #[test]
    fn the_reported_data_format_is_the_one_in_the_format_marker() {
        let marker = format!("deadbolt-data/{}", super::super::DATA_FORMAT);
        assert_eq!(FORMAT, marker.as_bytes());
    }

    fn open(dir: &Path) -> Result<OpenedData, DataDirError> {
        open_data_dir(dir, 1)
    }

    /// The sealed snapshot in the snapshot database of `data`.
    fn sealed_snapshot(data: &Path) -> Vec<u8> {
        let snapshots = Database::create(data.join(SNAPSHOTS_FILE)).unwrap();
        let txn = snapshots.begin_read().unwrap();
        snapshot_chunks::read(&txn).unwrap().expect("a snapshot")
    }

    /// The format marker of the log database of `data`.
    fn format(data: &Path) -> Vec<u8> {
        let db = Database::create(data.join(DB_FILE)).unwrap();
        let txn = db.begin_read().unwrap();
        let meta = txn.open_table(META).unwrap();
        let format = meta.get(FORMAT_KEY).unwrap().unwrap().value().to_vec();
        format
    }

    /// Writes `value` under `key` in the `META` table of `db_file` in `data`.
    fn set_meta(data: &Path, db_file: &str, key: &str, value: &[u8]) {
        let db = Database::create(data.join(db_file)).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META).unwrap().insert(key, value).unwrap();
        txn.commit().unwrap();
    }

    #[test]
    fn new_directory_is_created_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let first = open(&data).unwrap();
        assert!(first.report.is_none());
        let instance = first.witness.current().instance;
        drop(first);
        let again = open(&data).unwrap();
        assert_eq!(again.witness.current().instance, instance);
        assert!(again.report.is_some());
    }

    /// A newer release's directory is refused (not opened, not changed),
    /// with both versions and what to do; so is a format no release wrote.
    #[test]
    fn a_directory_of_a_newer_release_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        drop(open(&data).unwrap());
        let newer = format!("deadbolt-data/{}", super::super::DATA_FORMAT + 1);
        set_meta(&data, DB_FILE, FORMAT_KEY, newer.as_bytes());
        let err = open(&data).err().unwrap().to_string();
        assert!(
            err.contains(&newer)
                && err.contains(crate::RELEASE)
                && err.contains("a newer release wrote it")
                && err.contains("docs/upgrading.md"),
            "{err}"
        );
        assert_eq!(
            format(&data),
            newer.as_bytes(),
            "the refusal changed the marker"
        );

        set_meta(&data, DB_FILE, FORMAT_KEY, b"deadbolt-data/8");
        let err = open(&data).err().unwrap().to_string();
        assert!(err.contains("point --data-dir"), "{err}");
    }

    #[test]
    fn foreign_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("postgresql.conf"), "x").unwrap();
        let err = open(dir.path()).err().unwrap();
        assert!(matches!(err, DataDirError::Foreign { .. }), "{err}");
    }

    #[test]
    fn corrupt_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path()).unwrap());
        std::fs::write(dir.path().join(DB_FILE), vec![0x5a; 64 * 1024]).unwrap();
        let err = open(dir.path()).err().unwrap();
        assert!(matches!(err, DataDirError::Damaged { .. }), "{err}");
        // Refused without a write: the bytes are as they were left.
        assert_eq!(
            std::fs::read(dir.path().join(DB_FILE)).unwrap(),
            vec![0x5a; 64 * 1024]
        );
    }

    #[test]
    fn an_unreadable_directory_is_refused_as_unreadable_not_damaged() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path()).unwrap());
        let witness = dir.path().join(WITNESS_FILE);
        std::fs::remove_file(&witness).unwrap();
        std::fs::create_dir(&witness).unwrap();
        let err = open(dir.path()).err().unwrap();
        assert!(matches!(err, DataDirError::Open { .. }), "{err}");
        assert!(err.to_string().contains("cannot open"), "{err}");
    }

    #[test]
    fn second_open_is_refused_while_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let _first = open(dir.path()).unwrap();
        let err = open(dir.path()).err().unwrap();
        assert!(matches!(err, DataDirError::InUse { .. }), "{err}");
        let err = check_data_dir(dir.path()).err().unwrap();
        assert!(matches!(err, DataDirError::InUse { .. }), "{err}");
    }

    #[test]
    fn a_database_deleted_or_emptied_after_use_is_a_loss_not_a_fresh_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut opened = open(dir.path()).unwrap();
        opened
            .witness
            .record_vote(openraft::Vote::new(1, 1))
            .unwrap();
        drop(opened);
        std::fs::write(dir.path().join(DB_FILE), b"").unwrap();
        let err = open(dir.path()).err().unwrap();
        assert!(matches!(err, DataDirError::Lost { .. }), "{err}");
        std::fs::remove_file(dir.path().join(DB_FILE)).unwrap();
        let err = open(dir.path()).err().unwrap();
        assert!(matches!(err, DataDirError::Lost { .. }), "{err}");
        assert!(
            err.to_string().contains("rebuild it from its peers"),
            "{err}"
        );
        // Refused without creating anything.
        assert!(!dir.path().join(DB_FILE).exists());
    }

    #[test]
    fn a_database_without_its_witness_or_of_another_node_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path()).unwrap());
        let err = open_data_dir(dir.path(), 2).err().unwrap();
        assert!(
            matches!(
                err,
                DataDirError::NodeMismatch {
                    found: 1,
                    expected: 2,
                    ..
                }
            ),
            "{err}"
        );
        std::fs::remove_file(dir.path().join(WITNESS_FILE)).unwrap();
        let err = open(dir.path()).err().unwrap();
        assert!(matches!(err, DataDirError::WitnessMissing { .. }), "{err}");
    }

    #[test]
    fn a_database_from_another_directory_is_refused() {
        let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        drop(open(one.path()).unwrap());
        drop(open(two.path()).unwrap());
        std::fs::copy(one.path().join(DB_FILE), two.path().join(DB_FILE)).unwrap();
        let err = open(two.path()).err().unwrap();
        assert!(
            err.to_string()
                .contains("belongs to another data directory"),
            "{err}"
        );
    }

    /// A directory of the format before this one (the snapshot inside the
    /// log database, its table encoded before the table held its limits)
    /// is read as it is, and moved to the new layout, re-encoded, when
    /// opened for writing: an upgrade loses nothing. The old table is a
    /// real format-9 encoding, made by the build before the limits (the
    /// table inside `testdata/before-limits.snap`, see `backup.rs`).
    #[test]
    fn a_directory_with_the_snapshot_in_the_log_database_is_moved_to_its_own() {
        use super::super::codec;
        use super::super::state_machine::{decode_table, StoredSnapshot};
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        // The backup's body: saved_at_ms, node_id, term and index (a u64
        // each), then the table as the old build encoded it.
        let backup = include_bytes!("../../testdata/before-limits.snap");
        let body = codec::unseal(&backup[b"deadbolt-snapshot/1\n".len()..]).unwrap();
        let old_table = &body[4 * 8..];
        let table: deadbolt_core::LockTable =
            bincode::deserialize::<deadbolt_core::LockTableV9>(old_table)
                .unwrap()
                .into();
        assert_eq!((table.session_count(), table.lock_count()), (2, 2));
        let seeded = super::super::seed_data_dir(&data, 1, "127.0.0.1:7070", &table).unwrap();
        // Back to the old layout and the old table encoding, as format 9
        // wrote them.
        let snapshot = {
            let bytes = sealed_snapshot(&data);
            let stored: StoredSnapshot =
                bincode::deserialize(codec::unseal(&bytes).unwrap()).unwrap();
            let old = StoredSnapshot {
                meta: stored.meta,
                data: old_table.to_vec(),
            };
            assert!(
                decode_table(&old).is_err(),
                "the old encoding is not format 10's"
            );
            codec::seal(&bincode::serialize(&old).unwrap())
        };
        std::fs::remove_file(data.join(SNAPSHOTS_FILE)).unwrap();
        {
            let db = Database::create(data.join(DB_FILE)).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut meta = txn.open_table(META).unwrap();
                meta.insert(SNAPSHOT_KEY, snapshot.as_slice()).unwrap();
                meta.insert(FORMAT_KEY, FORMAT_SNAPSHOT_IN_LOG).unwrap();
            }
            txn.commit().unwrap();
        }
        assert_eq!(check_data_dir(&data).unwrap(), seeded);

        drop(open(&data).unwrap());
        let db = Database::create(data.join(DB_FILE)).unwrap();
        let txn = db.begin_read().unwrap();
        let meta = txn.open_table(META).unwrap();
        assert_eq!(meta.get(FORMAT_KEY).unwrap().unwrap().value(), FORMAT);
        assert!(meta.get(SNAPSHOT_KEY).unwrap().is_none());
        drop((meta, txn, db));
        assert_eq!(check_data_dir(&data).unwrap(), seeded);
        // Moved in this format's encoding: the same table, default limits.
        let bytes = sealed_snapshot(&data);
        let moved: StoredSnapshot = bincode::deserialize(codec::unseal(&bytes).unwrap()).unwrap();
        let moved = decode_table(&moved).unwrap();
        assert_eq!(moved, table);
        assert_eq!(moved.table_limits(), deadbolt_core::TableLimits::DEFAULT);
    }

    /// A format-11 directory (the log in a table of `deadbolt.redb`) is
    /// read as it is, and its log moved into segments when opened for
    /// writing; a segment left by a move a crash interrupted is replaced.
    #[test]
    fn a_format_11_directory_has_its_log_moved_into_segments() {
        use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let log_id = |index| LogId::new(CommittedLeaderId::new(1, 1), index);
        {
            let mut opened = open(&data).unwrap();
            let at = At(ErrorSubject::Logs, ErrorVerb::Write);
            let txn = opened.db.begin_write().unwrap();
            {
                let mut table = txn.open_table(LOG).unwrap();
                for index in 0..50 {
                    let entry = Entry::<crate::raft_types::TypeConfig> {
                        log_id: log_id(index),
                        payload: EntryPayload::Blank,
                    };
                    table
                        .insert(index, encode(&entry, &at).unwrap().as_slice())
                        .unwrap();
                }
                let mut meta = txn.open_table(META).unwrap();
                meta.insert(FORMAT_KEY, FORMAT_LOG_IN_DATABASE).unwrap();
            }
            txn.commit().unwrap();
            opened.witness.record_last_log(Some(log_id(49))).unwrap();
        }
        let leftover = data.join("deadbolt-log-0000000000000007");
        std::fs::write(&leftover, vec![0xa5; 4096]).unwrap();
        let before = check_data_dir(&data).unwrap();
        assert_eq!((before.log_first, before.log_last), (Some(0), Some(49)));

        drop(open(&data).unwrap());
        assert_eq!(format(&data), FORMAT);
        assert_eq!(check_data_dir(&data).unwrap(), before);
        assert!(!leftover.exists(), "the interrupted move's segment is gone");
        let db = Database::create(data.join(DB_FILE)).unwrap();
        let txn = db.begin_read().unwrap();
        assert!(matches!(
            txn.open_table(LOG),
            Err(redb::TableError::TableDoesNotExist(_))
        ));
    }

    /// A directory of format 10 (the snapshot one value in its database,
    /// which grew the file to nine times the snapshot) is read as it is,
    /// and its snapshot cut into chunks when opened for writing; and so is
    /// one whose snapshot was cut but whose marker was not yet raised (a
    /// crash in between).
    #[test]
    fn a_format_10_directory_has_its_snapshot_cut_into_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let table = deadbolt_core::LockTable::default();
        let seeded = super::super::seed_data_dir(&data, 1, "127.0.0.1:7070", &table).unwrap();
        let sealed = sealed_snapshot(&data);
        // Back to format 10's layout.
        {
            let snapshots = Database::create(data.join(SNAPSHOTS_FILE)).unwrap();
            let txn = snapshots.begin_write().unwrap();
            assert!(txn.delete_table(snapshot_chunks::CHUNKS).unwrap());
            txn.commit().unwrap();
        }
        set_meta(&data, SNAPSHOTS_FILE, SNAPSHOT_KEY, &sealed);
        set_meta(&data, DB_FILE, FORMAT_KEY, FORMAT_SNAPSHOT_IN_ONE_VALUE);
        assert_eq!(check_data_dir(&data).unwrap(), seeded);

        for _ in 0..2 {
            drop(open(&data).unwrap());
            assert_eq!(format(&data), FORMAT);
            let snapshots = Database::create(data.join(SNAPSHOTS_FILE)).unwrap();
            let txn = snapshots.begin_read().unwrap();
            let meta = txn.open_table(META).unwrap();
            assert!(meta.get(SNAPSHOT_KEY).unwrap().is_none());
            assert_eq!(
                txn.open_table(snapshot_chunks::CHUNKS)
                    .unwrap()
                    .len()
                    .unwrap(),
                1
            );
            drop((meta, txn, snapshots));
            assert_eq!(sealed_snapshot(&data), sealed);
            assert_eq!(check_data_dir(&data).unwrap(), seeded);
            // Cut, but the marker still says format 10.
            set_meta(&data, DB_FILE, FORMAT_KEY, FORMAT_SNAPSHOT_IN_ONE_VALUE);
            assert_eq!(check_data_dir(&data).unwrap(), seeded);
        }
    }
}
