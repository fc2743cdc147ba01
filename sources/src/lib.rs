//! weir's streaming sources.
//!
//! A [`SourceProvider`] is the definition a query is planned against (format, options, schema);
//! [`SourceProvider::open`] gives the [`MicroBatchStream`] that one run of one query reads from.
//! The engine drives every stream through the same cycle per micro-batch: `latest_offset` (how
//! far to read, within a [`ReadLimit`]), `get_batch(start, end)` (the rows, deterministic for
//! the same offsets, so a replayed batch reads exactly the same rows), and `commit(end)`.
//!
//! Sources are found by format name in a [`SourceRegistry`]; nothing outside this crate names a
//! concrete source.

#[cfg(feature = "delta")]
pub mod delta;
mod error;
pub mod files;
#[cfg(feature = "kafka")]
pub mod kafka;
mod kept;
mod memory;
pub mod nexmark;
mod offset;
mod rate;
mod rate_micro_batch;
mod registry;

use std::fmt::Debug;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use weir_common::Location;

pub use error::{Error, Result};
pub use files::FileSourceProvider;
pub use memory::{MemoryStream, MemoryStreamProvider};
pub use nexmark::NexmarkSourceProvider;
pub use offset::{Offset, ReadLimit};
pub use rate::RateSourceProvider;
pub use rate_micro_batch::RateMicroBatchSourceProvider;
pub use registry::{SourceFactory, SourceRegistry};

/// The rows of one micro-batch of one source, split into partitions that may be processed in
/// parallel.
pub type Partitions = Vec<Vec<RecordBatch>>;

/// A streaming source as a query is planned against it.
#[async_trait]
pub trait SourceProvider: Debug + Send + Sync {
    /// The format name this source was created under, e.g. `rate`.
    fn format(&self) -> &str;

    /// What the offsets log records to recognise this source on restart: the format, plus what
    /// tells two sources of one format apart where offsets are not interchangeable (a memory
    /// stream's name).
    fn identity(&self) -> String {
        self.format().to_string()
    }

    /// The schema of every batch the source produces.
    fn schema(&self) -> SchemaRef;

    /// Opens the stream for one run of a query. `ctx.metadata` is a directory in the checkpoint
    /// private to this source (its position in the query), for state such as the rate source's
    /// start time.
    async fn open(&self, ctx: SourceContext) -> Result<Box<dyn MicroBatchStream>>;

    /// Where this source continues when it replaces the source `previous` (an identity) whose
    /// last committed batch ended at `previous_end` (a selective reset of the source), so that
    /// nothing is lost or read twice; `None` when no position can be derived (another kind of
    /// source, another folder), and the source starts from its starting position.
    fn derive_start(&self, previous: &str, previous_end: &Offset) -> Option<Offset> {
        (previous == self.identity()).then(|| previous_end.clone())
    }

    /// How starting at `chosen` instead of `derived` (see [`SourceProvider::derive_start`])
    /// leaves rows unread or reads them twice, in words; `None` when it does neither, or when
    /// the source cannot tell.
    fn start_difference(&self, _derived: &Offset, _chosen: &Offset) -> Option<String> {
        None
    }
}

/// What a source gets from the engine when it is opened.
#[derive(Debug, Clone)]
pub struct SourceContext {
    /// The source's private directory in the checkpoint (`<checkpoint>/sources/<position>`).
    pub metadata: Location,
}

/// One source as read by one run of a query, one micro-batch at a time.
#[async_trait]
pub trait MicroBatchStream: Send + Sync {
    /// Description shown in progress records (`sources[].description`).
    fn description(&self) -> String;

    /// Where a query that has never read this source starts.
    fn initial_offset(&self) -> Offset;

    /// The read limit that applies when the user set none (from the source's options, e.g.
    /// `maxRowsPerTrigger`).
    fn default_read_limit(&self) -> ReadLimit {
        ReadLimit::AllAvailable
    }

    /// The end offset of the next batch starting at `start`, within `limit`. Returning `start`
    /// means no new data.
    async fn latest_offset(&mut self, start: &Offset, limit: ReadLimit) -> Result<Offset>;

    /// Whether a fresh query runs batch 0 even before this source has data. Spark runs batch 0
    /// as soon as a source reports any offset: the rate source always does (its batch 0 is
    /// empty), a memory stream only once something was pushed.
    fn runs_first_batch_without_data(&self) -> bool {
        false
    }

    /// The newest offset the source knew of at the last `latest_offset` call, ignoring limits
    /// (progress: `sources[].latestOffset`).
    fn reported_latest_offset(&self) -> Option<Offset> {
        None
    }

    /// The rows in `(start, end]`, in partitions. Must return the same rows for the same
    /// offsets, every time, also after a restart.
    async fn get_batch(&mut self, start: &Offset, end: &Offset) -> Result<Partitions>;

    /// Everything up to `end` is committed; the source may clean up.
    async fn commit(&mut self, _end: &Offset) -> Result<()> {
        Ok(())
    }

    /// The query runs with the available-now trigger: from now on, `latest_offset` must not go
    /// past what is available at this moment. Returns that target offset.
    async fn prepare_for_available_now(&mut self, start: &Offset) -> Result<Offset>;
}
