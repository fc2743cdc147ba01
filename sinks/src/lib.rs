//! weir's streaming sinks.
//!
//! The engine hands a [`Sink`] the output of each micro-batch with its batch ID. A sink that
//! promises exactly-once ([`Sink::is_idempotent`]) must make a re-delivered batch ID change
//! nothing: after a crash the engine replays the last uncommitted batch and relies on that.
//!
//! Sinks are found by format name in a [`SinkRegistry`]; nothing outside this crate names a
//! concrete sink, except the foreach-batch sink, which takes a Rust closure.

mod console;
#[cfg(feature = "delta")]
pub mod delta;
mod error;
mod file;
mod foreach;
#[cfg(feature = "kafka")]
pub mod kafka;
mod memory;
mod noop;
mod registry;

use std::fmt::{self, Debug};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use weir_common::ClassifiedError;

pub use console::ConsoleSink;
pub use error::{Error, Result};
pub use file::{
    FileFormat, FileSink, MANIFEST_DIR, ManifestFile, SinkManifest, check_files, read_manifest,
};
pub use foreach::{ForeachBatchFn, ForeachBatchSink};
pub use memory::{MemorySink, MemorySinkData};
pub use noop::NoopSink;
pub use registry::{SinkFactory, SinkRegistry, SinkSpec};

/// How the result of a streaming query is written (Spark's output modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputMode {
    /// Only new rows, each written once.
    #[default]
    Append,
    /// The rows that changed in this batch.
    Update,
    /// The whole result, every batch.
    Complete,
}

impl OutputMode {
    /// Parses `append`, `update` or `complete` (any case).
    pub fn parse(s: &str) -> Result<Self, ClassifiedError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "append" => Ok(Self::Append),
            "update" => Ok(Self::Update),
            "complete" => Ok(Self::Complete),
            _ => Err(ClassifiedError::new(
                "STREAMING_OUTPUT_MODE.INVALID",
                "42KDE",
                format!(
                    "Unknown output mode '{s}'. Accepted output modes: append, update, complete."
                ),
            )),
        }
    }
}

impl fmt::Display for OutputMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Append => "Append",
            Self::Update => "Update",
            Self::Complete => "Complete",
        })
    }
}

/// What a checkpoint says of the batches its sink was given, for [`Sink::check_batches`].
#[derive(Debug, Clone, Copy)]
pub struct CheckpointBatches<'a> {
    /// The query's ID, the same across restarts.
    pub query_id: &'a str,
    /// The newest committed batch, when the sink was given every batch up to it (the
    /// checkpoint's record names this sink); the sink must hold each of them.
    pub last_committed: Option<u64>,
    /// The newest batch the checkpoint planned (logged in its offsets): a batch after it was
    /// never run on this checkpoint.
    pub last_planned: Option<u64>,
    /// Whether the sink was given every batch to record, empty ones too (checkpoints created
    /// since weir records them); a sink that records only non-empty batches may lack the newest
    /// ones of an older checkpoint.
    pub every_batch_recorded: bool,
}

/// Where the output of a streaming query goes.
#[async_trait]
pub trait Sink: Debug + Send + Sync {
    /// Description shown in progress records (`sink.description`).
    fn description(&self) -> String;

    /// Whether re-delivering a batch ID changes nothing (exactly-once across restarts).
    fn is_idempotent(&self) -> bool;

    /// The output modes this sink accepts.
    fn supported_output_modes(&self) -> &'static [OutputMode] {
        &[OutputMode::Append, OutputMode::Update, OutputMode::Complete]
    }

    /// Where an exactly-once sink keeps its output, if its output is tied to the checkpoint's
    /// batches (a file sink's folder, a Delta table): recorded in the checkpoint, so that a
    /// restart writing elsewhere is refused. `None` for sinks whose target may change between
    /// restarts (console, Kafka, foreach-batch).
    fn identity(&self) -> Option<String> {
        None
    }

    /// Called once per run, after the checkpoint is open and before the first batch, with the
    /// query's id (the same across restarts).
    async fn open(&self, _query_id: &str) -> Result<()> {
        Ok(())
    }

    /// Checks, before a run writes anything, that the sink's own record of the batches it
    /// holds agrees with the checkpoint's ([`CheckpointBatches`]): a sink that keeps such a
    /// record (a file sink's manifest, a Delta table's `txn`) refuses one that does not, so
    /// that a lost entry or a replaced checkpoint is found instead of a batch being lost for
    /// readers or written twice. Writes nothing.
    async fn check_batches(&self, _batches: &CheckpointBatches<'_>) -> Result<()> {
        Ok(())
    }

    /// The checks [`Sink::open`] makes that write nothing (a Delta table's schema and
    /// partitioning against the query's output), for `weir checkpoint validate`. Checks that
    /// act on the target (fencing a transactional Kafka producer) are left to `open`.
    async fn check(&self) -> Result<()> {
        Ok(())
    }

    /// Removes everything the sink has written, for a full refresh of its query's checkpoint
    /// (`weir checkpoint reset --full`). Sinks whose output weir cannot take back refuse.
    async fn clear_output(&self) -> Result<()> {
        Err(ClassifiedError::new(
            "FULL_REFRESH_SINK_NOT_CLEARABLE",
            "0A000",
            format!(
                "weir cannot remove what {} has written. Clear it yourself, then run the full \
                 refresh again with --keep-sink-data.",
                self.description()
            ),
        )
        .into())
    }

    /// Writes the output of micro-batch `batch_id`.
    async fn add_batch(
        &self,
        batch_id: u64,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<()>;

    /// The sink's figures for the batch it last wrote (the progress record's `sink.metrics`).
    fn batch_metrics(&self) -> std::collections::BTreeMap<String, String> {
        Default::default()
    }

    /// How batch SQL reads back what the sink wrote, when it can: the session registers a table
    /// for it (under the query's name, or the memory sink's own).
    fn read_back(&self) -> Option<ReadBack> {
        None
    }

    /// Whether a full refresh may keep the sink's output (`--keep-sink-data`): not when the
    /// output records its batches by batch ID alone (a file sink's manifest), so that the
    /// refreshed query's batches from 0 would be skipped as already written.
    fn output_can_outlive_a_refresh(&self) -> bool {
        true
    }
}

/// What the engine needs to read a sink's output back with batch SQL ([`Sink::read_back`]).
#[derive(Debug, Clone)]
pub enum ReadBack {
    /// The memory sink's rows, under its own name.
    Memory {
        /// The table name.
        name: String,
        /// The rows, shared with the sink.
        data: Arc<memory::MemorySinkData>,
    },
    /// A file sink's folder, read through its manifest.
    Files(weir_common::Location),
    /// A Delta table, read at its latest version; `STREAM name` streams its commits.
    #[cfg(feature = "delta")]
    Delta {
        /// The table's URL.
        url: url::Url,
        /// Its object store options.
        storage: std::collections::HashMap<String, String>,
        /// The Delta source's options for the same table.
        source_options: weir_common::Options,
    },
}
