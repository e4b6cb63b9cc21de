//! Every integration test of the backends, in one binary: each file is a
//! module with its own "why", and `common` is the contract they share.
//!
//! Why one binary: each test binary compiles and links every backend client
//! (redis, etcd, PostgreSQL, Deadbolt's own) anew; one binary does it once.

mod common;
mod etcd;
mod postgres;
mod redis;
