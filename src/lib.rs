//! weir: Arrow-columnar micro-batch stream processing with Spark Structured Streaming's
//! semantics, in Rust.
//!
//! ```no_run
//! use weir::{DataFrameStreamExt, Trigger, WeirSession};
//!
//! # async fn demo() -> weir::Result<()> {
//! let session = WeirSession::new();
//! let df = session
//!     .read_stream()
//!     .format("rate")
//!     .option("rowsPerSecond", 10)
//!     .load()?
//!     .filter(weir::datafusion::prelude::col("value").gt(weir::datafusion::prelude::lit(3)))?;
//! let query = df
//!     .write_stream()?
//!     .format("console")
//!     .trigger(Trigger::ProcessingTime(std::time::Duration::from_secs(1)))
//!     .checkpoint_location("/tmp/weir-demo-checkpoint")
//!     .start()
//!     .await?;
//! query.await_termination().await.ok();
//! # Ok(())
//! # }
//! ```

pub mod bench;
mod bench_inputs;
pub mod nexmark;

pub use datafusion;
pub use weir_common::{ClassifiedError, Location, Options};
pub use weir_engine::*;
pub use weir_planner::limits::MAX_EXPRESSION_DEPTH;
pub use weir_sinks::{ForeachBatchSink, MemorySink, Sink, SinkRegistry};
pub use weir_sources::{MemoryStream, Offset, ReadLimit, SourceProvider, SourceRegistry};

/// The README's Rust example, compiled as a doc test so it cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
