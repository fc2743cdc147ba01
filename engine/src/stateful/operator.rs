//! The shell every stateful operator runs in: [`StatefulExec`] does what they share, and a
//! [`StatefulOperator`] says what differs.
//!
//! ```text
//! StatefulExec<O>, output partition p of P
//!   first partition to run: every input of O, all partitions ──shuffle by O's keys──▶ P buckets
//!   on the blocking pool:
//!     open O's stores for p at the batch's version      (info().store_names, in order)
//!     O::process(bucket p of each input, stores)         load · match or merge · write · evict
//!     commit every store (version N+1)                   crash tests pause after partition 0's
//!     record the partition's figures                     stateOperators of the progress record
//!   ──▶ one output batch
//! ```
//!
//! An operator is planned in two steps, as DataFusion plans it once and weir runs it once per
//! batch: [`super::plan_stateful`] gives it its operator ID and the batch, and wraps it in a
//! `StatefulExec`.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::row::SortField;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PhysicalExpr, PlanProperties,
};
use tokio::sync::OnceCell;
use weir_state::{StateStore, StoreMetrics};

use super::{
    BatchState, BatchWatermark, OperatorInfo, StateRun, on_blocking_pool, one_batch_stream,
    state_error,
};
use crate::execution::progress::StateOperatorProgress;

/// What a stateful operator is, apart from the shell it runs in.
pub(crate) trait StatefulOperator: Send + Sync + 'static {
    /// The plan node's name (`StatefulAggregateExec`).
    fn name(&self) -> &'static str;

    /// The operator as the checkpoint records it: its ID, kind, stores and state schemas.
    fn info(&self) -> &OperatorInfo;

    /// The rows it outputs.
    fn schema(&self) -> SchemaRef;

    /// Its inputs; each is shuffled by [`StatefulOperator::shuffle_key`].
    fn inputs(&self) -> Vec<&Arc<dyn ExecutionPlan>>;

    /// What rows of input `input` are shuffled by: equal keys meet in one partition.
    fn shuffle_key(&self, input: usize) -> Result<ShuffleKey>;

    /// One partition's step over its rows of each input (in arrival order) and its stores
    /// (opened at the batch's version, in the order of `info().store_names`): applies its
    /// changes to the stores, which the shell commits, and returns its output.
    fn process(&self, step: Step<'_>) -> Result<Processed>;

    /// One line for `EXPLAIN`.
    fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

/// The key a stateful operator's input is shuffled by: expressions over the input's rows,
/// encoded with arrow-row as `fields`.
pub(crate) struct ShuffleKey {
    pub(crate) exprs: Vec<Arc<dyn PhysicalExpr>>,
    pub(crate) fields: Vec<SortField>,
    /// A boolean column whose true rows go to every partition (AUTO CDC's truncates, which
    /// apply to every key).
    pub(crate) broadcast: Option<usize>,
}

impl ShuffleKey {
    /// The columns at `columns` of `schema`.
    pub(crate) fn columns(schema: &arrow::datatypes::Schema, columns: &[usize]) -> Self {
        Self {
            exprs: columns
                .iter()
                .map(|&i| {
                    Arc::new(datafusion::physical_expr::expressions::Column::new(
                        schema.field(i).name(),
                        i,
                    )) as Arc<dyn PhysicalExpr>
                })
                .collect(),
            fields: columns
                .iter()
                .map(|&i| SortField::new(schema.field(i).data_type().clone()))
                .collect(),
            broadcast: None,
        }
    }

    /// The key, with the rows where boolean column `column` is true sent to every partition.
    pub(crate) fn broadcasting(self, column: usize) -> Self {
        Self {
            broadcast: Some(column),
            ..self
        }
    }
}

/// What one partition's step works on.
pub(crate) struct Step<'a> {
    /// The partition's rows of each input, in arrival order.
    pub(crate) input: Vec<Vec<RecordBatch>>,
    /// The operator's stores for this partition, in the order of `info().store_names`.
    pub(crate) stores: &'a mut [Box<dyn StateStore>],
    /// The query run: output mode, partitions, eviction floors.
    pub(crate) run: &'a StateRun,
    /// The batch's ID (it reads state version N and commits N+1).
    pub(crate) batch: u64,
    /// The batch's watermarks.
    pub(crate) watermark: BatchWatermark,
}

/// How many rows an operator holds in state, for `numRowsTotal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowsInState {
    /// The keys of the store at this position (one row per key).
    KeysOf(usize),
    /// A count the operator keeps itself.
    Counted(u64),
}

/// What one partition's step did.
#[derive(Debug)]
pub(crate) struct Processed {
    pub(crate) output: RecordBatch,
    pub(crate) rows_updated: u64,
    pub(crate) rows_removed: u64,
    pub(crate) rows_dropped_by_watermark: u64,
    pub(crate) rows_in_state: RowsInState,
    /// Time spent reading, matching and writing the batch's rows.
    pub(crate) updates: Duration,
    /// Time spent evicting.
    pub(crate) removals: Duration,
}

/// A stateful operator in a batch's physical plan: one output partition per shuffle
/// partition, each running `O`'s step on its rows and stores.
pub(crate) struct StatefulExec<O: StatefulOperator> {
    inner: Arc<Shell<O>>,
    properties: Arc<PlanProperties>,
}

struct Shell<O> {
    operator: O,
    batch: Arc<BatchState>,
    /// Every input's rows, by input then shuffle partition; filled by the first output
    /// partition that runs.
    shuffled: OnceCell<Vec<Vec<Vec<RecordBatch>>>>,
}

impl<O: StatefulOperator> StatefulExec<O> {
    /// `operator` as it runs in `batch`.
    pub(crate) fn new(operator: O, batch: Arc<BatchState>) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(operator.schema()),
            Partitioning::UnknownPartitioning(operator.info().num_partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            inner: Arc::new(Shell {
                operator,
                batch,
                shuffled: OnceCell::new(),
            }),
            properties,
        }
    }

    /// The operator as the checkpoint records it.
    pub(crate) fn info(&self) -> &OperatorInfo {
        self.inner.operator.info()
    }

    /// The operator.
    pub(crate) fn operator(&self) -> &O {
        &self.inner.operator
    }
}

impl<O: StatefulOperator> Shell<O> {
    /// Reads every input over all its partitions and splits its rows by shuffle partition.
    async fn shuffle(&self, context: Arc<TaskContext>) -> Result<Vec<Vec<Vec<RecordBatch>>>> {
        let partitions = self.batch.run()?.partitions;
        let mut out = vec![];
        for (i, input) in self.operator.inputs().into_iter().enumerate() {
            let key = self.operator.shuffle_key(i)?;
            out.push(
                super::shuffle(Arc::clone(input), Arc::clone(&context), &key, partitions).await?,
            );
        }
        Ok(out)
    }

    /// Runs partition `partition`'s step: opens its stores, processes, commits and records the
    /// partition's figures.
    fn run_partition(&self, partition: usize, input: Vec<Vec<RecordBatch>>) -> Result<RecordBatch> {
        let opening = Instant::now();
        let run = self.batch.run()?;
        let info = self.operator.info();
        let mut stores = info
            .store_names
            .iter()
            .map(|name| {
                let store = (name.as_str(), info.key_shape(name));
                run.open_store(info.operator_id, partition, store, self.batch.batch)
            })
            .collect::<weir_state::Result<Vec<_>>>()
            .map_err(state_error)?;
        let opened = opening.elapsed();
        let processed = self.operator.process(Step {
            input,
            stores: &mut stores,
            run,
            batch: self.batch.batch,
            watermark: self.batch.watermark,
        })?;

        let committing = Instant::now();
        for store in &mut stores {
            store.commit().map_err(state_error)?;
        }
        if partition == 0 {
            // Crash tests stop here: one partition's state is committed, the others' are not.
            weir_common::failpoint::pause_point("state_committed", self.batch.batch);
        }
        let metrics: Vec<StoreMetrics> = stores.iter().map(|s| s.metrics()).collect();
        let mut custom = std::collections::BTreeMap::new();
        for m in &metrics {
            for (k, v) in &m.custom {
                *custom.entry(k.clone()).or_default() += v;
            }
        }
        let rows_total = match processed.rows_in_state {
            RowsInState::KeysOf(store) => metrics.get(store).map_or(0, |m| m.num_keys),
            RowsInState::Counted(n) => n,
        };
        self.batch.record(
            info.operator_id,
            StateOperatorProgress {
                operator_name: info.operator_name.clone(),
                num_rows_total: rows_total,
                num_rows_updated: processed.rows_updated,
                all_updates_time_ms: (opened + processed.updates).as_millis() as u64,
                num_rows_removed: processed.rows_removed,
                all_removals_time_ms: processed.removals.as_millis() as u64,
                num_rows_dropped_by_watermark: processed.rows_dropped_by_watermark,
                commit_time_ms: committing.elapsed().as_millis() as u64,
                memory_used_bytes: metrics.iter().map(|m| m.memory_used_bytes).sum(),
                num_shuffle_partitions: run.partitions as u64,
                num_state_store_instances: stores.len() as u64,
                custom_metrics: custom,
            },
        );
        Ok(processed.output)
    }
}

impl<O: StatefulOperator> fmt::Debug for StatefulExec<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(self.inner.operator.name())
            .field("operator", &self.info().operator_id)
            .finish()
    }
}

impl<O: StatefulOperator> DisplayAs for StatefulExec<O> {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.operator.describe(f)
    }
}

impl<O: StatefulOperator> ExecutionPlan for StatefulExec<O> {
    fn name(&self) -> &str {
        self.inner.operator.name()
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.inner.operator.inputs()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let same = children.len() == self.children().len()
            && children
                .iter()
                .zip(self.children())
                .all(|(new, old)| Arc::ptr_eq(new, old));
        if same {
            return Ok(self);
        }
        Err(DataFusionError::Internal(format!(
            "the inputs of {} cannot be replaced once planned",
            self.name()
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let inner = Arc::clone(&self.inner);
        let run = async move {
            let shuffled = inner
                .shuffled
                .get_or_try_init(|| inner.shuffle(context))
                .await?;
            let input = shuffled
                .iter()
                .map(|buckets| buckets.get(partition).cloned().unwrap_or_default())
                .collect();
            let worker = Arc::clone(&inner);
            on_blocking_pool(move || worker.run_partition(partition, input)).await
        };
        Ok(one_batch_stream(self.inner.operator.schema(), run))
    }
}
