//! The command under a lock: what `deadbolt run` and `elect` are given,
//! the [`LockSystem`] they take their lock in, and the guard process that
//! runs the command while it is held ([`run_holding`]), whichever system
//! holds it.
//!
//! The command must never run on after the lock could have passed to
//! someone else. The client's lease deadline is conservative (counted from
//! when the last acknowledged keepalive was *sent*); from it we keep a
//! margin for clock-rate drift between client and server, and before that
//! margin we give the command SIGTERM, then SIGKILL a grace period later.
//! So the command is dead before the server's own deadline can pass.
//!
//! This bounds the damage of a lost lease, it does not make the work
//! exclusive: a command paused (or a `deadbolt run` SIGSTOP'd) past its
//! lease can still act late. Resources that matter must check
//! `$DEADBOLT_TOKEN`.

use crate::locks::LockArgs;
use crate::{exit, parse_duration};
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
    pub(crate) once: Option<String>,
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

/// A lock system `run` takes its lock in: the Deadbolt server
/// (`deadbolt.rs`) or one a team already runs (`backend.rs`). `run::main`
/// drives each the same way: take, run the command holding it, let go,
/// close.
pub(crate) trait LockSystem {
    /// What a taken lock is held as.
    type Held: Holding;

    /// Takes the lock, permit or leadership `args` name; or, having said
    /// why not, the exit code to end with.
    async fn take(&self, args: &RunArgs) -> Result<Self::Held, i32>;

    /// Runs the command while `held` is held: [`run_holding`], and whatever
    /// the system adds around it.
    async fn run(
        &self,
        held: &Self::Held,
        args: &RunArgs,
        grace: Duration,
        margin: Duration,
    ) -> i32 {
        run_holding(held, args, grace, margin).await
    }

    /// Lets go of `held`. A lock already lost is refused by its token or
    /// owner, never released for whoever holds it now.
    async fn release(&self, held: Self::Held);

    /// Ends the session; its lease ends by itself if this fails.
    async fn close(self);
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

/// The command's own exit code; 128+N if it died of signal N, as shells report.
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(exit::FAILURE)
}
