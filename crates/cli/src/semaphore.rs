//! `deadbolt semaphore`: an admin defines a semaphore (it then stays while
//! nobody holds it, and acquirers need not name its permits), changes its
//! permits, or deletes the definition; `status` shows one.
//!
//! Why an admin's command: a semaphore created by its first acquirer takes
//! that acquirer's count, and a different count later is refused rather
//! than a silent change (docs/semaphores.md). Changing it on purpose is an
//! operator's decision, as `cluster limits` is.

use crate::locks::{connect, semaphore_status};
use crate::{exit, Endpoints};

#[derive(clap::Subcommand)]
pub enum SemaphoreCommand {
    /// Create NAME with N permits, or give the one that exists N permits
    /// (more: waiters that now fit are granted at once; fewer than are
    /// held: nothing is taken back, nothing more granted until enough are
    /// released). Needs the `admin` permission.
    Define {
        name: String,
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
        permits: u32,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Drop NAME's definition: it goes once nobody holds or waits on it
    /// (permits held stay held). Needs the `admin` permission.
    Delete { name: String },
    /// Who holds NAME's permits (token and slot), who waits, and whether it
    /// is defined (`status --semaphore NAME`).
    Status {
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub async fn main(endpoints: &Endpoints, command: SemaphoreCommand) -> i32 {
    let client = match connect(endpoints).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    match command {
        SemaphoreCommand::Define {
            name,
            permits,
            json,
        } => match client.define_semaphore(&name, permits).await {
            Ok(_) => semaphore_status(&client, &name, json).await,
            Err(err) => exit::report(&err),
        },
        SemaphoreCommand::Delete { name } => match client.delete_semaphore(&name).await {
            Ok(Some(_)) => {
                println!("{name}: no longer defined; it goes once its permits are released");
                exit::OK
            }
            Ok(None) => {
                println!("{name}: deleted");
                exit::OK
            }
            Err(err) => exit::report(&err),
        },
        SemaphoreCommand::Status { name, json } => semaphore_status(&client, &name, json).await,
    }
}
