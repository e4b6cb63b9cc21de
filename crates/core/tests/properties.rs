//! Property tests: random command sequences against a `LockTable`, checking
//! the safety and fairness invariants on what the table reports (its
//! outcomes and events), not on its internals.

use deadbolt_core::{
    AcquireOutcome, Command, Event, FeatureLevel, LimitsChange, LockError, LockTable, Outcome,
    SecretHash, SessionId, SessionSecret, TableLimits, Token,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

const LOCKS: [&str; 3] = ["a", "b", "c"];

#[derive(Debug, Clone)]
enum Step {
    Open,
    Close(usize),
    Expire(usize),
    /// Session, lock, wait, attempt id, with a lock-delay.
    Acquire(usize, usize, bool, u64, bool),
    /// The leader's lock-delay timer for a lock ran out.
    EndDelay(usize),
    /// The caller of an acquire attempt went away.
    Abandon(usize, usize, u64),
    /// Release with the right token, or with a wrong one.
    Release(usize, usize, bool),
    Cancel(usize, usize),
    /// A session that never existed.
    Bogus(u64),
    /// An admin sets the limits on sessions and on waiters per lock (some
    /// values below the floor, so refused).
    SetLimits(Option<u64>, Option<u64>),
    /// The leader raises the cluster version (to a level at or below the
    /// one the table is at, too: a replayed or raced raise).
    SetClusterVersion(u32),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => Just(Step::Open),
        1 => (0..8usize).prop_map(Step::Close),
        1 => (0..8usize).prop_map(Step::Expire),
        6 => (0..8usize, 0..3usize, any::<bool>(), 0..4u64, prop::bool::weighted(0.3))
            .prop_map(|(s, l, w, a, d)| Step::Acquire(s, l, w, a, d)),
        1 => (0..3usize).prop_map(Step::EndDelay),
        1 => (0..8usize, 0..3usize, 0..4u64).prop_map(|(s, l, a)| Step::Abandon(s, l, a)),
        4 => (0..8usize, 0..3usize, prop::bool::weighted(0.85)).prop_map(|(s, l, ok)| Step::Release(s, l, ok)),
        1 => (0..8usize, 0..3usize).prop_map(|(s, l)| Step::Cancel(s, l)),
        1 => (1000..1010u64).prop_map(Step::Bogus),
        1 => (prop::option::of(5..14u64), prop::option::of(0..4u64))
            .prop_map(|(s, w)| Step::SetLimits(s, w)),
        1 => (FeatureLevel::BASE.0..=FeatureLevel::NEWEST.0).prop_map(Step::SetClusterVersion),
    ]
}

/// What the test has learned from the table's own replies.
#[derive(Default)]
struct Observed {
    /// Every session ever opened, in order (indexes in `Step` pick from here).
    opened: Vec<SessionId>,
    ended: BTreeSet<SessionId>,
    /// Current holder and token of each lock, from events.
    holders: BTreeMap<Arc<str>, (SessionId, Token)>,
    /// Queue of each lock as reported by `Queued` outcomes and `WaitEnded`.
    queues: BTreeMap<Arc<str>, VecDeque<SessionId>>,
    last_token: Option<Token>,
    /// Locks in lock-delay, with the lost grant's token.
    delayed: BTreeMap<Arc<str>, Token>,
}

impl Observed {
    fn session(&self, index: usize) -> SessionId {
        self.opened
            .get(index % self.opened.len().max(1))
            .copied()
            .unwrap_or(SessionId(999))
    }

    fn absorb(&mut self, events: &[Event]) {
        for event in events {
            match event {
                Event::Granted {
                    lock,
                    session,
                    token,
                } => {
                    assert!(
                        !self.ended.contains(session),
                        "grant to ended session {session}"
                    );
                    assert!(
                        self.last_token.is_none_or(|last| *token > last),
                        "token {token} not above {:?}",
                        self.last_token
                    );
                    self.last_token = Some(*token);
                    assert!(
                        !self.delayed.contains_key(lock),
                        "{lock} granted during its lock-delay"
                    );
                    let previous = self.holders.insert(lock.clone(), (*session, *token));
                    assert!(
                        previous.is_none(),
                        "{lock} granted while held by {previous:?}"
                    );
                    let queue = self.queues.entry(lock.clone()).or_default();
                    if let Some(head) = queue.pop_front() {
                        assert_eq!(head, *session, "{lock} granted out of FIFO order");
                    }
                }
                Event::Released {
                    lock,
                    session,
                    token,
                } => {
                    assert_eq!(self.holders.remove(lock), Some((*session, *token)));
                }
                Event::WaitEnded { lock, session } => {
                    let queue = self
                        .queues
                        .get_mut(lock)
                        .expect("wait ended on known queue");
                    let before = queue.len();
                    queue.retain(|s| s != session);
                    assert_eq!(
                        queue.len() + 1,
                        before,
                        "{session} was not waiting on {lock}"
                    );
                }
                // Checked against the outcome in `run`.
                Event::Queued { .. } => {}
                Event::LockDelayed { lock, token, .. } => {
                    assert!(self.delayed.insert(lock.clone(), *token).is_none());
                }
                Event::SessionOpened { session, .. } => self.opened.push(*session),
                Event::SessionEnded { session, .. } => {
                    assert!(self.ended.insert(*session));
                    assert!(self.holders.values().all(|(s, _)| s != session));
                    assert!(self.queues.values().all(|q| !q.contains(session)));
                }
            }
        }
    }
}

/// The secret hash the `index`th session opened is opened with: a different
/// one for each session.
fn secret_of(index: usize) -> SecretHash {
    let mut hash = [0; 32];
    hash[..8].copy_from_slice(&(index as u64).to_le_bytes());
    SecretHash(hash)
}

/// The identity the `index`th session is opened by: some anonymous, some
/// sharing an identity.
fn owner_of(index: usize) -> Option<String> {
    index
        .is_multiple_of(2)
        .then(|| format!("user{}", index % 3))
}

/// Every session keeps the secret hash and owner it was opened with while it lives,
/// and an id never opened or ended is never reported live.
fn check_secrets(table: &LockTable, seen: &Observed) {
    for (index, session) in seen.opened.iter().enumerate() {
        let hash = secret_of(index);
        let owner = owner_of(index);
        let expected = if seen.ended.contains(session) {
            SessionSecret::Ended
        } else {
            SessionSecret::Live {
                secret: &hash,
                owner: owner.as_deref(),
            }
        };
        assert_eq!(
            table.session_secret(*session),
            expected,
            "session {session}"
        );
    }
    let never = SessionId(seen.opened.last().map_or(1, |last| last.0 + 1));
    assert_eq!(table.session_secret(never), SessionSecret::NotYetOpened);
}

fn command(step: &Step, seen: &Observed) -> Command {
    match *step {
        Step::Open => Command::OpenSession {
            ttl_ms: 10_000,
            secret: secret_of(seen.opened.len()),
            owner: owner_of(seen.opened.len()),
        },
        Step::Close(s) => Command::CloseSession {
            session: seen.session(s),
        },
        Step::Expire(s) => Command::ExpireSession {
            term: 1,
            session: seen.session(s),
        },
        Step::Acquire(s, l, wait, attempt, delayed) => Command::Acquire {
            session: seen.session(s),
            lock: LOCKS[l].into(),
            wait,
            attempt,
            lock_delay_ms: if delayed { 1000 } else { 0 },
        },
        Step::EndDelay(l) => Command::EndLockDelay {
            term: 1,
            lock: LOCKS[l].into(),
            token: seen.delayed.get(LOCKS[l]).copied().unwrap_or(Token(1)),
        },
        Step::Abandon(s, l, attempt) => Command::Abandon {
            session: seen.session(s),
            lock: LOCKS[l].into(),
            attempt,
        },
        Step::Release(s, l, right_token) => {
            let held = seen.holders.get(LOCKS[l]).map_or(Token(1), |(_, t)| *t);
            Command::Release {
                session: seen.session(s),
                lock: LOCKS[l].into(),
                token: if right_token { held } else { Token(held.0 + 1) },
            }
        }
        Step::Cancel(s, l) => Command::CancelWait {
            session: seen.session(s),
            lock: LOCKS[l].into(),
        },
        Step::SetLimits(sessions, waiters) => Command::SetLimits(LimitsChange {
            max_sessions: sessions,
            max_waiters_per_lock: waiters,
            ..LimitsChange::default()
        }),
        Step::SetClusterVersion(level) => Command::SetClusterVersion {
            level: FeatureLevel(level),
        },
        Step::Bogus(id) => Command::Acquire {
            session: SessionId(id),
            lock: "a".into(),
            wait: true,
            attempt: 1,
            lock_delay_ms: 0,
        },
    }
}

/// The cluster version never goes down, and a raise leaves it at the
/// higher of the two levels, as its answer says.
fn check_cluster_version(
    before: &LockTable,
    after: &LockTable,
    command: &Command,
    outcome: &Result<Outcome, LockError>,
) {
    assert!(after.cluster_version() >= before.cluster_version());
    match command {
        Command::SetClusterVersion { level } => {
            let expected = before.cluster_version().max(*level);
            assert_eq!(after.cluster_version(), expected);
            assert_eq!(outcome, &Ok(Outcome::ClusterVersionSet(expected)));
        }
        _ => assert_eq!(after.cluster_version(), before.cluster_version()),
    }
}

/// The limits in force are the last ones set, and every refusal at a limit
/// (and only those) comes when the table was at that limit.
fn check_limits(
    before: &LockTable,
    after: &LockTable,
    command: &Command,
    outcome: &Result<Outcome, LockError>,
) {
    let limits = before.table_limits();
    match (command, outcome) {
        (Command::SetLimits(change), Ok(Outcome::LimitsSet(set))) => {
            assert_eq!(*set, after.table_limits());
            let expect = |old: usize, new: Option<u64>| new.map_or(old, |n| n as usize);
            assert_eq!(
                set.max_sessions,
                expect(limits.max_sessions, change.max_sessions)
            );
            assert_eq!(
                set.max_waiters_per_lock,
                expect(limits.max_waiters_per_lock, change.max_waiters_per_lock)
            );
            assert_eq!(set.max_locks, limits.max_locks);
        }
        (Command::SetLimits(change), Err(LockError::LimitOutOfRange { .. })) => {
            let floor = TableLimits::FLOOR;
            let low = |value: Option<u64>, min: usize| value.is_some_and(|v| v < min as u64);
            assert!(
                low(change.max_sessions, floor.max_sessions)
                    || low(change.max_waiters_per_lock, floor.max_waiters_per_lock),
                "{change:?} refused"
            );
        }
        (Command::SetLimits(change), other) => panic!("{change:?} answered {other:?}"),
        (Command::OpenSession { .. }, Err(LockError::TooManySessions { limit })) => {
            assert_eq!(*limit, limits.max_sessions);
            assert!(before.session_count() >= *limit);
        }
        (Command::OpenSession { .. }, Ok(_)) => {
            assert!(before.session_count() < limits.max_sessions);
        }
        (Command::Acquire { lock, .. }, Err(LockError::TooManyWaiters { limit, .. })) => {
            assert_eq!(*limit, limits.max_waiters_per_lock);
            let waiters = before.lock(lock).map_or(0, |info| info.waiters.len());
            assert!(waiters >= *limit, "{waiters} waiters refused at {limit}");
        }
        (Command::Acquire { lock, .. }, Ok(Outcome::Acquire(AcquireOutcome::Queued { .. }))) => {
            let waiters = before.lock(lock).map_or(0, |info| info.waiters.len());
            let already = after.lock(lock).map_or(0, |info| info.waiters.len()) == waiters;
            assert!(already || waiters < limits.max_waiters_per_lock);
        }
        _ => {}
    }
}

fn run(
    table: &mut LockTable,
    seen: &mut Observed,
    command: &Command,
) -> Result<Outcome, LockError> {
    let before = table.clone();
    // The server never refuses such an acquire as overloaded, because it
    // only keeps a place: it must change nothing but the attempt.
    let keeps_place = match command {
        Command::Acquire { session, lock, .. } => table.holds_or_waits(*session, lock),
        _ => false,
    };
    let applied = table.apply(command);
    table.check_invariants();
    check_limits(&before, table, command, &applied.outcome);
    check_cluster_version(&before, table, command, &applied.outcome);
    if keeps_place {
        assert!(
            applied.events.is_empty(),
            "an acquire by the holder or a waiter changed something: {:?}",
            applied.events
        );
    }
    match &applied.outcome {
        Err(_) => assert_eq!(*table, before, "a refused command changed the table"),
        Ok(Outcome::Acquire(AcquireOutcome::Queued { position })) => {
            let Command::Acquire { session, lock, .. } = command else {
                unreachable!()
            };
            let queue = seen.queues.entry(lock.as_str().into()).or_default();
            let queued_event = Event::Queued {
                lock: lock.as_str().into(),
                session: *session,
            };
            match queue.iter().position(|s| s == session) {
                Some(index) => {
                    assert_eq!(index + 1, *position, "retry moved the queue position");
                    assert!(
                        applied.events.is_empty(),
                        "a retried acquire changed something"
                    );
                }
                None => {
                    queue.push_back(*session);
                    assert_eq!(queue.len(), *position);
                    assert_eq!(applied.events, vec![queued_event]);
                }
            }
            return applied.outcome;
        }
        Ok(Outcome::Acquire(AcquireOutcome::Granted { token })) => {
            let Command::Acquire { session, lock, .. } = command else {
                unreachable!()
            };
            let was_holder = seen.holders.get(lock.as_str()) == Some(&(*session, *token));
            seen.absorb(&applied.events);
            assert_eq!(seen.holders.get(lock.as_str()), Some(&(*session, *token)));
            if was_holder {
                assert!(
                    applied.events.is_empty(),
                    "idempotent acquire changed something"
                );
            }
            return applied.outcome;
        }
        Ok(Outcome::LockDelayEnded { ended }) => {
            let Command::EndLockDelay { lock, token, .. } = command else {
                unreachable!()
            };
            assert_eq!(*ended, seen.delayed.get(lock.as_str()) == Some(token));
            if *ended {
                seen.delayed.remove(lock.as_str());
            }
        }
        Ok(_) => {}
    }
    seen.absorb(&applied.events);
    applied.outcome
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn invariants_hold_for_any_command_sequence(
        steps in prop::collection::vec((step(), prop::option::weighted(0.1, 0..50u64)), 1..120),
    ) {
        let mut table = LockTable::new();
        let mut seen = Observed::default();
        for (step, batch_at_ms) in &steps {
            // Some steps start a new log entry, stamped with the leader's
            // wall clock: the token floor rises to it, and never falls.
            if let Some(at_ms) = *batch_at_ms {
                let before = table.next_token();
                table.raise_token_floor(at_ms);
                prop_assert!(table.next_token() >= before);
                prop_assert!(table.next_token().0 >= at_ms * 1_000);
                table.check_invariants();
            }
            let command = command(step, &seen);
            let outcome = run(&mut table, &mut seen, &command);
            check_secrets(&table, &seen);
            if let (Step::Release(..), Ok(_)) = (step, &outcome) {
                prop_assert!(matches!(outcome, Ok(Outcome::Released)));
            }
            if let Err(err) = &outcome {
                // Errors are only ever the ones a caller could expect.
                let expected = matches!(err,
                    LockError::UnknownSession(_) | LockError::Busy { .. }
                    | LockError::NotHolder { .. } | LockError::StaleToken { .. }
                    | LockError::TooManySessions { .. } | LockError::TooManyWaiters { .. }
                    | LockError::LimitOutOfRange { .. });
                prop_assert!(expected, "unexpected error {}", err);
            }
        }
        // Liveness: once every session ends, every waiter was either granted
        // or removed, and nothing is left behind.
        let live: Vec<SessionId> = seen.opened.iter().copied()
            .filter(|s| !seen.ended.contains(s)).collect();
        for session in live {
            run(&mut table, &mut seen, &Command::CloseSession { session }).unwrap();
        }
        for (lock, token) in seen.delayed.clone() {
            run(&mut table, &mut seen, &Command::EndLockDelay {
                    lock: lock.to_string(),
                    token,
                    term: 1,
                }).unwrap();
        }
        prop_assert_eq!(table.lock_count(), 0);
        prop_assert_eq!(table.session_count(), 0);
        prop_assert!(seen.queues.values().all(VecDeque::is_empty));
        prop_assert!(seen.holders.is_empty());
    }

    /// A snapshot encodes a clone of the table while applies go on (the
    /// clone shares the table's persistent maps): what it encodes must be
    /// the table as it was when cloned, whatever is applied meanwhile.
    #[test]
    fn a_clone_for_a_snapshot_is_unchanged_by_later_commands(
        before in prop::collection::vec(step(), 1..60),
        after in prop::collection::vec(step(), 1..60),
    ) {
        let mut table = LockTable::new();
        let mut seen = Observed::default();
        for step in &before {
            let command = command(step, &seen);
            run(&mut table, &mut seen, &command).ok();
        }
        let at_clone = serde_json::to_vec(&table).unwrap();
        let clone = table.clone();
        for step in &after {
            let command = command(step, &seen);
            run(&mut table, &mut seen, &command).ok();
        }
        prop_assert_eq!(serde_json::to_vec(&clone).unwrap(), at_clone);
        clone.check_invariants();
    }

    #[test]
    fn snapshot_round_trip_preserves_behaviour(steps in prop::collection::vec(step(), 1..80)) {
        let mut table = LockTable::new();
        let mut seen = Observed::default();
        for step in &steps {
            let command = command(step, &seen);
            run(&mut table, &mut seen, &command).ok();
        }
        let bytes = serde_json::to_vec(&table).unwrap();
        let restored: LockTable = serde_json::from_slice(&bytes).unwrap();
        // The table's own encoding leaves the cluster version out (it stays
        // release 0.1.0's); the server's table image carries it beside the
        // table (`store/table_image.rs` tests that).
        prop_assert_eq!(restored.cluster_version(), FeatureLevel::BASE);
        let mut restored = restored.with_cluster_version(table.cluster_version());
        prop_assert_eq!(&restored, &table);
        prop_assert_eq!(restored.table_limits(), table.table_limits());
        // The restored table never re-issues a token (with room for one
        // more session, whatever the steps set the limit to).
        let room = LimitsChange { max_sessions: Some(1_000), ..LimitsChange::default() };
        prop_assert!(restored.apply(&Command::SetLimits(room)).outcome.is_ok());
        let open = restored.apply(&Command::OpenSession { ttl_ms: 1000, secret: secret_of(0), owner: None });
        let Ok(Outcome::SessionOpened { session, .. }) = open.outcome else { panic!() };
        let grant = restored.apply(&Command::Acquire { session, lock: "fresh".into(), wait: false, attempt: 0 , lock_delay_ms: 0 });
        let Ok(Outcome::Acquire(AcquireOutcome::Granted { token })) = grant.outcome else { panic!() };
        prop_assert!(seen.last_token.is_none_or(|last| token > last));
    }
}

fn open_session(table: &mut LockTable) -> SessionId {
    match table
        .apply(&Command::OpenSession {
            ttl_ms: 5000,
            secret: secret_of(0),
            owner: None,
        })
        .outcome
    {
        Ok(Outcome::SessionOpened { session, .. }) => session,
        other => panic!("{other:?}"),
    }
}

#[test]
fn release_errors_name_the_problem() {
    let mut table = LockTable::new();
    let (a, b) = (open_session(&mut table), open_session(&mut table));
    let grant = table.apply(&Command::Acquire {
        session: a,
        lock: "x".into(),
        wait: false,
        attempt: 0,
        lock_delay_ms: 0,
    });
    let Ok(Outcome::Acquire(AcquireOutcome::Granted { token })) = grant.outcome else {
        panic!()
    };
    let wrong = table.apply(&Command::Release {
        session: a,
        lock: "x".into(),
        token: Token(token.0 + 5),
    });
    assert!(wrong
        .outcome
        .unwrap_err()
        .to_string()
        .starts_with("stale token"));
    let other = table.apply(&Command::Release {
        session: b,
        lock: "x".into(),
        token,
    });
    assert!(other
        .outcome
        .unwrap_err()
        .to_string()
        .starts_with("not holder"));
    let busy = table.apply(&Command::Acquire {
        session: b,
        lock: "x".into(),
        wait: false,
        attempt: 0,
        lock_delay_ms: 0,
    });
    assert!(
        matches!(busy.outcome, Err(LockError::Busy { holder_token, .. }) if holder_token == token)
    );
    let long = "n".repeat(10 * 1024 * 1024);
    let too_long = table.apply(&Command::Acquire {
        session: b,
        lock: long,
        wait: false,
        attempt: 0,
        lock_delay_ms: 0,
    });
    assert!(matches!(
        too_long.outcome,
        Err(LockError::InvalidName { .. })
    ));
    for ttl_ms in [0, 10 * 365 * 24 * 3600 * 1000] {
        let bad = table.apply(&Command::OpenSession {
            ttl_ms,
            secret: secret_of(0),
            owner: None,
        });
        assert!(matches!(bad.outcome, Err(LockError::TtlOutOfRange { .. })));
    }
}

#[test]
fn a_queued_session_asking_not_to_wait_hears_busy() {
    let mut table = LockTable::new();
    let (a, b) = (open_session(&mut table), open_session(&mut table));
    let acquire = |session, wait| Command::Acquire {
        session,
        lock: "x".into(),
        wait,
        attempt: 0,
        lock_delay_ms: 0,
    };
    assert!(table.apply(&acquire(a, false)).outcome.is_ok());
    assert!(matches!(
        table.apply(&acquire(b, true)).outcome,
        Ok(Outcome::Acquire(AcquireOutcome::Queued { position: 1 }))
    ));
    assert!(matches!(
        table.apply(&acquire(b, false)).outcome,
        Err(LockError::Busy { .. })
    ));
    // ...and keeps its place.
    assert_eq!(table.lock("x").unwrap().waiters, vec![b]);
}

#[test]
fn abandon_gives_back_only_what_no_later_attempt_asked_for() {
    let mut table = LockTable::new();
    let (a, b) = (open_session(&mut table), open_session(&mut table));
    let acquire = |session, attempt| Command::Acquire {
        session,
        lock: "x".into(),
        wait: true,
        attempt,
        lock_delay_ms: 0,
    };
    let abandon = |session, attempt| Command::Abandon {
        session,
        lock: "x".into(),
        attempt,
    };
    table.apply(&acquire(a, 1));
    table.apply(&acquire(b, 7));
    // A retry (attempt 8) came after attempt 7: abandoning 7 changes nothing.
    table.apply(&acquire(b, 8));
    let stale = table.apply(&abandon(b, 7));
    assert_eq!(stale.outcome, Ok(Outcome::Abandoned { released: None }));
    assert!(stale.events.is_empty());
    assert_eq!(table.lock("x").unwrap().waiters, vec![b]);
    // Attempt 1 got its grant; nobody asked since: abandoning releases it,
    // and the lock passes to the next waiter.
    let token = table.lock("x").unwrap().token;
    let given_back = table.apply(&abandon(a, 1));
    assert_eq!(
        given_back.outcome,
        Ok(Outcome::Abandoned {
            released: Some(token)
        })
    );
    assert_eq!(table.lock("x").unwrap().holder, b);
    // Attempt 0 means "no id": never abandoned.
    table.apply(&acquire(a, 0));
    let anonymous = table.apply(&abandon(a, 0));
    assert!(anonymous.events.is_empty());
    assert_eq!(table.lock("x").unwrap().waiters, vec![a]);
}

#[test]
fn the_audit_trail_tells_who_held_a_lock_and_how_it_ended() {
    use deadbolt_core::AuditKind;
    let mut table = LockTable::new();
    let open = |table: &mut LockTable| match table
        .apply(&Command::OpenSession {
            ttl_ms: 1000,
            secret: secret_of(0),
            owner: None,
        })
        .outcome
    {
        Ok(Outcome::SessionOpened { session, .. }) => session,
        other => panic!("{other:?}"),
    };
    let (a, b) = (open(&mut table), open(&mut table));
    let acquire = |session| Command::Acquire {
        session,
        lock: "report".into(),
        wait: true,
        attempt: 0,
        lock_delay_ms: 0,
    };
    table.apply_at(&acquire(a), 1_000).outcome.unwrap();
    table.apply_at(&acquire(b), 2_000).outcome.unwrap();
    table
        .apply_at(
            &Command::ExpireSession {
                session: a,
                term: 1,
            },
            3_000,
        )
        .outcome
        .unwrap();
    table
        .apply_at(&Command::CloseSession { session: b }, 4_000)
        .outcome
        .unwrap();
    let trail: Vec<(SessionId, u64, AuditKind, u64)> = table
        .history("report")
        .into_iter()
        .map(|r| (r.session, r.token.0, r.what, r.at_ms))
        .collect();
    assert_eq!(
        trail,
        [
            (a, 1, AuditKind::Granted, 1_000),
            (a, 1, AuditKind::Expired, 3_000),
            (b, 2, AuditKind::Granted, 3_000),
            (b, 2, AuditKind::Closed, 4_000),
        ]
    );
    let seqs: Vec<u64> = table.history("report").iter().map(|r| r.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] <= w[1]), "{seqs:?}");
    assert!(table.history("other").is_empty());
}
