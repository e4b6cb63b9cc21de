//! `deadbolt bench overload`: what a server does when asked for more than it
//! can take (issue 15: "bounded everywhere, and a clear answer when full").
//!
//! Thousands of sessions block in the FIFO queues of a few locks, each
//! releasing as soon as it is granted and queueing again, while flooders
//! open and close sessions and read lock status as fast as the server
//! answers, over many connections. Meanwhile a probe with a connection of
//! its own times its acquires (on a lock nobody else takes) and the health
//! call, and the server's resident memory is sampled from `/proc`. Then the
//! flood stops, every waiter finishes its last acquire, and the probe is
//! timed again.
//!
//! The bench checks what the grants it saw allow: no token twice, and on
//! each lock, taken in token order, every grant arrived after the previous
//! holder had sent its release (no two holders at once, nothing lost).
//! This is a measurement, not a test: it prints figures and never fails on
//! a threshold.

use super::measure::{histogram, BenchArgs};
use crate::Endpoints;
use deadbolt_client::{Client, Error, ErrorKind, Session};
use futures::stream::{self, StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the probe is timed before the flood and after it.
const QUIET_PHASE: Duration = Duration::from_secs(3);
/// Sessions opened or closed at once while setting up and tearing down.
const SETUP_CONCURRENCY: usize = 256;
/// How long the waiters may take to finish once the flood has stopped.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

/// One grant a waiter saw.
struct Grant {
    lock: usize,
    token: u64,
    granted: Instant,
    /// When its release was sent.
    released: Instant,
}

/// What the flood's unary calls were answered.
#[derive(Default)]
struct Answers {
    ok: AtomicU64,
    overloaded: AtomicU64,
    other: ErrorCounts,
}

impl Answers {
    fn count(&self, answer: Result<(), Error>) {
        match answer {
            Ok(()) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) if err.kind() == ErrorKind::Overloaded => {
                self.overloaded.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) => count_error(&self.other, err),
        }
    }
}

/// Errors by kind.
type ErrorCounts = Mutex<BTreeMap<&'static str, u64>>;

pub(super) async fn overload(endpoints: &Endpoints, args: &BenchArgs) -> anyhow::Result<()> {
    let waiters = args.clients as usize;
    let connections = args.connections.unwrap_or(args.clients).min(args.clients) as usize;
    let rss = Rss::start(args.server_pid);
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(endpoints.connect().await?);
    }
    let probe_client = endpoints.connect().await?;
    let probe = probe_client.open_session(args.ttl).await?;
    println!(
        "overload: {waiters} blocking waiters on {} locks over {connections} connections, \
         {} flooders, {} flood",
        args.locks,
        args.flooders,
        humantime::format_duration(args.duration)
    );
    let before = rss.now();
    let quiet = timed_probe(&probe_client, &probe, &AtomicBool::new(false), QUIET_PHASE).await?;
    quiet.print("before");

    let sessions: Vec<Session> = stream::iter(0..waiters)
        .map(|i| clients[i % connections].open_session(args.ttl))
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect()
        .await?;
    let done = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(ErrorCounts::default());
    let mut waiting = Vec::new();
    for (i, session) in sessions.iter().cloned().enumerate() {
        let (done, errors, lock) = (done.clone(), errors.clone(), i % args.locks);
        waiting.push(tokio::spawn(async move {
            let mut grants = Vec::new();
            let name = lock_name(lock);
            while !done.load(Ordering::Relaxed) {
                match session.lock(&name).await {
                    Ok(guard) => {
                        let (token, granted) = (guard.token(), Instant::now());
                        let released = Instant::now();
                        let answer = guard.release().await;
                        grants.push(Grant {
                            lock,
                            token,
                            granted,
                            released,
                        });
                        answer.map_err(|err| count_error(&errors, err)).ok();
                    }
                    Err(err) => count_error(&errors, err),
                }
            }
            grants
        }));
    }
    let answers = Arc::new(Answers::default());
    let flooders: Vec<_> = (0..args.flooders)
        .map(|i| {
            let (client, done, answers) = (
                clients[i % connections].clone(),
                done.clone(),
                answers.clone(),
            );
            tokio::spawn(async move {
                while !done.load(Ordering::Relaxed) {
                    answers.count(open_and_close(&client).await);
                    answers.count(client.lock_status(&lock_name(0)).await.map(drop));
                }
            })
        })
        .collect();
    let flood_started = Instant::now();
    let flood_peak = rss.peak_from_now();
    let flooded = timed_probe(&probe_client, &probe, &done, args.duration).await?;
    done.store(true, Ordering::Relaxed);
    let flood_took = flood_started.elapsed();
    let peak = flood_peak.finish();
    flooded.print("flood");
    for flooder in flooders {
        flooder.await?;
    }
    let drain_started = Instant::now();
    let mut grants = Vec::new();
    let drained = tokio::time::timeout(DRAIN_LIMIT, async {
        for waiter in waiting {
            grants.extend(waiter.await?);
        }
        Ok::<_, tokio::task::JoinError>(())
    })
    .await;
    let drain = drain_started.elapsed();
    let after = timed_probe(&probe_client, &probe, &AtomicBool::new(false), QUIET_PHASE).await?;
    after.print("after");
    let rest = rss.now();
    match (before, peak, rest) {
        (Some(before), Some(peak), Some(rest)) => println!(
            "  server RSS: before {} MiB, peak during the flood {} MiB, after {} MiB",
            before >> 20,
            peak >> 20,
            rest >> 20
        ),
        _ => println!("  server RSS: not sampled (give --server-pid)"),
    }
    let secs = flood_took.as_secs_f64();
    let (ok, overloaded) = (
        answers.ok.load(Ordering::Relaxed),
        answers.overloaded.load(Ordering::Relaxed),
    );
    println!(
        "  flood calls: {ok} answered ({:.0}/s), {overloaded} refused overloaded ({:.0}/s), other errors {:?}",
        ok as f64 / secs,
        overloaded as f64 / secs,
        answers.other.lock().expect("answers lock poisoned")
    );
    println!(
        "  waiter grants: {} ({:.0}/s), errors {:?}; {}",
        grants.len(),
        grants.len() as f64 / secs,
        errors.lock().expect("errors lock poisoned"),
        match drained {
            Ok(Ok(())) => format!(
                "every waiter's last acquire done {:.1}s after the flood",
                drain.as_secs_f64()
            ),
            Ok(Err(err)) => format!("a waiter failed: {err}"),
            Err(_) => format!("waiters still blocked after {DRAIN_LIMIT:?}"),
        }
    );
    let (unique, overlaps) = check(&grants);
    println!(
        "  tokens unique: {}; each lock's grants, in token order, came after the previous \
         holder's release: {}",
        if unique { "yes" } else { "NO" },
        if overlaps == 0 {
            "yes".to_owned()
        } else {
            format!("NO ({overlaps} overlaps)")
        }
    );
    stream::iter(sessions)
        .for_each_concurrent(SETUP_CONCURRENCY, |session| async move {
            let _ = session.close().await;
        })
        .await;
    probe.close().await?;
    Ok(())
}

fn lock_name(lock: usize) -> String {
    format!("bench:overload:{lock}")
}

fn count_error(errors: &ErrorCounts, err: Error) {
    *errors
        .lock()
        .expect("errors lock poisoned")
        .entry(err.kind().as_str())
        .or_default() += 1;
}

/// A session opened and closed with one plain call each: new work, which
/// an overloaded server refuses.
async fn open_and_close(client: &Client) -> Result<(), Error> {
    let (handle, _) = client.open_session_raw(Duration::from_secs(5)).await?;
    client.close_session_raw(&handle).await
}

/// Whether no token was granted twice, and how many grants arrived before
/// the previous holder of their lock (in token order) had sent its release.
fn check(grants: &[Grant]) -> (bool, usize) {
    let mut seen = HashSet::new();
    let unique = grants.iter().all(|grant| seen.insert(grant.token));
    let mut by_lock: BTreeMap<usize, Vec<&Grant>> = BTreeMap::new();
    for grant in grants {
        by_lock.entry(grant.lock).or_default().push(grant);
    }
    let overlaps = by_lock
        .values_mut()
        .map(|grants| {
            grants.sort_by_key(|grant| grant.token);
            grants
                .windows(2)
                .filter(|pair| pair[1].granted < pair[0].released)
                .count()
        })
        .sum();
    (unique, overlaps)
}

/// The probe's latencies over one phase.
struct Timings {
    acquire: Histogram<u64>,
    health: Histogram<u64>,
    errors: u64,
}

impl Timings {
    fn print(&self, phase: &str) {
        let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "  {phase:>6}: probe acquire p50 {:.2}ms p99 {:.2}ms max {:.2}ms ({} grants); \
             health p50 {:.2}ms p99 {:.2}ms max {:.2}ms ({} calls); {} probe errors",
            ms(&self.acquire, 0.5),
            ms(&self.acquire, 0.99),
            self.acquire.max() as f64 / 1000.0,
            self.acquire.len(),
            ms(&self.health, 0.5),
            ms(&self.health, 0.99),
            self.health.max() as f64 / 1000.0,
            self.health.len(),
            self.errors
        );
    }
}

/// Times the probe's acquire+release on its own lock, back to back, and a
/// health call every 50 ms, for `phase` or until `stop`.
async fn timed_probe(
    client: &Client,
    session: &Session,
    stop: &AtomicBool,
    phase: Duration,
) -> Result<Timings, Error> {
    let until = Instant::now() + phase;
    let running = || Instant::now() < until && !stop.load(Ordering::Relaxed);
    let acquires = async {
        let (mut times, mut errors) = (histogram(), 0);
        while running() {
            let started = Instant::now();
            match session.lock("bench:overload:probe").await {
                Ok(guard) => {
                    times.saturating_record(started.elapsed().as_micros() as u64);
                    guard.release().await?;
                }
                Err(_) => errors += 1,
            }
        }
        Ok::<_, Error>((times, errors))
    };
    let health = async {
        let (mut times, mut errors) = (histogram(), 0);
        while running() {
            let started = Instant::now();
            match client.health().await {
                Ok(_) => times.saturating_record(started.elapsed().as_micros() as u64),
                Err(_) => errors += 1,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (times, errors)
    };
    let (acquires, (health, health_errors)) = futures::future::join(acquires, health).await;
    let (acquire, acquire_errors) = acquires?;
    Ok(Timings {
        acquire,
        health,
        errors: acquire_errors + health_errors,
    })
}

/// The server's resident memory, from `/proc/PID/status`.
struct Rss {
    pid: Option<u32>,
}

/// The highest RSS sampled since [`Rss::peak_from_now`], every 100 ms.
struct Peak {
    peak: Arc<AtomicU64>,
    sampler: Option<tokio::task::JoinHandle<()>>,
}

impl Rss {
    fn start(pid: Option<u32>) -> Rss {
        Rss { pid }
    }

    /// Bytes, if a pid was given and it can be read.
    fn now(&self) -> Option<u64> {
        read_rss(self.pid?)
    }

    fn peak_from_now(&self) -> Peak {
        let peak = Arc::new(AtomicU64::new(0));
        let sampler = self.pid.map(|pid| {
            let peak = peak.clone();
            tokio::spawn(async move {
                loop {
                    if let Some(rss) = read_rss(pid) {
                        peak.fetch_max(rss, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        });
        Peak { peak, sampler }
    }
}

impl Peak {
    fn finish(self) -> Option<u64> {
        let sampler = self.sampler?;
        sampler.abort();
        Some(self.peak.load(Ordering::Relaxed))
    }
}

fn read_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
