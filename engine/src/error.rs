//! Errors of weir's engine, each with a stable error class and SQLSTATE.

use datafusion::error::DataFusionError;
use weir_common::ClassifiedError;

/// Errors raised while planning, starting or running a streaming query.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The user asked for something wrong: the class says what.
    #[error(transparent)]
    User(#[from] ClassifiedError),
    /// A source failed.
    #[error("{}", with_class(self))]
    Source(#[from] weir_sources::Error),
    /// A sink failed.
    #[error("{}", with_class(self))]
    Sink(#[from] weir_sinks::Error),
    /// DataFusion refused or failed the query.
    #[error("{}", datafusion_message(.0))]
    DataFusion(#[from] DataFusionError),
    /// The checkpoint's storage failed.
    #[error("{}", with_class(self))]
    Storage(#[from] object_store::Error),
    /// A checkpoint file is damaged or from a newer weir.
    #[error(
        "[CHECKPOINT_FILE_CORRUPT] The checkpoint file '{file}' {problem}. Restore the file from \
         a backup, start the query over (weir checkpoint reset DIR --full), or start it with a \
         new checkpoint location. SQLSTATE: KD002"
    )]
    Corrupt {
        /// The file, as a path the user can open.
        file: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A bug in weir.
    #[error("[INTERNAL_ERROR] {0} SQLSTATE: XX000")]
    Internal(String),
}

fn classified_in(e: &DataFusionError) -> Option<&ClassifiedError> {
    match e {
        DataFusionError::External(inner) => {
            if let Some(c) = inner.downcast_ref::<ClassifiedError>() {
                return Some(c);
            }
            if let Some(weir_sources::Error::User(c)) = inner.downcast_ref::<weir_sources::Error>()
            {
                return Some(c);
            }
            if let Some(weir_sinks::Error::User(c)) = inner.downcast_ref::<weir_sinks::Error>() {
                return Some(c);
            }
            inner
                .downcast_ref::<DataFusionError>()
                .and_then(classified_in)
        }
        DataFusionError::Context(_, inner) => classified_in(inner),
        DataFusionError::Shared(inner) => classified_in(inner),
        DataFusionError::Diagnostic(_, inner) => classified_in(inner),
        _ => None,
    }
}

/// A source's or sink's own error (a damaged manifest, a storage failure) inside a DataFusion
/// error: its class, SQLSTATE and message.
fn connector_error_in(e: &DataFusionError) -> Option<(&'static str, &'static str, String)> {
    match e {
        DataFusionError::External(inner) => {
            if let Some(s) = inner.downcast_ref::<weir_sinks::Error>() {
                return Some((s.error_class(), s.sql_state(), s.to_string()));
            }
            if let Some(s) = inner.downcast_ref::<weir_sources::Error>() {
                return Some((s.error_class(), s.sql_state(), s.to_string()));
            }
            inner
                .downcast_ref::<DataFusionError>()
                .and_then(connector_error_in)
        }
        DataFusionError::Context(_, inner) => connector_error_in(inner),
        DataFusionError::Shared(inner) => connector_error_in(inner),
        DataFusionError::Diagnostic(_, inner) => connector_error_in(inner),
        _ => None,
    }
}

fn datafusion_class(e: &DataFusionError) -> (&'static str, &'static str) {
    if let Some(c) = classified_in(e) {
        return (c.class, c.sqlstate);
    }
    if let Some((class, state, _)) = connector_error_in(e) {
        return (class, state);
    }
    match e.find_root() {
        DataFusionError::SQL(..) => ("PARSE_SYNTAX_ERROR", "42601"),
        DataFusionError::SchemaError(s, _) => match s.as_ref() {
            datafusion::common::SchemaError::FieldNotFound { valid_fields, .. }
                if valid_fields.is_empty() =>
            {
                ("UNRESOLVED_COLUMN.WITHOUT_SUGGESTION", "42703")
            }
            datafusion::common::SchemaError::FieldNotFound { .. } => {
                ("UNRESOLVED_COLUMN.WITH_SUGGESTION", "42703")
            }
            _ => ("INVALID_SCHEMA", "42K07"),
        },
        DataFusionError::Plan(m) if m.contains("not found") => ("TABLE_OR_VIEW_NOT_FOUND", "42P01"),
        DataFusionError::Plan(_) => ("INVALID_QUERY", "42000"),
        DataFusionError::NotImplemented(_) => ("UNSUPPORTED_FEATURE", "0A000"),
        DataFusionError::ResourcesExhausted(_) => ("RESOURCES_EXHAUSTED", "53000"),
        DataFusionError::IoError(_) | DataFusionError::ObjectStore(_) => ("IO_ERROR", "58030"),
        _ => ("EXECUTION_ERROR", "XX000"),
    }
}

/// `[CLASS] message SQLSTATE: XXXXX` for errors whose message does not carry its class.
fn with_class(e: &Error) -> String {
    let message = match e {
        Error::Source(weir_sources::Error::User(c)) | Error::Sink(weir_sinks::Error::User(c)) => {
            return c.to_string();
        }
        Error::Source(s) => s.to_string(),
        Error::Sink(s) => s.to_string(),
        Error::Storage(s) => format!("Cannot access the checkpoint: {s}"),
        other => return format!("{other:?}"),
    };
    format!(
        "[{}] {message} SQLSTATE: {}",
        e.error_class(),
        e.sql_state()
    )
}

fn datafusion_message(e: &DataFusionError) -> String {
    if let Some(c) = classified_in(e) {
        return c.to_string();
    }
    if let Some((class, state, message)) = connector_error_in(e) {
        return format!("[{class}] {message} SQLSTATE: {state}");
    }
    let (class, state) = datafusion_class(e);
    format!("[{class}] {} SQLSTATE: {state}", e.find_root())
}

impl Error {
    /// The stable error class of this error, e.g. `DATA_SOURCE_NOT_FOUND`.
    pub fn error_class(&self) -> &'static str {
        self.class_and_state().0
    }

    /// The SQLSTATE of this error.
    pub fn sql_state(&self) -> &'static str {
        self.class_and_state().1
    }

    fn class_and_state(&self) -> (&'static str, &'static str) {
        match self {
            Error::User(e) => (e.class, e.sqlstate),
            Error::Source(weir_sources::Error::User(e))
            | Error::Sink(weir_sinks::Error::User(e)) => (e.class, e.sqlstate),
            Error::Source(e) => (e.error_class(), e.sql_state()),
            Error::Sink(e) => (e.error_class(), e.sql_state()),
            Error::DataFusion(e) => datafusion_class(e),
            Error::Storage(_) => ("CANNOT_ACCESS_CHECKPOINT", "58030"),
            Error::Corrupt { .. } => ("CHECKPOINT_FILE_CORRUPT", "KD002"),
            Error::Internal(_) => ("INTERNAL_ERROR", "XX000"),
        }
    }

    /// A user error of `class` with `sqlstate`.
    pub fn user(class: &'static str, sqlstate: &'static str, message: impl Into<String>) -> Self {
        Error::User(ClassifiedError::new(class, sqlstate, message))
    }
}

/// Result of engine operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_classified_error_inside_datafusion_keeps_its_class() {
        let inner = ClassifiedError::new("DATA_SOURCE_NOT_FOUND", "42K02", "no foo.");
        let e = Error::DataFusion(DataFusionError::External(Box::new(inner)).context("planning"));
        assert_eq!(e.error_class(), "DATA_SOURCE_NOT_FOUND");
        assert_eq!(
            e.to_string(),
            "[DATA_SOURCE_NOT_FOUND] no foo. SQLSTATE: 42K02"
        );
    }
}
