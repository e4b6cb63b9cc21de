//! Who is calling, and may they: authentication and authorization for
//! every call of the client API (and, in [`peers`], of the peer service).
//!
//! Why one module between the wire and [`Node`]: both front ends (gRPC and
//! HTTP) and the `Calls` stream hand over the same [`Credentials`] (the
//! bearer token and the TLS client certificate's name), and every call of
//! [`crate::api::Api`] turns them into a [`Caller`] and asks [`Node::permit`]
//! before doing anything, so no endpoint can forget the check.
//!
//! The rules are the replicated [`deadbolt_core::AccessControl`] in the
//! applied table: every node enforces the same ones, and they survive
//! leader changes and restarts. A token is `dbt.<id>.<secret>`: the id is
//! public (listed, revoked by it), the table keeps the SHA-256 of the secret
//! only, and the check is a map lookup and one hash compared in constant
//! time (no bcrypt per request). A token this node has not applied yet (it
//! was just made, on a lagging replica) is looked up once more after a
//! linearizable barrier, as a session id is.
//!
//! Credentials end (`deadbolt acl token create --ttl`, `deadbolt acl deny`)
//! on the same check: an expired token or a denied identity is refused at
//! its next call, also on a connection opened before, and an open watch
//! ends at its next event ([`Node::still_trusted`]).
//!
//! Access control is off until `deadbolt acl bootstrap`: then every caller
//! may do everything, as on the loopback default, but a session still
//! belongs to the identity that opened it (see `secret.rs` for the other
//! half: its secret).

pub mod peers;

use crate::node::{ApiError, Node};
use crate::secret::{self, SecretSource};
use crate::tls::TlsClient;
use deadbolt_core::{AccessControl, Permission};
use deadbolt_proto::ErrorKind;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// The scheme of a token: makes one recognisable in logs and to secret
/// scanners.
const TOKEN_PREFIX: &str = "dbt";
/// Longest `authorization` value looked at: a token is about 53 bytes.
const MAX_TOKEN_BYTES: usize = 256;

/// What a request presented, before anything is checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// The `authorization` header or metadata, if any.
    authorization: Option<String>,
    /// The TLS client certificate's common name (mTLS), if any.
    certificate: Option<String>,
}

impl Credentials {
    /// No token and no certificate: what the simulation's clients present.
    pub const ANONYMOUS: Credentials = Credentials {
        authorization: None,
        certificate: None,
    };

    /// What a client with a certificate named `name` presents (mutual TLS),
    /// for the simulation's clients, which reach nodes without TLS.
    pub fn certificate(name: &str) -> Credentials {
        Credentials {
            authorization: None,
            certificate: Some(name.to_owned()),
        }
    }

    /// From a request's `authorization` header (or gRPC metadata) and the
    /// TLS client the listener put into its extensions.
    pub fn new(authorization: Option<&[u8]>, tls: Option<&TlsClient>) -> Credentials {
        Credentials {
            authorization: authorization.map(|value| String::from_utf8_lossy(value).into_owned()),
            certificate: tls.and_then(|client| client.name.clone()),
        }
    }
}

/// Calls in flight per identity: a limit on what one client (or one
/// leaked token) can hold of the server, across all its connections.
/// Connections and streams have limits of their own (`listener.rs`), but a
/// client with many connections could still fill the proposer and the wait
/// queues alone. Anonymous callers share one count.
#[derive(Debug)]
pub struct InFlight {
    limit: usize,
    /// Looked up twice per call (in and out): foldhash, not SipHash, as the
    /// stream's map of calls (`calls.rs`).
    counts: Mutex<HashMap<Option<String>, usize, foldhash::fast::RandomState>>,
}

impl InFlight {
    pub fn new(limit: usize) -> Arc<InFlight> {
        assert!(limit > 0, "the limit of calls in flight must be positive");
        Arc::new(InFlight {
            limit,
            counts: Mutex::new(HashMap::default()),
        })
    }

    /// A slot for one call of `identity`, given back when dropped.
    fn enter(self: &Arc<Self>, identity: Option<&str>) -> Result<InFlightSlot, ApiError> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let count = counts.entry(identity.map(str::to_owned)).or_default();
        if *count >= self.limit {
            let who = identity.map_or("anonymous callers have".to_owned(), |i| {
                format!("identity {i:?} has")
            });
            return Err(ApiError::new(
                ErrorKind::LimitReached,
                format!(
                    "{who} {} calls in flight already (the server's \
                     --max-calls-per-identity); wait for some to finish",
                    self.limit
                ),
            ));
        }
        *count += 1;
        Ok(InFlightSlot {
            in_flight: self.clone(),
            identity: identity.map(str::to_owned),
        })
    }
}

/// One call's place in [`InFlight`].
#[derive(Debug)]
pub struct InFlightSlot {
    in_flight: Arc<InFlight>,
    identity: Option<String>,
}

impl Drop for InFlightSlot {
    fn drop(&mut self) {
        let mut counts = self
            .in_flight
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let count = counts
            .get_mut(&self.identity)
            .expect("a slot's identity is counted");
        *count -= 1;
        // Only identities with calls in flight take room.
        if *count == 0 {
            counts.remove(&self.identity);
        }
    }
}

/// How a caller proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthenticatedBy {
    Token,
    Certificate,
}

impl AuthenticatedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthenticatedBy::Token => "token",
            AuthenticatedBy::Certificate => "certificate",
        }
    }
}

/// An authenticated caller; `identity` is `None` for an anonymous one.
#[derive(Debug)]
#[must_use = "a caller holds its call's slot in `InFlight`: keep it for the whole call"]
pub struct Caller {
    pub identity: Option<String>,
    pub by: Option<AuthenticatedBy>,
    /// The id of the token it presented, if it did: its expiry is checked
    /// again while a watch runs.
    token_id: Option<String>,
    /// Held for as long as the call runs.
    slot: Option<InFlightSlot>,
}

impl Caller {
    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    /// Counts this call against its identity's calls in flight.
    pub fn admit(mut self, in_flight: &Arc<InFlight>) -> Result<Caller, ApiError> {
        self.slot = Some(in_flight.enter(self.identity())?);
        Ok(self)
    }
}

/// A new token: (token id, the token to show once, the hash to store).
pub fn draw_token(secrets: &SecretSource) -> (String, String, deadbolt_core::SecretHash) {
    let (id, _) = secrets.draw();
    let id = id[..16].to_owned();
    let (secret, hash) = secrets.draw();
    let token = format!("{TOKEN_PREFIX}.{id}.{secret}");
    (id, token, hash)
}

/// `(id, secret)` of a well-formed `authorization` value.
fn parse_bearer(authorization: &str) -> Result<(&str, &str), ApiError> {
    let unusable = |why: &str| {
        ApiError::new(
            ErrorKind::Unauthenticated,
            format!("the authorization header {why}: send `Bearer dbt.<id>.<secret>`, a token from `deadbolt acl token create`"),
        )
    };
    if authorization.len() > MAX_TOKEN_BYTES {
        return Err(unusable("is too long"));
    }
    let Some((scheme, token)) = authorization.split_once(' ') else {
        return Err(unusable("has no scheme"));
    };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(unusable("is not a bearer token"));
    }
    let mut parts = token.trim().split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(TOKEN_PREFIX), Some(id), Some(secret), None) if !id.is_empty() => Ok((id, secret)),
        _ => Err(unusable("does not hold a Deadbolt token")),
    }
}

impl Node {
    /// Who `credentials` speak for. A token must be valid whether or not
    /// access control is on (a client configured with a token should hear
    /// that it is wrong); a certificate's name is its identity.
    pub async fn authenticate(&self, credentials: &Credentials) -> Result<Caller, ApiError> {
        let Some(authorization) = &credentials.authorization else {
            let caller = Caller {
                identity: credentials.certificate.clone(),
                by: credentials
                    .certificate
                    .as_ref()
                    .map(|_| AuthenticatedBy::Certificate),
                token_id: None,
                slot: None,
            };
            self.still_trusted(&caller)?;
            return Ok(caller);
        };
        let (id, secret) = parse_bearer(authorization)?;
        if let Some(checked) = self.check_bearer(id, secret) {
            return checked;
        }
        // Boxed: the barrier's future is 2 KB, and this path is rare (a
        // token this node has not applied yet). Inline, every call's future
        // would carry those bytes, copied each time a call is boxed.
        Box::pin(self.linearizable()).await?;
        self.check_bearer(id, secret).unwrap_or_else(|| {
            Err(ApiError::new(
                ErrorKind::Unauthenticated,
                format!("unknown token dbt.{id}.…: it was revoked, or never made"),
            ))
        })
    }

    /// The token on the applied table; `None` if this node does not know
    /// its id.
    fn check_bearer(&self, id: &str, secret: &str) -> Option<Result<Caller, ApiError>> {
        let state = self.table.read().expect("state lock poisoned");
        let acl = state.table.acl();
        let token = acl.token(id)?;
        if !secret::matches(secret, &token.hash) {
            return Some(Err(ApiError::new(
                ErrorKind::Unauthenticated,
                format!("token dbt.{id}.… has the wrong secret"),
            )));
        }
        let caller = Caller {
            identity: Some(token.identity.clone()),
            by: Some(AuthenticatedBy::Token),
            token_id: Some(id.to_owned()),
            slot: None,
        };
        let clock = self.leases.clock();
        Some(trusted(acl, &caller, || clock.unix_ms()).map(|()| caller))
    }

    /// Whether `caller`'s credentials still hold: its token has not
    /// expired, its identity is not denied. Asked at every call, and by a
    /// watch before each event it sends, so that credentials that end take
    /// effect on connections and streams opened before.
    pub fn still_trusted(&self, caller: &Caller) -> Result<(), ApiError> {
        // An anonymous caller has nothing that could have ended: no lock
        // taken on the hot path of a loopback node.
        if caller.identity.is_none() {
            return Ok(());
        }
        let state = self.table.read().expect("state lock poisoned");
        let clock = self.leases.clock();
        trusted(state.table.acl(), caller, || clock.unix_ms())
    }

    /// Whether `caller` may use `permission` on `resource` (a lock name or
    /// store key; `None`: on anything at all, for calls not about one).
    pub fn permit(
        &self,
        caller: &Caller,
        permission: Permission,
        resource: Option<&str>,
    ) -> Result<(), ApiError> {
        let state = self.table.read().expect("state lock poisoned");
        check(state.table.acl(), caller, permission, resource)
    }

    /// Keeps only the locks `caller` may read: a listing shows no more.
    pub fn retain_readable(&self, caller: &Caller, locks: &mut Vec<deadbolt_core::LockInfo>) {
        let state = self.table.read().expect("state lock poisoned");
        let acl = state.table.acl();
        locks.retain(|lock| acl.allows(caller.identity(), Permission::Read, &lock.name));
    }

    /// May `caller` watch `name` (or, with `prefix`, something under it)?
    /// A lock-like name needs `read`, a store key `store_read`; which one a
    /// name is may change, so either will do here, and each event is
    /// checked again as it is sent ([`Node::retain_watchable`]).
    pub fn permit_watch(&self, caller: &Caller, name: &str, prefix: bool) -> Result<(), ApiError> {
        let state = self.table.read().expect("state lock poisoned");
        let acl = state.table.acl();
        let resource = (!prefix).then_some(name);
        check(acl, caller, Permission::Read, resource)
            .or_else(|_| check(acl, caller, Permission::StoreRead, resource))
    }

    /// Keeps only the events `caller` may read: a lock's with `read`, a
    /// store key's with `store_read`, under the rules as they are now.
    pub fn retain_watchable(&self, caller: &Caller, events: &mut Vec<crate::watches::Positioned>) {
        let state = self.table.read().expect("state lock poisoned");
        let acl = state.table.acl();
        events.retain(|event| {
            let watched = &event.watched;
            let needs = match watched.kind.is_store() {
                true => Permission::StoreRead,
                false => Permission::Read,
            };
            acl.allows(caller.identity(), needs, &watched.name)
        });
    }
}

/// [`Node::still_trusted`] on given rules; the wall clock (milliseconds
/// since the Unix epoch) is read only for a token that has an expiry.
fn trusted(
    acl: &AccessControl,
    caller: &Caller,
    now_unix_ms: impl FnOnce() -> u64,
) -> Result<(), ApiError> {
    let expiry = caller
        .token_id
        .as_deref()
        .and_then(|id| acl.token_expiry(id));
    if let (Some(id), Some(expiry)) = (&caller.token_id, expiry) {
        if now_unix_ms() >= expiry {
            let at = humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(expiry),
            );
            return Err(ApiError::new(
                ErrorKind::Unauthenticated,
                format!(
                    "token dbt.{id}.… expired at {at}; an admin can make a new one \
                     (`deadbolt acl token create`)"
                ),
            ));
        }
    }
    match caller.identity() {
        Some(identity) if acl.denied(identity) => Err(ApiError::new(
            ErrorKind::PermissionDenied,
            format!(
                "identity {identity:?} is denied, whatever it presents; an admin can allow it \
                 again (`deadbolt acl allow {identity}`)"
            ),
        )),
        _ => Ok(()),
    }
}

/// [`Node::permit`] on given rules.
fn check(
    acl: &AccessControl,
    caller: &Caller,
    permission: Permission,
    resource: Option<&str>,
) -> Result<(), ApiError> {
    let allowed = match resource {
        Some(resource) => acl.allows(caller.identity(), permission, resource),
        None => acl.allows_some(caller.identity(), permission),
    };
    if allowed {
        return Ok(());
    }
    let Some(identity) = caller.identity() else {
        return Err(ApiError::new(
            ErrorKind::Unauthenticated,
            "access control is on: send a token (--access-token, DEADBOLT_ACCESS_TOKEN, or \
             `authorization: Bearer ...`) or a client certificate",
        ));
    };
    let on = match resource {
        Some(resource) => format!(" on {resource:?}"),
        None => String::new(),
    };
    Err(ApiError::new(
        ErrorKind::PermissionDenied,
        format!(
            "identity {identity:?} has no {permission} permission{on}; an admin can grant it \
             (`deadbolt acl role put` and `deadbolt acl grant`)"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use deadbolt_core::{AclCommand, Grant};

    #[test]
    fn calls_in_flight_are_limited_per_identity_and_given_back() {
        let in_flight = InFlight::new(2);
        let ci = [
            in_flight.enter(Some("ci")).unwrap(),
            in_flight.enter(Some("ci")).unwrap(),
        ];
        let refused = in_flight.enter(Some("ci")).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::LimitReached);
        assert!(
            refused
                .message
                .contains(r#"identity "ci" has 2 calls in flight already"#),
            "{}",
            refused.message
        );
        // Others are not held up by ci, anonymous callers count as one.
        let _ops = in_flight.enter(Some("ops")).unwrap();
        let anonymous = [
            in_flight.enter(None).unwrap(),
            in_flight.enter(None).unwrap(),
        ];
        assert!(in_flight.enter(None).is_err());
        drop(anonymous);
        let [first, _second] = ci;
        drop(first);
        let _again = in_flight.enter(Some("ci")).unwrap();
        drop(_ops);
        let counts = in_flight.counts.lock().unwrap();
        assert_eq!(
            counts.len(),
            1,
            "identities without calls take no room: {counts:?}"
        );
    }

    #[test]
    fn a_drawn_token_parses_back_to_its_id_and_a_secret_matching_its_hash() {
        let (id, token, hash) = draw_token(&SecretSource::os());
        let header = format!("Bearer {token}");
        let (parsed_id, secret) = parse_bearer(&header).unwrap();
        assert_eq!(parsed_id, id);
        assert!(secret::matches(secret, &hash));
        assert!(parse_bearer(&format!("bearer  {token}")).is_ok());
    }

    #[test]
    fn malformed_authorization_is_unauthenticated_with_the_expected_form() {
        for bad in [
            "",
            "Bearer",
            "Basic abc",
            "Bearer abc",
            "Bearer dbt..x",
            "Bearer dbt.a.b.c",
        ] {
            let err = parse_bearer(bad).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Unauthenticated, "{bad:?}");
            assert!(
                err.message.contains("Bearer dbt.<id>.<secret>"),
                "{}",
                err.message
            );
        }
        assert!(parse_bearer(&format!("Bearer dbt.a.{}", "x".repeat(300))).is_err());
    }

    #[test]
    fn a_refusal_says_unauthenticated_for_anonymous_and_names_the_missing_permission() {
        let mut acl = AccessControl::default();
        let anonymous = Caller {
            identity: None,
            by: None,
            token_id: None,
            slot: None,
        };
        assert!(check(&acl, &anonymous, Permission::Admin, None).is_ok());
        acl.apply(&AclCommand::Bootstrap {
            token_id: "t".into(),
            hash: deadbolt_core::SecretHash([0; 32]),
        })
        .unwrap();
        let err = check(&acl, &anonymous, Permission::Read, Some("a")).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Unauthenticated);
        acl.apply(&AclCommand::PutRole {
            name: "r".into(),
            grants: vec![Grant::new(Permission::Lock, "jobs/")],
        })
        .unwrap();
        acl.apply(&AclCommand::GrantRole {
            identity: "ci".into(),
            role: "r".into(),
        })
        .unwrap();
        let ci = Caller {
            identity: Some("ci".into()),
            by: Some(AuthenticatedBy::Token),
            token_id: None,
            slot: None,
        };
        assert!(check(&acl, &ci, Permission::Lock, Some("jobs/a")).is_ok());
        assert!(check(&acl, &ci, Permission::Lock, None).is_ok());
        let err = check(&acl, &ci, Permission::Lock, Some("web/a")).unwrap_err();
        assert_eq!(err.kind, ErrorKind::PermissionDenied);
        assert!(
            err.message
                .contains(r#""ci" has no lock permission on "web/a""#),
            "{}",
            err.message
        );
    }

    #[test]
    fn an_expired_token_and_a_denied_identity_are_refused_saying_why_and_what_to_do() {
        let mut acl = AccessControl::default();
        let changes = [
            AclCommand::Bootstrap {
                token_id: "t".into(),
                hash: deadbolt_core::SecretHash([0; 32]),
            },
            AclCommand::CreateExpiringToken {
                token_id: "ci0".into(),
                identity: "ci".into(),
                hash: deadbolt_core::SecretHash([1; 32]),
                expires_unix_ms: 2_000_000,
            },
        ];
        for change in changes {
            acl.apply(&change).unwrap();
        }
        let ci = Caller {
            identity: Some("ci".into()),
            by: Some(AuthenticatedBy::Token),
            token_id: Some("ci0".into()),
            slot: None,
        };
        assert!(
            trusted(&acl, &ci, || 1_999_999).is_ok(),
            "before its expiry"
        );
        let expired = trusted(&acl, &ci, || 2_000_000).unwrap_err();
        assert_eq!(expired.kind, ErrorKind::Unauthenticated);
        assert!(
            expired
                .message
                .contains("token dbt.ci0.… expired at 1970-01-01T00:33:20Z"),
            "{}",
            expired.message
        );
        let laptop = Caller {
            identity: Some("laptop-7".into()),
            by: Some(AuthenticatedBy::Certificate),
            token_id: None,
            slot: None,
        };
        assert!(trusted(&acl, &laptop, || 0).is_ok());
        acl.apply(&AclCommand::DenyIdentity {
            identity: "laptop-7".into(),
        })
        .unwrap();
        let denied = trusted(&acl, &laptop, || 0).unwrap_err();
        assert_eq!(denied.kind, ErrorKind::PermissionDenied);
        assert!(
            denied.message.contains("`deadbolt acl allow laptop-7`"),
            "{}",
            denied.message
        );
    }
}
