//! `cluster add` on embedded nodes and tokio's paused clock: adding is
//! idempotent, so an add cut short by an election is finished by sending it
//! again to the new leader, and an add that would silently keep a member's
//! old address is refused.

use crate::common;

use common::{Api, ApiError, Cluster, Credentials, ErrorKind, NodeId};
use deadbolt_proto::v1::{AddMemberRequest, ClusterStatusResponse};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::Instant;

async fn add(api: Api, id: NodeId, address: &str) -> Result<ClusterStatusResponse, ApiError> {
    let request = AddMemberRequest {
        node_id: id,
        address: address.to_owned(),
    };
    api.add_member(&Credentials::ANONYMOUS, request).await
}

/// The voters and every member's address, as node `id` sees them.
fn members(cluster: &Cluster, id: NodeId) -> (BTreeSet<NodeId>, Vec<(NodeId, String)>) {
    let metrics = cluster.raft(id).metrics().borrow().clone();
    let membership = metrics.membership_config.membership();
    let addresses = membership
        .nodes()
        .map(|(id, node)| (*id, node.addr.clone()))
        .collect();
    (membership.voter_ids().collect(), addresses)
}

/// A CI run of `cluster add` failed with "stopped leading": an election
/// during the catch-up left the new node a learner, and the only way on was
/// `cluster remove` and a second add. Here the leader is cut from the new
/// node (so it cannot catch up) and then from the other voters, who elect a
/// new leader: the add answers `NotLeader` (which the client sends on to
/// the new leader) and the same add, sent there, makes the learner a voter.
#[tokio::test(start_paused = true)]
async fn an_add_cut_short_by_an_election_is_finished_by_the_same_add_to_the_new_leader() {
    let mut cluster = Cluster::form(3).await;
    let old_leader = cluster.leader().await;
    let voters: Vec<NodeId> = (1..=3).filter(|id| *id != old_leader).collect();
    cluster.start_blank(4).await;
    cluster.net.cut_all(&[old_leader, 4]);

    let first_add = tokio::spawn(add(cluster.api(old_leader), 4, "node-4"));
    // Once node 4 is listed (a learner), the leader loses the others.
    let give_up = Instant::now() + Duration::from_secs(10);
    while !members(&cluster, old_leader)
        .1
        .iter()
        .any(|(id, _)| *id == 4)
    {
        assert!(Instant::now() < give_up, "node 4 was never listed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for &voter in &voters {
        cluster.net.cut_all(&[old_leader, voter]);
    }
    // The old leader still believes it leads: ask the others.
    let new_leader = loop {
        let elected = voters
            .iter()
            .find(|&&voter| cluster.api(voter).health().leader);
        if let Some(&leader) = elected {
            break leader;
        }
        assert!(Instant::now() < give_up, "the others elected no leader");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    cluster.net.heal();

    let cut_short = first_add
        .await
        .unwrap()
        .expect_err("the old leader cannot finish the add");
    assert_eq!(cut_short.kind, ErrorKind::NotLeader, "{cut_short:?}");
    assert!(
        cut_short.message.contains("stopped leading"),
        "{cut_short:?}"
    );
    let (voters_now, _) = members(&cluster, new_leader);
    assert!(
        !voters_now.contains(&4),
        "node 4 votes without having caught up"
    );

    add(cluster.api(new_leader), 4, "node-4")
        .await
        .expect("the same add, sent to the new leader, finishes");
    let (voters_now, addresses) = members(&cluster, new_leader);
    assert_eq!(voters_now, BTreeSet::from([1, 2, 3, 4]));
    assert!(
        addresses.contains(&(4, "node-4".to_owned())),
        "{addresses:?}"
    );
}

/// openraft keeps a listed node's address when it is added again, and would
/// report the add done: an add naming another address is refused, one
/// naming the same address changes nothing.
#[tokio::test(start_paused = true)]
async fn adding_a_member_again_at_another_address_is_refused_and_at_its_own_changes_nothing() {
    let cluster = Cluster::form(3).await;
    let leader = cluster.leader().await;
    let before = members(&cluster, leader);

    let moved = add(cluster.api(leader), 2, "elsewhere:7070")
        .await
        .expect_err("a member at another address");
    assert_eq!(moved.kind, ErrorKind::InvalidArgument, "{moved:?}");
    assert!(
        moved.message.contains("already a member, at node-2"),
        "{moved:?}"
    );
    assert_eq!(members(&cluster, leader), before);

    add(cluster.api(leader), 2, "node-2")
        .await
        .expect("adding a voter at its own address");
    assert_eq!(members(&cluster, leader), before);
}
