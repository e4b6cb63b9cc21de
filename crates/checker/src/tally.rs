//! Counts, not just verdicts: how many times a run's lock service and its
//! resource let mutual exclusion down, for the table in docs/backends.md
//! (violations per fault per backend, with and without fencing).
//!
//! [`crate::checker::check`] says whether a history is correct; this says
//! how wrong it is, in three numbers the seeds' table is about:
//!
//! - **double grants**: two clients held one lock at once by the service's
//!   own promises. Each grant is certainly held ([`Held`]) from its
//!   acknowledgement to the earlier of its release and the lease deadline
//!   its client knew last (a lower bound of the server's); a grant counts
//!   when it was acknowledged inside another client's such interval. A
//!   paused holder whose lease ran out is not one: the service kept its
//!   word; what the holder does next is a stale write.
//! - **stale writes**: writes the resource took although, before they were
//!   sent, a client granted the lock later had already read the resource
//!   ([`Write`]: so the resource had seen the newer holder, and a fence had
//!   been raised past the older token). Without fencing every such late
//!   write lands; with it, the resource refuses them (`stale_refused`).
//! - **lost writes**: acknowledged increments missing from the resource's
//!   final counter (a late read-modify-write overwrote others' work).
//!
//! Plus `repeated_tokens`: grants whose token an earlier grant of another
//! client already had (Redis's counter after a restart).
//!
//! All counts are conservative: an operation whose timing leaves room for an
//! innocent order is not counted.

use crate::history::{Held, Op, Phase, Record, Write};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Tally {
    /// Acknowledged grants.
    pub grants: u64,
    /// Acknowledged resource increments.
    pub writes: u64,
    pub double_grants: u64,
    pub stale_writes: u64,
    /// Late writes the resource refused (its fence held).
    pub stale_refused: u64,
    pub lost_writes: u64,
    pub repeated_tokens: u64,
    /// The longest time a lock went without a grant, in milliseconds
    /// (between consecutive acknowledged grants of one lock): how long a
    /// fault kept everyone out.
    pub max_gap_ms: u64,
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "grants={} writes={} double_grants={} stale_writes={} stale_refused={} lost_writes={} repeated_tokens={} max_gap_ms={}",
            self.grants,
            self.writes,
            self.double_grants,
            self.stale_writes,
            self.stale_refused,
            self.lost_writes,
            self.repeated_tokens,
            self.max_gap_ms
        )
    }
}

/// Tallies a history (sorted by time), the workers' holding intervals and
/// the resource's final counter of each lock.
pub fn tally(
    history: &[Record],
    held: &[Held],
    writes: &[Write],
    resource: &BTreeMap<String, u64>,
) -> Tally {
    let mut tally = Tally::default();
    let grants: Vec<&Record> = history
        .iter()
        .filter(|r| r.op == Op::Acquire && r.phase == Phase::Ok)
        .collect();
    tally.grants = grants.len() as u64;

    let mut last_grant: HashMap<&str, u64> = HashMap::new();
    for grant in &grants {
        if let Some(previous) = last_grant.insert(&grant.lock, grant.at) {
            tally.max_gap_ms = tally
                .max_gap_ms
                .max(grant.at.saturating_sub(previous) / 1_000_000);
        }
    }

    // Per lock: a token repeats only if it fences the same resource.
    let mut owners: HashMap<(&str, u64), usize> = HashMap::new();
    for grant in &grants {
        if let Some(token) = grant.token {
            match owners.get(&(grant.lock.as_str(), token)) {
                Some(&owner) if owner != grant.client => tally.repeated_tokens += 1,
                Some(_) => {}
                None => {
                    owners.insert((&grant.lock, token), grant.client);
                }
            }
        }
    }

    // Double grants: a grant acknowledged while another client's earlier
    // grant of the lock was certainly still held (so both were, at once).
    // A sweep in order of acknowledgement, keeping the latest ends of
    // earlier grants (of two different clients) per lock.
    let mut by_grant: Vec<&Held> = held.iter().collect();
    by_grant.sort_by_key(|h| h.granted);
    let mut ends: HashMap<&str, Top2> = HashMap::new();
    for later in by_grant {
        let latest_end = ends
            .get(later.lock.as_str())
            .and_then(|top| top.best_not_of(later.client));
        tally.double_grants += u64::from(
            later.granted < later.until && latest_end.is_some_and(|end| later.granted < end),
        );
        ends.entry(&later.lock)
            .or_default()
            .offer(later.until, later.client);
    }

    // Stale: some other client under a newer grant had read the resource
    // before this write went out. A sweep in order of sending, keeping the
    // newest grants (of two clients) whose reads came back so far, per lock.
    let mut by_read: Vec<&Write> = writes.iter().collect();
    by_read.sort_by_key(|w| w.read);
    let mut by_sent: Vec<&Write> = writes.iter().collect();
    by_sent.sort_by_key(|w| w.sent);
    let mut newest: HashMap<&str, Top2> = HashMap::new();
    let mut next = 0;
    for write in by_sent {
        while next < by_read.len() && by_read[next].read < write.sent {
            let seen = by_read[next];
            newest
                .entry(&seen.lock)
                .or_default()
                .offer(seen.granted, seen.client);
            next += 1;
        }
        let superseded = newest
            .get(write.lock.as_str())
            .and_then(|top| top.best_not_of(write.client))
            .is_some_and(|granted| granted > write.granted);
        match write.outcome {
            Phase::Ok => tally.stale_writes += u64::from(superseded),
            Phase::Fail => tally.stale_refused += u64::from(superseded),
            Phase::Invoke | Phase::Info => {}
        }
    }

    let mut acked: BTreeMap<&str, u64> = BTreeMap::new();
    for record in history {
        if record.op == Op::ResourceIncrement && record.phase == Phase::Ok {
            tally.writes += 1;
            *acked.entry(record.lock.as_str()).or_default() += 1;
        }
    }
    for (lock, acked) in acked {
        let final_value = resource.get(lock).copied().unwrap_or(0);
        tally.lost_writes += acked.saturating_sub(final_value);
    }
    tally
}

/// The largest value offered, and the largest offered by another client
/// than the first's: enough to answer "the largest not of client C".
#[derive(Default)]
struct Top2 {
    first: Option<(u64, usize)>,
    second: Option<(u64, usize)>,
}

impl Top2 {
    fn offer(&mut self, value: u64, client: usize) {
        match self.first {
            Some((best, owner)) if owner == client => {
                self.first = Some((best.max(value), owner));
            }
            Some((best, _)) if value > best => {
                self.second = self.first;
                self.first = Some((value, client));
            }
            Some(_) => {
                if self.second.is_none_or(|(second, _)| value > second) {
                    self.second = Some((value, client));
                }
            }
            None => self.first = Some((value, client)),
        }
    }

    fn best_not_of(&self, client: usize) -> Option<u64> {
        match self.first {
            Some((_, owner)) if owner == client => self.second.map(|(value, _)| value),
            first => first.map(|(value, _)| value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(at: u64, client: usize, op: Op, phase: Phase) -> Record {
        Record {
            at,
            client,
            op,
            phase,
            lock: "l".into(),
            token: None,
            value: None,
            error: None,
        }
    }

    fn held(client: usize, invoked: u64, granted: u64, until: u64) -> Held {
        Held {
            client,
            lock: "l".into(),
            invoked,
            granted,
            until,
            token: None,
        }
    }

    fn write(client: usize, granted: u64, read: u64, sent: u64, outcome: Phase) -> Write {
        Write {
            client,
            lock: "l".into(),
            granted,
            read,
            sent,
            outcome,
        }
    }

    /// Client 0 is granted at 10, reads at 11 and is paused; client 1 is
    /// granted at 20, reads at 21 and writes at 22; client 0 wakes and
    /// writes at 30 what it read at 11.
    fn late_writer(outcome: Phase) -> (Vec<Record>, Vec<Write>) {
        let history = vec![
            record(10, 0, Op::Acquire, Phase::Ok),
            record(11, 0, Op::ResourceIncrement, Phase::Invoke),
            record(20, 1, Op::Acquire, Phase::Ok),
            record(20, 1, Op::ResourceIncrement, Phase::Invoke),
            record(23, 1, Op::ResourceIncrement, Phase::Ok),
            record(31, 0, Op::ResourceIncrement, outcome),
        ];
        let writes = vec![
            write(1, 20, 21, 22, Phase::Ok),
            write(0, 10, 11, 30, outcome),
        ];
        (history, writes)
    }

    #[test]
    fn a_late_write_is_stale_and_loses_the_other() {
        let resource = BTreeMap::from([("l".to_owned(), 1)]);
        let (history, writes) = late_writer(Phase::Ok);
        let tally = tally(&history, &[], &writes, &resource);
        assert_eq!((tally.stale_writes, tally.lost_writes), (1, 1));
        assert_eq!(tally.stale_refused, 0);
    }

    #[test]
    fn a_refused_late_write_is_counted_as_refused() {
        let resource = BTreeMap::from([("l".to_owned(), 1)]);
        let (history, writes) = late_writer(Phase::Fail);
        let tally = tally(&history, &[], &writes, &resource);
        assert_eq!((tally.stale_writes, tally.lost_writes), (0, 0));
        assert_eq!(tally.stale_refused, 1);
    }

    #[test]
    fn a_write_before_the_newer_holder_read_is_not_stale() {
        // Client 1 was granted at 20 but its read came back only after
        // client 0's write went out (a fence would not have known it yet).
        let writes = [
            write(0, 10, 11, 22, Phase::Ok),
            write(1, 20, 23, 24, Phase::Ok),
        ];
        let resource = BTreeMap::from([("l".to_owned(), 2)]);
        let tally = tally(&[], &[], &writes, &resource);
        assert_eq!(tally.stale_writes, 0);
    }

    #[test]
    fn a_grant_inside_a_promised_lease_is_a_double_grant() {
        // Client 0 was promised until 50; client 1's acquire ran 20..25.
        let inside = [held(0, 5, 10, 50), held(1, 20, 25, 60)];
        assert_eq!(tally(&[], &inside, &[], &BTreeMap::new()).double_grants, 1);
        // Its lease had run out (paused holder): not the service's fault.
        let after = [held(0, 5, 10, 18), held(1, 20, 25, 60)];
        assert_eq!(tally(&[], &after, &[], &BTreeMap::new()).double_grants, 0);
        // Acknowledged after the first had been released.
        let released = [held(0, 5, 10, 20), held(1, 8, 25, 60)];
        assert_eq!(
            tally(&[], &released, &[], &BTreeMap::new()).double_grants,
            0
        );
        // One client's own grants never overlap another's count.
        let own = [held(0, 5, 10, 50), held(0, 20, 25, 60)];
        assert_eq!(tally(&[], &own, &[], &BTreeMap::new()).double_grants, 0);
    }

    #[test]
    fn top2_answers_for_every_client() {
        let mut top = Top2::default();
        for (value, client) in [(5, 1), (9, 1), (7, 2), (3, 3), (8, 3)] {
            top.offer(value, client);
        }
        assert_eq!(top.best_not_of(1), Some(8));
        assert_eq!(top.best_not_of(2), Some(9));
        assert_eq!(top.best_not_of(4), Some(9));
    }

    #[test]
    fn a_token_granted_to_two_clients_is_repeated() {
        let mut history = vec![
            record(10, 0, Op::Acquire, Phase::Ok),
            record(20, 1, Op::Acquire, Phase::Ok),
        ];
        history[0].token = Some(1);
        history[1].token = Some(1);
        assert_eq!(
            tally(&history, &[], &[], &BTreeMap::new()).repeated_tokens,
            1
        );
    }
}
