//! Unit-test support for the stateful operators: an operator planned from SQL, stepped one
//! batch at a time on in-memory stores.
//!
//! ```text
//! Harness::new(sql, streams, mode)   weir's planner over in-memory streams (memory:<name>)
//!   step::<O>(rows, watermark)       one batch: the streams' rows → DataFusion's plan with
//!                                    the stateful operators in place → operator O's inputs,
//!                                    collected (one partition) → O::process on the run's
//!                                    stores at this batch's version → commit
//!   phases(rows)                     the same operator and inputs, for a test that calls
//!                                    one of O's phases itself
//! ```
//!
//! The operator is the one the engine would run: its stores, keys, time columns and eviction
//! bounds come from the query, not from hand-built fields.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::SessionConfig;
use weir_planner::{StreamingTable, streaming_tables};
use weir_sinks::OutputMode;
use weir_sources::MemoryStream;
use weir_state::StateStore;

use super::operator::{Processed, StatefulExec, StatefulOperator, Step};
use super::{BatchState, BatchWatermark, StateBackend, StateRun, plan_stateful};
use crate::api::WeirSession;

/// A streaming query's plan and a run's in-memory state, stepped batch by batch.
pub(crate) struct Harness {
    session: WeirSession,
    plan: LogicalPlan,
    tables: Vec<Arc<StreamingTable>>,
    run: Arc<StateRun>,
    batch: u64,
}

/// One batch's plan: the stateful operator of the type asked for and its inputs' rows.
pub(crate) struct Planned {
    node: Arc<dyn ExecutionPlan>,
    /// Each input's rows (one shuffle partition holds them all).
    pub(crate) input: Vec<Vec<RecordBatch>>,
}

impl Planned {
    /// The operator.
    pub(crate) fn operator<O: StatefulOperator + 'static>(&self) -> &O {
        self.node
            .downcast_ref::<StatefulExec<O>>()
            .map(StatefulExec::operator)
            .expect("the plan's operator has the type asked for")
    }
}

impl Harness {
    /// Plans `sql` over `streams` (each read as `STREAM <name>`) in `mode`, on one shuffle
    /// partition.
    pub(crate) async fn new(sql: &str, streams: &[(&str, SchemaRef)], mode: OutputMode) -> Self {
        let session = WeirSession::with_config(SessionConfig::new().with_target_partitions(1));
        for (name, schema) in streams {
            session.register_memory_stream(&MemoryStream::new(*name, Arc::clone(schema)));
        }
        let sql = weir_planner::statement::rewrite_stream_keyword(sql).expect("the query parses");
        let logical = session.plan_sql(&sql).await.expect("the query plans");
        let (plan, _) = crate::api::streaming_plan(&logical, mode, crate::api::PlanBehaviours::NEW)
            .expect("the query can stream");
        let tables = streaming_tables(&plan);
        let run = StateRun::open(
            StateBackend::Memory,
            None,
            None,
            uuid::Uuid::nil(),
            super::Instances::Scratch(uuid::Uuid::nil()),
            1,
            mode,
        )
        .expect("an in-memory run opens");
        Self {
            session,
            plan,
            tables,
            run: Arc::new(run),
            batch: 0,
        }
    }

    /// Plans the next batch, whose streams hold `rows` (by stream name; a stream not named
    /// has none), and finds the first stateful operator of type `O` in it.
    pub(crate) async fn phases<O: StatefulOperator + 'static>(
        &self,
        rows: &[(&str, RecordBatch)],
        watermark: BatchWatermark,
    ) -> Planned {
        for t in &self.tables {
            let parts: Vec<RecordBatch> = rows
                .iter()
                .filter(|(name, _)| t.source().identity() == format!("memory:{name}"))
                .map(|(_, b)| b.clone())
                .collect();
            t.set_batch(vec![parts]);
        }
        let state = self.session.context().state();
        let physical = state
            .create_physical_plan(&self.plan)
            .await
            .expect("the batch plans");
        let batch = Arc::new(BatchState::new(
            Some(Arc::clone(&self.run)),
            self.batch,
            watermark,
        ));
        let (physical, _) = plan_stateful(physical, &batch).expect("the operators attach");
        let node = find::<O>(&physical).expect("the plan has the operator");
        let mut input = vec![];
        for plan in node
            .downcast_ref::<StatefulExec<O>>()
            .map(|e| e.operator().inputs())
            .unwrap_or_default()
        {
            input.push(
                collect(Arc::clone(plan), state.task_ctx())
                    .await
                    .expect("the input runs"),
            );
        }
        for t in &self.tables {
            t.clear();
        }
        Planned { node, input }
    }

    /// The operator's stores at the version the next batch reads.
    pub(crate) fn stores<O: StatefulOperator>(&self, op: &O) -> Vec<Box<dyn StateStore>> {
        let info = op.info();
        info.store_names
            .iter()
            .map(|name| {
                self.run
                    .open_store(
                        info.operator_id,
                        0,
                        (name, info.key_shape(name)),
                        self.batch,
                    )
                    .expect("an in-memory store opens")
            })
            .collect()
    }

    /// Runs the next batch through operator `O`: its streams hold `rows`, its watermarks are
    /// `watermark`; the operator's stores are committed and its result returned.
    pub(crate) async fn step<O: StatefulOperator + 'static>(
        &mut self,
        rows: &[(&str, RecordBatch)],
        watermark: BatchWatermark,
    ) -> Processed {
        let planned = self.phases::<O>(rows, watermark).await;
        let op = planned.operator::<O>();
        let mut stores = self.stores(op);
        let processed = op
            .process(Step {
                input: planned.input.clone(),
                stores: &mut stores,
                run: &self.run,
                batch: self.batch,
                watermark,
            })
            .expect("the step runs");
        for s in &mut stores {
            s.commit().expect("the store commits");
        }
        self.batch += 1;
        processed
    }
}

fn find<O: StatefulOperator + 'static>(
    plan: &Arc<dyn ExecutionPlan>,
) -> Option<Arc<dyn ExecutionPlan>> {
    if plan.downcast_ref::<StatefulExec<O>>().is_some() {
        return Some(Arc::clone(plan));
    }
    plan.children().into_iter().find_map(find::<O>)
}

/// `batch`'s rows as comma-separated values, sorted: an order-free picture of an output.
pub(crate) fn lines(batch: &RecordBatch) -> Vec<String> {
    let mut out: Vec<String> = (0..batch.num_rows())
        .map(|r| {
            (0..batch.num_columns())
                .map(|c| {
                    arrow::util::display::array_value_to_string(batch.column(c), r)
                        .expect("a value displays")
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    out.sort();
    out
}

/// The test streams' schema: a key `k`, an event time `t` and a value `v`.
pub(crate) fn event_schema() -> SchemaRef {
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, true),
        Field::new("t", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        Field::new("v", DataType::Int64, true),
    ]))
}

/// Rows `(k, t in seconds, v)` of [`event_schema`]; a time of `None` is null.
pub(crate) fn events(rows: &[(&str, Option<i64>, i64)]) -> RecordBatch {
    use arrow::array::{Int64Array, StringArray, TimestampMicrosecondArray};
    RecordBatch::try_new(
        event_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(TimestampMicrosecondArray::from_iter(
                rows.iter().map(|r| r.1.map(|s| s * 1_000_000)),
            )),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
        ],
    )
    .expect("the rows fit the schema")
}

/// Watermarks (ms) for a batch: rows at or before `late_ms` are late, state at or before
/// `eviction_ms` is evicted.
pub(crate) fn watermark(late_ms: i64, eviction_ms: i64) -> BatchWatermark {
    BatchWatermark {
        late_ms,
        eviction_ms,
    }
}
