//! The `noop` sink: consumes every batch and writes nothing (benchmarks).

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;

use crate::{Result, Sink};

/// Discards its input.
#[derive(Debug, Default, Clone)]
pub struct NoopSink;

#[async_trait]
impl Sink for NoopSink {
    fn description(&self) -> String {
        "NoopSink".to_string()
    }

    fn is_idempotent(&self) -> bool {
        true
    }

    async fn add_batch(
        &self,
        _batch_id: u64,
        _schema: SchemaRef,
        _batches: Vec<RecordBatch>,
    ) -> Result<()> {
        Ok(())
    }
}
