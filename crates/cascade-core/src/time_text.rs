//! Times and durations as people read them, in the messages the core
//! composes (and the CLI's ages): `12s`, `3m 4s`, `2h 5m`, `3d 4h`, and
//! RFC 3339 in UTC. The core has no clock and no time zone, so a message
//! says how long ago or from now against the step's `now`, or gives the
//! instant in UTC; a client shows local times itself.

use crate::model::Timestamp;

/// A duration in its two largest units, whole seconds at the finest
/// (`0s`, `12s`, `3m 4s`, `2h`, `2h 5m`, `3d 4h`): what a person compares,
/// without the noise of the smaller units.
pub fn duration(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(86_400, "d"), (3_600, "h"), (60, "m"), (1, "s")];
    let mut rest = ms / 1000;
    let Some(first) = UNITS.iter().position(|&(size, _)| rest >= size) else {
        return "0s".to_owned();
    };
    let mut parts = Vec::new();
    for &(size, unit) in &UNITS[first..(first + 2).min(UNITS.len())] {
        let n = rest / size;
        rest %= size;
        if n > 0 {
            parts.push(format!("{n}{unit}"));
        }
    }
    parts.join(" ")
}

/// The longest duration [`parse_duration`] reads: ten years, far beyond
/// any retention a node allows, and far from overflowing a millisecond
/// timestamp when added to one.
pub const MAX_PARSED_DURATION_MS: u64 = 10 * 365 * 86_400_000;

/// A duration as people write one in a schema or a flag, in milliseconds:
/// one or more `<number><unit>` parts, units `ms`, `s`, `m`, `h`, `d`, `w`
/// (`7d`, `90s`, `1h30m`, `1d 12h`). The error quotes at most a short
/// prefix of the text.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let quoted = || format!("{:?}", crate::limits::cut_stored(text, 32));
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("an empty duration (write it like 7d, 12h, 90s)".to_owned());
    }
    let mut total: u64 = 0;
    let mut rest = trimmed;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("{}: expected a number (write it like 7d, 12h, 90s)", quoted()));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("{}: a number too large", quoted()))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == ' ')
            .unwrap_or(rest.len());
        let unit_ms: u64 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            "" => return Err(format!("{}: a number without a unit (ms, s, m, h, d, w)", quoted())),
            _ => return Err(format!("{}: unknown unit (ms, s, m, h, d, w)", quoted())),
        };
        rest = rest[unit_len..].trim_start();
        total = n
            .checked_mul(unit_ms)
            .and_then(|part| total.checked_add(part))
            .filter(|t| *t <= MAX_PARSED_DURATION_MS)
            .ok_or_else(|| format!("{}: longer than ten years", quoted()))?;
    }
    Ok(total)
}

/// How far `at` is from `now`: `in 4s`, `3m 2s ago`.
pub fn relative(at: Timestamp, now: Timestamp) -> String {
    // Under a second either way reads as now: a client's clock read just
    // before the call it shows is a few milliseconds behind its answer,
    // and "in 0s" would look like a time in the future.
    if at.0.abs_diff(now.0) < 1000 {
        "just now".to_owned()
    } else if at.0 > now.0 {
        format!("in {}", duration(at.0 - now.0))
    } else {
        format!("{} ago", duration(now.0 - at.0))
    }
}

/// The instant in RFC 3339, UTC, to the millisecond
/// (`2026-11-25T21:30:05.123Z`).
pub fn rfc3339(t: Timestamp) -> String {
    let ms = t.0 % 1000;
    let secs = t.0 / 1000;
    let (days, of_day) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_from_the_units_people_write() {
        assert_eq!(parse_duration("7d"), Ok(7 * 86_400_000));
        assert_eq!(parse_duration("90s"), Ok(90_000));
        assert_eq!(parse_duration("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration("1d 12h"), Ok(36 * 3_600_000));
        assert_eq!(parse_duration("250ms"), Ok(250));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("7").unwrap_err().contains("without a unit"));
        assert!(parse_duration("7y").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("d").unwrap_err().contains("expected a number"));
        assert!(parse_duration("99999999999999999999d").is_err());
        assert!(parse_duration("4000d").unwrap_err().contains("ten years"));
        // A hostile text is quoted by a short prefix only.
        let long = format!("{}x", "1".repeat(5000));
        assert!(parse_duration(&long).unwrap_err().len() < 200);
    }

    #[test]
    fn durations_read_in_their_two_largest_units() {
        assert_eq!(duration(0), "0s");
        assert_eq!(duration(999), "0s");
        assert_eq!(duration(12_400), "12s");
        assert_eq!(duration(60_000), "1m");
        assert_eq!(duration(184_000), "3m 4s");
        assert_eq!(duration(2 * 3_600_000 + 5 * 60_000 + 59_000), "2h 5m");
        assert_eq!(duration(3_600_000), "1h");
        assert_eq!(duration(3 * 86_400_000 + 4 * 3_600_000 + 1), "3d 4h");
        assert_eq!(duration(3 * 86_400_000 + 30_000), "3d");
    }

    #[test]
    fn relative_times_say_which_way() {
        assert_eq!(relative(Timestamp(10_000), Timestamp(6_000)), "in 4s");
        assert_eq!(relative(Timestamp(6_000), Timestamp(188_000)), "3m 2s ago");
        assert_eq!(relative(Timestamp(6_400), Timestamp(6_000)), "just now");
        assert_eq!(relative(Timestamp(6_000), Timestamp(6_999)), "just now");
    }

    #[test]
    fn instants_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(Timestamp(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(Timestamp(951_782_400_000)), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(Timestamp(1_795_642_564_985)), "2026-11-25T21:36:04.985Z");
        assert_eq!(rfc3339(Timestamp(4_107_542_399_999)), "2100-02-28T23:59:59.999Z");
    }
}
