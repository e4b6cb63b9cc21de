//! `deadbolt run --backend URL`: the same cron wrapper over a lock system a
//! team already runs (Redis, Redlock, etcd, PostgreSQL; `deadbolt-backends`).
//!
//! Only the lock changes: the command runs under the same guard process and
//! is stopped (SIGTERM, then SIGKILL) before the lease the client knows of
//! can end, with the same margins and exit codes as with the Deadbolt server
//! (`command.rs`). How much that protects depends on the backend (`deadbolt
//! backends`): a Redis restart without persistence hands the lock to someone
//! else with no lease ending on our side at all. The command learns the
//! token in `$DEADBOLT_TOKEN` only when it is a fencing token.
//!
//! `deadbolt elect --backend etcd://…` campaigns in etcd's own elections
//! the same way, and `deadbolt leader --backend` asks who leads them.

use super::command::{Holding, LockSystem, RunArgs};
use crate::exit;
use deadbolt_backends::{Backend, Guard, Locker, Lost, Mode, Session, Token};
use std::future::Future;
use std::time::{Duration, Instant};

impl Holding for Guard {
    fn at_risk(&self, margin: Duration) -> impl Future<Output = (String, bool)> + Send + 'static {
        let lost = self.lost(margin);
        async move {
            let reason = lost.await;
            let ours = matches!(reason, Lost::Expired);
            (reason.to_string(), ours)
        }
    }

    fn lease_deadline(&self) -> Instant {
        Guard::lease_deadline(self)
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("DEADBOLT_LOCK", self.name().to_owned())];
        match self.token() {
            Token::Fencing(token) => env.push(("DEADBOLT_TOKEN", token.to_string())),
            // Not a fencing token: under a name of its own, so that nothing
            // written for $DEADBOLT_TOKEN trusts it by mistake.
            Token::Counter(counter) => env.push(("DEADBOLT_UNSAFE_COUNTER", counter.to_string())),
            Token::None => {}
        }
        env
    }
}

/// A session in the lock system at a `--backend` URL.
pub struct Backends {
    session: Session,
}

impl Backends {
    /// Refuses what the system cannot do (a primitive it lacks, a
    /// lock-delay), then connects and opens the session; or, having said why
    /// not, the exit code.
    pub async fn open(url: &str, args: &RunArgs) -> Result<Backends, i32> {
        let target = &args.target;
        let backend = match deadbolt_backends::Target::parse(url) {
            Ok(parsed) => parsed.backend(),
            Err(err) => return Err(exit::report_backend(&err)),
        };
        // PostgreSQL's shared advisory locks are its own read/write locks, and
        // etcd's v3election service its own elections.
        let primitive = match () {
            () if target.semaphore.is_some() => Some("--semaphore"),
            () if target.rw_mode().is_some() && backend != Backend::Postgres => {
                Some("--shared and --exclusive")
            }
            () if target.election.is_some() && backend != Backend::Etcd => Some("--election"),
            () => None,
        };
        if let Some(asked) = primitive {
            let label = backend.label();
            eprintln!(
            "deadbolt run: {asked} is not supported with --backend {}; the Deadbolt server has \
             it (run without --backend). {}: {}",
            label.name, label.name, label.primitives
        );
            return Err(exit::USAGE);
        }
        if !args.target.lock_delay.is_zero() {
            eprintln!(
                "deadbolt run: --lock-delay is the Deadbolt server's; the lock at {} cannot \
             delay a handover",
                deadbolt_backends::redact(url)
            );
            return Err(exit::FAILURE);
        }
        let opened = match Locker::connect(url).await {
            Ok(locker) => locker.open_session(target.ttl).await,
            Err(err) => Err(err),
        };
        let session = opened.map_err(|err| exit::report_backend(&err))?;
        Ok(Backends { session })
    }
}

impl LockSystem for Backends {
    type Held = Guard;

    async fn take(&self, args: &RunArgs) -> Result<Guard, i32> {
        take_lock(&self.session, args).await
    }

    async fn release(&self, held: Guard) {
        let lock = held.name().to_owned();
        if let Err(err) = held.release().await {
            eprintln!("deadbolt run: releasing lock {lock:?}: {err}");
        }
    }

    async fn close(self) {
        if let Err(err) = self.session.close().await {
            tracing::debug!(%err, "closing the session failed; its lease will end by itself");
        }
    }
}

async fn take_lock(session: &Session, args: &RunArgs) -> Result<Guard, i32> {
    let target = &args.target;
    if let Some(election) = &target.election {
        // Without waiting: a campaign that gives up at once.
        let wait = if target.no_wait {
            Some(Duration::ZERO)
        } else {
            target.wait
        };
        return session
            .campaign(election, &target.value, wait)
            .await
            .map_err(|err| exit::report_backend(&err));
    }
    let lock = &target.lock;
    // --exclusive is a plain (exclusive) lock: it waits for the shared ones.
    let mode = match args.target.rw_mode() {
        Some(deadbolt_client::RwMode::Shared) => Mode::Shared,
        _ => Mode::Exclusive,
    };
    let taken = if args.target.no_wait {
        match session.try_lock_in(lock, mode).await {
            Ok(Some(guard)) => Ok(guard),
            Ok(None) => {
                eprintln!("deadbolt run: lock {lock:?} is busy");
                return Err(exit::BUSY);
            }
            Err(err) => Err(err),
        }
    } else {
        session.lock_in(lock, mode, args.target.wait).await
    };
    taken.map_err(|err| exit::report_backend(&err))
}

/// `deadbolt leader NAME --backend URL`: who leads the election in that
/// lock system (etcd's `Leader`).
pub async fn leader(url: &str, election: &str, json: bool) -> i32 {
    let asked = match Locker::connect(url).await {
        Ok(locker) => locker.leader(election).await,
        Err(err) => Err(err),
    };
    let leader = match asked {
        Ok(leader) => leader,
        Err(err) => return exit::report_backend(&err),
    };
    if json {
        let state = leader.map(
            |leader| serde_json::json!({ "value": leader.value, "term": leader.token.fencing() }),
        );
        println!(
            "{}",
            serde_json::json!({ "election": election, "leader": state })
        );
    } else {
        match leader {
            Some(leader) => println!(
                "{election}: led in term {}, value {:?}",
                leader.token, leader.value
            ),
            None => println!("{election}: no leader (nobody campaigns)"),
        }
    }
    exit::OK
}
