//! [`FramedCalls`]: serves the framed form of the `Calls` stream
//! (`deadbolt_proto::frames`) on plain connections to the client port.
//!
//! Why a second way in: over HTTP/2 each call's request and answer go
//! through h2's frames, flow-control windows and a task per stream; that
//! transport alone cost a one-thread server 12.6-15.6 µs of CPU per
//! message, against 7.1-9.2 for length-prefixed frames
//! (`scripts/transport-floor.sh`). Here one task per connection reads the
//! requests, runs them through the same [`CallStream`] as the gRPC stream
//! (so the two answer alike, with the same bounds and the same access
//! checks), and writes every answer that is ready with one write.
//!
//! Only the leader serves framed calls: a follower forwards gRPC calls to
//! its leader (`forward.rs`) but not these, so it refuses them in its
//! welcome and the client goes on over gRPC. A plain connection asks for
//! them with the preface's first byte; a TLS one by ALPN (`tls.rs`), with
//! the preface and frames inside, and the client's certificate naming the
//! caller as on any TLS call.
//!
//! Bounded like any connection of the listener (its slot, the handshake's
//! deadline), and a client that vanished is found by TCP keepalive, as
//! HTTP/2 pings find one on the gRPC stream.

use crate::api::Api;
use crate::auth::Credentials;
use crate::calls::CallStream;
use crate::tls::TlsClient;
use deadbolt_proto::frames::{FrameCodec, PREFACE};
use deadbolt_proto::v1::call_response::Result as Answer;
use deadbolt_proto::v1::{CallError, CallRequest, CallResponse, CallsHello, CallsWelcome};
use deadbolt_proto::ErrorKind;
use futures::{SinkExt, Stream, StreamExt};
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Encoder, FramedRead, FramedWrite};
use tonic::Status;

/// How long a connection may sit idle before the kernel probes it, how
/// often it probes, and how many probes may go unanswered: a vanished
/// client frees its connection within about a minute, as HTTP/2 pings free
/// a gRPC one (`listener.rs`).
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 3;

/// Answers gathered into one write, at most: the write buffer stays
/// small however many calls finish together.
const MAX_WRITE_BYTES: usize = 64 * 1024;

/// Serves framed calls, as the gRPC service serves the `Calls` stream.
#[derive(Clone)]
pub struct FramedCalls {
    api: Api,
    /// Turns true when the server begins to shut down.
    stopping: watch::Receiver<bool>,
}

impl FramedCalls {
    pub fn new(api: Api, stopping: watch::Receiver<bool>) -> Self {
        FramedCalls { api, stopping }
    }

    /// Serves one TCP connection whose first byte was the preface's, until
    /// the client is done or the server stops. `handshake_timeout` bounds
    /// the preface and the hello, as it bounds an HTTP request's head.
    pub async fn serve_tcp(self, socket: TcpStream, handshake_timeout: Duration) {
        keep_alive(&socket);
        self.serve(socket, handshake_timeout, None).await;
    }

    /// [`serve_tcp`](Self::serve_tcp) over TLS, with the certificate the
    /// client showed.
    pub async fn serve_tls(
        self,
        stream: TlsStream<TcpStream>,
        handshake_timeout: Duration,
        client: TlsClient,
    ) {
        keep_alive(stream.get_ref().0);
        self.serve(stream, handshake_timeout, Some(client)).await;
    }

    /// [`serve_tcp`](Self::serve_tcp) on any byte stream (`tls`: the
    /// certificate a TLS client showed): the simulation's connections are
    /// in memory.
    pub async fn serve(
        self,
        connection: impl AsyncRead + AsyncWrite + Send + 'static,
        handshake_timeout: Duration,
        tls: Option<TlsClient>,
    ) {
        let (mut reader, writer) = tokio::io::split(connection);
        let handshake = async {
            let mut preface = [0u8; PREFACE.len()];
            reader.read_exact(&mut preface).await?;
            if preface != PREFACE {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "not the framed-calls preface",
                ));
            }
            let mut hellos = FramedRead::new(reader, FrameCodec::<(), CallsHello>::new());
            let hello = hellos.next().await.ok_or(io::ErrorKind::UnexpectedEof)??;
            Ok((hellos, hello))
        };
        let (hellos, hello) = match tokio::time::timeout(handshake_timeout, handshake).await {
            Ok(Ok(handshake)) => handshake,
            Ok(Err(err)) => return tracing::debug!(%err, "framed-calls handshake refused"),
            Err(_) => return,
        };
        let mut welcomes = FramedWrite::new(writer, FrameCodec::<CallsWelcome, ()>::new());
        let refused = self.api.welcome_framed_calls().err();
        let welcome = CallsWelcome {
            refused: refused.clone().map(CallError::from),
        };
        if welcomes.send(welcome).await.is_err() || refused.is_some() {
            return;
        }
        let authorization = (!hello.authorization.is_empty()).then_some(&hello.authorization);
        let authorization = authorization.map(|value| value.as_bytes());
        let credentials = Credentials::new(authorization, tls.as_ref());
        // The end of the requests is the client gone (a killed process's
        // connection ends as a clean close does): its calls in flight are
        // abandoned, as a reset HTTP/2 stream abandons a `Calls` stream's,
        // and not left to hold their locks and its in-flight slots until
        // they time out. (A regression: `acl.rs`'s slots that came back
        // only when the killed waiters' 60 s waits ran out.) A stream's
        // items are tonic's own `Result<_, Status>`, as on the gRPC stream.
        #[allow(clippy::result_large_err)]
        let requests = hellos
            .map_decoder(|_| FrameCodec::<(), CallRequest>::new())
            .map(|request| request.map_err(read_failure))
            .chain(futures::stream::once(async {
                Err(Status::cancelled("the client closed the connection"))
            }));
        let calls = CallStream::new(self.api, credentials, requests, self.stopping);
        let mut writer = welcomes.into_inner();
        if let Err(err) = answer(calls, &mut writer).await {
            tracing::debug!(%err, "framed-calls connection failed");
        }
        let _ = writer.shutdown().await;
    }
}

fn keep_alive(socket: &TcpStream) {
    use rustix::net::sockopt;
    let set = sockopt::set_socket_keepalive(socket, true)
        .and_then(|()| sockopt::set_tcp_keepidle(socket, KEEPALIVE_IDLE))
        .and_then(|()| sockopt::set_tcp_keepintvl(socket, KEEPALIVE_INTERVAL))
        .and_then(|()| sockopt::set_tcp_keepcnt(socket, KEEPALIVE_PROBES));
    if let Err(err) = set {
        tracing::debug!(%err, "cannot turn TCP keepalive on");
    }
}

/// Why reading requests failed, as the stream's status: a frame that does
/// not decode (or is over the limit) is the caller's fault, as an
/// undecodable message on the gRPC stream is (`calls.rs`).
fn read_failure(err: io::Error) -> Status {
    match err.kind() {
        io::ErrorKind::InvalidData => {
            ErrorKind::InvalidArgument.status(format!("a call frame that does not decode: {err}"))
        }
        _ => Status::unavailable(format!("reading the connection failed: {err}")),
    }
}

/// Writes the stream's answers, each write carrying every answer that was
/// ready, until it ends. A stream that ends with an error sends it last,
/// as the answer to id 0.
async fn answer(mut calls: CallStream, writer: &mut (impl AsyncWrite + Unpin)) -> io::Result<()> {
    let mut codec = FrameCodec::<CallResponse, ()>::new();
    let mut ready = BytesMut::with_capacity(8 * 1024);
    loop {
        let ended = poll_fn(|cx| gather(Pin::new(&mut calls), &mut codec, &mut ready, cx)).await?;
        writer.write_all_buf(&mut ready).await?;
        if ended {
            return Ok(());
        }
    }
}

/// Encodes the answers that are ready into `ready`: ready once at least
/// one is there and no more are (or [`MAX_WRITE_BYTES`] are), or the
/// stream has ended (`true`).
fn gather(
    mut calls: Pin<&mut CallStream>,
    codec: &mut FrameCodec<CallResponse, ()>,
    ready: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<bool>> {
    while ready.len() < MAX_WRITE_BYTES {
        let answer = match calls.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(answer))) => answer,
            Poll::Ready(Some(Err(status))) => {
                let error = CallError {
                    kind: ErrorKind::of_status(&status).as_str().to_owned(),
                    message: status.message().to_owned(),
                    leader: None,
                };
                let last = CallResponse {
                    id: 0,
                    result: Some(Answer::Error(error)),
                };
                codec.encode(last, ready)?;
                return Poll::Ready(Ok(true));
            }
            Poll::Ready(None) => return Poll::Ready(Ok(true)),
            Poll::Pending if ready.is_empty() => return Poll::Pending,
            Poll::Pending => break,
        };
        codec.encode(answer, ready)?;
    }
    Poll::Ready(Ok(false))
}
