//! [`Error`]: one error type for every backend, with a small [`ErrorKind`]
//! that callers (and `deadbolt run`'s exit codes) branch on.
//!
//! Each backend's client library has its own error vocabulary; what a
//! caller must decide is only whether to wait and retry (busy, timeout),
//! whether the lock service is out of reach, whether the lock was lost, or
//! whether the request itself is wrong. The message keeps the library's own
//! words and names the server.

use std::fmt;

/// What kind of failure, across backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The lock URL does not parse, names an unknown scheme, or a lock
    /// name or TTL is out of range.
    InvalidArgument,
    /// The lock is held by someone else (`try_lock` reports this as `None`).
    Busy,
    /// The wait for the lock ran out.
    WaitTimeout,
    /// The lock service could not be reached or did not answer in time.
    Unavailable,
    /// The lock (or the lease under it) was already lost: whatever was done
    /// under it may have overlapped with another holder.
    LockLost,
    /// The server refused the request for another reason.
    Refused,
}

/// A failed lock operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// Worth another attempt while a wait lasts.
    pub(crate) fn is_transient(&self) -> bool {
        self.kind == ErrorKind::Unavailable
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    pub(crate) fn unavailable(server: &str, cause: impl fmt::Display) -> Self {
        Self::new(
            ErrorKind::Unavailable,
            format!("could not reach {server}: {cause}"),
        )
    }

    pub(crate) fn timed_out(lock: &str, waited: std::time::Duration) -> Self {
        Self::new(
            ErrorKind::WaitTimeout,
            format!("timed out after {waited:?} waiting for lock {lock:?}"),
        )
    }

    pub(crate) fn lost(lock: &str, why: impl fmt::Display) -> Self {
        Self::new(
            ErrorKind::LockLost,
            format!("lock {lock:?} was already lost: {why}"),
        )
    }
}

impl From<deadbolt_client::Error> for Error {
    fn from(error: deadbolt_client::Error) -> Self {
        use deadbolt_client::ErrorKind as K;
        let kind = match error.kind() {
            K::Busy => ErrorKind::Busy,
            K::WaitTimeout => ErrorKind::WaitTimeout,
            K::Unavailable | K::NotLeader => ErrorKind::Unavailable,
            K::StaleToken | K::NotHolder | K::UnknownSession | K::SessionExpiring => {
                ErrorKind::LockLost
            }
            K::InvalidArgument | K::LimitReached => ErrorKind::InvalidArgument,
            _ => ErrorKind::Refused,
        };
        Self::new(kind, error.message())
    }
}
