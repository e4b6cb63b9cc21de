//! Redis locks: the seeds' `SET key owner NX PX ttl` on one server, and
//! Redlock over several independent masters (the rules in `redlock.rs`).
//! Both are the same three scripts run on every node:
//!
//! - acquire: `SET lock owner NX PX ttl` (as a script), with a random 128-bit owner per
//!   grant, so that nobody ever deletes or extends a lock that became
//!   someone else's after its own expired; on one server, optionally
//!   `INCR` of a companion counter in the same script, so every grant gets
//!   the next number;
//! - renew (the watchdog, every TTL/3): compare-and-`PEXPIRE`;
//! - release: compare-and-`DEL`.
//!
//! The counter is *not* a fencing token in the seeds' sense, and the type
//! says so ([`Token::Counter`]): Redis replicates asynchronously and, without
//! `appendfsync always`, forgets recent writes on a restart, so a failover
//! or a restart can hand out a number again, or the lock twice. It still
//! orders grants while the server keeps its memory, which catches the
//! common case (a paused client) as a resource check.
//!
//! Keys: `deadbolt:lock:{NAME}` and `deadbolt:fence:{NAME}`; the braces are
//! a Redis Cluster hash tag, so both land in one slot and one script may
//! touch both.

use crate::lease::{watchdog, Lease, Renewal};
use crate::redlock::Rules;
use crate::target::RedisNode;
use crate::{Error, ErrorKind, Lost, Token};
use futures::future::join_all;
use rand::Rng;
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, RedisConnectionInfo, Script,
    TlsCertificates,
};
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// `SET NX PX` as a script, so that it can also count, and so that a repeat
/// by the same owner (an attempt resent after its connection broke) is a
/// grant again rather than a refusal that would leave our own key behind.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif owner then return false
else redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
if ARGV[3] == '1' then return redis.call('INCR', KEYS[2]) end
return 0",
    )
});

static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0",
    )
});

static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0",
    )
});

/// How long opening a connection to one server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One server, connected lazily and again after the connection broke (a
/// restarted server), so that a Redlock session survives a master that is
/// down when it opens or restarts later.
struct Node {
    url: String,
    client: redis::Client,
    connection: Mutex<Option<MultiplexedConnection>>,
    timeout: Duration,
}

/// Not derived: `redis::Client`'s `Debug` shows the password.
impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// The connection, and whether it was opened before this call (it may
    /// have broken since, say by a server restart).
    async fn connection(&self) -> Result<(MultiplexedConnection, bool), Error> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = &*slot {
            return Ok((connection.clone(), true));
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(CONNECT_TIMEOUT.min(self.timeout * 10))
            .set_response_timeout(self.timeout);
        let connection = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|err| failure(&self.url, &err))?;
        *slot = Some(connection.clone());
        Ok((connection, false))
    }

    /// Runs one script. A broken connection is dropped so the next call
    /// reconnects; if it was an old one and the script is safe to repeat
    /// (`Repeat::Once`), it is sent once more on a new connection.
    async fn run(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
        repeat: Repeat,
    ) -> Result<Option<i64>, Error> {
        let (mut connection, reused) = self.connection().await?;
        match self.invoke(&mut connection, script, keys, args).await {
            Err(Broken(_)) if reused && repeat == Repeat::Once => {
                let (mut connection, _) = self.connection().await?;
                self.invoke(&mut connection, script, keys, args)
                    .await
                    .map_err(|Broken(error)| error)
            }
            answer => answer.map_err(|Broken(error)| error),
        }
    }

    async fn invoke(
        &self,
        connection: &mut MultiplexedConnection,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Option<i64>, Broken> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        let answer = tokio::time::timeout(self.timeout, invocation.invoke_async(connection)).await;
        match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => {
                if err.is_unrecoverable_error() || err.is_io_error() || err.is_timeout() {
                    *self.connection.lock().await = None;
                }
                Err(Broken(failure(&self.url, &err)))
            }
            Err(_) => Err(Broken(Error::unavailable(
                &self.url,
                format!("no answer within {:?}", self.timeout),
            ))),
        }
    }
}

/// A script that failed on its connection.
struct Broken(Error);

/// Whether a script may be sent again after its connection broke: acquire
/// and renew may (repeating them by the same owner changes nothing more);
/// release may not (a repeat would find the key gone and report the lock
/// lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repeat {
    Once,
    Never,
}

/// Where the lock lives and how grants are decided. Connects nothing.
#[derive(Clone)]
pub(crate) struct Locker {
    /// Each server: its name for messages (no password) and its client.
    nodes: Vec<(String, redis::Client)>,
    rules: Rules,
    fence: bool,
}

/// Not derived: `redis::Client`'s `Debug` shows the password.
impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.nodes.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("Locker")
            .field("nodes", &names)
            .field("rules", &self.rules)
            .field("fence", &self.fence)
            .finish()
    }
}

impl Locker {
    pub(crate) fn single(node: RedisNode, fence: bool) -> Result<Locker, Error> {
        Ok(Locker {
            nodes: vec![client(&node)?],
            rules: Rules::SINGLE,
            fence,
        })
    }

    pub(crate) fn redlock(nodes: Vec<RedisNode>) -> Result<Locker, Error> {
        Ok(Locker {
            rules: Rules::redlock(nodes.len()),
            nodes: nodes.iter().map(client).collect::<Result<_, _>>()?,
            fence: false,
        })
    }

    /// A session: its own connections (one per server, as one process
    /// would hold), opened on first use.
    pub(crate) fn open_session(&self, ttl: Duration) -> Result<Session, Error> {
        let timeout = self.rules.node_timeout(ttl);
        let nodes = self
            .nodes
            .iter()
            .map(|(url, client)| Node {
                url: url.clone(),
                client: client.clone(),
                connection: Mutex::new(None),
                timeout,
            })
            .collect();
        Ok(Session {
            shared: Arc::new(Shared {
                nodes,
                rules: self.rules,
                fence: self.fence,
                ttl,
            }),
        })
    }
}

/// The client of one server: its address, database and credentials, and
/// for TLS the CA file read now, so that a missing or empty one is refused
/// before anything connects.
fn client(node: &RedisNode) -> Result<(String, redis::Client), Error> {
    let name = node.to_string();
    let addr = match &node.tls {
        None => ConnectionAddr::Tcp(node.host.clone(), node.port),
        Some(_) => ConnectionAddr::TcpTls {
            host: node.host.clone(),
            port: node.port,
            insecure: false,
            tls_params: None,
        },
    };
    let info = ConnectionInfo {
        addr,
        redis: RedisConnectionInfo {
            db: node.db.into(),
            username: node.username.clone(),
            password: node
                .password
                .as_ref()
                .map(|secret| secret.expose().to_owned()),
            ..Default::default()
        },
    };
    let client = match node.tls.as_ref().and_then(|tls| tls.ca.as_ref()) {
        None => redis::Client::open(info),
        Some(ca) => {
            let pem = std::fs::read(ca).map_err(|err| {
                Error::invalid(format!(
                    "lock URL {name}: cannot read the CA file {} (?ca=): {err}",
                    ca.display()
                ))
            })?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                return Err(Error::invalid(format!(
                    "lock URL {name}: the CA file {} (?ca=) holds no PEM certificate",
                    ca.display()
                )));
            }
            redis::Client::build_with_tls(
                info,
                TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                },
            )
        }
    }
    .map_err(|err| Error::invalid(format!("lock URL {name}: {err}")))?;
    Ok((name, client))
}

/// The error of a failed command or connection: `Refused` (no retry: it
/// will not get better by waiting) when the server refused our credentials
/// or the TLS handshake failed on its certificate, `Unavailable` otherwise.
fn failure(server: &str, err: &redis::RedisError) -> Error {
    let auth = err.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(err.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"));
    if auth {
        return Error::new(
            ErrorKind::Refused,
            format!(
                "{server} refused to authenticate us ({err}); check the URL's USER:PASSWORD@ \
                 (:PASSWORD@ for requirepass)"
            ),
        );
    }
    let text = err.to_string();
    if text.contains("certificate") || text.contains("UnknownIssuer") {
        return Error::new(
            ErrorKind::Refused,
            format!(
                "{server}: the TLS handshake failed ({text}); give the CA that signed the \
                 server's certificate as ?ca=PATH"
            ),
        );
    }
    Error::unavailable(server, text)
}

#[derive(Debug)]
struct Shared {
    nodes: Vec<Node>,
    rules: Rules,
    fence: bool,
    ttl: Duration,
}

#[derive(Debug, Clone)]
pub(crate) struct Session {
    shared: Arc<Shared>,
}

/// One grant: the owner value that proves it, and its watchdog.
#[derive(Debug)]
pub(crate) struct Held {
    grant: Arc<Grant>,
    lease: Lease,
    watchdog: AbortHandle,
}

#[derive(Debug)]
struct Grant {
    shared: Arc<Shared>,
    key: String,
    owner: String,
}

impl Grant {
    /// Runs `script` on every server at once; each answer, in server order.
    async fn everywhere(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
        repeat: Repeat,
    ) -> Vec<Result<Option<i64>, Error>> {
        join_all(
            self.shared
                .nodes
                .iter()
                .map(|node| node.run(script, keys, args, repeat)),
        )
        .await
    }

    /// Compare-and-`DEL` on every server; how many still held it.
    async fn release_everywhere(&self) -> (usize, Option<Error>) {
        let answers = self
            .everywhere(&RELEASE, &[&self.key], &[&self.owner], Repeat::Never)
            .await;
        let deleted = answers
            .iter()
            .filter(|answer| matches!(answer, Ok(Some(1))))
            .count();
        (deleted, answers.into_iter().find_map(Result::err))
    }

    async fn renew(&self) -> Result<Renewal, Error> {
        let shared = &self.shared;
        let sent = Instant::now();
        let ttl_ms = millis(shared.ttl);
        let answers = self
            .everywhere(&RENEW, &[&self.key], &[&self.owner, &ttl_ms], Repeat::Once)
            .await;
        let renewed = answers
            .iter()
            .filter(|answer| matches!(answer, Ok(Some(1))))
            .count();
        let refused = answers
            .iter()
            .filter(|answer| matches!(answer, Ok(Some(0))))
            .count();
        if renewed >= shared.rules.needed {
            if let Some(validity) = shared.rules.validity(shared.ttl, sent.elapsed()) {
                return Ok(Renewal::Until(sent + validity));
            }
        }
        if shared.rules.hopeless(refused) {
            return Ok(Renewal::Gone(format!(
                "the key expired or has another owner on {refused} of {} servers",
                shared.nodes.len()
            )));
        }
        Err(answers
            .into_iter()
            .find_map(Result::err)
            .unwrap_or_else(|| {
                Error::unavailable("the Redis servers", "renewal ran out of validity")
            }))
    }
}

impl Session {
    /// One round of `SET NX PX` on every server. `None`: busy. A round that
    /// fell short of a majority (or of validity) is undone everywhere.
    pub(crate) async fn try_acquire(&self, name: &str) -> Result<Option<(Held, Token)>, Error> {
        let shared = &self.shared;
        let grant = Arc::new(Grant {
            shared: shared.clone(),
            key: format!("deadbolt:lock:{{{name}}}"),
            owner: format!("{:032x}", rand::thread_rng().gen::<u128>()),
        });
        let fence_key = format!("deadbolt:fence:{{{name}}}");
        let (ttl_ms, fence) = (millis(shared.ttl), if shared.fence { "1" } else { "0" });
        let sent = Instant::now();
        let answers = grant
            .everywhere(
                &ACQUIRE,
                &[&grant.key, &fence_key],
                &[&grant.owner, &ttl_ms, fence],
                Repeat::Once,
            )
            .await;
        let granted: Vec<i64> = answers
            .iter()
            .filter_map(|answer| answer.clone().ok().flatten())
            .collect();
        let refused = answers
            .iter()
            .filter(|answer| matches!(answer, Ok(None)))
            .count();
        let validity = shared.rules.validity(shared.ttl, sent.elapsed());
        if let (true, Some(validity)) = (granted.len() >= shared.rules.needed, validity) {
            let token = match (shared.fence, granted.as_slice()) {
                (true, [counter]) => Token::Counter(*counter as u64),
                _ => Token::None,
            };
            let lease = Lease::new(sent + validity);
            let watchdog = tokio::spawn(watchdog(lease.clone(), shared.ttl / 3, {
                let grant = grant.clone();
                move || {
                    let grant = grant.clone();
                    async move { grant.renew().await }
                }
            }))
            .abort_handle();
            return Ok(Some((
                Held {
                    grant,
                    lease,
                    watchdog,
                },
                token,
            )));
        }
        // Undo partial grants (including ones whose reply was lost).
        if refused < answers.len() {
            grant.release_everywhere().await;
        }
        if shared.rules.held_elsewhere(granted.len(), refused) {
            return Ok(None);
        }
        Err(answers
            .into_iter()
            .find_map(Result::err)
            .unwrap_or_else(|| {
                Error::unavailable("the Redis servers", "the grant took longer than its TTL")
            }))
    }
}

impl Held {
    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    pub(crate) async fn release(self, name: &str) -> Result<(), Error> {
        self.watchdog.abort();
        let was_lost = self.lease.is_lost();
        self.lease.end(Lost::Closed);
        let (deleted, error) = self.grant.release_everywhere().await;
        if deleted >= self.grant.shared.rules.needed {
            return Ok(());
        }
        match error {
            Some(error) if !was_lost => Err(error),
            _ => Err(Error::lost(
                name,
                format!(
                    "the key had expired or had another owner on {} of {} servers",
                    self.grant.shared.nodes.len() - deleted,
                    self.grant.shared.nodes.len()
                ),
            )),
        }
    }
}

fn millis(duration: Duration) -> String {
    duration.as_millis().max(1).to_string()
}
