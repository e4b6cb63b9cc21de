//! Availability, judged beside safety: a lock service exists to be there
//! when a node dies, so a run also fails when a client was shown an outage
//! while a majority of the nodes was up and connected, or when no grant
//! came for longer than a stated bound after a fault.
//!
//! Why: every fault run checked only that nothing unsafe happened. A
//! regression that failed every call for a second after a leader died
//! (`deadbolt run` exiting 10 ms after a `kill -9`) landed green, with 39
//! operations of 3,163 lost and counted nowhere (issue 59).
//!
//! What counts: an error the client library returned (not the worker's own
//! timeout) of a kind that says the service was not there
//! ([`OUTAGE_KINDS`]), outside the windows a fault excuses: one that left
//! no majority able to write (every node's disk full), or one of the
//! client's own (its process paused past its lease, when its session is
//! rightly gone). Refusals (`busy`, `wait_timeout`, `unknown_session` of a
//! lost lease) are answers, not outages. Nor is an error on a session the
//! client already knew lost ([`ClientError::lease_lost`]): a holder keeps
//! its lease through a failover shorter than its TTL less its margin, and
//! a fault that outlasted it leaves the call nothing to be served on (a
//! fenced put whose first attempt's answer was lost, refused as stale on
//! its repeat, can only say its outcome is unknown).
//!
//! A change whose outcome is unknown ([`ClientError::outcome_unknown`]) is
//! counted apart and reported, not failed: a fenced write cut off by a
//! node's death and refused on repeat because another semaphore holder
//! wrote since cannot be told done or not done without a request id the
//! replicated commands do not carry (yet).

use crate::checker::Violation;
pub use crate::history::ClientError;

/// Error kinds that mean the service did not serve the call.
pub const OUTAGE_KINDS: [&str; 4] = ["unavailable", "not_leader", "overloaded", "internal"];

/// One fault of a run: when it started and ended (history clock), what
/// it was, and how it bears on availability.
#[derive(Debug, Clone)]
pub struct Fault {
    pub from: u64,
    pub to: u64,
    pub what: String,
    pub bearing: Bearing,
}

/// What a fault lets the service off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bearing {
    /// A majority stayed up and connected: every call must be served, and
    /// a grant must come within the gap bound.
    Kept,
    /// No majority could serve until `grace` after the fault ended (every
    /// node's disk full): errors and gaps then are excused.
    NoMajority { grace: u64 },
    /// Only the named client was faulted (paused): its own errors until
    /// `grace` after the fault ended are excused, and the gap is not
    /// measured (the others may rightly wait on its locks).
    Client { client: usize, grace: u64 },
}

/// What the run's availability came to.
#[derive(Debug, Default)]
pub struct Report {
    /// Outage errors outside every excusing window.
    pub unexcused: Vec<ClientError>,
    /// Outage errors a fault excused.
    pub excused: usize,
    /// Outage errors on a session whose lease was already lost.
    pub lease_lost: usize,
    /// Changes whose outcome the fault left unknown.
    pub outcome_unknown: usize,
    /// For each [`Bearing::Kept`] fault: the longest time without a grant
    /// from its start until service came back, in nanoseconds.
    pub gaps: Vec<(String, u64)>,
}

impl Report {
    /// The median and the longest gap, in milliseconds.
    pub fn gap_figures(&self) -> Option<(u64, u64)> {
        let mut gaps: Vec<u64> = self.gaps.iter().map(|(_, gap)| gap / 1_000_000).collect();
        gaps.sort_unstable();
        Some((*gaps.get(gaps.len() / 2)?, *gaps.last()?))
    }
}

/// Judges `errors` and `grants` (the instants acquires were acknowledged)
/// against `faults`; a gap above `max_gap` (ns) is a violation.
pub fn check(
    errors: &[ClientError],
    grants: &[u64],
    faults: &[Fault],
    max_gap: u64,
) -> (Report, Vec<Violation>) {
    let mut report = Report::default();
    for error in errors
        .iter()
        .filter(|error| OUTAGE_KINDS.contains(&error.kind.as_str()))
    {
        if error.lease_lost {
            report.lease_lost += 1;
        } else if error.outcome_unknown {
            report.outcome_unknown += 1;
        } else if faults.iter().any(|fault| excuses(fault, error)) {
            report.excused += 1;
        } else {
            report.unexcused.push(error.clone());
        }
    }
    let mut grants = grants.to_vec();
    grants.sort_unstable();
    for fault in faults.iter().filter(|fault| fault.bearing == Bearing::Kept) {
        report
            .gaps
            .push((fault.what.clone(), longest_gap(&grants, fault)));
    }
    let mut violations: Vec<Violation> = report
        .unexcused
        .iter()
        .map(|error| Violation {
            what: format!(
                "client {} was shown {} on {} while a majority was up",
                error.client, error.kind, error.call
            ),
            records: vec![format!("at {}: {}", error.at, error.message)],
        })
        .collect();
    violations.extend(
        report
            .gaps
            .iter()
            .filter(|(_, gap)| *gap > max_gap)
            .map(|(what, gap)| Violation {
                what: format!(
                    "no grant for {} ms after a fault that left a majority up (bound {} ms)",
                    gap / 1_000_000,
                    max_gap / 1_000_000
                ),
                records: vec![what.clone()],
            }),
    );
    (report, violations)
}

fn excuses(fault: &Fault, error: &ClientError) -> bool {
    match fault.bearing {
        Bearing::Kept => false,
        Bearing::NoMajority { grace } => (fault.from..=fault.to + grace).contains(&error.at),
        Bearing::Client { client, grace } => {
            client == error.client && (fault.from..=fault.to + grace).contains(&error.at)
        }
    }
}

/// The longest stretch without a grant that overlaps the fault: from the
/// fault's start (or the last grant before it) to the first grant after
/// the stretch, for every stretch that began before the fault ended.
fn longest_gap(grants: &[u64], fault: &Fault) -> u64 {
    let after_start = grants.partition_point(|at| *at < fault.from);
    let mut since = fault.from;
    let mut longest = 0;
    for at in &grants[after_start..] {
        longest = longest.max(at - since);
        if *at > fault.to {
            return longest;
        }
        since = *at;
    }
    // No grant after the fault at all: the run's liveness check says so.
    longest
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn error(at: u64, client: usize, kind: &str) -> ClientError {
        ClientError {
            at,
            client,
            call: "open_session".into(),
            kind: kind.into(),
            message: "this node forwards calls to the leader, and that failed".into(),
            lease_lost: false,
            outcome_unknown: false,
        }
    }

    fn fault(from: u64, to: u64, bearing: Bearing) -> Fault {
        Fault {
            from,
            to,
            what: "kill -9 node 1 (leader)".into(),
            bearing,
        }
    }

    // The regression of issue 59: a leader's kill reached callers as
    // `unavailable`, and the run passed.
    #[test]
    fn an_outage_shown_while_a_majority_was_up_fails_the_run() {
        let faults = [fault(100 * MS, 400 * MS, Bearing::Kept)];
        let errors = [
            error(110 * MS, 2, "unavailable"),
            error(120 * MS, 3, "busy"),
        ];
        let (report, violations) = check(&errors, &[50 * MS, 700 * MS], &faults, 2_000 * MS);
        assert_eq!(
            report.unexcused.len(),
            1,
            "busy is an answer, not an outage"
        );
        assert_eq!(violations.len(), 1);
        assert!(violations[0].what.contains("unavailable on open_session"));
    }

    #[test]
    fn a_fault_that_left_no_majority_or_paused_the_client_excuses_its_errors() {
        let faults = [
            fault(100 * MS, 400 * MS, Bearing::NoMajority { grace: 500 * MS }),
            fault(
                2_000 * MS,
                3_000 * MS,
                Bearing::Client {
                    client: 4,
                    grace: 0,
                },
            ),
        ];
        let errors = [
            error(800 * MS, 1, "unavailable"),
            error(2_500 * MS, 4, "unavailable"),
            error(2_500 * MS, 5, "not_leader"),
        ];
        let (report, violations) = check(&errors, &[], &faults, 2_000 * MS);
        assert_eq!(report.excused, 2);
        assert_eq!(
            report.unexcused,
            vec![errors[2].clone()],
            "client 5 was not paused"
        );
        assert_eq!(violations.len(), 1);
    }

    // CI at 4bd3883, nemesis seed 1: a fenced put cut off by a leader's
    // partition, longer than the worker's 1 s lease, was repeated and
    // refused as stale; its outcome unknown, the client said
    // `unavailable`, and the run failed although the lease, not the
    // service, was gone.
    #[test]
    fn an_error_on_a_lease_the_fault_outlasted_is_no_outage() {
        let faults = [fault(100 * MS, 2_000 * MS, Bearing::Kept)];
        let on_lost_lease = ClientError {
            lease_lost: true,
            ..error(1_500 * MS, 4, "unavailable")
        };
        let on_held_lease = error(1_500 * MS, 5, "unavailable");
        let (report, violations) = check(
            &[on_lost_lease, on_held_lease.clone()],
            &[50 * MS, 2_100 * MS],
            &faults,
            5_000 * MS,
        );
        assert_eq!(report.lease_lost, 1);
        assert_eq!(report.unexcused, vec![on_held_lease]);
        assert_eq!(violations.len(), 1);
    }

    #[test]
    fn a_change_left_unknown_is_counted_apart() {
        let faults = [fault(100 * MS, 2_000 * MS, Bearing::Kept)];
        let unknown = ClientError {
            outcome_unknown: true,
            ..error(1_500 * MS, 3, "unavailable")
        };
        let (report, violations) = check(&[unknown], &[50 * MS, 900 * MS], &faults, 5_000 * MS);
        assert_eq!(report.outcome_unknown, 1);
        assert!(report.unexcused.is_empty());
        assert!(violations.is_empty());
    }

    #[test]
    fn the_gap_runs_from_the_fault_to_the_first_grant_that_ends_it() {
        let faults = [fault(1_000 * MS, 1_100 * MS, Bearing::Kept)];
        let grants = [900 * MS, 2_300 * MS, 2_400 * MS];
        let (report, violations) = check(&[], &grants, &faults, 2_000 * MS);
        assert_eq!(report.gaps[0].1, 1_300 * MS);
        assert!(violations.is_empty());
        let (_, violations) = check(&[], &grants, &faults, 1_000 * MS);
        assert_eq!(
            violations.len(),
            1,
            "1.3 s without a grant is over a 1 s bound"
        );
        assert_eq!(report.gap_figures(), Some((1_300, 1_300)));
    }

    #[test]
    fn a_gap_that_began_during_the_fault_counts_until_its_grant() {
        // Granted early in a long pause, then nothing for 2.5 s.
        let faults = [fault(1_000 * MS, 3_000 * MS, Bearing::Kept)];
        let grants = [1_100 * MS, 3_600 * MS];
        let (report, _) = check(&[], &grants, &faults, 5_000 * MS);
        assert_eq!(report.gaps[0].1, 2_500 * MS);
    }
}
