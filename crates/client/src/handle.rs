//! [`SessionHandle`]: a session's id and secret, which together are what it
//! takes to act on the session.
//!
//! The id alone is public (`status`, `locks` and `history` show it to
//! anyone), so the server refuses every call on a session that does not
//! also carry the secret it returned when the session was opened. A
//! [`crate::Session`] keeps its handle to itself; the raw calls take one,
//! and the CLI prints and reads it as `ID.SECRET` (`12.9f8e…`), so that a
//! script can hand a session from `deadbolt acquire` to `deadbolt release`.

use crate::{Error, ErrorKind};
use std::fmt;
use std::str::FromStr;

/// A session's id and secret. `Display` and [`FromStr`] use the `ID.SECRET`
/// form; `Debug` leaves the secret out, so that logging a handle does not
/// give the session away.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionHandle {
    id: u64,
    secret: String,
}

impl SessionHandle {
    /// A handle from the id and secret the server returned on opening the
    /// session (over HTTP, say).
    pub fn new(id: u64, secret: impl Into<String>) -> Self {
        SessionHandle {
            id,
            secret: secret.into(),
        }
    }

    /// The server's id for the session; never reused.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The secret, as the API's `session_secret` fields carry it.
    pub fn secret(&self) -> &str {
        &self.secret
    }
}

impl fmt::Display for SessionHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.id, self.secret)
    }
}

impl fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionHandle")
            .field("id", &self.id)
            .field("secret", &"(hidden)")
            .finish()
    }
}

/// What every refusal of a malformed handle ends with. The text given is
/// never repeated: it may hold a real secret, and error messages end up in
/// logs.
const HANDLE_FORM: &str = "a session handle is ID.SECRET, as `deadbolt acquire` prints it \
                           (e.g. 12.3f9a0c...); the id alone is not enough to act on a session";

impl FromStr for SessionHandle {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let invalid =
            |what: String| Error::new(ErrorKind::InvalidArgument, format!("{what}: {HANDLE_FORM}"));
        let (id, secret) = text.trim().split_once('.').unwrap_or((text.trim(), ""));
        let id: u64 = id.parse().map_err(|_| {
            invalid("invalid session handle: it does not start with a session id".into())
        })?;
        if secret.is_empty() {
            return Err(invalid(format!("session {id} is given without its secret")));
        }
        // The server hands out lowercase hex; anything else is a typo that
        // the server would only refuse as someone else's session.
        if !secret
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(invalid(format!(
                "invalid session handle for session {id}: the secret must be lowercase hex digits"
            )));
        }
        Ok(SessionHandle::new(id, secret))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_reads_back_as_it_prints() {
        let handle = SessionHandle::new(12, "9f8e0a");
        assert_eq!(handle.to_string(), "12.9f8e0a");
        assert_eq!("12.9f8e0a".parse::<SessionHandle>().unwrap(), handle);
        assert_eq!(" 12.9f8e0a\n".parse::<SessionHandle>().unwrap(), handle);
    }

    #[test]
    fn debug_keeps_the_secret_out_of_logs() {
        let shown = format!("{:?}", SessionHandle::new(12, "9f8e0a"));
        assert!(shown.contains("12") && !shown.contains("9f8e0a"), "{shown}");
    }

    #[test]
    fn bad_handles_are_refused_without_repeating_the_secret() {
        for (text, says) in [
            ("12", "session 12 is given without its secret"),
            ("12.", "session 12 is given without its secret"),
            ("", "does not start with a session id"),
            (".9f8e", "does not start with a session id"),
            ("x12.9f8e", "does not start with a session id"),
            ("-1.9f8e", "does not start with a session id"),
            ("12.9F8E", "lowercase hex digits"),
            ("12.9f8e.77", "lowercase hex digits"),
            ("12.9f8e zz", "lowercase hex digits"),
        ] {
            let error = text.parse::<SessionHandle>().unwrap_err();
            assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{text:?}");
            assert!(error.message().contains(says), "{text:?}: {error}");
            assert!(error.message().contains("ID.SECRET"), "{text:?}: {error}");
            if let Some((_, secret)) = text.split_once('.').filter(|(_, s)| s.len() > 2) {
                assert!(!error.message().contains(secret), "{text:?}: {error}");
            }
        }
    }
}
