//! The resource side of fencing.
//!
//! A Deadbolt lock is a lease, so it only limits how long a holder *thinks*
//! it holds the lock: a holder that pauses past its lease wakes up still
//! believing it does. Every grant comes with a fencing token, larger than
//! any granted before, and what makes the work exclusive is the protected
//! resource remembering the highest token it accepted and refusing lower
//! ones. This crate is that check, in three places a resource lives:
//!
//! - in this process: [`FenceGate`] (one mark) and [`FenceGates`] (a mark per
//!   key);
//! - in PostgreSQL: [`postgres`], a fenced `UPDATE` (feature `postgres`);
//! - behind HTTP: [`http::FencingLayer`], a tower middleware checking a
//!   `Fencing-Token` header (feature `http`).
//!
//! Everywhere the rule is the same: a token **equal to or above** the mark is
//! accepted and becomes the mark (one holder writes many times with its one
//! token); a lower one is refused with [`Stale`], which names both tokens.
//!
//! # In-process
//!
//! ```
//! use deadbolt_fence::FenceGate;
//!
//! let gate = FenceGate::new();
//! gate.admit(33).unwrap(); // holder A
//! gate.admit(34).unwrap(); // holder B, granted after A's lease ran out
//! let err = gate.admit(33).unwrap_err(); // A wakes up and tries to write
//! assert_eq!(
//!     err.to_string(),
//!     "stale fencing token 33: this resource already accepted token 34"
//! );
//!
//! // Check the token and write in one step, so an admitted-but-slow holder
//! // cannot write after a newer one:
//! let mut file = Vec::new();
//! gate.admit_with(34, || file.push("B's data")).unwrap();
//! ```
//!
//! # PostgreSQL
//!
//! The row keeps its mark in a `fence BIGINT NOT NULL DEFAULT 0` column and
//! the check is part of the `UPDATE` (`... AND fence <= $token`); see
//! [`postgres`] for the schema, the SQL and the u64/BIGINT caveat.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn example(token: u64) -> Result<(), Box<dyn std::error::Error>> {
//! use deadbolt_fence::postgres::{FencedTable, UpdateError};
//!
//! let (client, connection) =
//!     tokio_postgres::connect("postgres://app@localhost/app", tokio_postgres::NoTls).await?;
//! tokio::spawn(connection);
//!
//! let files = FencedTable::new("files")?; // key column `id`, fence column `fence`
//! match files.update(&client, &7_i64, token, "data = $1", &[&"report"]).await {
//!     Ok(()) => println!("written with token {token}"),
//!     Err(UpdateError::Stale(stale)) => println!("not written: {stale}"),
//!     Err(other) => return Err(other.into()),
//! }
//! # Ok(()) }
//! ```
//!
//! # HTTP
//!
//! ```
//! # #[cfg(not(feature = "http"))]
//! # fn main() {}
//! # #[cfg(feature = "http")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::sync::Arc;
//!
//! use axum::{body::Body, http::Request, routing::put, Router};
//! use deadbolt_fence::{http::FencingLayer, FenceGate};
//! use tower::ServiceExt;
//!
//! let gate = Arc::new(FenceGate::new());
//! let app = Router::new()
//!     .route("/report", put(|| async { "stored" }))
//!     .layer(FencingLayer::new(Arc::clone(&gate)));
//!
//! let put_with = |token: &str| {
//!     Request::put("/report")
//!         .header("Fencing-Token", token)
//!         .body(Body::empty())
//!         .unwrap()
//! };
//! let response = app.clone().oneshot(put_with("34")).await.unwrap();
//! assert_eq!(response.status(), 200);
//! let response = app.oneshot(put_with("33")).await.unwrap();
//! assert_eq!(response.status(), 409); // the handler did not run
//! assert_eq!(gate.highest(), 34);
//! # }
//! ```

mod gate;
mod keyed;

#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "postgres")]
pub mod postgres;

pub use gate::{FenceGate, Stale};
pub use keyed::FenceGates;
