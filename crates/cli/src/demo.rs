//! `deadbolt demo pause`: the scenario from the fencing-token literature, run
//! for real and narrated.
//!
//! Client A takes a lock and is about to write to a storage service when it
//! pauses (a real SIGSTOP of its process, standing in for a GC pause or a VM
//! stall). Its lease runs out, client B gets the lock and writes. A resumes,
//! still sure it holds the lock, and writes too. Without fencing the storage
//! service accepts A's stale write and B's work is lost; with fencing
//! (`deadbolt_fence::FencingLayer` in front of the same service) A's write
//! carries the older token and is refused.
//!
//! Everything is real and throwaway: a Deadbolt server started for the demo
//! in a temporary directory, the storage service in this process, and A and
//! B as separate `deadbolt demo worker` processes.

use crate::exit;
use anyhow::{bail, Context};
use axum::extract::State;
use axum::routing::{get, post};
use deadbolt_client::Client;
use deadbolt_fence::http::FencingLayer;
use deadbolt_fence::FenceGate;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdout, Command};

/// The lock the two clients compete for.
const LOCK: &str = "report";

#[derive(clap::Subcommand)]
pub enum DemoCommand {
    /// A lock holder paused past its lease writes after the next holder:
    /// first against a storage service that does not check fencing tokens,
    /// then against one that does.
    Pause {
        /// The demo clients' session TTL: how long A's pause must outlast.
        #[arg(long, default_value = "2s", value_parser = crate::parse_duration)]
        ttl: Duration,
    },
    /// Internal: one demo client (A or B), driven over stdin and stdout.
    #[command(hide = true)]
    Worker {
        #[arg(long)]
        name: String,
        #[arg(long)]
        server: String,
        #[arg(long)]
        storage: SocketAddr,
        #[arg(long, value_parser = crate::parse_duration)]
        ttl: Duration,
        /// Send the grant's token with the write.
        #[arg(long)]
        fenced: bool,
    },
}

pub async fn main(command: DemoCommand) -> i32 {
    let result = match command {
        DemoCommand::Pause { ttl } => pause(ttl).await,
        DemoCommand::Worker {
            name,
            server,
            storage,
            ttl,
            fenced,
        } => worker(&name, &server, storage, ttl, fenced).await,
    };
    match result {
        Ok(true) => exit::OK,
        Ok(false) => exit::FAILURE,
        Err(err) => {
            eprintln!("deadbolt demo: {err:#}");
            exit::FAILURE
        }
    }
}

/// Runs the scenario without and with fencing; true if both ended as they
/// must (the stale write accepted, then refused).
async fn pause(ttl: Duration) -> anyhow::Result<bool> {
    let server = DemoServer::start().await?;
    println!(
        "A throwaway Deadbolt server runs at {} (data in {}).",
        server.endpoint,
        server.dir.display()
    );
    println!(
        "Clients A and B both want lock {LOCK:?}, with {} leases.\n",
        humantime::format_duration(ttl)
    );
    println!("== 1. The storage service accepts every write (no fencing)");
    let unfenced = scenario(&server.endpoint, ttl, false).await?;
    let corrupted = unfenced.starts_with("written by A");
    if corrupted {
        println!("Result: the storage holds {unfenced:?}: A's stale write overwrote B's work. Corrupted.\n");
    } else {
        println!("Result: the storage holds {unfenced:?} (unexpected: A's stale write should have won).\n");
    }
    println!("== 2. The storage service checks fencing tokens (deadbolt_fence::FencingLayer)");
    let fenced = scenario(&server.endpoint, ttl, true).await?;
    let intact = fenced.starts_with("written by B");
    if intact {
        println!("Result: the storage holds {fenced:?}: A's stale write was refused. Intact.");
    } else {
        println!("Result: the storage holds {fenced:?} (unexpected: A's stale write should have been refused).");
    }
    println!(
        "\nChecking \"do I still hold the lock?\" before writing cannot help: A checked, and the \
         pause came after the check. Only the resource can tell a stale write, by its token."
    );
    Ok(corrupted && intact)
}

/// One run: A acquires and pauses, B acquires and writes, A resumes and
/// writes. Returns what the storage holds at the end.
async fn scenario(endpoint: &str, ttl: Duration, fenced: bool) -> anyhow::Result<String> {
    let storage = Storage::start(fenced).await?;
    let mut a = Worker::spawn("A", endpoint, storage.address, ttl, fenced)?;
    let token_a = a.expect("acquired").await?;
    println!("[A] acquired lock {LOCK:?} with token {token_a}, checked that its lease is fine, and is about to write...");
    a.signal(libc::SIGSTOP);
    println!("[A] ...but its process is paused (SIGSTOP: think of a long GC pause or a VM stall).");
    let paused = Instant::now();
    let mut b = Worker::spawn("B", endpoint, storage.address, ttl, fenced)?;
    println!("[B] asks for the lock and waits: A holds it.");
    let token_b = b.expect("acquired").await?;
    println!(
        "[B] got the lock with token {token_b} after {:.1}s: A's lease ran out while A was paused.",
        paused.elapsed().as_secs_f64()
    );
    b.send("write").await?;
    let wrote_b = b.expect("wrote").await?;
    println!("[B] writes its report (token {token_b}): {wrote_b}");
    a.signal(libc::SIGCONT);
    println!("[A] resumes (SIGCONT), still sure it holds the lock, and writes its report (token {token_a}).");
    a.send("write").await?;
    let wrote_a = a.expect("wrote").await?;
    println!("[A] the storage answers: {wrote_a}");
    b.send("done").await?;
    a.finish().await;
    b.finish().await;
    Ok(storage.document())
}

/// A storage service holding one document, optionally behind a fence.
struct Storage {
    address: SocketAddr,
    document: Arc<Mutex<String>>,
}

impl Storage {
    async fn start(fenced: bool) -> anyhow::Result<Storage> {
        let document = Arc::new(Mutex::new(String::from("(empty)")));
        let mut write = axum::Router::new().route("/report", post(store_report));
        if fenced {
            write = write.layer(FencingLayer::new(Arc::new(FenceGate::new())));
        }
        let app = write
            .route("/report", get(read_report))
            .with_state(document.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Storage { address, document })
    }

    fn document(&self) -> String {
        self.document
            .lock()
            .expect("document lock poisoned")
            .clone()
    }
}

async fn store_report(State(document): State<Arc<Mutex<String>>>, body: String) -> &'static str {
    *document.lock().expect("document lock poisoned") = body;
    "stored"
}

async fn read_report(State(document): State<Arc<Mutex<String>>>) -> String {
    document.lock().expect("document lock poisoned").clone()
}

/// A `deadbolt server` for the demo only, on a free port, in a temporary
/// directory removed afterwards.
struct DemoServer {
    endpoint: String,
    dir: PathBuf,
    child: Child,
}

impl DemoServer {
    async fn start() -> anyhow::Result<DemoServer> {
        let dir = std::env::temp_dir().join(format!("deadbolt-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let child = Command::new("/proc/self/exe")
            .args([
                "server",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--data-dir",
            ])
            .arg(dir.join("data"))
            .stderr(std::fs::File::create(dir.join("server.log"))?)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start the demo server")?;
        let server = DemoServer {
            endpoint,
            dir,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(client) = Client::connect([server.endpoint.clone()]).await {
                if client.health().await.is_ok_and(|health| health.leader) {
                    return Ok(server);
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the demo server did not start; see {}",
                    server.dir.join("server.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for DemoServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A demo client process, driven line by line.
struct Worker {
    name: &'static str,
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Worker {
    fn spawn(
        name: &'static str,
        endpoint: &str,
        storage: SocketAddr,
        ttl: Duration,
        fenced: bool,
    ) -> anyhow::Result<Worker> {
        let mut command = Command::new("/proc/self/exe");
        command
            .args(["demo", "worker", "--name", name, "--server", endpoint])
            .args(["--storage", &storage.to_string()])
            .args(["--ttl", &humantime::format_duration(ttl).to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if fenced {
            command.arg("--fenced");
        }
        let mut child = command.spawn().context("cannot start a demo client")?;
        let stdout = child.stdout.take().expect("piped");
        Ok(Worker {
            name,
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// Waits for the worker's next line, which must start with `what`;
    /// returns the rest.
    async fn expect(&mut self, what: &str) -> anyhow::Result<String> {
        let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
            .await
            .with_context(|| format!("client {} said nothing for 60s", self.name))??
            .with_context(|| format!("client {} exited early", self.name))?;
        match line.strip_prefix(what) {
            Some(rest) => Ok(rest.trim().to_owned()),
            None => bail!("client {} said {line:?}, expected {what:?}", self.name),
        }
    }

    async fn send(&mut self, line: &str) -> anyhow::Result<()> {
        let stdin = self.child.stdin.as_mut().expect("piped");
        stdin.write_all(format!("{line}\n").as_bytes()).await?;
        Ok(stdin.flush().await?)
    }

    fn signal(&self, signal: i32) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(pid as i32, signal);
            }
        }
    }

    async fn finish(mut self) {
        drop(self.child.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

/// The client side: take the lock, say so, wait for "write", write, report
/// the storage's answer, wait for the end.
async fn worker(
    name: &str,
    server: &str,
    storage: SocketAddr,
    ttl: Duration,
    fenced: bool,
) -> anyhow::Result<bool> {
    let client = Client::connect([server]).await?;
    let session = client.open_session(ttl).await?;
    let guard = session.lock(LOCK).await?;
    // The check a careful client makes before writing. It passes: the pause
    // that follows is what makes it worthless.
    anyhow::ensure!(
        session.lease_deadline() > Instant::now(),
        "the lease is already gone"
    );
    println!("acquired {}", guard.token());
    let mut commands = BufReader::new(tokio::io::stdin()).lines();
    while let Some(command) = commands.next_line().await? {
        if command == "write" {
            let body = format!("written by {name} with token {}", guard.token());
            let token = fenced.then(|| guard.token());
            println!("wrote {}", post_report(storage, &body, token).await?);
        } else {
            break;
        }
    }
    Ok(true)
}

/// POSTs the report over a bare HTTP/1.1 connection; returns the status line
/// and body, e.g. `409 Conflict: stale fencing token 1: ...`.
async fn post_report(
    storage: SocketAddr,
    body: &str,
    token: Option<u64>,
) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(storage).await?;
    let fence = token.map_or(String::new(), |t| format!("fencing-token: {t}\r\n"));
    let request = format!(
        "POST /report HTTP/1.1\r\nhost: {storage}\r\n{fence}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .lines()
        .next()
        .and_then(|line| line.split_once(' '))
        .map(|(_, status)| status.to_owned())
        .unwrap_or_default();
    let reply = response.split("\r\n\r\n").nth(1).unwrap_or_default().trim();
    Ok(format!("{status}: {reply}"))
}
