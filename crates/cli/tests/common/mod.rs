//! Test harness: real `deadbolt` processes on loopback, in temp directories.
//!
//! Nothing here imitates the server: every test talks to the binary that
//! `cargo build` produced, through the real client or raw HTTP.

#![allow(dead_code)] // each test binary uses a different part of the harness

pub use deadbolt_testkit::{free_port, http, signal, TestCluster};

use deadbolt_client::Client;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_deadbolt");

/// A running `deadbolt server`; killed (SIGKILL) when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    pub data_dir: PathBuf,
    child: Option<Child>,
    log: PathBuf,
}

impl TestServer {
    /// Starts a server on a fresh port with its data in `data_dir`, and
    /// waits until it leads and serves. The port `free_port` found can be
    /// bound by someone else before the server binds it (another test
    /// that chose the same one): then the server is started again on
    /// another, a few times.
    pub fn start(data_dir: &Path) -> TestServer {
        const ATTEMPTS: usize = 5;
        let fresh = || SocketAddr::from(([127, 0, 0, 1], free_port()));
        for _ in 1..ATTEMPTS {
            let mut server = Self::spawn(data_dir, fresh(), &[]);
            match server.wait_ready() {
                Ok(()) => return server,
                Err(exit) if exit.contains("Address already in use") => continue,
                Err(exit) => panic!("{exit}"),
            }
        }
        Self::start_on(data_dir, fresh())
    }

    pub fn start_on(data_dir: &Path, addr: SocketAddr) -> TestServer {
        Self::start_with(data_dir, addr, &[])
    }

    /// A single node that can take members in (`deadbolt cluster add`): it
    /// has a cluster secret (`peer-secret` beside its data directory) for
    /// them to authenticate with.
    pub fn start_growable(data_dir: &Path, addr: SocketAddr) -> (TestServer, PathBuf) {
        Self::start_growable_with(data_dir, addr, &[])
    }

    /// Like `start_growable`, with extra `deadbolt server` flags.
    pub fn start_growable_with(
        data_dir: &Path,
        addr: SocketAddr,
        flags: &[&str],
    ) -> (TestServer, PathBuf) {
        let secret = peer_secret_beside(data_dir);
        let secret_text = secret.to_string_lossy();
        let mut all = vec!["--peer-secret-file", &secret_text];
        all.extend_from_slice(flags);
        (Self::start_with(data_dir, addr, &all), secret)
    }

    /// Like `start_on`, with extra `deadbolt server` flags.
    pub fn start_with(data_dir: &Path, addr: SocketAddr, flags: &[&str]) -> TestServer {
        let mut server = Self::spawn(data_dir, addr, flags);
        if let Err(exit) = server.wait_ready() {
            panic!("{exit}");
        }
        server
    }

    /// Like `start_on`, with extra environment variables (say, an
    /// `LD_PRELOAD` library that fails an fsync): the server once it serves,
    /// or how it exited before.
    pub fn try_start_with_env(
        data_dir: &Path,
        addr: SocketAddr,
        env: &[(&str, &Path)],
    ) -> Result<TestServer, String> {
        Self::try_start_with_flags_and_env(data_dir, addr, &[], env)
    }

    /// Like `try_start_with_env`, with extra `deadbolt server` flags.
    pub fn try_start_with_flags_and_env(
        data_dir: &Path,
        addr: SocketAddr,
        flags: &[&str],
        env: &[(&str, &Path)],
    ) -> Result<TestServer, String> {
        let mut server = Self::spawn_with_env(data_dir, addr, flags, env);
        server.wait_ready().map(|()| server)
    }

    fn spawn(data_dir: &Path, addr: SocketAddr, flags: &[&str]) -> TestServer {
        Self::spawn_with_env(data_dir, addr, flags, &[])
    }

    fn spawn_with_env(
        data_dir: &Path,
        addr: SocketAddr,
        flags: &[&str],
        env: &[(&str, &Path)],
    ) -> TestServer {
        let log = data_dir.with_extension(format!("{}.log", addr.port()));
        let child = Command::new(BIN)
            .args(["server", "--listen", &addr.to_string(), "--data-dir"])
            .arg(data_dir)
            .args(flags)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start deadbolt server");
        TestServer {
            addr,
            data_dir: data_dir.to_owned(),
            child: Some(child),
            log,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until the server is healthy; if it exits first, how it exited.
    fn wait_ready(&mut self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                return Err(format!("server exited with {status}: {}", self.log_text()));
            }
            if let Ok((200, _)) = http(self.addr, "GET", "/health", None) {
                return Ok(());
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "server not ready: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// How the server exited, if it did within `within`.
    pub fn exit_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().expect("started").try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            if started.elapsed() > within {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// kill -9: no chance to flush or say goodbye.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// SIGTERM, and the exit status of the graceful shutdown.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("server running");
        signal(child.id() as i32, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "server ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect([self.endpoint()]).await.expect("connect")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A 3- or 5-node cluster of the `deadbolt` binary under test.
pub async fn start_cluster(dir: &Path, size: u64) -> TestCluster {
    TestCluster::start(Path::new(BIN), dir, size).await
}

/// `deadbolt ARGS...` against `endpoint`, to completion.
pub fn deadbolt(endpoint: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("DEADBOLT_ENDPOINT", endpoint)
        .output()
        .expect("run deadbolt")
}

/// [`deadbolt`] for async tests: run on the blocking pool, so the runtime
/// (which may run a test cluster's proxies) keeps going.
pub async fn run(endpoint: &str, args: &[&str]) -> Output {
    let endpoint = endpoint.to_owned();
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        deadbolt(&endpoint, &args)
    })
    .await
    .expect("the command ran")
}

/// [`run`], again while it exits 69 (EX_UNAVAILABLE: try again), at most
/// three times: a membership change whose leader search outlasts an
/// election (two cores shared with the compiler can starve a 50 ms
/// heartbeat) is finished by sending it again, as an operator would.
pub async fn run_while_unreachable(endpoint: &str, args: &[&str]) -> Output {
    let mut attempts = 1;
    loop {
        let output = run(endpoint, args).await;
        if output.status.code() != Some(69) || attempts == 3 {
            return output;
        }
        attempts += 1;
        // Time for the election to end.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// POSTs JSON and parses the JSON reply.
pub fn post(addr: SocketAddr, path: &str, json: serde_json::Value) -> (u16, serde_json::Value) {
    let (status, body) = http(addr, "POST", path, Some(json.to_string().as_bytes())).unwrap();
    let value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body:?}"));
    (status, value)
}

/// `curl` as a new user would type it, with a bearer token if given; the
/// HTTP status and the JSON reply (a reply that is not JSON, such as the
/// metrics scrape, comes back as its first 200 characters in a string).
pub fn curl(
    addr: SocketAddr,
    token: Option<&str>,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    match curl_at(&format!("http://{addr}{path}"), &[], token, body) {
        (status, serde_json::Value::String(text)) => (
            status,
            serde_json::Value::String(text.chars().take(200).collect()),
        ),
        answer => answer,
    }
}

/// [`curl`] of any URL, with extra options first (TLS files, headers); a
/// reply that is not JSON comes back whole, in a string.
pub fn curl_at(
    url: &str,
    options: &[String],
    token: Option<&str>,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut command = Command::new("curl");
    command.args(["-sS", "-w", "\n%{http_code}"]).args(options);
    if let Some(token) = token {
        command.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    if let Some(body) = body {
        command.args(["-d", &body.to_string()]);
    }
    let output = command.arg(url).output().expect("curl is installed");
    let text = String::from_utf8(output.stdout).unwrap();
    let (reply, status) = text
        .rsplit_once('\n')
        .unwrap_or_else(|| panic!("{text:?} {}", String::from_utf8_lossy(&output.stderr)));
    let reply =
        serde_json::from_str(reply).unwrap_or_else(|_| serde_json::Value::String(reply.to_owned()));
    (status.parse().unwrap(), reply)
}

/// `deadbolt ARGS` with `DEADBOLT_ACCESS_TOKEN` set (or not).
pub fn as_token(endpoint: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command.args(args).env("DEADBOLT_ENDPOINT", endpoint);
    if let Some(token) = token {
        command.env("DEADBOLT_ACCESS_TOKEN", token);
    }
    command.output().expect("run deadbolt")
}

/// A command's output, which must have succeeded, trimmed.
pub fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .trim()
        .to_owned()
}

/// The log segment files of the data directory `data`, by name.
pub fn log_segments(data: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(data)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("deadbolt-log-"))
        .collect();
    names.sort();
    names
}

/// Puts the database and log of `older`, a copy of the data directory
/// `data` taken earlier, back into `data`, as a `cp` of an old copy would
/// (the witness stays as it is).
pub fn roll_back_log(older: &Path, data: &Path) {
    for name in log_segments(data) {
        std::fs::remove_file(data.join(name)).unwrap();
    }
    for name in log_segments(older)
        .into_iter()
        .chain(["deadbolt.redb".to_owned()])
    {
        std::fs::copy(older.join(&name), data.join(&name)).unwrap();
    }
}

/// A cluster secret file beside `data_dir`, made with `deadbolt peer-secret
/// new` (once; later calls return the same file).
pub fn peer_secret_beside(data_dir: &Path) -> PathBuf {
    let dir = data_dir
        .parent()
        .expect("a data directory in a temp directory");
    let path = dir.join("peer-secret");
    if path.exists() {
        return path;
    }
    deadbolt_testkit::new_peer_secret(Path::new(BIN), dir)
}

/// Waits for a fresh single node to raise its cluster version to this
/// build's newest level (it asks itself every 2 s): semaphores need it.
pub fn wait_for_newest_cluster_version(endpoint: &str) {
    let newest = format!("cluster version: {}", deadbolt_server::FeatureLevel::NEWEST);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = deadbolt(endpoint, &["cluster", "status"]);
        let said = String::from_utf8_lossy(&status.stdout);
        if said.contains(&newest) {
            return;
        }
        assert!(Instant::now() < deadline, "{said}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `deadbolt_framed_connections_total{result}` of the node at `addr`.
pub fn framed_connections(addr: SocketAddr, result: &str) -> f64 {
    let (_, metrics) = http(addr, "GET", "/metrics", None).unwrap();
    framed_connections_in(&metrics, result)
}

/// `deadbolt_framed_connections_total{result}` in a scrape of `/metrics`.
pub fn framed_connections_in(metrics: &str, result: &str) -> f64 {
    metric_in(
        metrics,
        &format!("deadbolt_framed_connections_total{{result=\"{result}\"}}"),
    )
}

/// The value of `series` (a metric's name, with its labels if it has any)
/// in the `/metrics` of the node at `addr`.
pub fn metric(addr: SocketAddr, series: &str) -> f64 {
    let (_, metrics) = http(addr, "GET", "/metrics", None).unwrap();
    metric_in(&metrics, series)
}

fn metric_in(metrics: &str, series: &str) -> f64 {
    let prefix = format!("{series} ");
    let value = metrics.lines().find_map(|line| line.strip_prefix(&prefix));
    value
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in the metrics"))
}
