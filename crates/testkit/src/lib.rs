//! Test kit: real `deadbolt` server processes on loopback, and a network
//! between them that can be cut.
//!
//! Shared by the end-to-end tests (`crates/cli/tests`) and the fault
//! injection suite (`crates/nemesis`). Nothing here imitates a server: every
//! node is the real binary, started as a process, killed with real signals.

pub mod cluster;
pub mod peers;
pub mod pki;

pub use cluster::{ClusterNode, TestCluster};
pub use pki::TestPki;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
