//! Hooks for the deterministic simulation (`crates/sim`), which runs this
//! client, unchanged, against simulated servers: on one thread, on tokio's
//! paused clock, over a network the simulation provides.
//!
//! Three things the client takes from the host would make a simulated run
//! unrepeatable or wrong: the lease clock (CLOCK_BOOTTIME, which paused
//! tokio time does not move), the retry jitter (the thread's OS-seeded
//! random numbers) and acquire attempt ids (wall-clock microseconds). After
//! [`enter`] on a thread, those three come from tokio's clock and the seed
//! instead, for that thread only; a thread that never calls it is not
//! touched. A cargo feature would not do: features unify across a build, so
//! the simulation's would reach every binary built with it.
//!
//! [`Dial`] carries the connections: a client made with
//! [`Client::connect_through`](crate::Client::connect_through) dials every
//! address through it rather than TCP.

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::DuplexStream;

/// How long the simulated machine has been up when a run begins: lease
/// clocks read as time since boot, and a deadline minus a margin must not
/// fall before zero in a run's first seconds.
const UPTIME_AT_START: Duration = Duration::from_secs(86_400);

struct Simulated {
    rng: StdRng,
    /// Tokio's (paused) clock when the run began.
    origin: tokio::time::Instant,
    last_attempt: u64,
}

thread_local! {
    static SIMULATED: RefCell<Option<Simulated>> = const { RefCell::new(None) };
}

/// Makes this thread's clients deterministic for one run: lease clock and
/// attempt ids on tokio's clock (call it inside the run's runtime, whose
/// clock is paused), retry jitter from `seed`. Until [`leave`].
pub fn enter(seed: u64) {
    SIMULATED.with(|simulated| {
        *simulated.borrow_mut() = Some(Simulated {
            rng: StdRng::seed_from_u64(seed),
            origin: tokio::time::Instant::now(),
            last_attempt: 0,
        })
    });
}

/// Ends [`enter`] on this thread.
pub fn leave() {
    SIMULATED.with(|simulated| *simulated.borrow_mut() = None);
}

/// Time since "boot" on tokio's clock, in a simulated run.
pub(crate) fn boot_time() -> Option<Duration> {
    SIMULATED.with(|simulated| {
        let simulated = simulated.borrow();
        let simulated = simulated.as_ref()?;
        Some(UPTIME_AT_START + simulated.origin.elapsed())
    })
}

/// Runs `draw` on the run's seeded random numbers, or the thread's own.
pub(crate) fn with_rng<T>(draw: impl FnOnce(&mut dyn RngCore) -> T) -> T {
    SIMULATED.with(|simulated| match simulated.borrow_mut().as_mut() {
        Some(simulated) => draw(&mut simulated.rng),
        None => draw(&mut rand::thread_rng()),
    })
}

/// The next acquire attempt id in a simulated run: microseconds of tokio's
/// clock, strictly increasing on this thread. `None` outside one.
pub(crate) fn next_attempt() -> Option<u64> {
    SIMULATED.with(|simulated| {
        let mut simulated = simulated.borrow_mut();
        let simulated = simulated.as_mut()?;
        let now = simulated.origin.elapsed().as_micros() as u64;
        simulated.last_attempt = simulated.last_attempt.saturating_add(1).max(now);
        Some(simulated.last_attempt)
    })
}

/// A connection to an address (`host:port`), as a byte stream.
pub type Connecting = Pin<Box<dyn Future<Output = std::io::Result<DuplexStream>> + Send>>;

/// Opens connections in place of TCP: the simulation's network.
#[derive(Clone)]
pub struct Dial(Arc<dyn Fn(String) -> Connecting + Send + Sync>);

impl Dial {
    pub fn new(dial: impl Fn(String) -> Connecting + Send + Sync + 'static) -> Dial {
        Dial(Arc::new(dial))
    }

    /// A connection to `address` (`host:port`).
    pub(crate) fn connect(&self, address: String) -> Connecting {
        (self.0)(address)
    }

    /// A connector for tonic's `Endpoint::connect_with_connector`.
    pub(crate) fn connector(
        &self,
    ) -> impl tower::Service<
        http::Uri,
        Response = hyper_util::rt::TokioIo<DuplexStream>,
        Error = std::io::Error,
        Future = impl Send,
    > + Send
           + 'static {
        let dial = self.0.clone();
        tower::service_fn(move |uri: http::Uri| {
            let address = uri
                .authority()
                .map_or_else(String::new, ToString::to_string);
            let connecting = dial(address);
            async move { connecting.await.map(hyper_util::rt::TokioIo::new) }
        })
    }
}

impl fmt::Debug for Dial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Dial(simulated network)")
    }
}
