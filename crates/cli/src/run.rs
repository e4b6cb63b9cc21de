//! `deadbolt run` and `deadbolt elect`: a command run while holding a lock,
//! stopped before the lock can pass to anyone else.
//!
//! One road whichever system holds the lock: [`main`] takes it through a
//! [`LockSystem`] (the Deadbolt server, `deadbolt.rs`, or one a team
//! already runs, `backend.rs`) and runs the command under the same guard
//! process, margins and exit codes (`command.rs`).

pub(crate) mod backend;
mod command;
mod deadbolt;

pub use command::{ElectArgs, RunArgs};

use crate::Endpoints;
use command::{grace_and_margin, LockSystem};
use std::time::Duration;

/// `deadbolt run` (and `elect`): against the lock system `--backend`
/// names, or the Deadbolt server at `endpoints`.
pub async fn main(endpoints: &Endpoints, args: RunArgs) -> i32 {
    let timing = match grace_and_margin(&args) {
        Ok(timing) => timing,
        Err(code) => return code,
    };
    let opened = match &args.backend {
        Some(url) => match backend::Backends::open(url, &args).await {
            Ok(system) => Ok(hold_and_run(system, &args, timing).await),
            Err(code) => Err(code),
        },
        None => match deadbolt::Deadbolt::open(endpoints, &args).await {
            Ok(system) => Ok(hold_and_run(system, &args, timing).await),
            Err(code) => Err(code),
        },
    };
    opened.unwrap_or_else(|code| code)
}

/// Takes the lock in `system`, runs the command holding it, lets go and
/// closes the session: the exit code of the command, or of what stopped it.
async fn hold_and_run(
    system: impl LockSystem,
    args: &RunArgs,
    (grace, margin): (Duration, Duration),
) -> i32 {
    let code = match system.take(args).await {
        Ok(held) => {
            let code = system.run(&held, args, grace, margin).await;
            system.release(held).await;
            code
        }
        Err(code) => code,
    };
    system.close().await;
    code
}
