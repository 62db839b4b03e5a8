//! The bottom layer: bytes and text in and out, pure Rust without nginx, shared by the layers
//! above: the RESP codec, a queue of byte strings and buffers kept for reuse, Redis Cluster key
//! slots, the script call's framing, and the syntax of directive values.
//!
//! Imports nothing of the crate outside `codec`: it knows neither decisions nor connections.

pub mod buffers;
pub mod byte_queue;
pub mod call;
pub mod resp;
pub mod slot;
pub mod values;
