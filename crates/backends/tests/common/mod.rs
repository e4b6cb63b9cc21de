//! The contract every backend must keep, against real servers
//! (`deadbolt_testkit::peers` starts them or skips, loudly).

use deadbolt_backends::{ErrorKind, Locker, Token};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A lock name no other test (or earlier run) uses.
pub fn unique(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("test-{test}-{}-{nanos}", std::process::id())
}

/// Which kind of token a backend must give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Fencing,
    Counter,
    None,
}

/// The contract: one holder at a time, a busy lock refused or waited for
/// (with a timeout), one name per session, the lock handed over on
/// release, and tokens (where there are any) growing from grant to grant.
pub async fn contract(url: &str, ttl: Duration, expect: Expect) {
    let locker = Locker::connect(url).await.unwrap();
    let name = unique("contract");
    let a = locker.open_session(ttl).await.unwrap();
    let b = Arc::new(locker.open_session(ttl).await.unwrap());

    let first = a.lock_timeout(&name, Duration::from_secs(5)).await.unwrap();
    let kind = match first.token() {
        Token::Fencing(_) => Expect::Fencing,
        Token::Counter(_) => Expect::Counter,
        Token::None => Expect::None,
    };
    assert_eq!(kind, expect, "token {}", first.token());

    assert!(b.try_lock(&name).await.unwrap().is_none(), "two holders");
    let waited = Instant::now();
    let timeout = b
        .lock_timeout(&name, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(timeout.kind(), ErrorKind::WaitTimeout, "{timeout}");
    assert!(
        waited.elapsed() < Duration::from_secs(3),
        "{:?}",
        waited.elapsed()
    );
    let twice = a.try_lock(&name).await.unwrap_err();
    assert_eq!(twice.kind(), ErrorKind::InvalidArgument, "{twice}");

    // A waiter gets the lock once the holder releases it.
    let waiter = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move { b.lock_timeout(&name, Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let first_token = first.token();
    first.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    match (first_token, second.token()) {
        (Token::Fencing(x), Token::Fencing(y)) | (Token::Counter(x), Token::Counter(y)) => {
            assert!(y > x, "token went from {x} to {y}")
        }
        (Token::None, Token::None) => {}
        (x, y) => panic!("token kinds changed: {x} then {y}"),
    }
    assert!(a.try_lock(&name).await.unwrap().is_none());
    second.release().await.unwrap();
    let third = a
        .try_lock(&name)
        .await
        .unwrap()
        .expect("free after release");
    third.release().await.unwrap();
}

/// Waits for `lost` at most `within`, and returns why it fired.
pub async fn lost_within(
    lost: impl std::future::Future<Output = deadbolt_backends::Lost>,
    within: Duration,
) -> deadbolt_backends::Lost {
    tokio::time::timeout(within, lost)
        .await
        .unwrap_or_else(|_| panic!("lost() did not fire within {within:?}"))
}

/// A lock held past two TTLs by its renewals, and a rival session it is
/// still refused to.
pub struct Renewed {
    pub name: String,
    pub guard: deadbolt_backends::Guard,
    #[allow(dead_code)] // not read: held so the session stays open as long as `Renewed`
    pub holder: deadbolt_backends::Session,
    pub rival: deadbolt_backends::Session,
}

pub async fn held_past_its_ttl(url: &str, ttl: Duration, test: &str) -> Renewed {
    let locker = Locker::connect(url).await.unwrap();
    let holder = locker.open_session(ttl).await.unwrap();
    let rival = locker.open_session(ttl).await.unwrap();
    let name = unique(test);
    let guard = holder.try_lock(&name).await.unwrap().unwrap();
    tokio::time::sleep(ttl * 2).await;
    assert!(
        rival.try_lock(&name).await.unwrap().is_none(),
        "the lock ended although its lease was renewed"
    );
    Renewed {
        name,
        guard,
        holder,
        rival,
    }
}

/// A CA and a server certificate for `names` (IP addresses or DNS names)
/// signed by it, as PEM files in a temporary directory: `ca.pem`,
/// `server.pem`, `server-key.pem`.
pub fn certificates(names: &[&str]) -> tempfile::TempDir {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let dir = tempfile::tempdir().unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "deadbolt-backends test CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
    let server = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.path().join("server.pem"), server.pem()).unwrap();
    std::fs::write(dir.path().join("server-key.pem"), key.serialize_pem()).unwrap();
    dir
}
