//! The protocol checked exhaustively for small bounds, and rules it rests
//! on broken: the checker must find the counterexample.
//!
//! The bound is one tick (about 290,000 states, seconds in a debug
//! build); deeper bounds need a smaller state space first (docs/safety.md).

use deadbolt_model::{LockModel, Rules};
use stateright::{Checker, Model};

/// Two clients, a TTL of 2 ticks, time up to `max_time`, one leader change.
fn model(rules: Rules, max_time: u64) -> LockModel {
    LockModel {
        clients: 2,
        ttl: 2,
        max_time,
        leader_changes: 1,
        rules,
    }
}

#[test]
fn the_protocol_keeps_every_property_for_one_tick() {
    let checked = model(Rules::SOUND, 1).checker().spawn_bfs().join();
    eprintln!("{} states", checked.unique_state_count());
    checked.assert_properties();
}

#[test]
fn a_client_margin_below_the_drift_bound_lets_two_clients_hold_the_lock() {
    let rules = Rules {
        client_margin: 0,
        ..Rules::SOUND
    };
    let checked = model(rules, 1).checker().spawn_bfs().join();
    let path = checked
        .discovery("one holder at a time")
        .expect("a counterexample");
    // The checker's trace: both clients' grants, and the time the server
    // ended the first lease before its holder's deadline.
    eprintln!("{:#?}", path.into_actions());
}
