//! Errors of weir's sources.

use weir_common::ClassifiedError;

/// Errors raised by sources.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The user asked for something wrong (unknown format, bad option, ...).
    #[error(transparent)]
    User(#[from] ClassifiedError),
    /// Arrow refused to build a batch: a bug in the source.
    #[error("arrow error in a source: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// The checkpoint's storage failed (retryable).
    #[error("storage error in a source's checkpoint files: {0}")]
    Storage(#[from] object_store::Error),
    /// A source's own file in the checkpoint is damaged.
    #[error("{0}")]
    Corrupt(String),
}

impl Error {
    /// The stable error class of this error.
    pub fn error_class(&self) -> &'static str {
        match self {
            Error::User(e) => e.class,
            Error::Arrow(_) => "INTERNAL_ERROR",
            Error::Storage(_) => "CANNOT_ACCESS_CHECKPOINT",
            Error::Corrupt(_) => "CHECKPOINT_FILE_CORRUPT",
        }
    }

    /// The SQLSTATE of this error.
    pub fn sql_state(&self) -> &'static str {
        match self {
            Error::User(e) => e.sqlstate,
            Error::Arrow(_) => "XX000",
            Error::Storage(_) => "58030",
            Error::Corrupt(_) => "KD002",
        }
    }
}

/// A value the source would compute does not fit in 64 bits (Spark's `ARITHMETIC_OVERFLOW`).
pub(crate) fn overflow(message: String) -> Error {
    Error::User(ClassifiedError::new(
        "ARITHMETIC_OVERFLOW",
        "22003",
        message,
    ))
}

/// Result of source operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
