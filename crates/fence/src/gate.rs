//! [`FenceGate`]: one resource's high-water mark of fencing tokens, checked
//! and advanced atomically, for resources that live in this process.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// A fencing token was refused because the resource already accepted a
/// larger one: whoever presented it lost the lock since (its lease ran out
/// and the lock was granted again), whether or not it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {presented}: this resource already accepted token {highest}")]
pub struct Stale {
    /// The token that was refused.
    pub presented: u64,
    /// The highest token the resource had accepted when it refused it
    /// (always larger than `presented`).
    pub highest: u64,
}

/// The highest fencing token a resource has accepted, and the check that
/// refuses lower ones.
///
/// A token is admitted if it is **greater than or equal to** the highest one
/// admitted so far, and admitting it raises the mark. Equal tokens pass
/// because one holder keeps its token for the whole time it holds the lock
/// and may write many times with it; a lower token can only come from a
/// holder whose lock has since been granted to someone else.
///
/// The check and the advance are one atomic step, so of two concurrent
/// callers the lower token can never slip in after the higher one was
/// admitted. Share a gate with an `Arc`.
///
/// For a read/write lock's resource, readers pass through
/// [`FenceGate::admit_read_with`]: a read needs a token at least the highest
/// *write*, and raises a read mark that every later write must reach. So
/// readers (each with its own token) never refuse each other, and a writer
/// that paused past its lease is refused once a newer reader has read
/// (docs/rw-locks.md).
///
/// The mark lives in memory: a restarted process starts from
/// [`FenceGate::new`] and would admit a stale holder again. If the resource
/// outlives the process, keep the mark next to the data (see the `postgres`
/// module) or restore it with [`FenceGate::starting_at`].
#[derive(Debug, Default)]
pub struct FenceGate {
    marks: Mutex<Marks>,
}

/// The highest token admitted to write, and the highest admitted at all.
#[derive(Debug, Default, Clone, Copy)]
struct Marks {
    written: u64,
    highest: u64,
}

impl FenceGate {
    /// A gate that has admitted nothing: every token passes, 0 included.
    pub fn new() -> Self {
        Self::starting_at(0)
    }

    /// A gate that behaves as if it had already admitted `highest`: for
    /// restoring the mark of a resource that outlived the previous gate.
    pub fn starting_at(highest: u64) -> Self {
        FenceGate {
            marks: Mutex::new(Marks {
                written: highest,
                highest,
            }),
        }
    }

    /// Admits `token` if it is at least the highest token admitted so far,
    /// and makes it the new mark; otherwise refuses it and changes nothing.
    ///
    /// Only admission is ordered: two callers admitted one after the other
    /// then write to the resource in whatever order they get to it. When
    /// the write itself must be ordered, use [`FenceGate::admit_with`].
    pub fn admit(&self, token: u64) -> Result<(), Stale> {
        self.admit_with(token, || ())
    }

    /// Admits `token` like [`FenceGate::admit`] and, if it was admitted,
    /// runs `write` before any other token can be admitted, returning its
    /// result.
    ///
    /// This makes "check the token, then write" one step, which is what
    /// fencing needs: with plain `admit`, holder 7 could be admitted, stall,
    /// and write after holder 8 was admitted and wrote. The price is that
    /// writes through one gate run one at a time. `write` must not call this
    /// gate (the lock is not reentrant).
    ///
    /// The mark is raised before `write` runs and stays raised if `write`
    /// fails or panics: that `token` was presented at all proves every lower
    /// token is stale, whatever became of the write.
    pub fn admit_with<R>(&self, token: u64, write: impl FnOnce() -> R) -> Result<R, Stale> {
        let mut marks = self.lock();
        if token < marks.highest {
            return Err(Stale {
                presented: token,
                highest: marks.highest,
            });
        }
        *marks = Marks {
            written: token,
            highest: token,
        };
        Ok(write())
    }

    /// Admits a read by a read/write lock's holder with `token`, and runs
    /// `read` before any write can be admitted: refused only if a write
    /// with a larger token was admitted (this holder's hold has ended
    /// since). Raises the mark that later writes must reach, so that a
    /// writer older than this reader can no longer write; other readers,
    /// older or newer, are not refused.
    pub fn admit_read_with<R>(&self, token: u64, read: impl FnOnce() -> R) -> Result<R, Stale> {
        let mut marks = self.lock();
        if token < marks.written {
            return Err(Stale {
                presented: token,
                highest: marks.written,
            });
        }
        marks.highest = marks.highest.max(token);
        Ok(read())
    }

    /// The highest token admitted so far, to write or to read (or given to
    /// [`FenceGate::starting_at`]); 0 if none.
    pub fn highest(&self) -> u64 {
        self.lock().highest
    }

    fn lock(&self) -> MutexGuard<'_, Marks> {
        // The marks are set in one step before `write` runs, so a panic
        // inside `write` cannot leave them half-updated: the poisoned
        // value is still the right one.
        self.marks.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_equal_and_higher_refuses_lower() {
        let gate = FenceGate::new();
        assert_eq!(gate.highest(), 0);
        assert_eq!(gate.admit(7), Ok(()));
        assert_eq!(gate.admit(7), Ok(()), "the same holder writes again");
        assert_eq!(
            gate.admit(5),
            Err(Stale {
                presented: 5,
                highest: 7
            })
        );
        assert_eq!(gate.highest(), 7, "a refused token changes nothing");
        assert_eq!(gate.admit(9), Ok(()));
        assert_eq!(gate.highest(), 9);
    }

    #[test]
    fn stale_names_both_tokens() {
        let err = FenceGate::starting_at(7).admit(5).unwrap_err();
        assert_eq!(
            err.to_string(),
            "stale fencing token 5: this resource already accepted token 7"
        );
    }

    #[test]
    fn admit_with_runs_the_write_only_when_admitted() {
        let gate = FenceGate::starting_at(3);
        let mut writes = Vec::new();
        assert_eq!(gate.admit_with(4, || writes.push(4)), Ok(()));
        assert!(gate.admit_with(2, || writes.push(2)).is_err());
        assert_eq!(writes, [4]);
    }

    #[test]
    fn readers_do_not_refuse_each_other_and_a_newer_read_keeps_an_older_writer_out() {
        let gate = FenceGate::new();
        gate.admit(5).unwrap();
        // Readers 8 and 7 hold the lock together; 8 reads first.
        assert_eq!(gate.admit_read_with(8, || "v"), Ok("v"));
        assert_eq!(gate.admit_read_with(7, || "v"), Ok("v"));
        assert_eq!(gate.highest(), 8);
        // Writer 6 was paused past its lease: the readers' reads came after
        // its hold ended, so it may not write over what they read.
        assert_eq!(
            gate.admit(6),
            Err(Stale {
                presented: 6,
                highest: 8
            })
        );
        // The next writer (9) writes; a reader of an earlier hold no longer
        // reads.
        gate.admit(9).unwrap();
        assert_eq!(
            gate.admit_read_with(8, || ()),
            Err(Stale {
                presented: 8,
                highest: 9
            })
        );
    }

    #[test]
    fn a_panicking_write_leaves_the_mark_raised_and_the_gate_usable() {
        let gate = FenceGate::new();
        let panicked = std::panic::catch_unwind(|| gate.admit_with(8, || panic!("write failed")));
        assert!(panicked.is_err());
        assert_eq!(gate.highest(), 8);
        assert!(gate.admit(7).is_err());
        assert_eq!(gate.admit(8), Ok(()));
    }
}
