//! `deadbolt guard` (internal): the process between `deadbolt run` and the
//! user's command, so that nothing the command starts outlives the lock.
//!
//! The guard runs the command in a new process group and makes itself a
//! child subreaper, so every process the command leaves behind, even one
//! that moved to another group or session, is re-parented to the guard. It
//! exits only when the command has exited *and* every such process is dead
//! and reaped; `deadbolt run` releases the lock only after that.
//!
//! Signals it acts on:
//! - SIGTERM, SIGINT, SIGHUP (from `deadbolt run`): forwarded to the
//!   command's process group;
//! - SIGUSR2 (from `deadbolt run`): SIGKILL the command's process group now;
//! - SIGUSR1: set by `deadbolt run` as the parent-death signal, so the same
//!   happens if `deadbolt run` itself is killed, even by SIGKILL.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

#[derive(clap::Args)]
pub struct GuardArgs {
    /// The `deadbolt run` process this guard belongs to.
    #[arg(long)]
    parent: i32,
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

/// The command's process group (its pid), once it runs.
static COMMAND_GROUP: AtomicI32 = AtomicI32::new(0);
/// A kill was asked for, possibly before the command's group was known.
static KILL_REQUESTED: AtomicBool = AtomicBool::new(false);

fn kill_command_group() {
    let group = COMMAND_GROUP.load(Ordering::SeqCst);
    if group > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
    }
}

extern "C" fn on_kill(_: libc::c_int) {
    KILL_REQUESTED.store(true, Ordering::SeqCst);
    kill_command_group();
}

extern "C" fn on_forward(signal: libc::c_int) {
    let group = COMMAND_GROUP.load(Ordering::SeqCst);
    if group > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(-group, signal);
        }
    }
}

fn install(signal: libc::c_int, handler: extern "C" fn(libc::c_int)) {
    // SAFETY: the handlers only touch atomics and call kill, which are
    // async-signal-safe. Handlers (unlike SIG_IGN) are reset on exec, so the
    // command starts with default signal behaviour.
    unsafe {
        libc::signal(signal, handler as *const () as libc::sighandler_t);
    }
}

pub fn main(args: GuardArgs) -> i32 {
    install(libc::SIGUSR1, on_kill);
    install(libc::SIGUSR2, on_kill);
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        install(signal, on_forward);
    }
    // SAFETY: plain syscalls without memory-safety preconditions.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
        // `deadbolt run` may have died before the handler was in place.
        if libc::getppid() != args.parent {
            return 1;
        }
    }
    let mut command = std::process::Command::new(&args.command[0]);
    command.args(&args.command[1..]).process_group(0);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => {
            eprintln!("deadbolt run: cannot start {:?}: {err}", args.command[0]);
            // As shells report it: not found, or found but not runnable.
            return if err.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    COMMAND_GROUP.store(child.id() as i32, Ordering::SeqCst);
    // A kill asked for while the command was being started.
    if KILL_REQUESTED.load(Ordering::SeqCst) {
        kill_command_group();
    }
    let status = child.wait().expect("waiting for the command failed");
    // The command is gone; what it left running must not outlive the lock.
    kill_command_group();
    kill_and_reap_orphans();
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(1)
}

/// SIGKILLs and reaps every process re-parented to this guard until none is
/// left. Killing one can orphan its children, which then arrive here too.
fn kill_and_reap_orphans() {
    let me = std::process::id().to_string();
    loop {
        for child in children_of(&me) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(child, libc::SIGKILL);
            }
        }
        loop {
            // SAFETY: waitpid with a null status pointer is allowed.
            let reaped = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
            match reaped {
                0 => break,    // children left, none exited yet
                -1 => return,  // ECHILD: nobody left
                _ => continue, // reaped one; look for more
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Pids whose parent is `parent`, from /proc.
fn children_of(parent: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                // The command name may hold spaces: fields start after ')'.
                .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.to_owned()))
                .and_then(|rest| rest.split_whitespace().nth(1).map(|ppid| ppid == parent))
                .unwrap_or(false)
        })
        .collect()
}
