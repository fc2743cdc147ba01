//! Spark-style duration strings: `10 seconds`, `1 minute`, `500ms`, `5s`, `2 hours`,
//! `INTERVAL 3 SECONDS`, or a bare number (taken in the caller's default unit).

use std::time::Duration;

/// Parses a duration such as `"10 seconds"`, `"500 ms"`, `"5s"` or `"interval 1 minute"`.
///
/// A bare number is taken in `bare_unit` (Spark reads `rampUpTime = 5` as seconds).
/// Returns a message naming the accepted forms on failure.
pub fn parse_duration(text: &str, bare_unit: Duration) -> Result<Duration, String> {
    let s = text.trim().to_ascii_lowercase();
    let s = s.strip_prefix("interval").map(str::trim).unwrap_or(&s);
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let unit = unit.trim().trim_matches('\'');
    let bad = || {
        format!(
            "'{text}' is not a duration: write a number and a unit, e.g. '10 seconds', \
             '500 milliseconds', '5s', '1 minute'"
        )
    };
    let value: f64 = num.parse().map_err(|_| bad())?;
    if !value.is_finite() || value < 0.0 {
        return Err(bad());
    }
    let unit_secs = match unit {
        "" => bare_unit.as_secs_f64(),
        "ns" | "nanosecond" | "nanoseconds" => 1e-9,
        "us" | "microsecond" | "microseconds" => 1e-6,
        "ms" | "milli" | "millis" | "millisecond" | "milliseconds" => 1e-3,
        "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
        "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
        "h" | "hour" | "hours" => 3600.0,
        "d" | "day" | "days" => 86400.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(value * unit_secs).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_duration_too_long_to_represent_is_an_error_not_a_panic() {
        assert!(parse_duration("100000000000000000000 seconds", S).is_err());
        assert!(parse_duration("1e300 days", S).is_err());
    }

    #[test]
    fn parses_the_forms_spark_users_write() {
        assert_eq!(parse_duration("10 seconds", S), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms", S), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5s", S), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1 minute", S), Ok(Duration::from_secs(60)));
        assert_eq!(
            parse_duration("INTERVAL 2 HOURS", S),
            Ok(Duration::from_secs(7200))
        );
        assert_eq!(parse_duration("3", S), Ok(Duration::from_secs(3)));
    }

    #[test]
    fn refuses_garbage_with_the_accepted_forms() {
        let err = parse_duration("soon", S).unwrap_err();
        assert!(err.contains("'10 seconds'"), "{err}");
        assert!(parse_duration("5 fortnights", S).is_err());
        assert!(parse_duration("-1 s", S).is_err());
    }
}
