//! `deadbolt server`: starts a node and runs it until SIGTERM or ctrl-c.

use crate::exit;
use deadbolt_server::{Server, ServerConfig};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ServerArgs {
    /// Address for both the gRPC and the HTTP API.
    #[arg(long, default_value = "127.0.0.1:7070", env = "DEADBOLT_LISTEN")]
    listen: SocketAddr,
    /// Where the Raft log and snapshots live. Created if missing; a
    /// directory of another program is refused.
    #[arg(long, default_value = "./deadbolt-data", env = "DEADBOLT_DATA_DIR")]
    data_dir: PathBuf,
    /// This node's id in the cluster.
    #[arg(long, default_value_t = 1)]
    node_id: u64,
    /// Snapshot the lock table and compact the Raft log every N entries.
    #[arg(long, default_value_t = ServerConfig::DEFAULT_SNAPSHOT_EVERY, value_parser = clap::value_parser!(u64).range(10..))]
    snapshot_every: u64,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long)]
    log_json: bool,
}

pub async fn main(args: ServerArgs) -> i32 {
    init_logging(args.log_json);
    let config = ServerConfig {
        node_id: args.node_id,
        listen: args.listen,
        data_dir: args.data_dir,
        snapshot_every: args.snapshot_every,
    };
    let server = match Server::start(config).await {
        Ok(server) => server,
        Err(err) => {
            eprintln!("deadbolt server: {err:#}");
            return exit::FAILURE;
        }
    };
    match server.serve(shutdown_signal()).await {
        Ok(()) => exit::OK,
        Err(err) => {
            eprintln!("deadbolt server: {err:#}");
            exit::FAILURE
        }
    }
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,openraft=warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Resolves on SIGTERM or ctrl-c (SIGINT).
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("cannot install the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
