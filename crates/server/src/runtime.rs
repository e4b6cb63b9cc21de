//! [`DeadboltRuntime`]: the async runtime openraft runs on. It is tokio, as
//! with openraft's own `TokioRuntime`, except for the random numbers a node
//! draws (openraft's randomized election timeouts, a new data directory's
//! instance id): those come from [`NodeRng`], which the deterministic
//! simulation seeds so that a run repeats exactly. (Session and token
//! secrets are `secret.rs`'s, from a source of their own.)
//!
//! Every task a node starts, openraft's and ours, goes through [`spawn`],
//! so that the simulation can stop a node's tasks as SIGSTOP stops a
//! process: a [`PauseGate`] given to the node is inherited by each task it
//! spawns, and while it is shut none of them is polled. Their timers still
//! come due, and all fire the moment it opens, as a resumed process's do.
//! A real node has no gate, and `spawn` is `tokio::spawn`.

use openraft::{AsyncRuntime, OptionalSend, TokioRuntime};
use rand::rngs::{StdRng, ThreadRng};
use rand::{RngCore, SeedableRng};
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
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

/// Whether a simulated node's tasks may run (see the module's comment).
/// Clones share the gate.
#[derive(Clone, Default)]
pub struct PauseGate(Arc<Mutex<GateState>>);

#[derive(Default)]
struct GateState {
    shut: bool,
    /// The tasks that were woken while the gate was shut, in order.
    woken: Vec<Waker>,
}

impl PauseGate {
    /// From now on the node's tasks are not polled.
    pub fn shut(&self) {
        self.state().shut = true;
    }

    /// The node's tasks run again: each woken meanwhile is polled now.
    pub fn open(&self) {
        let woken = {
            let mut state = self.state();
            state.shut = false;
            std::mem::take(&mut state.woken)
        };
        woken.into_iter().for_each(Waker::wake);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        // Only ever a flag and a list: nothing a panic could leave half done.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `future` (a node's start) with this gate, so that every task
    /// it spawns through [`spawn`], and theirs, is behind it.
    pub async fn enclose<F: Future>(&self, future: F) -> F::Output {
        GATE.scope(self.clone(), future).await
    }
}

tokio::task_local! {
    static GATE: PauseGate;
}

/// A task behind a gate: polled only while the gate is open.
struct Gated<F> {
    gate: PauseGate,
    task: Pin<Box<F>>,
}

impl<F: Future> Future for Gated<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        {
            let mut state = self.gate.state();
            if state.shut {
                if !state.woken.iter().any(|woken| woken.will_wake(cx.waker())) {
                    state.woken.push(cx.waker().clone());
                }
                return Poll::Pending;
            }
        }
        self.task.as_mut().poll(cx)
    }
}

/// Spawns one of a node's tasks: behind the node's gate if it has one (in
/// the simulation), else plainly.
pub fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match GATE.try_with(PauseGate::clone) {
        Ok(gate) => tokio::spawn(Gated {
            gate: gate.clone(),
            task: Box::pin(GATE.scope(gate, future)),
        }),
        Err(_) => tokio::spawn(future),
    }
}

/// Everything but `thread_rng` and `spawn` is `TokioRuntime`'s.
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
        spawn(future)
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::{sleep, Instant};

    /// A paused node's timers must not fire during the pause (a process
    /// stopped by SIGSTOP runs nothing), and fire at once when it resumes;
    /// a task spawned by one of its tasks is behind the same gate.
    #[tokio::test(start_paused = true)]
    async fn a_shut_gate_holds_its_tasks_and_their_timers_until_it_opens() {
        let gate = PauseGate::default();
        let (fired, mut firings) = tokio::sync::mpsc::unbounded_channel();
        let started = Instant::now();
        gate.enclose(async move {
            spawn(async move {
                sleep(Duration::from_millis(100)).await;
                fired.send(("parent", started.elapsed())).unwrap();
                spawn(async move {
                    sleep(Duration::from_millis(100)).await;
                    fired.send(("child", started.elapsed())).unwrap();
                });
            });
        })
        .await;
        // The parent's timer is due at 100 ms, the child's at 1,110 ms:
        // each fires only when the pause around it ends.
        let parent = pause_then_resume(&gate, &mut firings).await;
        assert_eq!(parent, ("parent", LITTLE + PAUSE));
        let child = pause_then_resume(&gate, &mut firings).await;
        assert_eq!(child, ("child", (LITTLE + PAUSE) * 2));
    }

    const LITTLE: Duration = Duration::from_millis(10);
    const PAUSE: Duration = Duration::from_secs(1);

    /// Shuts the gate once the tasks wait on their timers, for a second in
    /// which nothing may fire; then opens it and returns what fired.
    async fn pause_then_resume(
        gate: &PauseGate,
        firings: &mut tokio::sync::mpsc::UnboundedReceiver<(&'static str, Duration)>,
    ) -> (&'static str, Duration) {
        sleep(LITTLE).await;
        gate.shut();
        sleep(PAUSE).await;
        assert!(firings.try_recv().is_err(), "a task ran during the pause");
        gate.open();
        firings.recv().await.unwrap()
    }

    #[tokio::test]
    async fn without_a_gate_a_task_runs_plainly() {
        assert_eq!(spawn(async { 7 }).await.unwrap(), 7);
    }
}
