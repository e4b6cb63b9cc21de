//! The lock commands for scripts and humans: `acquire`, `release`,
//! `keepalive`, `status`, `locks`.
//!
//! `acquire` returns as soon as it holds the lock, so its session is no longer
//! kept alive by anyone: the lock is held for one `--ttl` unless renewed with
//! `deadbolt keepalive`. For "hold while a command runs", use `deadbolt run`.
//!
//! `acquire` prints the session as a handle, `ID.SECRET`, and `keepalive`
//! and `release` take that handle: the id alone, which `status` shows to
//! everyone, is not enough to act on a session.

use crate::Endpoints;
use crate::{exit, parse_duration, stop_signal};
use deadbolt_client::{Client, Error, ErrorKind, LockState, RwMode, SessionHandle};
use std::time::Duration;

/// Which lock to take and how long to wait for it: shared by `run` and
/// `acquire`.
#[derive(clap::Args)]
pub struct LockArgs {
    /// Name of the lock.
    #[arg(
        long,
        required_unless_present_any = ["semaphore", "election"],
        default_value = ""
    )]
    pub lock: String,
    /// Take a permit of this counting semaphore instead of a lock: at most
    /// --permits holders at once, cluster-wide (docs/semaphores.md).
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with_all = ["lock", "lock_delay"]
    )]
    pub semaphore: Option<String>,
    /// The semaphore's number of permits, which creates it; every holder
    /// must name the same. Leave it out to take a permit of a semaphore
    /// that exists (one an admin defined: `deadbolt semaphore define`).
    #[arg(long, value_name = "N", requires = "semaphore", value_parser = clap::value_parser!(u32).range(1..))]
    pub permits: Option<u32>,
    /// Take --lock as a read/write lock, shared: beside other --shared
    /// holders, behind any --exclusive one queued first (docs/rw-locks.md).
    #[arg(long, conflicts_with_all = ["semaphore", "lock_delay", "exclusive"])]
    pub shared: bool,
    /// Take --lock as a read/write lock, exclusive: alone, once every
    /// holder and everyone queued ahead is done. (A plain --lock is a
    /// lock, not a read/write lock: one name is one kind.)
    #[arg(long, conflicts_with_all = ["semaphore", "lock_delay"])]
    pub exclusive: bool,
    /// Campaign for leader of this election instead of taking a lock:
    /// held while leading; the token is the term (docs/elections.md).
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with_all = ["lock", "semaphore", "shared", "exclusive", "lock_delay"]
    )]
    pub election: Option<String>,
    /// With --election: the value the leader tells everyone (`deadbolt
    /// leader` shows it), e.g. its address.
    #[arg(long, requires = "election", default_value = "")]
    pub value: String,
    /// Session lease: how long the lock outlives this process if it dies.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// Wait at most this long (default: wait as long as it takes).
    #[arg(long, value_parser = parse_duration, conflicts_with = "no_wait")]
    pub wait: Option<Duration>,
    /// Fail at once (exit 75) if the lock is held.
    #[arg(long)]
    pub no_wait: bool,
    /// If this session expires while holding the lock (not on a clean
    /// release), keep the lock from everyone for this long, so writes still
    /// in flight can drain. For resources that cannot check fencing tokens.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub lock_delay: Duration,
}

impl LockArgs {
    /// What is taken, for messages: `lock "x"`, `semaphore "y"` or
    /// `read/write lock "z" (shared)`.
    pub fn described(&self) -> String {
        if let Some(election) = &self.election {
            return format!("election {election:?}");
        }
        match (&self.semaphore, self.rw_mode()) {
            (Some(semaphore), _) => format!("semaphore {semaphore:?}"),
            (None, Some(mode)) => format!("read/write lock {:?} ({})", self.lock, mode.as_str()),
            (None, None) => format!("lock {:?}", self.lock),
        }
    }

    /// With --shared or --exclusive, the read/write lock's mode.
    pub fn rw_mode(&self) -> Option<RwMode> {
        match (self.shared, self.exclusive) {
            (true, _) => Some(RwMode::Shared),
            (false, true) => Some(RwMode::Exclusive),
            (false, false) => None,
        }
    }
}

#[derive(clap::Args)]
pub struct AcquireArgs {
    #[command(flatten)]
    target: LockArgs,
}

#[derive(clap::Args)]
pub struct ReleaseArgs {
    /// The lock to release.
    #[arg(long)]
    lock: String,
    /// The session handle `deadbolt acquire` printed (ID.SECRET).
    #[arg(long, value_name = "ID.SECRET")]
    session: SessionHandle,
    /// The fencing token `deadbolt acquire` printed.
    #[arg(long)]
    token: u64,
    /// Keep the session open (by default it is closed after the release).
    #[arg(long)]
    keep_session: bool,
}

#[derive(clap::Args)]
pub struct KeepaliveArgs {
    /// The session handle `deadbolt acquire` printed (ID.SECRET).
    #[arg(long, value_name = "ID.SECRET")]
    session: SessionHandle,
}

#[derive(clap::Args)]
pub struct StatusArgs {
    /// The lock to show.
    #[arg(long, required_unless_present = "semaphore")]
    lock: Option<String>,
    /// Show this counting semaphore instead: its permits, who holds which
    /// (token and slot), and who waits for how many.
    #[arg(long, value_name = "NAME", conflicts_with = "lock")]
    semaphore: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct HistoryArgs {
    /// The lock whose grants to show.
    #[arg(long)]
    lock: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct LeaderArgs {
    /// The election.
    pub(crate) election: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Keep printing, a line each time the leader, its term or its value
    /// changes, until interrupted (it follows the election's events:
    /// docs/watches.md).
    #[arg(long)]
    watch: bool,
    /// Ask another lock system's election instead of the Deadbolt
    /// server's, named by URL: etcd(s):// (as `elect --backend`).
    #[arg(long, value_name = "URL", conflicts_with = "watch")]
    pub(crate) backend: Option<String>,
}

#[derive(clap::Args)]
pub struct ListArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Connects, or reports why not and returns the exit code.
pub(crate) async fn connect(endpoints: &Endpoints) -> Result<Client, i32> {
    connect_within(endpoints, None).await
}

/// [`connect`], trying again while no endpoint answers for up to `patience`
/// (see [`Endpoints::connect_within`]).
pub(crate) async fn connect_within(
    endpoints: &Endpoints,
    patience: Option<std::time::Duration>,
) -> Result<Client, i32> {
    (endpoints.connect_within(patience).await).map_err(|err| exit::report(&err))
}

fn outcome(result: Result<(), Error>) -> i32 {
    match result {
        Ok(()) => exit::OK,
        Err(err) => exit::report(&err),
    }
}

pub async fn acquire(endpoints: &Endpoints, args: AcquireArgs) -> i32 {
    let args = args.target;
    let patience = if args.no_wait { None } else { args.wait };
    let client = match connect_within(endpoints, patience).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let (session, _) = match client.open_session_raw(args.ttl).await {
        Ok(opened) => opened,
        Err(err) => return exit::report(&err),
    };
    let timeout = if args.no_wait { None } else { args.wait };
    let acquiring = async {
        match (&args.semaphore, args.permits) {
            (Some(semaphore), capacity) => client
                .acquire_permits_raw(
                    &session,
                    semaphore,
                    capacity.unwrap_or(0),
                    1,
                    !args.no_wait,
                    timeout,
                )
                .await
                .map(|permits| permits.first().map_or(0, |permit| permit.token)),
            _ if args.election.is_some() => {
                let election = args.election.as_deref().expect("an election");
                let wait = !args.no_wait;
                client
                    .campaign_raw(&session, election, &args.value, wait, timeout)
                    .await
            }
            _ if args.rw_mode().is_some() => {
                let mode = args.rw_mode().expect("a read/write mode");
                let wait = !args.no_wait;
                client
                    .acquire_rw_raw(&session, &args.lock, mode, wait, timeout)
                    .await
            }
            _ => {
                client
                    .acquire_raw_delayed(
                        &session,
                        &args.lock,
                        !args.no_wait,
                        timeout,
                        args.lock_delay,
                    )
                    .await
            }
        }
    };
    let acquired = tokio::select! {
        acquired = acquiring => acquired,
        signal = stop_signal() => {
            // The token will never be printed, so nobody can use the
            // session: close it (and give up its place or grant) rather
            // than leave it to its TTL.
            let _ = client.close_session_raw(&session).await;
            return 128 + signal;
        }
    };
    match acquired {
        Ok(token) => {
            println!("{session} {token}");
            exit::OK
        }
        Err(err) => {
            // Leave nothing behind: a session without the lock is useless.
            let _ = client.close_session_raw(&session).await;
            if err.kind() == ErrorKind::WaitTimeout {
                eprintln!("deadbolt: timed out waiting for {}", args.described());
                return exit::BUSY;
            }
            exit::report(&err)
        }
    }
}

pub async fn release(endpoints: &Endpoints, args: ReleaseArgs) -> i32 {
    let client = match connect(endpoints).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let released = client
        .release_raw(&args.session, &args.lock, args.token)
        .await;
    if released.is_ok() && !args.keep_session {
        return outcome(client.close_session_raw(&args.session).await);
    }
    outcome(released)
}

pub async fn keepalive(endpoints: &Endpoints, args: KeepaliveArgs) -> i32 {
    let client = match connect(endpoints).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    outcome(client.keep_alive_raw(&args.session).await.map(|ttl| {
        println!("renewed for {}", humantime::format_duration(ttl));
    }))
}

pub async fn status(endpoints: &Endpoints, args: StatusArgs) -> i32 {
    let client = match connect(endpoints).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let lock = match (args.lock, args.semaphore) {
        (_, Some(semaphore)) => return semaphore_status(&client, &semaphore, args.json).await,
        (Some(lock), None) => lock,
        (None, None) => unreachable!("clap requires --lock or --semaphore"),
    };
    outcome(
        client
            .lock_status_with_index(&lock)
            .await
            .map(|(state, index)| {
                if args.json {
                    let json = serde_json::json!({ "lock": lock, "state": state, "index": index });
                    println!("{json}");
                    return;
                }
                match state {
                    None => println!("{lock}: free"),
                    Some(state) if !state.mode.is_empty() => print_rw_lock(&state),
                    Some(state) if state.lock_delay => println!(
                        "{}: in lock-delay (session {} expired holding token {}), {} waiting{}",
                        state.lock,
                        state.holder_session_id,
                        state.token,
                        state.waiter_session_ids.len(),
                        waiter_list(&state)
                    ),
                    Some(state) => println!(
                        "{}: held by session {} with token {}, {} waiting{}",
                        state.lock,
                        state.holder_session_id,
                        state.token,
                        state.waiter_session_ids.len(),
                        waiter_list(&state)
                    ),
                }
            }),
    )
}

pub(crate) async fn semaphore_status(client: &Client, semaphore: &str, json: bool) -> i32 {
    let status = client.semaphore_status_with_index(semaphore).await;
    outcome(status.map(|(state, index)| {
        if json {
            let json =
                serde_json::json!({ "semaphore": semaphore, "state": state, "index": index });
            println!("{json}");
            return;
        }
        let Some(state) = state else {
            return println!("{semaphore}: free (nobody holds or waits on it)");
        };
        let held: usize = state.holders.iter().map(|h| h.permits.len()).sum();
        println!(
            "{semaphore}: {held} of {} permits held, {} waiting{}",
            state.capacity,
            state.waiters.len(),
            match state.defined {
                true => " (defined: it stays while unused)",
                false => "",
            }
        );
        for holder in &state.holders {
            let permits: Vec<String> = holder
                .permits
                .iter()
                .map(|p| format!("token {} on slot {}", p.token, p.slot))
                .collect();
            println!(
                "  session {} holds {}",
                holder.session_id,
                permits.join(", ")
            );
        }
        for waiter in &state.waiters {
            println!("  session {} waits for {}", waiter.session_id, waiter.count);
        }
    }))
}

/// A read/write lock's status: its mode, every holder with its token, and
/// the queue with each waiter's mode.
fn print_rw_lock(state: &LockState) {
    let holders: Vec<String> = state
        .holders
        .iter()
        .map(|hold| format!("session {} (token {})", hold.session_id, hold.token))
        .collect();
    println!(
        "{}: read/write lock held {} by {}, {} waiting",
        state.lock,
        state.mode,
        holders.join(", "),
        state.waiters.len()
    );
    for waiter in &state.waiters {
        println!("  session {} waits {}", waiter.session_id, waiter.mode);
    }
}

fn waiter_list(state: &LockState) -> String {
    if state.waiter_session_ids.is_empty() {
        return String::new();
    }
    let ids: Vec<String> = state
        .waiter_session_ids
        .iter()
        .map(u64::to_string)
        .collect();
    format!(" (sessions {})", ids.join(", "))
}

/// `deadbolt leader NAME`: who leads the election, in which term, with
/// which value, and who is next.
pub async fn leader(endpoints: &Endpoints, args: LeaderArgs) -> i32 {
    let client = match connect(endpoints).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let election = &args.election;
    let show = |answer: deadbolt_client::LeaderResponse| {
        if args.json {
            let index = answer.index;
            let json = serde_json::json!({ "election": election, "state": answer, "index": index });
            return println!("{json}");
        }
        let Some(leader) = answer.leader else {
            return println!("{election}: no leader (nobody campaigns)");
        };
        println!(
            "{election}: led by session {} in term {}, value {:?}, {} candidates waiting",
            leader.session_id,
            leader.term,
            leader.value,
            answer.candidate_session_ids.len()
        );
    };
    if !args.watch {
        return outcome(client.leader(election).await.map(show));
    }
    let stopped = stop_signal();
    tokio::pin!(stopped);
    let mut changes = match client.observe_leader(election).await {
        Ok(changes) => changes,
        Err(err) => return exit::report(&err),
    };
    loop {
        let leader = tokio::select! {
            leader = changes.next() => leader,
            _ = &mut stopped => return exit::OK,
        };
        match leader {
            Ok(answer) => show(answer),
            Err(err) => return exit::report(&err),
        }
    }
}

pub async fn list(endpoints: &Endpoints, args: ListArgs) -> i32 {
    let client = match connect(endpoints).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    outcome(client.list_locks().await.map(|locks| {
        if args.json {
            println!("{}", serde_json::json!({ "locks": locks }));
            return;
        }
        if locks.is_empty() {
            println!("no locks are held");
            return;
        }
        let width = locks.iter().map(|l| l.lock.len()).max().unwrap_or(4).max(4);
        // Tokens count microseconds since the epoch: 16 digits.
        let tokens = locks.iter().map(|l| l.token.to_string().len()).max();
        let tokens = tokens.unwrap_or(5).max(5);
        println!(
            "{:width$}  {:9}  {:>8}  {:>tokens$}  WAITERS",
            "LOCK", "MODE", "SESSION", "TOKEN"
        );
        for lock in &locks {
            // A read/write lock held shared by several: the first holder,
            // and how many more.
            let session = match lock.holders.len() {
                0 | 1 => lock.holder_session_id.to_string(),
                n => format!("{} +{}", lock.holder_session_id, n - 1),
            };
            let mode = match lock.mode.as_str() {
                "" => "lock",
                mode => mode,
            };
            println!(
                "{:width$}  {mode:9}  {session:>8}  {:>tokens$}  {}",
                lock.lock,
                lock.token,
                lock.waiter_session_ids.len()
            );
        }
    }))
}

pub async fn history(endpoints: &Endpoints, args: HistoryArgs) -> i32 {
    let client = match connect(endpoints).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    outcome(client.lock_history(&args.lock).await.map(|entries| {
        if args.json {
            println!(
                "{}",
                serde_json::json!({ "lock": args.lock, "entries": entries })
            );
            return;
        }
        if entries.is_empty() {
            println!("no history kept for lock {:?}", args.lock);
            return;
        }
        println!(
            "{:>10}  {:24}  {:>8}  {:>12}  {:10}  IDENTITY",
            "SEQ", "TIME (UTC)", "SESSION", "TOKEN", "WHAT"
        );
        for entry in entries {
            let at = std::time::UNIX_EPOCH + Duration::from_millis(entry.at_ms);
            println!(
                "{:>10}  {:24}  {:>8}  {:>12}  {:10}  {}",
                entry.seq,
                humantime::format_rfc3339_millis(at).to_string(),
                entry.session_id,
                entry.token,
                entry.what,
                if entry.identity.is_empty() {
                    "-"
                } else {
                    &entry.identity
                }
            );
        }
    }))
}
