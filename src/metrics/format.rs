//! The metrics as Prometheus text exposition (format 0.0.4) and as JSON, from a snapshot.

use core::fmt::{self, Write};

use super::{
    Counter, Gauge, View, BUCKETS_US, ERROR_KINDS, LEASE_EVENTS, REPLY_CLASSES, SLOT_EVENTS,
    STATUSES,
};

/// What the figures are about: the zone names (in layout order) and the Redis server's name.
pub struct Labels<'a> {
    pub zones: &'a [&'a str],
    pub server: &'a str,
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
    let server = Escaped(l.server);
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
        let h = "ratelimit_redis_call_duration_seconds";
        writeln!(o, "# HELP {h} Round trip of one script call, from its write to its reply.")?;
        writeln!(o, "# TYPE {h} histogram")?;
        for (b, n) in BUCKETS_US.iter().zip(v.buckets()) {
            writeln!(o, "{h}_bucket{{server=\"{server}\",le=\"{}\"}} {n}", Seconds(*b))?;
        }
        let count = v.round_trips();
        writeln!(o, "{h}_bucket{{server=\"{server}\",le=\"+Inf\"}} {count}")?;
        writeln!(o, "{h}_sum{{server=\"{server}\"}} {}", Seconds(v.round_trip_sum_us()))?;
        writeln!(o, "{h}_count{{server=\"{server}\"}} {count}")?;
        for (g, name, help) in SERVER_GAUGES {
            writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge")?;
            writeln!(o, "{name}{{server=\"{server}\"}} {}", v.gauge(g))?;
        }
        for (c, name, help) in SERVER_COUNTERS {
            writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter")?;
            writeln!(o, "{name}{{server=\"{server}\"}} {}", v.counter(c))?;
        }
        let e = "ratelimit_redis_errors_total";
        writeln!(
            o,
            "# HELP {e} Failed Redis decisions, by kind (error replies: see error_replies)."
        )?;
        writeln!(o, "# TYPE {e} counter")?;
        for (i, (_, kind)) in ERROR_KINDS.iter().enumerate() {
            writeln!(o, "{e}{{server=\"{server}\",kind=\"{kind}\"}} {}", v.errors(i))?;
        }
        let e = "ratelimit_redis_error_replies_total";
        writeln!(o, "# HELP {e} Error replies to whole script calls, by class (first word).")?;
        writeln!(o, "# TYPE {e} counter")?;
        for (i, class) in REPLY_CLASSES.iter().enumerate() {
            writeln!(o, "{e}{{server=\"{server}\",class=\"{class}\"}} {}", v.replies(i))?;
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
        writeln!(o, "# HELP {d} Settlements given up: Redis did not take them in time.")?;
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
        write!(
            o,
            "}},\"redis\":{{\"{}\":{{\"call_duration_seconds\":{{\"buckets\":{{",
            Escaped(l.server)
        )?;
        for (i, (b, n)) in BUCKETS_US.iter().zip(v.buckets()).enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(o, "{sep}\"{}\":{n}", Seconds(*b))?;
        }
        let count = v.round_trips();
        write!(
            o,
            ",\"+Inf\":{count}}},\"sum\":{},\"count\":{count}}}",
            Seconds(v.round_trip_sum_us())
        )?;
        for (g, name, _) in SERVER_GAUGES {
            write!(o, ",\"{}\":{}", &name["ratelimit_redis_".len()..], v.gauge(g))?;
        }
        for (c, name, _) in SERVER_COUNTERS {
            let key = name["ratelimit_redis_".len()..].trim_end_matches("_total");
            write!(o, ",\"{key}\":{}", v.counter(c))?;
        }
        o.write_str(",\"errors\":{")?;
        for (i, (_, kind)) in ERROR_KINDS.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(o, "{sep}\"{kind}\":{}", v.errors(i))?;
        }
        o.write_str("},\"error_replies\":{")?;
        for (i, class) in REPLY_CLASSES.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(o, "{sep}\"{class}\":{}", v.replies(i))?;
        }
        let (delayed, delay_ms) = v.delayed();
        let (returned, charged, lost) = v.settlements();
        writeln!(
            o,
            "}}}}}},\"deny_cache_entries\":{},\"delays\":{{\"waiting\":{},\"delayed\":{delayed},\
             \"delay_seconds\":{}}},\"settled_units\":{{\"returned\":{returned},\
             \"charged\":{charged}}},\"settlements_lost\":{lost}}}",
            v.deny_cache_entries(),
            v.waiting(),
            Seconds(delay_ms * 1000)
        )
    })();
    o
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
    use crate::metrics::test_metrics;

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

    const LABELS: Labels<'static> = Labels { zones: &["api", "per_ip"], server: "127.0.0.1:6379" };

    #[test]
    fn exposition() {
        let cells = sample();
        let text = prometheus(&View { cells: &cells, zones: 2 }, &LABELS);
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
        let text = json(&View { cells: &cells, zones: 2 }, &LABELS);
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
