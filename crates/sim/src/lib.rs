//! Deterministic simulation of a whole Deadbolt cluster in one process.
//!
//! A run is one seed. Everything in it, the Raft nodes (openraft, our
//! storage on simulated disks, the state machine, proposer and leases), the
//! network between them, the clients and the fenced resource, runs as tasks
//! on one thread, on tokio's paused clock: time only moves when every task
//! waits, and then jumps to the next timer. Every random choice (faults,
//! message delays and losses, clients' choices, openraft's election timeouts,
//! data directories' instance ids, tokio's `select!` fairness) is drawn from
//! the seed, and nothing depends on the order of a `HashMap` (redb's page
//! writes are one: see `disk.rs`), so a seed replays the same run exactly;
//! [`SeedReport::digest`] proves it.
//!
//! The history the clients record is judged by the same checker as the
//! fault-injection suite on real processes (`deadbolt_checker::checker`);
//! an operator changing the table's limits meanwhile is checked on its own
//! (`operator.rs`).

mod cluster;
mod disk;
mod faults;
mod network;
mod operator;
mod real_client;
mod wire;
mod workload;

#[cfg(not(tokio_unstable))]
compile_error!(
    "the simulation needs tokio's seeded scheduler: build with RUSTFLAGS=\"--cfg tokio_unstable\" \
     (the workspace's .cargo/config.toml sets it)"
);

use cluster::SimCluster;
use deadbolt_checker::availability;
use deadbolt_checker::checker::{check, Finals, Violation};
use deadbolt_checker::history::{Accepted, Op, Phase, Record};
use deadbolt_checker::linearizable::check_linearizable;
use deadbolt_proto::v1::{LockHistoryRequest, StoreGetRequest};
use deadbolt_server::embedded::{seed_node_rng, SecretSource};
use network::Fabric;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;
use tokio::time::Instant;
use workload::{History, Router, SimResource};

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// How long faults are injected, in simulated time.
    pub fault_time: Duration,
    /// `false` removes the resource's fence: the checker must then find the
    /// stale writes it would have refused.
    pub fenced_resource: bool,
    /// `false` leaves out the clients that run the real client crate
    /// (`real_client.rs`), so that a seed found before they joined the runs
    /// replays as it ran then (unless a node paused in it: pauses stop a
    /// node's timers since the same day): their draws come from a stream of
    /// their own, and without them nothing else moves.
    pub real_clients: bool,
    /// Added to every lease deadline the client crate gives the real
    /// clients, as a crate that counted its lease from the server's answer
    /// rather than from its request would: the run must then find two
    /// holders at once. Zero in every honest run.
    pub overtrust: Duration,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            fault_time: Duration::from_secs(20),
            fenced_resource: true,
            real_clients: true,
            overtrust: Duration::ZERO,
        }
    }
}

/// Mixed into the seed for the session secrets' random stream.
const SECRETS_STREAM: u64 = 0x5ec2_e75e_c2e7_5ec2;
/// Mixed into the seed for the real clients' random streams (their number,
/// their choices, the client crate's retry jitter).
const REAL_CLIENTS_STREAM: u64 = 0xc11e_a7c1_1ea7_c11e;
/// The names of a run's plain locks (the others are semaphores and
/// read/write locks, by their own prefixes), which the real clients take.
const LOCK_PREFIX: &str = "lock-";

/// After the faults stop, every lock must see a complete round within this.
const LIVENESS_BOUND: Duration = Duration::from_secs(10);
/// The longest time without any grant after a fault that left a majority
/// up. Longer than the nemesis's 5 s `--max-gap`, because here every lock
/// may be held by a holder the fault cut off or a client paused, and a new
/// leader restarts each lease in full (the 2 s `SESSION_TTL`), after an
/// election that a partition with a bridging node (five nodes) can drag
/// out. Over 300 seeds on 2026-12-07 the longest such gap was 7.5 s (the
/// bridge), the median of each seed's longest about 1.1-3.5 s; a leader
/// that never serves again would stand out.
const MAX_GAP: Duration = Duration::from_secs(10);
/// How long clients go on after the faults stop.
const CALM_TIME: Duration = Duration::from_secs(12);
/// How far past their time the faults may run (a membership change waits
/// up to a minute for a healthy cluster, twice in a rebuild) before the
/// seed counts as hung. Without it a call that never returns kept a seed
/// running, unreported, until memory ran out (seed 1,011,477: 5.8 GB when
/// the soak was stopped; with the hang put back and a 300 s bound it ended
/// with this violation, after peaking at 13.5 GB: a run that goes on grows
/// fast, so the bound is no longer than it needs to be).
const FAULT_OVERRUN: Duration = Duration::from_secs(150);

/// The outcome of one seed.
#[derive(Debug)]
pub struct SeedReport {
    pub seed: u64,
    pub nodes: u64,
    pub clients: usize,
    /// How many of the clients (the last ones) run the real client crate.
    pub real_clients: usize,
    pub ops: usize,
    pub faults: u64,
    pub violations: Vec<Violation>,
    /// The faults, with their simulated times.
    pub fault_log: Vec<String>,
    pub history: Vec<Record>,
    /// A hash of the history, of every write the resource accepted, of the
    /// fault log and of every disk a crash left: two runs of one seed have
    /// the same digest.
    pub digest: u64,
    /// Simulated time the run took.
    pub simulated: Duration,
    /// Whether the lease timing was checked (every clock stayed within the
    /// drift bound).
    pub leases_checked: bool,
    /// The real clients' errors while a majority was up, and the longest
    /// time without a grant after each fault that left one (issue 59).
    pub served: availability::Report,
}

thread_local! {
    static START: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Simulated time since the current run began (on the thread running it).
pub fn elapsed() -> Duration {
    START.with(|start| start.get().map_or(Duration::ZERO, |start| start.elapsed()))
}

/// An instant on the run's clock as the history's time: ns since the run
/// began.
pub(crate) fn history_time(at: std::time::Instant) -> u64 {
    START.with(|start| {
        start.get().map_or(0, |start| {
            Instant::from_std(at)
                .saturating_duration_since(start)
                .as_nanos() as u64
        })
    })
}

/// Runs one seed to the end, on the calling thread.
pub fn simulate(seed: u64, options: &SimOptions) -> SeedReport {
    seed_node_rng(seed);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()))
        .build()
        .expect("cannot build the simulation runtime");
    let report = runtime.block_on(async {
        deadbolt_client::simulation::enter(seed ^ REAL_CLIENTS_STREAM);
        run(seed, options).await
    });
    deadbolt_client::simulation::leave();
    report
}

async fn run(seed: u64, options: &SimOptions) -> SeedReport {
    START.with(|start| start.set(Some(Instant::now())));
    let mut rng = StdRng::seed_from_u64(seed);
    let nodes = if rng.gen_bool(0.5) { 3 } else { 5 };
    let fabric = Fabric::new(StdRng::seed_from_u64(rng.gen()));
    // Half the runs keep every clock within the drift bound, so that the
    // lease timing can be checked.
    let clock_faults = rng.gen_bool(0.5);
    // Session secrets from a stream of their own, so that drawing them
    // moves no other random choice.
    let secrets = SecretSource::seeded(seed ^ SECRETS_STREAM);
    let mut cluster = SimCluster::form(
        nodes,
        clock_faults,
        fabric.clone(),
        secrets,
        options.real_clients,
    )
    .await
    .expect("a new simulated cluster forms");
    let mut locks: Vec<String> = (0..rng.gen_range(1..=3))
        .map(|i| format!("{LOCK_PREFIX}{i}"))
        .collect();
    if rng.gen_bool(0.5) {
        locks.push(format!("{}0", workload::SEMAPHORE_PREFIX));
    }
    if rng.gen_bool(0.5) {
        locks.push(format!("{}0", workload::RW_PREFIX));
    }
    if rng.gen_bool(0.5) {
        locks.push(format!("{}0", workload::ELECTION_PREFIX));
    }
    let clients = rng.gen_range(3..=8);
    let history = History::default();
    let resource = std::sync::Arc::new(SimResource::new(options.fenced_resource));
    let mut router = Router::new(fabric.clone(), cluster.ids(), 1);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let initial_limits = router
        .send(|api, _| async move { Ok(api.limits()) })
        .await
        .ok()
        .and_then(|answer| answer.limits);
    let (operator, attempts) = operator::spawn(&router, seed, stopped.clone());
    let until = Instant::now() + options.fault_time;
    let workers = workload::spawn_clients(
        clients,
        &locks,
        &router,
        &history,
        &resource,
        rng.gen(),
        &workload::Schedule {
            faults_until: until,
            stop: stopped.clone(),
        },
    );

    // From a stream of their own, like the secrets.
    let mut real_rng = StdRng::seed_from_u64(seed ^ REAL_CLIENTS_STREAM);
    let real_clients = if options.real_clients {
        real_rng.gen_range(1..=2)
    } else {
        0
    };
    let workers = workers
        .into_iter()
        .chain(real_client::spawn(
            real_client::Roster {
                first_id: clients,
                count: real_clients,
                seed: real_rng.gen(),
                overtrust: options.overtrust,
            },
            &locks,
            &fabric,
            &cluster.ids(),
            &history,
            &resource,
            &workload::Schedule {
                faults_until: until,
                stop: stopped.clone(),
            },
        ))
        .collect::<Vec<_>>();

    let mut fault_log = Vec::new();
    let mut violations = Vec::new();
    let mut nemesis_router = Router::new(fabric.clone(), cluster.ids(), 1);
    let injected = tokio::time::timeout(
        options.fault_time + FAULT_OVERRUN,
        faults::inject(
            &mut cluster,
            &mut nemesis_router,
            &mut rng,
            until,
            &mut fault_log,
            &history,
        ),
    )
    .await
    .unwrap_or_else(|_| {
        Err(format!(
            "the faults did not end within {FAULT_OVERRUN:?} of their time: something a fault \
             waits on never answered (the fault log's last line says what)"
        ))
    });
    let faults = match injected {
        Ok(faults) => faults,
        Err(finding) => {
            violations.push(Violation {
                what: finding,
                records: Vec::new(),
            });
            0
        }
    };
    cluster.fabric.heal();
    let healed_at = elapsed().as_nanos() as u64;
    tokio::time::sleep(CALM_TIME).await;
    let _ = stop.send(true);
    for worker in workers {
        // A client blocked in a long call is abandoned: its last
        // operation counts as unknown.
        if tokio::time::timeout(Duration::from_secs(10), worker)
            .await
            .is_err()
        {
            continue;
        }
    }
    // A change still in flight stays unknown.
    let _ = tokio::time::timeout(Duration::from_secs(10), operator).await;
    let attempts = std::mem::take(&mut *attempts.lock().expect("attempts lock"));
    fault_log.extend(
        attempts
            .iter()
            .map(|attempt| format!("operator: {attempt}")),
    );
    let last_limits = router
        .send(|api, _| async move { Ok(api.limits()) })
        .await
        .ok()
        .and_then(|answer| answer.limits);
    match (initial_limits, last_limits) {
        (Some(initial), Some(last)) => {
            violations.extend(operator::check(&attempts, &initial, &last));
        }
        (initial, last) => violations.push(Violation {
            what: format!(
                "the cluster did not answer a limits read: {initial:?} at the start, {last:?} at \
                 the end"
            ),
            records: Vec::new(),
        }),
    }

    let (resource_counters, accepted) = resource.finals();
    let mut finals = Finals {
        store: BTreeMap::new(),
        resource: BTreeMap::new(),
        audit: BTreeMap::new(),
        semaphores: locks
            .iter()
            .filter(|name| name.starts_with(workload::SEMAPHORE_PREFIX))
            .map(|name| (name.clone(), workload::SEMAPHORE_PERMITS))
            .collect(),
    };
    for lock in &locks {
        let key = format!("counter:{lock}");
        let read = router
            .send(|api, credentials| {
                let key = key.clone();
                async move {
                    api.store_get(
                        &credentials,
                        StoreGetRequest {
                            key,
                            token: None,
                            lock: None,
                        },
                    )
                    .await
                }
            })
            .await;
        let trail = router
            .send(|api, credentials| {
                let lock = lock.clone();
                async move {
                    api.lock_history(&credentials, LockHistoryRequest { lock })
                        .await
                }
            })
            .await;
        match (read, trail) {
            (Ok(read), Ok(trail)) => {
                let value = if read.found {
                    read.value.parse().expect("counters are numbers")
                } else {
                    0
                };
                finals.store.insert(lock.clone(), value);
                finals.audit.insert(lock.clone(), trail.entries);
            }
            (read, trail) => violations.push(Violation {
                what: format!(
                    "the healed cluster did not answer final reads of {lock}: {read:?} {trail:?}"
                ),
                records: Vec::new(),
            }),
        }
        let value = resource_counters.get(lock).copied().unwrap_or(0);
        finals.resource.insert(lock.clone(), value);
    }
    cluster.shut_down().await;
    let crashed_disks = cluster.crash_digest();
    let leases_checked = !cluster.clock_faulted;
    if leases_checked {
        violations.extend(early_expiries(&finals.audit, &history.lease_starts()));
        violations.extend(history.take_overlaps());
    }

    violations.extend(sessions_called_unknown_then_served(&history.sessions()));

    let records = history.records();
    violations.extend(check(
        &records,
        &accepted,
        &finals,
        healed_at,
        LIVENESS_BOUND.as_nanos() as u64,
    ));
    violations.extend(check_linearizable(&records, &finals));
    let grants: Vec<u64> = records
        .iter()
        .filter(|record| record.op == Op::Acquire && record.phase == Phase::Ok)
        .map(|record| record.at)
        .collect();
    let (errors, fault_spans) = history.availability();
    let (served, unserved) =
        availability::check(&errors, &grants, &fault_spans, MAX_GAP.as_nanos() as u64);
    violations.extend(unserved);
    SeedReport {
        seed,
        nodes,
        clients: clients + real_clients,
        real_clients,
        ops: records.len() / 2,
        faults,
        violations,
        digest: digest(&records, &accepted, &fault_log, crashed_disks),
        fault_log,
        history: records,
        simulated: elapsed(),
        leases_checked,
        served,
    }
}

/// Leases that ended early: a holder's expiry in the audit trail, proposed
/// less than a TTL after the client sent its last acknowledged keepalive.
/// The TTL is the leader's, so true time may be shorter by the drift bound;
/// runs where a clock strayed further are not checked.
fn early_expiries(
    audit: &BTreeMap<String, Vec<deadbolt_proto::v1::AuditEntry>>,
    lease_starts: &BTreeMap<u64, u64>,
) -> Vec<Violation> {
    // Audit stamps are whole milliseconds of a clock started on a whole
    // millisecond, and drift within the bound adds well under one more.
    const STAMP_SLACK_MS: u64 = 3;
    let ttl = workload::SESSION_TTL;
    let ttl_ms = ttl.div_f64(1.0 + cluster::CLOCK_DRIFT_BOUND).as_millis() as u64;
    let mut early = Vec::new();
    for (lock, trail) in audit {
        for entry in trail.iter().filter(|entry| entry.what == "expired") {
            let Some(&start_ns) = lease_starts.get(&entry.session_id) else {
                continue;
            };
            let expired_ms = entry.at_ms.saturating_sub(cluster::EPOCH_MS);
            let earliest_ms = start_ns / 1_000_000 + ttl_ms;
            if expired_ms + STAMP_SLACK_MS < earliest_ms {
                early.push(Violation {
                    what: format!(
                        "session {} lost {lock} to expiry at {expired_ms} ms, before its TTL ran out \
                         ({earliest_ms} ms: the {ttl:?} TTL by a clock at most {}% fast, after its \
                         last acknowledged keepalive was sent)",
                        entry.session_id,
                        cluster::CLOCK_DRIFT_BOUND * 100.0
                    ),
                    records: vec![format!("{entry:?}")],
                });
            }
        }
    }
    early
}

/// Sessions the service called unknown, then served a call on that was
/// sent after: the refusal was false. An acquire refused so may have been
/// granted (a nemesis run saw its permit handed back later with its old
/// token: a leader restarted within its term read from a half-replayed
/// state).
fn sessions_called_unknown_then_served(
    sessions: &BTreeMap<u64, workload::SessionAnswers>,
) -> Vec<Violation> {
    sessions
        .iter()
        .filter_map(|(session, answers)| {
            let unknown = answers.called_unknown?;
            let served = answers.served.filter(|served| *served > unknown)?;
            Some(Violation {
                what: format!(
                    "session {session} was called unknown at {} ms, then a call on it sent at \
                     {} ms succeeded",
                    unknown / 1_000_000,
                    served / 1_000_000
                ),
                records: vec![format!("{answers:?}")],
            })
        })
        .collect()
}

fn digest(
    records: &[Record],
    accepted: &[Accepted],
    fault_log: &[String],
    crashed_disks: u64,
) -> u64 {
    let mut hasher = DefaultHasher::new();
    fault_log.hash(&mut hasher);
    crashed_disks.hash(&mut hasher);
    for record in records {
        serde_json::to_string(record)
            .expect("serializable")
            .hash(&mut hasher);
    }
    for write in accepted {
        serde_json::to_string(write)
            .expect("serializable")
            .hash(&mut hasher);
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use workload::SessionAnswers;

    fn answers(called_unknown: Option<u64>, served: Option<u64>) -> SessionAnswers {
        SessionAnswers {
            called_unknown,
            served,
        }
    }

    #[test]
    fn a_session_served_after_it_was_called_unknown_is_a_violation() {
        let sessions = BTreeMap::from([
            // Called unknown, then renewed by a keepalive sent after.
            (15, answers(Some(2_000_000_000), Some(2_500_000_000))),
            // Served before it was called unknown: the usual end.
            (16, answers(Some(3_000_000_000), Some(2_900_000_000))),
            // Never called unknown.
            (17, answers(None, Some(4_000_000_000))),
        ]);
        let violations = sessions_called_unknown_then_served(&sessions);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0]
                .what
                .starts_with("session 15 was called unknown at 2000 ms"),
            "{violations:?}"
        );
    }
}
