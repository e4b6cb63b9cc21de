//! [`ApiError`]: how every operation of [`Node`](super::Node) fails.
//!
//! Why a module of its own: it is the one type that every layer shares
//! (the operations return it, `api.rs` passes it on, and each front end
//! turns it into its status: `grpc.rs`, `http.rs`, the `Calls` stream), and
//! the translation of the core's refusals ([`LockError`]) and the proposer's
//! failures ([`ProposeError`]) into the stable [`ErrorKind`] vocabulary is
//! decided here, once.

use crate::proposer::ProposeError;
use deadbolt_core::{AclError, LockError, WrongOutcome};
use deadbolt_proto::ErrorKind;

/// A refused or failed API call: a stable kind and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// With `not_leader`: the leader's address, when this node knows it.
    pub leader: Option<String>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
            leader: None,
        }
    }
}

impl From<LockError> for ApiError {
    fn from(err: LockError) -> Self {
        let kind = match err {
            LockError::UnknownSession(_) => ErrorKind::UnknownSession,
            LockError::Busy { .. } => ErrorKind::Busy,
            LockError::NotHolder { .. } => ErrorKind::NotHolder,
            LockError::StaleToken { .. } => ErrorKind::StaleToken,
            LockError::InvalidName { .. } | LockError::TtlOutOfRange { .. } => {
                ErrorKind::InvalidArgument
            }
            LockError::StaleFence { .. } | LockError::NotCurrentGrant { .. } => {
                ErrorKind::StaleToken
            }
            LockError::TokenNotIssued { .. }
            | LockError::LockDelayTooLong { .. }
            | LockError::InvalidKey { .. }
            | LockError::ValueTooLarge { .. }
            | LockError::LimitOutOfRange { .. }
            | LockError::InvalidPermits { .. }
            | LockError::CapacityMismatch { .. }
            | LockError::NoSuchSemaphore { .. }
            | LockError::NotDefined { .. }
            | LockError::WrongKind { .. }
            | LockError::OtherMode { .. } => ErrorKind::InvalidArgument,
            LockError::NoPermits { .. }
            | LockError::RwBusy { .. }
            | LockError::HasLeader { .. } => ErrorKind::Busy,
            LockError::NeedsClusterVersion { .. } => ErrorKind::NeedsUpgrade,
            // Only the leader's own timer commands are ever superseded.
            LockError::Superseded { .. } => ErrorKind::Unavailable,
            LockError::Acl(AclError::AlreadyBootstrapped) => ErrorKind::PermissionDenied,
            LockError::Acl(AclError::TooMany { .. }) => ErrorKind::LimitReached,
            LockError::Acl(_) => ErrorKind::InvalidArgument,
            LockError::TooManyWaiters { .. }
            | LockError::TooManySessions { .. }
            | LockError::TooManyLocks { .. }
            | LockError::TooManyKeys { .. }
            | LockError::StoreFull { .. } => ErrorKind::LimitReached,
        };
        ApiError::new(kind, err.to_string())
    }
}

impl From<ProposeError> for ApiError {
    fn from(err: ProposeError) -> Self {
        let kind = match err {
            ProposeError::NotLeader { .. } => ErrorKind::NotLeader,
            ProposeError::ShuttingDown
            | ProposeError::DiskFull
            | ProposeError::NoQuorum(_)
            | ProposeError::LostQuorum(_)
            | ProposeError::Fatal(_) => ErrorKind::Unavailable,
            ProposeError::Overloaded { .. } => ErrorKind::Overloaded,
        };
        let leader = match &err {
            ProposeError::NotLeader { leader } => leader.clone(),
            _ => None,
        };
        ApiError {
            leader,
            ..ApiError::new(kind, err.to_string())
        }
    }
}

impl From<WrongOutcome> for ApiError {
    /// The state machine answered a command with another command's outcome
    /// (see `deadbolt_core::Proposal`): a bug, reported as `internal`.
    fn from(err: WrongOutcome) -> Self {
        ApiError::new(ErrorKind::Internal, err.to_string())
    }
}
