//! ngx_http_ratelimit_module: an exact, atomic, non-blocking Redis rate limiter for nginx.
//!
//! Pure logic (RESP, parameter parsing, script arguments and replies, headers, keys) lives in
//! modules without FFI so that `cargo test` links and exercises it without nginx; the nginx glue
//! is kept to the modules compiled out of unit tests.

mod deny_cache;
pub mod headers;
pub mod key;
pub mod lease;
mod local_limit;
mod log_throttle;
pub mod metrics;
pub mod params;
pub mod quota;
pub mod redis;
pub mod script;
pub mod slots;
pub mod status;
pub mod text;

#[cfg(not(test))]
mod admin;
#[cfg(not(test))]
mod auth_target;
#[cfg(not(test))]
mod conf;
#[cfg(not(test))]
mod directives;
#[cfg(not(test))]
mod giveback;
#[cfg(not(test))]
mod handler;
#[cfg(not(test))]
mod module;
#[cfg(not(test))]
mod variables;
