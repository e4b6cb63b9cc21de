//! [`DeadboltRuntime`]: the async runtime openraft runs on. It is tokio, as
//! with openraft's own `TokioRuntime`, except for the random numbers a node
//! draws (openraft's randomized election timeouts, a new data directory's
//! instance id): those come from [`NodeRng`], which the deterministic
//! simulation seeds so that a run repeats exactly. (Session and token
//! secrets are `secret.rs`'s, from a source of their own.)

use openraft::{AsyncRuntime, OptionalSend, TokioRuntime};
use rand::rngs::{StdRng, ThreadRng};
use rand::{RngCore, SeedableRng};
use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct DeadboltRuntime;

thread_local! {
    static SEEDED: RefCell<Option<Rc<RefCell<StdRng>>>> = const { RefCell::new(None) };
}

/// A node's random numbers on this thread: the operating system's
/// (`rand::thread_rng`), unless [`seed_node_rng`] gave this thread a seed.
pub enum NodeRng {
    Os(ThreadRng),
    Seeded(Rc<RefCell<StdRng>>),
}

/// From now on nodes draw their random numbers on this thread from `seed`.
/// Only the simulation calls this; it runs everything on one thread.
pub fn seed_node_rng(seed: u64) {
    SEEDED.with(|seeded| {
        *seeded.borrow_mut() = Some(Rc::new(RefCell::new(StdRng::seed_from_u64(seed))));
    });
}

/// The random numbers for a node on this thread (see [`NodeRng`]).
pub fn node_rng() -> NodeRng {
    SEEDED.with(|seeded| match &*seeded.borrow() {
        Some(rng) => NodeRng::Seeded(rng.clone()),
        None => NodeRng::Os(rand::thread_rng()),
    })
}

impl RngCore for NodeRng {
    fn next_u32(&mut self) -> u32 {
        match self {
            NodeRng::Os(rng) => rng.next_u32(),
            NodeRng::Seeded(rng) => rng.borrow_mut().next_u32(),
        }
    }

    fn next_u64(&mut self) -> u64 {
        match self {
            NodeRng::Os(rng) => rng.next_u64(),
            NodeRng::Seeded(rng) => rng.borrow_mut().next_u64(),
        }
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        match self {
            NodeRng::Os(rng) => rng.fill_bytes(dest),
            NodeRng::Seeded(rng) => rng.borrow_mut().fill_bytes(dest),
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

/// Everything but `thread_rng` is `TokioRuntime`'s.
type Tokio = TokioRuntime;

impl AsyncRuntime for DeadboltRuntime {
    type JoinError = <Tokio as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <Tokio as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <Tokio as AsyncRuntime>::Sleep;
    type Instant = <Tokio as AsyncRuntime>::Instant;
    type TimeoutError = <Tokio as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <Tokio as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = NodeRng;
    type OneshotSender<T: OptionalSend> = <Tokio as AsyncRuntime>::OneshotSender<T>;
    type OneshotReceiverError = <Tokio as AsyncRuntime>::OneshotReceiverError;
    type OneshotReceiver<T: OptionalSend> = <Tokio as AsyncRuntime>::OneshotReceiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        Tokio::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        Tokio::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        Tokio::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        Tokio::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        node_rng()
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        Tokio::oneshot()
    }
}
