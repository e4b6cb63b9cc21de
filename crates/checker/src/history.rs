//! The history: every operation of every client, as JSON lines.
//!
//! Each operation is recorded twice, when it is invoked and when it
//! completes: `ok` (it happened), `fail` (it certainly did not), or `info`
//! (unknown: a timeout or a lost connection; it may or may not have taken
//! effect). Times come from CLOCK_MONOTONIC, which all processes on one
//! host share, so records from different client processes can be ordered.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Take the lock (blocking, with a timeout).
    Acquire,
    /// Fenced read, then fenced put of value + 1, in Deadbolt's fenced store.
    StoreIncrement,
    /// The same on the resource process (`deadbolt-nemesis resource`).
    ResourceIncrement,
    Release,
    /// A keepalive on another identity's session, with that session's
    /// secret: must be refused (the simulation's clients each have an
    /// identity; see `deadbolt_server::auth`). `lock` holds nothing; the
    /// session id is in `value`.
    Trespass,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Invoke,
    Ok,
    Fail,
    Info,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Nanoseconds on CLOCK_MONOTONIC.
    pub at: u64,
    pub client: usize,
    pub op: Op,
    pub phase: Phase,
    pub lock: String,
    /// The fencing token the operation carried (acquire: the one granted).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub token: Option<u64>,
    /// For increments: the value written; for a semaphore's acquire: the
    /// slot of its permit.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub value: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
}

/// A write the resource process accepted, in the order it accepted them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    pub at: u64,
    pub lock: String,
    pub token: u64,
    pub value: u64,
}

/// One grant as its holder saw it, for lock services whose grants the
/// run cannot read back (the backends of `deadbolt-backends`): the lock
/// was certainly held from `granted` until `until`, the earlier of the
/// release's invocation and the lease deadline the client knew last (the
/// latest instant the service promised to keep the grant). A worker writes
/// one per grant, as a line `{"held": {...}}` beside its records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub client: usize,
    pub lock: String,
    /// The acquire's invocation and acknowledgement: the grant happened
    /// between the two.
    pub invoked: u64,
    pub granted: u64,
    pub until: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub token: Option<u64>,
}

/// When a resource increment wrote, for lock services whose grants the run
/// cannot read back: `read` is when the read came back (the resource had
/// seen this holder by then), `sent` when the write went out (after the
/// holder's work: a pause there makes the write late). A worker writes one
/// per increment that got as far as its write, as `{"write": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Write {
    pub client: usize,
    pub lock: String,
    /// When the grant it was made under was acknowledged.
    pub granted: u64,
    pub read: u64,
    pub sent: u64,
    /// `ok`: the resource took it; `fail`: it refused (stale); `info`:
    /// unknown.
    pub outcome: Phase,
}

/// An error a client library returned to a worker, as a worker writes it
/// (`{"client_error": {...}}` beside its records), for the availability
/// check (`availability.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientError {
    pub at: u64,
    pub client: usize,
    /// The call: `open_session`, `acquire`, `release`, ...
    pub call: String,
    /// The error's kind, as the server names kinds (`unavailable`, ...).
    pub kind: String,
    pub message: String,
    /// The call was made on a session whose lease the client already
    /// knew lost when the error came: a fault outlasted the lease, and
    /// the call had no lease left to be served on.
    #[serde(default)]
    pub lease_lost: bool,
    /// A change cut off by the fault and refused on repeat, its outcome
    /// unknown (the client's `Error::outcome_unknown`).
    #[serde(default)]
    pub outcome_unknown: bool,
}

/// A worker's output line: a record, a grant's holding interval, a
/// write's timing, or an error its client library returned (for the
/// availability check, `availability.rs`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Line {
    Held { held: Held },
    Write { write: Write },
    ClientError { client_error: ClientError },
    Record(Record),
}

/// CLOCK_MONOTONIC now, in nanoseconds.
pub fn now() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass and nothing else.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut time) };
    assert_eq!(result, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}

/// A `std::time::Instant` (CLOCK_MONOTONIC on Linux) on the history's
/// clock, to within the microseconds between the two readings.
pub fn at(instant: std::time::Instant) -> u64 {
    let (history_now, instant_now) = (now(), std::time::Instant::now());
    if instant >= instant_now {
        history_now + (instant - instant_now).as_nanos() as u64
    } else {
        history_now.saturating_sub((instant_now - instant).as_nanos() as u64)
    }
}
