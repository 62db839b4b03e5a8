//! The TLS parameters of `ratelimit_redis` (`ssl=`, `ssl_*=`, named after nginx's
//! `proxy_ssl_*`): parsing and the checks between them, without FFI, so that `cargo test`
//! covers them. `super::tls` turns the result into an OpenSSL context at configuration time.

use crate::codec::values::{parse_switch, parse_uint};

/// nginx's protocol bits (`NGX_SSL_TLSv1` ...), which `ngx_ssl_create` takes; `super::tls`
/// asserts at compile time that they still are.
pub const TLS_V1: u32 = 0x0008;
pub const TLS_V1_1: u32 = 0x0010;
pub const TLS_V1_2: u32 = 0x0020;
pub const TLS_V1_3: u32 = 0x0040;
const PROTOCOLS: [(&str, u32); 4] =
    [("TLSv1", TLS_V1), ("TLSv1.1", TLS_V1_1), ("TLSv1.2", TLS_V1_2), ("TLSv1.3", TLS_V1_3)];

/// nginx's `proxy_ssl_verify_depth` default.
pub const DEFAULT_VERIFY_DEPTH: u32 = 1;
const MAX_VERIFY_DEPTH: u64 = 100;

/// The parameters as written; `None` is "not given".
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TlsParams {
    pub ssl: Option<bool>,
    pub verify: Option<bool>,
    pub trusted_certificate: Option<String>,
    pub verify_depth: Option<u32>,
    pub name: Option<String>,
    pub server_name: Option<bool>,
    pub certificate: Option<String>,
    pub certificate_key: Option<String>,
    pub protocols: Option<u32>,
    pub ciphers: Option<String>,
    pub session_reuse: Option<bool>,
    /// The first `ssl_*=` parameter written, to name it when `ssl=on` is missing.
    first: Option<&'static str>,
}

/// What [`TlsParams::param`] made of a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    Yes,
    /// Not a TLS parameter: the caller goes on.
    NotTls,
    /// A TLS parameter with an invalid value.
    Invalid,
}

/// What the connections do, once the parameters are checked against each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub protocols: u32,
    pub ciphers: String,
    /// `Some(CA file)`: verify the server's certificate against it; `None`: `ssl_verify=off`.
    pub trusted_certificate: Option<String>,
    pub verify_depth: u32,
    pub name: Peer,
    /// `ssl_server_name=on` and a host name: sent as SNI. Never an IP literal (RFC 6066).
    pub sni: Option<String>,
    /// Client certificate and key files (mutual TLS).
    pub certificate: Option<(String, String)>,
    pub session_reuse: bool,
}

/// What the server's certificate must name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// A DNS name (`X509_check_host` through `ngx_ssl_check_host`).
    Host(String),
    /// An IP literal (an IP SAN, checked by OpenSSL during verification).
    Ip(String),
    /// The address was given as an IP literal and no `ssl_name=`: each server's certificate
    /// must name the IP it is reached at (every node of a Cluster its own).
    OwnIp,
}

impl Peer {
    pub fn as_str(&self) -> &str {
        match self {
            Peer::Host(s) | Peer::Ip(s) => s,
            Peer::OwnIp => "",
        }
    }
}

fn nonempty(value: &str) -> Option<String> {
    (!value.is_empty() && !value.contains(char::is_whitespace)).then(|| value.to_owned())
}

/// `TLSv1.2:TLSv1.3`: nginx's protocol names, colon-separated, each once.
pub fn parse_protocols(value: &str) -> Option<u32> {
    let mut bits = 0;
    for name in value.split(':') {
        let &(_, bit) = PROTOCOLS.iter().find(|(n, _)| *n == name)?;
        if bits & bit != 0 {
            return None;
        }
        bits |= bit;
    }
    Some(bits)
}

/// The host part of a `ratelimit_redis` address as written: `host`, `host:port`,
/// `[v6]:port`, `[v6]`; `None` for `unix:`.
pub fn host_of(addr: &str) -> Option<&str> {
    if addr.starts_with("unix:") {
        return None;
    }
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split_once(']').map(|(h, _)| h);
    }
    // A bare IPv6 literal has more than one colon and no port.
    match addr.matches(':').count() {
        0 => Some(addr),
        1 => addr.split_once(':').map(|(h, _)| h),
        _ => Some(addr),
    }
}

fn peer(name: &str) -> Peer {
    match name.parse::<std::net::IpAddr>() {
        Ok(ip) => Peer::Ip(ip.to_string()),
        Err(_) => Peer::Host(name.to_owned()),
    }
}

impl TlsParams {
    /// Takes `name=value` if it is a TLS parameter.
    pub fn param(&mut self, name: &str, value: &str) -> Taken {
        let ok = match name {
            "ssl" => parse_switch(value).map(|v| self.ssl = Some(v)),
            "ssl_verify" => parse_switch(value).map(|v| self.verify = Some(v)),
            "ssl_trusted_certificate" => {
                nonempty(value).map(|v| self.trusted_certificate = Some(v))
            }
            "ssl_verify_depth" => {
                parse_uint(value, 0, MAX_VERIFY_DEPTH).map(|n| self.verify_depth = Some(n as u32))
            }
            "ssl_name" => nonempty(value).map(|v| self.name = Some(v)),
            "ssl_server_name" => parse_switch(value).map(|v| self.server_name = Some(v)),
            "ssl_certificate" => nonempty(value).map(|v| self.certificate = Some(v)),
            "ssl_certificate_key" => nonempty(value).map(|v| self.certificate_key = Some(v)),
            "ssl_protocols" => parse_protocols(value).map(|v| self.protocols = Some(v)),
            "ssl_ciphers" => nonempty(value).map(|v| self.ciphers = Some(v)),
            "ssl_session_reuse" => parse_switch(value).map(|v| self.session_reuse = Some(v)),
            _ => return Taken::NotTls,
        };
        if name != "ssl" && self.first.is_none() {
            self.first = PARAM_NAMES.iter().copied().find(|&n| n == name);
        }
        if ok.is_some() {
            Taken::Yes
        } else {
            Taken::Invalid
        }
    }

    /// Checks the parameters against each other and the address (as written); `Ok(None)`: no
    /// TLS. `Err` is the message for `nginx -t`, which appends the file and line.
    pub fn resolve(&self, addr: &str, is_unix: bool) -> Result<Option<TlsSettings>, String> {
        const D: &str = "of the \"ratelimit_redis\" directive";
        match self.ssl {
            Some(true) => {}
            // An explicit ssl=off turns TLS off and keeps the rest for later.
            Some(false) => return Ok(None),
            None => {
                return match self.first {
                    Some(p) => Err(format!("\"{p}=\" {D} needs \"ssl=on\"")),
                    None => Ok(None),
                }
            }
        }
        if is_unix {
            return Err(format!(
                "\"ssl=on\" {D} is not for a unix: address (Redis serves TLS on TCP ports only)"
            ));
        }
        let verify = self.verify.unwrap_or(true);
        let trusted_certificate = match (&self.trusted_certificate, verify) {
            (Some(ca), true) => Some(ca.clone()),
            (None, true) => {
                return Err(format!(
                    "\"ssl=on\" {D} verifies the server's certificate and needs \
                     \"ssl_trusted_certificate=\" with a CA file, or an explicit \
                     \"ssl_verify=off\""
                ))
            }
            (_, false) => None,
        };
        let certificate = match (&self.certificate, &self.certificate_key) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            (None, None) => None,
            (Some(_), None) => {
                return Err(format!("\"ssl_certificate=\" {D} needs \"ssl_certificate_key=\""))
            }
            (None, Some(_)) => {
                return Err(format!("\"ssl_certificate_key=\" {D} needs \"ssl_certificate=\""))
            }
        };
        let name = match (&self.name, host_of(addr)) {
            (Some(n), _) => peer(n),
            (None, Some(h)) if !h.is_empty() => match peer(h) {
                Peer::Ip(_) => Peer::OwnIp,
                host => host,
            },
            _ => return Err(format!("\"ssl=on\" {D} needs \"ssl_name=\" for \"{addr}\"")),
        };
        let sni = match (&name, self.server_name.unwrap_or(true)) {
            (Peer::Host(h), true) => Some(h.clone()),
            _ => None,
        };
        Ok(Some(TlsSettings {
            protocols: self.protocols.unwrap_or(TLS_V1_2 | TLS_V1_3),
            ciphers: self.ciphers.clone().unwrap_or_else(|| "DEFAULT".to_owned()),
            trusted_certificate,
            verify_depth: self.verify_depth.unwrap_or(DEFAULT_VERIFY_DEPTH),
            name,
            sni,
            certificate,
            session_reuse: self.session_reuse.unwrap_or(true),
        }))
    }
}

/// The `ssl_*=` parameters (`ssl=` aside), also for naming a lone word in errors.
pub const PARAM_NAMES: [&str; 10] = [
    "ssl_verify",
    "ssl_trusted_certificate",
    "ssl_verify_depth",
    "ssl_name",
    "ssl_server_name",
    "ssl_certificate",
    "ssl_certificate_key",
    "ssl_protocols",
    "ssl_ciphers",
    "ssl_session_reuse",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&str]) -> Result<TlsParams, String> {
        let mut p = TlsParams::default();
        for a in args {
            let (n, v) = a.split_once('=').unwrap();
            match p.param(n, v) {
                Taken::Yes => {}
                Taken::NotTls => return Err(format!("not mine: {a}")),
                Taken::Invalid => return Err(format!("invalid: {a}")),
            }
        }
        Ok(p)
    }

    fn settings(addr: &str, args: &[&str]) -> Result<Option<TlsSettings>, String> {
        parsed(args)?.resolve(addr, addr.starts_with("unix:"))
    }

    #[test]
    fn protocols() {
        assert_eq!(parse_protocols("TLSv1.2:TLSv1.3"), Some(TLS_V1_2 | TLS_V1_3));
        assert_eq!(parse_protocols("TLSv1.3"), Some(TLS_V1_3));
        assert_eq!(parse_protocols("TLSv1:TLSv1.1"), Some(TLS_V1 | TLS_V1_1));
        for bad in
            ["", "TLSv1.4", "SSLv3", "TLSv1.2:", "TLSv1.2 TLSv1.3", "tlsv1.2", "TLSv1.2:TLSv1.2"]
        {
            assert_eq!(parse_protocols(bad), None, "{bad}");
        }
    }

    #[test]
    fn hosts() {
        assert_eq!(host_of("redis.example.net:6380"), Some("redis.example.net"));
        assert_eq!(host_of("redis.example.net"), Some("redis.example.net"));
        assert_eq!(host_of("127.0.0.1:6380"), Some("127.0.0.1"));
        assert_eq!(host_of("[::1]:6380"), Some("::1"));
        assert_eq!(host_of("[::1]"), Some("::1"));
        assert_eq!(host_of("::1"), Some("::1"));
        assert_eq!(host_of("unix:/run/redis.sock"), None);
    }

    #[test]
    fn values() {
        let mut p = TlsParams::default();
        assert_eq!(p.param("pool_size", "4"), Taken::NotTls);
        assert_eq!(p.param("ssl", "yes"), Taken::Invalid);
        assert_eq!(p.param("ssl_verify", "1"), Taken::Invalid);
        assert_eq!(p.param("ssl_verify_depth", "-1"), Taken::Invalid);
        assert_eq!(p.param("ssl_verify_depth", "101"), Taken::Invalid);
        assert_eq!(p.param("ssl_verify_depth", "3"), Taken::Yes);
        assert_eq!(p.param("ssl_trusted_certificate", ""), Taken::Invalid);
        assert_eq!(p.param("ssl_name", "a b"), Taken::Invalid);
        assert_eq!(p.param("ssl_protocols", "TLSv1.4"), Taken::Invalid);
        assert_eq!(p.param("ssl_session_reuse", "off"), Taken::Yes);
        assert_eq!(p.verify_depth, Some(3));
        assert_eq!(p.session_reuse, Some(false));
    }

    #[test]
    fn defaults() {
        let s = settings("redis.example.net:6380", &["ssl=on", "ssl_trusted_certificate=ca.pem"])
            .unwrap()
            .unwrap();
        assert_eq!(
            s,
            TlsSettings {
                protocols: TLS_V1_2 | TLS_V1_3,
                ciphers: "DEFAULT".into(),
                trusted_certificate: Some("ca.pem".into()),
                verify_depth: 1,
                name: Peer::Host("redis.example.net".into()),
                sni: Some("redis.example.net".into()),
                certificate: None,
                session_reuse: true,
            }
        );
        assert_eq!(settings("127.0.0.1:6379", &[]), Ok(None));
        assert_eq!(settings("127.0.0.1:6379", &["ssl=off"]), Ok(None));
        // ssl=off keeps the other parameters for when it is switched on again.
        assert_eq!(settings("127.0.0.1:6379", &["ssl=off", "ssl_name=x"]), Ok(None));
    }

    #[test]
    fn names() {
        let ca = "ssl_trusted_certificate=ca.pem";
        // An IP literal is verified as an IP and never sent as SNI.
        let s = settings("127.0.0.1:6380", &["ssl=on", ca]).unwrap().unwrap();
        assert_eq!((s.name, s.sni), (Peer::OwnIp, None));
        let s = settings("[::1]:6380", &["ssl=on", ca]).unwrap().unwrap();
        assert_eq!((s.name, s.sni), (Peer::OwnIp, None));
        // ssl_name= names what is verified and sent.
        let s =
            settings("127.0.0.1:6380", &["ssl=on", ca, "ssl_name=redis.test"]).unwrap().unwrap();
        assert_eq!(s.name, Peer::Host("redis.test".into()));
        assert_eq!(s.sni.as_deref(), Some("redis.test"));
        let s = settings("redis.test:6380", &["ssl=on", ca, "ssl_name=10.0.0.1"]).unwrap().unwrap();
        assert_eq!((s.name, s.sni), (Peer::Ip("10.0.0.1".into()), None));
        let s =
            settings("redis.test:6380", &["ssl=on", ca, "ssl_server_name=off"]).unwrap().unwrap();
        assert_eq!((s.name, s.sni), (Peer::Host("redis.test".into()), None));
    }

    #[test]
    fn checks() {
        let err = settings("127.0.0.1:6380", &["ssl=on"]).unwrap_err();
        assert!(err.contains("needs \"ssl_trusted_certificate=\""), "{err}");
        assert!(err.contains("\"ssl_verify=off\""), "{err}");
        assert!(err.contains("\"ratelimit_redis\""), "{err}");
        let s = settings("127.0.0.1:6380", &["ssl=on", "ssl_verify=off"]).unwrap().unwrap();
        assert_eq!(s.trusted_certificate, None);
        let s = settings("h:1", &["ssl=on", "ssl_verify=off", "ssl_trusted_certificate=ca.pem"]);
        assert_eq!(s.unwrap().unwrap().trusted_certificate, None);

        let mtls = ["ssl=on", "ssl_verify=off", "ssl_certificate=c.pem"];
        let err = settings("127.0.0.1:6380", &mtls).unwrap_err();
        assert!(err.contains("\"ssl_certificate=\" of the \"ratelimit_redis\" directive needs \"ssl_certificate_key=\""), "{err}");
        let err = settings("h:1", &["ssl=on", "ssl_verify=off", "ssl_certificate_key=k.pem"])
            .unwrap_err();
        assert!(err.contains("needs \"ssl_certificate=\""), "{err}");
        let s = settings(
            "h:1",
            &["ssl=on", "ssl_verify=off", "ssl_certificate=c", "ssl_certificate_key=k"],
        );
        assert_eq!(s.unwrap().unwrap().certificate, Some(("c".into(), "k".into())));

        let err = settings("unix:/run/redis.sock", &["ssl=on", "ssl_verify=off"]).unwrap_err();
        assert!(err.contains("not for a unix: address"), "{err}");
        let err = settings("127.0.0.1:6380", &["ssl_name=redis.test"]).unwrap_err();
        assert!(
            err.contains("\"ssl_name=\" of the \"ratelimit_redis\" directive needs \"ssl=on\""),
            "{err}"
        );
    }
}
