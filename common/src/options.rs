//! Connector options: a case-insensitive map (as Spark's `CaseInsensitiveMap`) and a typed
//! reader that turns it into a config struct, refusing unknown, missing or malformed options
//! with an error that names the option and lists the accepted ones.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use crate::ClassifiedError;
use crate::duration::parse_duration;

/// Options of a source or sink: keys compare case-insensitively, the spelling given is kept
/// for messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    entries: BTreeMap<String, (String, String)>,
}

impl Options {
    /// No options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`, replacing any value under the same key in any case.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) {
        let key = key.into();
        self.entries
            .insert(key.to_ascii_lowercase(), (key, value.into()));
    }

    /// Sets `key` to `value` unless an option of the same name (in any case) is set: then
    /// returns the spelling it was given as. For option lists written by a user (SQL
    /// `OPTIONS (...)`, a source's named arguments), where a repeated option is a mistake that
    /// must not be settled silently by the last one winning.
    pub fn insert_new(
        &mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<(), String> {
        let key = key.into();
        match self.entries.entry(key.to_ascii_lowercase()) {
            std::collections::btree_map::Entry::Occupied(e) => Err(e.get().0.clone()),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert((key, value.into()));
                Ok(())
            }
        }
    }

    /// Builder form of [`Options::set`].
    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.set(key, value);
        self
    }

    /// The value under `key`, in any case.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .get(&key.to_ascii_lowercase())
            .map(|(_, v)| v.as_str())
    }

    /// Removes and returns the value under `key`, in any case.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        self.entries
            .remove(&key.to_ascii_lowercase())
            .map(|(_, v)| v)
    }

    /// `(key as given, value)` pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.values().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Splits off the options whose key starts with `prefix` (in any case), e.g. a client's
    /// `kafka.*` or `aws_*` settings: those `(key as given, value)` pairs, and the rest.
    pub fn split_prefixed(&self, prefix: &str) -> (Vec<(String, String)>, Options) {
        let prefix = prefix.to_ascii_lowercase();
        let (with, without): (Vec<_>, Vec<_>) = self
            .iter()
            .partition(|(k, _)| k.to_ascii_lowercase().starts_with(&prefix));
        (
            with.into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            without.into_iter().collect(),
        )
    }

    /// True when no option is set.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Starts a typed read of these options for the connector `what` (e.g. `rate source`),
    /// which accepts exactly `accepted`.
    pub fn reader<'a>(&'a self, what: &'a str, accepted: &'a [&'a str]) -> OptionReader<'a> {
        OptionReader {
            options: self,
            what,
            accepted,
        }
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Options {
    fn from_iter<T: IntoIterator<Item = (K, V)>>(iter: T) -> Self {
        let mut o = Options::new();
        for (k, v) in iter {
            o.set(k, v);
        }
        o
    }
}

/// Typed access to [`Options`] for one connector; see [`Options::reader`].
#[derive(Debug)]
pub struct OptionReader<'a> {
    options: &'a Options,
    what: &'a str,
    accepted: &'a [&'a str],
}

impl OptionReader<'_> {
    /// Fails if any option is not among the accepted ones, naming it and listing them.
    pub fn check_known(&self) -> Result<(), ClassifiedError> {
        for (key, _) in self.options.iter() {
            if !self.accepted.iter().any(|a| a.eq_ignore_ascii_case(key)) {
                return Err(ClassifiedError::invalid_option(format!(
                    "Unknown option '{key}' for the {}. Accepted options: {}.",
                    self.what,
                    self.accepted_list()
                )));
            }
        }
        Ok(())
    }

    fn accepted_list(&self) -> String {
        if self.accepted.is_empty() {
            "none".to_string()
        } else {
            self.accepted.join(", ")
        }
    }

    fn bad(&self, key: &str, value: &str, expected: &str) -> ClassifiedError {
        ClassifiedError::invalid_option(format!(
            "Invalid value '{value}' for option '{key}' of the {}: expected {expected}.",
            self.what
        ))
    }

    /// The raw string value of `key`, if set.
    pub fn string(&self, key: &str) -> Option<String> {
        self.options.get(key).map(str::to_string)
    }

    /// The value of a required option.
    pub fn required(&self, key: &str) -> Result<String, ClassifiedError> {
        self.string(key).ok_or_else(|| {
            ClassifiedError::invalid_option(format!(
                "The {} needs option '{key}'. Accepted options: {}.",
                self.what,
                self.accepted_list()
            ))
        })
    }

    /// A number parsed with `FromStr`, or `default` when absent.
    pub fn parse<T: FromStr>(
        &self,
        key: &str,
        default: T,
        expected: &str,
    ) -> Result<T, ClassifiedError> {
        match self.options.get(key) {
            None => Ok(default),
            Some(v) => v.trim().parse().map_err(|_| self.bad(key, v, expected)),
        }
    }

    /// A whole number at least `min`, or `default` when absent.
    pub fn int_at_least(&self, key: &str, default: i64, min: i64) -> Result<i64, ClassifiedError> {
        let expected = format!("a whole number >= {min}");
        let v: i64 = self.parse(key, default, &expected)?;
        if v < min {
            return Err(self.bad(key, &v.to_string(), &expected));
        }
        Ok(v)
    }

    /// A whole number from `min` to `max`, or `default` when absent: for counts that size an
    /// allocation (rows per batch, partitions), where a huge value must be an error, not an
    /// abort.
    pub fn int_between(
        &self,
        key: &str,
        default: i64,
        min: i64,
        max: i64,
    ) -> Result<i64, ClassifiedError> {
        let expected = format!("a whole number from {min} to {max}");
        let v: i64 = self.parse(key, default, &expected)?;
        if !(min..=max).contains(&v) {
            return Err(self.bad(key, &v.to_string(), &expected));
        }
        Ok(v)
    }

    /// `true`/`false` (any case), or `default` when absent.
    pub fn bool(&self, key: &str, default: bool) -> Result<bool, ClassifiedError> {
        match self.options.get(key) {
            None => Ok(default),
            Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
            Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
            Some(v) => Err(self.bad(key, v, "true or false")),
        }
    }

    /// A duration such as `10 seconds` (a bare number is in `bare_unit`), or `default`.
    pub fn duration(
        &self,
        key: &str,
        default: Duration,
        bare_unit: Duration,
    ) -> Result<Duration, ClassifiedError> {
        match self.options.get(key) {
            None => Ok(default),
            Some(v) => parse_duration(v, bare_unit).map_err(|m| {
                ClassifiedError::invalid_option(format!(
                    "Invalid value for option '{key}' of the {}: {m}.",
                    self.what
                ))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_case_insensitive_and_keep_their_spelling() {
        let o = Options::new().with("rowsPerSecond", "10");
        assert_eq!(o.get("ROWSPERSECOND"), Some("10"));
        assert_eq!(o.iter().next(), Some(("rowsPerSecond", "10")));
    }

    #[test]
    fn an_unknown_option_is_named_with_the_accepted_ones() {
        let o = Options::new().with("rowsPerSecnd", "10");
        let err = o
            .reader("rate source", &["rowsPerSecond", "numPartitions"])
            .check_known()
            .unwrap_err();
        assert_eq!(err.class, "STREAMING_INVALID_OPTION");
        assert!(err.message.contains("'rowsPerSecnd'"), "{}", err.message);
        assert!(
            err.message.contains("rowsPerSecond, numPartitions"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_malformed_or_too_small_number_is_refused() {
        let o = Options::new().with("rowsPerSecond", "ten");
        let r = o.reader("rate source", &["rowsPerSecond"]);
        assert!(
            r.int_at_least("rowsPerSecond", 1, 1)
                .unwrap_err()
                .message
                .contains("'ten'")
        );
        let o = Options::new().with("rowsPerSecond", "-3");
        let r = o.reader("rate source", &["rowsPerSecond"]);
        assert!(r.int_at_least("rowsPerSecond", 1, 1).is_err());
        assert_eq!(
            Options::new().reader("x", &[]).int_at_least("a", 7, 1),
            Ok(7)
        );
    }

    #[test]
    fn a_missing_required_option_is_named() {
        let err = Options::new()
            .reader("parquet sink", &["path"])
            .required("path")
            .unwrap_err();
        assert!(
            err.message.contains("needs option 'path'"),
            "{}",
            err.message
        );
    }
}
