//! TLS on the client port and between peers, on rustls (no OpenSSL).
//!
//! Why one module: the node's certificate serves clients, and is also the
//! identity it presents to its peers; the CA given with `--tls-client-ca`
//! verifies client certificates and, in a cluster, the peers' certificates.
//! One set of files, loaded and reloaded in one place.
//!
//! Reloading: SIGHUP re-reads the files (`reload_on_sighup` in lib.rs). New connections use the new
//! certificates; open ones keep theirs (a rotation drops nobody). A file
//! that cannot be read or does not parse is refused with a log line, and
//! the old certificates stay in use.

use rustls_pemfile::Item;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// Who is at the other end of a TLS connection, from the certificate it
/// showed; put into every request's extensions by the listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsClient {
    /// The certificate's common name; `None` without a client certificate.
    pub name: Option<String>,
    /// A node certificate: valid for server authentication (what `deadbolt
    /// certs node` makes, and what a node needs to serve TLS at all).
    /// Client certificates (`deadbolt certs client`) are not.
    pub node: bool,
}

impl TlsClient {
    /// From the certificates a client showed (its own first); a certificate
    /// rustls accepted but x509-parser cannot read counts as none.
    pub fn from_chain(chain: Option<&[CertificateDer<'_>]>) -> TlsClient {
        let parsed = chain
            .and_then(|chain| chain.first())
            .and_then(|leaf| x509_parser::parse_x509_certificate(leaf).ok());
        let Some((_, cert)) = parsed else {
            return TlsClient {
                name: None,
                node: false,
            };
        };
        let name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        let node = matches!(cert.extended_key_usage(), Ok(Some(usage)) if usage.value.server_auth);
        TlsClient { name, node }
    }
}

/// The files a TLS node is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// This node's certificate chain (PEM), for clients and peers.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// With it, every client and peer must present a certificate signed by
    /// one of these CAs (mTLS); peers' server certificates are checked
    /// against it too.
    pub client_ca: Option<PathBuf>,
    /// When not empty, the only node certificate names that may speak Raft
    /// to this node (`--peer-names`).
    pub peer_names: Vec<String>,
}

/// The node's TLS settings as last loaded.
pub struct NodeTls {
    files: TlsFiles,
    server: RwLock<Arc<ServerConfig>>,
    peers: RwLock<Option<ClientTlsConfig>>,
    /// How many reloads took: a channel kept between calls is keyed on it,
    /// as a tonic channel reconnects with the settings it was built with.
    reloads: AtomicU64,
}

impl NodeTls {
    /// Loads the files; the error names the one that is wrong and how.
    pub fn load(files: TlsFiles) -> Result<NodeTls, String> {
        let (server, peers) = load(&files)?;
        Ok(NodeTls {
            files,
            server: RwLock::new(server),
            peers: RwLock::new(peers),
            reloads: AtomicU64::new(0),
        })
    }

    /// Re-reads the files; on any error the settings in use stay.
    pub fn reload(&self) -> Result<(), String> {
        let (server, peers) = load(&self.files)?;
        *self.server.write().expect("tls lock poisoned") = server;
        *self.peers.write().expect("tls lock poisoned") = peers;
        self.reloads.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Changes with every reload that took.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Acquire)
    }

    /// For the next accepted connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.server.read().expect("tls lock poisoned").clone())
    }

    /// How to dial a peer: `None` without `--tls-client-ca`, which a TLS
    /// cluster needs (peers authenticate each other with it).
    pub fn peer_config(&self) -> Option<ClientTlsConfig> {
        self.peers.read().expect("tls lock poisoned").clone()
    }

    pub fn mutual(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// Whether a node certificate named `name` may speak Raft here.
    pub fn peer_allowed(&self, name: Option<&str>) -> bool {
        let names = &self.files.peer_names;
        names.is_empty() || name.is_some_and(|name| names.iter().any(|n| n == name))
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|err| format!("cannot read the {what} {}: {err}", path.display()))
}

fn certificates(
    pem: &[u8],
    path: &Path,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| format!("the {what} {} is not PEM: {err}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "the {what} {} holds no certificate",
            path.display()
        ));
    }
    Ok(certs)
}

fn private_key(pem: &[u8], path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let bad = |why: String| format!("the key {} {why}", path.display());
    for item in rustls_pemfile::read_all(&mut &pem[..]) {
        match item.map_err(|err| bad(format!("is not PEM: {err}")))? {
            Item::Pkcs1Key(key) => return Ok(key.into()),
            Item::Pkcs8Key(key) => return Ok(key.into()),
            Item::Sec1Key(key) => return Ok(key.into()),
            _ => {}
        }
    }
    Err(bad("holds no private key".into()))
}

fn load(files: &TlsFiles) -> Result<(Arc<ServerConfig>, Option<ClientTlsConfig>), String> {
    let cert_pem = read(&files.cert, "certificate")?;
    let key_pem = read(&files.key, "key")?;
    let chain = certificates(&cert_pem, &files.cert, "certificate")?;
    let key = private_key(&key_pem, &files.key)?;
    let builder = ServerConfig::builder();
    let (builder, peers) = match &files.client_ca {
        Some(path) => {
            let ca_pem = read(path, "client CA")?;
            let mut roots = RootCertStore::empty();
            for ca in certificates(&ca_pem, path, "client CA")? {
                roots.add(ca).map_err(|err| {
                    format!("the client CA {} is unusable: {err}", path.display())
                })?;
            }
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .map_err(|err| format!("the client CA {} is unusable: {err}", path.display()))?;
            let peers = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&ca_pem))
                .identity(Identity::from_pem(&cert_pem, &key_pem));
            (builder.with_client_cert_verifier(verifier), Some(peers))
        }
        None => (builder.with_no_client_auth(), None),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|err| {
        format!(
            "the certificate {} and key {} do not go together: {err}",
            files.cert.display(),
            files.key.display()
        )
    })?;
    // gRPC needs HTTP/2; curl and browsers may take either; the Rust
    // client asks for framed calls (`frames.rs`) this way.
    config.alpn_protocols = vec![
        b"h2".to_vec(),
        b"http/1.1".to_vec(),
        deadbolt_proto::frames::ALPN.to_vec(),
    ];
    Ok((Arc::new(config), peers))
}

/// SIGHUPs from now on. Called as soon as the TLS files are loaded: until a
/// handler is installed, a SIGHUP would end the process.
pub fn hangups() -> Option<Signal> {
    match signal(SignalKind::hangup()) {
        Ok(hangups) => Some(hangups),
        Err(err) => {
            tracing::warn!(%err, "cannot install the SIGHUP handler: certificates and the cluster secret reload only on restart");
            None
        }
    }
}
