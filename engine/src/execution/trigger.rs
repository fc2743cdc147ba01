//! Triggers: when the next micro-batch runs.

use std::fmt;
use std::time::Duration;

use weir_common::{ClassifiedError, parse_duration};

/// When micro-batches run (Spark's `Trigger`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Trigger {
    /// The next batch as soon as the previous one ends (polling every 10 ms when idle).
    #[default]
    Default,
    /// A batch every interval; a batch that overruns starts the next one right away.
    ProcessingTime(Duration),
    /// Everything available at start, in as many batches as the read limits need, then stop.
    AvailableNow,
    /// One batch of everything available (ignoring read limits), then stop.
    Once,
}

impl Trigger {
    /// Parses `default`, `once`, `availableNow`, `processingTime=10 seconds` or a bare
    /// interval such as `10 seconds`.
    pub fn parse(s: &str) -> Result<Self, ClassifiedError> {
        let t = s.trim();
        let lower = t.to_ascii_lowercase().replace(['_', '-', ' '], "");
        match lower.as_str() {
            "default" | "" => return Ok(Self::Default),
            "once" => return Ok(Self::Once),
            "availablenow" => return Ok(Self::AvailableNow),
            _ => {}
        }
        let interval = t
            .split_once('=')
            .filter(|(k, _)| k.trim().eq_ignore_ascii_case("processingtime"))
            .map_or(t, |(_, v)| v);
        parse_duration(interval, Duration::from_millis(1))
            .map(|d| {
                if d.is_zero() {
                    Self::Default
                } else {
                    Self::ProcessingTime(d)
                }
            })
            .map_err(|m| {
                ClassifiedError::new(
                    "INVALID_TRIGGER",
                    "42601",
                    format!(
                        "Unknown trigger '{s}' ({m}). Accepted: default, once, availableNow, \
                         processingTime=<interval> or an interval such as '10 seconds'."
                    ),
                )
            })
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => f.write_str("default"),
            Self::ProcessingTime(d) => write!(f, "processingTime={} ms", d.as_millis()),
            Self::AvailableNow => f.write_str("availableNow"),
            Self::Once => f.write_str("once"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_spark_triggers() {
        assert_eq!(Trigger::parse("once").unwrap(), Trigger::Once);
        assert_eq!(
            Trigger::parse("AvailableNow").unwrap(),
            Trigger::AvailableNow
        );
        assert_eq!(
            Trigger::parse("available-now").unwrap(),
            Trigger::AvailableNow
        );
        assert_eq!(
            Trigger::parse("processingTime=2 seconds").unwrap(),
            Trigger::ProcessingTime(Duration::from_secs(2))
        );
        assert_eq!(
            Trigger::parse("500ms").unwrap(),
            Trigger::ProcessingTime(Duration::from_millis(500))
        );
        assert_eq!(Trigger::parse("0 seconds").unwrap(), Trigger::Default);
        assert_eq!(
            Trigger::parse("sometimes").unwrap_err().class,
            "INVALID_TRIGGER"
        );
    }
}
