//! Times for people and for scripts: `TimeDisplay` (a local or UTC clock
//! time with its age), RFC 3339 for `-o json`, durations through core's
//! `time_text` (the one formatter), and aligned tables.

use cascade_core::time_text;
use cascade_core::Timestamp;
use serde_json::{json, Value};

/// How text output shows instants: in which time zone (the system's,
/// which honours `TZ`, or UTC), and against which "now" ages are counted.
#[derive(Debug, Clone)]
pub struct TimeDisplay {
    zone: jiff::tz::TimeZone,
    utc: bool,
    now_ms: i64,
}

impl TimeDisplay {
    /// Times in UTC when `utc`, else in the system's zone; ages against
    /// `now_ms` (milliseconds since the epoch).
    pub fn new(utc: bool, now_ms: i64) -> TimeDisplay {
        let zone = if utc {
            jiff::tz::TimeZone::UTC
        } else {
            jiff::tz::TimeZone::system()
        };
        TimeDisplay { zone, utc, now_ms }
    }

    /// The same display with ages counted against another now (an
    /// answer's own time, so that a skewed client clock does not show).
    pub fn at(&self, now_ms: i64) -> TimeDisplay {
        TimeDisplay { now_ms, ..self.clone() }
    }

    /// The wall-clock time of `ms`: `21:30:05`, with the date when it is
    /// not today, and ` UTC` under `--utc`.
    pub fn clock(&self, ms: i64) -> String {
        let Ok(at) = jiff::Timestamp::from_millisecond(ms) else {
            return "?".to_owned();
        };
        let zoned = at.to_zoned(self.zone.clone());
        let today = jiff::Timestamp::from_millisecond(self.now_ms)
            .ok()
            .map(|now| now.to_zoned(self.zone.clone()).date());
        let mut text = if today == Some(zoned.date()) {
            zoned.strftime("%H:%M:%S").to_string()
        } else {
            zoned.strftime("%Y-%m-%d %H:%M:%S").to_string()
        };
        if self.utc {
            text += " UTC";
        }
        text
    }

    /// `21:30:05 (3m 12s ago)`, `21:30:09 (in 4s)`.
    pub fn instant(&self, ms: i64) -> String {
        format!("{} ({})", self.clock(ms), self.relative(ms))
    }

    /// How long ago `ms` was (`3m 12s`; `0s` for the future).
    pub fn age_of(&self, ms: i64) -> String {
        age(self.now_ms.saturating_sub(ms))
    }

    /// `3m 12s ago`, `in 4s`.
    pub fn relative(&self, ms: i64) -> String {
        time_text::relative(timestamp(ms), timestamp(self.now_ms))
    }
}

fn timestamp(ms: i64) -> Timestamp {
    Timestamp(u64::try_from(ms).unwrap_or(0))
}

/// An instant for `-o json`: RFC 3339 in UTC, to the millisecond.
pub(crate) fn rfc3339(ms: i64) -> Value {
    json!(time_text::rfc3339(timestamp(ms)))
}

/// An instant that 0 means "none" for: RFC 3339, or null.
pub(crate) fn rfc3339_or_null(ms: i64) -> Value {
    if ms > 0 {
        rfc3339(ms)
    } else {
        Value::Null
    }
}

/// Rows as a table: every column as wide as its widest cell, two spaces
/// between, the last column unpadded.
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out += line.join("  ").trim_end();
        out.push('\n');
    }
    out
}

/// A duration for people (`12s`, `3m 4s`, `2h 5m`): core's
/// `time_text::duration`, which the node's own messages use too.
pub fn age(ms: i64) -> String {
    time_text::duration(u64::try_from(ms).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_a_clock_and_an_age_with_the_date_when_not_today() {
        // 2026-11-25T21:30:05Z, seen 3m 12s later, in UTC.
        let at = 1_795_642_205_000;
        let times = TimeDisplay::new(true, at + 192_000);
        assert_eq!(times.instant(at), "21:30:05 UTC (3m 12s ago)");
        assert_eq!(times.instant(at + 196_000), "21:33:21 UTC (in 4s)");
        assert_eq!(times.at(at + 86_400_000).clock(at), "2026-11-25 21:30:05 UTC");
        assert_eq!(age(184_000), "3m 4s");
        assert_eq!(age(-5), "0s");
    }

    #[test]
    fn json_instants_are_the_rfc3339_that_jiff_reads_back() {
        for ms in [0, 1, 999, 951_782_400_000, 1_795_642_564_985, 4_107_542_399_999] {
            let text = rfc3339(ms);
            let parsed: jiff::Timestamp = text.as_str().unwrap_or_default().parse().unwrap();
            assert_eq!(parsed.as_millisecond(), ms, "{text}");
        }
        assert_eq!(rfc3339_or_null(0), Value::Null);
    }
}
