//! [`Label`]: what each backend guarantees, stated once, for `deadbolt
//! backends` and `docs/backends.md` (which holds the same table). Each entry
//! says what survives a lock-server crash, a failover and a client pause,
//! and what the token is, next to the seeds' one-word verdict; the
//! fault-injection runs that are to measure these are listed in the docs.

/// The lock systems this crate speaks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Deadbolt,
    Redis,
    Redlock,
    Etcd,
    Postgres,
}

/// One backend's guarantees, in words.
#[derive(Debug)]
pub struct Label {
    pub backend: Backend,
    pub name: &'static str,
    pub url: &'static str,
    /// The seeds' verdict ("Weak", "Debated", ...), for comparison.
    pub seeds: &'static str,
    pub server_crash: &'static str,
    pub failover: &'static str,
    pub client_pause: &'static str,
    pub token: &'static str,
    /// Read/write locks, semaphores and elections: what the system itself
    /// offers, and whether this crate uses it (`Session::lock_in` with
    /// `Mode::Shared`, `Session::campaign`).
    pub primitives: &'static str,
}

pub const LABELS: [Label; 5] = [
    Label {
        backend: Backend::Deadbolt,
        name: "deadbolt",
        url: "http://HOST:PORT[,...]",
        seeds: "(not in the seeds)",
        server_crash:
            "kept: a grant is acknowledged only once a majority fsynced it; leases restart \
                       with a full TTL (they can outlive it, never end early)",
        failover: "kept: Raft elects a leader, which restarts leases from checkpoints or in full",
        client_pause:
            "the lease expires after the TTL and the lock passes on; the paused holder's \
                       late writes are refused by a resource that checks the token",
        token: "fencing token: Raft-replicated counter, strictly increasing across locks, crashes \
                and failovers",
        primitives:
            "read/write locks, semaphores and elections, fenced and FIFO (docs/rw-locks.md, \
                     semaphores.md, elections.md); use the Deadbolt server itself, not --backend",
    },
    Label {
        backend: Backend::Redis,
        name: "redis",
        url: "redis[s]://[[USER]:PASSWORD@]HOST:PORT[/DB][?fence=counter&ca=CA.pem]",
        seeds: "Weak; no fencing token built in",
        server_crash:
            "LOST without persistence: a restarted server forgets every lock, so the next \
                       client gets it while the old holder still works",
        failover: "UNSAFE: replication is asynchronous; a promoted replica may lack the lock key",
        client_pause:
            "the key expires after the TTL and the lock passes on; the paused holder acts \
                       late with nothing to stop it",
        token:
            "none; with ?fence=counter an INCR counter (Token::Counter), NOT a fencing token: a \
                restart without persistence or a failover can repeat it",
        primitives: "none native: read/write locks and semaphores are client recipes (Redisson's \
                     RReadWriteLock, RSemaphore) with the same unsafe expiry; not supported here",
    },
    Label {
        backend: Backend::Redlock,
        name: "redlock",
        url: "redlock[s]://[[USER]:PASSWORD@]HOST:PORT,... (3 or more)[?ca=CA.pem]",
        seeds: "Debated; no fencing token",
        server_crash:
            "survives a minority of masters down; a master restarting WITHOUT persistence \
                       forgets its keys, so two clients can each count a majority (unless restarts \
                       are delayed by a TTL)",
        failover: "no replicas by design (independent masters): see server crash",
        client_pause: "the lock ends after its validity time; the paused holder acts late, and \
                       safety assumes bounded pauses, delays and clock drift (Kleppmann)",
        token: "none: Redlock cannot produce a fencing token",
        primitives: "none: Redlock defines only an exclusive lock; not supported here",
    },
    Label {
        backend: Backend::Etcd,
        name: "etcd",
        url: "etcd[s]://[USER:PASSWORD@]HOST:PORT[,...][?ca=CA.pem]",
        seeds: "Strong (with fencing); token: revision",
        server_crash: "kept while a majority of members is up: the lease and the lock key are in \
                       etcd's Raft log",
        failover: "kept: the new leader restarts lease TTLs in full (never ends one early)",
        client_pause:
            "the lease expires after the TTL and the lock passes on; the paused holder's \
                       late writes are refused by a resource that checks the token",
        token: "fencing token: the lock key's create revision, strictly increasing, replicated",
        primitives: "elections are native, and supported (elect --backend etcd://...: the \
                     v3election API's Campaign, FIFO by create revision; Proclaim and Leader; \
                     the leader key's create revision is the term and fences); read/write locks \
                     and semaphores are client recipes (etcd's recipes package), not supported \
                     here",
    },
    Label {
        backend: Backend::Postgres,
        name: "postgres",
        url: "postgres://USER:PASSWORD@HOST:PORT/DB[?sslmode=verify-full&sslrootcert=CA.pem]",
        seeds: "Strong within the DB; token: use DB transactions",
        server_crash: "the locks end with the server's sessions; every holder sees its connection \
                       close (lost) before anyone can lock again",
        failover:
            "UNSAFE to rely on: advisory locks are not replicated, a promoted standby starts \
                   with none, and an asynchronous standby's sequence may repeat recent tokens",
        client_pause:
            "a holder hung with its socket open keeps the lock until idle_session_timeout \
                       (set to the TTL) ends its session; then the token fences late writes",
        token: "fencing token: nextval of sequence deadbolt_fence in the same database",
        primitives:
            "shared advisory locks are native, and supported (run --backend postgres://... \
                     --shared: pg_advisory_lock_shared beside other readers, never beside a \
                     pg_advisory_lock writer; a stream of readers can keep a writer waiting; each \
                     grant takes a token from the sequence); no semaphores or elections",
    },
];

impl Backend {
    pub fn label(self) -> &'static Label {
        LABELS
            .iter()
            .find(|label| label.backend == self)
            .expect("every backend has a label")
    }
}
