//! `deadbolt bench --backend URL`: the `uncontended` and `contended` loops
//! of `bench.rs`, same measurement and report, over another lock system
//! (`deadbolt-backends`), so that figures for Deadbolt, Redis, Redlock,
//! etcd and PostgreSQL come from one tool in one run on one machine.
//!
//! Each client has its own session (its own connection or lease), as in
//! lockbench. Waits follow each backend's own way: Redis, Redlock and
//! PostgreSQL poll with backoff and full jitter, etcd waits on the server.

use crate::bench::measure::{measure, BenchArgs, Round, Workload};
use crate::exit;
use deadbolt_backends::{Error, Locker};
use std::sync::Arc;
use std::time::Instant;

pub async fn main(url: &str, args: &BenchArgs) -> i32 {
    if args.fill > 0 {
        eprintln!(
            "deadbolt bench: --fill measures the Deadbolt server's table; not with --backend"
        );
        return exit::USAGE;
    }
    if args.watchers > 0 {
        eprintln!("deadbolt bench: --watchers watches the Deadbolt server; not with --backend");
        return exit::USAGE;
    }
    let contended = match args.workload {
        Workload::Uncontended => false,
        Workload::Contended => true,
        Workload::Expiry
        | Workload::Failover
        | Workload::Overload
        | Workload::Rwlock
        | Workload::Semaphore
        | Workload::Election => {
            eprintln!(
                "deadbolt bench: --backend runs `uncontended` and `contended`; the other \
                 workloads measure the Deadbolt server"
            );
            return exit::USAGE;
        }
    };
    match loops(url, args, contended).await {
        Ok(()) => exit::OK,
        Err(err) => exit::report_backend(&err),
    }
}

async fn loops(url: &str, args: &BenchArgs, contended: bool) -> Result<(), Error> {
    let locker = Locker::connect(url).await?;
    let mut rounds = Vec::new();
    for _ in 0..args.clients {
        let session = Arc::new(locker.open_session(args.ttl).await?);
        rounds.push(move |name: String| {
            let session = session.clone();
            async move {
                let started = Instant::now();
                let guard = session.lock(&name).await?;
                let waited = started.elapsed();
                let token = guard.token().fencing();
                guard.release().await?;
                Ok::<_, Error>(Round { waited, token })
            }
        });
    }
    let over = format!(
        "{} sessions ({})",
        args.clients,
        locker.backend().label().name
    );
    measure(args, contended, rounds, &over, None).await
}
