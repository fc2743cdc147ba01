//! Streaming deduplication (DESIGN.md §5): the first row of each key passes, later ones are
//! dropped, across batches.
//!
//! ```text
//! input (any partitions)
//!   └─ shuffle by key_partition(arrow-row key), arrival order kept
//! StatefulExec<Deduplicate>, partition p (see `operator.rs` for the shell)
//!                            one multi_get of the batch's distinct keys in store (op, p, default)
//!                            keep a row if its key is neither stored nor seen earlier in the batch
//!                            put the kept keys; evict by watermark; commit version N+1
//! ```
//!
//! `dropDuplicates` with an event-time column among the keys stores `[event time µs, keys...]`,
//! so the watermark evicts a range and late rows are dropped. `dropDuplicatesWithinWatermark`
//! keeps a time-indexed map (`weir_state::table::TimeIndexedMap`): `default` holds each key's
//! expiry (its first event time plus the watermark delay), `default-by-expiry` the key under
//! its expiry, so the keys the watermark passed are one range scan. Checkpoints of earlier
//! weirs have no index (the store `default` only): their query runs as it was planned then,
//! finding expired keys by a scan of every key.

use datafusion::common::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, BooleanArray, Int64Array, RecordBatch};
use arrow::compute::{concat_batches, filter_record_batch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PhysicalExpr, PlanProperties,
};
use weir_state::table::{TimeIndexedMap, ValueChanges, times_up_to};
use weir_state::{KeyRange, StateStore};

use super::kind::{OperatorKind, Placement, StateFormat};
use super::operator::{Processed, RowsInState, ShuffleKey, StatefulExec, StatefulOperator, Step};
use super::watermark::{drop_late, event_micros};
use super::{BatchState, BatchWatermark, OperatorInfo, StateRun, state_error, watermark_columns};

const STORE: &str = "default";
/// Within the watermark: the keys by expiry.
const BY_EXPIRY: &str = "default-by-expiry";
const EVENT_TIME: &str = super::EVENT_TIME_KEY;

/// How the watermark bounds the operator's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// No watermark on a key: keys are kept forever (as in Spark).
    Never,
    /// The key column at this position is watermarked: stored keys lead with it.
    KeyEventTime(usize),
    /// Within the watermark: the input column at this position is the event time; a key expires
    /// `delay_ms` after its first event time. `indexed`: the keys are indexed by expiry (not in
    /// checkpoints of earlier weirs).
    WithinWatermark {
        column: usize,
        delay_ms: i64,
        indexed: bool,
    },
}

/// The planned deduplication: its input and key columns, before a batch attaches it.
#[derive(Debug)]
pub(crate) struct DedupeExec {
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<usize>,
    within_watermark: bool,
    properties: Arc<PlanProperties>,
}

/// A deduplication in a batch: the first row of each key passes.
#[derive(Debug)]
pub(crate) struct Deduplicate {
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<usize>,
    key_fields: Vec<SortField>,
    expiry: Expiry,
    info: OperatorInfo,
}

impl DedupeExec {
    /// Deduplication of `input` on the columns `keys` (by name).
    pub(crate) fn try_new(
        input: Arc<dyn ExecutionPlan>,
        keys: &[String],
        within_watermark: bool,
    ) -> Result<Self> {
        let schema = input.schema();
        let keys = keys
            .iter()
            .map(|k| schema.index_of(k))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            input,
            keys,
            within_watermark,
            properties,
        })
    }

    fn kind(&self) -> OperatorKind {
        if self.within_watermark {
            OperatorKind::DedupeWithinWatermark
        } else {
            OperatorKind::Dedupe
        }
    }

    /// The operator as stateful operator `id` of `batch` (its input already attached).
    pub(crate) fn attach(
        &self,
        input: Arc<dyn ExecutionPlan>,
        id: u32,
        batch: Arc<BatchState>,
    ) -> Result<StatefulExec<Deduplicate>> {
        let schema = input.schema();
        let watermarks = watermark_columns(&input);
        let expiry = if self.within_watermark {
            let Some((column, delay_ms)) = watermarks
                .iter()
                .find_map(|(name, delay)| schema.index_of(name).ok().map(|i| (i, *delay)))
            else {
                return Err(DataFusionError::External(Box::new(
                    weir_common::ClassifiedError::new(
                        "UNSUPPORTED_STREAMING_OPERATION.DEDUPLICATE_WITHIN_WATERMARK",
                        "0A000",
                        "dropDuplicatesWithinWatermark needs a watermark on the stream \
                         (with_watermark or WATERMARK ... DELAY OF) whose column reaches it.",
                    ),
                )));
            };
            // A checkpoint an earlier weir wrote keeps the layout it has: no index.
            let recorded = batch.run()?.recorded_stores(id);
            let indexed = recorded.is_none_or(|stores| stores != [STORE]);
            Expiry::WithinWatermark {
                column,
                delay_ms,
                indexed,
            }
        } else {
            self.keys
                .iter()
                .position(|&k| watermarks.iter().any(|(w, _)| schema.field(k).name() == w))
                .map_or(Expiry::Never, Expiry::KeyEventTime)
        };
        let mut key_schema: Vec<Field> =
            self.keys.iter().map(|&k| schema.field(k).clone()).collect();
        if matches!(expiry, Expiry::KeyEventTime(_)) {
            key_schema.insert(0, Field::new(EVENT_TIME, DataType::Int64, true));
        }
        let value_schema = match expiry {
            Expiry::WithinWatermark { .. } => {
                vec![Field::new("expires_at_us", DataType::Int64, false)]
            }
            _ => vec![],
        };
        let key_fields = key_schema
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let info = OperatorInfo {
            operator_id: id,
            operator_name: self.kind().name().into(),
            num_partitions: batch.run()?.partitions,
            store_names: match expiry {
                Expiry::WithinWatermark { indexed: true, .. } => {
                    vec![STORE.into(), BY_EXPIRY.into()]
                }
                _ => vec![STORE.into()],
            },
            key_schema: Schema::new(key_schema),
            value_schema: Schema::new(value_schema),
            fingerprint: self
                .keys
                .iter()
                .map(|&k| format!("key {}", schema.field(k).name()))
                .collect(),
            layout: None,
        };
        Ok(StatefulExec::new(
            Deduplicate {
                input,
                keys: self.keys.clone(),
                key_fields,
                expiry,
                info,
            },
            batch,
        ))
    }
}

/// How a deduplication keeps its state: store `default` holds each key seen (arrow-row, led by
/// the event time when a watermark is on a key); within the watermark, its value is the key's
/// expiry (µs, big-endian), otherwise empty, and `default-by-expiry` indexes the keys by expiry.
pub(crate) struct DedupeFormat;

impl StateFormat for DedupeFormat {
    fn readable(&self, store: &str) -> bool {
        store == STORE
    }

    fn placement(&self, store: &str) -> Placement {
        if store == BY_EXPIRY {
            Placement::ByKeyAfterTime
        } else {
            Placement::ByKey
        }
    }

    fn decode_values(
        &self,
        fields: &arrow::datatypes::Fields,
        values: &[&[u8]],
    ) -> Result<Vec<ArrayRef>> {
        if fields.is_empty() {
            return Ok(vec![]);
        }
        let expiry: arrow::array::Int64Array = values
            .iter()
            .map(|v| <[u8; 8]>::try_from(*v).ok().map(i64::from_be_bytes))
            .collect();
        Ok(vec![Arc::new(expiry)])
    }
}

/// A key the batch sees first: its encoding and, within the watermark, its expiry.
struct NewKey {
    key: Vec<u8>,
    expires_us: Option<i64>,
}

impl Deduplicate {
    /// The event-time column, when the watermark bounds the state.
    fn event_time(&self) -> Option<usize> {
        match self.expiry {
            Expiry::Never => None,
            Expiry::KeyEventTime(k) => Some(self.keys[k]),
            Expiry::WithinWatermark { column, .. } => Some(column),
        }
    }

    /// Drops the rows at or behind the previous batch's watermark (they never reach state);
    /// returns the rest, their event times (µs) and how many were dropped.
    fn drop_late(
        &self,
        batch: RecordBatch,
        watermark: BatchWatermark,
    ) -> Result<(RecordBatch, Option<Int64Array>, u64)> {
        match self.event_time() {
            None => Ok((batch, None, 0)),
            Some(column) => {
                let late_us = watermark.late_ms.saturating_mul(1000);
                let times = event_micros(batch.column(column).as_ref())?;
                let (kept, times, dropped) = drop_late(&batch, &times, late_us)?;
                Ok((kept, Some(times), dropped))
            }
        }
    }

    /// Each row's stored key: its key columns, led by the event time when it is a key.
    fn encode_keys(&self, batch: &RecordBatch, times: Option<&Int64Array>) -> Result<Rows> {
        let mut columns: Vec<ArrayRef> = self
            .keys
            .iter()
            .map(|&k| Arc::clone(batch.column(k)))
            .collect();
        if let (Expiry::KeyEventTime(_), Some(t)) = (self.expiry, times) {
            columns.insert(0, Arc::new(t.clone()));
        }
        let converter = RowConverter::new(self.key_fields.clone())?;
        Ok(converter.convert_columns(&columns)?)
    }

    /// Which rows pass (the first of a key neither stored nor seen earlier in the batch), and
    /// the keys they bring.
    fn first_of_new_keys(
        &self,
        store: &dyn StateStore,
        rows: &Rows,
        times: Option<&Int64Array>,
    ) -> Result<(BooleanArray, Vec<NewKey>)> {
        let mut distinct: Vec<&[u8]> = Vec::new();
        let mut seen_in_batch: HashSet<&[u8]> = HashSet::new();
        for r in rows.iter() {
            if seen_in_batch.insert(r.data()) {
                distinct.push(r.data());
            }
        }
        let stored: HashSet<&[u8]> = store
            .multi_get(&distinct)
            .map_err(state_error)?
            .iter()
            .zip(&distinct)
            .filter_map(|(v, k)| v.as_ref().map(|_| *k))
            .collect();
        let mut first: HashSet<&[u8]> = HashSet::new();
        let mut new = vec![];
        let keep: BooleanArray = rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let k = r.data();
                let is_new = !stored.contains(k) && first.insert(k);
                if is_new {
                    let expires_us = match (self.expiry, times) {
                        (Expiry::WithinWatermark { delay_ms, .. }, Some(t)) if t.is_valid(i) => {
                            Some(t.value(i).saturating_add(delay_ms.saturating_mul(1000)))
                        }
                        _ => None,
                    };
                    new.push(NewKey {
                        key: k.to_vec(),
                        expires_us,
                    });
                }
                Some(is_new)
            })
            .collect();
        Ok((keep, new))
    }

    /// Stores the new keys: within the watermark with their expiry (indexed by it where the
    /// layout has the index), otherwise with an empty value.
    fn write<'s>(
        &self,
        store: &mut dyn StateStore,
        index: Option<&mut (dyn StateStore + 's)>,
        new: Vec<NewKey>,
    ) -> Result<()> {
        let value = |k: &NewKey| k.expires_us.map_or(vec![], |e| e.to_be_bytes().to_vec());
        match index {
            Some(index) => {
                // A key without an event time never expires: stored, not indexed.
                let (timed, untimed): (Vec<NewKey>, Vec<NewKey>) =
                    new.into_iter().partition(|k| k.expires_us.is_some());
                let mut plain = ValueChanges::new();
                for k in &untimed {
                    plain.put(k.key.clone(), value(k), false);
                }
                plain.apply_to(store).map_err(state_error)?;
                let entries = timed
                    .into_iter()
                    .map(|k| {
                        let v = value(&k);
                        (k.key, k.expires_us.unwrap_or(i64::MAX), v)
                    })
                    .collect();
                TimeIndexedMap::new(store, index)
                    .insert_new(entries)
                    .map_err(state_error)
            }
            None => {
                let mut changes = ValueChanges::new();
                for k in &new {
                    changes.put(k.key.clone(), value(k), false);
                }
                changes.apply_to(store).map_err(state_error)
            }
        }
    }

    /// Removes the keys that can no longer repeat: those whose event time (or, within the
    /// watermark, expiry) the eviction watermark has passed. Returns how many.
    fn evict<'s>(
        &self,
        store: &mut dyn StateStore,
        index: Option<&mut (dyn StateStore + 's)>,
        run: &StateRun,
        watermark: BatchWatermark,
    ) -> Result<u64> {
        let wm_us = watermark.eviction_ms.saturating_mul(1000);
        let expired: Vec<Vec<u8>> = match (self.expiry, index) {
            (Expiry::Never, _) => return Ok(0),
            (Expiry::WithinWatermark { .. }, Some(index)) => {
                // From where this run's last eviction stopped: below it are deleted keys only.
                let floor = run.eviction_floor(index.id(), wm_us);
                let gone = TimeIndexedMap::new(store, index)
                    .evict(floor, wm_us)
                    .map_err(state_error)?;
                return Ok(gone.len() as u64);
            }
            (Expiry::KeyEventTime(_), _) => store
                .scan(&times_up_to(None, wm_us))
                .map_err(state_error)?
                .into_iter()
                .map(|(k, _)| k)
                .collect(),
            // An earlier weir's layout: every key's expiry is read.
            (Expiry::WithinWatermark { .. }, None) => store
                .scan(&KeyRange::all())
                .map_err(state_error)?
                .into_iter()
                .filter(|(_, v)| {
                    v.as_slice()
                        .try_into()
                        .map(i64::from_be_bytes)
                        .is_ok_and(|expires| expires <= wm_us)
                })
                .map(|(k, _)| k)
                .collect(),
        };
        let removed = expired.len() as u64;
        let mut changes = ValueChanges::new();
        for k in expired {
            changes.remove(k);
        }
        if !changes.is_empty() {
            changes.apply_to(store).map_err(state_error)?;
        }
        Ok(removed)
    }
}

impl StatefulOperator for Deduplicate {
    fn name(&self) -> &'static str {
        "DedupeExec"
    }

    fn info(&self) -> &OperatorInfo {
        &self.info
    }

    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }

    fn inputs(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn shuffle_key(&self, _input: usize) -> Result<ShuffleKey> {
        Ok(ShuffleKey::columns(&self.input.schema(), &self.keys))
    }

    /// Keeps the first row of each new key in a partition's rows, records the kept keys and
    /// evicts by watermark.
    fn process(&self, step: Step<'_>) -> Result<Processed> {
        let started = Instant::now();
        let Step {
            input,
            stores,
            run,
            watermark,
            ..
        } = step;
        let (store, mut index): (&mut Box<dyn StateStore>, Option<&mut dyn StateStore>) =
            match stores {
                [store] => (store, None),
                [store, index] => (store, Some(index.as_mut())),
                _ => {
                    return Err(DataFusionError::Internal(
                        "a deduplication has one or two stores".into(),
                    ));
                }
            };
        let schema = self.schema();
        let batch = concat_batches(&schema, &input.into_iter().next().unwrap_or_default())?;
        let (batch, times, dropped) = self.drop_late(batch, watermark)?;
        let rows = self.encode_keys(&batch, times.as_ref())?;
        let (keep, new) = self.first_of_new_keys(store.as_ref(), &rows, times.as_ref())?;
        let updated = new.len() as u64;
        let output = filter_record_batch(&batch, &keep)?;
        self.write(store.as_mut(), index.as_deref_mut(), new)?;
        let updates = started.elapsed();

        let removing = Instant::now();
        let removed = self.evict(store.as_mut(), index, run, watermark)?;
        let removals = removing.elapsed();

        Ok(Processed {
            output,
            rows_updated: updated,
            rows_removed: removed,
            rows_dropped_by_watermark: dropped,
            rows_in_state: RowsInState::KeysOf(0),
            updates,
            removals,
        })
    }

    fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let within_watermark = matches!(self.expiry, Expiry::WithinWatermark { .. });
        describe(&self.input, &self.keys, within_watermark, f)
    }
}

/// `DedupeExec: <kind> keys=[...]`, planned or attached.
fn describe(
    input: &Arc<dyn ExecutionPlan>,
    keys: &[usize],
    within_watermark: bool,
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    let schema = input.schema();
    let keys: Vec<&str> = keys
        .iter()
        .map(|&k| schema.field(k).name().as_str())
        .collect();
    let kind = if within_watermark {
        OperatorKind::DedupeWithinWatermark
    } else {
        OperatorKind::Dedupe
    };
    write!(f, "DedupeExec: {} keys=[{}]", kind.name(), keys.join(", "))
}

impl DisplayAs for DedupeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        describe(&self.input, &self.keys, self.within_watermark, f)
    }
}

impl ExecutionPlan for DedupeExec {
    fn name(&self) -> &str {
        "DedupeExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
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
        let input = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("dedupe without input".into()))?;
        let names: Vec<String> = self
            .keys
            .iter()
            .map(|&k| self.input.schema().field(k).name().clone())
            .collect();
        Ok(Arc::new(Self::try_new(
            input,
            &names,
            self.within_watermark,
        )?))
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Err(DataFusionError::Internal(
            "a deduplication ran outside a streaming batch".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, TimestampMicrosecondArray};
    use arrow::datatypes::TimeUnit;
    use datafusion::physical_plan::empty::EmptyExec;
    use weir_sinks::OutputMode;

    use super::*;
    use crate::stateful::StateBackend;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("t", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        ]))
    }

    /// Rows `(k, t in seconds)`.
    fn rows(rows: &[(i64, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(TimestampMicrosecondArray::from_iter_values(
                    rows.iter().map(|r| r.1 * 1_000_000),
                )),
            ],
        )
        .unwrap()
    }

    fn keys_of(batch: &RecordBatch) -> Vec<(i64, i64)> {
        let k = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let t = batch
            .column(1)
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .unwrap();
        (0..batch.num_rows())
            .map(|i| (k.value(i), t.value(i) / 1_000_000))
            .collect()
    }

    /// `dropDuplicatesWithinWatermark` on `k` with a 2-second delay, with the expiry index or
    /// in an earlier weir's layout without it.
    fn within_watermark(indexed: bool) -> Deduplicate {
        let input: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(schema()));
        let mut stores = vec![STORE.to_string()];
        if indexed {
            stores.push(BY_EXPIRY.into());
        }
        let mut info = OperatorInfo::placeholder();
        info.operator_name = OperatorKind::DedupeWithinWatermark.name().into();
        info.num_partitions = 1;
        info.store_names = stores;
        Deduplicate {
            input,
            keys: vec![0],
            key_fields: vec![SortField::new(DataType::Int64)],
            expiry: Expiry::WithinWatermark {
                column: 1,
                delay_ms: 2_000,
                indexed,
            },
            info,
        }
    }

    /// A batch: its rows `(k, t in seconds)`, then its late and eviction watermarks in seconds.
    type Batch = (&'static [(i64, i64)], i64, i64);
    /// What a batch did: the rows that passed, and how many keys it removed.
    type Passed = (Vec<(i64, i64)>, u64);

    /// Runs `batches` (rows, then the late and eviction watermarks in seconds) through `op` on
    /// in-memory stores, committing each: the rows each passed and removed, and the stores'
    /// keys at the end.
    fn run(op: &Deduplicate, batches: &[Batch]) -> (Vec<Passed>, Vec<u64>) {
        let state = StateRun::open(
            StateBackend::Memory,
            None,
            None,
            uuid::Uuid::nil(),
            crate::stateful::Instances::Scratch(uuid::Uuid::nil()),
            1,
            OutputMode::Append,
        )
        .unwrap();
        let mut out = vec![];
        let mut keys = vec![];
        for (n, (input, late_s, eviction_s)) in batches.iter().enumerate() {
            let mut stores: Vec<Box<dyn StateStore>> = op
                .info
                .store_names
                .iter()
                .map(|name| {
                    state
                        .open_store(0, 0, (name, weir_state::KeyShape::Opaque), n as u64)
                        .unwrap()
                })
                .collect();
            let processed = op
                .process(Step {
                    input: vec![vec![rows(input)]],
                    stores: &mut stores,
                    run: &state,
                    batch: n as u64,
                    watermark: BatchWatermark {
                        late_ms: late_s * 1000,
                        eviction_ms: eviction_s * 1000,
                    },
                })
                .unwrap();
            for s in &mut stores {
                s.commit().unwrap();
            }
            keys = stores.iter().map(|s| s.metrics().num_keys).collect();
            out.push((keys_of(&processed.output), processed.rows_removed));
        }
        (out, keys)
    }

    const BATCHES: &[Batch] = &[
        // Keys 1 and 2 pass once; they expire at 3 s (first time + 2 s).
        (&[(1, 1), (1, 2), (2, 1), (2, 1)], 0, 0),
        // Key 1 again before it expired; key 3 new (expires at 6 s); the watermark reaches 3 s:
        // keys 1 and 2 go.
        (&[(1, 2), (3, 4)], 0, 3),
        // Key 1 passes again, once; a late row (at the previous watermark) is dropped.
        (&[(1, 4), (1, 5), (2, 3)], 3, 4),
        // The watermark passes 6 s: key 3 goes; 1 (expires at 6 s) too.
        (&[], 4, 6),
    ];

    #[test]
    fn within_the_watermark_a_key_passes_once_until_its_expiry_passes() {
        let (out, keys) = run(&within_watermark(true), BATCHES);
        assert_eq!(
            out,
            [
                (vec![(1, 1), (2, 1)], 0),
                (vec![(3, 4)], 2),
                (vec![(1, 4)], 0),
                (vec![], 2),
            ]
        );
        // Nothing left in the map nor in its index.
        assert_eq!(keys, [0, 0]);
    }

    #[test]
    fn an_earlier_weirs_layout_without_the_index_gives_the_same_rows() {
        let (indexed, _) = run(&within_watermark(true), BATCHES);
        let (scanned, keys) = run(&within_watermark(false), BATCHES);
        assert_eq!(scanned, indexed);
        assert_eq!(keys, [0]);
    }

    #[test]
    fn the_first_new_key_of_a_batch_passes_and_a_stored_one_does_not() {
        let op = within_watermark(true);
        let state = StateRun::open(
            StateBackend::Memory,
            None,
            None,
            uuid::Uuid::nil(),
            crate::stateful::Instances::Scratch(uuid::Uuid::nil()),
            1,
            OutputMode::Append,
        )
        .unwrap();
        let mut store = state
            .open_store(0, 0, (STORE, weir_state::KeyShape::Opaque), 0)
            .unwrap();
        let mut stored = ValueChanges::new();
        stored.put(
            op.encode_keys(&rows(&[(7, 1)]), None)
                .unwrap()
                .row(0)
                .as_ref(),
            vec![],
            false,
        );
        stored.apply_to(store.as_mut()).unwrap();
        let batch = rows(&[(7, 2), (8, 2), (8, 3), (9, 1)]);
        let keys = op.encode_keys(&batch, None).unwrap();
        let (keep, new) = op
            .first_of_new_keys(
                store.as_ref(),
                &keys,
                Some(&Int64Array::from(vec![2, 2, 3, 1])),
            )
            .unwrap();
        assert_eq!(
            keep.iter().collect::<Vec<_>>(),
            [Some(false), Some(true), Some(false), Some(true)]
        );
        // Within the watermark each new key expires at its first time plus the delay (2 s).
        assert_eq!(
            new.iter().map(|k| k.expires_us).collect::<Vec<_>>(),
            [Some(2_000_002), Some(2_000_001)]
        );
    }
}
