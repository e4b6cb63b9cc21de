//! `deadbolt guard` (internal): the process between `deadbolt run` and the
//! user's command, so the command never outlives its lock holder.
//!
//! `deadbolt run` starts the guard as the leader of a new process group, with
//! the kernel set to send it SIGUSR1 if `deadbolt run` dies (even by
//! SIGKILL). On that signal the guard SIGKILLs its whole group: the command
//! and anything the command started. `PR_SET_PDEATHSIG` on the command itself
//! would only reach the command, not its children.

use std::os::unix::process::ExitStatusExt;

#[derive(clap::Args)]
pub struct GuardArgs {
    /// The `deadbolt run` process this guard belongs to.
    #[arg(long)]
    parent: i32,
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

extern "C" fn kill_group(_: libc::c_int) {
    // SAFETY: kill is async-signal-safe; 0 means our own process group.
    unsafe {
        libc::kill(0, libc::SIGKILL);
    }
}

/// A handler that does nothing. Unlike SIG_IGN it is not inherited across
/// exec, so the command still gets the default signal behaviour.
extern "C" fn shrug(_: libc::c_int) {}

pub fn main(args: GuardArgs) -> i32 {
    // SAFETY: installing handlers that only call async-signal-safe functions.
    unsafe {
        libc::signal(libc::SIGUSR1, kill_group as *const () as libc::sighandler_t);
        // Signals forwarded by `deadbolt run` go to the whole group; the
        // command decides what they mean, the guard waits for its exit.
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(signal, shrug as *const () as libc::sighandler_t);
        }
        // The parent may have died before the handler was in place.
        if libc::getppid() != args.parent {
            kill_group(0);
        }
    }
    match std::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        .status()
    {
        Ok(status) => status
            .code()
            .or_else(|| status.signal().map(|signal| 128 + signal))
            .unwrap_or(1),
        Err(err) => {
            eprintln!("deadbolt run: cannot start {:?}: {err}", args.command[0]);
            127
        }
    }
}
