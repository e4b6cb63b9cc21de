//! etcd against a real single-member `etcd` process, started and killed by
//! each test.

use crate::common;

use common::{contract, lost_within, unique, Expect};
use deadbolt_backends::{ErrorKind, Locker, Lost, Token};
use deadbolt_testkit::peers;
use std::sync::Arc;
use std::time::Duration;

/// etcd counts leases in whole seconds and refuses very short ones.
const TTL: Duration = Duration::from_secs(2);

#[tokio::test]
async fn etcd_keeps_the_contract_with_create_revisions_as_tokens() {
    let Some(server) = peers::etcd() else { return };
    contract(
        &format!("etcd://{}", server.address()),
        TTL,
        Expect::Fencing,
    )
    .await;
}

#[tokio::test]
async fn the_lease_outlives_its_ttl_while_renewed_and_lost_fires_when_etcd_dies() {
    let Some(mut server) = peers::etcd() else {
        return;
    };
    let url = format!("etcd://{}", server.address());
    let renewed = common::held_past_its_ttl(&url, TTL, "etcd-lease").await;
    let guard = renewed.guard;
    server.kill();
    let reason = lost_within(guard.lost(Duration::ZERO), TTL + Duration::from_secs(1)).await;
    assert_eq!(reason, Lost::Expired);
}

/// When the holder's lease is revoked (as when it expires), lost() fires and
/// a waiter gets the lock at once, with a larger token.
#[tokio::test]
async fn a_waiter_gets_the_lock_when_the_holders_lease_ends() {
    let Some(server) = peers::etcd() else { return };
    let locker = Locker::connect(&format!("etcd://{}", server.address()))
        .await
        .unwrap();
    let name = unique("etcd-handover");
    let a = locker.open_session(TTL).await.unwrap();
    let b = Arc::new(locker.open_session(TTL).await.unwrap());
    let first = a.try_lock(&name).await.unwrap().unwrap();
    let Token::Fencing(first_token) = first.token() else {
        panic!("{}", first.token())
    };
    let waiter = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move { b.lock_timeout(&name, TTL * 3).await }
    });

    // The lock key is NAME/LEASE-ID-IN-HEX, etcd's lock layout.
    let mut admin = etcd_client::Client::connect([server.address()], None)
        .await
        .unwrap();
    let keys = admin
        .get(
            format!("{name}/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let holder = keys.kvs().first().unwrap().key_str().unwrap().to_owned();
    let lease = i64::from_str_radix(holder.rsplit('/').next().unwrap(), 16).unwrap();
    admin.lease_revoke(lease).await.unwrap();

    let reason = lost_within(first.lost(Duration::ZERO), TTL).await;
    assert!(matches!(reason, Lost::Rejected(_)), "{reason:?}");
    let second = waiter.await.unwrap().unwrap();
    assert!(second.token().fencing().unwrap() > first_token);
    assert_eq!(
        first.release().await.unwrap_err().kind(),
        ErrorKind::LockLost
    );
}

/// etcd's own elections: campaigns queue FIFO, the leader's term is its
/// key's create revision, only the leader proclaims, resigning hands over
/// to the next candidate in a larger term, and a leader whose lease ended
/// is told it lost (a proclaim is refused) while the next one leads.
/// A plain etcd client's `Leader` call sees the same leader.
#[tokio::test]
async fn etcd_elections_hand_over_in_order_with_growing_terms() {
    let Some(server) = peers::etcd() else { return };
    let locker = Locker::connect(&format!("etcd://{}", server.address()))
        .await
        .unwrap();
    let name = unique("etcd-election");
    assert_eq!(locker.leader(&name).await.unwrap(), None);
    let (a, b, c) = (
        locker.open_session(TTL).await.unwrap(),
        Arc::new(locker.open_session(TTL).await.unwrap()),
        Arc::new(locker.open_session(TTL).await.unwrap()),
    );
    let first = a.campaign(&name, "a", None).await.unwrap();
    let first_term = first.token().fencing().unwrap();
    first.proclaim("a, again").await.unwrap();
    let led = locker.leader(&name).await.unwrap().unwrap();
    assert_eq!((led.value.as_str(), led.token), ("a, again", first.token()));

    // b, then c, queue behind a (c starts once b's key exists).
    let campaign = |session: Arc<deadbolt_backends::Session>, value: &'static str| {
        let name = name.clone();
        tokio::spawn(async move { session.campaign(&name, value, Some(TTL * 5)).await })
    };
    let second = campaign(b.clone(), "b");
    let mut admin = etcd_client::Client::connect([server.address()], None)
        .await
        .unwrap();
    let candidates = |admin: &mut etcd_client::Client| {
        let mut admin = admin.clone();
        let prefix = format!("{name}/");
        async move {
            let options = etcd_client::GetOptions::new().with_prefix();
            let keys = admin.get(prefix, Some(options)).await.unwrap();
            keys.kvs().len()
        }
    };
    while candidates(&mut admin).await < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let third = campaign(c.clone(), "c");
    while candidates(&mut admin).await < 3 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        locker.leader(&name).await.unwrap().unwrap().value,
        "a, again"
    );

    first.release().await.unwrap();
    let second = second.await.unwrap().unwrap();
    let second_term = second.token().fencing().unwrap();
    assert!(second_term > first_term, "{second_term} after {first_term}");
    let led = admin.leader(name.as_str()).await.unwrap();
    assert_eq!(led.kv().unwrap().value(), b"b");

    // b's lease ends (as when it expires): c leads, b may not proclaim.
    let lease = i64::from_str_radix(
        std::str::from_utf8(led.kv().unwrap().key())
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap(),
        16,
    )
    .unwrap();
    admin.lease_revoke(lease).await.unwrap();
    let third = third.await.unwrap().unwrap();
    assert!(third.token().fencing().unwrap() > second_term);
    let refused = second.proclaim("b is back").await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::LockLost, "{refused}");
    let led = locker.leader(&name).await.unwrap().unwrap();
    assert_eq!((led.value.as_str(), led.token), ("c", third.token()));
}

/// A lock's guard is not a leadership, and the other backends have no
/// elections: both refused, saying so.
#[tokio::test]
async fn only_an_etcd_campaign_proclaims() {
    let Some(server) = peers::etcd() else { return };
    let locker = Locker::connect(&format!("etcd://{}", server.address()))
        .await
        .unwrap();
    let session = locker.open_session(TTL).await.unwrap();
    let lock = session.lock(&unique("etcd-not-election")).await.unwrap();
    let refused = lock.proclaim("x").await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidArgument);
    assert!(refused.to_string().contains("not an election"), "{refused}");

    let redis = Locker::connect("redis://127.0.0.1:1").await.unwrap();
    let refused = redis.leader("e").await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidArgument);
    assert!(
        refused.to_string().contains("elections are etcd's"),
        "{refused}"
    );
}

/// Closing a session revokes its lease, which frees its locks at once.
#[tokio::test]
async fn closing_the_session_frees_its_locks_at_once() {
    let Some(server) = peers::etcd() else {
        return;
    };
    let locker = Locker::connect(&format!("etcd://{}", server.address()))
        .await
        .unwrap();
    let name = unique("etcd-close");
    let (a, b) = (
        locker.open_session(TTL).await.unwrap(),
        locker.open_session(TTL).await.unwrap(),
    );
    let guard = a.try_lock(&name).await.unwrap().unwrap();
    let lost = guard.lost(Duration::ZERO);
    std::mem::forget(guard); // not released: only the close frees it
    a.close().await.unwrap();
    assert_eq!(lost_within(lost, TTL).await, Lost::Closed);
    assert!(b.try_lock(&name).await.unwrap().is_some());
}

/// The seeds' etcd fault: the leader of a 3-member cluster is killed while
/// a client holds a lock. The lease survives the election (the new leader
/// restarts it in full), the lock stays held and refused to others, and the
/// next grant's token is larger.
#[tokio::test]
async fn a_held_lock_survives_a_leader_kill() {
    let Some(mut members) = peers::etcd_cluster(3) else {
        return;
    };
    let endpoints: Vec<String> = members.iter().map(peers::Server::address).collect();
    let url = format!("etcd://{}", endpoints.join(","));
    let locker = Locker::connect(&url).await.unwrap();
    // Long enough for a renewal stuck on the dead leader (a third of the
    // TTL) and an election (about a second here) before the client's own,
    // conservative deadline: with 3 s, the client gave up on a lease that
    // etcd had kept.
    let ttl = Duration::from_secs(6);
    let name = unique("etcd-leader");
    let (a, b) = (
        locker.open_session(ttl).await.unwrap(),
        locker.open_session(ttl).await.unwrap(),
    );
    let first = a.lock_timeout(&name, ttl).await.unwrap();
    let first_token = first.token().fencing().unwrap();

    let mut admin = etcd_client::Client::connect(&endpoints, None)
        .await
        .unwrap();
    let leader = admin.status().await.unwrap().leader();
    let mut killed = None;
    for (i, endpoint) in endpoints.iter().enumerate() {
        let mut member = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        let status = member.status().await.unwrap();
        if status.header().map(|header| header.member_id()) == Some(leader) {
            members[i].kill();
            killed = Some(i);
        }
    }
    assert!(killed.is_some(), "no member is the leader");

    // Longer than a TTL after the kill, the lock is still held and ours.
    let lost = first.lost(Duration::ZERO);
    tokio::time::sleep(ttl + Duration::from_secs(2)).await;
    if let Ok(reason) = tokio::time::timeout(Duration::ZERO, lost).await {
        panic!("the lease was lost in the election: {reason}");
    }
    assert!(b.try_lock(&name).await.unwrap().is_none(), "two holders");
    first.release().await.unwrap();
    let second = b.lock_timeout(&name, ttl).await.unwrap();
    assert!(second.token().fencing().unwrap() > first_token);
}

/// A member that is down when the session opens is passed over.
#[tokio::test]
async fn a_member_down_at_open_is_passed_over() {
    let Some(server) = peers::etcd() else {
        return;
    };
    let dead = deadbolt_testkit::free_port();
    let url = format!("etcd://127.0.0.1:{dead},{}", server.address());
    let locker = Locker::connect(&url).await.unwrap();
    let session = locker.open_session(TTL).await.unwrap();
    let guard = session.try_lock(&unique("etcd-dead-member")).await.unwrap();
    guard.unwrap().release().await.unwrap();
}

/// `etcd://USER:PASSWORD@`: with etcd's authentication on (a `root` user,
/// `auth enable`), the right password keeps the contract; none, or a wrong
/// one, is refused at once, in a message without the password.
#[tokio::test]
async fn a_user_with_its_password_locks_once_auth_is_enabled() {
    let Some(server) = peers::etcd() else {
        return;
    };
    let mut admin = etcd_client::Client::connect([server.address()], None)
        .await
        .unwrap();
    admin.user_add("root", "root pw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();

    let url = format!("etcd://root:root%20pw@{}", server.address());
    contract(&url, TTL, Expect::Fencing).await;
    for url in [
        format!("etcd://{}", server.address()),
        format!("etcd://root:hunter2@{}", server.address()),
    ] {
        let locker = Locker::connect(&url).await.unwrap();
        let error = match locker.open_session(TTL).await {
            Ok(session) => session.try_lock("auth").await.unwrap_err(),
            Err(error) => error,
        };
        assert_eq!(error.kind(), ErrorKind::Refused, "{url}: {error}");
        assert!(!error.to_string().contains("hunter2"), "{error}");
    }
}

/// `etcds://…?ca=`: TLS to a member with a certificate of the test's CA;
/// refused without the CA (the system's roots do not know it), naming the
/// fix.
#[tokio::test]
async fn etcds_locks_over_tls_verified_by_the_ca_of_the_url() {
    let certs = common::certificates(&["127.0.0.1", "localhost"]);
    let file = |name: &str| certs.path().join(name);
    let Some(server) = peers::etcd_tls(&file("server.pem"), &file("server-key.pem")) else {
        return;
    };
    let url = format!(
        "etcds://{}?ca={}",
        server.address(),
        file("ca.pem").display()
    );
    contract(&url, TTL, Expect::Fencing).await;

    let untrusted = format!("etcds://{}", server.address());
    let error = Locker::connect(&untrusted)
        .await
        .unwrap()
        .open_session(TTL)
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Refused, "{error}");
    assert!(error.to_string().contains("?ca=PATH"), "{error}");
}
