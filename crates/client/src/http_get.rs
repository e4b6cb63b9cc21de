//! Calls of the HTTP API that have no gRPC twin (`GET /v1/snapshot`,
//! `GET /metrics`), sent over the same channel as the gRPC calls.
//!
//! Why not a separate HTTP client: the server serves gRPC and HTTP on one
//! port and tonic's channel is an HTTP/2 client already, with the
//! endpoints, TLS settings and client certificate this client was built
//! with, and `call_over`'s leader search. A JSON error body becomes the same
//! [`Error`] a gRPC call would give (`not_leader` with the leader's address
//! included), so the retries work alike.

use crate::client::{Current, Patience, Repeat};
use crate::error::describe_chain;
use crate::{Client, Error};
use deadbolt_proto::v1::CallError;
use http_body_util::{BodyExt, Limited};
use tower::ServiceExt;

impl Client {
    /// A backup of the cluster's state (`deadbolt snapshot save`), from the
    /// leader, as the file's bytes. Refused if larger than `max_bytes`.
    pub async fn snapshot(&self, max_bytes: u64) -> Result<Vec<u8>, Error> {
        self.call_over(
            (Repeat::Freely, Patience::Budget),
            Current::channel,
            (),
            |channel, ()| get(channel, "/v1/snapshot", max_bytes),
        )
        .await
    }

    /// The Prometheus text of `GET /metrics` of the node this client talks
    /// to now (after a call, the leader), for tools such as `deadbolt
    /// bench` that read a figure of the server's from it.
    pub async fn node_metrics(&self) -> Result<String, Error> {
        /// Far above a node's scrape (a few hundred lines).
        const MAX_METRICS_BYTES: u64 = 4 << 20;
        let text = self
            .call_over(
                (Repeat::Freely, Patience::Budget),
                Current::channel,
                (),
                |channel, ()| get(channel, "/metrics", MAX_METRICS_BYTES),
            )
            .await?;
        Ok(String::from_utf8_lossy(&text).into_owned())
    }
}

async fn get(
    channel: crate::link::Link,
    path: &'static str,
    max_bytes: u64,
) -> Result<Vec<u8>, tonic::Status> {
    let request = http::Request::get(path)
        .body(tonic::body::empty_body())
        .map_err(|err| tonic::Status::internal(err.to_string()))?;
    let response = channel
        .oneshot(request)
        .await
        .map_err(|err| tonic::Status::unavailable(describe_chain(&err)))?;
    let status = response.status();
    let limit = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    let body = Limited::new(response.into_body(), limit)
        .collect()
        .await
        .map_err(|err| {
            tonic::Status::unavailable(format!(
                "reading the answer to GET {path} failed (larger than {max_bytes} bytes?): {}",
                describe_chain(&*err)
            ))
        })?
        .to_bytes();
    if status.is_success() {
        return Ok(body.to_vec());
    }
    // `{"error": {"kind", "message", "leader"}}`, as docs/http-api.md says.
    let error = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|mut json| serde_json::from_value::<CallError>(json["error"].take()).ok());
    Err(match error {
        Some(error) => error.into_status(),
        None => tonic::Status::unknown(format!(
            "GET {path} answered {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        )),
    })
}
