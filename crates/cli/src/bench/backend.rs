//! `deadbolt bench --backend URL`: the `uncontended` and `contended` loops
//! over another lock system (`deadbolt-backends`), measured and reported as
//! the Deadbolt server's are, so that figures for Deadbolt, Redis, Redlock,
//! etcd and PostgreSQL come from one tool in one run on one machine.
//!
//! Each client has its own session (its own connection or lease), as in
//! lockbench. Waits follow each backend's own way: Redis, Redlock and
//! PostgreSQL poll with backoff and full jitter, etcd waits on the server.

use super::measure::{BenchArgs, LoopSystem, Round, ServerCpu, Workload};
use crate::exit;
use deadbolt_backends::{Error, Locker, Session};
use std::time::Instant;

/// Why `--backend` with another workload is a usage error.
pub(crate) const ONLY_LOOPS: &str =
    "--backend runs `uncontended` and `contended`; the other workloads measure the Deadbolt server";

/// The loop workloads' clients on another lock system.
pub(crate) struct Backends {
    sessions: Vec<Session>,
    /// The backend's name, for the report.
    name: &'static str,
}

impl Backends {
    /// Connects to the system `url` names and opens every client's session;
    /// or, having said why not (a workload or option only the Deadbolt
    /// server has, or the system's error), the exit code to end with.
    pub(crate) async fn open(url: &str, args: &BenchArgs) -> Result<Backends, i32> {
        if args.fill > 0 || args.fill_sessions > 0 {
            eprintln!(
                "deadbolt bench: --fill and --fill-sessions fill the Deadbolt server's table; \
                 not with --backend"
            );
            return Err(exit::USAGE);
        }
        if args.watchers > 0 {
            eprintln!("deadbolt bench: --watchers watches the Deadbolt server; not with --backend");
            return Err(exit::USAGE);
        }
        if !matches!(args.workload, Workload::Uncontended | Workload::Contended) {
            eprintln!("deadbolt bench: {ONLY_LOOPS}");
            return Err(exit::USAGE);
        }
        Self::connect(url, args)
            .await
            .map_err(|err| exit::report_backend(&err))
    }

    async fn connect(url: &str, args: &BenchArgs) -> Result<Backends, Error> {
        let locker = Locker::connect(url).await?;
        let mut sessions = Vec::new();
        for _ in 0..args.clients {
            sessions.push(locker.open_session(args.ttl).await?);
        }
        Ok(Backends {
            sessions,
            name: locker.backend().label().name,
        })
    }
}

impl LoopSystem for Backends {
    type Error = Error;

    fn clients(&self) -> usize {
        self.sessions.len()
    }

    async fn round(&self, client: usize, name: String) -> Result<Round, Error> {
        let started = Instant::now();
        let guard = self.sessions[client].lock(&name).await?;
        let waited = started.elapsed();
        let token = guard.token().fencing();
        guard.release().await?;
        Ok(Round { waited, token })
    }

    fn over(&self) -> String {
        format!("{} sessions ({})", self.sessions.len(), self.name)
    }

    /// Another system's CPU is not this tool's to read.
    fn server_cpu(&self) -> Option<&ServerCpu> {
        None
    }

    async fn close(self) -> Result<(), Error> {
        for session in self.sessions {
            session.close().await?;
        }
        Ok(())
    }

    fn report(err: &Error) -> i32 {
        exit::report_backend(err)
    }
}
