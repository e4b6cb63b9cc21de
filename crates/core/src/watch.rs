//! [`WatchEvent`]: what a watcher sees of one applied command, named as
//! users name things (a lock, semaphore, read/write lock, election or store
//! key) with who and which token.
//!
//! Why in the core: which session held what, who owned that session and
//! how a grant ended are facts of the state machine right after the
//! command (a closed session is gone a moment later). Computing them here,
//! on every replica's own table, means a watcher of any node sees exactly
//! what the log applied, and the property tests can check that replaying
//! the events rebuilds who holds what.

use crate::audit::{self, AuditKind};
use crate::{Command, Event, RwMode, SessionId, Token, Want};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What happened to a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchKind {
    /// A grant: of a lock, permits, a read/write hold or a leadership.
    Granted,
    /// The holder released it (or resigned).
    Released,
    /// The holder's session was closed.
    Closed,
    /// The holder's session expired.
    Expired,
    /// The acquire's caller went away without hearing of the grant.
    Abandoned,
    /// A session joined the queue.
    Queued,
    /// A queued session stopped waiting without a grant.
    LeftQueue,
    /// After an expiry the lock-delay began: no grant until it ends.
    Delayed,
    /// An election's leader set a new value.
    Proclaimed,
    /// A store key was written.
    Put,
    /// A store key was deleted.
    Deleted,
}

impl WatchKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WatchKind::Granted => "granted",
            WatchKind::Released => "released",
            WatchKind::Closed => "closed",
            WatchKind::Expired => "expired",
            WatchKind::Abandoned => "abandoned",
            WatchKind::Queued => "queued",
            WatchKind::LeftQueue => "left_queue",
            WatchKind::Delayed => "delayed",
            WatchKind::Proclaimed => "proclaimed",
            WatchKind::Put => "put",
            WatchKind::Deleted => "deleted",
        }
    }

    /// Is this about a store key (rather than a lock-like name)? Access
    /// control reads the two with different permissions.
    pub fn is_store(self) -> bool {
        matches!(self, WatchKind::Put | WatchKind::Deleted)
    }
}

impl std::fmt::Display for WatchKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One change of one name, as a watcher sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    pub kind: WatchKind,
    /// The lock, semaphore, read/write lock, election or store key.
    pub name: Arc<str>,
    /// The session it happened to (none for store writes and delays).
    pub session: Option<SessionId>,
    /// The identity that opened that session (see
    /// [`crate::AccessControl`]); none for anonymous callers.
    pub identity: Option<String>,
    /// The grant's fencing token (a semaphore grant's first permit; an
    /// election's term), or the token a store write carried. None for
    /// queue events.
    pub token: Option<Token>,
    /// Granted: the read/write lock's mode, if it is one.
    pub mode: Option<RwMode>,
    /// Granted: how many permits, if it is a semaphore.
    pub permits: Option<u32>,
    /// Proclaimed, or granted leadership: the leader's value; put: the
    /// key's new value.
    pub value: Option<String>,
}

impl WatchEvent {
    /// `name` shared with the command's events where it comes from one
    /// (`Event`): a copy of it per watch event was an allocation in every
    /// acquire and release.
    fn about(kind: WatchKind, name: Arc<str>) -> Self {
        WatchEvent {
            kind,
            name,
            session: None,
            identity: None,
            token: None,
            mode: None,
            permits: None,
            value: None,
        }
    }
}

/// What a successful `command` and its `events` look like to watchers, in
/// the order they happened. `owner_of` names a session's identity (also of
/// a session that this command ended); `holding` says what a session holds
/// of a semaphore-like name and with which value, after the command.
pub(crate) fn events(
    command: &Command,
    events: &[Event],
    owner_of: impl Fn(SessionId) -> Option<String>,
    holding: impl Fn(&str, SessionId) -> Option<(Want, String)>,
    out: &mut Vec<WatchEvent>,
) {
    let ended = match audit::ended_by(command) {
        AuditKind::Closed => WatchKind::Closed,
        AuditKind::Expired => WatchKind::Expired,
        AuditKind::Abandoned => WatchKind::Abandoned,
        _ => WatchKind::Released,
    };
    let of_session = |kind, name: Arc<str>, session: SessionId, token: Option<Token>| WatchEvent {
        session: Some(session),
        identity: owner_of(session),
        token,
        ..WatchEvent::about(kind, name)
    };
    for event in events {
        out.push(match event {
            Event::Granted {
                lock,
                session,
                token,
            } => {
                let mut granted =
                    of_session(WatchKind::Granted, lock.clone(), *session, Some(*token));
                match holding(lock, *session) {
                    Some((Want::Permits(count), _)) => granted.permits = Some(count),
                    Some((Want::Rw(mode), _)) => granted.mode = Some(mode),
                    Some((Want::Campaign, value)) => granted.value = Some(value),
                    None => {}
                }
                granted
            }
            Event::Released {
                lock,
                session,
                token,
            } => of_session(ended, lock.clone(), *session, Some(*token)),
            Event::Queued { lock, session } => {
                of_session(WatchKind::Queued, lock.clone(), *session, None)
            }
            Event::WaitEnded { lock, session } => {
                of_session(WatchKind::LeftQueue, lock.clone(), *session, None)
            }
            Event::LockDelayed { lock, token, .. } => WatchEvent {
                token: Some(*token),
                ..WatchEvent::about(WatchKind::Delayed, lock.clone())
            },
            Event::SessionOpened { .. } | Event::SessionEnded { .. } => continue,
        });
    }
    // Commands whose change is not a lock event: the event is the command.
    out.extend(match command {
        Command::Proclaim {
            session,
            election,
            token,
            value,
        } => Some(WatchEvent {
            value: Some(value.clone()),
            ..of_session(
                WatchKind::Proclaimed,
                election.as_str().into(),
                *session,
                Some(*token),
            )
        }),
        Command::StorePut {
            key, value, token, ..
        } => Some(WatchEvent {
            token: Some(*token),
            value: Some(value.clone()),
            ..WatchEvent::about(WatchKind::Put, key.as_str().into())
        }),
        Command::StoreDelete { key, token, .. } => Some(WatchEvent {
            token: Some(*token),
            ..WatchEvent::about(WatchKind::Deleted, key.as_str().into())
        }),
        _ => None,
    });
}
