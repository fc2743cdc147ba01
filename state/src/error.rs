//! Errors of the state store.

use weir_common::ClassifiedError;

/// Errors raised by state stores. The message is displayed without its class; convert to a
/// [`ClassifiedError`] for `[CLASS] message SQLSTATE: ...`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The version asked for does not exist (never committed, or purged).
    #[error(
        "State store {store} has no version {version} (it has {available}). The checkpoint's \
         state was purged or lost; restore it, start the query over (weir checkpoint reset DIR \
         --full), or start it with a new checkpoint location."
    )]
    VersionNotFound {
        /// The store, as `operator/partition/name`.
        store: String,
        /// The version asked for.
        version: u64,
        /// What the store has, for the message.
        available: String,
    },
    /// A state file in the checkpoint fails its checksum or cannot be read.
    #[error(
        "The state file '{file}' {problem}. Restore it from a backup, start the query over \
         (weir checkpoint reset DIR --full), or start it with a new checkpoint location."
    )]
    Corrupt {
        /// The file.
        file: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The backend failed.
    #[error("State store {store}: {message}")]
    Backend {
        /// The store, as `operator/partition/name`.
        store: String,
        /// What failed.
        message: String,
    },
}

impl Error {
    /// The stable error class.
    pub fn error_class(&self) -> &'static str {
        match self {
            Error::VersionNotFound { .. } => "STATE_STORE_VERSION_NOT_FOUND",
            Error::Corrupt { .. } => "STATE_STORE_FILE_CORRUPT",
            Error::Backend { .. } => "STATE_STORE_IO_ERROR",
        }
    }

    /// The SQLSTATE.
    pub fn sql_state(&self) -> &'static str {
        match self {
            Error::VersionNotFound { .. } => "XXKST",
            Error::Corrupt { .. } => "XX001",
            Error::Backend { .. } => "58030",
        }
    }
}

impl From<Error> for ClassifiedError {
    fn from(e: Error) -> Self {
        ClassifiedError::new(e.error_class(), e.sql_state(), e.to_string())
    }
}

/// What is wrong with a state file that does not decode: written by a newer weir (its magic
/// `prefix` followed by a format digit above `current`), or damaged.
pub(crate) fn corrupt_problem(bytes: &[u8], prefix: &[u8], current: u8) -> String {
    match bytes.strip_prefix(prefix).and_then(|r| r.first()) {
        Some(&d) if d.is_ascii_digit() && d > current => format!(
            "was written by a newer weir (format {}; this weir reads {}): run that version",
            d as char, current as char
        ),
        _ => "is damaged (its checksum does not match)".into(),
    }
}

/// Result of state store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
