//! Who may speak Raft to this node: the gate in front of the peer service.
//!
//! Why a gate of its own: the `RaftPeer` service's messages can rewrite the
//! replicated state (a vote or an append from a made-up leader at a higher
//! term, an installed snapshot with other access-control rules), so it must
//! never be more open than the client API it sits beside. It was: without
//! TLS it let every connection through, access control or not.
//!
//! The gate runs as a tonic interceptor, on the request's headers and the
//! connection's identity, before the body is read or anything decoded:
//! - A node with no peers (a single node, never part of a cluster, or one
//!   whose others were all removed) serves no peer calls at all. It needs
//!   none: it starts taking them once a member is added (the leader sends,
//!   the new node answers; the new node calls only once it is a voter).
//! - Over TLS, peers authenticate with node certificates from the cluster's
//!   CA (and `--peer-names`), as before.
//! - Without TLS, with the cluster secret ([`PeerSecrets`]): a file that
//!   only the nodes hold, sent in a header on every peer call and compared
//!   in constant time. Chosen over a separate peer listener because it
//!   needs no second port in every firewall rule, proxy and load-balancer
//!   config, works the same through the test proxies and the nemesis, and
//!   rotates without downtime (a file of several secrets, as Consul's
//!   gossip keyring). It protects against everyone who cannot read the
//!   file: other local users of the host, and anything that can only reach
//!   the port. It does not protect against someone who can watch the
//!   traffic (a plain-text network), which only TLS does.
//!
//! A refusal is `permission_denied`, counted in
//! `deadbolt_peer_calls_refused_total{reason}`, and logged with the remote
//! address (at most one line a second, so a flood cannot fill the disk).

use crate::metrics::{Metrics, Refusal};
use crate::raft_types::Raft;
use crate::secret;
use crate::tls::{NodeTls, TlsClient};
use deadbolt_core::SecretHash;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tonic::metadata::MetadataValue;

/// The header that marks a call a node forwarded (`forward.rs`): the
/// forwarding node's id. Only a peer may send it.
pub const FORWARDED_BY: &str = "deadbolt-forwarded-by";

/// The header a node sends its cluster secret in, on plain-text peer calls.
pub const SECRET_HEADER: &str = "deadbolt-peer-secret";
/// Secrets in one file: the one in use, and those being rotated in or out.
const MAX_SECRETS: usize = 8;
/// Shortest secret accepted: 128 bits as hex digits, what
/// `deadbolt peer-secret` draws.
const MIN_SECRET_CHARS: usize = 32;
/// Longest secret accepted; a header longer than this is refused unread.
const MAX_SECRET_CHARS: usize = 256;

/// The cluster secret file (`--peer-secret-file`): one secret a line, the
/// first sent on every call, every one accepted. Blank lines and lines
/// starting with `#` are skipped. Reloaded on SIGHUP.
pub struct PeerSecrets {
    path: PathBuf,
    ring: RwLock<Ring>,
}

struct Ring {
    /// The first secret, ready to send.
    sending: MetadataValue<tonic::metadata::Ascii>,
    /// Every secret's hash: a presented one is hashed and compared with
    /// each in constant time, so neither its length nor where it differs
    /// shows in how long a refusal takes.
    accepted: Vec<SecretHash>,
}

impl PeerSecrets {
    /// Reads the file; the error says what is wrong with it and how to
    /// make a good one.
    pub fn load(path: &Path) -> Result<PeerSecrets, String> {
        Ok(PeerSecrets {
            path: path.to_owned(),
            ring: RwLock::new(read_ring(path)?),
        })
    }

    /// Re-reads the file; on any error the secrets in use stay.
    pub fn reload(&self) -> Result<(), String> {
        let ring = read_ring(&self.path)?;
        *self.ring.write().expect("peer secrets lock poisoned") = ring;
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The header value this node sends.
    pub fn sending(&self) -> MetadataValue<tonic::metadata::Ascii> {
        self.ring
            .read()
            .expect("peer secrets lock poisoned")
            .sending
            .clone()
    }

    /// Whether `presented` is one of the secrets.
    fn accepts(&self, presented: &str) -> bool {
        let ring = self.ring.read().expect("peer secrets lock poisoned");
        // Every secret compared, not the first match: the time taken does
        // not tell which one matched.
        ring.accepted.iter().fold(false, |found, hash| {
            secret::matches(presented, hash) | found
        })
    }
}

fn read_ring(path: &Path) -> Result<Ring, String> {
    let shown = path.display();
    let make = "`deadbolt peer-secret new FILE` makes one (copy the same file to every node)";
    let metadata = std::fs::metadata(path)
        .map_err(|err| format!("cannot read the peer secret file {shown}: {err}; {make}"))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "the peer secret file {shown} is readable by others (mode {mode:03o}): anyone who \
                 reads it can speak Raft to this cluster; `chmod 600 {shown}`"
            ));
        }
    }
    let text = std::fs::read_to_string(path)
        .map_err(|err| format!("cannot read the peer secret file {shown}: {err}; {make}"))?;
    let secrets: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect();
    if secrets.is_empty() {
        return Err(format!(
            "the peer secret file {shown} holds no secret; {make}"
        ));
    }
    if secrets.len() > MAX_SECRETS {
        return Err(format!(
            "the peer secret file {shown} holds {} secrets, more than {MAX_SECRETS}: keep the one \
             in use and the ones being rotated",
            secrets.len()
        ));
    }
    for (line, secret) in secrets.iter().enumerate() {
        let fine = (MIN_SECRET_CHARS..=MAX_SECRET_CHARS).contains(&secret.len())
            && secret.bytes().all(|byte| byte.is_ascii_graphic());
        if !fine {
            return Err(format!(
                "secret {} of the peer secret file {shown} is not {MIN_SECRET_CHARS} to \
                 {MAX_SECRET_CHARS} printable characters without spaces; {make}",
                line + 1
            ));
        }
    }
    Ok(Ring {
        sending: secrets[0]
            .parse()
            .expect("printable ASCII is a valid header value"),
        accepted: secrets.iter().map(|secret| secret::hash(secret)).collect(),
    })
}

/// The connection's remote address, put into the extensions of every peer
/// call (and every call a node forwards) by the listener, for the log
/// lines of refusals.
#[derive(Debug, Clone, Copy)]
pub struct RemoteAddr(pub SocketAddr);

impl RemoteAddr {
    /// Adds this address to `request` if it is a peer call. Only those: an
    /// extension costs every request an allocation, and the lock path
    /// stays lean.
    pub fn mark_peer_call<B>(self, request: &mut axum::http::Request<B>) {
        if request.uri().path().starts_with(PEER_SERVICE_PATH)
            || request.headers().contains_key(FORWARDED_BY)
        {
            request.extensions_mut().insert(self);
        }
    }
}

/// The path prefix of the peer service's calls.
const PEER_SERVICE_PATH: &str = "/deadbolt.v1.RaftPeer/";

/// How this node's peers authenticate, as `cluster status` and the
/// dashboard show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerAuthentication {
    /// Node certificates from the cluster's CA.
    MutualTls,
    /// Plain text, with the secret file every node holds.
    ClusterSecret,
    /// A node embedded in another program (the simulation), which hands
    /// its peers' messages to its Raft itself: no peer service to guard.
    InProcess,
    /// No way for a peer to authenticate (TLS without a client CA, or plain
    /// text without a secret): the node serves no peer calls and takes no
    /// members in.
    Unavailable,
}

impl PeerAuthentication {
    pub fn of(tls: Option<&NodeTls>, secrets: Option<&PeerSecrets>) -> Self {
        match (tls, secrets) {
            (Some(tls), _) if tls.mutual() => PeerAuthentication::MutualTls,
            (Some(_), _) | (None, None) => PeerAuthentication::Unavailable,
            (None, Some(_)) => PeerAuthentication::ClusterSecret,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PeerAuthentication::MutualTls => "mutual-tls",
            PeerAuthentication::ClusterSecret => "cluster-secret",
            PeerAuthentication::InProcess => "in-process",
            PeerAuthentication::Unavailable => "none",
        }
    }
}

/// Whether a node has peers to serve: a member besides itself, or no
/// membership yet (a node forming a cluster or waiting to be added).
/// Counted as "anyone but me", not "more than one": a node being added
/// first learns the membership from a snapshot taken before it was listed,
/// which names only the leader (a CI run: the restored node's new member
/// refused every append after the first).
pub fn has_peers(raft: &Raft) -> bool {
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    let me = metrics.id;
    let mut members = metrics.membership_config.nodes().map(|(id, _)| *id);
    let first = members.next();
    first.is_none() || first != Some(me) || members.next().is_some()
}

/// The interceptor in front of `RaftPeer`.
#[derive(Clone)]
pub struct PeerGate {
    raft: Raft,
    tls: Option<Arc<NodeTls>>,
    secrets: Option<Arc<PeerSecrets>>,
    metrics: Arc<Metrics>,
    /// When the last refusal was logged (ms since `started`), for the
    /// one-line-a-second limit.
    last_logged_ms: Arc<AtomicU64>,
    started: Instant,
}

/// At most one refusal logged in this long; the metric counts them all.
const LOG_EVERY: Duration = Duration::from_secs(1);

impl PeerGate {
    pub fn new(
        raft: Raft,
        tls: Option<Arc<NodeTls>>,
        secrets: Option<Arc<PeerSecrets>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        PeerGate {
            raft,
            tls,
            secrets,
            metrics,
            last_logged_ms: Arc::new(AtomicU64::new(u64::MAX)),
            started: Instant::now(),
        }
    }

    /// Whether a call that showed `client` (over TLS) or presented
    /// `secret` (without) comes from one of the cluster's nodes. A refusal
    /// is counted and logged (with `remote`), and says why.
    pub fn admit(
        &self,
        client: Option<&TlsClient>,
        secret: Option<&str>,
        remote: Option<RemoteAddr>,
    ) -> Result<(), String> {
        self.check(client, secret)
            .map_err(|(refusal, why)| self.refused(remote, refusal, why))
    }

    fn check(
        &self,
        client: Option<&TlsClient>,
        secret: Option<&str>,
    ) -> Result<(), (Refusal, String)> {
        if !has_peers(&self.raft) {
            return Err((
                Refusal::NoPeers,
                "this node is a cluster of one and serves no peers; it takes Raft messages only \
                 from members added with `deadbolt cluster add`"
                    .to_owned(),
            ));
        }
        if let Some(client) = client {
            return self.check_certificate(client);
        }
        let Some(secrets) = &self.secrets else {
            return Err((
                Refusal::NoSecret,
                "this node speaks Raft without TLS only with the cluster secret, and was given \
                 none (--peer-secret-file)"
                    .to_owned(),
            ));
        };
        match secret.filter(|secret| secret.len() <= MAX_SECRET_CHARS) {
            Some(presented) if secrets.accepts(presented) => Ok(()),
            Some(_) => Err((
                Refusal::BadSecret,
                "wrong cluster secret: only the cluster's nodes may speak Raft here, and they \
                 share the file given with --peer-secret-file"
                    .to_owned(),
            )),
            None => Err((
                Refusal::BadSecret,
                "only the cluster's nodes may speak Raft here, and this call carries no cluster \
                 secret"
                    .to_owned(),
            )),
        }
    }

    fn check_certificate(&self, client: &TlsClient) -> Result<(), (Refusal, String)> {
        let allowed = self
            .tls
            .as_ref()
            .is_some_and(|tls| tls.mutual() && tls.peer_allowed(client.name.as_deref()));
        let name = client.name.as_deref().unwrap_or("none");
        match client {
            TlsClient { node: true, .. } if allowed => Ok(()),
            TlsClient { node: true, .. } => Err((
                Refusal::NotANode,
                format!(
                    "this node's --peer-names does not list the node certificate's name ({name})"
                ),
            )),
            TlsClient { .. } => Err((
                Refusal::NotANode,
                format!(
                    "only the cluster's nodes may speak Raft here, and this connection's \
                     certificate ({name}) is not a node certificate (one valid for server \
                     authentication, as `deadbolt certs node` makes)"
                ),
            )),
        }
    }

    fn refused(&self, remote: Option<RemoteAddr>, refusal: Refusal, why: String) -> String {
        self.metrics.peer_call_refused(refusal);
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_logged_ms.load(Ordering::Relaxed);
        let due = last == u64::MAX || now.saturating_sub(last) >= LOG_EVERY.as_millis() as u64;
        if due
            && self
                .last_logged_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let remote = remote.map(|remote| remote.0.to_string());
            tracing::warn!(
                remote = remote.as_deref().unwrap_or("unknown"),
                reason = refusal.as_str(),
                "refused a Raft peer call: {why} (at most one such line a second; \
                 deadbolt_peer_calls_refused_total counts them all)"
            );
        }
        why
    }
}

impl tonic::service::Interceptor for PeerGate {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let secret = request
            .metadata()
            .get(SECRET_HEADER)
            .and_then(|value| value.to_str().ok());
        self.admit(
            request.extensions().get::<TlsClient>(),
            secret,
            request.extensions().get::<RemoteAddr>().copied(),
        )
        .map_err(tonic::Status::permission_denied)?;
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    fn file(text: &str, mode: u32) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        file
    }

    const A: &str = "0123456789abcdef0123456789abcdef";
    const B: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn the_first_secret_is_sent_and_every_one_accepted() {
        let secrets =
            PeerSecrets::load(file(&format!("# rotating\n{A}\n\n{B}\n"), 0o600).path()).unwrap();
        assert_eq!(secrets.sending().to_str().unwrap(), A);
        assert!(secrets.accepts(A));
        assert!(secrets.accepts(B));
        assert!(!secrets.accepts(&A[1..]));
        assert!(!secrets.accepts(&format!("{A}0")));
        assert!(!secrets.accepts(""));
    }

    #[test]
    fn a_file_others_can_read_is_refused_with_the_fix() {
        let loose = file(A, 0o644);
        let err = PeerSecrets::load(loose.path()).err().unwrap();
        assert!(
            err.contains("mode 644") && err.contains("chmod 600"),
            "{err}"
        );
    }

    #[test]
    fn short_empty_or_too_many_secrets_are_refused() {
        for (text, expected) in [
            ("", "holds no secret"),
            ("# only a comment\n", "holds no secret"),
            ("short", "secret 1"),
            (
                &format!("{A}\nhas a space in it 0123456789abcdef"),
                "secret 2",
            ),
            (&format!("{A}\n").repeat(MAX_SECRETS + 1), "more than 8"),
        ] {
            let err = PeerSecrets::load(file(text, 0o600).path()).err().unwrap();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_reload_that_fails_keeps_the_secrets_in_use() {
        let path = file(A, 0o600);
        let secrets = PeerSecrets::load(path.path()).unwrap();
        std::fs::write(path.path(), "short").unwrap();
        assert!(secrets.reload().is_err());
        assert!(secrets.accepts(A));
        std::fs::write(path.path(), format!("{B}\n{A}")).unwrap();
        secrets.reload().unwrap();
        assert_eq!(secrets.sending().to_str().unwrap(), B);
        assert!(secrets.accepts(A));
    }
}
