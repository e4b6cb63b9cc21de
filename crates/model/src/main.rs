//! `deadbolt-model`: check the lock protocol's model for the bounds given,
//! with every rule kept or one of them broken, and print the states
//! explored and any counterexample (docs/safety.md, "Model checking").

use clap::{Parser, ValueEnum};
use deadbolt_model::{LockModel, Primitive, Rules};
use stateright::{Checker, HasDiscoveries, Model};
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Model-check the lock protocol exhaustively for small bounds")]
struct Args {
    /// Clients contending for the lock.
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// The session TTL in ticks; the leader's clock may end a lease one
    /// tick early, and the client's margin is one tick.
    #[arg(long, default_value_t = 2)]
    ttl: u64,
    /// Ticks of time explored.
    #[arg(long, default_value_t = 1)]
    ticks: u64,
    /// Leader changes.
    #[arg(long, default_value_t = 1)]
    leader_changes: u64,
    /// Sessions the clients may open in all.
    #[arg(long, default_value_t = 2)]
    opens: u64,
    /// Acquires the clients may send in all.
    #[arg(long, default_value_t = 2)]
    acquires: u64,
    /// Break a rule (repeat to break several), and stop at the first
    /// counterexample.
    #[arg(long = "break", value_enum)]
    broken: Vec<Broken>,
    /// The clients' acquires wait in the lock's queue (blocking acquires,
    /// and the FIFO property with them: take 3 clients).
    #[arg(long)]
    blocking: bool,
    /// What the clients contend for.
    #[arg(long, value_enum, default_value = "lock")]
    primitive: Kind,
    /// The lock-delay the clients ask for, in ticks (0: none, the
    /// client's default).
    #[arg(long, default_value_t = 0)]
    lock_delay: u64,
    /// Search depth first (less memory, longer traces) instead of breadth first.
    #[arg(long)]
    dfs: bool,
    /// Stop after this many states (a partial check: say so when quoting it).
    #[arg(long)]
    max_states: Option<usize>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Kind {
    Lock,
    RwLock,
    Semaphore,
    Election,
}

#[derive(Clone, Copy, ValueEnum)]
enum Broken {
    DriftMargin,
    Checkpoint,
    TermCheck,
    Renewal,
    Fence,
    Claim,
    /// The client's watchdog (with it, the server's renewal and term
    /// checks are defence in depth: break one of them as well).
    Watchdog,
    /// A new leader times lock-delays afresh.
    LockDelay,
}

impl Broken {
    fn apply(self, sound: Rules) -> Rules {
        match self {
            Broken::DriftMargin => Rules {
                client_margin: 0,
                ..sound
            },
            Broken::Checkpoint => Rules {
                checkpoint_rule: false,
                ..sound
            },
            Broken::TermCheck => Rules {
                term_check: false,
                ..sound
            },
            Broken::Renewal => Rules {
                refuse_renewal_while_expiring: false,
                ..sound
            },
            Broken::Fence => Rules {
                fence: false,
                ..sound
            },
            Broken::Claim => Rules {
                claim_until_released: false,
                ..sound
            },
            Broken::Watchdog => Rules {
                watchdog_final: false,
                ..sound
            },
            Broken::LockDelay => Rules {
                rearm_lock_delays: false,
                ..sound
            },
        }
    }
}

fn main() {
    let args = Args::parse();
    let model = LockModel {
        clients: args.clients,
        ttl: args.ttl,
        max_time: args.ticks,
        leader_changes: args.leader_changes,
        max_opens: args.opens,
        max_acquires: args.acquires,
        blocking: args.blocking,
        primitive: match args.primitive {
            Kind::Lock => Primitive::Lock,
            Kind::RwLock => Primitive::RwLock,
            Kind::Semaphore => Primitive::Semaphore,
            Kind::Election => Primitive::Election,
        },
        lock_delay: args.lock_delay,
        rules: args
            .broken
            .iter()
            .fold(Rules::SOUND, |rules, broken| broken.apply(rules)),
    };
    let mut checker = model.clone().checker();
    if !args.broken.is_empty() {
        checker = checker.finish_when(HasDiscoveries::AnyFailures);
    }
    if let Some(limit) = args.max_states {
        checker = checker.target_state_count(limit);
    }
    let started = Instant::now();
    let violated = if args.dfs {
        report(&model, checker.spawn_dfs().join(), started)
    } else {
        report(&model, checker.spawn_bfs().join(), started)
    };
    if violated {
        std::process::exit(1);
    }
}

/// Prints what the check explored and its counterexamples; true if any.
fn report(model: &LockModel, checked: impl Checker<LockModel>, started: Instant) -> bool {
    println!(
        "states={} unique={} depth={} in {:.1?}",
        checked.state_count(),
        checked.unique_state_count(),
        checked.max_depth(),
        started.elapsed()
    );
    let mut violated = false;
    for (name, path) in checked.discoveries() {
        violated = true;
        println!("VIOLATION: {name}");
        for step in model.explain(path) {
            println!("{step}");
        }
    }
    if !violated {
        println!("every property holds for these bounds");
    }
    violated
}
