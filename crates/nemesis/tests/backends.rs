//! `deadbolt-nemesis run --backend`, short, against a real etcd: clients
//! paused past their lease write late; the resource must see those writes
//! land when it ignores tokens, and refuse every one of them when it checks
//! etcd's fencing token. The long runs behind docs/backends.md's table are
//! the same command with other backends and faults.
//!
//! Both runs go at once (about 30 s together); etcd comes from PATH or
//! `DEADBOLT_ETCD` (scripts/backends.sh), and its absence skips the test
//! unless `DEADBOLT_REQUIRE_BACKENDS=1`.

use std::collections::HashMap;
use std::process::{Command, Output};

const NEMESIS: &str = env!("CARGO_BIN_EXE_deadbolt-nemesis");

fn run(extra: &[&str]) -> std::process::Child {
    Command::new(NEMESIS)
        .args(["run", "--backend", "etcd", "--fault", "pause"])
        // etcd grants at least 2 s; pauses last 3 to 6 s.
        .args(["--ttl", "2s", "--duration", "15s", "--seed", "7"])
        // Each holder works 100 ms between its read and its write: the
        // window a pause lands in (with the default 5 ms, a pause often
        // came a moment after the write, and no write was late).
        .args(["--clients", "4", "--locks", "1", "--hold", "100ms"])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start deadbolt-nemesis")
}

/// The summary line's `key=value` pairs, and the whole output for messages.
fn summary(output: &Output) -> (HashMap<String, String>, String) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let last = text
        .lines()
        .rfind(|line| line.starts_with("backend="))
        .unwrap_or_else(|| panic!("no summary line in:\n{text}"));
    println!("{last}");
    let pairs = last
        .split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
    (pairs, text)
}

fn count(pairs: &HashMap<String, String>, key: &str) -> u64 {
    pairs
        .get(key)
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no number {key} in {pairs:?}"))
}

#[test]
fn paused_etcd_holders_write_late_unless_the_resource_checks_the_revision() {
    // Only to learn whether etcd is there (skips, or fails under
    // DEADBOLT_REQUIRE_BACKENDS=1, if not).
    if deadbolt_testkit::peers::etcd().is_none() {
        return;
    }
    let unfenced = run(&["--unfenced"]);
    let fenced = run(&[]);
    let (unfenced, fenced) = (
        unfenced.wait_with_output().unwrap(),
        fenced.wait_with_output().unwrap(),
    );

    let (pairs, text) = summary(&unfenced);
    assert!(count(&pairs, "grants") >= 10, "too few grants:\n{text}");
    assert!(
        count(&pairs, "stale_writes") >= 1,
        "no late write landed on the unfenced resource:\n{text}"
    );
    assert!(count(&pairs, "violations") >= 1, "{text}");
    assert_eq!(unfenced.status.code(), Some(1), "{text}");

    let (pairs, text) = summary(&fenced);
    assert!(count(&pairs, "grants") >= 10, "too few grants:\n{text}");
    assert!(
        count(&pairs, "stale_refused") >= 1,
        "no late write reached the fenced resource to be refused:\n{text}"
    );
    for key in [
        "stale_writes",
        "lost_writes",
        "double_grants",
        "repeated_tokens",
        "violations",
    ] {
        assert_eq!(count(&pairs, key), 0, "{key}:\n{text}");
    }
    assert_eq!(fenced.status.code(), Some(0), "{text}");
}
