//! What load balancers, orchestrators and gRPC tools ask a node, answered
//! through clients nobody here wrote (tonic-health's and tonic-reflection's
//! generated clients, as `grpc_health_probe` and grpcurl would call):
//! `grpc.health.v1.Health` (alive: `""`; ready: `deadbolt.v1.Deadbolt`),
//! `GET /ready` beside `GET /health`, and server reflection. All open to
//! every caller, access control on or not: a probe has no token.

mod common;

use common::{free_port, http, TestServer};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

async fn health(addr: SocketAddr, service: &str) -> Result<ServingStatus, tonic::Status> {
    let mut client = HealthClient::new(channel(&format!("http://{addr}")).await);
    let answer = client
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await?;
    Ok(answer.into_inner().status())
}

async fn channel(endpoint: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// `GET /ready`: its status and body.
fn ready(addr: SocketAddr) -> (u16, serde_json::Value) {
    let (status, body) = http(addr, "GET", "/ready", None).unwrap();
    (status, serde_json::from_str(&body).unwrap())
}

/// The services reflection lists, asked in `grpc.reflection.v1` or (the
/// same messages under other names) `v1alpha`.
macro_rules! listed_services {
    ($version:ident, $endpoint:expr) => {{
        use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;
        use tonic_reflection::pb::$version::ServerReflectionRequest;
        let mut reflection = ServerReflectionClient::new(channel($endpoint).await);
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut answers = reflection
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .unwrap()
            .into_inner();
        let answer = answers.message().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
            panic!("not a service list: {answer:?}");
        };
        list.service
            .into_iter()
            .map(|s| s.name)
            .collect::<Vec<String>>()
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leading_node_is_alive_and_ready_to_every_caller() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = tokio::task::spawn_blocking(move || TestServer::start(&data))
        .await
        .unwrap();
    // With access control on, a probe without a token still gets answers.
    let client = deadbolt_client::Client::connect([server.endpoint()])
        .await
        .unwrap();
    client.acl_bootstrap().await.unwrap();

    assert_eq!(
        health(server.addr, "").await.unwrap(),
        ServingStatus::Serving
    );
    assert_eq!(
        health(server.addr, "deadbolt.v1.Deadbolt").await.unwrap(),
        ServingStatus::Serving
    );
    let unknown = health(server.addr, "no.such.Service").await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
    let (status, body) = ready(server.addr);
    assert_eq!(
        (status, &body["ready"]),
        (200, &serde_json::json!(true)),
        "{body}"
    );

    // Reflection lists every service, as grpcurl's `list` shows them: in
    // v1, and in v1alpha, all that older tools ask (it was UNIMPLEMENTED).
    let expected = [
        "deadbolt.v1.Deadbolt",
        "deadbolt.v1.Cluster",
        "deadbolt.v1.Access",
        "grpc.health.v1.Health",
    ];
    let names = listed_services!(v1, &server.endpoint());
    let names_v1alpha = listed_services!(v1alpha, &server.endpoint());
    for expected in expected {
        assert!(names.iter().any(|name| name == expected), "{names:?}");
        assert!(
            names_v1alpha.iter().any(|name| name == expected),
            "{names_v1alpha:?}"
        );
    }
}

/// A node waiting to be added is alive but not ready: a load balancer
/// sends it nothing, an orchestrator does not restart it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_waiting_to_join_is_alive_but_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let secret = common::peer_secret_beside(&data);
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut child = std::process::Command::new(common::BIN)
        .args([
            "server",
            "--join",
            "--listen",
            &addr.to_string(),
            "--data-dir",
        ])
        .arg(&data)
        .arg("--peer-secret-file")
        .arg(&secret)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while http(addr, "GET", "/ready", None).is_err() {
        assert!(Instant::now() < deadline, "never served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = ready(addr);
    assert_eq!(status, 503, "{body}");
    assert!(
        body["reason"].as_str().unwrap().contains("not a member"),
        "{body}"
    );
    assert_eq!(health(addr, "").await.unwrap(), ServingStatus::Serving);
    assert_eq!(
        health(addr, "deadbolt.v1.Deadbolt").await.unwrap(),
        ServingStatus::NotServing
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
