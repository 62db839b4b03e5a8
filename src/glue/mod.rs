//! The nginx glue: the module's registration, its directives and configuration, the access
//! handler, the variables, the `ratelimit_admin` and `ratelimit_metrics` content handlers, the
//! metrics zone, the `auth_request` check and the give-back timer. Everything that touches
//! nginx's HTTP and configuration structures, and every module-global lookup
//! (`RateLimit::main_conf`, the worker's pool through [`conf::MainConf::pool`]), is here.
//!
//! May import every layer below: `crate::redis`, `crate::metrics`, `crate::decide`,
//! `crate::codec`. Compiled out of unit tests, which cannot link nginx.

mod admin;
mod auth_target;
pub mod conf;
mod directives;
mod giveback;
mod handler;
mod metrics_page;
mod metrics_zone;
pub mod module;
mod request;
mod settle;
mod value;
mod variables;
