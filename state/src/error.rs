//! Errors of the state store.

use weir_common::ClassifiedError;

/// Errors raised by state stores. The message is displayed without its class; convert to a
/// [`ClassifiedError`] for `[CLASS] message SQLSTATE: ...`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The version asked for does not exist (never committed, or purged).
    #[error(
        "State store {store} has no version {version} (it has {available}). The checkpoint's \
         state was purged or lost; restore it, or start the query with a new checkpoint location."
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
        "The state file '{file}' is damaged (its checksum does not match). Restore it from a \
         backup, or start the query with a new checkpoint location."
    )]
    Corrupt {
        /// The file.
        file: String,
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

/// Result of state store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
