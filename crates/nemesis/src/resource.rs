//! `deadbolt-nemesis resource`: a protected resource in a process of its
//! own, fenced with `deadbolt_fence::FenceGates`: one counter per lock.
//!
//! `GET /counter/{lock}` with a `Fencing-Token` is a fenced read (it raises
//! the lock's fence); `PUT /counter/{lock}` writes, fenced, under the gate so
//! check and write are one step. Every accepted write is appended to the
//! `--accepted` file, which the checker reads. `GET /final/{lock}` reads
//! without a token, for the end of the run.
//!
//! With `--unfenced` it is the resource most code writes to: reads and
//! writes need no token and nothing is checked (a token sent is only
//! logged), so the same run counts what fencing prevents.

use crate::history::{now, Accepted};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use deadbolt_fence::FenceGates;
use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[derive(clap::Args)]
pub struct ResourceArgs {
    #[arg(long)]
    listen: SocketAddr,
    /// Where accepted writes are appended, one JSON line each.
    #[arg(long)]
    accepted: PathBuf,
    /// Check no token: accept every read and write.
    #[arg(long)]
    unfenced: bool,
}

struct Resource {
    unfenced: bool,
    gates: FenceGates<String>,
    counters: Mutex<HashMap<String, u64>>,
    accepted: Mutex<std::fs::File>,
}

type Reply = (StatusCode, String);

pub async fn main(args: ResourceArgs) -> anyhow::Result<()> {
    let resource = Arc::new(Resource {
        unfenced: args.unfenced,
        gates: FenceGates::new(),
        counters: Mutex::default(),
        accepted: Mutex::new(std::fs::File::create(&args.accepted)?),
    });
    let app = axum::Router::new()
        .route("/counter/:lock", get(read).put(write))
        .route("/final/:lock", get(final_value))
        .with_state(resource);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    axum::serve(listener, app).await?;
    Ok(())
}

fn token(headers: &HeaderMap) -> Result<u64, Reply> {
    headers
        .get("fencing-token")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
        .ok_or((StatusCode::BAD_REQUEST, "missing fencing-token".into()))
}

impl Resource {
    /// The request's token; unfenced, any (0 for none).
    fn token(&self, headers: &HeaderMap) -> Result<u64, Reply> {
        match token(headers) {
            Err(_) if self.unfenced => Ok(0),
            token => token,
        }
    }

    fn value(&self, lock: &str) -> u64 {
        self.counters
            .lock()
            .expect("poisoned")
            .get(lock)
            .copied()
            .unwrap_or(0)
    }
}

async fn read(
    State(resource): State<Arc<Resource>>,
    Path(lock): Path<String>,
    headers: HeaderMap,
) -> Reply {
    let token = match resource.token(&headers) {
        Ok(token) => token,
        Err(reply) => return reply,
    };
    if resource.unfenced {
        return (StatusCode::OK, resource.value(&lock).to_string());
    }
    match resource.gates.admit(lock.as_str(), token) {
        Ok(()) => (StatusCode::OK, resource.value(&lock).to_string()),
        Err(stale) => (StatusCode::CONFLICT, stale.to_string()),
    }
}

async fn write(
    State(resource): State<Arc<Resource>>,
    Path(lock): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Reply {
    let token = match resource.token(&headers) {
        Ok(token) => token,
        Err(reply) => return reply,
    };
    let Ok(value) = body.trim().parse::<u64>() else {
        return (StatusCode::BAD_REQUEST, "the body must be a number".into());
    };
    let store = || {
        resource
            .counters
            .lock()
            .expect("poisoned")
            .insert(lock.clone(), value);
        let record = Accepted {
            at: now(),
            lock: lock.clone(),
            token,
            value,
        };
        let mut log = resource.accepted.lock().expect("poisoned");
        writeln!(
            log,
            "{}",
            serde_json::to_string(&record).expect("serializable")
        )
    };
    let written = if resource.unfenced {
        Ok(store())
    } else {
        let gate = resource.gates.gate(lock.as_str());
        gate.admit_with(token, store)
    };
    match written {
        Ok(Ok(())) => (StatusCode::OK, value.to_string()),
        Ok(Err(err)) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
        Err(stale) => (StatusCode::CONFLICT, stale.to_string()),
    }
}

async fn final_value(State(resource): State<Arc<Resource>>, Path(lock): Path<String>) -> Reply {
    (StatusCode::OK, resource.value(&lock).to_string())
}
