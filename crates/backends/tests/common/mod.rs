//! Real lock servers for the backend tests, and the contract every backend
//! must keep.
//!
//! Redis and etcd are started here, one throwaway process per test on free
//! loopback ports (so a test may kill, pause or restart its own), from the
//! binaries on PATH or named by `DEADBOLT_REDIS_SERVER` / `DEADBOLT_ETCD`.
//! PostgreSQL is the shared server of `scripts/postgres.sh`
//! (`DEADBOLT_TEST_POSTGRES_URL`). A missing server skips its tests, loudly,
//! unless `DEADBOLT_REQUIRE_BACKENDS=1` (set by `scripts/test.sh`), which
//! makes them fail: CI must not pass by skipping.

#![allow(dead_code)] // each test binary uses its own part

use deadbolt_backends::{ErrorKind, Locker, Token};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const REQUIRE: &str = "DEADBOLT_REQUIRE_BACKENDS";

/// Says (once per test) that a server is missing, or fails if it must not be.
fn missing(what: &str, how: &str) {
    assert!(
        std::env::var(REQUIRE).as_deref() != Ok("1"),
        "{REQUIRE}=1 but {what} is missing: {how}"
    );
    // Straight to stderr: the harness swallows output of passing tests.
    let _ = writeln!(
        std::io::stderr(),
        "\n*** {what} missing, test skipped: {how} (scripts/test.sh does this) ***\n"
    );
}

/// `var`'s path, or `program` on PATH.
fn binary(var: &str, program: &str, package: &str) -> Option<PathBuf> {
    if let Ok(path) = std::env::var(var) {
        return Some(PathBuf::from(path));
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    });
    if found.is_none() {
        missing(program, &format!("install Debian's {package} or set {var}"));
    }
    found
}

/// A lock server process this test started; killed (by its own pid) when
/// dropped.
pub struct Server {
    program: PathBuf,
    args: Vec<String>,
    pub port: u16,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(program: PathBuf, args: Vec<String>, port: u16, dir: tempfile::TempDir) -> Server {
        let mut server = Server {
            program,
            args,
            port,
            child: None,
            _dir: dir,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new(&self.program)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {:?}: {err}", self.program));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "{:?} did not listen on port {} within 20s",
                self.program,
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again, same port, same data directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis server without persistence, as the seeds' lock assumes.
pub fn redis() -> Option<Server> {
    let program = binary("DEADBOLT_REDIS_SERVER", "redis-server", "redis-server")?;
    let dir = tempfile::tempdir().unwrap();
    let port = deadbolt_testkit::free_port();
    let args = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        dir.path().to_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec();
    Some(Server::start(program, args, port, dir))
}

/// A single-member etcd cluster.
pub fn etcd() -> Option<Server> {
    let program = binary("DEADBOLT_ETCD", "etcd", "etcd-server")?;
    let dir = tempfile::tempdir().unwrap();
    let (port, peer) = (deadbolt_testkit::free_port(), deadbolt_testkit::free_port());
    let client = format!("http://127.0.0.1:{port}");
    let peer = format!("http://127.0.0.1:{peer}");
    let args = [
        "--name",
        "test",
        "--data-dir",
        &dir.path().join("data").to_string_lossy(),
        "--listen-client-urls",
        &client,
        "--advertise-client-urls",
        &client,
        "--listen-peer-urls",
        &peer,
        "--initial-advertise-peer-urls",
        &peer,
        "--initial-cluster",
        &format!("test={peer}"),
        "--log-level",
        "error",
    ]
    .map(str::to_owned)
    .to_vec();
    Some(Server::start(program, args, port, dir))
}

/// The shared PostgreSQL server's URL.
pub fn postgres_url() -> Option<String> {
    const VAR: &str = "DEADBOLT_TEST_POSTGRES_URL";
    match std::env::var(VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            missing(
                "PostgreSQL",
                &format!("run `eval \"$(scripts/postgres.sh)\"` to set {VAR}"),
            );
            None
        }
    }
}

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
