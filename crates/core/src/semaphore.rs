//! [`Semaphores`]: names that several sessions hold at once, kept in the
//! replicated table beside the locks: counting semaphores, and read/write
//! locks (a semaphore whose rule is "many shared holders or one exclusive").
//!
//! Why in the state machine and not a client recipe: the recipes leak.
//! Redisson's semaphore permits outlive a crashed holder, Curator's lease
//! nodes depend on every client cleaning up after itself, and etcd's
//! RWMutex recipe lets a reader in ahead of a queued writer. Here a grant
//! belongs to a session and ends with it, the queue is FIFO for every kind
//! of request, and every grant takes tokens from the table's one counter,
//! so a resource fences a permit or a shared hold as it fences a lock.
//!
//! The rules (docs/semaphores.md, docs/rw-locks.md):
//! - The first acquire of a name creates it with the rule it names (a
//!   semaphore's capacity, or read/write); while it exists, an acquire
//!   naming another rule is refused (never a silent change). A name nobody
//!   holds or waits on is removed, as a free lock is.
//! - A session has at most one grant per name: `count` permits, or one hold
//!   in one mode. An acquire it repeats (a retry) gets the same grant, or
//!   the same place.
//! - FIFO: requests are granted in the order they came, from the head of
//!   the queue while they fit. A request that does not fit yet holds back
//!   every request behind it: a stream of requests for one permit cannot
//!   starve a request for three, and readers that come after a queued
//!   writer wait behind it. Consecutive readers at the head are granted
//!   together.
//! - Each permit of a grant takes the next token and the lowest free slot
//!   (0..capacity): no two live permits share a slot, so a resource with N
//!   slots (connections, GPUs, shards) fences each slot with its tokens.
//!   The grant is named by its first token (releases present it). A
//!   read/write hold, shared or exclusive, takes one token (slot 0).
//!
//! Its length (about 1,050 lines) is the semaphore and read/write lock state
//! with their transitions and invariants: each transition keeps the slots,
//! queue and holds consistent together, and the invariant check reads all of
//! them.

use crate::{AcquireOutcome, Event, LockError, SessionId, Token};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The most permits a semaphore may have: slot numbers stay small, and
/// granting (which looks for free slots) stays cheap.
pub const MAX_PERMITS: u32 = 1_024;

/// Every semaphore, and which of them each session holds or waits on (so
/// that a session's end finds its permits without a scan).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Semaphores {
    #[serde(deserialize_with = "crate::bounded::ord_map")]
    by_name: imbl::OrdMap<String, Semaphore>,
    #[serde(deserialize_with = "crate::bounded::ord_map")]
    by_session: imbl::OrdMap<SessionId, BTreeSet<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Semaphore {
    rule: Rule,
    holders: BTreeMap<SessionId, Holding>,
    queue: VecDeque<Request>,
    /// Created by [`crate::Command::DefineSemaphore`]: kept while nobody
    /// holds or waits on it, until deleted, and its capacity changes only
    /// by another definition.
    defined: bool,
}

/// What a name lets several sessions hold at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rule {
    /// A counting semaphore: at most `capacity` permits out.
    Permits { capacity: u32 },
    /// A read/write lock: any number of shared holders, or one exclusive.
    ReadWrite,
    /// A leader election: one leader at a time, candidates in FIFO order,
    /// the leader's value proclaimed to everyone.
    Election,
}

/// The two ways to hold a read/write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RwMode {
    Shared,
    Exclusive,
}

/// What one grant is: permits of a semaphore, or a read/write lock's hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Want {
    Permits(u32),
    Rw(RwMode),
    /// A candidacy in an election.
    Campaign,
}

/// What one session holds of one name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Holding {
    want: Want,
    permits: Vec<Permit>,
    /// The latest acquire attempt (see [`crate::Command::Abandon`]).
    attempt: u64,
    /// An election leader's value (empty for the other kinds).
    value: String,
}

/// A request waiting in a semaphore's queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Request {
    session: SessionId,
    want: Want,
    attempt: u64,
    /// A candidate's value, the leader's once elected.
    value: String,
}

/// One held permit: its fencing token and its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permit {
    pub token: Token,
    pub slot: u32,
}

/// A read-only view of one semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemaphoreInfo {
    pub name: String,
    pub capacity: u32,
    /// Holders in session order, each with its permits.
    pub holders: Vec<(SessionId, Vec<Permit>)>,
    /// Waiting sessions with the permits each asks for, next in line first.
    pub waiters: Vec<(SessionId, u32)>,
    /// Created by a definition: kept while unused, until deleted.
    pub defined: bool,
}

/// A read-only view of one read/write lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RwLockInfo {
    pub name: String,
    /// Holders in session order, each with its mode and token.
    pub holders: Vec<(SessionId, RwMode, Token)>,
    /// Waiting sessions with the mode each asks for, next in line first.
    pub waiters: Vec<(SessionId, RwMode)>,
}

/// A read-only view of one election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionInfo {
    pub name: String,
    /// The leader's session, its token (the term) and its value.
    pub leader: (SessionId, Token, String),
    /// Candidates, next in line first.
    pub candidates: Vec<SessionId>,
}

/// The most bytes a candidate's or leader's value may have: it is in every
/// leader query and every snapshot.
pub const MAX_ELECTION_VALUE: usize = 4_096;

/// What an acquire asks for (see [`crate::Command::AcquirePermits`],
/// [`crate::Command::AcquireRw`] and [`crate::Command::Campaign`]).
#[derive(Debug, Clone)]
pub(crate) struct ShareRequest {
    pub rule: Rule,
    pub want: Want,
    pub wait: bool,
    pub attempt: u64,
    /// A candidate's value (empty for the other kinds).
    pub value: String,
}

impl Rule {
    /// What messages call a name with this rule.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Rule::Permits { .. } => "semaphore",
            Rule::ReadWrite => "read/write lock",
            Rule::Election => "election",
        }
    }
}

impl Want {
    /// What messages call a name granting this.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Want::Permits(_) => Rule::Permits { capacity: 1 }.kind(),
            Want::Rw(_) => Rule::ReadWrite.kind(),
            Want::Campaign => Rule::Election.kind(),
        }
    }
}

impl std::fmt::Display for RwMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RwMode::Shared => "shared",
            RwMode::Exclusive => "exclusive",
        })
    }
}

impl Semaphore {
    /// Nobody holds or waits on it yet.
    fn new(rule: Rule, defined: bool) -> Self {
        Semaphore {
            rule,
            holders: BTreeMap::new(),
            queue: VecDeque::new(),
            defined,
        }
    }

    fn capacity(&self) -> Option<u32> {
        match self.rule {
            Rule::Permits { capacity } => Some(capacity),
            Rule::ReadWrite | Rule::Election => None,
        }
    }

    fn held(&self) -> u32 {
        self.holders
            .values()
            .map(|holding| holding.permits.len() as u32)
            .sum()
    }

    /// Whether `want` could be granted now, queue aside.
    fn fits(&self, want: Want) -> bool {
        match (self.rule, want) {
            // Held may be above a capacity lowered since: no grant then.
            (Rule::Permits { capacity }, Want::Permits(count)) => {
                count <= capacity.saturating_sub(self.held())
            }
            (Rule::ReadWrite, Want::Rw(RwMode::Exclusive)) | (Rule::Election, Want::Campaign) => {
                self.holders.is_empty()
            }
            (Rule::ReadWrite, Want::Rw(RwMode::Shared)) => self
                .holders
                .values()
                .all(|holding| holding.want == Want::Rw(RwMode::Shared)),
            (rule, want) => unreachable!("{want:?} asked of a {}", rule.kind()),
        }
    }

    /// Nothing keeps it: nobody holds or waits on it, and it was not
    /// defined.
    fn is_unused(&self) -> bool {
        !self.defined && self.holders.is_empty() && self.queue.is_empty()
    }

    /// The `count` lowest slots no holder has.
    fn free_slots(&self, count: u32) -> Vec<u32> {
        let taken: BTreeSet<u32> = self
            .holders
            .values()
            .flat_map(|holding| holding.permits.iter().map(|permit| permit.slot))
            .collect();
        (0..self.capacity().unwrap_or(1))
            .filter(|slot| !taken.contains(slot))
            .take(count as usize)
            .collect()
    }

    /// Why `want` cannot be granted now, to a caller that would not wait.
    fn busy(&self, name: &str, want: Want) -> LockError {
        let queued = self.queue.len();
        match (self.rule, want) {
            (Rule::Permits { capacity }, Want::Permits(asked)) => LockError::NoPermits {
                semaphore: name.to_owned(),
                free: capacity.saturating_sub(self.held()),
                queued,
                asked,
            },
            (_, Want::Rw(asked)) => LockError::RwBusy {
                lock: name.to_owned(),
                asked,
                exclusive: self
                    .holders
                    .values()
                    .any(|h| h.want == Want::Rw(RwMode::Exclusive)),
                holders: self.holders.len(),
                queued,
            },
            (_, Want::Campaign) => LockError::HasLeader {
                election: name.to_owned(),
                term: self
                    .holders
                    .values()
                    .next()
                    .map_or(Token(0), |h| h.permits[0].token),
                queued,
            },
            (rule, want) => unreachable!("{want:?} asked of a {}", rule.kind()),
        }
    }
}

impl Semaphores {
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// How many names of each kind: semaphores, read/write locks, elections.
    pub fn count_by_kind(&self) -> (usize, usize, usize) {
        let mut counts = (0, 0, 0);
        for semaphore in self.by_name.values() {
            match semaphore.rule {
                Rule::Permits { .. } => counts.0 += 1,
                Rule::ReadWrite => counts.1 += 1,
                Rule::Election => counts.2 += 1,
            }
        }
        counts
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Grants `request.want` of `name` to `session`, or queues it, creating
    /// the name with `request.rule` if it does not exist (the caller
    /// checked that the name is no lock, the session is live and there is
    /// room for a new name).
    pub(crate) fn acquire(
        &mut self,
        next_token: &mut u64,
        session: SessionId,
        name: &str,
        request: ShareRequest,
        max_waiters: usize,
        events: &mut Vec<Event>,
    ) -> Result<AcquireOutcome, LockError> {
        let ShareRequest {
            rule,
            want,
            wait,
            attempt,
            value,
        } = request;
        if value.len() > MAX_ELECTION_VALUE {
            return Err(LockError::ValueTooLarge {
                bytes: value.len(),
                limit: MAX_ELECTION_VALUE,
            });
        }
        // Capacity 0: whatever the semaphore has (it must exist).
        let rule = match (rule, self.by_name.get(name).map(|s| s.rule)) {
            (Rule::Permits { capacity: 0 }, None) => {
                return Err(LockError::NoSuchSemaphore {
                    semaphore: name.to_owned(),
                })
            }
            (Rule::Permits { capacity: 0 }, Some(existing @ Rule::Permits { .. })) => existing,
            (Rule::Permits { capacity: 0 }, Some(other)) => {
                return Err(LockError::WrongKind {
                    name: name.to_owned(),
                    kind: other.kind().to_owned(),
                    asked: rule.kind().to_owned(),
                })
            }
            (rule, _) => rule,
        };
        if let (Rule::Permits { capacity }, Want::Permits(count)) = (rule, want) {
            if !(1..=MAX_PERMITS).contains(&capacity) || !(1..=capacity).contains(&count) {
                return Err(LockError::InvalidPermits {
                    semaphore: name.to_owned(),
                    capacity,
                    count,
                    max: MAX_PERMITS,
                });
            }
        }
        let semaphore = self
            .by_name
            .entry(name.to_owned())
            .or_insert_with(|| Semaphore::new(rule, false));
        match (semaphore.rule, rule) {
            (
                Rule::Permits { capacity },
                Rule::Permits {
                    capacity: requested,
                },
            ) if capacity != requested => {
                return Err(LockError::CapacityMismatch {
                    semaphore: name.to_owned(),
                    capacity,
                    requested,
                });
            }
            (held, asked) if held.kind() != asked.kind() => {
                return Err(LockError::WrongKind {
                    name: name.to_owned(),
                    kind: held.kind().to_owned(),
                    asked: asked.kind().to_owned(),
                });
            }
            _ => {}
        }
        let other_mode = |has: Want| match (has, want) {
            (Want::Rw(has), Want::Rw(asked)) if has != asked => Some(LockError::OtherMode {
                lock: name.to_owned(),
                session,
                has,
                asked,
            }),
            _ => None,
        };
        // A retry changes nothing but the attempt it answers to.
        if let Some(holding) = semaphore.holders.get_mut(&session) {
            if let Some(refused) = other_mode(holding.want) {
                return Err(refused);
            }
            holding.attempt = later_attempt(holding.attempt, attempt);
            return Ok(AcquireOutcome::Granted {
                token: holding.permits[0].token,
            });
        }
        let queued = semaphore.queue.iter().position(|r| r.session == session);
        if let Some(refused) = queued.and_then(|index| other_mode(semaphore.queue[index].want)) {
            return Err(refused);
        }
        if let (Some(index), true) = (queued, wait) {
            let waiting = &mut semaphore.queue[index];
            waiting.attempt = later_attempt(waiting.attempt, attempt);
            return Ok(AcquireOutcome::Queued {
                position: index + 1,
            });
        }
        if semaphore.queue.is_empty() && semaphore.fits(want) {
            let asked = Request {
                session,
                want,
                attempt,
                value,
            };
            let token = grant(semaphore, next_token, asked, name, events);
            self.link(session, name);
            return Ok(AcquireOutcome::Granted { token });
        }
        if !wait {
            let busy = semaphore.busy(name, want);
            self.remove_if_unused(name);
            return Err(busy);
        }
        if semaphore.queue.len() >= max_waiters {
            return Err(LockError::TooManyWaiters {
                lock: name.to_owned(),
                limit: max_waiters,
            });
        }
        semaphore.queue.push_back(Request {
            session,
            want,
            attempt,
            value,
        });
        let position = semaphore.queue.len();
        events.push(Event::Queued {
            lock: name.into(),
            session,
        });
        self.link(session, name);
        Ok(AcquireOutcome::Queued { position })
    }

    /// Gives back the permits `session` holds of `name`, named by `token`
    /// (the grant's first).
    pub(crate) fn release(
        &mut self,
        next_token: &mut u64,
        session: SessionId,
        name: &str,
        token: Token,
        events: &mut Vec<Event>,
    ) -> Result<(), LockError> {
        let not_holder = || LockError::NotHolder {
            lock: name.to_owned(),
            session,
        };
        let semaphore = self.by_name.get(name).ok_or_else(not_holder)?;
        let held = semaphore.holders.get(&session).ok_or_else(not_holder)?;
        let first = held.permits[0].token;
        if first != token {
            return Err(LockError::StaleToken {
                lock: name.to_owned(),
                presented: token,
                current: first,
            });
        }
        self.leave(next_token, session, name, events);
        Ok(())
    }

    /// Leaves the queue of `name`; the grant's token if it came first.
    pub(crate) fn cancel_wait(
        &mut self,
        next_token: &mut u64,
        session: SessionId,
        name: &str,
        events: &mut Vec<Event>,
    ) -> Option<Token> {
        let semaphore = self.by_name.get(name)?;
        if let Some(holding) = semaphore.holders.get(&session) {
            return Some(holding.permits[0].token);
        }
        if semaphore.queue.iter().any(|r| r.session == session) {
            self.leave(next_token, session, name, events);
        }
        None
    }

    /// The caller of `attempt` went away: if no later attempt came, give up
    /// the wait or the grant. The grant's token if one was released.
    pub(crate) fn abandon(
        &mut self,
        next_token: &mut u64,
        session: SessionId,
        name: &str,
        attempt: u64,
        events: &mut Vec<Event>,
    ) -> Option<Token> {
        let semaphore = self.by_name.get(name)?;
        let (latest, released) = match semaphore.holders.get(&session) {
            Some(holding) => (holding.attempt, Some(holding.permits[0].token)),
            None => {
                let request = semaphore.queue.iter().find(|r| r.session == session)?;
                (request.attempt, None)
            }
        };
        if attempt == 0 || latest != attempt {
            return None;
        }
        self.leave(next_token, session, name, events);
        released
    }

    /// Everything `session` holds or waits for ends (its session did).
    pub(crate) fn end_session(
        &mut self,
        next_token: &mut u64,
        session: SessionId,
        events: &mut Vec<Event>,
    ) {
        let names = self.by_session.get(&session).cloned().unwrap_or_default();
        for name in &names {
            self.leave(next_token, session, name, events);
        }
    }

    /// Takes `session` out of `name` (as holder or waiter), then grants
    /// whoever now fits at the head of the queue.
    fn leave(
        &mut self,
        next_token: &mut u64,
        session: SessionId,
        name: &str,
        events: &mut Vec<Event>,
    ) {
        let semaphore = self.by_name.get_mut(name).expect("left semaphore exists");
        if let Some(holding) = semaphore.holders.remove(&session) {
            events.push(Event::Released {
                lock: name.into(),
                session,
                token: holding.permits[0].token,
            });
        } else {
            semaphore.queue.retain(|r| r.session != session);
            events.push(Event::WaitEnded {
                lock: name.into(),
                session,
            });
        }
        self.unlink(session, name);
        // A request that left may have held back smaller ones behind it.
        self.grant_from_head(next_token, name, events);
        self.remove_if_unused(name);
    }

    /// Grants the requests at the head of `name`'s queue while they fit.
    /// Granted waiters stay linked: they waited, and now they hold.
    fn grant_from_head(&mut self, next_token: &mut u64, name: &str, events: &mut Vec<Event>) {
        let semaphore = self.by_name.get_mut(name).expect("semaphore exists");
        while let Some(head) = semaphore.queue.front() {
            if !semaphore.fits(head.want) {
                break;
            }
            let head = semaphore.queue.pop_front().expect("head exists");
            grant(semaphore, next_token, head, name, events);
        }
    }

    /// Creates the semaphore `name` with `capacity` permits, kept while
    /// nobody holds it, or gives the one that exists that capacity: raised,
    /// the requests at the head of its queue that now fit are granted;
    /// lowered below what is held, nothing is taken back, but nothing is
    /// granted until enough is released. The caller checked the name and
    /// the room for a new one.
    pub(crate) fn define(
        &mut self,
        next_token: &mut u64,
        name: &str,
        capacity: u32,
        events: &mut Vec<Event>,
    ) -> Result<(), LockError> {
        if !(1..=MAX_PERMITS).contains(&capacity) {
            return Err(LockError::InvalidPermits {
                semaphore: name.to_owned(),
                capacity,
                count: 1,
                max: MAX_PERMITS,
            });
        }
        let rule = Rule::Permits { capacity };
        if let Some(other) = self.by_name.get(name).map(|s| s.rule.kind()) {
            if other != rule.kind() {
                return Err(LockError::WrongKind {
                    name: name.to_owned(),
                    kind: other.to_owned(),
                    asked: rule.kind().to_owned(),
                });
            }
        }
        let semaphore = self
            .by_name
            .entry(name.to_owned())
            .or_insert_with(|| Semaphore::new(rule, true));
        semaphore.rule = rule;
        semaphore.defined = true;
        // A request for more than the new capacity could never be granted,
        // and would hold back everyone behind it: it ends, ungranted.
        let (too_big, fitting) = std::mem::take(&mut semaphore.queue)
            .into_iter()
            .partition(|request| permits_of(request.want) > capacity);
        semaphore.queue = fitting;
        for request in Vec::from(too_big) {
            events.push(Event::WaitEnded {
                lock: name.into(),
                session: request.session,
            });
            self.unlink(request.session, name);
        }
        self.grant_from_head(next_token, name, events);
        Ok(())
    }

    /// Drops the definition of the semaphore `name`: it goes once nobody
    /// holds or waits on it (at once if nobody does). Permits held stay.
    pub(crate) fn delete(&mut self, name: &str) -> Result<(), LockError> {
        let semaphore = self
            .by_name
            .get_mut(name)
            .filter(|semaphore| semaphore.capacity().is_some());
        let semaphore = match semaphore {
            Some(semaphore) if semaphore.defined => semaphore,
            // Held, but made by its first acquirer: nothing to delete.
            Some(_) => {
                return Err(LockError::NotDefined {
                    semaphore: name.to_owned(),
                })
            }
            None => {
                return Err(LockError::NoSuchSemaphore {
                    semaphore: name.to_owned(),
                })
            }
        };
        semaphore.defined = false;
        self.remove_if_unused(name);
        Ok(())
    }

    fn link(&mut self, session: SessionId, name: &str) {
        self.by_session
            .entry(session)
            .or_default()
            .insert(name.to_owned());
    }

    fn unlink(&mut self, session: SessionId, name: &str) {
        if let Some(names) = self.by_session.get_mut(&session) {
            names.remove(name);
            if names.is_empty() {
                self.by_session.remove(&session);
            }
        }
    }

    fn remove_if_unused(&mut self, name: &str) {
        if self.by_name.get(name).is_some_and(Semaphore::is_unused) {
            self.by_name.remove(name);
        }
    }

    /// Whether `token` is a live permit of `name` (a fenced write naming
    /// the semaphore must carry one).
    pub fn holds_permit(&self, name: &str, token: Token) -> bool {
        self.by_name.get(name).is_some_and(|semaphore| {
            semaphore
                .holders
                .values()
                .any(|holding| holding.permits.iter().any(|p| p.token == token))
        })
    }

    /// The newest (highest) token among `name`'s live permits.
    pub fn newest_permit(&self, name: &str) -> Option<Token> {
        let semaphore = self.by_name.get(name)?;
        let permits = semaphore.holders.values().flat_map(|h| h.permits.iter());
        permits.map(|permit| permit.token).max()
    }

    /// The permits `session` holds of `name`.
    pub fn permits(&self, session: SessionId, name: &str) -> Option<&[Permit]> {
        let holding = self.by_name.get(name)?.holders.get(&session)?;
        Some(&holding.permits)
    }

    pub(crate) fn holds_or_waits(&self, session: SessionId, name: &str) -> bool {
        self.by_session
            .get(&session)
            .is_some_and(|names| names.contains(name))
    }

    /// Whether an acquire of `want` of `name` by `session` would queue,
    /// applied now.
    pub(crate) fn acquire_would_queue(&self, session: SessionId, name: &str, want: Want) -> bool {
        self.by_name.get(name).is_some_and(|semaphore| {
            !semaphore.holders.contains_key(&session)
                && semaphore.rule.kind() == want.kind()
                && (!semaphore.queue.is_empty() || !semaphore.fits(want))
        })
    }

    /// The rule of the name, if it exists.
    pub fn rule(&self, name: &str) -> Option<Rule> {
        self.by_name.get(name).map(|semaphore| semaphore.rule)
    }

    /// What `session` holds of `name`, if anything.
    pub fn held_by(&self, session: SessionId, name: &str) -> Option<Want> {
        self.holding(session, name).map(|(want, _)| want)
    }

    /// What `session` holds of `name`, if anything, and its value (an
    /// election leader's; empty for the other kinds).
    pub(crate) fn holding(&self, session: SessionId, name: &str) -> Option<(Want, &str)> {
        let holding = self.by_name.get(name)?.holders.get(&session)?;
        Some((holding.want, &holding.value))
    }

    /// The leader of `name`, if it is an election, proclaims `value`; only
    /// the leader may, with its token (the term it was elected in).
    pub(crate) fn proclaim(
        &mut self,
        session: SessionId,
        name: &str,
        token: Token,
        value: String,
    ) -> Result<(), LockError> {
        if value.len() > MAX_ELECTION_VALUE {
            return Err(LockError::ValueTooLarge {
                bytes: value.len(),
                limit: MAX_ELECTION_VALUE,
            });
        }
        let not_leader = || LockError::NotHolder {
            lock: name.to_owned(),
            session,
        };
        let election = self
            .by_name
            .get_mut(name)
            .filter(|election| election.rule == Rule::Election)
            .ok_or_else(not_leader)?;
        let leader = election.holders.get_mut(&session).ok_or_else(not_leader)?;
        let term = leader.permits[0].token;
        if term != token {
            return Err(LockError::StaleToken {
                lock: name.to_owned(),
                presented: token,
                current: term,
            });
        }
        leader.value = value;
        Ok(())
    }

    /// The election `name` (none if it is not one).
    pub fn election(&self, name: &str) -> Option<ElectionInfo> {
        let election = self.by_name.get(name)?;
        if election.rule != Rule::Election {
            return None;
        }
        let (session, leader) = election.holders.iter().next()?;
        Some(ElectionInfo {
            name: name.to_owned(),
            leader: (*session, leader.permits[0].token, leader.value.clone()),
            candidates: election.queue.iter().map(|r| r.session).collect(),
        })
    }

    /// Whether `token` is the live exclusive hold of the read/write lock
    /// `name` (a fenced write naming it must carry one).
    pub fn holds_exclusive(&self, name: &str, token: Token) -> bool {
        self.by_name.get(name).is_some_and(|semaphore| {
            semaphore.holders.values().any(|holding| {
                holding.want == Want::Rw(RwMode::Exclusive) && holding.permits[0].token == token
            })
        })
    }

    /// The counting semaphore `name` (none if it is a read/write lock).
    pub fn semaphore(&self, name: &str) -> Option<SemaphoreInfo> {
        let semaphore = self.by_name.get(name)?;
        Some(SemaphoreInfo {
            name: name.to_owned(),
            capacity: semaphore.capacity()?,
            holders: semaphore
                .holders
                .iter()
                .map(|(session, holding)| (*session, holding.permits.clone()))
                .collect(),
            waiters: semaphore
                .queue
                .iter()
                .map(|request| (request.session, permits_of(request.want)))
                .collect(),
            defined: semaphore.defined,
        })
    }

    /// The read/write lock `name` (none if it is a counting semaphore).
    pub fn rw_lock(&self, name: &str) -> Option<RwLockInfo> {
        let semaphore = self.by_name.get(name)?;
        if semaphore.rule != Rule::ReadWrite {
            return None;
        }
        Some(RwLockInfo {
            name: name.to_owned(),
            holders: semaphore
                .holders
                .iter()
                .map(|(session, holding)| {
                    (*session, mode_of(holding.want), holding.permits[0].token)
                })
                .collect(),
            waiters: semaphore
                .queue
                .iter()
                .map(|request| (request.session, mode_of(request.want)))
                .collect(),
        })
    }

    /// Counting semaphores in name order, starting after `after` (for
    /// paging).
    pub fn semaphores_after<'a>(
        &'a self,
        after: &'a str,
    ) -> impl Iterator<Item = SemaphoreInfo> + 'a {
        use std::ops::Bound;
        self.by_name
            .range::<_, str>((Bound::Excluded(after), Bound::Unbounded))
            .filter_map(|(name, _)| self.semaphore(name))
    }

    /// Read/write locks in name order, starting after `after` (for paging).
    pub fn rw_locks_after<'a>(&'a self, after: &'a str) -> impl Iterator<Item = RwLockInfo> + 'a {
        use std::ops::Bound;
        self.by_name
            .range::<_, str>((Bound::Excluded(after), Bound::Unbounded))
            .filter_map(|(name, _)| self.rw_lock(name))
    }

    /// Every (session, semaphore) wait.
    pub(crate) fn waits(&self) -> impl Iterator<Item = (SessionId, &str)> + '_ {
        self.by_name.iter().flat_map(|(name, semaphore)| {
            semaphore
                .queue
                .iter()
                .map(move |request| (request.session, name.as_str()))
        })
    }

    /// Panics if a semaphore breaks a rule: more permits out than its
    /// capacity, two live permits on one slot, a dead or doubly listed
    /// session, a token not below `next_token`, tokens of a grant out of
    /// order, or an index that disagrees with the semaphores.
    pub(crate) fn check_invariants(&self, next_token: u64, is_live: impl Fn(SessionId) -> bool) {
        let mut linked: BTreeMap<SessionId, BTreeSet<&str>> = BTreeMap::new();
        for (name, semaphore) in &self.by_name {
            assert!(!semaphore.is_unused(), "unused semaphore {name:?} kept");
            let kind = semaphore.rule.kind();
            match semaphore.rule {
                // Held may exceed a capacity a definition lowered since:
                // `grant` asserts that no grant ever exceeds it.
                Rule::Permits { capacity } => assert!((1..=MAX_PERMITS).contains(&capacity)),
                Rule::Election => {
                    assert!(
                        semaphore.holders.len() <= 1,
                        "election {name:?} has two leaders"
                    );
                }
                Rule::ReadWrite => {
                    let exclusive = semaphore
                        .holders
                        .values()
                        .filter(|h| h.want == Want::Rw(RwMode::Exclusive))
                        .count();
                    assert!(
                        exclusive == 0 || semaphore.holders.len() == 1,
                        "read/write lock {name:?} has an exclusive holder beside others"
                    );
                }
            }
            let mut slots = BTreeSet::new();
            for (session, holding) in &semaphore.holders {
                assert!(is_live(*session), "dead session {session} holds {name:?}");
                assert_eq!(holding.want.kind(), kind, "{name:?} mixes kinds");
                assert_eq!(holding.permits.len() as u32, permits_of(holding.want));
                for pair in holding.permits.windows(2) {
                    assert!(pair[0].token < pair[1].token, "a grant's tokens go back");
                }
                for permit in &holding.permits {
                    assert!(permit.token.0 < next_token, "permit token not issued");
                    // A permit granted before a definition lowered the
                    // capacity keeps its slot.
                    let ever = semaphore.capacity().map_or(1, |_| MAX_PERMITS);
                    assert!(permit.slot < ever, "slot out of range");
                    assert!(
                        slots.insert(permit.slot) || semaphore.rule == Rule::ReadWrite,
                        "two permits on slot {}",
                        permit.slot
                    );
                }
                linked.entry(*session).or_default().insert(name);
            }
            // The head of a queue waits only because it does not fit.
            if let Some(head) = semaphore.queue.front() {
                assert!(
                    !semaphore.fits(head.want),
                    "head of {name:?} fits but waits"
                );
            }
            for request in &semaphore.queue {
                assert!(is_live(request.session), "dead session queued on {name:?}");
                assert_eq!(request.want.kind(), kind, "{name:?} mixes kinds");
                if let (Some(capacity), Want::Permits(count)) = (semaphore.capacity(), request.want)
                {
                    assert!((1..=capacity).contains(&count));
                }
                assert!(
                    !semaphore.holders.contains_key(&request.session),
                    "holder of {name:?} also waits on it"
                );
                assert!(
                    linked.entry(request.session).or_default().insert(name),
                    "session {} queued twice on {name:?}",
                    request.session
                );
            }
        }
        let index: BTreeMap<SessionId, BTreeSet<&str>> = self
            .by_session
            .iter()
            .map(|(session, names)| (*session, names.iter().map(String::as_str).collect()))
            .collect();
        assert_eq!(
            index, linked,
            "the session index disagrees with the semaphores"
        );
    }
}

/// Grants `request`: for permits, one token each on the lowest free slots;
/// for a read/write hold or a campaign, one token. Returns the first
/// token, which names the grant.
fn grant(
    semaphore: &mut Semaphore,
    next_token: &mut u64,
    request: Request,
    name: &str,
    events: &mut Vec<Event>,
) -> Token {
    let Request {
        session,
        want,
        attempt,
        value,
    } = request;
    let count = permits_of(want);
    let slots = match want {
        Want::Permits(count) => semaphore.free_slots(count),
        Want::Rw(_) | Want::Campaign => vec![0],
    };
    let permits: Vec<Permit> = slots
        .into_iter()
        .map(|slot| Permit {
            token: Token::take_next(next_token),
            slot,
        })
        .collect();
    assert_eq!(permits.len(), count as usize, "granted without free slots");
    let token = permits[0].token;
    let holding = Holding {
        want,
        permits,
        attempt,
        value,
    };
    semaphore.holders.insert(session, holding);
    // Never more permits out than the capacity, each on a slot below it.
    if let Some(capacity) = semaphore.capacity() {
        assert!(
            semaphore.held() <= capacity,
            "{name:?}: granted past capacity"
        );
        let slots = &semaphore.holders[&session].permits;
        assert!(slots.iter().all(|permit| permit.slot < capacity));
    }
    events.push(Event::Granted {
        lock: name.into(),
        session,
        token,
    });
    token
}

/// How many permits (tokens) a grant of `want` takes.
fn permits_of(want: Want) -> u32 {
    match want {
        Want::Permits(count) => count,
        Want::Rw(_) | Want::Campaign => 1,
    }
}

/// The mode of a read/write lock's hold or request.
fn mode_of(want: Want) -> RwMode {
    match want {
        Want::Rw(mode) => mode,
        Want::Permits(_) | Want::Campaign => unreachable!("{want:?} of a read/write lock"),
    }
}

/// The attempt an abandonment must name, after an acquire with `attempt`:
/// the newer one, and none (0) once an anonymous acquire came, as for locks.
fn later_attempt(known: u64, attempt: u64) -> u64 {
    match (known, attempt) {
        (0, _) | (_, 0) => 0,
        (known, attempt) => known.max(attempt),
    }
}
