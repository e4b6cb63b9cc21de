//! Redis and Redlock against real `redis-server` processes (no persistence,
//! as the seeds' lock assumes), started and killed by each test.

mod common;

use common::{contract, lost_within, unique, Expect};
use deadbolt_backends::{ErrorKind, Locker, Lost, Token};
use deadbolt_testkit::peers;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(2);

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
    contract(&redlock_url(&servers), TTL, Expect::None).await;
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
