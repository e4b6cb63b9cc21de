//! An election as one handle, the shape of etcd's `concurrency.Election`
//! and Curator's `LeaderLatch`: campaign, proclaim, resign, ask who leads
//! and follow the changes, all on the name given once.
//!
//! Why a handle and not only the calls it is made of
//! ([`Session::campaign`], [`LockGuard::proclaim`], [`Client::leader`],
//! [`Client::observe_leader`]): a replica that campaigns usually also
//! asks who leads and follows the changes, and those take the client,
//! not the session, so one value that knows its election keeps the two
//! from naming different ones.

use crate::{Client, Error, LeaderChanges, LeaderResponse, LockGuard, Session};
use std::time::Duration;

/// The election `name`, from [`Client::election`].
#[derive(Debug, Clone)]
pub struct Election {
    client: Client,
    name: String,
}

impl Client {
    /// The election `name` (docs/elections.md): campaign in it through a
    /// session, ask who leads, follow the changes.
    pub fn election(&self, name: &str) -> Election {
        Election {
            client: self.clone(),
            name: name.to_owned(),
        }
    }
}

impl Election {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs for leader with `value` through `session`, waiting in FIFO
    /// order for as long as it takes; see [`Session::campaign`]. The
    /// guard's token is the term; [`LockGuard::resign`] ends the
    /// leadership, [`LockGuard::proclaim`] changes the value.
    pub async fn campaign(&self, session: &Session, value: &str) -> Result<LockGuard, Error> {
        session.campaign(&self.name, value).await
    }

    /// [`campaign`](Self::campaign), waiting at most `timeout`.
    pub async fn campaign_timeout(
        &self,
        session: &Session,
        value: &str,
        timeout: Duration,
    ) -> Result<LockGuard, Error> {
        session.campaign_timeout(&self.name, value, timeout).await
    }

    /// The leader (session, term, value) and the candidates; see
    /// [`Client::leader`].
    pub async fn leader(&self) -> Result<LeaderResponse, Error> {
        self.client.leader(&self.name).await
    }

    /// The leadership now, then at each change; see
    /// [`Client::observe_leader`].
    pub async fn observe(&self) -> Result<LeaderChanges, Error> {
        self.client.observe_leader(&self.name).await
    }
}
