//! Property tests of `FenceGate` and `FenceGates`: random token sequences,
//! one thread and many, checked against what fencing promises from the
//! outside (what was admitted, what was refused, and in which order).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;

use deadbolt_fence::{FenceGate, FenceGates, Stale};
use proptest::prelude::*;

/// Tokens from a small range, so that repeats (equal tokens) and
/// out-of-order arrivals are common.
fn tokens(max_len: usize) -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(0u64..40, 0..max_len)
}

proptest! {
    #[test]
    fn one_thread_admits_exactly_the_tokens_not_below_the_mark(tokens in tokens(200)) {
        let gate = FenceGate::new();
        let mut accepted: Vec<u64> = Vec::new();
        for token in tokens {
            let mark = gate.highest();
            match gate.admit(token) {
                Ok(()) => {
                    prop_assert!(token >= mark);
                    accepted.push(token);
                }
                Err(stale) => {
                    prop_assert_eq!(stale, Stale { presented: token, highest: mark });
                    prop_assert!(token < mark);
                    prop_assert_eq!(gate.highest(), mark, "a refusal changed the mark");
                }
            }
        }
        prop_assert!(accepted.windows(2).all(|w| w[0] <= w[1]), "{:?}", accepted);
        prop_assert_eq!(gate.highest(), accepted.last().copied().unwrap_or(0));
    }

    #[test]
    fn keys_are_fenced_independently(ops in prop::collection::vec((0u8..4, 0u64..40), 0..200)) {
        let gates = FenceGates::<u8>::new();
        let mut model: HashMap<u8, u64> = HashMap::new();
        for (key, token) in ops {
            let mark = model.get(&key).copied().unwrap_or(0);
            prop_assert_eq!(gates.highest(&key), mark);
            let result = gates.admit(&key, token);
            if token >= mark {
                prop_assert_eq!(result, Ok(()));
                model.insert(key, token);
            } else {
                prop_assert_eq!(result, Err(Stale { presented: token, highest: mark }));
            }
        }
    }
}

/// One `admit` call as seen from outside: when it started and ended on a
/// global clock (a shared counter), and what it returned.
struct Call {
    token: u64,
    start: u64,
    end: u64,
    admitted: bool,
}

proptest! {
    // Each case starts threads; fewer cases keep the test quick.
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn concurrent_admits_never_let_a_lower_token_in_after_a_higher(
        per_thread in prop::collection::vec(tokens(60), 2..5)
    ) {
        let gate = FenceGate::new();
        let clock = AtomicU64::new(0);
        let start = Barrier::new(per_thread.len());
        let calls: Vec<Call> = thread::scope(|s| {
            let handles: Vec<_> = per_thread
                .iter()
                .map(|tokens| {
                    let (gate, clock, start) = (&gate, &clock, &start);
                    s.spawn(move || {
                        start.wait();
                        tokens
                            .iter()
                            .map(|&token| {
                                let start = clock.fetch_add(1, Ordering::SeqCst);
                                let admitted = gate.admit(token).is_ok();
                                let end = clock.fetch_add(1, Ordering::SeqCst);
                                Call { token, start, end, admitted }
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });

        for call in &calls {
            for earlier in calls.iter().filter(|c| c.admitted && c.end < call.start) {
                // Admitted strictly before `call` began: `call` cannot pass with less.
                prop_assert!(
                    !(call.admitted && call.token < earlier.token),
                    "token {} admitted after {} had been", call.token, earlier.token
                );
            }
            if !call.admitted {
                // Refused: some higher token had been admitted, and that
                // admission began before the refusal ended.
                prop_assert!(
                    calls.iter().any(|c| c.admitted && c.token > call.token && c.start < call.end),
                    "token {} refused with no higher token admitted", call.token
                );
            }
        }
        let highest_admitted = calls.iter().filter(|c| c.admitted).map(|c| c.token).max();
        prop_assert_eq!(gate.highest(), highest_admitted.unwrap_or(0));
    }

    #[test]
    fn concurrent_writes_through_admit_with_land_in_token_order(
        per_thread in prop::collection::vec(tokens(60), 2..5)
    ) {
        let gate = FenceGate::new();
        let resource = Mutex::new(Vec::new());
        let start = Barrier::new(per_thread.len());
        thread::scope(|s| {
            for tokens in &per_thread {
                let (gate, resource, start) = (&gate, &resource, &start);
                s.spawn(move || {
                    start.wait();
                    for &token in tokens {
                        let _ = gate.admit_with(token, || resource.lock().unwrap().push(token));
                    }
                });
            }
        });
        // The order writes reached the resource is the order they were
        // admitted in, so it never goes down.
        let writes = resource.into_inner().unwrap();
        prop_assert!(writes.windows(2).all(|w| w[0] <= w[1]), "{:?}", writes);
        prop_assert_eq!(gate.highest(), writes.last().copied().unwrap_or(0));
        let max_presented = per_thread.iter().flatten().max().copied();
        prop_assert_eq!(writes.last().copied(), max_presented, "the highest token always gets in");
    }
}
