//! The conformance suite: one set of scenarios that every Deadbolt client
//! (Rust, Python, TypeScript) must pass, run against real `deadbolt server`
//! processes.
//!
//! Why a runner and drivers: the rules a client keeps (the conservative
//! lease deadline, `lost` firing before anyone else can be granted the
//! lock, FIFO waits, retries that never hold two grants, the error kinds)
//! are the same in every language, and a test suite per language would
//! drift apart. So each client ships a small driver program that speaks
//! the line protocol of `README.md`, and the scenarios here drive it; the
//! Rust client's driver is `src/bin/driver.rs`.

mod driver;
pub mod scenarios;

pub use driver::{token, ClientUnderTest, Driver, Refusal};
