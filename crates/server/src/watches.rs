//! [`History`]: the newest applied log entries' [`WatchEvent`]s, kept so
//! that a watcher can follow them and resume after a disconnect, and
//! [`Watcher`]: one watch's place in them.
//!
//! Why a ring on every node rather than a stream from the leader: every
//! replica applies the same log, so each has the same events at the same
//! log indexes; a watch may be served by any node and resumed on another
//! (after a leader change, say) from the last index it saw. The ring is
//! filled on the apply path (also when a restart replays the log), so
//! events are kept whether or not anyone watches. It is bounded, and a
//! watch that asks for history it no longer has, or falls that far behind,
//! is told so ([`Compacted`]) rather than given a gap: as etcd's
//! `ErrCompacted`.
//!
//! Watchers pull from the shared ring at their own pace: a slow one costs
//! no memory, it only risks being compacted away.

use deadbolt_core::WatchEvent;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::watch;

/// The events of one applied log entry (only entries with events are kept).
#[derive(Debug)]
pub struct WatchedEntry {
    pub index: u64,
    pub events: Vec<WatchEvent>,
}

/// Where a watch stands: it has seen every event up to `index`, or, with
/// `event`, up to that event (its position in the entry) of `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub index: u64,
    pub event: Option<u32>,
}

impl Cursor {
    /// After every event of entry `index`.
    pub fn after(index: u64) -> Self {
        Cursor { index, event: None }
    }

    /// Parses `"INDEX"` or `"INDEX.EVENT"` (an SSE event id).
    pub fn parse(text: &str) -> Option<Self> {
        let (index, event) = match text.split_once('.') {
            Some((index, event)) => (index, Some(event.parse().ok()?)),
            None => (text, None),
        };
        Some(Cursor {
            index: index.parse().ok()?,
            event,
        })
    }

    fn saw(&self, index: u64, event: u32) -> bool {
        index < self.index || (index == self.index && self.event.is_none_or(|seen| event <= seen))
    }
}

/// Why a watch is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEnd {
    /// The history it needs is gone.
    Compacted(Compacted),
    /// The node is shutting down.
    Closing,
}

/// The history a watch needs is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// Events of entries after this index are still kept.
    pub kept_after: u64,
    /// The newest applied index: read the current state, then watch after it.
    pub current: u64,
}

/// How much history each node keeps, in events and in bytes (names,
/// identities and values): the limit on its memory, whatever the load.
pub const MAX_KEPT_EVENTS: usize = 100_000;
pub const MAX_KEPT_BYTES: usize = 32 << 20;
/// At most this many watches at once on one node.
pub const MAX_WATCHES: usize = 10_000;

/// What one event costs the ring, roughly: its strings and fixed part.
fn cost(event: &WatchEvent) -> usize {
    let strings = event.name.len()
        + event.identity.as_ref().map_or(0, String::len)
        + event.value.as_ref().map_or(0, String::len);
    strings + std::mem::size_of::<WatchEvent>()
}

#[derive(Default)]
struct Ring {
    entries: VecDeque<Arc<WatchedEntry>>,
    events: usize,
    bytes: usize,
    /// Entries up to this index may have had events that are gone.
    floor: u64,
}

impl Ring {
    fn push(&mut self, entry: WatchedEntry) {
        debug_assert!(self
            .entries
            .back()
            .is_none_or(|last| last.index < entry.index));
        self.events += entry.events.len();
        self.bytes += entry.events.iter().map(cost).sum::<usize>();
        self.entries.push_back(Arc::new(entry));
        while self.events > MAX_KEPT_EVENTS || self.bytes > MAX_KEPT_BYTES {
            let oldest = self
                .entries
                .pop_front()
                .expect("over the limit, so not empty");
            self.events -= oldest.events.len();
            self.bytes -= oldest.events.iter().map(cost).sum::<usize>();
            self.floor = oldest.index;
        }
    }
}

/// Every node's recent events, and the newest applied index.
pub struct History {
    ring: Mutex<Ring>,
    applied: watch::Sender<u64>,
    /// One permit per watch in progress.
    watches: Arc<tokio::sync::Semaphore>,
    /// Set at shutdown: every watch ends, so none holds it open.
    closing: AtomicBool,
}

impl Default for History {
    fn default() -> Self {
        History {
            ring: Mutex::default(),
            applied: watch::Sender::new(0),
            watches: Arc::new(tokio::sync::Semaphore::new(MAX_WATCHES)),
            closing: AtomicBool::new(false),
        }
    }
}

impl History {
    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Entries up to `applied` were applied; `entries` are those of them
    /// with events (the apply path calls this).
    pub fn applied(&self, entries: Vec<WatchedEntry>, applied: u64) {
        if !entries.is_empty() {
            let mut ring = self.ring();
            for entry in entries {
                ring.push(entry);
            }
        }
        self.applied.send_if_modified(|newest| {
            let moved = applied > *newest;
            *newest = (*newest).max(applied);
            moved
        });
    }

    /// The table was replaced by a snapshot of index `applied`: no events
    /// lead to it, so the history before it is gone.
    pub fn reset(&self, applied: u64) {
        let mut ring = self.ring();
        ring.entries.clear();
        ring.events = 0;
        ring.bytes = 0;
        ring.floor = applied;
        drop(ring);
        self.applied.send_replace(applied);
    }

    /// Watches in progress.
    pub fn watching(&self) -> usize {
        MAX_WATCHES - self.watches.available_permits()
    }

    /// Events kept.
    pub fn kept_events(&self) -> usize {
        self.ring().events
    }

    /// Ends every watch, now and from now on: the node is shutting down.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.applied.send_modify(|_| {});
    }

    /// Starts a watch of the names `matches` accepts, after `from` (`None`:
    /// from now on). `None` if [`MAX_WATCHES`] are in progress.
    pub fn watch(
        self: &Arc<Self>,
        from: Option<Cursor>,
        matches: Box<dyn Fn(&str) -> bool + Send + Sync>,
    ) -> Option<Watcher> {
        let slot = self.watches.clone().try_acquire_owned().ok()?;
        let applied = self.applied.subscribe();
        let cursor = from.unwrap_or_else(|| Cursor::after(*applied.borrow()));
        Some(Watcher {
            history: self.clone(),
            applied,
            cursor,
            matches,
            _slot: slot,
        })
    }
}

/// One event with its place in the log.
#[derive(Debug, Clone)]
pub struct Positioned {
    pub index: u64,
    /// Its position among its entry's events.
    pub event: u32,
    pub watched: WatchEvent,
}

impl Positioned {
    /// Its SSE event id (and a cursor to resume after it).
    pub fn id(&self) -> String {
        format!("{}.{}", self.index, self.event)
    }
}

/// One watch in progress: where it stands and what it follows.
pub struct Watcher {
    history: Arc<History>,
    applied: watch::Receiver<u64>,
    cursor: Cursor,
    matches: Box<dyn Fn(&str) -> bool + Send + Sync>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Watcher {
    /// Where the watch stands: resume after it.
    pub fn cursor(&self) -> Cursor {
        self.cursor
    }

    /// The next events the watch follows, at most `max`, waiting until
    /// there is one. Every entry's events come whole unless `max` cuts
    /// them. `Err` once the watch is over.
    pub async fn next(&mut self, max: usize) -> Result<Vec<Positioned>, WatchEnd> {
        assert!(max > 0, "a watch reads at least one event at a time");
        loop {
            // Subscribed before reading, so an apply after the read wakes it.
            self.applied.mark_unchanged();
            if self.history.closing.load(Ordering::SeqCst) {
                return Err(WatchEnd::Closing);
            }
            let found = self.read(max).map_err(WatchEnd::Compacted)?;
            if !found.is_empty() {
                return Ok(found);
            }
            if self.applied.changed().await.is_err() {
                // The node is shutting down: nothing more will come.
                std::future::pending::<()>().await;
            }
        }
    }

    /// What has arrived since the cursor; advances it past what it read,
    /// including entries of names the watch does not follow.
    fn read(&mut self, max: usize) -> Result<Vec<Positioned>, Compacted> {
        let ring = self.history.ring();
        let current = *self.applied.borrow();
        if self.cursor.index < ring.floor {
            return Err(Compacted {
                kept_after: ring.floor,
                current,
            });
        }
        let start = ring
            .entries
            .partition_point(|entry| entry.index < self.cursor.index);
        let mut found = Vec::new();
        for entry in ring.entries.range(start..) {
            for (position, watched) in entry.events.iter().enumerate() {
                let position = u32::try_from(position).expect("an entry's events fit a u32");
                if self.cursor.saw(entry.index, position) {
                    continue;
                }
                if found.len() == max {
                    return Ok(found);
                }
                self.cursor = Cursor {
                    index: entry.index,
                    event: Some(position),
                };
                if (self.matches)(&watched.name) {
                    found.push(Positioned {
                        index: entry.index,
                        event: position,
                        watched: watched.clone(),
                    });
                }
            }
            self.cursor = Cursor::after(entry.index);
        }
        // Entries without events (or none yet kept) move the cursor too, so
        // a resumed watch does not ask for history from before them.
        self.cursor = self.cursor.max_index(current);
        Ok(found)
    }
}

impl Cursor {
    fn max_index(self, applied: u64) -> Self {
        if applied > self.index {
            Cursor::after(applied)
        } else {
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deadbolt_core::{SessionId, Token, WatchKind};

    fn granted(name: &str, token: u64) -> WatchEvent {
        WatchEvent {
            kind: WatchKind::Granted,
            name: name.into(),
            session: Some(SessionId(1)),
            identity: None,
            token: Some(Token(token)),
            mode: None,
            permits: None,
            value: None,
        }
    }

    fn entry(index: u64, names: &[&str]) -> WatchedEntry {
        WatchedEntry {
            index,
            events: names.iter().map(|name| granted(name, index)).collect(),
        }
    }

    fn everything() -> Box<dyn Fn(&str) -> bool + Send + Sync> {
        Box::new(|_| true)
    }

    fn ids(events: &[Positioned]) -> Vec<String> {
        events.iter().map(Positioned::id).collect()
    }

    #[tokio::test]
    async fn a_watch_resumes_after_the_last_event_it_saw_even_inside_an_entry() {
        let history = Arc::new(History::default());
        history.applied(vec![entry(3, &["a", "b", "c"]), entry(5, &["a"])], 6);
        let mut all = history.watch(Some(Cursor::after(0)), everything()).unwrap();
        assert_eq!(ids(&all.next(2).await.unwrap()), ["3.0", "3.1"]);
        let resumed = Cursor::parse("3.1").unwrap();
        assert_eq!(all.cursor(), resumed);
        let mut again = history.watch(Some(resumed), everything()).unwrap();
        assert_eq!(ids(&again.next(10).await.unwrap()), ["3.2", "5.0"]);
        // Read to the end: the cursor moved past entry 6, which had none.
        assert_eq!(again.cursor(), Cursor::after(6));
    }

    #[tokio::test]
    async fn a_watch_sees_only_its_names_and_waits_for_the_next() {
        let history = Arc::new(History::default());
        let mut jobs = history
            .watch(None, Box::new(|name| name.starts_with("jobs/")))
            .unwrap();
        let waiting = tokio::spawn(async move { jobs.next(10).await.map(|found| ids(&found)) });
        tokio::task::yield_now().await;
        history.applied(vec![entry(1, &["other"])], 1);
        history.applied(vec![entry(2, &["other", "jobs/a"])], 2);
        assert_eq!(waiting.await.unwrap().unwrap(), ["2.1"]);
    }

    #[tokio::test]
    async fn history_that_is_gone_is_compacted_not_skipped() {
        let history = Arc::new(History::default());
        history.reset(40);
        history.applied(vec![entry(41, &["a"])], 41);
        let mut old = history
            .watch(Some(Cursor::after(39)), everything())
            .unwrap();
        let compacted = old.next(1).await.unwrap_err();
        let expected = Compacted {
            kept_after: 40,
            current: 41,
        };
        assert_eq!(compacted, WatchEnd::Compacted(expected));
        let mut fresh = history
            .watch(Some(Cursor::after(40)), everything())
            .unwrap();
        assert_eq!(ids(&fresh.next(1).await.unwrap()), ["41.0"]);
    }

    #[tokio::test]
    async fn a_watch_that_falls_behind_the_ring_is_cut_off() {
        let history = Arc::new(History::default());
        let mut slow = history.watch(Some(Cursor::after(0)), everything()).unwrap();
        let names = vec!["x"; 1000];
        let entries = MAX_KEPT_EVENTS / names.len() + 1;
        for index in 1..=entries as u64 {
            history.applied(vec![entry(index, &names)], index);
        }
        let WatchEnd::Compacted(compacted) = slow.next(1).await.unwrap_err() else {
            panic!("not compacted");
        };
        assert_eq!(compacted.kept_after, 1);
        assert!(history.ring().events <= MAX_KEPT_EVENTS);
    }

    #[tokio::test]
    async fn closing_ends_every_watch() {
        let history = Arc::new(History::default());
        let mut waiting = history.watch(None, everything()).unwrap();
        let waiting = tokio::spawn(async move { waiting.next(1).await });
        tokio::task::yield_now().await;
        history.close();
        assert_eq!(waiting.await.unwrap().unwrap_err(), WatchEnd::Closing);
    }

    #[test]
    fn cursors_parse_as_sse_ids() {
        assert_eq!(Cursor::parse("12"), Some(Cursor::after(12)));
        let inside = Cursor {
            index: 12,
            event: Some(3),
        };
        assert_eq!(Cursor::parse("12.3"), Some(inside));
        for bad in ["", "x", "12.", "12.x", "-1"] {
            assert_eq!(Cursor::parse(bad), None, "{bad}");
        }
    }
}
