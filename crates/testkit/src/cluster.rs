//! A real multi-node cluster for tests, with a fault-injecting network.
//!
//! Every node listens on its own port, but the cluster knows each node by
//! the address of a TCP proxy in front of it: that is where the peers (and
//! the leader hints given to clients) send traffic. The proxies can cut the
//! link from one node to another in one direction. To tell which node a
//! connection comes from, a proxy looks up which process owns the other end
//! of the socket (/proc/net/tcp and /proc/PID/fd), so nodes need no
//! test-only flags. Tests that talk to a node directly use its `listen`
//! address and are never cut off.

use crate::{free_port, http, signal, TestPki};
use deadbolt_client::Client;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};

pub struct ClusterNode {
    pub id: u64,
    /// Where the node itself listens (reached directly by tests).
    pub listen: SocketAddr,
    /// Its address in the cluster: the proxy in front of it.
    pub advertised: SocketAddr,
    pub data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// Set when the cluster runs over mutual TLS.
    pki: Option<TestPki>,
}

impl ClusterNode {
    pub fn endpoint(&self) -> String {
        let scheme = if self.pki.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.listen)
    }

    /// A GET straight to this node (over TLS if the cluster uses it).
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        match &self.pki {
            Some(pki) => pki.get(self.listen, path),
            None => http(self.listen, "GET", path, None),
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// This node's own `/v1/cluster/status`, if it answers.
    pub fn status(&self) -> Option<serde_json::Value> {
        match self.get("/v1/cluster/status") {
            Ok((200, body)) => serde_json::from_str(&body).ok(),
            _ => None,
        }
    }
}

/// Which links are cut, and which process is which node.
#[derive(Default)]
struct Network {
    pids: HashMap<i32, u64>,
    /// (from, to): connections from node `from` into node `to` are dropped.
    cut: HashSet<(u64, u64)>,
    /// Live forwarded connections, to drop when their link is cut.
    links: Vec<(u64, u64, tokio::task::AbortHandle)>,
}

pub struct TestCluster {
    pub nodes: Vec<ClusterNode>,
    /// The `deadbolt` binary every node runs.
    bin: PathBuf,
    network: Arc<Mutex<Network>>,
    initial_cluster: String,
    pki: Option<TestPki>,
    /// Without TLS, the cluster secret file every node is given.
    peer_secret: Option<PathBuf>,
}

impl TestCluster {
    /// Starts `size` nodes with empty data directories under `dir` and waits
    /// until one leads.
    pub async fn start(bin: &Path, dir: &Path, size: u64) -> TestCluster {
        Self::start_with(bin, dir, size, None).await
    }

    /// [`start`](Self::start), over mutual TLS with `pki`'s certificates
    /// when given.
    pub async fn start_with(
        bin: &Path,
        dir: &Path,
        size: u64,
        pki: Option<TestPki>,
    ) -> TestCluster {
        let mut cluster = Self::stopped(bin, dir, size, pki).await;
        for id in 1..=size {
            cluster.start_node(id);
        }
        cluster.leader_within(Duration::from_secs(30)).await;
        cluster
    }

    /// A cluster of `size` nodes with empty data directories under `dir`,
    /// none started: for a test that starts some of them its own way
    /// ([`start_node_with_env`](Self::start_node_with_env)).
    pub async fn stopped(bin: &Path, dir: &Path, size: u64, pki: Option<TestPki>) -> TestCluster {
        std::fs::create_dir_all(dir).expect("create the cluster directory");
        let network = Arc::new(Mutex::new(Network::default()));
        let mut nodes = Vec::new();
        for id in 1..=size {
            let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let advertised = start_proxy(id, listen, network.clone()).await;
            nodes.push(ClusterNode {
                id,
                listen,
                advertised,
                data_dir: dir.join(format!("node{id}")),
                log: dir.join(format!("node{id}.log")),
                child: None,
                pki: pki.clone(),
            });
        }
        let initial_cluster = nodes
            .iter()
            .map(|n| format!("{}={}", n.id, n.advertised))
            .collect::<Vec<_>>()
            .join(",");
        // Without TLS, the nodes authenticate each other with a secret
        // file, made as an operator would.
        let peer_secret = pki.is_none().then(|| new_peer_secret(bin, dir));
        TestCluster {
            nodes,
            bin: bin.to_owned(),
            network,
            initial_cluster,
            pki,
            peer_secret,
        }
    }

    pub fn node(&self, id: u64) -> &ClusterNode {
        &self.nodes[(id - 1) as usize]
    }

    fn node_mut(&mut self, id: u64) -> &mut ClusterNode {
        &mut self.nodes[(id - 1) as usize]
    }

    /// All listen addresses, for clients that should fail over.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(ClusterNode::endpoint).collect()
    }

    pub async fn client(&self) -> Client {
        let tls = self
            .pki
            .as_ref()
            .map(TestPki::tls_options)
            .unwrap_or_default();
        Client::connect_with(self.endpoints(), &tls)
            .await
            .expect("connect")
    }

    /// The cluster secret file, when the cluster runs without TLS.
    pub fn peer_secret(&self) -> Option<&Path> {
        self.peer_secret.as_deref()
    }

    /// The certificates, when the cluster runs over mutual TLS.
    pub fn pki(&self) -> Option<&TestPki> {
        self.pki.as_ref()
    }

    /// The `deadbolt` binary that nodes started from now on run: a node
    /// restarted after this is upgraded (or rolled back) to it.
    pub fn set_bin(&mut self, bin: &Path) {
        self.bin = bin.to_owned();
    }

    /// Starts (or restarts) node `id` with the cluster's `--initial-cluster`.
    pub fn start_node(&mut self, id: u64) {
        self.start_node_with_env(id, &[]);
    }

    /// [`start_node`](Self::start_node) with extra environment variables
    /// (say, `LD_PRELOAD` of libfaketime for a node whose clock runs fast).
    pub fn start_node_with_env(&mut self, id: u64, env: &[(&str, &str)]) {
        let members = self.initial_cluster.clone();
        self.spawn(id, &["--initial-cluster", &members], env, None);
    }

    /// [`start_node`](Self::start_node) with extra flags (say, a longer
    /// `--election-timeout`).
    pub fn start_node_with_flags(&mut self, id: u64, flags: &[&str]) {
        let members = self.initial_cluster.clone();
        let flags = [&["--initial-cluster", members.as_str()], flags].concat();
        self.spawn(id, &flags, &[], None);
    }

    /// Starts node `id` with any extra flags.
    pub fn spawn_node(&mut self, id: u64, flags: &[&str]) {
        self.spawn(id, flags, &[], None);
    }

    /// Starts node `id` unable to grow any file beyond `bytes`, as if its
    /// disk filled up there: writes past it fail with EFBIG (SIGXFSZ is
    /// ignored), which the node sees as a storage error.
    pub fn start_node_with_full_disk_at(&mut self, id: u64, bytes: u64) {
        let members = self.initial_cluster.clone();
        self.spawn(id, &["--initial-cluster", &members], &[], Some(bytes));
    }

    fn spawn(
        &mut self,
        id: u64,
        flags: &[&str],
        env: &[(&str, &str)],
        max_file_bytes: Option<u64>,
    ) {
        let bin = self.bin.clone();
        let tls_flags = match (&self.pki, &self.peer_secret) {
            (Some(pki), _) => pki.server_flags(),
            (None, Some(secret)) => vec![
                "--peer-secret-file".to_owned(),
                secret.to_string_lossy().into_owned(),
            ],
            (None, None) => Vec::new(),
        };
        let node = self.node_mut(id);
        assert!(node.child.is_none(), "node {id} is already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .unwrap();
        let mut command = Command::new(bin);
        command
            .args(["server", "--node-id", &id.to_string()])
            .args(["--listen", &node.listen.to_string(), "--data-dir"])
            .arg(&node.data_dir)
            .args(&tls_flags)
            .args(flags)
            .env("RUST_LOG", "info,openraft=warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(bytes) = max_file_bytes {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit and signal are async-signal-safe, as
            // pre_exec requires; an ignored signal stays ignored across exec.
            unsafe {
                command.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: bytes,
                        rlim_max: bytes,
                    };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                    Ok(())
                });
            }
        }
        let child = command.spawn().expect("start deadbolt server");
        let pid = child.id() as i32;
        node.child = Some(child);
        self.network.lock().unwrap().pids.insert(pid, id);
    }

    /// Whether node `id` has exited by itself, and how.
    pub fn exited(&mut self, id: u64) -> Option<ExitStatus> {
        let node = self.node_mut(id);
        let status = node.child.as_mut()?.try_wait().unwrap()?;
        node.child = None;
        Some(status)
    }

    /// Waits for node `id` to exit by itself; returns its status.
    pub fn wait_exit(&mut self, id: u64, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        let node = self.node_mut(id);
        let child = node.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                node.child = None;
                return status;
            }
            assert!(Instant::now() < deadline, "node {id} did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// [`wait_exit`](Self::wait_exit) for async tests: polls on tokio's
    /// timer, so the runtime (which also runs the proxies) keeps going.
    pub async fn exit_within(&mut self, id: u64, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.exited(id) {
                return status;
            }
            assert!(Instant::now() < deadline, "node {id} did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// kill -9.
    pub fn kill9(&mut self, id: u64) {
        if let Some(mut child) = self.node_mut(id).child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// SIGTERM, then wait for the graceful exit.
    pub fn terminate(&mut self, id: u64) -> ExitStatus {
        let pid = self.node(id).child.as_ref().expect("running").id() as i32;
        signal(pid, libc::SIGTERM);
        self.wait_exit(id, Duration::from_secs(15))
    }

    /// [`terminate`](Self::terminate) for async tests.
    pub async fn terminate_within(&mut self, id: u64, within: Duration) -> ExitStatus {
        let pid = self.node(id).child.as_ref().expect("running").id() as i32;
        signal(pid, libc::SIGTERM);
        self.exit_within(id, within).await
    }

    /// Restarts node `id` on `bin` with `env`, as a rolling upgrade (or a
    /// rollback) does: SIGTERM, start it again, and wait until the cluster
    /// has a leader and the node answers as a member that knows it and has
    /// applied the log.
    pub async fn restart_on(&mut self, id: u64, bin: &Path, env: &[(&str, &str)]) {
        self.terminate_within(id, Duration::from_secs(15)).await;
        self.set_bin(bin);
        self.start_node_with_env(id, env);
        self.leader_within(Duration::from_secs(30)).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let rejoined = self.node(id).status().is_some_and(|status| {
                status["leader_id"].as_u64().is_some()
                    && status["applied_index"]
                        .as_u64()
                        .is_some_and(|index| index > 0)
            });
            if rejoined {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} did not come back; its log:\n{}",
                self.node(id).log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// [`wait_for_leader`](Self::wait_for_leader) for async tests: polls on
    /// tokio's timer instead of blocking a worker thread, which would also
    /// hold up the proxies that run on the test's runtime.
    pub async fn leader_within(&self, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            if let Some(leader) = self.agreed_leader() {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "no leader within {within:?}; logs:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The node every running node agrees leads, once there is one; from
    /// synchronous code (async tests use [`leader_within`](Self::leader_within)).
    pub fn wait_for_leader(&self, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            if let Some(leader) = self.agreed_leader() {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "no leader within {within:?}; logs:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The process id of node `id`, while it runs.
    pub fn pid(&self, id: u64) -> Option<i32> {
        self.node(id).child.as_ref().map(|child| child.id() as i32)
    }

    /// Some(id) when `id` says it leads and every other running node that
    /// answers names it as leader.
    pub fn agreed_leader(&self) -> Option<u64> {
        let statuses: Vec<serde_json::Value> = self
            .nodes
            .iter()
            .filter(|n| n.is_running())
            .filter_map(ClusterNode::status)
            .collect();
        let leader = statuses.iter().find(|s| s["role"] == "leader")?["node_id"].as_u64()?;
        let agreed = statuses
            .iter()
            .all(|s| s["leader_id"].as_u64() == Some(leader));
        // Leading includes having applied every earlier entry: `/health`
        // answers 200 only then.
        let ready = matches!(self.node(leader).get("/health"), Ok((200, _)));
        (agreed && ready).then_some(leader)
    }

    /// Cuts node `from`'s connections into node `to` (one direction).
    pub fn cut(&self, from: u64, to: u64) {
        let mut network = self.network.lock().unwrap();
        network.cut.insert((from, to));
        network.links.retain(|(f, t, link)| {
            let cut = (*f, *t) == (from, to);
            if cut {
                link.abort();
            }
            !cut
        });
    }

    /// Cuts `node` off from every other node, both ways.
    pub fn isolate(&self, node: u64) {
        for other in self.nodes.iter().map(|n| n.id).filter(|id| *id != node) {
            self.cut(node, other);
            self.cut(other, node);
        }
    }

    pub fn heal(&self) {
        self.network.lock().unwrap().cut.clear();
    }

    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- node {}:\n{}", n.id, n.log_text()))
            .collect()
    }

    /// Each node's last `lines` log lines: what a failing test prints when
    /// whole logs would push its own failures out of CI's view.
    pub fn logs_tail(&self, lines: usize) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let log = n.log_text();
                let all: Vec<&str> = log.lines().collect();
                let tail = &all[all.len().saturating_sub(lines)..];
                format!(
                    "--- node {}, its log's last {} lines:\n{}\n",
                    n.id,
                    tail.len(),
                    tail.join("\n")
                )
            })
            .collect()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Starts the proxy in front of node `id`; returns its address.
async fn start_proxy(id: u64, target: SocketAddr, network: Arc<Mutex<Network>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        // Connections from a cut link are held open and never answered, as
        // a real partition would: the sender has to time out.
        let mut black_holed = Vec::new();
        loop {
            let Ok((inbound, peer)) = listener.accept().await else {
                return;
            };
            let pids: Vec<i32> = network.lock().unwrap().pids.keys().copied().collect();
            let from = socket_owner(peer, address, &pids)
                .and_then(|pid| network.lock().unwrap().pids.get(&pid).copied());
            let mut network = network.lock().unwrap();
            if network.cut.is_empty() {
                black_holed.clear();
            }
            let Some(from) = from else {
                // Not a node (a test's own client): never cut.
                tokio::spawn(forward(inbound, target));
                continue;
            };
            if network.cut.contains(&(from, id)) {
                black_holed.push(inbound);
                continue;
            }
            let link = tokio::spawn(forward(inbound, target));
            network.links.push((from, id, link.abort_handle()));
        }
    });
    address
}

async fn forward(mut inbound: TcpStream, target: SocketAddr) {
    if let Ok(mut outbound) = TcpStream::connect(target).await {
        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
    }
}

/// The process (among `pids`) that owns the client end of the TCP
/// connection from `peer` to `local`.
fn socket_owner(peer: SocketAddr, local: SocketAddr, pids: &[i32]) -> Option<i32> {
    let hex = |addr: SocketAddr| match addr {
        SocketAddr::V4(v4) => format!(
            "{:08X}:{:04X}",
            u32::from_le_bytes(v4.ip().octets()),
            v4.port()
        ),
        SocketAddr::V6(_) => String::new(),
    };
    let (want_local, want_remote) = (hex(peer), hex(local));
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let inode = table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&want_local.as_str())
            && fields.get(2) == Some(&want_remote.as_str()))
        .then(|| fields.get(9).map(|inode| inode.to_string()))
        .flatten()
    })?;
    let socket = format!("socket:[{inode}]");
    pids.iter().copied().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|target| target.as_os_str() == socket.as_str())
                })
            })
            .unwrap_or(false)
    })
}

/// Makes a cluster secret file in `dir` with `bin peer-secret new`, and
/// returns its path.
pub fn new_peer_secret(bin: &Path, dir: &Path) -> PathBuf {
    let path = dir.join("peer-secret");
    let out = Command::new(bin)
        .args(["peer-secret", "new"])
        .arg(&path)
        .output()
        .expect("run deadbolt peer-secret new");
    assert!(out.status.success(), "deadbolt peer-secret new: {out:?}");
    path
}
