//! Streaming aggregation (DESIGN.md §5): the batch's partial aggregate, shuffled by group key
//! into the checkpoint's partitions, merged per partition with the stored accumulator state,
//! written back, and emitted by output mode.
//!
//! ```text
//! AggregateExec(Partial)                 DataFusion's, per input partition: group keys + state
//!   └─ shuffle                           all partial rows, by key_partition(encoded key)
//! StatefulExec<StreamingAggregate>, partition p (see `operator.rs` for the shell):
//!   group    the batch's rows by encoded key (late rows dropped), merged into accumulators
//!   load     multi_get those keys from store (op, p, default), merged in too
//!   write    each group's new state, one batch of ValueChanges
//!   emit     by output mode: the changed groups, every group, or (append) the evicted ones
//!   evict    groups whose event time the watermark passed (a range scan)
//! ```
//!
//! Keys are the group columns encoded with arrow-row; values are the accumulators' state
//! columns (`state_fields`), encoded the same way.

use datafusion::common::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch, StructArray, UInt32Array};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_expr::GroupsAccumulatorAdapter;
use datafusion::physical_expr::ScalarFunctionExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::{ExecutionPlan, PhysicalExpr};
use weir_common::ClassifiedError;
use weir_sinks::OutputMode;
use weir_state::table::{ValueChanges, times_up_to};
use weir_state::{KeyRange, StateStore};

use super::kind::{OperatorKind, StateFormat, sort_fields};
use super::operator::{Processed, RowsInState, ShuffleKey, StatefulOperator, Step};
use super::watermark::{drop_late, event_micros};
use super::{BatchWatermark, OperatorInfo, state_error, watermark_columns};

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
pub(super) struct EventTimeKey {
    /// Its position among the group columns.
    pub(super) index: usize,
    /// A window struct (whose `end` is the event time) rather than a timestamp.
    pub(super) window: bool,
}

/// The group key among `group` that is a watermarked column or a window over one.
pub(super) fn event_time_key(
    group: &[(Arc<dyn PhysicalExpr>, String)],
    watermarked: &[(String, i64)],
    input: &Schema,
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
            // A window an aggregation below grouped by is event time too: its end.
            let window = matches!(e.data_type(input), Ok(DataType::Struct(_)));
            return Some(EventTimeKey { index, window });
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
    key_event_times(batch.column(key.index), key.window)
}

/// The event time of each value of an event-time key column (a window's end, or the
/// timestamp), microseconds; null where it has none.
pub(super) fn key_event_times(column: &ArrayRef, window: bool) -> Result<Int64Array> {
    let (times, outer) = if window {
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

/// A streaming aggregation: DataFusion's final aggregate, with its groups' accumulator state
/// kept across batches.
pub(crate) struct StreamingAggregate {
    /// DataFusion's partial aggregate of the batch: group columns, then each aggregate's state.
    partial: Arc<dyn ExecutionPlan>,
    num_group: usize,
    aggregates: Aggregates,
    /// The grouping key that carries event time, if a watermark is on it: then the stored key
    /// starts with its end (microseconds), so eviction is a range scan.
    event_time: Option<EventTimeKey>,
    key_fields: Vec<SortField>,
    value_fields: Vec<SortField>,
    /// DataFusion's aggregate's output.
    schema: SchemaRef,
    /// What the operator emits: `schema`, and with `changelog` the weight.
    output_schema: SchemaRef,
    /// Whether it emits a changelog for an aggregation above it (see `changelog.rs`): each
    /// changed group's old row (weight -1) and new row (+1), whatever the output mode.
    changelog: bool,
    info: OperatorInfo,
}

/// The stored state of some of a batch's groups, as it was before the batch.
struct Stored {
    /// Whether each group was stored.
    found: Vec<bool>,
    /// The stored ones, by group index.
    groups: Vec<usize>,
    /// Their state columns.
    state: Vec<ArrayRef>,
}

/// The batch's rows grouped by key and merged into one accumulator per group.
struct Groups {
    /// Encoded keys, one per group, in first-seen order.
    keys: Vec<Vec<u8>>,
    accs: Vec<Box<dyn GroupsAccumulator>>,
    /// Rows dropped as late.
    dropped: u64,
}

impl StreamingAggregate {
    /// Replaces DataFusion's aggregate `agg` (a `Final`, `FinalPartitioned`, `Single` or
    /// `SinglePartitioned` one) as stateful operator `id`, over `partitions` shuffle
    /// partitions.
    pub(crate) fn try_new(agg: &AggregateExec, id: u32, partitions: usize) -> Result<Self> {
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
            &partial_agg.input_schema(),
        );
        let mut key_fields = partial_schema.fields()[..num_group].to_vec();
        if event_time.is_some() {
            key_fields.insert(0, Arc::new(Field::new(EVENT_TIME, DataType::Int64, true)));
        }
        let key_schema = Schema::new(key_fields);
        let value_schema = Schema::new(partial_schema.fields()[num_group..].to_vec());
        let aggregates = Aggregates::new(partial_agg, value_schema.fields().len())?;
        let mut fingerprint: Vec<String> = partial_agg
            .group_expr()
            .expr()
            .iter()
            .map(|(e, _)| format!("group by {}", without_positions(&e.to_string())))
            .collect();
        fingerprint.extend(aggregates.fingerprint().iter().cloned());
        let info = OperatorInfo {
            operator_id: id,
            operator_name: OperatorKind::Aggregate.name().into(),
            num_partitions: partitions,
            store_names: vec![STORE.into()],
            key_schema: key_schema.clone(),
            value_schema: value_schema.clone(),
            fingerprint,
            layout: None,
        };
        Ok(Self {
            partial,
            num_group,
            aggregates,
            event_time,
            key_fields: sort_fields(&key_schema),
            value_fields: sort_fields(&value_schema),
            schema: agg.schema(),
            output_schema: agg.schema(),
            changelog: false,
            info,
        })
    }

    /// The operator emitting a changelog (each changed group's old row with weight -1 and
    /// new row with +1) for an aggregation above it to read.
    pub(crate) fn emitting_changelog(self) -> Self {
        Self {
            output_schema: super::changelog::with_weight(&self.schema),
            changelog: true,
            ..self
        }
    }

    /// The batch's changelog: for each group that was stored and whose row changed, the old
    /// row (weight -1); for each new or changed group, the new row (+1). A group whose row the
    /// batch left as it was emits nothing.
    fn changes(&self, keys: &[&[u8]], state: &[ArrayRef], stored: &Stored) -> Result<RecordBatch> {
        let new = self.evaluate(keys, state)?;
        let old_keys: Vec<&[u8]> = stored.groups.iter().map(|&g| keys[g]).collect();
        let old = self.evaluate(&old_keys, &stored.state)?;
        let mut inserted = vec![true; keys.len()];
        let mut retracted: Vec<u32> = vec![];
        let value_columns = self.schema.fields().len() - self.num_group;
        if value_columns == 0 {
            // A grouping without aggregates: a stored key's row is the key, unchanged.
            for &g in &stored.groups {
                inserted[g] = false;
            }
        } else if !stored.groups.is_empty() {
            let fields = self.schema.fields()[self.num_group..]
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect();
            let rows = RowConverter::new(fields)?;
            let now = rows.convert_columns(&new.columns()[self.num_group..])?;
            let before = rows.convert_columns(&old.columns()[self.num_group..])?;
            for (i, &g) in stored.groups.iter().enumerate() {
                if now.row(g) == before.row(i) {
                    inserted[g] = false;
                } else {
                    retracted.push(i as u32);
                }
            }
        }
        let inserted: Vec<u32> = (0..keys.len() as u32)
            .filter(|&g| inserted[g as usize])
            .collect();
        let weighted = |batch: &RecordBatch, rows: Vec<u32>, weight: i64| -> Result<RecordBatch> {
            let n = rows.len();
            let taken = arrow::compute::take_record_batch(batch, &UInt32Array::from(rows))?;
            let mut columns = taken.columns().to_vec();
            columns.push(Arc::new(Int64Array::from_value(weight, n)));
            Ok(RecordBatch::try_new(
                Arc::clone(&self.output_schema),
                columns,
            )?)
        };
        Ok(arrow::compute::concat_batches(
            &self.output_schema,
            &[weighted(&old, retracted, -1)?, weighted(&new, inserted, 1)?],
        )?)
    }

    /// The position of the group key that is event time (a watermarked column or a window),
    /// among the output columns: later operators treat that column as event time.
    pub(crate) fn event_time_column(&self) -> Option<usize> {
        self.event_time.map(|k| k.index)
    }

    /// The output rows of groups with keys `keys` and accumulator state `state`.
    fn evaluate(&self, keys: &[&[u8]], state: &[ArrayRef]) -> Result<RecordBatch> {
        let n = keys.len();
        if n == 0 {
            // A partition the batch sent no rows: an accumulator DataFusion adapts from a
            // row-at-a-time one has then made no state columns at all.
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
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

    /// Groups the batch's partial rows by encoded key and merges them into one accumulator per
    /// group; rows at or behind the previous batch's watermark are late: dropped before they
    /// reach state, and counted.
    ///
    /// Accumulators expect every group below `total_num_groups` to appear in some merge
    /// (DataFusion's null tracking counts on it), so each batch is merged with the number of
    /// groups seen up to it, and stored state after all of them.
    fn group(&self, input: &[RecordBatch], watermark: BatchWatermark) -> Result<Groups> {
        let converter = RowConverter::new(self.key_fields.clone())?;
        let mut index: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut keys: Vec<Vec<u8>> = vec![];
        let mut accs = self.aggregates.accumulators()?;
        let mut dropped = 0u64;
        for batch in input {
            let (batch, key_columns) = match self.event_time {
                None => (batch.clone(), batch.columns()[..self.num_group].to_vec()),
                Some(et) => {
                    let late_us = watermark.late_ms.saturating_mul(1000);
                    let (kept, times, late) = drop_late(batch, &event_times(et, batch)?, late_us)?;
                    dropped += late;
                    let mut cols: Vec<ArrayRef> = vec![Arc::new(times)];
                    cols.extend(kept.columns()[..self.num_group].iter().cloned());
                    (kept, cols)
                }
            };
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
        Ok(Groups {
            keys,
            accs,
            dropped,
        })
    }

    /// Merges the stored state of `groups`' keys into their accumulators; returns which of
    /// them were stored.
    fn load(
        &self,
        store: &dyn StateStore,
        values: &RowConverter,
        groups: &mut Groups,
    ) -> Result<Stored> {
        let n = groups.keys.len();
        if n == 0 {
            return Ok(Stored {
                found: vec![],
                groups: vec![],
                state: vec![],
            });
        }
        let key_refs: Vec<&[u8]> = groups.keys.iter().map(Vec::as_slice).collect();
        let stored = store.multi_get(&key_refs).map_err(state_error)?;
        let (found, bytes): (Vec<usize>, Vec<&[u8]>) = stored
            .iter()
            .enumerate()
            .filter_map(|(g, v)| v.as_deref().map(|v| (g, v)))
            .unzip();
        let mut state = vec![];
        if !found.is_empty() {
            let parser = values.parser();
            state = values.convert_rows(bytes.iter().map(|b| parser.parse(b)))?;
            self.aggregates.merge(&mut groups.accs, &state, &found, n)?;
        }
        Ok(Stored {
            found: stored.iter().map(Option::is_some).collect(),
            groups: found,
            state,
        })
    }

    /// Writes each group's new state (`state`, the accumulators' state columns; `stored`,
    /// whether the group was in state before).
    fn write(
        &self,
        store: &mut dyn StateStore,
        values: &RowConverter,
        keys: &[Vec<u8>],
        state: &[ArrayRef],
        stored: &[bool],
    ) -> Result<()> {
        let mut changes = ValueChanges::new();
        if state.is_empty() {
            // A grouping without aggregate functions (`GROUP BY k` alone, `SELECT DISTINCT`):
            // the key is the whole state. (Rows of no columns would count no rows.)
            for (key, existed) in keys.iter().zip(stored) {
                changes.put(key, b"", *existed);
            }
        } else if !keys.is_empty() {
            let rows = values.convert_columns(state)?;
            for ((key, row), existed) in keys.iter().zip(rows.iter()).zip(stored) {
                changes.put(key, row.as_ref(), *existed);
            }
        }
        changes.apply_to(store).map_err(state_error)
    }

    /// Removes the groups whose event time the eviction watermark has passed (they are final)
    /// and returns them.
    fn evict(
        &self,
        store: &mut dyn StateStore,
        watermark: BatchWatermark,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let range = times_up_to(None, watermark.eviction_ms.saturating_mul(1000));
        let expired = store.scan(&range).map_err(state_error)?;
        if !expired.is_empty() {
            let mut deletes = ValueChanges::new();
            for (k, _) in &expired {
                deletes.remove(k.clone());
            }
            deletes.apply_to(store).map_err(state_error)?;
        }
        Ok(expired)
    }
}

/// How a streaming aggregation keeps its state: store `default` maps a group key (arrow-row,
/// led by the event time when a watermark is on a key) to its accumulators' state columns
/// (arrow-row).
pub(crate) struct AggregateFormat;

impl StateFormat for AggregateFormat {
    fn readable(&self, _store: &str) -> bool {
        true
    }
}

impl StatefulOperator for StreamingAggregate {
    fn name(&self) -> &'static str {
        "StatefulAggregateExec"
    }

    fn info(&self) -> &OperatorInfo {
        &self.info
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.output_schema)
    }

    fn inputs(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.partial]
    }

    fn shuffle_key(&self, _input: usize) -> Result<ShuffleKey> {
        let keys: Vec<usize> = (0..self.num_group).collect();
        Ok(ShuffleKey::columns(&self.partial.schema(), &keys))
    }

    fn process(&self, step: Step<'_>) -> Result<Processed> {
        let started = Instant::now();
        let Step {
            input,
            stores,
            run,
            watermark,
            ..
        } = step;
        let [store] = stores else {
            return Err(DataFusionError::Internal(
                "a streaming aggregation has one store".into(),
            ));
        };
        let input = input.into_iter().next().unwrap_or_default();
        let values = RowConverter::new(self.value_fields.clone())?;
        let mut groups = self.group(&input, watermark)?;
        let stored = self.load(store.as_ref(), &values, &mut groups)?;
        let n = groups.keys.len();
        let mut state = Vec::with_capacity(self.value_fields.len());
        for acc in &mut groups.accs {
            state.extend(acc.state(EmitTo::All)?);
        }
        self.write(store.as_mut(), &values, &groups.keys, &state, &stored.found)?;

        let key_refs: Vec<&[u8]> = groups.keys.iter().map(Vec::as_slice).collect();
        // A changelog emits changes whatever the query's mode, and its groups leave state
        // (silently: their last row was emitted) once the watermark passes them.
        let mode = if self.changelog {
            OutputMode::Update
        } else {
            run.output_mode
        };
        let mut output = match mode {
            OutputMode::Update if self.changelog => {
                vec![self.changes(&key_refs, &state, &stored)?]
            }
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
        if self.event_time.is_some() && mode != OutputMode::Complete {
            let expired = self.evict(store.as_mut(), watermark)?;
            if mode == OutputMode::Append && !expired.is_empty() {
                output.push(self.evaluate_stored(&values, &expired)?);
            }
            removed = expired.len() as u64;
        }
        let removals = removing.elapsed();
        Ok(Processed {
            output: arrow::compute::concat_batches(&self.output_schema, &output)?,
            rows_updated: n as u64,
            rows_removed: removed,
            rows_dropped_by_watermark: groups.dropped,
            rows_in_state: RowsInState::KeysOf(0),
            updates,
            removals,
        })
    }

    fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "StatefulAggregateExec: operator={}, {}{}",
            self.info.operator_id,
            self.info.fingerprint.join(", "),
            if self.changelog {
                ", emits a changelog"
            } else {
                ""
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stateful::testing::lines;

    #[test]
    fn fingerprints_leave_out_column_positions() {
        assert_eq!(without_positions("value@0 % 10"), "value % 10");
        assert_eq!(without_positions("a@12 + b@3"), "a + b");
        assert_eq!(without_positions("user@example"), "user@example");
    }

    /// The streaming aggregation of `SELECT k, sum(v), count(*) ... GROUP BY k` over `rows`
    /// (k, v), and its partial rows: DataFusion plans it as for a table of these rows.
    async fn planned(sql: &str, rows: &[(&str, i64)]) -> (StreamingAggregate, Vec<RecordBatch>) {
        use arrow::array::StringArray;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap();
        let ctx = datafusion::prelude::SessionContext::new();
        let table = datafusion::datasource::MemTable::try_new(schema, vec![vec![batch]]).unwrap();
        ctx.register_table("t", Arc::new(table)).unwrap();
        let plan = ctx
            .sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        fn final_aggregate(plan: &Arc<dyn ExecutionPlan>) -> Option<&AggregateExec> {
            if let Some(a) = plan.downcast_ref::<AggregateExec>()
                && *a.mode() != AggregateMode::Partial
            {
                return Some(a);
            }
            plan.children().into_iter().find_map(final_aggregate)
        }
        let op = StreamingAggregate::try_new(final_aggregate(&plan).unwrap(), 0, 1).unwrap();
        let partial = datafusion::physical_plan::collect(Arc::clone(&op.partial), ctx.task_ctx())
            .await
            .unwrap();
        (op, partial)
    }

    /// Two batches through the operator on an in-memory store in `mode`: each batch's output.
    async fn two_batches(mode: OutputMode) -> Vec<(Vec<String>, u64)> {
        two_batches_of(
            "SELECT k, sum(v) AS s, count(*) AS n FROM t GROUP BY k",
            mode,
        )
        .await
    }

    async fn two_batches_of(sql: &str, mode: OutputMode) -> Vec<(Vec<String>, u64)> {
        two_batches_with(sql, mode, false).await
    }

    /// A changelog for an aggregation above: the first batch inserts every group; the second
    /// retracts a's old maximum and inserts its new one, inserts the new group c, and emits
    /// nothing for b, whose maximum its new row (1) left as it was. The query's output mode does
    /// not change what a changelog emits.
    #[tokio::test]
    async fn a_changelog_retracts_each_changed_row_and_skips_unchanged_ones() {
        for mode in [OutputMode::Update, OutputMode::Complete] {
            let out = two_batches_with("SELECT k, max(v) AS m FROM t GROUP BY k", mode, true).await;
            assert_eq!(
                out,
                [
                    (vec!["a,3,1".to_string(), "b,2,1".into()], 2),
                    (
                        vec!["a,10,1".to_string(), "a,3,-1".into(), "c,5,1".into()],
                        3
                    ),
                ],
                "{mode:?}"
            );
        }
    }

    async fn two_batches_with(
        sql: &str,
        mode: OutputMode,
        changelog: bool,
    ) -> Vec<(Vec<String>, u64)> {
        let state = super::super::StateRun::open(
            super::super::StateBackend::Memory,
            None,
            None,
            uuid::Uuid::nil(),
            super::super::Instances::Scratch(uuid::Uuid::nil()),
            1,
            mode,
        )
        .unwrap();
        let mut out = vec![];
        for (n, rows) in [
            vec![("a", 1), ("b", 2), ("a", 3)],
            vec![("a", 10), ("c", 5), ("b", 1)],
        ]
        .into_iter()
        .enumerate()
        {
            let (op, partial) = planned(sql, &rows).await;
            let op = if changelog {
                op.emitting_changelog()
            } else {
                op
            };
            let mut stores = vec![
                state
                    .open_store(0, 0, (STORE, weir_state::KeyShape::Opaque), n as u64)
                    .unwrap(),
            ];
            let processed = op
                .process(Step {
                    input: vec![partial],
                    stores: &mut stores,
                    run: &state,
                    batch: n as u64,
                    watermark: BatchWatermark::default(),
                })
                .unwrap();
            stores[0].commit().unwrap();
            assert_eq!(processed.rows_in_state, RowsInState::KeysOf(0));
            out.push((lines(&processed.output), processed.rows_updated));
        }
        out
    }

    #[tokio::test]
    async fn update_mode_emits_the_groups_a_batch_changed_merged_with_their_state() {
        assert_eq!(
            two_batches(OutputMode::Update).await,
            [
                (vec!["a,4,2".to_string(), "b,2,1".into()], 2),
                (
                    vec!["a,14,3".to_string(), "b,3,2".into(), "c,5,1".into()],
                    3
                ),
            ]
        );
    }

    #[tokio::test]
    async fn complete_mode_emits_every_group_in_state() {
        assert_eq!(
            two_batches(OutputMode::Complete).await[1],
            (
                vec!["a,14,3".to_string(), "b,3,2".into(), "c,5,1".into()],
                3
            )
        );
    }

    /// A grouping without aggregate functions keeps its keys as its state: the keys of both
    /// batches are in state, each once.
    #[tokio::test]
    async fn a_grouping_without_aggregates_keeps_its_keys() {
        let out = two_batches_of("SELECT k FROM t GROUP BY k", OutputMode::Complete).await;
        assert_eq!(out[0], (vec!["a".to_string(), "b".into()], 2));
        assert_eq!(out[1], (vec!["a".to_string(), "b".into(), "c".into()], 3));
    }
}
