//! Talking to Redis: the RESP codec (pure), Redis Cluster slots and topology (pure), and the
//! per-worker pool of event-loop connections.

mod batch;
pub mod breaker;
#[cfg(not(test))]
mod cluster;
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
pub mod resp;
#[cfg(not(test))]
mod sentinel;
pub mod slot;
#[cfg(not(test))]
pub mod tls;
pub mod tls_params;
pub mod topology;
#[cfg(not(test))]
mod tracker;
