//! Errors of weir's sinks.

use weir_common::ClassifiedError;

/// Errors raised by sinks.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The user asked for something wrong (unknown format, bad option, ...).
    #[error(transparent)]
    User(#[from] ClassifiedError),
    /// Arrow failed to encode or print a batch.
    #[error("arrow error in a sink: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// Parquet failed to encode a batch.
    #[error("parquet error in a sink: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// The output storage failed.
    #[error("cannot write the sink's output: {0}")]
    Storage(#[from] object_store::Error),
    /// A closure given to the foreach-batch sink failed.
    #[error("the foreach-batch function failed on batch {batch_id}: {message}")]
    Foreach {
        /// The batch the closure was called with.
        batch_id: u64,
        /// What the closure reported.
        message: String,
    },
    /// The sink's manifest log is damaged.
    #[error("{0}")]
    Corrupt(String),
}

impl Error {
    /// The stable error class of this error.
    pub fn error_class(&self) -> &'static str {
        match self {
            Error::User(e) => e.class,
            Error::Arrow(_) | Error::Parquet(_) => "INTERNAL_ERROR",
            Error::Storage(_) => "CANNOT_WRITE_SINK",
            Error::Foreach { .. } => "FOREACH_BATCH_USER_FUNCTION_ERROR",
            Error::Corrupt(_) => "SINK_MANIFEST_CORRUPT",
        }
    }

    /// The SQLSTATE of this error.
    pub fn sql_state(&self) -> &'static str {
        match self {
            Error::User(e) => e.sqlstate,
            Error::Arrow(_) | Error::Parquet(_) => "XX000",
            Error::Storage(_) => "58030",
            Error::Foreach { .. } => "39000",
            Error::Corrupt(_) => "KD002",
        }
    }
}

/// Result of sink operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
