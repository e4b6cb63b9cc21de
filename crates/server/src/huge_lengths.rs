//! Issue 58, part 1, for this crate's tests: every decoder of bytes from
//! outside the process (a snapshot or backup from disk or a peer, a log
//! record, a Raft message) is fed valid bytes with each eight-byte window
//! in turn replaced by a huge count, and must answer with a value or an
//! error: never a panic, and never an allocation above [`LIMIT`].
//!
//! Why an allocator of its own: a decoder that trusts an encoded count
//! (`Vec::with_capacity(len)`, as `imbl`'s map did) asks for the memory
//! before it reads one entry. With a count just under what the machine
//! has, that is no panic, only a node that swaps or is killed; counting
//! the largest request is what catches it. The count is kept per thread, so
//! tests running beside each other do not see each other's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The largest allocation a decoder may make from the small inputs these
/// tests give it: serde's own cautious preallocation stops at 1 MiB.
pub const LIMIT: usize = 4 << 20;

/// The counts written over each window: past any memory, past `isize`, and
/// large enough to fit memory but not these inputs.
const HUGE: [u64; 4] = [u64::MAX, 1 << 62, 1 << 35, u32::MAX as u64];

/// The system allocator, counting the largest request on this thread while
/// [`largest_allocation`] runs.
struct Counting;

thread_local! {
    /// `None` while not counting.
    static LARGEST: Cell<Option<usize>> = const { Cell::new(None) };
}

// SAFETY: every call goes to `System` unchanged; the bookkeeping only reads
// and writes a const-initialised thread-local `Cell`, which allocates
// nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn note(size: usize) {
    // `try_with`: the thread may be tearing its locals down.
    let _ = LARGEST.try_with(|largest| {
        if let Some(so_far) = largest.get() {
            largest.set(Some(so_far.max(size)));
        }
    });
}

/// Runs `f`, and returns whether it panicked and the largest single
/// allocation it asked for.
fn largest_allocation(f: impl FnOnce()) -> (bool, usize) {
    LARGEST.with(|largest| largest.set(Some(0)));
    let panicked = crate::quiet_panic::catch_quietly(f).is_err();
    let largest = LARGEST.with(|largest| largest.take()).unwrap_or(0);
    (panicked, largest)
}

/// Feeds `decode` the `valid` bytes with every eight-byte window replaced,
/// in turn, by each huge count (every length in them is in one of those
/// windows, whatever its offset), and asserts that it never panics nor
/// allocates above [`LIMIT`]. `valid` itself must decode (`decode` returns
/// whether it did), so that the mutations reach past the first byte.
pub fn assert_every_length_bounded(what: &str, valid: &[u8], decode: impl Fn(&[u8]) -> bool) {
    assert!(decode(valid), "{what}: the valid bytes do not decode");
    assert!(valid.len() >= 8, "{what}: too short to hold a length");
    for huge in HUGE {
        for at in 0..=valid.len() - 8 {
            let mut mutated = valid.to_vec();
            mutated[at..at + 8].copy_from_slice(&huge.to_le_bytes());
            let (panicked, largest) = largest_allocation(|| {
                decode(&mutated);
            });
            assert!(!panicked, "{what}: a count of {huge} at byte {at} panicked");
            assert!(
                largest <= LIMIT,
                "{what}: a count of {huge} at byte {at} asked for {largest} bytes at once"
            );
        }
    }
}

/// A table with something in each of its parts (sessions, locks, waiters,
/// the store, the audit trail, access control with its ends, semaphores,
/// read/write locks, elections), at the newest cluster version: the bytes
/// whose lengths the tests make huge. Its access control holds token
/// `ci0`, expiring at 1,800,000,000,000 ms, and denies `laptop-7`.
pub fn full_table() -> deadbolt_core::LockTable {
    use deadbolt_core::{AclCommand, Command, LockTable, Outcome, RwMode, SecretHash, SessionId};
    let mut table = LockTable::new();
    let newest = Command::SetClusterVersion {
        level: deadbolt_core::FeatureLevel::NEWEST,
    };
    let apply = |table: &mut LockTable, command: Command| {
        let applied = table.apply(&command);
        assert!(
            applied.outcome.is_ok(),
            "{command:?}: {:?}",
            applied.outcome
        );
        applied.outcome.unwrap()
    };
    apply(&mut table, newest);
    let mut sessions = Vec::new();
    for n in 0..2u8 {
        let open = Command::OpenSession {
            ttl_ms: 10_000,
            secret: SecretHash([n; 32]),
            owner: Some(format!("owner-{n}")),
        };
        let Outcome::SessionOpened { session, .. } = apply(&mut table, open) else {
            panic!("no session");
        };
        sessions.push(session);
    }
    let [first, second]: [SessionId; 2] = sessions.try_into().unwrap();
    for session in [first, second] {
        let acquire = Command::Acquire {
            session,
            lock: "jobs/a".into(),
            wait: true,
            attempt: 1,
            lock_delay_ms: 0,
        };
        apply(&mut table, acquire);
    }
    let put = Command::StorePut {
        key: "jobs/k".into(),
        value: "v".into(),
        lock: Some("jobs/a".into()),
        token: deadbolt_core::Token(1),
    };
    apply(&mut table, put);
    let more = [
        Command::AcquirePermits {
            session: first,
            semaphore: "pool".into(),
            capacity: 4,
            count: 2,
            wait: false,
            attempt: 2,
        },
        Command::AcquireRw {
            session: second,
            lock: "catalog".into(),
            mode: RwMode::Shared,
            wait: false,
            attempt: 3,
        },
        Command::Campaign {
            session: first,
            election: "scheduler".into(),
            value: "10.0.0.7:8080".into(),
            wait: false,
            attempt: 4,
        },
    ];
    for command in more {
        apply(&mut table, command);
    }
    let acl = [
        AclCommand::Bootstrap {
            token_id: "root0".into(),
            hash: SecretHash([9; 32]),
        },
        AclCommand::CreateExpiringToken {
            token_id: "ci0".into(),
            identity: "ci".into(),
            hash: SecretHash([8; 32]),
            expires_unix_ms: 1_800_000_000_000,
        },
        AclCommand::DenyIdentity {
            identity: "laptop-7".into(),
        },
    ];
    for change in acl {
        apply(&mut table, Command::Acl(change));
    }
    table
}
