//! Test kit: real `deadbolt` server processes on loopback, and a network
//! between them that can be cut.
//!
//! Shared by the end-to-end tests (`crates/cli/tests`) and the fault
//! injection suite (`crates/nemesis`). Nothing here imitates a server: every
//! node is the real binary, started as a process, killed with real signals.

pub mod cluster;
pub mod peers;
pub mod pki;

pub use cluster::{new_peer_secret, ClusterNode, TestCluster};
pub use pki::TestPki;

use rand::Rng;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::Duration;

/// A port nobody listens on right now, for a server to bind a moment later
/// (and again after each restart).
///
/// Not one the kernel picks (`bind` to port 0): those come from its
/// ephemeral range, which every other `bind(0)` and every outgoing
/// connection draws on too, so the port could be taken before the server
/// binds it, or while a node is down between two runs on it. A CI run lost
/// a server that way ("cannot listen on 127.0.0.1:32919: Address already in
/// use"). Below that range a port is only taken by someone choosing it, as
/// this does, at random among about 20,000.
///
/// Never the same port twice in one process: two nodes starting at once
/// could both be handed a port neither had bound yet; the second then
/// fails to bind, and its proxy forwards to the first, so a leader's
/// appends to it came back to the leader itself (suspected in a CI run
/// where a fresh cluster's first leader hit openraft's assertion that a
/// node taking appends has no leader role).
pub fn free_port() -> u16 {
    const FIRST: u16 = 10_000;
    const ATTEMPTS: usize = 64;
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    let ephemeral_from = ephemeral_range_start().unwrap_or(32_768);
    if ephemeral_from > FIRST + 1_000 {
        for _ in 0..ATTEMPTS {
            let port = rand::thread_rng().gen_range(FIRST..ephemeral_from);
            if !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                handed_out.insert(port);
                return port;
            }
        }
    }
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if handed_out.insert(port) {
            return port;
        }
    }
}

/// The first port of the kernel's ephemeral range (Linux).
fn ephemeral_range_start() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

pub fn signal(pid: i32, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(
        unsafe { libc::kill(pid, signal) },
        0,
        "kill({pid}, {signal})"
    );
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
    parse_response(&response)
}

/// Status and body of an HTTP/1.1 response read to its end.
fn parse_response(response: &[u8]) -> std::io::Result<(u16, String)> {
    let text = String::from_utf8_lossy(response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not HTTP: {text:?}")))?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    Ok((status, body))
}

/// Builds the `LD_PRELOAD` library of `c/failsync.c` into `dir` and returns
/// its path: in a process started with it, once the file its
/// `FAILSYNC_TRIGGER` names exists holding a number N, the next N fsync and
/// fdatasync calls succeed and the one after fails with EIO; only that one.
pub fn failsync_library(dir: &std::path::Path) -> std::path::PathBuf {
    preload_library(dir, "failsync")
}

/// Builds the `LD_PRELOAD` library of `c/fulldisk.c` into `dir` and returns
/// its path: in a process started with it, while the file its
/// `FULLDISK_TRIGGER` names exists, holding a directory's path, every write
/// to a file under that directory fails with ENOSPC.
pub fn fulldisk_library(dir: &std::path::Path) -> std::path::PathBuf {
    preload_library(dir, "fulldisk")
}

/// Builds `c/NAME.c` into `dir` as `libNAME.so` with the system's C compiler
/// (the one Rust links with).
fn preload_library(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("c/{name}.c"));
    let library = dir.join(format!("lib{name}.so"));
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .output()
        .expect("run cc (the C compiler Rust links with)");
    assert!(out.status.success(), "cc {name}.c: {out:?}");
    library
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_is_free_and_not_one_the_kernel_hands_out() {
        let ports: Vec<u16> = (0..8).map(|_| free_port()).collect();
        for port in &ports {
            assert!(*port < ephemeral_range_start().unwrap(), "{ports:?}");
            TcpListener::bind(("127.0.0.1", *port)).unwrap();
        }
        // Chosen at random, not the same one every time.
        assert!(ports.windows(2).any(|pair| pair[0] != pair[1]), "{ports:?}");
    }
}
