//! Deadbolt backend for lockbench (`/work/shared/lockbench`), so that Deadbolt can be
//! measured with the same harness and workloads as etcd, Redis and PostgreSQL.
//!
//! This file is not part of the Deadbolt workspace: `scripts/lockbench.sh` copies lockbench
//! to a scratch directory, drops this file in as `src/backends/deadbolt.rs`, registers the
//! `deadbolt://host:port[,host:port...]` scheme and adds `deadbolt-client` as a path
//! dependency.
//!
//! Recipe: each simulated client is one `Client::connect` (its own gRPC connection) and one
//! `Session` opened at connect, whose watchdog renews the lease every TTL/3. `acquire` is
//! `Session::lock` (blocks on the server, FIFO); `release` is `LockGuard::release`. The
//! fencing token is the grant token, which grows with every grant.
//!
//! Crash (expiry workload): the session and its guards are dropped on a thread outside the
//! tokio runtime. `Session`'s and `LockGuard`'s `Drop` then only stop the watchdog: with no
//! runtime to spawn on they send neither a release nor a close, so the locks stay held
//! until the server expires the lease, as for a killed or hung process. The harness then
//! drops this client (`--crash close`: the gRPC connection closes) or keeps it (`--crash
//! hang`: the connection stays open but sends nothing).
use crate::backend::{Backend, ClientOpts, Held, LockClient, LockLost};
use anyhow::{Context, Result, anyhow, bail};
use async_trait::async_trait;
use deadbolt_client::{Client, ErrorKind, LockGuard, Session};
use std::collections::HashMap;
use std::time::Duration;

pub struct DeadboltBackend {
    endpoints: Vec<String>,
}

impl DeadboltBackend {
    pub fn new(url: &str) -> Result<Self> {
        let rest = url.strip_prefix("deadbolt://").context("deadbolt url")?;
        let endpoints: Vec<String> = rest
            .trim_end_matches('/')
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|hp| format!("http://{hp}"))
            .collect();
        if endpoints.is_empty() {
            bail!("deadbolt url has no endpoints");
        }
        Ok(Self { endpoints })
    }
}

#[async_trait]
impl Backend for DeadboltBackend {
    fn kind(&self) -> &'static str {
        "deadbolt"
    }
    fn recipe(&self) -> String {
        "deadbolt session (watchdog keepalive TTL/3) + blocking FIFO Acquire / Release over gRPC; raft (openraft) single node, redb fsync per batch; fencing token = grant token"
            .to_string()
    }
    async fn connect(&self, o: &ClientOpts) -> Result<Box<dyn LockClient>> {
        let client = Client::connect(self.endpoints.iter().cloned())
            .await
            .with_context(|| format!("client {}: connect to {:?}", o.client_id, self.endpoints))?;
        let session = client
            .open_session(o.ttl)
            .await
            .with_context(|| format!("client {}: open session (ttl {:?})", o.client_id, o.ttl))?;
        let eff = session.ttl();
        Ok(Box::new(DeadboltLock { client, session: Some(session), guards: HashMap::new(), eff }))
    }
}

pub struct DeadboltLock {
    /// Kept apart from the session so that after `crash` the connection can stay open
    /// (hung process) while the session's watchdog is gone.
    #[allow(dead_code)]
    client: Client,
    /// `None` after `crash`.
    session: Option<Session>,
    /// Held locks by fencing token (which `Held::token` carries, big-endian).
    guards: HashMap<u64, LockGuard>,
    eff: Duration,
}

/// Whether a release error means the lock had already been lost (see `LockGuard::release`).
fn is_lost(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::StaleToken | ErrorKind::NotHolder | ErrorKind::UnknownSession | ErrorKind::SessionExpiring
    )
}

#[async_trait]
impl LockClient for DeadboltLock {
    async fn acquire(&mut self, name: &str) -> Result<Held> {
        let session = self.session.as_ref().ok_or_else(|| anyhow!("deadbolt client has crashed"))?;
        let guard = session.lock(name).await.with_context(|| format!("lock {name:?}"))?;
        let token = guard.token();
        let fence = i64::try_from(token).with_context(|| format!("fencing token {token} does not fit in i64"))?;
        if let Some(old) = self.guards.insert(token, guard) {
            // Two grants with one token would be a server bug; keep the evidence.
            let dup = old.token();
            std::mem::forget(old);
            bail!("lock {name:?}: token {dup} granted twice to this client");
        }
        Ok(Held { name: name.to_string(), token: token.to_be_bytes().to_vec(), fence: Some(fence) })
    }

    async fn release(&mut self, held: Held) -> Result<()> {
        let bytes: [u8; 8] = held.token.as_slice().try_into().map_err(|_| anyhow!("bad deadbolt token {:?}", held.token))?;
        let token = u64::from_be_bytes(bytes);
        let guard = self
            .guards
            .remove(&token)
            .ok_or_else(|| anyhow!("release {:?}: no guard for token {token}", held.name))?;
        match guard.release().await {
            Ok(()) => Ok(()),
            Err(e) if is_lost(e.kind()) => Err(anyhow::Error::new(LockLost)),
            Err(e) => Err(anyhow::Error::new(e).context(format!("release {:?} token {token}", held.name))),
        }
    }

    async fn crash(&mut self) {
        let session = self.session.take();
        let guards = std::mem::take(&mut self.guards);
        // Dropped where there is no runtime: the watchdog is aborted and nothing is released
        // or closed (see the module comment).
        let dropper = std::thread::spawn(move || {
            drop(guards);
            drop(session);
        });
        let _ = tokio::task::spawn_blocking(move || dropper.join()).await;
    }

    async fn close(mut self: Box<Self>) {
        if let Some(session) = self.session.take() {
            // Closing the session releases whatever it still holds, and makes the guards'
            // drops no-ops.
            let _ = tokio::time::timeout(Duration::from_secs(5), session.close()).await;
        }
        self.guards.clear();
    }

    fn effective_ttl(&self) -> Option<Duration> {
        Some(self.eff)
    }
}
