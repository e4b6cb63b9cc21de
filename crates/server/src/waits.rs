//! [`Waits`]: blocked acquire calls, waiting for the state machine to grant
//! them the lock (or to drop them from the queue).
//!
//! A caller registers *before* proposing its acquire, so a grant applied a
//! moment later can never be missed.

use deadbolt_core::{Event, SessionId, Token};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use tokio::sync::oneshot;

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    Granted(Token),
    /// Removed from the queue without a grant: cancelled, or the session ended.
    Dropped,
}

type Key = (SessionId, String);
/// A ticket id and where to send the outcome.
type Waiter = (u64, oneshot::Sender<WaitEnd>);

#[derive(Default)]
pub struct Waits {
    waiting: Mutex<HashMap<Key, Vec<Waiter>>>,
    next_ticket: AtomicU64,
}

/// One registered waiter. Hand it back to [`Waits::forget`] when done.
pub struct Ticket {
    key: Key,
    id: u64,
    pub ended: oneshot::Receiver<WaitEnd>,
}

impl Waits {
    pub fn register(&self, session: SessionId, lock: &str) -> Ticket {
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let (sender, ended) = oneshot::channel();
        let key = (session, lock.to_owned());
        self.waiting
            .lock()
            .expect("waits lock poisoned")
            .entry(key.clone())
            .or_default()
            .push((id, sender));
        Ticket { key, id, ended }
    }

    /// Unregisters a ticket. Returns whether other callers still wait on the
    /// same (session, lock): a retried acquire shares the queue place, so
    /// the place must not be given up while one of them still wants it.
    pub fn forget(&self, ticket: &Ticket) -> bool {
        let mut waiting = self.waiting.lock().expect("waits lock poisoned");
        let Some(tickets) = waiting.get_mut(&ticket.key) else {
            return false;
        };
        tickets.retain(|(id, _)| *id != ticket.id);
        let others = !tickets.is_empty();
        if !others {
            waiting.remove(&ticket.key);
        }
        others
    }

    pub fn on_event(&self, event: &Event) {
        let (key, end) = match event {
            Event::Granted {
                lock,
                session,
                token,
            } => ((*session, lock.clone()), WaitEnd::Granted(*token)),
            Event::WaitEnded { lock, session } => ((*session, lock.clone()), WaitEnd::Dropped),
            _ => return,
        };
        let woken = self
            .waiting
            .lock()
            .expect("waits lock poisoned")
            .remove(&key);
        for (_, sender) in woken.into_iter().flatten() {
            let _ = sender.send(end);
        }
    }

    /// Ends every wait: the node is shutting down or lost leadership.
    pub fn drop_all(&self) {
        self.waiting.lock().expect("waits lock poisoned").clear();
    }
}
