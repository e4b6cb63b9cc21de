//! Panics that are refusals, not crashes: caught without the default
//! hook's message on stderr.
//!
//! Why: checking a damaged data directory can make the storage library
//! panic, and a backup's table is checked with `check_invariants`, which
//! asserts. Both are caught and turned into a clear refusal, but the
//! default panic hook printed "thread 'main' panicked at ..." first, so the
//! refusal was not the only thing an operator read (a black-box run of
//! `deadbolt data check` on a damaged page).
//!
//! A process has one panic hook. This one is installed once, passes every
//! panic to the hook that was there before, and stays silent only for a
//! panic on a thread inside [`catch_quietly`]: other threads' panics are
//! reported as ever.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    /// Whether this thread is inside [`catch_quietly`].
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`; a panic in it comes back as `Err` with its payload, and
/// prints nothing.
pub fn catch_quietly<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
    let was_quiet = QUIET.with(|quiet| quiet.replace(true));
    let caught = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|quiet| quiet.set(was_quiet));
    caught
}

/// The message a caught panic carried.
pub fn message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or(payload.downcast_ref::<&str>().copied())
        .unwrap_or("a panic")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_returns_its_message_and_the_thread_goes_on() {
        let caught = catch_quietly(|| -> u32 { panic!("page 7 is damaged") });
        assert_eq!(message(&*caught.unwrap_err()), "page 7 is damaged");
        assert_eq!(catch_quietly(|| 5).unwrap(), 5);
        // Outside it, the quiet flag is down again.
        assert!(!QUIET.with(Cell::get));
    }
}
