//! Access control: which identity may do what, on which locks and keys.
//!
//! Why here, in the replicated table: every node must enforce the same
//! rules, and keep enforcing them after a leader change, a restart or a
//! snapshot restore. etcd's simple tokens lived in one node's memory and
//! stopped working after a leader change; rules and token hashes that go
//! through the log like a grant cannot.
//!
//! The model follows Consul's policies and etcd's roles: a *role* is a list
//! of [`Grant`]s (a [`Permission`] on a lock-name or store-key prefix), an
//! *identity* (a client certificate's name, or the name a token was made
//! for) holds roles, and everything not granted is refused. Until
//! [`AclCommand::Bootstrap`] runs, access control is off and everything is
//! allowed, which is the loopback default; bootstrapping turns it on for
//! good, making identity `root` with the `root` role, which grants all.
//!
//! Credentials can end (from [`FeatureLevel::CREDENTIAL_ENDS`] on): a token
//! made with an expiry stops working at that instant of the wall clock
//! ([`AccessControl::token_expiry`]), and an identity on the deny list is
//! refused whatever it presents, a client certificate the CA still vouches
//! for included ([`AclCommand::DenyIdentity`]). Both are read on every call,
//! so they take effect on open connections at their next call. The wall
//! clock, not a monotonic one, because a credential's end is a date the
//! administrator gives ("30 days") that must survive restarts; a skewed
//! clock moves it by the skew, which is no safety matter (leases run on
//! monotonic clocks and tokens on the table's own counter).
//!
//! Tokens are stored only as the SHA-256 of their secret part (they are 128
//! random bits, so a slow salted hash would buy nothing and cost every
//! request: the bcrypt-per-request pain etcd had). Hashing and comparing are
//! the server's, as for session secrets: this crate has no cryptography.

use crate::{FeatureLevel, SecretHash};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The role bootstrap creates: every permission on everything. It cannot be
/// changed or deleted, and identity [`ROOT_IDENTITY`] cannot lose it, so an
/// administrator can always get back in with a root token.
pub const ROOT_ROLE: &str = "root";
/// The identity bootstrap's token belongs to.
pub const ROOT_IDENTITY: &str = "root";

/// Bounds on the access-control state: it is in every snapshot and checked
/// on every call.
pub const MAX_ROLES: usize = 1024;
pub const MAX_GRANTS_PER_ROLE: usize = 64;
pub const MAX_IDENTITIES: usize = 10_000;
pub const MAX_TOKENS: usize = 10_000;
/// Longest role, identity or token-id name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Longest grant prefix, in bytes (as long as the longest lock name or key).
pub const MAX_PREFIX_BYTES: usize = 1024;

/// What a grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Permission {
    /// Open sessions, and acquire, release and keep alive locks under the
    /// prefix.
    Lock,
    /// Status, list, history and token checks of locks under the prefix,
    /// and the cluster's status.
    Read,
    /// Read store keys under the prefix (plain and fenced reads).
    StoreRead,
    /// Put and delete store keys under the prefix.
    StoreWrite,
    /// Membership and access control. Not tied to a prefix.
    Admin,
}

impl Permission {
    pub const ALL: [Permission; 5] = [
        Permission::Lock,
        Permission::Read,
        Permission::StoreRead,
        Permission::StoreWrite,
        Permission::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Lock => "lock",
            Permission::Read => "read",
            Permission::StoreRead => "store-read",
            Permission::StoreWrite => "store-write",
            Permission::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<Permission> {
        Self::ALL.into_iter().find(|p| p.as_str() == text)
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A permission on every lock name or store key that starts with
/// `prefix` (`""`: all of them).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Grant {
    pub permission: Permission,
    pub prefix: String,
}

impl Grant {
    pub fn new(permission: Permission, prefix: impl Into<String>) -> Grant {
        Grant {
            permission,
            prefix: prefix.into(),
        }
    }

    /// From the text form `PERMISSION` or `PERMISSION:PREFIX`
    /// (`lock:jobs/`, `read`, `admin`), as the CLI takes it.
    pub fn parse(text: &str) -> Result<Grant, String> {
        let (permission, prefix) = text.split_once(':').unwrap_or((text, ""));
        let permission = Permission::parse(permission).ok_or_else(|| {
            let known: Vec<&str> = Permission::ALL.iter().map(|p| p.as_str()).collect();
            format!(
                "unknown permission {permission:?} in {text:?}: the permissions are {}",
                known.join(", ")
            )
        })?;
        Ok(Grant::new(permission, prefix))
    }

    fn covers(&self, permission: Permission, resource: &str) -> bool {
        self.permission == permission && resource.starts_with(&self.prefix)
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.permission, self.prefix)
    }
}

/// A bearer token as the table keeps it: whose it is, and the hash of its
/// secret part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessToken {
    pub identity: String,
    pub hash: SecretHash,
}

/// A change to the access-control state. Names are checked here, so every
/// replica refuses the same commands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AclCommand {
    /// Turn access control on, with a first token for [`ROOT_IDENTITY`].
    /// Refused once access control is on.
    Bootstrap { token_id: String, hash: SecretHash },
    /// Create `name`, or replace its grants.
    PutRole { name: String, grants: Vec<Grant> },
    /// Delete a role, and take it from every identity.
    DeleteRole { name: String },
    /// Give `identity` the role (creating the identity if new).
    GrantRole { identity: String, role: String },
    /// Take the role from `identity`.
    RevokeRole { identity: String, role: String },
    /// A new token for `identity`.
    CreateToken {
        token_id: String,
        identity: String,
        hash: SecretHash,
    },
    /// The token stops working on every node once this is applied.
    RevokeToken { token_id: String },
    /// A new token for `identity` that stops working at `expires_unix_ms`
    /// (milliseconds since the Unix epoch, on each node's wall clock). From
    /// [`FeatureLevel::CREDENTIAL_ENDS`] on: release 0.2.0 cannot decode it.
    CreateExpiringToken {
        token_id: String,
        identity: String,
        hash: SecretHash,
        expires_unix_ms: u64,
    },
    /// Refuse `identity` whatever it presents (its tokens, and a client
    /// certificate with its name), until [`AclCommand::AllowIdentity`].
    /// From [`FeatureLevel::CREDENTIAL_ENDS`] on.
    DenyIdentity { identity: String },
    /// Take `identity` off the deny list.
    AllowIdentity { identity: String },
}

impl AclCommand {
    /// The cluster version the command needs: an older release cannot
    /// decode it, so no replica may see it in the log before then.
    pub fn needs(&self) -> FeatureLevel {
        match self {
            AclCommand::CreateExpiringToken { .. }
            | AclCommand::DenyIdentity { .. }
            | AclCommand::AllowIdentity { .. } => FeatureLevel::CREDENTIAL_ENDS,
            _ => FeatureLevel::BASE,
        }
    }

    /// The bytes of its strings, for the log's size estimate.
    pub(crate) fn text_bytes(&self) -> usize {
        match self {
            AclCommand::Bootstrap { token_id, .. } | AclCommand::RevokeToken { token_id } => {
                token_id.len()
            }
            AclCommand::PutRole { name, grants } => {
                name.len() + grants.iter().map(|g| g.prefix.len() + 8).sum::<usize>()
            }
            AclCommand::DeleteRole { name } => name.len(),
            AclCommand::GrantRole { identity, role }
            | AclCommand::RevokeRole { identity, role } => identity.len() + role.len(),
            AclCommand::CreateToken {
                token_id, identity, ..
            }
            | AclCommand::CreateExpiringToken {
                token_id, identity, ..
            } => token_id.len() + identity.len(),
            AclCommand::DenyIdentity { identity } | AclCommand::AllowIdentity { identity } => {
                identity.len()
            }
        }
    }
}

/// For logs: what changed, without the token hashes.
impl fmt::Display for AclCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AclCommand::Bootstrap { token_id, .. } => {
                write!(f, "bootstrap (root token {token_id})")
            }
            AclCommand::PutRole { name, grants } => {
                let grants: Vec<String> = grants.iter().map(Grant::to_string).collect();
                write!(f, "role {name} = {}", grants.join(" "))
            }
            AclCommand::DeleteRole { name } => write!(f, "role {name} deleted"),
            AclCommand::GrantRole { identity, role } => write!(f, "{identity} granted role {role}"),
            AclCommand::RevokeRole { identity, role } => write!(f, "{identity} lost role {role}"),
            AclCommand::CreateToken {
                token_id, identity, ..
            } => write!(f, "token {token_id} made for {identity}"),
            AclCommand::RevokeToken { token_id } => write!(f, "token {token_id} revoked"),
            AclCommand::CreateExpiringToken {
                token_id,
                identity,
                expires_unix_ms,
                ..
            } => write!(
                f,
                "token {token_id} made for {identity}, until {expires_unix_ms} ms after the epoch"
            ),
            AclCommand::DenyIdentity { identity } => write!(f, "{identity} denied"),
            AclCommand::AllowIdentity { identity } => write!(f, "{identity} allowed again"),
        }
    }
}

/// Why an access-control change was refused. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AclError {
    #[error("access control is already on: bootstrap works once (use a root token to make more)")]
    AlreadyBootstrapped,
    #[error("access control is off: run `deadbolt acl bootstrap` first")]
    NotBootstrapped,
    #[error("no role {0:?}")]
    UnknownRole(String),
    #[error("role {0:?} is built in and cannot be changed or deleted")]
    BuiltInRole(String),
    #[error("identity {0:?} always keeps role {ROOT_ROLE:?}, so an administrator can always get back in")]
    RootKeepsRoot(String),
    #[error("no token {0:?} (it was revoked, or never existed)")]
    UnknownToken(String),
    #[error("token id {0:?} exists already")]
    TokenExists(String),
    #[error("invalid {what} {name:?}: {reason}")]
    InvalidName {
        what: String,
        name: String,
        reason: String,
    },
    #[error("{what} is {count}, the limit is {limit}")]
    TooMany {
        what: String,
        count: usize,
        limit: usize,
    },
    #[error("the admin permission is not tied to a prefix: write \"admin\", not {0:?}")]
    AdminWithPrefix(String),
    #[error("identity {0:?} cannot be denied, so an administrator can always get back in (revoke its leaked token instead)")]
    RootCannotBeDenied(String),
    #[error("identity {0:?} is not denied")]
    NotDenied(String),
}

/// The replicated access-control state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessControl {
    enabled: bool,
    /// Role name → its grants. Holds [`ROOT_ROLE`] once enabled.
    roles: BTreeMap<String, Vec<Grant>>,
    /// Identity → the roles it holds.
    identities: BTreeMap<String, BTreeSet<String>>,
    /// Token id (public, listed) → the token.
    tokens: BTreeMap<String, AccessToken>,
    /// Expiries and the deny list. Not in this struct's own encoding, which
    /// stays release 0.2.0's: the table image writes them after the
    /// semaphores, from [`FeatureLevel::CREDENTIAL_ENDS`] on.
    #[serde(skip)]
    ends: CredentialEnds,
}

/// Where credentials end: token expiries and denied identities.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialEnds {
    /// Token id → when it stops working, in milliseconds since the Unix
    /// epoch. Only tokens made with an expiry; at most [`MAX_TOKENS`].
    token_expiries: BTreeMap<String, u64>,
    /// Identities refused whatever they present; at most
    /// [`MAX_IDENTITIES`].
    denied: BTreeSet<String>,
}

impl AccessControl {
    /// Whether access control is on. Off, every call is allowed.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether `identity` may use `permission` on `resource` (a lock name
    /// or store key). Off: always. On: only with a grant that covers it;
    /// no identity (an anonymous caller) may do nothing.
    pub fn allows(&self, identity: Option<&str>, permission: Permission, resource: &str) -> bool {
        !self.enabled
            || self
                .grants(identity)
                .any(|grant| grant.covers(permission, resource))
    }

    /// Whether `identity` has `permission` on at least some prefix: enough
    /// for calls not about one lock (opening a session, cluster status).
    pub fn allows_some(&self, identity: Option<&str>, permission: Permission) -> bool {
        !self.enabled
            || self
                .grants(identity)
                .any(|grant| grant.permission == permission)
    }

    /// Every grant `identity` holds, through all its roles: none for a
    /// denied identity.
    pub fn grants<'a>(&'a self, identity: Option<&str>) -> impl Iterator<Item = &'a Grant> + 'a {
        identity
            .filter(|identity| !self.denied(identity))
            .and_then(|identity| self.identities.get(identity))
            .into_iter()
            .flatten()
            .filter_map(|role| self.roles.get(role))
            .flatten()
    }

    pub fn token(&self, token_id: &str) -> Option<&AccessToken> {
        self.tokens.get(token_id)
    }

    /// When the token stops working (milliseconds since the Unix epoch),
    /// if it was made with an expiry.
    pub fn token_expiry(&self, token_id: &str) -> Option<u64> {
        self.ends.token_expiries.get(token_id).copied()
    }

    /// Whether `identity` is on the deny list.
    pub fn denied(&self, identity: &str) -> bool {
        self.ends.denied.contains(identity)
    }

    /// The deny list, in order.
    pub fn denied_identities(&self) -> impl Iterator<Item = &str> {
        self.ends.denied.iter().map(String::as_str)
    }

    /// Expiries and the deny list, for the table image.
    pub fn ends(&self) -> &CredentialEnds {
        &self.ends
    }

    /// Rules decoded from a table image, with the expiries and deny list
    /// recorded after them.
    pub fn with_ends(mut self, ends: CredentialEnds) -> Self {
        self.ends = ends;
        self
    }

    pub fn roles(&self) -> impl Iterator<Item = (&str, &[Grant])> {
        self.roles
            .iter()
            .map(|(name, grants)| (name.as_str(), grants.as_slice()))
    }

    pub fn identities(&self) -> impl Iterator<Item = (&str, &BTreeSet<String>)> {
        self.identities
            .iter()
            .map(|(name, roles)| (name.as_str(), roles))
    }

    pub fn tokens(&self) -> impl Iterator<Item = (&str, &AccessToken)> {
        self.tokens.iter().map(|(id, token)| (id.as_str(), token))
    }

    /// Applies a change, or refuses it leaving everything as it was.
    pub fn apply(&mut self, command: &AclCommand) -> Result<(), AclError> {
        if !self.enabled && !matches!(command, AclCommand::Bootstrap { .. }) {
            return Err(AclError::NotBootstrapped);
        }
        match command {
            AclCommand::Bootstrap { token_id, hash } => {
                if self.enabled {
                    return Err(AclError::AlreadyBootstrapped);
                }
                check_name("token id", token_id)?;
                let all = Permission::ALL.map(|p| Grant::new(p, "")).to_vec();
                self.enabled = true;
                self.roles.insert(ROOT_ROLE.to_owned(), all);
                self.identities.insert(
                    ROOT_IDENTITY.to_owned(),
                    BTreeSet::from([ROOT_ROLE.to_owned()]),
                );
                self.tokens.insert(
                    token_id.clone(),
                    AccessToken {
                        identity: ROOT_IDENTITY.to_owned(),
                        hash: *hash,
                    },
                );
            }
            AclCommand::PutRole { name, grants } => {
                check_name("role name", name)?;
                if name == ROOT_ROLE {
                    return Err(AclError::BuiltInRole(name.clone()));
                }
                check_count("the number of grants", grants.len(), MAX_GRANTS_PER_ROLE)?;
                for grant in grants {
                    if grant.permission == Permission::Admin && !grant.prefix.is_empty() {
                        return Err(AclError::AdminWithPrefix(grant.to_string()));
                    }
                    if grant.prefix.len() > MAX_PREFIX_BYTES {
                        return Err(AclError::InvalidName {
                            what: "prefix".into(),
                            name: grant.prefix.chars().take(32).collect(),
                            reason: format!("longer than {MAX_PREFIX_BYTES} bytes"),
                        });
                    }
                }
                if !self.roles.contains_key(name) {
                    check_count("the number of roles", self.roles.len() + 1, MAX_ROLES)?;
                }
                let mut grants = grants.clone();
                grants.sort();
                grants.dedup();
                self.roles.insert(name.clone(), grants);
            }
            AclCommand::DeleteRole { name } => {
                if name == ROOT_ROLE {
                    return Err(AclError::BuiltInRole(name.clone()));
                }
                if self.roles.remove(name).is_none() {
                    return Err(AclError::UnknownRole(name.clone()));
                }
                for roles in self.identities.values_mut() {
                    roles.remove(name);
                }
            }
            AclCommand::GrantRole { identity, role } => {
                check_name("identity", identity)?;
                if !self.roles.contains_key(role) {
                    return Err(AclError::UnknownRole(role.clone()));
                }
                if !self.identities.contains_key(identity) {
                    let count = self.identities.len() + 1;
                    check_count("the number of identities", count, MAX_IDENTITIES)?;
                }
                self.identities
                    .entry(identity.clone())
                    .or_default()
                    .insert(role.clone());
            }
            AclCommand::RevokeRole { identity, role } => {
                if identity == ROOT_IDENTITY && role == ROOT_ROLE {
                    return Err(AclError::RootKeepsRoot(identity.clone()));
                }
                if !self.roles.contains_key(role) {
                    return Err(AclError::UnknownRole(role.clone()));
                }
                if let Some(roles) = self.identities.get_mut(identity) {
                    roles.remove(role);
                }
            }
            AclCommand::CreateToken {
                token_id,
                identity,
                hash,
            } => self.create_token(token_id, identity, hash)?,
            AclCommand::CreateExpiringToken {
                token_id,
                identity,
                hash,
                expires_unix_ms,
            } => {
                self.create_token(token_id, identity, hash)?;
                self.ends
                    .token_expiries
                    .insert(token_id.clone(), *expires_unix_ms);
            }
            AclCommand::RevokeToken { token_id } => {
                if self.tokens.remove(token_id).is_none() {
                    return Err(AclError::UnknownToken(token_id.clone()));
                }
                self.ends.token_expiries.remove(token_id);
            }
            AclCommand::DenyIdentity { identity } => {
                check_name("identity", identity)?;
                if identity == ROOT_IDENTITY {
                    return Err(AclError::RootCannotBeDenied(identity.clone()));
                }
                if !self.ends.denied.contains(identity) {
                    let count = self.ends.denied.len() + 1;
                    check_count("the number of denied identities", count, MAX_IDENTITIES)?;
                }
                self.ends.denied.insert(identity.clone());
            }
            AclCommand::AllowIdentity { identity } => {
                if !self.ends.denied.remove(identity) {
                    return Err(AclError::NotDenied(identity.clone()));
                }
            }
        }
        Ok(())
    }

    /// Adds a token, or refuses it leaving everything as it was.
    fn create_token(
        &mut self,
        token_id: &str,
        identity: &str,
        hash: &SecretHash,
    ) -> Result<(), AclError> {
        check_name("token id", token_id)?;
        check_name("identity", identity)?;
        if self.tokens.contains_key(token_id) {
            return Err(AclError::TokenExists(token_id.to_owned()));
        }
        check_count("the number of tokens", self.tokens.len() + 1, MAX_TOKENS)?;
        self.tokens.insert(
            token_id.to_owned(),
            AccessToken {
                identity: identity.to_owned(),
                hash: *hash,
            },
        );
        Ok(())
    }
}

/// Names are printable ASCII without spaces or the `:` that separates a
/// grant's permission from its prefix: they show up in logs, the audit
/// trail and the CLI's columns, and a certificate's common name is one.
fn check_name(what: &'static str, name: &str) -> Result<(), AclError> {
    let invalid = |reason: String| AclError::InvalidName {
        what: what.into(),
        name: name.chars().take(32).collect(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("empty".into()));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(invalid(format!("longer than {MAX_NAME_BYTES} bytes")));
    }
    if let Some(bad) = name.chars().find(|c| !c.is_ascii_graphic() || *c == ':') {
        return Err(invalid(format!(
            "{bad:?} is not allowed (printable ASCII without spaces or ':')"
        )));
    }
    Ok(())
}

fn check_count(what: &'static str, count: usize, limit: usize) -> Result<(), AclError> {
    if count > limit {
        return Err(AclError::TooMany {
            what: what.into(),
            count,
            limit,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bootstrapped() -> AccessControl {
        let mut acl = AccessControl::default();
        acl.apply(&AclCommand::Bootstrap {
            token_id: "t0".into(),
            hash: SecretHash([1; 32]),
        })
        .unwrap();
        acl
    }

    #[test]
    fn off_allows_everything_and_refuses_changes_before_bootstrap() {
        let mut acl = AccessControl::default();
        assert!(acl.allows(None, Permission::Admin, ""));
        let put = AclCommand::PutRole {
            name: "r".into(),
            grants: vec![],
        };
        assert_eq!(acl.apply(&put), Err(AclError::NotBootstrapped));
        assert_eq!(acl, AccessControl::default());
    }

    #[test]
    fn on_denies_by_default_and_allows_only_what_a_prefix_covers() {
        let mut acl = bootstrapped();
        assert!(!acl.allows(None, Permission::Read, "a"));
        assert!(!acl.allows(Some("ci"), Permission::Lock, "jobs/x"));
        assert!(acl.allows(Some(ROOT_IDENTITY), Permission::Admin, ""));
        acl.apply(&AclCommand::PutRole {
            name: "jobs".into(),
            grants: vec![
                Grant::parse("lock:jobs/").unwrap(),
                Grant::parse("read").unwrap(),
            ],
        })
        .unwrap();
        acl.apply(&AclCommand::GrantRole {
            identity: "ci".into(),
            role: "jobs".into(),
        })
        .unwrap();
        assert!(acl.allows(Some("ci"), Permission::Lock, "jobs/x"));
        assert!(!acl.allows(Some("ci"), Permission::Lock, "job"));
        assert!(!acl.allows(Some("ci"), Permission::Lock, "other/jobs/x"));
        assert!(acl.allows(Some("ci"), Permission::Read, "anything"));
        assert!(!acl.allows(Some("ci"), Permission::StoreWrite, "jobs/x"));
        assert!(!acl.allows(Some("ci"), Permission::Admin, ""));
        assert!(acl.allows_some(Some("ci"), Permission::Lock));
        assert!(!acl.allows_some(Some("ci"), Permission::StoreRead));
        acl.apply(&AclCommand::DeleteRole {
            name: "jobs".into(),
        })
        .unwrap();
        assert!(!acl.allows(Some("ci"), Permission::Lock, "jobs/x"));
    }

    #[test]
    fn bootstrap_works_once_and_root_cannot_be_locked_out() {
        let mut acl = bootstrapped();
        let before = acl.clone();
        let again = AclCommand::Bootstrap {
            token_id: "t1".into(),
            hash: SecretHash([2; 32]),
        };
        assert_eq!(acl.apply(&again), Err(AclError::AlreadyBootstrapped));
        let revoke = AclCommand::RevokeRole {
            identity: ROOT_IDENTITY.into(),
            role: ROOT_ROLE.into(),
        };
        assert!(matches!(
            acl.apply(&revoke),
            Err(AclError::RootKeepsRoot(_))
        ));
        let delete = AclCommand::DeleteRole {
            name: ROOT_ROLE.into(),
        };
        assert!(matches!(acl.apply(&delete), Err(AclError::BuiltInRole(_))));
        assert_eq!(acl, before);
    }

    #[test]
    fn tokens_are_unique_and_revocable() {
        let mut acl = bootstrapped();
        let create = AclCommand::CreateToken {
            token_id: "t1".into(),
            identity: "ci".into(),
            hash: SecretHash([3; 32]),
        };
        acl.apply(&create).unwrap();
        assert_eq!(acl.token("t1").unwrap().identity, "ci");
        assert!(matches!(acl.apply(&create), Err(AclError::TokenExists(_))));
        let revoke = AclCommand::RevokeToken {
            token_id: "t1".into(),
        };
        acl.apply(&revoke).unwrap();
        assert!(acl.token("t1").is_none());
        assert!(matches!(acl.apply(&revoke), Err(AclError::UnknownToken(_))));
    }

    #[test]
    fn bad_names_and_grants_are_refused() {
        let mut acl = bootstrapped();
        for name in ["", "has space", "a:b", &"x".repeat(MAX_NAME_BYTES + 1)] {
            let put = AclCommand::PutRole {
                name: name.into(),
                grants: vec![],
            };
            assert!(
                matches!(acl.apply(&put), Err(AclError::InvalidName { .. })),
                "{name:?}"
            );
        }
        let admin_prefix = AclCommand::PutRole {
            name: "r".into(),
            grants: vec![Grant::new(Permission::Admin, "x")],
        };
        assert!(matches!(
            acl.apply(&admin_prefix),
            Err(AclError::AdminWithPrefix(_))
        ));
        let many = AclCommand::PutRole {
            name: "r".into(),
            grants: (0..=MAX_GRANTS_PER_ROLE)
                .map(|i| Grant::new(Permission::Lock, i.to_string()))
                .collect(),
        };
        assert!(matches!(acl.apply(&many), Err(AclError::TooMany { .. })));
        assert!(Grant::parse("write:x").unwrap_err().contains("store-write"));
        assert_eq!(
            Grant::parse("store-read:k/").unwrap().to_string(),
            "store-read:k/"
        );
    }
}
