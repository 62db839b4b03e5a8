//! Talking to Redis: the RESP codec (pure), Redis Cluster slots and topology (pure), and the
//! per-worker pool of event-loop connections.

pub mod breaker;
#[cfg(not(test))]
mod conn;
#[cfg(not(test))]
pub mod pool;
pub mod resp;
pub mod slot;
pub mod topology;
