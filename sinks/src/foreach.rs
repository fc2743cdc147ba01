//! The foreach-batch sink: a Rust closure receives each micro-batch's ID and rows. As in Spark,
//! exactly-once is the closure's job: a replayed batch ID is delivered again.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use futures::future::BoxFuture;

use crate::{Error, Result, Sink};

/// The closure of a foreach-batch sink: `(batch_id, rows)`; an `Err(message)` fails the query.
pub type ForeachBatchFn = Arc<
    dyn Fn(u64, Vec<RecordBatch>) -> BoxFuture<'static, std::result::Result<(), String>>
        + Send
        + Sync,
>;

/// Calls a closure with every micro-batch.
#[derive(Clone)]
pub struct ForeachBatchSink {
    f: ForeachBatchFn,
}

impl ForeachBatchSink {
    /// A sink calling `f` for every batch.
    pub fn new(f: ForeachBatchFn) -> Self {
        Self { f }
    }
}

impl fmt::Debug for ForeachBatchSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ForeachBatchSink")
    }
}

#[async_trait]
impl Sink for ForeachBatchSink {
    fn description(&self) -> String {
        "ForeachBatchSink".to_string()
    }

    fn is_idempotent(&self) -> bool {
        false
    }

    async fn add_batch(
        &self,
        batch_id: u64,
        _schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<()> {
        (self.f)(batch_id, batches)
            .await
            .map_err(|message| Error::Foreach { batch_id, message })
    }
}
