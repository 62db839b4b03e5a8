//! Calendar periods of quota zones: the `period=` and `utc_offset=` values, their encoding in
//! the script's window field (`lua/decide.lua`, "q"), and the length of the period holding a
//! time, which the draft `RateLimit-Policy` announces as `w`. The script computes the period's
//! bounds itself, from its own clock; this mirror only serves the headers.

const MINUTE: u64 = 60_000;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;
/// A fixed UTC offset is at most this many minutes either way (real ones are -12:00..+14:00).
const MAX_OFFSET_MIN: i64 = 1439;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeriodKind {
    Hour = 1,
    Day = 2,
    /// From Monday 00:00, as ISO 8601 weeks.
    Week = 3,
    Month = 4,
}

/// A calendar period in a fixed offset from UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    pub kind: PeriodKind,
    pub offset_min: i64,
}

impl PeriodKind {
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "hour" => Some(PeriodKind::Hour),
            "day" => Some(PeriodKind::Day),
            "week" => Some(PeriodKind::Week),
            "month" => Some(PeriodKind::Month),
            _ => None,
        }
    }

    /// As `period=` names it.
    pub fn name(self) -> &'static str {
        match self {
            PeriodKind::Hour => "hour",
            PeriodKind::Day => "day",
            PeriodKind::Week => "week",
            PeriodKind::Month => "month",
        }
    }
}

/// `+02:00`, `-05:30`, `+0`, `Z`: the offset in minutes.
pub fn parse_offset(value: &str) -> Option<i64> {
    if value == "Z" {
        return Some(0);
    }
    let (sign, rest) = match value.as_bytes().first()? {
        b'+' => (1, &value[1..]),
        b'-' => (-1, &value[1..]),
        _ => return None,
    };
    let (h, m) = rest.split_once(':').unwrap_or((rest, "0"));
    let digits = |s: &str| !s.is_empty() && s.len() <= 2 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(h) || !digits(m) {
        return None;
    }
    let (h, m): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
    let total = h * 60 + m;
    (m < 60 && total <= MAX_OFFSET_MIN).then_some(sign * total)
}

impl Period {
    /// The script's window field for "q": (offset in minutes + 1440) * 10 + kind.
    pub fn encode(self) -> u64 {
        ((self.offset_min + 1440) * 10) as u64 + self.kind as u64
    }

    /// The length in ms of the period that holds UTC time `now_ms`.
    pub fn length_ms(self, now_ms: u64) -> u64 {
        match self.kind {
            PeriodKind::Hour => HOUR,
            PeriodKind::Day => DAY,
            PeriodKind::Week => 7 * DAY,
            PeriodKind::Month => {
                let local = now_ms as i64 + self.offset_min * MINUTE as i64;
                let (y, m) = year_month(local.div_euclid(DAY as i64));
                month_days(y, m) * DAY
            }
        }
    }
}

/// The year and month of a day counted from 1970-01-01 (H. Hinnant's days-to-civil, as the
/// script has it).
fn year_month(days: i64) -> (i64, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m)
}

fn month_days(y: i64, m: u32) -> u64 {
    match m {
        2 if y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn month(offset_min: i64) -> Period {
        Period { kind: PeriodKind::Month, offset_min }
    }

    #[test]
    fn offsets() {
        assert_eq!(parse_offset("+02:00"), Some(120));
        assert_eq!(parse_offset("-05:30"), Some(-330));
        assert_eq!(parse_offset("+14"), Some(840));
        assert_eq!(parse_offset("Z"), Some(0));
        assert_eq!(parse_offset("-0"), Some(0));
        assert_eq!(parse_offset("+23:59"), Some(1439));
        for bad in ["", "2", "+24:00", "+1:60", "+:30", "+123", "+02:", "+02:00:00", "+a"] {
            assert_eq!(parse_offset(bad), None, "{bad}");
        }
    }

    #[test]
    fn encoding_matches_the_script() {
        assert_eq!(month(0).encode(), 14404);
        assert_eq!(Period { kind: PeriodKind::Hour, offset_min: -1439 }.encode(), 11);
        assert_eq!(Period { kind: PeriodKind::Day, offset_min: 1439 }.encode(), 28792);
        assert_eq!(PeriodKind::parse("week"), Some(PeriodKind::Week));
        assert_eq!(PeriodKind::parse("year"), None);
        for k in [PeriodKind::Hour, PeriodKind::Day, PeriodKind::Week, PeriodKind::Month] {
            assert_eq!(PeriodKind::parse(k.name()), Some(k));
        }
    }

    #[test]
    fn month_lengths() {
        // 2024-02-10, 2023-02-10, 2100-02-10, 2000-02-10, 2024-04-10, 1999-12-31 (ms).
        let days = |ms: u64| month(0).length_ms(ms) / DAY;
        assert_eq!(days(1_707_523_200_000), 29);
        assert_eq!(days(1_675_987_200_000), 28);
        assert_eq!(days(4_105_814_400_000), 28);
        assert_eq!(days(950_140_800_000), 29);
        assert_eq!(days(1_712_707_200_000), 30);
        assert_eq!(days(946_684_799_999), 31);
        // 2024-02-29 23:00 UTC is March at +02:00, February at -05:30.
        let t = 1_709_247_600_000;
        assert_eq!(month(120).length_ms(t) / DAY, 31);
        assert_eq!(month(-330).length_ms(t) / DAY, 29);
        assert_eq!(Period { kind: PeriodKind::Week, offset_min: 0 }.length_ms(t), 7 * DAY);
    }
}
