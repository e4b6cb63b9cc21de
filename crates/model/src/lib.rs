//! An exhaustive model check of the lock protocol, with stateright (issue
//! 31 §1): every interleaving, for small bounds, of
//!
//! - clients that open a session, keep it alive, take the lock, write to a
//!   fenced resource while they believe they hold it, and release; each
//!   computes its deadline as `crates/client` does (the send time of the
//!   last acknowledged open or keepalive, plus the TTL, minus its margin)
//!   and stops acting at it;
//! - the real `deadbolt_core::LockTable` as the state machine, applied
//!   with `apply_in_term` (so its own term check on timer commands is the
//!   one checked);
//! - a leader that counts leases on a clock that may run fast by the drift
//!   bound (it ends a lease `drift` ticks early), decides expiries (and
//!   from then on refuses the session's keepalives), records lease
//!   checkpoints, and is replaced (once): the new leader gives each session
//!   a fresh lease, or the remaining time of a checkpoint no renewal has
//!   overtaken;
//! - a network that loses, delays and reorders every message between
//!   clients, server and resource;
//! - a resource that fences writes by token.
//!
//! Time advances in discrete ticks, up to a bound; the clients open at
//! most `max_opens` sessions and send at most `max_acquires` acquires in
//! all, which bounds the states between two ticks. Properties: no two
//! clients inside their "I hold it" window at once; the resource never
//! accepts a write with a smaller token than one it accepted before; grant
//! tokens strictly increase; waiters are granted in FIFO order; no grant
//! during a lock-delay.
//!
//! [`Rules`] can break each rule the protocol rests on in turn, and the
//! tests (tests/protocol.rs) show the checker's counterexample for each:
//! the drift margin, the fence compare, the checkpoint rule, the client's
//! claim on a lock name until its release is answered, a new leader's
//! re-timing of lock-delays, and the client's final watchdog. With the watchdog final, a late renewal cannot revive a
//! session, so the server's renewal and term checks only matter to clients
//! without one: the model breaks them alongside it. Two rules were found
//! missing from the model by the checker, not from the code: the server's
//! refusal of renewals once an expiry is decided (`session_expiring`) and
//! the client's claim on a lock name.
//!
//! With [`LockModel::blocking`], the clients' acquires wait in the lock's
//! queue, and a fourth property holds: waiters are granted in the order
//! they joined it (three clients; a table that served its queue last in,
//! first out was caught at once).
//!
//! With [`LockModel::lock_delay`], an expired holder's lock stays
//! unavailable that long, timed by the leader (afresh by a new one), and a
//! fifth property holds: no grant comes before the delay has run, less the
//! leader's drift.
//!
//! With [`LockModel::primitive`], the clients contend for a read/write
//! lock (shared holds may overlap each other, never an exclusive one), a
//! semaphore of one permit, or an election instead, each through the
//! table's own commands.
//!
//! Not modelled yet: semaphores of several permits, proclaiming an
//! election's value, liveness; a client's
//! keepalives run one at a time with its other requests, where the real
//! client renews concurrently.
//!
//! Its length (about 975 lines) is one model: its state, its actions and the
//! properties checked on it, which stateright wants as one `Model`
//! implementation.

use deadbolt_core::{
    AcquireOutcome, Command, Event, FeatureLevel, LockTable, Outcome, RwMode, SecretHash,
    SessionId, Token,
};
use stateright::{Model, Path, Property};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

/// The one lock the clients contend for.
const LOCK: &str = "lock";

/// At most this many messages in flight: a client sends nothing more until
/// some are delivered or lost (a bound on the state space, large enough
/// for a request, its answer, a release and a late write at once).
const MAX_IN_FLIGHT: usize = 4;

/// The rules the protocol's safety rests on; [`Rules::SOUND`] keeps them
/// all, and each test breaks one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// How many ticks early the client ends its own view of the lease.
    pub client_margin: u64,
    /// How many ticks early the leader's clock may end a lease (the drift
    /// bound): the margin must cover it.
    pub drift: u64,
    /// A new leader ignores a checkpoint a renewal has overtaken.
    pub checkpoint_rule: bool,
    /// An expiry decided in one term is refused once another has begun
    /// (the table's own check: broken, the model relabels it).
    pub term_check: bool,
    /// The resource refuses a write whose token is below its fence.
    pub fence: bool,
    /// Once the leader has decided a session's expiry, it refuses its
    /// keepalives (`session_expiring`): acknowledging one would promise a
    /// lease the expiry on its way to the log is about to end.
    pub refuse_renewal_while_expiring: bool,
    /// A client does not acquire a lock again through the same session
    /// until its release has been answered (or is lost): the client's
    /// claim on a lock name (`crates/client/src/session.rs`, `Claim`).
    /// Broken, an acquire overtakes the release before it: the server
    /// answers it with the grant the session still holds (acquire is
    /// idempotent), and the release then frees the lock under the client.
    pub claim_until_released: bool,
    /// The client's watchdog: at its deadline the client gives the session
    /// up for good, and a renewal answered later does not bring it back
    /// (`crates/client/src/session.rs`, `watchdog`). Broken, the client
    /// may carry on past its deadline and trusts a late renewal: then the
    /// server's own rules (the renewal and term checks) must hold alone.
    pub watchdog_final: bool,
    /// A new leader times every lock-delay afresh from when it takes over
    /// (`start_leading` in `crates/server/src/leases.rs`). Broken, it ends
    /// them as it takes over.
    pub rearm_lock_delays: bool,
}

impl Rules {
    pub const SOUND: Rules = Rules {
        client_margin: 1,
        drift: 1,
        checkpoint_rule: true,
        term_check: true,
        fence: true,
        refuse_renewal_while_expiring: true,
        claim_until_released: true,
        watchdog_final: true,
        rearm_lock_delays: true,
    };
}

/// What the clients contend for: each is the table's own, with its own
/// commands; the name is [`LOCK`] for all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primitive {
    Lock,
    /// A read/write lock: each acquire asks for shared or exclusive.
    RwLock,
    /// A semaphore of one permit.
    Semaphore,
    /// An election: campaigning is acquiring, resigning is releasing.
    Election,
}

/// The bounds and rules of one check.
#[derive(Debug, Clone)]
pub struct LockModel {
    pub clients: usize,
    /// The session TTL, in ticks.
    pub ttl: u64,
    /// Time stops here.
    pub max_time: u64,
    pub leader_changes: u64,
    /// How many sessions the clients may open, and acquires they may send,
    /// in the whole run: each open and each grant moves a counter of the
    /// table, so these bound the state space between two ticks.
    pub max_opens: u64,
    pub max_acquires: u64,
    /// The clients' acquires wait in the lock's queue (else they do not).
    pub blocking: bool,
    pub primitive: Primitive,
    /// The lock-delay the clients ask for, in ticks (0: none): when a
    /// holder's session expires, nobody gets the lock for this long.
    pub lock_delay: u64,
    pub rules: Rules,
}

/// A [`LockTable`] as model state. Two tables are the same state when
/// what decides the protocol's future is: the live sessions, the lock's
/// holder and token, and the next token (not the audit trail or the count
/// of commands applied, which only record the past and would make every
/// history a state of its own).
#[derive(Debug, Clone)]
pub struct Table(pub LockTable);

impl Table {
    #[allow(clippy::type_complexity)]
    fn essence(
        &self,
    ) -> (
        Vec<u64>,
        Option<(u64, u64, Vec<u64>, bool)>,
        Option<String>,
        u64,
    ) {
        let table = &self.0;
        let sessions = table.sessions().map(|(id, _)| id.0).collect();
        let lock = table.lock(LOCK).map(|info| {
            let waiters = info.waiters.iter().map(|session| session.0).collect();
            (info.holder.0, info.token.0, waiters, info.delayed)
        });
        // The other primitives' holders and queues, only when there is one.
        let shared = table.semaphores();
        let other = [
            shared.rw_lock(LOCK).map(|info| format!("{info:?}")),
            shared.semaphore(LOCK).map(|info| format!("{info:?}")),
            shared.election(LOCK).map(|info| format!("{info:?}")),
        ];
        let other = other.into_iter().flatten().reduce(|all, one| all + &one);
        (sessions, lock, other, table.next_token().0)
    }
}

impl PartialEq for Table {
    fn eq(&self, other: &Table) -> bool {
        self.essence() == other.essence()
    }
}

impl Eq for Table {}

impl Hash for Table {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.essence().hash(state);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Server {
    pub table: Table,
    pub term: u64,
    pub leader_changes: u64,
    /// The tick at which the leader ends each live session's lease.
    pub expiry: BTreeMap<u64, u64>,
    /// Each session's last checkpoint: the lease left then, and whether a
    /// renewal has come since.
    pub checkpoint: BTreeMap<u64, (u64, bool)>,
    /// Expiries decided by a leader, with its term, not yet committed.
    pub pending_expiries: Vec<(u64, u64)>,
    /// The blocking acquires waiting in the queue: session → client. They
    /// survive a leader change, as the client's retry (which keeps its
    /// queue place) would.
    pub blocked: BTreeMap<u64, usize>,
    /// The tick at which the leader ends each lock-delay, by token.
    pub delays: BTreeMap<u64, u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Request {
    Open,
    KeepAlive,
    /// An acquire that does not wait.
    Acquire,
    /// A blocking acquire: queued behind the holder, answered when granted
    /// or when its wait ends.
    Wait,
    /// The same two, for a shared hold of a read/write lock.
    AcquireShared,
    WaitShared,
}

impl Request {
    fn acquires(self) -> bool {
        !matches!(self, Request::Open | Request::KeepAlive)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Message {
    /// Client → server, sent at tick `sent`, on `session` (0: none yet).
    Request {
        client: usize,
        request: Request,
        session: u64,
        sent: u64,
    },
    Release {
        client: usize,
        session: u64,
        token: u64,
    },
    /// Server → client: the session, and the send time of the request
    /// this answers (what the client's deadline counts from).
    Opened {
        client: usize,
        session: u64,
        sent: u64,
    },
    Renewed {
        client: usize,
        session: u64,
        sent: u64,
    },
    Granted {
        client: usize,
        session: u64,
        token: u64,
    },
    /// A release's answer; or busy, or the session is gone.
    Answered { client: usize },
    /// Client → resource.
    Write { token: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Client {
    pub session: u64,
    /// The end of the lease by this client's account.
    pub deadline: u64,
    pub holding: Option<u64>,
    /// Its grant (or the acquire it waits for) is a shared hold.
    pub shared: bool,
    pub waiting: bool,
    /// Whether it wrote under its current grant.
    pub wrote: bool,
}

impl Client {
    /// Inside its "I hold it" window at `now`.
    fn believes_it_holds(&self, now: u64) -> bool {
        self.holding.is_some() && now < self.deadline
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    pub now: u64,
    pub server: Server,
    pub clients: Vec<Client>,
    /// Messages in flight, sorted (a multiset).
    pub network: Vec<Message>,
    /// The resource's fence: the largest token it accepted.
    pub fence: u64,
    pub stale_write_accepted: bool,
    /// The session and token of the latest grant.
    pub highest_grant: (u64, u64),
    pub token_went_back: bool,
    /// Opens and acquires sent so far (see [`LockModel::max_opens`]).
    pub opens: u64,
    pub acquires: u64,
    /// The sessions queued for the lock, in the order they joined.
    pub queue: Vec<u64>,
    /// A grant went to a session other than the first in the queue.
    pub fifo_broken: bool,
    /// When the latest lock-delay began (by true time).
    pub delay_began: Option<u64>,
    /// A grant came before the lock-delay in force had run (less the
    /// leader's drift).
    pub granted_in_delay: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Tick,
    Send(usize, Request),
    Write(usize),
    Release(usize),
    /// The client's deadline passed: it drops the session.
    Lose(usize),
    /// Its request or the answer is lost, and it gives up waiting.
    GiveUp(usize),
    Deliver(usize),
    Drop(usize),
    DecideExpiry(u64),
    CommitExpiry(usize),
    Checkpoint(u64),
    /// The leader's timer for the lock-delay of a token ran out: it
    /// proposes its end (committed in the same step).
    EndLockDelay(u64),
    ChangeLeader,
}

impl Message {
    /// The client a request or an answer belongs to.
    fn client(&self) -> Option<usize> {
        match *self {
            Message::Request { client, .. }
            | Message::Opened { client, .. }
            | Message::Renewed { client, .. }
            | Message::Granted { client, .. }
            | Message::Answered { client } => Some(client),
            Message::Release { client, .. } => Some(client),
            Message::Write { .. } => None,
        }
    }
}

impl LockModel {
    fn send(state: &mut State, message: Message) {
        state.network.push(message);
        state.network.sort();
    }

    fn apply(&self, state: &mut State, command: &Command, term: u64) -> Result<Outcome, ()> {
        let applied = state.server.table.0.apply_in_term(command, 0, term);
        for event in &applied.events {
            self.observe(state, event);
        }
        applied.outcome.map_err(drop)
    }

    /// What the properties track of each grant and queue change, and the
    /// answers to blocked calls that a change brings.
    fn observe(&self, state: &mut State, event: &Event) {
        match *event {
            Event::Granted { session, token, .. } => {
                let (session, token) = (session.0, token.0);
                if let Some(began) = state.delay_began.take() {
                    let ran = (began + self.lock_delay).saturating_sub(self.rules.drift);
                    state.granted_in_delay |= state.now < ran;
                }
                state.token_went_back |= token <= state.highest_grant.1;
                state.highest_grant = (session, token);
                match state.queue.iter().position(|&queued| queued == session) {
                    Some(place) => {
                        state.fifo_broken |= place != 0;
                        state.queue.remove(place);
                    }
                    None => state.fifo_broken |= !state.queue.is_empty(),
                }
                if let Some(client) = state.server.blocked.remove(&session) {
                    Self::send(
                        state,
                        Message::Granted {
                            client,
                            session,
                            token,
                        },
                    );
                }
            }
            Event::Queued { session, .. } => state.queue.push(session.0),
            Event::LockDelayed { token, .. } => {
                let ends = (state.now + self.lock_delay).saturating_sub(self.rules.drift);
                state.server.delays.insert(token.0, ends);
                state.delay_began = Some(state.now);
            }
            Event::WaitEnded { session, .. } => {
                state.queue.retain(|&queued| queued != session.0);
                if let Some(client) = state.server.blocked.remove(&session.0) {
                    Self::send(state, Message::Answered { client });
                }
            }
            _ => {}
        }
    }

    /// A message arrives: at the server (a request, a release), the
    /// resource (a write) or a client (an answer).
    fn deliver(&self, state: &mut State, message: Message) {
        let term = state.server.term;
        let lease = state.now + self.ttl - self.rules.drift;
        match message {
            Message::Request {
                client,
                request: Request::Open,
                sent,
                ..
            } => {
                let command = Command::OpenSession {
                    ttl_ms: self.ttl * 1000,
                    secret: SecretHash([client as u8; 32]),
                    owner: None,
                };
                if let Ok(Outcome::SessionOpened { session, .. }) =
                    self.apply(state, &command, term)
                {
                    state.server.expiry.insert(session.0, lease);
                    Self::send(
                        state,
                        Message::Opened {
                            client,
                            session: session.0,
                            sent,
                        },
                    );
                }
            }
            Message::Request {
                client,
                request: Request::KeepAlive,
                session,
                sent,
            } => {
                let expiring = state.server.pending_expiries.contains(&(session, term))
                    && self.rules.refuse_renewal_while_expiring;
                if state.server.table.0.has_session(SessionId(session)) && !expiring {
                    state.server.expiry.insert(session, lease);
                    if let Some((_, renewed)) = state.server.checkpoint.get_mut(&session) {
                        *renewed = true;
                    }
                    Self::send(
                        state,
                        Message::Renewed {
                            client,
                            session,
                            sent,
                        },
                    );
                } else {
                    Self::send(state, Message::Answered { client });
                }
            }
            Message::Request {
                client,
                request:
                    request @ (Request::Acquire
                    | Request::Wait
                    | Request::AcquireShared
                    | Request::WaitShared),
                session,
                ..
            } => {
                let command = self.acquire(session, request);
                match self.apply(state, &command, term) {
                    // A grant at once (or, acquire being idempotent, the
                    // grant the session already holds).
                    Ok(Outcome::Acquire(AcquireOutcome::Granted { token })) => Self::send(
                        state,
                        Message::Granted {
                            client,
                            session,
                            token: token.0,
                        },
                    ),
                    Ok(Outcome::Acquire(AcquireOutcome::Queued { .. })) => {
                        state.server.blocked.insert(session, client);
                    }
                    _ => Self::send(state, Message::Answered { client }),
                }
            }
            Message::Release {
                client,
                session,
                token,
            } => {
                let command = Command::Release {
                    session: SessionId(session),
                    lock: LOCK.to_owned(),
                    token: Token(token),
                };
                let _ = self.apply(state, &command, term);
                // Broken, the rule has the client go on without waiting for
                // this answer, so none is sent (a late one would end the wait
                // of the client's next request).
                if self.rules.claim_until_released {
                    Self::send(state, Message::Answered { client });
                }
            }
            Message::Write { token } => {
                if !self.rules.fence || token >= state.fence {
                    state.stale_write_accepted |= token < state.fence;
                    state.fence = state.fence.max(token);
                }
            }
            Message::Opened {
                client,
                session,
                sent,
            } => {
                let me = &mut state.clients[client];
                me.waiting = false;
                // An answer to an open it gave up on, once it has another
                // session, is not its session.
                if me.session == 0 {
                    me.session = session;
                    me.deadline = sent + self.ttl - self.rules.client_margin;
                }
            }
            Message::Renewed {
                client,
                session,
                sent,
            } => {
                let now = state.now;
                let me = &mut state.clients[client];
                me.waiting = false;
                // Past its deadline the client has given the session up,
                // whatever answer comes late.
                if me.session == session && (now < me.deadline || !self.rules.watchdog_final) {
                    let renewed = sent + self.ttl - self.rules.client_margin;
                    me.deadline = me.deadline.max(renewed);
                }
            }
            Message::Granted {
                client,
                session,
                token,
            } => {
                let me = &mut state.clients[client];
                me.waiting = false;
                if me.session == session {
                    me.holding = Some(token);
                    me.wrote = false;
                }
            }
            Message::Answered { client } => state.clients[client].waiting = false,
        }
    }

    /// The table's command for an acquire of the model's primitive.
    fn acquire(&self, session: u64, request: Request) -> Command {
        let (session, lock) = (SessionId(session), LOCK.to_owned());
        let wait = matches!(request, Request::Wait | Request::WaitShared);
        match self.primitive {
            Primitive::Lock => Command::Acquire {
                session,
                lock,
                wait,
                attempt: 0,
                lock_delay_ms: self.lock_delay * 1000,
            },
            Primitive::RwLock => Command::AcquireRw {
                session,
                lock,
                mode: if matches!(request, Request::AcquireShared | Request::WaitShared) {
                    RwMode::Shared
                } else {
                    RwMode::Exclusive
                },
                wait,
                attempt: 0,
            },
            Primitive::Semaphore => Command::AcquirePermits {
                session,
                semaphore: lock,
                capacity: 1,
                count: 1,
                wait,
                attempt: 0,
            },
            Primitive::Election => Command::Campaign {
                session,
                election: lock,
                value: String::new(),
                wait,
                attempt: 0,
            },
        }
    }

    /// A counterexample as one line per step: the action (a delivered or
    /// lost message spelt out), then what the clients believe and what the
    /// leader and the table hold after it.
    pub fn explain(&self, path: Path<State, Action>) -> Vec<String> {
        let steps = path.into_vec();
        let mut lines = Vec::with_capacity(steps.len());
        for pair in steps.windows(2) {
            let [(before, Some(action)), (after, _)] = pair else {
                continue;
            };
            let what = match *action {
                Action::Deliver(i) => format!("deliver {:?}", before.network[i]),
                Action::Drop(i) => format!("lose {:?}", before.network[i]),
                ref other => format!("{other:?}"),
            };
            let clients: Vec<String> = after
                .clients
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let holds = match c.holding {
                        Some(token) if c.believes_it_holds(after.now) => {
                            format!(" HOLDS token {token}")
                        }
                        Some(token) => format!(" (token {token}, past its deadline)"),
                        None => String::new(),
                    };
                    format!(
                        "client {i}: session {} until {}{holds}",
                        c.session, c.deadline
                    )
                })
                .collect();
            let table = &after.server.table;
            let holder = match table.0.lock(LOCK) {
                Some(l) => Some(format!("session {} token {}", l.holder.0, l.token.0)),
                // A read/write lock, semaphore or election: as the table has it.
                None => table.essence().2,
            };
            lines.push(format!(
                "t={} {what}\n    {}; leader term {} leases {:?} lock {} queue {:?}",
                after.now,
                clients.join(", "),
                after.server.term,
                after.server.expiry,
                holder.as_deref().unwrap_or("free"),
                after.queue,
            ));
        }
        lines
    }

    fn live_sessions(state: &State) -> Vec<u64> {
        state.server.expiry.keys().copied().collect()
    }
}

impl Model for LockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            server: Server {
                // Every primitive allowed, as a cluster of this release.
                table: Table(LockTable::default().with_cluster_version(FeatureLevel::NEWEST)),
                term: 1,
                leader_changes: 0,
                expiry: BTreeMap::new(),
                checkpoint: BTreeMap::new(),
                pending_expiries: Vec::new(),
                blocked: BTreeMap::new(),
                delays: BTreeMap::new(),
            },
            clients: vec![Client::default(); self.clients],
            network: Vec::new(),
            fence: 0,
            stale_write_accepted: false,
            highest_grant: (0, 0),
            token_went_back: false,
            opens: 0,
            acquires: 0,
            queue: Vec::new(),
            fifo_broken: false,
            delay_began: None,
            granted_in_delay: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now < self.max_time {
            actions.push(Action::Tick);
        }
        for (i, client) in state.clients.iter().enumerate() {
            if client.waiting {
                // Once its request or the answer is lost; a blocking acquire
                // in the queue waits for its answer.
                if state.network.iter().any(|m| m.client() == Some(i)) {
                    actions.push(Action::GiveUp(i));
                }
                continue;
            }
            if client.session != 0 && state.now >= client.deadline {
                // The client's watchdog: at its deadline it stops acting
                // and drops the session, before anything else it would do.
                actions.push(Action::Lose(i));
                if self.rules.watchdog_final {
                    continue;
                }
            }
            if state.network.len() >= MAX_IN_FLIGHT {
                continue;
            }
            if client.session == 0 {
                if state.opens < self.max_opens {
                    actions.push(Action::Send(i, Request::Open));
                }
                continue;
            }
            // A keepalive that cannot move its deadline (sent in the tick
            // of the open or keepalive before it) would only split states.
            if state.now + self.ttl - self.rules.client_margin > client.deadline {
                actions.push(Action::Send(i, Request::KeepAlive));
            }
            match client.holding {
                None if state.acquires < self.max_acquires => {
                    let (exclusive, shared) = if self.blocking {
                        (Request::Wait, Request::WaitShared)
                    } else {
                        (Request::Acquire, Request::AcquireShared)
                    };
                    actions.push(Action::Send(i, exclusive));
                    if self.primitive == Primitive::RwLock {
                        actions.push(Action::Send(i, shared));
                    }
                }
                None => {}
                Some(_) => {
                    // Only an exclusive holder writes to the resource.
                    if client.believes_it_holds(state.now) && !client.wrote && !client.shared {
                        actions.push(Action::Write(i));
                    }
                    actions.push(Action::Release(i));
                }
            }
        }
        for i in 0..state.network.len() {
            if i > 0 && state.network[i] == state.network[i - 1] {
                continue;
            }
            actions.push(Action::Deliver(i));
            // A lost request or answer is the client's to give up on.
            let exchange = state.network[i]
                .client()
                .filter(|&c| state.clients[c].waiting);
            if exchange.is_none() {
                actions.push(Action::Drop(i));
            }
        }
        for session in Self::live_sessions(state) {
            if state.now >= state.server.expiry[&session]
                && !state
                    .server
                    .pending_expiries
                    .iter()
                    .any(|&(s, term)| s == session && term == state.server.term)
            {
                actions.push(Action::DecideExpiry(session));
            }
            if !state.server.checkpoint.contains_key(&session) {
                actions.push(Action::Checkpoint(session));
            }
        }
        for i in 0..state.server.pending_expiries.len() {
            actions.push(Action::CommitExpiry(i));
        }
        for (&token, &ends) in &state.server.delays {
            if state.now >= ends {
                actions.push(Action::EndLockDelay(token));
            }
        }
        if state.server.leader_changes < self.leader_changes {
            actions.push(Action::ChangeLeader);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        let now = state.now;
        match action {
            Action::Tick => state.now += 1,
            Action::Send(i, request) => {
                match request {
                    Request::Open => state.opens += 1,
                    Request::KeepAlive => {}
                    _ => state.acquires += 1,
                }
                let client = &mut state.clients[i];
                client.waiting = true;
                if request.acquires() {
                    client.shared = matches!(request, Request::AcquireShared | Request::WaitShared);
                }
                let session = client.session;
                // Only an open's and a keepalive's send time counts (the
                // deadline starts there); an acquire's would only split
                // states.
                let sent = if request.acquires() { 0 } else { now };
                Self::send(
                    &mut state,
                    Message::Request {
                        client: i,
                        request,
                        session,
                        sent,
                    },
                );
            }
            Action::Write(i) => {
                let client = &mut state.clients[i];
                client.wrote = true;
                let token = client.holding.expect("holding");
                Self::send(&mut state, Message::Write { token });
            }
            Action::Release(i) => {
                let client = &mut state.clients[i];
                let token = client.holding.take().expect("holding");
                client.waiting = self.rules.claim_until_released;
                let session = client.session;
                Self::send(
                    &mut state,
                    Message::Release {
                        client: i,
                        session,
                        token,
                    },
                );
            }
            Action::Lose(i) => state.clients[i] = Client::default(),
            Action::GiveUp(i) => {
                state.clients[i].waiting = false;
                state.network.retain(|m| m.client() != Some(i));
            }
            Action::Deliver(i) => {
                let message = state.network.remove(i);
                self.deliver(&mut state, message);
            }
            Action::Drop(i) => {
                state.network.remove(i);
            }
            Action::DecideExpiry(session) => {
                let term = state.server.term;
                state.server.pending_expiries.push((session, term));
                state.server.pending_expiries.sort();
            }
            Action::CommitExpiry(i) => {
                let (session, decided) = state.server.pending_expiries.remove(i);
                let labelled = if self.rules.term_check {
                    decided
                } else {
                    state.server.term
                };
                let command = Command::ExpireSession {
                    session: SessionId(session),
                    term: labelled,
                };
                let term = state.server.term;
                if self.apply(&mut state, &command, term).is_ok() {
                    state.server.expiry.remove(&session);
                    state.server.checkpoint.remove(&session);
                }
            }
            Action::Checkpoint(session) => {
                let left = state.server.expiry[&session].saturating_sub(now);
                state.server.checkpoint.insert(session, (left, false));
            }
            Action::EndLockDelay(token) => {
                state.server.delays.remove(&token);
                let term = state.server.term;
                let command = Command::EndLockDelay {
                    lock: LOCK.to_owned(),
                    token: Token(token),
                    term,
                };
                let _ = self.apply(&mut state, &command, term);
            }
            Action::ChangeLeader => {
                let server = &mut state.server;
                server.term += 1;
                server.leader_changes += 1;
                let rearmed = (now + self.lock_delay).saturating_sub(self.rules.drift);
                let ended: Vec<u64> = if self.rules.rearm_lock_delays {
                    server.delays.values_mut().for_each(|ends| *ends = rearmed);
                    Vec::new()
                } else {
                    std::mem::take(&mut server.delays).into_keys().collect()
                };
                let term = server.term;
                for token in ended {
                    let command = Command::EndLockDelay {
                        lock: LOCK.to_owned(),
                        token: Token(token),
                        term,
                    };
                    let _ = self.apply(&mut state, &command, term);
                }
                let server = &mut state.server;
                for (session, expiry) in server.expiry.iter_mut() {
                    let fresh = now + self.ttl - self.rules.drift;
                    *expiry = match server.checkpoint.get(session) {
                        Some(&(left, renewed)) if !renewed || !self.rules.checkpoint_rule => {
                            now + left
                        }
                        _ => fresh,
                    };
                }
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one holder at a time", |_, state: &State| {
                let mut holding = state
                    .clients
                    .iter()
                    .filter(|c| c.believes_it_holds(state.now));
                // Shared holds of a read/write lock may overlap each other.
                holding.clone().count() <= 1 || holding.all(|c| c.shared)
            }),
            Property::always("the resource's tokens never go back", |_, state: &State| {
                !state.stale_write_accepted
            }),
            Property::always("grant tokens strictly increase", |_, state: &State| {
                !state.token_went_back
            }),
            Property::always("waiters are granted in FIFO order", |_, state: &State| {
                !state.fifo_broken
            }),
            Property::always("no grant during a lock-delay", |_, state: &State| {
                !state.granted_in_delay
            }),
        ]
    }
}
