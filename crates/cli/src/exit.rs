//! Exit codes, and how errors map onto them. Documented in `--help`.

use deadbolt_client::{Error, ErrorKind};

pub const OK: i32 = 0;
pub const FAILURE: i32 = 1;
/// A command line (or config file) that does not parse, as clap exits.
pub const USAGE: i32 = 2;
/// EX_UNAVAILABLE from sysexits.h.
pub const UNREACHABLE: i32 = 69;
/// EX_TEMPFAIL: try again later.
pub const BUSY: i32 = 75;
pub const LOCK_LOST: i32 = 76;
/// EX_NOPERM: no valid credentials, or no permission for this.
pub const NOT_PERMITTED: i32 = 77;

/// Prints the error and returns its exit code.
pub fn report(err: &Error) -> i32 {
    eprintln!("deadbolt: {err}");
    code_of(err)
}

pub fn code_of(err: &Error) -> i32 {
    match err.kind() {
        ErrorKind::Busy | ErrorKind::WaitTimeout | ErrorKind::Overloaded => BUSY,
        ErrorKind::Unavailable | ErrorKind::NotLeader => UNREACHABLE,
        ErrorKind::StaleToken
        | ErrorKind::NotHolder
        | ErrorKind::UnknownSession
        | ErrorKind::SessionExpiring => LOCK_LOST,
        ErrorKind::PermissionDenied | ErrorKind::Unauthenticated => NOT_PERMITTED,
        _ => FAILURE,
    }
}

/// [`report`] for the errors of the other lock systems (`--backend`).
pub fn report_backend(err: &deadbolt_backends::Error) -> i32 {
    use deadbolt_backends::ErrorKind as Kind;
    eprintln!("deadbolt: {err}");
    match err.kind() {
        Kind::Busy | Kind::WaitTimeout => BUSY,
        Kind::Unavailable => UNREACHABLE,
        Kind::LockLost => LOCK_LOST,
        Kind::InvalidArgument | Kind::Refused => FAILURE,
    }
}
