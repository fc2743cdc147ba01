//! Reading Delta tables with batch SQL: a table provider that loads the table's latest version
//! at every scan, so a query in the same session sees each batch a streaming query committed.
//! It backs `CREATE EXTERNAL TABLE t STORED AS DELTA LOCATION '...'` and the name of a streaming
//! table written by the Delta sink.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{CreateExternalTable, Expr};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{CastExpr, Column};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use url::Url;
use weir_common::delta;

fn ext(e: weir_common::ClassifiedError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// A version of a Delta table to read (Delta's time travel: `VERSION AS OF`, `TIMESTAMP AS
/// OF`).
#[derive(Debug, Clone, PartialEq)]
pub enum TableAt {
    /// The table as commit `version` left it.
    Version(i64),
    /// The newest version committed at or before this time.
    Timestamp(chrono::DateTime<chrono::Utc>),
}

/// A Delta table, read at its latest version on every scan (or at one pinned version).
#[derive(Debug)]
pub struct DeltaLatestTable {
    url: Url,
    storage: HashMap<String, String>,
    /// The columns readers see: the table's, but those only AUTO CDC reads
    /// (`__weir_cdc_*`, `weir_planner::auto_cdc::HIDDEN_PREFIX`).
    schema: SchemaRef,
    /// Where each seen column is among the table's.
    visible: Vec<usize>,
    at: Option<TableAt>,
}

impl DeltaLatestTable {
    /// The table at `url`, whose rows have `schema`.
    pub fn new(url: Url, storage: HashMap<String, String>, schema: SchemaRef) -> Self {
        let visible: Vec<usize> = (0..schema.fields().len())
            .filter(|&i| {
                !schema
                    .field(i)
                    .name()
                    .starts_with(weir_planner::auto_cdc::HIDDEN_PREFIX)
            })
            .collect();
        let schema = if visible.len() == schema.fields().len() {
            schema
        } else {
            Arc::new(
                schema
                    .project(&visible)
                    .unwrap_or_else(|_| schema.as_ref().clone()),
            )
        };
        Self {
            url,
            storage,
            schema,
            visible,
            at: None,
        }
    }

    /// The same table read at `at` instead of its latest version.
    pub fn at(mut self, at: TableAt) -> Self {
        self.at = Some(at);
        self
    }

    async fn provider(&self, state: &dyn Session) -> Result<Arc<dyn TableProvider>> {
        let mut table = delta::open(&self.url, &self.storage).await.map_err(ext)?;
        let doing = format!("read the Delta table at {} as of {:?}", self.url, self.at);
        match &self.at {
            None => {}
            Some(TableAt::Version(v)) => table
                .load_version(*v as _)
                .await
                .map_err(|e| ext(delta::error(e, &doing)))?,
            Some(TableAt::Timestamp(t)) => table
                .load_with_datetime(*t)
                .await
                .map_err(|e| ext(delta::error(e, &doing)))?,
        }
        table.update_datafusion_session(state)?;
        table.table_provider().await
    }
}

#[async_trait]
impl TableProvider for DeltaLatestTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let provider = self.provider(state).await?;
        // The projection over the seen columns, as the table's.
        let hidden = self.visible.len() != provider.schema().fields().len();
        let among_table: Option<Vec<usize>> = match (projection, hidden) {
            (Some(p), true) => Some(p.iter().map(|&i| self.visible[i]).collect()),
            (None, true) => Some(self.visible.clone()),
            (p, false) => p.cloned(),
        };
        let plan = provider
            .scan(state, among_table.as_ref(), filters, limit)
            .await?;
        // delta-rs may read strings as views, or a table's types may have moved on: give the
        // rows the types this table declared when it was registered.
        let want = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => Arc::clone(&self.schema),
        };
        let have = plan.schema();
        if have.fields().len() != want.fields().len() {
            return Err(DataFusionError::Plan(format!(
                "The Delta table at {} now has {} columns where {} were expected; register it \
                 again.",
                self.url,
                have.fields().len(),
                want.fields().len()
            )));
        }
        if have
            .fields()
            .iter()
            .zip(want.fields())
            .all(|(h, w)| h.data_type() == w.data_type())
        {
            return Ok(plan);
        }
        let exprs = want
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let column: Arc<dyn PhysicalExpr> = Arc::new(Column::new(have.field(i).name(), i));
                let expr: Arc<dyn PhysicalExpr> = if have.field(i).data_type() == f.data_type() {
                    column
                } else {
                    Arc::new(CastExpr::new(column, f.data_type().clone(), None))
                };
                ProjectionExpr::new(expr, f.name().clone())
            })
            .collect::<Vec<_>>();
        Ok(Arc::new(ProjectionExec::try_new(exprs, plan)?))
    }
}

/// `CREATE EXTERNAL TABLE ... STORED AS DELTA LOCATION '...'` (options are the S3 client's
/// `aws_*` settings).
#[derive(Debug, Default)]
pub struct DeltaTableFactory;

#[async_trait]
impl TableProviderFactory for DeltaTableFactory {
    async fn create(
        &self,
        _state: &dyn Session,
        cmd: &CreateExternalTable,
    ) -> Result<Arc<dyn TableProvider>> {
        let [location] = cmd.locations.as_slice() else {
            return Err(DataFusionError::Plan(format!(
                "A Delta table has one location; {} were given.",
                cmd.locations.len()
            )));
        };
        let url = delta::table_url(location, false).map_err(ext)?;
        let storage: HashMap<String, String> = cmd
            .options
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect();
        let table = delta::open(&url, &storage).await.map_err(ext)?;
        if table.version().is_none() {
            return Err(ext(weir_common::ClassifiedError::new(
                "DELTA_MISSING_DELTA_TABLE",
                "42P01",
                format!("There is no Delta table at {url}."),
            )));
        }
        let schema = table.snapshot()?.snapshot().arrow_schema();
        Ok(Arc::new(DeltaLatestTable::new(url, storage, schema)))
    }
}
