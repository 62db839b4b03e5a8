//! ngx_http_ratelimit_module: an exact, atomic, non-blocking Redis rate limiter for nginx.
//!
//! Five layers, each a folder whose `mod.rs` says what it holds and what it may import; imports
//! point down only (`make check-layers`, docs/layout.md):
//!
//! - [`glue`]: the nginx module: registration, directives, configuration, the handlers. The
//!   only layer that knows nginx's HTTP structures; compiled out of unit tests.
//! - [`redis`]: the worker's connections to Redis on nginx's event loop.
//! - [`metrics`]: the counters in shared memory.
//! - [`decide`]: what a request's answer is, pure Rust.
//! - [`codec`]: bytes and text in and out, pure Rust: RESP, key slots, the script call's framing,
//!   directive value syntax.

pub mod codec;
pub mod decide;
#[cfg(not(test))]
mod glue;
pub mod metrics;
pub mod redis;
