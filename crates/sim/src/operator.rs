//! An operator who changes the table's limits (`SetLimits`) now and then
//! while the faults run, and the check that the cluster ends with the
//! limits of a change it made.
//!
//! The limits are enforced inside the replicated state machine, so they
//! travel through the log like any write: leader changes, crashes, restarts
//! from snapshots and lost answers must all leave the cluster with one of
//! the operator's changes, never a mix or a lost acknowledged one. The
//! values always leave the clients room (at least 1,000 sessions, 100
//! waiters per lock), so they change no client's history; one change in
//! five is out of range and must be refused.

use crate::workload::{Failure, Router};
use deadbolt_checker::checker::Violation;
use deadbolt_proto::v1::{SetLimitsRequest, TableLimits};
use deadbolt_proto::ErrorKind;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Mixed into the seed for the operator's random stream.
const OPERATOR_STREAM: u64 = 0x0be2_a70e_0be2_a70e;

/// One change the operator asked for, and what it heard back.
#[derive(Debug)]
pub struct Attempt {
    pub request: SetLimitsRequest,
    pub answer: Answer,
}

impl std::fmt::Display for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let asked = requested(&self.request);
        write!(f, "set limits {asked:?}: ")?;
        match &self.answer {
            Answer::Set(limits) => write!(f, "now {:?}", fields(limits)),
            Answer::Refused(kind) => write!(f, "refused ({})", kind.as_str()),
            Answer::Unknown => write!(f, "unknown outcome"),
        }
    }
}

#[derive(Debug)]
pub enum Answer {
    /// Acknowledged: the limits in force right after it.
    Set(TableLimits),
    /// Certainly not applied.
    Refused(ErrorKind),
    /// May have been applied.
    Unknown,
}

/// What the operator tried so far; a change in flight counts as unknown.
pub type Attempts = Arc<Mutex<Vec<Attempt>>>;

/// Changes the limits every 1–4 s until `stop`.
pub fn spawn(
    router: &Router,
    seed: u64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> (tokio::task::JoinHandle<()>, Attempts) {
    let mut router = router.as_identity("operator");
    let mut rng = StdRng::seed_from_u64(seed ^ OPERATOR_STREAM);
    let attempts = Attempts::default();
    let record = attempts.clone();
    let task = tokio::spawn(async move {
        loop {
            let pause = Duration::from_millis(rng.gen_range(1_000..4_000));
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => return,
            }
            let request = draw(&mut rng);
            let index = {
                let mut attempts = record.lock().expect("attempts lock");
                attempts.push(Attempt {
                    request,
                    answer: Answer::Unknown,
                });
                attempts.len() - 1
            };
            let answer = router
                .send(|api, credentials| async move { api.set_limits(&credentials, request).await })
                .await;
            let answer = match answer {
                Ok(response) => Answer::Set(response.limits.expect("limits in the answer")),
                Err(Failure::Refused(err)) => Answer::Refused(err.kind),
                Err(Failure::Unknown(_)) => Answer::Unknown,
            };
            record.lock().expect("attempts lock")[index].answer = answer;
        }
    });
    (task, attempts)
}

fn draw(rng: &mut StdRng) -> SetLimitsRequest {
    let some = |rng: &mut StdRng, range: std::ops::RangeInclusive<u64>| {
        rng.gen_bool(0.6).then(|| rng.gen_range(range))
    };
    let mut request = SetLimitsRequest {
        max_sessions: some(rng, 1_000..=2_000_000),
        max_locks: some(rng, 100..=5_000_000),
        max_waiters_per_lock: some(rng, 100..=100_000),
        max_keys: some(rng, 100..=1_000_000),
        max_store_bytes: some(rng, 1 << 20..=1 << 30),
    };
    if request == SetLimitsRequest::default() {
        request.max_sessions = Some(1_000);
    }
    if rng.gen_bool(0.2) {
        // Below the floor: refused whole, whatever else it sets.
        request.max_sessions = Some(rng.gen_range(0..10));
    }
    request
}

fn in_range(request: &SetLimitsRequest) -> bool {
    request.max_sessions.is_none_or(|n| n >= 10)
}

/// The five limits as numbers, in one order.
fn fields(limits: &TableLimits) -> [u64; 5] {
    [
        limits.max_sessions,
        limits.max_locks,
        limits.max_waiters_per_lock,
        limits.max_keys,
        limits.max_store_bytes,
    ]
}

fn requested(request: &SetLimitsRequest) -> [Option<u64>; 5] {
    [
        request.max_sessions,
        request.max_locks,
        request.max_waiters_per_lock,
        request.max_keys,
        request.max_store_bytes,
    ]
}

/// Checks the attempts against the limits the healed cluster reports
/// (`initial`: those before the first attempt), limit by limit. Every
/// out-of-range change was refused; an acknowledged change reports its own
/// values, and for the limits it does not set, values they could have had;
/// and each final limit is the last acknowledged value or that of a change
/// whose outcome is unknown (such a change may still be applied later: it
/// can wait in an old leader's queue).
pub fn check(attempts: &[Attempt], initial: &TableLimits, last: &TableLimits) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut violation = |what: String| {
        violations.push(Violation {
            what,
            records: Vec::new(),
        })
    };
    let mut possible: [Vec<u64>; 5] = fields(initial).map(|value| vec![value]);
    let mut unknown: [Vec<u64>; 5] = Default::default();
    for attempt in attempts {
        let asked = requested(&attempt.request);
        match (&attempt.answer, in_range(&attempt.request)) {
            (Answer::Set(_), false) => violation(format!(
                "an out-of-range limits change was acknowledged: {:?}",
                attempt.request
            )),
            (Answer::Refused(kind), false) => {
                if !matches!(
                    kind,
                    ErrorKind::InvalidArgument | ErrorKind::NotLeader | ErrorKind::Unavailable
                ) {
                    violation(format!(
                        "an out-of-range limits change was refused as {kind:?}"
                    ));
                }
            }
            (Answer::Set(set), true) => {
                let set = fields(set);
                for field in 0..5 {
                    let ok = match asked[field] {
                        Some(value) => set[field] == value,
                        None => possible[field].contains(&set[field]),
                    };
                    if !ok {
                        violation(format!(
                            "limits change {:?} acknowledged {set:?}, which no earlier change                              leads to",
                            attempt.request
                        ));
                    }
                    possible[field] = vec![set[field]];
                    possible[field].extend(&unknown[field]);
                }
            }
            (Answer::Refused(_), true) => {}
            (Answer::Unknown, in_range) => {
                if in_range {
                    for field in 0..5 {
                        if let Some(value) = asked[field] {
                            unknown[field].push(value);
                            possible[field].push(value);
                        }
                    }
                }
            }
        }
    }
    let last = fields(last);
    for field in 0..5 {
        if !possible[field].contains(&last[field]) {
            violation(format!(
                "the healed cluster's limits {last:?} are not what the operator's changes lead                  to (limit {field} could be {:?})",
                possible[field]
            ));
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    const INITIAL: TableLimits = TableLimits {
        max_sessions: 100_000,
        max_locks: 1_000_000,
        max_waiters_per_lock: 10_000,
        max_keys: 100_000,
        max_store_bytes: 1 << 26,
    };

    fn sessions(n: u64, answer: Answer) -> Attempt {
        Attempt {
            request: SetLimitsRequest {
                max_sessions: Some(n),
                ..SetLimitsRequest::default()
            },
            answer,
        }
    }

    fn with_sessions(n: u64) -> TableLimits {
        TableLimits {
            max_sessions: n,
            ..INITIAL
        }
    }

    #[test]
    fn the_final_limits_must_follow_from_the_changes() {
        let acked = [
            sessions(2_000, Answer::Set(with_sessions(2_000))),
            sessions(3_000, Answer::Unknown),
        ];
        assert!(check(&acked, &INITIAL, &with_sessions(2_000)).is_empty());
        assert!(check(&acked, &INITIAL, &with_sessions(3_000)).is_empty());
        // An acknowledged change lost, or a value nobody asked for.
        assert_eq!(check(&acked, &INITIAL, &INITIAL).len(), 1);
        assert_eq!(check(&acked, &INITIAL, &with_sessions(4_000)).len(), 1);
        // Refused changes are not applied.
        let refused = [sessions(2_000, Answer::Refused(ErrorKind::NotLeader))];
        assert_eq!(check(&refused, &INITIAL, &with_sessions(2_000)).len(), 1);
        // An out-of-range change must never be acknowledged.
        let low = [sessions(5, Answer::Set(with_sessions(5)))];
        assert!(!check(&low, &INITIAL, &with_sessions(5)).is_empty());
        // An acknowledgement must report the values asked for.
        let wrong = [sessions(2_000, Answer::Set(with_sessions(2_001)))];
        assert!(!check(&wrong, &INITIAL, &with_sessions(2_001)).is_empty());
    }
}
