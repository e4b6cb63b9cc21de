//! The configurable limits ([`TableLimits`], set by `Command::SetLimits`):
//! the table enforces the last ones set, a change out of range is refused
//! whole, lowering a limit takes nothing away, snapshots carry them, and a
//! table encoded before they existed ([`LockTableV9`]) still decodes.

use deadbolt_core::{
    AcquireOutcome, Command, LimitsChange, LockError, LockTable, LockTableV9, Outcome, SecretHash,
    SessionId, TableLimits, Token,
};
use proptest::prelude::*;

fn open(table: &mut LockTable) -> Result<SessionId, LockError> {
    let command = Command::OpenSession {
        ttl_ms: 10_000,
        secret: SecretHash([7; 32]),
        owner: None,
    };
    table.apply(&command).outcome.map(|outcome| match outcome {
        Outcome::SessionOpened { session, .. } => session,
        other => panic!("open answered {other:?}"),
    })
}

fn grant(table: &mut LockTable, session: SessionId, lock: &str) -> Result<Token, LockError> {
    let command = Command::Acquire {
        session,
        lock: lock.into(),
        wait: false,
        attempt: 0,
        lock_delay_ms: 0,
    };
    table.apply(&command).outcome.map(|outcome| match outcome {
        Outcome::Acquire(AcquireOutcome::Granted { token }) => token,
        other => panic!("acquire answered {other:?}"),
    })
}

fn set(table: &mut LockTable, change: LimitsChange) -> Result<TableLimits, LockError> {
    table
        .apply(&Command::SetLimits(change))
        .outcome
        .map(|outcome| match outcome {
            Outcome::LimitsSet(limits) => limits,
            other => panic!("set limits answered {other:?}"),
        })
}

fn sessions(n: u64) -> LimitsChange {
    LimitsChange {
        max_sessions: Some(n),
        ..LimitsChange::default()
    }
}

proptest! {
    /// Whatever sequence of limit changes and opens: an open succeeds
    /// exactly when fewer sessions are live than the last accepted limit,
    /// and a JSON round trip (as a snapshot) keeps the limits.
    #[test]
    fn opens_are_refused_exactly_at_the_last_limit_set(
        steps in prop::collection::vec(prop_oneof![
            3 => Just(None),
            1 => (0..40u64).prop_map(Some),
        ], 1..150),
    ) {
        let mut table = LockTable::new();
        let mut limit = TableLimits::DEFAULT.max_sessions;
        let mut live = 0;
        for step in steps {
            match step {
                Some(n) => match set(&mut table, sessions(n)) {
                    Ok(limits) => {
                        prop_assert!(n >= TableLimits::FLOOR.max_sessions as u64);
                        limit = n as usize;
                        prop_assert_eq!(limits.max_sessions, limit);
                    }
                    Err(err) => {
                        prop_assert!(n < TableLimits::FLOOR.max_sessions as u64);
                        assert!(matches!(err, LockError::LimitOutOfRange { .. }), "{err}");
                    }
                },
                None => match open(&mut table) {
                    Ok(_) => {
                        prop_assert!(live < limit);
                        live += 1;
                    }
                    Err(LockError::TooManySessions { limit: refused_at }) => {
                        prop_assert_eq!(refused_at, limit);
                        prop_assert!(live >= limit);
                    }
                    Err(other) => panic!("open refused: {other}"),
                },
            }
            table.check_invariants();
            prop_assert_eq!(table.session_count(), live);
        }
        let json = serde_json::to_vec(&table).unwrap();
        let restored: LockTable = serde_json::from_slice(&json).unwrap();
        prop_assert_eq!(restored.table_limits().max_sessions, limit);
        prop_assert_eq!(restored, table);
    }
}

#[test]
fn a_change_out_of_range_is_refused_whole_and_names_the_range() {
    let mut table = LockTable::new();
    let change = LimitsChange {
        max_locks: Some(20),
        max_sessions: Some(3_000_000),
        ..LimitsChange::default()
    };
    let err = set(&mut table, change).unwrap_err();
    assert_eq!(
        err.to_string(),
        "max_sessions 3000000 is out of range: must be between 10 and 2000000"
    );
    assert_eq!(
        table.table_limits(),
        TableLimits::DEFAULT,
        "max_locks moved"
    );
    let err = set(
        &mut table,
        LimitsChange {
            max_store_bytes: Some(0),
            ..LimitsChange::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().starts_with("max_store_bytes 0"), "{err}");
    // Setting nothing changes nothing, and says what is in force.
    assert_eq!(
        set(&mut table, LimitsChange::default()),
        Ok(TableLimits::DEFAULT)
    );
    // Floors and ceilings themselves are accepted.
    for bound in [TableLimits::FLOOR, TableLimits::CEILING] {
        let every = LimitsChange {
            max_sessions: Some(bound.max_sessions as u64),
            max_locks: Some(bound.max_locks as u64),
            max_waiters_per_lock: Some(bound.max_waiters_per_lock as u64),
            max_keys: Some(bound.max_keys as u64),
            max_store_bytes: Some(bound.max_store_bytes as u64),
        };
        assert_eq!(set(&mut table, every), Ok(bound));
    }
}

#[test]
fn lowering_a_limit_keeps_what_is_there_and_refuses_more() {
    let mut table = LockTable::new();
    let held: Vec<SessionId> = (0..12).map(|_| open(&mut table).unwrap()).collect();
    for (i, session) in held.iter().enumerate() {
        grant(&mut table, *session, &format!("lock-{i}")).unwrap();
    }
    let lowered = LimitsChange {
        max_sessions: Some(10),
        max_locks: Some(10),
        ..LimitsChange::default()
    };
    set(&mut table, lowered).unwrap();
    table.check_invariants();
    assert_eq!(table.session_count(), 12);
    assert_eq!(table.lock_count(), 12);
    assert_eq!(
        open(&mut table),
        Err(LockError::TooManySessions { limit: 10 })
    );
    assert_eq!(
        grant(&mut table, held[0], "one-more"),
        Err(LockError::TooManyLocks { limit: 10 })
    );
    // Once enough have gone, new ones come in up to the new limit.
    for session in &held[..3] {
        let closed = table.apply(&Command::CloseSession { session: *session });
        assert!(closed.outcome.is_ok());
    }
    let again = open(&mut table).unwrap();
    assert_eq!(
        open(&mut table),
        Err(LockError::TooManySessions { limit: 10 })
    );
    grant(&mut table, again, "one-more").unwrap();
    table.check_invariants();
}

#[test]
fn the_store_limits_come_from_the_table() {
    let mut table = LockTable::new();
    let session = open(&mut table).unwrap();
    let token = grant(&mut table, session, "writer").unwrap();
    set(
        &mut table,
        LimitsChange {
            max_keys: Some(10),
            ..LimitsChange::default()
        },
    )
    .unwrap();
    let put = |key: String| Command::StorePut {
        key,
        value: "v".into(),
        token,
        lock: None,
    };
    for i in 0..10 {
        assert!(table.apply(&put(format!("k{i}"))).outcome.is_ok());
    }
    assert_eq!(
        table.apply(&put("k10".into())).outcome,
        Err(LockError::TooManyKeys { limit: 10 })
    );
    // Existing keys can still be written.
    assert!(table.apply(&put("k3".into())).outcome.is_ok());
}

/// The encoding before the table held its limits is this one minus the
/// limits at the end (bincode writes a struct as its fields in order, five
/// `usize`s as eight bytes each): it decodes as `LockTableV9`, and becomes
/// the same table with the default limits.
#[test]
fn a_table_encoded_before_it_held_limits_decodes_as_lock_table_v9() {
    let mut table = LockTable::new();
    let session = open(&mut table).unwrap();
    grant(&mut table, session, "kept").unwrap();
    table.raise_token_floor(5_000);
    let bytes = bincode::serialize(&table).unwrap();
    let before_limits = &bytes[..bytes.len() - 5 * 8];
    assert!(bincode::deserialize::<LockTable>(before_limits).is_err());
    let old: LockTableV9 = bincode::deserialize(before_limits).unwrap();
    let upgraded = LockTable::from(old);
    upgraded.check_invariants();
    assert_eq!(upgraded, table);
    assert_eq!(upgraded.table_limits(), TableLimits::DEFAULT);
}
