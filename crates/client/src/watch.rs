//! [`Client::watch`]: follow a name, or every name under a prefix, as a
//! stream of events that survives the loss of the node serving it.
//!
//! Why a task of its own: every node serves watches from its own applied
//! log, with the same log index on each event everywhere, so when the
//! stream breaks (a node killed, a leader change, a restart) the task opens
//! another on the next endpoint, after the last event it passed on, and the
//! caller sees one unbroken stream, without a gap or a repeat. The channel
//! between the task and the caller is bounded: a caller that reads slowly
//! slows the task's reading, never grows memory; if it falls behind what
//! the server keeps, the stream ends with [`ErrorKind::Compacted`].

use crate::{Client, Error, ErrorKind};
use deadbolt_proto::v1::deadbolt_client::DeadboltClient;
use deadbolt_proto::v1::{ElectionLeader, LeaderResponse, WatchEvent, WatchRequest};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Events the task may read ahead of the caller.
const READ_AHEAD: usize = 1024;
/// How long the task tries other endpoints before it gives up.
const RECONNECT_FOR: Duration = Duration::from_secs(30);
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

/// A watch in progress (see [`Client::watch`]): a [`Stream`] of events,
/// in log order, until an error ends it.
///
/// [`Stream`]: tokio_stream::Stream
pub struct Watch {
    events: mpsc::Receiver<Item>,
}

/// What the task passes on.
enum Item {
    /// The first server answered: the watch is in place.
    Started,
    Event(WatchEvent),
    Failed(Error),
}

impl Item {
    fn into_next(self) -> Option<Result<WatchEvent, Error>> {
        match self {
            Item::Started => None,
            Item::Event(event) => Some(Ok(event)),
            Item::Failed(error) => Some(Err(error)),
        }
    }
}

impl Watch {
    /// The next event; `None` after an error ended the watch.
    pub async fn next(&mut self) -> Option<Result<WatchEvent, Error>> {
        loop {
            if let Some(next) = self.events.recv().await?.into_next() {
                return Some(next);
            }
        }
    }

    /// Waits until a server has the watch in place: a change made after
    /// this returns is seen, even by a watch "from now on". Reading the
    /// current state after this, then following the events, misses nothing.
    pub async fn started(&mut self) -> Result<(), Error> {
        match self.events.recv().await {
            Some(Item::Started) => Ok(()),
            Some(Item::Failed(error)) => Err(error),
            Some(Item::Event(_)) => unreachable!("a watch starts before its first event"),
            None => Err(Error::new(ErrorKind::Unavailable, "the watch ended")),
        }
    }
}

impl tokio_stream::Stream for Watch {
    type Item = Result<WatchEvent, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match self.events.poll_recv(cx) {
                Poll::Ready(Some(item)) => match item.into_next() {
                    Some(next) => return Poll::Ready(Some(next)),
                    None => continue,
                },
                other => return other.map(|_| None),
            }
        }
    }
}

/// What to watch, and from where.
#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    /// Follow every name that starts with the name given.
    pub prefix: bool,
    /// Start after this event id (`"INDEX.POSITION"`) or log index
    /// (`"INDEX"`), as a previous watch's [`WatchEvent::id`]; `None`: from
    /// now on.
    pub after: Option<String>,
}

impl Client {
    /// Follows `name` (a lock, semaphore, read/write lock, election or store
    /// key), or with [`WatchOptions::prefix`] every name under it: grants,
    /// releases, queue changes, proclaims and store writes, each with its
    /// log index, tokens and identities (docs/watches.md). The stream moves
    /// to another endpoint if its node goes away, resuming after the last
    /// event it gave, and ends with an error it cannot get past:
    /// [`ErrorKind::Compacted`] (the history it needs is gone: read the
    /// current state, then watch again), a permission refused, or no
    /// endpoint answering for 30 s.
    pub fn watch(&self, name: &str, options: WatchOptions) -> Watch {
        let (send, events) = mpsc::channel(READ_AHEAD);
        let request = WatchRequest {
            name: name.to_owned(),
            prefix: options.prefix,
            after: options.after.unwrap_or_default(),
        };
        tokio::spawn(follow(self.clone(), request, send));
        Watch { events }
    }
}

impl Client {
    /// Follows who leads `election`: [`LeaderChanges::next`] gives the
    /// leader now, then again each time the leader, its term or its value
    /// changes (`None`: nobody leads). Built on a watch of the election:
    /// every change wakes it, and it reads the leadership then, so the last
    /// change is never missed, but changes in quick succession (a grant and
    /// the new leader's first proclaim) may show as one. For every single
    /// change, read the watch itself ([`Client::watch`]). Survives the loss
    /// of the node serving it.
    pub async fn observe_leader(&self, election: &str) -> Result<LeaderChanges, Error> {
        let mut events = self.watch(election, WatchOptions::default());
        // In place before the first read: no change after it goes unseen.
        events.started().await?;
        Ok(LeaderChanges {
            client: self.clone(),
            election: election.to_owned(),
            events,
            shown: None,
        })
    }
}

/// The leadership of an election as it changes (see
/// [`Client::observe_leader`]).
pub struct LeaderChanges {
    client: Client,
    election: String,
    events: Watch,
    /// What `next` gave last.
    shown: Option<Option<ElectionLeader>>,
}

impl LeaderChanges {
    /// The leader now (and the candidates), the first time; then at the
    /// next leadership that differs from the last one given (candidates
    /// joining or leaving the queue do not count). An error ends the
    /// observation.
    pub async fn next(&mut self) -> Result<LeaderResponse, Error> {
        loop {
            if self.shown.is_some() {
                match self.events.next().await {
                    Some(event) => drop(event?),
                    None => return Err(Error::new(ErrorKind::Unavailable, "the watch ended")),
                }
            }
            let answer = self.client.leader(&self.election).await?;
            if self.shown.as_ref() != Some(&answer.leader) {
                self.shown = Some(answer.leader.clone());
                return Ok(answer);
            }
        }
    }
}

/// Reads the watch from one endpoint after another, passing its events on,
/// until the caller drops the [`Watch`] or an error ends it.
async fn follow(client: Client, mut request: WatchRequest, send: mpsc::Sender<Item>) {
    let mut failing_since: Option<Instant> = None;
    let mut started = false;
    loop {
        let (address, generation, channel) = client.endpoint_now();
        let status = match DeadboltClient::new(channel).watch(request.clone()).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    let message = tokio::select! {
                        message = stream.message() => message,
                        // Nobody reads any more: stop watching.
                        () = send.closed() => return,
                    };
                    match message {
                        Ok(Some(answer)) => {
                            failing_since = None;
                            if !started {
                                started = true;
                                if send.send(Item::Started).await.is_err() {
                                    return;
                                }
                            }
                            for event in answer.events {
                                request.after.clone_from(&event.id);
                                if send.send(Item::Event(event)).await.is_err() {
                                    return;
                                }
                            }
                            if !answer.cursor.is_empty() {
                                request.after = answer.cursor;
                            }
                        }
                        // A watch never ends by itself: the node went away.
                        Ok(None) => break tonic::Status::unavailable("the watch stream ended"),
                        Err(status) => break status,
                    }
                }
            }
            Err(status) => status,
        };
        let error = Error::from_status(&status, &address);
        let since = *failing_since.get_or_insert_with(crate::clock::now);
        // Any node serves a watch, but one that cannot check the caller's
        // credentials (a bearer token it has not applied yet, just after a
        // restart) sends it to the leader: follow it there.
        let movable = matches!(error.kind(), ErrorKind::Unavailable | ErrorKind::NotLeader);
        if !movable || crate::clock::now().saturating_duration_since(since) > RECONNECT_FOR {
            let _ = send.send(Item::Failed(error)).await;
            return;
        }
        tracing::debug!(%address, %error, after = %request.after, "watch moves to another endpoint");
        client.move_on(generation, error.leader());
        tokio::select! {
            () = tokio::time::sleep(RECONNECT_PAUSE) => {}
            () = send.closed() => return,
        }
    }
}
