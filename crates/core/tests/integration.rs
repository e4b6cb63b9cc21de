//! Every integration test of the core state machine, in one binary: each
//! file is a module with its own "why".
//!
//! Why one binary: each test binary compiles proptest and the core anew and
//! links them; one binary does it once.

mod acl;
mod fenced_store;
mod leases;
mod limits;
mod properties;
mod regressions;
mod semaphores;
