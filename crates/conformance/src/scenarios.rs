//! The scenarios. Each starts its own real server (one node, or a 3-node
//! cluster), drives one or more instances of the client under test, and
//! fails with a message that says what the client did wrong.
//!
//! Timing is measured, never assumed: where a scenario waits for the
//! server to reach a state (a waiter queued), it polls for it.

use crate::driver::{token, ClientUnderTest, Driver, Pending};
use anyhow::{bail, ensure, Context};
use deadbolt_client::{AclGrant, Client};
use deadbolt_testkit::{free_port, signal, TestCluster, TestPki};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

/// Real servers for one scenario, in a directory removed afterwards.
struct Servers {
    cluster: TestCluster,
    _dir: tempfile::TempDir,
}

impl Servers {
    async fn start(bin: &Path, size: u64) -> anyhow::Result<Servers> {
        let dir = tempfile::tempdir()?;
        let cluster = TestCluster::start(bin, dir.path(), size).await;
        Ok(Servers { cluster, _dir: dir })
    }

    fn endpoints(&self) -> Vec<String> {
        self.cluster.endpoints()
    }

    /// Waits until every node has applied the cluster version from which
    /// followers forward calls to the leader (it rises a moment after a
    /// cluster forms), so that a client given only a follower is served
    /// through it rather than sent on to the leader.
    async fn until_followers_forward(&self) -> anyhow::Result<()> {
        let forwarding = u64::from(deadbolt_core::FeatureLevel::FORWARDING.0);
        let started = Instant::now();
        loop {
            let lowest = self
                .cluster
                .nodes
                .iter()
                .map(|node| {
                    node.status()
                        .map_or(0, |s| s["cluster_version"].as_u64().unwrap_or(0))
                })
                .min()
                .unwrap_or(0);
            if lowest >= forwarding {
                return Ok(());
            }
            ensure!(
                started.elapsed() < Duration::from_secs(20),
                "the cluster version stayed at {lowest}, below {forwarding}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A driver connected to `servers`.
async fn connected(client: &ClientUnderTest, servers: &Servers) -> anyhow::Result<Driver> {
    let mut driver = Driver::start(client)?;
    driver.connect(&servers.endpoints()).await?;
    Ok(driver)
}

/// Two instances of the client, connected, each with a session of `ttl`.
async fn two_holders(
    client: &ClientUnderTest,
    servers: &Servers,
    ttl: Duration,
) -> anyhow::Result<((Driver, u64), (Driver, u64))> {
    let mut a = connected(client, servers).await?;
    let mut b = connected(client, servers).await?;
    let (sa, sb) = (a.open(ttl).await?, b.open(ttl).await?);
    Ok(((a, sa), (b, sb)))
}

/// Polls until `session` waits in `lock`'s queue.
async fn until_queued(observer: &mut Driver, lock: &str, session: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if observer.status(lock).await?.waiters.contains(&session) {
            return Ok(());
        }
        ensure!(
            started.elapsed() < Duration::from_secs(20),
            "session {session} never showed up in {lock:?}'s queue"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A grant's token, from an answer that must have come.
async fn granted(pending: Pending) -> anyhow::Result<u64> {
    token(&pending.ok().await?)
}

/// Acquire, release, and tokens that grow with every grant; `try_lock`
/// finds a held lock busy without waiting.
pub async fn tokens_grow(client: &ClientUnderTest, bin: &Path) -> anyhow::Result<()> {
    let servers = Servers::start(bin, 1).await?;
    let ((mut a, sa), (mut b, sb)) = two_holders(client, &servers, Duration::from_secs(10)).await?;
    let first = a.lock(sa, "tokens").await?;
    let busy = b
        .ok("try_lock", json!({ "session": sb, "name": "tokens" }))
        .await?;
    ensure!(
        busy["token"].is_null(),
        "try_lock of a held lock answered {busy}, not busy"
    );
    let held = a.status("tokens").await?;
    ensure!(
        held.holder == Some(sa) && held.token == Some(first),
        "status after the grant: {held:?}, expected session {sa} with token {first}"
    );
    a.release(sa, "tokens").await?;
    let second = token(
        &b.ok("try_lock", json!({ "session": sb, "name": "tokens" }))
            .await?,
    )?;
    ensure!(
        second > first,
        "second grant's token {second} is not above the first's {first}"
    );
    b.release(sb, "tokens").await?;
    // Another lock's grant goes on from the same counter.
    let third = a.lock(sa, "tokens/other").await?;
    ensure!(
        third > second,
        "token {third} of another lock is not above {second}"
    );
    let free = a.status("tokens").await?;
    ensure!(free.holder.is_none(), "released lock still shows {free:?}");
    a.ok("close", json!({ "session": sa })).await?;
    ensure!(
        b.status("tokens/other").await?.holder.is_none(),
        "closing the session did not release its lock"
    );
    Ok(())
}

/// Blocking waiters are granted in the order they queued, each with a
/// larger token.
pub async fn fifo_waiters(client: &ClientUnderTest, bin: &Path) -> anyhow::Result<()> {
    let servers = Servers::start(bin, 1).await?;
    let (mut holder, mut waiters) = (
        connected(client, &servers).await?,
        connected(client, &servers).await?,
    );
    let ttl = Duration::from_secs(10);
    let owner = holder.open(ttl).await?;
    let mut token = holder.lock(owner, "fifo").await?;
    let mut queue = Vec::new();
    for _ in 0..3 {
        let session = waiters.open(ttl).await?;
        let pending = waiters
            .send("lock", json!({ "session": session, "name": "fifo" }))
            .await?;
        until_queued(&mut holder, "fifo", session).await?;
        queue.push((session, pending));
    }
    holder.release(owner, "fifo").await?;
    for (place, (session, pending)) in queue.into_iter().enumerate() {
        let next = granted(pending)
            .await
            .with_context(|| format!("waiter {place}"))?;
        ensure!(
            next > token,
            "waiter {place}'s token {next} is not above {token}"
        );
        let status = holder.status("fifo").await?;
        ensure!(
            status.holder == Some(session),
            "waiter {place} (session {session}) was told it holds the lock, status says {status:?}"
        );
        token = next;
        waiters.release(session, "fifo").await?;
    }
    Ok(())
}

/// A wait with a timeout ends with `wait_timeout` and leaves no place in
/// the queue behind.
pub async fn wait_timeout(client: &ClientUnderTest, bin: &Path) -> anyhow::Result<()> {
    let servers = Servers::start(bin, 1).await?;
    let ((mut a, sa), (mut b, sb)) = two_holders(client, &servers, Duration::from_secs(10)).await?;
    let held = a.lock(sa, "timeout").await?;
    let started = Instant::now();
    let timed_out = b
        .call(
            "lock",
            json!({ "session": sb, "name": "timeout", "timeout_ms": 700 }),
        )
        .await?;
    let waited = started.elapsed();
    match timed_out {
        Err(refusal) if refusal.kind == "wait_timeout" => {}
        other => bail!("a lock wait of 700ms on a held lock answered {other:?}, not wait_timeout"),
    }
    ensure!(
        waited >= Duration::from_millis(600),
        "the 700ms wait gave up after only {waited:?}"
    );
    let status = a.status("timeout").await?;
    ensure!(
        !status.waiters.contains(&sb),
        "the timed-out waiter is still queued: {status:?}"
    );
    a.release(sa, "timeout").await?;
    let next = token(
        &b.ok("try_lock", json!({ "session": sb, "name": "timeout" }))
            .await?,
    )?;
    ensure!(
        next > held,
        "token {next} after the timeout is not above {held}"
    );
    Ok(())
}

/// The client renews its lease: a lock with a 1 s TTL stays held, with
/// the same token, through five TTLs, and `lost` does not fire.
pub async fn renewal(client: &ClientUnderTest, bin: &Path) -> anyhow::Result<()> {
    let servers = Servers::start(bin, 1).await?;
    let mut a = connected(client, &servers).await?;
    let ttl = Duration::from_secs(1);
    let session = a.open(ttl).await?;
    let held = a.lock(session, "renewed").await?;
    let mut lost = a
        .send("lost", json!({ "session": session, "margin_ms": 0 }))
        .await?;
    for _ in 0..5 {
        if let Some(answer) = lost.within(ttl).await? {
            bail!("lost fired while the server was up and renewals could get through: {answer:?}");
        }
        let status = a.status("renewed").await?;
        ensure!(
            status.holder == Some(session) && status.token == Some(held),
            "the lock changed hands while its holder kept renewing: {status:?}"
        );
    }
    a.release(session, "renewed").await?;
    Ok(())
}

/// A server frozen (SIGSTOP) past the TTL: the holder's `lost` fires before
/// the lease the server holds could end, and after the server resumes the
/// lock goes to another client with a larger token. Returns how long before
/// the latest possible end of the server's lease `lost` fired.
pub async fn lost_before_regrant(client: &ClientUnderTest, bin: &Path) -> anyhow::Result<Duration> {
    let servers = Servers::start(bin, 1).await?;
    let (mut a, mut b) = (
        connected(client, &servers).await?,
        connected(client, &servers).await?,
    );
    let ttl = Duration::from_secs(2);
    let session = a.open(ttl).await?;
    let held = a.lock(session, "frozen").await?;
    // Let a renewal or two go through first.
    tokio::time::sleep(ttl / 2).await;
    let lost = a
        .send("lost", json!({ "session": session, "margin_ms": 0 }))
        .await?;
    let pid = servers.cluster.pid(1).context("the server is running")?;
    signal(pid, libc::SIGSTOP);
    let frozen_at = Instant::now();
    let answer = lost.answer().await;
    let lost_after = frozen_at.elapsed();
    signal(pid, libc::SIGCONT);
    answer?.map_err(|refusal| anyhow::anyhow!("lost failed: {refusal}"))?;
    // The server received the last renewal before it froze, so the lease
    // it would enforce ends within one TTL of the freeze.
    ensure!(
        lost_after < ttl,
        "lost fired {lost_after:?} after the freeze, past the {ttl:?} TTL"
    );
    let other = b.open(Duration::from_secs(10)).await?;
    let next = b.lock(other, "frozen").await?;
    ensure!(
        next > held,
        "the next holder's token {next} is not above {held}"
    );
    Ok(ttl - lost_after)
}

/// A 3-node cluster loses its leader (SIGKILL) while one client holds a
/// lock and another waits for it: the holder keeps it (its lease carries
/// over), its release goes through the new leader, and the waiter, whose
/// blocking acquire the kill cut and the client retried, is granted once.
/// The waiter is given one follower's address only, as a client behind a
/// load balancer may be: that follower forwards its calls to whichever
/// node leads, before the kill and after.
pub async fn leader_kill(client: &ClientUnderTest, bin: &Path) -> anyhow::Result<()> {
    let mut servers = Servers::start(bin, 3).await?;
    servers.until_followers_forward().await?;
    let leader = servers.cluster.leader_within(Duration::from_secs(10)).await;
    let follower = servers.cluster.nodes.iter().find(|n| n.id != leader);
    let follower = follower.expect("a follower").endpoint();
    let ttl = Duration::from_secs(10);
    let mut a = connected(client, &servers).await?;
    let mut b = Driver::start(client)?;
    b.connect(&[follower]).await?;
    let (sa, sb) = (a.open(ttl).await?, b.open(ttl).await?);
    let held = a.lock(sa, "failover").await?;
    let mut lost = a
        .send("lost", json!({ "session": sa, "margin_ms": 0 }))
        .await?;
    let waiting = b
        .send("lock", json!({ "session": sb, "name": "failover" }))
        .await?;
    until_queued(&mut a, "failover", sb).await?;
    let leader = servers.cluster.leader_within(Duration::from_secs(10)).await;
    servers.cluster.kill9(leader);
    let new_leader = servers.cluster.leader_within(Duration::from_secs(30)).await;
    ensure!(
        new_leader != leader,
        "node {leader} was killed but still leads"
    );
    // Wait for the waiter to be queued again (its acquire was cut).
    until_queued(&mut a, "failover", sb).await?;
    if let Some(answer) = lost.within(Duration::ZERO).await? {
        bail!("the holder's lease was lost across the leader change: {answer:?}");
    }
    let status = a.status("failover").await?;
    ensure!(
        status.holder == Some(sa) && status.token == Some(held),
        "after the leader change the lock shows {status:?}, not session {sa} with {held}"
    );
    a.release(sa, "failover").await?;
    let next = granted(waiting).await?;
    ensure!(next > held, "the waiter's token {next} is not above {held}");
    let status = b.status("failover").await?;
    ensure!(
        status.holder == Some(sb) && status.waiters.is_empty(),
        "the retried acquire left {status:?}, expected session {sb} alone"
    );
    b.release(sb, "failover").await?;
    let status = b.status("failover").await?;
    ensure!(
        status.holder.is_none(),
        "a second grant from the retried acquire: {status:?}"
    );
    Ok(())
}

/// Bad input is refused with `invalid_argument`, and a server nobody runs
/// gives `unavailable`, without hanging.
pub async fn bad_input(client: &ClientUnderTest, bin: &Path) -> anyhow::Result<()> {
    let servers = Servers::start(bin, 1).await?;
    let mut a = connected(client, &servers).await?;
    let kind = |answer: Result<serde_json::Value, crate::Refusal>| match answer {
        Ok(ok) => format!("success {ok}"),
        Err(refusal) => refusal.kind,
    };
    let too_short = a.call("open", json!({ "ttl_ms": 100 })).await?;
    ensure!(
        kind(too_short.clone()) == "invalid_argument",
        "a 100ms TTL: {too_short:?}"
    );
    let session = a.open(Duration::from_secs(10)).await?;
    for name in ["", "bell\u{7}", &"x".repeat(513)] {
        let answer = a
            .call("try_lock", json!({ "session": session, "name": name }))
            .await?;
        ensure!(
            kind(answer.clone()) == "invalid_argument",
            "lock name {name:?}: {answer:?}"
        );
    }
    let mut nobody = Driver::start(client)?;
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let started = Instant::now();
    let answer = match nobody
        .call("connect", json!({ "endpoints": [endpoint] }))
        .await?
    {
        Ok(_) => nobody.call("open", json!({ "ttl_ms": 10_000 })).await?,
        refused => refused,
    };
    ensure!(
        kind(answer.clone()) == "unavailable",
        "a server nobody runs: {answer:?}"
    );
    ensure!(
        started.elapsed() < Duration::from_secs(30),
        "reporting an unreachable server took {:?}",
        started.elapsed()
    );
    Ok(())
}

/// Mutual TLS with a CA and a client certificate, and a bearer token: the
/// client takes a lock as its identity; another identity, even holding the
/// session's id and secret, is refused with `permission_denied`.
pub async fn tls_and_identities(client: &ClientUnderTest, bin: &Path) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = TestPki::create(bin, &dir.path().join("pki"), "client");
    let cluster =
        TestCluster::start_with(bin, &dir.path().join("cluster"), 1, Some(pki.clone())).await;
    let tls = pki.tls_options();
    let root = cluster.client().await.acl_bootstrap().await?.token;
    let admin = Client::connect_with_token(cluster.endpoints(), &tls, Some(&root)).await?;
    let grants = ["lock", "read"].map(|permission| AclGrant {
        permission: permission.into(),
        prefix: "conformance/".into(),
    });
    admin.acl_put_role("locker", grants.to_vec()).await?;
    let mut tokens = Vec::new();
    for identity in ["alice", "bob"] {
        admin.acl_bind_role(identity, "locker", true).await?;
        tokens.push(admin.acl_create_token(identity).await?.token);
    }
    let files = dir.path().join("pki");
    let file = |name: &str| files.join(name).to_string_lossy().into_owned();
    let connect = |token: &str| {
        json!({
            "endpoints": cluster.endpoints(),
            "ca": file("ca.pem"),
            "cert": file("client.pem"),
            "key": file("client-key.pem"),
            "token": token,
        })
    };
    let mut alice = Driver::start(client)?;
    alice.ok("connect", connect(&tokens[0])).await?;
    let session = alice.open(Duration::from_secs(10)).await?;
    let held = alice.lock(session, "conformance/tls").await?;
    let outside = alice
        .call(
            "try_lock",
            json!({ "session": session, "name": "elsewhere" }),
        )
        .await?;
    ensure!(
        matches!(&outside, Err(refusal) if refusal.kind == "permission_denied"),
        "a lock outside alice's prefix: {outside:?}"
    );
    let handle = alice.ok("handle", json!({ "session": session })).await?;
    let mut bob = Driver::start(client)?;
    bob.ok("connect", connect(&tokens[1])).await?;
    let stolen = bob.call("keep_alive_handle", handle.clone()).await?;
    ensure!(
        matches!(&stolen, Err(refusal) if refusal.kind == "permission_denied"),
        "bob used alice's session (id and secret): {stolen:?}"
    );
    let mut anonymous = Driver::start(client)?;
    let mut no_token = connect("");
    no_token["token"] = serde_json::Value::Null;
    let unauthenticated = match anonymous.call("connect", no_token).await? {
        Ok(_) => anonymous.call("open", json!({ "ttl_ms": 10_000 })).await?,
        refused => refused,
    };
    ensure!(
        matches!(&unauthenticated, Err(refusal) if refusal.kind == "permission_denied"),
        "a client certificate without a role: {unauthenticated:?}"
    );
    ensure!(
        bob.status("conformance/tls").await?.token == Some(held),
        "bob cannot read the lock alice holds"
    );
    alice.release(session, "conformance/tls").await?;
    Ok(())
}
