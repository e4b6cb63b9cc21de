//! `deadbolt watch`: print a name's (or a prefix's) events as they happen.
//!
//! Why a command: `status` says who holds a lock now; following who takes
//! and gives it over time (a dashboard, an audit script, a test) otherwise
//! means polling and missing what happens between two polls. A watch
//! misses nothing, and each line's id resumes it (`--after`).

use crate::locks::connect;
use crate::{exit, stop_signal, Endpoints};
use deadbolt_client::{WatchEvent, WatchOptions};

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["lock", "prefix"])))]
#[command(group(clap::ArgGroup::new("start").args(["from", "after"])))]
pub struct WatchArgs {
    /// The name to follow: a lock, semaphore, read/write lock, election or
    /// store key.
    #[arg(long, visible_aliases = ["semaphore", "election", "store-key"])]
    lock: Option<String>,
    /// Follow every name that starts with PREFIX ("" for all of them).
    #[arg(long)]
    prefix: Option<String>,
    /// Start with the events of log index INDEX (if the server still keeps
    /// them; else the watch ends with `compacted`). Default: from now on.
    #[arg(long, value_name = "INDEX")]
    from: Option<u64>,
    /// Resume after the event with this id (the first column, or "id" in
    /// --json), as a watch that stopped left off.
    #[arg(long, value_name = "ID")]
    after: Option<String>,
    /// Print one JSON object per event.
    #[arg(long)]
    json: bool,
}

/// Prints events until interrupted (exit 0) or until an error ends the
/// watch: `compacted` if the history it needs is gone (exit 1), no server
/// reachable (69), no permission (77).
pub async fn main(endpoints: &Endpoints, args: WatchArgs) -> i32 {
    let client = match connect(endpoints).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let (name, prefix) = match (args.lock, args.prefix) {
        (Some(lock), _) => (lock, false),
        (None, Some(prefix)) => (prefix, true),
        (None, None) => unreachable!("clap requires --lock or --prefix"),
    };
    let after = match (args.from, args.after) {
        (Some(from), _) => Some(from.saturating_sub(1).to_string()),
        (None, after) => after,
    };
    let mut watch = client.watch(&name, WatchOptions { prefix, after });
    let stopped = stop_signal();
    tokio::pin!(stopped);
    loop {
        let event = tokio::select! {
            event = watch.next() => event,
            _ = &mut stopped => return exit::OK,
        };
        match event {
            Some(Ok(event)) if args.json => println!("{}", serde_json::json!(event)),
            Some(Ok(event)) => println!("{}", line(&event)),
            Some(Err(err)) => return exit::report(&err),
            None => return exit::FAILURE,
        }
    }
}

/// `ID KIND NAME` and whichever of session, identity, token, mode,
/// permits and value the event has.
fn line(event: &WatchEvent) -> String {
    let mut line = format!("{} {} {}", event.id, event.kind, event.name);
    if event.session_id != 0 {
        line += &format!(" session={}", event.session_id);
    }
    if !event.identity.is_empty() {
        line += &format!(" identity={}", event.identity);
    }
    if event.token != 0 {
        line += &format!(" token={}", event.token);
    }
    if !event.mode.is_empty() {
        line += &format!(" mode={}", event.mode);
    }
    if event.permits != 0 {
        line += &format!(" permits={}", event.permits);
    }
    if let Some(value) = &event.value {
        line += &format!(" value={value:?}");
    }
    line
}
