//! TLS as a new user would try it: certificates from `deadbolt certs`, a
//! real server, and clients nobody here wrote (`curl`, `openssl s_client`)
//! next to the `deadbolt` CLI. Every wrong way in gets a clear error and
//! changes nothing.

mod common;

use common::{deadbolt, free_port, BIN};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn make_certs(dir: &Path, args: &[&str]) {
    let out = Command::new(BIN)
        .arg("certs")
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "deadbolt certs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a node certificate for 127.0.0.1 and a client certificate.
fn pki(root: &Path) -> PathBuf {
    let dir = root.join("certs");
    make_certs(&dir, &["ca"]);
    make_certs(&dir, &["node", "--name", "node1", "--host", "127.0.0.1"]);
    make_certs(&dir, &["client", "--name", "alice"]);
    dir
}

/// A TLS server; killed when dropped.
struct Server {
    addr: SocketAddr,
    child: Child,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(root: &Path, name: &str, flags: &[String]) -> Server {
    // Leading (and so serving) once the log says so.
    start_until(root, name, flags, "leading")
}

/// Starts a server and waits until its log says `ready`.
fn start_until(root: &Path, name: &str, flags: &[String], ready: &str) -> Server {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let log = root.join(format!("{name}.log"));
    let child = Command::new(BIN)
        .args(["server", "--listen", &addr.to_string(), "--data-dir"])
        .arg(root.join(name))
        .args(flags)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let server = Server { addr, child, log };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&server.log)
        .unwrap()
        .contains(ready)
    {
        assert!(
            Instant::now() < deadline,
            "{}",
            std::fs::read_to_string(&server.log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

fn tls_flags(certs: &Path, mutual: bool) -> Vec<String> {
    let file = |name: &str| certs.join(name).to_string_lossy().into_owned();
    let mut flags = vec![
        "--tls-cert".into(),
        file("node1.pem"),
        "--tls-key".into(),
        file("node1-key.pem"),
    ];
    if mutual {
        flags.extend(["--tls-client-ca".into(), file("ca.pem")]);
    }
    flags
}

fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .unwrap()
}

/// The token `deadbolt acquire` printed (`HANDLE TOKEN`).
fn granted_token(out: &Output) -> u64 {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let token = stdout.split_whitespace().last();
    token
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no token in {stdout:?}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn curl_and_openssl_reach_a_tls_server_and_every_wrong_way_in_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let certs = pki(root.path());
    let server = start(root.path(), "data", &tls_flags(&certs, true));
    let url = format!("https://{}/health", server.addr);
    let path = |name: &str| certs.join(name).to_string_lossy().into_owned();
    let (ca, cert, key) = (path("ca.pem"), path("alice.pem"), path("alice-key.pem"));

    let ok = curl(&["--cacert", &ca, "--cert", &cert, "--key", &key, &url]);
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(text(&ok).contains("\"leader\":true"), "{}", text(&ok));

    // No client certificate: the handshake is refused.
    let anonymous = curl(&["--cacert", &ca, &url]);
    assert!(!anonymous.status.success(), "{}", text(&anonymous));

    // A server certificate from a CA the client does not trust.
    let other = root.path().join("other");
    make_certs(&other, &["ca"]);
    let wrong_ca = curl(&[
        "--cacert",
        &other.join("ca.pem").to_string_lossy(),
        "--cert",
        &cert,
        "--key",
        &key,
        &url,
    ]);
    assert_eq!(wrong_ca.status.code(), Some(60), "{}", text(&wrong_ca));

    // A client certificate from another CA.
    make_certs(&other, &["client", "--name", "mallory"]);
    let stranger = curl(&[
        "--cacert",
        &ca,
        "--cert",
        &other.join("mallory.pem").to_string_lossy(),
        "--key",
        &other.join("mallory-key.pem").to_string_lossy(),
        &url,
    ]);
    assert!(!stranger.status.success(), "{}", text(&stranger));

    // An expired client certificate from the right CA.
    let (expired, expired_key) = expired_client_cert(&certs, root.path());
    let late = curl(&[
        "--cacert",
        &ca,
        "--cert",
        &expired,
        "--key",
        &expired_key,
        &url,
    ]);
    assert!(!late.status.success(), "{}", text(&late));

    // Plain text to the TLS port: an error that says what to do.
    let plain = curl(&[&format!("http://{}/health", server.addr)]);
    assert!(
        text(&plain).contains("speaks TLS only: use https://"),
        "{}",
        text(&plain)
    );

    // openssl s_client: the chain verifies, and the server asks for a
    // client certificate.
    let s_client = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &server.addr.to_string(),
            "-CAfile",
            &ca,
            "-cert",
            &cert,
            "-key",
            &key,
            "-brief",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = text(&s_client);
    assert!(said.contains("Verification: OK"), "{said}");

    // The refusals changed nothing: no session was opened.
    let after = curl(&["--cacert", &ca, "--cert", &cert, "--key", &key, &url]);
    assert!(text(&after).contains("\"sessions\":0"), "{}", text(&after));
}

/// A client certificate for `expired` that ran out yesterday, signed by the
/// CA in `certs`.
fn expired_client_cert(certs: &Path, root: &Path) -> (String, String) {
    let ca_key =
        rcgen::KeyPair::from_pem(&std::fs::read_to_string(certs.join("ca-key.pem")).unwrap())
            .unwrap();
    let ca = rcgen::CertificateParams::from_ca_cert_pem(
        &std::fs::read_to_string(certs.join("ca.pem")).unwrap(),
    )
    .unwrap()
    .self_signed(&ca_key)
    .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "expired");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(30);
    params.not_after = now - time::Duration::days(1);
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    let (cert_path, key_path) = (root.join("expired.pem"), root.join("expired-key.pem"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (
        cert_path.to_string_lossy().into_owned(),
        key_path.to_string_lossy().into_owned(),
    )
}

#[test]
fn the_cli_speaks_mutual_tls_and_says_what_is_missing() {
    let root = tempfile::tempdir().unwrap();
    let certs = pki(root.path());
    let server = start(root.path(), "data", &tls_flags(&certs, true));
    let endpoint = format!("https://{}", server.addr);
    let path = |name: &str| certs.join(name).to_string_lossy().into_owned();
    let with_cert = [
        "--ca",
        &path("ca.pem"),
        "--cert",
        &path("alice.pem"),
        "--key",
        &path("alice-key.pem"),
    ];

    let mut args = with_cert.to_vec();
    args.extend(["acquire", "--lock", "tls-lock"]);
    let out = deadbolt(&endpoint, &args);
    assert!(out.status.success(), "{}", text(&out));
    let mut args = with_cert.to_vec();
    args.extend(["status", "--lock", "tls-lock"]);
    assert!(text(&deadbolt(&endpoint, &args)).contains("held by session"));

    // https:// without --ca, and --ca without the client certificate.
    let out = deadbolt(&endpoint, &["status", "--lock", "tls-lock"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("--ca"), "{}", text(&out));
    let out = deadbolt(
        &endpoint,
        &["--ca", &path("ca.pem"), "status", "--lock", "tls-lock"],
    );
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
    // rustls's alert names the missing certificate when it reaches the
    // client before the connection closes (then the message says to give
    // --cert and --key); either way the client cannot get in.
    assert!(text(&out).contains("could not reach"), "{}", text(&out));
}

#[test]
fn plain_text_beyond_loopback_is_refused_unless_insecure() {
    let root = tempfile::tempdir().unwrap();
    let listen = format!("0.0.0.0:{}", free_port());
    let out = Command::new(BIN)
        .args(["server", "--listen", &listen, "--data-dir"])
        .arg(root.path().join("data"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("without TLS") && text(&out).contains("--insecure"),
        "{}",
        text(&out)
    );
    assert!(
        !root.path().join("data").exists(),
        "the refusal created the data directory"
    );

    let mut insecure = Command::new(BIN)
        .args(["server", "--insecure", "--listen", &listen, "--data-dir"])
        .arg(root.path().join("data"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let health = format!(
        "http://127.0.0.1:{}/health",
        listen.rsplit(':').next().unwrap()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !curl(&["-f", &health]).status.success() {
        assert!(
            Instant::now() < deadline,
            "the --insecure server never served"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    insecure.kill().unwrap();
    let out = insecure.wait_with_output().unwrap();
    assert!(text(&out).contains("no encryption"), "{}", text(&out));
}

#[test]
fn certificates_rotate_on_sighup_and_a_bad_file_keeps_the_old_ones() {
    let root = tempfile::tempdir().unwrap();
    let certs = pki(root.path());
    let server = start(root.path(), "data", &tls_flags(&certs, false));
    let url = format!("https://{}/health", server.addr);
    let old_ca = root.path().join("old-ca.pem");
    std::fs::copy(certs.join("ca.pem"), &old_ca).unwrap();

    // A new CA and node certificate in place of the old ones.
    let fresh = root.path().join("fresh");
    certs_into(&fresh);
    for file in ["node1.pem", "node1-key.pem"] {
        std::fs::copy(fresh.join(file), certs.join(file)).unwrap();
    }
    sighup(&server);
    wait_for(|| {
        curl(&["--cacert", &fresh.join("ca.pem").to_string_lossy(), &url])
            .status
            .success()
    });
    assert!(!curl(&["--cacert", &old_ca.to_string_lossy(), &url])
        .status
        .success());

    // A broken key: refused with a log line, the certificates in use stay.
    std::fs::write(certs.join("node1-key.pem"), "not a key").unwrap();
    sighup(&server);
    wait_for(|| {
        std::fs::read_to_string(&server.log)
            .unwrap()
            .contains("were refused")
    });
    assert!(
        curl(&["--cacert", &fresh.join("ca.pem").to_string_lossy(), &url])
            .status
            .success()
    );
}

fn certs_into(dir: &Path) {
    make_certs(dir, &["ca"]);
    make_certs(dir, &["node", "--name", "node1", "--host", "127.0.0.1"]);
}

fn sighup(server: &Server) {
    common::signal(server.child.id() as i32, libc::SIGHUP);
}

fn wait_for(mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Three nodes that only speak mutual TLS, to clients and to each other:
/// they form a cluster, grant, and carry on after the leader is killed.
#[test]
fn a_three_node_cluster_over_mutual_tls_forms_grants_and_fails_over() {
    let root = tempfile::tempdir().unwrap();
    let certs = pki(root.path());
    let addrs: Vec<SocketAddr> = (0..3)
        .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
        .collect();
    let members = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    // Killed when dropped, also when an assertion below fails.
    let mut nodes: Vec<Option<Server>> = (0..3)
        .map(|i| {
            let mut flags = tls_flags(&certs, true);
            flags.extend([
                "--node-id".into(),
                (i + 1).to_string(),
                "--initial-cluster".into(),
                members.clone(),
            ]);
            let log = root.path().join(format!("node{}.log", i + 1));
            let child = Command::new(BIN)
                .args(["server", "--listen", &addrs[i].to_string(), "--data-dir"])
                .arg(root.path().join(format!("node{}", i + 1)))
                .args(&flags)
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            Some(Server {
                addr: addrs[i],
                child,
                log,
            })
        })
        .collect();
    let endpoint = addrs
        .iter()
        .map(|a| format!("https://{a}"))
        .collect::<Vec<_>>()
        .join(",");
    let path = |name: &str| certs.join(name).to_string_lossy().into_owned();
    let run_at = |endpoint: &str, args: &[&str]| {
        let mut all = vec![
            "--ca".to_owned(),
            path("ca.pem"),
            "--cert".into(),
            path("alice.pem"),
            "--key".into(),
            path("alice-key.pem"),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        deadbolt(endpoint, &all)
    };
    let run = |args: &[&str]| run_at(&endpoint, args);
    let logs = || {
        (1..=3)
            .map(|i| {
                std::fs::read_to_string(root.path().join(format!("node{i}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        let out = run(&["cluster", "status", "--json"]);
        if out.status.success() {
            let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if let Some(leader) = status["leader"].as_u64().filter(|l| *l > 0) {
                break leader;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader: {}\n{}",
            text(&out),
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // Access control on: alice's certificate names her, and she may do
    // nothing until granted; bob has a token. Both only for lock "ha".
    let root = run(&["acl", "bootstrap"]);
    assert!(root.status.success(), "{}", text(&root));
    let root = String::from_utf8(root.stdout).unwrap().trim().to_owned();
    let admin = |args: &[&str]| {
        let mut all = vec!["--access-token", root.as_str()];
        all.extend(args);
        let out = run(&all);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let refused = run(&["acquire", "--lock", "ha"]);
    assert_eq!(refused.status.code(), Some(77), "{}", text(&refused));
    assert!(
        text(&refused).contains(r#"identity "alice""#),
        "{}",
        text(&refused)
    );
    admin(&["acl", "role", "put", "ha", "lock:ha", "read:ha"]);
    admin(&["acl", "grant", "alice", "ha"]);
    admin(&["acl", "grant", "bob", "ha"]);
    let bob = admin(&["acl", "token", "create", "bob"]);

    let first = run(&["acquire", "--lock", "ha", "--ttl", "2s"]);
    assert!(first.status.success(), "{}\n{}", text(&first), logs());
    let first_token = granted_token(&first);
    // Given only a follower, the CLI is served through it (it forwards to
    // the leader, forwarding.rs), over the same mutual TLS.
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let follower = format!("https://{}", addrs[(follower - 1) as usize]);
    let status = run_at(
        &follower,
        &["--access-token", &bob, "status", "--lock", "ha"],
    );
    assert!(status.status.success(), "{}", text(&status));
    assert!(
        text(&status).contains(&first_token.to_string()),
        "{}",
        text(&status)
    );

    drop(nodes[(leader - 1) as usize].take());
    // The holder's session lapses (2 s TTL) and a new leader grants anew,
    // to bob: his token, made before, works on the new leader.
    let deadline = Instant::now() + Duration::from_secs(30);
    let second = loop {
        let out = run(&[
            "--access-token",
            &bob,
            "acquire",
            "--lock",
            "ha",
            "--wait",
            "5s",
        ]);
        if out.status.success() {
            break out;
        }
        assert!(
            Instant::now() < deadline,
            "no grant after the leader died: {}\n{}",
            text(&out),
            logs()
        );
    };
    let second_token = granted_token(&second);
    assert!(second_token > first_token);
    let history = run(&["--access-token", &bob, "history", "--lock", "ha", "--json"]);
    let history: serde_json::Value = serde_json::from_slice(&history.stdout).unwrap();
    let holders: Vec<(&str, &str)> = history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["what"].as_str().unwrap(), e["identity"].as_str().unwrap()))
        .collect();
    assert_eq!(
        holders,
        [
            ("granted", "alice"),
            ("expired", "alice"),
            ("granted", "bob")
        ]
    );
}

/// The Raft service shares the client port, so over TLS it checks who
/// calls: a client certificate from the cluster's own CA is refused before
/// the message is even decoded; a node certificate gets through to Raft.
/// The nodes wait to join a cluster: a single node serves no peer at all
/// (`peer_door.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_cannot_speak_raft() {
    use deadbolt_proto::v1::raft_peer_client::RaftPeerClient;
    use deadbolt_proto::v1::RaftPayload;
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

    let root = tempfile::tempdir().unwrap();
    let certs = pki(root.path());
    let joining = |name: &str, flags: &[String]| {
        let mut flags = flags.to_vec();
        flags.push("--join".to_owned());
        tokio::task::block_in_place(|| {
            start_until(root.path(), name, &flags, "waiting to be added")
        })
    };
    let server = joining("data", &tls_flags(&certs, true));
    let read = |name: &str| std::fs::read(certs.join(name)).unwrap();
    // A forged vote to `server`, over TLS with the certificate `name`.
    let vote = |server: &Server, name: &str| {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read("ca.pem")))
            .identity(Identity::from_pem(
                read(&format!("{name}.pem")),
                read(&format!("{name}-key.pem")),
            ));
        let endpoint = Endpoint::from_shared(format!("https://{}", server.addr))
            .unwrap()
            .tls_config(tls)
            .unwrap();
        async move {
            let channel = endpoint.connect().await.unwrap();
            RaftPeerClient::new(channel)
                .vote(RaftPayload {
                    data: b"forged".to_vec(),
                })
                .await
                .unwrap_err()
        }
    };
    let refused = vote(&server, "alice").await;
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("not a node certificate"),
        "{refused:?}"
    );
    let undecodable = vote(&server, "node1").await;
    assert_eq!(
        undecodable.code(),
        tonic::Code::InvalidArgument,
        "{undecodable:?}"
    );

    // With --peer-names, a node certificate of another name is refused too.
    let mut flags = tls_flags(&certs, true);
    flags.extend(["--peer-names".to_owned(), "node2,node3".to_owned()]);
    let listed = joining("listed", &flags);
    let refused = vote(&listed, "node1").await;
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("--peer-names does not list")
            && refused.message().contains("node1"),
        "{refused:?}"
    );
}
