//! Redis and Redlock against real `redis-server` processes (no persistence,
//! as the seeds' lock assumes), started and killed by each test.

use crate::common;

use common::{contract, lost_within, unique, Expect};
use deadbolt_backends::{ErrorKind, Locker, Lost, Token};
use deadbolt_testkit::peers;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(2);

/// The TTL of the Redlock contract runs. Each master gets TTL/200 to answer
/// a command and ten times that to connect (`Rules::node_timeout`): at 2 s
/// that is 10 ms and 100 ms, which a TLS handshake and AUTH on a CI machine
/// busy with the rest of the suite overran (a first `try_lock` reported
/// "could not reach rediss://…: timed out"). The contract waits on no
/// expiry, so 10 s, the Redis docs' example, costs it nothing.
const REDLOCK_CONTRACT_TTL: Duration = Duration::from_secs(10);

#[tokio::test]
async fn one_server_keeps_the_contract_without_a_token() {
    let Some(server) = peers::redis() else {
        return;
    };
    contract(&format!("redis://{}", server.address()), TTL, Expect::None).await;
}

#[tokio::test]
async fn one_server_with_the_counter_numbers_every_grant() {
    let Some(server) = peers::redis() else {
        return;
    };
    let url = format!("redis://{}?fence=counter", server.address());
    contract(&url, TTL, Expect::Counter).await;
}

#[tokio::test]
async fn the_watchdog_keeps_a_lock_past_its_ttl_and_lost_fires_when_the_key_goes() {
    let Some(server) = peers::redis() else {
        return;
    };
    let url = format!("redis://{}", server.address());
    let common::Renewed { name, guard, .. } =
        common::held_past_its_ttl(&url, TTL, "watchdog").await;

    // Someone deletes the key: the next renewal finds it gone.
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let deleted: i64 = redis::cmd("DEL")
        .arg(format!("deadbolt:lock:{{{name}}}"))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    let reason = lost_within(guard.lost(Duration::ZERO), TTL).await;
    assert!(matches!(reason, Lost::Rejected(_)), "{reason:?}");
    let release = guard.release().await.unwrap_err();
    assert_eq!(release.kind(), ErrorKind::LockLost, "{release}");
}

#[tokio::test]
async fn a_killed_server_makes_lost_fire_within_the_ttl() {
    let Some(mut server) = peers::redis() else {
        return;
    };
    let locker = Locker::connect(&format!("redis://{}", server.address()))
        .await
        .unwrap();
    let session = locker.open_session(TTL).await.unwrap();
    let guard = session.try_lock(&unique("kill")).await.unwrap().unwrap();
    server.kill();
    let reason = lost_within(guard.lost(Duration::ZERO), TTL + Duration::from_secs(1)).await;
    assert_eq!(reason, Lost::Expired);
}

/// The seeds' "Weak", shown: a restart without persistence forgets the
/// lock, and a second client takes it while the first still holds a lease
/// it believes in. Its counter starts over too, which is why it is a
/// `Token::Counter` and not a fencing token.
#[tokio::test]
async fn a_restart_without_persistence_grants_the_lock_twice() {
    let Some(mut server) = peers::redis() else {
        return;
    };
    let url = format!("redis://{}?fence=counter", server.address());
    let locker = Locker::connect(&url).await.unwrap();
    let (a, b) = (
        locker.open_session(Duration::from_secs(30)).await.unwrap(),
        locker.open_session(Duration::from_secs(30)).await.unwrap(),
    );
    let name = unique("restart");
    let first = a.try_lock(&name).await.unwrap().unwrap();
    assert_eq!(first.token(), Token::Counter(1));
    server.restart();
    let second = b.lock_timeout(&name, Duration::from_secs(5)).await.unwrap();
    // The first holder's lease has not run out: two holders at once.
    assert!(first.lease_deadline() > std::time::Instant::now());
    assert_eq!(
        second.token(),
        Token::Counter(1),
        "the counter started over"
    );
}

fn redlock_url(servers: &[peers::Server]) -> String {
    let nodes: Vec<String> = servers.iter().map(peers::Server::address).collect();
    format!("redlock://{}", nodes.join(","))
}

fn three_servers() -> Option<Vec<peers::Server>> {
    (0..3).map(|_| peers::redis()).collect()
}

#[tokio::test]
async fn redlock_keeps_the_contract_without_a_token() {
    let Some(servers) = three_servers() else {
        return;
    };
    contract(&redlock_url(&servers), REDLOCK_CONTRACT_TTL, Expect::None).await;
}

/// A minority of masters down changes nothing; a majority down loses the
/// lock (the lease cannot be renewed on a quorum) and refuses new grants.
#[tokio::test]
async fn redlock_survives_a_minority_down_and_loses_the_lock_with_the_majority() {
    let Some(mut servers) = three_servers() else {
        return;
    };
    let locker = Locker::connect(&redlock_url(&servers)).await.unwrap();
    let (a, b) = (
        locker.open_session(TTL).await.unwrap(),
        locker.open_session(TTL).await.unwrap(),
    );
    let name = unique("redlock-majority");
    let guard = a.try_lock(&name).await.unwrap().unwrap();
    assert_eq!(guard.token(), Token::None);
    servers[0].kill();
    tokio::time::sleep(TTL * 2).await;
    assert!(b.try_lock(&name).await.unwrap().is_none(), "two holders");
    let other = b.try_lock(&unique("redlock-other")).await.unwrap();
    assert!(other.is_some(), "two of three masters grant");

    servers[1].kill();
    let reason = lost_within(guard.lost(Duration::ZERO), TTL + Duration::from_secs(1)).await;
    assert_eq!(reason, Lost::Expired);
    let refused = b
        .lock_timeout(&unique("redlock-none"), Duration::from_millis(500))
        .await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::WaitTimeout);
}

/// The seeds' failover fault, scripted: the replica falls behind (its link
/// to the primary cut, as replication is asynchronous and may lag), the
/// primary grants and dies, the replica is promoted, and a client that
/// follows the failover gets the lock again.
#[tokio::test]
async fn a_failover_to_a_replica_that_missed_the_grant_grants_twice() {
    let Some(mut primary) = peers::redis() else {
        return;
    };
    let Some(replica) = peers::redis() else {
        return;
    };
    let replica_url = format!("redis://{}", replica.address());
    let admin = redis::Client::open(replica_url.as_str()).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    let replicate = |port: u16| {
        let mut command = redis::cmd("REPLICAOF");
        command.arg("127.0.0.1").arg(port);
        command
    };
    let ok: String = replicate(primary.port)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(ok, "OK");
    wait_until_replicating(&mut admin).await;
    // The link goes (a port nobody listens on): the replica lags from here.
    let dead_port = deadbolt_testkit::free_port();
    let ok: String = replicate(dead_port).query_async(&mut admin).await.unwrap();
    assert_eq!(ok, "OK");

    let ttl = Duration::from_secs(30);
    let name = unique("failover");
    let a = Locker::connect(&format!("redis://{}", primary.address()))
        .await
        .unwrap();
    let a = a.open_session(ttl).await.unwrap();
    let first = a.try_lock(&name).await.unwrap().unwrap();
    primary.kill();
    let promoted: String = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(promoted, "OK");

    let b = Locker::connect(&replica_url).await.unwrap();
    let b = b.open_session(ttl).await.unwrap();
    let second = b.try_lock(&name).await.unwrap();
    assert!(second.is_some(), "the promoted replica refused the lock");
    assert!(
        first.lease_deadline() > std::time::Instant::now(),
        "two holders"
    );
}

async fn wait_until_replicating(admin: &mut redis::aio::MultiplexedConnection) {
    for _ in 0..200 {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(admin)
            .await
            .unwrap();
        if info.contains("master_link_status:up") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the replica never caught up with its primary");
}

/// The restart the Redis docs warn about: a master that restarts without
/// persistence forgets the keys it held, and with one master down at the
/// first grant, a second client can count a majority again.
#[tokio::test]
async fn redlock_a_master_restarted_without_persistence_grants_twice() {
    let Some(mut servers) = three_servers() else {
        return;
    };
    let locker = Locker::connect(&redlock_url(&servers)).await.unwrap();
    let ttl = Duration::from_secs(30);
    let (a, b) = (
        locker.open_session(ttl).await.unwrap(),
        locker.open_session(ttl).await.unwrap(),
    );
    let name = unique("redlock-restart");
    servers[2].kill();
    let first = a
        .try_lock(&name)
        .await
        .unwrap()
        .expect("two of three grant");
    servers[2].restart();
    assert!(
        b.try_lock(&name).await.unwrap().is_none(),
        "one holder so far"
    );
    servers[0].restart();
    let second = b.try_lock(&name).await.unwrap();
    assert!(second.is_some(), "the restarted masters did not grant");
    assert!(
        first.lease_deadline() > std::time::Instant::now(),
        "two holders"
    );
}

// Authentication and TLS, against real servers: `--requirepass`, an ACL
// user, and servers that speak only TLS with certificates made here.

const PASSWORD: &str = "s3cret pass";

/// The password as a URL carries it (%-escaped).
const IN_URL: &str = "s3cret%20pass";

/// A password server refuses a client without the password or with a wrong
/// one, at once and as `Refused` (waiting would not help), in a message
/// that shows no password; the right one locks.
#[tokio::test]
async fn a_password_server_refuses_a_wrong_password_and_locks_with_the_right_one() {
    let Some(server) = peers::redis_with(&["--requirepass", PASSWORD]) else {
        return;
    };
    for (url, says) in [
        (format!("redis://{}", server.address()), "NOAUTH"),
        (
            format!("redis://:wrong-hunter2@{}", server.address()),
            "refused to authenticate",
        ),
    ] {
        let locker = Locker::connect(&url).await.unwrap();
        let session = locker.open_session(TTL).await.unwrap();
        let started = std::time::Instant::now();
        let error = session
            .lock_timeout(&unique("auth"), Duration::from_secs(10))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Refused, "{url}: {error}");
        assert!(error.to_string().contains(says), "{url}: {error}");
        assert!(!error.to_string().contains("hunter2"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(2), "{url}: retried");
    }
    let url = format!("redis://:{IN_URL}@{}?fence=counter", server.address());
    contract(&url, TTL, Expect::Counter).await;
}

/// `redis://USER:PASSWORD@`: `AUTH USER PASSWORD` for an ACL user, here one
/// allowed only Deadbolt's keys.
#[tokio::test]
async fn an_acl_user_locks_with_its_own_password() {
    let Some(server) = peers::redis_with(&["--requirepass", PASSWORD]) else {
        return;
    };
    let admin = format!("redis://:{IN_URL}@{}", server.address());
    let mut admin = redis::Client::open(admin.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "locker",
            "on",
            ">locker-pw",
            "~deadbolt:*",
            "+@all",
        ])
        .query_async(&mut admin)
        .await
        .unwrap();
    let url = format!("redis://locker:locker-pw@{}", server.address());
    contract(&url, TTL, Expect::None).await;
    let wrong = format!("redis://locker:hunter2@{}", server.address());
    let error = Locker::connect(&wrong)
        .await
        .unwrap()
        .open_session(TTL)
        .await
        .unwrap()
        .try_lock(&unique("acl"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Refused, "{error}");
    assert!(error.to_string().contains("locker:***@"), "{error}");
}

fn tls_redis(certs: &tempfile::TempDir, extra: &[&str]) -> Option<peers::Server> {
    let file = |name: &str| certs.path().join(name);
    peers::redis_tls(
        &file("server.pem"),
        &file("server-key.pem"),
        &file("ca.pem"),
        extra,
    )
}

/// `rediss://` with the CA of `?ca=`, and a password over it; refused, with
/// the fix named, without the CA (the system's roots do not know it); a
/// plain `redis://` to the TLS port fails instead of hanging.
#[tokio::test]
async fn rediss_locks_over_tls_verified_by_the_ca_of_the_url() {
    let certs = common::certificates(&["127.0.0.1", "localhost"]);
    let Some(server) = tls_redis(&certs, &["--requirepass", PASSWORD]) else {
        return;
    };
    let ca = certs.path().join("ca.pem");
    let url = format!(
        "rediss://:{IN_URL}@{}?ca={}&fence=counter",
        server.address(),
        ca.display()
    );
    contract(&url, TTL, Expect::Counter).await;

    let untrusted = format!("rediss://:{IN_URL}@{}", server.address());
    let error = Locker::connect(&untrusted)
        .await
        .unwrap()
        .open_session(TTL)
        .await
        .unwrap()
        .lock_timeout(&unique("tls"), Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Refused, "{error}");
    assert!(error.to_string().contains("?ca=PATH"), "{error}");
    assert!(!error.to_string().contains("s3cret"), "{error}");

    let plain = format!("redis://:{IN_URL}@{}", server.address());
    let error = Locker::connect(&plain)
        .await
        .unwrap()
        .open_session(TTL)
        .await
        .unwrap()
        .try_lock(&unique("plain"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");

    let missing = format!("rediss://{}?ca=/nonexistent/ca.pem", server.address());
    let error = Locker::connect(&missing).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}");
    assert!(error.to_string().contains("/nonexistent/ca.pem"), "{error}");
}

/// `redlocks://`: TLS to every master, each with its own password.
#[tokio::test]
async fn redlocks_locks_over_tls_masters_with_their_own_passwords() {
    let certs = common::certificates(&["127.0.0.1", "localhost"]);
    let mut servers = Vec::new();
    for password in ["pw-0", "pw-1", "pw-2"] {
        let Some(server) = tls_redis(&certs, &["--requirepass", password]) else {
            return;
        };
        servers.push((server, password));
    }
    let masters: Vec<String> = servers
        .iter()
        .map(|(server, password)| format!(":{password}@{}", server.address()))
        .collect();
    let url = format!(
        "redlocks://{}?ca={}",
        masters.join(","),
        certs.path().join("ca.pem").display()
    );
    contract(&url, REDLOCK_CONTRACT_TTL, Expect::None).await;
}
