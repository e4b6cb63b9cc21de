//! `deadbolt cluster status|add|remove|limits`: the members of a cluster and
//! each one's state, membership changes at runtime, and the table's limits
//! (replicated, so one change applies on every node).

use crate::exit;
use crate::Endpoints;
use deadbolt_client::{
    Client, ClusterStatusResponse, Error, LimitsResponse, SetLimitsRequest, TableLimits,
};
use std::collections::{BTreeMap, BTreeSet};

#[derive(clap::Subcommand)]
pub enum ClusterCommand {
    /// Every member with its role, term, log and applied index, and whether
    /// it answers. Exits 0 only when every member answers and one leads.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Add a node (started with `deadbolt server --join`): it catches up on
    /// the log as a learner, then becomes a voter. Running it again for a
    /// listed node finishes an add cut short by an election, or changes
    /// nothing.
    Add {
        /// The new node's --node-id.
        id: u64,
        /// The HOST:PORT it serves on.
        address: String,
    },
    /// Remove a node from the cluster. Its process keeps running until
    /// stopped, but it no longer votes or receives the log.
    Remove {
        /// The node's id.
        id: u64,
    },
    /// Show the limits on sessions, locks, waiters and the fenced store, or
    /// change them (needs `admin`; every node applies the change at the same
    /// log entry, and it survives restarts and snapshots). Lowering a limit
    /// below what the cluster holds takes nothing away: new ones are refused
    /// until enough have gone.
    Limits {
        /// Live sessions at once.
        #[arg(long, value_name = "N")]
        max_sessions: Option<u64>,
        /// Locks held or waited for at once.
        #[arg(long, value_name = "N")]
        max_locks: Option<u64>,
        /// Waiters queued on one lock.
        #[arg(long, value_name = "N")]
        max_waiters_per_lock: Option<u64>,
        /// Keys in the fenced store (deleted ones keep their fence and count).
        #[arg(long, value_name = "N")]
        max_keys: Option<u64>,
        /// Bytes of keys and values in the fenced store.
        #[arg(long, value_name = "BYTES")]
        max_store_bytes: Option<u64>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub async fn main(endpoints: &Endpoints, command: ClusterCommand) -> i32 {
    let client = match crate::locks::connect(endpoints).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    match command {
        ClusterCommand::Status { json } => status(&client, endpoints, json).await,
        ClusterCommand::Add { id, address } => {
            changed(client.add_member(id, &address).await, "added", id)
        }
        ClusterCommand::Remove { id } => changed(client.remove_member(id).await, "removed", id),
        ClusterCommand::Limits {
            max_sessions,
            max_locks,
            max_waiters_per_lock,
            max_keys,
            max_store_bytes,
            json,
        } => {
            let change = SetLimitsRequest {
                max_sessions,
                max_locks,
                max_waiters_per_lock,
                max_keys,
                max_store_bytes,
            };
            limits(&client, change, json).await
        }
    }
}

/// Shows the limits, after changing them if `change` sets any.
async fn limits(client: &Client, change: SetLimitsRequest, json: bool) -> i32 {
    let is_change = change != SetLimitsRequest::default();
    let answer = match is_change {
        true => client.set_limits(change).await,
        false => client.limits().await,
    };
    let limits = match answer {
        Ok(limits) => limits,
        Err(err) => return exit::report(&err),
    };
    if json {
        println!("{}", serde_json::to_string(&limits).expect("serializable"));
        return exit::OK;
    }
    let LimitsResponse {
        limits: Some(now),
        floor: Some(floor),
        ceiling: Some(ceiling),
        ..
    } = &limits
    else {
        eprintln!("deadbolt: the server's answer has no limits (is it older than this client?)");
        return exit::FAILURE;
    };
    let in_use = |name: &str| match name {
        "max_sessions" => limits.sessions.to_string(),
        "max_locks" => limits.locks.to_string(),
        "max_keys" => limits.keys.to_string(),
        "max_store_bytes" => limits.store_bytes.to_string(),
        _ => "-".to_owned(),
    };
    println!(
        "{:22}  {:>12}  {:>12}  {:>10}  {:>12}",
        "LIMIT", "IN FORCE", "IN USE", "FLOOR", "CEILING"
    );
    for (((name, value), (_, min)), (_, max)) in
        named(now).into_iter().zip(named(floor)).zip(named(ceiling))
    {
        println!(
            "{name:22}  {value:>12}  {:>12}  {min:>10}  {max:>12}",
            in_use(name)
        );
    }
    exit::OK
}

fn named(limits: &TableLimits) -> [(&'static str, u64); 5] {
    [
        ("max_sessions", limits.max_sessions),
        ("max_locks", limits.max_locks),
        ("max_waiters_per_lock", limits.max_waiters_per_lock),
        ("max_keys", limits.max_keys),
        ("max_store_bytes", limits.max_store_bytes),
    ]
}

fn changed(result: Result<ClusterStatusResponse, Error>, what: &str, id: u64) -> i32 {
    match result {
        Ok(view) => {
            let members: Vec<String> = view
                .members
                .iter()
                .map(|m| format!("{}={}", m.node_id, m.address))
                .collect();
            println!("{what} node {id}; members now: {}", members.join(","));
            exit::OK
        }
        Err(err) => exit::report(&err),
    }
}

async fn status(client: &Client, endpoints: &Endpoints, json: bool) -> i32 {
    let view = match client.cluster_status().await {
        Ok(view) => view,
        Err(err) => return exit::report(&err),
    };
    // Each member's own answer, asked of that member directly.
    let answers = futures::future::join_all(view.members.iter().map(|member| async move {
        let answer = match endpoints.connect_one(&member.address).await {
            Ok(client) => client.cluster_status().await,
            Err(err) => Err(err),
        };
        (member.node_id, answer)
    }))
    .await;
    let answers: BTreeMap<u64, Result<ClusterStatusResponse, Error>> =
        answers.into_iter().collect();
    let leaders: Vec<u64> = answers
        .values()
        .filter_map(|answer| answer.as_ref().ok())
        .filter(|status| status.role == "leader")
        .map(|status| status.node_id)
        .collect();
    // A node whose disk is full answers, but takes no write.
    let healthy = leaders.len() == 1
        && answers
            .values()
            .all(|answer| answer.as_ref().is_ok_and(|status| !status.disk_full));
    if json {
        let members: Vec<serde_json::Value> = view
            .members
            .iter()
            .map(|member| {
                let state = match &answers[&member.node_id] {
                    Ok(status) => serde_json::to_value(status).expect("serializable"),
                    Err(err) => serde_json::json!({ "error": err.to_string() }),
                };
                serde_json::json!({
                    "node_id": member.node_id,
                    "address": member.address,
                    "voter": member.voter,
                    "state": state,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "members": members, "leader": leaders.first(), "healthy": healthy })
        );
    } else {
        let width = view
            .members
            .iter()
            .map(|m| m.address.len())
            .max()
            .unwrap_or(7)
            .max(7);
        println!(
            "{:>4}  {:width$}  {:9}  {:5}  {:>6}  {:>10}  {:>10}  {:8}  HEALTH",
            "NODE", "ADDRESS", "ROLE", "VOTER", "TERM", "LOG", "APPLIED", "RELEASE"
        );
        for member in &view.members {
            let voter = if member.voter { "yes" } else { "no" };
            match &answers[&member.node_id] {
                Ok(status) => println!(
                    "{:>4}  {:width$}  {:9}  {:5}  {:>6}  {:>10}  {:>10}  {:8}  {}",
                    member.node_id,
                    member.address,
                    status.role,
                    voter,
                    status.term,
                    status.last_log_index,
                    status.applied_index,
                    // A release before 0.1.0's numbers answers without them.
                    status.versions.as_ref().map_or("-", |v| v.release.as_str()),
                    if status.disk_full {
                        "disk full: refuses writes until space is freed"
                    } else {
                        "ok"
                    },
                ),
                Err(err) => println!(
                    "{:>4}  {:width$}  {:9}  {:5}  {:>6}  {:>10}  {:>10}  {:8}  {}",
                    member.node_id, member.address, "-", voter, "-", "-", "-", "-", err
                ),
            }
        }
        println!("peers authenticate with: {}", view.peer_authentication);
        println!(
            "cluster version: {}",
            deadbolt_server::FeatureLevel::reported(view.cluster_version)
        );
        let numbers: BTreeSet<String> = answers
            .values()
            .filter_map(|answer| answer.as_ref().ok()?.versions.as_ref())
            .map(deadbolt_server::version::describe)
            .collect();
        for described in &numbers {
            println!("release: {described}");
        }
        if view.transport_security == "none" && view.members.len() > 1 {
            eprintln!(
                "deadbolt: WARNING: this cluster runs without TLS: its peers prove who they are \
                 with the cluster secret, but anyone who can watch its traffic can read that \
                 secret, tokens and session secrets (docs/security.md)"
            );
        }
        if !healthy {
            eprintln!(
                "deadbolt: the cluster is degraded ({} leader(s) seen, {} of {} members answer)",
                leaders.len(),
                answers.values().filter(|a| a.is_ok()).count(),
                answers.len()
            );
        }
    }
    if healthy {
        exit::OK
    } else {
        exit::FAILURE
    }
}
