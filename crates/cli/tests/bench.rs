//! `deadbolt bench` against a real server: the loop workloads run, share
//! connections when asked, say what each operation cost the server, and
//! leave nothing held behind.

mod common;

use common::{deadbolt, TestServer};

fn bench(endpoint: &str, workload: &str, connections: &str) -> String {
    let output = deadbolt(
        endpoint,
        &[
            "bench",
            workload,
            "--clients",
            "4",
            "--connections",
            connections,
            "--duration",
            "1s",
            "--warmup",
            "200ms",
        ],
    );
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// The first number after `: ` on the summary line, e.g. `1234 grants/s`.
fn rate(report: &str) -> f64 {
    let summary = report.lines().next().unwrap();
    let (_, figures) = summary.rsplit_once(": ").unwrap();
    figures.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn loop_workloads_report_rates_and_check_their_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();

    let uncontended = bench(&endpoint, "uncontended", "2");
    assert!(
        uncontended.starts_with("uncontended: 4 clients over 2 connections,"),
        "{uncontended}"
    );
    assert!(rate(&uncontended) > 0.0, "{uncontended}");
    assert!(
        uncontended.contains("tokens strictly increasing per client: yes"),
        "{uncontended}"
    );
    // What each pair cost the server, from its process_cpu_seconds_total:
    // some, and no more than every core of this machine for the run.
    let cpu_line = uncontended
        .lines()
        .find(|line| line.trim_start().starts_with("server CPU: "))
        .unwrap_or_else(|| panic!("no server CPU line: {uncontended}"));
    let per_pair: f64 = cpu_line
        .trim_start()
        .trim_start_matches("server CPU: ")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let pairs = rate(&uncontended);
    let cores = std::thread::available_parallelism().unwrap().get() as f64;
    assert!(
        per_pair > 0.0 && per_pair * pairs <= cores * 1e6 * 1.05,
        "{per_pair} µs per pair at {pairs} pairs/s: {cpu_line}"
    );

    let contended = bench(&endpoint, "contended", "1");
    assert!(
        contended.starts_with("contended: 4 clients over 1 connection,"),
        "{contended}"
    );
    assert!(rate(&contended) > 0.0, "{contended}");
    // Strict FIFO: every client gets its turn.
    assert!(!contended.contains("min 0 "), "{contended}");

    // Every bench session was closed: no lock is left held or waited on.
    let locks = deadbolt(&endpoint, &["locks"]);
    assert!(locks.status.success(), "{locks:?}");
    let listed = String::from_utf8(locks.stdout).unwrap();
    assert!(!listed.contains("bench:"), "{listed}");
}
