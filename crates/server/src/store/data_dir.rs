//! Opening the data directory, and refusing one that is not ours.
//!
//! A wrong `--data-dir` must fail loudly at start, never be "repaired" into
//! an empty lock service that re-issues token 1.

use super::{FORMAT, FORMAT_KEY, LOG, META};
use redb::{Database, ReadableTable, ReadableTableMetadata};
use std::path::{Path, PathBuf};

/// The database file inside a data directory.
const DB_FILE: &str = "deadbolt.redb";

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
    #[error("{path} is already in use by another Deadbolt process")]
    InUse { path: PathBuf },
    #[error(
        "the data in {path} is unreadable ({reason}); it may be corrupt or from another program. \
         Refusing to start rather than lose locks and tokens"
    )]
    Unreadable { path: PathBuf, reason: String },
    #[error("{path} holds data of format {found:?}, this build reads {expected:?}")]
    WrongFormat {
        path: PathBuf,
        found: String,
        expected: String,
    },
}

/// Opens (creating if needed) the database in `dir`.
pub fn open_data_dir(dir: &Path) -> Result<Database, DataDirError> {
    std::fs::create_dir_all(dir).map_err(|source| DataDirError::Create {
        path: dir.to_owned(),
        source,
    })?;
    let db_path = dir.join(DB_FILE);
    if !db_path.exists() {
        let found = std::fs::read_dir(dir)
            .map_err(|source| DataDirError::Create {
                path: dir.to_owned(),
                source,
            })?
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            // A fresh file system's mount point is a fine place for data.
            .find(|name| name != "lost+found");
        if let Some(found) = found {
            return Err(DataDirError::Foreign {
                path: dir.to_owned(),
                found,
            });
        }
    }
    let unreadable = |reason: String| DataDirError::Unreadable {
        path: db_path.clone(),
        reason,
    };
    let db = Database::create(&db_path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => DataDirError::InUse {
            path: dir.to_owned(),
        },
        other => unreadable(other.to_string()),
    })?;
    prepare(db, db_path)
}

/// Opens the database on a simulated disk (the deterministic simulation's
/// memory that survives a simulated crash), with the same checks as a
/// data directory.
pub fn open_simulated_disk(disk: impl redb::StorageBackend) -> Result<Database, DataDirError> {
    let path = PathBuf::from("<simulated disk>");
    let db =
        Database::builder()
            .create_with_backend(disk)
            .map_err(|e| DataDirError::Unreadable {
                path: path.clone(),
                reason: e.to_string(),
            })?;
    prepare(db, path)
}

/// Checks the format marker (writing it into a new database) and creates the
/// tables.
fn prepare(db: Database, db_path: PathBuf) -> Result<Database, DataDirError> {
    let unreadable = |reason: String| DataDirError::Unreadable {
        path: db_path.clone(),
        reason,
    };
    let txn = db.begin_write().map_err(|e| unreadable(e.to_string()))?;
    {
        let mut meta = txn
            .open_table(META)
            .map_err(|e| unreadable(e.to_string()))?;
        let found = meta
            .get(FORMAT_KEY)
            .map_err(|e| unreadable(e.to_string()))?
            .map(|v| v.value().to_vec());
        match found {
            Some(found) if found == FORMAT => {}
            Some(found) => {
                return Err(DataDirError::WrongFormat {
                    path: db_path,
                    found: String::from_utf8_lossy(&found).into_owned(),
                    expected: String::from_utf8_lossy(FORMAT).into_owned(),
                })
            }
            None if meta.len().map_err(|e| unreadable(e.to_string()))? == 0 => {
                meta.insert(FORMAT_KEY, FORMAT)
                    .map_err(|e| unreadable(e.to_string()))?;
            }
            None => return Err(unreadable("no format marker".into())),
        }
    }
    // Create the log table up front, so that readers never find it missing.
    txn.open_table(LOG).map_err(|e| unreadable(e.to_string()))?;
    txn.commit().map_err(|e| unreadable(e.to_string()))?;
    Ok(db)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_directory_is_created_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        drop(open_data_dir(&data).unwrap());
        drop(open_data_dir(&data).unwrap());
    }

    #[test]
    fn foreign_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("postgresql.conf"), "x").unwrap();
        let err = open_data_dir(dir.path()).unwrap_err();
        assert!(matches!(err, DataDirError::Foreign { .. }), "{err}");
    }

    #[test]
    fn corrupt_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(DB_FILE), vec![0x5a; 64 * 1024]).unwrap();
        let err = open_data_dir(dir.path()).unwrap_err();
        assert!(matches!(err, DataDirError::Unreadable { .. }), "{err}");
    }

    #[test]
    fn second_open_is_refused_while_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let _first = open_data_dir(dir.path()).unwrap();
        let err = open_data_dir(dir.path()).unwrap_err();
        assert!(matches!(err, DataDirError::InUse { .. }), "{err}");
    }
}
