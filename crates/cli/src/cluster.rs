//! `deadbolt cluster status|add|remove`: the members of a cluster and each
//! one's state, and membership changes at runtime.

use crate::exit;
use crate::Endpoints;
use deadbolt_client::{Client, ClusterStatusResponse, Error};
use std::collections::BTreeMap;

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
    /// the log as a learner, then becomes a voter.
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
    }
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
    let healthy = leaders.len() == 1 && answers.values().all(Result::is_ok);
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
            "{:>4}  {:width$}  {:9}  {:5}  {:>6}  {:>10}  {:>10}  HEALTH",
            "NODE", "ADDRESS", "ROLE", "VOTER", "TERM", "LOG", "APPLIED"
        );
        for member in &view.members {
            let voter = if member.voter { "yes" } else { "no" };
            match &answers[&member.node_id] {
                Ok(status) => println!(
                    "{:>4}  {:width$}  {:9}  {:5}  {:>6}  {:>10}  {:>10}  ok",
                    member.node_id,
                    member.address,
                    status.role,
                    voter,
                    status.term,
                    status.last_log_index,
                    status.applied_index
                ),
                Err(err) => println!(
                    "{:>4}  {:width$}  {:9}  {:5}  {:>6}  {:>10}  {:>10}  {}",
                    member.node_id, member.address, "-", voter, "-", "-", "-", err
                ),
            }
        }
        if view.transport_security == "none" && view.members.len() > 1 {
            eprintln!(
                "deadbolt: WARNING: this cluster runs without TLS: its peers are \
                 unauthenticated, and anything that can reach a node's port can speak Raft to \
                 it (docs/security.md)"
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
