//! Clients that run the real Rust client crate (`deadbolt-client`),
//! unchanged, inside the simulated cluster: its session, watchdog, lease
//! deadline, retry rules and leader search, over real gRPC on the simulated
//! network (`wire.rs`), rather than the copy of those rules the other
//! simulated clients carry (`workload.rs`, which reaches further into the
//! API than the crate does: trespasses, every kind of lock).
//!
//! Each does what a careful user of the crate does: open a session, take a
//! lock, increment the fenced store and the resource, release. Now and then
//! it pauses past its lease while it holds the lock, and its whole process
//! stops with it: its connections carry nothing until it resumes, so its
//! watchdog cannot renew. It writes afterwards all the same, so that the
//! fence is put to the test.
//!
//! Its writes are judged twice: by the history checker, like everyone's,
//! and against what the crate told it. A write sent while
//! `Session::is_lost` said the lease held must not be fenced out before the
//! `lease_deadline` the crate gave then: no one else can hold the lock
//! before that (Deadbolt's promise; the checker counts it only while every
//! clock kept within the drift bound). The lease starts the crate counts
//! (its deadline less the TTL) go to the early-expiry check too.

use crate::network::{address, Fabric, Lost};
use crate::workload::{
    now_ns, History, SimResource, Step, ACQUIRE_WAIT, PAUSE_CHANCE, SESSION_TTL,
};
use deadbolt_checker::availability::{Bearing, ClientError, Fault};
use deadbolt_checker::checker::Violation;
use deadbolt_checker::history::{Op, Phase};
use deadbolt_client::{Client, Error, ErrorKind, Session};
use deadbolt_server::embedded::NodeId;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How long a client waits before trying again to connect or to open a
/// session.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

struct RealClient {
    id: usize,
    client: Client,
    rng: StdRng,
    locks: Vec<String>,
    history: History,
    resource: Arc<SimResource>,
    fabric: Arc<Fabric>,
    /// True while this client's process is paused.
    paused: watch::Sender<bool>,
    /// When the faults stop: a pause is one.
    faults_until: Instant,
    /// See `SimOptions::overtrust`.
    overtrust: Duration,
}

/// What the client crate said of its lease just before a write.
#[derive(Clone, Copy)]
struct Belief {
    /// `!Session::is_lost()`.
    held: bool,
    /// `Session::lease_deadline()`, as the history's time (ns).
    deadline_ns: u64,
}

/// Which real clients a run has.
pub struct Roster {
    /// `count` clients, with ids from `first_id` (after the simulation's
    /// own clients).
    pub first_id: usize,
    pub count: usize,
    /// Seeds each client's own random choices.
    pub seed: u64,
    /// See `SimOptions::overtrust`.
    pub overtrust: Duration,
}

/// Starts the `roster`'s real clients on the plain locks among `locks`
/// (the crate's `lock`).
pub fn spawn(
    Roster {
        first_id,
        count,
        seed,
        overtrust,
    }: Roster,
    locks: &[String],
    fabric: &Arc<Fabric>,
    nodes: &[NodeId],
    history: &History,
    resource: &Arc<SimResource>,
    schedule: &crate::workload::Schedule,
) -> Vec<tokio::task::JoinHandle<()>> {
    let locks: Vec<String> = locks
        .iter()
        .filter(|name| name.starts_with(crate::LOCK_PREFIX))
        .cloned()
        .collect();
    let endpoints: Vec<String> = nodes.iter().map(|&id| address(id)).collect();
    (first_id..first_id + count)
        .map(|id| {
            let (paused, paused_rx) = watch::channel(false);
            let dial = crate::wire::dial(fabric.clone(), paused_rx);
            let endpoints = endpoints.clone();
            let mut stop = schedule.stop.clone();
            let (history, resource, fabric) = (history.clone(), resource.clone(), fabric.clone());
            let (locks, faults_until) = (locks.clone(), schedule.faults_until);
            let mut rng = StdRng::seed_from_u64(seed ^ (id as u64 + 1).wrapping_mul(0x2545_f491));
            // Half the clients send their calls over the gRPC stream, half
            // as framed calls (which a follower refuses, and then gRPC).
            let over_grpc = rng.gen_bool(0.5);
            tokio::spawn(async move {
                let client = loop {
                    if *stop.borrow_and_update() {
                        return;
                    }
                    match Client::connect_through(endpoints.clone(), dial.clone()).await {
                        Ok(client) if over_grpc => {
                            client.prefer_grpc_calls();
                            break client;
                        }
                        Ok(client) => break client,
                        Err(_) => tokio::time::sleep(RETRY_PAUSE).await,
                    }
                };
                let real = RealClient {
                    id,
                    client,
                    rng,
                    locks,
                    history,
                    resource,
                    fabric,
                    paused,
                    faults_until,
                    overtrust,
                };
                real.run(stop).await;
            })
        })
        .collect()
}

impl RealClient {
    /// Rounds until `stop`, each session until it is in doubt.
    async fn run(mut self, stop: watch::Receiver<bool>) {
        if self.locks.is_empty() {
            return;
        }
        while !*stop.borrow() {
            let session = match self.client.open_session(SESSION_TTL).await {
                Ok(session) => session,
                Err(error) => {
                    self.client_error("open_session", &error, None);
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
            };
            self.note_lease(&session);
            while !*stop.borrow() && self.round(&session).await {}
            // Its locks go with it (or with its lease, if this is lost).
            let _ = session.close().await;
        }
    }

    /// Records the lease start the crate counts from: its deadline less
    /// the TTL, the send time of the last renewal it saw acknowledged.
    fn note_lease(&self, session: &Session) {
        let deadline_ns = crate::history_time(session.lease_deadline());
        let start_ns = deadline_ns.saturating_sub(session.ttl().as_nanos() as u64);
        self.history.lease_renewed(session.id(), start_ns);
    }

    /// Lock, two increments, release. False once the session is in doubt.
    async fn round(&mut self, session: &Session) -> bool {
        let lock = self
            .locks
            .choose(&mut self.rng)
            .expect("at least one lock")
            .clone();
        let mut acquire = Step::begin(&self.history, self.id, Op::Acquire, &lock, None);
        let guard = match session.lock_timeout(&lock, ACQUIRE_WAIT).await {
            Ok(guard) => guard,
            Err(error) => {
                self.client_error("acquire", &error, Some(session));
                let waited = matches!(error.kind(), ErrorKind::WaitTimeout | ErrorKind::Busy);
                let phase = if waited { Phase::Fail } else { Phase::Info };
                acquire.record(phase, None, Some(error.to_string()));
                return waited && !session.is_lost();
            }
        };
        let token = guard.token();
        acquire.token = Some(token);
        acquire.ok(None);
        self.note_lease(session);

        if Instant::now() < self.faults_until && self.rng.gen_bool(PAUSE_CHANCE) {
            let pause = SESSION_TTL.mul_f64(self.rng.gen_range(1.5..3.0));
            let from = now_ns();
            self.paused.send_replace(true);
            tokio::time::sleep(pause).await;
            self.paused.send_replace(false);
            // Its lease is rightly gone: its own errors for a while after
            // are no outage.
            self.history.fault(Fault {
                from,
                to: now_ns(),
                what: format!("client {} paused for {pause:?}", self.id),
                bearing: Bearing::Client {
                    client: self.id,
                    grace: (SESSION_TTL * 2).as_nanos() as u64,
                },
            });
        }

        self.store_increment(session, &lock, token).await;
        self.resource_increment(session, &lock, token).await;
        self.note_lease(session);

        let release = Step::begin(&self.history, self.id, Op::Release, &lock, Some(token));
        match guard.release().await {
            Ok(()) => {
                release.ok(None);
                true
            }
            Err(error) => {
                self.client_error("release", &error, Some(session));
                release.record(phase(&error), None, Some(error.to_string()));
                false
            }
        }
    }

    /// A fenced read, then a put of the value + 1 fenced by the lock.
    async fn store_increment(&mut self, session: &Session, lock: &str, token: u64) {
        let step = Step::begin(
            &self.history,
            self.id,
            Op::StoreIncrement,
            lock,
            Some(token),
        );
        let key = format!("counter:{lock}");
        let current = match self.client.store_get(&key, Some((token, Some(lock)))).await {
            // A read changes no counter: the increment did not happen.
            Err(error) => {
                self.client_error("store_get", &error, Some(session));
                return step.refused(error.to_string());
            }
            Ok(stored) => stored
                .value
                .map_or(0, |value| value.parse().expect("counters are numbers")),
        };
        let next = current + 1;
        let written = self
            .client
            .store_put(&key, &next.to_string(), token, Some(lock))
            .await;
        match written {
            Ok(_) => step.ok(Some(next)),
            Err(error) => {
                self.client_error("store_put", &error, Some(session));
                step.record(phase(&error), Some(next), Some(error.to_string()));
            }
        }
    }

    /// Writes down an error the client crate returned, for the run's
    /// availability check (`session`: the one the call was made on).
    fn client_error(&self, call: &str, error: &Error, session: Option<&Session>) {
        self.history.client_error(ClientError {
            at: now_ns(),
            client: self.id,
            call: call.to_owned(),
            kind: error.kind().as_str().to_owned(),
            message: error.to_string(),
            lease_lost: session.is_some_and(Session::is_lost),
            outcome_unknown: error.outcome_unknown(),
        });
    }

    /// The same on the resource, across the simulated network, judging
    /// each refusal against what the crate said of the lease.
    async fn resource_increment(&mut self, session: &Session, lock: &str, token: u64) {
        let step = Step::begin(
            &self.history,
            self.id,
            Op::ResourceIncrement,
            lock,
            Some(token),
        );
        let deadline = session.lease_deadline() + self.overtrust;
        let belief = Belief {
            held: if self.overtrust.is_zero() {
                !session.is_lost()
            } else {
                tokio::time::Instant::now().into_std() < deadline
            },
            deadline_ns: crate::history_time(deadline),
        };
        let resource = self.resource.clone();
        let read = self
            .fabric
            .reach(|| (resource.read(lock, token), now_ns()))
            .await;
        let current = match read {
            Ok((Ok(value), _)) => value,
            Ok((Err(stale), arrived)) => {
                self.judge(belief, lock, token, arrived, &stale);
                return step.refused(stale);
            }
            Err(lost) => return step.refused(format!("read: {lost:?}")),
        };
        let next = current + 1;
        let written = self
            .fabric
            .reach(|| (resource.write(lock, token, next), now_ns()))
            .await;
        match written {
            Ok((Ok(()), _)) => step.ok(Some(next)),
            Ok((Err(stale), arrived)) => {
                self.judge(belief, lock, token, arrived, &stale);
                step.record(Phase::Fail, Some(next), Some(stale));
            }
            Err(Lost::Refused) => step.record(Phase::Fail, Some(next), Some("refused".into())),
            Err(Lost::NoAnswer) => step.record(Phase::Info, Some(next), Some("no answer".into())),
        }
    }

    /// A request fenced out at `arrived_ns`: an overlap if the crate said
    /// the lease held, until later than that.
    fn judge(&self, belief: Belief, lock: &str, token: u64, arrived_ns: u64, stale: &str) {
        if belief.held && arrived_ns < belief.deadline_ns {
            self.history.overlapped(Violation {
                what: format!(
                    "two holders at once: real client {} sent a request with token {token} on \
                     {lock} while the client crate said its lease held until {} ms, and the \
                     resource fenced it out at {} ms ({stale}), so a later holder had come \
                     before that deadline",
                    self.id,
                    belief.deadline_ns / 1_000_000,
                    arrived_ns / 1_000_000,
                ),
                records: Vec::new(),
            });
        }
    }
}

/// How a failed call ends in the history: a refusal had no effect; a call
/// that got no answer, or whose server could not finish it, may have.
fn phase(error: &Error) -> Phase {
    match error.kind() {
        ErrorKind::Unavailable | ErrorKind::Internal | ErrorKind::Overloaded => Phase::Info,
        _ => Phase::Fail,
    }
}
