//! [`LockGuard`]: a held lock and the fencing token it was granted with.
//!
//! Holding a guard does not by itself make it safe to act: the session's
//! lease can be lost at any moment (a pause, a partition), and then another
//! client may take the lock. The token is what keeps that safe: resources
//! that record the highest token they have seen can refuse writes carrying
//! an older one.

use crate::session::Claim;
use crate::{Error, Permit, Session};

/// How a read/write lock is held: beside other shared holders, or alone
/// (docs/rw-locks.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RwMode {
    Shared,
    Exclusive,
}

impl RwMode {
    /// The mode as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            RwMode::Shared => "shared",
            RwMode::Exclusive => "exclusive",
        }
    }
}

/// A lock held by a [`Session`]. Release it with [`release`](Self::release)
/// to learn whether it was still held; dropping it releases in the
/// background instead.
#[derive(Debug)]
pub struct LockGuard {
    session: Session,
    lock: String,
    token: u64,
    /// A semaphore's permits (none for a lock).
    permits: Vec<Permit>,
    released: bool,
    /// Held until the release is done, so that no new acquire of the same
    /// lock through this session can overtake it.
    claim: Option<Claim>,
}

impl LockGuard {
    pub(crate) fn new(session: Session, claim: Claim, token: u64, permits: Vec<Permit>) -> Self {
        Self {
            session,
            lock: claim.lock().to_owned(),
            token,
            permits,
            released: false,
            claim: Some(claim),
        }
    }

    /// The fencing token of this grant: larger than that of any earlier
    /// grant of any lock. Pass it along with every write the lock protects.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// A semaphore grant's permits, tokens ascending, each with the slot
    /// (0..capacity) that no other live permit has; empty for a lock.
    pub fn permits(&self) -> &[Permit] {
        &self.permits
    }

    pub fn name(&self) -> &str {
        &self.lock
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    /// As an election's leader ([`Session::campaign`]), tells everyone
    /// `value` instead of the value it campaigned with. Refused if this
    /// leadership has ended.
    pub async fn proclaim(&self, value: &str) -> Result<(), Error> {
        self.session.proclaim(&self.lock, self.token, value).await
    }

    /// Ends an election's leadership: the next candidate in line leads,
    /// in a larger term. The same call as [`release`](Self::release), by
    /// the name elections use.
    pub async fn resign(self) -> Result<(), Error> {
        self.release().await
    }

    /// Releases the lock. An error of kind `StaleToken`, `NotHolder`,
    /// `UnknownSession` or `SessionExpiring` means the lock had already been
    /// lost, so whatever was done under it may have overlapped with another
    /// holder.
    pub async fn release(mut self) -> Result<(), Error> {
        let result = self.session.release(&self.lock, self.token).await;
        // Only now: if this future is dropped half-way, `Drop` still
        // releases in the background.
        self.released = true;
        result
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // Closing the session already released the lock on the server.
        if self.released || self.session.is_closed() {
            return;
        }
        let (session, lock, token, claim) = (
            self.session.clone(),
            std::mem::take(&mut self.lock),
            self.token,
            self.claim.take(),
        );
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _claim = claim;
                    if let Err(error) = session.release(&lock, token).await {
                        tracing::warn!(
                            session = session.id(),
                            lock,
                            token,
                            %error,
                            "could not release dropped lock guard"
                        );
                    }
                });
            }
            Err(_) => tracing::debug!(
                session = session.id(),
                lock,
                token,
                "lock guard dropped outside a runtime; the lock is freed when the session ends"
            ),
        }
    }
}
