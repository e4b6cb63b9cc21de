//! A planned stop of the leader: leadership handed to an up-to-date
//! follower before the process exits.
//!
//! Why: openraft 0.9 has no leadership transfer. A leader that just stops
//! leaves its followers to wait out its leader lease (`election_timeout_max`)
//! plus an election timeout before one stands for election: half a second
//! or more with no leader. Instead, on SIGTERM the leader waits for a voter
//! whose log matches its own and asks it to stand at once (Raft's
//! `TimeoutNow`, `network::ask_to_stand`). The candidate needs one vote
//! besides its own, and the stopping leader grants it: openraft refuses
//! votes while the vote it holds is younger than the leader lease, but a
//! leader's vote dates from its election, so one that has led longer than
//! the lease votes (`Engine::handle_vote_req`). The other followers refuse
//! until their own lease runs out, which this does not need.
//!
//! The handover only ever saves time. Whatever goes wrong (no follower
//! catches up in time, a 0.1.0 peer that does not know the call, a log
//! that grew between the check and the vote, a leader elected less than a
//! lease ago) leaves the election to the timeouts, as after a crash. Raft's
//! vote rules decide who leads either way. Writes the stopping leader has
//! appended are committed by the new leader, and the stopping node, still
//! running Raft until it has drained its connections, answers their
//! callers.

use crate::network::ask_to_stand;
use crate::node::Node;
use crate::raft_types::NodeId;
use openraft::{RaftMetrics, ServerState};
use std::time::Duration;
use tokio::time::Instant;

/// How long a stopping leader tries to hand over before it leaves the
/// election to the timeouts. A follower that is not caught up within this
/// is behind by more than a planned stop should wait for.
const HANDOVER_WAIT: Duration = Duration::from_secs(1);
/// How long the chosen follower has to answer the request to stand.
const ASK_WAIT: Duration = Duration::from_millis(300);

/// What a stopping node's handover came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Handover {
    /// Not the leader of a cluster with other voters: nothing to hand over.
    NotLeading,
    /// `to` leads, `after` the handover began.
    Done { to: NodeId, after: Duration },
    /// Why not; the followers elect a leader after their timeouts.
    Failed(String),
}

impl Handover {
    /// Says in the log what came of it.
    pub fn report(self) {
        match self {
            Handover::NotLeading => {}
            Handover::Done { to, after } => {
                tracing::info!(leader = to, ?after, "handed leadership over")
            }
            Handover::Failed(reason) => tracing::warn!(
                "could not hand leadership over ({reason}); the followers elect a leader after \
                 their election timeout"
            ),
        }
    }
}

/// Hands leadership over if this node leads, waiting at most
/// [`HANDOVER_WAIT`] once new proposals are held (holding them first waits
/// for the batches already sent to reach the log, which the proposer's
/// commit wait bounds). Proposals are held meanwhile, so that the
/// log the chosen follower has caught up with is still the whole log when
/// this node grants it its vote; once another node leads, they are refused
/// with its address (nothing was appended), and their callers go there.
pub async fn hand_over(node: &Node) -> Handover {
    let started = Instant::now();
    let deadline = started + HANDOVER_WAIT;
    if node.raft.metrics().borrow().state != ServerState::Leader {
        return Handover::NotLeading;
    }
    let _held = node.proposer.hold().await;
    let mut metrics = node.raft.metrics();
    // The voter to ask, once its log matches this leader's.
    let (target, address, vote) = loop {
        {
            let now = metrics.borrow_and_update();
            if now.state != ServerState::Leader {
                return Handover::NotLeading;
            }
            let voters = now.membership_config.membership().voter_ids().count();
            if voters < 2 {
                return Handover::NotLeading;
            }
            if let Some((target, address)) = up_to_date_voter(&now) {
                break (target, address, now.vote);
            }
        }
        if !matches!(
            tokio::time::timeout_at(deadline, metrics.changed()).await,
            Ok(Ok(()))
        ) {
            return Handover::Failed(format!(
                "no other voter's log caught up with this leader's within {HANDOVER_WAIT:?}"
            ));
        }
    };
    let asked = ask_to_stand(
        &address,
        node.tls.as_deref(),
        node.peer_secrets.as_deref(),
        &vote,
        ASK_WAIT,
    )
    .await;
    if let Err(reason) = asked {
        return Handover::Failed(format!(
            "node {target} did not stand for election: {reason}"
        ));
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    let led_by_another = node
        .raft
        .wait(Some(remaining))
        .metrics(
            |now| now.current_leader.is_some_and(|leader| leader != node.id),
            "another node leads",
        )
        .await;
    match led_by_another {
        Ok(now) => Handover::Done {
            to: now.current_leader.unwrap_or(target),
            after: started.elapsed(),
        },
        _ => Handover::Failed(format!(
            "node {target} stood for election but no other node led within {HANDOVER_WAIT:?}"
        )),
    }
}

/// A voter other than this leader whose matched log is this leader's whole
/// log, and its address: the one follower that can win at once.
fn up_to_date_voter(
    metrics: &RaftMetrics<NodeId, openraft::BasicNode>,
) -> Option<(NodeId, String)> {
    let last = metrics.last_log_index?;
    let matched = metrics.replication.as_ref()?;
    let membership = metrics.membership_config.membership();
    membership
        .voter_ids()
        .filter(|voter| *voter != metrics.id)
        .find(|voter| {
            matched
                .get(voter)
                .and_then(|log_id| log_id.as_ref())
                .is_some_and(|log_id| log_id.index >= last)
        })
        .and_then(|voter| {
            membership
                .get_node(&voter)
                .map(|node| (voter, node.addr.clone()))
        })
}
