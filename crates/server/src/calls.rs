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
//! answer being written.

use crate::api::Api;
use crate::node::ApiError;
use deadbolt_proto::v1::call_request::Call;
use deadbolt_proto::v1::call_response::Result as Answer;
use deadbolt_proto::v1::{CallError, CallRequest, CallResponse};
use deadbolt_proto::ErrorKind;
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::oneshot;
use tonic::{Status, Streaming};

/// Calls in flight on one stream. Past this the stream stops reading
/// requests until some finish: backpressure, not an error, since the client
/// may simply have many blocked acquires.
const MAX_IN_FLIGHT: usize = 4096;

/// A call being served: resolves to its id and its answer, or no answer if
/// the client cancelled it.
type RunningCall = Pin<Box<dyn Future<Output = (u64, Option<Answer>)> + Send>>;

/// The answers of one `Calls` stream, as they finish.
pub struct CallStream {
    api: Api,
    /// `None` once the client has sent its last request: the stream then
    /// ends when the calls in flight have been answered.
    requests: Option<Streaming<CallRequest>>,
    running: FuturesUnordered<RunningCall>,
    /// How to cancel each call in flight, by id.
    cancels: HashMap<u64, oneshot::Sender<()>>,
    /// Answers to requests refused without running (a malformed request).
    refused: VecDeque<CallResponse>,
}

impl CallStream {
    pub fn new(api: Api, requests: Streaming<CallRequest>) -> Self {
        CallStream {
            api,
            requests: Some(requests),
            running: FuturesUnordered::new(),
            cancels: HashMap::new(),
            refused: VecDeque::new(),
        }
    }

    fn start(&mut self, request: CallRequest) {
        let id = request.id;
        let call = match request.call {
            Some(Call::Cancel(_)) => {
                // Unknown ids are fine: the call may have finished already.
                if let Some(cancel) = self.cancels.remove(&id) {
                    let _ = cancel.send(());
                }
                return;
            }
            Some(call) if !self.cancels.contains_key(&id) => call,
            Some(_) => {
                return self.refuse(
                    id,
                    format!("call id {id} is already in flight on this stream"),
                )
            }
            None => return self.refuse(id, "the call request names no call".into()),
        };
        let (cancel, cancelled) = oneshot::channel();
        self.cancels.insert(id, cancel);
        let api = self.api.clone();
        self.running.push(Box::pin(async move {
            let work = run(api, call);
            tokio::select! {
                answer = work => (id, Some(answer)),
                // Dropping `work` abandons the call as a dropped unary call would.
                _ = cancelled => (id, None),
            }
        }));
    }

    fn refuse(&mut self, id: u64, message: String) {
        let error = ApiError::new(ErrorKind::InvalidArgument, message);
        self.refused.push_back(CallResponse {
            id,
            result: Some(Answer::Error(error.into())),
        });
    }
}

async fn run(api: Api, call: Call) -> Answer {
    let answer = match call {
        Call::Acquire(request) => api.acquire(request).await.map(Answer::Acquire),
        Call::Release(request) => api.release(request).await.map(Answer::Release),
        Call::KeepAlive(request) => api.keep_alive(request).await.map(Answer::KeepAlive),
        Call::Cancel(_) => unreachable!("cancels are handled by the stream"),
    };
    answer.unwrap_or_else(|err| Answer::Error(err.into()))
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

impl Stream for CallStream {
    type Item = Result<CallResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        while this.running.len() + this.refused.len() < MAX_IN_FLIGHT {
            let Some(requests) = &mut this.requests else {
                break;
            };
            match requests.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(request))) => this.start(request),
                // A malformed message or a broken connection: the stream
                // ends with this status, and the calls in flight are
                // abandoned with it.
                Poll::Ready(Some(Err(status))) => {
                    this.requests = None;
                    this.running.clear();
                    this.cancels.clear();
                    return Poll::Ready(Some(Err(status)));
                }
                Poll::Ready(None) => this.requests = None,
                Poll::Pending => break,
            }
        }
        if let Some(refused) = this.refused.pop_front() {
            return Poll::Ready(Some(Ok(refused)));
        }
        loop {
            match this.running.poll_next_unpin(cx) {
                Poll::Ready(Some((id, answer))) => {
                    this.cancels.remove(&id);
                    if let Some(answer) = answer {
                        return Poll::Ready(Some(Ok(CallResponse {
                            id,
                            result: Some(answer),
                        })));
                    }
                }
                Poll::Ready(None) if this.requests.is_none() => return Poll::Ready(None),
                // Idle: the requests' waker brings us back.
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}
