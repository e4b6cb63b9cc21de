//! One targeted test per bug the simulation found (docs/safety.md, "What
//! the simulation found"), named after the seed that found it, so the bug
//! stays found even after the simulation's schedules change and the seed
//! replays something else.

use deadbolt_core::{
    AcquireOutcome, Command, LockError, LockTable, Outcome, SecretHash, SessionId, Token,
};

fn open(table: &mut LockTable, ttl_ms: u64) -> SessionId {
    match table
        .apply(&Command::OpenSession {
            ttl_ms,
            secret: SecretHash([7; 32]),
            owner: None,
        })
        .outcome
    {
        Ok(Outcome::SessionOpened { session, .. }) => session,
        other => panic!("open: {other:?}"),
    }
}

fn acquire(table: &mut LockTable, session: SessionId, attempt: u64) -> AcquireOutcome {
    let command = Command::Acquire {
        session,
        lock: "job".into(),
        wait: true,
        attempt,
        lock_delay_ms: 0,
    };
    match table.apply(&command).outcome {
        Ok(Outcome::Acquire(outcome)) => outcome,
        other => panic!("acquire: {other:?}"),
    }
}

/// Seed 100605: a lease checkpoint decided by a leader in one term reached
/// the log in a later term, after the lease had been renewed, and the next
/// leader started the session with too little time left. A timer command
/// now counts only in the term that decided it.
#[test]
fn seed_100605_a_checkpoint_committed_in_a_later_term_changes_no_lease() {
    let mut table = LockTable::new();
    let session = open(&mut table, 10_000);
    let before: Vec<_> = table.sessions().collect();
    let stale = Command::CheckpointLease {
        session,
        remaining_ms: 350,
        renewals: 0,
        term: 3,
    };
    let applied = table.apply_in_term(&stale, 0, 4);
    assert_eq!(
        applied.outcome,
        Err(LockError::Superseded {
            decided: 3,
            committed: 4
        })
    );
    assert_eq!(table.sessions().collect::<Vec<_>>(), before);
    // The same checkpoint in its own term does count.
    table.apply_in_term(&stale, 0, 3).outcome.unwrap();
    assert_ne!(table.sessions().collect::<Vec<_>>(), before);
}

/// Seed 400056: a new leader gave up a restored wait with `Abandon` and the
/// wait's attempt id, which also releases a grant; a client whose retry had
/// meanwhile been granted lost its lock. Giving up a queue place is
/// `CancelWait`, which leaves a grant that already happened standing.
#[test]
fn seed_400056_giving_up_a_queue_place_never_takes_back_a_grant() {
    let mut table = LockTable::new();
    let (holder, waiter) = (open(&mut table, 10_000), open(&mut table, 10_000));
    assert!(matches!(
        acquire(&mut table, holder, 1),
        AcquireOutcome::Granted { .. }
    ));
    assert!(matches!(
        acquire(&mut table, waiter, 7),
        AcquireOutcome::Queued { .. }
    ));
    table
        .apply(&Command::CloseSession { session: holder })
        .outcome
        .unwrap();
    let granted: Token = table.lock("job").expect("handed on").token;
    assert_eq!(table.lock("job").unwrap().holder, waiter);

    let given_up = table.apply(&Command::CancelWait {
        session: waiter,
        lock: "job".into(),
    });
    assert_eq!(
        given_up.outcome,
        Ok(Outcome::WaitCancelled {
            granted: Some(granted)
        })
    );
    let lock = table.lock("job").expect("still held");
    assert_eq!((lock.holder, lock.token), (waiter, granted));
}
