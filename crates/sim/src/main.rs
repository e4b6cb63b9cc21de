//! `deadbolt-sim`: runs seeds of the deterministic simulation and reports
//! every violation with the seed that reproduces it.

use clap::Parser;
use deadbolt_sim::{simulate, SeedReport, SimOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "deadbolt-sim",
    version,
    about = "Deterministic simulation of a Deadbolt cluster under faults, seed by seed",
    after_help = "Examples:\n  \
        deadbolt-sim --seeds 1000                 # seeds 0..999 on every core\n  \
        deadbolt-sim --seed 4242 --verbose        # replay one seed: faults and history\n\n\
        Exit status: 0 if no seed found a violation, 1 otherwise."
)]
struct Cli {
    /// How many seeds to run, starting at --first.
    #[arg(long, default_value_t = 100, conflicts_with = "seed")]
    seeds: u64,
    /// The first seed of the range.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Run just this seed (twice, to check that it replays exactly).
    #[arg(long)]
    seed: Option<u64>,
    /// Simulated time of faults per seed.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    fault_time: Duration,
    /// Threads running seeds side by side (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Print the fault log and the history of every failing seed (with
    /// --seed: of that seed).
    #[arg(long)]
    verbose: bool,
    /// Also run every Nth seed of the range a second time, and count a
    /// digest that differs as a violation: a failing seed must replay (0:
    /// never).
    #[arg(long, default_value_t = 0, conflicts_with = "seed")]
    replay_every: u64,
    /// Remove the resource's fence, to see the checker catch stale writes.
    #[arg(long, hide = true)]
    unfenced: bool,
    /// Leave out the clients that run the real client crate, so that a
    /// seed found before they joined the runs (2026-12-05) replays as it
    /// ran then, unless a node paused in it.
    #[arg(long)]
    without_real_clients: bool,
}

/// Log lines carry the simulated time.
struct SimulatedTime;

impl tracing_subscriber::fmt::time::FormatTime for SimulatedTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write!(w, "{:>9.3}s", deadbolt_sim::elapsed().as_secs_f64())
    }
}

fn print_report(report: &SeedReport, verbose: bool) {
    println!(
        "seed {}: nodes={} clients={} ops={} faults={} violations={} simulated={:.1}s digest={:016x}",
        report.seed,
        report.nodes,
        report.clients,
        report.ops,
        report.faults,
        report.violations.len(),
        report.simulated.as_secs_f64(),
        report.digest
    );
    for violation in &report.violations {
        print!("{violation}");
    }
    let mut availability = Availability::default();
    availability.add(report);
    availability.print();
    if verbose || !report.violations.is_empty() {
        for line in &report.fault_log {
            println!("  fault {line}");
        }
    }
    if verbose {
        for record in &report.history {
            println!("  {}", serde_json::to_string(record).expect("serializable"));
        }
    }
    if !report.violations.is_empty() {
        println!("  reproduce: deadbolt-sim --seed {} --verbose", report.seed);
    }
}

/// The real clients' availability over the seeds run (issue 59): errors
/// that did not count, and each node fault's longest time without a grant.
#[derive(Default)]
struct Availability {
    excused: usize,
    lease_lost: usize,
    outcome_unknown: usize,
    gaps_ms: Vec<u64>,
}

impl Availability {
    fn add(&mut self, report: &SeedReport) {
        let served = &report.served;
        self.excused += served.excused;
        self.lease_lost += served.lease_lost;
        self.outcome_unknown += served.outcome_unknown;
        self.gaps_ms
            .extend(served.gaps.iter().map(|(_, gap)| gap / 1_000_000));
    }

    fn print(&mut self) {
        self.gaps_ms.sort_unstable();
        let median = self.gaps_ms.get(self.gaps_ms.len() / 2).copied();
        println!(
            "  availability: errors a fault excused {}, on leases a fault outlasted {}, changes \
             left of unknown outcome {} (outages while a majority was up are violations); after \
             each of {} faults that left a majority, the longest time without a grant: median \
             {} ms, max {} ms",
            self.excused,
            self.lease_lost,
            self.outcome_unknown,
            self.gaps_ms.len(),
            median.unwrap_or(0),
            self.gaps_ms.last().copied().unwrap_or(0)
        );
    }
}

fn main() {
    let cli = Cli::parse();
    // Off unless asked for: a seed's log runs to megabytes.
    if let Ok(filter) = std::env::var("DEADBOLT_SIM_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_timer(SimulatedTime)
            .with_writer(std::io::stderr)
            .init();
    }
    let options = SimOptions {
        fault_time: cli.fault_time,
        fenced_resource: !cli.unfenced,
        real_clients: !cli.without_real_clients,
        overtrust: Duration::ZERO,
    };
    if let Some(seed) = cli.seed {
        let first = simulate(seed, &options);
        print_report(&first, cli.verbose);
        let again = simulate(seed, &options);
        let replayed = again.digest == first.digest;
        println!(
            "replay: digest {:016x} ({})",
            again.digest,
            if replayed {
                "identical"
            } else {
                "DIFFERENT: the run is not deterministic"
            }
        );
        let failed = !first.violations.is_empty() || !replayed;
        println!(
            "seeds=1 ops={} faults={} violations={}",
            first.ops,
            first.faults,
            first.violations.len() + usize::from(!replayed)
        );
        std::process::exit(i32::from(failed));
    }

    let threads = cli
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let next = Arc::new(AtomicU64::new(cli.first));
    let end = cli.first + cli.seeds;
    let totals = Arc::new(Mutex::new((0u64, 0usize, 0u64, 0usize, 0u64)));
    let availability = Arc::new(Mutex::new(Availability::default()));
    let replayed = Arc::new(AtomicU64::new(0));
    let replay_every = cli.replay_every;
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (next, totals, options) = (next.clone(), totals.clone(), options.clone());
            let availability = availability.clone();
            let replayed = replayed.clone();
            let verbose = cli.verbose;
            std::thread::spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    return;
                }
                let report = simulate(seed, &options);
                let same_again = (replay_every > 0 && seed % replay_every == 0).then(|| {
                    replayed.fetch_add(1, Ordering::Relaxed);
                    let again = simulate(seed, &options);
                    if again.digest != report.digest {
                        println!(
                            "seed {seed}: DIFFERENT: digest {:016x}, then {:016x}: the run is not \
                             deterministic (replay: deadbolt-sim --seed {seed} --verbose)",
                            report.digest, again.digest
                        );
                    }
                    again.digest == report.digest
                });
                availability
                    .lock()
                    .expect("availability poisoned")
                    .add(&report);
                let mut totals = totals.lock().expect("totals poisoned");
                totals.3 += usize::from(same_again == Some(false));
                totals.0 += 1;
                totals.1 += report.ops;
                totals.2 += report.faults;
                totals.3 += report.violations.len();
                totals.4 += u64::from(report.leases_checked);
                if !report.violations.is_empty() {
                    print_report(&report, verbose);
                }
                if totals.0 % 50 == 0 {
                    eprintln!(
                        "... {} seeds in {:.0?}, {} violations so far",
                        totals.0,
                        started.elapsed(),
                        totals.3
                    );
                }
            })
        })
        .collect();
    for worker in workers {
        if worker.join().is_err() {
            // A panic inside a seed is a finding too; its message is above.
            totals.lock().unwrap_or_else(|p| p.into_inner()).3 += 1;
        }
    }
    let (seeds, ops, faults, violations, leases_checked) =
        *totals.lock().unwrap_or_else(|p| p.into_inner());
    eprintln!(
        "ran {seeds} seeds in {:.1?}; lease timing checked in {leases_checked} (the others had a clock fault); {} replayed a second time",
        started.elapsed(),
        replayed.load(Ordering::Relaxed)
    );
    availability
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .print();
    println!("seeds={seeds} ops={ops} faults={faults} violations={violations}");
    std::process::exit(i32::from(violations > 0));
}
