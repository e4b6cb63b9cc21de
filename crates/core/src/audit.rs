//! The audit trail: who held which lock, and when it ended, in the order
//! the replicated log applied it (the service's own timeline).
//!
//! Kept in the replicated table, so every node, snapshot and restart agrees
//! on it; bounded to the newest [`crate::Limits::audit_records`] records.

use crate::{Command, Event, SessionId, Token};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One change of a lock's holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Position in the service's timeline: the number of commands applied
    /// before this one, counting from the first. Strictly orders records.
    pub seq: u64,
    /// Wall-clock time (Unix milliseconds) at which the leader proposed the
    /// command; for people reading the trail, never for decisions. 0 if
    /// unknown.
    pub at_ms: u64,
    pub lock: Arc<str>,
    pub session: SessionId,
    pub token: Token,
    pub what: AuditKind,
    /// The identity that opened the session (see [`crate::AccessControl`]);
    /// it is also who released or closed, since nobody else may.
    pub identity: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    Granted,
    /// The holder released it.
    Released,
    /// The holder's session was closed.
    Closed,
    /// The holder's session expired.
    Expired,
    /// The acquire's caller went away without hearing of the grant.
    Abandoned,
    /// After an expiry, the lock-delay began; no grant until it ends.
    Delayed,
    /// Permits of a semaphore were granted (`token` is the grant's first);
    /// unlike a lock, a semaphore has several grants at once.
    PermitsGranted,
    /// A read/write lock was granted shared; its exclusive grants are
    /// [`AuditKind::Granted`], as a lock's.
    SharedGranted,
}

/// How the grants that `command` ends end.
pub(crate) fn ended_by(command: &Command) -> AuditKind {
    match command {
        Command::CloseSession { .. } => AuditKind::Closed,
        Command::ExpireSession { .. } => AuditKind::Expired,
        Command::Abandon { .. } => AuditKind::Abandoned,
        _ => AuditKind::Released,
    }
}

/// What the command and its events add to the trail. An iterator, not a
/// `Vec`: the records go straight into the trail, and a `Vec` per command
/// was one allocation in each acquire and each release.
pub(crate) fn records<'a>(
    command: &Command,
    events: &'a [Event],
    seq: u64,
    at_ms: u64,
    owner_of: impl Fn(SessionId) -> Option<String> + 'a,
    granted_as: impl Fn(&str, SessionId) -> AuditKind + 'a,
) -> impl Iterator<Item = AuditRecord> + 'a {
    let ended = ended_by(command);
    events.iter().filter_map(move |event| {
        let (lock, session, token, what) = match event {
            Event::Granted {
                lock,
                session,
                token,
            } => (lock, *session, *token, granted_as(lock, *session)),
            Event::Released {
                lock,
                session,
                token,
            } => (lock, *session, *token, ended),
            Event::LockDelayed { lock, token, .. } => {
                (lock, SessionId(0), *token, AuditKind::Delayed)
            }
            _ => return None,
        };
        Some(AuditRecord {
            seq,
            at_ms,
            lock: lock.clone(),
            session,
            token,
            what,
            identity: owner_of(session),
        })
    })
}
