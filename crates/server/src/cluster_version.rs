//! The leader raises the cluster version (`deadbolt_core::FeatureLevel`)
//! once every member supports a higher level.
//!
//! Why the leader asks, as etcd's does (`monitorVersions`): a member's level
//! is a fact about the binary it runs, which only that member knows, and
//! openraft's heartbeats carry no application data. So every
//! [`ASK_EVERY`] the leader asks each member's `Cluster.Status` (learners
//! too: they receive the log as well). When every member answers with a
//! level above the cluster version, and the membership did not change while
//! it asked, it commits `SetClusterVersion` with the lowest of them. A
//! member that does not answer holds the version where it is: it may be an
//! old release, down for its upgrade. `cluster add` checks the other way
//! round: a node below the cluster version is not taken in
//! ([`Node::check_supports_cluster_version`]).
//!
//! Embedded nodes (the simulation) have no addresses to ask: their members
//! are in the same process, hence the same build, and each is taken to
//! support the leader's own level.

use crate::cluster::query_status;
use crate::node::{ApiError, Node};
use crate::raft_types::NodeId;
use deadbolt_core::{FeatureLevel, Proposal};
use deadbolt_proto::v1::ClusterStatusResponse;
use deadbolt_proto::ErrorKind;
use openraft::ServerState;
use std::time::Duration;
use tokio::sync::watch;

/// How often the leader asks its members. etcd asks every 4 s; an upgrade
/// finishes at most this long after its last member restarts.
pub const ASK_EVERY: Duration = Duration::from_secs(2);
/// How long `cluster add` keeps asking a new node that does not answer yet
/// (it may still be starting).
const ADD_ASK_WAIT: Duration = Duration::from_secs(10);

/// What the leader decided from its members' answers.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Raise(FeatureLevel),
    Hold,
}

/// The level every member supports, if it is above `current`. `answers`
/// holds every member but the leader, whose own level is `own`.
fn decide(
    current: FeatureLevel,
    own: FeatureLevel,
    answers: &[(NodeId, Result<FeatureLevel, String>)],
) -> Decision {
    let mut lowest = own;
    for (_, answer) in answers {
        match answer {
            Ok(level) => lowest = lowest.min(*level),
            Err(_) => return Decision::Hold,
        }
    }
    if lowest > current {
        Decision::Raise(lowest)
    } else {
        Decision::Hold
    }
}

/// The level a member's status reports (a member of release 0.1.0 reports
/// none: the base level).
pub fn level_of(status: &ClusterStatusResponse) -> FeatureLevel {
    FeatureLevel::reported(status.versions.as_ref().map_or(0, |v| v.feature_level))
}

/// Asks the members and raises the cluster version, every [`ASK_EVERY`]
/// while this node leads, until `stopped`.
pub(crate) async fn raise_when_supported(node: Node, mut stopped: watch::Receiver<bool>) {
    let mut every = tokio::time::interval(ASK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = node.started_leading.notified() => {}
            _ = stopped.wait_for(|stopped| *stopped) => return,
        }
        if let Err(err) = raise_once(&node).await {
            // Lost the lead or overloaded: the next round asks again.
            tracing::debug!(
                kind = err.kind.as_str(),
                error = err.message,
                "cluster version not raised this round"
            );
        }
    }
}

async fn raise_once(node: &Node) -> Result<(), ApiError> {
    let metrics = node.raft.metrics().borrow().clone();
    if metrics.state != ServerState::Leader {
        return Ok(());
    }
    let current = node.cluster_version();
    if current >= node.feature_level {
        return Ok(());
    }
    let membership = metrics.membership_config.clone();
    let others = membership
        .membership()
        .nodes()
        .filter(|(id, _)| **id != node.id)
        .map(|(id, member)| {
            let (id, address) = (*id, member.addr.clone());
            async move {
                if node.in_process_peers {
                    return (id, Ok(node.feature_level));
                }
                let status = query_status(&address, node.tls.as_deref()).await;
                (id, status.map(|status| level_of(&status)))
            }
        });
    let answers = futures::future::join_all(others).await;
    *node.member_levels.lock().expect("member levels poisoned") = answers.clone();
    let Decision::Raise(level) = decide(current, node.feature_level, &answers) else {
        return Ok(());
    };
    // A member added while the leader asked was not asked.
    if node.raft.metrics().borrow().membership_config.log_id() != membership.log_id() {
        return Ok(());
    }
    let now = node.propose(Proposal::set_cluster_version(level)).await?;
    tracing::info!(
        from = %current,
        to = %now,
        "raised the cluster version: every member supports it"
    );
    Ok(())
}

impl Node {
    /// The cluster version, as this node has applied it.
    pub fn cluster_version(&self) -> FeatureLevel {
        self.table
            .read()
            .expect("state lock poisoned")
            .table
            .cluster_version()
    }

    /// Refuses a call that needs `level` (for `feature`) while the cluster
    /// version is below it, naming the members that hold it back as this
    /// node last heard them. Below the level only a leader decides: a
    /// follower's view of the version may lag, so it answers `not_leader`
    /// and the client asks the leader.
    ///
    /// A node that does not lead must refuse, not let the call through to
    /// a proposal that Raft would refuse: right after an election Raft takes
    /// proposals before this node's leases lead, and a call let through
    /// then put a read/write lock into the log of a cluster at level 1,
    /// which stopped a node rolled back to 0.1.0 (found by the nemesis's
    /// rolling upgrade, `scripts/upgrade-check.sh --seed 1`).
    pub(crate) fn check_cluster_version_allows(
        &self,
        level: FeatureLevel,
        feature: &str,
    ) -> Result<(), ApiError> {
        let current = self.cluster_version();
        if current >= level {
            return Ok(());
        }
        if !self.leases.is_leading() {
            return Err(self.not_leader(&format!(
                "{feature} need cluster version {level}, which this node has not applied; \
                 the leader decides"
            )));
        }
        let mut behind = Vec::new();
        if self.feature_level < level {
            behind.push(format!(
                "node {} (this leader) supports feature level {}",
                self.id, self.feature_level
            ));
        }
        for (id, answer) in self
            .member_levels
            .lock()
            .expect("member levels poisoned")
            .iter()
        {
            match answer {
                Ok(known) if *known >= level => {}
                Ok(known) => behind.push(format!("node {id} supports feature level {known}")),
                Err(err) => behind.push(format!("node {id} did not answer ({err})")),
            }
        }
        let behind = match behind.is_empty() {
            true => "the leader has not heard from every member yet".to_owned(),
            false => behind.join("; "),
        };
        Err(ApiError::new(
            ErrorKind::NeedsUpgrade,
            format!(
                "unavailable until upgraded: {feature} need cluster version {level}, and the \
                 cluster is at {current}: {behind}. Upgrade those members to release {} or \
                 newer; the leader raises the version within {}s of the last one \
                 (docs/upgrading.md)",
                crate::RELEASE,
                ASK_EVERY.as_secs()
            ),
        ))
    }

    /// Refuses to take in node `id` at `address` if it cannot take part at
    /// the cluster version: it could not decode what the log holds. A node
    /// that does not answer within [`ADD_ASK_WAIT`] is refused too, while
    /// the cluster version is above the base level (its release is then
    /// unknown).
    pub(crate) async fn check_supports_cluster_version(
        &self,
        id: NodeId,
        address: &str,
    ) -> Result<(), ApiError> {
        let current = self.cluster_version();
        // An in-process member runs this very build, which supports the
        // cluster version it raised.
        if current == FeatureLevel::BASE || self.in_process_peers {
            return Ok(());
        }
        let give_up = tokio::time::Instant::now() + ADD_ASK_WAIT;
        let status = loop {
            match query_status(address, self.tls.as_deref()).await {
                Ok(status) => break status,
                Err(_) if tokio::time::Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(err) => {
                    return Err(ApiError::new(
                        ErrorKind::Unavailable,
                        format!(
                            "node {id} did not answer ({err}), so its release is unknown: start \
                             it (with --join) before adding it"
                        ),
                    ))
                }
            }
        };
        let level = level_of(&status);
        if level < current {
            let release = status
                .versions
                .map_or_else(|| "older than 0.1.0".to_owned(), |v| v.release);
            return Err(ApiError::new(
                ErrorKind::NeedsUpgrade,
                format!(
                    "node {id} runs release {release}, which supports feature level {level}, \
                     below the cluster version {current}: it could not decode this cluster's \
                     log. Upgrade it to release {} or newer (docs/upgrading.md)",
                    crate::RELEASE
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: FeatureLevel = FeatureLevel::BASE;
    const TWO: FeatureLevel = FeatureLevel::CLUSTER_VERSION;

    #[test]
    fn the_version_moves_only_when_every_member_answers_with_a_higher_level() {
        assert_eq!(decide(ONE, TWO, &[]), Decision::Raise(TWO), "a single node");
        assert_eq!(
            decide(ONE, TWO, &[(2, Ok(TWO)), (3, Ok(TWO))]),
            Decision::Raise(TWO)
        );
        assert_eq!(
            decide(ONE, TWO, &[(2, Ok(TWO)), (3, Ok(ONE))]),
            Decision::Hold,
            "node 3 still runs the old release"
        );
        assert_eq!(
            decide(ONE, TWO, &[(2, Ok(TWO)), (3, Err("refused".into()))]),
            Decision::Hold,
            "node 3 is down, maybe for its upgrade"
        );
        assert_eq!(
            decide(ONE, ONE, &[(2, Ok(TWO))]),
            Decision::Hold,
            "the leader itself is held back"
        );
        assert_eq!(
            decide(TWO, TWO, &[(2, Ok(TWO))]),
            Decision::Hold,
            "already there"
        );
    }

    #[test]
    fn a_member_that_reports_no_level_is_at_the_base_level() {
        let old = ClusterStatusResponse::default();
        assert_eq!(level_of(&old), FeatureLevel::BASE);
        let new = ClusterStatusResponse {
            versions: Some(crate::version::build_versions()),
            ..Default::default()
        };
        assert_eq!(level_of(&new), FeatureLevel::NEWEST);
    }
}
