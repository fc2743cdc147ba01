//! weir's planner: everything between SQL text (or a DataFrame) and a plan the engine can run
//! one micro-batch at a time.
//!
//! - [`statement`]: weir's statements on top of DataFusion's dialect (`CREATE STREAMING TABLE`,
//!   `INSERT INTO` a streaming table) and the `STREAM` keyword.
//! - [`relation`]: a DataFusion `RelationPlanner` that turns `STREAM rate(rowsPerSecond => 10)`
//!   or `STREAM events` into a scan of a [`StreamingTable`].
//! - [`StreamingTable`]: the table behind every streaming scan; per micro-batch the engine
//!   puts that batch's rows into it before planning the physical plan; its physical scan is a
//!   [`StreamScanExec`], which tells the engine which operators see the stream.
//! - [`analysis`]: which scans are streaming, and which operations a streaming plan may not
//!   contain (refused before anything runs).
//! - [`sink_table`]: reading a weir file sink's output directory through its manifest.
//! - [`changelog`]: an aggregation over an updating aggregation (retractions between them).
//! - [`extreme`]: `min` and `max` that take back retracted rows (for [`changelog`]).
//! - [`dedupe`]: streaming deduplication (`DISTINCT ON`, `drop_duplicates`).
//! - [`join`]: joins of two streams, and the event-time range their condition implies.
//! - [`limits`]: bounds on what one statement may make the planner do (expression depth).
//! - [`watermark`]: the event-time watermark node (`WATERMARK col DELAY OF ...`,
//!   `with_watermark`).
//! - [`window`]: the `window()` time-window function.
//! - [`session_window`]: `session_window()`, session windows of a streaming aggregation.
//! - [`top_n`]: top-N per key (`row_number() ... <= N`) over a stream.
//! - [`to_char`]: DataFusion's `to_char` with the format parsed once per batch.

pub mod analysis;
pub mod auto_cdc;
pub mod changelog;
pub mod dedupe;
pub mod extreme;
pub mod join;
pub mod limits;
pub mod pipeline;
pub mod relation;
pub mod session_window;
pub mod sink_table;
pub mod statement;
mod stream_scan;
mod table;
pub mod to_char;
pub mod top_n;
pub mod watermark;
pub mod window;

pub use analysis::{
    check_streaming_plan, has_stateful_operator, has_streaming_aggregation, is_streaming,
    streaming_tables, with_fresh_streaming_tables,
};
pub use relation::{StreamCatalog, StreamRelationPlanner};
pub use stream_scan::StreamScanExec;
pub use table::{StreamingTable, check_source_name};
