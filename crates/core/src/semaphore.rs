//! [`Semaphores`]: named counting semaphores, kept in the replicated table
//! beside the locks.
//!
//! Why in the state machine and not a client recipe: the recipes leak.
//! Redisson's semaphore permits outlive a crashed holder, and Curator's
//! lease nodes depend on every client cleaning up after itself. Here a
//! permit belongs to a session and ends with it, the queue is FIFO for
//! every request size, and every permit takes a token from the table's one
//! counter, so a resource can fence per permit as it fences a lock.
//!
//! The rules (docs/semaphores.md):
//! - The first acquire of a name creates the semaphore with the capacity it
//!   names; while it exists, an acquire naming another capacity is refused
//!   (never a silent change). A semaphore nobody holds or waits on is
//!   removed, as a free lock is.
//! - A session has at most one grant per semaphore, of `count` permits; an
//!   acquire it repeats (a retry) gets the same grant, or the same place.
//! - FIFO: requests are granted in the order they came. A request for k
//!   permits that do not fit yet holds back every request behind it, so a
//!   stream of requests for one permit cannot starve it.
//! - Each permit of a grant takes the next token and the lowest free slot
//!   (0..capacity): no two live permits share a slot, so a resource with N
//!   slots (connections, GPUs, shards) fences each slot with its tokens.
//!   The grant is named by its first token (releases present it).

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
    by_name: imbl::OrdMap<String, Semaphore>,
    by_session: imbl::OrdMap<SessionId, BTreeSet<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Semaphore {
    capacity: u32,
    holders: BTreeMap<SessionId, Holding>,
    queue: VecDeque<Request>,
}

/// The permits one session holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Holding {
    permits: Vec<Permit>,
    /// The latest acquire attempt (see [`crate::Command::Abandon`]).
    attempt: u64,
}

/// A request waiting in a semaphore's queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Request {
    session: SessionId,
    count: u32,
    attempt: u64,
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
}

/// What an acquire asks for (see [`crate::Command::AcquirePermits`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PermitRequest {
    pub capacity: u32,
    pub count: u32,
    pub wait: bool,
    pub attempt: u64,
}

impl Semaphore {
    fn held(&self) -> u32 {
        self.holders
            .values()
            .map(|holding| holding.permits.len() as u32)
            .sum()
    }

    fn free(&self) -> u32 {
        self.capacity - self.held()
    }

    fn is_unused(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty()
    }

    /// The `count` lowest slots no holder has.
    fn free_slots(&self, count: u32) -> Vec<u32> {
        let taken: BTreeSet<u32> = self
            .holders
            .values()
            .flat_map(|holding| holding.permits.iter().map(|permit| permit.slot))
            .collect();
        (0..self.capacity)
            .filter(|slot| !taken.contains(slot))
            .take(count as usize)
            .collect()
    }
}

impl Semaphores {
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Takes `request.count` permits of `name` for `session`, creating the
    /// semaphore if it does not exist (the caller checked that the name is
    /// no lock, the session is live and there is room for a new name).
    pub(crate) fn acquire(
        &mut self,
        next_token: &mut u64,
        session: SessionId,
        name: &str,
        request: PermitRequest,
        max_waiters: usize,
        events: &mut Vec<Event>,
    ) -> Result<AcquireOutcome, LockError> {
        let PermitRequest {
            capacity,
            count,
            wait,
            attempt,
        } = request;
        if !(1..=MAX_PERMITS).contains(&capacity) || !(1..=capacity).contains(&count) {
            return Err(LockError::InvalidPermits {
                semaphore: name.to_owned(),
                capacity,
                count,
                max: MAX_PERMITS,
            });
        }
        let semaphore = self
            .by_name
            .entry(name.to_owned())
            .or_insert_with(|| Semaphore {
                capacity,
                holders: BTreeMap::new(),
                queue: VecDeque::new(),
            });
        if semaphore.capacity != capacity {
            return Err(LockError::CapacityMismatch {
                semaphore: name.to_owned(),
                capacity: semaphore.capacity,
                requested: capacity,
            });
        }
        // A retry changes nothing but the attempt it answers to.
        if let Some(holding) = semaphore.holders.get_mut(&session) {
            holding.attempt = later_attempt(holding.attempt, attempt);
            return Ok(AcquireOutcome::Granted {
                token: holding.permits[0].token,
            });
        }
        let queued = semaphore.queue.iter().position(|r| r.session == session);
        if let (Some(index), true) = (queued, wait) {
            let waiting = &mut semaphore.queue[index];
            waiting.attempt = later_attempt(waiting.attempt, attempt);
            return Ok(AcquireOutcome::Queued {
                position: index + 1,
            });
        }
        let fits = semaphore.queue.is_empty() && count <= semaphore.free();
        if fits {
            let token = grant(semaphore, next_token, session, count, attempt, name, events);
            self.link(session, name);
            return Ok(AcquireOutcome::Granted { token });
        }
        if !wait {
            let free = semaphore.free();
            let queued = semaphore.queue.len();
            self.remove_if_unused(name);
            return Err(LockError::NoPermits {
                semaphore: name.to_owned(),
                free,
                queued,
                asked: count,
            });
        }
        if semaphore.queue.len() >= max_waiters {
            return Err(LockError::TooManyWaiters {
                lock: name.to_owned(),
                limit: max_waiters,
            });
        }
        semaphore.queue.push_back(Request {
            session,
            count,
            attempt,
        });
        let position = semaphore.queue.len();
        events.push(Event::Queued {
            lock: name.to_owned(),
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
                lock: name.to_owned(),
                session,
                token: holding.permits[0].token,
            });
        } else {
            semaphore.queue.retain(|r| r.session != session);
            events.push(Event::WaitEnded {
                lock: name.to_owned(),
                session,
            });
        }
        self.unlink(session, name);
        // A request that left may have held back smaller ones behind it.
        // Granted waiters stay linked: they waited, and now they hold.
        let semaphore = self.by_name.get_mut(name).expect("left semaphore exists");
        while let Some(head) = semaphore.queue.front() {
            if head.count > semaphore.free() {
                break;
            }
            let head = semaphore.queue.pop_front().expect("head exists");
            grant(
                semaphore,
                next_token,
                head.session,
                head.count,
                head.attempt,
                name,
                events,
            );
        }
        self.remove_if_unused(name);
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

    /// Whether an acquire of `count` permits of `name` by `session` would
    /// queue, applied now.
    pub(crate) fn acquire_would_queue(&self, session: SessionId, name: &str, count: u32) -> bool {
        self.by_name.get(name).is_some_and(|semaphore| {
            !semaphore.holders.contains_key(&session)
                && (!semaphore.queue.is_empty() || count > semaphore.free())
        })
    }

    pub fn semaphore(&self, name: &str) -> Option<SemaphoreInfo> {
        let semaphore = self.by_name.get(name)?;
        Some(SemaphoreInfo {
            name: name.to_owned(),
            capacity: semaphore.capacity,
            holders: semaphore
                .holders
                .iter()
                .map(|(session, holding)| (*session, holding.permits.clone()))
                .collect(),
            waiters: semaphore
                .queue
                .iter()
                .map(|request| (request.session, request.count))
                .collect(),
        })
    }

    /// Semaphores in name order, starting after `after` (for paging).
    pub fn semaphores_after<'a>(
        &'a self,
        after: &'a str,
    ) -> impl Iterator<Item = SemaphoreInfo> + 'a {
        use std::ops::Bound;
        self.by_name
            .range::<_, str>((Bound::Excluded(after), Bound::Unbounded))
            .map(|(name, _)| self.semaphore(name).expect("listed semaphore exists"))
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
            assert!((1..=MAX_PERMITS).contains(&semaphore.capacity));
            assert!(
                semaphore.held() <= semaphore.capacity,
                "semaphore {name:?} has {} permits out of {}",
                semaphore.held(),
                semaphore.capacity
            );
            let mut slots = BTreeSet::new();
            for (session, holding) in &semaphore.holders {
                assert!(is_live(*session), "dead session {session} holds {name:?}");
                assert!(!holding.permits.is_empty());
                for pair in holding.permits.windows(2) {
                    assert!(pair[0].token < pair[1].token, "a grant's tokens go back");
                }
                for permit in &holding.permits {
                    assert!(permit.token.0 < next_token, "permit token not issued");
                    assert!(permit.slot < semaphore.capacity, "slot out of range");
                    assert!(
                        slots.insert(permit.slot),
                        "two permits on slot {}",
                        permit.slot
                    );
                }
                linked.entry(*session).or_default().insert(name);
            }
            // The head of a queue waits only because it does not fit.
            if let Some(head) = semaphore.queue.front() {
                assert!(
                    head.count > semaphore.free(),
                    "head of {name:?} fits but waits"
                );
            }
            for request in &semaphore.queue {
                assert!(is_live(request.session), "dead session queued on {name:?}");
                assert!((1..=semaphore.capacity).contains(&request.count));
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

/// Gives `count` permits of `semaphore` to `session`: one token each, on
/// the lowest free slots. Returns the first token, which names the grant.
fn grant(
    semaphore: &mut Semaphore,
    next_token: &mut u64,
    session: SessionId,
    count: u32,
    attempt: u64,
    name: &str,
    events: &mut Vec<Event>,
) -> Token {
    let permits: Vec<Permit> = semaphore
        .free_slots(count)
        .into_iter()
        .map(|slot| Permit {
            token: crate::table::take_token(next_token),
            slot,
        })
        .collect();
    assert_eq!(permits.len(), count as usize, "granted without free slots");
    let token = permits[0].token;
    semaphore
        .holders
        .insert(session, Holding { permits, attempt });
    events.push(Event::Granted {
        lock: name.to_owned(),
        session,
        token,
    });
    token
}

/// The attempt an abandonment must name, after an acquire with `attempt`:
/// the newer one, and none (0) once an anonymous acquire came, as for locks.
fn later_attempt(known: u64, attempt: u64) -> u64 {
    match (known, attempt) {
        (0, _) | (_, 0) => 0,
        (known, attempt) => known.max(attempt),
    }
}
