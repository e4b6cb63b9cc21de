//! The Rust client's conformance driver: reads the commands of
//! `crates/conformance/README.md` on stdin, one JSON object per line, runs
//! each through `deadbolt-client` as its own task (a blocking acquire does
//! not hold up the others), and prints one JSON answer per command, tagged
//! with its id, in the order they finish.
//!
//! With `--calls grpc`, the client sends its acquires, releases and
//! keepalives over the gRPC `Calls` stream instead of framed calls
//! (docs/framed-calls.md), so the suite holds both to the same scenarios.
//!
//! Why a driver and not a test linked to the client: the scenarios are the
//! same for the Python and TypeScript clients, which cannot be linked; each
//! ships a driver like this one, and the runner treats them all alike.

use deadbolt_client::{Client, Error, ErrorKind, LockGuard, Session, SessionHandle, TlsOptions};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

#[derive(Default)]
struct State {
    /// `--calls grpc`: see the module's comment.
    over_grpc: bool,
    client: Option<Client>,
    sessions: HashMap<u64, Session>,
    /// Held locks by (session id, lock name).
    guards: HashMap<(u64, String), LockGuard>,
}

type Shared = Arc<Mutex<State>>;

/// A failed command: the client's error kind and message.
struct Failure(String, String);

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure(error.kind().as_str().to_owned(), error.message().to_owned())
    }
}

fn bad(message: impl Into<String>) -> Failure {
    Failure("driver".into(), message.into())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The client's own account of retries and lost leases, on stderr (stdout
    // is the protocol's), with `RUST_LOG=deadbolt_client=debug`.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let over_grpc = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] | ["--calls", "framed"] => false,
        ["--calls", "grpc"] => true,
        _ => anyhow::bail!("usage: deadbolt-conformance-driver [--calls framed|grpc]"),
    };
    let state = Shared::new(Mutex::new(State {
        over_grpc,
        ..State::default()
    }));
    let (answers, mut outbox) = mpsc::unbounded_channel::<Value>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(answer) = outbox.recv().await {
            let mut line = answer.to_string();
            line.push('\n');
            if stdout.write_all(line.as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let command: Value = serde_json::from_str(&line)?;
        let (state, answers) = (state.clone(), answers.clone());
        tokio::spawn(async move {
            let id = command["id"].clone();
            let answer = match run(&state, &command).await {
                Ok(ok) => json!({"id": id, "ok": ok}),
                Err(Failure(kind, message)) => {
                    json!({"id": id, "error": {"kind": kind, "message": message}})
                }
            };
            let _ = answers.send(answer);
        });
    }
    // Stdin closed: the runner is done with this client.
    drop(answers);
    let _ = writer.await;
    Ok(())
}

fn text<'a>(command: &'a Value, field: &str) -> Result<&'a str, Failure> {
    command[field]
        .as_str()
        .ok_or_else(|| bad(format!("{field} must be a string")))
}

fn number(command: &Value, field: &str) -> Result<u64, Failure> {
    command[field]
        .as_u64()
        .ok_or_else(|| bad(format!("{field} must be a number")))
}

fn millis(command: &Value, field: &str) -> Result<Duration, Failure> {
    number(command, field).map(Duration::from_millis)
}

fn client(state: &Shared) -> Result<Client, Failure> {
    state
        .lock()
        .unwrap()
        .client
        .clone()
        .ok_or_else(|| bad("connect first"))
}

fn session(state: &Shared, command: &Value) -> Result<Session, Failure> {
    let id = number(command, "session")?;
    state
        .lock()
        .unwrap()
        .sessions
        .get(&id)
        .cloned()
        .ok_or_else(|| bad(format!("no session {id} in this driver")))
}

fn granted(state: &Shared, guard: LockGuard) -> Value {
    let token = guard.token();
    let key = (guard.session().id(), guard.name().to_owned());
    state.lock().unwrap().guards.insert(key, guard);
    json!({ "token": token })
}

async fn run(state: &Shared, command: &Value) -> Result<Value, Failure> {
    match text(command, "op")? {
        "connect" => {
            let endpoints: Vec<String> = command["endpoints"]
                .as_array()
                .ok_or_else(|| bad("endpoints must be a list"))?
                .iter()
                .filter_map(|endpoint| endpoint.as_str().map(str::to_owned))
                .collect();
            let file = |field: &str| command[field].as_str().map(PathBuf::from);
            let tls = TlsOptions::from_files(
                file("ca").as_deref(),
                file("cert").as_deref(),
                file("key").as_deref(),
            )?;
            let client =
                Client::connect_with_token(endpoints, &tls, command["token"].as_str()).await?;
            let mut state = state.lock().unwrap();
            if state.over_grpc {
                client.prefer_grpc_calls();
            }
            state.client = Some(client);
            Ok(json!({}))
        }
        "open" => {
            let session = client(state)?
                .open_session(millis(command, "ttl_ms")?)
                .await?;
            let id = session.id();
            state.lock().unwrap().sessions.insert(id, session);
            Ok(json!({ "session": id }))
        }
        "lock" => {
            let session = session(state, command)?;
            let name = text(command, "name")?;
            let guard = match command["timeout_ms"].as_u64() {
                Some(ms) => {
                    session
                        .lock_timeout(name, Duration::from_millis(ms))
                        .await?
                }
                None => session.lock(name).await?,
            };
            Ok(granted(state, guard))
        }
        "try_lock" => {
            let session = session(state, command)?;
            match session.try_lock(text(command, "name")?).await? {
                Some(guard) => Ok(granted(state, guard)),
                None => Ok(json!({ "token": null })),
            }
        }
        "release" => {
            let key = (
                number(command, "session")?,
                text(command, "name")?.to_owned(),
            );
            let guard = state
                .lock()
                .unwrap()
                .guards
                .remove(&key)
                .ok_or_else(|| bad(format!("{key:?} is not held in this driver")))?;
            guard.release().await?;
            Ok(json!({}))
        }
        "lost" => {
            let lost = session(state, command)?.lost(millis(command, "margin_ms")?);
            let reason = match lost.await {
                deadbolt_client::LeaseLost::Expired => "expired",
                deadbolt_client::LeaseLost::Rejected(_) => "rejected",
                deadbolt_client::LeaseLost::Closed => "closed",
            };
            Ok(json!({ "reason": reason }))
        }
        "close" => {
            let id = number(command, "session")?;
            let session = state.lock().unwrap().sessions.remove(&id);
            session
                .ok_or_else(|| bad(format!("no session {id} in this driver")))?
                .close()
                .await?;
            Ok(json!({}))
        }
        "status" => {
            let state = client(state)?.lock_status(text(command, "name")?).await?;
            Ok(match state {
                Some(lock) => json!({
                    "holder": lock.holder_session_id,
                    "token": lock.token,
                    "waiters": lock.waiter_session_ids,
                }),
                None => json!({ "holder": null, "token": null, "waiters": [] }),
            })
        }
        "handle" => {
            let session = session(state, command)?;
            let handle = session.handle();
            Ok(json!({ "session_id": handle.id(), "secret": handle.secret() }))
        }
        "keep_alive_handle" => {
            let handle =
                SessionHandle::new(number(command, "session_id")?, text(command, "secret")?);
            let ttl = client(state)?.keep_alive_raw(&handle).await?;
            Ok(json!({ "ttl_ms": ttl.as_millis() as u64 }))
        }
        op => Err(Failure(
            ErrorKind::InvalidArgument.as_str().to_owned(),
            format!("unknown op {op:?}"),
        )),
    }
}
