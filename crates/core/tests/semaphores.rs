//! Property tests of counting semaphores, read/write locks and elections:
//! random commands, locks on the same names among them, checked against
//! what the table reports (its outcomes, events and listings) after every
//! step: never more permits out than the capacity, never two live permits
//! on one slot, never an exclusive holder beside another, one leader at a
//! time and only its term proclaims, tokens strictly increasing, grants in
//! FIFO order (so no reader passes a queued writer), nobody waiting while
//! its request fits, one name one kind, and nothing left once every
//! session ends. A watcher that knows only the watch events (`WatchEvent`)
//! must know who holds, who waits and each leader's value, exactly as the
//! table has it, after every step.

use deadbolt_core::{
    AcquireOutcome, Command, Event, FeatureLevel, LockError, LockTable, Outcome, RwMode,
    SecretHash, SessionId, Token, WatchEvent, WatchKind,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

const NAMES: [&str; 3] = ["pool", "gpu", "shared"];

#[derive(Debug, Clone)]
enum Step {
    Open,
    Close(usize),
    Expire(usize),
    /// Session, name, capacity, count, wait, attempt.
    Permits(usize, usize, u32, u32, bool, u64),
    /// Session, name, exclusive, wait, attempt: a read/write acquire.
    Rw(usize, usize, bool, bool, u64),
    /// Session, name, wait, attempt: a campaign for leader.
    Campaign(usize, usize, bool, u64),
    /// Session, name, with the session's token (or a wrong one).
    Proclaim(usize, usize, bool),
    /// A mutex acquire on one of the same names.
    Lock(usize, usize),
    /// Release the session's grant with its token, or a wrong one.
    Release(usize, usize, bool),
    Cancel(usize, usize),
    Abandon(usize, usize, u64),
    /// An admin defines (or resizes) a semaphore.
    Define(usize, u32),
    /// An admin drops a definition.
    Delete(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => Just(Step::Open),
        1 => (0..6usize).prop_map(Step::Close),
        1 => (0..6usize).prop_map(Step::Expire),
        // Capacity 3 mostly; 2 or 4 sometimes, which a live semaphore of 3
        // refuses; 0 takes whatever it has (refused if it does not exist).
        8 => (0..6usize, 0..3usize, prop::sample::select(vec![3u32, 3, 3, 2, 4, 0]), 0..5u32,
              prop::bool::weighted(0.8), 0..3u64)
            .prop_map(|(s, n, c, k, w, a)| Step::Permits(s, n, c, k, w, a)),
        6 => (0..6usize, 0..3usize, prop::bool::weighted(0.3), prop::bool::weighted(0.8), 0..3u64)
            .prop_map(|(s, n, x, w, a)| Step::Rw(s, n, x, w, a)),
        4 => (0..6usize, 0..3usize, prop::bool::weighted(0.8), 0..3u64)
            .prop_map(|(s, n, w, a)| Step::Campaign(s, n, w, a)),
        2 => (0..6usize, 0..3usize, prop::bool::weighted(0.8))
            .prop_map(|(s, n, ok)| Step::Proclaim(s, n, ok)),
        1 => (0..6usize, 0..3usize).prop_map(|(s, n)| Step::Lock(s, n)),
        4 => (0..6usize, 0..3usize, prop::bool::weighted(0.9))
            .prop_map(|(s, n, ok)| Step::Release(s, n, ok)),
        1 => (0..6usize, 0..3usize).prop_map(|(s, n)| Step::Cancel(s, n)),
        1 => (0..6usize, 0..3usize, 0..3u64).prop_map(|(s, n, a)| Step::Abandon(s, n, a)),
        // Capacity 0 in a `Permits` step takes a defined one's; these make
        // and resize them, below what is held too.
        1 => (0..3usize, 1..5u32).prop_map(|(n, c)| Step::Define(n, c)),
        1 => (0..3usize).prop_map(Step::Delete),
    ]
}

/// What the test learned from the table's replies and events.
#[derive(Default)]
struct Seen {
    opened: Vec<SessionId>,
    ended: BTreeSet<SessionId>,
    /// Each semaphore's queue, from `Queued` outcomes and `WaitEnded`.
    queues: BTreeMap<Arc<str>, VecDeque<SessionId>>,
    /// Each (name, session) grant's token.
    grants: BTreeMap<(Arc<str>, SessionId), Token>,
    last_token: Option<Token>,
}

impl Seen {
    fn session(&self, index: usize) -> SessionId {
        self.opened
            .get(index % self.opened.len().max(1))
            .copied()
            .unwrap_or(SessionId(999))
    }

    fn absorb(&mut self, table: &LockTable, events: &[Event]) {
        for event in events {
            match event {
                Event::Granted {
                    lock,
                    session,
                    token,
                } => {
                    assert!(!self.ended.contains(session), "grant to an ended session");
                    assert!(
                        self.last_token.is_none_or(|last| *token > last),
                        "token {token} not above {:?}",
                        self.last_token
                    );
                    // A grant of k permits takes k tokens.
                    let permits = table
                        .semaphores()
                        .permits(*session, lock)
                        .map_or(1, <[_]>::len);
                    self.last_token = Some(Token(token.0 + permits as u64 - 1));
                    let queue = self.queues.entry(lock.clone()).or_default();
                    if queue.contains(session) {
                        assert_eq!(
                            queue.pop_front(),
                            Some(*session),
                            "{lock} granted out of FIFO order"
                        );
                    }
                    self.grants.insert((lock.clone(), *session), *token);
                }
                Event::Released {
                    lock,
                    session,
                    token,
                } => {
                    assert_eq!(self.grants.remove(&(lock.clone(), *session)), Some(*token));
                }
                Event::WaitEnded { lock, session } => {
                    let queue = self.queues.get_mut(lock).expect("known queue");
                    let before = queue.len();
                    queue.retain(|s| s != session);
                    assert_eq!(queue.len() + 1, before, "{session} was not waiting");
                }
                Event::SessionOpened { session, .. } => self.opened.push(*session),
                Event::SessionEnded { session, .. } => {
                    assert!(self.ended.insert(*session));
                    assert!(self.grants.keys().all(|(_, s)| s != session));
                    assert!(self.queues.values().all(|q| !q.contains(session)));
                }
                Event::Queued { .. } | Event::LockDelayed { .. } => {}
            }
        }
    }
}

/// What a watcher of every name knows from the watch events alone.
#[derive(Default)]
struct Watched {
    holders: BTreeMap<Arc<str>, BTreeMap<SessionId, Token>>,
    queues: BTreeMap<Arc<str>, Vec<SessionId>>,
    /// Each election's leader's value.
    values: BTreeMap<Arc<str>, String>,
}

impl Watched {
    fn absorb(&mut self, events: &[WatchEvent]) {
        for event in events {
            let name = event.name.clone();
            let session = event.session.expect("every event here is a session's");
            let queue = self.queues.entry(name.clone()).or_default();
            match event.kind {
                WatchKind::Granted => {
                    queue.retain(|waiting| *waiting != session);
                    let token = event.token.expect("a grant has a token");
                    self.holders
                        .entry(name.clone())
                        .or_default()
                        .insert(session, token);
                    if let Some(value) = &event.value {
                        self.values.insert(name, value.clone());
                    }
                }
                WatchKind::Released
                | WatchKind::Closed
                | WatchKind::Expired
                | WatchKind::Abandoned => {
                    let held = self
                        .holders
                        .entry(name.clone())
                        .or_default()
                        .remove(&session);
                    assert_eq!(held, event.token, "{event:?} ended another grant");
                    self.values.remove(&name);
                }
                WatchKind::Queued => queue.push(session),
                WatchKind::LeftQueue => {
                    let before = queue.len();
                    queue.retain(|waiting| *waiting != session);
                    assert_eq!(queue.len() + 1, before, "{event:?} was not queued");
                }
                WatchKind::Proclaimed => {
                    self.values
                        .insert(name, event.value.clone().expect("a value"));
                }
                WatchKind::Delayed | WatchKind::Put | WatchKind::Deleted => {
                    unreachable!("no lock-delays or store writes here: {event:?}")
                }
            }
        }
    }

    /// The watcher's view must be the table's, for every name.
    fn check(&self, table: &LockTable) {
        for name in NAMES {
            let (holders, queue, value) = holds_and_waits(table, name);
            let empty = BTreeMap::new();
            let watched = self.holders.get(name).unwrap_or(&empty);
            assert_eq!(*watched, holders, "{name}: holders");
            let watched = self.queues.get(name).cloned().unwrap_or_default();
            assert_eq!(watched, queue, "{name}: queue");
            assert_eq!(self.values.get(name), value.as_ref(), "{name}: value");
        }
    }
}

/// Who holds `name` (with which token), who waits, and its leader's
/// value, whatever kind it is.
fn holds_and_waits(
    table: &LockTable,
    name: &str,
) -> (BTreeMap<SessionId, Token>, Vec<SessionId>, Option<String>) {
    let semaphores = table.semaphores();
    if let Some(info) = semaphores.semaphore(name) {
        let holders = info.holders.iter().map(|(s, p)| (*s, p[0].token));
        let waiters = info.waiters.iter().map(|(s, _)| *s);
        return (holders.collect(), waiters.collect(), None);
    }
    if let Some(info) = semaphores.rw_lock(name) {
        let holders = info.holders.iter().map(|(s, _, t)| (*s, *t));
        let waiters = info.waiters.iter().map(|(s, _)| *s);
        return (holders.collect(), waiters.collect(), None);
    }
    if let Some(info) = semaphores.election(name) {
        let (leader, term, value) = info.leader;
        let holders = BTreeMap::from([(leader, term)]);
        return (holders, info.candidates, Some(value));
    }
    match table.lock(name) {
        Some(info) => (
            BTreeMap::from([(info.holder, info.token)]),
            info.waiters,
            None,
        ),
        None => Default::default(),
    }
}

fn command(step: &Step, seen: &Seen) -> Command {
    let name = |n: usize| NAMES[n].to_owned();
    match *step {
        Step::Open => Command::OpenSession {
            ttl_ms: 10_000,
            secret: SecretHash([seen.opened.len() as u8; 32]),
            owner: None,
        },
        Step::Close(s) => Command::CloseSession {
            session: seen.session(s),
        },
        Step::Expire(s) => Command::ExpireSession {
            session: seen.session(s),
            term: 1,
        },
        Step::Permits(s, n, capacity, count, wait, attempt) => Command::AcquirePermits {
            session: seen.session(s),
            semaphore: name(n),
            capacity,
            count,
            wait,
            attempt,
        },
        Step::Rw(s, n, exclusive, wait, attempt) => Command::AcquireRw {
            session: seen.session(s),
            lock: name(n),
            mode: match exclusive {
                true => RwMode::Exclusive,
                false => RwMode::Shared,
            },
            wait,
            attempt,
        },
        Step::Campaign(s, n, wait, attempt) => Command::Campaign {
            session: seen.session(s),
            election: name(n),
            value: format!("candidate {s}"),
            wait,
            attempt,
        },
        Step::Proclaim(s, n, right) => {
            let session = seen.session(s);
            let token = seen.grants.get(&(name(n).into(), session)).copied();
            let token = token.unwrap_or(Token(1));
            Command::Proclaim {
                session,
                election: name(n),
                token: if right { token } else { Token(token.0 + 1) },
                value: format!("proclaimed by {s}"),
            }
        }
        Step::Lock(s, n) => Command::Acquire {
            session: seen.session(s),
            lock: name(n),
            wait: true,
            attempt: 0,
            lock_delay_ms: 0,
        },
        Step::Release(s, n, right) => {
            let session = seen.session(s);
            let token = seen
                .grants
                .get(&(name(n).into(), session))
                .copied()
                .unwrap_or(Token(1));
            Command::Release {
                session,
                lock: name(n),
                token: if right { token } else { Token(token.0 + 1) },
            }
        }
        Step::Cancel(s, n) => Command::CancelWait {
            session: seen.session(s),
            lock: name(n),
        },
        Step::Abandon(s, n, attempt) => Command::Abandon {
            session: seen.session(s),
            lock: name(n),
            attempt,
        },
        Step::Define(n, capacity) => Command::DefineSemaphore {
            semaphore: name(n),
            capacity,
        },
        Step::Delete(n) => Command::DeleteSemaphore { semaphore: name(n) },
    }
}

/// What every listing must show, whatever happened: permits within the
/// capacity, one permit per slot, an exclusive holder alone, and a head of
/// the queue that waits only because its request does not fit.
fn check_listings(table: &LockTable) {
    for name in NAMES {
        if let Some(info) = table.semaphores().election(name) {
            // One leader: the election's grant is the only one, and a
            // candidate waits only behind it.
            assert!(table.semaphores().rw_lock(name).is_none());
            assert!(table.semaphores().semaphore(name).is_none());
            assert!(!info.candidates.contains(&info.leader.0));
        }
        if let Some(info) = table.semaphores().rw_lock(name) {
            let exclusive = |mode: &RwMode| *mode == RwMode::Exclusive;
            let writers = info.holders.iter().filter(|(_, m, _)| exclusive(m)).count();
            assert!(writers == 0 || info.holders.len() == 1, "{name}: {info:?}");
            if let Some((_, mode)) = info.waiters.first() {
                assert!(writers > 0 || (exclusive(mode) && !info.holders.is_empty()));
            }
            assert!(table.semaphores().semaphore(name).is_none());
        }
        let Some(info) = table.semaphores().semaphore(name) else {
            continue;
        };
        // Held may exceed a capacity a definition lowered since (`run`
        // checks that no grant does).
        let held: usize = info.holders.iter().map(|(_, p)| p.len()).sum();
        let slots: BTreeSet<u32> = info
            .holders
            .iter()
            .flat_map(|(_, permits)| permits.iter().map(|p| p.slot))
            .collect();
        assert_eq!(slots.len(), held, "{name}: two permits on one slot");
        if let Some((_, count)) = info.waiters.first() {
            assert!(*count as usize > (info.capacity as usize).saturating_sub(held));
        }
        assert!(
            table.lock(name).is_none(),
            "{name} is a lock and a semaphore"
        );
    }
}

fn run(
    table: &mut LockTable,
    seen: &mut Seen,
    watched: &mut Watched,
    command: &Command,
) -> Result<Outcome, LockError> {
    let before = table.clone();
    let before_semaphores = before.semaphores().clone();
    let mut watch = Vec::new();
    let term = command.decided_in_term().unwrap_or(1);
    let applied = table.apply_watched(command, 0, term, Some(&mut watch));
    table.check_invariants();
    check_listings(table);
    watched.absorb(&watch);
    watched.check(table);
    // A command that grants permits leaves no more out than the capacity.
    for event in &applied.events {
        if let Event::Granted { lock, .. } = event {
            if let Some(info) = table.semaphores().semaphore(lock) {
                let held: usize = info.holders.iter().map(|(_, p)| p.len()).sum();
                assert!(held <= info.capacity as usize, "{lock}: {held} permits out");
            }
        }
    }
    if let Command::CloseSession { .. } = command {
        assert!(watch.iter().all(|event| matches!(
            event.kind,
            WatchKind::Closed | WatchKind::LeftQueue | WatchKind::Granted
        )));
    }
    if applied.outcome.is_err() {
        assert_eq!(*table, before, "a refused command changed the table");
        assert_eq!(*table.semaphores(), before_semaphores);
    }
    let acquired = match command {
        Command::AcquirePermits {
            session, semaphore, ..
        } => Some((session, semaphore)),
        Command::Acquire { session, lock, .. } | Command::AcquireRw { session, lock, .. } => {
            Some((session, lock))
        }
        Command::Campaign {
            session, election, ..
        } => Some((session, election)),
        _ => None,
    };
    // Locks on the same names queue too; their queues are followed alike.
    if let (Some((session, name)), Ok(Outcome::Acquire(AcquireOutcome::Queued { position }))) =
        (acquired, &applied.outcome)
    {
        let queue = seen.queues.entry(name.as_str().into()).or_default();
        match queue.iter().position(|s| s == session) {
            Some(index) => {
                assert_eq!(index + 1, *position, "a retry moved the queue place");
                assert!(applied.events.is_empty());
            }
            None => {
                queue.push_back(*session);
                assert_eq!(queue.len(), *position);
            }
        }
    }
    // FIFO on arrival too: a new request never passes anyone waiting.
    if let (Some((_, name)), Ok(Outcome::Acquire(AcquireOutcome::Granted { .. }))) =
        (acquired, &applied.outcome)
    {
        if !applied.events.is_empty() {
            assert!(
                seen.queues
                    .get(name.as_str())
                    .is_none_or(VecDeque::is_empty),
                "{name} granted past its queue"
            );
        }
    }
    // Only the leader proclaims, and what it proclaims is what everyone reads.
    // (A refused one changed nothing: checked above.)
    if let (
        Command::Proclaim {
            session,
            election,
            value,
            token,
        },
        Ok(_),
    ) = (command, &applied.outcome)
    {
        let leader = table.semaphores().election(election).map(|e| e.leader);
        let leader = leader.expect("proclaimed by a leader");
        assert_eq!(
            leader,
            (*session, *token, value.clone()),
            "a proclaim not by the leader's term"
        );
    }
    seen.absorb(table, &applied.events);
    applied.outcome
}

fn at_semaphore_level() -> LockTable {
    let mut table = LockTable::new();
    let raise = Command::SetClusterVersion {
        level: FeatureLevel::SEMAPHORES,
    };
    assert!(table.apply(&raise).outcome.is_ok());
    table
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn semaphores_rw_locks_and_elections_keep_their_rules_under_any_command_sequence(
        steps in prop::collection::vec(step(), 1..150),
    ) {
        let mut table = at_semaphore_level();
        let mut seen = Seen::default();
        let mut watched = Watched::default();
        for step in &steps {
            let command = command(step, &seen);
            if let Err(err) = run(&mut table, &mut seen, &mut watched, &command) {
                let expected = matches!(err,
                    LockError::UnknownSession(_) | LockError::NoPermits { .. }
                    | LockError::Busy { .. } | LockError::NotHolder { .. }
                    | LockError::StaleToken { .. } | LockError::InvalidPermits { .. }
                    | LockError::CapacityMismatch { .. } | LockError::WrongKind { .. }
                    | LockError::RwBusy { .. } | LockError::OtherMode { .. }
                    | LockError::HasLeader { .. } | LockError::NoSuchSemaphore { .. }
                    | LockError::NotDefined { .. });
                prop_assert!(expected, "unexpected error {}", err);
            }
        }
        // The table's image carries the semaphores beside the table.
        let bytes = serde_json::to_vec(table.semaphores()).unwrap();
        let restored = serde_json::from_slice(&bytes).unwrap();
        prop_assert_eq!(table.clone().with_semaphores(restored), table.clone());
        // Liveness: once every session ends, every waiter was granted or
        // removed, and no semaphore is left.
        let live: Vec<SessionId> =
            seen.opened.iter().copied().filter(|s| !seen.ended.contains(s)).collect();
        for session in live {
            let close = Command::CloseSession { session };
            run(&mut table, &mut seen, &mut watched, &close).unwrap();
        }
        // Defined semaphores stay, unused, until deleted.
        for name in NAMES {
            if table.semaphores().semaphore(name).is_some_and(|s| s.defined) {
                prop_assert!(table.semaphores().semaphore(name).unwrap().holders.is_empty());
                let delete = Command::DeleteSemaphore { semaphore: name.to_owned() };
                run(&mut table, &mut seen, &mut watched, &delete).unwrap();
            }
        }
        prop_assert!(table.semaphores().is_empty());
        prop_assert_eq!(table.lock_count(), 0);
        prop_assert!(seen.grants.is_empty());
        prop_assert!(seen.queues.values().all(VecDeque::is_empty));
    }
}

fn open(table: &mut LockTable) -> SessionId {
    let open = Command::OpenSession {
        ttl_ms: 10_000,
        secret: SecretHash([1; 32]),
        owner: None,
    };
    match table.apply(&open).outcome {
        Ok(Outcome::SessionOpened { session, .. }) => session,
        other => panic!("{other:?}"),
    }
}

fn permits(session: SessionId, count: u32) -> Command {
    Command::AcquirePermits {
        session,
        semaphore: "pool".into(),
        capacity: 3,
        count,
        wait: true,
        attempt: 0,
    }
}

#[test]
fn semaphores_wait_for_the_cluster_version_that_allows_them() {
    let mut table = LockTable::new();
    let session = open(&mut table);
    let refused = table.apply(&permits(session, 1));
    assert!(
        matches!(refused.outcome, Err(LockError::NeedsClusterVersion { needed, .. }) if needed == FeatureLevel::SEMAPHORES)
    );
    assert!(table.semaphores().is_empty());
}

#[test]
fn a_large_request_at_the_head_holds_back_smaller_ones_behind_it() {
    let mut table = at_semaphore_level();
    let (a, b, c) = (open(&mut table), open(&mut table), open(&mut table));
    table.apply(&permits(a, 2)).outcome.unwrap();
    // b asks for all three: it waits for a, and c's one permit (which
    // would fit now) waits behind it.
    assert_eq!(
        table.apply(&permits(b, 3)).outcome,
        Ok(Outcome::Acquire(AcquireOutcome::Queued { position: 1 }))
    );
    assert_eq!(
        table.apply(&permits(c, 1)).outcome,
        Ok(Outcome::Acquire(AcquireOutcome::Queued { position: 2 }))
    );
    let info = table.semaphores().semaphore("pool").unwrap();
    assert_eq!(info.waiters, vec![(b, 3), (c, 1)]);
    // b gives up: c's request fits, and is granted in the same step.
    let cancelled = table.apply(&Command::CancelWait {
        session: b,
        lock: "pool".into(),
    });
    assert!(cancelled
        .events
        .iter()
        .any(|e| matches!(e, Event::Granted { session, .. } if *session == c)));
    let info = table.semaphores().semaphore("pool").unwrap();
    let slots: Vec<u32> = info
        .holders
        .iter()
        .flat_map(|(_, permits)| permits.iter().map(|p| p.slot))
        .collect();
    assert_eq!(slots, vec![0, 1, 2], "a's two slots, then c's");
}

#[test]
fn one_name_is_one_kind() {
    let mut table = at_semaphore_level();
    let session = open(&mut table);
    table.apply(&permits(session, 1)).outcome.unwrap();
    let as_lock = table.apply(&Command::Acquire {
        session,
        lock: "pool".into(),
        wait: false,
        attempt: 0,
        lock_delay_ms: 0,
    });
    assert_eq!(
        as_lock.outcome.unwrap_err().to_string(),
        "\"pool\" is a semaphore, not a lock: one name is one kind"
    );
    let other_capacity = table.apply(&Command::AcquirePermits {
        session,
        semaphore: "pool".into(),
        capacity: 5,
        count: 1,
        wait: true,
        attempt: 0,
    });
    assert!(other_capacity
        .outcome
        .unwrap_err()
        .to_string()
        .starts_with("semaphore \"pool\" has 3 permits, not 5"));
}

fn rw(session: SessionId, mode: RwMode, wait: bool) -> Command {
    Command::AcquireRw {
        session,
        lock: "doc".into(),
        mode,
        wait,
        attempt: 0,
    }
}

fn granted(applied: &deadbolt_core::Applied) -> Vec<SessionId> {
    let grants = applied.events.iter().filter_map(|event| match event {
        Event::Granted { session, .. } => Some(*session),
        _ => None,
    });
    grants.collect()
}

#[test]
fn readers_share_a_queued_writer_holds_back_later_readers_and_readers_at_the_head_go_together() {
    let mut table = at_semaphore_level();
    let [r1, r2, w, r3, r4] = [(); 5].map(|()| open(&mut table));
    table.apply(&rw(r1, RwMode::Shared, true)).outcome.unwrap();
    assert!(matches!(
        table.apply(&rw(r2, RwMode::Shared, true)).outcome,
        Ok(Outcome::Acquire(AcquireOutcome::Granted { .. }))
    ));
    // The writer waits for both readers; a reader after it waits behind it
    // although the lock is only held shared (no writer starvation).
    for (session, mode, position) in [(w, RwMode::Exclusive, 1), (r3, RwMode::Shared, 2)] {
        assert_eq!(
            table.apply(&rw(session, mode, true)).outcome,
            Ok(Outcome::Acquire(AcquireOutcome::Queued { position }))
        );
    }
    let busy = table
        .apply(&rw(r4, RwMode::Shared, false))
        .outcome
        .unwrap_err();
    assert_eq!(
        busy.to_string(),
        "read/write lock \"doc\" cannot be taken shared now: held shared by 2, 2 requests \
         queued ahead"
    );
    table.apply(&rw(r4, RwMode::Shared, true)).outcome.unwrap();
    // The readers leave: the writer alone; then both readers behind it at once.
    let close = |session| Command::CloseSession { session };
    assert!(granted(&table.apply(&close(r1))).is_empty());
    assert_eq!(granted(&table.apply(&close(r2))), vec![w]);
    assert_eq!(granted(&table.apply(&close(w))), vec![r3, r4]);
    let info = table.semaphores().rw_lock("doc").unwrap();
    let modes: Vec<RwMode> = info.holders.iter().map(|(_, mode, _)| *mode).collect();
    assert_eq!(modes, [RwMode::Shared, RwMode::Shared]);
    assert!(
        info.holders[0].2 < info.holders[1].2,
        "one token each, in order"
    );
}

#[test]
fn a_hold_keeps_its_mode_and_a_name_its_kind() {
    let mut table = LockTable::new();
    let session = open(&mut table);
    let refused = table.apply(&rw(session, RwMode::Shared, true));
    assert!(matches!(
        refused.outcome,
        Err(LockError::NeedsClusterVersion { needed, .. }) if needed == FeatureLevel::RW_LOCKS
    ));
    let mut table = at_semaphore_level();
    let session = open(&mut table);
    table
        .apply(&rw(session, RwMode::Shared, true))
        .outcome
        .unwrap();
    let upgrade = table.apply(&rw(session, RwMode::Exclusive, true)).outcome;
    assert!(
        matches!(
            upgrade,
            Err(LockError::OtherMode {
                has: RwMode::Shared,
                ..
            })
        ),
        "{upgrade:?}"
    );
    let as_semaphore = table.apply(&Command::AcquirePermits {
        session,
        semaphore: "doc".into(),
        capacity: 3,
        count: 1,
        wait: true,
        attempt: 0,
    });
    assert_eq!(
        as_semaphore.outcome.unwrap_err().to_string(),
        "\"doc\" is a read/write lock, not a semaphore: one name is one kind"
    );
    table.apply(&permits(session, 1)).outcome.unwrap();
    let pool_as_rw = table.apply(&Command::AcquireRw {
        session,
        lock: "pool".into(),
        mode: RwMode::Exclusive,
        wait: true,
        attempt: 0,
    });
    assert_eq!(
        pool_as_rw.outcome.unwrap_err().to_string(),
        "\"pool\" is a semaphore, not a read/write lock: one name is one kind"
    );
}

#[test]
fn a_shared_token_fences_reads_and_only_the_exclusive_one_writes() {
    let mut table = at_semaphore_level();
    let (reader, writer) = (open(&mut table), open(&mut table));
    let token_of = |outcome| match outcome {
        Ok(Outcome::Acquire(AcquireOutcome::Granted { token })) => token,
        other => panic!("{other:?}"),
    };
    let shared = token_of(table.apply(&rw(reader, RwMode::Shared, true)).outcome);
    let put = |token| Command::StorePut {
        key: "doc/body".into(),
        value: "v".into(),
        token,
        lock: Some("doc".into()),
    };
    let refused = table.apply(&put(shared)).outcome;
    assert!(
        matches!(refused, Err(LockError::NotCurrentGrant { .. })),
        "{refused:?}"
    );
    let read = Command::StoreRead {
        key: "doc/body".into(),
        token: shared,
        lock: Some("doc".into()),
    };
    table.apply(&read).outcome.unwrap();
    // A newer reader reads the key; the older one still may: readers
    // share, and the fence stays at the newer token.
    let newer_reader = open(&mut table);
    let newer = token_of(table.apply(&rw(newer_reader, RwMode::Shared, true)).outcome);
    let read_with = |token| Command::StoreRead {
        key: "doc/body".into(),
        token,
        lock: Some("doc".into()),
    };
    table.apply(&read_with(newer)).outcome.unwrap();
    let older_read = table.apply(&read_with(shared)).outcome;
    assert!(
        matches!(older_read, Ok(Outcome::Read(ref stored)) if stored.fence == newer),
        "{older_read:?}"
    );
    for session in [reader, newer_reader] {
        let close = Command::CloseSession { session };
        table.apply(&close).outcome.unwrap();
    }
    // Once the readers are gone, the older reader's token reads no more.
    let stale = table.apply(&read_with(shared)).outcome;
    assert!(
        matches!(stale, Err(LockError::NotCurrentGrant { .. })),
        "{stale:?}"
    );
    let exclusive = token_of(table.apply(&rw(writer, RwMode::Exclusive, true)).outcome);
    assert!(exclusive > newer);
    table.apply(&put(exclusive)).outcome.unwrap();
}

/// Permits of the semaphore "pool", naming `capacity` (0: what it has).
fn permits_of(session: SessionId, capacity: u32) -> Command {
    Command::AcquirePermits {
        session,
        semaphore: "pool".into(),
        capacity,
        count: 1,
        wait: true,
        attempt: 0,
    }
}

fn define(capacity: u32) -> Command {
    Command::DefineSemaphore {
        semaphore: "pool".into(),
        capacity,
    }
}

#[test]
fn a_defined_semaphore_stays_and_only_a_definition_changes_its_permits() {
    let mut table = at_semaphore_level();
    let [a, b, c] = [(); 3].map(|()| open(&mut table));
    let missing = table.apply(&permits_of(a, 0)).outcome;
    assert!(
        matches!(missing, Err(LockError::NoSuchSemaphore { .. })),
        "{missing:?}"
    );
    table.apply(&define(2)).outcome.unwrap();
    let pool = table.semaphores().semaphore("pool").unwrap();
    assert!(pool.defined && pool.holders.is_empty() && pool.capacity == 2);
    // Acquirers name no capacity, or the one it has; another is refused.
    for session in [a, b] {
        let taken = table.apply(&permits_of(session, 0)).outcome;
        assert!(matches!(
            taken,
            Ok(Outcome::Acquire(AcquireOutcome::Granted { .. }))
        ));
    }
    let other = table.apply(&permits_of(c, 3)).outcome;
    assert!(
        matches!(other, Err(LockError::CapacityMismatch { .. })),
        "{other:?}"
    );
    assert!(matches!(
        table.apply(&permits_of(c, 2)).outcome,
        Ok(Outcome::Acquire(AcquireOutcome::Queued { position: 1 }))
    ));
    // Lowered below what is held: nothing is taken back, nothing granted
    // until enough is released.
    assert!(table.apply(&define(1)).events.is_empty());
    let token_of =
        |table: &LockTable, session| table.semaphores().permits(session, "pool").unwrap()[0].token;
    let release = Command::Release {
        session: a,
        lock: "pool".into(),
        token: token_of(&table, a),
    };
    assert_eq!(granted(&table.apply(&release)), []);
    // Raised: the head of the queue fits now, and is granted at once.
    assert_eq!(granted(&table.apply(&define(3))), [c]);
    table.check_invariants();
    // Everyone gone, it stays; deleted, it goes.
    for session in [b, c] {
        table
            .apply(&Command::CloseSession { session })
            .outcome
            .unwrap();
    }
    assert!(table.semaphores().semaphore("pool").unwrap().defined);
    let delete = Command::DeleteSemaphore {
        semaphore: "pool".into(),
    };
    table.apply(&delete).outcome.unwrap();
    assert!(table.semaphores().is_empty());
    let again = table.apply(&delete).outcome;
    assert!(
        matches!(again, Err(LockError::NoSuchSemaphore { .. })),
        "{again:?}"
    );
}

#[test]
fn lowering_a_semaphore_ends_the_waits_it_could_never_grant() {
    let mut table = at_semaphore_level();
    let [a, b, c] = [(); 3].map(|()| open(&mut table));
    table.apply(&define(4)).outcome.unwrap();
    let ask = |session, count| Command::AcquirePermits {
        session,
        semaphore: "pool".into(),
        capacity: 0,
        count,
        wait: true,
        attempt: 0,
    };
    table.apply(&ask(a, 4)).outcome.unwrap();
    table.apply(&ask(b, 3)).outcome.unwrap();
    table.apply(&ask(c, 1)).outcome.unwrap();
    // b's 3 could never fit in 2, and would hold c back forever.
    let lowered = table.apply(&define(2));
    assert_eq!(
        lowered.events,
        [Event::WaitEnded {
            lock: "pool".into(),
            session: b
        }]
    );
    let waiting = table.semaphores().semaphore("pool").unwrap().waiters;
    assert_eq!(waiting, [(c, 1)]);
    table.check_invariants();
}

#[test]
fn a_name_defined_as_a_semaphore_is_no_lock_and_a_lock_is_no_semaphore() {
    let mut table = at_semaphore_level();
    let a = open(&mut table);
    table.apply(&lock_of(a)).outcome.unwrap();
    let refused = table.apply(&define(2)).outcome;
    assert!(
        matches!(refused, Err(LockError::WrongKind { .. })),
        "{refused:?}"
    );
    let mut table = at_semaphore_level();
    let a = open(&mut table);
    table.apply(&define(2)).outcome.unwrap();
    let refused = table.apply(&lock_of(a)).outcome;
    assert!(
        matches!(refused, Err(LockError::WrongKind { .. })),
        "{refused:?}"
    );
}

fn lock_of(session: SessionId) -> Command {
    Command::Acquire {
        session,
        lock: "pool".into(),
        wait: false,
        attempt: 0,
        lock_delay_ms: 0,
    }
}
