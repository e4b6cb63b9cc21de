//! The protocol checked exhaustively for small bounds, and each rule it
//! rests on broken in turn: the checker must find a counterexample, which
//! the test prints (run with `--nocapture` to read it).

use deadbolt_model::{LockModel, Primitive, Rules};
use stateright::{Checker, HasDiscoveries, Model};

/// Two clients and one leader change, acquires without a lock-delay (the
/// client's default); a TTL of `ttl` ticks (the leader's
/// clock may end a lease a tick early, and the client stops a tick before
/// its deadline), time up to `ticks`, and `opens` sessions and `acquires`
/// acquires in all.
fn model(rules: Rules, ttl: u64, ticks: u64, opens: u64, acquires: u64) -> LockModel {
    model_of(2, rules, ttl, ticks, opens, acquires)
}

fn model_of(
    clients: usize,
    rules: Rules,
    ttl: u64,
    ticks: u64,
    opens: u64,
    acquires: u64,
) -> LockModel {
    LockModel {
        clients,
        ttl,
        max_time: ticks,
        leader_changes: 1,
        max_opens: opens,
        max_acquires: acquires,
        blocking: false,
        primitive: Primitive::Lock,
        lock_delay: 0,
        rules,
    }
}

/// The bound CI checks exhaustively: one open and one acquire per client,
/// a TTL of two ticks, one tick of time.
fn small(rules: Rules) -> LockModel {
    model(rules, 2, 1, 2, 2)
}

/// Checks `model` until the first violation; returns the violated
/// property's counterexample, step by step.
fn counterexample(model: LockModel, property: &'static str) -> Vec<String> {
    let checked = model
        .clone()
        .checker()
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let path = checked.discovery(property).unwrap_or_else(|| {
        panic!(
            "no counterexample to {property:?} in {} states",
            checked.unique_state_count()
        )
    });
    let steps = model.explain(path);
    eprintln!(
        "{property}: {} states, counterexample:",
        checked.unique_state_count()
    );
    for step in &steps {
        eprintln!("{step}");
    }
    steps
}

const ONE_HOLDER: &str = "one holder at a time";

/// The index of the first step that mentions `what`.
fn first(steps: &[String], what: &str) -> usize {
    steps
        .iter()
        .position(|step| step.contains(what))
        .unwrap_or_else(|| panic!("no step {what:?} in the counterexample"))
}

/// The index of the last step that mentions `what`.
fn last(steps: &[String], what: &str) -> usize {
    steps
        .iter()
        .rposition(|step| step.contains(what))
        .unwrap_or_else(|| panic!("no step {what:?} in the counterexample"))
}

#[test]
fn the_protocol_keeps_every_property_for_one_tick() {
    // Without a lock-delay, and with one of two ticks (which must hold off
    // every grant after an expiry that long, less the drift).
    for lock_delay in [0, 2] {
        let model = LockModel {
            lock_delay,
            ..small(Rules::SOUND)
        };
        let checked = model.checker().spawn_bfs().join();
        eprintln!(
            "lock-delay {lock_delay}: {} states",
            checked.unique_state_count()
        );
        checked.assert_properties();
        // The bound reaches the scenarios the tests below break: both
        // clients granted in turn, a leader change, an expiry.
        assert!(checked.unique_state_count() > 500_000);
    }
}

#[test]
fn every_other_primitive_keeps_every_property_for_one_tick() {
    // The table's own commands for each (a semaphore of one permit; an
    // election, where resigning is releasing; a read/write lock whose
    // clients ask for shared or exclusive holds, and shared holds may
    // overlap).
    for primitive in [Primitive::RwLock, Primitive::Semaphore, Primitive::Election] {
        let model = LockModel {
            primitive,
            ..small(Rules::SOUND)
        };
        let checked = model.checker().spawn_bfs().join();
        eprintln!("{primitive:?}: {} states", checked.unique_state_count());
        checked.assert_properties();
        assert!(checked.unique_state_count() > 500_000);
    }
}

#[test]
fn a_client_margin_below_the_drift_bound_lets_a_writer_and_another_holder_overlap() {
    let model = LockModel {
        primitive: Primitive::RwLock,
        ..small(Rules {
            client_margin: 0,
            ..Rules::SOUND
        })
    };
    let steps = counterexample(model, ONE_HOLDER);
    first(&steps, "DecideExpiry");
}

#[test]
fn three_blocking_clients_are_granted_in_fifo_order_one_at_a_time() {
    // Two waiters behind a holder take three clients; the bound without
    // time or leader changes keeps it to about 2.4 million states (each
    // tick and leader change multiplies them several times).
    let mut model = model_of(3, Rules::SOUND, 2, 0, 3, 3);
    model.blocking = true;
    model.leader_changes = 0;
    let checked = model.checker().spawn_bfs().join();
    eprintln!("{} states", checked.unique_state_count());
    checked.assert_properties();
    assert!(checked.unique_state_count() > 2_000_000);
}

#[test]
fn a_client_margin_below_the_drift_bound_lets_two_clients_hold_the_lock() {
    let rules = Rules {
        client_margin: 0,
        ..Rules::SOUND
    };
    let steps = counterexample(small(rules), ONE_HOLDER);
    // The leader's fast clock ended the first lease while its holder
    // still counted on it.
    first(&steps, "DecideExpiry");
}

#[test]
fn a_resource_without_the_fence_accepts_a_stale_write() {
    let rules = Rules {
        fence: false,
        ..Rules::SOUND
    };
    counterexample(small(rules), "the resource's tokens never go back");
}

#[test]
fn an_acquire_that_overtakes_the_same_sessions_release_is_granted_a_lock_then_freed() {
    // Acquire is idempotent: the server answers the overtaking acquire
    // with the grant the session still holds, and the release then frees
    // it. The client's claim on a lock name (held until the release is
    // answered) rules this out; it takes a third acquire.
    let rules = Rules {
        claim_until_released: false,
        ..Rules::SOUND
    };
    let steps = counterexample(model(rules, 2, 1, 2, 3), ONE_HOLDER);
    let released = first(&steps, "deliver Release");
    let regranted = last(&steps, "deliver Granted");
    assert!(
        released < regranted,
        "the stale grant arrives after the release"
    );
}

#[test]
fn a_new_leader_that_trusts_an_overtaken_checkpoint_ends_a_renewed_lease_early() {
    // A checkpoint records a lease's time left; a renewal then moves the
    // lease on. A new leader that restores the checkpoint's time ends the
    // lease before the client's deadline. It takes a TTL of three ticks
    // (a checkpoint, then a renewal, before the first lease ends) and two
    // ticks of time.
    let rules = Rules {
        checkpoint_rule: false,
        ..Rules::SOUND
    };
    let steps = counterexample(model(rules, 3, 2, 2, 2), ONE_HOLDER);
    let checkpoint = first(&steps, "Checkpoint");
    let renewed = last(&steps, "deliver Renewed");
    let changed = first(&steps, "ChangeLeader");
    assert!(checkpoint < renewed && renewed < changed);
}

#[test]
fn a_new_leader_that_ends_lock_delays_as_it_takes_over_grants_the_lock_during_one() {
    let rules = Rules {
        rearm_lock_delays: false,
        ..Rules::SOUND
    };
    let model = LockModel {
        lock_delay: 2,
        ..small(rules)
    };
    let steps = counterexample(model, "no grant during a lock-delay");
    let expired = first(&steps, "CommitExpiry");
    let changed = first(&steps, "ChangeLeader");
    assert!(expired < changed);
}

/// With the client's watchdog final, a late renewal cannot revive a
/// session, which alone keeps the server's renewal and term checks from
/// mattering to the client that holds (both checks protect clients that
/// lack such a watchdog, so the model breaks it alongside them).
fn without_the_watchdog(rules: Rules) -> Rules {
    Rules {
        watchdog_final: false,
        ..rules
    }
}

#[test]
fn a_leader_that_renews_a_session_whose_expiry_it_decided_lets_two_clients_hold_the_lock() {
    let rules = without_the_watchdog(Rules {
        refuse_renewal_while_expiring: false,
        ..Rules::SOUND
    });
    let steps = counterexample(small(rules), ONE_HOLDER);
    let decided = first(&steps, "DecideExpiry");
    let renewed = last(&steps, "request: KeepAlive");
    assert!(
        decided < renewed,
        "the keepalive arrives after the expiry was decided"
    );
}

#[test]
fn an_expiry_decided_in_an_old_term_that_commits_in_a_new_one_ends_a_renewed_lease() {
    let rules = without_the_watchdog(Rules {
        term_check: false,
        ..Rules::SOUND
    });
    let steps = counterexample(small(rules), ONE_HOLDER);
    let decided = first(&steps, "DecideExpiry");
    let changed = first(&steps, "ChangeLeader");
    let committed = first(&steps, "CommitExpiry");
    assert!(decided < changed && changed < committed);
}
