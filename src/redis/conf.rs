//! What `ratelimit_redis` says, as this layer keeps it: the addresses, the mode (one server, a
//! Cluster's seeds, a Sentinel group), timeouts, credentials and TLS, and the script its
//! decisions call. [`Builder`] reads the parameters and checks them as a whole; the glue
//! resolves the addresses with nginx's parser, words the errors and turns the TLS parameters
//! into an OpenSSL context ([`super::tls::configure`]).

use ngx::ffi::{ngx_msec_t, sockaddr, socklen_t};

use super::tls::TlsConf;
use super::tls_params::{Taken, TlsParams, PARAM_NAMES as TLS_PARAM_NAMES};
use crate::codec::call::Script;
use crate::codec::resp;
use crate::codec::values::{parse_msec, parse_switch, parse_uint};

/// An address of `ratelimit_redis` as written and as resolved at configuration time.
pub struct SeedAddr {
    /// Points into the configuration cycle's pool, which outlives every worker's use.
    pub sockaddr: *mut sockaddr,
    pub socklen: socklen_t,
    pub name: String,
    pub is_unix: bool,
}

pub struct SentinelConf {
    /// The group's name, as in the sentinels' `sentinel monitor NAME ...`.
    pub name: String,
    /// `AUTH` for the sentinels themselves (`sentinel_password=`, `sentinel_user=`); the
    /// primary's is `RedisConf::auth`. Never logged.
    pub auth: Option<Vec<u8>>,
}

pub struct RedisConf {
    /// `name=`: the backend's name, which `ratelimit_zone ... redis=` picks; empty for the
    /// unnamed one, the default of zones that name none.
    pub backend: String,
    /// Points into the configuration cycle's pool, which outlives every worker's use.
    pub sockaddr: *mut sockaddr,
    pub socklen: socklen_t,
    /// The address as written, for log messages.
    pub name: String,
    pub is_unix: bool,
    /// Every address given, the first included: a Cluster's seeds, or the sentinels.
    pub seeds: Vec<SeedAddr>,
    /// `cluster=on`: the addresses are seeds of a Redis Cluster.
    pub cluster: bool,
    pub pool_size: usize,
    pub timeout: ngx_msec_t,
    pub connect_timeout: ngx_msec_t,
    pub keepalive_timeout: ngx_msec_t,
    pub prefix: Vec<u8>,
    /// `AUTH [user] password`, RESP-encoded, sent first on every connection. Never logged.
    pub auth: Option<Vec<u8>>,
    /// `SELECT db` (`db=`), RESP-encoded, sent after `AUTH` on every data connection.
    pub select: Option<Vec<u8>>,
    /// `sentinel=NAME`: the addresses are sentinels, asked for the primary of this group.
    pub sentinel: Option<SentinelConf>,
    /// Consecutive failures that open the circuit breaker.
    pub fail_threshold: u32,
    /// How long an open breaker lets no decision reach Redis.
    pub fail_backoff: ngx_msec_t,
    /// `ssl=on`: the connections speak TLS (`super::tls`).
    pub tls: Option<TlsConf>,
    /// What decisions call (`EVALSHA`), and load again when Redis has lost it.
    pub script: &'static Script,
}

/// The parameter names of `ratelimit_redis` (TLS aside), for naming a lone word in errors.
const REDIS_PARAMS: [&str; 15] = [
    "name",
    "pool_size",
    "timeout",
    "connect_timeout",
    "keepalive_timeout",
    "fail_threshold",
    "fail_backoff",
    "prefix",
    "cluster",
    "user",
    "password",
    "db",
    "sentinel",
    "sentinel_user",
    "sentinel_password",
];

/// Whether `word` names a parameter of `ratelimit_redis`.
pub fn is_param(word: &str) -> bool {
    word == "ssl" || REDIS_PARAMS.contains(&word) || TLS_PARAM_NAMES.contains(&word)
}

/// Why a parameter of `ratelimit_redis` is refused.
pub enum ParamError {
    /// Not a parameter of the directive.
    Unknown,
    /// A value it does not take; the range it does, to follow the error (or nothing).
    Invalid(&'static str),
    /// A secret written empty: named, its value never echoed.
    Empty,
}

/// `ratelimit_redis` read parameter by parameter, then checked as a whole.
pub struct Builder<'a> {
    conf: RedisConf,
    tls: TlsParams,
    connect_timeout: Option<ngx_msec_t>,
    user: Option<&'a str>,
    password: Option<&'a str>,
    sentinel: SentinelParams<'a>,
}

impl<'a> Builder<'a> {
    /// The defaults, for these addresses (at least one) and this script.
    pub fn new(seeds: Vec<SeedAddr>, script: &'static Script) -> Self {
        let first = &seeds[0];
        let conf = RedisConf {
            backend: String::new(),
            sockaddr: first.sockaddr,
            socklen: first.socklen,
            name: first.name.clone(),
            is_unix: first.is_unix,
            seeds: Vec::new(),
            cluster: false,
            pool_size: 4,
            timeout: 200,
            connect_timeout: 0,
            keepalive_timeout: 60_000,
            prefix: b"rl:".to_vec(),
            auth: None,
            select: None,
            sentinel: None,
            fail_threshold: 3,
            fail_backoff: 1000,
            tls: None,
            script,
        };
        Builder {
            conf: RedisConf { seeds, ..conf },
            tls: TlsParams::default(),
            connect_timeout: None,
            user: None,
            password: None,
            sentinel: SentinelParams::default(),
        }
    }

    /// One `name=value` parameter.
    pub fn param(&mut self, name: &str, value: &'a str) -> Result<(), ParamError> {
        let conf = &mut self.conf;
        match self.sentinel.parse(name, value) {
            Some(Ok(Some(()))) => return Ok(()),
            Some(Ok(None)) => return Err(ParamError::Invalid(range(name))),
            Some(Err(())) => return Err(ParamError::Empty),
            None => {}
        }
        let ok = match name {
            "name" => valid_name(value).then(|| conf.backend = value.to_owned()),
            "pool_size" => parse_uint(value, 1, 4096).map(|n| conf.pool_size = n as usize),
            "timeout" => parse_msec(value).filter(|&t| t > 0).map(|t| conf.timeout = t as _),
            "connect_timeout" => {
                parse_msec(value).filter(|&t| t > 0).map(|t| self.connect_timeout = Some(t as _))
            }
            "keepalive_timeout" => parse_msec(value).map(|t| conf.keepalive_timeout = t as _),
            "fail_threshold" => {
                parse_uint(value, 1, 1_000_000).map(|n| conf.fail_threshold = n as u32)
            }
            "fail_backoff" => {
                parse_msec(value).filter(|&t| t > 0).map(|t| conf.fail_backoff = t as _)
            }
            "prefix" => {
                conf.prefix = value.as_bytes().to_vec();
                Some(())
            }
            "cluster" => parse_switch(value).map(|on| conf.cluster = on),
            "user" if !value.is_empty() => {
                self.user = Some(value);
                Some(())
            }
            "password" if !value.is_empty() => {
                self.password = Some(value);
                Some(())
            }
            // The value is a secret: name the parameter, never echo it.
            "user" | "password" => return Err(ParamError::Empty),
            _ => match self.tls.param(name, value) {
                Taken::Yes => Some(()),
                Taken::NotTls => return Err(ParamError::Unknown),
                Taken::Invalid => None,
            },
        };
        ok.ok_or(ParamError::Invalid(range(name)))
    }

    /// The configuration, and the TLS parameters for `super::tls::configure`; or what is wrong
    /// with the parameters together, as `nginx -t` says it.
    pub fn finish(mut self) -> Result<(RedisConf, TlsParams), String> {
        let conf = &mut self.conf;
        match (self.user, self.password) {
            (_, Some(password)) => conf.auth = Some(resp::auth_command(self.user, password)),
            (Some(_), None) => {
                return Err(
                    "\"user=\" of the \"ratelimit_redis\" directive needs \"password=\"".into()
                )
            }
            (None, None) => {}
        }
        if let Err(msg) = self.sentinel.finish(conf) {
            return Err(format!("{msg} of the \"ratelimit_redis\" directive"));
        }
        if let Some(why) = topology_error(conf) {
            return Err(format!("\"ratelimit_redis\" {why}"));
        }
        // The whole decision must fit in `timeout`, so connecting can never take longer.
        conf.connect_timeout = self.connect_timeout.unwrap_or(conf.timeout).min(conf.timeout);
        Ok((self.conf, self.tls))
    }
}

/// A backend's name: what `redis=` may write and a metrics label may carry.
fn valid_name(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 64
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The range of a number parameter of `ratelimit_redis`, for its error.
fn range(name: &str) -> &'static str {
    match name {
        "name" => ", it must be 1 to 64 letters, digits, \"_\" or \"-\"",
        "db" => {
            ", it must be 0..65535 (Redis itself has 16 databases, 0..15, unless its \
             \"databases\" says more)"
        }
        "pool_size" => ", it must be 1..4096",
        "fail_threshold" => ", it must be 1..1000000",
        _ => "",
    }
}

/// What is wrong with the addresses and the mode asked, if anything.
fn topology_error(redis: &RedisConf) -> Option<String> {
    let unix = redis.seeds.iter().find(|s| s.is_unix).map(|s| s.name.as_str());
    let sentinel = redis.sentinel.is_some();
    match (redis.cluster, unix) {
        (true, _) if sentinel => Some("cannot use \"sentinel=\" with \"cluster=on\"".into()),
        (true, _) if redis.select.is_some() => {
            Some("cannot use \"db=\" with \"cluster=on\": a cluster has one database".into())
        }
        (true, Some(addr)) => Some(format!("cannot use \"{addr}\" with \"cluster=on\"")),
        (false, _) if redis.seeds.len() > 1 && !sentinel => Some(format!(
            "has {} addresses: several need \"cluster=on\" or \"sentinel=\"",
            redis.seeds.len()
        )),
        _ => None,
    }
}

/// `db=` and Sentinel mode's parameters of `ratelimit_redis`.
#[derive(Default)]
struct SentinelParams<'a> {
    db: Option<u64>,
    name: Option<&'a str>,
    user: Option<&'a str>,
    password: Option<&'a str>,
}

impl<'a> SentinelParams<'a> {
    /// `None` for a parameter not of this group; `Some(Err(()))` for an empty secret, which
    /// must be named, never echoed; `Some(Ok(None))` for a bad value.
    fn parse(&mut self, name: &str, value: &'a str) -> Option<Result<Option<()>, ()>> {
        let ok = match name {
            // Redis' own limit (`databases`, 16 by default) is checked by `SELECT` itself.
            "db" => parse_uint(value, 0, 65535).map(|n| self.db = Some(n)),
            "sentinel" => (!value.is_empty()).then(|| self.name = Some(value)),
            "sentinel_user" | "sentinel_password" if value.is_empty() => return Some(Err(())),
            "sentinel_user" => {
                self.user = Some(value);
                Some(())
            }
            "sentinel_password" => {
                self.password = Some(value);
                Some(())
            }
            _ => return None,
        };
        Some(Ok(ok))
    }

    /// `db=` and the Sentinel group into `redis`; or what is wrong, to be said "of the
    /// directive".
    fn finish(self, redis: &mut RedisConf) -> Result<(), &'static str> {
        if let Some(db) = self.db {
            redis.select = Some(resp::command(&[b"SELECT", db.to_string().as_bytes()]));
        }
        let Some(name) = self.name else {
            return match (self.user, self.password) {
                (None, None) => Ok(()),
                _ => Err("\"sentinel_user=\" and \"sentinel_password=\" need \"sentinel=\""),
            };
        };
        if redis.seeds.iter().any(|s| s.is_unix) {
            return Err("\"sentinel=\" takes sentinels' host:port, not unix: sockets");
        }
        let auth = match (self.user, self.password) {
            (user, Some(password)) => Some(resp::auth_command(user, password)),
            (Some(_), None) => return Err("\"sentinel_user=\" needs \"sentinel_password=\""),
            (None, None) => None,
        };
        redis.sentinel = Some(SentinelConf { name: name.to_owned(), auth });
        Ok(())
    }
}
