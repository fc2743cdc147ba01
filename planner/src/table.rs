//! The table behind every streaming scan.

use std::sync::{Arc, RwLock};

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use weir_common::ClassifiedError;
use weir_sources::{Partitions, SourceProvider};

use crate::StreamScanExec;

/// A streaming source as a table. Its rows exist one micro-batch at a time: the engine calls
/// [`StreamingTable::set_batch`] before it plans the batch's physical plan, and `scan` reads
/// them. Outside a running streaming query there are no rows, and scanning is refused.
#[derive(Debug)]
pub struct StreamingTable {
    name: String,
    source: Arc<dyn SourceProvider>,
    /// The name the user gave the source (`.name("orders_us")`, `STREAM(..., name =>
    /// 'orders_us')`): with source evolution, its offsets are kept under it.
    source_name: Option<String>,
    slot: RwLock<Option<Partitions>>,
}

/// Checks a source name: letters, digits and underscores (Spark's rule).
pub fn check_source_name(name: &str) -> Result<(), ClassifiedError> {
    if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Ok(());
    }
    Err(ClassifiedError::new(
        "INVALID_STREAMING_SOURCE_NAME",
        "42602",
        format!(
            "'{name}' is not a valid source name: use letters, digits and underscores only \
             (e.g. orders_us)."
        ),
    ))
}

impl StreamingTable {
    /// A streaming table called `name` reading `source`.
    pub fn new(name: impl Into<String>, source: Arc<dyn SourceProvider>) -> Self {
        Self {
            name: name.into(),
            source,
            source_name: None,
            slot: RwLock::new(None),
        }
    }

    /// The same table with the source named `name` (checked with [`check_source_name`]).
    pub fn with_source_name(mut self, name: impl Into<String>) -> Self {
        self.source_name = Some(name.into());
        self
    }

    /// The name the user gave the source, if any.
    pub fn source_name(&self) -> Option<&str> {
        self.source_name.as_deref()
    }

    /// The table's name as written in the query.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The source definition.
    pub fn source(&self) -> &Arc<dyn SourceProvider> {
        &self.source
    }

    /// The same source with no rows: each query run gets its own copies.
    pub fn fresh(&self) -> Self {
        Self {
            source_name: self.source_name.clone(),
            ..Self::new(self.name.clone(), Arc::clone(&self.source))
        }
    }

    /// Makes `partitions` the rows of the current micro-batch.
    pub fn set_batch(&self, partitions: Partitions) {
        if let Ok(mut slot) = self.slot.write() {
            *slot = Some(partitions);
        }
    }

    /// Drops the current micro-batch's rows.
    pub fn clear(&self) {
        if let Ok(mut slot) = self.slot.write() {
            *slot = None;
        }
    }
}

#[async_trait]
impl TableProvider for StreamingTable {
    fn schema(&self) -> SchemaRef {
        self.source.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let slot = self
            .slot
            .read()
            .map_err(|_| DataFusionError::Internal("streaming table lock poisoned".into()))?;
        let Some(partitions) = slot.as_ref() else {
            return Err(DataFusionError::External(Box::new(ClassifiedError::new(
                "NON_STREAMING_ACTION_ON_STREAMING_SOURCE",
                "42K0E",
                format!(
                    "'{}' is a streaming source: a query that reads it must be started as a \
                     streaming query (write_stream().start() in Rust, CREATE STREAMING TABLE or \
                     weir run in SQL), not collected as a batch.",
                    self.name
                ),
            ))));
        };
        let mut parts = partitions.clone();
        if parts.is_empty() {
            parts.push(vec![]);
        }
        let exec = MemorySourceConfig::try_new_exec(&parts, self.schema(), projection.cloned())?;
        Ok(Arc::new(StreamScanExec::new(self.name.clone(), exec)))
    }
}
