//! weir's engine: the micro-batch loop that runs a streaming query exactly-once, its
//! checkpoint, the query handle and manager, progress records and listeners, and the
//! embedding API (session, stream reader and writer, SQL scripts).
//!
//! Data flows: [`WeirSession`] plans SQL or a `DataFrame` (with `weir-planner`) →
//! [`DataStreamWriter::start`] checks the plan, opens the sink and the [`Checkpoint`] →
//! the execution loop runs one micro-batch at a time: source offsets → WAL → rows into the
//! plan's streaming tables → DataFusion physical plan (with weir's stateful operators) → sink →
//! commit → progress event.
//!
//! ```text
//! api/         WeirSession, DataStreamReader/Writer, start, SQL scripts
//! execution/   the micro-batch loop, query handles, progress records, listeners, triggers
//! checkpoint/  the checkpoint's files, recovery, restart point and restart checks
//! stateful/    the stateful operators: one shell (operator.rs), their kinds and state formats
//! tools/       offline checkpoint tools: inspect, validate, reset, repartition, replay, read_state
//! ```

mod api;
pub mod checkpoint;
#[cfg(feature = "delta")]
pub mod delta_table;
mod error;
#[cfg(feature = "delta")]
pub mod event_log;
mod execution;
mod stateful;
pub mod tools;

pub use api::memory_table::MemorySinkTable;
pub use api::script::{ScriptOptions, StatementResult};
pub use api::{
    DataFrameStreamExt, DataStreamReader, DataStreamWriter, ReplayReport, ReplayedSource,
    WeirSession,
};
pub use checkpoint::Checkpoint;
pub use error::{Error, Result};
pub use execution::health::HealthRecord;
pub use execution::listener::{
    QueryIdleEvent, QueryProgressEvent, QueryStartedEvent, QueryTerminatedEvent,
    StreamingQueryListener,
};
pub use execution::progress::{
    SinkProgress, SourceProgress, StateOperatorProgress, StreamingQueryProgress, format_timestamp,
};
pub use execution::query::{
    QueryStatus, StreamingQuery, StreamingQueryException, StreamingQueryManager,
};
pub use execution::trigger::Trigger;
pub use stateful::{StateBackend, auto_cdc_apply_once};
pub use tools::validate::ValidationReport;
pub use weir_sinks::OutputMode;
pub use weir_state::{RocksDbConfig, SstCompression};
