//! Accepting connections, with a limit on everything a client controls:
//! how many connections, how long a request's head and body may take to
//! arrive, how many HTTP/2 streams one connection may open.
//!
//! Why not `axum::serve`: it has none of these. A black-box run found 500
//! connections trickling one header byte a second never closed (0 of 500
//! after 40 s), a request declaring `Content-Length: 3000000` and sending
//! nothing held open forever, and, once the open-file limit was reached,
//! every new client locked out by the held ones. Here a connection that has
//! not sent its request head within `header_read_timeout` is closed, a body
//! that stalls for `body_read_timeout` is answered 408 (the HTTP API's
//! layer, `http.rs`; gRPC streams are long-lived by design and rely on
//! HTTP/2 keepalive pings instead), and past `max_connections` new
//! connections wait in the kernel's listen backlog (`backlog`) until one
//! ends, instead of costing a file descriptor each.

use crate::auth::peers::RemoteAddr;
use crate::frames::FramedCalls;
use crate::tls::{NodeTls, TlsClient};
use axum::Router;
use deadbolt_proto::frames::{self, PREFACE};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::Semaphore;

/// Limits on what one client can hold. Every one has a flag on
/// `deadbolt server`; the defaults suit a lock service on one machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// The kernel's queue of connections not yet accepted (capped by
    /// `net.core.somaxconn`).
    pub backlog: u32,
    /// How long a connection may take to send its first bytes, and an
    /// HTTP/1.1 request its whole head.
    pub header_read_timeout: Duration,
    /// How long an HTTP API request body may stall.
    pub body_read_timeout: Duration,
    /// Concurrent HTTP/2 streams (gRPC calls) per connection.
    pub max_streams_per_connection: u32,
    /// API calls in flight per identity, across connections (see
    /// `auth::InFlight`): one client cannot take every slot.
    pub max_calls_per_identity: usize,
}

impl ConnectionLimits {
    pub const DEFAULT: ConnectionLimits = ConnectionLimits {
        max_connections: 4096,
        backlog: 1024,
        header_read_timeout: Duration::from_secs(10),
        body_read_timeout: Duration::from_secs(10),
        max_streams_per_connection: 1024,
        max_calls_per_identity: 16_384,
    };
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// How often an idle HTTP/2 connection is pinged, and how long an answer
/// may take before the connection is closed: a peer that vanished (cable
/// pulled, VM frozen) frees its connection within about a minute.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The first byte of every TLS connection (a handshake record).
const TLS_HANDSHAKE: u8 = 0x16;

/// Answers a plain-text request on the TLS port with a plain-text error
/// that says what to do, instead of a handshake failure a person cannot
/// read, and closes the connection.
async fn refuse_plain_text(mut stream: tokio::net::TcpStream) {
    let body = r#"{"error":{"kind":"invalid_argument","message":"this Deadbolt server speaks TLS only: use https:// (with --ca, or curl --cacert)"}}"#;
    let response = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Binds `addr` with a listen backlog of `backlog`.
pub fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    // As `TcpListener::bind` does: a restarted server can take its port
    // back at once, despite connections of the last run in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// Open files a node keeps for itself besides client connections: its
/// databases, log segments and witness, peer connections, stdio, the
/// runtime's epoll and eventfds, with room to spare.
const FILES_FOR_THE_NODE: u64 = 256;

/// Raises the soft open-file limit to the hard one, and lowers
/// `max_connections` to what the limit leaves after the node's own files.
/// A black-box run with the limit at 1,024 and 2,000 connections held
/// (the default allows 4,096) saw a fresh `/health` take 2 s and one call
/// in 21 fail: accepts failed with EMFILE instead of waiting in the
/// backlog, as they do past `max_connections`. Says what it did in the log.
pub fn fit_open_file_limit(limits: ConnectionLimits) -> ConnectionLimits {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut open_files = getrlimit(Resource::Nofile);
    let Some(soft) = open_files.current else {
        return limits; // unlimited
    };
    if open_files.maximum.is_none_or(|hard| hard > soft) {
        let raised = rustix::process::Rlimit {
            current: open_files.maximum,
            maximum: open_files.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => {
                tracing::info!(
                    from = soft,
                    to = raised
                        .current
                        .map_or("unlimited".to_owned(), |n| n.to_string()),
                    "raised the open-file limit to its hard limit"
                );
                open_files = raised;
            }
            Err(err) => tracing::warn!(%err, soft, "cannot raise the open-file limit"),
        }
    }
    let Some(limit) = open_files.current else {
        return limits;
    };
    match connections_within(limits.max_connections, limit) {
        Some(fitted) => {
            tracing::warn!(
                max_connections = limits.max_connections,
                open_file_limit = limit,
                serving = fitted,
                "--max-connections is more than the open-file limit leaves after \
                 {FILES_FOR_THE_NODE} files for the node itself: serving at most {fitted} \
                 connections at once (more wait in the backlog); raise the limit (ulimit -n, \
                 systemd's LimitNOFILE=) to serve more"
            );
            ConnectionLimits {
                max_connections: fitted,
                ..limits
            }
        }
        None => limits,
    }
}

/// The connection limit that fits `open_file_limit`, if `max_connections`
/// does not: what is left after the node's own files, and at least one.
fn connections_within(max_connections: usize, open_file_limit: u64) -> Option<usize> {
    let left = open_file_limit.saturating_sub(FILES_FOR_THE_NODE).max(1);
    let left = usize::try_from(left).unwrap_or(usize::MAX);
    (max_connections > left).then_some(left)
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops
/// accepting and returns once every connection has finished (the caller
/// bounds how long that may take). A plain connection that opens with the
/// framed-calls preface is served by `framed` instead.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    framed: FramedCalls,
    limits: ConnectionLimits,
    tls: Option<Arc<NodeTls>>,
    shutdown: impl Future<Output = ()>,
) {
    assert!(
        limits.max_connections > 0,
        "max_connections must be positive"
    );
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams_per_connection)
        .keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT);
    let builder = Arc::new(builder);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        // A free slot first: past the limit, connections wait in the
        // kernel's backlog rather than in our file table.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors, or a connection reset before
                    // it was accepted: wait a moment, as hyper's own
                    // accept loop does, instead of spinning.
                    tracing::warn!(%err, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let framed = framed.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let header_read_timeout = limits.header_read_timeout;
        let tls = tls.as_ref().map(|tls| tls.acceptor());
        tokio::spawn(async move {
            // hyper reads the first bytes to tell HTTP/1.1 from HTTP/2
            // with no deadline of its own, and a TLS handshake has none
            // either.
            let mut first = [0u8; 1];
            match tokio::time::timeout(header_read_timeout, stream.peek(&mut first)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return drop(slot),
            }
            // Peer calls carry where they came from (for the peer gate's log
            // lines); over TLS every request carries who sent it.
            let remote = RemoteAddr(remote);
            match tls {
                None if first[0] == PREFACE[0] => {
                    framed.serve_tcp(stream, header_read_timeout).await;
                }
                None => {
                    let service = TowerToHyperService::new(tower::util::MapRequest::new(
                        app,
                        move |mut request: hyper::Request<hyper::body::Incoming>| {
                            remote.mark_peer_call(&mut request);
                            request
                        },
                    ));
                    let connection =
                        builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                    let _ = watcher.watch(connection.into_owned()).await;
                }
                Some(_) if first[0] != TLS_HANDSHAKE => refuse_plain_text(stream).await,
                Some(acceptor) => {
                    let accepted =
                        tokio::time::timeout(header_read_timeout, acceptor.accept(stream)).await;
                    let stream = match accepted {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(err)) => {
                            tracing::debug!(%err, "TLS handshake refused");
                            return drop(slot);
                        }
                        Err(_) => return drop(slot),
                    };
                    let client = TlsClient::from_chain(stream.get_ref().1.peer_certificates());
                    if stream.get_ref().1.alpn_protocol() == Some(frames::ALPN) {
                        framed.serve_tls(stream, header_read_timeout, client).await;
                        return drop(slot);
                    }
                    let service = TowerToHyperService::new(tower::util::MapRequest::new(
                        app,
                        move |mut request: hyper::Request<hyper::body::Incoming>| {
                            remote.mark_peer_call(&mut request);
                            request.extensions_mut().insert(client.clone());
                            request
                        },
                    ));
                    let connection =
                        builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                    let _ = watcher.watch(connection.into_owned()).await;
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    // Framed connections end by themselves once the server stops (see
    // `CallStream`); each holds its slot until then.
    let every_slot = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(every_slot).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_limit_fits_what_the_open_file_limit_leaves() {
        // The black-box run's machine: 1,024 open files, the default 4,096.
        assert_eq!(connections_within(4096, 1024), Some(768));
        assert_eq!(connections_within(500, 1024), None);
        assert_eq!(connections_within(768, 1024), None);
        assert_eq!(connections_within(4096, 1_048_576), None);
        // A limit below the node's own needs still serves one.
        assert_eq!(connections_within(4096, 100), Some(1));
    }
}
