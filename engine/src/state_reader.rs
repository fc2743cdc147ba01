//! SQL over a checkpoint's state: `read_state_metadata('DIR')`, as Spark's `state-metadata`
//! data source, one row per stateful operator and store: `operatorId`, `operatorName`,
//! `stateStoreName`, `numPartitions`, `minBatchId`, `maxBatchId` (the batches whose state the
//! checkpoint still holds, up to the last committed one). The checkpoint is read when the query
//! runs, without a lock: a running query may own it.

use std::sync::Arc;

use arrow::array::{Int32Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::datasource::{MemTable, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use weir_common::{ClassifiedError, Location};

use crate::checkpoint::inspect::inspect;

fn user(e: impl Into<ClassifiedError>) -> DataFusionError {
    DataFusionError::External(Box::new(e.into()))
}

/// The table function `read_state_metadata('DIR')`.
#[derive(Debug, Default)]
pub struct ReadStateMetadata;

impl TableFunctionImpl for ReadStateMetadata {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let dir = match args.exprs() {
            [Expr::Literal(v, _)] => v.try_as_str().flatten().map(str::to_string),
            _ => None,
        }
        .ok_or_else(|| {
            user(ClassifiedError::new(
                "INVALID_STATE_READER_ARGUMENT",
                "42K09",
                "read_state_metadata takes one argument, the checkpoint location as a string: \
                 read_state_metadata('/data/ck').",
            ))
        })?;
        Ok(Arc::new(StateMetadataTable { dir }))
    }
}

/// The operators of the checkpoint at `dir`, read at each scan.
#[derive(Debug)]
struct StateMetadataTable {
    dir: String,
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("operatorId", DataType::Int64, false),
        Field::new("operatorName", DataType::Utf8, false),
        Field::new("stateStoreName", DataType::Utf8, false),
        Field::new("numPartitions", DataType::Int32, false),
        Field::new("minBatchId", DataType::Int64, true),
        Field::new("maxBatchId", DataType::Int64, true),
    ]))
}

impl StateMetadataTable {
    async fn rows(&self) -> Result<RecordBatch> {
        let location = Location::parse_existing_with(&self.dir, std::iter::empty::<(&str, &str)>())
            .map_err(user)?;
        let report = inspect(location)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let (mut id, mut name, mut store, mut parts, mut lo, mut hi) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for op in &report.operators {
            for s in &op.store_names {
                id.push(i64::from(op.operator_id));
                name.push(op.operator_name.clone());
                store.push(s.clone());
                parts.push(op.num_partitions as i32);
                // State version v holds the state after batch v - 1; only committed batches
                // count.
                let range = match (op.store_versions.get(s), report.last_committed) {
                    (Some(&(a, b)), Some(c)) => {
                        let base = op.first_batch;
                        let (first, last) = (
                            base + a.saturating_sub(1),
                            (base + b.saturating_sub(1)).min(c),
                        );
                        (first <= last).then_some((first as i64, last as i64))
                    }
                    _ => None,
                };
                lo.push(range.map(|r| r.0));
                hi.push(range.map(|r| r.1));
            }
        }
        Ok(RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(id)),
                Arc::new(StringArray::from(name)),
                Arc::new(StringArray::from(store)),
                Arc::new(Int32Array::from(parts)),
                Arc::new(Int64Array::from(lo)),
                Arc::new(Int64Array::from(hi)),
            ],
        )?)
    }
}

#[async_trait]
impl TableProvider for StateMetadataTable {
    fn schema(&self) -> SchemaRef {
        schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let table = MemTable::try_new(schema(), vec![vec![self.rows().await?]])?;
        table.scan(state, projection, filters, limit).await
    }
}
