//! Whether a node is ready for clients, as load balancers and orchestrators
//! ask it: `GET /ready`, and the standard `grpc.health.v1.Health` service
//! (what Kubernetes' gRPC probes, `grpc_health_probe` and gRPC load
//! balancers call).
//!
//! Three questions, three answers:
//! - **Alive**: the process serves. `grpc.health.v1.Health` for the service
//!   `""` answers SERVING from the start until shutdown; any answer from
//!   `/health` means the same.
//! - **Ready**: a member of a cluster with a known leader, so a call sent
//!   here is answered (by this node, or with a `not_leader` naming the
//!   leader). `GET /ready` is 200 then and 503 otherwise (forming, waiting
//!   to be added, an election under way, cut off from the quorum, a full
//!   disk, shutting down), and `grpc.health.v1.Health` for
//!   `deadbolt.v1.Deadbolt` is SERVING then and NOT_SERVING otherwise.
//! - **Leads**: `GET /health` is 200 on the leader and 503 elsewhere, as it
//!   always was (kept for the scripts that find the leader with it); 503
//!   on a leader whose disk is full, which takes no write and is about to
//!   be replaced.
//!
//! Open to every caller, as `/health` is: they tell nothing a client could
//! not learn by calling, and a probe has no token.

use crate::node::Node;
use openraft::ServerState;
use tokio::sync::watch;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// How often the gRPC health status looks at the disk, besides whenever
/// Raft's metrics change.
const DISK_LOOK: std::time::Duration = std::time::Duration::from_secs(1);

/// The gRPC health service name of the lock API (readiness).
pub const LOCK_SERVICE: &str = "deadbolt.v1.Deadbolt";

impl Node {
    /// `Ok` when ready (above), or why not.
    pub fn readiness(&self) -> Result<(), String> {
        // openraft marks a stopped Raft in `metrics()` only; the rest comes
        // from the server metrics, which `report` waits on.
        if self.raft.metrics().borrow().state == ServerState::Shutdown {
            return Err("this node is shutting down".to_owned());
        }
        if self.space.is_full() {
            return Err("this node's disk is full: it takes no writes until space is freed".into());
        }
        let watched = self.raft.server_metrics();
        let metrics = watched.borrow();
        match (metrics.state, metrics.current_leader) {
            (ServerState::Shutdown, _) => Err("this node is shutting down".to_owned()),
            (ServerState::Candidate, _) => {
                Err("an election is under way: no leader is known".to_owned())
            }
            _ if metrics.membership_config.nodes().next().is_none() => Err(
                "this node is not a member of a cluster yet (forming one, or waiting to be added)"
                    .to_owned(),
            ),
            (_, None) => Err("no leader is known (cut off from the quorum?)".to_owned()),
            (_, Some(_)) => Ok(()),
        }
    }
}

/// Keeps the gRPC health statuses in step with the node until `stopped`,
/// then reports both NOT_SERVING.
pub async fn report(node: Node, mut reporter: HealthReporter, mut stopped: watch::Receiver<bool>) {
    // Not `metrics()`, which changes with every commit: a wake-up of this
    // task per batch, for a status that seldom changes.
    let mut metrics = node.raft.server_metrics();
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    let mut reported = None;
    loop {
        let status = match node.readiness() {
            Ok(()) => ServingStatus::Serving,
            Err(_) => ServingStatus::NotServing,
        };
        if reported != Some(status) {
            reporter.set_service_status(LOCK_SERVICE, status).await;
            reported = Some(status);
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { break },
            // A full disk changes no Raft metric: looked at now and then.
            () = tokio::time::sleep(DISK_LOOK) => {}
            _ = stopped.wait_for(|stopped| *stopped) => break,
        }
    }
    for service in ["", LOCK_SERVICE] {
        reporter
            .set_service_status(service, ServingStatus::NotServing)
            .await;
    }
}
