//! Framed calls (`deadbolt_proto::frames`): the `Calls` stream's messages
//! on a plain TCP connection of their own, the cheaper way to a server that
//! speaks them (see `deadbolt_server`'s `frames` module for the measured
//! reason). [`Calls`](crate::calls::Calls) opens one when it can, and the
//! gRPC stream otherwise.
//!
//! When: always (to `https://` endpoints, over TLS with the same CA and
//! client certificate, asked for by ALPN), unless turned off
//! ([`Client::prefer_grpc_calls`](crate::Client::prefer_grpc_calls)).
//! A server that does not answer the preface with a welcome (a release
//! without framed calls, a proxy that passes only HTTP), or a follower that
//! refuses it, gets the gRPC stream instead, and no further framed attempt
//! until the client moves to another endpoint.

use crate::simulation::Dial;
use deadbolt_proto::frames::{FrameCodec, ALPN, PREFACE};
use deadbolt_proto::v1::call_response::Result as Answer;
use deadbolt_proto::v1::{CallRequest, CallResponse, CallsHello, CallsWelcome};
use deadbolt_proto::woken::WokenOnly;
use futures::{SinkExt, StreamExt};
use std::fmt;
use std::future::{poll_fn, Future};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Encoder, FramedRead, FramedWrite};
use tonic::Status;

/// Requests written together, at most: what one `recv_many` takes.
const MAX_REQUESTS_PER_WRITE: usize = 64;

/// When a client opens framed calls rather than the gRPC stream.
#[derive(Debug)]
pub(crate) struct Framing {
    /// Off after `prefer_grpc_calls`.
    enabled: AtomicBool,
    /// What the client's gRPC calls carry in `authorization`, if anything.
    authorization: String,
    /// The simulation's network, if connections go through it.
    dial: Option<Dial>,
    /// For `https://` endpoints.
    tls: Option<Arc<FramedTls>>,
}

impl Framing {
    pub(crate) fn new(
        authorization: Option<&str>,
        dial: Option<Dial>,
        tls: Option<Arc<FramedTls>>,
    ) -> Framing {
        Framing {
            enabled: AtomicBool::new(true),
            authorization: authorization.unwrap_or_default().to_owned(),
            dial,
            tls,
        }
    }

    pub(crate) fn turn_off(&self) {
        self.enabled.store(false, Ordering::Relaxed);
    }

    /// Where to open framed calls for the endpoint at `address`, unless it
    /// refused them before, or they are off.
    pub(crate) fn target(&self, address: &str, refused: &Arc<AtomicBool>) -> Option<FramedTarget> {
        let (scheme, authority) = address.split_once("://")?;
        let tls = match scheme {
            "https" => Some(self.tls.clone()?),
            _ => None,
        };
        let on = self.enabled.load(Ordering::Relaxed) && !refused.load(Ordering::Relaxed);
        on.then(|| FramedTarget {
            address: authority.to_owned(),
            authorization: self.authorization.clone(),
            refused: refused.clone(),
            dial: self.dial.clone(),
            tls,
        })
    }
}

/// Where to open framed calls, and as whom.
#[derive(Debug, Clone)]
pub(crate) struct FramedTarget {
    /// `host:port`.
    pub(crate) address: String,
    /// The `authorization` value every call carries ("Bearer ..."), if any.
    authorization: String,
    /// Set once the endpoint turned framed calls away: later streams to it
    /// go over gRPC at once.
    refused: Arc<AtomicBool>,
    dial: Option<Dial>,
    tls: Option<Arc<FramedTls>>,
}

/// rustls's settings for framed calls over TLS.
pub(crate) type FramedTls = ClientConfig;

/// The settings for framed calls to `https://` endpoints: the CA that
/// signed the servers' certificates and, for mutual TLS, this client's
/// certificate and key (PEM), as for gRPC; and the ALPN id that asks for
/// framed calls. `None` if rustls cannot use them: gRPC, which reads the
/// same files, then says what is wrong.
pub(crate) fn tls_config(ca: &[u8], identity: Option<(&[u8], &[u8])>) -> Option<Arc<FramedTls>> {
    let mut roots = RootCertStore::empty();
    for ca in rustls_pemfile::certs(&mut &ca[..]) {
        roots.add(ca.ok()?).ok()?;
    }
    let builder = ClientConfig::builder().with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((chain, key)) => {
            let chain = rustls_pemfile::certs(&mut &chain[..]).collect::<Result<Vec<_>, _>>();
            let key = rustls_pemfile::private_key(&mut &key[..]).ok()??;
            builder.with_client_auth_cert(chain.ok()?, key).ok()?
        }
    };
    config.alpn_protocols = vec![ALPN.to_vec()];
    Some(Arc::new(config))
}

/// A connection's bytes: TCP, or the simulation's in-memory stream.
trait Connection: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Connection for T {}
type AnyConnection = Box<dyn Connection>;

/// Why framed calls could not be opened.
#[derive(Debug)]
pub(crate) enum NotFramed {
    /// The connection could not be made: gRPC will say why.
    Unreachable(io::Error),
    /// The server answered, but not with a welcome: the endpoint is marked.
    Refused(String),
}

impl fmt::Display for NotFramed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotFramed::Unreachable(err) => write!(f, "cannot connect: {err}"),
            NotFramed::Refused(why) => f.write_str(why),
        }
    }
}

/// An open framed connection, welcomed.
pub(crate) struct FramedConnection {
    answers: FramedRead<ReadHalf<AnyConnection>, FrameCodec<(), CallResponse>>,
    requests: FramedWrite<WriteHalf<AnyConnection>, FrameCodec<CallRequest, ()>>,
}

impl FramedTarget {
    /// Connects, sends the preface and the hello, and waits for the welcome,
    /// within `timeout` in all.
    pub(crate) async fn open(&self, timeout: Duration) -> Result<FramedConnection, NotFramed> {
        let socket = tokio::time::timeout(timeout, self.connect())
            .await
            .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()))
            .map_err(NotFramed::Unreachable)?;
        let handshake = async { self.handshake(self.secure(socket).await?).await };
        let opened = tokio::time::timeout(timeout, handshake).await;
        let refused = match opened {
            Ok(Ok(Ok(connection))) => return Ok(connection),
            Ok(Ok(Err(refusal))) => refusal,
            Ok(Err(err)) => format!("the server does not speak framed calls: {err}"),
            Err(_) => format!("no welcome to framed calls within {timeout:?}"),
        };
        self.refused.store(true, Ordering::Relaxed);
        Err(NotFramed::Refused(refused))
    }

    async fn connect(&self) -> io::Result<AnyConnection> {
        if let Some(dial) = &self.dial {
            return Ok(Box::new(dial.connect(self.address.clone()).await?));
        }
        let socket = TcpStream::connect(&self.address).await?;
        socket.set_nodelay(true)?;
        Ok(Box::new(socket))
    }

    /// `socket` under TLS, for an `https://` endpoint: a server that does
    /// not agree to framed calls' ALPN id fails the handshake.
    async fn secure(&self, socket: AnyConnection) -> io::Result<AnyConnection> {
        let Some(tls) = &self.tls else {
            return Ok(socket);
        };
        let authority: http::uri::Authority = self.address.parse().map_err(io::Error::other)?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = ServerName::try_from(host.to_owned()).map_err(io::Error::other)?;
        let stream = TlsConnector::from(tls.clone())
            .connect(name, socket)
            .await?;
        if stream.get_ref().1.alpn_protocol() != Some(ALPN) {
            return Err(io::Error::other("the server did not agree to framed calls"));
        }
        Ok(Box::new(stream))
    }

    /// The handshake on `socket`: the welcome, or the server's refusal.
    async fn handshake(
        &self,
        socket: AnyConnection,
    ) -> io::Result<Result<FramedConnection, String>> {
        let (reader, mut writer) = tokio::io::split(socket);
        let mut hello = BytesMut::from(PREFACE);
        let authorization = self.authorization.clone();
        FrameCodec::<CallsHello, ()>::new().encode(CallsHello { authorization }, &mut hello)?;
        writer.write_all(&hello).await?;
        let mut welcomes = FramedRead::new(reader, FrameCodec::<(), CallsWelcome>::new());
        let welcome = welcomes
            .next()
            .await
            .ok_or(io::ErrorKind::UnexpectedEof)??;
        if let Some(refused) = welcome.refused {
            return Ok(Err(refused.message));
        }
        Ok(Ok(FramedConnection {
            answers: welcomes.map_decoder(|_| FrameCodec::new()),
            requests: FramedWrite::new(writer, FrameCodec::new()),
        }))
    }
}

impl FramedConnection {
    /// Sends what `outgoing` carries, each write taking every request
    /// waiting, and hands each answer to `deliver`, until the connection
    /// ends; says why it did. Once every sender is gone (and so no call is
    /// in flight, as each holds one) the connection is closed.
    pub(crate) async fn run(
        self,
        mut outgoing: mpsc::Receiver<CallRequest>,
        mut deliver: impl FnMut(u64, Option<Answer>),
    ) -> Status {
        let FramedConnection {
            mut answers,
            mut requests,
        } = self;
        let send = async {
            let mut batch = Vec::with_capacity(MAX_REQUESTS_PER_WRITE);
            while outgoing.recv_many(&mut batch, MAX_REQUESTS_PER_WRITE).await > 0 {
                for request in batch.drain(..) {
                    requests.feed(request).await?;
                }
                requests.flush().await?;
            }
            requests.close().await
        };
        let receive = async {
            loop {
                match answers.next().await {
                    // The server's last word: why it ended the connection.
                    Some(Ok(CallResponse {
                        id: 0,
                        result: Some(Answer::Error(error)),
                    })) => return error.into_status(),
                    Some(Ok(CallResponse { id, result })) => deliver(id, result),
                    Some(Err(err)) => {
                        return Status::unavailable(format!("the call connection failed: {err}"))
                    }
                    None => return Status::unavailable("the server closed the call stream"),
                }
            }
        };
        tokio::pin!(send, receive);
        // Each is polled only when it woke the task: a request queued by a
        // caller does not read the socket, nor an answer the queue.
        let (send_woken, receive_woken) = (WokenOnly::new(), WokenOnly::new());
        let mut sending = true;
        poll_fn(|cx| {
            if sending {
                if let Poll::Ready(sent) = send_woken.poll(cx, |cx| send.as_mut().poll(cx)) {
                    if let Err(err) = sent {
                        let failed = format!("the call connection failed: {err}");
                        return Poll::Ready(Status::unavailable(failed));
                    }
                    sending = false;
                }
            }
            receive_woken.poll(cx, |cx| receive.as_mut().poll(cx))
        })
        .await
    }
}
