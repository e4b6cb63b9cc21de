//! The clients of a simulated run and the resource they protect.
//!
//! Each client does what a `deadbolt-nemesis worker` process does: take a
//! lock, increment a counter in Deadbolt's fenced store and one on the
//! [`SimResource`] (fenced with `deadbolt_fence`), release; every operation
//! goes into the history the checker reads. Now and then a client pauses
//! while holding its lock for longer than its lease (a GC pause, the seeds'
//! scenario), keepalives included, and writes with its old token afterwards;
//! only while the faults last, as a pause is one.
//!
//! Its length (about 860 lines) is the simulated client's one round, every
//! kind of grant and trespass it tries, and the step recording each: they
//! share the round's state, and split apart each would need all of it.

use crate::network::{node_at, Fabric, Lost, Sender};
use deadbolt_checker::availability::{ClientError, Fault};
use deadbolt_checker::checker::Violation;
use deadbolt_checker::history::{Accepted, Op, Phase, Record};
use deadbolt_fence::FenceGates;
use deadbolt_proto::v1::{
    AcquirePermitsRequest, AcquireRequest, CampaignRequest, CloseSessionRequest, KeepAliveRequest,
    OpenSessionRequest, ReleaseRequest, StoreGetRequest, StorePutRequest,
};
use deadbolt_proto::ErrorKind;
use deadbolt_server::embedded::{Api, ApiError, Credentials, NodeId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// A client's lease.
pub const SESSION_TTL: Duration = Duration::from_secs(2);
/// How long an acquire waits on the server.
pub(crate) const ACQUIRE_WAIT: Duration = Duration::from_secs(2);
/// How long a client looks for the leader before it gives up on a request
/// (as the real client's `LEADER_SEARCH`).
const LEADER_SEARCH: Duration = Duration::from_secs(2);
const ELECTION_PAUSE: Duration = Duration::from_millis(50);
/// The chance that a client pauses after taking a lock.
pub(crate) const PAUSE_CHANCE: f64 = 0.03;
/// Names with this prefix are semaphores of [`SEMAPHORE_PERMITS`]
/// permits, taken one at a time; the others are locks.
pub const SEMAPHORE_PREFIX: &str = "semaphore-";
pub const SEMAPHORE_PERMITS: u32 = 2;
/// Names with this prefix are read/write locks: clients with an even id
/// take them exclusive (and increment, as for a lock), the others shared
/// (and only hold them: a shared holder may not write).
pub const RW_PREFIX: &str = "rw-";
/// Names with this prefix are elections: a round campaigns, and its leader
/// increments as a lock's holder does.
pub const ELECTION_PREFIX: &str = "election-";

/// The history of a run, in the order things happened, and when each
/// session's lease last (re)started by its client's account.
#[derive(Clone, Default)]
pub struct History {
    records: Arc<Mutex<Vec<Record>>>,
    lease_starts: Arc<Mutex<BTreeMap<u64, u64>>>,
    sessions: Arc<Mutex<BTreeMap<u64, SessionAnswers>>>,
    /// Writes the resource refused as stale although the client library
    /// said, as they were sent, that their lease lasted past their arrival
    /// (see `real_client.rs`): two holders inside their windows at once.
    overlaps: Arc<Mutex<Vec<Violation>>>,
    /// The errors the real clients' library returned, and the faults that
    /// may excuse them: the run's availability check (issue 59).
    client_errors: Arc<Mutex<Vec<ClientError>>>,
    faults: Arc<Mutex<Vec<Fault>>>,
}

/// What the service said of one session: a call on a session it once
/// called unknown (closed, expired, never opened) can never succeed again.
#[derive(Clone, Copy, Debug, Default)]
pub struct SessionAnswers {
    /// When the first refusal naming the session unknown came (ns).
    pub called_unknown: Option<u64>,
    /// When the latest call on it that succeeded was sent (ns).
    pub served: Option<u64>,
}

impl History {
    pub(crate) fn push(&self, record: Record) {
        self.records.lock().expect("history poisoned").push(record);
    }

    pub fn records(&self) -> Vec<Record> {
        self.records.lock().expect("history poisoned").clone()
    }

    /// The open or keepalive of `session` sent at `sent_ns` was
    /// acknowledged: its lease runs at least a TTL from then.
    pub(crate) fn lease_renewed(&self, session: u64, sent_ns: u64) {
        let mut starts = self.lease_starts.lock().expect("history poisoned");
        let start = starts.entry(session).or_default();
        *start = (*start).max(sent_ns);
        drop(starts);
        self.served(session, sent_ns);
    }

    /// A call on `session` sent at `sent_ns` succeeded.
    fn served(&self, session: u64, sent_ns: u64) {
        let mut sessions = self.sessions.lock().expect("history poisoned");
        let answers = sessions.entry(session).or_default();
        answers.served = answers.served.max(Some(sent_ns));
    }

    /// A call on `session` was refused as on an unknown session, answered
    /// at `answered_ns`.
    fn called_unknown(&self, session: u64, answered_ns: u64) {
        let mut sessions = self.sessions.lock().expect("history poisoned");
        let answers = sessions.entry(session).or_default();
        answers.called_unknown = Some(
            answers
                .called_unknown
                .unwrap_or(answered_ns)
                .min(answered_ns),
        );
    }

    pub(crate) fn overlapped(&self, overlap: Violation) {
        self.overlaps
            .lock()
            .expect("history poisoned")
            .push(overlap);
    }

    /// Takes what [`History::overlapped`] collected; they count only if
    /// every clock kept within the drift bound.
    pub fn take_overlaps(&self) -> Vec<Violation> {
        std::mem::take(&mut *self.overlaps.lock().expect("history poisoned"))
    }

    /// Each session's answers.
    pub fn sessions(&self) -> BTreeMap<u64, SessionAnswers> {
        self.sessions.lock().expect("history poisoned").clone()
    }

    /// Each session's latest acknowledged lease start (send time, ns).
    pub fn lease_starts(&self) -> BTreeMap<u64, u64> {
        self.lease_starts.lock().expect("history poisoned").clone()
    }

    /// An error a real client's library returned.
    pub(crate) fn client_error(&self, error: ClientError) {
        self.client_errors
            .lock()
            .expect("history poisoned")
            .push(error);
    }

    /// A fault, once it is over.
    pub(crate) fn fault(&self, fault: Fault) {
        self.faults.lock().expect("history poisoned").push(fault);
    }

    /// What [`client_error`](Self::client_error) and
    /// [`fault`](Self::fault) collected.
    pub fn availability(&self) -> (Vec<ClientError>, Vec<Fault>) {
        let errors = self.client_errors.lock().expect("history poisoned").clone();
        let faults = self.faults.lock().expect("history poisoned").clone();
        (errors, faults)
    }
}

/// Simulated time since the run began, in nanoseconds: the history's clock.
pub(crate) fn now_ns() -> u64 {
    crate::elapsed().as_nanos() as u64
}

/// A counter per lock behind a fence per lock, like the
/// `deadbolt-nemesis resource` process. `fenced: false` removes the fence,
/// to show that the checker catches what the fence prevents.
pub struct SimResource {
    gates: FenceGates<String>,
    fenced: bool,
    counters: Mutex<BTreeMap<String, u64>>,
    accepted: Mutex<Vec<Accepted>>,
}

impl SimResource {
    pub fn new(fenced: bool) -> Self {
        SimResource {
            gates: FenceGates::new(),
            fenced,
            counters: Mutex::default(),
            accepted: Mutex::default(),
        }
    }

    fn value(&self, lock: &str) -> u64 {
        let counters = self.counters.lock().expect("resource poisoned");
        counters.get(lock).copied().unwrap_or(0)
    }

    /// A fenced read: raises the lock's fence to `token`.
    pub(crate) fn read(&self, lock: &str, token: u64) -> Result<u64, String> {
        if self.fenced {
            self.gates
                .admit(lock, token)
                .map_err(|stale| stale.to_string())?;
        }
        Ok(self.value(lock))
    }

    pub(crate) fn write(&self, lock: &str, token: u64, value: u64) -> Result<(), String> {
        let store = || {
            self.counters
                .lock()
                .expect("resource poisoned")
                .insert(lock.to_owned(), value);
            self.accepted
                .lock()
                .expect("resource poisoned")
                .push(Accepted {
                    at: now_ns(),
                    lock: lock.to_owned(),
                    token,
                    value,
                });
        };
        if !self.fenced {
            store();
            return Ok(());
        }
        let gate = self.gates.gate(lock);
        gate.admit_with(token, store)
            .map_err(|stale| stale.to_string())
    }

    pub fn finals(&self) -> (BTreeMap<String, u64>, Vec<Accepted>) {
        (
            self.counters.lock().expect("resource poisoned").clone(),
            self.accepted.lock().expect("resource poisoned").clone(),
        )
    }
}

/// Why a request failed.
#[derive(Debug)]
pub enum Failure {
    /// It certainly took no effect.
    Refused(ApiError),
    /// It may have taken effect.
    Unknown(String),
}

impl Failure {
    fn kind(&self) -> Option<ErrorKind> {
        match self {
            Failure::Refused(err) => Some(err.kind),
            Failure::Unknown(_) => None,
        }
    }

    fn phase(&self) -> Phase {
        match self {
            Failure::Refused(_) => Phase::Fail,
            Failure::Unknown(_) => Phase::Info,
        }
    }

    fn message(&self) -> String {
        match self {
            Failure::Refused(err) => err.message.clone(),
            Failure::Unknown(why) => format!("unknown outcome: {why}"),
        }
    }
}

/// Finds the leader for a client, as the real client does: on "not
/// leader" or a refused connection (which certainly had no effect) it tries
/// the leader named, or the next node.
#[derive(Clone)]
pub struct Router {
    fabric: Arc<Fabric>,
    nodes: Vec<NodeId>,
    target: NodeId,
    /// Who the requests come from (see `Router::as_identity`).
    credentials: Arc<Credentials>,
}

impl Router {
    pub fn new(fabric: Arc<Fabric>, nodes: Vec<NodeId>, first: NodeId) -> Self {
        Router {
            fabric,
            nodes,
            target: first,
            credentials: Arc::new(Credentials::ANONYMOUS),
        }
    }

    /// This router, sending as a client whose certificate names
    /// `identity`: the sessions it opens belong to that identity.
    pub fn as_identity(&self, identity: &str) -> Router {
        Router {
            credentials: Arc::new(Credentials::certificate(identity)),
            ..self.clone()
        }
    }

    fn next_node(&mut self) {
        let at = self.nodes.iter().position(|&id| id == self.target);
        self.target = self.nodes[at.map_or(0, |at| (at + 1) % self.nodes.len())];
    }

    pub async fn send<T, Fut>(
        &mut self,
        request: impl Fn(Api, Arc<Credentials>) -> Fut,
    ) -> Result<T, Failure>
    where
        Fut: Future<Output = Result<T, ApiError>>,
    {
        let give_up = Instant::now() + LEADER_SEARCH;
        loop {
            let answer = self
                .fabric
                .call(Sender::Client, self.target, |node| {
                    request(node.api, self.credentials.clone())
                })
                .await;
            let no_effect = match answer {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(err)) if err.kind == ErrorKind::NotLeader => {
                    match err.leader.as_deref().and_then(node_at) {
                        Some(leader) => self.target = leader,
                        None => self.next_node(),
                    }
                    err
                }
                Ok(Err(err))
                    if matches!(err.kind, ErrorKind::Unavailable | ErrorKind::Internal) =>
                {
                    return Err(Failure::Unknown(err.message))
                }
                Ok(Err(err)) => return Err(Failure::Refused(err)),
                Err(Lost::Refused) => {
                    self.next_node();
                    ApiError::new(ErrorKind::Unavailable, "connection refused")
                }
                Err(Lost::NoAnswer) => return Err(Failure::Unknown("no answer".into())),
            };
            if Instant::now() + ELECTION_PAUSE >= give_up {
                return Err(Failure::Refused(no_effect));
            }
            tokio::time::sleep(ELECTION_PAUSE).await;
        }
    }
}

/// An open session and the task that keeps it alive.
struct Session {
    id: u64,
    /// Every call on the session carries it.
    secret: String,
    lost: Arc<AtomicBool>,
    keepalive: tokio::task::JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

struct Client {
    id: usize,
    router: Router,
    rng: StdRng,
    locks: Vec<String>,
    history: History,
    resource: Arc<SimResource>,
    /// Until when this client is paused (its keepalives too).
    paused_until: Arc<Mutex<Instant>>,
    /// When the faults stop. A pause is a fault: none begins later, so
    /// that every lock can be taken within the liveness bound after it.
    /// Regression: seed 1,000,176 of the soak, where both clients that
    /// write a read/write lock paused through the 10 s after the faults
    /// stopped.
    faults_until: Instant,
    /// Acquire attempts so far; each acquire is a new attempt.
    attempts: u64,
    /// Sessions the clients opened lately, as if their secrets had leaked.
    leaked: Leaked,
}

/// The newest sessions opened by any client: (client, session id, secret).
type Leaked = Arc<Mutex<VecDeque<(usize, u64, String)>>>;
/// How many [`Leaked`] keeps.
const LEAKED_SESSIONS: usize = 64;
/// One round in this many starts with a trespass (see `Client::trespass`).
const TRESPASS_EVERY: u32 = 16;

/// One operation of a client: recorded as invoked when it starts, and once
/// more when it ends.
pub(crate) struct Step {
    history: History,
    client: usize,
    op: Op,
    lock: String,
    pub(crate) token: Option<u64>,
}

impl Step {
    /// Records `client`'s `op` on `lock` as invoked now.
    pub(crate) fn begin(
        history: &History,
        client: usize,
        op: Op,
        lock: &str,
        token: Option<u64>,
    ) -> Step {
        let step = Step {
            history: history.clone(),
            client,
            op,
            lock: lock.to_owned(),
            token,
        };
        step.record(Phase::Invoke, None, None);
        step
    }

    pub(crate) fn record(&self, phase: Phase, value: Option<u64>, error: Option<String>) {
        self.history.push(Record {
            at: now_ns(),
            client: self.client,
            op: self.op,
            phase,
            lock: self.lock.clone(),
            token: self.token,
            value,
            error,
        });
    }

    pub(crate) fn ok(self, value: Option<u64>) {
        self.record(Phase::Ok, value, None);
    }

    /// Ended as `failure` says: certainly without effect, or unknown.
    fn failed(self, failure: &Failure, value: Option<u64>) {
        self.record(failure.phase(), value, Some(failure.message()));
    }

    pub(crate) fn refused(self, error: String) {
        self.record(Phase::Fail, None, Some(error));
    }
}

impl Client {
    fn start(&self, op: Op, lock: &str, token: Option<u64>) -> Step {
        Step::begin(&self.history, self.id, op, lock, token)
    }

    /// Rounds until `stop`.
    async fn run(mut self, stop: tokio::sync::watch::Receiver<bool>) {
        let mut session: Option<Session> = None;
        while !*stop.borrow() {
            let current = match session.take() {
                Some(open) if !open.lost.load(Ordering::Relaxed) => open,
                _ => match self.open_session().await {
                    Some(open) => open,
                    None => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            if self.rng.gen_ratio(1, TRESPASS_EVERY) {
                self.trespass().await;
            }
            let lock = self.locks[self.rng.gen_range(0..self.locks.len())].clone();
            if self.round(&current, &lock).await {
                session = Some(current);
            } else {
                // A grant we may not know of may be held by this session:
                // end it (the lease ends it anyway, if this is lost too).
                let close = CloseSessionRequest {
                    session_id: current.id,
                    session_secret: current.secret.clone(),
                };
                drop(current);
                let sent = now_ns();
                let closed = self
                    .router
                    .send(|api, credentials| {
                        let close = close.clone();
                        async move { api.close_session(&credentials, close).await }
                    })
                    .await;
                if closed.is_ok() {
                    self.history.served(close.session_id, sent);
                }
            }
        }
    }

    async fn open_session(&mut self) -> Option<Session> {
        let ttl_ms = SESSION_TTL.as_millis() as u64;
        let sent = now_ns();
        let opened = self
            .router
            .send(|api, credentials| async move {
                api.open_session(&credentials, OpenSessionRequest { ttl_ms })
                    .await
            })
            .await
            .ok()?;
        self.history.lease_renewed(opened.session_id, sent);
        {
            let mut leaked = self.leaked.lock().expect("leaked poisoned");
            if leaked.len() == LEAKED_SESSIONS {
                leaked.pop_front();
            }
            leaked.push_back((self.id, opened.session_id, opened.session_secret.clone()));
        }
        let lost = Arc::new(AtomicBool::new(false));
        let keepalive = tokio::spawn(keep_alive(
            KeepAliveRequest {
                session_id: opened.session_id,
                session_secret: opened.session_secret.clone(),
            },
            self.router.clone(),
            self.history.clone(),
            self.paused_until.clone(),
            lost.clone(),
        ));
        Some(Session {
            id: opened.session_id,
            secret: opened.session_secret,
            lost,
            keepalive,
        })
    }

    /// Renews another client's session with its secret, as a client would
    /// whose colleague's session handle leaked to it: the session belongs
    /// to the identity that opened it, so the server must refuse, whatever
    /// crashes, elections and snapshots came between (the checker flags an
    /// acknowledged trespass).
    async fn trespass(&mut self) {
        let victim = {
            let leaked = self.leaked.lock().expect("leaked poisoned");
            let others: Vec<_> = leaked
                .iter()
                .filter(|(owner, ..)| *owner != self.id)
                .collect();
            if others.is_empty() {
                return;
            }
            others[self.rng.gen_range(0..others.len())].clone()
        };
        let (_, session_id, session_secret) = victim;
        let step = self.start(Op::Trespass, "", None);
        let renewed = self
            .router
            .send(|api, credentials| {
                let request = KeepAliveRequest {
                    session_id,
                    session_secret: session_secret.clone(),
                };
                async move { api.keep_alive(&credentials, request).await }
            })
            .await;
        match renewed {
            Ok(_) => step.ok(Some(session_id)),
            Err(failure) => step.failed(&failure, Some(session_id)),
        }
    }

    /// Acquire, two increments, release. False if the session is in doubt.
    async fn round(&mut self, session: &Session, lock: &str) -> bool {
        let (session_id, secret) = (session.id, session.secret.as_str());
        let mut acquire = self.start(Op::Acquire, lock, None);
        self.attempts += 1;
        let attempt = self.attempts;
        let timeout_ms = Some(ACQUIRE_WAIT.as_millis() as u64);
        let shared = lock.starts_with(RW_PREFIX) && self.id % 2 == 1;
        let mode = match (lock.starts_with(RW_PREFIX), shared) {
            (false, _) => "",
            (true, true) => "shared",
            (true, false) => "exclusive",
        };
        let acquired = match lock {
            _ if lock.starts_with(ELECTION_PREFIX) => self
                .router
                .send(|api, credentials| {
                    let (election, session_secret) = (lock.to_owned(), secret.to_owned());
                    async move {
                        let request = CampaignRequest {
                            session_id,
                            session_secret,
                            election,
                            value: format!("client {session_id}"),
                            wait: true,
                            timeout_ms,
                            attempt,
                        };
                        api.campaign(&credentials, request).await
                    }
                })
                .await
                .map(|elected| (elected.term, None)),
            _ if !lock.starts_with(SEMAPHORE_PREFIX) => self
                .router
                .send(|api, credentials| {
                    let (lock, session_secret) = (lock.to_owned(), secret.to_owned());
                    async move {
                        let request = AcquireRequest {
                            session_id,
                            session_secret,
                            lock,
                            wait: true,
                            timeout_ms,
                            attempt,
                            lock_delay_ms: 0,
                            mode: mode.to_owned(),
                        };
                        api.acquire(&credentials, request).await
                    }
                })
                .await
                .map(|granted| (granted.token, None)),
            _ => self
                .router
                .send(|api, credentials| {
                    let (semaphore, session_secret) = (lock.to_owned(), secret.to_owned());
                    async move {
                        let request = AcquirePermitsRequest {
                            session_id,
                            session_secret,
                            semaphore,
                            capacity: SEMAPHORE_PERMITS,
                            count: 1,
                            wait: true,
                            timeout_ms,
                            attempt,
                        };
                        api.acquire_permits(&credentials, request).await
                    }
                })
                .await
                .map(|granted| {
                    let slot = granted.permits.first().map(|permit| permit.slot.into());
                    (granted.token, slot)
                }),
        };
        // A semaphore's slot goes into the history: the checker holds
        // each live permit to its own.
        let (token, slot) = match acquired {
            Ok(granted) => granted,
            Err(failure) => {
                if failure.kind() == Some(ErrorKind::UnknownSession) {
                    self.history.called_unknown(session_id, now_ns());
                }
                // Semaphores wait for the cluster version to allow them.
                let session_fine = matches!(
                    failure.kind(),
                    Some(
                        ErrorKind::WaitTimeout
                            | ErrorKind::Busy
                            | ErrorKind::NotLeader
                            | ErrorKind::NeedsUpgrade
                    )
                );
                acquire.failed(&failure, None);
                return session_fine;
            }
        };
        acquire.token = Some(token);
        acquire.ok(slot);

        if Instant::now() < self.faults_until && self.rng.gen_bool(PAUSE_CHANCE) {
            let pause = SESSION_TTL.mul_f64(self.rng.gen_range(1.5..3.0));
            *self.paused_until.lock().expect("pause poisoned") = Instant::now() + pause;
            tokio::time::sleep(pause).await;
        }

        if !shared {
            self.store_increment(lock, token).await;
            self.resource_increment(lock, token).await;
        }

        let release = self.start(Op::Release, lock, Some(token));
        let released = self
            .router
            .send(|api, credentials| {
                let (lock, session_secret) = (lock.to_owned(), secret.to_owned());
                async move {
                    api.release(
                        &credentials,
                        ReleaseRequest {
                            session_id,
                            session_secret,
                            lock,
                            token,
                        },
                    )
                    .await
                }
            })
            .await;
        match released {
            Ok(_) => {
                release.ok(None);
                true
            }
            Err(failure) => {
                release.failed(&failure, None);
                false
            }
        }
    }

    /// A fenced read, then a strict fenced put of the value + 1.
    async fn store_increment(&mut self, lock: &str, token: u64) {
        let step = self.start(Op::StoreIncrement, lock, Some(token));
        let key = format!("counter:{lock}");
        let read = self
            .router
            .send(|api, credentials| {
                let (key, lock) = (key.clone(), lock.to_owned());
                async move {
                    api.store_get(
                        &credentials,
                        StoreGetRequest {
                            key,
                            token: Some(token),
                            lock: Some(lock),
                        },
                    )
                    .await
                }
            })
            .await;
        let current = match read {
            // A read changes no counter: whatever its outcome, the
            // increment certainly did not happen.
            Err(failure) => return step.refused(failure.message()),
            Ok(read) if read.found => read.value.parse::<u64>().expect("counters are numbers"),
            Ok(_) => 0,
        };
        let next = current + 1;
        let written = self
            .router
            .send(|api, credentials| {
                let (key, lock) = (key.clone(), lock.to_owned());
                async move {
                    api.store_put(
                        &credentials,
                        StorePutRequest {
                            key,
                            value: next.to_string(),
                            token,
                            lock: Some(lock),
                        },
                    )
                    .await
                }
            })
            .await;
        match written {
            Ok(_) => step.ok(Some(next)),
            Err(failure) => step.failed(&failure, Some(next)),
        }
    }

    /// The same on the resource, across the simulated network.
    async fn resource_increment(&mut self, lock: &str, token: u64) {
        let step = self.start(Op::ResourceIncrement, lock, Some(token));
        let resource = self.resource.clone();
        let read = self
            .router
            .fabric
            .reach(|| resource.read(lock, token))
            .await;
        let current = match read {
            Ok(Ok(value)) => value,
            Ok(Err(stale)) => return step.refused(stale),
            Err(lost) => return step.refused(format!("read: {lost:?}")),
        };
        let next = current + 1;
        let written = self
            .router
            .fabric
            .reach(|| resource.write(lock, token, next))
            .await;
        match written {
            Ok(Ok(())) => step.ok(Some(next)),
            Ok(Err(stale)) => step.record(Phase::Fail, Some(next), Some(stale)),
            Err(Lost::Refused) => step.record(Phase::Fail, Some(next), Some("refused".into())),
            Err(Lost::NoAnswer) => step.record(Phase::Info, Some(next), Some("no answer".into())),
        }
    }
}

/// Renews the session every TTL/3, except while the client is paused.
/// Marks it lost once the server refuses it, or once a TTL has passed since
/// the last acknowledged keepalive was sent.
async fn keep_alive(
    request: KeepAliveRequest,
    mut router: Router,
    history: History,
    paused_until: Arc<Mutex<Instant>>,
    lost: Arc<AtomicBool>,
) {
    let session_id = request.session_id;
    let mut last_acknowledged_send = Instant::now();
    loop {
        tokio::time::sleep(SESSION_TTL / 3).await;
        let paused = *paused_until.lock().expect("pause poisoned");
        if paused > Instant::now() {
            tokio::time::sleep_until(paused).await;
        }
        if last_acknowledged_send + SESSION_TTL <= Instant::now() {
            break;
        }
        let sent = Instant::now();
        let sent_ns = now_ns();
        let renewed = router
            .send(|api, credentials| {
                let request = request.clone();
                async move { api.keep_alive(&credentials, request).await }
            })
            .await;
        match renewed {
            Ok(_) => {
                last_acknowledged_send = sent;
                history.lease_renewed(session_id, sent_ns);
                tracing::debug!(
                    session_id,
                    node = router.target,
                    sent_ms = sent_ns / 1_000_000,
                    "keepalive acknowledged"
                );
            }
            Err(Failure::Refused(err))
                if matches!(
                    err.kind,
                    ErrorKind::UnknownSession | ErrorKind::SessionExpiring
                ) =>
            {
                break
            }
            Err(_) => {}
        }
    }
    lost.store(true, Ordering::Relaxed);
}

/// The clients' time line: when their pauses (faults) end, and the
/// signal that stops them.
pub struct Schedule {
    pub faults_until: Instant,
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// Starts `count` clients on `locks`, each with its own random stream.
pub fn spawn_clients(
    count: usize,
    locks: &[String],
    router: &Router,
    history: &History,
    resource: &Arc<SimResource>,
    seed: u64,
    schedule: &Schedule,
) -> Vec<tokio::task::JoinHandle<()>> {
    let leaked = Leaked::default();
    (0..count)
        .map(|id| {
            let client = Client {
                id,
                // Each client is an identity of its own, as a client
                // certificate would make it.
                router: router.as_identity(&format!("client-{id}")),
                rng: StdRng::seed_from_u64(
                    seed ^ (id as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                ),
                locks: locks.to_vec(),
                history: history.clone(),
                resource: resource.clone(),
                paused_until: Arc::new(Mutex::new(Instant::now())),
                faults_until: schedule.faults_until,
                attempts: 0,
                leaked: leaked.clone(),
            };
            tokio::spawn(client.run(schedule.stop.clone()))
        })
        .collect()
}
