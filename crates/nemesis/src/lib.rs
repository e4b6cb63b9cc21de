//! The history format and its checker, shared by the fault-injection runner
//! (`deadbolt-nemesis run`, real processes) and the deterministic simulation
//! (`deadbolt-sim`, one process): both record the same operations and are
//! judged by the same rules.

pub mod checker;
pub mod history;
