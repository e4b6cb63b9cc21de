//! A leader's wall clock that jumps (issue 31 §3). The token counter rises
//! to each log entry's wall clock (docs/safety.md, rule 1), so a clock
//! decades ahead raises every later token for good: these tests show how
//! far it can take them, and that a clock that jumps back changes nothing.

use crate::common::{acquire, open_session, Cluster};
use deadbolt_core::LATEST_TOKEN_FLOOR_MS;
use std::time::Duration;

/// 3000-01-01 and 1990-01-01, in milliseconds since 1970.
const YEAR_3000_MS: u64 = 32_503_680_000_000;
const YEAR_1990_MS: u64 = 631_152_000_000;

/// The largest integer every JSON reader keeps exact (JavaScript's
/// `Number.MAX_SAFE_INTEGER`).
const JSON_SAFE: u64 = (1 << 53) - 1;

/// A grant of `lock` to a new session on the single node's leader.
async fn grant(cluster: &Cluster, lock: &str) -> u64 {
    let leader = cluster.leader().await;
    let api = cluster.api(leader);
    let session = open_session(&api, Duration::from_secs(10)).await;
    acquire(&api, &session, lock, false, 1)
        .await
        .expect("granted")
}

#[tokio::test(start_paused = true)]
async fn a_leader_clock_centuries_ahead_then_back_keeps_tokens_rising_and_json_safe() {
    let mut cluster = Cluster::form(1).await;
    let before = grant(&cluster, "before").await;

    // The clock jumps to the year 3000: tokens rise to the floor of the
    // year 2200 and no further (unbounded, to 3.25 × 10^16, past 2^53).
    cluster.set_wall_clock(1, YEAR_3000_MS);
    cluster.restart(1).await;
    let ahead = grant(&cluster, "ahead").await;
    assert!(ahead > before);
    let latest_floor = LATEST_TOKEN_FLOOR_MS * 1_000;
    assert!(
        (latest_floor..latest_floor + 1_000).contains(&ahead),
        "a clock in the year 3000 raised the token to {ahead}, not to the year 2200's floor \
         {latest_floor}"
    );
    assert!(ahead <= JSON_SAFE);

    // And back, to 1990: the counter does not follow it down.
    cluster.set_wall_clock(1, YEAR_1990_MS);
    cluster.restart(1).await;
    let back = grant(&cluster, "back").await;
    assert!(back > ahead, "token {back} after {ahead}");
    assert!(back <= JSON_SAFE);
}
