//! `deadbolt-nemesis worker`: one client process. It loops: take a lock,
//! increment a counter in Deadbolt's fenced store and one in the resource
//! process (each a fenced read-modify-write), release; and writes every step
//! to stdout as history records. It runs until its stdin closes.
//!
//! The worker is deliberately not careful: it never checks its lease before
//! writing. Safety must come from the fences, which is what the run tests.
//!
//! With `--backend URL` it locks through `deadbolt-backends` instead (any
//! lock service: Redis, Redlock, etcd, PostgreSQL, Deadbolt), skips the
//! Deadbolt fenced store, and reports each grant's holding interval
//! ([`Held`]) so the run can count double grants. With `--unfenced` it
//! sends the resource no token, as code that ignores its lock's token would.
//! One loop for both ([`hold_in_turn`]), over a [`LockSystem`].

use crate::availability::ClientError;
use crate::history::{self, at, now, Held, Line, Op, Phase, Record};
use deadbolt_client::{Client, ErrorKind, Session, TlsOptions};
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    id: usize,
    /// The Deadbolt cluster (its endpoints), or `--backend`.
    #[arg(long, value_delimiter = ',', required_unless_present = "backend")]
    endpoints: Vec<String>,
    /// Lock through `deadbolt-backends` at this lock URL instead.
    #[arg(long, conflicts_with = "endpoints")]
    backend: Option<String>,
    /// Send the resource no fencing token (only with --backend).
    #[arg(long, requires = "backend")]
    unfenced: bool,
    /// The work between an increment's read and its write (only with
    /// --backend): the window in which a pause makes a write late.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration, requires = "backend")]
    hold: Duration,
    #[arg(long, value_delimiter = ',')]
    locks: Vec<String>,
    #[arg(long)]
    resource: SocketAddr,
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Duration,
    #[arg(long)]
    seed: u64,
    /// Mutual TLS (`run --secure`): the CA, and this client's certificate
    /// and key.
    #[arg(long)]
    ca: Option<PathBuf>,
    #[arg(long)]
    cert: Option<PathBuf>,
    #[arg(long)]
    key: Option<PathBuf>,
    /// The access token to send (`run --secure`).
    #[arg(long)]
    access_token: Option<String>,
}

/// How long one acquire may wait before it is recorded as failed.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a single request may take before its outcome is unknown.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn main(args: WorkerArgs) -> anyhow::Result<()> {
    match &args.backend {
        Some(url) => {
            let locker = deadbolt_backends::Locker::connect(url).await?;
            hold_in_turn(Backends(locker), &args).await;
        }
        None => {
            let tls = TlsOptions::from_files(
                args.ca.as_deref(),
                args.cert.as_deref(),
                args.key.as_deref(),
            )?;
            let token = args.access_token.as_deref();
            let client = Client::connect_with_token(args.endpoints.clone(), &tls, token).await?;
            hold_in_turn(Deadbolt(client), &args).await;
        }
    }
    Ok(())
}

/// A lock system the worker takes its locks in: a Deadbolt cluster
/// ([`Deadbolt`]) or the one `--backend` names ([`Backends`]).
/// [`hold_in_turn`] drives either the same way.
trait LockSystem {
    type Session;
    /// A new session; `None` (said in the history where the system can) to
    /// try again shortly.
    async fn open_session(&self, ttl: Duration, log: &mut Log) -> Option<Self::Session>;
    /// One round on `lock` in `session`; whether the session may be used
    /// for the next (false once its lease is lost, or may be).
    async fn round(
        &self,
        session: &Self::Session,
        lock: &str,
        args: &WorkerArgs,
        log: &mut Log,
    ) -> bool;
}

/// Round after round on a random one of the run's locks, in a session
/// opened again once it is lost, until the runner closes stdin.
async fn hold_in_turn(system: impl LockSystem, args: &WorkerArgs) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let mut log = Log { client: args.id };
    let stop = stop_on_stdin_close();
    let mut session = None;
    while !*stop.borrow() {
        let current = match session.take() {
            Some(current) => current,
            None => match system.open_session(args.ttl, &mut log).await {
                Some(opened) => opened,
                None => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let lock = &args.locks[rng.gen_range(0..args.locks.len())];
        if system.round(&current, lock, args, &mut log).await {
            session = Some(current);
        }
    }
}

/// A Deadbolt cluster: rounds of acquire, fenced store increment, resource
/// increment, release ([`round`]).
struct Deadbolt(Client);

impl LockSystem for Deadbolt {
    type Session = Session;

    async fn open_session(&self, ttl: Duration, log: &mut Log) -> Option<Session> {
        match self.0.open_session(ttl).await {
            Ok(opened) => Some(opened),
            Err(err) => {
                log.client_error("open_session", &err, false);
                None
            }
        }
    }

    async fn round(&self, session: &Session, lock: &str, args: &WorkerArgs, log: &mut Log) -> bool {
        round(&self.0, session, lock, args.resource, log).await;
        !session.is_lost()
    }
}

/// Another lock system, through `deadbolt-backends`: a session per holder,
/// and rounds of acquire, resource increment, release ([`backend_round`]).
struct Backends(deadbolt_backends::Locker);

impl LockSystem for Backends {
    type Session = deadbolt_backends::Session;

    async fn open_session(&self, ttl: Duration, _: &mut Log) -> Option<Self::Session> {
        match tokio::time::timeout(REQUEST_TIMEOUT, self.0.open_session(ttl)).await {
            Ok(Ok(opened)) => Some(opened),
            _ => None,
        }
    }

    async fn round(
        &self,
        session: &Self::Session,
        lock: &str,
        args: &WorkerArgs,
        log: &mut Log,
    ) -> bool {
        backend_round(session, lock, args, log).await
    }
}

/// A watch that turns true when the runner closes our stdin.
fn stop_on_stdin_close() -> tokio::sync::watch::Receiver<bool> {
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = tokio::io::stdin().read_to_end(&mut sink).await;
        let _ = stop_tx.send(true);
    });
    stop
}

/// One round over a backend; false if its session is lost (or may be) and
/// a new one is due.
async fn backend_round(
    session: &deadbolt_backends::Session,
    lock: &str,
    args: &WorkerArgs,
    log: &mut Log,
) -> bool {
    use deadbolt_backends::{ErrorKind as Kind, Token};
    let invoked = log.record(Op::Acquire, Phase::Invoke, lock, None, None, None);
    let guard = match session.lock_timeout(lock, ACQUIRE_TIMEOUT).await {
        Ok(guard) => guard,
        Err(err) => {
            // A timeout granted nothing (the backends undo a late grant);
            // anything else may have.
            let phase = match err.kind() {
                Kind::WaitTimeout | Kind::Busy | Kind::InvalidArgument | Kind::Refused => {
                    Phase::Fail
                }
                _ => Phase::Info,
            };
            log.record(Op::Acquire, phase, lock, None, None, Some(err.to_string()));
            tokio::time::sleep(Duration::from_millis(20)).await;
            return phase == Phase::Fail;
        }
    };
    // Redis's counter is no fencing token, but it is all plain Redis has:
    // the run shows what checking it buys.
    let token = match guard.token() {
        Token::Fencing(token) | Token::Counter(token) => Some(token),
        Token::None => None,
    };
    let granted = log.record(Op::Acquire, Phase::Ok, lock, token, None, None);

    log.record(
        Op::ResourceIncrement,
        Phase::Invoke,
        lock,
        token,
        None,
        None,
    );
    let fence = if args.unfenced { None } else { token };
    let mut timing = Timing::default();
    // Longer than the longest pause (3 TTLs): a worker paused mid-write
    // must make its late write when it wakes, not time out on the spot.
    let outcome = tokio::time::timeout(
        REQUEST_TIMEOUT + args.hold + args.ttl * 3,
        resource_increment(args.resource, lock, fence, args.hold, &mut timing),
    )
    .await;
    let outcome = log.resource_outcome(lock, token, outcome);
    if let (Some(read), Some(sent)) = (timing.read, timing.sent) {
        log.line(&Line::Write {
            write: history::Write {
                client: args.id,
                lock: lock.to_owned(),
                granted,
                read,
                sent,
                outcome,
            },
        });
    }

    let releasing = log.record(Op::Release, Phase::Invoke, lock, token, None, None);
    log.held(Held {
        client: args.id,
        lock: lock.to_owned(),
        invoked,
        granted,
        until: releasing.min(at(guard.lease_deadline())),
        token,
    });
    let (phase, error) = match tokio::time::timeout(REQUEST_TIMEOUT, guard.release()).await {
        Ok(Ok(())) => (Phase::Ok, None),
        Ok(Err(err)) => (Phase::Fail, Some(err.to_string())),
        Err(_) => (Phase::Info, Some("timed out".to_owned())),
    };
    let lost = phase != Phase::Ok;
    log.record(Op::Release, phase, lock, token, None, error);
    !lost
}

/// Names of the run's read/write lock, election and semaphore (`run.rs`
/// adds one of each beside the locks, under the workers' `lock-` prefix).
pub(crate) const RW_LOCK_PREFIX: &str = "lock-rw-";
pub(crate) const ELECTION_PREFIX: &str = "lock-election-";
pub(crate) const SEMAPHORE_PREFIX: &str = "lock-semaphore-";
/// The semaphore's permits: its workers take one each, so two hold it at
/// once, and the fenced read before each write keeps their increments
/// from overwriting each other.
pub(crate) const SEMAPHORE_PERMITS: u32 = 2;

/// Acquire, two increments, release.
async fn round(
    client: &Client,
    session: &Session,
    lock: &str,
    resource: SocketAddr,
    log: &mut Log,
) {
    log.record(Op::Acquire, Phase::Invoke, lock, None, None, None);
    // The run's read/write lock is taken exclusive and its election
    // campaigned for: each grant is then as exclusive as a lock's, and the
    // same checks hold. Its semaphore's permits are two at once.
    let taken = if lock.starts_with(RW_LOCK_PREFIX) {
        let exclusive = deadbolt_client::RwMode::Exclusive;
        session
            .rw_lock_timeout(lock, exclusive, ACQUIRE_TIMEOUT)
            .await
    } else if lock.starts_with(ELECTION_PREFIX) {
        let value = format!("worker {}", session.id());
        session
            .campaign_timeout(lock, &value, ACQUIRE_TIMEOUT)
            .await
    } else if lock.starts_with(SEMAPHORE_PREFIX) {
        session
            .acquire_permits_timeout(lock, SEMAPHORE_PERMITS, 1, ACQUIRE_TIMEOUT)
            .await
    } else {
        session.lock_timeout(lock, ACQUIRE_TIMEOUT).await
    };
    let guard = match taken {
        Ok(guard) => guard,
        Err(err) => {
            // A timed-out or refused acquire granted nothing we know of;
            // an outage leaves it unknown.
            let phase = if matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::NotLeader) {
                Phase::Info
            } else {
                Phase::Fail
            };
            log.client_error("acquire", &err, session.is_lost());
            log.record(Op::Acquire, phase, lock, None, None, Some(err.to_string()));
            // Whatever went wrong, do not hammer the cluster with retries.
            tokio::time::sleep(Duration::from_millis(20)).await;
            return;
        }
    };
    let token = guard.token();
    // A permit's slot goes into the history: the checker holds each live
    // permit to its own.
    let slot = guard.permits().first().map(|permit| u64::from(permit.slot));
    log.record(Op::Acquire, Phase::Ok, lock, Some(token), slot, None);

    log.record(
        Op::StoreIncrement,
        Phase::Invoke,
        lock,
        Some(token),
        None,
        None,
    );
    let key = format!("counter:{lock}");
    let outcome = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let read = client
            .store_get(&key, Some((token, Some(lock))))
            .await
            .map_err(|err| (false, err))?;
        let next = read
            .value
            .as_deref()
            .unwrap_or("0")
            .parse::<u64>()
            .unwrap_or(0)
            + 1;
        client
            .store_put(&key, &next.to_string(), token, Some(lock))
            .await
            .map(|_| next)
            .map_err(|err| (true, err))
    })
    .await;
    match outcome {
        Ok(Ok(value)) => log.record(
            Op::StoreIncrement,
            Phase::Ok,
            lock,
            Some(token),
            Some(value),
            None,
        ),
        Ok(Err((wrote, error))) => {
            log.client_error(
                if wrote { "store_put" } else { "store_get" },
                &error,
                session.is_lost(),
            );
            // The put's outcome is unknown only if it was sent and the
            // answer lost; a refusal (stale) certainly changed nothing.
            let unknown = wrote
                && matches!(
                    error.kind(),
                    ErrorKind::Unavailable | ErrorKind::NotLeader | ErrorKind::Internal
                );
            let error = error.to_string();
            let phase = if unknown { Phase::Info } else { Phase::Fail };
            log.record(
                Op::StoreIncrement,
                phase,
                lock,
                Some(token),
                None,
                Some(error),
            )
        }
        Err(_) => log.record(
            Op::StoreIncrement,
            Phase::Info,
            lock,
            Some(token),
            None,
            Some("timed out".into()),
        ),
    };

    log.record(
        Op::ResourceIncrement,
        Phase::Invoke,
        lock,
        Some(token),
        None,
        None,
    );
    let outcome = tokio::time::timeout(
        REQUEST_TIMEOUT,
        resource_increment(
            resource,
            lock,
            Some(token),
            Duration::ZERO,
            &mut Timing::default(),
        ),
    )
    .await;
    log.resource_outcome(lock, Some(token), outcome);

    log.record(Op::Release, Phase::Invoke, lock, Some(token), None, None);
    match tokio::time::timeout(REQUEST_TIMEOUT, guard.release()).await {
        Ok(Ok(())) => log.record(Op::Release, Phase::Ok, lock, Some(token), None, None),
        Ok(Err(err)) => {
            log.client_error("release", &err, session.is_lost());
            log.record(
                Op::Release,
                Phase::Fail,
                lock,
                Some(token),
                None,
                Some(err.to_string()),
            )
        }
        Err(_) => log.record(
            Op::Release,
            Phase::Info,
            lock,
            Some(token),
            None,
            Some("timed out".into()),
        ),
    };
}

/// A fenced read then a fenced write of value + 1 on the resource process
/// (without a token: unfenced, for a resource run with `--unfenced`).
/// `Ok(Err(_))`: the resource refused (stale); `Err(_)`: the outcome is unknown.
/// `timing` learns when the read came back and the write went out (for a
/// refused read, when the read went out, as both).
async fn resource_increment(
    resource: SocketAddr,
    lock: &str,
    token: Option<u64>,
    hold: Duration,
    timing: &mut Timing,
) -> anyhow::Result<Result<u64, String>> {
    let asked = now();
    let (status, body) = http(resource, "GET", &format!("/counter/{lock}"), token, "").await?;
    if status != 200 {
        // The late access was the read: counted as a write refused then.
        (timing.read, timing.sent) = (Some(asked), Some(asked));
        return Ok(Err(format!("read refused: {status} {body}")));
    }
    timing.read = Some(now());
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    timing.sent = Some(now());
    let next = body.trim().parse::<u64>()? + 1;
    let (status, body) = http(
        resource,
        "PUT",
        &format!("/counter/{lock}"),
        token,
        &next.to_string(),
    )
    .await?;
    if status != 200 {
        return Ok(Err(format!("write refused: {status} {body}")));
    }
    Ok(Ok(next))
}

/// When an increment's read came back and its write went out.
#[derive(Default)]
struct Timing {
    read: Option<u64>,
    sent: Option<u64>,
}

/// One HTTP/1.1 exchange on a fresh connection: status and body.
pub async fn http(
    address: SocketAddr,
    method: &str,
    path: &str,
    token: Option<u64>,
    body: &str,
) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let fence = token.map_or(String::new(), |t| format!("fencing-token: {t}\r\n"));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {address}\r\n{fence}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("not an HTTP response: {response:?}"))?;
    let body = response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    Ok((status, body))
}

struct Log {
    client: usize,
}

impl Log {
    /// Writes a record; returns its time.
    fn record(
        &mut self,
        op: Op,
        phase: Phase,
        lock: &str,
        token: Option<u64>,
        value: Option<u64>,
        error: Option<String>,
    ) -> u64 {
        let record = Record {
            at: now(),
            client: self.client,
            op,
            phase,
            lock: lock.to_owned(),
            token,
            value,
            error,
        };
        let at = record.at;
        self.line(&Line::Record(record));
        at
    }

    /// Writes down an error the client library returned, for the run's
    /// availability check; `lease_lost`: the session it was made on was
    /// already known lost.
    fn client_error(&mut self, call: &str, err: &deadbolt_client::Error, lease_lost: bool) {
        self.line(&Line::ClientError {
            client_error: ClientError {
                at: now(),
                client: self.client,
                call: call.to_owned(),
                kind: err.kind().as_str().to_owned(),
                message: err.to_string(),
                lease_lost,
                outcome_unknown: err.outcome_unknown(),
            },
        });
    }

    fn held(&mut self, held: Held) {
        self.line(&Line::Held { held });
    }

    fn line(&mut self, line: &Line) {
        let mut out = std::io::stdout().lock();
        // The runner reads every line; a broken pipe means it is gone.
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string(line).expect("serializable")
        );
        let _ = out.flush();
    }

    /// Records how a resource increment ended; returns that.
    fn resource_outcome(
        &mut self,
        lock: &str,
        token: Option<u64>,
        outcome: Result<anyhow::Result<Result<u64, String>>, tokio::time::error::Elapsed>,
    ) -> Phase {
        let (phase, value, error) = match outcome {
            Ok(Ok(Ok(value))) => (Phase::Ok, Some(value), None),
            Ok(Ok(Err(refusal))) => (Phase::Fail, None, Some(refusal)),
            Ok(Err(err)) => (Phase::Info, None, Some(err.to_string())),
            Err(_) => (Phase::Info, None, Some("timed out".to_owned())),
        };
        self.record(Op::ResourceIncrement, phase, lock, token, value, error);
        phase
    }
}
