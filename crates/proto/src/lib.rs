//! Generated gRPC types for the Deadbolt API (`proto/deadbolt.proto`), shared
//! by the server and the client so both always speak the same schema.

pub mod frames;
pub mod woken;

pub mod v1 {
    tonic::include_proto!("deadbolt.v1");
}

impl v1::CallError {
    /// The status the unary RPC would have ended with, so that one error
    /// path serves both kinds of call.
    pub fn into_status(self) -> tonic::Status {
        let kind = ErrorKind::parse(&self.kind).unwrap_or(ErrorKind::Internal);
        let mut status = kind.status(self.message);
        if let Some(leader) = self
            .leader
            .and_then(|address| tonic::metadata::MetadataValue::try_from(address).ok())
        {
            status.metadata_mut().insert(LEADER_KEY, leader);
        }
        status
    }
}

/// Name of the gRPC trailer that carries a machine-readable error kind.
pub const ERROR_KIND_KEY: &str = "deadbolt-error";

/// Name of the gRPC trailer that comes with a `not_leader` error when the
/// answering node knows the leader: that leader's address, where a client
/// should send the request instead.
pub const LEADER_KEY: &str = "deadbolt-leader";

/// The encoded descriptors of `proto/deadbolt.proto`, for gRPC server
/// reflection (grpcurl and similar tools list and call the API from it).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/current.bin"));

/// The client API's compatibility number: what `proto/deadbolt.proto` and
/// the HTTP API promise clients. Additions (a new field, call or error
/// kind) keep it; a change that could break a client of the previous
/// number (a field renumbered or retyped, a call or enum value removed)
/// bumps it, and `tests/compatibility.rs` holds the proto to that.
pub const CLIENT_API: u32 = 1;

/// The largest gRPC message either side accepts. Raft appends carry batches
/// of commands and snapshot chunks are a few MiB; tonic's 4 MiB default
/// would cut them off.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Calls in flight on one `Calls` stream, of every kind. The server stops
/// reading a stream at this many (HTTP/2 flow control then holds the
/// client back); the client waits for a slot before sending past it. Twice
/// the acquires one stream may have blocked (4096), so keepalives and
/// releases always find room beside them.
pub const MAX_CALLS_PER_STREAM: usize = 8192;

/// The stable, machine-readable kinds of API error. Both the gRPC trailer
/// and the HTTP error body carry one of these strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    UnknownSession,
    Busy,
    NotHolder,
    StaleToken,
    InvalidArgument,
    LimitReached,
    WaitTimeout,
    WaitCancelled,
    SessionExpiring,
    NotLeader,
    Unavailable,
    /// The leader has more work queued than it takes (its proposal queue is
    /// full): nothing was done, and the same request may be sent again
    /// after a backoff. Clients back off with jitter.
    Overloaded,
    Internal,
    /// A call on a session without that session's secret, or a call the
    /// caller's identity has no permission for.
    PermissionDenied,
    /// Access control is on and the call carries no valid credentials (a
    /// bearer token or a client certificate).
    Unauthenticated,
    /// A node's release is too old for what was asked: a feature the
    /// cluster version does not allow yet, or a node that cannot join at
    /// the cluster version. The message names the nodes to upgrade
    /// (docs/upgrading.md). Added after release 0.1.0, whose clients read
    /// it by its gRPC code (`FAILED_PRECONDITION`) as `internal`.
    NeedsUpgrade,
    /// A watch asked for history the node no longer keeps (or fell that far
    /// behind): read the current state and watch again from now. Added
    /// after release 0.1.0.
    Compacted,
}

impl ErrorKind {
    /// Every kind: what `parse` knows, and the server's error metric's labels.
    pub const ALL: [ErrorKind; 17] = [
        ErrorKind::UnknownSession,
        ErrorKind::Busy,
        ErrorKind::NotHolder,
        ErrorKind::StaleToken,
        ErrorKind::InvalidArgument,
        ErrorKind::LimitReached,
        ErrorKind::WaitTimeout,
        ErrorKind::WaitCancelled,
        ErrorKind::SessionExpiring,
        ErrorKind::NotLeader,
        ErrorKind::Unavailable,
        ErrorKind::Overloaded,
        ErrorKind::Internal,
        ErrorKind::PermissionDenied,
        ErrorKind::Unauthenticated,
        ErrorKind::NeedsUpgrade,
        ErrorKind::Compacted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::UnknownSession => "unknown_session",
            ErrorKind::Busy => "busy",
            ErrorKind::NotHolder => "not_holder",
            ErrorKind::StaleToken => "stale_token",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::LimitReached => "limit_reached",
            ErrorKind::WaitTimeout => "wait_timeout",
            ErrorKind::WaitCancelled => "wait_cancelled",
            ErrorKind::SessionExpiring => "session_expiring",
            ErrorKind::NotLeader => "not_leader",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Internal => "internal",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::NeedsUpgrade => "needs_upgrade",
            ErrorKind::Compacted => "compacted",
        }
    }

    pub fn parse(kind: &str) -> Option<ErrorKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == kind)
    }

    /// The gRPC status code that goes with this kind.
    pub fn grpc_code(self) -> tonic::Code {
        use tonic::Code;
        match self {
            ErrorKind::UnknownSession => Code::NotFound,
            ErrorKind::Busy | ErrorKind::LimitReached => Code::ResourceExhausted,
            ErrorKind::NotHolder
            | ErrorKind::StaleToken
            | ErrorKind::SessionExpiring
            | ErrorKind::NeedsUpgrade => Code::FailedPrecondition,
            ErrorKind::InvalidArgument => Code::InvalidArgument,
            ErrorKind::WaitTimeout => Code::DeadlineExceeded,
            ErrorKind::WaitCancelled => Code::Aborted,
            // UNAVAILABLE, not RESOURCE_EXHAUSTED: gRPC's own retry policies
            // and generic clients retry it with backoff, which is the answer.
            ErrorKind::NotLeader | ErrorKind::Unavailable | ErrorKind::Overloaded => {
                Code::Unavailable
            }
            ErrorKind::Internal => Code::Internal,
            ErrorKind::PermissionDenied => Code::PermissionDenied,
            ErrorKind::Unauthenticated => Code::Unauthenticated,
            ErrorKind::Compacted => Code::OutOfRange,
        }
    }

    /// Builds a status that carries this kind in its trailer.
    pub fn status(self, message: impl Into<String>) -> tonic::Status {
        let mut status = tonic::Status::new(self.grpc_code(), message);
        status.metadata_mut().insert(
            ERROR_KIND_KEY,
            tonic::metadata::MetadataValue::from_static(self.as_str()),
        );
        status
    }

    /// Reads the kind back from a status; statuses from elsewhere (a proxy,
    /// the transport) get a kind from their code.
    pub fn of_status(status: &tonic::Status) -> ErrorKind {
        status
            .metadata()
            .get(ERROR_KIND_KEY)
            .and_then(|v| v.to_str().ok())
            .and_then(ErrorKind::parse)
            .unwrap_or(match status.code() {
                // A bare Cancelled comes from the transport (a reset
                // stream), not from the server: worth a retry.
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
                    ErrorKind::Unavailable
                }
                tonic::Code::DeadlineExceeded => ErrorKind::WaitTimeout,
                tonic::Code::InvalidArgument | tonic::Code::OutOfRange => {
                    ErrorKind::InvalidArgument
                }
                tonic::Code::PermissionDenied => ErrorKind::PermissionDenied,
                tonic::Code::Unauthenticated => ErrorKind::Unauthenticated,
                _ => ErrorKind::Internal,
            })
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorKind;

    #[test]
    fn every_kind_survives_a_status_round_trip() {
        for kind in ErrorKind::ALL {
            assert_eq!(ErrorKind::parse(kind.as_str()), Some(kind));
            assert_eq!(ErrorKind::of_status(&kind.status("x")), kind);
        }
    }

    #[test]
    fn a_call_error_becomes_the_status_a_unary_call_ends_with() {
        let error = super::v1::CallError {
            kind: "not_leader".into(),
            message: "ask elsewhere".into(),
            leader: Some("http://10.0.0.2:7070".into()),
        };
        let status = error.into_status();
        assert_eq!(ErrorKind::of_status(&status), ErrorKind::NotLeader);
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(status.message(), "ask elsewhere");
        assert_eq!(
            status.metadata().get(super::LEADER_KEY).unwrap(),
            "http://10.0.0.2:7070"
        );
        let unknown = super::v1::CallError {
            kind: "from_the_future".into(),
            ..Default::default()
        };
        assert_eq!(
            ErrorKind::of_status(&unknown.into_status()),
            ErrorKind::Internal
        );
    }
}
