//! PostgreSQL locks: session-level advisory locks on a connection of the
//! session's own, a fencing token from a sequence in the same database, and
//! a lease made of the connection.
//!
//! - Lock names become advisory-lock keys as `hashtextextended(name, 0)`, a
//!   64-bit hash PostgreSQL keeps stable across versions (hash partitioning
//!   depends on it). Two names with one hash are one lock: by the birthday
//!   bound, a collision among a million names has odds of about 3·10⁻⁸. The
//!   keys also share the database's single-bigint advisory-lock space with
//!   any other user of `pg_advisory_lock(bigint)` there.
//! - Acquire is `pg_try_advisory_lock` and, in the same statement and only if
//!   it succeeded, `nextval('deadbolt_fence')`: grants are serialised by the
//!   lock, so tokens grow with every grant of a name (and across names), and
//!   a sequence never goes back, even across a crash. A blocking acquire
//!   polls with backoff and full jitter rather than waiting in
//!   `pg_advisory_lock`: a waiting statement could not be taken back if the
//!   caller gave up (the lock would be granted later to a connection nobody
//!   listens on), and it would stall the lease's pings queued behind it.
//! - The lease is the connection: PostgreSQL releases a session's advisory
//!   locks when the connection ends, and never otherwise. A holder that
//!   hangs with its socket open (SIGSTOP, a stuck thread) would hold the
//!   lock forever, so every session sets `idle_session_timeout` to the TTL
//!   (PostgreSQL ≥ 14): the server closes a session idle that long, and the
//!   watchdog sends `SELECT 1` every TTL/3 so a live holder never is. TCP
//!   keepalives (idle 10 s) find a holder whose host vanished. The
//!   deadline is counted from the send time of the last statement answered:
//!   the server's idle clock starts later than that.
//! - Limits: a connection per session, so `max_connections` bounds holders.
//! - TLS (`sslmode=require|verify-ca|verify-full`, `sslrootcert=PATH`, as
//!   libpq names them) on rustls through `tokio-postgres-rustls`: `require`
//!   encrypts without checking the certificate (libpq's meaning, unless a
//!   `sslrootcert` is given, which makes it `verify-ca`), `verify-ca` checks
//!   the chain, `verify-full` the chain and the host name. `prefer`, which
//!   falls back to plain TCP unnoticed, is refused.

use crate::lease::{watchdog, Lease, Renewal};
use crate::target::{PostgresTls, SslMode};
use crate::{Error, ErrorKind, Lost, Token};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_postgres::{Client, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How long connecting may take, and how often TCP keepalives probe.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);

/// The sequence tokens come from; created on first use.
const FENCE_SEQUENCE: &str = "deadbolt_fence";

/// `idle_session_timeout` is PostgreSQL 14's; its SQLSTATE when missing.
const UNDEFINED_PARAMETER: &str = "42704";
/// Two sessions creating the sequence at once: one of them is told so.
const ALREADY_EXISTS: [&str; 2] = ["42P07", "23505"];

#[derive(Clone)]
pub(crate) struct Locker {
    config: Config,
    server: String,
    /// Sets `idle_session_timeout` (off only to measure what it prevents).
    idle_timeout: bool,
    /// TLS, made once (the CA file read when the `Locker` is made).
    tls: Option<(SslMode, MakeRustlsConnect)>,
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("config", &self.config) // tokio-postgres redacts the password
            .field("server", &self.server)
            .field("idle_timeout", &self.idle_timeout)
            .field("tls", &self.tls.as_ref().map(|(mode, _)| mode))
            .finish()
    }
}

/// The connection task: the socket, plain or TLS.
type Connection = Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send>>;

#[derive(Debug, Clone)]
pub(crate) struct Session {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Arc<Client>,
    lease: Lease,
    ttl: Duration,
    watchdog: AbortHandle,
    connection: AbortHandle,
    server: String,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.watchdog.abort();
        self.lease.end(Lost::Closed);
        // Closing the connection releases every advisory lock of the session.
        self.connection.abort();
    }
}

impl Locker {
    pub(crate) fn new(
        url: &str,
        idle_timeout: bool,
        tls: Option<PostgresTls>,
    ) -> Result<Locker, Error> {
        let mut config: Config = url.parse().map_err(|err| {
            Error::invalid(format!("lock URL {:?}: {err}", crate::target::redact(url)))
        })?;
        config
            .connect_timeout(CONNECT_TIMEOUT)
            .keepalives(true)
            .keepalives_idle(KEEPALIVE_IDLE)
            .application_name("deadbolt-backends");
        let hosts = config.get_hosts().len();
        let server = format!(
            "PostgreSQL ({hosts} host{}{})",
            if hosts == 1 { "" } else { "s" },
            match tls.as_ref().map(|tls| tls.mode) {
                None => "",
                Some(SslMode::Require) => ", TLS unverified",
                Some(SslMode::VerifyCa) => ", TLS verify-ca",
                Some(SslMode::VerifyFull) => ", TLS verify-full",
            }
        );
        let tls = match tls {
            None => None,
            Some(tls) => {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
                Some((tls.mode, connector(&tls, &server)?))
            }
        };
        Ok(Locker {
            server,
            config,
            idle_timeout,
            tls,
        })
    }

    pub(crate) async fn open_session(&self, ttl: Duration) -> Result<Session, Error> {
        let server = &self.server;
        let (client, connection): (Client, Connection) = match &self.tls {
            None => {
                let (client, connection) = self
                    .config
                    .connect(NoTls)
                    .await
                    .map_err(|err| connect_failure(server, err))?;
                (client, Box::pin(connection))
            }
            Some((_, tls)) => {
                let (client, connection) = self
                    .config
                    .connect(tls.clone())
                    .await
                    .map_err(|err| connect_failure(server, err))?;
                (client, Box::pin(connection))
            }
        };
        let client = Arc::new(client);
        let sent = Instant::now();
        let lease = Lease::new(sent + ttl);
        let connection = tokio::spawn({
            let lease = lease.clone();
            async move {
                let why = match connection.await {
                    Ok(()) => "the connection closed".to_owned(),
                    Err(err) => format!("the connection failed: {err}"),
                };
                lease.end(Lost::Rejected(format!(
                    "{why}; PostgreSQL released the session's advisory locks"
                )));
            }
        })
        .abort_handle();
        // 0 is PostgreSQL's "never" (`?idle_session_timeout=off`).
        let ms = if self.idle_timeout {
            ttl.as_millis().max(1)
        } else {
            0
        };
        if let Err(err) = client
            .batch_execute(&format!("SET idle_session_timeout = {ms}"))
            .await
        {
            connection.abort();
            return Err(
                if err.code().map(|c| c.code()) == Some(UNDEFINED_PARAMETER) {
                    Error::invalid(format!(
                        "{server} has no idle_session_timeout (it is PostgreSQL 13 or older): a \
                     holder hung with its socket open would hold its locks forever; use \
                     PostgreSQL 14 or later"
                    ))
                } else {
                    Error::unavailable(server, err)
                },
            );
        }
        if let Err(err) = client
            .batch_execute(&format!("CREATE SEQUENCE IF NOT EXISTS {FENCE_SEQUENCE}"))
            .await
        {
            if !err
                .code()
                .is_some_and(|c| ALREADY_EXISTS.contains(&c.code()))
            {
                connection.abort();
                return Err(Error::new(
                    crate::ErrorKind::Refused,
                    format!("{server}: cannot create sequence {FENCE_SEQUENCE}: {err}"),
                ));
            }
        }
        lease.renewed(sent + ttl);
        let watchdog = tokio::spawn(watchdog(lease.clone(), ttl / 3, {
            let (client, server) = (client.clone(), server.clone());
            move || {
                let (client, server) = (client.clone(), server.clone());
                async move {
                    let sent = Instant::now();
                    match client.simple_query("SELECT 1").await {
                        Ok(_) => Ok(Renewal::Until(sent + ttl)),
                        Err(err) if client.is_closed() => Ok(Renewal::Gone(format!(
                            "the connection closed ({err}); PostgreSQL released the session's \
                             advisory locks"
                        ))),
                        Err(err) => Err(Error::unavailable(&server, err)),
                    }
                }
            }
        }))
        .abort_handle();
        Ok(Session {
            inner: Arc::new(Inner {
                client,
                lease,
                ttl,
                watchdog,
                connection,
                server: server.clone(),
            }),
        })
    }
}

/// The lock and, in the same statement and only if it was granted, the
/// next token: grants are serialised by the lock, so tokens grow.
const TRY_LOCK: &str = "WITH taken AS MATERIALIZED \
     (SELECT pg_try_advisory_lock(hashtextextended($1, 0)) AS got) \
     SELECT CASE WHEN got THEN nextval('deadbolt_fence') END FROM taken";
const TRY_LOCK_SHARED: &str = "WITH taken AS MATERIALIZED \
     (SELECT pg_try_advisory_lock_shared(hashtextextended($1, 0)) AS got) \
     SELECT CASE WHEN got THEN nextval('deadbolt_fence') END FROM taken";

/// A held advisory lock (the session holds it; this names it).
#[derive(Debug)]
pub(crate) struct Held {
    session: Session,
    /// Taken with `pg_try_advisory_lock_shared`: released with its twin.
    shared: bool,
}

impl Session {
    pub(crate) fn lease(&self) -> &Lease {
        &self.inner.lease
    }

    /// One `pg_try_advisory_lock` (with `shared`, `..._shared`: beside
    /// other shared holders, not beside an exclusive one), and the next
    /// token if it was granted.
    pub(crate) async fn try_acquire(
        &self,
        name: &str,
        shared: bool,
    ) -> Result<Option<(Held, Token)>, Error> {
        let inner = &self.inner;
        let sent = Instant::now();
        let statement = match shared {
            true => TRY_LOCK_SHARED,
            false => TRY_LOCK,
        };
        let row = inner
            .client
            .query_one(statement, &[&name])
            .await
            .map_err(|err| Error::unavailable(&inner.server, err))?;
        // Any answered statement proves the session was not idle.
        inner.lease.renewed(sent + inner.ttl);
        let token: Option<i64> = row.get(0);
        Ok(token.map(|token| {
            let held = Held {
                session: self.clone(),
                shared,
            };
            (held, Token::Fencing(token.unsigned_abs()))
        }))
    }
}

impl Held {
    pub(crate) fn lease(&self) -> &Lease {
        self.session.lease()
    }

    pub(crate) async fn release(self, name: &str) -> Result<(), Error> {
        let inner = &self.session.inner;
        let statement = match self.shared {
            true => "SELECT pg_advisory_unlock_shared(hashtextextended($1, 0))",
            false => "SELECT pg_advisory_unlock(hashtextextended($1, 0))",
        };
        let unlocked = inner.client.query_one(statement, &[&name]).await;
        match unlocked {
            Ok(row) if row.get::<_, bool>(0) => Ok(()),
            Ok(_) => Err(Error::lost(name, "this session no longer held it")),
            Err(_) if inner.client.is_closed() => Err(Error::lost(
                name,
                "the connection closed, which released it",
            )),
            Err(err) => Err(Error::unavailable(&inner.server, err)),
        }
    }
}

/// A refused password or certificate will not get better by waiting:
/// `Refused`, with the fix; anything else `Unavailable`.
fn connect_failure(server: &str, err: tokio_postgres::Error) -> Error {
    const INVALID_PASSWORD: &str = "28P01";
    const INVALID_AUTHORIZATION: &str = "28000";
    let text = match std::error::Error::source(&err) {
        Some(cause) => format!("{err}: {cause}"),
        None => err.to_string(),
    };
    if matches!(
        err.code().map(|code| code.code()),
        Some(INVALID_PASSWORD | INVALID_AUTHORIZATION)
    ) {
        return Error::new(ErrorKind::Refused, format!("{server} refused us: {text}"));
    }
    if text.contains("certificate") || text.contains("UnknownIssuer") {
        return Error::new(
            ErrorKind::Refused,
            format!(
                "{server}: the TLS handshake failed ({text}); give the CA that signed the \
                 server's certificate as sslrootcert=PATH (verify-full also checks the host \
                 name against the certificate)"
            ),
        );
    }
    Error::unavailable(server, text)
}

/// The rustls connector for `tls`: roots from `sslrootcert` or the
/// system's, and the checks `sslmode` asks for.
fn connector(tls: &PostgresTls, server: &str) -> Result<MakeRustlsConnect, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|err| Error::invalid(format!("{server}: {err}")))?;
    let config = match tls.mode {
        SslMode::Require => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
            .with_no_client_auth(),
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let roots = Arc::new(roots(tls.ca.as_deref(), server)?);
            let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|err| Error::invalid(format!("{server}: {err}")))?;
            if tls.mode == SslMode::VerifyCa {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyName(verifier)))
                    .with_no_client_auth()
            } else {
                builder.with_webpki_verifier(verifier).with_no_client_auth()
            }
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

/// The CAs of `sslrootcert=PATH`, or the system's.
fn roots(ca: Option<&std::path::Path>, server: &str) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    let Some(ca) = ca else {
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        if roots.is_empty() {
            return Err(Error::invalid(format!(
                "{server}: no system CA certificates found; give one as sslrootcert=PATH"
            )));
        }
        return Ok(roots);
    };
    let pem = std::fs::read(ca).map_err(|err| {
        Error::invalid(format!(
            "{server}: cannot read the CA file {} (sslrootcert=): {err}",
            ca.display()
        ))
    })?;
    use rustls::pki_types::pem::PemObject;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|err| {
            Error::invalid(format!(
                "{server}: the CA file {} (sslrootcert=) is not PEM: {err}",
                ca.display()
            ))
        })?;
        roots.add(cert).map_err(|err| {
            Error::invalid(format!(
                "{server}: the CA file {} (sslrootcert=): {err}",
                ca.display()
            ))
        })?;
    }
    if roots.is_empty() {
        return Err(Error::invalid(format!(
            "{server}: the CA file {} (sslrootcert=) holds no PEM certificate",
            ca.display()
        )));
    }
    Ok(roots)
}

/// `verify-ca`: the chain checked, the host name not (libpq's meaning).
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            answer => answer,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `require` without `sslrootcert`: encrypted, any certificate taken
/// (libpq's meaning; the handshake's signatures are still checked).
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
