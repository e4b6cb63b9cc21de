//! Test harness: real `deadbolt` processes on loopback, in temp directories.
//!
//! Nothing here imitates the server: every test talks to the binary that
//! `cargo build` produced, through the real client or raw HTTP.

#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod cluster;

use deadbolt_client::Client;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_deadbolt");

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `deadbolt server`; killed (SIGKILL) when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    pub data_dir: PathBuf,
    child: Option<Child>,
    log: PathBuf,
}

impl TestServer {
    /// Starts a server on a fresh port with its data in `data_dir`, and
    /// waits until it leads and serves.
    pub fn start(data_dir: &Path) -> TestServer {
        Self::start_on(data_dir, SocketAddr::from(([127, 0, 0, 1], free_port())))
    }

    pub fn start_on(data_dir: &Path, addr: SocketAddr) -> TestServer {
        Self::start_with(data_dir, addr, &[])
    }

    /// Like `start_on`, with extra `deadbolt server` flags.
    pub fn start_with(data_dir: &Path, addr: SocketAddr, flags: &[&str]) -> TestServer {
        let log = data_dir.with_extension(format!("{}.log", addr.port()));
        let child = Command::new(BIN)
            .args(["server", "--listen", &addr.to_string(), "--data-dir"])
            .arg(data_dir)
            .args(flags)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start deadbolt server");
        let mut server = TestServer {
            addr,
            data_dir: data_dir.to_owned(),
            child: Some(child),
            log,
        };
        server.wait_ready();
        server
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn wait_ready(&mut self) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("server exited with {status}: {}", self.log_text());
            }
            if let Ok((200, _)) = http(self.addr, "GET", "/health", None) {
                return;
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

pub fn signal(pid: i32, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(
        unsafe { libc::kill(pid, signal) },
        0,
        "kill({pid}, {signal})"
    );
}

/// `deadbolt ARGS...` against `endpoint`, to completion.
pub fn deadbolt(endpoint: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("DEADBOLT_ENDPOINT", endpoint)
        .output()
        .expect("run deadbolt")
}

/// A minimal HTTP/1.1 exchange, so tests can send exactly the bytes they
/// want (malformed JSON included). Like `curl -d`, it sends no JSON
/// Content-Type, which the server must accept. Returns status and body.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    // A server may answer (413) and close before reading a huge body.
    let _ = stream.write_all(body);
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not HTTP: {text:?}")))?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    Ok((status, body))
}

/// POSTs JSON and parses the JSON reply.
pub fn post(addr: SocketAddr, path: &str, json: serde_json::Value) -> (u16, serde_json::Value) {
    let (status, body) = http(addr, "POST", path, Some(json.to_string().as_bytes())).unwrap();
    let value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body:?}"));
    (status, value)
}
