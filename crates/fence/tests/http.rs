//! `FencingLayer` in a real axum server on 127.0.0.1, driven by real HTTP/1.1
//! requests: what each kind of request gets back, and whether the handler ran.

#![cfg(feature = "http")]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::put;
use axum::{Extension, Router};
use deadbolt_fence::http::{FencingLayer, FencingToken};
use deadbolt_fence::FenceGate;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// What the handlers share: how often they ran, and a switch that holds the
/// `/slow` handler until the test releases it.
#[derive(Clone, Default)]
struct Handlers {
    runs: Arc<AtomicUsize>,
    release_slow: Arc<Notify>,
}

impl Handlers {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

/// Echoes the token the layer admitted, or "none".
async fn write(State(handlers): State<Handlers>, token: Option<Extension<FencingToken>>) -> String {
    handlers.runs.fetch_add(1, Ordering::SeqCst);
    match token {
        Some(Extension(FencingToken(token))) => format!("written with {token}"),
        None => "written without a token".to_owned(),
    }
}

/// Like `write`, but waits for the test's go-ahead first: a holder whose
/// request was admitted and is still in its handler.
async fn slow_write(State(handlers): State<Handlers>) -> &'static str {
    handlers.runs.fetch_add(1, Ordering::SeqCst);
    handlers.release_slow.notified().await;
    "slow write done"
}

/// Serves `layer` around the handlers on a free loopback port.
async fn serve(layer: FencingLayer) -> (SocketAddr, Handlers) {
    let handlers = Handlers::default();
    let app = Router::new()
        .route("/data", put(write))
        .route("/slow", put(slow_write))
        .layer(layer)
        .with_state(handlers.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, handlers)
}

/// One PUT on a fresh connection, with these `Fencing-Token` header values.
async fn put_with(addr: SocketAddr, path: &str, tokens: &[&str]) -> (StatusCode, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = Request::put(path).header("host", addr.to_string());
    for token in tokens {
        request = request.header("Fencing-Token", *token);
    }
    let response = sender
        .send_request(request.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn current_tokens_pass_stale_ones_get_409_without_running_the_handler() {
    let gate = Arc::new(FenceGate::new());
    let (addr, handlers) = serve(FencingLayer::new(Arc::clone(&gate))).await;

    assert_eq!(
        put_with(addr, "/data", &["7"]).await,
        (StatusCode::OK, "written with 7".to_owned())
    );
    assert_eq!(
        put_with(addr, "/data", &["7"]).await,
        (StatusCode::OK, "written with 7".to_owned()),
        "the same holder writes again with its token"
    );
    assert_eq!(
        put_with(addr, "/data", &["9"]).await,
        (StatusCode::OK, "written with 9".to_owned())
    );
    assert_eq!(handlers.runs(), 3);

    assert_eq!(
        put_with(addr, "/data", &["7"]).await,
        (
            StatusCode::CONFLICT,
            "stale fencing token 7: this resource already accepted token 9\n".to_owned()
        )
    );
    assert_eq!(handlers.runs(), 3, "the handler ran for a stale token");
    assert_eq!(gate.highest(), 9);
}

#[tokio::test]
async fn missing_or_malformed_tokens_get_400_without_running_the_handler() {
    let gate = Arc::new(FenceGate::starting_at(5));
    let (addr, handlers) = serve(FencingLayer::new(Arc::clone(&gate))).await;

    let (status, body) = put_with(addr, "/data", &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body, "missing Fencing-Token header\n");

    for garbage in ["abc", "+6", "-1", "6.0", "", "99999999999999999999"] {
        let (status, body) = put_with(addr, "/data", &[garbage]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{garbage:?}");
        assert!(body.starts_with("malformed Fencing-Token header"), "{body}");
    }

    let (status, body) = put_with(addr, "/data", &["6", "7"]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body, "more than one Fencing-Token header\n");

    assert_eq!(handlers.runs(), 0);
    assert_eq!(gate.highest(), 5, "no rejected request moved the mark");
}

#[tokio::test]
async fn allow_missing_token_lets_tokenless_requests_through_but_still_fences_the_rest() {
    let gate = Arc::new(FenceGate::starting_at(5));
    let (addr, handlers) = serve(FencingLayer::new(gate).allow_missing_token()).await;

    assert_eq!(
        put_with(addr, "/data", &[]).await,
        (StatusCode::OK, "written without a token".to_owned())
    );
    assert_eq!(
        put_with(addr, "/data", &["4"]).await.0,
        StatusCode::CONFLICT
    );
    assert_eq!(
        put_with(addr, "/data", &["x"]).await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        put_with(addr, "/data", &["5"]).await,
        (StatusCode::OK, "written with 5".to_owned())
    );
    assert_eq!(handlers.runs(), 2);
}

/// The mark advances when a request is admitted, not when its handler
/// finishes: while holder 8's request is still in its handler, holder 7 is
/// already refused.
#[tokio::test]
async fn the_mark_advances_on_admission_before_the_handler_finishes() {
    let gate = Arc::new(FenceGate::starting_at(1));
    let (addr, handlers) = serve(FencingLayer::new(Arc::clone(&gate))).await;

    let slow = tokio::spawn(async move { put_with(addr, "/slow", &["8"]).await });
    // Wait until token 8's handler is running (and so blocked).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while handlers.runs() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "/slow never reached its handler"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(gate.highest(), 8);

    let (status, body) = put_with(addr, "/data", &["7"]).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        body,
        "stale fencing token 7: this resource already accepted token 8\n"
    );
    assert_eq!(handlers.runs(), 1, "token 7's handler ran");

    handlers.release_slow.notify_one();
    assert_eq!(
        slow.await.unwrap(),
        (StatusCode::OK, "slow write done".to_owned())
    );
}
