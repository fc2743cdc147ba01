//! Streaming deduplication (DESIGN.md §5): the first row of each key passes, later ones are
//! dropped, across batches.
//!
//! ```text
//! input (any partitions)
//!   └─ shuffle by key_partition(arrow-row key), arrival order kept
//! DedupeExec, partition p    one multi_get of the batch's distinct keys in store (op, p, default)
//!                            keep a row if its key is neither stored nor seen earlier in the batch
//!                            put the kept keys; evict by watermark; commit version N+1
//! ```
//!
//! `dropDuplicates` with an event-time column among the keys stores `[event time µs, keys...]`,
//! so the watermark evicts a range and late rows are dropped. `dropDuplicatesWithinWatermark`
//! stores each key's expiry (its first event time plus the watermark delay) as the value and
//! evicts keys whose expiry the watermark has passed.

use datafusion::common::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow::compute::{concat_batches, filter_record_batch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PhysicalExpr, PlanProperties,
};
use tokio::sync::OnceCell;
use weir_state::{KeyRange, WriteBatch};

use super::watermark::{drop_late, event_micros};
use super::{
    BatchState, OperatorInfo, event_time_bound, on_blocking_pool, one_batch_stream, shuffle,
    state_error, watermark_columns,
};
use crate::progress::StateOperatorProgress;

const STORE: &str = "default";
const EVENT_TIME: &str = super::EVENT_TIME_KEY;

/// How the watermark bounds the operator's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// No watermark on a key: keys are kept forever (as in Spark).
    Never,
    /// The key column at this position is watermarked: stored keys lead with it.
    KeyEventTime(usize),
    /// Within the watermark: the input column at this position is the event time; a key expires
    /// `delay_ms` after its first event time.
    WithinWatermark { column: usize, delay_ms: i64 },
}

/// The planned deduplication: its input and key columns, before a batch attaches it.
#[derive(Debug)]
pub(crate) struct DedupeExec {
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<usize>,
    within_watermark: bool,
    properties: Arc<PlanProperties>,
    attached: Option<Arc<Inner>>,
}

#[derive(Debug)]
struct Inner {
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<usize>,
    key_fields: Vec<SortField>,
    expiry: Expiry,
    info: OperatorInfo,
    batch: Arc<BatchState>,
    shuffled: OnceCell<Vec<Vec<RecordBatch>>>,
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
            attached: None,
        })
    }

    fn name_of(&self) -> &'static str {
        if self.within_watermark {
            "dedupeWithinWatermark"
        } else {
            "dedupe"
        }
    }

    /// The operator as stateful operator `id` of `batch` (its input already attached).
    pub(crate) fn attach(
        &self,
        input: Arc<dyn ExecutionPlan>,
        id: u32,
        batch: Arc<BatchState>,
    ) -> Result<Self> {
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
            Expiry::WithinWatermark { column, delay_ms }
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
            operator_name: self.name_of().into(),
            num_partitions: batch.run()?.partitions,
            store_names: vec![STORE.into()],
            key_schema: Schema::new(key_schema),
            value_schema: Schema::new(value_schema),
            fingerprint: self
                .keys
                .iter()
                .map(|&k| format!("key {}", schema.field(k).name()))
                .collect(),
            layout: None,
        };
        let partitions = info.num_partitions;
        Ok(Self {
            input: Arc::clone(&input),
            keys: self.keys.clone(),
            within_watermark: self.within_watermark,
            properties: Arc::new(PlanProperties::new(
                EquivalenceProperties::new(Arc::clone(&schema)),
                Partitioning::UnknownPartitioning(partitions),
                EmissionType::Final,
                Boundedness::Bounded,
            )),
            attached: Some(Arc::new(Inner {
                input,
                keys: self.keys.clone(),
                key_fields,
                expiry,
                info,
                batch,
                shuffled: OnceCell::new(),
            })),
        })
    }

    /// The operator as the checkpoint records it, once attached.
    pub(crate) fn info(&self) -> Option<&OperatorInfo> {
        self.attached.as_ref().map(|i| &i.info)
    }
}

impl Inner {
    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }

    /// Keeps the first row of each new key in partition `partition`'s rows, records the kept
    /// keys, evicts by watermark and commits the store.
    fn dedupe_partition(&self, partition: usize, input: &[RecordBatch]) -> Result<RecordBatch> {
        let started = Instant::now();
        let run = self.batch.run()?;
        let watermark = self.batch.watermark;
        let mut store = run
            .open_store(self.info.operator_id, partition, STORE, self.batch.batch)
            .map_err(state_error)?;
        let schema = self.schema();
        let batch = concat_batches(&schema, input)?;

        // Late rows are dropped before they reach state.
        let event_time = match self.expiry {
            Expiry::Never => None,
            Expiry::KeyEventTime(k) => Some(self.keys[k]),
            Expiry::WithinWatermark { column, .. } => Some(column),
        };
        let (batch, times, dropped) = match event_time {
            None => (batch, None, 0),
            Some(column) => {
                let late_us = watermark.late_ms.saturating_mul(1000);
                let times = event_micros(batch.column(column).as_ref())?;
                let (kept, times, dropped) = drop_late(&batch, &times, late_us)?;
                (kept, Some(times), dropped)
            }
        };

        let mut columns: Vec<ArrayRef> = self
            .keys
            .iter()
            .map(|&k| Arc::clone(batch.column(k)))
            .collect();
        if let (Expiry::KeyEventTime(_), Some(t)) = (self.expiry, &times) {
            columns.insert(0, Arc::new(t.clone()));
        }
        let converter = RowConverter::new(self.key_fields.clone())?;
        let rows = converter.convert_columns(&columns)?;
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
        let mut writes = WriteBatch::new();
        let keep: BooleanArray = rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let k = r.data();
                let new = !stored.contains(k) && first.insert(k);
                if new {
                    let value = match (self.expiry, &times) {
                        (Expiry::WithinWatermark { delay_ms, .. }, Some(t)) if t.is_valid(i) => t
                            .value(i)
                            .saturating_add(delay_ms.saturating_mul(1000))
                            .to_be_bytes()
                            .to_vec(),
                        _ => vec![],
                    };
                    writes.put(k.to_vec(), value);
                }
                Some(new)
            })
            .collect();
        let updated = first.len() as u64;
        let output = filter_record_batch(&batch, &keep)?;
        store
            .apply(writes.with_key_delta(updated as i64))
            .map_err(state_error)?;
        let updates = started.elapsed();

        // Evict what can no longer repeat.
        let removing = Instant::now();
        let wm_us = watermark.eviction_ms.saturating_mul(1000);
        let expired: Vec<Vec<u8>> = match self.expiry {
            Expiry::Never => vec![],
            Expiry::KeyEventTime(_) => {
                let range = KeyRange {
                    start: std::ops::Bound::Included(event_time_bound(i64::MIN)?),
                    end: std::ops::Bound::Excluded(event_time_bound(wm_us.saturating_add(1))?),
                };
                store
                    .scan(&range)
                    .map_err(state_error)?
                    .into_iter()
                    .map(|(k, _)| k)
                    .collect()
            }
            Expiry::WithinWatermark { .. } => store
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
        if !expired.is_empty() {
            let mut deletes = WriteBatch::new();
            for k in expired {
                deletes.delete(k);
            }
            store
                .apply(deletes.with_key_delta(-(removed as i64)))
                .map_err(state_error)?;
        }
        let removals = removing.elapsed();

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
                num_rows_updated: updated,
                all_updates_time_ms: updates.as_millis() as u64,
                num_rows_removed: removed,
                all_removals_time_ms: removals.as_millis() as u64,
                commit_time_ms: committing.elapsed().as_millis() as u64,
                memory_used_bytes: metrics.memory_used_bytes,
                num_rows_dropped_by_watermark: dropped,
                num_shuffle_partitions: run.partitions as u64,
                num_state_store_instances: 1,
                custom_metrics: metrics.custom,
            },
        );
        Ok(output)
    }
}

impl DisplayAs for DedupeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let schema = self.input.schema();
        let keys: Vec<&str> = self
            .keys
            .iter()
            .map(|&k| schema.field(k).name().as_str())
            .collect();
        write!(
            f,
            "DedupeExec: {} keys=[{}]",
            self.name_of(),
            keys.join(", ")
        )
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
        if self.attached.is_some() {
            return Err(DataFusionError::Internal(
                "a deduplication's input cannot be replaced once planned".into(),
            ));
        }
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
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let Some(inner) = self.attached.clone() else {
            return Err(DataFusionError::Internal(
                "a deduplication ran outside a streaming batch".into(),
            ));
        };
        let schema = inner.schema();
        let run = async move {
            let shuffled = inner
                .shuffled
                .get_or_try_init(|| async {
                    let schema = inner.input.schema();
                    let fields = inner
                        .keys
                        .iter()
                        .map(|&k| SortField::new(schema.field(k).data_type().clone()))
                        .collect();
                    shuffle(
                        Arc::clone(&inner.input),
                        context,
                        &inner.keys,
                        fields,
                        inner.batch.run()?.partitions,
                    )
                    .await
                })
                .await?;
            let input = shuffled.get(partition).cloned().unwrap_or_default();
            let worker = Arc::clone(&inner);
            on_blocking_pool(move || worker.dedupe_partition(partition, &input)).await
        };
        Ok(one_batch_stream(schema, run))
    }
}
