//! [`Error`]: what went wrong with a request, as a stable [`ErrorKind`] to
//! branch on and a message to show a person.
//!
//! Server refusals keep the server's own message, which already names the
//! lock, session or token involved. Failures that never reached a Deadbolt
//! server (refused connections, resets, a proxy's reply) carry no kind from the
//! server, so they are described here and name the endpoint that failed.

use deadbolt_proto::ErrorKind;
use std::error::Error as _;

/// A failed Deadbolt request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    leader: Option<String>,
    /// The request never left this process: no connection could be made.
    unsent: bool,
    /// A change cut off with its outcome unknown, then refused on repeat.
    outcome_unknown: bool,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            leader: None,
            unsent: false,
            outcome_unknown: false,
        }
    }

    /// A change whose first attempt was cut off (its node died or lost the
    /// cluster with the answer on its way) and whose repeat was refused:
    /// the refusal (say, a stale token, because another holder of a
    /// semaphore has written since) does not say whether the first attempt
    /// was done, so neither can this error. The kind is
    /// [`ErrorKind::Unavailable`]; read the state again to know.
    pub fn outcome_unknown(&self) -> bool {
        self.outcome_unknown
    }

    /// An unknown outcome: `earlier` (an attempt cut off) was repeated and
    /// the repeat `refused`.
    pub(crate) fn of_unknown_outcome(earlier: &Error, refused: &Error) -> Self {
        Self {
            outcome_unknown: true,
            ..Self::new(
                ErrorKind::Unavailable,
                format!(
                    "{earlier}; repeated, the call was refused ({refused}), which does not say \
                     whether the first attempt was done: its outcome is unknown"
                ),
            )
        }
    }

    /// With [`ErrorKind::NotLeader`]: the leader's address (`host:port`),
    /// when the answering node knew it.
    pub fn leader(&self) -> Option<&str> {
        self.leader.as_deref()
    }

    /// The machine-readable kind, as the server (or the transport) reported it.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The human-readable description; the same text `Display` prints.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Interprets a status that came back from a call to `endpoint`.
    pub(crate) fn from_status(status: &tonic::Status, endpoint: &str) -> Self {
        let kind = ErrorKind::of_status(status);
        if status
            .metadata()
            .contains_key(deadbolt_proto::ERROR_KIND_KEY)
        {
            let message = if status.message().is_empty() {
                kind.as_str().to_owned()
            } else {
                status.message().to_owned()
            };
            let leader = status
                .metadata()
                .get(deadbolt_proto::LEADER_KEY)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned);
            return Self {
                leader,
                ..Self::new(kind, message)
            };
        }
        // No kind trailer: the status was made by the transport or by
        // something between us and the server, not by Deadbolt. Its
        // `Display` dumps every field, so describe it from the message and
        // whatever caused it.
        let cause = with_sources(status.message().to_owned(), status.source());
        let message = if kind == ErrorKind::Unavailable {
            let hint = tls_hint(&cause);
            format!("could not reach the Deadbolt server at {endpoint}: {cause}{hint}")
        } else {
            format!(
                "unexpected reply from {endpoint} ({:?}): {cause}",
                status.code()
            )
        };
        // tonic reports a failed dial only through the error text.
        let unsent = kind == ErrorKind::Unavailable && cause.contains("tcp connect error");
        Self {
            unsent,
            ..Self::new(kind, message)
        }
    }

    /// The request certainly had no effect: it was refused by a node that
    /// is not the leader, or it could not even be sent.
    pub(crate) fn had_no_effect(&self) -> bool {
        self.kind == ErrorKind::NotLeader || self.unsent
    }

    /// Worth repeating as is, after a backoff: the server could not be
    /// reached, was not the one to answer, or was too busy to take it
    /// (`overloaded`), so the request had no effect or an idempotent one.
    pub(crate) fn is_transient(&self) -> bool {
        self.points_elsewhere() || self.kind == ErrorKind::Overloaded
    }

    /// Another endpoint may do better: this one could not be reached or is
    /// not the leader. (An overloaded leader is still the leader: the
    /// others would only send the call back to it.)
    pub(crate) fn points_elsewhere(&self) -> bool {
        matches!(self.kind, ErrorKind::Unavailable | ErrorKind::NotLeader)
    }

    /// The server has no live session by that id: it was closed, or its lease
    /// ran out (or is being expired), so every lock it held is gone.
    pub(crate) fn ends_session(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::UnknownSession | ErrorKind::SessionExpiring
        )
    }
}

/// What to do about a TLS handshake that failed, from the words rustls
/// reports it with.
pub(crate) fn tls_hint(failure: &str) -> &'static str {
    if failure.contains("CertificateRequired") {
        " (the server requires a client certificate: give --cert and --key)"
    } else if failure.contains("UnknownIssuer") {
        " (the server's certificate is not signed by the --ca given)"
    } else if failure.contains("NotValidForName") {
        " (the server's certificate does not name this address)"
    } else {
        ""
    }
}

/// Renders an error and its sources as one line. Transport errors are
/// layered ("transport error" over "tcp connect error" over the OS error),
/// and only the whole chain says what actually happened.
pub(crate) fn describe_chain(error: &(dyn std::error::Error + 'static)) -> String {
    with_sources(error.to_string(), error.source())
}

/// Appends each source's text to `text`, skipping layers that merely repeat
/// what is already there.
fn with_sources(
    mut text: String,
    mut source: Option<&(dyn std::error::Error + 'static)>,
) -> String {
    while let Some(cause) = source {
        let part = cause.to_string();
        if !part.is_empty() && !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_keep_the_servers_message() {
        let status =
            ErrorKind::StaleToken.status("stale token: lock \"x\" is held with token 9, not 7");
        let error = Error::from_status(&status, "http://127.0.0.1:7070");
        assert_eq!(error.kind(), ErrorKind::StaleToken);
        assert_eq!(
            error.to_string(),
            "stale token: lock \"x\" is held with token 9, not 7"
        );
    }

    #[test]
    fn untagged_unavailable_names_the_endpoint() {
        let status = tonic::Status::unavailable("connection refused");
        let error = Error::from_status(&status, "http://127.0.0.1:7070");
        assert_eq!(error.kind(), ErrorKind::Unavailable);
        assert_eq!(
            error.to_string(),
            "could not reach the Deadbolt server at http://127.0.0.1:7070: connection refused"
        );
        assert!(error.is_transient());
    }
}
