//! Errors of the state store.

/// Errors raised by state stores.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The version asked for does not exist (never committed, or purged).
    #[error(
        "[STATE_STORE_VERSION_NOT_FOUND] State store {store} has no version {version} (it has \
         {available}). The checkpoint's state was purged or lost; restore it, or start the query \
         with a new checkpoint location. SQLSTATE: XXKST"
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
        "[STATE_STORE_FILE_CORRUPT] The state file '{file}' is damaged (its checksum does not \
         match). Restore it from a backup, or start the query with a new checkpoint location. \
         SQLSTATE: XX001"
    )]
    Corrupt {
        /// The file.
        file: String,
    },
    /// The backend failed.
    #[error("[STATE_STORE_IO_ERROR] State store {store}: {message} SQLSTATE: 58030")]
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
}

/// Result of state store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
