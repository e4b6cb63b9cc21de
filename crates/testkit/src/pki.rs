//! Certificates for a test cluster whose nodes require mutual TLS, made by
//! the binary under test (`deadbolt certs`), and the clients that use them:
//! the Rust client's [`TlsOptions`], the CLI's flags, and a blocking
//! HTTPS exchange on rustls for the kit's status probes.
//!
//! Why a module of its own: the fault-injection suite runs the same cluster
//! over mutual TLS (`deadbolt-nemesis run --secure`), so every part of the
//! kit that talks to a node (starting it, probing it, connecting clients)
//! needs the same files.

use deadbolt_client::TlsOptions;
use rustls::pki_types::ServerName;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// A CA, one node certificate for 127.0.0.1 (every node shows the same
/// one; they all listen on loopback), and one client certificate.
#[derive(Debug, Clone)]
pub struct TestPki {
    dir: PathBuf,
    client: String,
}

impl TestPki {
    /// Makes the files in `dir` with `bin certs ...`; the client
    /// certificate is named `client` (its identity, once access control is
    /// on).
    pub fn create(bin: &Path, dir: &Path, client: &str) -> TestPki {
        for args in [
            &["ca"][..],
            &["node", "--name", "node", "--host", "127.0.0.1"],
            &["client", "--name", client],
        ] {
            let out = Command::new(bin)
                .arg("certs")
                .args(args)
                .arg("--dir")
                .arg(dir)
                .output()
                .expect("run deadbolt certs");
            assert!(out.status.success(), "deadbolt certs {args:?}: {out:?}");
        }
        TestPki {
            dir: dir.to_owned(),
            client: client.to_owned(),
        }
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// `deadbolt server` flags for mutual TLS.
    pub fn server_flags(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.file("node.pem"),
            "--tls-key".into(),
            self.file("node-key.pem"),
            "--tls-client-ca".into(),
            self.file("ca.pem"),
        ]
    }

    /// Client flags of every `deadbolt` command (and the nemesis worker).
    pub fn client_flags(&self) -> Vec<String> {
        vec![
            "--ca".into(),
            self.file("ca.pem"),
            "--cert".into(),
            self.file(&format!("{}.pem", self.client)),
            "--key".into(),
            self.file(&format!("{}-key.pem", self.client)),
        ]
    }

    /// The Rust client's TLS settings.
    pub fn tls_options(&self) -> TlsOptions {
        let path = |name: String| PathBuf::from(self.file(&name));
        TlsOptions::from_files(
            Some(&path("ca.pem".into())),
            Some(&path(format!("{}.pem", self.client))),
            Some(&path(format!("{}-key.pem", self.client))),
        )
        .expect("the test certificates load")
    }

    /// A blocking HTTPS/1.1 GET with the client certificate: status and
    /// body.
    pub fn get(&self, addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
        let config = self.rustls_config()?;
        let name = ServerName::IpAddress(addr.ip().into());
        let connection =
            rustls::ClientConnection::new(config, name).map_err(std::io::Error::other)?;
        let socket = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        socket.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut stream = rustls::StreamOwned::new(connection, socket);
        let head = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        stream.write_all(head.as_bytes())?;
        let mut response = Vec::new();
        // A server that closes without close_notify still sent its answer.
        match stream.read_to_end(&mut response) {
            Ok(_) => {}
            Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof => {}
            Err(err) => return Err(err),
        }
        crate::parse_response(&response)
    }

    fn rustls_config(&self) -> std::io::Result<Arc<rustls::ClientConfig>> {
        let read = |name: &str| std::fs::read(self.dir.join(name));
        let certs =
            |pem: Vec<u8>| rustls_pemfile::certs(&mut &pem[..]).collect::<Result<Vec<_>, _>>();
        let mut roots = rustls::RootCertStore::empty();
        for ca in certs(read("ca.pem")?)? {
            roots.add(ca).map_err(std::io::Error::other)?;
        }
        let chain = certs(read(&format!("{}.pem", self.client))?)?;
        let key =
            rustls_pemfile::private_key(&mut &read(&format!("{}-key.pem", self.client))?[..])?
                .ok_or_else(|| std::io::Error::other("no private key"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(std::io::Error::other)?;
        Ok(Arc::new(config))
    }
}
