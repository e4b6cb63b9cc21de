//! Every integration test of the server, in one binary: each file is a
//! module with its own "why".
//!
//! Why one binary: each test binary compiles the embedded node (openraft,
//! the stores, the harness in `common`) and links it anew. Five binaries
//! cost a cold CI build about 110 s of CPU; one compiles and links it once.

mod abandoned_calls;
mod clock_jumps;
mod common;
mod expiry;
mod membership;
mod regressions;
mod waits;
