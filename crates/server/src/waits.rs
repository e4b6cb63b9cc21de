//! [`Waits`]: what became of each queued (session, lock) wait, derived from
//! the state machine's events, and the blocked acquire calls watching them.
//!
//! The record of a wait is created by the `Queued` event itself, while the
//! entry is applied, and updated by the `Granted` / `WaitEnded` events that
//! follow. An acquire call subscribes only after its own acquire came back
//! `Queued`, so it can only ever see the outcome of *that* wait: never a
//! grant from an older entry (say, one re-applied after a restart), and never
//! miss a grant that came before it subscribed.

use deadbolt_core::{Event, LockTable, SessionId, Token};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use tokio::sync::oneshot;

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    Granted(Token),
    /// Removed from the queue without a grant: cancelled, or the session ended.
    Dropped,
}

/// The latest wait of one session on one lock.
#[derive(Default)]
struct Wait {
    ended: Option<WaitEnd>,
    subscribers: Vec<(u64, oneshot::Sender<WaitEnd>)>,
}

impl Wait {
    fn end(&mut self, end: WaitEnd) {
        self.ended = Some(end);
        for (_, subscriber) in self.subscribers.drain(..) {
            let _ = subscriber.send(end);
        }
    }
}

#[derive(Default)]
pub struct Waits {
    /// By session, then lock: a session's waits go away together with it.
    waits: Mutex<BTreeMap<SessionId, BTreeMap<String, Wait>>>,
    next_subscription: AtomicU64,
    /// Set at shutdown: no acquire call may start waiting any more.
    closed: AtomicBool,
}

/// One blocked acquire call. Hand it back to [`Waits::unsubscribe`].
pub struct Subscription {
    session: SessionId,
    lock: String,
    id: u64,
    pub ended: oneshot::Receiver<WaitEnd>,
}

impl Waits {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<SessionId, BTreeMap<String, Wait>>> {
        self.waits.lock().expect("waits lock poisoned")
    }

    /// Watches the wait that an acquire just reported as `Queued`. If it
    /// already ended, the subscription resolves at once.
    pub fn subscribe(&self, session: SessionId, lock: &str) -> Subscription {
        let id = self.next_subscription.fetch_add(1, Ordering::Relaxed);
        let (sender, ended) = oneshot::channel();
        let mut waits = self.lock();
        let wait = waits
            .get_mut(&session)
            .and_then(|locks| locks.get_mut(lock));
        match wait {
            // Shutting down: dropping the sender ends the subscription as
            // "unavailable, retry".
            _ if self.closed.load(Ordering::Relaxed) => drop(sender),
            Some(Wait {
                ended: Some(end), ..
            }) => {
                let _ = sender.send(*end);
            }
            Some(wait) => wait.subscribers.push((id, sender)),
            // Gone: the wait ended without a grant, or the session ended.
            None => {
                let _ = sender.send(WaitEnd::Dropped);
            }
        }
        Subscription {
            session,
            lock: lock.to_owned(),
            id,
            ended,
        }
    }

    /// Stops watching. Returns whether other calls still watch the same
    /// wait: a retried acquire shares the queue place, so the place must not
    /// be given up while one of them still wants it.
    pub fn unsubscribe(&self, subscription: &Subscription) -> bool {
        let mut waits = self.lock();
        let Some(wait) = waits
            .get_mut(&subscription.session)
            .and_then(|locks| locks.get_mut(&subscription.lock))
        else {
            return false;
        };
        wait.subscribers.retain(|(id, _)| *id != subscription.id);
        !wait.subscribers.is_empty()
    }

    /// Follows the table. Called with the events of each applied entry, in
    /// order.
    pub fn on_event(&self, event: &Event) {
        let mut waits = self.lock();
        match event {
            Event::Queued { lock, session } => {
                waits
                    .entry(*session)
                    .or_default()
                    .insert(lock.to_string(), Wait::default());
            }
            Event::Granted {
                lock,
                session,
                token,
            } => {
                if let Some(wait) = waits
                    .get_mut(session)
                    .and_then(|locks| locks.get_mut(&**lock))
                {
                    wait.end(WaitEnd::Granted(*token));
                }
            }
            Event::WaitEnded { lock, session } => {
                // Nothing to remember: a later subscriber that finds no
                // record hears "dropped" all the same.
                if let Some(mut wait) = waits
                    .get_mut(session)
                    .and_then(|locks| locks.remove(&**lock))
                {
                    wait.end(WaitEnd::Dropped);
                }
            }
            Event::Released { lock, session, .. } => {
                if let Some(locks) = waits.get_mut(session) {
                    locks.remove(&**lock);
                }
            }
            Event::SessionEnded { session, .. } => {
                // Dropping the senders ends any remaining subscriptions.
                waits.remove(session);
            }
            // A delayed lock keeps its queue; the grant after the delay
            // is an ordinary `Granted`.
            Event::SessionOpened { .. } | Event::LockDelayed { .. } => {}
        }
    }

    /// The table was replaced wholesale (a snapshot was loaded): start over
    /// from the waits it holds.
    pub fn reset(&self, table: &LockTable) {
        let mut waits = self.lock();
        waits.clear();
        for (session, lock) in table.waits() {
            waits
                .entry(session)
                .or_default()
                .insert(lock.to_owned(), Wait::default());
        }
    }

    /// Whether some acquire call is blocked on this wait right now.
    pub fn is_watched(&self, session: SessionId, lock: &str) -> bool {
        self.lock()
            .get(&session)
            .and_then(|locks| locks.get(lock))
            .is_some_and(|wait| !wait.subscribers.is_empty())
    }

    /// Shutdown: ends every blocked acquire call, and any that arrives later.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.drop_subscribers();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Ends every blocked acquire call (they answer "unavailable, retry"),
    /// keeping the record of the waits: the node is shutting down or stopped
    /// leading, and the queue places themselves are untouched.
    pub fn drop_subscribers(&self) {
        for locks in self.lock().values_mut() {
            for wait in locks.values_mut() {
                wait.subscribers.clear();
            }
        }
    }
}
