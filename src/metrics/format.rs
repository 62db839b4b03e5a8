//! The metrics as Prometheus text exposition (format 0.0.4) and as JSON, from a snapshot.

use core::fmt::{self, Write};

use super::{
    Counter, Gauge, Server, View, BUCKETS_US, ERROR_KINDS, LEASE_EVENTS, REPLY_CLASSES,
    SLOT_EVENTS, STATUSES,
};

/// What the figures are about: the zone names and the Redis backends, in layout order.
pub struct Labels<'a> {
    pub zones: &'a [&'a str],
    pub backends: &'a [Backend<'a>],
}

/// A Redis backend: its `name=` ("" for the unnamed one, whose series carry no `backend` label,
/// as before backends had names) and its server, as written.
#[derive(Clone, Copy)]
pub struct Backend<'a> {
    pub name: &'a str,
    pub server: &'a str,
}

impl Backend<'_> {
    /// The labels of its series: `server="…"`, after `backend="…",` for a named one.
    fn labels(&self) -> String {
        let server = Escaped(self.server);
        if self.name.is_empty() {
            format!("server=\"{server}\"")
        } else {
            format!("backend=\"{}\",server=\"{server}\"", Escaped(self.name))
        }
    }
}

/// Label values and JSON strings share the escapes that matter here: `\`, `"`, newline.
struct Escaped<'a>(&'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '"' => f.write_str("\\\"")?,
                '\n' => f.write_str("\\n")?,
                c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// Microseconds as seconds, exactly (no float rounding): `1500` → `0.0015`.
struct Seconds(u64);

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (s, us) = (self.0 / 1_000_000, self.0 % 1_000_000);
        if us == 0 {
            return write!(f, "{s}");
        }
        let frac = format!("{us:06}");
        write!(f, "{s}.{}", frac.trim_end_matches('0'))
    }
}

fn status_name(i: usize) -> &'static str {
    // Statuses are ASCII constants.
    core::str::from_utf8(STATUSES[i].as_bytes()).unwrap_or("")
}

const SERVER_COUNTERS: [(Counter, &str, &str); 4] = [
    (Counter::Connects, "ratelimit_redis_connects_total", "Connections opened to Redis."),
    (
        Counter::ScriptLoads,
        "ratelimit_redis_script_loads_total",
        "SCRIPT LOAD sent after NOSCRIPT (Redis restarted or flushed its scripts).",
    ),
    (
        Counter::BreakerOpenings,
        "ratelimit_redis_breaker_openings_total",
        "Times a worker's circuit breaker opened.",
    ),
    (
        Counter::Rerouted,
        "ratelimit_redis_reroutes_total",
        "Decisions of a Cluster node's batch sent again alone: a key was not on that node.",
    ),
];

const SERVER_GAUGES: [(Gauge, &str, &str); 3] = [
    (
        Gauge::InFlight,
        "ratelimit_redis_decisions_in_flight",
        "Decisions written to Redis and not answered yet, over all workers.",
    ),
    (
        Gauge::Connections,
        "ratelimit_redis_connections",
        "Open Redis connections, over all workers.",
    ),
    (Gauge::BreakerOpen, "ratelimit_redis_breaker_open", "Workers whose circuit breaker is open."),
];

/// The Prometheus text exposition format.
pub fn prometheus(v: &View<'_>, l: &Labels<'_>) -> String {
    let mut o = String::with_capacity(4096);
    let _ = (|| -> fmt::Result {
        o.write_str(
            "# HELP ratelimit_decisions_total Requests decided, by zone and $ratelimit_status.\n\
             # TYPE ratelimit_decisions_total counter\n",
        )?;
        for (z, name) in l.zones.iter().enumerate() {
            for i in 0..STATUSES.len() {
                let (zone, status, n) = (Escaped(name), status_name(i), v.status(z, i));
                writeln!(
                    o,
                    "ratelimit_decisions_total{{zone=\"{zone}\",status=\"{status}\"}} {n}"
                )?;
            }
        }
        o.write_str(
            "# HELP ratelimit_consumed_units_total Units (request costs) recorded, by zone.\n\
             # TYPE ratelimit_consumed_units_total counter\n",
        )?;
        for (z, name) in l.zones.iter().enumerate() {
            writeln!(
                o,
                "ratelimit_consumed_units_total{{zone=\"{}\"}} {}",
                Escaped(name),
                v.units(z)
            )?;
        }
        let u = "ratelimit_lease_units_total";
        writeln!(o, "# HELP {u} Units reserved (lease=), and given back unspent.")?;
        writeln!(o, "# TYPE {u} counter")?;
        for (z, name) in l.zones.iter().enumerate() {
            for (i, (_, event)) in LEASE_EVENTS.iter().enumerate() {
                let n = v.lease(z, i);
                writeln!(o, "{u}{{zone=\"{}\",event=\"{event}\"}} {n}", Escaped(name))?;
            }
        }
        let s = "ratelimit_concurrency_slots_total";
        writeln!(o, "# HELP {s} Concurrency slots taken, released, renewed, and found lapsed.")?;
        writeln!(o, "# TYPE {s} counter")?;
        for (z, name) in l.zones.iter().enumerate() {
            for (i, (_, event)) in SLOT_EVENTS.iter().enumerate() {
                let n = v.slot(z, i);
                writeln!(o, "{s}{{zone=\"{}\",event=\"{event}\"}} {n}", Escaped(name))?;
            }
        }
        // Every Redis family's samples, one backend after another, under its one # TYPE.
        let servers: Vec<(String, Server<'_>)> =
            l.backends.iter().enumerate().map(|(b, be)| (be.labels(), v.server(b))).collect();
        let h = "ratelimit_redis_call_duration_seconds";
        writeln!(o, "# HELP {h} Round trip of one script call, from its write to its reply.")?;
        writeln!(o, "# TYPE {h} histogram")?;
        for (labels, s) in &servers {
            for (b, n) in BUCKETS_US.iter().zip(s.buckets()) {
                writeln!(o, "{h}_bucket{{{labels},le=\"{}\"}} {n}", Seconds(*b))?;
            }
            let count = s.round_trips();
            writeln!(o, "{h}_bucket{{{labels},le=\"+Inf\"}} {count}")?;
            writeln!(o, "{h}_sum{{{labels}}} {}", Seconds(s.round_trip_sum_us()))?;
            writeln!(o, "{h}_count{{{labels}}} {count}")?;
        }
        for (g, name, help) in SERVER_GAUGES {
            writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge")?;
            for (labels, s) in &servers {
                writeln!(o, "{name}{{{labels}}} {}", s.gauge(g))?;
            }
        }
        for (c, name, help) in SERVER_COUNTERS {
            writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter")?;
            for (labels, s) in &servers {
                writeln!(o, "{name}{{{labels}}} {}", s.counter(c))?;
            }
        }
        let e = "ratelimit_redis_errors_total";
        writeln!(
            o,
            "# HELP {e} Failed Redis decisions, by kind (error replies: see error_replies)."
        )?;
        writeln!(o, "# TYPE {e} counter")?;
        for (labels, s) in &servers {
            for (i, (_, kind)) in ERROR_KINDS.iter().enumerate() {
                writeln!(o, "{e}{{{labels},kind=\"{kind}\"}} {}", s.errors(i))?;
            }
        }
        let e = "ratelimit_redis_error_replies_total";
        writeln!(o, "# HELP {e} Error replies to whole script calls, by class (first word).")?;
        writeln!(o, "# TYPE {e} counter")?;
        for (labels, s) in &servers {
            for (i, class) in REPLY_CLASSES.iter().enumerate() {
                writeln!(o, "{e}{{{labels},class=\"{class}\"}} {}", s.replies(i))?;
            }
        }
        let d = "ratelimit_deny_cache_entries";
        writeln!(o, "# HELP {d} Rejections remembered by the deny caches, over all workers.")?;
        writeln!(o, "# TYPE {d} gauge\n{d} {}", v.deny_cache_entries())?;
        let (delayed, delay_ms) = v.delayed();
        let d = "ratelimit_requests_waiting";
        writeln!(o, "# HELP {d} Requests waiting for their turn (delay=), over all workers.")?;
        writeln!(o, "# TYPE {d} gauge\n{d} {}", v.waiting())?;
        let d = "ratelimit_delayed_requests_total";
        writeln!(o, "# HELP {d} Requests admitted after a wait (delay=).")?;
        writeln!(o, "# TYPE {d} counter\n{d} {delayed}")?;
        let d = "ratelimit_delay_seconds_total";
        writeln!(o, "# HELP {d} The waits of delayed requests, summed.")?;
        writeln!(o, "# TYPE {d} counter\n{d} {}", Seconds(delay_ms * 1000))?;
        let (returned, charged, lost) = v.settlements();
        let d = "ratelimit_settled_units_total";
        writeln!(o, "# HELP {d} Units settlements gave back or charged past the limit (settle=).")?;
        writeln!(o, "# TYPE {d} counter")?;
        writeln!(o, "{d}{{event=\"returned\"}} {returned}\n{d}{{event=\"charged\"}} {charged}")?;
        let d = "ratelimit_settlements_lost_total";
        writeln!(
            o,
            "# HELP {d} Settlements given up: Redis did not take them in time, or refused them."
        )?;
        writeln!(o, "# TYPE {d} counter\n{d} {lost}")
    })();
    o
}

/// The same figures as one JSON object.
pub fn json(v: &View<'_>, l: &Labels<'_>) -> String {
    let mut o = String::with_capacity(2048);
    let _ = (|| -> fmt::Result {
        o.write_str("{\"zones\":{")?;
        for (z, name) in l.zones.iter().enumerate() {
            let sep = if z == 0 { "" } else { "," };
            write!(o, "{sep}\"{}\":{{\"decisions\":{{", Escaped(name))?;
            for i in 0..STATUSES.len() {
                let sep = if i == 0 { "" } else { "," };
                write!(o, "{sep}\"{}\":{}", status_name(i), v.status(z, i))?;
            }
            write!(o, "}},\"consumed_units\":{},\"lease_units\":{{", v.units(z))?;
            for (i, (_, event)) in LEASE_EVENTS.iter().enumerate() {
                let sep = if i == 0 { "" } else { "," };
                write!(o, "{sep}\"{event}\":{}", v.lease(z, i))?;
            }
            o.write_str("},\"concurrency_slots\":{")?;
            for (i, (_, event)) in SLOT_EVENTS.iter().enumerate() {
                let sep = if i == 0 { "" } else { "," };
                write!(o, "{sep}\"{event}\":{}", v.slot(z, i))?;
            }
            o.write_str("}}")?;
        }
        // The unnamed backend under "redis" by its server, as before backends had names; each
        // named one under "backends" by its name, then its server.
        o.write_str("},\"redis\":{")?;
        let unnamed = l.backends.iter().enumerate().filter(|(_, be)| be.name.is_empty());
        for (i, (b, be)) in unnamed.enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(o, "{sep}\"{}\":", Escaped(be.server))?;
            server_json(&mut o, &v.server(b))?;
        }
        o.write_str("},\"backends\":{")?;
        let named = l.backends.iter().enumerate().filter(|(_, be)| !be.name.is_empty());
        for (i, (b, be)) in named.enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(o, "{sep}\"{}\":{{\"{}\":", Escaped(be.name), Escaped(be.server))?;
            server_json(&mut o, &v.server(b))?;
            o.write_str("}")?;
        }
        let (delayed, delay_ms) = v.delayed();
        let (returned, charged, lost) = v.settlements();
        writeln!(
            o,
            "}},\"deny_cache_entries\":{},\"delays\":{{\"waiting\":{},\"delayed\":{delayed},\
             \"delay_seconds\":{}}},\"settled_units\":{{\"returned\":{returned},\
             \"charged\":{charged}}},\"settlements_lost\":{lost}}}",
            v.deny_cache_entries(),
            v.waiting(),
            Seconds(delay_ms * 1000)
        )
    })();
    o
}

/// One backend's object: `{"call_duration_seconds": {...}, "decisions_in_flight": 0, ...}`.
fn server_json(o: &mut String, s: &Server<'_>) -> fmt::Result {
    o.write_str("{\"call_duration_seconds\":{\"buckets\":{")?;
    for (i, (b, n)) in BUCKETS_US.iter().zip(s.buckets()).enumerate() {
        let sep = if i == 0 { "" } else { "," };
        write!(o, "{sep}\"{}\":{n}", Seconds(*b))?;
    }
    let count = s.round_trips();
    write!(
        o,
        ",\"+Inf\":{count}}},\"sum\":{},\"count\":{count}}}",
        Seconds(s.round_trip_sum_us())
    )?;
    for (g, name, _) in SERVER_GAUGES {
        write!(o, ",\"{}\":{}", &name["ratelimit_redis_".len()..], s.gauge(g))?;
    }
    for (c, name, _) in SERVER_COUNTERS {
        let key = name["ratelimit_redis_".len()..].trim_end_matches("_total");
        write!(o, ",\"{key}\":{}", s.counter(c))?;
    }
    o.write_str(",\"errors\":{")?;
    for (i, (_, kind)) in ERROR_KINDS.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        write!(o, "{sep}\"{kind}\":{}", s.errors(i))?;
    }
    o.write_str("},\"error_replies\":{")?;
    for (i, class) in REPLY_CLASSES.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        write!(o, "{sep}\"{class}\":{}", s.replies(i))?;
    }
    o.write_str("}}")
}

/// The page of a metrics zone too small for the counters: no sample at all, so that dashboards
/// show no data and `absent()` alerts fire, rather than zeros that read as "no traffic".
pub fn disabled(json: bool) -> String {
    const WHY: &str = "ratelimit_metrics_zone is full, metrics are not counted";
    if json {
        format!("{{\"error\":\"{WHY}\"}}\n")
    } else {
        format!("# {WHY}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::status::Status;
    use crate::metrics::{test_backends, test_metrics, ErrorKind};

    fn sample() -> Vec<u64> {
        let m = test_metrics(2);
        m.decision(0, Status::Passed, 2);
        m.decision(1, Status::Rejected, 0);
        m.round_trip(150);
        m.round_trip(1_500_000);
        m.error_reply(b"BUSY running");
        m.delay(1500);
        m.delay(250);
        m.waited();
        m.settled(false, 70);
        m.settled(true, 150);
        m.settlement_lost();
        m.snapshot().unwrap()
    }

    const LABELS: Labels<'static> = Labels {
        zones: &["api", "per_ip"],
        backends: &[Backend { name: "", server: "127.0.0.1:6379" }],
    };

    #[test]
    fn exposition() {
        let cells = sample();
        let text = prometheus(&View { cells: &cells, zones: 2, backends: 1 }, &LABELS);
        for line in [
            "ratelimit_decisions_total{zone=\"api\",status=\"PASSED\"} 1",
            "ratelimit_decisions_total{zone=\"per_ip\",status=\"REJECTED\"} 1",
            "ratelimit_decisions_total{zone=\"per_ip\",status=\"REJECTED_DRY_RUN\"} 0",
            "ratelimit_consumed_units_total{zone=\"api\"} 2",
            "ratelimit_redis_call_duration_seconds_bucket{server=\"127.0.0.1:6379\",le=\"0.0001\"} 0",
            "ratelimit_redis_call_duration_seconds_bucket{server=\"127.0.0.1:6379\",le=\"0.00025\"} 1",
            "ratelimit_redis_call_duration_seconds_bucket{server=\"127.0.0.1:6379\",le=\"1\"} 1",
            "ratelimit_redis_call_duration_seconds_bucket{server=\"127.0.0.1:6379\",le=\"+Inf\"} 2",
            "ratelimit_redis_call_duration_seconds_sum{server=\"127.0.0.1:6379\"} 1.50015",
            "ratelimit_redis_call_duration_seconds_count{server=\"127.0.0.1:6379\"} 2",
            "ratelimit_redis_error_replies_total{server=\"127.0.0.1:6379\",class=\"BUSY\"} 1",
            "# TYPE ratelimit_redis_connections gauge",
            "ratelimit_deny_cache_entries 0",
            "ratelimit_requests_waiting 1",
            "ratelimit_delayed_requests_total 2",
            "ratelimit_delay_seconds_total 1.75",
            "ratelimit_settled_units_total{event=\"returned\"} 70",
            "ratelimit_settled_units_total{event=\"charged\"} 150",
            "ratelimit_settlements_lost_total 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // Every sample belongs to the family its # TYPE line announced just before.
        let mut family = "";
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap();
            } else if !l.starts_with('#') {
                assert!(l.starts_with(family), "{l} outside {family}");
            }
        }
    }

    #[test]
    fn json_is_well_formed() {
        let cells = sample();
        let text = json(&View { cells: &cells, zones: 2, backends: 1 }, &LABELS);
        assert!(text.starts_with("{\"zones\":{\"api\":{\"decisions\":{\"PASSED\":1,"), "{text}");
        assert!(text.contains("\"sum\":1.50015,\"count\":2}"), "{text}");
        assert!(text.contains("\"error_replies\":{\"NOSCRIPT\":0,\"LOADING\":0,\"BUSY\":1"));
        let depth = text.chars().fold(0i32, |d, c| match c {
            '{' => d + 1,
            '}' => d - 1,
            _ => d,
        });
        assert_eq!(depth, 0, "{text}");
        let delays = "\"deny_cache_entries\":0,\"delays\":{\"waiting\":1,\"delayed\":2,\
                      \"delay_seconds\":1.75},\"settled_units\":{\"returned\":70,\
                      \"charged\":150},\"settlements_lost\":1}\n";
        assert!(text.ends_with(delays), "{text}");
        assert!(text.contains(",\"connects\":0,\"script_loads\":0,\"breaker_openings\":0,"));
        assert!(text.contains("}}},\"backends\":{},\"deny_cache_entries\""), "{text}");
    }

    /// Issue 34: the unnamed backend's series as before, a named one's with its `backend`
    /// label, each with its own figures; in JSON under "redis" and "backends".
    fn two_backends() -> (Vec<u64>, Labels<'static>) {
        let m = test_backends(1, 2);
        m.backend(0).round_trip(150);
        let regional = m.backend(1);
        regional.round_trip(3_000);
        regional.round_trip(4_000);
        regional.failure(Some(ErrorKind::Timeout));
        regional.gauge(Gauge::BreakerOpen, 1);
        m.decision(0, Status::Passed, 1);
        let labels = Labels {
            zones: &["q"],
            backends: &[
                Backend { name: "", server: "127.0.0.1:6379" },
                Backend { name: "regional", server: "10.0.0.2:6379" },
            ],
        };
        (m.snapshot().unwrap(), labels)
    }

    #[test]
    fn exposition_per_backend() {
        let (cells, labels) = two_backends();
        let text = prometheus(&View { cells: &cells, zones: 1, backends: 2 }, &labels);
        let h = "ratelimit_redis_call_duration_seconds";
        let (d, r) = ("server=\"127.0.0.1:6379\"", "backend=\"regional\",server=\"10.0.0.2:6379\"");
        for line in [
            format!("{h}_bucket{{{d},le=\"0.00025\"}} 1"),
            format!("{h}_count{{{d}}} 1"),
            format!("{h}_bucket{{{r},le=\"0.0025\"}} 0"),
            format!("{h}_bucket{{{r},le=\"0.005\"}} 2"),
            format!("{h}_sum{{{r}}} 0.007"),
            format!("{h}_count{{{r}}} 2"),
            format!("ratelimit_redis_errors_total{{{d},kind=\"timeout\"}} 0"),
            format!("ratelimit_redis_errors_total{{{r},kind=\"timeout\"}} 1"),
            format!("ratelimit_redis_breaker_open{{{d}}} 0"),
            format!("ratelimit_redis_breaker_open{{{r}}} 1"),
            format!("ratelimit_redis_error_replies_total{{{r},class=\"other\"}} 0"),
            "ratelimit_decisions_total{zone=\"q\",status=\"PASSED\"} 1".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // Each Redis family once, both backends' samples under it; the default's first.
        let families: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).collect();
        let mut unique = families.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), families.len(), "{text}");
        let connections: Vec<&str> =
            text.lines().filter(|l| l.starts_with("ratelimit_redis_connections{")).collect();
        assert_eq!(connections.len(), 2, "{text}");
        assert!(connections[0].starts_with("ratelimit_redis_connections{server="));
        // Only Redis series carry the label.
        let labelled = text.lines().filter(|l| l.contains("backend=")).count();
        let redis = text.lines().filter(|l| l.starts_with("ratelimit_redis_")).count();
        assert_eq!(2 * labelled, redis, "{text}");
    }

    #[test]
    fn json_per_backend() {
        let (cells, labels) = two_backends();
        let text = json(&View { cells: &cells, zones: 1, backends: 2 }, &labels);
        let default = "\"redis\":{\"127.0.0.1:6379\":{\"call_duration_seconds\":{\"buckets\":\
                       {\"0.0001\":0,\"0.00025\":1,";
        assert!(text.contains(default), "{text}");
        let regional = "\"backends\":{\"regional\":{\"10.0.0.2:6379\":\
                        {\"call_duration_seconds\":{\"buckets\":{\"0.0001\":0,";
        assert!(text.contains(regional), "{text}");
        assert!(text.contains("\"sum\":0.007,\"count\":2}"), "{text}");
        assert!(text.contains("\"breaker_open\":1,"), "{text}");
        assert!(text.contains("\"errors\":{\"refused\":0,\"timeout\":1,"), "{text}");
        assert!(text.contains("}}}},\"deny_cache_entries\":0,"), "{text}");
        let depth = text.chars().try_fold(0i32, |d, c| {
            let d = match c {
                '{' => d + 1,
                '}' => d - 1,
                _ => d,
            };
            (d >= 0).then_some(d)
        });
        assert_eq!(depth, Some(0), "{text}");
        // Only named backends: "redis" is empty.
        let labels = Labels { zones: &["q"], backends: &labels.backends[1..] };
        let cells = test_backends(1, 1).snapshot().unwrap();
        let text = json(&View { cells: &cells, zones: 1, backends: 1 }, &labels);
        assert!(text.contains("\"redis\":{},\"backends\":{\"regional\":{\"10.0.0.2"), "{text}");
    }

    #[test]
    fn escapes_and_seconds() {
        assert_eq!(Escaped("a\"b\\c\nd").to_string(), "a\\\"b\\\\c\\nd");
        assert_eq!(Seconds(100).to_string(), "0.0001");
        assert_eq!(Seconds(2_500).to_string(), "0.0025");
        assert_eq!(Seconds(1_000_000).to_string(), "1");
        assert_eq!(Seconds(0).to_string(), "0");
    }

    #[test]
    fn disabled_has_no_samples() {
        let text = disabled(false);
        assert!(text.lines().all(|l| l.starts_with("# ")), "{text}");
        assert_eq!(
            disabled(true),
            "{\"error\":\"ratelimit_metrics_zone is full, metrics are not counted\"}\n"
        );
    }
}
