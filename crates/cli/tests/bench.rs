//! `deadbolt bench` against a real server: the loop workloads run, share
//! connections when asked, and leave nothing held behind.

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
