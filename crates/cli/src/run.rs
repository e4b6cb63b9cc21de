//! `deadbolt run`: runs a command while holding a lock.
//!
//! The command must never run on after the server could have handed the lock
//! to someone else. The client's lease deadline is conservative (counted from
//! when the last acknowledged keepalive was *sent*); from it we keep a margin
//! for clock-rate drift between client and server, and before that margin we
//! give the command SIGTERM, then SIGKILL a grace period later. So the
//! command is dead before the server's own deadline can pass.
//!
//! This bounds the damage of a lost lease, it does not make the work
//! exclusive: a command paused (or a `deadbolt run` SIGSTOP'd) past its lease
//! can still act late. Resources that matter must check `$DEADBOLT_TOKEN`.

use crate::locks::LockArgs;
use crate::Endpoints;
use crate::{exit, parse_duration};
use deadbolt_client::{Client, ErrorKind, LeaseLost, LockGuard, RwMode, Session};
use std::future::Future;
use std::process::ExitStatus;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub(crate) target: LockArgs,
    /// Time between SIGTERM and SIGKILL when the lease is at risk, and
    /// between a SIGTERM, SIGINT or SIGHUP to `deadbolt run` (passed on to
    /// the command) and the SIGKILL of a command still running by then
    /// (default: a quarter of the TTL, at most 5s).
    #[arg(long, value_parser = parse_duration)]
    grace: Option<Duration>,
    /// Run the command only if KEY is not marked done in the fenced store,
    /// and mark it (fenced by this grant's token) when the command exits 0.
    /// E.g. `--once daily-report:2026-11-29`: one report per day, not one
    /// at a time. (Not with --shared: only an exclusive holder may mark.)
    #[arg(long, value_name = "KEY", conflicts_with = "shared")]
    once: Option<String>,
    /// Take the lock in another lock system instead of the Deadbolt server,
    /// named by URL: redis(s)://, redlock(s)://, etcd(s)://, postgres:// (what each
    /// guarantees: `deadbolt backends`).
    #[arg(long, value_name = "URL", conflicts_with = "once")]
    pub(crate) backend: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub(crate) command: Vec<String>,
}

/// Margin for clock-rate drift between this host and the server: the server
/// may measure the TTL as up to this much shorter than we do. 2% of the TTL
/// (far beyond real quartz drift, ~0.01%) and at least 50ms for scheduling.
fn drift_margin(ttl: Duration) -> Duration {
    (ttl / 50).max(Duration::from_millis(50))
}

fn default_grace(ttl: Duration) -> Duration {
    (ttl / 4).min(Duration::from_secs(5))
}

/// `deadbolt elect NAME -- CMD`: `run --election NAME -- CMD`.
#[derive(clap::Args)]
pub struct ElectArgs {
    /// The election.
    election: String,
    /// The value the leader tells everyone (`deadbolt leader` shows it),
    /// e.g. its address.
    #[arg(long, default_value = "")]
    value: String,
    /// Session lease: how long the leadership outlives this process if it
    /// dies.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
    /// Give up if not elected within this long (default: campaign as long
    /// as it takes).
    #[arg(long, value_parser = parse_duration)]
    wait: Option<Duration>,
    /// As `run --grace`.
    #[arg(long, value_parser = parse_duration)]
    grace: Option<Duration>,
    /// Campaign in another lock system's elections instead of the Deadbolt
    /// server's, named by URL: etcd(s):// (its v3election service; the
    /// others have none: `deadbolt backends`).
    #[arg(long, value_name = "URL")]
    backend: Option<String>,
    /// The command and its arguments: it runs only while this process
    /// leads, and is stopped before anyone else can be elected.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

impl From<ElectArgs> for RunArgs {
    fn from(elect: ElectArgs) -> Self {
        RunArgs {
            target: LockArgs {
                lock: String::new(),
                semaphore: None,
                permits: None,
                shared: false,
                exclusive: false,
                election: Some(elect.election),
                value: elect.value,
                ttl: elect.ttl,
                wait: elect.wait,
                no_wait: false,
                lock_delay: Duration::ZERO,
            },
            grace: elect.grace,
            once: None,
            backend: elect.backend,
            command: elect.command,
        }
    }
}

/// The grace `args` give the command and the margin for clock drift, or,
/// when they do not fit well within the lease, the exit code after saying
/// why.
pub(crate) fn grace_and_margin(args: &RunArgs) -> Result<(Duration, Duration), i32> {
    let margin = drift_margin(args.target.ttl);
    let grace = args.grace.unwrap_or_else(|| default_grace(args.target.ttl));
    if grace + margin >= args.target.ttl / 2 {
        eprintln!(
            "deadbolt run: --grace {} is too long for --ttl {}: the command must be stopped well \
             within the lease",
            humantime::format_duration(grace),
            humantime::format_duration(args.target.ttl)
        );
        return Err(exit::FAILURE);
    }
    Ok((grace, margin))
}

/// `deadbolt run` (and `elect`) against Deadbolt; `run_backend.rs` runs it
/// against the other lock systems.
pub async fn main(endpoints: &Endpoints, args: RunArgs) -> i32 {
    let (grace, margin) = match grace_and_margin(&args) {
        Ok(timing) => timing,
        Err(code) => return code,
    };
    let patience = if args.target.no_wait {
        None
    } else {
        args.target.wait
    };
    let client = match crate::locks::connect_within(endpoints, patience).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let session = match client.open_session(args.target.ttl).await {
        Ok(session) => session,
        Err(err) => return exit::report(&err),
    };
    session.set_lock_delay(args.target.lock_delay);
    let code = match take_lock(&session, &args).await {
        Ok(guard) => {
            let code = match &args.once {
                Some(key) => run_once(&client, &session, &guard, key, &args, grace, margin).await,
                None => run_holding(&(&session, &guard), &args, grace, margin).await,
            };
            // The lock may already be lost; releasing by token is safe either
            // way (a stale token is refused).
            release(guard).await;
            code
        }
        Err(code) => code,
    };
    if let Err(err) = session.close().await {
        tracing::debug!(%err, "closing the session failed; it will expire");
    }
    code
}

async fn take_lock(session: &Session, args: &RunArgs) -> Result<LockGuard, i32> {
    let target = &args.target;
    let taken = match (&target.semaphore, target.permits) {
        // No capacity (0): the semaphore's own, as it was defined.
        (Some(semaphore), capacity) => {
            take_permit(session, semaphore, capacity.unwrap_or(0), target).await
        }
        _ if target.rw_mode().is_some() => {
            let mode = target.rw_mode().expect("a read/write mode");
            take_rw_lock(session, &target.lock, mode, target).await
        }
        (None, _) if target.election.is_some() => {
            let election = target.election.as_deref().expect("an election");
            // Without waiting: a campaign that gives up at once.
            let wait = match target.no_wait {
                true => Some(Duration::ZERO),
                false => target.wait,
            };
            match wait {
                Some(wait) => {
                    session
                        .campaign_timeout(election, &target.value, wait)
                        .await
                }
                None => session.campaign(election, &target.value).await,
            }
            .map(Some)
        }
        _ if target.no_wait => session.try_lock(&target.lock).await,
        _ => match target.wait {
            Some(wait) => session.lock_timeout(&target.lock, wait).await.map(Some),
            None => session.lock(&target.lock).await.map(Some),
        },
    };
    let taken = match taken {
        Ok(Some(guard)) => Ok(guard),
        Ok(None) => {
            eprintln!("deadbolt run: {} is busy", target.described());
            return Err(exit::BUSY);
        }
        Err(err) => Err(err),
    };
    taken.map_err(|err| {
        if err.kind() == ErrorKind::WaitTimeout {
            eprintln!("deadbolt run: timed out waiting for {}", target.described());
            exit::BUSY
        } else {
            exit::report(&err)
        }
    })
}

/// One permit of `semaphore`; `None` if busy and the caller would not wait.
async fn take_permit(
    session: &Session,
    semaphore: &str,
    capacity: u32,
    target: &LockArgs,
) -> Result<Option<LockGuard>, deadbolt_client::Error> {
    if target.no_wait {
        return session.try_acquire_permits(semaphore, capacity, 1).await;
    }
    match target.wait {
        Some(wait) => session
            .acquire_permits_timeout(semaphore, capacity, 1, wait)
            .await
            .map(Some),
        None => session
            .acquire_permits(semaphore, capacity, 1)
            .await
            .map(Some),
    }
}

/// The read/write lock `lock` in `mode`; `None` if busy and the caller
/// would not wait.
async fn take_rw_lock(
    session: &Session,
    lock: &str,
    mode: RwMode,
    target: &LockArgs,
) -> Result<Option<LockGuard>, deadbolt_client::Error> {
    if target.no_wait {
        return session.try_rw_lock(lock, mode).await;
    }
    match target.wait {
        Some(wait) => session.rw_lock_timeout(lock, mode, wait).await.map(Some),
        None if mode == RwMode::Shared => session.read_lock(lock).await.map(Some),
        None => session.write_lock(lock).await.map(Some),
    }
}

/// `--once KEY`: a fenced read of the marker first (so that an older holder
/// still running can no longer mark it), the command only if unmarked, and
/// the mark only if the command succeeded and this grant is still current.
async fn run_once(
    client: &Client,
    session: &Session,
    guard: &LockGuard,
    key: &str,
    args: &RunArgs,
    grace: Duration,
    margin: Duration,
) -> i32 {
    let fence = Some((guard.token(), Some(guard.name())));
    match client.store_get(key, fence).await {
        Ok(stored) => {
            if let Some(done) = stored.value {
                eprintln!(
                    "deadbolt run: {key:?} is already done ({done}); not running the command"
                );
                return exit::OK;
            }
        }
        Err(err) => return exit::report(&err),
    }
    let code = run_holding(&(session, guard), args, grace, margin).await;
    if code != exit::OK {
        return code;
    }
    let done = format!(
        "done at {} with token {}",
        humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
        guard.token()
    );
    match client
        .store_put(key, &done, guard.token(), Some(guard.name()))
        .await
    {
        Ok(_) => code,
        Err(err) => {
            eprintln!(
                "deadbolt run: the command succeeded, but {key:?} could not be marked done: {err}"
            );
            exit::code_of(&err)
        }
    }
}

/// What `run` needs from a held lock, whichever system holds it.
pub(crate) trait Holding {
    /// Completes once the lease is within `margin` of its end, or lost:
    /// why, and whether the lock is still ours until
    /// [`lease_deadline`](Self::lease_deadline) (time for a clean stop) or
    /// may be someone else's already.
    fn at_risk(&self, margin: Duration) -> impl Future<Output = (String, bool)> + Send + 'static;
    /// The latest instant the lease is certain to last until.
    fn lease_deadline(&self) -> Instant;
    /// What the command is told about its lock.
    fn env(&self) -> Vec<(&'static str, String)>;
}

impl Holding for (&Session, &LockGuard) {
    fn at_risk(&self, margin: Duration) -> impl Future<Output = (String, bool)> + Send + 'static {
        let lost = self.0.lost(margin);
        async move {
            let reason = lost.await;
            // Rejected or closed: the server already let go.
            let ours = matches!(reason, LeaseLost::Expired);
            (reason.to_string(), ours)
        }
    }

    fn lease_deadline(&self) -> Instant {
        self.0.lease_deadline()
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        let guard = self.1;
        vec![
            ("DEADBOLT_LOCK", guard.name().to_owned()),
            ("DEADBOLT_TOKEN", guard.token().to_string()),
            // A semaphore permit's slot (0..permits): no other live permit
            // has it, so the command may use it to pick its resource.
            (
                "DEADBOLT_SLOT",
                guard
                    .permits()
                    .first()
                    .map_or_else(String::new, |permit| permit.slot.to_string()),
            ),
            // The handle (id and secret): the command may act on its own
            // session, e.g. `deadbolt keepalive --session "$DEADBOLT_SESSION"`.
            ("DEADBOLT_SESSION", guard.session().handle().to_string()),
        ]
    }
}

pub(crate) async fn run_holding(
    held: &impl Holding,
    args: &RunArgs,
    grace: Duration,
    margin: Duration,
) -> i32 {
    let mut child = match spawn(&args.command, &held.env()) {
        Ok(child) => child,
        Err(err) => {
            eprintln!("deadbolt run: cannot start the command: {err}");
            return exit::FAILURE;
        }
    };
    let keeper = child.id().expect("a just-spawned child has a pid") as i32;
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut hangup = signal(SignalKind::hangup()).expect("SIGHUP handler");
    let at_risk = held.at_risk(margin + grace);
    tokio::pin!(at_risk);
    // Armed by the first stop signal passed on: a command that ignores it
    // must not keep the lock (and everyone waiting for it) indefinitely.
    let mut kill_at: Option<Instant> = None;
    let pass_on = |signal: i32, kill_at: &mut Option<Instant>| {
        signal_guard(keeper, signal);
        kill_at.get_or_insert_with(|| Instant::now() + grace);
    };
    // The guard exits only once the command and everything it started are
    // dead, so its exit is what allows the release below.
    loop {
        tokio::select! {
            // Biased: when the command's exit and the lease's loss are seen
            // together, the loss decides (below), never a coin toss.
            biased;
            (reason, ours) = &mut at_risk => {
                if ours {
                    // Exited while the lease was still certain: its work
                    // was all done under the lock, and its status stands.
                    if let Ok(Some(status)) = child.try_wait() {
                        break exit_code(status);
                    }
                }
                eprintln!(
                    "deadbolt run: {reason}; stopping {:?} before the lock can pass on",
                    args.command[0]
                );
                if ours {
                    // Still ours until the deadline: time for a clean stop.
                    stop_gracefully(&mut child, keeper, held.lease_deadline(), margin).await;
                } else {
                    // The server already let go: the lock may be someone
                    // else's right now.
                    signal_guard(keeper, KILL_ALL);
                }
                let _ = child.wait().await;
                eprintln!("deadbolt run: {} lost while running", args.target.described());
                break exit::LOCK_LOST;
            }
            status = child.wait() => break exit_code(status.expect("waiting for the command failed")),
            () = sleep_until_set(kill_at) => {
                eprintln!(
                    "deadbolt run: {:?} still running {} after it was told to stop; killing it",
                    args.command[0],
                    humantime::format_duration(grace)
                );
                signal_guard(keeper, KILL_ALL);
                kill_at = None;
            }
            // Forwarded by the guard to the command's process group.
            _ = terminate.recv() => pass_on(libc::SIGTERM, &mut kill_at),
            _ = interrupt.recv() => pass_on(libc::SIGINT, &mut kill_at),
            _ = hangup.recv() => pass_on(libc::SIGHUP, &mut kill_at),
        }
    }
}

/// Sleeps until `at`; never wakes when it is `None`.
async fn sleep_until_set(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Asks the guard to SIGKILL the command's process group.
const KILL_ALL: i32 = libc::SIGUSR2;

/// SIGTERM, then SIGKILL when the grace period is over, which is still
/// `margin` before the conservative lease deadline.
async fn stop_gracefully(child: &mut Child, keeper: i32, deadline: Instant, margin: Duration) {
    signal_guard(keeper, libc::SIGTERM);
    let kill_at = deadline.checked_sub(margin).unwrap_or_else(Instant::now);
    if tokio::time::timeout_at(kill_at.into(), child.wait())
        .await
        .is_err()
    {
        signal_guard(keeper, KILL_ALL);
    }
}

/// Starts CMD under `deadbolt guard` (see guard.rs), in a process group of
/// its own so that terminal signals reach only us, and we decide.
fn spawn(command: &[String], env: &[(&str, String)]) -> std::io::Result<Child> {
    let parent = std::process::id() as i32;
    // This very binary, even if its file was replaced or removed since.
    let mut cmd = Command::new("/proc/self/exe");
    cmd.args(["guard", "--parent", &parent.to_string(), "--"])
        .args(command)
        .envs(env.iter().map(|(name, value)| (name, value)))
        .process_group(0);
    // SAFETY: prctl and getppid are async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGUSR1) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(std::io::Error::other(
                    "deadbolt run exited before the command started",
                ));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

fn signal_guard(keeper: i32, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(keeper, signal);
    }
}

async fn release(guard: LockGuard) {
    let lock = guard.name().to_owned();
    if let Err(err) = guard.release().await {
        eprintln!("deadbolt run: releasing lock {lock:?}: {err}");
    }
}

/// The command's own exit code; 128+N if it died of signal N, as shells report.
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(exit::FAILURE)
}
