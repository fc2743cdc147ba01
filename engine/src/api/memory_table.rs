//! The memory sink's rows as a DataFusion table, read afresh on every scan.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use weir_sinks::MemorySinkData;

/// A memory sink as a table.
#[derive(Debug)]
pub struct MemorySinkTable {
    data: Arc<MemorySinkData>,
}

impl MemorySinkTable {
    /// The table over `data`.
    pub fn new(data: Arc<MemorySinkData>) -> Self {
        Self { data }
    }
}

#[async_trait]
impl TableProvider for MemorySinkTable {
    fn schema(&self) -> SchemaRef {
        self.data.schema()
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
        let rows = self.data.snapshot();
        Ok(MemorySourceConfig::try_new_exec(
            &[rows],
            self.schema(),
            projection.cloned(),
        )?)
    }
}
