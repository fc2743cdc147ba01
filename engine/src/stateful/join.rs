//! Stream-stream join (DESIGN.md §5): a symmetric hash join whose two sides keep their rows
//! in state.
//!
//! ```text
//! left input ──┐  both shuffled by key_partition(arrow-row join key), P partitions
//! right input ─┘
//! partition p: new left rows L, new right rows R (late rows dropped by the watermark)
//!   output  L ⋈ (stored right ∪ R)  ∪  stored left ⋈ R, then the rest of the condition
//!   store   L and R: "<side>" key = join key ++ (batch, row), value = matched flag, event
//!           time, the row; "<side>-time" = event time ++ that key, for eviction by range
//!   evict   left rows with time <= watermark - upper, right rows with time <= watermark +
//!           lower (no future row of the other side can match them); an outer join emits the
//!           evicted rows of its outer side that never matched, padded with nulls
//!   commit  the four stores at version N+1
//! ```
//!
//! `lower <= right time - left time <= upper` comes from the join condition (see the planner's
//! `join` module). Without it, or without watermarks, state is kept forever (as in Spark).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, BooleanArray, Int64Array, RecordBatch, new_null_array};
use arrow::compute::{concat_batches, filter_record_batch, interleave_record_batch};
use arrow::datatypes::{Field, Schema, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::JoinType;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PhysicalExpr, PlanProperties,
};
use tokio::sync::OnceCell;
use weir_planner::join::TimeBound;
use weir_state::{KeyRange, StateStore, StoreId, WriteBatch};

use super::watermark::event_micros;
use super::{BatchState, OperatorInfo, event_time_bound, state_error, watermark_columns};
use crate::progress::StateOperatorProgress;

/// Bytes of an arrow-row Int64 (null flag and 8 bytes): the time prefix of a `-time` key.
const TIME_PREFIX: usize = 9;

/// A join of two streams as planned, before a batch attaches it.
#[derive(Debug)]
pub(crate) struct StreamJoinExec {
    plan: Arc<Planned>,
    properties: Arc<PlanProperties>,
    attached: Option<Arc<Inner>>,
}

#[derive(Debug)]
pub(crate) struct Planned {
    pub(crate) left: Arc<dyn ExecutionPlan>,
    pub(crate) right: Arc<dyn ExecutionPlan>,
    pub(crate) left_keys: Vec<Arc<dyn PhysicalExpr>>,
    pub(crate) right_keys: Vec<Arc<dyn PhysicalExpr>>,
    /// The rest of the condition, over the output schema.
    pub(crate) filter: Option<Arc<dyn PhysicalExpr>>,
    pub(crate) join_type: JoinType,
    pub(crate) time_bound: Option<TimeBound>,
    pub(crate) schema: SchemaRef,
}

/// One side of the join.
#[derive(Debug)]
struct Side {
    name: &'static str,
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    /// The watermarked event-time column, if any.
    time: Option<usize>,
    /// Rows of this side older than `watermark + evict_after_us` can no longer match.
    evict_after_us: Option<i64>,
    /// Whether its unmatched rows are emitted (outer side).
    outer: bool,
}

#[derive(Debug)]
struct Inner {
    plan: Arc<Planned>,
    left: Side,
    right: Side,
    key_fields: Vec<SortField>,
    info: OperatorInfo,
    batch: Arc<BatchState>,
    shuffled: OnceCell<[Vec<Vec<RecordBatch>>; 2]>,
}

fn row_fields(schema: &Schema) -> Vec<SortField> {
    schema
        .fields()
        .iter()
        .map(|f| SortField::new(f.data_type().clone()))
        .collect()
}

fn key_columns(keys: &[Arc<dyn PhysicalExpr>], batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    keys.iter()
        .map(|k| k.evaluate(batch)?.into_array(batch.num_rows()))
        .collect()
}

impl StreamJoinExec {
    pub(crate) fn new(plan: Planned) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&plan.schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            plan: Arc::new(plan),
            properties,
            attached: None,
        }
    }

    /// The inputs, left then right.
    pub(crate) fn inputs(&self) -> [&Arc<dyn ExecutionPlan>; 2] {
        [&self.plan.left, &self.plan.right]
    }

    /// The join as stateful operator `id` of `batch`, over `left` and `right` (already
    /// attached).
    pub(crate) fn attach(
        &self,
        left: Arc<dyn ExecutionPlan>,
        right: Arc<dyn ExecutionPlan>,
        id: u32,
        batch: Arc<BatchState>,
    ) -> Result<Self> {
        let p = &self.plan;
        let partitions = batch.run()?.partitions;
        let time_of = |input: &Arc<dyn ExecutionPlan>, name: Option<&String>| {
            let name = name?;
            watermark_columns(input)
                .iter()
                .any(|(w, _)| w == name)
                .then(|| input.schema().index_of(name).ok())
                .flatten()
        };
        let bound = p.time_bound.as_ref();
        let left_time = time_of(&left, bound.map(|b| &b.left));
        let right_time = time_of(&right, bound.map(|b| &b.right));
        // A left row at time t matches right rows up to t + upper; a right row at t, left rows
        // up to t - lower.
        let left_evict = bound
            .and_then(|b| b.upper_us)
            .filter(|_| left_time.is_some())
            .map(|u| -u);
        let right_evict = bound
            .and_then(|b| b.lower_us)
            .filter(|_| right_time.is_some());
        let outer_left = matches!(p.join_type, JoinType::Left | JoinType::Full);
        let outer_right = matches!(p.join_type, JoinType::Right | JoinType::Full);
        if (outer_left && left_evict.is_none()) || (outer_right && right_evict.is_none()) {
            return Err(DataFusionError::External(Box::new(
                weir_common::ClassifiedError::new(
                    "UNSUPPORTED_STREAMING_OPERATION.STREAM_STREAM_JOIN",
                    "0A000",
                    format!(
                        "A {} outer join of two streams needs watermarks on both sides and a \
                         condition bounding the event times between them (e.g. rt BETWEEN lt - \
                         INTERVAL 1 SECOND AND lt + INTERVAL 1 SECOND): only then is a row known \
                         never to match, and can be emitted with nulls.",
                        p.join_type
                    ),
                ),
            )));
        }
        let key_types = p
            .left_keys
            .iter()
            .map(|k| k.data_type(&left.schema()))
            .collect::<Result<Vec<_>>>()?;
        let key_fields: Vec<SortField> = key_types.iter().cloned().map(SortField::new).collect();
        let key_schema = Schema::new(
            key_types
                .iter()
                .enumerate()
                .map(|(i, t)| Field::new(format!("key{i}"), t.clone(), true))
                .collect::<Vec<_>>(),
        );
        let value_schema = Schema::new(
            left.schema()
                .fields()
                .iter()
                .map(|f| Field::new(format!("left.{}", f.name()), f.data_type().clone(), true))
                .chain(right.schema().fields().iter().map(|f| {
                    Field::new(format!("right.{}", f.name()), f.data_type().clone(), true)
                }))
                .collect::<Vec<_>>(),
        );
        let strip = |e: &Arc<dyn PhysicalExpr>| super::aggregate::without_positions(&e.to_string());
        let mut fingerprint = vec![format!("join {}", p.join_type)];
        for (l, r) in p.left_keys.iter().zip(&p.right_keys) {
            fingerprint.push(format!("on {} = {}", strip(l), strip(r)));
        }
        if let Some(f) = &p.filter {
            fingerprint.push(format!("filter {}", strip(f)));
        }
        let info = OperatorInfo {
            operator_id: id,
            operator_name: "streamStreamJoin".into(),
            num_partitions: partitions,
            store_names: ["left", "left-time", "right", "right-time"]
                .map(String::from)
                .to_vec(),
            key_schema,
            value_schema,
            fingerprint,
        };
        let inner = Inner {
            plan: Arc::clone(&self.plan),
            left: Side {
                name: "left",
                input: Arc::clone(&left),
                keys: p.left_keys.clone(),
                time: left_time,
                evict_after_us: left_evict,
                outer: outer_left,
            },
            right: Side {
                name: "right",
                input: Arc::clone(&right),
                keys: p.right_keys.clone(),
                time: right_time,
                evict_after_us: right_evict,
                outer: outer_right,
            },
            key_fields,
            info,
            batch,
            shuffled: OnceCell::new(),
        };
        let plan = Planned {
            left,
            right,
            left_keys: p.left_keys.clone(),
            right_keys: p.right_keys.clone(),
            filter: p.filter.clone(),
            join_type: p.join_type,
            time_bound: p.time_bound.clone(),
            schema: Arc::clone(&p.schema),
        };
        Ok(Self {
            plan: Arc::new(plan),
            properties: Arc::new(PlanProperties::new(
                EquivalenceProperties::new(Arc::clone(&p.schema)),
                Partitioning::UnknownPartitioning(partitions),
                EmissionType::Final,
                Boundedness::Bounded,
            )),
            attached: Some(Arc::new(inner)),
        })
    }

    /// The operator as the checkpoint records it, once attached.
    pub(crate) fn info(&self) -> Option<&OperatorInfo> {
        self.attached.as_ref().map(|i| &i.info)
    }
}

/// Rows of one side in a batch, with what the join needs of them.
struct SideRows {
    batch: RecordBatch,
    /// Encoded join keys.
    keys: Rows,
    /// Event times (µs), when the side has an event-time column.
    times: Option<Int64Array>,
    dropped: u64,
}

/// A stored row: its main key and decoded parts.
struct Stored {
    key: Vec<u8>,
    matched: bool,
    time: i64,
    row: Vec<u8>,
}

fn decode_value(key: Vec<u8>, v: &[u8]) -> Option<Stored> {
    let (&flag, rest) = v.split_first()?;
    let (time, row) = rest.split_at_checked(8)?;
    Some(Stored {
        key,
        matched: flag == 1,
        time: i64::from_be_bytes(time.try_into().ok()?),
        row: row.to_vec(),
    })
}

fn encode_value(matched: bool, time: i64, row: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + row.len());
    v.push(u8::from(matched));
    v.extend(time.to_be_bytes());
    v.extend(row);
    v
}

/// Keys sharing `prefix` (an encoded join key; arrow-row keys are prefix-free).
fn prefix_range(prefix: &[u8]) -> KeyRange {
    let mut end = prefix.to_vec();
    end.push(0xff);
    end.extend([0xff; 16]);
    KeyRange {
        start: std::ops::Bound::Included(prefix.to_vec()),
        end: std::ops::Bound::Excluded(end),
    }
}

fn corrupt(store: &str) -> DataFusionError {
    DataFusionError::External(Box::new(weir_common::ClassifiedError::new(
        "STATE_STORE_FILE_CORRUPT",
        "XX001",
        format!("A value in the join's {store} state store is damaged."),
    )))
}

impl Inner {
    async fn shuffle(&self, context: Arc<TaskContext>) -> Result<[Vec<Vec<RecordBatch>>; 2]> {
        let partitions = self.batch.run()?.partitions;
        let mut out = [vec![vec![]; partitions], vec![vec![]; partitions]];
        for (s, side) in [&self.left, &self.right].into_iter().enumerate() {
            let converter = RowConverter::new(self.key_fields.clone())?;
            let collected = datafusion::physical_plan::collect_partitioned(
                Arc::clone(&side.input),
                Arc::clone(&context),
            )
            .await?;
            for batch in collected.into_iter().flatten() {
                if batch.num_rows() == 0 {
                    continue;
                }
                let rows = converter.convert_columns(&key_columns(&side.keys, &batch)?)?;
                let mut indices = vec![vec![]; partitions];
                for (i, r) in rows.iter().enumerate() {
                    indices[weir_state::key_partition(r.as_ref(), partitions)].push(i as u32);
                }
                for (p, ix) in indices.into_iter().enumerate() {
                    if !ix.is_empty() {
                        out[s][p].push(arrow::compute::take_record_batch(
                            &batch,
                            &arrow::array::UInt32Array::from(ix),
                        )?);
                    }
                }
            }
        }
        Ok(out)
    }

    fn side_rows(&self, side: &Side, input: &[RecordBatch], late_us: i64) -> Result<SideRows> {
        let schema = side.input.schema();
        let batch = concat_batches(&schema, input)?;
        let (batch, dropped) = match side.time {
            Some(t) => {
                let times = event_micros(batch.column(t).as_ref())?;
                let keep: BooleanArray = times
                    .iter()
                    .map(|t| Some(t.is_none_or(|t| t > late_us)))
                    .collect();
                let kept = filter_record_batch(&batch, &keep)?;
                let dropped = (batch.num_rows() - kept.num_rows()) as u64;
                (kept, dropped)
            }
            None => (batch, 0),
        };
        let times = match side.time {
            Some(t) => {
                let m = event_micros(batch.column(t).as_ref())?;
                Some(Int64Array::new(m.values().clone(), m.nulls().cloned()))
            }
            None => None,
        };
        let converter = RowConverter::new(self.key_fields.clone())?;
        let keys = converter.convert_columns(&key_columns(&side.keys, &batch)?)?;
        Ok(SideRows {
            batch,
            keys,
            times,
            dropped,
        })
    }

    /// Stored rows of `store` with each key of `keys`, by key.
    fn stored_by_key(
        store: &dyn StateStore,
        keys: &Rows,
        name: &str,
    ) -> Result<HashMap<Vec<u8>, Vec<Stored>>> {
        let mut out: HashMap<Vec<u8>, Vec<Stored>> = HashMap::new();
        for k in keys.iter() {
            if out.contains_key(k.as_ref()) {
                continue;
            }
            let rows = store
                .scan(&prefix_range(k.as_ref()))
                .map_err(state_error)?
                .into_iter()
                .map(|(key, v)| decode_value(key, &v).ok_or_else(|| corrupt(name)))
                .collect::<Result<Vec<_>>>()?;
            out.insert(k.as_ref().to_vec(), rows);
        }
        Ok(out)
    }

    fn join_partition(
        &self,
        partition: usize,
        left_in: &[RecordBatch],
        right_in: &[RecordBatch],
    ) -> Result<RecordBatch> {
        let started = Instant::now();
        let run = self.batch.run()?;
        let wm = self.batch.watermark;
        let late_us = wm.late_ms.saturating_mul(1000);
        let open = |name: &str| {
            run.provider
                .open(
                    &StoreId::new(self.info.operator_id, partition as u32, name),
                    self.batch.batch,
                )
                .map_err(state_error)
        };
        let (mut ls, mut lt, mut rs, mut rt) = (
            open("left")?,
            open("left-time")?,
            open("right")?,
            open("right-time")?,
        );
        let l = self.side_rows(&self.left, left_in, late_us)?;
        let r = self.side_rows(&self.right, right_in, late_us)?;
        let left_schema = self.left.input.schema();
        let right_schema = self.right.input.schema();
        let left_rows = RowConverter::new(row_fields(&left_schema))?;
        let right_rows = RowConverter::new(row_fields(&right_schema))?;

        // Stored rows of the other side for each new key (before this batch's rows go in).
        let stored_right = Self::stored_by_key(rs.as_ref(), &l.keys, "right")?;
        let stored_left = Self::stored_by_key(ls.as_ref(), &r.keys, "left")?;
        let flat_left: Vec<&Stored> = stored_left.values().flatten().collect();
        let flat_right: Vec<&Stored> = stored_right.values().flatten().collect();
        let decode =
            |conv: &RowConverter, rows: &[&Stored], schema: &SchemaRef| -> Result<RecordBatch> {
                if rows.is_empty() {
                    return Ok(RecordBatch::new_empty(Arc::clone(schema)));
                }
                let parser = conv.parser();
                let cols = conv.convert_rows(rows.iter().map(|s| parser.parse(&s.row)))?;
                Ok(RecordBatch::try_new(Arc::clone(schema), cols)?)
            };
        let old_left = decode(&left_rows, &flat_left, &left_schema)?;
        let old_right = decode(&right_rows, &flat_right, &right_schema)?;
        let index_of = |flat: &[&Stored]| -> HashMap<*const Stored, usize> {
            flat.iter()
                .enumerate()
                .map(|(i, s)| (*s as *const Stored, i))
                .collect()
        };
        let (li, ri) = (index_of(&flat_left), index_of(&flat_right));

        // Candidate pairs: (side source, row) for each side; source 0 new rows, 1 stored.
        let mut r_by_key: HashMap<&[u8], Vec<usize>> = HashMap::new();
        for (i, k) in r.keys.iter().enumerate() {
            r_by_key.entry(k.data()).or_default().push(i);
        }
        let mut pairs: Vec<((usize, usize), (usize, usize))> = vec![];
        for (i, k) in l.keys.iter().enumerate() {
            for s in stored_right.get(k.data()).into_iter().flatten() {
                pairs.push(((0, i), (1, ri[&(s as *const Stored)])));
            }
            for &j in r_by_key.get(k.data()).into_iter().flatten() {
                pairs.push(((0, i), (0, j)));
            }
        }
        for (j, k) in r.keys.iter().enumerate() {
            for s in stored_left.get(k.data()).into_iter().flatten() {
                pairs.push(((1, li[&(s as *const Stored)]), (0, j)));
            }
        }
        let left_part = interleave_record_batch(
            &[&l.batch, &old_left],
            &pairs.iter().map(|p| p.0).collect::<Vec<_>>(),
        )?;
        let right_part = interleave_record_batch(
            &[&r.batch, &old_right],
            &pairs.iter().map(|p| p.1).collect::<Vec<_>>(),
        )?;
        let schema = Arc::clone(&self.plan.schema);
        let mut columns = left_part.columns().to_vec();
        columns.extend(right_part.columns().iter().cloned());
        let joined = RecordBatch::try_new_with_options(
            Arc::clone(&schema),
            columns,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(pairs.len())),
        )?;
        let (joined, passed): (RecordBatch, Vec<bool>) = match &self.plan.filter {
            Some(f) if !pairs.is_empty() => {
                let mask = f.evaluate(&joined)?.into_array(joined.num_rows())?;
                let mask = mask
                    .as_any()
                    .downcast_ref::<BooleanArray>()
                    .ok_or_else(|| DataFusionError::Internal("join filter is not boolean".into()))?
                    .clone();
                let passed = (0..mask.len())
                    .map(|i| mask.is_valid(i) && mask.value(i))
                    .collect();
                (filter_record_batch(&joined, &mask)?, passed)
            }
            _ => (joined, vec![true; pairs.len()]),
        };
        let mut outputs = vec![joined];

        // Matches, for outer joins' flags.
        let mut new_left_matched = vec![false; l.batch.num_rows()];
        let mut new_right_matched = vec![false; r.batch.num_rows()];
        let mut old_left_matched = vec![false; flat_left.len()];
        let mut old_right_matched = vec![false; flat_right.len()];
        for (p, ok) in pairs.iter().zip(&passed) {
            if !ok {
                continue;
            }
            match p.0 {
                (0, i) => new_left_matched[i] = true,
                (_, i) => old_left_matched[i] = true,
            }
            match p.1 {
                (0, j) => new_right_matched[j] = true,
                (_, j) => old_right_matched[j] = true,
            }
        }

        // New rows into state; stored rows that matched for the first time get their flag.
        let suffix = |i: usize| {
            let mut s = self.batch.batch.to_be_bytes().to_vec();
            s.extend((i as u32).to_be_bytes());
            s
        };
        let mut updated = 0u64;
        for (side, rows, conv, matched, store, time_store) in [
            (
                &self.left,
                &l,
                &left_rows,
                &new_left_matched,
                &mut ls,
                &mut lt,
            ),
            (
                &self.right,
                &r,
                &right_rows,
                &new_right_matched,
                &mut rs,
                &mut rt,
            ),
        ] {
            let encoded = conv.convert_columns(rows.batch.columns())?;
            let mut writes = WriteBatch::new();
            let mut index = WriteBatch::new();
            for (i, k) in rows.keys.iter().enumerate() {
                let mut key = k.as_ref().to_vec();
                key.extend(suffix(i));
                let time = rows
                    .times
                    .as_ref()
                    .filter(|t| t.is_valid(i))
                    .map_or(i64::MIN, |t| t.value(i));
                if side.evict_after_us.is_some() {
                    let mut tk = event_time_bound(time)?;
                    tk.extend(&key);
                    index.put(tk, Vec::new());
                }
                writes.put(key, encode_value(matched[i], time, encoded.row(i).as_ref()));
                updated += 1;
            }
            store.apply(writes).map_err(state_error)?;
            time_store.apply(index).map_err(state_error)?;
        }
        for (flat, matched, store) in [
            (&flat_left, &old_left_matched, &mut ls),
            (&flat_right, &old_right_matched, &mut rs),
        ] {
            let mut writes = WriteBatch::new();
            for (s, m) in flat.iter().zip(matched) {
                if *m && !s.matched {
                    writes.put(s.key.clone(), encode_value(true, s.time, &s.row));
                }
            }
            store.apply(writes).map_err(state_error)?;
        }
        let updates = started.elapsed();

        // Evict rows no future row can match; outer sides emit their unmatched ones.
        let removing = Instant::now();
        let mut removed = 0u64;
        let wm_us = wm.eviction_ms.saturating_mul(1000);
        for (side, store, time_store, conv, schema) in [
            (&self.left, &mut ls, &mut lt, &left_rows, &left_schema),
            (&self.right, &mut rs, &mut rt, &right_rows, &right_schema),
        ] {
            let Some(after) = side.evict_after_us else {
                continue;
            };
            let limit = wm_us.saturating_add(after);
            let range = KeyRange {
                start: std::ops::Bound::Unbounded,
                end: std::ops::Bound::Excluded(event_time_bound(limit.saturating_add(1))?),
            };
            let expired = time_store.scan(&range).map_err(state_error)?;
            if expired.is_empty() {
                continue;
            }
            let keys: Vec<Vec<u8>> = expired
                .iter()
                .map(|(k, _)| k.get(TIME_PREFIX..).unwrap_or_default().to_vec())
                .collect();
            if side.outer {
                let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                let values = store.multi_get(&refs).map_err(state_error)?;
                let unmatched: Vec<Stored> = keys
                    .iter()
                    .zip(values)
                    .filter_map(|(k, v)| decode_value(k.clone(), &v?))
                    .filter(|s| !s.matched)
                    .collect();
                if !unmatched.is_empty() {
                    let rows: Vec<&Stored> = unmatched.iter().collect();
                    let side_batch = decode(conv, &rows, schema)?;
                    outputs.push(self.null_padded(side.name == "left", &side_batch)?);
                }
            }
            let mut deletes = WriteBatch::new();
            let mut index = WriteBatch::new();
            for ((tk, _), k) in expired.into_iter().zip(keys) {
                index.delete(tk);
                deletes.delete(k);
            }
            removed += deletes.ops().len() as u64;
            store.apply(deletes).map_err(state_error)?;
            time_store.apply(index).map_err(state_error)?;
        }
        let removals = removing.elapsed();

        let committing = Instant::now();
        for s in [&mut ls, &mut lt, &mut rs, &mut rt] {
            s.commit().map_err(state_error)?;
        }
        let (lm, rm) = (ls.metrics(), rs.metrics());
        let mut custom = lm.custom.clone();
        for (k, v) in rm.custom {
            *custom.entry(k).or_default() += v;
        }
        self.batch.record(
            self.info.operator_id,
            StateOperatorProgress {
                operator_name: self.info.operator_name.clone(),
                num_rows_total: lm.num_keys + rm.num_keys,
                num_rows_updated: updated,
                all_updates_time_ms: updates.as_millis() as u64,
                num_rows_removed: removed,
                all_removals_time_ms: removals.as_millis() as u64,
                commit_time_ms: committing.elapsed().as_millis() as u64,
                memory_used_bytes: lm.memory_used_bytes + rm.memory_used_bytes,
                num_rows_dropped_by_watermark: l.dropped + r.dropped,
                num_shuffle_partitions: run.partitions as u64,
                num_state_store_instances: 4,
                custom_metrics: custom,
            },
        );
        Ok(concat_batches(&schema, &outputs)?)
    }

    /// `rows` of one side with nulls for the other side's columns, in the output schema.
    fn null_padded(&self, left: bool, rows: &RecordBatch) -> Result<RecordBatch> {
        let schema = &self.plan.schema;
        let n = rows.num_rows();
        let nl = self.left.input.schema().fields().len();
        let columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| match (left, i < nl) {
                (true, true) => Arc::clone(rows.column(i)),
                (false, false) => Arc::clone(rows.column(i - nl)),
                _ => new_null_array(f.data_type(), n),
            })
            .collect();
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }
}

impl DisplayAs for StreamJoinExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamStreamJoinExec: {}", self.plan.join_type)
    }
}

impl ExecutionPlan for StreamJoinExec {
    fn name(&self) -> &str {
        "StreamStreamJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.plan.left, &self.plan.right]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if self.attached.is_some() || children.len() != 2 {
            return Err(DataFusionError::Internal(
                "a stream-stream join's inputs cannot be replaced once planned".into(),
            ));
        }
        let right = children.pop().unwrap_or_else(|| unreachable!());
        let left = children.pop().unwrap_or_else(|| unreachable!());
        let p = &self.plan;
        Ok(Arc::new(Self::new(Planned {
            left,
            right,
            left_keys: p.left_keys.clone(),
            right_keys: p.right_keys.clone(),
            filter: p.filter.clone(),
            join_type: p.join_type,
            time_bound: p.time_bound.clone(),
            schema: Arc::clone(&p.schema),
        })))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let Some(inner) = self.attached.clone() else {
            return Err(DataFusionError::Internal(
                "a stream-stream join ran outside a streaming batch".into(),
            ));
        };
        let schema = Arc::clone(&inner.plan.schema);
        let run = async move {
            let shuffled = inner
                .shuffled
                .get_or_try_init(|| inner.shuffle(context))
                .await?;
            let left = shuffled[0].get(partition).cloned().unwrap_or_default();
            let right = shuffled[1].get(partition).cloned().unwrap_or_default();
            let worker = Arc::clone(&inner);
            tokio::task::spawn_blocking(move || worker.join_partition(partition, &left, &right))
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(run),
        )))
    }
}
