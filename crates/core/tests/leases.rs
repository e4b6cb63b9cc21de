//! Property test of the leader's lease bookkeeping: a lease never ends
//! earlier than its TTL after the last acknowledged keepalive, and every
//! lease that did run out is reported (once).

use deadbolt_core::{LeaseTracker, RenewError, SessionId};
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
                    leases.track(SessionId(s), ttl, now);
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
