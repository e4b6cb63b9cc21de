//! `deadbolt-nemesis run --backend KIND --fault FAULT [--unfenced]`: the
//! same workers, resource and checker as the Deadbolt runs, against any
//! lock service `deadbolt-backends` speaks, to measure the seeds' table
//! (docs/backends.md): how many double grants, stale writes and lost writes
//! each fault causes on each backend, with the resource checking tokens and
//! without.
//!
//! The run starts the service (servers.rs), the resource (fenced, or
//! `--unfenced`), and workers locking through `deadbolt-backends`; injects
//! one kind of fault over and over for `--duration`; lets the workers run on
//! for a few seconds; then checks the history with the shared checker and
//! tallies it (tally.rs). The last line printed is
//! `backend=… fault=… fencing=on|off grants=N … violations=N`, and the exit
//! code is 0 only without violations (a measurement run that shows what an
//! unfenced resource suffers exits 1, by design).

use crate::checker::{check_scoped, Finals, TokenScope, Violation};
use crate::harness::{
    holding_clients, pause_client, spawn_worker, stop_workers, write_history, Resource, RunArgs,
    Setup,
};
use crate::history::{now, Line, Op, Phase, Record};
use crate::servers::{Fault, Kind, Options, Servers};
use crate::tally::tally;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the workers run on after the faults stop.
const RUN_ON: Duration = Duration::from_secs(5);
/// Violations printed in full; the rest are counted.
const SHOWN_VIOLATIONS: usize = 10;

pub async fn main(args: RunArgs) -> anyhow::Result<bool> {
    let Setup {
        me,
        deadbolt,
        scratch,
        out,
    } = Setup::new(&args)?;
    let (me, deadbolt, out) = (me.as_path(), deadbolt.as_path(), out.as_path());
    let args = &args;
    let backend = &args.backend;
    let kind = backend.backend.expect("called with --backend");
    anyhow::ensure!(
        backend.unfenced || !matches!(kind, Kind::Redis | Kind::Redlock),
        "{kind:?} issues no token, so there is nothing to fence with: run it with --unfenced \
         (or use redis-counter for Redis's counter)"
    );
    anyhow::ensure!(
        (1..=64).contains(&args.clients) && (1..=16).contains(&args.locks),
        "--clients must be 1 to 64 and --locks 1 to 16"
    );
    let options = Options {
        kind,
        fault: backend.fault,
        aof: backend.aof,
        masters: backend.masters,
        lag: backend.lag,
        ttl: args.ttl,
        postgres_url: backend.postgres_url.clone(),
        no_idle_timeout: backend.no_idle_timeout,
        sentinel: backend.sentinel,
        deadbolt,
        dir: out,
    };
    let (mut servers, url) = Servers::start(&options).await?;
    let fencing = if backend.unfenced { "off" } else { "on" };
    println!(
        "nemesis: {kind:?} at {url}, fault {:?}, fencing {fencing}, seed {}, {} clients, {} locks, TTL {:?}, faults for {}",
        backend.fault,
        args.seed,
        args.clients,
        args.locks,
        args.ttl,
        humantime::format_duration(args.duration)
    );

    let locks: Vec<String> = (0..args.locks).map(|i| format!("lock-{i}")).collect();
    let resource = Resource::start(me, out, backend.unfenced).await?;
    let history = Arc::new(Mutex::new(Vec::<Record>::new()));
    let extra = Arc::new(Mutex::new(Vec::<Line>::new()));
    let mut connect = vec![
        "--backend".to_owned(),
        url.clone(),
        "--hold".to_owned(),
        humantime::format_duration(backend.hold).to_string(),
    ];
    if backend.unfenced {
        connect.push("--unfenced".to_owned());
    }
    let mut workers = Vec::new();
    for id in 0..args.clients {
        workers.push(spawn_worker(
            me,
            id,
            &connect,
            &locks,
            resource.address,
            args,
            history.clone(),
            Some(extra.clone()),
        )?);
    }

    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut faults = 0u64;
    while started.elapsed() < args.duration {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1200))).await;
        faults += 1;
        let fault = if backend.fault == Fault::Pause {
            let holding = mid_write(&history).await;
            pause_client(&mut workers, &holding, &mut rng, args.ttl)
                .await
                .0
        } else {
            servers.inject(&options, &mut rng).await?
        };
        println!("[{:>5.1}s] {fault}", started.elapsed().as_secs_f64());
    }
    let healed_at = now();
    println!(
        "[{:>5.1}s] faults stopped; clients run on for {}s",
        started.elapsed().as_secs_f64(),
        RUN_ON.as_secs()
    );
    tokio::time::sleep(RUN_ON).await;
    stop_workers(&mut workers).await;

    let finals = Finals {
        store: BTreeMap::new(),
        resource: resource.finals(&locks).await?,
        audit: BTreeMap::new(),
        semaphores: BTreeMap::new(),
    };
    let accepted = resource.stop()?;
    drop(servers);
    let mut history = std::mem::take(&mut *history.lock().expect("poisoned"));
    history.sort_by_key(|r| r.at);
    let extra = std::mem::take(&mut *extra.lock().expect("poisoned"));
    write_history(&out.join("history.jsonl"), &history)?;
    write_lines(&out.join("held-and-writes.jsonl"), &extra)?;
    let (mut held, mut writes) = (Vec::new(), Vec::new());
    for line in extra {
        match line {
            Line::Held { held: interval } => held.push(interval),
            Line::Write { write } => writes.push(write),
            // The backends' own errors are not judged for availability:
            // some of them fail calls by design during a failover.
            Line::ClientError { .. } | Line::Record(_) => {}
        }
    }

    // Liveness is not judged here (there is no Deadbolt store to read):
    // some of these services do not recover by design.
    let counts = tally(&history, &held, &writes, &finals.resource);
    // Redis's counter is one per lock; the other tokens are global.
    let scope = if kind == Kind::RedisCounter {
        TokenScope::PerLock
    } else {
        TokenScope::Global
    };
    let mut violations = check_scoped(&history, &accepted, &finals, healed_at, 0, scope);
    // What the shared checker cannot see without the service's own trail
    // (and, unfenced, without tokens at the resource): the tally's counts.
    if counts.double_grants > 0 {
        violations.push(Violation {
            what: format!(
                "{} grants came while another client's lease of the lock had not ended (held-and-writes.jsonl)",
                counts.double_grants
            ),
            records: Vec::new(),
        });
    }
    if counts.stale_writes > 0 {
        violations.push(Violation {
            what: format!(
                "the resource accepted {} writes from holders whose lock a newer holder had already used",
                counts.stale_writes
            ),
            records: Vec::new(),
        });
    }
    for violation in violations.iter().take(SHOWN_VIOLATIONS) {
        print!("{violation}");
    }
    if violations.len() > SHOWN_VIOLATIONS {
        println!(
            "... and {} more violations",
            violations.len() - SHOWN_VIOLATIONS
        );
    }
    let ops = history.iter().filter(|r| r.phase != Phase::Invoke).count();
    println!(
        "final counters: resource {:?}; {ops} operations",
        finals.resource
    );
    if !violations.is_empty() && args.out.is_none() {
        let kept: PathBuf = scratch.keep();
        println!("history and logs kept in {}", kept.display());
    }
    let persistence = match (backend.aof, backend.no_idle_timeout) {
        (true, _) => " aof=always",
        (_, true) => " idle_session_timeout=off",
        _ => "",
    };
    let lag = if backend.sentinel {
        " sentinel".to_owned()
    } else if backend.lag.is_zero() {
        String::new()
    } else {
        format!(" lag={}", humantime::format_duration(backend.lag))
    };
    println!(
        "backend={} fault={}{persistence}{lag} fencing={fencing} faults={faults} {counts} violations={}",
        kind_name(kind),
        fault_name(backend.fault),
        violations.len()
    );
    Ok(violations.is_empty())
}

/// Clients in the middle of a read-modify-write (their last record is an
/// increment's invocation), waited for up to a second; else the clients
/// holding a lock. A pause there is the one that makes a late write.
async fn mid_write(history: &Mutex<Vec<Record>>) -> Vec<usize> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let writing: Vec<usize> = {
            let history = history.lock().expect("poisoned");
            let mut last = BTreeMap::new();
            for record in history.iter().rev().take(1000) {
                last.entry(record.client).or_insert(record);
            }
            last.into_iter()
                .filter(|(_, r)| r.op == Op::ResourceIncrement && r.phase == Phase::Invoke)
                .map(|(client, _)| client)
                .collect()
        };
        if !writing.is_empty() {
            return writing;
        }
        if Instant::now() >= deadline {
            return holding_clients(&history.lock().expect("poisoned"));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn kind_name(kind: Kind) -> String {
    clap::ValueEnum::to_possible_value(&kind)
        .map(|value| value.get_name().to_owned())
        .unwrap_or_default()
}

fn fault_name(fault: Fault) -> String {
    clap::ValueEnum::to_possible_value(&fault)
        .map(|value| value.get_name().to_owned())
        .unwrap_or_default()
}

fn write_lines(path: &Path, lines: &[Line]) -> anyhow::Result<()> {
    let lines: Vec<String> = lines
        .iter()
        .map(|h| serde_json::to_string(h).expect("serializable"))
        .collect();
    std::fs::write(path, lines.join("\n") + "\n")?;
    Ok(())
}
