//! The checker: reads a history and reports every violation with the
//! operations involved. Pure: the same history always gives the same report.
//!
//! Checked:
//! - **token uniqueness**: no token is granted to two different (client,
//!   lock) pairs (the same client may be told its own grant twice: acquire is
//!   idempotent);
//! - **token order**: of two grants of one lock, one acknowledged before the
//!   other was invoked has the smaller token. (Across locks this need not
//!   hold: a retried acquire may learn late of a grant made earlier.)
//! - **resource fence**: the resource accepted each lock's writes with
//!   non-decreasing tokens;
//! - **lost or phantom updates**: each counter's final value is at least the
//!   number of acknowledged increments and at most that plus the increments
//!   whose outcome is unknown;
//! - **liveness**: once the faults stopped, every lock saw a complete round
//!   (grant and both increments acknowledged) within the bound;
//! - **the service's own timeline** (its audit trail, read at the end): no
//!   grant of a lock while an earlier grant of it had not ended (of a
//!   semaphore: no more grants at once than it has permits, and no two
//!   live ones on the slot their clients were told of; of a
//!   read/write lock: shared grants only beside shared ones), grant tokens
//!   growing, and every grant a client was told of present in it (none lost
//!   to a crash or a leader change).

use crate::history::{Accepted, Op, Phase, Record};
use deadbolt_proto::v1::AuditEntry;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// The end state read after the run.
pub struct Finals {
    /// Fenced-store counter of each lock.
    pub store: BTreeMap<String, u64>,
    /// Resource counter of each lock.
    pub resource: BTreeMap<String, u64>,
    /// The service's audit trail of each lock (the newest records).
    pub audit: BTreeMap<String, Vec<AuditEntry>>,
    /// The names among them that are semaphores, with their permits: their
    /// trails may show that many grants at once (of one permit each).
    pub semaphores: BTreeMap<String, u32>,
}

/// The largest token every JSON reader keeps exact (JavaScript's
/// `Number.MAX_SAFE_INTEGER`).
const JSON_SAFE_TOKEN: u64 = (1 << 53) - 1;

#[derive(Debug)]
pub struct Violation {
    pub what: String,
    pub records: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "VIOLATION: {}", self.what)?;
        for record in &self.records {
            writeln!(f, "    {record}")?;
        }
        Ok(())
    }
}

/// One completed operation: its invocation and completion.
#[derive(Debug, Clone)]
struct Completed {
    invoked: u64,
    done: Record,
}

/// Pairs each completion with its client's latest invocation of that op.
/// An invocation that never completed (its client was stopped at the end)
/// counts as completed with an unknown outcome.
fn completed(history: &[Record]) -> Vec<Completed> {
    let mut open: HashMap<(usize, Op), &Record> = HashMap::new();
    let mut done = Vec::new();
    for record in history {
        match record.phase {
            Phase::Invoke => {
                open.insert((record.client, record.op), record);
            }
            _ => {
                let invoked = open
                    .remove(&(record.client, record.op))
                    .map_or(record.at, |invoke| invoke.at);
                done.push(Completed {
                    invoked,
                    done: record.clone(),
                });
            }
        }
    }
    for invoke in open.into_values() {
        done.push(Completed {
            invoked: invoke.at,
            done: Record {
                phase: Phase::Info,
                error: Some("never completed".into()),
                ..invoke.clone()
            },
        });
    }
    done
}

fn show(record: &Record) -> String {
    serde_json::to_string(record).expect("serializable")
}

/// Over what a token must be unique.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenScope {
    /// Every grant of every lock (Deadbolt's one counter; etcd's revision;
    /// PostgreSQL's sequence).
    Global,
    /// Each lock's grants (Redis's counter, one per lock).
    PerLock,
}

pub fn check(
    history: &[Record],
    accepted: &[Accepted],
    finals: &Finals,
    healed_at: u64,
    liveness_bound_ns: u64,
) -> Vec<Violation> {
    check_scoped(
        history,
        accepted,
        finals,
        healed_at,
        liveness_bound_ns,
        TokenScope::Global,
    )
}

/// [`check`], with tokens unique over `scope`.
pub fn check_scoped(
    history: &[Record],
    accepted: &[Accepted],
    finals: &Finals,
    healed_at: u64,
    liveness_bound_ns: u64,
    scope: TokenScope,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    let done = completed(history);
    let grants: Vec<&Completed> = done
        .iter()
        .filter(|c| c.done.op == Op::Acquire && c.done.phase == Phase::Ok)
        .collect();

    // Token uniqueness. (A grant without a token comes from a lock service
    // that issues none, Redlock or plain Redis: nothing to check.)
    let mut owners: HashMap<(u64, &str), &Record> = HashMap::new();
    for grant in &grants {
        let Some(token) = grant.done.token else {
            continue;
        };
        let key = match scope {
            TokenScope::Global => (token, ""),
            TokenScope::PerLock => (token, grant.done.lock.as_str()),
        };
        if let Some(first) = owners.get(&key) {
            if (first.client, &first.lock) != (grant.done.client, &grant.done.lock) {
                violations.push(Violation {
                    what: format!("token {token} was granted twice"),
                    records: vec![show(first), show(&grant.done)],
                });
            }
        } else {
            owners.insert(key, &grant.done);
        }
    }

    // Tokens stay exact as JSON numbers: below 2^53 (docs/safety.md, rule
    // 1; a leader's clock raises them at most to the year 2200's floor).
    for grant in &grants {
        match grant.done.token {
            Some(token) if token > JSON_SAFE_TOKEN => violations.push(Violation {
                what: format!("token {token} is past 2^53, where JSON readers lose digits"),
                records: vec![show(&grant.done)],
            }),
            _ => {}
        }
    }

    // Token order within each lock: the largest token acknowledged before
    // each grant was invoked must be smaller than the grant's. (The same
    // client told its own grant again is not a second grant.)
    let mut by_ack: Vec<&Completed> = grants.clone();
    by_ack.sort_by_key(|c| c.done.at);
    for later in &grants {
        let Some(token) = later.done.token else {
            continue;
        };
        let earlier = by_ack
            .iter()
            .take_while(|c| c.done.at < later.invoked)
            .filter(|c| c.done.lock == later.done.lock)
            .filter(|c| !(c.done.client == later.done.client && c.done.token == Some(token)))
            .max_by_key(|c| c.done.token);
        if let Some(earlier) = earlier {
            if earlier.done.token >= Some(token) {
                violations.push(Violation {
                    what: format!(
                        "grant with token {token} was invoked after a grant with token {} was acknowledged",
                        earlier.done.token.unwrap_or(0)
                    ),
                    records: vec![show(&earlier.done), show(&later.done)],
                });
            }
        }
    }

    // A session belongs to the identity that opened it.
    for trespass in done
        .iter()
        .filter(|c| c.done.op == Op::Trespass && c.done.phase == Phase::Ok)
    {
        violations.push(Violation {
            what: format!(
                "client {} renewed session {} of another identity",
                trespass.done.client,
                trespass.done.value.unwrap_or(0)
            ),
            records: vec![show(&trespass.done)],
        });
    }

    // The resource's accepted writes, per lock, never go back in token.
    let mut last: HashMap<&str, &Accepted> = HashMap::new();
    for write in accepted {
        if let Some(previous) = last.get(write.lock.as_str()) {
            if write.token < previous.token {
                violations.push(Violation {
                    what: format!(
                        "the resource accepted token {} for {} after token {}",
                        write.token, write.lock, previous.token
                    ),
                    records: vec![
                        serde_json::to_string(previous).expect("serializable"),
                        serde_json::to_string(write).expect("serializable"),
                    ],
                });
            }
        }
        last.insert(&write.lock, write);
    }

    // Lost or phantom increments.
    for (op, finals) in [
        (Op::StoreIncrement, &finals.store),
        (Op::ResourceIncrement, &finals.resource),
    ] {
        for (lock, final_value) in finals {
            let of_lock = done
                .iter()
                .filter(|c| c.done.op == op && c.done.lock == *lock);
            let acked = of_lock
                .clone()
                .filter(|c| c.done.phase == Phase::Ok)
                .count() as u64;
            let unknown = of_lock.filter(|c| c.done.phase == Phase::Info).count() as u64;
            if *final_value < acked || *final_value > acked + unknown {
                violations.push(Violation {
                    what: format!(
                        "{op:?} counter of {lock} ends at {final_value}, but {acked} increments were acknowledged and {unknown} are unknown"
                    ),
                    records: Vec::new(),
                });
            }
        }
    }

    // The service's own timeline.
    for (lock, trail) in &finals.audit {
        // Grants not ended yet, by token; a semaphore's or a read/write
        // lock's may be several.
        let room = finals
            .semaphores
            .get(lock)
            .map_or(1, |&permits| permits as usize);
        let mut holders: BTreeMap<u64, &AuditEntry> = BTreeMap::new();
        let mut last_grant: Option<&AuditEntry> = None;
        // The slot each acknowledged permit's client was told of.
        let slots: HashMap<u64, u64> = grants
            .iter()
            .filter(|g| g.done.lock == *lock)
            .filter_map(|g| Some((g.done.token?, g.done.value?)))
            .collect();
        for entry in trail {
            match entry.what.as_str() {
                what @ ("granted" | "permits_granted" | "shared_granted") => {
                    let conflict = match what {
                        "permits_granted" => holders.len() >= room,
                        "shared_granted" => holders.values().any(|h| h.what != "shared_granted"),
                        _ => !holders.is_empty(),
                    };
                    if conflict {
                        let held: Vec<u64> = holders.keys().copied().collect();
                        violations.push(Violation {
                            what: format!(
                                "{lock} was granted with token {} while its grants with tokens {held:?} had not ended",
                                entry.token
                            ),
                            records: holders
                                .values()
                                .chain([&entry])
                                .map(|e| format!("{e:?}"))
                                .collect(),
                        });
                    }
                    let slot = slots.get(&entry.token);
                    if let Some(sharer) = holders
                        .values()
                        .find(|h| slot.is_some() && slots.get(&h.token) == slot)
                    {
                        violations.push(Violation {
                            what: format!(
                                "{lock}'s permits with tokens {} and {} held slot {} at once",
                                sharer.token,
                                entry.token,
                                slot.copied().unwrap_or_default()
                            ),
                            records: vec![format!("{sharer:?}"), format!("{entry:?}")],
                        });
                    }
                    if let Some(last) = last_grant.filter(|last| last.token >= entry.token) {
                        violations.push(Violation {
                            what: format!("{lock}'s grant tokens went back in the audit trail"),
                            records: vec![format!("{last:?}"), format!("{entry:?}")],
                        });
                    }
                    holders.insert(entry.token, entry);
                    last_grant = Some(entry);
                }
                "delayed" => {}
                _ => {
                    holders.remove(&entry.token);
                }
            }
        }
        // A grant a client was told of is never given back as "abandoned"
        // (that is for grants whose requester went away unanswered).
        let acknowledged: std::collections::HashSet<u64> = grants
            .iter()
            .filter(|g| g.done.lock == *lock)
            .filter_map(|g| g.done.token)
            .collect();
        for entry in trail.iter().filter(|e| e.what == "abandoned") {
            if acknowledged.contains(&entry.token) {
                violations.push(Violation {
                    what: format!(
                        "the service took back (abandoned) a grant of {lock} with token {} that a client was told of",
                        entry.token
                    ),
                    records: vec![format!("{entry:?}")],
                });
            }
        }
        // Acknowledged grants no older than what the trail still keeps.
        let is_grant = |e: &&AuditEntry| e.what.ends_with("granted");
        let oldest = trail.iter().find(is_grant).map(|e| e.token);
        let in_trail: std::collections::HashSet<u64> =
            trail.iter().filter(is_grant).map(|e| e.token).collect();
        for grant in grants.iter().filter(|g| g.done.lock == *lock) {
            let Some(token) = grant.done.token else {
                continue;
            };
            if oldest.is_some_and(|oldest| token >= oldest) && !in_trail.contains(&token) {
                violations.push(Violation {
                    what: format!("acknowledged grant of {lock} with token {token} is missing from the service's audit trail"),
                    records: vec![show(&grant.done)],
                });
            }
        }
    }

    // Liveness after healing.
    let deadline = healed_at + liveness_bound_ns;
    for lock in finals.store.keys() {
        let recovered = done.iter().any(|c| {
            c.done.lock == *lock
                && c.done.op == Op::StoreIncrement
                && c.done.phase == Phase::Ok
                && c.invoked >= healed_at
                && c.done.at <= deadline
        });
        if !recovered {
            violations.push(Violation {
                what: format!(
                    "no increment of {lock} completed within {}s of the faults stopping",
                    liveness_bound_ns / 1_000_000_000
                ),
                records: Vec::new(),
            });
        }
    }
    violations
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn record(at: u64, client: usize, op: Op, phase: Phase, token: Option<u64>) -> Record {
        Record {
            at,
            client,
            op,
            phase,
            lock: "l".into(),
            token,
            value: None,
            error: None,
        }
    }

    fn finals(store: u64, resource: u64) -> Finals {
        Finals {
            store: BTreeMap::from([("l".to_owned(), store)]),
            resource: BTreeMap::from([("l".to_owned(), resource)]),
            audit: BTreeMap::new(),
            semaphores: BTreeMap::new(),
        }
    }

    /// A record of session 1 (the watch checker's tests use it too).
    pub(crate) fn audit(seq: u64, token: u64, what: &str) -> AuditEntry {
        AuditEntry {
            seq,
            at_ms: 0,
            session_id: 1,
            token,
            what: what.into(),
            identity: String::new(),
        }
    }

    /// Two clients, each: grant, both increments.
    fn clean_history() -> Vec<Record> {
        let mut history = Vec::new();
        for (client, token, start) in [(0, 1, 10), (1, 2, 100)] {
            history.push(record(start, client, Op::Acquire, Phase::Invoke, None));
            history.push(record(
                start + 1,
                client,
                Op::Acquire,
                Phase::Ok,
                Some(token),
            ));
            for op in [Op::StoreIncrement, Op::ResourceIncrement] {
                history.push(record(start + 2, client, op, Phase::Invoke, Some(token)));
                history.push(record(start + 3, client, op, Phase::Ok, Some(token)));
            }
        }
        history
    }

    #[test]
    fn a_clean_history_passes() {
        let violations = check(&clean_history(), &[], &finals(2, 2), 0, 1_000);
        assert!(violations.is_empty(), "{violations:?}");
    }

    #[test]
    fn a_repeated_token_is_caught() {
        let mut history = clean_history();
        history[7].token = Some(1);
        let violations = check(&history, &[], &finals(2, 2), 0, 1_000);
        assert!(
            violations.iter().any(|v| v.what.contains("granted twice")),
            "{violations:?}"
        );
        assert!(
            violations
                .iter()
                .any(|v| v.what.contains("after a grant with token")),
            "{violations:?}"
        );
    }

    #[test]
    fn a_token_past_2_pow_53_is_caught() {
        let mut history = clean_history();
        let last_grant = history
            .iter()
            .rposition(|r| r.op == Op::Acquire && r.phase == Phase::Ok)
            .unwrap();
        history[last_grant].token = Some(1 << 53);
        let violations = check(&history, &[], &finals(2, 2), 0, 1_000);
        assert!(
            violations.iter().any(|v| v.what.contains("past 2^53")),
            "{violations:?}"
        );
    }

    #[test]
    fn a_lost_update_is_caught() {
        let violations = check(&clean_history(), &[], &finals(1, 2), 0, 1_000);
        assert!(
            violations.iter().any(|v| v.what.contains("ends at 1")),
            "{violations:?}"
        );
    }

    #[test]
    fn a_stale_accepted_write_is_caught() {
        let accepted = |token| Accepted {
            at: 0,
            lock: "l".into(),
            token,
            value: 1,
        };
        let violations = check(
            &clean_history(),
            &[accepted(2), accepted(1)],
            &finals(2, 2),
            0,
            1_000,
        );
        assert!(
            violations
                .iter()
                .any(|v| v.what.contains("accepted token 1")),
            "{violations:?}"
        );
    }

    #[test]
    fn overlapping_or_missing_grants_in_the_trail_are_caught() {
        let mut overlapping = finals(2, 2);
        overlapping.audit.insert(
            "l".into(),
            vec![
                audit(1, 1, "granted"),
                audit(2, 2, "granted"),
                audit(3, 2, "released"),
            ],
        );
        let violations = check(&clean_history(), &[], &overlapping, 0, 1_000);
        assert!(
            violations.iter().any(|v| v.what.contains("had not ended")),
            "{violations:?}"
        );
        // A semaphore of two permits may have two grants at once, not three.
        let mut semaphore = finals(2, 2);
        semaphore.semaphores.insert("l".into(), 2);
        let permits = |tokens: &[u64]| -> Vec<AuditEntry> {
            let granted = tokens.iter().map(|&t| audit(t, t, "permits_granted"));
            granted.chain([audit(9, 1, "released")]).collect()
        };
        semaphore.audit.insert("l".into(), permits(&[1, 2]));
        let violations = check(&clean_history(), &[], &semaphore, 0, 1_000);
        assert!(
            !violations.iter().any(|v| v.what.contains("had not ended")),
            "{violations:?}"
        );
        semaphore.audit.insert("l".into(), permits(&[1, 2, 3]));
        let violations = check(&clean_history(), &[], &semaphore, 0, 1_000);
        assert!(
            violations.iter().any(|v| v.what.contains("had not ended")),
            "{violations:?}"
        );
        // Its two live permits on two slots, not on one.
        semaphore.audit.insert("l".into(), permits(&[1, 2]));
        let with_slots = |slots: [u64; 2]| -> Vec<Record> {
            let mut history = clean_history();
            let acks = history
                .iter_mut()
                .filter(|r| r.op == Op::Acquire && r.phase == Phase::Ok);
            for (ack, slot) in acks.zip(slots) {
                ack.value = Some(slot);
            }
            history
        };
        let violations = check(&with_slots([0, 1]), &[], &semaphore, 0, 1_000);
        assert!(
            !violations.iter().any(|v| v.what.contains("slot")),
            "{violations:?}"
        );
        let violations = check(&with_slots([1, 1]), &[], &semaphore, 0, 1_000);
        assert!(
            violations
                .iter()
                .any(|v| v.what.contains("tokens 1 and 2 held slot 1 at once")),
            "{violations:?}"
        );
        // A read/write lock: shared grants beside shared ones, an exclusive
        // one alone, whichever came first.
        let mut rw = finals(2, 2);
        let trail = |grants: &[(u64, &str)]| -> Vec<AuditEntry> {
            let seqs = 1..;
            let granted = seqs
                .zip(grants)
                .map(|(seq, &(t, what))| audit(seq, t, what));
            granted.chain([audit(9, 1, "released")]).collect()
        };
        let shared = [(1, "shared_granted"), (2, "shared_granted")];
        for (grants, overlaps) in [
            (&shared[..], false),
            (&[(1, "shared_granted"), (2, "granted")][..], true),
            (&[(1, "granted"), (2, "shared_granted")][..], true),
        ] {
            rw.audit.insert("l".into(), trail(grants));
            let violations = check(&clean_history(), &[], &rw, 0, 1_000);
            let found = violations.iter().any(|v| v.what.contains("had not ended"));
            assert_eq!(found, overlaps, "{grants:?}: {violations:?}");
        }
        let mut missing = finals(2, 2);
        missing.audit.insert(
            "l".into(),
            vec![audit(1, 1, "granted"), audit(2, 1, "expired")],
        );
        let violations = check(&clean_history(), &[], &missing, 0, 1_000);
        assert!(
            violations
                .iter()
                .any(|v| v.what.contains("token 2 is missing")),
            "{violations:?}"
        );
    }

    #[test]
    fn no_progress_after_healing_is_caught() {
        let violations = check(&clean_history(), &[], &finals(2, 2), 500, 1_000);
        assert!(
            violations.iter().any(|v| v.what.contains("no increment")),
            "{violations:?}"
        );
    }
}
