//! The Rust client for Deadbolt, a distributed lock service whose locks come
//! with fencing tokens.
//!
//! A [`Client`] connects to the cluster. A [`Session`] is a lease: a
//! background watchdog renews it every third of its TTL, and every lock the
//! session takes lasts only as long as the lease does. A [`LockGuard`] is a
//! held lock and its fencing token.
//!
//! A session is also a capability: the server gives a secret to the client
//! that opens it and refuses any call on the session without it, so the
//! session ids and tokens that anyone can read from `status` cannot be used
//! to release your locks. `Session` keeps the secret and sends it for you;
//! [`Session::handle`] hands it out, as a [`SessionHandle`], for code that
//! must act on the session elsewhere.
//!
//! A lease can be lost without the holder noticing in time: a long GC pause,
//! a suspended VM, a network partition. Deadbolt offers two defences, and
//! careful callers use both:
//!
//! - [`Session::lost`] completes when the client can no longer be sure it
//!   holds the lease (with a safety margin of your choosing), so work can
//!   stop before another client takes over.
//! - [`LockGuard::token`] grows with every grant, so a resource that
//!   remembers the highest token it has seen can refuse a write from a
//!   holder that was paused past its lease.
//!
//! Runnable versions of the examples below, against a local server:
//! `cargo run -p deadbolt-client --example cron_dedupe` (also `long_task`,
//! `fenced_write`); and of the other primitives: `semaphore` (permits,
//! each with a slot and a token), `election` (candidates and an observer,
//! [`Client::observe_leader`]) and `watch` (every event under a prefix,
//! [`Client::watch`], resumable after any event).
//!
//! # Run a cron job on one host only
//!
//! Every host runs the job; whichever takes the lock first does the work and
//! the others skip it.
//!
//! ```no_run
//! use deadbolt_client::Client;
//! use std::time::Duration;
//!
//! # async fn send_nightly_report() {}
//! # async fn run() -> Result<(), deadbolt_client::Error> {
//! let client = Client::connect(["http://127.0.0.1:7070"]).await?;
//! let session = client.open_session(Duration::from_secs(30)).await?;
//! match session.try_lock("cron/nightly-report").await? {
//!     Some(guard) => {
//!         send_nightly_report().await;
//!         guard.release().await?;
//!     }
//!     None => println!("another host is sending the report"),
//! }
//! session.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Hold a lock for a long task
//!
//! The watchdog renews the lease for as long as the task runs. Race the task
//! against [`Session::lost`] so that it stops, with a margin to spare, if
//! renewal fails.
//!
//! ```no_run
//! use deadbolt_client::Client;
//! use std::time::Duration;
//!
//! # async fn rebuild_search_index() {}
//! # async fn run() -> Result<(), deadbolt_client::Error> {
//! let client = Client::connect(["127.0.0.1:7070"]).await?;
//! let session = client.open_session(Duration::from_secs(15)).await?;
//! let guard = session.lock("search-index").await?;
//! tokio::select! {
//!     () = rebuild_search_index() => guard.release().await?,
//!     reason = session.lost(Duration::from_secs(3)) => {
//!         eprintln!("stopped the rebuild: {reason}");
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Fence the writes a lock protects
//!
//! The resource keeps the highest token it has accepted and refuses anything
//! older, so a holder that lost its lock without knowing cannot overwrite
//! the work of the one that took it next.
//!
//! ```no_run
//! use deadbolt_client::Client;
//! use std::time::Duration;
//!
//! # struct Storage;
//! # impl Storage {
//! #     /// Writes only if `token` is at least the highest token seen for `key`.
//! #     async fn write_fenced(&self, key: &str, token: u64, value: &[u8]) -> Result<(), String> { Ok(()) }
//! # }
//! # async fn run(storage: Storage) -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::connect(["http://127.0.0.1:7070"]).await?;
//! let session = client.open_session(Duration::from_secs(10)).await?;
//! let guard = session.lock("accounts/42").await?;
//! storage
//!     .write_fenced("accounts/42", guard.token(), b"balance=100")
//!     .await?;
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

mod backoff;
mod calls;
mod client;
mod clock;
mod election;
mod error;
mod framed;
mod handle;
mod http_get;
mod link;
mod lock;
mod session;
#[doc(hidden)]
pub mod simulation;
mod watch;

pub use backoff::Backoff;
pub use client::{Client, Stored, TlsOptions};
pub use deadbolt_proto::v1::{
    AclGrant, AclIdentity, AclRole, AclShowResponse, AclTokenInfo, AclTokenResponse, AuditEntry,
    ClusterStatusResponse, ElectionLeader, HealthResponse, LeaderResponse, LimitsResponse,
    LockState, Member, Permit, RwHold, SemaphoreHolder, SemaphoreState, SemaphoreWaiter,
    SetLimitsRequest, TableLimits, WatchEvent, WhoAmIResponse,
};
pub use deadbolt_proto::ErrorKind;
pub use election::Election;
pub use error::Error;
pub use handle::SessionHandle;
pub use lock::{LockGuard, RwMode};
pub use session::{LeaseLost, Session};
pub use watch::{LeaderChanges, Watch, WatchOptions};
