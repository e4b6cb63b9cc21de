//! `deadbolt data check`: the checks a server runs on its data directory
//! before it starts, run offline and reported, like `etcdutl check` or
//! `bbolt check`.
//!
//! It opens nothing for writing (the database is read through an in-memory
//! overlay), so it is safe on a directory that a server refused, and on a
//! copy an operator is unsure of. A running server holds its directory
//! locked; check a stopped node, or a copy.

use crate::exit;
use deadbolt_server::{check_data_dir, DataReport};
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum DataCommand {
    /// Verify a stopped node's data directory: every record against its
    /// checksum, the log against the witness, the snapshot's invariants.
    /// Exit 0 if a server would start on it, 1 if it would refuse.
    Check(CheckArgs),
}

#[derive(clap::Args)]
pub struct CheckArgs {
    /// The data directory, as given to `deadbolt server --data-dir`.
    #[arg(long, default_value = "./deadbolt-data", env = "DEADBOLT_DATA_DIR")]
    data_dir: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn main(command: DataCommand) -> i32 {
    let DataCommand::Check(args) = command;
    match check_data_dir(&args.data_dir) {
        Ok(report) => {
            if args.json {
                let json = serde_json::json!({ "intact": true, "report": report });
                println!("{json}");
            } else {
                print_report(&args.data_dir, &report);
            }
            exit::OK
        }
        Err(err) => {
            if args.json {
                let json = serde_json::json!({ "intact": false, "error": err.to_string() });
                println!("{json}");
            }
            eprintln!("deadbolt data check: {err}");
            exit::FAILURE
        }
    }
}

fn print_report(dir: &std::path::Path, report: &DataReport) {
    let index = |index: Option<u64>| index.map_or("-".to_owned(), |i| i.to_string());
    println!("{}: intact, and not behind its witness", dir.display());
    println!(
        "  node        {} (instance {})",
        report.node_id, report.instance
    );
    println!("  vote        {}", report.vote.as_deref().unwrap_or("-"));
    println!(
        "  raft log    {}..{} (compacted up to {}, snapshot at {})",
        index(report.log_first),
        index(report.log_last),
        index(report.purged),
        index(report.snapshot_last)
    );
    println!("  members     {:?}", report.members);
    println!("  next token  {}", report.next_token);
    println!("  features    cluster version {}", report.cluster_version);
    println!(
        "  state       {} sessions, {} locks, {} store keys",
        report.sessions, report.locks, report.store_keys
    );
    if report.cluster_version >= deadbolt_server::FeatureLevel::SEMAPHORES.0 {
        println!(
            "              {} semaphores, {} read/write locks, {} elections",
            report.semaphores, report.rw_locks, report.elections
        );
    }
}
