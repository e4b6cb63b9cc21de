//! The lock services `deadbolt-nemesis run --backend` runs against, started
//! here as real processes so that the run can break them, and the faults
//! that matter to each (docs/backends.md, "The seeds' table, measured"):
//!
//! - Redis, one server (`redis`, `redis-counter`): kill -9 and restart,
//!   without persistence or with `--aof` (appendonly, appendfsync always);
//!   failover to a replica, promoted by a script (`REPLICAOF NO ONE`, as
//!   Sentinel would after noticing), the clients following through a TCP
//!   proxy repointed at the new primary (as a virtual IP or HAProxy would),
//!   optionally with the replica's link cut `--lag` before the primary dies;
//!   or, `--sentinel`, promoted by a Redis Sentinel (quorum 1, down after
//!   1 s), the proxy following the primary Sentinel names;
//! - Redlock (`redlock`, `--masters N`): a rolling restart, 2 masters of 5
//!   at a time (kill -9, restart right away or after one TTL:
//!   `restart-delayed`, the Redis docs' remedy), with or without `--aof`;
//! - etcd (`etcd`, 3 members): kill -9 of the leader, restarted after a
//!   while, and one TTL of calm once a leader is back;
//! - PostgreSQL (`postgres`): `scripts/postgres.sh`'s server; only the
//!   client pause applies (the holder hung with its socket open), with the
//!   backend's `idle_session_timeout` or, `--no-idle-timeout`, without;
//! - Deadbolt (`deadbolt`, through the adapter): a local cluster; only the
//!   client pause here (its own faults are `deadbolt-nemesis run` without
//!   `--backend`).
//!
//! The client pause (SIGSTOP of a worker holding a lock, for 1.5 to 3 TTLs)
//! applies to every backend and lives with the workers, in run.rs.

use deadbolt_testkit::peers::{self, Server};
use deadbolt_testkit::TestCluster;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Which lock service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// The Deadbolt server, through deadbolt-backends' adapter.
    Deadbolt,
    /// One Redis server, no token.
    Redis,
    /// One Redis server with `?fence=counter` (an INCR counter as token).
    RedisCounter,
    /// Redlock over `--masters` independent Redis masters.
    Redlock,
    /// etcd (3 members for leader-kill, else 1).
    Etcd,
    /// PostgreSQL advisory locks (`--postgres-url` or
    /// $DEADBOLT_TEST_POSTGRES_URL, as scripts/postgres.sh exports).
    Postgres,
}

/// Which fault the run injects, over and over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// SIGSTOP a worker that holds a lock for 1.5 to 3 TTLs (every backend).
    Pause,
    /// kill -9 and restart: the Redis server, or every Redlock master, a
    /// minority at a time.
    Restart,
    /// Redlock: the rolling restart, each minority kept down for one TTL.
    RestartDelayed,
    /// Redis: kill -9 the primary, promote its replica, clients follow.
    Failover,
    /// etcd: kill -9 the leader, restart it after 0.5 to 2 s.
    LeaderKill,
}

/// Everything a fault may need to know.
pub struct Options<'a> {
    pub kind: Kind,
    pub fault: Fault,
    pub aof: bool,
    pub masters: usize,
    pub lag: Duration,
    pub ttl: Duration,
    pub postgres_url: Option<String>,
    /// Redis failover by Sentinel rather than a scripted promotion.
    pub sentinel: bool,
    /// PostgreSQL without `idle_session_timeout` (unsafe: to measure it).
    pub no_idle_timeout: bool,
    pub deadbolt: &'a Path,
    pub dir: &'a Path,
}

/// The most Redlock masters a run starts (the URL's own limit is 15).
const MAX_MASTERS: usize = 9;
/// How many Redlock masters restart at once (a minority of 5; 1 of 3 or 4).
const RESTARTED_MASTERS: usize = 2;

/// The running service; dropping it stops every process it started.
pub enum Servers {
    /// Kept only to be stopped when dropped.
    Deadbolt(#[allow(dead_code)] TestCluster),
    Redis(Server),
    Failover {
        primary: Server,
        replica: Server,
        proxy: Proxy,
        /// Sentinel promotes (the proxy follows it); else a script does.
        sentinel: Option<Box<Server>>,
    },
    Redlock(Vec<Server>),
    Etcd(Vec<Server>),
    Postgres,
}

fn refuse(what: &str) -> anyhow::Error {
    anyhow::anyhow!("{what} is missing: install it (scripts/backends.sh, scripts/postgres.sh)")
}

impl Servers {
    /// Starts the service; returns it and the lock URL for the workers.
    pub async fn start(options: &Options<'_>) -> anyhow::Result<(Servers, String)> {
        use Fault::*;
        use Kind::*;
        let fits = match options.fault {
            Pause => true,
            Restart => matches!(options.kind, Redis | RedisCounter | Redlock),
            RestartDelayed => options.kind == Redlock,
            Failover => matches!(options.kind, Redis | RedisCounter),
            LeaderKill => options.kind == Etcd,
        };
        anyhow::ensure!(
            fits,
            "fault {:?} does not apply to backend {:?}: pause applies to all; restart to redis, \
             redis-counter and redlock; restart-delayed to redlock; failover to redis and \
             redis-counter; leader-kill to etcd",
            options.fault,
            options.kind
        );
        let persistence: &[&str] = if options.aof {
            &["--appendonly", "yes", "--appendfsync", "always"]
        } else {
            &[]
        };
        let query = if options.kind == RedisCounter {
            "?fence=counter"
        } else {
            ""
        };
        let started = match options.kind {
            Deadbolt => {
                anyhow::ensure!(
                    options.deadbolt.exists(),
                    "no deadbolt binary at {} (build it, or pass --deadbolt)",
                    options.deadbolt.display()
                );
                let cluster =
                    TestCluster::start(options.deadbolt, &options.dir.join("cluster"), 1).await;
                let hosts: Vec<String> = cluster
                    .endpoints()
                    .iter()
                    .map(|e| e.trim_start_matches("http://").to_owned())
                    .collect();
                let url = format!("http://{}", hosts.join(","));
                (Servers::Deadbolt(cluster), url)
            }
            Redis | RedisCounter if options.fault == Failover => {
                // A new replica syncs at once (Redis 7 waits 5 s by default
                // for more replicas to share the transfer).
                let args: Vec<&str> = [persistence, &["--repl-diskless-sync-delay", "0"]].concat();
                let primary = peers::redis_with(&args).ok_or_else(|| refuse("redis"))?;
                let replica = peers::redis_with(&args).ok_or_else(|| refuse("redis"))?;
                replicate(&replica, &primary).await?;
                let proxy = Proxy::start(primary_address(&primary)).await?;
                let sentinel = if options.sentinel {
                    anyhow::ensure!(
                        options.lag.is_zero(),
                        "--lag cuts the replica's link by hand, which Sentinel would repair: \
                         use it without --sentinel"
                    );
                    let sentinel = peers::redis_sentinel(primary.port)
                        .ok_or_else(|| refuse("redis-server (for Sentinel)"))?;
                    proxy.follow(sentinel.address());
                    Some(Box::new(sentinel))
                } else {
                    None
                };
                let url = format!("redis://{}{query}", proxy.address);
                (
                    Servers::Failover {
                        primary,
                        replica,
                        proxy,
                        sentinel,
                    },
                    url,
                )
            }
            Redis | RedisCounter => {
                let server = peers::redis_with(persistence).ok_or_else(|| refuse("redis"))?;
                let url = format!("redis://{}{query}", server.address());
                (Servers::Redis(server), url)
            }
            Redlock => {
                anyhow::ensure!(
                    (3..=MAX_MASTERS).contains(&options.masters),
                    "--masters {}: Redlock runs here take 3 to {MAX_MASTERS} masters",
                    options.masters
                );
                let masters = (0..options.masters)
                    .map(|_| peers::redis_with(persistence).ok_or_else(|| refuse("redis")))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let addresses: Vec<String> = masters.iter().map(Server::address).collect();
                let url = format!("redlock://{}", addresses.join(","));
                (Servers::Redlock(masters), url)
            }
            Etcd => {
                let size = if options.fault == LeaderKill { 3 } else { 1 };
                let members = peers::etcd_cluster(size).ok_or_else(|| refuse("etcd"))?;
                let addresses: Vec<String> = members.iter().map(Server::address).collect();
                let url = format!("etcd://{}", addresses.join(","));
                (Servers::Etcd(members), url)
            }
            Postgres => {
                let url = match &options.postgres_url {
                    Some(url) => url.clone(),
                    None => peers::postgres_url().ok_or_else(|| {
                        anyhow::anyhow!(
                            "no PostgreSQL: pass --postgres-url or run `eval \"$(scripts/postgres.sh)\"`"
                        )
                    })?,
                };
                let url = if options.no_idle_timeout {
                    let join = if url.contains('?') { '&' } else { '?' };
                    format!("{url}{join}idle_session_timeout=off")
                } else {
                    url
                };
                (Servers::Postgres, url)
            }
        };
        Ok(started)
    }

    /// Injects one fault of the service (not the client pause), waits its
    /// length and undoes it. Returns what it did.
    pub async fn inject(
        &mut self,
        options: &Options<'_>,
        rng: &mut StdRng,
    ) -> anyhow::Result<String> {
        match self {
            Servers::Redis(server) => {
                tokio::task::block_in_place(|| server.restart());
                Ok(format!("kill -9 redis-server, restarted{}", aof(options)))
            }
            Servers::Redlock(masters) => {
                // A rolling restart, a minority at a time: each pair is
                // killed, kept down (not at all, or one TTL), restarted,
                // and the next pair goes at once. A holder granted while a
                // pair was down holds only a bare majority, which the next
                // pair's restart can take from it.
                let mut order: Vec<usize> = (0..masters.len()).collect();
                order.shuffle(rng);
                let down = match options.fault {
                    Fault::RestartDelayed => options.ttl + Duration::from_millis(100),
                    _ => Duration::ZERO,
                };
                let at_once = RESTARTED_MASTERS.min((masters.len() - 1) / 2).max(1);
                for group in order.chunks(at_once) {
                    for &index in group {
                        masters[index].kill();
                    }
                    tokio::time::sleep(down).await;
                    for &index in group {
                        tokio::task::block_in_place(|| masters[index].restart());
                    }
                }
                Ok(format!(
                    "rolling restart of the {} Redlock masters, {at_once} at a time (kill -9, \
                     restarted after {down:?}), order {order:?}{}",
                    masters.len(),
                    aof(options)
                ))
            }
            Servers::Failover {
                primary,
                replica,
                sentinel: Some(sentinel),
                ..
            } => {
                // Sentinel notices (1 s without an answer), promotes the
                // replica, and the proxy follows what it names.
                let killed = std::time::Instant::now();
                primary.kill();
                let mut promoted = None;
                while killed.elapsed() < Duration::from_secs(15) {
                    if sentinel_master(&sentinel.address()).await.ok() == Some(replica.port) {
                        promoted = Some(killed.elapsed());
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let Some(promoted) = promoted else {
                    anyhow::bail!("Sentinel promoted no replica within 15 s of the primary's kill")
                };
                // Rejoined as the new primary's replica at once (Sentinel
                // would do it too, at its next look, up to 10 s later).
                tokio::task::block_in_place(|| primary.restart());
                replicate(primary, replica).await?;
                std::mem::swap(primary, replica);
                Ok(format!(
                    "kill -9 the Redis primary; Sentinel promoted the replica {promoted:.1?} later{}",
                    aof(options)
                ))
            }
            Servers::Failover {
                primary,
                replica,
                proxy,
                sentinel: None,
            } => {
                if !options.lag.is_zero() {
                    // Replication stops here (a port nobody listens on):
                    // what the primary does from now on, the replica misses.
                    let nowhere = deadbolt_testkit::free_port().to_string();
                    command(&replica.address(), &["REPLICAOF", "127.0.0.1", &nowhere]).await?;
                    tokio::time::sleep(options.lag).await;
                }
                primary.kill();
                command(&replica.address(), &["REPLICAOF", "NO", "ONE"]).await?;
                proxy.point(primary_address(replica));
                // The old primary comes back (empty without persistence) as
                // the new one's replica, ready for the next failover.
                tokio::task::block_in_place(|| primary.restart());
                replicate(primary, replica).await?;
                std::mem::swap(primary, replica);
                Ok(format!(
                    "kill -9 the Redis primary, replica promoted (REPLICAOF NO ONE){}{}",
                    if options.lag.is_zero() {
                        String::new()
                    } else {
                        format!(" after its link was cut for {:?}", options.lag)
                    },
                    aof(options)
                ))
            }
            Servers::Etcd(members) => {
                let mut leader = None;
                for (index, member) in members.iter().enumerate() {
                    if etcd_is_leader(&member.address()).await.unwrap_or(false) {
                        leader = Some(index);
                    }
                }
                let Some(leader) = leader else {
                    return Ok("no etcd leader to kill (an election is under way)".to_owned());
                };
                members[leader].kill();
                let down = Duration::from_millis(rng.gen_range(500..2000));
                tokio::time::sleep(down).await;
                tokio::task::block_in_place(|| members[leader].restart());
                // One fault at a time: the next leader must be elected and
                // the clients' leases renewed (one TTL) before another kill,
                // else the cluster spends the run electing.
                let restarted = std::time::Instant::now();
                let mut elected = None;
                while elected.is_none() && restarted.elapsed() < Duration::from_secs(10) {
                    for member in members.iter() {
                        if etcd_is_leader(&member.address()).await.unwrap_or(false) {
                            elected = Some(restarted.elapsed());
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                tokio::time::sleep(options.ttl).await;
                Ok(format!(
                    "kill -9 etcd leader (member {leader}), restarted after {down:?}; a leader \
                     {} then one TTL of calm",
                    match elected {
                        Some(after) => format!("{after:.1?} after the restart"),
                        None => "not seen within 10 s".to_owned(),
                    }
                ))
            }
            Servers::Deadbolt(_) | Servers::Postgres => {
                anyhow::bail!("no server fault for this backend (only pause)")
            }
        }
    }
}

fn aof(options: &Options<'_>) -> &'static str {
    if options.aof {
        " (appendonly, appendfsync always)"
    } else {
        " (no persistence)"
    }
}

fn primary_address(server: &Server) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], server.port))
}

/// Makes `replica` replicate `primary` and waits until it has synced.
async fn replicate(replica: &Server, primary: &Server) -> anyhow::Result<()> {
    let port = primary.port.to_string();
    command(&replica.address(), &["REPLICAOF", "127.0.0.1", &port]).await?;
    wait_synced(replica, Duration::from_secs(5)).await
}

/// Waits until `replica` has a live link to its primary.
async fn wait_synced(replica: &Server, within: Duration) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    while started.elapsed() < within {
        // A server still starting refuses commands for a moment.
        if let Ok(info) = command(&replica.address(), &["INFO", "replication"]).await {
            if info.contains("master_link_status:up") {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    anyhow::bail!(
        "the Redis replica on {} did not sync within {within:?}",
        replica.address()
    )
}

/// The port of the primary the Sentinel at `address` names now.
async fn sentinel_master(address: &str) -> anyhow::Result<u16> {
    let reply = command(
        address,
        &["SENTINEL", "get-master-addr-by-name", "deadbolt"],
    )
    .await?;
    let port = reply
        .lines()
        .rev()
        .find_map(|line| line.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("Sentinel names no primary: {reply:?}"))?;
    Ok(port)
}

/// One Redis command (RESP), its reply as text: a status, an error (as an
/// error) or a bulk string. Enough for REPLICAOF and INFO.
async fn command(address: &str, args: &[&str]) -> anyhow::Result<String> {
    let exchange = async {
        let mut stream = TcpStream::connect(address).await?;
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        stream.write_all(request.as_bytes()).await?;
        let mut reply = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let read = stream.read(&mut chunk).await?;
            anyhow::ensure!(read > 0, "redis-server on {address} closed the connection");
            reply.extend_from_slice(&chunk[..read]);
            anyhow::ensure!(reply.len() <= 1 << 20, "reply over 1 MiB from {address}");
            let text = String::from_utf8_lossy(&reply).into_owned();
            let Some((head, body)) = text.split_once("\r\n") else {
                continue;
            };
            match head.as_bytes().first() {
                Some(b'+') => return Ok(head[1..].to_owned()),
                Some(b'-') => anyhow::bail!("{address}: {} {args:?}", &head[1..]),
                Some(b'$') => {
                    let len: usize = head[1..].parse()?;
                    if body.len() >= len {
                        return Ok(body[..len].to_owned());
                    }
                }
                // An array of N bulk strings (Sentinel's answers): complete
                // with 2N more lines; returned as they are.
                Some(b'*') => {
                    let items: usize = head[1..].parse()?;
                    if body.matches("\r\n").count() >= 2 * items {
                        return Ok(body.to_owned());
                    }
                }
                _ => anyhow::bail!("{address}: unexpected reply {head:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| anyhow::anyhow!("redis-server on {address} did not answer {args:?} in 5s"))?
}

/// Whether the etcd member at `address` leads (its gRPC gateway's status).
async fn etcd_is_leader(address: &str) -> anyhow::Result<bool> {
    let address: SocketAddr = address.parse()?;
    let (status, body) = tokio::time::timeout(
        Duration::from_secs(2),
        crate::worker::http(address, "POST", "/v3/maintenance/status", None, "{}"),
    )
    .await??;
    anyhow::ensure!(status == 200, "etcd status: {status} {body}");
    let status: serde_json::Value = serde_json::from_str(&body)?;
    let member = &status["header"]["member_id"];
    Ok(!member.is_null() && *member == status["leader"])
}

/// A TCP proxy to whichever server is the primary: what clients of a
/// failed-over Redis reach through a virtual IP or HAProxy. Repointing it
/// cuts every open connection, so clients reconnect to the new primary.
pub struct Proxy {
    pub address: SocketAddr,
    target: std::sync::Arc<tokio::sync::watch::Sender<SocketAddr>>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let (sender, receiver) = tokio::sync::watch::channel(target);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut receiver = receiver.clone();
                tokio::spawn(async move {
                    let target = *receiver.borrow_and_update();
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = receiver.changed() => {}
                    }
                });
            }
        });
        Ok(Proxy {
            address,
            target: std::sync::Arc::new(sender),
        })
    }

    /// Points at `target`; cuts the open connections if that is a change.
    fn point(&self, target: SocketAddr) {
        point(&self.target, target);
    }

    /// Follows the primary the Sentinel at `sentinel` names (asked every
    /// 20 ms, as a client library's Sentinel support would), until the
    /// proxy is dropped.
    fn follow(&self, sentinel: String) {
        let target = std::sync::Arc::downgrade(&self.target);
        tokio::spawn(async move {
            while let Some(target) = target.upgrade() {
                if let Ok(port) = sentinel_master(&sentinel).await {
                    point(&target, SocketAddr::from(([127, 0, 0, 1], port)));
                }
                drop(target);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
}

fn point(sender: &tokio::sync::watch::Sender<SocketAddr>, target: SocketAddr) {
    sender.send_if_modified(|current| {
        let changed = *current != target;
        *current = target;
        changed
    });
}
