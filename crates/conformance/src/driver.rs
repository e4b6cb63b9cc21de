//! [`Driver`]: one client under test, as a child process that takes JSON
//! commands on stdin and answers each, by id, on stdout.

use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::oneshot;

/// How to start a client's driver.
#[derive(Debug, Clone)]
pub struct ClientUnderTest {
    /// For messages: "rust", "python", ...
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// A command the client refused or failed: the client's error kind (as the
/// server names kinds: `busy`, `wait_timeout`, ...) and its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub kind: String,
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

type Waiting = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, Refusal>>>>>;

/// A running driver. Commands run concurrently inside it; each answer
/// comes back to the call that sent it.
pub struct Driver {
    client: String,
    child: Child,
    stdin: ChildStdin,
    next_id: u64,
    waiting: Waiting,
}

/// No command of a scenario should take longer than this; a driver that
/// does is stuck, and the scenario fails saying which command.
const COMMAND_LIMIT: Duration = Duration::from_secs(60);

impl Driver {
    pub fn start(client: &ClientUnderTest) -> anyhow::Result<Driver> {
        let mut child = Command::new(&client.program)
            .args(&client.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| {
                anyhow::anyhow!(
                    "cannot start {}'s driver {:?}: {error}",
                    client.name,
                    client.program
                )
            })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let waiting = Waiting::default();
        let answers = waiting.clone();
        let name = client.name.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(answer) = serde_json::from_str::<Value>(&line) else {
                    eprintln!("{name} driver printed a line that is not JSON: {line}");
                    continue;
                };
                let Some(id) = answer["id"].as_u64() else {
                    eprintln!("{name} driver answered without an id: {line}");
                    continue;
                };
                let result = match answer.get("error") {
                    Some(error) => Err(Refusal {
                        kind: error["kind"].as_str().unwrap_or_default().to_owned(),
                        message: error["message"].as_str().unwrap_or_default().to_owned(),
                    }),
                    None => Ok(answer["ok"].clone()),
                };
                if let Some(waiter) = answers.lock().unwrap().remove(&id) {
                    let _ = waiter.send(result);
                }
            }
        });
        Ok(Driver {
            client: client.name.clone(),
            child,
            stdin,
            next_id: 0,
            waiting,
        })
    }

    /// Sends `op` with `args` and returns the answer to come, so that a
    /// scenario can start a blocking acquire and go on.
    pub async fn send(&mut self, op: &str, mut args: Value) -> anyhow::Result<Pending> {
        self.next_id += 1;
        let id = self.next_id;
        args["id"] = id.into();
        args["op"] = op.into();
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap().insert(id, tx);
        let mut line = args.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await?;
        self.stdin.flush().await?;
        Ok(Pending {
            what: format!("{} {op} {args}", self.client),
            answer: rx,
        })
    }

    /// Sends and waits for the answer.
    pub async fn call(&mut self, op: &str, args: Value) -> anyhow::Result<Result<Value, Refusal>> {
        self.send(op, args).await?.answer().await
    }

    /// Sends and expects success.
    pub async fn ok(&mut self, op: &str, args: Value) -> anyhow::Result<Value> {
        let what = format!("{} {op} {args}", self.client);
        self.call(op, args)
            .await?
            .map_err(|refusal| anyhow::anyhow!("{what} failed: {refusal}"))
    }

    /// Connects to `endpoints` with no TLS and no token.
    pub async fn connect(&mut self, endpoints: &[String]) -> anyhow::Result<()> {
        self.ok("connect", json!({ "endpoints": endpoints }))
            .await
            .map(drop)
    }

    /// Opens a session with `ttl` and returns its id.
    pub async fn open(&mut self, ttl: Duration) -> anyhow::Result<u64> {
        let opened = self
            .ok("open", json!({ "ttl_ms": ttl.as_millis() as u64 }))
            .await?;
        opened["session"]
            .as_u64()
            .ok_or_else(|| anyhow::anyhow!("open answered {opened} without a session id"))
    }

    /// Takes `name` in `session`, waiting; returns the token.
    pub async fn lock(&mut self, session: u64, name: &str) -> anyhow::Result<u64> {
        let granted = self
            .ok("lock", json!({ "session": session, "name": name }))
            .await?;
        token(&granted)
    }

    pub async fn release(&mut self, session: u64, name: &str) -> anyhow::Result<()> {
        self.ok("release", json!({ "session": session, "name": name }))
            .await
            .map(drop)
    }

    /// The lock's holder, token and waiters, as the driver's client reads them.
    pub async fn status(&mut self, name: &str) -> anyhow::Result<LockStatus> {
        let status = self.ok("status", json!({ "name": name })).await?;
        Ok(LockStatus {
            holder: status["holder"].as_u64(),
            token: status["token"].as_u64(),
            waiters: status["waiters"]
                .as_array()
                .map(|waiters| waiters.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default(),
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// What `status` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockStatus {
    pub holder: Option<u64>,
    pub token: Option<u64>,
    pub waiters: Vec<u64>,
}

/// The token of a `lock` or `try_lock` answer.
pub fn token(granted: &Value) -> anyhow::Result<u64> {
    granted["token"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("answer {granted} has no token"))
}

/// An answer not yet read.
pub struct Pending {
    what: String,
    answer: oneshot::Receiver<Result<Value, Refusal>>,
}

impl Pending {
    pub async fn answer(self) -> anyhow::Result<Result<Value, Refusal>> {
        match tokio::time::timeout(COMMAND_LIMIT, self.answer).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => anyhow::bail!("the driver exited before answering {}", self.what),
            Err(_) => anyhow::bail!("no answer within {COMMAND_LIMIT:?} to {}", self.what),
        }
    }

    /// Waits for success.
    pub async fn ok(self) -> anyhow::Result<Value> {
        let what = self.what.clone();
        self.answer()
            .await?
            .map_err(|refusal| anyhow::anyhow!("{what} failed: {refusal}"))
    }

    /// The answer if it comes within `wait`; `None` if it has not (the
    /// command goes on, and can still be waited for).
    pub async fn within(
        &mut self,
        wait: Duration,
    ) -> anyhow::Result<Option<Result<Value, Refusal>>> {
        match tokio::time::timeout(wait, &mut self.answer).await {
            Ok(Ok(answer)) => Ok(Some(answer)),
            Ok(Err(_)) => anyhow::bail!("the driver exited before answering {}", self.what),
            Err(_) => Ok(None),
        }
    }
}
