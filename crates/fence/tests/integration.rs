//! Every integration test of the fencing toolkit, in one binary: each file
//! is a module with its own "why" (and its own feature gate).
//!
//! Why one binary: each test binary compiles and links its dependencies
//! anew; one binary does it once.

mod gate_properties;
mod http;
mod postgres;
