//! Offsets and read limits.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A position in a source, as the source defines it, serialized as JSON in the offsets log
/// (`3` for the rate source's seconds, `{"offset":N,"timestamp":T}` for rate-micro-batch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Offset(pub serde_json::Value);

impl Offset {
    /// An offset that is a single number.
    pub fn long(n: i64) -> Self {
        Offset(serde_json::Value::from(n))
    }

    /// The number, if this offset is a single number.
    pub fn as_long(&self) -> Option<i64> {
        self.0.as_i64()
    }

    /// Compact JSON text of the offset.
    pub fn json(&self) -> String {
        self.0.to_string()
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// How much one micro-batch may read from a source (admission control).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadLimit {
    /// Everything available.
    AllAvailable,
    /// At most this many rows.
    MaxRows(u64),
    /// At most this many files (file sources' `maxFilesPerTrigger`).
    MaxFiles(u64),
    /// Files up to about this many bytes, at least one (`maxBytesPerTrigger`).
    MaxBytes(u64),
}
