//! [`CallStream`]: serves one `Deadbolt.Calls` stream, the cheap way to
//! acquire, release and renew (see `proto/deadbolt.proto`).
//!
//! A unary RPC costs an HTTP/2 stream: HEADERS, DATA and trailers each way,
//! hpack work and stream bookkeeping on both sides. On the two cores of the
//! benchmark machine that alone caps a client at about 39k trivial RPCs/s.
//! Over one long-lived stream a call is one DATA frame each way.
//!
//! Each call runs through [`Api`] exactly as its unary RPC does, so the two
//! paths cannot answer differently. The stream itself polls all its calls:
//! no task per call and no channel hop between a call finishing and its
//! answer being written. When the server shuts down, the stream turns new
//! calls away and ends once the calls in flight are answered.
//!
//! Everything a stream holds is bounded: acquires in flight (past
//! [`MAX_ACQUIRES_IN_FLIGHT`], refused), calls in flight of every kind
//! ([`MAX_CALLS_PER_STREAM`]) and refusals not yet written
//! ([`MAX_REFUSED_QUEUED`]): at either of the last two the stream stops
//! reading requests until calls finish or answers are written, and HTTP/2
//! flow control (TCP's, for framed calls: `frames.rs`) holds the client
//! back.

use crate::api::Api;
use crate::auth::Credentials;
use crate::node::ApiError;
use deadbolt_proto::v1::call_request::Call;
use deadbolt_proto::v1::call_response::Result as Answer;
use deadbolt_proto::v1::{CallError, CallRequest, CallResponse};
use deadbolt_proto::woken::WokenOnly;
use deadbolt_proto::{ErrorKind, MAX_CALLS_PER_STREAM};
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use tokio::sync::{oneshot, watch};
use tonic::Status;

/// Acquires in flight on one stream; past this, a new acquire is refused
/// with `limit_reached`. Releases, keepalives and cancels always run: a
/// client with many blocked acquires must still be able to keep its
/// sessions alive and free what it holds.
const MAX_ACQUIRES_IN_FLIGHT: usize = 4096;

/// Refusals waiting to be written on one stream. A client that sends faster
/// than it reads its answers is not read further until they are written.
const MAX_REFUSED_QUEUED: usize = 1024;

/// The requests of one stream: a gRPC `Calls` stream's (tonic's
/// `Streaming`), or a framed connection's (`frames.rs`).
pub type Requests = Pin<Box<dyn Stream<Item = Result<CallRequest, Status>> + Send>>;

/// A call being served.
type RunningCall = Pin<Box<dyn Future<Output = Finished> + Send>>;

struct Finished {
    id: u64,
    acquire: bool,
    /// Which call with this id: a client may reuse the id of a call it
    /// cancelled while that call is still winding down.
    serial: u64,
    /// `None` if the client cancelled the call.
    answer: Option<Answer>,
}

/// How to cancel a call in flight.
struct Cancel {
    serial: u64,
    sender: oneshot::Sender<()>,
}

/// The answers of one `Calls` stream, as they finish.
pub struct CallStream {
    /// Shared by the calls: one reference count per call rather than a
    /// clone of every handle inside `Api`.
    api: Arc<Api>,
    /// What the stream was opened with: every call on it runs as that
    /// caller.
    credentials: Arc<Credentials>,
    /// `None` once the client has sent its last request: the stream then
    /// ends when the calls in flight have been answered.
    requests: Option<Requests>,
    /// The stream is polled a few times per call (for each answer, and
    /// when a call in flight is woken): the requests are read only when
    /// they woke it.
    requests_woken: WokenOnly,
    /// When the server begins to shut down: from then on new calls are
    /// turned away (to another node), and the stream ends once the calls in
    /// flight are answered. A client never half-closes its stream, which
    /// would otherwise hold the graceful shutdown open.
    stopping: Stopping,
    stopped: bool,
    running: FuturesUnordered<RunningCall>,
    /// How to cancel each call in flight, by id. Three lookups per call:
    /// foldhash rather than SipHash, which took about 2 % of the server's
    /// instructions per call. Ids are the client's choice, but the map
    /// holds at most [`MAX_CALLS_PER_STREAM`] of them and the seed is
    /// random, so colliding ids cost their sender little more than itself.
    cancels: HashMap<u64, Cancel, foldhash::fast::RandomState>,
    next_serial: u64,
    acquires_in_flight: usize,
    /// Answers to calls turned away without running.
    refused: VecDeque<CallResponse>,
}

/// Whether the server has begun to shut down, for a stream that asks on
/// every poll: a stream is polled a few times per call, and waiting on the
/// signal each time (a lock on its list of waiters) was about 1 % of the
/// server's CPU at 256 clients (bench/results/2026-12-05.md). Here the
/// wait is polled only when the signal may have come (one atomic load
/// says) or the stream is polled for another task than the one it last
/// registered, as `futures`' `AtomicWaker` does.
struct Stopping {
    /// Resolves once the signal is `true`.
    wait: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// A copy of the signal, which has changed once the server stops.
    signal: watch::Receiver<bool>,
    /// The waker `wait` was last polled with.
    registered: Option<Waker>,
}

impl Stopping {
    fn new(mut signal: watch::Receiver<bool>) -> Self {
        let copy = signal.clone();
        Stopping {
            wait: Box::pin(async move {
                // An error means the server is gone: stopping too.
                let _ = signal.wait_for(|stopping| *stopping).await;
            }),
            signal: copy,
            registered: None,
        }
    }

    /// Whether the server is stopping; if not, `cx` is woken when it does.
    fn poll_stopped(&mut self, cx: &mut Context<'_>) -> bool {
        // The server stops by sending `true`, and a sender gone is stopping
        // too; either way this copy has seen a change.
        let signalled = self.signal.has_changed().unwrap_or(true);
        let registered =
            (self.registered.as_ref()).is_some_and(|waker| waker.will_wake(cx.waker()));
        if !signalled && registered {
            return false;
        }
        self.registered = Some(cx.waker().clone());
        self.wait.as_mut().poll(cx).is_ready()
    }
}

impl CallStream {
    pub fn new(
        api: Api,
        credentials: Credentials,
        requests: impl Stream<Item = Result<CallRequest, Status>> + Send + 'static,
        stopping: watch::Receiver<bool>,
    ) -> Self {
        CallStream {
            api: Arc::new(api),
            credentials: Arc::new(credentials),
            requests: Some(Box::pin(requests)),
            requests_woken: WokenOnly::new(),
            stopping: Stopping::new(stopping),
            stopped: false,
            running: FuturesUnordered::new(),
            cancels: HashMap::default(),
            next_serial: 0,
            acquires_in_flight: 0,
            refused: VecDeque::new(),
        }
    }

    fn start(&mut self, request: CallRequest) {
        let id = request.id;
        let call = match request.call {
            Some(Call::Cancel(_)) => {
                // Unknown ids are fine: the call may have finished already.
                if let Some(cancel) = self.cancels.remove(&id) {
                    let _ = cancel.sender.send(());
                }
                return;
            }
            None => {
                let message = "the call request names no call";
                return self.refuse(id, ErrorKind::InvalidArgument, message.into());
            }
            Some(_) if self.cancels.contains_key(&id) => {
                let message = format!("call id {id} is already in flight on this stream");
                return self.refuse(id, ErrorKind::InvalidArgument, message);
            }
            Some(_) if self.stopped => {
                // Never started, so safe to send elsewhere at once.
                let message = "this node is shutting down".to_owned();
                return self.refuse(id, ErrorKind::NotLeader, message);
            }
            Some(call)
                if is_acquire(&call) && self.acquires_in_flight >= MAX_ACQUIRES_IN_FLIGHT =>
            {
                let message = format!(
                    "{MAX_ACQUIRES_IN_FLIGHT} acquires are in flight on this stream; \
                     wait for some to finish"
                );
                return self.refuse(id, ErrorKind::LimitReached, message);
            }
            Some(call) => call,
        };
        self.next_serial += 1;
        let serial = self.next_serial;
        let acquire = is_acquire(&call);
        self.acquires_in_flight += usize::from(acquire);
        let (sender, cancelled) = oneshot::channel();
        self.cancels.insert(id, Cancel { serial, sender });
        let (api, credentials) = (self.api.clone(), self.credentials.clone());
        self.running.push(Box::pin(Running {
            work: run(api, credentials, call),
            cancelled: Some(cancelled),
            id,
            serial,
            acquire,
        }));
    }

    fn refuse(&mut self, id: u64, kind: ErrorKind, message: String) {
        let error = ApiError::new(kind, message);
        self.refused.push_back(CallResponse {
            id,
            result: Some(Answer::Error(error.into())),
        });
    }
}

/// Whether `call` may wait in a queue (and so counts against
/// [`MAX_ACQUIRES_IN_FLIGHT`]).
fn is_acquire(call: &Call) -> bool {
    matches!(
        call,
        Call::Acquire(_) | Call::AcquirePermits(_) | Call::Campaign(_)
    )
}

pin_project_lite::pin_project! {
    /// A call in flight: its work, until it is done or the client cancels
    /// it. A future of its own, not an `async` block around a `select!`:
    /// the block kept what it was given (the call, its `Arc`s) beside the
    /// work it made of them, and drew a random number on every poll. Each
    /// call's future is boxed, and at 1,648 bytes it was past mimalloc's
    /// small objects (1 KiB), which take a shorter path.
    struct Running<W> {
        #[pin]
        work: W,
        // `None` once its sender is gone without a word: the entry was
        // replaced, and only the work can end the call now.
        cancelled: Option<oneshot::Receiver<()>>,
        id: u64,
        serial: u64,
        acquire: bool,
    }
}

impl<W: Future<Output = Answer>> Future for Running<W> {
    type Output = Finished;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Finished> {
        let this = self.project();
        // The work first: a call that is done is answered without its
        // cancel being looked at.
        let answer = match this.work.poll(cx) {
            Poll::Ready(answer) => Some(answer),
            Poll::Pending => {
                let Some(cancelled) = this.cancelled else {
                    return Poll::Pending;
                };
                match Pin::new(cancelled).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    // Dropping the work abandons the call as a dropped
                    // unary call would.
                    Poll::Ready(Ok(())) => None,
                    Poll::Ready(Err(_)) => {
                        *this.cancelled = None;
                        return Poll::Pending;
                    }
                }
            }
        };
        Poll::Ready(Finished {
            id: *this.id,
            acquire: *this.acquire,
            serial: *this.serial,
            answer,
        })
    }
}

/// Runs `call` as `credentials`. A function returning an `async move`
/// block rather than an `async fn`, which would keep its arguments twice
/// (see `Api::timed`).
#[expect(
    clippy::manual_async_fn,
    reason = "an `async fn` keeps its arguments twice"
)]
fn run(
    api: Arc<Api>,
    credentials: Arc<Credentials>,
    call: Call,
) -> impl Future<Output = Answer> + Send {
    async move {
        let credentials = &*credentials;
        let answer = match call {
            Call::Acquire(request) => api.acquire(credentials, request).await.map(Answer::Acquire),
            Call::AcquirePermits(request) => api
                .acquire_permits(credentials, request)
                .await
                .map(Answer::AcquirePermits),
            Call::Campaign(request) => api
                .campaign(credentials, request)
                .await
                .map(Answer::Campaign),
            Call::Release(request) => api.release(credentials, request).await.map(Answer::Release),
            Call::KeepAlive(request) => api
                .keep_alive(credentials, request)
                .await
                .map(Answer::KeepAlive),
            Call::Cancel(_) => unreachable!("cancels are handled by the stream"),
        };
        answer.unwrap_or_else(|err| Answer::Error(err.into()))
    }
}

impl From<ApiError> for CallError {
    fn from(err: ApiError) -> Self {
        CallError {
            kind: err.kind.as_str().to_owned(),
            message: err.message,
            leader: err.leader,
        }
    }
}

/// A frame that does not decode is the caller's fault: the stream ends
/// with `invalid_argument` and the `deadbolt-error` kind, as an undecodable
/// unary request is answered (`grpc.rs`), not with tonic's INTERNAL, which
/// reads as the server's. A black-box run sent 500 random frames: 498 ended
/// INTERNAL without a kind.
fn caller_fault(status: Status) -> Status {
    if is_undecodable(status.code() == tonic::Code::Internal, status.message()) {
        ErrorKind::InvalidArgument.status(status.message())
    } else {
        status
    }
}

impl Stream for CallStream {
    type Item = Result<CallResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if !this.stopped && this.stopping.poll_stopped(cx) {
            this.stopped = true;
        }
        loop {
            // Read every request that has arrived: each is started, refused
            // or a cancel, so reading never waits on a call in flight; only
            // on the stream's bounds, freed as calls finish and answers go.
            while let Some(requests) = &mut this.requests {
                if this.running.len() >= MAX_CALLS_PER_STREAM
                    || this.refused.len() >= MAX_REFUSED_QUEUED
                {
                    break;
                }
                let read = (this.requests_woken).poll(cx, |cx| requests.poll_next_unpin(cx));
                match read {
                    Poll::Ready(Some(Ok(request))) => this.start(request),
                    // A malformed message or a broken connection: the
                    // stream ends with this status, and the calls in flight
                    // are abandoned with it.
                    Poll::Ready(Some(Err(status))) => {
                        this.requests = None;
                        // The calls go first: the cancels' order then
                        // wakes no one (the simulation replays runs exactly).
                        this.running.clear();
                        this.cancels.clear();
                        return Poll::Ready(Some(Err(caller_fault(status))));
                    }
                    Poll::Ready(None) => this.requests = None,
                    Poll::Pending => break,
                }
            }
            if let Some(refused) = this.refused.pop_front() {
                return Poll::Ready(Some(Ok(refused)));
            }
            match this.running.poll_next_unpin(cx) {
                Poll::Ready(Some(Finished {
                    id,
                    acquire,
                    serial,
                    answer,
                })) => {
                    this.acquires_in_flight -= usize::from(acquire);
                    if this
                        .cancels
                        .get(&id)
                        .is_some_and(|cancel| cancel.serial == serial)
                    {
                        this.cancels.remove(&id);
                    }
                    if let Some(answer) = answer {
                        return Poll::Ready(Some(Ok(CallResponse {
                            id,
                            result: Some(answer),
                        })));
                    }
                    // Cancelled: nothing to send; look again.
                }
                Poll::Ready(None) if this.requests.is_none() || this.stopped => {
                    return Poll::Ready(None)
                }
                // Idle: the requests' waker brings us back.
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Whether a status is tonic's answer to a request message it could not
/// decode: INTERNAL, with a message that says so.
pub(crate) fn is_undecodable(internal: bool, message: &str) -> bool {
    internal && message.contains("decode")
}

/// A `Calls` stream's `cancel`, on tokio's paused clock: the cancelled
/// acquire is abandoned exactly as a dropped unary call is, after the 3 s
/// grace and not before, and gets no answer.
///
/// Why here: the stream is served in-process from a request body fed by the
/// test (gRPC-framed messages, decoded by tonic as on the wire), so the
/// grace can be timed to the millisecond; the real-process test
/// (`an_acquire_given_up_by_its_caller_does_not_leak_the_lock` in
/// `crates/cli/tests/recovery.rs`) covers the client's side of a cancel.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::single_node;
    use deadbolt_proto::v1::{
        AcquireRequest, CancelCall, LockStatusRequest, OpenSessionRequest, OpenSessionResponse,
        ReleaseRequest,
    };
    use hyper::body::{Body, Bytes, Frame};
    use tokio::sync::mpsc;
    use tokio::time::{Duration, Instant};
    use tonic::codec::{Codec, ProstCodec};
    use tonic::Streaming;

    /// A request body that carries the messages the test sends, framed as
    /// gRPC frames them.
    struct Requests(mpsc::UnboundedReceiver<CallRequest>);

    impl Body for Requests {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.0.poll_recv(cx).map(|request| {
                request.map(|request| {
                    let message = prost::Message::encode_to_vec(&request);
                    let mut frame = vec![0];
                    frame.extend((message.len() as u32).to_be_bytes());
                    frame.extend(message);
                    Ok(Frame::data(Bytes::from(frame)))
                })
            })
        }
    }

    async fn holder(api: &Api, lock: &str) -> Option<u64> {
        let request = LockStatusRequest {
            lock: lock.to_owned(),
        };
        let status = api.lock_status(&Credentials::ANONYMOUS, request).await;
        status.unwrap().state.map(|state| state.holder_session_id)
    }

    async fn open(api: &Api) -> OpenSessionResponse {
        let request = OpenSessionRequest { ttl_ms: 60_000 };
        api.open_session(&Credentials::ANONYMOUS, request)
            .await
            .unwrap()
    }

    fn acquire(session: &OpenSessionResponse, wait: bool, attempt: u64) -> AcquireRequest {
        AcquireRequest {
            session_id: session.session_id,
            session_secret: session.session_secret.clone(),
            lock: "job".to_owned(),
            wait,
            timeout_ms: None,
            attempt,
            ..AcquireRequest::default()
        }
    }

    fn release(session: &OpenSessionResponse, token: u64) -> ReleaseRequest {
        ReleaseRequest {
            session_id: session.session_id,
            session_secret: session.session_secret.clone(),
            lock: "job".to_owned(),
            token,
        }
    }

    /// Serves a stream whose requests the test sends; its answers, once it
    /// ends, come from the returned task.
    fn serve(
        api: &Api,
        stopping: watch::Receiver<bool>,
    ) -> (
        mpsc::UnboundedSender<CallRequest>,
        tokio::task::JoinHandle<Vec<Result<CallResponse, Status>>>,
    ) {
        let (send, requests) = mpsc::unbounded_channel();
        let decoder = ProstCodec::<CallResponse, CallRequest>::default().decoder();
        let requests = Streaming::new_request(decoder, Requests(requests), None, None);
        let stream = CallStream::new(api.clone(), Credentials::ANONYMOUS, requests, stopping);
        (send, tokio::spawn(stream.collect::<Vec<_>>()))
    }

    /// Waits until `waiter` is in the queue of "job".
    async fn until_queued(api: &Api, waiter: &OpenSessionResponse) {
        loop {
            let status = api
                .lock_status(
                    &Credentials::ANONYMOUS,
                    LockStatusRequest { lock: "job".into() },
                )
                .await
                .unwrap();
            if status.state.unwrap().waiter_session_ids == [waiter.session_id] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// A node whose lock "job" is held, and a stream (stopping with
    /// `stopping`) whose acquire of it, id 1, waits in its queue.
    struct Queued {
        _node: crate::embedded::EmbeddedNode,
        api: Api,
        holder: OpenSessionResponse,
        held: u64,
        waiter: OpenSessionResponse,
        send: mpsc::UnboundedSender<CallRequest>,
        answers: tokio::task::JoinHandle<Vec<Result<CallResponse, Status>>>,
    }

    async fn queued_behind_a_holder(stopping: watch::Receiver<bool>) -> Queued {
        let (node, api) = single_node().await;
        let (holder, waiter) = (open(&api).await, open(&api).await);
        let held = api
            .acquire(&Credentials::ANONYMOUS, acquire(&holder, false, 1))
            .await
            .unwrap()
            .token;
        let (send, answers) = serve(&api, stopping);
        let call = Some(Call::Acquire(acquire(&waiter, true, 7)));
        send.send(CallRequest { id: 1, call }).unwrap();
        until_queued(&api, &waiter).await;
        Queued {
            _node: node,
            api,
            holder,
            held,
            waiter,
            send,
            answers,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_acquire_is_given_up_after_the_grace_and_gets_no_answer() {
        let (_running, stopping) = watch::channel(false);
        let Queued {
            _node,
            api,
            holder: holder_session,
            held,
            waiter,
            send,
            answers,
        } = queued_behind_a_holder(stopping).await;
        let anonymous = &Credentials::ANONYMOUS;
        let cancel = Some(Call::Cancel(CancelCall {}));
        send.send(CallRequest {
            id: 1,
            call: cancel,
        })
        .unwrap();
        let cancelled = Instant::now();

        // Freed within the grace: the grant goes to the cancelled call's
        // session, kept for a retry until the grace is over, then given back.
        api.release(anonymous, release(&holder_session, held))
            .await
            .unwrap();
        assert_eq!(holder(&api, "job").await, Some(waiter.session_id));
        tokio::time::sleep_until(cancelled + Duration::from_millis(2900)).await;
        assert_eq!(
            holder(&api, "job").await,
            Some(waiter.session_id),
            "given back before the grace was over"
        );
        tokio::time::sleep_until(cancelled + Duration::from_millis(3100)).await;
        assert_eq!(
            holder(&api, "job").await,
            None,
            "the cancelled grant was kept"
        );

        drop(send);
        let answers = answers.await.unwrap();
        assert!(
            answers.is_empty(),
            "a cancelled call was answered: {answers:?}"
        );
    }

    /// The shutdown signal reaches a stream that is waiting, not only one
    /// that is being polled anyway (`Stopping` polls the signal's wait only
    /// when it may have come): a call sent after it is turned away, the call
    /// in flight is answered, and the stream ends while the client still
    /// holds its end open.
    #[tokio::test(start_paused = true)]
    async fn a_stopping_server_turns_new_calls_away_and_ends_the_stream_after_those_in_flight() {
        let (running, stopping) = watch::channel(false);
        let Queued {
            _node,
            api,
            holder: holder_session,
            held,
            send,
            answers,
            ..
        } = queued_behind_a_holder(stopping).await;
        let anonymous = &Credentials::ANONYMOUS;

        running.send(true).unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let call = Some(Call::Acquire(acquire(&holder_session, false, 2)));
        send.send(CallRequest { id: 2, call }).unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!answers.is_finished(), "ended with a call in flight");
        api.release(anonymous, release(&holder_session, held))
            .await
            .unwrap();

        let answers = tokio::time::timeout(Duration::from_secs(10), answers)
            .await
            .expect("the stream did not end")
            .unwrap();
        let answers: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
        let [turned_away, granted] = &answers[..] else {
            panic!("two answers were due: {answers:?}");
        };
        match (turned_away.id, &turned_away.result) {
            (2, Some(Answer::Error(error))) => assert_eq!(error.kind, "not_leader"),
            _ => panic!("the late call was not turned away: {turned_away:?}"),
        }
        assert!(
            matches!((granted.id, &granted.result), (1, Some(Answer::Acquire(_)))),
            "the call in flight was not granted: {granted:?}"
        );
        drop(send);
    }

    /// Every call's future is boxed. mimalloc serves objects of at most
    /// 1 KiB on a shorter path; at 1,648 bytes each call took the longer
    /// one, and copied the 1.6 KB into the box. A new layer on the call
    /// path (an `async fn` wrapper keeps its arguments and the future it
    /// awaits) can push it back over.
    #[test]
    fn a_running_call_fits_in_a_small_allocation() {
        fn running_size<A, B, C, W>(_: impl Fn(A, B, C) -> W) -> usize {
            std::mem::size_of::<Running<W>>()
        }
        let size = running_size(run);
        assert!(size <= 1024, "a running call is {size} bytes");
    }
}
