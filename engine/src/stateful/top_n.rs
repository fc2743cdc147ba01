//! Top-N per key over a stream (`row_number() OVER (PARTITION BY k ORDER BY o) <= N`): each
//! key's best N rows are kept in state and re-ranked as rows arrive.
//!
//! ```text
//! input (any partitions)
//!   └─ shuffle by the PARTITION BY key, arrival order kept
//! StatefulExec<TopN>, partition p (see `operator.rs` for the shell):
//!   group    the batch's rows by encoded key (late rows dropped when the key holds event time)
//!   load     multi_get those keys' stored lists from store (op, p, default)
//!   rank     stored rows then new rows, stably sorted by the encoded ORDER BY, cut to N
//!   write    the lists that changed
//!   emit     update: the rows whose position changed, with it; complete: every key's rows;
//!            append: a key's rows once, when the watermark passes its event time
//!   evict    keys whose event time the watermark passed (a range scan)
//! ```
//!
//! A stored key is the PARTITION BY values (arrow-row), led by the event time (µs) when one of
//! them is a watermarked column or a window; its value is the list of the key's rows in rank
//! order, each as its ORDER BY values (arrow-row with the sort's directions, so bytes compare
//! as the order) and its columns (arrow-row), each length-prefixed.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, UInt64Array};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};
use datafusion::common::HashMap;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalSortExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PhysicalExpr, PlanProperties,
};
use weir_sinks::OutputMode;
use weir_state::KeyRange;
use weir_state::table::{ValueChanges, times_up_to};

use super::aggregate::{EventTimeKey, event_time_key, key_event_times, without_positions};
use super::kind::{OperatorKind, StateFormat, sort_fields};
use super::operator::{Processed, RowsInState, ShuffleKey, StatefulExec, StatefulOperator, Step};
use super::watermark::drop_late;
use super::{BatchState, BatchWatermark, OperatorInfo, state_error, watermark_columns};

const STORE: &str = "default";
const EVENT_TIME: &str = super::EVENT_TIME_KEY;
/// The rank column `read_state` shows after each stored row's columns.
const RANK: &str = "rank";

/// The planned top-N: its input, key, order and N, before a batch attaches it.
#[derive(Debug)]
pub(crate) struct TopNExec {
    input: Arc<dyn ExecutionPlan>,
    partition_by: Vec<Arc<dyn PhysicalExpr>>,
    order_by: Vec<PhysicalSortExpr>,
    n: u64,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl TopNExec {
    /// The best `n` rows of `input` per `partition_by`, by `order_by`; `schema` is the input's
    /// columns and the row number.
    pub(crate) fn try_new(
        input: Arc<dyn ExecutionPlan>,
        partition_by: Vec<Arc<dyn PhysicalExpr>>,
        order_by: Vec<PhysicalSortExpr>,
        n: u64,
        schema: SchemaRef,
    ) -> Result<Self> {
        if schema.fields().len() != input.schema().fields().len() + 1 {
            return Err(DataFusionError::Internal(
                "a top-N's output is its input's columns and the row number".into(),
            ));
        }
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            input,
            partition_by,
            order_by,
            n,
            schema,
            properties,
        })
    }

    /// The operator as stateful operator `id` of `batch` (its input already attached).
    pub(crate) fn attach(
        &self,
        input: Arc<dyn ExecutionPlan>,
        id: u32,
        batch: Arc<BatchState>,
    ) -> Result<StatefulExec<TopN>> {
        let input_schema = input.schema();
        let named: Vec<(Arc<dyn PhysicalExpr>, String)> = self
            .partition_by
            .iter()
            .map(|e| (Arc::clone(e), without_positions(&e.to_string())))
            .collect();
        let event_time = event_time_key(&named, &watermark_columns(&input), &input_schema);
        let mut key_fields = vec![];
        if event_time.is_some() {
            key_fields.push(Field::new(EVENT_TIME, DataType::Int64, true));
        }
        for (e, name) in &named {
            key_fields.push(Field::new(name, e.data_type(&input_schema)?, true));
        }
        let order_fields = self
            .order_by
            .iter()
            .map(|s| {
                Ok(SortField::new_with_options(
                    s.expr.data_type(&input_schema)?,
                    s.options,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut value_fields: Vec<Field> = input_schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        value_fields.push(Field::new(RANK, DataType::UInt64, false));
        let mut fingerprint: Vec<String> = named
            .iter()
            .map(|(_, name)| format!("partition by {name}"))
            .collect();
        fingerprint.extend(
            self.order_by
                .iter()
                .map(|s| format!("order by {}", without_positions(&s.to_string()))),
        );
        fingerprint.push(format!("n {}", self.n));
        let key_schema = Schema::new(key_fields);
        let info = OperatorInfo {
            operator_id: id,
            operator_name: OperatorKind::TopN.name().into(),
            num_partitions: batch.run()?.partitions,
            store_names: vec![STORE.into()],
            key_schema: key_schema.clone(),
            value_schema: Schema::new(value_fields),
            fingerprint,
            layout: None,
        };
        Ok(StatefulExec::new(
            TopN {
                input,
                partition_by: self.partition_by.clone(),
                order_by: self.order_by.clone(),
                n: self.n as usize,
                schema: Arc::clone(&self.schema),
                event_time,
                key_fields: sort_fields(&key_schema),
                order_fields,
                row_fields: sort_fields(&input_schema),
                info,
            },
            batch,
        ))
    }
}

/// A top-N in a batch.
pub(crate) struct TopN {
    input: Arc<dyn ExecutionPlan>,
    partition_by: Vec<Arc<dyn PhysicalExpr>>,
    order_by: Vec<PhysicalSortExpr>,
    n: usize,
    /// The input's columns and the row number.
    schema: SchemaRef,
    /// The PARTITION BY expression that carries event time, if a watermark is on it.
    event_time: Option<EventTimeKey>,
    key_fields: Vec<SortField>,
    order_fields: Vec<SortField>,
    row_fields: Vec<SortField>,
    info: OperatorInfo,
}

/// One ranked row: its encoded ORDER BY values and its encoded columns.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ranked {
    order: Vec<u8>,
    row: Vec<u8>,
}

/// A key's rows, best first, as stored.
fn encode_list(rows: &[Ranked]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.iter().map(|r| 8 + r.order.len() + r.row.len()).sum());
    for r in rows {
        out.extend_from_slice(&(r.order.len() as u32).to_le_bytes());
        out.extend_from_slice(&r.order);
        out.extend_from_slice(&(r.row.len() as u32).to_le_bytes());
        out.extend_from_slice(&r.row);
    }
    out
}

/// A stored list; `None` when damaged.
fn decode_list(mut bytes: &[u8]) -> Option<Vec<Ranked>> {
    fn part<'a>(bytes: &mut &'a [u8]) -> Option<&'a [u8]> {
        let (len, rest) = bytes.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        let (value, rest) = (rest.get(..len)?, rest.get(len..)?);
        *bytes = rest;
        Some(value)
    }
    let mut out = vec![];
    while !bytes.is_empty() {
        let order = part(&mut bytes)?.to_vec();
        let row = part(&mut bytes)?.to_vec();
        out.push(Ranked { order, row });
    }
    Some(out)
}

fn damaged() -> DataFusionError {
    DataFusionError::External(Box::new(weir_common::ClassifiedError::new(
        "CHECKPOINT_FILE_CORRUPT",
        "KD002",
        "A top-N's stored rows cannot be read: the state store does not hold what weir wrote. \
         Restore the checkpoint's state, or reset the query's state (weir checkpoint reset).",
    )))
}

impl TopN {
    /// `(key, position, row)` of every row to emit, as output rows.
    fn rows_out(&self, emitted: &[(usize, &[u8])]) -> Result<RecordBatch> {
        if emitted.is_empty() {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
        let converter = RowConverter::new(self.row_fields.clone())?;
        let parser = converter.parser();
        let mut columns = converter.convert_rows(emitted.iter().map(|(_, r)| parser.parse(r)))?;
        let rank: ArrayRef = Arc::new(UInt64Array::from_iter_values(
            emitted.iter().map(|(i, _)| *i as u64 + 1),
        ));
        let rank_type = self.schema.field(columns.len()).data_type();
        columns.push(cast(&rank, rank_type)?);
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }

    /// Every row of the stored `(key, list)` entries, ranked, as output rows.
    fn lists_out(&self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<RecordBatch> {
        let lists = entries
            .iter()
            .map(|(_, v)| decode_list(v).ok_or_else(damaged))
            .collect::<Result<Vec<_>>>()?;
        let rows: Vec<(usize, &[u8])> = lists
            .iter()
            .flat_map(|l| l.iter().enumerate().map(|(i, r)| (i, r.row.as_slice())))
            .collect();
        self.rows_out(&rows)
    }

    /// The batch's rows by stored key, in first-seen order, each with its ranked rows.
    fn group(
        &self,
        batch: &RecordBatch,
        times: Option<&Int64Array>,
    ) -> Result<Vec<(Vec<u8>, Vec<Ranked>)>> {
        let mut keys: Vec<ArrayRef> = vec![];
        if let Some(t) = times {
            keys.push(Arc::new(t.clone()));
        }
        for e in &self.partition_by {
            keys.push(e.evaluate(batch)?.into_array(batch.num_rows())?);
        }
        let orders = self
            .order_by
            .iter()
            .map(|s| s.expr.evaluate(batch)?.into_array(batch.num_rows()))
            .collect::<Result<Vec<_>>>()?;
        let keys = RowConverter::new(self.key_fields.clone())?.convert_columns(&keys)?;
        let orders = RowConverter::new(self.order_fields.clone())?.convert_columns(&orders)?;
        let rows = RowConverter::new(self.row_fields.clone())?.convert_columns(batch.columns())?;
        let mut index: HashMap<&[u8], usize> = HashMap::new();
        let mut groups: Vec<(Vec<u8>, Vec<Ranked>)> = vec![];
        for i in 0..batch.num_rows() {
            let k = keys.row(i);
            let g = *index.entry(k.data()).or_insert_with(|| {
                groups.push((k.data().to_vec(), vec![]));
                groups.len() - 1
            });
            groups[g].1.push(Ranked {
                order: orders.row(i).data().to_vec(),
                row: rows.row(i).data().to_vec(),
            });
        }
        Ok(groups)
    }

    /// The event times of the batch's rows (when a key holds event time), the late ones
    /// dropped: the rows kept, their times, and how many were dropped.
    fn drop_late(
        &self,
        batch: RecordBatch,
        watermark: BatchWatermark,
    ) -> Result<(RecordBatch, Option<Int64Array>, u64)> {
        let Some(key) = self.event_time else {
            return Ok((batch, None, 0));
        };
        let column = self.partition_by[key.index]
            .evaluate(&batch)?
            .into_array(batch.num_rows())?;
        let times = key_event_times(&column, key.window)?;
        let late_us = watermark.late_ms.saturating_mul(1000);
        let (kept, times, dropped) = drop_late(&batch, &times, late_us)?;
        Ok((kept, Some(times), dropped))
    }
}

impl StatefulOperator for TopN {
    fn name(&self) -> &'static str {
        "TopNExec"
    }

    fn info(&self) -> &OperatorInfo {
        &self.info
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn inputs(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn shuffle_key(&self, _input: usize) -> Result<ShuffleKey> {
        let schema = self.input.schema();
        Ok(ShuffleKey {
            exprs: self.partition_by.clone(),
            fields: self
                .partition_by
                .iter()
                .map(|e| Ok(SortField::new(e.data_type(&schema)?)))
                .collect::<Result<Vec<_>>>()?,
            broadcast: None,
        })
    }

    /// Re-ranks each key the batch's rows belong to, stores the lists that changed, emits by
    /// output mode and evicts by watermark.
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
            return Err(DataFusionError::Internal("a top-N has one store".into()));
        };
        let schema = self.input.schema();
        let batch = concat_batches(&schema, &input.into_iter().next().unwrap_or_default())?;
        let (batch, times, dropped) = self.drop_late(batch, watermark)?;
        let groups = self.group(&batch, times.as_ref())?;
        let key_refs: Vec<&[u8]> = groups.iter().map(|(k, _)| k.as_slice()).collect();
        let stored = store.multi_get(&key_refs).map_err(state_error)?;
        let mut changes = ValueChanges::new();
        let mut emitted: Vec<(usize, Vec<u8>)> = vec![];
        let mut updated = 0u64;
        for ((key, new), old) in groups.into_iter().zip(stored) {
            let existed = old.is_some();
            let old = match old {
                Some(bytes) => decode_list(&bytes).ok_or_else(damaged)?,
                None => vec![],
            };
            let mut list = old.clone();
            list.extend(new);
            // Stable: of equal ORDER BY values, the stored rows, then arrival order.
            list.sort_by(|a, b| a.order.cmp(&b.order));
            list.truncate(self.n);
            if list == old {
                continue;
            }
            updated += 1;
            if run.output_mode == OutputMode::Update {
                for (i, r) in list.iter().enumerate() {
                    if old.get(i) != Some(r) {
                        emitted.push((i, r.row.clone()));
                    }
                }
            }
            changes.put(key, encode_list(&list), existed);
        }
        changes.apply_to(store.as_mut()).map_err(state_error)?;
        let mut output = vec![];
        match run.output_mode {
            OutputMode::Update => {
                let rows: Vec<(usize, &[u8])> =
                    emitted.iter().map(|(i, r)| (*i, r.as_slice())).collect();
                output.push(self.rows_out(&rows)?);
            }
            OutputMode::Complete => {
                let all = store.scan(&KeyRange::all()).map_err(state_error)?;
                output.push(self.lists_out(&all)?);
            }
            OutputMode::Append => {}
        }
        let updates = started.elapsed();

        // Keys whose event time the watermark passed are final: append mode emits their rows,
        // and (except in complete mode, which keeps everything) they leave state.
        let removing = Instant::now();
        let mut removed = 0u64;
        if self.event_time.is_some() && run.output_mode != OutputMode::Complete {
            let range = times_up_to(None, watermark.eviction_ms.saturating_mul(1000));
            let expired = store.scan(&range).map_err(state_error)?;
            if !expired.is_empty() {
                let mut deletes = ValueChanges::new();
                for (k, _) in &expired {
                    deletes.remove(k.clone());
                }
                deletes.apply_to(store.as_mut()).map_err(state_error)?;
                if run.output_mode == OutputMode::Append {
                    output.push(self.lists_out(&expired)?);
                }
            }
            removed = expired.len() as u64;
        }
        let removals = removing.elapsed();
        Ok(Processed {
            output: concat_batches(&self.schema, &output)?,
            rows_updated: updated,
            rows_removed: removed,
            rows_dropped_by_watermark: dropped,
            rows_in_state: RowsInState::KeysOf(0),
            updates,
            removals,
        })
    }

    fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        describe(&self.partition_by, &self.order_by, self.n as u64, f)
    }
}

/// `TopNExec: partition_by=[...], order_by=[...], n=N`, planned or attached.
fn describe(
    partition_by: &[Arc<dyn PhysicalExpr>],
    order_by: &[PhysicalSortExpr],
    n: u64,
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    let p: Vec<String> = partition_by.iter().map(|e| e.to_string()).collect();
    let o: Vec<String> = order_by.iter().map(|s| s.to_string()).collect();
    write!(
        f,
        "TopNExec: partition_by=[{}], order_by=[{}], n={n}",
        p.join(", "),
        o.join(", ")
    )
}

/// How a top-N keeps its state: store `default` maps a key (arrow-row, led by the event time
/// when a watermark is on it) to its rows in rank order; `read_state` shows one row per stored
/// row, with its rank.
pub(crate) struct TopNFormat;

impl StateFormat for TopNFormat {
    fn readable(&self, store: &str) -> bool {
        store == STORE
    }

    fn read_entries(&self, key: &[u8], value: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
        let rank = RowConverter::new(vec![SortField::new(DataType::UInt64)]).ok()?;
        let list = decode_list(value)?;
        let ranks: ArrayRef = Arc::new(UInt64Array::from_iter_values(1..=list.len() as u64));
        let ranks = rank.convert_columns(&[ranks]).ok()?;
        Some(
            list.into_iter()
                .zip(ranks.iter())
                .map(|(r, rank)| {
                    // arrow-row encodes columns one after another: the row's, then the rank's.
                    let mut value = r.row;
                    value.extend_from_slice(rank.data());
                    (key.to_vec(), value)
                })
                .collect(),
        )
    }
}

impl DisplayAs for TopNExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        describe(&self.partition_by, &self.order_by, self.n, f)
    }
}

impl ExecutionPlan for TopNExec {
    fn name(&self) -> &str {
        "TopNExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        for e in self
            .partition_by
            .iter()
            .chain(self.order_by.iter().map(|s| &s.expr))
        {
            if f(e)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("top-N without input".into()))?;
        Ok(Arc::new(Self::try_new(
            input,
            self.partition_by.clone(),
            self.order_by.clone(),
            self.n,
            Arc::clone(&self.schema),
        )?))
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Err(DataFusionError::Internal(
            "a top-N runs only inside a streaming query's batch".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_lists_round_trip_and_damage_is_detected() {
        let list = vec![
            Ranked {
                order: vec![1, 2],
                row: vec![3],
            },
            Ranked {
                order: vec![],
                row: vec![4, 5, 6],
            },
        ];
        assert_eq!(decode_list(&encode_list(&list)), Some(list.clone()));
        let bytes = encode_list(&list);
        assert_eq!(decode_list(&bytes[..bytes.len() - 1]), None);
        assert_eq!(decode_list(&[]), Some(vec![]));
    }
}
