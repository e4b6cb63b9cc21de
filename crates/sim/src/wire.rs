//! Real gRPC and framed calls over the simulated network, for the real Rust
//! client (`real_client.rs`).
//!
//! Each node incarnation serves the same tonic services `deadbolt server`
//! does ([`client_routes`]) on connections the [`Fabric`] hands it. A
//! connection is a pair of in-memory byte streams with a pump each way
//! between them, so that the bytes, like a TCP stream's, arrive in order
//! but late: each chunk waits a delay drawn from the link's quality (a lost
//! packet costs a retransmission), and waits while the node or the client
//! at either end is paused. When the node crashes the pumps stop and both
//! ends see the connection close, as a reset would close it.

use crate::network::{node_at, Fabric, Listener, Sender};
use deadbolt_client::simulation::{Connecting, Dial};
use deadbolt_proto::frames::PREFACE;
use deadbolt_server::embedded::{client_routes, Api, FramedCalls};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{
    AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf, ReadHalf, WriteHalf,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::transport::server::Connected;

/// Bytes a connection's in-memory stream buffers each way.
const STREAM_BUFFER: usize = 64 * 1024;
/// What a lost segment costs: TCP's minimum retransmission timeout.
const RETRANSMISSION: Duration = Duration::from_millis(200);
/// Connections opened to a node and not yet taken by its server, at most,
/// as `listen(2)`'s backlog bounds them: past it a connection is refused.
/// A run has one or two real clients, so it is never reached.
const LISTEN_BACKLOG: usize = 64;
/// How long a framed connection's preface and hello may take, as
/// `deadbolt server`'s `--header-read-timeout` defaults.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `api`'s client services on the connections sent to the returned
/// listener, until `crashed` turns true: framed calls on those that open
/// with their preface, as `deadbolt server`'s listener tells them apart by
/// the first byte, and gRPC on the rest.
pub fn serve(api: Api, crashed: watch::Receiver<bool>) -> Listener {
    let (listener, mut connections) = mpsc::channel::<DuplexStream>(LISTEN_BACKLOG);
    let (to_grpc, for_grpc) = mpsc::channel::<Rewound>(LISTEN_BACKLOG);
    let framed = FramedCalls::new(api.clone(), crashed.clone());
    let until_crashed = crashed.clone();
    tokio::spawn(async move {
        while let Some(mut connection) = connections.recv().await {
            let (framed, to_grpc) = (framed.clone(), to_grpc.clone());
            let mut until_crashed = until_crashed.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                if connection.read_exact(&mut first).await.is_err() {
                    return;
                }
                let connection = Rewound {
                    first: Some(first[0]),
                    connection,
                };
                if first[0] != PREFACE[0] {
                    let _ = to_grpc.send(connection).await;
                    return;
                }
                // The node's tonic server drops its connections when it
                // crashes; this is the same for framed ones.
                tokio::select! {
                    _ = until_crashed.wait_for(|crashed| *crashed) => {}
                    () = framed.serve(connection, HANDSHAKE_TIMEOUT, None) => {}
                }
            });
        }
    });
    let incoming = ReceiverStream::new(for_grpc).map(Ok::<_, io::Error>);
    let mut until_crashed = crashed.clone();
    tokio::spawn(async move {
        let crash = async move {
            let _ = until_crashed.wait_for(|crashed| *crashed).await;
        };
        let served = tonic::transport::Server::builder()
            .add_routes(client_routes(api, crashed))
            .serve_with_incoming_shutdown(incoming, crash)
            .await;
        if let Err(error) = served {
            tracing::debug!(%error, "a simulated node's gRPC service ended");
        }
    });
    listener
}

/// A connection whose first byte the dispatcher in [`serve`] has read,
/// handing it out again before the rest.
struct Rewound {
    first: Option<u8>,
    connection: DuplexStream,
}

impl AsyncRead for Rewound {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(first) = self.first.take() {
            buf.put_slice(&[first]);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.connection).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewound {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.connection).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.connection).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.connection).poll_shutdown(cx)
    }
}

impl Connected for Rewound {
    type ConnectInfo = ();

    fn connect_info(&self) {}
}

/// Dials nodes for one client, whose pauses hold its bytes back too.
pub fn dial(fabric: Arc<Fabric>, client_paused: watch::Receiver<bool>) -> Dial {
    Dial::new(move |address: String| -> Connecting {
        let (fabric, paused) = (fabric.clone(), client_paused.clone());
        Box::pin(async move { connect(fabric, paused, &address).await })
    })
}

/// Opens a connection to the node at `address` (`host:port`), after a
/// connection's worth of delay; refused if the node is down.
async fn connect(
    fabric: Arc<Fabric>,
    client_paused: watch::Receiver<bool>,
    address: &str,
) -> io::Result<DuplexStream> {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    let refused = || io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused");
    let id = node_at(host).ok_or_else(refused)?;
    tokio::time::sleep(fabric.draw_leg().0).await;
    let node = fabric.reach_node(Sender::Client, id).ok_or_else(refused)?;
    let (client_end, near) = tokio::io::duplex(STREAM_BUFFER);
    let (far, server_end) = tokio::io::duplex(STREAM_BUFFER);
    let listener = node.listener.as_ref().ok_or_else(refused)?;
    listener.try_send(server_end).map_err(|_| refused())?;
    let (near_read, near_write) = tokio::io::split(near);
    let (far_read, far_write) = tokio::io::split(far);
    for (from, to) in [(near_read, far_write), (far_read, near_write)] {
        let pump = Pump {
            fabric: fabric.clone(),
            node: id,
            client_paused: client_paused.clone(),
        };
        let mut crashed = node.crashed.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = crashed.wait_for(|crashed| *crashed) => {}
                () = pump.run(from, to) => {}
            }
        });
    }
    Ok(client_end)
}

/// Carries one direction of a connection.
struct Pump {
    fabric: Arc<Fabric>,
    node: u64,
    client_paused: watch::Receiver<bool>,
}

impl Pump {
    async fn run(mut self, mut from: ReadHalf<DuplexStream>, mut to: WriteHalf<DuplexStream>) {
        let mut chunk = vec![0; STREAM_BUFFER];
        loop {
            let read = match from.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            let (delay, lost) = self.fabric.draw_leg();
            let delay = if lost { delay + RETRANSMISSION } else { delay };
            tokio::time::sleep(delay).await;
            self.fabric.running(self.node).await;
            let _ = self.client_paused.wait_for(|paused| !*paused).await;
            if to.write_all(&chunk[..read]).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    }
}
