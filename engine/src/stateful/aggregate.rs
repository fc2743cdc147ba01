//! Streaming aggregation (DESIGN.md §5): the batch's partial aggregate, shuffled by group key
//! into the checkpoint's partitions, merged per partition with the stored accumulator state,
//! written back, and emitted by output mode.
//!
//! ```text
//! AggregateExec(Partial)                 DataFusion's, per input partition: group keys + state
//!   └─ shuffle                           all partial rows, by key_partition(encoded key)
//! StatefulAggregateExec, partition p     multi_get the batch's keys from store (op, p, default)
//!                                        GroupsAccumulator::merge_batch(stored), merge_batch(batch)
//!                                        state() → one WriteBatch → emit → commit version N+1
//! ```
//!
//! Keys are the group columns encoded with arrow-row; values are the accumulators' state
//! columns (`state_fields`), encoded the same way.

use datafusion::common::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch, StructArray};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_expr::GroupsAccumulatorAdapter;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, ScalarFunctionExpr};
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PhysicalExpr, PlanProperties,
};
use tokio::sync::OnceCell;
use weir_common::ClassifiedError;
use weir_sinks::OutputMode;
use weir_state::{KeyRange, WriteBatch};

use super::watermark::{drop_late, event_micros};
use super::{
    BatchState, OperatorInfo, event_time_bound, on_blocking_pool, one_batch_stream, state_error,
    watermark_columns,
};
use crate::progress::StateOperatorProgress;

const STORE: &str = "default";
/// The stored key's leading event-time column, when the aggregation has a watermarked key.
const EVENT_TIME: &str = super::EVENT_TIME_KEY;

/// A physical expression as text without column positions (`value@0 % 10` → `value % 10`), so
/// the fingerprint survives projection changes.
pub(super) fn without_positions(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '@' && chars.peek().is_some_and(|d| d.is_ascii_digit()) {
            while chars.peek().is_some_and(|d| d.is_ascii_digit()) {
                chars.next();
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The `Partial` aggregate under a `Final` one, through repartitions and coalesces.
fn find_partial(plan: &Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    let mut node = Arc::clone(plan);
    loop {
        if let Some(agg) = node.downcast_ref::<AggregateExec>() {
            if *agg.mode() == AggregateMode::Partial {
                return Ok(node);
            }
            break;
        }
        let next = match node.children().as_slice() {
            [only] => Arc::clone(only),
            _ => break,
        };
        node = next;
    }
    Err(DataFusionError::Internal(format!(
        "no partial aggregate below a final one in {}",
        datafusion::physical_plan::displayable(plan.as_ref()).one_line()
    )))
}

/// DataFusion's partial aggregate that feeds a streaming aggregation replacing `agg` (a
/// `Final`, `FinalPartitioned`, `Single` or `SinglePartitioned` aggregate): the one below it, or
/// a new one over its input.
pub(super) fn partial_of(agg: &AggregateExec) -> Result<Arc<dyn ExecutionPlan>> {
    if agg.group_expr().has_grouping_set() {
        return Err(DataFusionError::External(Box::new(
            ClassifiedError::unsupported(
                "GROUPING SETS, CUBE and ROLLUP are not supported in a streaming \
                 aggregation; group by plain columns or expressions.",
            ),
        )));
    }
    match agg.mode() {
        AggregateMode::Final | AggregateMode::FinalPartitioned => find_partial(agg.input()),
        AggregateMode::Single | AggregateMode::SinglePartitioned => {
            Ok(Arc::new(AggregateExec::try_new(
                AggregateMode::Partial,
                Arc::new(agg.group_expr().clone()),
                agg.aggr_expr().to_vec(),
                agg.filter_expr().to_vec(),
                Arc::clone(agg.input()),
                agg.input_schema(),
            )?))
        }
        other => Err(DataFusionError::Internal(format!(
            "unexpected aggregate mode {other:?} for a streaming aggregation"
        ))),
    }
}

/// The aggregate functions of a streaming aggregation, and how their state columns (after the
/// group columns of the partial aggregate's output) are laid out.
pub(super) struct Aggregates {
    aggr: Vec<Arc<AggregateFunctionExpr>>,
    /// How many state columns each aggregate has.
    state_widths: Vec<usize>,
    /// One line per aggregate for the operator's fingerprint.
    fingerprint: Vec<String>,
}

impl Aggregates {
    /// The aggregates of `partial`, whose output has `num_state_columns` state columns.
    pub(super) fn new(partial: &AggregateExec, num_state_columns: usize) -> Result<Self> {
        let aggr = partial.aggr_expr().to_vec();
        let state_widths = aggr
            .iter()
            .map(|a| a.state_fields().map(|f| f.len()))
            .collect::<Result<Vec<_>>>()?;
        if state_widths.iter().sum::<usize>() != num_state_columns {
            return Err(DataFusionError::Internal(
                "the partial aggregate's state columns do not match its aggregates".into(),
            ));
        }
        let mut fingerprint = vec![];
        for (a, filter) in aggr.iter().zip(partial.filter_expr()) {
            let args: Vec<String> = a
                .expressions()
                .iter()
                .map(|e| without_positions(&e.to_string()))
                .collect();
            let mut line = format!(
                "{}({}{})",
                a.fun().name(),
                if a.is_distinct() { "DISTINCT " } else { "" },
                args.join(", ")
            );
            if let Some(f) = filter {
                line.push_str(&format!(
                    " FILTER (WHERE {})",
                    without_positions(&f.to_string())
                ));
            }
            fingerprint.push(line);
        }
        Ok(Self {
            aggr,
            state_widths,
            fingerprint,
        })
    }

    /// The fingerprint lines of the aggregate functions.
    pub(super) fn fingerprint(&self) -> &[String] {
        &self.fingerprint
    }

    /// Fresh accumulators, one per aggregate.
    pub(super) fn accumulators(&self) -> Result<Vec<Box<dyn GroupsAccumulator>>> {
        self.aggr
            .iter()
            .map(|a| {
                if a.groups_accumulator_supported() {
                    a.create_groups_accumulator()
                } else {
                    let a = Arc::clone(a);
                    Ok(Box::new(GroupsAccumulatorAdapter::new(move || {
                        a.create_accumulator()
                    })) as Box<dyn GroupsAccumulator>)
                }
            })
            .collect()
    }

    /// Merges state columns (every aggregate's, in order) into the accumulators.
    pub(super) fn merge(
        &self,
        accs: &mut [Box<dyn GroupsAccumulator>],
        state: &[ArrayRef],
        groups: &[usize],
        num_groups: usize,
    ) -> Result<()> {
        let mut offset = 0;
        for (acc, width) in accs.iter_mut().zip(&self.state_widths) {
            acc.merge_batch(&state[offset..offset + width], groups, num_groups)?;
            offset += width;
        }
        Ok(())
    }
}

/// A grouping key on a watermarked column: the column itself, or `window(column, ...)`.
#[derive(Debug, Clone, Copy)]
struct EventTimeKey {
    /// Its position among the group columns.
    index: usize,
    /// A window struct (whose `end` is the event time) rather than a timestamp.
    window: bool,
}

/// The group key among `group` that is a watermarked column or a window over one.
fn event_time_key(
    group: &[(Arc<dyn PhysicalExpr>, String)],
    watermarked: &[(String, i64)],
) -> Option<EventTimeKey> {
    let is_watermarked = |e: &Arc<dyn PhysicalExpr>| {
        e.downcast_ref::<Column>()
            .is_some_and(|c| watermarked.iter().any(|(w, _)| w == c.name()))
    };
    group.iter().enumerate().find_map(|(index, (e, _))| {
        // An expanded sliding window (see the planner's window module), over a watermarked
        // stream.
        if !watermarked.is_empty()
            && e.downcast_ref::<Column>()
                .is_some_and(|c| c.name() == weir_planner::window::SLIDING_WINDOW_COLUMN)
        {
            return Some(EventTimeKey {
                index,
                window: true,
            });
        }
        if is_watermarked(e) {
            return Some(EventTimeKey {
                index,
                window: false,
            });
        }
        let f = e.downcast_ref::<ScalarFunctionExpr>()?;
        (f.name() == "window" && f.args().first().is_some_and(is_watermarked)).then_some(
            EventTimeKey {
                index,
                window: true,
            },
        )
    })
}

/// The event time of each partial row: the key's window end or timestamp, microseconds.
fn event_times(key: EventTimeKey, batch: &RecordBatch) -> Result<Int64Array> {
    let column = batch.column(key.index);
    let (times, outer) = if key.window {
        let s = column
            .as_any()
            .downcast_ref::<StructArray>()
            .ok_or_else(|| DataFusionError::Internal("a window key is not a struct".into()))?;
        let end = s
            .column_by_name("end")
            .ok_or_else(|| DataFusionError::Internal("a window key has no end".into()))?;
        (Arc::clone(end), s.nulls().cloned())
    } else {
        (Arc::clone(column), None)
    };
    let micros = event_micros(times.as_ref())?;
    // A null window has no end, whatever its field holds.
    let nulls = NullBuffer::union(outer.as_ref(), micros.nulls());
    Ok(Int64Array::new(micros.values().clone(), nulls))
}

struct Inner {
    /// DataFusion's partial aggregate of the batch: group columns, then each aggregate's state.
    partial: Arc<dyn ExecutionPlan>,
    num_group: usize,
    aggregates: Aggregates,
    /// The grouping key that carries event time, if a watermark is on it: then the stored key
    /// starts with its end (microseconds), so eviction is a range scan.
    event_time: Option<EventTimeKey>,
    key_fields: Vec<SortField>,
    value_fields: Vec<SortField>,
    schema: SchemaRef,
    info: OperatorInfo,
    batch: Arc<BatchState>,
    /// The partial rows of every input partition, split by shuffle partition; filled by the
    /// first output partition that runs.
    shuffled: OnceCell<Vec<Vec<RecordBatch>>>,
}

/// The stateful final aggregate of a streaming aggregation; one output partition per shuffle
/// partition.
pub(crate) struct StatefulAggregateExec {
    inner: Arc<Inner>,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for StatefulAggregateExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatefulAggregateExec")
            .field("operator", &self.inner.info.operator_id)
            .finish()
    }
}

impl StatefulAggregateExec {
    /// Replaces DataFusion's aggregate `agg` (a `Final`, `FinalPartitioned`, `Single` or
    /// `SinglePartitioned` one) as stateful operator `id`.
    pub(crate) fn try_new(agg: &AggregateExec, id: u32, batch: Arc<BatchState>) -> Result<Self> {
        let partial = partial_of(agg)?;
        let Some(partial_agg) = partial.downcast_ref::<AggregateExec>() else {
            return Err(DataFusionError::Internal(
                "partial is not an aggregate".into(),
            ));
        };
        let num_group = partial_agg.group_expr().expr().len();
        let partial_schema = partial.schema();
        let event_time = event_time_key(
            partial_agg.group_expr().expr(),
            &watermark_columns(&partial),
        );
        let mut key_fields = partial_schema.fields()[..num_group].to_vec();
        if event_time.is_some() {
            key_fields.insert(0, Arc::new(Field::new(EVENT_TIME, DataType::Int64, true)));
        }
        let key_schema = Schema::new(key_fields);
        let value_schema = Schema::new(partial_schema.fields()[num_group..].to_vec());
        let aggregates = Aggregates::new(partial_agg, value_schema.fields().len())?;
        let sort_fields = |s: &Schema| -> Vec<SortField> {
            s.fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect()
        };
        let mut fingerprint: Vec<String> = partial_agg
            .group_expr()
            .expr()
            .iter()
            .map(|(e, _)| format!("group by {}", without_positions(&e.to_string())))
            .collect();
        fingerprint.extend(aggregates.fingerprint().iter().cloned());
        let partitions = batch.run()?.partitions;
        let info = OperatorInfo {
            operator_id: id,
            operator_name: "aggregate".into(),
            num_partitions: partitions,
            store_names: vec![STORE.into()],
            key_schema: key_schema.clone(),
            value_schema: value_schema.clone(),
            fingerprint,
            layout: None,
        };
        let schema = agg.schema();
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            inner: Arc::new(Inner {
                partial,
                num_group,
                aggregates,
                event_time,
                key_fields: sort_fields(&key_schema),
                value_fields: sort_fields(&value_schema),
                schema,
                info,
                batch,
                shuffled: OnceCell::new(),
            }),
            properties,
        })
    }

    /// The operator as the checkpoint records it.
    pub(crate) fn info(&self) -> &OperatorInfo {
        &self.inner.info
    }
}

impl Inner {
    /// The output rows of groups with keys `keys` and accumulator state `state`.
    fn evaluate(&self, keys: &[&[u8]], state: &[ArrayRef]) -> Result<RecordBatch> {
        let n = keys.len();
        let mut accs = self.aggregates.accumulators()?;
        let groups: Vec<usize> = (0..n).collect();
        self.aggregates.merge(&mut accs, state, &groups, n)?;
        let mut columns = if self.num_group == 0 {
            vec![]
        } else {
            let converter = RowConverter::new(self.key_fields.clone())?;
            let parser = converter.parser();
            let mut c = converter.convert_rows(keys.iter().map(|k| parser.parse(k)))?;
            if self.event_time.is_some() {
                c.remove(0);
            }
            c
        };
        for acc in &mut accs {
            columns.push(acc.evaluate(EmitTo::All)?);
        }
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }

    /// The output rows of stored `(key, value)` pairs.
    fn evaluate_stored(
        &self,
        values: &RowConverter,
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<RecordBatch> {
        if pairs.is_empty() {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
        let keys: Vec<&[u8]> = pairs.iter().map(|(k, _)| k.as_slice()).collect();
        let parser = values.parser();
        let state = values.convert_rows(pairs.iter().map(|(_, v)| parser.parse(v)))?;
        self.evaluate(&keys, &state)
    }

    /// Reads every input partition's partial rows and splits them by shuffle partition.
    async fn shuffle(&self, context: Arc<TaskContext>) -> Result<Vec<Vec<RecordBatch>>> {
        let group_fields = self.key_fields[usize::from(self.event_time.is_some())..].to_vec();
        let keys: Vec<usize> = (0..self.num_group).collect();
        super::shuffle(
            Arc::clone(&self.partial),
            context,
            &keys,
            group_fields,
            self.batch.run()?.partitions,
        )
        .await
    }

    /// Merges partition `partition`'s partial rows with its stored state, writes the new state,
    /// commits the store and returns the rows the output mode emits.
    fn merge_partition(&self, partition: usize, input: &[RecordBatch]) -> Result<RecordBatch> {
        let started = Instant::now();
        let run = self.batch.run()?;
        let watermark = self.batch.watermark;
        let mut dropped = 0u64;
        let mut store = run
            .open_store(self.info.operator_id, partition, STORE, self.batch.batch)
            .map_err(state_error)?;

        // Group indices: one per distinct encoded key, in first-seen order. Accumulators
        // expect every group below `total_num_groups` to appear in some merge (DataFusion's
        // null tracking counts on it), so each batch is merged with the number of groups seen
        // up to it, and stored state after all of them.
        let converter = RowConverter::new(self.key_fields.clone())?;
        let mut index: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut keys: Vec<Vec<u8>> = vec![];
        let mut accs = self.aggregates.accumulators()?;
        for batch in input {
            let (batch, key_columns) = match self.event_time {
                None => (batch.clone(), batch.columns()[..self.num_group].to_vec()),
                Some(et) => {
                    // Rows at or behind the previous batch's watermark are late: dropped
                    // before they reach state, and counted.
                    let late_us = watermark.late_ms.saturating_mul(1000);
                    let (kept, times, late) = drop_late(batch, &event_times(et, batch)?, late_us)?;
                    dropped += late;
                    let mut cols: Vec<ArrayRef> = vec![Arc::new(times)];
                    cols.extend(kept.columns()[..self.num_group].iter().cloned());
                    (kept, cols)
                }
            };
            let batch = &batch;
            let groups: Vec<usize> = if self.num_group == 0 {
                if keys.is_empty() {
                    keys.push(vec![]);
                }
                vec![0; batch.num_rows()]
            } else {
                let rows = converter.convert_columns(&key_columns)?;
                rows.iter()
                    .map(|r| match index.get(r.as_ref()) {
                        Some(&g) => g,
                        None => {
                            let g = keys.len();
                            keys.push(r.as_ref().to_vec());
                            index.insert(r.as_ref().to_vec(), g);
                            g
                        }
                    })
                    .collect()
            };
            self.aggregates.merge(
                &mut accs,
                &batch.columns()[self.num_group..],
                &groups,
                keys.len(),
            )?;
        }
        let n = keys.len();
        let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let values = RowConverter::new(self.value_fields.clone())?;
        let mut stored_keys = 0;
        if n > 0 {
            let stored = store.multi_get(&key_refs).map_err(state_error)?;
            let (found, bytes): (Vec<usize>, Vec<&[u8]>) = stored
                .iter()
                .enumerate()
                .filter_map(|(g, v)| v.as_deref().map(|v| (g, v)))
                .unzip();
            stored_keys = found.len();
            if !found.is_empty() {
                let parser = values.parser();
                let state = values.convert_rows(bytes.iter().map(|b| parser.parse(b)))?;
                self.aggregates.merge(&mut accs, &state, &found, n)?;
            }
        }
        let mut state = Vec::with_capacity(self.value_fields.len());
        for acc in &mut accs {
            state.extend(acc.state(EmitTo::All)?);
        }
        let mut writes = WriteBatch::new();
        if n > 0 {
            let rows = values.convert_columns(&state)?;
            for (key, row) in keys.iter().zip(rows.iter()) {
                writes.put(key.clone(), row.as_ref().to_vec());
            }
        }
        store
            .apply(writes.with_key_delta((n - stored_keys) as i64))
            .map_err(state_error)?;

        let mut output = match run.output_mode {
            OutputMode::Update => vec![self.evaluate(&key_refs, &state)?],
            OutputMode::Complete => {
                let all = store.scan(&KeyRange::all()).map_err(state_error)?;
                vec![self.evaluate_stored(&values, &all)?]
            }
            // Append emits a group once, when the watermark finalises it (below).
            OutputMode::Append => vec![],
        };
        let updates = started.elapsed();

        // Groups whose event time the watermark has passed are final: append mode emits them,
        // and (except in complete mode, which keeps everything) they leave state.
        let removing = Instant::now();
        let mut removed = 0u64;
        if self.event_time.is_some() && run.output_mode != OutputMode::Complete {
            let range = KeyRange {
                start: std::ops::Bound::Included(event_time_bound(i64::MIN)?),
                end: std::ops::Bound::Excluded(event_time_bound(
                    watermark.eviction_ms.saturating_mul(1000).saturating_add(1),
                )?),
            };
            let expired = store.scan(&range).map_err(state_error)?;
            if !expired.is_empty() {
                if run.output_mode == OutputMode::Append {
                    output.push(self.evaluate_stored(&values, &expired)?);
                }
                let mut deletes = WriteBatch::new();
                for (k, _) in &expired {
                    deletes.delete(k.clone());
                }
                removed = expired.len() as u64;
                store
                    .apply(deletes.with_key_delta(-(expired.len() as i64)))
                    .map_err(state_error)?;
            }
        }
        let removals = removing.elapsed();
        let output = arrow::compute::concat_batches(&self.schema, &output)?;

        let committing = Instant::now();
        store.commit().map_err(state_error)?;
        if partition == 0 {
            // Crash tests stop here: one partition's state is committed, the others' are not.
            weir_common::failpoint::pause_point("state_committed", self.batch.batch);
        }
        let metrics = store.metrics();
        self.batch.record(
            self.info.operator_id,
            StateOperatorProgress {
                operator_name: self.info.operator_name.clone(),
                num_rows_total: metrics.num_keys,
                num_rows_updated: n as u64,
                all_updates_time_ms: updates.as_millis() as u64,
                num_rows_removed: removed,
                all_removals_time_ms: removals.as_millis() as u64,
                num_rows_dropped_by_watermark: dropped,
                commit_time_ms: committing.elapsed().as_millis() as u64,
                memory_used_bytes: metrics.memory_used_bytes,
                num_shuffle_partitions: run.partitions as u64,
                num_state_store_instances: 1,
                custom_metrics: metrics.custom,
            },
        );
        Ok(output)
    }
}

impl DisplayAs for StatefulAggregateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "StatefulAggregateExec: operator={}, {}",
            self.inner.info.operator_id,
            self.inner.info.fingerprint.join(", ")
        )
    }
}

impl ExecutionPlan for StatefulAggregateExec {
    fn name(&self) -> &str {
        "StatefulAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.inner.partial]
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
        match children.as_slice() {
            [only] if Arc::ptr_eq(only, &self.inner.partial) => Ok(self),
            _ => Err(DataFusionError::Internal(
                "a streaming aggregation's input cannot be replaced once planned".into(),
            )),
        }
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
            let input = shuffled.get(partition).cloned().unwrap_or_default();
            let worker = Arc::clone(&inner);
            on_blocking_pool(move || worker.merge_partition(partition, &input)).await
        };
        Ok(one_batch_stream(Arc::clone(&self.inner.schema), run))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_leave_out_column_positions() {
        assert_eq!(without_positions("value@0 % 10"), "value % 10");
        assert_eq!(without_positions("a@12 + b@3"), "a + b");
        assert_eq!(without_positions("user@example"), "user@example");
    }
}
