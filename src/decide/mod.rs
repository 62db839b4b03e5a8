//! The decisions: what a request's answer is and what a worker remembers between requests,
//! pure Rust, so that `cargo test` exercises all of it without nginx: keys, zone figures, the
//! decision script's arguments and replies, calendar quotas, reservations, concurrency slots, the
//! deny cache, the local fallback, the headers and statuses that report a decision.
//!
//! Imports `crate::codec` only: never `ngx`/`nginx_sys`, the glue, `crate::redis` or
//! `crate::metrics`. What it needs of Redis comes as bytes and replies (`codec::call`,
//! `codec::resp`); the clock, as numbers passed in.

pub(crate) mod deny_cache;
pub mod headers;
pub mod key;
pub mod key_buf;
pub mod lease;
pub(crate) mod local_limit;
pub(crate) mod log_throttle;
pub mod params;
pub mod quota;
pub mod script;
pub mod settle;
pub mod slots;
pub mod status;
pub mod table_key;
pub mod text;
