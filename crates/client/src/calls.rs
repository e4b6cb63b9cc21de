//! [`Calls`]: acquire, release and keepalive requests multiplexed over one
//! `Deadbolt.Calls` gRPC stream per connection.
//!
//! Each call costs one small message each way instead of a whole HTTP/2
//! request (see `deadbolt_server`'s `calls` module for the measured
//! reason). To the rest of the client a call looks like a unary RPC: it
//! resolves to the answer or to the [`Status`] the unary RPC would have
//! ended with, and dropping it abandons the call on the server as dropping
//! a unary call would (a `cancel` message instead of a reset stream).
//!
//! Where the server speaks them, the same messages go as framed calls
//! instead (`framed.rs`), on a TCP connection of their own; everything
//! below holds for both.
//!
//! A stream that breaks (the server went away, the connection failed)
//! fails every call in flight with the transport's status, exactly like the
//! unary calls on that connection; the next call opens a new stream.
//!
//! The channel to the stream is bounded: each call reserves two places in
//! it, one for the request and one for a cancel, so that dropping a call
//! never has to wait or lose its cancel. At
//! [`MAX_CALLS_PER_STREAM`] calls in flight the next one waits for a slot,
//! as the server would stop reading it anyway.

use crate::framed::FramedTarget;
use crate::link::{Link, CONNECT_TIMEOUT};
use deadbolt_proto::v1::call_request::Call;
use deadbolt_proto::v1::call_response::Result as Answer;
use deadbolt_proto::v1::deadbolt_client::DeadboltClient;
use deadbolt_proto::v1::{CallRequest, CallResponse, CancelCall};
use deadbolt_proto::{ErrorKind, MAX_CALLS_PER_STREAM};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

/// The largest call sent. Calls carry a lock name (at most 512 bytes) and a
/// few numbers; the server refuses messages over 4 MiB by ending the stream.
const MAX_CALL_BYTES: usize = 64 * 1024;

/// One open `Calls` stream. Cheap to clone; clones share the stream, which
/// ends when the last clone is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Calls {
    requests: mpsc::Sender<CallRequest>,
    shared: Arc<Shared>,
}

/// What the callers and the stream's task share.
#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Set once `state.ended` is: the client asks before every call whether
    /// the stream has ended, and this answers without taking the lock.
    ended: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    /// Where each call in flight wants its answer. Ordered, so that when
    /// the stream ends its callers learn it in one order every time (the
    /// simulation replays runs exactly).
    waiting: BTreeMap<u64, oneshot::Sender<Result<Answer, Status>>>,
    /// Why the stream ended, once it has.
    ended: Option<Status>,
}

impl Calls {
    /// Opens the stream in the background, as framed calls to `framed` if
    /// given and welcomed there, else on `channel`: calls made before the
    /// server has answered are sent as soon as it does.
    pub(crate) fn open(channel: Link, framed: Option<FramedTarget>) -> Calls {
        // A request and a cancel for each call in flight.
        let (requests, outgoing) = mpsc::channel(2 * MAX_CALLS_PER_STREAM);
        let shared = Arc::new(Shared::default());
        tokio::spawn(deliver_answers(channel, framed, outgoing, shared.clone()));
        Calls { requests, shared }
    }

    pub(crate) fn has_ended(&self) -> bool {
        self.shared.ended.load(Ordering::Acquire)
    }

    /// Sends `call` and waits for its answer.
    // A `Status` is what every tonic call fails with; boxing it here alone
    // would only add an allocation to the error path.
    #[allow(clippy::result_large_err)]
    pub(crate) async fn call(&self, call: Call) -> Result<Answer, Status> {
        let size = call.encoded_len();
        if size > MAX_CALL_BYTES {
            // The server would end the whole stream over it, failing the
            // other calls in flight too.
            return Err(ErrorKind::InvalidArgument.status(format!(
                "the request is {size} bytes, more than the {MAX_CALL_BYTES} a call may take: is the lock name that long?"
            )));
        }
        // Both places at once, before the id: a call that cannot be sent
        // has nothing to cancel. Fails only once the stream has ended.
        let Ok(mut places) = self.requests.reserve_many(2).await else {
            return Err(self.ended());
        };
        let send = places.next().expect("two places reserved");
        let cancel = places.next().expect("two places reserved");
        let (id, answer) = {
            let mut state = self.state();
            if let Some(ended) = &state.ended {
                return Err(ended.clone());
            }
            state.next_id += 1;
            let id = state.next_id;
            let (reply, answer) = oneshot::channel();
            state.waiting.insert(id, reply);
            (id, answer)
        };
        let mut in_flight = InFlight {
            calls: self,
            id,
            cancel: Some(cancel),
        };
        send.send(CallRequest {
            id,
            call: Some(call),
        });
        let answer = answer.await;
        in_flight.cancel = None;
        answer.unwrap_or_else(|_| Err(Status::unavailable("the call stream ended")))
    }

    /// Ends the stream for its callers now, with `reason`: the client gave
    /// up on its endpoint (it took a call and never answered), and the calls
    /// waiting on it are better repeated elsewhere than left waiting for a
    /// node that may be paused for good.
    pub(crate) fn abandon(&self, reason: Status) {
        end(&self.shared, reason);
    }

    /// Why the stream ended, for a call that found it so.
    fn ended(&self) -> Status {
        (self.state().ended.clone()).unwrap_or_else(|| Status::unavailable("the call stream ended"))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.shared.state)
    }
}

/// A call sent and not yet answered; dropped early, it cancels the call
/// through the place it reserved for that.
struct InFlight<'a> {
    calls: &'a Calls,
    id: u64,
    /// `None` once answered.
    cancel: Option<mpsc::Permit<'a, CallRequest>>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let Some(cancel) = self.cancel.take() else {
            return;
        };
        if self.calls.state().waiting.remove(&self.id).is_some() {
            cancel.send(CallRequest {
                id: self.id,
                call: Some(Call::Cancel(CancelCall {})),
            });
        }
    }
}

/// Runs the stream: hands each answer to its caller, and when the stream
/// ends, fails every call still waiting with the reason.
async fn deliver_answers(
    channel: Link,
    framed: Option<FramedTarget>,
    outgoing: mpsc::Receiver<CallRequest>,
    shared: Arc<Shared>,
) {
    // Also if this task is cancelled (its runtime shut down) or panics: no
    // call may wait forever on a stream nobody reads.
    let mut ending = Ending {
        shared: shared.clone(),
        reason: Status::unavailable("the call stream's task stopped"),
    };
    let deliver = |id, result: Option<Answer>| {
        // No one waiting: the call was cancelled meanwhile.
        if let Some(reply) = lock(&shared.state).waiting.remove(&id) {
            let _ = reply
                .send(result.ok_or_else(|| Status::internal("the server sent an empty answer")));
        }
    };
    if let Some(framed) = framed {
        match framed.open(CONNECT_TIMEOUT).await {
            Ok(connection) => {
                ending.reason = connection.run(outgoing, deliver).await;
                return;
            }
            Err(not_framed) => tracing::debug!(
                endpoint = %framed.address, reason = %not_framed,
                "no framed calls; using the Calls stream"
            ),
        }
    }
    let requests = ReceiverStream::new(outgoing);
    let mut answers = match DeadboltClient::new(channel).calls(requests).await {
        Ok(answers) => answers.into_inner(),
        Err(status) => {
            ending.reason = status;
            return;
        }
    };
    ending.reason = loop {
        match answers.message().await {
            Ok(Some(CallResponse { id, result })) => deliver(id, result),
            Ok(None) => break Status::unavailable("the server closed the call stream"),
            Err(status) => break status,
        }
    };
}

/// Ends the stream for its callers when dropped: marks it ended and fails
/// every call still waiting with `reason`.
struct Ending {
    shared: Arc<Shared>,
    reason: Status,
}

impl Drop for Ending {
    fn drop(&mut self) {
        end(&self.shared, self.reason.clone());
    }
}

/// Marks the stream ended (the first reason stays) and fails every call
/// still waiting with `reason`.
fn end(shared: &Shared, reason: Status) {
    tracing::debug!(%reason, "call stream ended");
    let waiting = {
        let mut state = lock(&shared.state);
        state.ended.get_or_insert_with(|| reason.clone());
        shared.ended.store(true, Ordering::Release);
        std::mem::take(&mut state.waiting)
    };
    for (_, reply) in waiting {
        let _ = reply.send(Err(reason.clone()));
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Every update leaves the state whole, so a panic elsewhere while
    // holding the lock cannot leave it inconsistent.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}
