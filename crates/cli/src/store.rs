//! `deadbolt store put|get|delete`: the fenced store from the shell, and
//! `deadbolt check`: is a token still the current grant of a lock?
//!
//! Output is made for scripts: `get` prints the value alone (`--json` adds
//! the fence), and a stale token exits 76 with a message that says so.

use crate::exit;
use crate::locks::connect;
use crate::Endpoints;
use deadbolt_client::Error;
use std::io::Read;

#[derive(clap::Subcommand)]
pub enum StoreCommand {
    /// Set KEY to VALUE (`-` reads it from stdin), fenced by TOKEN.
    Put {
        key: String,
        value: String,
        #[command(flatten)]
        fence: Fence,
    },
    /// Print KEY's value. With --token, the read is fenced: a holder with an
    /// older token can no longer write KEY afterwards.
    Get {
        key: String,
        /// Fence the read with this token.
        #[arg(long)]
        token: Option<u64>,
        /// With --token: it must also be a live grant of this lock (of a
        /// semaphore or read/write lock: any live permit or hold).
        #[arg(long, requires = "token")]
        lock: Option<String>,
        /// Print {"key", "found", "value", "fence"} as JSON.
        #[arg(long)]
        json: bool,
        /// Print this (and exit 0) when KEY has no value, instead of failing.
        #[arg(long, conflicts_with = "json")]
        default: Option<String>,
    },
    /// Delete KEY, fenced by TOKEN (KEY keeps its fence).
    Delete {
        key: String,
        #[command(flatten)]
        fence: Fence,
    },
}

/// The token a change is fenced with.
#[derive(clap::Args)]
pub struct Fence {
    /// The fencing token of your grant (`$DEADBOLT_TOKEN` under `deadbolt run`).
    #[arg(long, env = "DEADBOLT_TOKEN")]
    token: u64,
    /// Strict mode: TOKEN must also be this lock's current grant (a
    /// semaphore's live permit; a read/write lock's exclusive hold).
    #[arg(long)]
    lock: Option<String>,
}

#[derive(clap::Args)]
pub struct CheckArgs {
    #[arg(long)]
    lock: String,
    #[arg(long)]
    token: u64,
}

pub async fn main(endpoints: &Endpoints, command: StoreCommand) -> i32 {
    let client = match connect(endpoints).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let result: Result<i32, Error> = match command {
        StoreCommand::Put { key, value, fence } => {
            let value = if value == "-" {
                let mut stdin = String::new();
                if let Err(err) = std::io::stdin().read_to_string(&mut stdin) {
                    eprintln!("deadbolt: cannot read the value from stdin: {err}");
                    return exit::FAILURE;
                }
                stdin
            } else {
                value
            };
            client
                .store_put(&key, &value, fence.token, fence.lock.as_deref())
                .await
                .map(|_| exit::OK)
        }
        StoreCommand::Get {
            key,
            token,
            lock,
            json,
            default,
        } => {
            let fenced = token.map(|token| (token, lock.as_deref()));
            client.store_get(&key, fenced).await.map(|stored| {
                if json {
                    let body = serde_json::json!({
                        "key": key,
                        "found": stored.value.is_some(),
                        "value": stored.value,
                        "fence": stored.fence,
                    });
                    println!("{body}");
                    return exit::OK;
                }
                match stored.value.or(default) {
                    Some(value) => {
                        println!("{value}");
                        exit::OK
                    }
                    None => {
                        eprintln!("deadbolt: key {key:?} has no value");
                        exit::FAILURE
                    }
                }
            })
        }
        StoreCommand::Delete { key, fence } => client
            .store_delete(&key, fence.token, fence.lock.as_deref())
            .await
            .map(|_| exit::OK),
    };
    result.unwrap_or_else(|err| exit::report(&err))
}

/// Exit 0 when the token is the lock's current grant, 76 when it is not.
pub async fn check(endpoints: &Endpoints, args: CheckArgs) -> i32 {
    let client = match connect(endpoints).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    match client.check_token(&args.lock, args.token).await {
        Ok((true, _)) => {
            println!(
                "token {} is the current grant of lock {:?}",
                args.token, args.lock
            );
            exit::OK
        }
        Ok((false, current)) => {
            match current {
                Some(current) => eprintln!(
                    "deadbolt: stale: lock {:?} is held with token {current}, not {}",
                    args.lock, args.token
                ),
                None => eprintln!(
                    "deadbolt: stale: lock {:?} is not held (token {} is not current)",
                    args.lock, args.token
                ),
            }
            exit::LOCK_LOST
        }
        Err(err) => exit::report(&err),
    }
}
