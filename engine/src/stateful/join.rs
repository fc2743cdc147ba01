//! Stream-stream join (DESIGN.md §5): a symmetric hash join whose two sides keep their rows
//! in state.
//!
//! ```text
//! left input ──┐  both shuffled by key_partition(arrow-row join key), P partitions
//! right input ─┘
//! partition p: new left rows L, new right rows R (late rows dropped by the watermark)
//!   read    the stored rows the other side's new rows meet: a range scan per join key, or
//!           one scan of a side that holds few rows for so many keys
//!   output  L ⋈ (stored right ∪ R)  ∪  stored left ⋈ R, then the rest of the condition
//!   store   L and R: "<side>-rows" join key ++ batch and row number -> matched flag ++ row,
//!           one entry per row (storing a row costs the same however many its key has);
//!           "<side>-times" = event time ++ batch -> the (join key, row) of that batch's
//!           rows at that time: an index for eviction by range, one entry per distinct
//!           event time rather than per row; and the side's row count
//!   evict   left rows with time <= watermark - upper, right rows with time <= watermark +
//!           lower (no future row of the other side can match them); an outer join emits the
//!           evicted rows of its outer side that never matched, padded with nulls
//!   commit  the four stores at version N+1
//! ```
//!
//! `lower <= right time - left time <= upper` comes from the join condition (see the planner's
//! `join` module). Without it, or without watermarks, state is kept forever (as in Spark).

use datafusion::common::{HashMap, HashSet};
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
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PhysicalExpr, PlanProperties,
};
use weir_planner::join::TimeBound;
use weir_state::table::{TIME_PREFIX, ValueChanges, time_key_with, times_up_to};
use weir_state::{KeyRange, StateStore};

use super::kind::{OperatorKind, Placement, StateFormat, sort_fields};
use super::operator::{Processed, RowsInState, ShuffleKey, StatefulExec, StatefulOperator, Step};
use super::watermark::{drop_late, event_micros};
use super::{BatchState, OperatorInfo, StateRun, state_error, watermark_columns};

/// A join of two streams as planned, before a batch attaches it.
#[derive(Debug)]
pub(crate) struct StreamJoinExec {
    plan: Arc<Planned>,
    properties: Arc<PlanProperties>,
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

/// A stream-stream join in a batch: both sides' rows kept in state until no future row of the
/// other side can match them.
#[derive(Debug)]
pub(crate) struct StreamJoin {
    plan: Arc<Planned>,
    left: Side,
    right: Side,
    key_fields: Vec<SortField>,
    info: OperatorInfo,
}

/// Stored rows (arrow-row of `schema`'s columns) as a batch.
fn decode(conv: &RowConverter, rows: Vec<&[u8]>, schema: &SchemaRef) -> Result<RecordBatch> {
    if rows.is_empty() {
        return Ok(RecordBatch::new_empty(Arc::clone(schema)));
    }
    let parser = conv.parser();
    let cols = conv.convert_rows(rows.into_iter().map(|b| parser.parse(b)))?;
    Ok(RecordBatch::try_new(Arc::clone(schema), cols)?)
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
    ) -> Result<StatefulExec<StreamJoin>> {
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
            operator_name: OperatorKind::StreamStreamJoin.name().into(),
            num_partitions: partitions,
            store_names: ["left-rows", "left-times", "right-rows", "right-times"]
                .map(String::from)
                .to_vec(),
            key_schema,
            value_schema,
            fingerprint,
            layout: None,
        };
        let join = StreamJoin {
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
        };
        Ok(StatefulExec::new(join, batch))
    }
}

/// What matching a batch's new rows gave: the joined rows the condition passed, and which new
/// and stored rows (a stored row as its join key and position in the key's list) matched.
struct Matched<'a> {
    joined: RecordBatch,
    new_left_matched: Vec<bool>,
    new_right_matched: Vec<bool>,
    old_left: Vec<(&'a [u8], usize)>,
    old_left_matched: Vec<bool>,
    old_right: Vec<(&'a [u8], usize)>,
    old_right_matched: Vec<bool>,
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

impl SideRows {
    /// The encoded join key of each row.
    fn key_bytes(&self) -> Vec<&[u8]> {
        self.keys.iter().map(|k| k.data()).collect()
    }
}

/// A stored row's identity within its join key: the batch and row number that stored it.
const SUFFIX_LEN: usize = 12;

/// A side store's key of the row `suffix` of join key `key`, in its parts (a write lays them
/// end to end): `[join key][suffix]`.
fn row_key<'a>(key: &'a [u8], suffix: &'a [u8; SUFFIX_LEN]) -> [&'a [u8]; 2] {
    [key, suffix]
}

/// A stored row's value, in its parts: `[matched 1][row]`.
fn row_value(matched: bool, row: &[u8]) -> [&[u8]; 2] {
    [if matched { &[1] } else { &[0] }, row]
}

/// A stored row's value as (matched, row); `None` when damaged.
fn value_parts(value: &[u8]) -> Option<(bool, &[u8])> {
    let (&flag, row) = value.split_first()?;
    Some((flag == 1, row))
}

/// A stored row of a join key, as a batch read it.
struct Entry {
    suffix: [u8; SUFFIX_LEN],
    matched: bool,
    row: Vec<u8>,
}

impl Entry {
    /// The row stored under `row_key` with `value`; `None` when damaged.
    fn decode(row_key: &[u8], value: &[u8]) -> Option<Self> {
        let suffix = row_key
            .get(row_key.len().checked_sub(SUFFIX_LEN)?..)?
            .try_into()
            .ok()?;
        let (matched, row) = value_parts(value)?;
        Some(Self {
            suffix,
            matched,
            row: row.to_vec(),
        })
    }
}

/// A side store read whole rather than key by key when it holds at most this many rows per
/// join key asked for. Key by key, one iterator seeks each key in turn: a key with stored
/// rows costs about as much as reading a dozen rows, one without (most keys of a join whose
/// keys rarely repeat) a check of the store's prefix filters, about two rows' reading. Nexmark
/// q5 (4-5 stored rows per key asked for, none matching) ran ~20 % faster key by key than
/// whole at 8; q3, q8 and q20 the same either way.
const WHOLE_SCAN_ROWS_PER_KEY: usize = 2;

/// The stored rows of one side that a batch's new rows of the other side meet, by join key
/// (only keys that have rows). Rows are written and removed one entry each, so storing a row
/// costs the same whether its key has one row or a million.
#[derive(Default)]
struct SideState {
    rows: HashMap<Vec<u8>, Vec<Entry>>,
}

impl SideState {
    /// Reads the stored rows of `keys` from a side store holding `stored` rows: each distinct
    /// key's rows, or one scan of the whole store when it holds few rows for so many keys (a
    /// side that keeps few rows, such as an aggregate's output, met by every row of a busy
    /// side).
    fn load(store: &dyn StateStore, keys: &[&[u8]], stored: i64, name: &str) -> Result<Self> {
        let mut state = Self::default();
        let wanted: HashSet<&[u8]> = keys.iter().copied().collect();
        if wanted.is_empty() || stored <= 0 {
            return Ok(state);
        }
        let mut damaged = false;
        // Keeps an entry of `key`; false when it is damaged.
        let mut keep = |k: &[u8], v: &[u8], key: &[u8]| match Entry::decode(k, v) {
            Some(entry) => {
                state.rows.entry_ref(key).or_default().push(entry);
                true
            }
            None => false,
        };
        if stored as usize <= wanted.len().saturating_mul(WHOLE_SCAN_ROWS_PER_KEY) {
            // Only the wanted keys' entries are copied.
            store
                .scan_each(&KeyRange::all(), &mut |k, v| match stored::join_key(k) {
                    Some(key) if wanted.contains(key) => damaged |= !keep(k, v, key),
                    Some(_) => {}
                    None => damaged = true,
                })
                .map_err(state_error)?;
        } else {
            // One pass over the keys' rows (the store is prefixed by join key: a key with no
            // stored rows, most of a batch's, costs a filter check).
            let wanted: Vec<&[u8]> = wanted.into_iter().collect();
            store
                .scan_prefixes(&wanted, &mut |i, k, v| damaged |= !keep(k, v, wanted[i]))
                .map_err(state_error)?;
        }
        if damaged {
            return Err(corrupt(name));
        }
        Ok(state)
    }

    /// The stored rows of `key` (none when it has none).
    fn entries(&self, key: &[u8]) -> &[Entry] {
        self.rows.get(key).map_or(&[], Vec::as_slice)
    }
}

/// The stored rows of one side that a batch's new rows meet, flattened: `rows[i]` is (join key,
/// position among its stored rows).
#[derive(Default)]
struct StoredRefs<'a> {
    rows: Vec<(&'a [u8], usize)>,
    first: HashMap<&'a [u8], usize>,
}

impl<'a> StoredRefs<'a> {
    /// The flat indices of `key`'s stored rows (added on first use).
    fn of(&mut self, state: &SideState, key: &'a [u8]) -> std::ops::Range<usize> {
        let n = state.entries(key).len();
        let rows = &mut self.rows;
        let base = *self.first.entry(key).or_insert_with(|| {
            let b = rows.len();
            rows.extend((0..n).map(|p| (key, p)));
            b
        });
        base..base + n
    }
}

/// A stored row's identity: the batch and row number that stored it.
fn suffix(batch: u64, row: u32) -> [u8; SUFFIX_LEN] {
    let mut s = [0u8; SUFFIX_LEN];
    s[..8].copy_from_slice(&batch.to_be_bytes());
    s[8..].copy_from_slice(&row.to_be_bytes());
    s
}

/// The key of the index entry of `batch`'s rows at event time `time`.
fn index_key(time: i64, batch: u64) -> Result<Vec<u8>> {
    Ok(time_key_with(time, &batch.to_be_bytes()))
}

/// Adds row `row` with join key `key` to an index entry's value: `[key length 4][key][row 4]...`.
fn push_index_row(entry: &mut Vec<u8>, key: &[u8], row: u32) {
    entry.extend((key.len() as u32).to_be_bytes());
    entry.extend(key);
    entry.extend(row.to_be_bytes());
}

/// An index entry's rows: (join key, row number) each.
fn decode_index(v: &[u8]) -> Option<Vec<(&[u8], u32)>> {
    let mut rest = v;
    let mut out = vec![];
    while !rest.is_empty() {
        let (len, r) = rest.split_at_checked(4)?;
        let len = u32::from_be_bytes(len.try_into().ok()?) as usize;
        let (key, r) = r.split_at_checked(len)?;
        let (row, r) = r.split_at_checked(4)?;
        out.push((key, u32::from_be_bytes(row.try_into().ok()?)));
        rest = r;
    }
    Some(out)
}

/// What the checkpoint tools (`read_state`, `weir checkpoint repartition`) read of a join's
/// stores, whose values the join alone encodes.
pub(crate) mod stored {
    use std::collections::BTreeMap;

    /// A store's entries, by key.
    pub(crate) type Entries = BTreeMap<Vec<u8>, Vec<u8>>;

    /// Whether `store` is a side's event-time index (`"<side>-times"`) rather than its rows
    /// (`"<side>-rows"`).
    pub(crate) fn is_index(store: &str) -> bool {
        store.ends_with("-times")
    }

    /// The join key of a side store's entry; `None` when the key is damaged.
    pub(crate) fn join_key(entry_key: &[u8]) -> Option<&[u8]> {
        entry_key.get(..entry_key.len().checked_sub(super::SUFFIX_LEN)?)
    }

    /// A side store's entry as (join key, the side's columns as an arrow row); `None` when
    /// damaged.
    pub(crate) fn side_row(entry_key: &[u8], value: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
        let (_, row) = super::value_parts(value)?;
        Some(vec![(join_key(entry_key)?.to_vec(), row.to_vec())])
    }

    /// Splits a side's event-time index, read from every old partition, among new ones: each
    /// entry's rows go where `partition_of` sends their join keys (entries of old partitions
    /// under the same time and batch merge), and each new partition gets its own row count.
    /// `None` when an entry is damaged.
    pub(crate) fn split_index<E>(
        entries: &[(Vec<u8>, Vec<u8>)],
        partitions: usize,
        partition_of: impl FnOnce(&[&[u8]]) -> Result<Vec<usize>, E>,
    ) -> Result<Option<Vec<Entries>>, E> {
        let mut rows = vec![];
        for (k, v) in entries
            .iter()
            .filter(|(k, _)| k.as_slice() != super::COUNT_KEY)
        {
            let Some(decoded) = super::decode_index(v) else {
                return Ok(None);
            };
            rows.extend(decoded.into_iter().map(|(key, row)| (k, key, row)));
        }
        let keys: Vec<&[u8]> = rows.iter().map(|(_, key, _)| *key).collect();
        let targets = partition_of(&keys)?;
        if targets.len() != rows.len() {
            return Ok(None);
        }
        let mut out = vec![BTreeMap::new(); partitions];
        let mut counts = vec![0i64; partitions];
        for ((index_key, key, row), q) in rows.into_iter().zip(targets) {
            let Some(entries) = out.get_mut(q) else {
                return Ok(None);
            };
            let value: &mut Vec<u8> = entries.entry(index_key.clone()).or_default();
            super::push_index_row(value, key, row);
            counts[q] += 1;
        }
        for (entries, rows) in out.iter_mut().zip(counts) {
            entries.insert(super::COUNT_KEY.to_vec(), rows.to_be_bytes().to_vec());
        }
        Ok(Some(out))
    }
}

/// The index store's key of the side's row count. Arrow-row marks a non-null value with a
/// leading 1, so this sorts before every event-time key and no eviction scan reaches it.
const COUNT_KEY: &[u8] = &[0];

/// One side's rows in state, kept in its index store under [`COUNT_KEY`].
struct RowCount {
    rows: i64,
    stored: bool,
}

impl RowCount {
    fn read(store: &dyn StateStore, name: &str) -> Result<Self> {
        let stored = store
            .multi_get(&[COUNT_KEY])
            .map_err(state_error)?
            .pop()
            .flatten();
        Ok(match stored {
            Some(v) => Self {
                rows: i64::from_be_bytes(v.as_slice().try_into().map_err(|_| corrupt(name))?),
                stored: true,
            },
            None => Self {
                rows: 0,
                stored: false,
            },
        })
    }

    fn changes(&self) -> ValueChanges {
        let mut changes = ValueChanges::new();
        changes.put(COUNT_KEY, self.rows.to_be_bytes(), self.stored);
        changes
    }
}

fn corrupt(store: &str) -> DataFusionError {
    DataFusionError::External(Box::new(weir_common::ClassifiedError::new(
        "STATE_STORE_FILE_CORRUPT",
        "XX001",
        format!("A value in the join's {store} state store is damaged."),
    )))
}

impl StreamJoin {
    fn side_rows(&self, side: &Side, input: &[RecordBatch], late_us: i64) -> Result<SideRows> {
        let schema = side.input.schema();
        let batch = concat_batches(&schema, input)?;
        let (batch, times, dropped) = match side.time {
            Some(t) => {
                let times = event_micros(batch.column(t).as_ref())?;
                let (kept, times, dropped) = drop_late(&batch, &times, late_us)?;
                (kept, Some(times), dropped)
            }
            None => (batch, None, 0),
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

    /// Joins a partition's new rows of both sides with each other and with the stored rows,
    /// stores the new rows, and evicts (an outer side emitting) the rows no future row can
    /// match.
    fn join(&self, step: Step<'_>) -> Result<Processed> {
        let started = Instant::now();
        let Step {
            input,
            stores,
            run,
            batch,
            watermark: wm,
        } = step;
        let [ls, lt, rs, rt] = stores else {
            return Err(DataFusionError::Internal(
                "a stream-stream join has four stores".into(),
            ));
        };
        let late_us = wm.late_ms.saturating_mul(1000);
        let mut input = input.into_iter();
        let left_in = input.next().unwrap_or_default();
        let right_in = input.next().unwrap_or_default();
        let l = self.side_rows(&self.left, &left_in, late_us)?;
        let r = self.side_rows(&self.right, &right_in, late_us)?;
        let left_schema = self.left.input.schema();
        let right_schema = self.right.input.schema();
        let left_rows = RowConverter::new(sort_fields(&left_schema))?;
        let right_rows = RowConverter::new(sort_fields(&right_schema))?;

        // Each side's stored rows that the other side's new rows meet.
        let mut left_count = RowCount::read(lt.as_ref(), "left-times")?;
        let mut right_count = RowCount::read(rt.as_ref(), "right-times")?;
        let left_state = SideState::load(ls.as_ref(), &r.key_bytes(), left_count.rows, "left")?;
        let right_state = SideState::load(rs.as_ref(), &l.key_bytes(), right_count.rows, "right")?;

        let Matched {
            joined,
            new_left_matched,
            new_right_matched,
            old_left,
            old_left_matched,
            old_right,
            old_right_matched,
        } = self.match_rows(&l, &r, &left_state, &right_state, &left_rows, &right_rows)?;
        let schema = Arc::clone(&self.plan.schema);
        let mut outputs = vec![joined];

        // Stored rows of an outer side that matched for the first time: their flag is
        // rewritten (an inner side's flags are never read).
        for (side, state, store, old, matched) in [
            (
                &self.left,
                &left_state,
                &mut *ls,
                &old_left,
                &old_left_matched,
            ),
            (
                &self.right,
                &right_state,
                &mut *rs,
                &old_right,
                &old_right_matched,
            ),
        ] {
            if !side.outer {
                continue;
            }
            let mut flags = ValueChanges::new();
            for ((k, p), _) in old.iter().zip(matched).filter(|(_, m)| **m) {
                let e = &state.entries(k)[*p];
                if !e.matched {
                    flags.put_parts(&row_key(k, &e.suffix), &row_value(true, &e.row), true);
                }
            }
            flags.apply_to(&mut **store).map_err(state_error)?;
        }

        // New rows under their join key and into the event-time index. A row without an
        // event time never meets the time range: where the side evicts, it is not kept (an
        // outer side emits it now if it matched nothing).
        let mut updated = 0u64;
        for (side, rows, conv, matched, store, time_store, counts) in [
            (
                &self.left,
                &l,
                &left_rows,
                &new_left_matched,
                &mut *ls,
                &mut *lt,
                &mut left_count,
            ),
            (
                &self.right,
                &r,
                &right_rows,
                &new_right_matched,
                &mut *rs,
                &mut *rt,
                &mut right_count,
            ),
        ] {
            let (stored, timeless) = self.store_new_rows(
                side,
                rows,
                conv,
                matched,
                (&mut **store, &mut **time_store),
                counts,
                batch,
            )?;
            updated += stored;
            outputs.extend(timeless);
        }
        let updates = started.elapsed();

        // Evict rows no future row can match (through the event-time index); outer sides emit
        // the evicted rows that never matched.
        let removing = Instant::now();
        let mut removed = 0u64;
        let wm_us = wm.eviction_ms.saturating_mul(1000);
        for (side, store, time_store, conv, schema, counts) in [
            (
                &self.left,
                &mut *ls,
                &mut *lt,
                &left_rows,
                &left_schema,
                &mut left_count,
            ),
            (
                &self.right,
                &mut *rs,
                &mut *rt,
                &right_rows,
                &right_schema,
                &mut right_count,
            ),
        ] {
            let (gone, unmatched) = self.evict_side(
                side,
                (&mut **store, &mut **time_store),
                conv,
                schema,
                counts,
                run,
                wm_us,
            )?;
            removed += gone;
            outputs.extend(unmatched);
        }
        for (time_store, counts) in [(&mut *lt, &left_count), (&mut *rt, &right_count)] {
            counts
                .changes()
                .apply_to(&mut **time_store)
                .map_err(state_error)?;
        }
        let removals = removing.elapsed();

        Ok(Processed {
            output: concat_batches(&schema, &outputs)?,
            rows_updated: updated,
            rows_removed: removed,
            rows_dropped_by_watermark: l.dropped + r.dropped,
            // Rows in state, as the index stores count them.
            rows_in_state: RowsInState::Counted((left_count.rows + right_count.rows).max(0) as u64),
            updates,
            removals,
        })
    }

    /// Matches the batch's new rows of each side with the other side's new and stored rows
    /// (`left_state`, `right_state`: the stored rows of the batch's keys), keeps the pairs the
    /// rest of the condition passes, and says which rows matched.
    fn match_rows<'a>(
        &self,
        l: &'a SideRows,
        r: &'a SideRows,
        left_state: &SideState,
        right_state: &SideState,
        left_rows: &RowConverter,
        right_rows: &RowConverter,
    ) -> Result<Matched<'a>> {
        let left_schema = self.left.input.schema();
        let right_schema = self.right.input.schema();
        // Stored rows the new rows meet, each decoded once: (key, position in its list).
        let (mut old_left, mut old_right) = (StoredRefs::default(), StoredRefs::default());
        // The new right rows of each key, chained: `r_first[key]` is the first, `r_next[j]`
        // the one after `j` (no list allocated per key).
        let mut r_first: HashMap<&[u8], usize> = HashMap::with_capacity(r.keys.num_rows());
        let mut r_next = vec![usize::MAX; r.keys.num_rows()];
        for j in (0..r.keys.num_rows()).rev() {
            if let Some(next) = r_first.insert(r.keys.row(j).data(), j) {
                r_next[j] = next;
            }
        }
        let mut pairs: Vec<((usize, usize), (usize, usize))> = vec![];
        for (i, k) in l.keys.iter().enumerate() {
            let k = k.data();
            pairs.extend(old_right.of(right_state, k).map(|p| ((0, i), (1, p))));
            let mut j = r_first.get(k).copied().unwrap_or(usize::MAX);
            while j != usize::MAX {
                pairs.push(((0, i), (0, j)));
                j = r_next[j];
            }
        }
        for (j, k) in r.keys.iter().enumerate() {
            pairs.extend(old_left.of(left_state, k.data()).map(|p| ((1, p), (0, j))));
        }
        let (old_left, old_right) = (old_left.rows, old_right.rows);
        let stored_left = decode(
            left_rows,
            old_left
                .iter()
                .map(|(k, p)| left_state.entries(k)[*p].row.as_slice())
                .collect(),
            &left_schema,
        )?;
        let stored_right = decode(
            right_rows,
            old_right
                .iter()
                .map(|(k, p)| right_state.entries(k)[*p].row.as_slice())
                .collect(),
            &right_schema,
        )?;
        let left_part = interleave_record_batch(
            &[&l.batch, &stored_left],
            &pairs.iter().map(|p| p.0).collect::<Vec<_>>(),
        )?;
        let right_part = interleave_record_batch(
            &[&r.batch, &stored_right],
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

        // Which rows matched, for outer joins' flags.
        let mut new_left_matched = vec![false; l.batch.num_rows()];
        let mut new_right_matched = vec![false; r.batch.num_rows()];
        let mut old_left_matched = vec![false; old_left.len()];
        let mut old_right_matched = vec![false; old_right.len()];
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
        Ok(Matched {
            joined,
            new_left_matched,
            new_right_matched,
            old_left,
            old_left_matched,
            old_right,
            old_right_matched,
        })
    }

    /// Stores a side's new rows under their join keys and adds them to the side's event-time
    /// index (one entry per distinct time). A row without an event time never meets the time
    /// range: where the side evicts, it is not kept, and an outer side emits it now if it
    /// matched nothing (returned, null-padded). Returns how many rows it stored.
    #[expect(
        clippy::too_many_arguments,
        reason = "one side's rows, flags, stores and count, as the step holds them"
    )]
    fn store_new_rows(
        &self,
        side: &Side,
        rows: &SideRows,
        conv: &RowConverter,
        matched: &[bool],
        (store, time_store): (&mut dyn StateStore, &mut dyn StateStore),
        counts: &mut RowCount,
        batch: u64,
    ) -> Result<(u64, Option<RecordBatch>)> {
        let mut updated = 0u64;
        let encoded = conv.convert_columns(rows.batch.columns())?;
        // The index groups the batch's rows by event time: one entry per distinct time.
        let mut by_time: HashMap<i64, Vec<u8>> = HashMap::new();
        let mut timeless = vec![];
        // Sized up front: a batch's rows are most of its writes, and a buffer grown by
        // doubling holds up to twice their bytes at the batch's peak.
        let bytes = (0..rows.keys.num_rows())
            .map(|i| {
                rows.keys.row(i).as_ref().len() + SUFFIX_LEN + 1 + encoded.row(i).as_ref().len()
            })
            .sum();
        let mut new_rows = ValueChanges::with_capacity(rows.keys.num_rows(), bytes);
        for (i, k) in rows.keys.iter().enumerate() {
            let untimed = rows.times.as_ref().is_some_and(|t| t.is_null(i));
            if untimed && side.evict_after_us.is_some() {
                if side.outer && !matched[i] {
                    timeless.push(i as u32);
                }
                continue;
            }
            let time = rows
                .times
                .as_ref()
                .filter(|t| t.is_valid(i))
                .map_or(i64::MIN, |t| t.value(i));
            push_index_row(by_time.entry(time).or_default(), k.data(), i as u32);
            new_rows.put_parts(
                &row_key(k.data(), &suffix(batch, i as u32)),
                &row_value(matched[i], encoded.row(i).as_ref()),
                false,
            );
            updated += 1;
            counts.rows += 1;
        }
        drop(encoded);
        new_rows.apply_to(store).map_err(state_error)?;
        // This batch's index keys are new (the batch ID is in them).
        let mut index = ValueChanges::new();
        for (time, rows) in by_time {
            index.put(index_key(time, batch)?, rows, false);
        }
        index.apply_to(time_store).map_err(state_error)?;
        if timeless.is_empty() {
            return Ok((updated, None));
        }
        let rows = arrow::compute::take_record_batch(
            &rows.batch,
            &arrow::array::UInt32Array::from(timeless),
        )?;
        Ok((updated, Some(self.null_padded(side.name == "left", &rows)?)))
    }

    /// Evicts a side's rows no future row of the other side can match, found through its
    /// event-time index from where this run's last eviction stopped; an outer side emits the
    /// evicted rows that never matched (returned, null-padded). Returns how many it removed.
    #[expect(
        clippy::too_many_arguments,
        reason = "one side's stores, decoding and count, as the step holds them"
    )]
    fn evict_side(
        &self,
        side: &Side,
        (store, time_store): (&mut dyn StateStore, &mut dyn StateStore),
        conv: &RowConverter,
        schema: &SchemaRef,
        counts: &mut RowCount,
        run: &StateRun,
        wm_us: i64,
    ) -> Result<(u64, Option<RecordBatch>)> {
        let Some(after) = side.evict_after_us else {
            return Ok((0, None));
        };
        let limit = wm_us.saturating_add(after);
        // Everything at or below the last limit is gone (new rows are later than the last
        // watermark, which is at least that limit when the time range contains 0), so the
        // scan starts there; a run's first scan starts at the first event time (past the
        // row count).
        let floor = run
            .eviction_floor(time_store.id(), limit)
            .filter(|_| after <= 0);
        let expired = time_store
            .scan(&times_up_to(floor, limit))
            .map_err(state_error)?;
        if expired.is_empty() {
            return Ok((0, None));
        }
        let mut entries = Vec::with_capacity(expired.len());
        for (tk, rows) in &expired {
            let batch = tk
                .get(TIME_PREFIX..)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| corrupt(side.name))?;
            entries.push((batch, decode_index(rows).ok_or_else(|| corrupt(side.name))?));
        }
        let rows = entries.iter().map(|(_, rows)| rows.len()).sum();
        let bytes = entries
            .iter()
            .flat_map(|(_, rows)| rows)
            .map(|(key, _)| key.len() + SUFFIX_LEN)
            .sum();
        let mut removals = ValueChanges::with_capacity(rows, bytes);
        for (batch, rows) in entries {
            for (key, row) in rows {
                removals.remove_parts(&row_key(key, &suffix(batch, row)));
            }
        }
        let removed = removals.len() as u64;
        counts.rows -= removed as i64;
        // An outer side reads the rows it evicts (as this batch left them: new rows and
        // flags included) for those that never matched.
        let unmatched = if side.outer {
            let keys: Vec<&[u8]> = removals.keys().collect();
            let values = store.multi_get(&keys).map_err(state_error)?;
            let mut unmatched: Vec<&[u8]> = vec![];
            for v in &values {
                match v.as_deref().and_then(value_parts) {
                    Some((false, row)) => unmatched.push(row),
                    Some((true, _)) => {}
                    None => return Err(corrupt(side.name)),
                }
            }
            if unmatched.is_empty() {
                None
            } else {
                let rows = unmatched;
                let batch = decode(conv, rows, schema)?;
                Some(self.null_padded(side.name == "left", &batch)?)
            }
        } else {
            None
        };
        removals.apply_to(store).map_err(state_error)?;
        let mut index = ValueChanges::new();
        for (tk, _) in expired {
            index.remove(tk);
        }
        index.apply_to(time_store).map_err(state_error)?;
        Ok((removed, unmatched))
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

/// How a stream-stream join keeps its state (see the module's notes): `read_state` shows a side
/// store's rows, one each, with that side's columns; repartitioning splits the event-time
/// indexes' entries, which list rows of many join keys.
pub(crate) struct JoinFormat;

impl StateFormat for JoinFormat {
    fn readable(&self, store: &str) -> bool {
        matches!(store, "left-rows" | "right-rows")
    }

    /// A side's rows are read by join key: `[join key][batch, row]`.
    fn key_shape(&self, store: &str) -> weir_state::KeyShape {
        if self.readable(store) {
            weir_state::KeyShape::Prefixed { suffix: SUFFIX_LEN }
        } else {
            weir_state::KeyShape::Opaque
        }
    }

    fn read_fields(&self, op: &OperatorInfo, store: &str) -> arrow::datatypes::Fields {
        let side = store.strip_suffix("-rows").unwrap_or(store);
        let prefix = format!("{side}.");
        op.value_schema
            .fields()
            .iter()
            .filter_map(|f| {
                let name = f.name().strip_prefix(&prefix)?;
                Some(Field::new(name, f.data_type().clone(), true))
            })
            .collect()
    }

    fn read_entries(&self, key: &[u8], value: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
        stored::side_row(key, value)
    }

    fn placement(&self, store: &str) -> Placement {
        if stored::is_index(store) {
            Placement::JoinIndex
        } else {
            Placement::JoinRows
        }
    }
}

impl StatefulOperator for StreamJoin {
    fn name(&self) -> &'static str {
        "StreamStreamJoinExec"
    }

    fn info(&self) -> &OperatorInfo {
        &self.info
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.plan.schema)
    }

    fn inputs(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.left.input, &self.right.input]
    }

    fn shuffle_key(&self, input: usize) -> Result<ShuffleKey> {
        let side = if input == 0 { &self.left } else { &self.right };
        Ok(ShuffleKey {
            exprs: side.keys.clone(),
            fields: self.key_fields.clone(),
            broadcast: None,
        })
    }

    fn process(&self, step: Step<'_>) -> Result<Processed> {
        self.join(step)
    }

    fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamStreamJoinExec: {}", self.plan.join_type)
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
        if children.len() != 2 {
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
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Err(DataFusionError::Internal(
            "a stream-stream join ran outside a streaming batch".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stateful::testing::{Harness, event_schema, events, watermark};
    use weir_sinks::OutputMode;

    /// The join of two event streams on `k`, within a second of each other, watermarks 2 s
    /// behind each side; `kind` is `JOIN` or `LEFT JOIN`.
    async fn harness(kind: &str) -> Harness {
        let sql = format!(
            "SELECT a.k, a.v AS lv, b.v AS rv \
             FROM STREAM lefts WATERMARK t DELAY OF INTERVAL 2 SECONDS AS a \
             {kind} STREAM rights WATERMARK t DELAY OF INTERVAL 2 SECONDS AS b \
             ON a.k = b.k AND b.t BETWEEN a.t - INTERVAL 1 SECOND AND a.t + INTERVAL 1 SECOND"
        );
        Harness::new(
            &sql,
            &[("lefts", event_schema()), ("rights", event_schema())],
            OutputMode::Append,
        )
        .await
    }

    /// Batch 0 of every test: a@1 s and b@1 s on the left, a@1 s on the right.
    async fn first_batch(h: &mut Harness) -> Processed {
        h.step::<StreamJoin>(
            &[
                ("lefts", events(&[("a", Some(1), 1), ("b", Some(1), 2)])),
                ("rights", events(&[("a", Some(1), 10)])),
            ],
            watermark(0, 0),
        )
        .await
    }

    /// Joined rows as `k:left v-right v` (an absent side's value empty), sorted.
    fn pairs(op: &StreamJoin, joined: &RecordBatch) -> Vec<String> {
        let width = op.left.input.schema().fields().len();
        let value = |c: usize, r: usize| {
            arrow::util::display::array_value_to_string(joined.column(c), r).unwrap()
        };
        let (k, v) = (
            op.left.input.schema().index_of("k").unwrap(),
            op.left.input.schema().index_of("v").unwrap(),
        );
        let mut out: Vec<String> = (0..joined.num_rows())
            .map(|r| format!("{}:{}-{}", value(k, r), value(v, r), value(width + v, r)))
            .collect();
        out.sort();
        out
    }

    #[tokio::test]
    async fn matching_meets_new_rows_with_each_other_and_with_the_other_sides_stored_rows() {
        let mut h = harness("JOIN").await;
        let first = first_batch(&mut h).await;
        assert_eq!(first.rows_in_state, RowsInState::Counted(3));

        // The next batch's matching phase on its own: a@2 meets stored a@1 on the right, a@5
        // is too far from it, stored b@1 on the left meets b@2, c meets nothing.
        let planned = h
            .phases::<StreamJoin>(
                &[
                    ("lefts", events(&[("a", Some(2), 3), ("a", Some(5), 4)])),
                    ("rights", events(&[("b", Some(2), 20), ("c", Some(2), 30)])),
                ],
                watermark(0, 0),
            )
            .await;
        let op = planned.operator::<StreamJoin>();
        let stores = h.stores(op);
        let l = op.side_rows(&op.left, &planned.input[0], 0).unwrap();
        let r = op.side_rows(&op.right, &planned.input[1], 0).unwrap();
        let left_state = SideState::load(stores[0].as_ref(), &r.key_bytes(), 2, "left").unwrap();
        let right_state = SideState::load(stores[2].as_ref(), &l.key_bytes(), 1, "right").unwrap();
        let left_rows = RowConverter::new(sort_fields(&op.left.input.schema())).unwrap();
        let right_rows = RowConverter::new(sort_fields(&op.right.input.schema())).unwrap();
        let m = op
            .match_rows(&l, &r, &left_state, &right_state, &left_rows, &right_rows)
            .unwrap();
        assert_eq!(pairs(op, &m.joined), ["a:3-10", "b:2-20"]);
        assert_eq!(m.new_left_matched, [true, false]);
        assert_eq!(m.new_right_matched, [true, false]);
        // Each stored row the new rows meet is decoded once, and says whether it matched.
        assert_eq!((m.old_left.len(), m.old_left_matched), (1, vec![true]));
        assert_eq!((m.old_right.len(), m.old_right_matched), (1, vec![true]));
    }

    #[tokio::test]
    async fn a_keys_rows_are_stored_one_entry_each_and_all_found_by_the_other_sides_rows() {
        let mut h = harness("JOIN").await;
        let many: Vec<(&str, Option<i64>, i64)> = (0..50).map(|v| ("a", Some(1), v)).collect();
        h.step::<StreamJoin>(&[("lefts", events(&many))], watermark(0, 0))
            .await;
        let second = h
            .step::<StreamJoin>(
                &[
                    ("lefts", events(&[("a", Some(1), 50)])),
                    (
                        "rights",
                        events(&[("a", Some(1), 100), ("b", Some(1), 101)]),
                    ),
                ],
                watermark(0, 0),
            )
            .await;
        let planned = h.phases::<StreamJoin>(&[], watermark(0, 0)).await;
        let op = planned.operator::<StreamJoin>();
        let mut expected: Vec<String> = (0..51).map(|v| format!("a:{v}-100")).collect();
        expected.sort();
        assert_eq!(pairs(op, &second.output), expected);
        let stores = h.stores(op);
        // 51 rows on the left: a new row under a key adds one entry rather than rewriting
        // the key's rows.
        assert_eq!(stores[0].metrics().num_keys, 51);
        let entries = stores[0].scan(&KeyRange::all()).unwrap();
        let rows: Vec<_> = entries
            .iter()
            .flat_map(|(k, v)| stored::side_row(k, v).unwrap())
            .collect();
        assert_eq!(rows.len(), 51);
        assert!(rows.iter().all(|(k, _)| *k == rows[0].0));
        // Found key by key as well as by one scan of the whole store.
        let key = rows[0].0.as_slice();
        for stored in [51, 1_000] {
            let state = SideState::load(stores[0].as_ref(), &[key], stored, "left").unwrap();
            assert_eq!(state.entries(key).len(), 51, "{stored} rows stored");
        }
        assert_eq!(stores[2].metrics().num_keys, 2);
    }

    #[tokio::test]
    async fn an_inner_join_emits_each_match_once_and_evicts_rows_the_watermark_passed() {
        let mut h = harness("JOIN").await;
        let first = first_batch(&mut h).await;
        let planned = h.phases::<StreamJoin>(&[], watermark(0, 0)).await;
        let op = planned.operator::<StreamJoin>();
        assert_eq!(pairs(op, &first.output), ["a:1-10"]);
        assert_eq!(first.rows_updated, 3);
        let second = h
            .step::<StreamJoin>(
                &[("rights", events(&[("b", Some(2), 20)]))],
                watermark(0, 0),
            )
            .await;
        assert_eq!(pairs(op, &second.output), ["b:2-20"]);
        assert_eq!(second.rows_in_state, RowsInState::Counted(4));
        // At 10 s no row of either side can meet a row at 1 s or 2 s any more.
        let third = h.step::<StreamJoin>(&[], watermark(10_000, 10_000)).await;
        assert!(pairs(op, &third.output).is_empty());
        assert_eq!(
            (third.rows_removed, third.rows_in_state),
            (4, RowsInState::Counted(0))
        );
        let stores = h.stores(op);
        assert!(
            stores.iter().all(|s| s.metrics().num_keys <= 1),
            "only counts are left"
        );
    }

    #[tokio::test]
    async fn a_left_outer_join_emits_a_left_row_that_never_matched_once_the_watermark_passes_it() {
        let mut h = harness("LEFT JOIN").await;
        let first = first_batch(&mut h).await;
        let planned = h.phases::<StreamJoin>(&[], watermark(0, 0)).await;
        let op = planned.operator::<StreamJoin>();
        assert_eq!(pairs(op, &first.output), ["a:1-10"]);
        // b@1 s meets right rows up to 2 s: below a watermark of 2 s one may still come.
        let second = h.step::<StreamJoin>(&[], watermark(0, 1_999)).await;
        assert!(pairs(op, &second.output).is_empty());
        let third = h.step::<StreamJoin>(&[], watermark(1_999, 2_000)).await;
        assert_eq!(pairs(op, &third.output), ["b:2-"]);
        assert_eq!(third.rows_in_state, RowsInState::Counted(0));
    }

    #[tokio::test]
    async fn an_outer_sides_row_without_an_event_time_is_emitted_at_once_and_not_stored() {
        let mut h = harness("LEFT JOIN").await;
        let first = h
            .step::<StreamJoin>(
                &[
                    ("lefts", events(&[("a", None, 1), ("b", Some(1), 2)])),
                    ("rights", events(&[("a", Some(1), 10)])),
                ],
                watermark(0, 0),
            )
            .await;
        let planned = h.phases::<StreamJoin>(&[], watermark(0, 0)).await;
        let op = planned.operator::<StreamJoin>();
        // a without a time never meets the time range: unmatched, out now, null-padded.
        assert_eq!(pairs(op, &first.output), ["a:1-"]);
        assert_eq!(
            (first.rows_updated, first.rows_in_state),
            (2, RowsInState::Counted(2))
        );
    }
}
