//! `deadbolt-nemesis worker`: one client process. It loops: take a lock,
//! increment a counter in Deadbolt's fenced store and one in the resource
//! process (each a fenced read-modify-write), release; and writes every step
//! to stdout as history records. It runs until its stdin closes.
//!
//! The worker is deliberately not careful: it never checks its lease before
//! writing. Safety must come from the fences, which is what the run tests.

use crate::history::{now, Op, Phase, Record};
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
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
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
    let tls = TlsOptions::from_files(
        args.ca.as_deref(),
        args.cert.as_deref(),
        args.key.as_deref(),
    )?;
    let token = args.access_token.as_deref();
    let client = Client::connect_with_token(args.endpoints.clone(), &tls, token).await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let mut log = Log { client: args.id };
    // Ends the loop when the runner closes our stdin.
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = tokio::io::stdin().read_to_end(&mut sink).await;
        let _ = stop_tx.send(true);
    });
    let mut session: Option<Session> = None;
    while !*stop.borrow() {
        let current = match &session {
            Some(session) if !session.is_lost() => session.clone(),
            _ => match client.open_session(args.ttl).await {
                Ok(opened) => {
                    session = Some(opened.clone());
                    opened
                }
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let lock = args.locks[rng.gen_range(0..args.locks.len())].clone();
        round(&client, &current, &lock, args.resource, &mut log).await;
        if current.is_lost() {
            session = None;
        }
    }
    Ok(())
}

/// Acquire, two increments, release.
async fn round(
    client: &Client,
    session: &Session,
    lock: &str,
    resource: SocketAddr,
    log: &mut Log,
) {
    log.record(Op::Acquire, Phase::Invoke, lock, None, None, None);
    let guard = match session.lock_timeout(lock, ACQUIRE_TIMEOUT).await {
        Ok(guard) => guard,
        Err(err) => {
            // A timed-out or refused acquire granted nothing we know of;
            // an outage leaves it unknown.
            let phase = if matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::NotLeader) {
                Phase::Info
            } else {
                Phase::Fail
            };
            log.record(Op::Acquire, phase, lock, None, None, Some(err.to_string()));
            // Whatever went wrong, do not hammer the cluster with retries.
            tokio::time::sleep(Duration::from_millis(20)).await;
            return;
        }
    };
    let token = guard.token();
    log.record(Op::Acquire, Phase::Ok, lock, Some(token), None, None);

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
            .map_err(|err| (false, err.to_string(), err.kind()))?;
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
            .map_err(|err| (true, err.to_string(), err.kind()))
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
        Ok(Err((wrote, error, kind))) => {
            // The put's outcome is unknown only if it was sent and the
            // answer lost; a refusal (stale) certainly changed nothing.
            let unknown = wrote
                && matches!(
                    kind,
                    ErrorKind::Unavailable | ErrorKind::NotLeader | ErrorKind::Internal
                );
            let phase = if unknown { Phase::Info } else { Phase::Fail };
            log.record(
                Op::StoreIncrement,
                phase,
                lock,
                Some(token),
                None,
                Some(error),
            );
        }
        Err(_) => log.record(
            Op::StoreIncrement,
            Phase::Info,
            lock,
            Some(token),
            None,
            Some("timed out".into()),
        ),
    }

    log.record(
        Op::ResourceIncrement,
        Phase::Invoke,
        lock,
        Some(token),
        None,
        None,
    );
    let outcome =
        tokio::time::timeout(REQUEST_TIMEOUT, resource_increment(resource, lock, token)).await;
    match outcome {
        Ok(Ok(Ok(value))) => log.record(
            Op::ResourceIncrement,
            Phase::Ok,
            lock,
            Some(token),
            Some(value),
            None,
        ),
        Ok(Ok(Err(refusal))) => log.record(
            Op::ResourceIncrement,
            Phase::Fail,
            lock,
            Some(token),
            None,
            Some(refusal),
        ),
        Ok(Err(err)) => log.record(
            Op::ResourceIncrement,
            Phase::Info,
            lock,
            Some(token),
            None,
            Some(err.to_string()),
        ),
        Err(_) => log.record(
            Op::ResourceIncrement,
            Phase::Info,
            lock,
            Some(token),
            None,
            Some("timed out".into()),
        ),
    }

    log.record(Op::Release, Phase::Invoke, lock, Some(token), None, None);
    match tokio::time::timeout(REQUEST_TIMEOUT, guard.release()).await {
        Ok(Ok(())) => log.record(Op::Release, Phase::Ok, lock, Some(token), None, None),
        Ok(Err(err)) => log.record(
            Op::Release,
            Phase::Fail,
            lock,
            Some(token),
            None,
            Some(err.to_string()),
        ),
        Err(_) => log.record(
            Op::Release,
            Phase::Info,
            lock,
            Some(token),
            None,
            Some("timed out".into()),
        ),
    }
}

/// A fenced read then a fenced write of value + 1 on the resource process.
/// `Ok(Err(_))`: the resource refused (stale); `Err(_)`: the outcome is unknown.
async fn resource_increment(
    resource: SocketAddr,
    lock: &str,
    token: u64,
) -> anyhow::Result<Result<u64, String>> {
    let (status, body) = http(
        resource,
        "GET",
        &format!("/counter/{lock}"),
        Some(token),
        "",
    )
    .await?;
    if status != 200 {
        return Ok(Err(format!("read refused: {status} {body}")));
    }
    let next = body.trim().parse::<u64>()? + 1;
    let (status, body) = http(
        resource,
        "PUT",
        &format!("/counter/{lock}"),
        Some(token),
        &next.to_string(),
    )
    .await?;
    if status != 200 {
        return Ok(Err(format!("write refused: {status} {body}")));
    }
    Ok(Ok(next))
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
    fn record(
        &mut self,
        op: Op,
        phase: Phase,
        lock: &str,
        token: Option<u64>,
        value: Option<u64>,
        error: Option<String>,
    ) {
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
        let mut out = std::io::stdout().lock();
        // The runner reads every line; a broken pipe means it is gone.
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string(&record).expect("serializable")
        );
        let _ = out.flush();
    }
}
