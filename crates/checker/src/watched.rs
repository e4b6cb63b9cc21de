//! Watch streams against the service's own timeline: what one watch of the
//! run's names received, across every fault of the run (leader kills, node
//! restarts, pauses), must be each name's audit trail exactly: the same
//! grants and ends, in the same order, none missing, none repeated.
//!
//! Why the audit trail is the reference: it is kept in the replicated
//! table, so it is the log's own account of who held what, read after the
//! faults stop; a watch that resumed on another node after a gap or twice
//! over the same events would differ from it.

use crate::checker::Violation;
use deadbolt_proto::v1::{AuditEntry, WatchEvent};
use std::collections::BTreeMap;

/// The most records the audit trail keeps (across all names): a trail that
/// long may have lost its oldest records, which the watch still has.
pub const AUDIT_RECORDS_KEPT: usize = 10_000;

/// One grant or end, as both a trail and a watch describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Change<'a> {
    what: &'a str,
    session: u64,
    token: u64,
    identity: &'a str,
}

fn from_trail(entry: &AuditEntry) -> Change<'_> {
    let what = match entry.what.as_str() {
        // The trail names the grant's kind; a watch says it in its fields.
        "permits_granted" | "shared_granted" => "granted",
        what => what,
    };
    Change {
        what,
        session: entry.session_id,
        token: entry.token,
        identity: &entry.identity,
    }
}

/// The watch's grants and ends (its queue events and proclaims are not in
/// the trail).
fn from_watch(event: &WatchEvent) -> Option<Change<'_>> {
    let what = event.kind.as_str();
    let in_trail = [
        "granted",
        "released",
        "closed",
        "expired",
        "abandoned",
        "delayed",
    ];
    in_trail.contains(&what).then_some(Change {
        what,
        session: event.session_id,
        token: event.token,
        identity: &event.identity,
    })
}

/// Checks the events one watch received (in the order received) against
/// `audit`, each name's trail read after the run; `ended` is the error that
/// ended the watch early, if one did.
pub fn check_watched(
    audit: &BTreeMap<String, Vec<AuditEntry>>,
    watched: &[WatchEvent],
    ended: Option<&str>,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    if let Some(error) = ended {
        violations.push(Violation {
            what: format!("the watch ended early: {error}"),
            records: Vec::new(),
        });
    }
    for pair in watched.windows(2) {
        if (pair[0].index, pair[0].position) >= (pair[1].index, pair[1].position) {
            violations.push(Violation {
                what: "the watch gave an event again, or out of log order".to_owned(),
                records: pair.iter().map(|e| format!("{e:?}")).collect(),
            });
        }
    }
    let complete = audit.values().map(Vec::len).sum::<usize>() < AUDIT_RECORDS_KEPT;
    for (name, trail) in audit {
        let expected: Vec<Change> = trail.iter().map(from_trail).collect();
        let got: Vec<Change> = watched
            .iter()
            .filter(|event| event.name == *name)
            .filter_map(from_watch)
            .collect();
        // A trail that may have lost its oldest records is compared with
        // the watch's newest.
        let got = match complete {
            true => &got[..],
            false => &got[got.len().saturating_sub(expected.len())..],
        };
        if got != expected {
            let first = got
                .iter()
                .zip(&expected)
                .position(|(got, expected)| got != expected)
                .unwrap_or(got.len().min(expected.len()));
            violations.push(Violation {
                what: format!(
                    "the watch of {name} differs from its audit trail from change {first} on \
                     ({} changes watched, {} in the trail)",
                    got.len(),
                    expected.len()
                ),
                records: [
                    format!("watched: {:?}", got.get(first)),
                    format!("trail:   {:?}", expected.get(first)),
                ]
                .to_vec(),
            });
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::tests::audit as entry;

    fn event(index: u64, token: u64, kind: &str) -> WatchEvent {
        WatchEvent {
            index,
            position: 0,
            id: format!("{index}.0"),
            kind: kind.into(),
            name: "l".into(),
            session_id: 1,
            token,
            ..Default::default()
        }
    }

    fn trail() -> BTreeMap<String, Vec<AuditEntry>> {
        let entries = [
            (1, "granted"),
            (1, "released"),
            (2, "shared_granted"),
            (2, "expired"),
        ];
        let entries = entries.iter().enumerate();
        BTreeMap::from([(
            "l".to_owned(),
            entries
                .map(|(seq, (t, w))| entry(seq as u64, *t, w))
                .collect(),
        )])
    }

    fn watched() -> Vec<WatchEvent> {
        vec![
            event(3, 1, "granted"),
            event(4, 1, "released"),
            event(5, 0, "queued"),
            event(6, 2, "granted"),
            event(9, 2, "expired"),
        ]
    }

    #[test]
    fn a_complete_watch_matches_its_trail() {
        assert!(check_watched(&trail(), &watched(), None).is_empty());
    }

    #[test]
    fn a_gap_a_repeat_and_an_early_end_are_violations() {
        let mut gap = watched();
        gap.remove(1);
        assert_eq!(check_watched(&trail(), &gap, None).len(), 1);
        let mut repeat = watched();
        repeat.insert(2, event(4, 1, "released"));
        // Out of order, and the trail differs.
        assert_eq!(check_watched(&trail(), &repeat, None).len(), 2);
        let ended = check_watched(&trail(), &watched(), Some("compacted"));
        assert_eq!(ended.len(), 1);
        assert!(ended[0].what.contains("compacted"));
    }
}
