//! The worker's way to Redis on nginx's event loop: pipelined connections (TLS optional), a
//! pool per server with its circuit breaker and probes, Redis Cluster (slot table, redirections)
//! and Sentinel (the group's primary), and the tracking that tells the deny cache and the
//! reservations when keys change.
//!
//! Imports `crate::codec` (RESP, key slots, the script call's framing) and `crate::metrics`
//! (the handle it counts through), and nothing above: never the glue or its configuration
//! structures, nor `crate::decide`. It owns its configuration ([`conf::RedisConf`], what
//! `ratelimit_redis` says, the script its calls run included), is handed it and the metrics
//! handle when the pool is made ([`pool::WorkerPool::get`]), and carries decisions as encoded
//! call arguments (`codec::call::Args`) whose replies it hands back unread. Its pure parts (breaker, batching
//! rule, topology parsing, invalidation events, TLS parameters) are unit-tested; the rest needs
//! nginx and is compiled out of unit tests.

mod batch;
pub mod breaker;
#[cfg(not(test))]
mod cluster;
#[cfg(not(test))]
pub mod conf;
#[cfg(not(test))]
mod conn;
#[cfg(not(test))]
pub mod follow;
pub mod invalidation;
#[cfg(not(test))]
mod node;
#[cfg(not(test))]
pub mod pool;
#[cfg(not(test))]
mod query;
#[cfg(not(test))]
mod sentinel;
#[cfg(not(test))]
pub mod tls;
pub mod tls_params;
pub mod topology;
#[cfg(not(test))]
mod tracker;
