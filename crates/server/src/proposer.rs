//! [`Proposer`]: turns concurrent lock commands into few Raft log entries.
//!
//! openraft 0.9 fsyncs each `client_write` on its own. Requests that arrive
//! while a write is being made durable wait here and go out together as one
//! [`Batch`], so a burst of N acquires costs one fsync rather than N (group
//! commit); in a cluster, a few batches wait for their followers at once.
//! Nothing is acknowledged before its batch is committed and applied.
//!
//! The queue is bounded ([`QueueLimits`]): past the limit, new work is
//! refused at once with `overloaded` (nothing done, safe to send again)
//! instead of waiting behind a queue that only grows. Which commands may be
//! refused is decided in [`Admission::of`]: never the leader's own timers,
//! nor anything that ends, renews or gives back what already exists.

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::raft_types::{Batch, Raft, TypeConfig};
use crate::store::DiskSpace;
use deadbolt_core::{Command, LockError, Outcome};
use openraft::error::ClientWriteError;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, OwnedRwLockWriteGuard, RwLock};
use tokio::time::Instant;

/// Commands per log entry. Bounds the apply pause.
const MAX_BATCH: usize = 1024;
/// Bytes per log entry, roughly: a batch stops growing past this, so that
/// entries (and a few of them in one append to a follower) stay far below
/// the gRPC message limit even with fenced-store values of 64 KiB.
const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// How long a command may take, from when it was queued to when its batch
/// is committed, before its caller hears `unavailable`; a batch's write
/// is waited for until the deadline of its oldest command. Long enough for an
/// election and a slow disk; a leader cut off from its quorum never
/// commits, and its callers should try another node.
const COMMIT_WAIT: Duration = Duration::from_secs(5);

/// Batches sent to Raft and not yet answered, at most. A batch is taken
/// only once the one before it is durable in the leader's log (see
/// [`batch_loop`]), so this only matters in a cluster, where a commit also
/// waits for a follower: at about a third of a millisecond per fsync and a
/// millisecond per replicated commit here, four keep the leader's log busy.
const BATCHES_IN_FLIGHT: usize = 4;

/// Proposals the node makes on its own (a sweep of expired leases, the
/// waits a new leader gives up) in flight at once. Each such job runs as one
/// task whatever its size (a mass expiry of 100,000 sessions is one task,
/// not 100,000); the proposer still groups them into few log entries.
pub const BACKGROUND_PROPOSALS_IN_FLIGHT: usize = 256;

/// How long a batch of only [`Pace::Patient`] commands waits for another
/// command to share its log append. A contended lock's hand-off chain sends
/// two commands per grant: the holder's release, which hands the lock on,
/// and the previous holder's next acquire, which only joins the queue. They
/// race to an idle log, and the one that loses waits out the other's fsync:
/// `deadbolt bench contended` measured 1.78 appends per grant on one node.
/// Held back, the acquire goes into the log with the release. Measured
/// (one node, alternating, 5 s): 1,135–1,162 against 1,350–1,681 grants/s
/// at 16 clients, 1,071 against 1,459 at 64 (docs/performance.md).
const PATIENT_HOLD: Duration = Duration::from_millis(1);

/// Whether a command's batch goes into the log as soon as the log is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    Prompt,
    /// A blocking acquire that joins the queue of a held lock: it changes
    /// nothing anyone waits for. A batch of only these waits up to
    /// [`PATIENT_HOLD`] for another command, so that they share an append.
    /// It costs the waiter at most that long before it is queued, and no
    /// queue place: whatever comes meanwhile goes into the same batch,
    /// behind it, and a release or expiry that could grant it comes in at
    /// once.
    Patient,
}

/// How much may wait in the proposal queue (not counting the batch being
/// written). Every node's own choice, not replicated: it only decides what
/// this node accepts, never what a command does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Commands queued (`--max-queued-commands`). At 1024 commands a batch
    /// and a few ms a batch, the default is some tens of ms of work: enough
    /// to absorb a burst, short enough that a refused client retrying soon
    /// gets in.
    pub max_commands: usize,
    /// Bytes queued, by [`Command::approximate_size`]: fenced-store values
    /// of up to 64 KiB would otherwise let the command limit alone hold a
    /// gigabyte.
    pub max_bytes: usize,
}

impl QueueLimits {
    pub const DEFAULT: QueueLimits = QueueLimits {
        max_commands: 16_384,
        max_bytes: 64 * 1024 * 1024,
    };
}

impl Default for QueueLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Whether a command may be refused when the queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// New work a client asked for: refused with `overloaded` when the
    /// queue is full. Refusing it does nothing, and the client retries.
    Refusable,
    /// Always queued (and counted). These end, renew or give back something
    /// that already exists: a session, a grant, a wait, a lock-delay. Each
    /// such thing has at most a few of them in flight, so the table's own
    /// limits (sessions, locks, waiters) and the in-flight limits per stream
    /// and identity bound them. Refusing them would be worse than queueing
    /// them: a refused expiry, checkpoint or lock-delay end is only retried
    /// later, so a dead holder's lock would be kept past its lease (a lock
    /// that "never ends" under load); a refused `LeaseRenewed` would let a
    /// live client's lease run out (end early) because the server was busy;
    /// a refused release, close or cancel keeps locks and queue places
    /// held that their owner gave up.
    Always,
}

impl Admission {
    /// The admission of `command` when nothing more is known about it. No
    /// catch-all arm: a new command must be placed here deliberately.
    pub fn of(command: &Command) -> Admission {
        match command {
            Command::OpenSession { .. }
            | Command::Acquire { .. }
            | Command::AcquirePermits { .. }
            | Command::AcquireRw { .. }
            | Command::Campaign { .. }
            | Command::Proclaim { .. }
            | Command::DefineSemaphore { .. }
            | Command::DeleteSemaphore { .. }
            | Command::StorePut { .. }
            | Command::StoreRead { .. }
            | Command::StoreDelete { .. }
            | Command::Acl(_)
            | Command::SetLimits(_)
            | Command::SetClusterVersion { .. } => Admission::Refusable,
            Command::ExpireSession { .. }
            | Command::CheckpointLease { .. }
            | Command::EndLockDelay { .. }
            | Command::LeaseRenewed { .. }
            | Command::CloseSession { .. }
            | Command::Release { .. }
            | Command::CancelWait { .. }
            | Command::Abandon { .. } => Admission::Always,
        }
    }
}

/// Why a command's outcome is unknown to the caller. The command may still
/// have taken effect (a reply lost to a shutdown, or a write that commits
/// after its wait ran out or under a new leader): callers retry, and every command is
/// safe to repeat (acquire and cancel are idempotent; a repeated release or
/// close reports that there is nothing left to do).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProposeError {
    #[error("this node is not the leader (leader: {})", leader.as_deref().unwrap_or("not known yet"))]
    NotLeader { leader: Option<String> },
    #[error("the lock service is shutting down")]
    ShuttingDown,
    /// The write did not commit in time: no quorum answers (this node may be
    /// on the minority side of a partition), or the queue ahead of it was
    /// that long. It may still commit later.
    #[error(
        "the write was not committed within {0:?} of being queued: no quorum of the cluster \
         answers, or this node is overloaded"
    )]
    NoQuorum(Duration),
    /// This node leads but has heard from no majority for the time given:
    /// it may be cut off, and another node may lead. The write may still
    /// commit later.
    #[error(
        "this node has heard from no majority of the cluster for {0:?}: another node may lead \
         now; the write may or may not be done (every call is safe to repeat)"
    )]
    LostQuorum(Duration),
    /// The queue was full: the command was not queued, so it certainly had
    /// no effect.
    #[error(
        "the leader is overloaded: {queued} commands ({bytes} bytes) are queued for the log, the \
         limit is {} commands and {} bytes (--max-queued-commands); nothing was done, retry after \
         a backoff", limits.max_commands, limits.max_bytes
    )]
    Overloaded {
        queued: usize,
        bytes: usize,
        limits: QueueLimits,
    },
    /// This node's disk is full: its log cannot take the command, which was
    /// not queued (`store/disk_space.rs`).
    #[error(
        "disk full: this node cannot write its log until space is freed on its data \
         directory's disk, and resumes by itself then; nothing was done, another node serves \
         (retry there, or here later)"
    )]
    DiskFull,
    /// This node's Raft stopped (its storage failed, or it is shutting
    /// down): it serves nothing more, and another node will lead. A change
    /// in flight may or may not have been committed (sim seeds 285 and 299:
    /// a leader whose log write failed answered `internal`, which clients
    /// do not repeat, while the rest of the cluster went on).
    #[error(
        "this node stopped ({0}); another node will serve: the change may or may not have been \
         done (every call is safe to repeat)"
    )]
    Fatal(String),
}

struct Pending {
    command: Command,
    /// `command.approximate_size()`, counted in [`Load`] until taken.
    bytes: usize,
    pace: Pace,
    /// [`COMMIT_WAIT`] after it was queued: by then its caller hears
    /// `NoQuorum`, from [`take_batch`] if it is still queued, else from
    /// [`answer`].
    deadline: Instant,
    reply: oneshot::Sender<Result<Result<Outcome, LockError>, ProposeError>>,
}

#[derive(Clone)]
pub struct Proposer {
    // Unbounded as a channel; bounded by `load`, which it is never ahead of.
    queue: mpsc::UnboundedSender<Pending>,
    load: Arc<Load>,
    /// Shared by every [`batch_loop`] from sending a batch until the
    /// leader's log has it; taken alone by [`Proposer::hold`].
    sending: Arc<RwLock<()>>,
    /// While the disk is full, every command is refused: none could be
    /// appended, and its caller is better served by another node at once
    /// than by a wait until [`COMMIT_WAIT`].
    space: DiskSpace,
}

/// While alive, nothing new is proposed: batches wait to be sent.
pub struct ProposalsHeld {
    _sending: OwnedRwLockWriteGuard<()>,
}

/// What waits in the queue, against its limits.
#[derive(Debug)]
struct Load {
    limits: QueueLimits,
    commands: AtomicUsize,
    bytes: AtomicUsize,
}

impl Load {
    /// Counts a command in, unless it is refusable and the queue is full.
    fn enter(&self, bytes: usize, admission: Admission) -> Result<(), ProposeError> {
        let commands_before = self.commands.fetch_add(1, Ordering::Relaxed);
        let bytes_before = self.bytes.fetch_add(bytes, Ordering::Relaxed);
        let full = commands_before >= self.limits.max_commands
            || bytes_before + bytes > self.limits.max_bytes;
        if full && admission == Admission::Refusable {
            self.leave(bytes);
            return Err(ProposeError::Overloaded {
                queued: commands_before,
                bytes: bytes_before,
                limits: self.limits,
            });
        }
        Ok(())
    }

    fn leave(&self, bytes: usize) {
        self.commands.fetch_sub(1, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

impl Proposer {
    pub fn start(
        raft: Raft,
        clock: Clock,
        metrics: Arc<Metrics>,
        limits: QueueLimits,
        appended: watch::Receiver<u64>,
        appends_inline: bool,
        space: DiskSpace,
    ) -> Self {
        let (queue, pending) = mpsc::unbounded_channel();
        let load = Arc::new(Load {
            limits,
            commands: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
        });
        let pending = Arc::new(tokio::sync::Mutex::new(pending));
        let sending = Arc::new(RwLock::new(()));
        for _ in 0..BATCHES_IN_FLIGHT {
            crate::runtime::spawn(batch_loop(
                raft.clone(),
                clock,
                metrics.clone(),
                load.clone(),
                Queue {
                    pending: pending.clone(),
                    sending: sending.clone(),
                },
                appended.clone(),
                appends_inline,
            ));
        }
        Proposer {
            queue,
            load,
            sending,
            space,
        }
    }

    /// Holds every new proposal back until the guard is dropped. Returns
    /// once every batch already sent is in the leader's log (or answered),
    /// so that, held, the log does not grow.
    pub async fn hold(&self) -> ProposalsHeld {
        ProposalsHeld {
            _sending: self.sending.clone().write_owned().await,
        }
    }

    /// Commands waiting to be proposed (for the metrics).
    pub fn queued_commands(&self) -> usize {
        self.load.commands.load(Ordering::Relaxed)
    }

    /// Commits `command` and returns what applying it produced; refuses it
    /// with [`ProposeError::Overloaded`] if the queue is full and
    /// [`Admission::of`] the command allows.
    pub async fn propose(
        &self,
        command: Command,
    ) -> Result<Result<Outcome, LockError>, ProposeError> {
        let admission = Admission::of(&command);
        self.propose_with(command, admission, Pace::Prompt).await
    }

    /// [`propose`](Self::propose), with the caller deciding whether the
    /// command may be refused and whether it may wait for company in the
    /// log (it knows more about it than its kind).
    ///
    /// A function returning an `async move` block rather than an `async
    /// fn`, which would keep the command twice in the future every call
    /// allocates (see `Node::propose`).
    #[expect(
        clippy::manual_async_fn,
        reason = "an `async fn` keeps its arguments twice"
    )]
    pub fn propose_with(
        &self,
        command: Command,
        admission: Admission,
        pace: Pace,
    ) -> impl Future<Output = Result<Result<Outcome, LockError>, ProposeError>> + '_ {
        async move {
            if self.space.is_full() {
                return Err(ProposeError::DiskFull);
            }
            let bytes = command.approximate_size();
            self.load.enter(bytes, admission)?;
            let (reply, outcome) = oneshot::channel();
            if self
                .queue
                .send(Pending {
                    command,
                    bytes,
                    pace,
                    deadline: Instant::now() + COMMIT_WAIT,
                    reply,
                })
                .is_err()
            {
                self.load.leave(bytes);
                return Err(ProposeError::ShuttingDown);
            }
            // No timer of its own: the batch loops answer by the deadline (a
            // timer per call, put into tokio's wheel and taken out again, was
            // 3.3 % of the server's instructions per pair under callgrind).
            outcome.await.map_err(|_| ProposeError::ShuttingDown)?
        }
    }
}

/// One of [`BATCHES_IN_FLIGHT`] loops that take turns at the queue. A loop
/// holds the queue from taking a batch until the leader's log has made that
/// batch durable (or it was answered first), so while one batch is fsync'd
/// the requests that arrive pile up in the channel and form the next: batches
/// grow with load (group commit). On a single node a batch commits when it is
/// durable, so this is one batch in flight. In a cluster its commit then
/// waits a round trip to a follower and the follower's fsync, in which the
/// leader's log would otherwise sit idle; the next batches are written
/// meanwhile. Measured against a single loop, alternating (`deadbolt
/// bench`, 16 clients): on one node 9.9–10.0k uncontended pairs/s against
/// 8.7–9.5k, contended level; on three nodes 669–677 contended grants/s
/// against 532–589. Loops that took turns without waiting for the leader's
/// fsync only split the group: two gave 6.7k pairs/s on one node.
async fn batch_loop(
    raft: Raft,
    clock: Clock,
    metrics: Arc<Metrics>,
    load: Arc<Load>,
    queue: Queue,
    mut appended: watch::Receiver<u64>,
    appends_inline: bool,
) {
    loop {
        let mut pending = queue.pending.lock().await;
        if appends_inline {
            // The append before held this thread up, so what arrived
            // meanwhile is still unread in the sockets: let the connections
            // read it first (tokio's `yield_now` waits for the next poll of
            // the network), and it joins this batch, as a Redis event loop
            // takes everything readable before its fsync. Measured, one
            // node, 16 clients: 78-89 µs of server CPU per pair against
            // 98-99 on the blocking pool; without this, 77-88 at 16 clients but
            // 65-66 against 57-62 at 64 (bench/results/2026-12-05.md).
            tokio::task::yield_now().await;
        }
        let Some(batch) = take_batch(&mut pending, &load).await else {
            return;
        };
        if batch.is_empty() {
            continue;
        }
        let sending = queue.sending.clone().read_owned().await;
        metrics.batch_proposed(batch.len());
        let started = Instant::now();
        appended.borrow_and_update();
        // Sent while the queue is held: batches go into the log in the
        // order they were taken.
        let sent = send(&raft, clock, batch).await;
        let mut answered = std::pin::pin!(answer(&raft, sent));
        let answered_first = tokio::select! {
            // (`biased`: the simulation needs the same choice every run.)
            biased;
            committed = answered.as_mut() => Some(committed),
            // The leader's log made it durable (or, if something else was
            // appended first, something just as recent).
            _ = appended.changed() => None,
        };
        drop((pending, sending));
        let committed = match answered_first {
            Some(committed) => committed,
            None => answered.await,
        };
        if committed {
            metrics.batch_committed(started.elapsed());
        }
    }
}

/// What the [`batch_loop`]s share: the queue's receiving end, which one
/// holds while it takes a batch and until the leader's log has it, and
/// [`Proposer::sending`].
struct Queue {
    pending: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Pending>>>,
    sending: Arc<RwLock<()>>,
}

/// The next batch: the first command to arrive, and what queued behind it,
/// within [`MAX_BATCH`] and [`MAX_BATCH_BYTES`]; a batch of only
/// [`Pace::Patient`] commands also takes what arrives within
/// [`PATIENT_HOLD`] of the first. `None` once the proposer is gone; empty
/// if every caller in it had gone or waited past its deadline.
///
/// A command waits in the queue only while every loop is busy, and a busy
/// loop is free by the deadline of its own batch, which was queued
/// earlier: so a command past its deadline is answered here soon after it
/// (or once [`Proposer::hold`] ends, which is bounded too).
async fn take_batch(
    pending: &mut mpsc::UnboundedReceiver<Pending>,
    load: &Load,
) -> Option<Vec<Pending>> {
    let mut next = Some(pending.recv().await?);
    let now = Instant::now();
    let hold_until = now + PATIENT_HOLD;
    let mut bytes = 0;
    let mut batch = Vec::new();
    let mut all_patient = true;
    while let Some(command) = next.take() {
        load.leave(command.bytes);
        if command.deadline <= now {
            // Its caller hears now that it did not commit in time, and
            // retries (perhaps on another node): proposed now, it would
            // only do late what the retry does.
            let _ = (command.reply).send(Err(ProposeError::NoQuorum(COMMIT_WAIT)));
        } else if !command.reply.is_closed() {
            // (A caller that is gone hears nothing: its command is not
            // proposed.)
            bytes += command.bytes;
            all_patient &= command.pace == Pace::Patient;
            batch.push(command);
        }
        if batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
            next = pending.try_recv().ok();
            if next.is_none() && all_patient && !batch.is_empty() {
                next = tokio::time::timeout_at(hold_until, pending.recv())
                    .await
                    .ok()
                    .flatten();
            }
        }
    }
    Some(batch)
}

/// A batch sent to Raft, its callers waiting for its outcome.
struct Sent {
    replies: Vec<oneshot::Sender<Result<Result<Outcome, LockError>, ProposeError>>>,
    written: Result<ClientWriteReceiver, ProposeError>,
    /// The earliest of its commands' deadlines: its callers hear `NoQuorum`
    /// then if it has not committed.
    deadline: Instant,
}

/// How often a batch not yet committed looks whether its leader still
/// hears from a quorum, and how long without that it takes to give up.
/// Followers stand for election once the leader's lease
/// (`election_timeout_max`, 300 ms by default) and an election timeout have
/// passed with no word from it: past [`LOST_QUORUM`] without a majority's
/// acknowledgement, another node may lead, and callers held here for the
/// whole [`COMMIT_WAIT`] would wait seconds for nothing (found by the
/// failover test: a leader cut off from its followers, but not from its
/// clients, held every caller until the cut healed).
const QUORUM_CHECK: Duration = Duration::from_millis(250);
const LOST_QUORUM: Duration = Duration::from_secs(1);

/// Waits for a sent batch's commit until `deadline`, or until this node has
/// heard from no quorum for [`LOST_QUORUM`]; `Err(())` then. One timer at a
/// time, as before: a batch that commits within [`QUORUM_CHECK`] (every
/// batch of a healthy cluster) looks at nothing else.
async fn committed_by<T>(
    raft: &Raft,
    deadline: Instant,
    mut receiver: oneshot::Receiver<T>,
) -> Result<Result<T, oneshot::error::RecvError>, ProposeError> {
    loop {
        let check = (Instant::now() + QUORUM_CHECK).min(deadline);
        match tokio::time::timeout_at(check, &mut receiver).await {
            Ok(answer) => return Ok(answer),
            Err(_) if check >= deadline => return Err(ProposeError::NoQuorum(COMMIT_WAIT)),
            Err(_) => {
                let since_ack = raft.metrics().borrow().millis_since_quorum_ack;
                if since_ack.is_some_and(|ms| ms > LOST_QUORUM.as_millis() as u64) {
                    return Err(ProposeError::LostQuorum(LOST_QUORUM));
                }
            }
        }
    }
}

/// What `Raft::client_write_ff` hands back (openraft's `OneshotResponder`).
type ClientWriteReceiver = oneshot::Receiver<openraft::raft::ClientWriteResult<TypeConfig>>;

/// Hands one batch to Raft, without waiting for it to commit.
async fn send(raft: &Raft, clock: Clock, batch: Vec<Pending>) -> Sent {
    let deadline =
        (batch.iter().map(|pending| pending.deadline).min()).expect("a batch sent is not empty");
    let (commands, replies): (Vec<_>, Vec<_>) =
        batch.into_iter().map(|p| (p.command, p.reply)).unzip();
    let batch = Batch {
        commands: commands.into(),
        at_ms: batch_clock(&clock),
    };
    let written = raft
        .client_write_ff(batch)
        .await
        .map_err(|fatal| ProposeError::Fatal(fatal.to_string()));
    Sent {
        replies,
        written,
        deadline,
    }
}

/// The wall clock a batch carries (and raises the token counter to): the
/// leader's, but no later than `LATEST_TOKEN_FLOOR_MS`, so that a clock
/// that jumps centuries ahead cannot take tokens past what JSON readers
/// keep exact. Said once per process when it happens.
fn batch_clock(clock: &Clock) -> u64 {
    static SAID: AtomicBool = AtomicBool::new(false);
    let now = clock.unix_ms();
    let bounded = deadbolt_core::token_floor_ms(now);
    if bounded < now && !SAID.swap(true, Ordering::Relaxed) {
        tracing::error!(
            unix_ms = now,
            "this node's wall clock reads later than the year 2200; its log entries carry \
             the start of 2200 instead, which keeps tokens below 2^53. Check its clock (NTP)"
        );
    }
    bounded
}

/// Waits for a sent batch to commit and answers each of its callers.
/// Returns whether it was committed.
async fn answer(
    raft: &Raft,
    Sent {
        replies,
        written,
        deadline,
    }: Sent,
) -> bool {
    let written = match written {
        Ok(receiver) => match committed_by(raft, deadline, receiver).await {
            Ok(Ok(Ok(written))) => Ok(written),
            Ok(Ok(Err(ClientWriteError::ForwardToLeader(forward)))) => {
                Err(ProposeError::NotLeader {
                    leader: forward.leader_node.map(|node| node.addr),
                })
            }
            Ok(Ok(Err(other))) => Err(ProposeError::Fatal(other.to_string())),
            Ok(Err(_)) => Err(ProposeError::ShuttingDown),
            Err(unanswered) => Err(unanswered),
        },
        Err(err) => Err(err),
    };
    match written {
        Ok(written) => {
            let outcomes = written.data.0;
            assert_eq!(outcomes.len(), replies.len(), "one outcome per command");
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(Ok(outcome));
            }
            true
        }
        Err(err) => {
            for reply in replies {
                let _ = reply.send(Err(err.clone()));
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deadbolt_core::{SessionId, Token};

    fn load(max_commands: usize, max_bytes: usize) -> Load {
        Load {
            limits: QueueLimits {
                max_commands,
                max_bytes,
            },
            commands: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
        }
    }

    #[test]
    fn a_full_queue_refuses_new_work_and_takes_what_ends_or_renews() {
        let load = load(2, 1 << 20);
        load.enter(10, Admission::Refusable).unwrap();
        load.enter(10, Admission::Refusable).unwrap();
        let refused = load.enter(10, Admission::Refusable).unwrap_err();
        assert!(matches!(
            refused,
            ProposeError::Overloaded { queued: 2, .. }
        ));
        assert!(
            refused.to_string().contains("--max-queued-commands"),
            "{refused}"
        );
        // Expiries, releases and the like are queued past the limit.
        load.enter(10, Admission::Always).unwrap();
        assert_eq!(load.commands.load(Ordering::Relaxed), 3);
        // Once the batch loop takes two, there is room again.
        load.leave(10);
        load.leave(10);
        load.enter(10, Admission::Refusable).unwrap();
        assert_eq!(load.commands.load(Ordering::Relaxed), 2);
        assert_eq!(load.bytes.load(Ordering::Relaxed), 20);
    }

    #[test]
    fn the_byte_limit_refuses_a_command_that_would_pass_it() {
        let load = load(100, 1000);
        load.enter(600, Admission::Refusable).unwrap();
        assert!(load.enter(500, Admission::Refusable).is_err());
        load.enter(400, Admission::Refusable).unwrap();
        assert_eq!(load.bytes.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn the_leaders_timers_and_what_gives_back_are_never_refused() {
        let session = SessionId(1);
        let lock = || "l".to_owned();
        let always = [
            Command::ExpireSession { session, term: 1 },
            Command::CheckpointLease {
                session,
                remaining_ms: 1,
                renewals: 0,
                term: 1,
            },
            Command::EndLockDelay {
                lock: lock(),
                token: Token(1),
                term: 1,
            },
            Command::LeaseRenewed { session },
            Command::Release {
                session,
                lock: lock(),
                token: Token(1),
            },
            Command::CloseSession { session },
            Command::CancelWait {
                session,
                lock: lock(),
            },
            Command::Abandon {
                session,
                lock: lock(),
                attempt: 1,
            },
        ];
        for command in always {
            assert_eq!(Admission::of(&command), Admission::Always, "{command:?}");
        }
        let acquire = Command::Acquire {
            session,
            lock: lock(),
            wait: true,
            attempt: 1,
            lock_delay_ms: 0,
        };
        assert_eq!(Admission::of(&acquire), Admission::Refusable);
    }

    type Reply = oneshot::Receiver<Result<Result<Outcome, LockError>, ProposeError>>;

    fn queue(
        pending: &mpsc::UnboundedSender<Pending>,
        load: &Load,
        session: u64,
        queued: Instant,
    ) -> Reply {
        let command = Command::LeaseRenewed {
            session: SessionId(session),
        };
        let bytes = command.approximate_size();
        load.enter(bytes, Admission::Always).unwrap();
        let (reply, answer) = oneshot::channel();
        let deadline = queued + COMMIT_WAIT;
        (pending.send(Pending {
            command,
            bytes,
            pace: Pace::Prompt,
            deadline,
            reply,
        }))
        .unwrap();
        answer
    }

    /// A caller waits on its answer with no timer of its own: a command
    /// still queued at its deadline is answered `NoQuorum` when a loop
    /// takes it, and is not proposed; those behind it go on.
    #[tokio::test(start_paused = true)]
    async fn a_command_queued_past_its_deadline_is_answered_and_not_proposed() {
        let (sender, mut pending) = mpsc::unbounded_channel();
        let load = load(100, 1 << 20);
        let mut late = queue(&sender, &load, 1, Instant::now());
        tokio::time::sleep(COMMIT_WAIT / 2).await;
        let in_time = queue(&sender, &load, 2, Instant::now());
        let gone = queue(&sender, &load, 3, Instant::now());
        drop(gone);
        tokio::time::sleep(COMMIT_WAIT / 2).await;

        let batch = take_batch(&mut pending, &load).await.unwrap();
        let sessions: Vec<_> = (batch.iter())
            .map(|pending| pending.command.clone())
            .collect();
        assert_eq!(
            sessions,
            [Command::LeaseRenewed {
                session: SessionId(2)
            }],
            "only the command within its deadline, and with a caller, is proposed"
        );
        assert!(matches!(
            late.try_recv(),
            Ok(Err(ProposeError::NoQuorum(COMMIT_WAIT)))
        ));
        assert_eq!(load.commands.load(Ordering::Relaxed), 0);
        drop((batch, in_time));
    }
}
