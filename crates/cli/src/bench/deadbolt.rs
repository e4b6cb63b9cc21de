//! `deadbolt bench`'s loop workloads on the Deadbolt server: one session
//! per client, spread over `--connections`, each round a lock, a
//! read/write lock or a semaphore permit taken and let go; with what only
//! a Deadbolt server has around them: a table filled first (`--fill`,
//! `--fill-sessions`), watchers counting events (`--watchers`), and the
//! server's CPU per operation.

use super::measure::{BenchArgs, CallsOver, LoopSystem, Round, ServerCpu, Workload};
use crate::exit;
use crate::Endpoints;
use deadbolt_client::{Error, LockGuard, Session};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Locks the fill takes per session: 990,000 locks in 82,500 sessions.
const FILL_LOCKS_PER_SESSION: u64 = 12;
/// The fill's sessions are renewed every TTL/3: long, to keep keepalives
/// from being the load.
const FILL_TTL: Duration = Duration::from_secs(600);
/// Fill requests in flight at once.
const FILL_CONCURRENCY: usize = 256;

/// The TTL of `--fill-sessions`' sessions: long enough to measure, restart
/// and measure again without keepalives.
const FILL_SESSIONS_TTL: Duration = Duration::from_secs(3600);

/// Opens `count` idle sessions and leaves them (see
/// [`BenchArgs::fill_sessions`]).
async fn fill_sessions(endpoints: &Endpoints, count: u64) -> Result<(), Error> {
    use futures::{StreamExt, TryStreamExt};
    if count == 0 {
        return Ok(());
    }
    let mut clients = Vec::new();
    for _ in 0..16.min(count) {
        clients.push(endpoints.connect().await?);
    }
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let client = &clients[i as usize % clients.len()];
            async move {
                client.open_session_raw(FILL_SESSIONS_TTL).await?;
                if (i + 1) % 100_000 == 0 {
                    eprintln!("[fill] {} sessions open", i + 1);
                }
                Ok::<_, Error>(())
            }
        })
        .buffer_unordered(FILL_CONCURRENCY)
        .try_collect::<()>()
        .await?;
    eprintln!(
        "[fill] {count} idle sessions opened in {:.1}s (left open: they expire in {}s)",
        started.elapsed().as_secs_f64(),
        FILL_SESSIONS_TTL.as_secs()
    );
    Ok(())
}

/// What `--fill` holds: its sessions, and the guards of their locks (kept
/// until the sessions are closed, which releases them all at once).
struct Fill {
    sessions: Vec<Session>,
    guards: Vec<LockGuard>,
}

/// Takes `count` locks and holds them (see [`BenchArgs::fill`]).
async fn fill(endpoints: &Endpoints, count: u64) -> Result<Fill, Error> {
    use futures::{StreamExt, TryStreamExt};
    let mut clients = Vec::new();
    for _ in 0..16.min(count) {
        clients.push(endpoints.connect().await?);
    }
    let started = Instant::now();
    let sessions: Vec<Session> = futures::stream::iter(0..count.div_ceil(FILL_LOCKS_PER_SESSION))
        .map(|i| clients[i as usize % clients.len()].open_session(FILL_TTL))
        .buffer_unordered(FILL_CONCURRENCY)
        .try_collect()
        .await?;
    let locks = (0..count).map(|i| (i, &sessions[(i / FILL_LOCKS_PER_SESSION) as usize]));
    let guards: Vec<LockGuard> = futures::stream::iter(locks)
        .map(|(i, session)| async move {
            let guard = session.lock(&format!("bench:fill:{i:07}")).await?;
            if (i + 1) % 100_000 == 0 {
                eprintln!("[fill] {} locks held", i + 1);
            }
            Ok::<_, Error>(guard)
        })
        .buffer_unordered(FILL_CONCURRENCY)
        .try_collect()
        .await?;
    eprintln!(
        "[fill] {count} locks held in {} sessions, in {:.1}s",
        sessions.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(Fill { sessions, guards })
}

impl Fill {
    async fn release(self) -> Result<(), Error> {
        use futures::{StreamExt, TryStreamExt};
        futures::stream::iter(&self.sessions)
            .map(Session::close)
            .buffer_unordered(FILL_CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
        // Closed sessions released their locks: dropping sends nothing.
        drop(self.guards);
        Ok(())
    }
}

/// Watches of every `bench:` name while a workload runs, counting the
/// events they receive (see [`BenchArgs::watchers`]).
struct Watchers {
    count: u32,
    events: Arc<AtomicU64>,
    started: Instant,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Watches per connection of their own.
const WATCHES_PER_CONNECTION: u32 = 100;

impl Watchers {
    /// Opens `count` watches, and waits until every one is in place.
    async fn start(endpoints: &Endpoints, count: u32) -> Result<Watchers, Error> {
        let events = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        let mut client = None;
        for i in 0..count {
            if i % WATCHES_PER_CONNECTION == 0 {
                client = Some(endpoints.connect().await?);
            }
            let client = client.as_ref().expect("connected above");
            let options = deadbolt_client::WatchOptions {
                prefix: true,
                after: None,
            };
            let mut watch = client.watch("bench:", options);
            watch.started().await?;
            let events = events.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(Ok(_)) = watch.next().await {
                    events.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        if count > 0 {
            eprintln!("[watch] {count} watches of bench:* in place");
        }
        Ok(Watchers {
            count,
            events,
            started: Instant::now(),
            tasks,
        })
    }

    /// Prints the events delivered, from the warm-up to the end.
    fn report(self) {
        if self.count == 0 {
            return;
        }
        let events = self.events.load(Ordering::Relaxed);
        let elapsed = self.started.elapsed().as_secs_f64();
        println!(
            "  watches: {} watchers received {events} events in {elapsed:.1}s (warm-up \
             included): {:.0} events/s delivered, {:.0} per watcher",
            self.count,
            events as f64 / elapsed,
            events as f64 / elapsed / f64::from(self.count),
        );
        for task in self.tasks {
            task.abort();
        }
    }
}

/// The loop workloads' clients on a Deadbolt server, and what the run set
/// up around them.
pub(crate) struct Deadbolt {
    sessions: Vec<Session>,
    workload: Workload,
    permits: u32,
    connections: u32,
    cpu: ServerCpu,
    filled: Fill,
    watchers: Watchers,
}

impl Deadbolt {
    /// Fills the table as asked, opens every client's session and starts
    /// the watchers; or, having said why not, the exit code to end with.
    pub(crate) async fn open(endpoints: &Endpoints, args: &BenchArgs) -> Result<Deadbolt, i32> {
        Self::try_open(endpoints, args)
            .await
            .map_err(|err| exit::report(&err))
    }

    async fn try_open(endpoints: &Endpoints, args: &BenchArgs) -> Result<Deadbolt, Error> {
        fill_sessions(endpoints, args.fill_sessions).await?;
        let filled = fill(endpoints, args.fill).await?;
        let connections = args.connections.unwrap_or(args.clients).min(args.clients);
        let mut clients = Vec::new();
        for _ in 0..connections {
            let client = endpoints.connect().await?;
            if args.calls == CallsOver::Grpc {
                client.prefer_grpc_calls();
            }
            clients.push(client);
        }
        let mut sessions = Vec::new();
        for client in clients.iter().cycle().take(args.clients as usize) {
            sessions.push(client.open_session(args.ttl).await?);
        }
        let watchers = Watchers::start(endpoints, args.watchers).await?;
        Ok(Deadbolt {
            sessions,
            workload: args.workload,
            permits: args.permits,
            connections,
            cpu: ServerCpu(clients.swap_remove(0)),
            filled,
            watchers,
        })
    }
}

impl LoopSystem for Deadbolt {
    type Error = Error;

    fn clients(&self) -> usize {
        self.sessions.len()
    }

    /// One in ten `rwlock` clients writes.
    async fn round(&self, client: usize, name: String) -> Result<Round, Error> {
        let session = &self.sessions[client];
        let started = Instant::now();
        let guard = match self.workload {
            Workload::Rwlock if client.is_multiple_of(10) => session.write_lock(&name).await?,
            Workload::Rwlock => session.read_lock(&name).await?,
            Workload::Semaphore => session.acquire_permits(&name, self.permits, 1).await?,
            _ => session.lock(&name).await?,
        };
        let waited = started.elapsed();
        let token = Some(guard.token());
        guard.release().await?;
        Ok(Round { waited, token })
    }

    fn over(&self) -> String {
        let connections = self.connections;
        format!(
            "{connections} connection{}",
            if connections == 1 { "" } else { "s" }
        )
    }

    fn server_cpu(&self) -> Option<&ServerCpu> {
        Some(&self.cpu)
    }

    async fn close(self) -> Result<(), Error> {
        self.watchers.report();
        for session in self.sessions {
            session.close().await?;
        }
        self.filled.release().await
    }

    fn report(err: &Error) -> i32 {
        exit::report(err)
    }
}
