//! Property tests of the leader's lease bookkeeping: a lease never ends
//! earlier than its TTL after the last acknowledged keepalive, not even
//! across leader changes that restart leases from checkpoints in the log, and
//! every lease that did run out is reported (once).

use deadbolt_core::{
    Command, LeaseTracker, LockTable, Outcome, RenewError, SecretHash, SessionId, SessionLease,
};
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
enum Step {
    Track(u64, u64),
    Renew(u64),
    Advance(u64),
    TakeExpired,
    Untrack(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (0..6u64, 1..50u64).prop_map(|(s, ttl)| Step::Track(s, ttl)),
        4 => (0..6u64).prop_map(Step::Renew),
        4 => (0..30u64).prop_map(Step::Advance),
        3 => Just(Step::TakeExpired),
        1 => (0..6u64).prop_map(Step::Untrack),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn leases_never_end_early_and_always_end(steps in prop::collection::vec(step(), 1..200)) {
        let start = Instant::now();
        let mut now = start;
        let mut leases = LeaseTracker::new();
        // Per tracked session: TTL, last acknowledged renewal, expired yet.
        let mut model: HashMap<u64, (Duration, Instant, bool)> = HashMap::new();
        for step in steps {
            match step {
                Step::Track(s, ttl) => {
                    let ttl = Duration::from_millis(ttl);
                    leases.track(SessionId(s), SessionLease::fresh(ttl), now);
                    model.insert(s, (ttl, now, false));
                }
                Step::Renew(s) => match (leases.renew(SessionId(s), now), model.get_mut(&s)) {
                    (Ok(ttl), Some((model_ttl, last_ack, false))) => {
                        prop_assert_eq!(ttl, *model_ttl);
                        *last_ack = now;
                    }
                    (Err(RenewError::Expiring), Some((_, _, true))) => {}
                    (Err(RenewError::Unknown), None) => {}
                    (result, state) => prop_assert!(false, "renew {:?} with {:?}", result, state),
                },
                Step::Advance(ms) => now += Duration::from_millis(ms),
                Step::TakeExpired => {
                    for SessionId(s) in leases.take_expired(now) {
                        let (ttl, last_ack, expired) = model.get_mut(&s).expect("tracked");
                        prop_assert!(!*expired, "session {} expired twice", s);
                        prop_assert!(now > *last_ack + *ttl, "session {} expired early", s);
                        *expired = true;
                    }
                    for (s, (ttl, last_ack, expired)) in &model {
                        prop_assert!(*expired || now <= *last_ack + *ttl, "session {} overdue", s);
                    }
                }
                Step::Untrack(s) => {
                    leases.untrack(SessionId(s));
                    model.remove(&s);
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
enum ClusterStep {
    /// A keepalive; a checkpointed session's goes through the log first,
    /// and that commit may fail (the keepalive is then not acknowledged).
    Renew {
        session: usize,
        commit_ok: bool,
    },
    Advance(u64),
    /// The leader takes due checkpoints and proposes them; they commit later.
    TakeCheckpoints,
    /// The oldest proposed checkpoint commits (proposals may be reordered
    /// against renewals, never against each other).
    CommitCheckpoint,
    /// A new leader starts every lease from the log. Of the old leader's
    /// proposals still in flight, those picked by the bit mask commit
    /// before the new leader's first entry, the rest never do (Raft: an
    /// old term's entry commits only as part of a prefix of the new log).
    ChangeLeader {
        commits: u8,
    },
    TakeExpired,
}

fn cluster_step() -> impl Strategy<Value = ClusterStep> {
    prop_oneof![
        4 => (0..4usize, prop::bool::weighted(0.8))
            .prop_map(|(session, commit_ok)| ClusterStep::Renew { session, commit_ok }),
        4 => (0..1500u64).prop_map(ClusterStep::Advance),
        2 => Just(ClusterStep::TakeCheckpoints),
        2 => Just(ClusterStep::CommitCheckpoint),
        1 => any::<u8>().prop_map(|commits| ClusterStep::ChangeLeader { commits }),
        3 => Just(ClusterStep::TakeExpired),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn checkpoints_never_shorten_an_acknowledged_lease(
        ttls in prop::collection::vec(500..3000u64, 4),
        steps in prop::collection::vec(cluster_step(), 1..150),
    ) {
        let mut now = Instant::now();
        let mut table = LockTable::new();
        let mut leader = LeaseTracker::new();
        // Per session: id, TTL, when the client was last told its lease runs
        // (open or acknowledged keepalive), and whether it has expired.
        let mut clients = Vec::new();
        for ttl_ms in ttls {
            let Ok(Outcome::SessionOpened { session, .. }) =
                table.apply(&Command::OpenSession { ttl_ms, secret: SecretHash([0; 32]), owner: None }).outcome
            else {
                panic!("open refused")
            };
            let ttl = Duration::from_millis(ttl_ms);
            leader.track(session, SessionLease::fresh(ttl), now);
            clients.push((session, ttl, now, false));
        }
        // Checkpoints proposed and not yet committed, each with the term that
        // decided it; one may still be waiting when the leadership changes.
        let mut proposed = std::collections::VecDeque::new();
        let mut term = 1;
        for step in steps {
            match step {
                ClusterStep::Renew { session, commit_ok } => {
                    let (id, _, last_ack, expired) = &mut clients[session];
                    let renewed = match leader.renew(*id, now) {
                        Err(RenewError::Checkpointed) if commit_ok => {
                            let applied = table.apply(&Command::LeaseRenewed { session: *id });
                            prop_assert!(applied.outcome.is_ok());
                            leader.renewed_through_log(*id, now)
                        }
                        other => other,
                    };
                    match renewed {
                        Ok(_) => {
                            prop_assert!(!*expired, "renewed an expired session");
                            *last_ack = now;
                        }
                        Err(RenewError::Checkpointed) => prop_assert!(!commit_ok),
                        Err(_) => prop_assert!(*expired || !table.has_session(*id)),
                    }
                }
                ClusterStep::Advance(ms) => now += Duration::from_millis(ms),
                ClusterStep::TakeCheckpoints => {
                    for due in leader.take_due_checkpoints(now) {
                        proposed.push_back(Command::CheckpointLease {
                            session: due.session,
                            remaining_ms: due.remaining.as_millis() as u64,
                            renewals: due.renewals,
                            term,
                        });
                    }
                }
                ClusterStep::CommitCheckpoint => {
                    if let Some(checkpoint) = proposed.pop_front() {
                        // Ends in an error for a session already gone, or a
                        // checkpoint decided in an earlier term.
                        let _ = table.apply_in_term(&checkpoint, 0, term);
                    }
                }
                ClusterStep::ChangeLeader { commits } => {
                    // Each pending checkpoint commits in the old term, is
                    // lost, or is still queued and reaches the log in a later
                    // term (the old leader's proposer held it, and the node
                    // leads again).
                    let pending: Vec<Command> = proposed.drain(..).collect();
                    for (i, checkpoint) in pending.into_iter().enumerate() {
                        match (commits >> (2 * (i % 4))) & 3 {
                            0 | 1 => {
                                let _ = table.apply_in_term(&checkpoint, 0, term);
                            }
                            2 => proposed.push_back(checkpoint),
                            _ => {}
                        }
                    }
                    term += 1;
                    leader = LeaseTracker::new();
                    for (session, lease) in table.sessions() {
                        leader.track(session, lease, now);
                    }
                }
                ClusterStep::TakeExpired => {
                    for session in leader.take_expired(now) {
                        let client = clients
                            .iter_mut()
                            .find(|c| c.0 == session)
                            .expect("known session");
                        prop_assert!(
                            now > client.2 + client.1,
                            "session {:?} expired {:?} after its last acknowledgement, TTL {:?}",
                            session, now - client.2, client.1
                        );
                        client.3 = true;
                        let expiry = Command::ExpireSession { session, term };
                        let applied = table.apply_in_term(&expiry, 0, term);
                        prop_assert!(applied.outcome.is_ok());
                    }
                }
            }
        }
    }
}
