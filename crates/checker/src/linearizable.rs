//! Linearizability of the counters a run's clients increment, checked with
//! stateright's `LinearizabilityTester`, a checker nobody here wrote.
//!
//! Why beside [`crate::checker`]: that one counts (no more and no fewer
//! increments than were acknowledged or unknown) and compares tokens pair
//! by pair. This one asks the stronger question: is there one order of all
//! the increments of a counter, each taking effect at a single instant
//! between its invocation and its answer, that explains every answer and
//! the final value, under the fence rule? A lost update, a phantom one, an
//! answer out of real-time order or a write accepted under a token older
//! than one already used all make the answer no.
//!
//! Each counter (one per lock in Deadbolt's fenced store, one per lock on
//! the resource) is a sequential object of its own ([`FencedCounter`]),
//! so each is checked alone: linearizability composes over objects. An
//! increment is a fenced read and a fenced write by the holder of one
//! token; the model takes it as one atomic step that is refused if a larger
//! token was used before. Increments that certainly failed are left out
//! (they changed nothing the model keeps); those of unknown outcome stay in
//! flight forever, so the tester may apply them or not, at any instant after
//! their invocation. The final value read after the run is one last read.

use crate::checker::{Finals, Violation};
use crate::history::{Op, Phase, Record};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};
use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A counter behind a fence: the value, and the largest token that has
/// incremented it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FencedCounter {
    value: u64,
    fence: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CounterOp {
    /// Read, then write value + 1, with this token (`None`: unfenced).
    Increment { token: Option<u64> },
    /// The read after the run.
    Read,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CounterRet {
    Value(u64),
    /// Stale: a larger token was used before.
    Refused,
}

impl SequentialSpec for FencedCounter {
    type Op = CounterOp;
    type Ret = CounterRet;

    fn invoke(&mut self, op: &CounterOp) -> CounterRet {
        match op {
            CounterOp::Increment { token } => {
                if let Some(token) = *token {
                    if token < self.fence {
                        return CounterRet::Refused;
                    }
                    self.fence = token;
                }
                self.value += 1;
                CounterRet::Value(self.value)
            }
            CounterOp::Read => CounterRet::Value(self.value),
        }
    }
}

/// Threads of increments whose outcome is unknown start here, above every
/// client's: each is in flight to the end, alone on its thread, and the
/// tester tries the clients' operations first.
const UNKNOWN_THREADS: u64 = 1 << 32;
/// The thread of the read after the run.
const FINAL_READER: u64 = u64::MAX;

/// The tester's search is exponential in the worst case, which a history
/// that is not linearizable can reach: past this much of its thread's CPU
/// time, the counter is reported undecided (itself a reason to look). CPU
/// time, not wall-clock time: a soak stopped with SIGSTOP, or starved at
/// nice 19 by a CI run, reported two searches of 2 s each as undecided.
const DECIDE_WITHIN: Duration = Duration::from_secs(60);
/// How often the waiting side looks at the search's CPU time.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// Checks every counter of `finals` (the store's and the resource's) for
/// linearizability against the increments of `history`, given in the order
/// they happened.
pub fn check_linearizable(history: &[Record], finals: &Finals) -> Vec<Violation> {
    let counters = [
        (Op::StoreIncrement, &finals.store),
        (Op::ResourceIncrement, &finals.resource),
    ];
    let mut violations = Vec::new();
    for (op, finals) in counters {
        for (lock, &final_value) in finals {
            let increments: Vec<&Record> = history
                .iter()
                .filter(|r| r.op == op && r.lock == *lock)
                .collect();
            if let Some(violation) = check_counter(op, lock, &increments, final_value) {
                violations.push(violation);
            }
        }
    }
    violations
}

/// One counter's increments (in the order they happened) and the value it
/// ended at: `None` if linearizable.
fn check_counter(
    op: Op,
    lock: &str,
    increments: &[&Record],
    final_value: u64,
) -> Option<Violation> {
    let tester = match tester(increments, final_value) {
        Ok(tester) => tester,
        Err(malformed) => {
            return Some(Violation {
                what: format!("the {op:?} history of {lock} is malformed: {malformed}"),
                records: Vec::new(),
            })
        }
    };
    let unknown = increments.iter().filter(|r| r.phase == Phase::Info).count();
    let what = match search(lock, tester) {
        Search::Linearizable => return None,
        Search::NoOrder => "is not linearizable: no order of its increments",
        Search::GaveUp => {
            "was not decided within a minute of CPU time: the search for an order of its \
             increments"
        }
    };
    let acknowledged = increments.iter().filter(|r| r.phase == Phase::Ok).count();
    Some(Violation {
        what: format!(
            "the {op:?} counter of {lock} {what} ({acknowledged} acknowledged, {unknown} of \
             unknown outcome), each at one instant between its invocation and its answer, \
             explains every answer and the final value {final_value} under the fence rule"
        ),
        records: Vec::new(),
    })
}

type Tester = LinearizabilityTester<u64, FencedCounter>;

enum Search {
    Linearizable,
    NoOrder,
    /// Past [`DECIDE_WITHIN`] of CPU time, or the search thread died.
    GaveUp,
}

/// Runs the tester's search on a thread of its own (it recurses once per
/// operation, and may have to be given up on, left running).
fn search(lock: &str, tester: Tester) -> Search {
    let (answer, answered) = mpsc::channel();
    let (clock, clock_known) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("linearizable {lock}"))
        .stack_size(256 << 20)
        .spawn(move || {
            let _ = clock.send(ThreadClock::of_this_thread());
            let _ = answer.send(tester.serialized_history().is_some());
        })
        .expect("a thread for the search");
    let Ok(clock) = clock_known.recv() else {
        return Search::GaveUp;
    };
    // Without a CPU clock for the thread (never seen on Linux), wall-clock
    // time stands in.
    let started = Instant::now();
    let used = || match &clock {
        Some(clock) => clock.used(),
        None => Some(started.elapsed()),
    };
    loop {
        match answered.recv_timeout(LOOK_EVERY) {
            Ok(true) => return Search::Linearizable,
            Ok(false) => return Search::NoOrder,
            Err(mpsc::RecvTimeoutError::Disconnected) => return Search::GaveUp,
            // An error reading the clock: the thread has just ended, and
            // its answer is on the way.
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if used().is_some_and(|used| used >= DECIDE_WITHIN) {
                    return Search::GaveUp;
                }
            }
        }
    }
}

/// The CPU time one thread has used, readable from another thread.
struct ThreadClock(libc::clockid_t);

impl ThreadClock {
    fn of_this_thread() -> Option<ThreadClock> {
        let mut id: libc::clockid_t = 0;
        // SAFETY: pthread_self() is this live thread; `id` is a valid out
        // pointer.
        let failed = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
        (failed == 0).then_some(ThreadClock(id))
    }

    /// `None` once the thread has ended.
    fn used(&self) -> Option<Duration> {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid out pointer; a stale clock id gives an
        // error, not undefined behaviour.
        let failed = unsafe { libc::clock_gettime(self.0, &mut now) };
        (failed == 0).then(|| {
            Duration::new(
                u64::try_from(now.tv_sec).unwrap_or(0),
                u32::try_from(now.tv_nsec).unwrap_or(0),
            )
        })
    }
}

/// The tester, fed with `increments` and the final read.
fn tester(increments: &[&Record], final_value: u64) -> Result<Tester, String> {
    // How each invocation ended: by the position of the invocation.
    let mut open: HashMap<usize, usize> = HashMap::new();
    let mut ended: BTreeMap<usize, &Record> = BTreeMap::new();
    for (at, record) in increments.iter().enumerate() {
        if record.phase == Phase::Invoke {
            open.insert(record.client, at);
        } else if let Some(invoked) = open.remove(&record.client) {
            ended.insert(invoked, record);
        }
    }
    let acknowledged = |at: usize| {
        ended
            .get(&at)
            .filter(|end| end.phase == Phase::Ok && end.value.is_some())
    };

    let mut tester = Tester::new(FencedCounter::default());
    let mut unknown_threads = UNKNOWN_THREADS..;
    for (at, record) in increments.iter().enumerate() {
        let increment = CounterOp::Increment {
            token: record.token,
        };
        match record.phase {
            Phase::Invoke => match ended.get(&at).map(|end| end.phase) {
                // Certainly without effect: nothing to place.
                Some(Phase::Fail) => {}
                _ if acknowledged(at).is_some() => {
                    tester.on_invoke(record.client as u64, increment)?;
                }
                _ => {
                    let thread = unknown_threads.next().expect("threads to spare");
                    tester.on_invoke(thread, increment)?;
                }
            },
            Phase::Ok if record.value.is_some() => {
                let value = record.value.expect("checked");
                tester.on_return(record.client as u64, CounterRet::Value(value))?;
            }
            _ => {}
        }
    }
    tester
        .on_invoke(FINAL_READER, CounterOp::Read)?
        .on_return(FINAL_READER, CounterRet::Value(final_value))?;
    Ok(tester)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The search's budget counts the CPU time its thread used, so a
    /// process stopped or starved for a minute does not give up on a search
    /// of two seconds (two soak seeds were reported undecided that way).
    #[test]
    fn a_thread_that_waits_uses_no_cpu_time() {
        let (clock, clock_known) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            clock.send(ThreadClock::of_this_thread()).unwrap();
            std::thread::sleep(Duration::from_millis(400));
        });
        let clock = clock_known
            .recv()
            .unwrap()
            .expect("a CPU clock for the thread");
        std::thread::sleep(Duration::from_millis(200));
        let used = clock.used().expect("the thread is still sleeping");
        assert!(used < Duration::from_millis(100), "{used:?}");
        waiter.join().unwrap();
    }

    /// Client `client`'s increment with `token`, invoked and ended as
    /// `phase` with `value`.
    fn increment(client: usize, token: u64, phase: Phase, value: Option<u64>) -> [Record; 2] {
        let record = |phase, value| Record {
            at: 0,
            client,
            op: Op::StoreIncrement,
            phase,
            lock: "l".into(),
            token: Some(token),
            value,
            error: None,
        };
        [record(Phase::Invoke, None), record(phase, value)]
    }

    fn verdict(history: &[Record], final_value: u64) -> Vec<Violation> {
        let finals = Finals {
            store: BTreeMap::from([("l".to_owned(), final_value)]),
            resource: BTreeMap::new(),
            audit: BTreeMap::new(),
            semaphores: BTreeMap::new(),
        };
        check_linearizable(history, &finals)
    }

    #[test]
    fn increments_one_after_another_are_linearizable() {
        let history = [
            increment(0, 5, Phase::Ok, Some(1)),
            increment(1, 6, Phase::Ok, Some(2)),
            // Refused as stale: left out.
            increment(0, 5, Phase::Fail, None),
            increment(0, 7, Phase::Ok, Some(3)),
        ]
        .concat();
        assert!(verdict(&history, 3).is_empty());
    }

    #[test]
    fn an_increment_of_unknown_outcome_may_have_happened_or_not() {
        let happened = [
            increment(0, 5, Phase::Info, None),
            increment(1, 6, Phase::Ok, Some(2)),
        ]
        .concat();
        assert!(verdict(&happened, 2).is_empty());
        let did_not = [
            increment(0, 5, Phase::Info, None),
            increment(1, 6, Phase::Ok, Some(1)),
        ]
        .concat();
        assert!(verdict(&did_not, 1).is_empty());
        // Whichever it was, the final value must agree with the answers.
        let violations = verdict(&did_not, 2);
        assert_eq!(violations.len(), 1, "{violations:?}");
    }

    #[test]
    fn concurrent_increments_are_placed_in_either_order() {
        // Both invoked before either answered (two permits of a semaphore).
        let [a_invoke, a_ok] = increment(0, 5, Phase::Ok, Some(2));
        let [b_invoke, b_ok] = increment(1, 6, Phase::Ok, Some(1));
        // b (token 6) first, then a (token 5) would be refused as stale: the
        // only order is a then b, which gives a 1, not 2.
        let history = [a_invoke.clone(), b_invoke.clone(), b_ok.clone(), a_ok];
        assert_eq!(verdict(&history, 2).len(), 1);
        let [_, a_first] = increment(0, 5, Phase::Ok, Some(1));
        let [_, b_second] = increment(1, 6, Phase::Ok, Some(2));
        let history = [a_invoke, b_invoke, b_second, a_first];
        assert!(verdict(&history, 2).is_empty());
    }

    /// Planted violations: each is caught, and says what it is about.
    #[test]
    fn a_lost_update_a_stale_write_and_a_wrong_final_value_are_caught() {
        let lost = [
            increment(0, 5, Phase::Ok, Some(1)),
            increment(1, 6, Phase::Ok, Some(1)),
        ]
        .concat();
        let violations = verdict(&lost, 1);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0]
                .what
                .contains("StoreIncrement counter of l is not linearizable"),
            "{}",
            violations[0]
        );

        // An older token's write accepted after a newer one's.
        let stale = [
            increment(0, 6, Phase::Ok, Some(1)),
            increment(1, 5, Phase::Ok, Some(2)),
        ]
        .concat();
        assert_eq!(verdict(&stale, 2).len(), 1);

        let phantom = [increment(0, 5, Phase::Ok, Some(1))].concat();
        assert_eq!(verdict(&phantom, 2).len(), 1);
    }
}
