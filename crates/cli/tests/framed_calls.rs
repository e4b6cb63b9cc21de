//! Framed calls (docs/framed-calls.md), spoken byte by byte as a client in
//! another language would speak them, to a real server: the handshake,
//! calls answered by id as on the gRPC `Calls` stream, the caller's token
//! from the hello, and a bad frame ending the connection with a reason.
//! A follower refuses them, and so does an HTTP proxy between, and the
//! Rust client goes on over gRPC. (Every other test's Rust client speaks
//! framed calls.)

mod common;

use common::{curl, deadbolt, framed_connections, stdout, TestServer};
use deadbolt_client::{Client, SessionHandle};
use deadbolt_proto::frames::{MAX_FRAME_BYTES, PREFACE};
use deadbolt_proto::v1::call_request::Call;
use deadbolt_proto::v1::call_response::Result as Answer;
use deadbolt_proto::v1::{
    AcquireRequest, CallRequest, CallResponse, CallsHello, CallsWelcome, ReleaseRequest,
};
use deadbolt_testkit::pki::TestPki;
use prost::Message;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A framed-calls connection, after the welcome.
struct Framed {
    stream: TcpStream,
}

impl Framed {
    /// Opens one to the server at `addr`, with `token` in the hello; the
    /// welcome.
    fn open(addr: SocketAddr, token: Option<&str>) -> (Framed, CallsWelcome) {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut framed = Framed { stream };
        framed.stream.write_all(PREFACE).unwrap();
        let authorization = token.map_or(String::new(), |token| format!("Bearer {token}"));
        framed.send(&CallsHello { authorization });
        let welcome = CallsWelcome::decode(framed.receive().unwrap().as_slice()).unwrap();
        (framed, welcome)
    }

    fn send(&mut self, message: &impl Message) {
        let body = message.encode_to_vec();
        self.send_raw(&body);
    }

    fn send_raw(&mut self, body: &[u8]) {
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend(body);
        self.stream.write_all(&frame).unwrap();
    }

    /// The next frame's body; `None` once the server has closed.
    fn receive(&mut self) -> Option<Vec<u8>> {
        let mut length = [0u8; 4];
        self.stream.read_exact(&mut length).ok()?;
        let mut body = vec![0; u32::from_be_bytes(length) as usize];
        self.stream.read_exact(&mut body).unwrap();
        Some(body)
    }

    fn answer(&mut self) -> CallResponse {
        let frame = self.receive().expect("the server closed the connection");
        CallResponse::decode(frame.as_slice()).unwrap()
    }

    fn call(&mut self, id: u64, call: Call) -> Answer {
        self.send(&CallRequest {
            id,
            call: Some(call),
        });
        let answer = self.answer();
        assert_eq!(answer.id, id, "{answer:?}");
        answer.result.expect("an answer has a result")
    }
}

/// A session opened over HTTP: (id, secret).
fn open_session(server: &TestServer, token: Option<&str>) -> (u64, String) {
    let (status, body) = curl(
        server.addr,
        token,
        "/v1/session/open",
        Some(&json!({"ttl_ms": 30_000})),
    );
    assert_eq!(status, 200, "{body}");
    let id = body["session_id"].as_u64().unwrap();
    (id, body["session_secret"].as_str().unwrap().to_owned())
}

fn acquire(session: &(u64, String), lock: &str) -> Call {
    Call::Acquire(AcquireRequest {
        session_id: session.0,
        session_secret: session.1.clone(),
        lock: lock.to_owned(),
        attempt: 1,
        ..AcquireRequest::default()
    })
}

#[test]
fn calls_are_answered_by_id_as_on_the_calls_stream() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let (mut framed, welcome) = Framed::open(server.addr, None);
    assert_eq!(welcome.refused, None);
    let (holder, waiter) = (open_session(&server, None), open_session(&server, None));

    let Answer::Acquire(granted) = framed.call(1, acquire(&holder, "job")) else {
        panic!("not granted");
    };
    assert!(granted.token > 0);
    // Taken: refused by id, with the unary call's error kind.
    let Answer::Error(busy) = framed.call(2, acquire(&waiter, "job")) else {
        panic!("a held lock was granted twice");
    };
    assert_eq!(busy.kind, "busy", "{busy:?}");
    let release = Call::Release(ReleaseRequest {
        session_id: holder.0,
        session_secret: holder.1.clone(),
        lock: "job".to_owned(),
        token: granted.token,
    });
    assert!(matches!(framed.call(3, release), Answer::Release(_)));
    let Answer::Acquire(next) = framed.call(4, acquire(&waiter, "job")) else {
        panic!("not granted after the release");
    };
    assert!(next.token > granted.token);

    // The same lock, seen over HTTP: the framed grant is the server's own.
    let (_, status) = curl(server.addr, None, "/v1/lock/status?lock=job", None);
    assert_eq!(status["state"]["token"], json!(next.token), "{status}");
    assert_eq!(framed_connections(server.addr, "served"), 1.0);
}

#[test]
fn a_frame_that_does_not_decode_ends_the_connection_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));

    let (mut garbled, _) = Framed::open(server.addr, None);
    garbled.send_raw(&[0xff; 7]);
    let last = garbled.answer();
    let Some(Answer::Error(error)) = last.result else {
        panic!("{last:?}");
    };
    assert_eq!((last.id, error.kind.as_str()), (0, "invalid_argument"));
    assert!(error.message.contains("does not decode"), "{error:?}");
    assert_eq!(garbled.receive(), None, "the connection stayed open");

    // A length over the limit is refused before its bytes arrive.
    let (mut oversized, _) = Framed::open(server.addr, None);
    let length = (MAX_FRAME_BYTES as u32 + 1).to_be_bytes();
    oversized.stream.write_all(&length).unwrap();
    let last = oversized.answer();
    assert!(
        matches!(&last.result, Some(Answer::Error(error)) if error.kind == "invalid_argument"),
        "{last:?}"
    );
    assert_eq!(oversized.receive(), None, "the connection stayed open");

    // Neither took the server down.
    let (mut framed, _) = Framed::open(server.addr, None);
    let session = open_session(&server, None);
    assert!(matches!(
        framed.call(1, acquire(&session, "after")),
        Answer::Acquire(_)
    ));
}

#[test]
fn with_access_control_on_every_call_runs_as_the_hello_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let root = stdout(&deadbolt(&server.endpoint(), &["acl", "bootstrap"]));
    let session = open_session(&server, Some(&root));

    let (mut anonymous, _) = Framed::open(server.addr, None);
    let Answer::Error(refused) = anonymous.call(1, acquire(&session, "guarded")) else {
        panic!("an anonymous framed call was served with access control on");
    };
    assert_eq!(refused.kind, "unauthenticated", "{refused:?}");

    let (mut as_root, _) = Framed::open(server.addr, Some(&root));
    assert!(matches!(
        as_root.call(1, acquire(&session, "guarded")),
        Answer::Acquire(_)
    ));
    let (_, status) = curl(
        server.addr,
        Some(&root),
        "/v1/lock/status?lock=guarded",
        None,
    );
    assert_eq!(status["state"]["holder_session_id"], Value::from(session.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_refuses_framed_calls_and_the_client_goes_on_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::start_cluster(dir.path(), 3).await;
    let leader = cluster.leader_within(Duration::from_secs(10)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();

    let (_, welcome) = Framed::open(cluster.node(follower).listen, None);
    let refused = welcome.refused.expect("a follower welcomed framed calls");
    assert_eq!(refused.kind, "not_leader", "{refused:?}");
    let leader_address = cluster.node(leader).advertised.to_string();
    assert_eq!(refused.leader, Some(leader_address), "{refused:?}");
    let (_, welcome) = Framed::open(cluster.node(leader).listen, None);
    assert_eq!(welcome.refused, None);

    // A keepalive is the client's first call here, so it goes to the
    // follower as framed calls, is turned away, and goes over the gRPC
    // stream, which the follower forwards.
    let at_leader = Client::connect([cluster.node(leader).endpoint()])
        .await
        .unwrap();
    let (session, _) = at_leader
        .open_session_raw(Duration::from_secs(30))
        .await
        .unwrap();
    let at_follower = Client::connect([cluster.node(follower).endpoint()])
        .await
        .unwrap();
    let handle = SessionHandle::new(session.id(), session.secret());
    let ttl = at_follower.keep_alive_raw(&handle).await.unwrap();
    assert_eq!(ttl, Duration::from_secs(30));
    let refusals = framed_connections(cluster.node(follower).listen, "refused");
    assert!(refusals >= 2.0, "{refusals} refusals");
}

/// Over TLS the client asks for framed calls by ALPN, and the name on its
/// certificate is the caller, as on gRPC: the session it opened over gRPC
/// is its own, so a framed call on it from anyone else would be refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mutual_tls_framed_calls_run_as_the_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::create(Path::new(common::BIN), &dir.path().join("certs"), "alice");
    let addr = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let _server = ChildGuard(
        Command::new(common::BIN)
            .args(["server", "--listen", &addr.to_string(), "--data-dir"])
            .arg(dir.path().join("data"))
            .args(pki.server_flags())
            .stderr(std::fs::File::create(dir.path().join("server.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    while !matches!(pki.get(addr, "/health"), Ok((200, _))) {
        assert!(started.elapsed() < Duration::from_secs(20), "no TLS server");
        std::thread::sleep(Duration::from_millis(20));
    }

    let client = Client::connect_with(
        [format!("https://127.0.0.1:{}", addr.port())],
        &pki.tls_options(),
    )
    .await
    .unwrap();
    let session = client.open_session(Duration::from_secs(30)).await.unwrap();
    let first = session.lock("over-tls").await.unwrap();
    let token = first.token();
    first.release().await.unwrap();
    let second = session.lock("over-tls").await.unwrap();
    assert!(second.token() > token);

    let (_, metrics) = pki.get(addr, "/metrics").unwrap();
    let served = common::framed_connections_in(&metrics, "served");
    assert!(served >= 1.0, "{served} framed connections served over TLS");
}

/// Kills a child process when dropped.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Behind an HTTP/2 proxy (haproxy in `mode http`), the preface reaches no
/// Deadbolt server: the proxy answers it as a bad HTTP request, and the
/// client takes and gives back its lock over the gRPC stream the proxy
/// passes on, at once rather than after the 3 s it gives a silent server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_an_http_proxy_the_client_goes_on_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let Some(proxy) = deadbolt_testkit::peers::haproxy_http(server.addr) else {
        return;
    };
    let client = Client::connect([format!("http://{}", proxy.address())])
        .await
        .unwrap();
    let session = client.open_session(Duration::from_secs(30)).await.unwrap();
    // A client that waited for a welcome gives up after exactly 3 s
    // (`CONNECT_TIMEOUT`): well under that means the proxy's answer ended
    // the wait.
    let started = Instant::now();
    let guard = session.lock("through-a-proxy").await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "the fallback waited {:?}",
        started.elapsed()
    );
    let token = guard.token();
    guard.release().await.unwrap();
    assert!(session.lock("through-a-proxy").await.unwrap().token() > token);
    assert_eq!(framed_connections(server.addr, "served"), 0.0);
}
