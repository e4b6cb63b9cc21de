//! Real peer lock servers for tests, and a load balancer in front of
//! Deadbolt nodes (haproxy): Redis and etcd processes started on
//! free loopback ports (one per test, so a test may kill or restart its
//! own), from the binaries on PATH or named by `DEADBOLT_REDIS_SERVER` /
//! `DEADBOLT_ETCD`, and the shared PostgreSQL of `scripts/postgres.sh`
//! (`DEADBOLT_TEST_POSTGRES_URL`). A missing one skips its test, loudly,
//! unless `DEADBOLT_REQUIRE_BACKENDS=1` (set by `scripts/test.sh`), which
//! makes it fail: CI must not pass by skipping. Used by the tests of
//! `crates/backends` and of `deadbolt run --backend`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REQUIRE: &str = "DEADBOLT_REQUIRE_BACKENDS";

/// Says (once per test) that a server is missing, or fails if it must not be.
fn missing(what: &str, how: &str) {
    assert!(
        std::env::var(REQUIRE).as_deref() != Ok("1"),
        "{REQUIRE}=1 but {what} is missing: {how}"
    );
    // Straight to stderr: the harness swallows output of passing tests.
    let _ = writeln!(
        std::io::stderr(),
        "\n*** {what} missing, test skipped: {how} (scripts/test.sh does this) ***\n"
    );
}

/// `var`'s path, or `program` on PATH.
fn binary(var: &str, program: &str, package: &str) -> Option<PathBuf> {
    if let Ok(path) = std::env::var(var) {
        return Some(PathBuf::from(path));
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    });
    if found.is_none() {
        missing(program, &format!("install Debian's {package} or set {var}"));
    }
    found
}

/// A lock server process this test started; killed (by its own pid) when
/// dropped.
pub struct Server {
    program: PathBuf,
    args: Vec<String>,
    pub port: u16,
    child: Option<Child>,
    /// The user (uid, gid) it runs as, if not ours (PostgreSQL refuses root).
    user: Option<(u32, u32)>,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(program: PathBuf, args: Vec<String>, port: u16, dir: tempfile::TempDir) -> Server {
        let mut server = Server::new(program, args, port, dir);
        server.spawn();
        server
    }

    fn new(program: PathBuf, args: Vec<String>, port: u16, dir: tempfile::TempDir) -> Server {
        Server {
            program,
            args,
            port,
            child: None,
            user: None,
            _dir: dir,
        }
    }

    fn spawn(&mut self) {
        self.spawn_only();
        self.wait_listening();
    }

    fn spawn_only(&mut self) {
        let mut command = Command::new(&self.program);
        if let Some((uid, gid)) = self.user {
            use std::os::unix::process::CommandExt;
            command.uid(uid).gid(gid);
        }
        let child = command
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {:?}: {err}", self.program));
        self.child = Some(child);
    }

    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "{:?} did not listen on port {} within 20s",
                self.program,
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again, same port, same data directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The running process's id (to SIGSTOP it), if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis server without persistence, as the seeds' lock assumes.
pub fn redis() -> Option<Server> {
    redis_with(&[])
}

/// A Redis server without persistence, with `extra` arguments after the
/// defaults (which they override: `--appendonly yes --appendfsync always`
/// for a server that keeps its keys across a restart).
pub fn redis_with(extra: &[&str]) -> Option<Server> {
    let program = binary("DEADBOLT_REDIS_SERVER", "redis-server", "redis-server")?;
    let dir = tempfile::tempdir().unwrap();
    let port = crate::free_port();
    let args = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        dir.path().to_str().unwrap(),
    ]
    .into_iter()
    .chain(extra.iter().copied())
    .map(str::to_owned)
    .collect();
    Some(Server::start(program, args, port, dir))
}

/// A Redis server without persistence that speaks only TLS (`--port 0
/// --tls-port PORT`), showing the PEM certificate `cert` with its key `key`
/// and asking clients for none (`--tls-auth-clients no`); `extra` as in
/// [`redis_with`] (say `--requirepass`). Debian's redis-server is built
/// with TLS (OpenSSL on the server's side; the client under test is rustls).
pub fn redis_tls(cert: &Path, key: &Path, ca: &Path, extra: &[&str]) -> Option<Server> {
    let program = binary("DEADBOLT_REDIS_SERVER", "redis-server", "redis-server")?;
    let dir = tempfile::tempdir().unwrap();
    let port = crate::free_port();
    let path = |path: &Path| path.to_str().expect("UTF-8 path").to_owned();
    let args = [
        "--port".to_owned(),
        "0".to_owned(),
        "--tls-port".to_owned(),
        port.to_string(),
        "--tls-cert-file".to_owned(),
        path(cert),
        "--tls-key-file".to_owned(),
        path(key),
        "--tls-ca-cert-file".to_owned(),
        path(ca),
        "--tls-auth-clients".to_owned(),
        "no".to_owned(),
        "--bind".to_owned(),
        "127.0.0.1".to_owned(),
        "--save".to_owned(),
        String::new(),
        "--appendonly".to_owned(),
        "no".to_owned(),
        "--dir".to_owned(),
        path(dir.path()),
    ]
    .into_iter()
    .chain(extra.iter().map(|arg| (*arg).to_owned()))
    .collect();
    Some(Server::start(program, args, port, dir))
}

/// A Redis Sentinel (`redis-server CONF --sentinel`, the same binary Debian's
/// redis-sentinel package runs) watching the primary on `primary_port` as
/// master `deadbolt`, alone (quorum 1): it calls the primary down after
/// 1 s without an answer and promotes a replica.
pub fn redis_sentinel(primary_port: u16) -> Option<Server> {
    let program = binary("DEADBOLT_REDIS_SERVER", "redis-server", "redis-server")?;
    let dir = tempfile::tempdir().unwrap();
    let port = crate::free_port();
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {}\n\
             sentinel monitor deadbolt 127.0.0.1 {primary_port} 1\n\
             sentinel down-after-milliseconds deadbolt 1000\n\
             sentinel failover-timeout deadbolt 3000\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let args = vec![conf.to_string_lossy().into_owned(), "--sentinel".to_owned()];
    Some(Server::start(program, args, port, dir))
}

/// A TCP load balancer (Debian's haproxy) on a free loopback port, as in
/// front of a Kubernetes Service: each new connection goes to the next of
/// `backends` in turn, and to another one when a backend refuses it or
/// failed its last health check (a TCP connect every 200 ms). It passes
/// TLS through untouched, so clients verify the nodes' own certificates.
pub fn haproxy(backends: &[std::net::SocketAddr]) -> Option<Server> {
    let program = binary("DEADBOLT_HAPROXY", "haproxy", "haproxy")?;
    let dir = tempfile::tempdir().expect("temp dir");
    let port = crate::free_port();
    let servers: String = backends
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            format!(
                "    server node{} {addr} check inter 200ms fall 1 rise 2\n",
                i + 1
            )
        })
        .collect();
    let config = format!(
        "global\n    maxconn 1024\n\
         defaults\n    mode tcp\n    timeout connect 1s\n    timeout client 1h\n    \
         timeout server 1h\n    retries 3\n    option redispatch\n\
         frontend deadbolt\n    bind 127.0.0.1:{port}\n    default_backend nodes\n\
         backend nodes\n    balance roundrobin\n{servers}"
    );
    Some(start_haproxy(program, &config, port, dir))
}

/// Runs haproxy with `config`, written into `dir`, listening on `port`.
fn start_haproxy(program: PathBuf, config: &str, port: u16, dir: tempfile::TempDir) -> Server {
    let path = dir.path().join("haproxy.cfg");
    std::fs::write(&path, config).expect("write haproxy.cfg");
    let args = vec![
        "-db".into(),
        "-f".into(),
        path.to_string_lossy().into_owned(),
    ];
    Server::start(program, args, port, dir)
}

/// An HTTP/2 proxy (Debian's haproxy in `mode http`, cleartext HTTP/2 both
/// ways) in front of `backend`: it passes gRPC on and answers anything
/// that is not HTTP itself, as an L7 proxy or an ingress would.
pub fn haproxy_http(backend: std::net::SocketAddr) -> Option<Server> {
    let program = binary("DEADBOLT_HAPROXY", "haproxy", "haproxy")?;
    let dir = tempfile::tempdir().expect("temp dir");
    let port = crate::free_port();
    let config = format!(
        "global\n    maxconn 1024\n\
         defaults\n    mode http\n    timeout connect 1s\n    timeout client 1h\n    \
         timeout server 1h\n\
         frontend deadbolt\n    bind 127.0.0.1:{port} proto h2\n    default_backend node\n\
         backend node\n    server node1 {backend} proto h2\n"
    );
    Some(start_haproxy(program, &config, port, dir))
}

/// A single-member etcd cluster.
pub fn etcd() -> Option<Server> {
    etcd_cluster(1).map(|mut members| members.remove(0))
}

/// An etcd cluster of `size` members, all started before any is waited for
/// (a member serves only once a quorum has formed).
pub fn etcd_cluster(size: usize) -> Option<Vec<Server>> {
    etcd_members(size, None)
}

/// A single-member etcd cluster whose client URL is `https://`: it shows
/// the PEM certificate `cert` with its key `key` and asks clients for none.
pub fn etcd_tls(cert: &Path, key: &Path) -> Option<Server> {
    etcd_members(1, Some((cert, key))).map(|mut members| members.remove(0))
}

fn etcd_members(size: usize, tls: Option<(&Path, &Path)>) -> Option<Vec<Server>> {
    let program = binary("DEADBOLT_ETCD", "etcd", "etcd-server")?;
    let ports: Vec<(u16, u16)> = (0..size)
        .map(|_| (crate::free_port(), crate::free_port()))
        .collect();
    let cluster = ports
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut members: Vec<Server> = ports
        .iter()
        .enumerate()
        .map(|(i, &(port, peer))| {
            let dir = tempfile::tempdir().unwrap();
            let scheme = if tls.is_some() { "https" } else { "http" };
            let client = format!("{scheme}://127.0.0.1:{port}");
            let peer = format!("http://127.0.0.1:{peer}");
            let args = [
                "--name",
                &format!("m{i}"),
                "--data-dir",
                &dir.path().join("data").to_string_lossy(),
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--initial-cluster",
                &cluster,
                "--log-level",
                "error",
            ]
            .map(str::to_owned)
            .to_vec();
            let tls_args = tls.iter().flat_map(|(cert, key)| {
                [
                    "--cert-file".to_owned(),
                    cert.to_string_lossy().into_owned(),
                    "--key-file".to_owned(),
                    key.to_string_lossy().into_owned(),
                ]
            });
            let args = args.into_iter().chain(tls_args).collect();
            Server::new(program.clone(), args, port, dir)
        })
        .collect();
    members.iter_mut().for_each(Server::spawn_only);
    members.iter().for_each(Server::wait_listening);
    Some(members)
}

/// A PostgreSQL server of its own (initdb'ed in a temporary directory) that
/// takes connections over TLS only: `hostssl ... trust` for every user from
/// 127.0.0.1, plain TCP rejected by pg_hba.conf. It shows the PEM
/// certificate `cert` with its key `key`. Connect as user `deadbolt` to
/// database `postgres`. Run as the `postgres` user when we are root (the
/// server refuses root), as in `scripts/postgres.sh`; `initdb` and
/// `postgres` (and `pg_isready`) from `initdb`'s directory on PATH or
/// Debian's `/usr/lib/postgresql/*/bin`.
pub fn postgres_tls(cert: &Path, key: &Path) -> Option<Server> {
    let Some(bin) = postgres_bin() else {
        missing(
            "PostgreSQL (initdb, postgres)",
            "install Debian's postgresql",
        );
        return None;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let user = if unsafe { libc::geteuid() } == 0 {
        let id = |flag: &str| -> u32 {
            let out = Command::new("id")
                .args([flag, "postgres"])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "no `postgres` user to run PostgreSQL as root"
            );
            String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
        };
        Some((id("-u"), id("-g")))
    } else {
        None
    };
    let own = |path: &Path| {
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
        }
    };
    own(dir.path());
    let mut initdb = Command::new(bin.join("initdb"));
    if let Some((uid, gid)) = user {
        use std::os::unix::process::CommandExt;
        initdb.uid(uid).gid(gid);
    }
    let out = initdb
        .current_dir(dir.path())
        .args([
            "-D",
            data.to_str().unwrap(),
            "-U",
            "deadbolt",
            "--auth=trust",
        ])
        .args(["-E", "UTF8", "--no-locale", "--no-sync"])
        .output()
        .expect("run initdb");
    assert!(out.status.success(), "initdb: {out:?}");
    for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
        let to = data.join(to);
        std::fs::copy(from, &to).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600)).unwrap();
        own(&to);
    }
    std::fs::write(
        data.join("pg_hba.conf"),
        "local all all trust\n\
         hostssl all all 127.0.0.1/32 trust\n\
         hostnossl all all 127.0.0.1/32 reject\n",
    )
    .unwrap();
    let port = crate::free_port();
    let args = [
        "-D",
        data.to_str().unwrap(),
        "-p",
        &port.to_string(),
        "-c",
        "listen_addresses=127.0.0.1",
        "-c",
        &format!("unix_socket_directories={}", dir.path().display()),
        "-c",
        "ssl=on",
        "-c",
        "fsync=off",
    ]
    .map(str::to_owned)
    .to_vec();
    let socket_dir = dir.path().to_owned();
    let mut server = Server::new(bin.join("postgres"), args, port, dir);
    server.user = user;
    server.spawn();
    // It listens before it is ready ("the database system is starting up").
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = Command::new(bin.join("pg_isready"))
            .args([
                "-q",
                "-h",
                socket_dir.to_str().unwrap(),
                "-p",
                &port.to_string(),
            ])
            .status()
            .expect("run pg_isready");
        if ready.success() {
            break;
        }
        assert!(Instant::now() < deadline, "PostgreSQL not ready within 30s");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(server)
}

/// The directory with `initdb` and `postgres`.
fn postgres_bin() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).find(|dir| dir.join("initdb").is_file()));
    // Debian links only some programs onto PATH: use initdb's own directory.
    let on_path = on_path.and_then(|dir| {
        let initdb = std::fs::canonicalize(dir.join("initdb")).ok()?;
        Some(initdb.parent()?.to_owned())
    });
    on_path.or_else(|| {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
            .filter(|dir| dir.join("initdb").is_file())
            .collect();
        dirs.sort();
        dirs.pop()
    })
}

/// The shared PostgreSQL server's URL.
pub fn postgres_url() -> Option<String> {
    const VAR: &str = "DEADBOLT_TEST_POSTGRES_URL";
    match std::env::var(VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            missing(
                "PostgreSQL",
                &format!("run `eval \"$(scripts/postgres.sh)\"` to set {VAR}"),
            );
            None
        }
    }
}
