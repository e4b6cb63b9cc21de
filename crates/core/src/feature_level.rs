//! [`FeatureLevel`]: which commands and encodings the replicated state may
//! use. The cluster version is the level the table is at, raised (never
//! lowered) by [`crate::Command::SetClusterVersion`].
//!
//! Why a level in the table: in a cluster that is being upgraded one node
//! at a time, a leader on the new release must not write a log entry or a
//! snapshot that a follower on the old release cannot decode (that
//! follower would stop, or never catch up). So what a release adds to the
//! log is written only once the cluster version allows it, and the leader
//! raises the cluster version only when every member says it supports the
//! new level (as etcd's cluster version and CockroachDB's version gates
//! do). Being in the table, the level is agreed through Raft, survives
//! restarts and leader changes, and travels in snapshots and backups.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A feature level. Levels only grow; a release supports every level up to
/// its own ([`FeatureLevel::NEWEST`] for this build). A level is fixed when
/// the release that introduced it is tagged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FeatureLevel(pub u32);

impl FeatureLevel {
    /// Release 0.1.0: everything before cluster versions existed. A member
    /// that does not report a level is at this one, and so is a table
    /// decoded from a snapshot or backup that records none.
    pub const BASE: FeatureLevel = FeatureLevel(1);
    /// The cluster version itself: [`crate::Command::SetClusterVersion`]
    /// in the log, and snapshots and backups that record the level (which
    /// release 0.1.0 cannot decode).
    pub const CLUSTER_VERSION: FeatureLevel = FeatureLevel(2);
    /// Counting semaphores ([`crate::Command::AcquirePermits`]), and
    /// snapshots and backups that carry them after the table.
    pub const SEMAPHORES: FeatureLevel = FeatureLevel(3);
    /// Read/write locks ([`crate::Command::AcquireRw`]), kept with the
    /// semaphores: both came in release 0.2.0, before it was tagged.
    pub const RW_LOCKS: FeatureLevel = FeatureLevel(3);
    /// Leader elections ([`crate::Command::Campaign`],
    /// [`crate::Command::Proclaim`]), from the same release.
    pub const ELECTIONS: FeatureLevel = FeatureLevel(3);
    /// Followers forwarding client calls to the leader: no change to the
    /// log, but a leader of release 0.1.0 would take a forwarded call for
    /// the forwarding node's own (its node certificate's identity). From
    /// the same release.
    pub const FORWARDING: FeatureLevel = FeatureLevel(3);
    /// Credentials that end: tokens with an expiry
    /// ([`crate::AclCommand::CreateExpiringToken`]) and a deny list of
    /// identities ([`crate::AclCommand::DenyIdentity`]), and snapshots and
    /// backups that carry both after the semaphores.
    pub const CREDENTIAL_ENDS: FeatureLevel = FeatureLevel(4);
    /// The highest level this build's state machine applies.
    pub const NEWEST: FeatureLevel = FeatureLevel::CREDENTIAL_ENDS;

    /// The level a member reports, as a number on the wire: 0 (an older
    /// member's unset field) is [`FeatureLevel::BASE`].
    pub fn reported(level: u32) -> FeatureLevel {
        FeatureLevel(level).max(FeatureLevel::BASE)
    }
}

impl Default for FeatureLevel {
    fn default() -> Self {
        FeatureLevel::BASE
    }
}

impl fmt::Display for FeatureLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
