//! [`LockTable`]: the replicated state. Sessions, locks, wait queues and the
//! token counter, changed only by [`LockTable::apply`].
//!
//! Invariants (checked by [`LockTable::check_invariants`], which the property
//! tests call after every step):
//! - a lock has at most one holder, and that holder is a live session;
//! - a session is never both the holder of and a waiter on the same lock, and
//!   waits at most once per lock;
//! - a lock with no holder has no waiters (the head of a queue is granted in
//!   the same step that frees the lock) and is removed from the table; the
//!   one exception is a lock in lock-delay, which keeps its lost grant (of an
//!   expired session) and its queue until the delay ends;
//! - every token handed out is smaller than `next_token`, which only grows;
//! - every fence in the fenced store is a token that was handed out.
//!
//! Its length (about 1,420 lines) is `LockTable::apply` and its commands over
//! one state (sessions, locks, queues, the two counters): each command's
//! effect keeps that state's invariants, which `check_invariants` asserts in
//! the same file; semaphores and read/write locks are already their own
//! (`semaphore.rs`), as are the store, the ACL and the audit trail.

use crate::acl::{AccessControl, AclCommand, CredentialEnds};
use crate::audit::{self, AuditKind, AuditRecord};
use crate::command::{Applied, SessionEnd};
use crate::fenced::Change;
use crate::limits::validate_lock_delay;
use crate::semaphore::ShareRequest;
use crate::watch::{self, WatchEvent};
use crate::{
    validate_key, validate_lock_name, validate_ttl, validate_value, AcquireOutcome, Command, Event,
    FeatureLevel, FencedStore, Limits, LockError, Outcome, SecretHash, Semaphores, SessionId,
    TableLimits, Token,
};
use crate::{Rule, RwLockInfo, RwMode, Want};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// The whole replicated lock state. Ordered maps keep iteration, and hence
/// snapshots and multi-lock releases, identical on every replica. The big
/// maps are persistent (`imbl`): a clone shares them and costs O(1), so a
/// snapshot of a million locks takes the state lock for about a millisecond
/// and is encoded from the clone while applies go on (the encoding in place
/// stalled every request for up to a second: docs/performance.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockTable {
    #[serde(deserialize_with = "crate::bounded::ord_map")]
    sessions: imbl::OrdMap<SessionId, Session>,
    #[serde(deserialize_with = "crate::bounded::ord_map")]
    locks: imbl::OrdMap<String, Lock>,
    store: FencedStore,
    next_session: u64,
    next_token: u64,
    /// Commands applied so far: the audit trail's timeline.
    applied: u64,
    /// The newest audit records, oldest first.
    audit: VecDeque<AuditRecord>,
    /// Who may do what; off until bootstrapped.
    acl: AccessControl,
    /// The limits an admin may change ([`Command::SetLimits`]). Last, so
    /// that [`LockTableV9`] (the same fields without it) reads the older
    /// encoding.
    limits: TableLimits,
    /// The cluster version ([`Command::SetClusterVersion`]). Not in the
    /// table's own encoding, which stays release 0.1.0's: the store and
    /// backups write it beside the table, and only once it is above
    /// [`FeatureLevel::BASE`] (see [`LockTable::with_cluster_version`]).
    #[serde(skip)]
    cluster_version: FeatureLevel,
    /// The counting semaphores (see `semaphore.rs`), from
    /// [`FeatureLevel::SEMAPHORES`] on. Not in the table's own encoding
    /// either: the table image writes them after it, at that level.
    #[serde(skip)]
    semaphores: Semaphores,
}

/// A [`LockTable`] as data format 9 and backup version 1 encoded it
/// (bincode has no field names: a struct is its fields in order), before
/// the table held its limits. Decode the old bytes as this and turn it into
/// a table with [`TableLimits::DEFAULT`], the limits it ran with.
#[derive(Debug, Deserialize)]
pub struct LockTableV9 {
    #[serde(deserialize_with = "crate::bounded::ord_map")]
    sessions: imbl::OrdMap<SessionId, Session>,
    #[serde(deserialize_with = "crate::bounded::ord_map")]
    locks: imbl::OrdMap<String, Lock>,
    store: FencedStore,
    next_session: u64,
    next_token: u64,
    applied: u64,
    audit: VecDeque<AuditRecord>,
    acl: AccessControl,
}

impl From<LockTableV9> for LockTable {
    fn from(old: LockTableV9) -> Self {
        LockTable {
            sessions: old.sessions,
            locks: old.locks,
            store: old.store,
            next_session: old.next_session,
            next_token: old.next_token,
            applied: old.applied,
            audit: old.audit,
            acl: old.acl,
            limits: TableLimits::DEFAULT,
            cluster_version: FeatureLevel::BASE,
            semaphores: Semaphores::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Session {
    ttl_ms: u64,
    /// The hash of the secret the session was opened with; every call on
    /// the session must present that secret (the server checks it).
    secret: SecretHash,
    /// The identity that opened it; only that identity may act on it.
    owner: Option<String>,
    /// Set by [`Command::CheckpointLease`]: the lease had at most this many
    /// milliseconds left when the leader checkpointed it, and no keepalive
    /// has been acknowledged since. A new leader may start the session with
    /// this rather than the full TTL.
    checkpoint_ms: Option<u64>,
    /// How many [`Command::LeaseRenewed`] have been applied: a checkpoint
    /// proposed before the latest renewal is out of date and ignored.
    renewals: u64,
    held: BTreeSet<String>,
    waiting: BTreeSet<String>,
    /// The latest acquire attempt on each lock held or waited on.
    attempts: BTreeMap<String, u64>,
    /// Lock-delay asked for on each lock held or waited on (none: 0).
    lock_delays: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Lock {
    holder: SessionId,
    token: Token,
    queue: VecDeque<SessionId>,
    /// `Some(ms)`: the holder's session expired and the lock is in
    /// lock-delay (`holder` and `token` are the lost grant's) until the
    /// leader's timer commits [`Command::EndLockDelay`].
    delay_ms: Option<u64>,
}

/// A live session, for listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub id: SessionId,
    pub ttl: Duration,
    /// How many locks it holds, and how many it waits for.
    pub held: usize,
    pub waiting: usize,
}

/// What a new leader needs to know of a session's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLease {
    pub ttl: Duration,
    /// The lease time left at the latest checkpoint, if no keepalive has been
    /// acknowledged since (see [`Command::CheckpointLease`]).
    pub checkpoint: Option<Duration>,
    /// Renewals applied so far, to stamp the next checkpoint with.
    pub renewals: u64,
}

impl SessionLease {
    /// The lease of a session that has just been opened.
    pub fn fresh(ttl: Duration) -> Self {
        SessionLease {
            ttl,
            checkpoint: None,
            renewals: 0,
        }
    }
}

/// What [`LockTable::session_secret`] knows of a session id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionSecret<'a> {
    /// Open, with the hash of its secret and the identity that opened it.
    Live {
        secret: &'a SecretHash,
        owner: Option<&'a str>,
    },
    /// Closed or expired; it never comes back.
    Ended,
    /// No session has this id yet (as far as this table has applied).
    NotYetOpened,
}

/// A read-only view of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    pub name: String,
    pub holder: SessionId,
    pub token: Token,
    /// Waiting sessions, next in line first.
    pub waiters: Vec<SessionId>,
    /// In lock-delay: `holder` is the expired session whose grant `token`
    /// was, and nobody holds the lock until the delay ends.
    pub delayed: bool,
    /// A read/write lock's holders and waiters with their modes; `holder`
    /// is then its first holder and `token` its newest hold's. `None` for
    /// a lock.
    pub rw: Option<RwLockInfo>,
}

impl Default for LockTable {
    fn default() -> Self {
        Self::new()
    }
}

impl LockTable {
    pub fn new() -> Self {
        LockTable {
            sessions: imbl::OrdMap::new(),
            locks: imbl::OrdMap::new(),
            store: FencedStore::default(),
            next_session: 1,
            next_token: 1,
            applied: 0,
            audit: VecDeque::new(),
            acl: AccessControl::default(),
            limits: TableLimits::DEFAULT,
            cluster_version: FeatureLevel::BASE,
            semaphores: Semaphores::default(),
        }
    }

    /// The cluster version: the feature level the replicated state may use.
    pub fn cluster_version(&self) -> FeatureLevel {
        self.cluster_version
    }

    /// A table decoded from a snapshot or backup, with the cluster version
    /// that was recorded beside it. For decoding only: a running table
    /// changes its version by [`Command::SetClusterVersion`].
    pub fn with_cluster_version(mut self, level: FeatureLevel) -> Self {
        self.cluster_version = level;
        self
    }

    /// A table decoded from a snapshot or backup, with the credential
    /// expiries and deny list that were recorded after it.
    pub fn with_credential_ends(mut self, ends: CredentialEnds) -> Self {
        self.acl = self.acl.with_ends(ends);
        self
    }

    /// The counting semaphores.
    pub fn semaphores(&self) -> &Semaphores {
        &self.semaphores
    }

    /// A table decoded from a snapshot or backup, with the semaphores
    /// that were recorded after it.
    pub fn with_semaphores(mut self, semaphores: Semaphores) -> Self {
        self.semaphores = semaphores;
        self
    }

    /// The limits this table enforces: [`Limits::STANDARD`] with the
    /// configurable ones as last set.
    pub fn limits(&self) -> Limits {
        Limits::STANDARD.with(self.limits)
    }

    /// The configurable limits as last set ([`Command::SetLimits`]).
    pub fn table_limits(&self) -> TableLimits {
        self.limits
    }

    /// Applies one command. On error nothing changed and `events` is empty.
    pub fn apply(&mut self, command: &Command) -> Applied {
        self.apply_at(command, 0)
    }

    /// Applies a command committed in a log entry of leader `term`. A
    /// command that a leader's timers decided (an expiry, a lease
    /// checkpoint, the end of a lock-delay) counts only if it was committed
    /// in the term that decided it; otherwise it is refused as
    /// [`LockError::Superseded`]. Such a command may wait in the proposer
    /// through a leadership change and reach the log in a later term, when
    /// the leader (even the same node, leading again) has restarted its
    /// timers and may have acknowledged keepalives since: applying it then
    /// could end a lease early.
    pub fn apply_in_term(&mut self, command: &Command, at_ms: u64, term: u64) -> Applied {
        self.apply_watched(command, at_ms, term, None)
    }

    /// [`apply_in_term`](Self::apply_in_term), and, if `watch` is given,
    /// adds what watchers see of the command to it (see [`WatchEvent`]).
    pub fn apply_watched(
        &mut self,
        command: &Command,
        at_ms: u64,
        term: u64,
        watch: Option<&mut Vec<WatchEvent>>,
    ) -> Applied {
        let mut events = Vec::new();
        let outcome = self.apply_watched_into(command, at_ms, term, watch, &mut events);
        Applied { outcome, events }
    }

    /// [`apply_watched`](Self::apply_watched), adding the command's events
    /// to `events` (on error, none): a server applies a log entry's
    /// commands into one buffer, where a `Vec` of each command's own was
    /// an allocation in every acquire and every release.
    pub fn apply_watched_into(
        &mut self,
        command: &Command,
        at_ms: u64,
        term: u64,
        watch: Option<&mut Vec<WatchEvent>>,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, LockError> {
        match command.decided_in_term() {
            Some(decided) if decided != term => Err(LockError::Superseded {
                decided,
                committed: term,
            }),
            _ => self.apply_observed(command, at_ms, watch, events),
        }
    }

    /// [`apply`](Self::apply), with the wall-clock time (Unix ms) at which
    /// the leader proposed the command, for the audit trail.
    pub fn apply_at(&mut self, command: &Command, at_ms: u64) -> Applied {
        let mut events = Vec::new();
        let outcome = self.apply_observed(command, at_ms, None, &mut events);
        Applied { outcome, events }
    }

    fn apply_observed(
        &mut self,
        command: &Command,
        at_ms: u64,
        watch: Option<&mut Vec<WatchEvent>>,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, LockError> {
        // A session that ends is gone once applied; the trail (and the
        // watchers) still name who held its locks.
        let ending_owner = match command {
            Command::CloseSession { session } | Command::ExpireSession { session, .. } => {
                self.sessions.get(session).and_then(|s| s.owner.clone())
            }
            _ => None,
        };
        let first = events.len();
        let outcome = self.apply_command(command, events);
        let events = &events[first..];
        if outcome.is_ok() {
            let owner_of = |session: SessionId| match self.sessions.get(&session) {
                Some(open) => open.owner.clone(),
                None => ending_owner.clone(),
            };
            let granted_as = |name: &str, session| match self.semaphores.held_by(session, name) {
                Some(Want::Permits(_)) => AuditKind::PermitsGranted,
                Some(Want::Rw(RwMode::Shared)) => AuditKind::SharedGranted,
                Some(Want::Rw(RwMode::Exclusive) | Want::Campaign) | None => AuditKind::Granted,
            };
            if let Some(watch) = watch {
                let holding = |name: &str, session| {
                    let (want, value) = self.semaphores.holding(session, name)?;
                    Some((want, value.to_owned()))
                };
                watch::events(command, events, owner_of, holding, watch);
            }
            let records =
                audit::records(command, events, self.applied, at_ms, owner_of, granted_as);
            self.applied += 1;
            for record in records {
                if self.audit.len() == Limits::STANDARD.audit_records {
                    self.audit.pop_front();
                }
                self.audit.push_back(record);
            }
        }
        outcome
    }

    /// Applies `command`, adding its events to `events` (none if it fails).
    fn apply_command(
        &mut self,
        command: &Command,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, LockError> {
        let tokens_before = self.next_token;
        let first = events.len();
        let outcome = match command {
            Command::OpenSession {
                ttl_ms,
                secret,
                owner,
            } => self.open_session(*ttl_ms, *secret, owner, events),
            Command::Acl(change) => self.change_acl(change),
            Command::SetLimits(change) => self.limits.changed(change).map(|limits| {
                self.limits = limits;
                Outcome::LimitsSet(limits)
            }),
            Command::SetClusterVersion { level } => {
                self.cluster_version = self.cluster_version.max(*level);
                Ok(Outcome::ClusterVersionSet(self.cluster_version))
            }
            Command::CloseSession { session } => {
                self.end_session(*session, SessionEnd::Closed, events)
            }
            Command::ExpireSession { session, .. } => {
                self.end_session(*session, SessionEnd::Expired, events)
            }
            Command::Acquire {
                session,
                lock,
                wait,
                attempt,
                lock_delay_ms,
            } => validate_lock_delay(*lock_delay_ms)
                .and_then(|()| self.acquire(*session, lock, *wait, events))
                .map(|outcome| {
                    self.note_attempt(*session, lock, *attempt);
                    self.note_lock_delay(*session, lock, *lock_delay_ms);
                    Outcome::Acquire(outcome)
                }),
            Command::AcquirePermits {
                session,
                semaphore,
                capacity,
                count,
                wait,
                attempt,
            } => {
                let request = ShareRequest {
                    rule: Rule::Permits {
                        capacity: *capacity,
                    },
                    want: Want::Permits(*count),
                    wait: *wait,
                    attempt: *attempt,
                    value: String::new(),
                };
                self.acquire_shared(*session, semaphore, request, events)
                    .map(Outcome::Acquire)
            }
            Command::AcquireRw {
                session,
                lock,
                mode,
                wait,
                attempt,
            } => {
                let request = ShareRequest {
                    rule: Rule::ReadWrite,
                    want: Want::Rw(*mode),
                    wait: *wait,
                    attempt: *attempt,
                    value: String::new(),
                };
                self.acquire_shared(*session, lock, request, events)
                    .map(Outcome::Acquire)
            }
            Command::Campaign {
                session,
                election,
                value,
                wait,
                attempt,
            } => {
                let request = ShareRequest {
                    rule: Rule::Election,
                    want: Want::Campaign,
                    wait: *wait,
                    attempt: *attempt,
                    value: value.clone(),
                };
                self.acquire_shared(*session, election, request, events)
                    .map(Outcome::Acquire)
            }
            Command::Proclaim {
                session,
                election,
                token,
                value,
            } => self.proclaim(*session, election, *token, value),
            Command::DefineSemaphore {
                semaphore,
                capacity,
            } => self.define_semaphore(semaphore, *capacity, events),
            Command::DeleteSemaphore { semaphore } => self
                .semaphores_allowed()
                .and_then(|()| self.semaphores.delete(semaphore))
                .map(|()| Outcome::SemaphoreDefined),
            Command::EndLockDelay { lock, token, .. } => {
                Ok(self.end_lock_delay(lock, *token, events))
            }
            Command::Release {
                session,
                lock,
                token,
            } => self.release(*session, lock, *token, events),
            Command::CancelWait { session, lock } => self.cancel_wait(*session, lock, events),
            Command::Abandon {
                session,
                lock,
                attempt,
            } => self.abandon(*session, lock, *attempt, events),
            Command::CheckpointLease {
                session,
                remaining_ms,
                renewals,
                ..
            } => self.checkpoint_lease(*session, *remaining_ms, *renewals),
            Command::LeaseRenewed { session } => self.lease_renewed(*session),
            Command::StorePut {
                key,
                value,
                token,
                lock,
            } => validate_value(value)
                .and_then(|()| self.store_change(key, *token, lock.as_deref(), Change::Put(value))),
            Command::StoreRead { key, token, lock } => {
                self.store_change(key, *token, lock.as_deref(), Change::Read)
            }
            Command::StoreDelete { key, token, lock } => {
                self.store_change(key, *token, lock.as_deref(), Change::Delete)
            }
        };
        debug_assert!(outcome.is_ok() || events.len() == first);
        // The one invariant everything rests on; a u64 compare per command.
        assert!(
            self.next_token >= tokens_before,
            "the token counter went back"
        );
        outcome
    }

    fn open_session(
        &mut self,
        ttl_ms: u64,
        secret: SecretHash,
        owner: &Option<String>,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, LockError> {
        validate_ttl(Duration::from_millis(ttl_ms))?;
        let limit = self.limits.max_sessions;
        if self.sessions.len() >= limit {
            return Err(LockError::TooManySessions { limit });
        }
        let session = SessionId(self.next_session);
        self.next_session += 1;
        self.sessions.insert(
            session,
            Session {
                ttl_ms,
                secret,
                owner: owner.clone(),
                checkpoint_ms: None,
                renewals: 0,
                held: BTreeSet::new(),
                waiting: BTreeSet::new(),
                attempts: BTreeMap::new(),
                lock_delays: BTreeMap::new(),
            },
        );
        events.push(Event::SessionOpened { session, ttl_ms });
        Ok(Outcome::SessionOpened { session, ttl_ms })
    }

    fn checkpoint_lease(
        &mut self,
        session: SessionId,
        remaining_ms: u64,
        renewals: u64,
    ) -> Result<Outcome, LockError> {
        let state = self
            .sessions
            .get_mut(&session)
            .ok_or(LockError::UnknownSession(session))?;
        let current = state.renewals == renewals;
        if current {
            state.checkpoint_ms = Some(remaining_ms.min(state.ttl_ms));
        }
        Ok(Outcome::LeaseCheckpointed { current })
    }

    fn lease_renewed(&mut self, session: SessionId) -> Result<Outcome, LockError> {
        let state = self
            .sessions
            .get_mut(&session)
            .ok_or(LockError::UnknownSession(session))?;
        state.checkpoint_ms = None;
        state.renewals += 1;
        Ok(Outcome::LeaseRenewed)
    }

    /// A fenced-store change: the token must have been issued (a made-up
    /// future token would lock every real holder out), must be the lock's
    /// current grant when a lock is named, and must pass the key's fence.
    fn store_change(
        &mut self,
        key: &str,
        token: Token,
        lock: Option<&str>,
        change: Change<'_>,
    ) -> Result<Outcome, LockError> {
        validate_key(key)?;
        // Token 0 is never issued: it is what a request without one carries.
        if token.0 == 0 || token.0 >= self.next_token {
            return Err(LockError::TokenNotIssued {
                presented: token,
                next: Token(self.next_token),
            });
        }
        if let Some(shared) = lock.filter(|name| self.semaphores.contains(name)) {
            // A read/write lock's shared holders may read, with a fence
            // that keeps an older writer out; only its exclusive holder
            // may write.
            let current = match (self.semaphores.rule(shared), &change) {
                (Some(Rule::ReadWrite), Change::Put(_) | Change::Delete) => {
                    self.semaphores.holds_exclusive(shared, token)
                }
                _ => self.semaphores.holds_permit(shared, token),
            };
            if !current {
                return Err(LockError::NotCurrentGrant {
                    lock: shared.to_owned(),
                    presented: token,
                    current: None,
                });
            }
            // Readers hold the lock together, each with its own token: an
            // older reader's read after a newer one's is no stale access.
            // The fence stays at the newer reader's token, which keeps
            // every older writer out all the same.
            if let (Some(Rule::ReadWrite), Change::Read) = (self.semaphores.rule(shared), &change) {
                let read = self.store.get(key).filter(|stored| {
                    stored.fence > token && self.semaphores.holds_permit(shared, stored.fence)
                });
                if let Some(stored) = read {
                    return Ok(Outcome::Read(stored));
                }
            }
        } else if let Some(lock) = lock {
            validate_lock_name(lock)?;
            // A lock in lock-delay has no current grant: its holder expired.
            let current = self
                .locks
                .get(lock)
                .filter(|l| l.delay_ms.is_none())
                .map(|l| l.token);
            if current != Some(token) {
                return Err(LockError::NotCurrentGrant {
                    lock: lock.to_owned(),
                    presented: token,
                    current,
                });
            }
        }
        self.store.apply(key, token, change, self.limits())
    }

    /// The audit trail of `lock` still kept, oldest first.
    pub fn history(&self, lock: &str) -> Vec<AuditRecord> {
        self.audit
            .iter()
            .filter(|record| &*record.lock == lock)
            .cloned()
            .collect()
    }

    /// Every audit record still kept, oldest first.
    pub fn audit(&self) -> impl Iterator<Item = &AuditRecord> + '_ {
        self.audit.iter()
    }

    /// The fenced store, for reads that need no fence.
    /// Who may do what (see [`AccessControl`]).
    pub fn acl(&self) -> &AccessControl {
        &self.acl
    }

    pub fn store(&self) -> &FencedStore {
        &self.store
    }

    fn end_session(
        &mut self,
        session: SessionId,
        how: SessionEnd,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, LockError> {
        let ended = self
            .sessions
            .remove(&session)
            .ok_or(LockError::UnknownSession(session))?;
        // Drop the waits before handing locks over, so that no queue names
        // the ended session when its locks pass to the next waiters.
        for name in &ended.waiting {
            self.leave_queue(name, session, events);
        }
        self.semaphores
            .end_session(&mut self.next_token, session, events);
        for name in &ended.held {
            let token = self.locks[name].token;
            debug_assert_eq!(self.locks[name].holder, session);
            events.push(Event::Released {
                lock: name.as_str().into(),
                session,
                token,
            });
            let delay_ms = ended.lock_delays.get(name).copied().unwrap_or(0);
            if how == SessionEnd::Expired && delay_ms > 0 {
                // The holder may still be writing: nobody gets the lock
                // until the delay is over.
                self.locks.get_mut(name).expect("held lock exists").delay_ms = Some(delay_ms);
                events.push(Event::LockDelayed {
                    lock: name.as_str().into(),
                    token,
                    delay_ms,
                });
            } else {
                self.hand_over(name, events);
            }
        }
        events.push(Event::SessionEnded { session, how });
        Ok(Outcome::SessionEnded)
    }

    fn acquire(
        &mut self,
        session: SessionId,
        name: &str,
        wait: bool,
        events: &mut Vec<Event>,
    ) -> Result<AcquireOutcome, LockError> {
        validate_lock_name(name)?;
        if !self.sessions.contains_key(&session) {
            return Err(LockError::UnknownSession(session));
        }
        if let Some(rule) = self.semaphores.rule(name) {
            return Err(wrong_kind(name, rule.kind(), "lock"));
        }
        let Some(lock) = self.locks.get_mut(name) else {
            let limit = self.limits.max_locks;
            if self.name_count() >= limit {
                return Err(LockError::TooManyLocks { limit });
            }
            let token = Token::take_next(&mut self.next_token);
            self.locks.insert(
                name.to_owned(),
                Lock {
                    holder: session,
                    token,
                    queue: VecDeque::new(),
                    delay_ms: None,
                },
            );
            self.session_mut(session).held.insert(name.to_owned());
            events.push(Event::Granted {
                lock: name.into(),
                session,
                token,
            });
            return Ok(AcquireOutcome::Granted { token });
        };
        // Retrying an acquire (say, after a lost reply) must not change
        // anything: same grant, or same place in the queue.
        if lock.holder == session {
            return Ok(AcquireOutcome::Granted { token: lock.token });
        }
        // A non-blocking acquire never reports "queued", even for a session
        // that is already waiting: the caller asked not to wait.
        if !wait {
            return Err(LockError::Busy {
                lock: name.to_owned(),
                holder_token: lock.token,
                lock_delay: lock.delay_ms.is_some(),
            });
        }
        if let Some(index) = lock.queue.iter().position(|s| *s == session) {
            return Ok(AcquireOutcome::Queued {
                position: index + 1,
            });
        }
        let limit = self.limits.max_waiters_per_lock;
        if lock.queue.len() >= limit {
            return Err(LockError::TooManyWaiters {
                lock: name.to_owned(),
                limit,
            });
        }
        lock.queue.push_back(session);
        let position = lock.queue.len();
        self.session_mut(session).waiting.insert(name.to_owned());
        events.push(Event::Queued {
            lock: name.into(),
            session,
        });
        Ok(AcquireOutcome::Queued { position })
    }

    fn proclaim(
        &mut self,
        session: SessionId,
        election: &str,
        token: Token,
        value: &str,
    ) -> Result<Outcome, LockError> {
        if !self.sessions.contains_key(&session) {
            return Err(LockError::UnknownSession(session));
        }
        self.semaphores
            .proclaim(session, election, token, value.to_owned())?;
        Ok(Outcome::Proclaimed)
    }

    /// An access-control change, refused below the cluster version it
    /// needs (as a leader on this release proposes none: a replica that
    /// applied it would disagree with one that could not decode it).
    fn change_acl(&mut self, change: &AclCommand) -> Result<Outcome, LockError> {
        let needed = change.needs();
        if self.cluster_version < needed {
            return Err(LockError::NeedsClusterVersion {
                feature: "expiring tokens and denied identities".to_owned(),
                needed,
                current: self.cluster_version,
            });
        }
        self.acl.apply(change)?;
        Ok(Outcome::AclChanged)
    }

    /// An acquire of a semaphore's permits, of a read/write lock or of an
    /// election's leadership.
    /// Semaphores are refused below the cluster version that allows them.
    fn semaphores_allowed(&self) -> Result<(), LockError> {
        if self.cluster_version < FeatureLevel::SEMAPHORES {
            return Err(LockError::NeedsClusterVersion {
                feature: "semaphores".to_owned(),
                needed: FeatureLevel::SEMAPHORES,
                current: self.cluster_version,
            });
        }
        Ok(())
    }

    fn define_semaphore(
        &mut self,
        name: &str,
        capacity: u32,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, LockError> {
        self.semaphores_allowed()?;
        validate_lock_name(name)?;
        if self.locks.contains_key(name) {
            return Err(wrong_kind(name, "lock", Rule::Permits { capacity }.kind()));
        }
        let limit = self.limits.max_locks;
        if !self.semaphores.contains(name) && self.name_count() >= limit {
            return Err(LockError::TooManyLocks { limit });
        }
        self.semaphores
            .define(&mut self.next_token, name, capacity, events)?;
        Ok(Outcome::SemaphoreDefined)
    }

    fn acquire_shared(
        &mut self,
        session: SessionId,
        name: &str,
        request: ShareRequest,
        events: &mut Vec<Event>,
    ) -> Result<AcquireOutcome, LockError> {
        let (feature, needed) = match request.rule {
            Rule::Permits { .. } => ("semaphores", FeatureLevel::SEMAPHORES),
            Rule::ReadWrite => ("read/write locks", FeatureLevel::RW_LOCKS),
            Rule::Election => ("elections", FeatureLevel::ELECTIONS),
        };
        if self.cluster_version < needed {
            return Err(LockError::NeedsClusterVersion {
                feature: feature.to_owned(),
                needed,
                current: self.cluster_version,
            });
        }
        validate_lock_name(name)?;
        if !self.sessions.contains_key(&session) {
            return Err(LockError::UnknownSession(session));
        }
        if self.locks.contains_key(name) {
            return Err(wrong_kind(name, "lock", request.rule.kind()));
        }
        let limit = self.limits.max_locks;
        if !self.semaphores.contains(name) && self.name_count() >= limit {
            return Err(LockError::TooManyLocks { limit });
        }
        let max_waiters = self.limits.max_waiters_per_lock;
        self.semaphores.acquire(
            &mut self.next_token,
            session,
            name,
            request,
            max_waiters,
            events,
        )
    }

    fn release(
        &mut self,
        session: SessionId,
        name: &str,
        token: Token,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, LockError> {
        if !self.sessions.contains_key(&session) {
            return Err(LockError::UnknownSession(session));
        }
        if self.semaphores.contains(name) {
            self.semaphores
                .release(&mut self.next_token, session, name, token, events)?;
            return Ok(Outcome::Released);
        }
        let lock = self.locks.get(name).ok_or_else(|| LockError::NotHolder {
            lock: name.to_owned(),
            session,
        })?;
        if lock.holder != session {
            return Err(LockError::NotHolder {
                lock: name.to_owned(),
                session,
            });
        }
        if lock.token != token {
            return Err(LockError::StaleToken {
                lock: name.to_owned(),
                presented: token,
                current: lock.token,
            });
        }
        let holder = self.session_mut(session);
        holder.held.remove(name);
        holder.attempts.remove(name);
        holder.lock_delays.remove(name);
        events.push(Event::Released {
            lock: name.into(),
            session,
            token,
        });
        self.hand_over(name, events);
        Ok(Outcome::Released)
    }

    fn cancel_wait(
        &mut self,
        session: SessionId,
        name: &str,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, LockError> {
        let state = self
            .sessions
            .get_mut(&session)
            .ok_or(LockError::UnknownSession(session))?;
        if self.semaphores.contains(name) {
            let granted = self
                .semaphores
                .cancel_wait(&mut self.next_token, session, name, events);
            return Ok(Outcome::WaitCancelled { granted });
        }
        if state.waiting.remove(name) {
            state.attempts.remove(name);
            state.lock_delays.remove(name);
            self.leave_queue(name, session, events);
            return Ok(Outcome::WaitCancelled { granted: None });
        }
        let granted = self
            .locks
            .get(name)
            .filter(|lock| lock.holder == session)
            .map(|lock| lock.token);
        Ok(Outcome::WaitCancelled { granted })
    }

    /// Remembers the latest acquire attempt of a session on a lock. Attempt
    /// ids grow with time, so a late-arriving older request does not take
    /// over from its retry; an anonymous attempt (0) disables abandoning
    /// until the lock is released, since its caller can never be told apart.
    fn note_attempt(&mut self, session: SessionId, lock: &str, attempt: u64) {
        let attempts = &mut self.session_mut(session).attempts;
        let latest = match (attempts.get(lock), attempt) {
            (_, 0) | (Some(0), _) => 0,
            (Some(&known), attempt) => known.max(attempt),
            (None, attempt) => attempt,
        };
        attempts.insert(lock.to_owned(), latest);
    }

    fn note_lock_delay(&mut self, session: SessionId, lock: &str, delay_ms: u64) {
        let delays = &mut self.session_mut(session).lock_delays;
        if delay_ms == 0 {
            delays.remove(lock);
        } else {
            delays.insert(lock.to_owned(), delay_ms);
        }
    }

    fn end_lock_delay(&mut self, name: &str, token: Token, events: &mut Vec<Event>) -> Outcome {
        let delayed = self
            .locks
            .get(name)
            .is_some_and(|lock| lock.delay_ms.is_some() && lock.token == token);
        if delayed {
            self.hand_over(name, events);
        }
        Outcome::LockDelayEnded { ended: delayed }
    }

    fn abandon(
        &mut self,
        session: SessionId,
        name: &str,
        attempt: u64,
        events: &mut Vec<Event>,
    ) -> Result<Outcome, LockError> {
        let state = self
            .sessions
            .get(&session)
            .ok_or(LockError::UnknownSession(session))?;
        if self.semaphores.contains(name) {
            let released =
                self.semaphores
                    .abandon(&mut self.next_token, session, name, attempt, events);
            return Ok(Outcome::Abandoned { released });
        }
        let nobody_else_asked = attempt != 0 && state.attempts.get(name) == Some(&attempt);
        if !nobody_else_asked {
            return Ok(Outcome::Abandoned { released: None });
        }
        if state.waiting.contains(name) {
            self.cancel_wait(session, name, events)?;
            return Ok(Outcome::Abandoned { released: None });
        }
        let token = self.locks[name].token;
        debug_assert_eq!(self.locks[name].holder, session);
        self.release(session, name, token, events)?;
        Ok(Outcome::Abandoned {
            released: Some(token),
        })
    }

    /// Takes `session` (already unlinked from the wait) out of the queue of
    /// `name`. A waited-on lock always has a holder, so it stays.
    fn leave_queue(&mut self, name: &str, session: SessionId, events: &mut Vec<Event>) {
        let lock = self.locks.get_mut(name).expect("waited-on lock exists");
        lock.queue.retain(|s| *s != session);
        events.push(Event::WaitEnded {
            lock: name.into(),
            session,
        });
    }

    /// The holder of `name` is gone (already unlinked from its session):
    /// grant the lock to the head of its queue, or delete it if nobody waits.
    fn hand_over(&mut self, name: &str, events: &mut Vec<Event>) {
        let lock = self.locks.get_mut(name).expect("handed-over lock exists");
        let Some(next) = lock.queue.pop_front() else {
            self.locks.remove(name);
            return;
        };
        let token = Token::take_next(&mut self.next_token);
        lock.holder = next;
        lock.token = token;
        lock.delay_ms = None;
        let waiter = self.session_mut(next);
        let was_waiting = waiter.waiting.remove(name);
        assert!(
            was_waiting,
            "queued session {next} was not waiting on {name:?}"
        );
        waiter.held.insert(name.to_owned());
        events.push(Event::Granted {
            lock: name.into(),
            session: next,
            token,
        });
    }

    fn session_mut(&mut self, session: SessionId) -> &mut Session {
        self.sessions
            .get_mut(&session)
            .unwrap_or_else(|| panic!("session {session} is linked from a lock but does not exist"))
    }

    /// Raises the token counter to at least the leader's wall clock, in
    /// microseconds since the Unix epoch, at which a batch was proposed
    /// (`at_ms`, carried in the log entry, so every replica raises it alike).
    ///
    /// Why: the counter lives in the data directory, and a directory can be
    /// lost, wiped, rolled back by a damaged disk or restored from an old
    /// backup. Tokens that never fall behind the wall clock stay above every
    /// token an earlier incarnation issued, as long as the wall clock moved
    /// forward since and grants came slower than one per microsecond (this
    /// service does tens of thousands a second at most). Tokens still stay
    /// below 2^53 until the year 2255, so JSON readers lose no digit; the
    /// leader passes its clock through [`token_floor_ms`] first, so that a
    /// clock that jumps centuries ahead cannot take them past it.
    pub fn raise_token_floor(&mut self, at_ms: u64) {
        let floor = at_ms.saturating_mul(1_000);
        if floor > self.next_token {
            self.next_token = floor;
        }
    }

    /// The token the next grant will carry. Every token already handed out
    /// is smaller.
    pub fn next_token(&self) -> Token {
        Token(self.next_token)
    }

    pub fn lock(&self, name: &str) -> Option<LockInfo> {
        self.locks.get(name).map(|lock| LockInfo {
            name: name.to_owned(),
            holder: lock.holder,
            token: lock.token,
            waiters: lock.queue.iter().copied().collect(),
            delayed: lock.delay_ms.is_some(),
            rw: None,
        })
    }

    /// The lock or read/write lock `name`, as [`LockInfo`].
    pub fn lock_or_rw(&self, name: &str) -> Option<LockInfo> {
        self.lock(name)
            .or_else(|| self.semaphores.rw_lock(name).map(rw_as_lock))
    }

    /// Locks and read/write locks in name order, starting after `after`
    /// (for paging).
    pub fn locks_and_rw_after<'a>(&'a self, after: &'a str) -> impl Iterator<Item = LockInfo> + 'a {
        let mut locks = self.locks_after(after).peekable();
        let mut rw_locks = self.semaphores.rw_locks_after(after).peekable();
        std::iter::from_fn(move || match (locks.peek(), rw_locks.peek()) {
            (Some(lock), Some(rw)) if rw.name < lock.name => rw_locks.next().map(rw_as_lock),
            (Some(_), _) => locks.next(),
            (None, _) => rw_locks.next().map(rw_as_lock),
        })
    }

    /// Locks in name order, starting after `after` (for paging).
    pub fn locks_after<'a>(&'a self, after: &'a str) -> impl Iterator<Item = LockInfo> + 'a {
        use std::ops::Bound;
        self.locks
            .range::<_, str>((Bound::Excluded(after), Bound::Unbounded))
            .map(|(name, _)| self.lock(name).expect("listed lock exists"))
    }

    /// Live sessions with ids above `after`, in id order (for paging).
    pub fn sessions_after(&self, after: SessionId) -> impl Iterator<Item = SessionInfo> + '_ {
        use std::ops::Bound;
        self.sessions
            .range((Bound::Excluded(after), Bound::Unbounded))
            .map(|(id, s)| SessionInfo {
                id: *id,
                ttl: Duration::from_millis(s.ttl_ms),
                held: s.held.len(),
                waiting: s.waiting.len(),
            })
    }

    /// Whether a blocking acquire of `lock` by `session` would, applied now,
    /// join its queue: someone else holds it (or it is in lock-delay). Such
    /// an acquire changes nothing anyone waits for, so the proposer may let
    /// it share the next command's log append (`Pace::Patient`).
    pub fn acquire_would_queue(&self, session: SessionId, lock: &str) -> bool {
        self.locks
            .get(lock)
            .is_some_and(|lock| lock.holder != session)
    }

    /// [`acquire_would_queue`](Self::acquire_would_queue), for `count`
    /// permits of a semaphore.
    pub fn permits_would_queue(&self, session: SessionId, semaphore: &str, count: u32) -> bool {
        self.semaphores
            .acquire_would_queue(session, semaphore, Want::Permits(count))
    }

    /// Whether a campaign by `session` for `election` would queue, applied
    /// now.
    pub fn campaign_would_queue(&self, session: SessionId, election: &str) -> bool {
        self.semaphores
            .acquire_would_queue(session, election, Want::Campaign)
    }

    /// Whether an acquire by `session` of the read/write lock `lock` in
    /// `mode` would queue, applied now.
    pub fn rw_would_queue(&self, session: SessionId, lock: &str, mode: RwMode) -> bool {
        self.semaphores
            .acquire_would_queue(session, lock, Want::Rw(mode))
    }

    /// Whether `session` holds `lock` or waits in its queue: an acquire of
    /// it is then a retry, which keeps that place rather than asking for one.
    pub fn holds_or_waits(&self, session: SessionId, lock: &str) -> bool {
        self.sessions
            .get(&session)
            .is_some_and(|s| s.held.contains(lock) || s.waiting.contains(lock))
            || self.semaphores.holds_or_waits(session, lock)
    }

    pub fn has_session(&self, id: SessionId) -> bool {
        self.sessions.contains_key(&id)
    }

    /// Where session `id` stands as of the applied log: live (with the hash
    /// of its secret), ended, or not opened yet. Ids are never reused and a
    /// secret never changes, so a live session's hash is the same on every
    /// replica and for as long as the session lives.
    pub fn session_secret(&self, id: SessionId) -> SessionSecret<'_> {
        match self.sessions.get(&id) {
            Some(session) => SessionSecret::Live {
                secret: &session.secret,
                owner: session.owner.as_deref(),
            },
            None if id.0 < self.next_session => SessionSecret::Ended,
            None => SessionSecret::NotYetOpened,
        }
    }

    /// Live sessions and their leases, for a new leader to start tracking.
    pub fn sessions(&self) -> impl Iterator<Item = (SessionId, SessionLease)> + '_ {
        self.sessions.iter().map(|(id, s)| {
            let lease = SessionLease {
                ttl: Duration::from_millis(s.ttl_ms),
                checkpoint: s.checkpoint_ms.map(Duration::from_millis),
                renewals: s.renewals,
            };
            (*id, lease)
        })
    }

    /// Locks in lock-delay, with the lost grant's token and the delay, for a
    /// new leader to time.
    pub fn delayed_locks(&self) -> impl Iterator<Item = (&str, Token, Duration)> + '_ {
        self.locks.iter().filter_map(|(name, lock)| {
            lock.delay_ms
                .map(|ms| (name.as_str(), lock.token, Duration::from_millis(ms)))
        })
    }

    /// Every (session, lock) wait, for observers that rebuild their view
    /// after the table was replaced by a snapshot.
    pub fn waits(&self) -> impl Iterator<Item = (SessionId, &str)> + '_ {
        self.sessions
            .iter()
            .flat_map(|(id, s)| s.waiting.iter().map(move |lock| (*id, lock.as_str())))
            .chain(self.semaphores.waits())
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    pub fn lock_count(&self) -> usize {
        self.locks.len()
    }

    /// Names in use, locks and semaphores: what the `max_locks` limit counts.
    fn name_count(&self) -> usize {
        self.locks.len() + self.semaphores.len()
    }

    /// Panics if any structural invariant is broken. O(size of the table):
    /// for tests and for checking a snapshot once at load time.
    pub fn check_invariants(&self) {
        assert!(
            (FeatureLevel::BASE..=FeatureLevel::NEWEST).contains(&self.cluster_version),
            "cluster version {} is not one this build knows",
            self.cluster_version
        );
        assert!(
            self.limits.in_bounds(),
            "limits out of bounds: {:?}",
            self.limits
        );
        // The trail never shows two grants of one lock at once, and grant
        // tokens only grow.
        let mut holders: BTreeMap<&str, Option<Token>> = BTreeMap::new();
        let mut last_grant: Option<Token> = None;
        for record in &self.audit {
            let holder = holders.entry(&*record.lock).or_default();
            match record.what {
                AuditKind::Granted => {
                    assert!(
                        holder.is_none(),
                        "audit: {:?} granted (token {}) while held with token {:?}",
                        record.lock,
                        record.token,
                        holder
                    );
                    assert!(
                        last_grant < Some(record.token),
                        "audit: grant tokens went back"
                    );
                    last_grant = Some(record.token);
                    *holder = Some(record.token);
                }
                AuditKind::PermitsGranted => {
                    assert!(
                        last_grant < Some(record.token),
                        "audit: grant tokens went back"
                    );
                    last_grant = Some(record.token);
                }
                // The lock stays unavailable, but the grant is over.
                AuditKind::Delayed => {}
                _ => *holder = None,
            }
        }
        for (key, fence) in self.store.fences() {
            assert!(
                fence.0 < self.next_token,
                "fence of key {key:?} is a token never handed out"
            );
        }
        self.store.check_bytes();
        for (name, lock) in &self.locks {
            if lock.delay_ms.is_some() {
                // The lost grant's session expired, and ids are never reused.
                assert!(
                    !self.sessions.contains_key(&lock.holder),
                    "lock {name:?} in lock-delay for live session {}",
                    lock.holder
                );
            } else {
                let holder = self.sessions.get(&lock.holder).unwrap_or_else(|| {
                    panic!("lock {name:?} held by dead session {}", lock.holder)
                });
                assert!(
                    holder.held.contains(name),
                    "holder of {name:?} does not list it"
                );
            }
            assert!(
                lock.token.0 < self.next_token,
                "token of {name:?} not below the counter"
            );
            // Not the current limit: lowering it leaves longer queues be.
            assert!(lock.queue.len() <= TableLimits::CEILING.max_waiters_per_lock);
            let mut seen = BTreeSet::new();
            for waiter in &lock.queue {
                assert!(
                    seen.insert(*waiter),
                    "session {waiter} queued twice on {name:?}"
                );
                assert_ne!(*waiter, lock.holder, "holder of {name:?} also waits on it");
                let session = self
                    .sessions
                    .get(waiter)
                    .unwrap_or_else(|| panic!("dead session {waiter} queued on {name:?}"));
                assert!(session.waiting.contains(name));
            }
        }
        self.semaphores
            .check_invariants(self.next_token, |session| {
                self.sessions.contains_key(&session)
            });
        assert!(
            self.cluster_version >= FeatureLevel::SEMAPHORES || self.semaphores.is_empty(),
            "semaphores below the cluster version that allows them"
        );
        for (name, _) in &self.locks {
            assert!(
                !self.semaphores.contains(name),
                "{name:?} is both a lock and a semaphore"
            );
        }
        for (id, session) in &self.sessions {
            assert!(
                id.0 < self.next_session,
                "session id {id} not below the counter"
            );
            for name in &session.held {
                assert_eq!(self.locks.get(name).map(|l| l.holder), Some(*id));
            }
            for name in &session.waiting {
                assert!(self.locks[name].queue.contains(id));
            }
            for name in session.attempts.keys().chain(session.lock_delays.keys()) {
                assert!(
                    session.held.contains(name) || session.waiting.contains(name),
                    "session {id} remembers a request on {name:?}, which it neither holds nor waits on"
                );
            }
        }
    }
}

/// The latest wall clock, in milliseconds since 1970, that may raise the
/// token counter: the start of the year 2200.
///
/// Why: a leader whose clock jumps years ahead raises every later token to
/// that time, for good (the counter never goes back). Past 2^53 readers of
/// JSON numbers (JavaScript's, jq) lose digits, and near 2^64 the counter
/// would run out and grants stop. Raised at most to 2200's clock, tokens
/// stay below 2^53 for the next [`TOKENS_AFTER_THE_LATEST_FLOOR`] grants,
/// centuries at the service's peak.
pub const LATEST_TOKEN_FLOOR_MS: u64 = 7_258_118_400_000;

/// How many grants after a floor at [`LATEST_TOKEN_FLOOR_MS`] still carry
/// tokens below 2^53 (about 1.7 × 10^15).
pub const TOKENS_AFTER_THE_LATEST_FLOOR: u64 = (1 << 53) - LATEST_TOKEN_FLOOR_MS * 1_000;
const _: () = assert!(TOKENS_AFTER_THE_LATEST_FLOOR > 1_000_000_000_000_000);

/// The wall clock `unix_ms`, as far as it may raise the token counter (see
/// [`LATEST_TOKEN_FLOOR_MS`]). A clock that jumps back needs no bound: the
/// counter only ever rises.
pub fn token_floor_ms(unix_ms: u64) -> u64 {
    unix_ms.min(LATEST_TOKEN_FLOOR_MS)
}

/// A read/write lock as a [`LockInfo`]: its first holder and its newest
/// hold's token stand for the holder and the token.
fn rw_as_lock(rw: RwLockInfo) -> LockInfo {
    let holder = rw
        .holders
        .first()
        .map_or(SessionId(0), |(session, ..)| *session);
    let token = rw.holders.iter().map(|(.., token)| *token).max();
    LockInfo {
        name: rw.name.clone(),
        holder,
        token: token.unwrap_or(Token(0)),
        waiters: rw.waiters.iter().map(|(session, _)| *session).collect(),
        delayed: false,
        rw: Some(rw),
    }
}

fn wrong_kind(name: &str, kind: &str, asked: &str) -> LockError {
    LockError::WrongKind {
        name: name.to_owned(),
        kind: kind.to_owned(),
        asked: asked.to_owned(),
    }
}
