//! A mass expiry on tokio's paused clock against an embedded node.
//!
//! Why: the leader used to spawn one task per session whose lease ran out
//! (and per checkpoint, and per lock-delay ending), so 100,000 sessions
//! expiring together were 100,000 tasks at once. A sweep is one task now,
//! with a bounded number of proposals in flight. Only the runtime's own
//! count of live tasks shows the difference, only the paused clock makes
//! every lease run out in the same instant, and replication held back
//! keeps the expiries uncommitted (their tasks alive) long enough to count.

use crate::common;

use common::{open_session, Cluster};
use std::time::Duration;

const SESSIONS: usize = 2_000;
const TTL: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn two_thousand_leases_ending_together_are_one_sweep_not_two_thousand_tasks() {
    let cluster = Cluster::form(3).await;
    let leader = cluster.leader().await;
    let api = cluster.api(leader);
    let opens = (0..SESSIONS).map(|_| open_session(&api, TTL));
    futures::future::join_all(opens).await;
    assert_eq!(api.health().sessions, SESSIONS as u64);

    let runtime = tokio::runtime::Handle::current().metrics();
    let before = runtime.num_alive_tasks();
    let held_until = tokio::time::Instant::now() + TTL * 2;
    cluster.net.hold_replication(leader, held_until);
    let mut most = before;
    let deadline = tokio::time::Instant::now() + TTL * 4;
    while api.health().sessions > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} sessions outlived their leases by three TTLs",
            api.health().sessions
        );
        most = most.max(runtime.num_alive_tasks());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // One sweep task (two if the sweep straddles a tick), not one per lease.
    assert!(
        most - before < 16,
        "{} tasks alive while {SESSIONS} leases ended (before: {before})",
        most
    );
}
