//! `deadbolt-nemesis`: Jepsen-style fault injection against a real Deadbolt
//! cluster, and a checker over what the clients saw.
//!
//! `run` starts everything and injects faults; `worker` and `resource` are
//! the client and resource processes it starts (hidden subcommands of this
//! same binary). See docs/safety.md; `run --backend` runs the same against
//! Redis, Redlock, etcd or PostgreSQL (docs/backends.md), and
//! `run --upgrade-from` a rolling upgrade from the previous release
//! (docs/upgrading.md).

mod backend_run;
mod full_disk;
mod harness;
mod resource;
mod run;
mod servers;
mod upgrade;
mod worker;

use clap::{Parser, Subcommand};
use deadbolt_checker::{availability, checker, history, linearizable, tally, watched};

#[derive(Parser)]
#[command(
    name = "deadbolt-nemesis",
    version,
    about = "Fault injection against a real Deadbolt cluster, with a history checker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a cluster under random faults and check the history.
    Run(harness::RunArgs),
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
    #[command(hide = true)]
    Resource(resource::ResourceArgs),
}

fn main() {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("cannot start the tokio runtime");
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) if args.backend.backend.is_some() => backend_run::main(args).await,
            Command::Run(args) => run::main(args).await,
            Command::Worker(args) => worker::main(args).await.map(|()| true),
            Command::Resource(args) => resource::main(args).await.map(|()| true),
        }
    });
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(true) => std::process::exit(0),
        Ok(false) => std::process::exit(1),
        Err(err) => {
            eprintln!("deadbolt-nemesis: {err:#}");
            std::process::exit(2)
        }
    }
}
