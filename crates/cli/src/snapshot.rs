//! `deadbolt snapshot save|inspect|restore`: backups of a running cluster
//! (like `etcdctl snapshot save` and `etcdutl snapshot restore`), the file
//! format and the token floor a restore stamps are the server's
//! (`crates/server/src/backup.rs`).
//!
//! `save` never leaves a half file under FILE: it checks the bytes it got
//! (version, checksum, table) before writing them to a temporary file beside
//! FILE, fsyncs it, renames it over FILE and fsyncs the directory.
//! `restore` is offline, like `data check`: it writes a new data directory
//! for a node that is not running yet.

use crate::{exit, parse_duration, Endpoints};
use deadbolt_server::{Backup, BackupSummary, MAX_BACKUP_BYTES};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum SnapshotCommand {
    /// Save a consistent snapshot of the cluster's state (from the leader,
    /// with every write acknowledged before the call) to FILE.
    Save {
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check a snapshot file and show what it holds.
    Inspect {
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write a new data directory from a snapshot file, for a new single-node
    /// cluster (grow it with `deadbolt cluster add`). Stop the old cluster
    /// first: tokens start above the later of this host's clock and the
    /// save's time, plus --token-margin.
    Restore {
        file: PathBuf,
        /// The new node's data directory: must not exist or be empty.
        #[arg(long)]
        data_dir: PathBuf,
        /// The new node's id (start it with the same --node-id).
        #[arg(long, default_value_t = 1)]
        node_id: u64,
        /// The HOST:PORT the new node will serve on (start it with the same
        /// --listen): its address in the cluster's membership.
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: String,
        /// How far past the clock the restored tokens start: covers clock
        /// differences between the old cluster's hosts and this one.
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        token_margin: Duration,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// `inspect` and `restore`: offline, before any runtime starts.
pub fn offline(command: &SnapshotCommand) -> Option<i32> {
    let code = match command {
        SnapshotCommand::Save { .. } => return None,
        SnapshotCommand::Inspect { file, json } => {
            read(file).map(|backup| show(file, &backup.summary(), *json))
        }
        SnapshotCommand::Restore {
            file,
            data_dir,
            node_id,
            listen,
            token_margin,
            json,
        } => read(file).and_then(|backup| {
            let summary = backup.summary();
            let report = backup
                .restore(data_dir, *node_id, listen, *token_margin)
                .map_err(|err| format!("{err:#}"))?;
            if *json {
                let json = serde_json::json!({ "snapshot": summary, "data": report });
                println!("{json}");
            } else {
                println!(
                    "restored {} into {}: {} sessions, {} locks, {} store keys; tokens start at {}",
                    file.display(),
                    data_dir.display(),
                    report.sessions,
                    report.locks,
                    report.store_keys,
                    report.next_token
                );
                println!(
                    "start it with: deadbolt server --node-id {node_id} --listen {listen} --data-dir {}",
                    data_dir.display()
                );
            }
            Ok(exit::OK)
        }),
    };
    Some(code.unwrap_or_else(|err| {
        eprintln!("deadbolt snapshot: {err}");
        exit::FAILURE
    }))
}

/// `save`: fetch, check, write atomically.
pub async fn save(endpoints: &Endpoints, command: SnapshotCommand) -> i32 {
    let SnapshotCommand::Save { file, json } = command else {
        unreachable!("inspect and restore run offline");
    };
    let client = match crate::locks::connect(endpoints).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let bytes = match client.snapshot(MAX_BACKUP_BYTES).await {
        Ok(bytes) => bytes,
        Err(err) => return exit::report(&err),
    };
    let written = Backup::decode(&bytes)
        .map_err(|err| format!("the server sent a snapshot that does not check: {err}"))
        .and_then(|backup| {
            write_atomically(&file, &bytes)
                .map_err(|err| format!("cannot write {}: {err}", file.display()))?;
            Ok(backup.summary())
        });
    match written {
        Ok(summary) => show(&file, &summary, json),
        Err(err) => {
            eprintln!("deadbolt snapshot save: {err}");
            exit::FAILURE
        }
    }
}

fn read(file: &Path) -> Result<Backup, String> {
    let opened = std::fs::File::open(file).map_err(|err| format!("{}: {err}", file.display()))?;
    let mut bytes = Vec::new();
    opened
        .take(MAX_BACKUP_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| format!("{}: {err}", file.display()))?;
    if bytes.len() as u64 > MAX_BACKUP_BYTES {
        return Err(format!(
            "{} is larger than {MAX_BACKUP_BYTES} bytes, more than any Deadbolt snapshot",
            file.display()
        ));
    }
    Backup::decode(&bytes).map_err(|err| format!("{}: {err}", file.display()))
}

/// Writes `bytes` to a temporary file beside `file`, fsyncs it, renames it
/// to `file` and fsyncs the directory: `file` is whole or untouched.
fn write_atomically(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = file.file_name().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "FILE names no file")
    })?;
    let temporary = dir.join(format!(
        ".{}.{}.partial",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| {
        let mut out = std::fs::File::create(&temporary)?;
        out.write_all(bytes)?;
        out.sync_all()?;
        std::fs::rename(&temporary, file)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

fn show(file: &Path, summary: &BackupSummary, json: bool) -> i32 {
    if json {
        println!("{}", serde_json::json!(summary));
        return exit::OK;
    }
    let saved = std::time::UNIX_EPOCH + Duration::from_millis(summary.saved_at_ms);
    println!(
        "{}: Deadbolt snapshot version {}, {} bytes, checksum ok",
        file.display(),
        summary.version,
        summary.file_bytes
    );
    println!(
        "  saved          {} by node {} at log index {} (term {})",
        humantime::format_rfc3339_millis(saved),
        summary.node_id,
        summary.index,
        summary.term
    );
    println!(
        "  state          {} sessions, {} locks ({} waiters), {} audit records, {} store keys",
        summary.sessions, summary.locks, summary.waiters, summary.audit_records, summary.store_keys
    );
    println!("  highest token  {}", summary.highest_token);
    println!("  next token     {}", summary.next_token);
    exit::OK
}
