//! The history format and its checker, shared by the fault-injection runner
//! (`deadbolt-nemesis run`, real processes) and the deterministic simulation
//! (`deadbolt-sim`, one process): both record the same operations and are
//! judged by the same rules; and the tally of how many times a run broke
//! mutual exclusion (`deadbolt-nemesis run --backend`, docs/backends.md);
//! whether clients were served while a majority was up (`availability.rs`);
//! a watch stream against the service's audit trail (`watched.rs`); and
//! each counter's increments for linearizability, with stateright's
//! tester (`linearizable.rs`).
//!
//! A crate of its own because it is pure (records in, violations out) and
//! neither runner's: the simulation depends on it without building the
//! nemesis's process launcher and its Redis, etcd and PostgreSQL clients.

pub mod availability;
pub mod checker;
pub mod history;
pub mod linearizable;
pub mod tally;
pub mod watched;
