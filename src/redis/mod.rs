//! Talking to Redis: the RESP codec (pure) and the per-worker pool of event-loop connections.

pub mod breaker;
#[cfg(not(test))]
mod conn;
#[cfg(not(test))]
pub mod pool;
pub mod resp;
#[cfg(not(test))]
pub mod tls;
pub mod tls_params;
