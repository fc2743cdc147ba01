//! Classified errors: a stable error class and SQLSTATE (Spark's where the situation is the
//! same), and a message that says what is wrong and what to do.

use std::fmt;

/// A user-facing error with a stable error class and a SQLSTATE.
///
/// Displayed as `[CLASS] message SQLSTATE: XXXXX`, the shape Spark users know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassifiedError {
    /// Stable, machine-readable error class, e.g. `DATA_SOURCE_NOT_FOUND`.
    pub class: &'static str,
    /// Five-character SQLSTATE, e.g. `42K02`.
    pub sqlstate: &'static str,
    /// What is wrong and what to do next.
    pub message: String,
}

impl ClassifiedError {
    /// A new error of `class` with `sqlstate` and `message`.
    pub fn new(class: &'static str, sqlstate: &'static str, message: impl Into<String>) -> Self {
        Self {
            class,
            sqlstate,
            message: message.into(),
        }
    }

    /// An option of a source or sink is unknown, missing or malformed.
    pub fn invalid_option(message: impl Into<String>) -> Self {
        Self::new("STREAMING_INVALID_OPTION", "42616", message)
    }

    /// The query is not something a streaming query can do.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new("UNSUPPORTED_STREAMING_OPERATION", "0A000", message)
    }
}

impl fmt::Display for ClassifiedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}] {} SQLSTATE: {}",
            self.class, self.message, self.sqlstate
        )
    }
}

impl std::error::Error for ClassifiedError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_class_message_and_sqlstate_like_spark() {
        let e = ClassifiedError::new("DATA_SOURCE_NOT_FOUND", "42K02", "no source named foo.");
        assert_eq!(
            e.to_string(),
            "[DATA_SOURCE_NOT_FOUND] no source named foo. SQLSTATE: 42K02"
        );
    }
}
