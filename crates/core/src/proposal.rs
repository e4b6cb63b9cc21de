//! Typed proposals: a [`Command`] together with the answer its caller gets.
//!
//! Why: [`LockTable::apply`](crate::LockTable::apply) answers every command
//! with one [`Outcome`] enum, and each caller matched it with a panicking
//! `unreachable!` arm for the variants its command cannot produce. Here each
//! command's constructor also says which variant answers it and what the
//! caller gets out of it (an acquire gives an [`AcquireOutcome`], a cancel
//! the grant that came first, a release nothing), so the pairing is written
//! once, beside the commands, and checked by a test that applies each one.
//! Should the table ever answer with another variant (a bug), the caller
//! gets a [`WrongOutcome`] to report, not a panic in a request.
//!
//! Only how callers build and read commands changes: what goes into the log
//! is the same [`Command`], serialized as before.

use crate::{
    AclCommand, AcquireOutcome, Command, FeatureLevel, LimitsChange, Outcome, RwMode, SecretHash,
    SessionId, StoredValue, TableLimits, Token,
};
use std::fmt;

/// A command and how to read its outcome as an `A`. Made only by the
/// constructors below, so the two always match.
#[derive(Debug)]
pub struct Proposal<A> {
    command: Command,
    answer: Answer<A>,
}

/// How to read the [`Outcome`] of one kind of command.
pub struct Answer<A> {
    /// The command's kind, for [`WrongOutcome`].
    kind: &'static str,
    read: fn(Outcome) -> Result<A, Outcome>,
}

impl<A> Clone for Answer<A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for Answer<A> {}

impl<A> fmt::Debug for Answer<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Answer({})", self.kind)
    }
}

/// The state machine answered a command with an outcome of another kind of
/// command: a bug in the lock table, not something the caller did.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("internal error: {kind} was answered with {outcome:?}, an outcome of another command")]
pub struct WrongOutcome {
    pub kind: &'static str,
    pub outcome: Outcome,
}

impl<A> Answer<A> {
    /// The caller's answer in `outcome`, the outcome of applying this
    /// answer's command.
    pub fn read(self, outcome: Outcome) -> Result<A, WrongOutcome> {
        (self.read)(outcome).map_err(|outcome| WrongOutcome {
            kind: self.kind,
            outcome,
        })
    }
}

/// The reader of a command's answer: the one [`Outcome`] variant that
/// answers it, and what the caller gets from it; any other is given back.
macro_rules! answer {
    ($variant:pat => $answer:expr) => {
        |outcome| match outcome {
            $variant => Ok($answer),
            other => Err(other),
        }
    };
}

impl<A> Proposal<A> {
    fn new(kind: &'static str, command: Command, read: fn(Outcome) -> Result<A, Outcome>) -> Self {
        Proposal {
            command,
            answer: Answer { kind, read },
        }
    }

    pub fn command(&self) -> &Command {
        &self.command
    }

    /// The command to propose, and how to read what applying it answers.
    pub fn into_parts(self) -> (Command, Answer<A>) {
        (self.command, self.answer)
    }
}

impl Proposal<(SessionId, u64)> {
    /// [`Command::OpenSession`]; answers the new session and its TTL in ms.
    pub fn open_session(ttl_ms: u64, secret: SecretHash, owner: Option<String>) -> Self {
        let command = Command::OpenSession {
            ttl_ms,
            secret,
            owner,
        };
        Proposal::new(
            "open session",
            command,
            answer!(Outcome::SessionOpened { session, ttl_ms } => (session, ttl_ms)),
        )
    }
}

impl Proposal<()> {
    /// [`Command::CloseSession`].
    pub fn close_session(session: SessionId) -> Self {
        let command = Command::CloseSession { session };
        Proposal::new(
            "close session",
            command,
            answer!(Outcome::SessionEnded => ()),
        )
    }

    /// [`Command::Release`].
    pub fn release(session: SessionId, lock: String, token: Token) -> Self {
        let command = Command::Release {
            session,
            lock,
            token,
        };
        Proposal::new("release", command, answer!(Outcome::Released => ()))
    }

    /// [`Command::Proclaim`].
    pub fn proclaim(session: SessionId, election: String, token: Token, value: String) -> Self {
        let command = Command::Proclaim {
            session,
            election,
            token,
            value,
        };
        Proposal::new("proclaim", command, answer!(Outcome::Proclaimed => ()))
    }

    /// [`Command::DefineSemaphore`].
    pub fn define_semaphore(semaphore: String, capacity: u32) -> Self {
        let command = Command::DefineSemaphore {
            semaphore,
            capacity,
        };
        let answer = answer!(Outcome::SemaphoreDefined => ());
        Proposal::new("define semaphore", command, answer)
    }

    /// [`Command::DeleteSemaphore`].
    pub fn delete_semaphore(semaphore: String) -> Self {
        let command = Command::DeleteSemaphore { semaphore };
        let answer = answer!(Outcome::SemaphoreDefined => ());
        Proposal::new("delete semaphore", command, answer)
    }

    /// [`Command::LeaseRenewed`].
    pub fn lease_renewed(session: SessionId) -> Self {
        let command = Command::LeaseRenewed { session };
        Proposal::new(
            "lease renewal",
            command,
            answer!(Outcome::LeaseRenewed => ()),
        )
    }

    /// [`Command::Acl`].
    pub fn acl(change: AclCommand) -> Self {
        Proposal::new(
            "access-control change",
            Command::Acl(change),
            answer!(Outcome::AclChanged => ()),
        )
    }
}

impl Proposal<TableLimits> {
    /// [`Command::SetLimits`]: answered with the limits now in force.
    pub fn set_limits(change: LimitsChange) -> Self {
        Proposal::new(
            "limits change",
            Command::SetLimits(change),
            answer!(Outcome::LimitsSet(limits) => limits),
        )
    }
}

impl Proposal<FeatureLevel> {
    /// [`Command::SetClusterVersion`]: answered with the cluster version now.
    pub fn set_cluster_version(level: FeatureLevel) -> Self {
        Proposal::new(
            "cluster version change",
            Command::SetClusterVersion { level },
            answer!(Outcome::ClusterVersionSet(level) => level),
        )
    }
}

impl Proposal<AcquireOutcome> {
    /// [`Command::Acquire`] (see there for the fields).
    pub fn acquire(
        session: SessionId,
        lock: String,
        wait: bool,
        attempt: u64,
        lock_delay_ms: u64,
    ) -> Self {
        let command = Command::Acquire {
            session,
            lock,
            wait,
            attempt,
            lock_delay_ms,
        };
        Proposal::new(
            "acquire",
            command,
            answer!(Outcome::Acquire(acquired) => acquired),
        )
    }

    /// [`Command::AcquirePermits`] (see there for the fields); a grant
    /// answers with its first permit's token.
    pub fn acquire_permits(
        session: SessionId,
        semaphore: String,
        capacity: u32,
        count: u32,
        wait: bool,
        attempt: u64,
    ) -> Self {
        let command = Command::AcquirePermits {
            session,
            semaphore,
            capacity,
            count,
            wait,
            attempt,
        };
        Proposal::new(
            "semaphore acquire",
            command,
            answer!(Outcome::Acquire(acquired) => acquired),
        )
    }

    /// [`Command::Campaign`] (see there for the fields); the grant's token
    /// is the leader's term.
    pub fn campaign(
        session: SessionId,
        election: String,
        value: String,
        wait: bool,
        attempt: u64,
    ) -> Self {
        let command = Command::Campaign {
            session,
            election,
            value,
            wait,
            attempt,
        };
        Proposal::new(
            "campaign",
            command,
            answer!(Outcome::Acquire(acquired) => acquired),
        )
    }

    /// [`Command::AcquireRw`] (see there for the fields).
    pub fn acquire_rw(
        session: SessionId,
        lock: String,
        mode: RwMode,
        wait: bool,
        attempt: u64,
    ) -> Self {
        let command = Command::AcquireRw {
            session,
            lock,
            mode,
            wait,
            attempt,
        };
        Proposal::new(
            "read/write acquire",
            command,
            answer!(Outcome::Acquire(acquired) => acquired),
        )
    }
}

impl Proposal<Option<Token>> {
    /// [`Command::CancelWait`]; answers the grant's token if it came first.
    pub fn cancel_wait(session: SessionId, lock: String) -> Self {
        let command = Command::CancelWait { session, lock };
        Proposal::new(
            "cancel wait",
            command,
            answer!(Outcome::WaitCancelled { granted } => granted),
        )
    }

    /// [`Command::Abandon`]; answers the token of the grant it released,
    /// if it released one.
    pub fn abandon(session: SessionId, lock: String, attempt: u64) -> Self {
        let command = Command::Abandon {
            session,
            lock,
            attempt,
        };
        Proposal::new(
            "abandon",
            command,
            answer!(Outcome::Abandoned { released } => released),
        )
    }
}

impl Proposal<Token> {
    /// [`Command::StorePut`]; answers the key's new fence.
    pub fn store_put(key: String, value: String, token: Token, lock: Option<String>) -> Self {
        let command = Command::StorePut {
            key,
            value,
            token,
            lock,
        };
        Proposal::new(
            "store put",
            command,
            answer!(Outcome::Stored { fence } => fence),
        )
    }
}

impl Proposal<StoredValue> {
    /// [`Command::StoreRead`] (a fenced read); answers what the key holds.
    pub fn store_read(key: String, token: Token, lock: Option<String>) -> Self {
        let command = Command::StoreRead { key, token, lock };
        Proposal::new("store read", command, answer!(Outcome::Read(read) => read))
    }
}

impl Proposal<bool> {
    /// [`Command::StoreDelete`]; answers whether the key had a value.
    pub fn store_delete(key: String, token: Token, lock: Option<String>) -> Self {
        let command = Command::StoreDelete { key, token, lock };
        Proposal::new(
            "store delete",
            command,
            answer!(Outcome::Deleted { existed } => existed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockTable;

    /// Applies `proposal` and reads its answer the way the server does.
    fn apply<A>(table: &mut LockTable, proposal: Proposal<A>) -> A {
        let (command, answer) = proposal.into_parts();
        let outcome = table.apply(&command).outcome.expect("applied");
        answer
            .read(outcome)
            .expect("the outcome of its own command")
    }

    #[test]
    fn every_proposal_reads_the_outcome_the_table_gives_its_command() {
        let mut table = LockTable::new();
        let secret = SecretHash([7; 32]);
        let lock = || "l".to_owned();
        let (one, ttl_ms) = apply(&mut table, Proposal::open_session(10_000, secret, None));
        assert_eq!(ttl_ms, 10_000);
        let (two, _) = apply(&mut table, Proposal::open_session(10_000, secret, None));
        let AcquireOutcome::Granted { token } =
            apply(&mut table, Proposal::acquire(one, lock(), true, 1, 0))
        else {
            panic!("a free lock is granted");
        };
        let queued = apply(&mut table, Proposal::acquire(two, lock(), true, 2, 0));
        assert_eq!(queued, AcquireOutcome::Queued { position: 1 });
        assert_eq!(apply(&mut table, Proposal::cancel_wait(two, lock())), None);
        assert_eq!(apply(&mut table, Proposal::abandon(two, lock(), 2)), None);
        apply(&mut table, Proposal::lease_renewed(one));
        let fence = apply(
            &mut table,
            Proposal::store_put("k".into(), "v".into(), token, None),
        );
        assert_eq!(fence, token);
        let read = apply(&mut table, Proposal::store_read("k".into(), token, None));
        assert_eq!(read.value.as_deref(), Some("v"));
        assert!(apply(
            &mut table,
            Proposal::store_delete("k".into(), token, None)
        ));
        apply(&mut table, Proposal::release(one, lock(), token));
        apply(&mut table, Proposal::close_session(one));
        let change = LimitsChange {
            max_sessions: Some(12),
            ..LimitsChange::default()
        };
        let limits = apply(&mut table, Proposal::set_limits(change));
        assert_eq!(limits.max_sessions, 12);
        apply(
            &mut table,
            Proposal::acl(AclCommand::Bootstrap {
                token_id: "root".into(),
                hash: SecretHash([1; 32]),
            }),
        );
    }

    #[test]
    fn an_outcome_of_another_command_is_an_error_not_a_panic() {
        let (_, answer) = Proposal::release(SessionId(1), "l".into(), Token(1)).into_parts();
        let wrong = answer.read(Outcome::SessionEnded).unwrap_err();
        assert_eq!(wrong.kind, "release");
        assert!(wrong.to_string().contains("SessionEnded"), "{wrong}");
    }
}
