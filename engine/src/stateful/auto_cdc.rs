//! AUTO CDC as a stateful operator: a stream of change records in, each batch's changes to a
//! keyed target table out (the rules, rule by rule: `../shared/reference/auto-cdc.md`; the
//! logical node and its output actions: `weir_planner::auto_cdc`).
//!
//! ```text
//! input: source columns + __weir_cdc_sequence, __weir_cdc_delete, __weir_cdc_truncate
//!   └─ shuffle by the keys; a truncate goes to every partition
//! StatefulExec<AutoCdc>, partition p
//!   validate          a null sequence, or a null key on an upsert or delete, fails the batch
//!   SCD 1             truncate at T: every stored key below T is deleted, and T becomes the
//!                     partition's floor (a change below it is ignored, in any later batch)
//!                     per key, the batch's change with the highest sequence (an upsert beats a
//!                     delete at an equal sequence), against the stored one:
//!                       newer upsert  -> action 2 (upsert) ; stored: sequence, live
//!                       newer delete  -> action 1 (delete key) if the key was live ;
//!                                        stored: sequence, tombstone at now (indexed by time)
//!                       older         -> nothing (a tombstone keeps an older upsert out)
//!                     tombstones older than pipelines.cdc.tombstoneGCThresholdInSeconds go
//!   SCD 2             per key, every change stored in sequence order; the key's versions are
//!                     recomputed from them (runs of upserts with equal tracked columns are one
//!                     version; a delete ends the open one) and, when they differ from before,
//!                     output as action 1 (delete the key's rows) then action 0 per version
//! ```
//!
//! Sequence values are kept as their arrow-row encoding, which sorts as the values do, so any
//! orderable type (numbers, timestamps, strings, structs) can sequence the changes.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int8Array, RecordBatch, UInt32Array};
use arrow::compute::{concat, concat_batches, take};
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
use weir_planner::auto_cdc::{
    ACTION_DELETE_KEY, ACTION_INSERT, ACTION_TRUNCATE, ACTION_UPSERT, AutoCdcNode, DELETE,
    SEQUENCE, TRUNCATE,
};
use weir_state::table::{ValueChanges, after_time, time_key_with, times_up_to};
use weir_state::{KeyRange, StateStore};

use super::kind::{OperatorKind, Placement, StateFormat, decode_rows};
use super::operator::{Processed, RowsInState, ShuffleKey, StatefulExec, StatefulOperator, Step};
use super::{BatchState, OperatorInfo, state_error};

/// Each key's state.
const STORE: &str = "default";
/// SCD 1: the highest truncate sequence the partition has seen, under the empty key.
const TRUNCATED: &str = "truncated";
/// SCD 1: the tombstones by when they were recorded (wall-clock ms), for their expiry.
const TOMBSTONES: &str = "tombstones-by-time";

/// Which input columns mean what, and what the operator outputs.
#[derive(Debug, Clone)]
struct Columns {
    keys: Vec<usize>,
    /// The target's columns (keys included), in order.
    columns: Vec<usize>,
    /// SCD 2: the tracked columns.
    tracked: Vec<usize>,
    sequence: usize,
    delete: usize,
    truncate: usize,
    scd_type: u8,
    tombstone_ttl_ms: i64,
    input: SchemaRef,
    output: SchemaRef,
}

impl Columns {
    fn of(node: &AutoCdcNode, input: SchemaRef, output: SchemaRef) -> Result<Self> {
        let index = |names: &[String]| {
            names
                .iter()
                .map(|n| input.index_of(n))
                .collect::<std::result::Result<Vec<_>, _>>()
        };
        Ok(Self {
            keys: index(&node.keys)?,
            columns: index(&node.columns)?,
            tracked: index(&node.tracked)?,
            sequence: input.index_of(SEQUENCE)?,
            delete: input.index_of(DELETE)?,
            truncate: input.index_of(TRUNCATE)?,
            scd_type: node.scd_type,
            tombstone_ttl_ms: node.tombstone_ttl_ms,
            input,
            output,
        })
    }

    fn kind(&self) -> OperatorKind {
        if self.scd_type == 2 {
            OperatorKind::AutoCdcScd2
        } else {
            OperatorKind::AutoCdcScd1
        }
    }

    fn fields(&self, columns: &[usize]) -> Vec<SortField> {
        columns
            .iter()
            .map(|&c| SortField::new(self.input.field(c).data_type().clone()))
            .collect()
    }

    fn sequence_type(&self) -> &DataType {
        self.input.field(self.sequence).data_type()
    }

    /// The operator as the checkpoint records it.
    fn info(&self, id: u32, partitions: usize) -> OperatorInfo {
        let name = |c: &usize| self.input.field(*c).name().clone();
        let key_schema: Vec<Field> = self
            .keys
            .iter()
            .map(|&k| self.input.field(k).clone())
            .collect();
        let mut value_schema = vec![
            Field::new("sequence", self.sequence_type().clone(), true),
            Field::new("deleted", DataType::Boolean, false),
        ];
        if self.scd_type == 2 {
            value_schema.extend(
                self.columns
                    .iter()
                    .map(|&c| self.input.field(c).clone().with_nullable(true)),
            );
        } else {
            value_schema.push(Field::new("deleted_at_ms", DataType::Int64, true));
        }
        let mut fingerprint: Vec<String> = self
            .keys
            .iter()
            .map(|k| format!("key {}", name(k)))
            .collect();
        fingerprint.extend(self.columns.iter().map(|c| format!("column {}", name(c))));
        fingerprint.extend(self.tracked.iter().map(|c| format!("tracked {}", name(c))));
        OperatorInfo {
            operator_id: id,
            operator_name: self.kind().name().into(),
            num_partitions: partitions,
            store_names: if self.scd_type == 2 {
                vec![STORE.into()]
            } else {
                vec![STORE.into(), TRUNCATED.into(), TOMBSTONES.into()]
            },
            key_schema: Schema::new(key_schema),
            value_schema: Schema::new(value_schema),
            fingerprint,
            layout: None,
        }
    }
}

fn validation(class: &'static str, message: String) -> DataFusionError {
    DataFusionError::External(Box::new(weir_common::ClassifiedError::new(
        class, "22004", message,
    )))
}

/// Refuses a batch with a null sequence, or a null key on a change that is not a truncate
/// (R14, R15): nothing of it is applied.
fn validate(c: &Columns, batch: &RecordBatch, truncates: &BooleanArray) -> Result<()> {
    let sequence = batch.column(c.sequence);
    if sequence.null_count() > 0 {
        return Err(validation(
            "AUTOCDC_MICROBATCH_VALIDATION.NULL_SEQUENCE",
            format!(
                "{} change record(s) of this micro-batch have a null SEQUENCE BY value; AUTO CDC \
                 orders every change by it, so nothing of the batch was applied. Give every \
                 change a sequence value (filter or fill the nulls in the source) and restart.",
                sequence.null_count()
            ),
        ));
    }
    for &k in &c.keys {
        let key = batch.column(k);
        let nulls = (0..batch.num_rows())
            .filter(|&i| key.is_null(i) && !truncates.value(i))
            .count();
        if nulls > 0 {
            return Err(validation(
                "AUTOCDC_MICROBATCH_VALIDATION.NULL_KEY",
                format!(
                    "{nulls} upsert or delete record(s) of this micro-batch have a null key \
                     column '{}'; nothing of the batch was applied. Filter them out of the \
                     source, or give them a key, and restart.",
                    c.input.field(k).name()
                ),
            ));
        }
    }
    Ok(())
}

/// A boolean column with nulls read as false.
fn flags(array: &ArrayRef) -> BooleanArray {
    let b = array.as_boolean();
    (0..b.len())
        .map(|i| Some(b.is_valid(i) && b.value(i)))
        .collect()
}

/// The planned AUTO CDC: its input and columns, before a batch attaches it.
#[derive(Debug)]
pub(crate) struct AutoCdcExec {
    input: Arc<dyn ExecutionPlan>,
    node: AutoCdcNode,
    columns: Columns,
    properties: Arc<PlanProperties>,
}

impl AutoCdcExec {
    pub(crate) fn try_new(input: Arc<dyn ExecutionPlan>, node: &AutoCdcNode) -> Result<Self> {
        use datafusion::logical_expr::UserDefinedLogicalNodeCore;
        let output = Arc::new(node.schema().as_arrow().clone());
        let columns = Columns::of(node, input.schema(), Arc::clone(&output))?;
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(output),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            input,
            node: node.clone(),
            columns,
            properties,
        })
    }

    /// The operator as stateful operator `id` of `batch`.
    pub(crate) fn attach(
        &self,
        input: Arc<dyn ExecutionPlan>,
        id: u32,
        batch: Arc<BatchState>,
    ) -> Result<StatefulExec<AutoCdc>> {
        let columns = Columns::of(&self.node, input.schema(), Arc::clone(&self.columns.output))?;
        let info = columns.info(id, batch.run()?.partitions);
        Ok(StatefulExec::new(
            AutoCdc {
                input,
                columns,
                info,
            },
            batch,
        ))
    }
}

/// AUTO CDC in a batch.
pub(crate) struct AutoCdc {
    input: Arc<dyn ExecutionPlan>,
    columns: Columns,
    info: OperatorInfo,
}

/// What one partition's step did.
struct Stepped {
    output: RecordBatch,
    updated: u64,
    removed: u64,
}

/// Applies `batches` of changes (with the computed columns of [`AutoCdcNode`]) to an empty
/// state: the changes a once flow (an initial snapshot) makes to its target, as the stream's
/// first batch would.
pub fn apply_once(node: &AutoCdcNode, batches: Vec<RecordBatch>) -> crate::Result<RecordBatch> {
    use datafusion::logical_expr::UserDefinedLogicalNodeCore;
    use weir_state::{MemoryStateStoreProvider, StateStoreProvider, StoreId};
    let input = Arc::new(node.input.schema().as_arrow().clone());
    let output = Arc::new(node.schema().as_arrow().clone());
    let columns = Columns::of(node, input, output)?;
    let info = columns.info(0, 1);
    let provider = MemoryStateStoreProvider::with_retained_versions(1);
    let mut stores = info
        .store_names
        .iter()
        .map(|n| provider.open(&StoreId::new(0, 0, n.as_str()), 0))
        .collect::<weir_state::Result<Vec<_>>>()
        .map_err(|e| crate::Error::User(e.into()))?;
    let batch = concat_batches(&columns.input, &batches).map_err(DataFusionError::from)?;
    let stepped = step(&columns, batch, &mut stores, now_ms(), None)?;
    Ok(stepped.output)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// One partition's changes against its stores.
fn step(
    c: &Columns,
    batch: RecordBatch,
    stores: &mut [Box<dyn StateStore>],
    now_ms: i64,
    gc_from: Option<i64>,
) -> Result<Stepped> {
    let truncates = flags(batch.column(c.truncate));
    validate(c, &batch, &truncates)?;
    if c.scd_type == 2 {
        let [store] = stores else {
            return Err(DataFusionError::Internal(
                "SCD 2 AUTO CDC has one store".into(),
            ));
        };
        scd2(c, &batch, store.as_mut())
    } else {
        let [store, truncated, tombstones] = stores else {
            return Err(DataFusionError::Internal(
                "SCD 1 AUTO CDC has three stores".into(),
            ));
        };
        scd1(
            c,
            &batch,
            &truncates,
            Scd1Stores {
                keys: store.as_mut(),
                truncated: truncated.as_mut(),
                tombstones: tombstones.as_mut(),
            },
            now_ms,
            gc_from,
        )
    }
}

struct Scd1Stores<'a> {
    keys: &'a mut dyn StateStore,
    truncated: &'a mut dyn StateStore,
    tombstones: &'a mut dyn StateStore,
}

/// An SCD 1 key's state: its winning sequence (arrow-row), and when it was deleted, if it was.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Scd1State {
    sequence: Vec<u8>,
    deleted_at_ms: Option<i64>,
}

impl Scd1State {
    /// `[deleted: u8][deleted at ms: i64 BE][sequence...]`.
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(9 + self.sequence.len());
        v.push(u8::from(self.deleted_at_ms.is_some()));
        v.extend_from_slice(&self.deleted_at_ms.unwrap_or(0).to_be_bytes());
        v.extend_from_slice(&self.sequence);
        v
    }

    fn decode(v: &[u8]) -> Option<Self> {
        let deleted = *v.first()? != 0;
        let at = i64::from_be_bytes(v.get(1..9)?.try_into().ok()?);
        Some(Self {
            sequence: v.get(9..)?.to_vec(),
            deleted_at_ms: deleted.then_some(at),
        })
    }
}

fn damaged(what: &str) -> DataFusionError {
    DataFusionError::External(Box::new(weir_common::ClassifiedError::new(
        "STATE_STORE_CORRUPTED",
        "XX001",
        format!(
            "An AUTO CDC {what} in the state store cannot be read: the checkpoint's state is \
             damaged. Restore the checkpoint, or reset the flow (--reset-checkpoint) or fully \
             refresh its table."
        ),
    )))
}

/// Rows at `indices` of `batch`, as the target's columns then their sequence; `keys_only`:
/// every column but the keys and the sequence null.
fn target_rows(
    c: &Columns,
    batch: &RecordBatch,
    indices: &[u32],
    keys_only: bool,
) -> Result<Vec<ArrayRef>> {
    let ix = UInt32Array::from(indices.to_vec());
    c.columns
        .iter()
        .chain([&c.sequence])
        .map(|&col| {
            if keys_only && !c.keys.contains(&col) && col != c.sequence {
                Ok(arrow::array::new_null_array(
                    c.input.field(col).data_type(),
                    indices.len(),
                ))
            } else {
                Ok(take(batch.column(col).as_ref(), &ix, None)?)
            }
        })
        .collect()
}

/// The target's columns for `keys` (arrow-row encoded): the key columns decoded, every other
/// column null.
fn key_rows_only(c: &Columns, converter: &RowConverter, keys: &[Vec<u8>]) -> Result<Vec<ArrayRef>> {
    let parser = converter.parser();
    let decoded = converter.convert_rows(keys.iter().map(|k| parser.parse(k)))?;
    Ok(c.columns
        .iter()
        .map(|col| match c.keys.iter().position(|k| k == col) {
            Some(p) => Arc::clone(&decoded[p]),
            None => arrow::array::new_null_array(c.input.field(*col).data_type(), keys.len()),
        })
        .collect())
}

/// Stacks parts of the output (each the target's columns, maybe with more) under their actions.
fn output(c: &Columns, parts: Vec<(i8, Vec<ArrayRef>)>) -> Result<RecordBatch> {
    let schema = Arc::clone(&c.output);
    let parts: Vec<(i8, Vec<ArrayRef>)> = parts
        .into_iter()
        .filter(|(_, cols)| cols.first().is_some_and(|a| !a.is_empty()))
        .collect();
    if parts.is_empty() {
        return Ok(RecordBatch::new_empty(schema));
    }
    let mut columns: Vec<ArrayRef> = vec![Arc::new(Int8Array::from_iter_values(
        parts
            .iter()
            .flat_map(|(a, cols)| std::iter::repeat_n(*a, cols[0].len())),
    ))];
    for i in 0..schema.fields().len() - 1 {
        let arrays: Vec<&dyn Array> = parts.iter().map(|(_, cols)| cols[i].as_ref()).collect();
        let stacked = concat(&arrays)?;
        let wanted = schema.field(i + 1).data_type();
        columns.push(if stacked.data_type() == wanted {
            stacked
        } else {
            arrow::compute::cast(&stacked, wanted)?
        });
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}

fn scd1(
    c: &Columns,
    batch: &RecordBatch,
    truncates: &BooleanArray,
    stores: Scd1Stores<'_>,
    now_ms: i64,
    gc_from: Option<i64>,
) -> Result<Stepped> {
    let Scd1Stores {
        keys: store,
        truncated,
        tombstones,
    } = stores;
    let sequences = RowConverter::new(c.fields(&[c.sequence]))?
        .convert_columns(&[Arc::clone(batch.column(c.sequence))])?;
    let key_converter = RowConverter::new(c.fields(&c.keys))?;
    let key_columns: Vec<ArrayRef> = c
        .keys
        .iter()
        .map(|&k| Arc::clone(batch.column(k)))
        .collect();
    let key_rows = key_converter.convert_columns(&key_columns)?;
    let deletes = flags(batch.column(c.delete));

    let mut changes = ValueChanges::new();
    let mut index = ValueChanges::new();
    let mut removed = 0u64;
    // Truncates: the highest one of the batch against the partition's floor.
    let stored_floor = truncated
        .multi_get(&[b"".as_slice()])
        .map_err(state_error)?
        .pop()
        .flatten();
    let batch_truncate = (0..batch.num_rows())
        .filter(|&i| truncates.value(i))
        .map(|i| sequences.row(i).data())
        .max();
    let mut floor = stored_floor.clone();
    // Keys the truncate deleted: their key bytes (decoded below for the output).
    let mut truncated_keys: Vec<Vec<u8>> = vec![];
    let mut gone: HashSet<Vec<u8>> = HashSet::new();
    let mut raised = None;
    if let Some(t) = batch_truncate
        && floor.as_deref().is_none_or(|f| t > f)
    {
        floor = Some(t.to_vec());
        raised = Some(t.to_vec());
        let mut put = ValueChanges::new();
        put.put(vec![], t, stored_floor.is_some());
        put.apply_to(truncated).map_err(state_error)?;
        for (k, v) in store.scan(&KeyRange::all()).map_err(state_error)? {
            let s = Scd1State::decode(&v).ok_or_else(|| damaged("key's state"))?;
            if s.sequence.as_slice() < t {
                match s.deleted_at_ms {
                    None => truncated_keys.push(k.clone()),
                    Some(at) => index.remove(time_key_with(at, &k)),
                }
                changes.remove(k.clone());
                gone.insert(k);
                removed += 1;
            }
        }
    }
    // Each key's winning change in the batch.
    let mut winners: HashMap<&[u8], usize> = HashMap::new();
    let mut order: Vec<&[u8]> = vec![];
    for i in 0..batch.num_rows() {
        if truncates.value(i) {
            continue;
        }
        let key = key_rows.row(i).data();
        match winners.get_mut(key) {
            None => {
                winners.insert(key, i);
                order.push(key);
            }
            Some(best) => {
                let (s, b) = (sequences.row(i).data(), sequences.row(*best).data());
                // Higher sequence wins; at an equal one an upsert beats a delete, and of two
                // upserts the later arrival wins.
                if s > b || (s == b && (!deletes.value(i) || deletes.value(*best))) {
                    *best = i;
                }
            }
        }
    }
    let stored = store.multi_get(&order).map_err(state_error)?;
    let mut upserts: Vec<u32> = vec![];
    let mut deleted: Vec<u32> = vec![];
    let mut updated = 0u64;
    let mut written: HashSet<&[u8]> = HashSet::new();
    for (key, stored) in order.iter().zip(stored) {
        let i = winners[key];
        let sequence = sequences.row(i).data();
        if floor.as_deref().is_some_and(|f| sequence < f) {
            continue;
        }
        let stored = if gone.contains(*key) {
            None
        } else {
            stored
                .map(|v| Scd1State::decode(&v).ok_or_else(|| damaged("key's state")))
                .transpose()?
        };
        let is_delete = deletes.value(i);
        let newer = match &stored {
            None => true,
            Some(s) => {
                sequence > s.sequence.as_slice()
                    || (sequence == s.sequence.as_slice()
                        && !is_delete
                        && s.deleted_at_ms.is_some())
            }
        };
        if !newer {
            continue;
        }
        let existed = stored.is_some() && !gone.contains(*key);
        if let Some(at) = stored.as_ref().and_then(|s| s.deleted_at_ms) {
            index.remove(time_key_with(at, key));
        }
        let state = if is_delete {
            index.put(time_key_with(now_ms, key), vec![], false);
            // Also when this flow never saw the key live: another flow into the table may
            // have written it (the MERGE deletes it only if older).
            deleted.push(i as u32);
            Scd1State {
                sequence: sequence.to_vec(),
                deleted_at_ms: Some(now_ms),
            }
        } else {
            upserts.push(i as u32);
            Scd1State {
                sequence: sequence.to_vec(),
                deleted_at_ms: None,
            }
        };
        changes.put(key, state.encode(), existed);
        written.insert(*key);
        updated += 1;
    }
    // A key the truncate deleted and the batch upserts again is upserted: one row per key.
    let emitted: HashSet<&[u8]> = upserts
        .iter()
        .chain(&deleted)
        .map(|&i| key_rows.row(i as usize).data())
        .collect();
    truncated_keys.retain(|k| !emitted.contains(k.as_slice()));
    // Tombstones past their time go (as if never deleted: an older change may come back).
    let cutoff = now_ms.saturating_sub(c.tombstone_ttl_ms);
    let mut expired = 0u64;
    for (k, _) in tombstones
        .scan(&times_up_to(gc_from, cutoff))
        .map_err(state_error)?
    {
        let Some(key) = after_time(&k) else { continue };
        // A key written in this batch has a new state (its old index entry is removed above).
        if !gone.contains(key) && !written.contains(key) {
            changes.remove(key);
            expired += 1;
        }
        index.remove(k);
    }
    changes.apply_to(store).map_err(state_error)?;
    index.apply_to(tombstones).map_err(state_error)?;

    let mut parts = vec![
        (ACTION_UPSERT, target_rows(c, batch, &upserts, false)?),
        (ACTION_DELETE_KEY, target_rows(c, batch, &deleted, true)?),
    ];
    if let Some(t) = raised {
        // The truncate's sequence, as a column of `n` rows.
        let sequence_converter = RowConverter::new(c.fields(&[c.sequence]))?;
        let t = sequence_converter.convert_rows([sequence_converter.parser().parse(&t)])?;
        let repeat = |n: usize| take(t[0].as_ref(), &UInt32Array::from(vec![0u32; n]), None);
        if !truncated_keys.is_empty() {
            let mut cols = key_rows_only(c, &key_converter, &truncated_keys)?;
            cols.push(repeat(truncated_keys.len())?);
            parts.push((ACTION_DELETE_KEY, cols));
        }
        // The rows other flows wrote into the table below the truncate go too.
        let mut cols: Vec<ArrayRef> = c
            .columns
            .iter()
            .map(|col| arrow::array::new_null_array(c.input.field(*col).data_type(), 1))
            .collect();
        cols.push(repeat(1)?);
        parts.push((ACTION_TRUNCATE, cols));
    }
    Ok(Stepped {
        output: output(c, parts)?,
        updated,
        removed: removed + expired,
    })
}

/// One change of an SCD 2 key, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Change {
    sequence: Vec<u8>,
    deleted: bool,
    /// The tracked columns (arrow-row), compared null-safely by their bytes.
    tracked: Vec<u8>,
    /// The target's columns (arrow-row).
    row: Vec<u8>,
}

/// A version of an SCD 2 key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Version<'a> {
    start: &'a [u8],
    end: Option<&'a [u8]>,
    row: &'a [u8],
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn take_bytes<'a>(v: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = u32::from_le_bytes(v.get(..4)?.try_into().ok()?) as usize;
    let b = v.get(4..4 + len)?;
    *v = &v[4 + len..];
    Some(b)
}

/// `[sequence][deleted: u8][tracked][row]` per change, each byte string length-prefixed.
fn encode_changes(changes: &[Change]) -> Vec<u8> {
    let mut out = vec![];
    for ch in changes {
        put_bytes(&mut out, &ch.sequence);
        out.push(u8::from(ch.deleted));
        put_bytes(&mut out, &ch.tracked);
        put_bytes(&mut out, &ch.row);
    }
    out
}

fn decode_changes(mut v: &[u8]) -> Option<Vec<Change>> {
    let mut out = vec![];
    while !v.is_empty() {
        let sequence = take_bytes(&mut v)?.to_vec();
        let deleted = *v.first()? != 0;
        v = &v[1..];
        let tracked = take_bytes(&mut v)?.to_vec();
        let row = take_bytes(&mut v)?.to_vec();
        out.push(Change {
            sequence,
            deleted,
            tracked,
            row,
        });
    }
    Some(out)
}

/// Adds `new` to a key's changes (kept in sequence order): an identical change is already
/// there; at an equal sequence a delete wins over an upsert, and of two upserts the later.
fn add_change(changes: &mut Vec<Change>, new: Change) {
    match changes.binary_search_by(|c| c.sequence.cmp(&new.sequence)) {
        Ok(i) => {
            let old = &changes[i];
            if old == &new || (old.deleted && !new.deleted) {
                return;
            }
            changes[i] = new;
        }
        Err(i) => changes.insert(i, new),
    }
}

/// A key's versions from its changes in sequence order (R10-R13): consecutive upserts with
/// equal tracked columns are one version starting at the first and showing the last; the next
/// upsert with other tracked values or a delete ends it.
fn versions(changes: &[Change]) -> Vec<Version<'_>> {
    let mut out: Vec<Version<'_>> = vec![];
    let mut open: Option<(&Change, &Change)> = None; // (first, last) of the open run
    for ch in changes {
        if let Some((first, last)) = open {
            if !ch.deleted && ch.tracked == first.tracked {
                open = Some((first, ch));
                continue;
            }
            out.push(Version {
                start: &first.sequence,
                end: Some(&ch.sequence),
                row: &last.row,
            });
            open = None;
        }
        if !ch.deleted {
            open = Some((ch, ch));
        }
    }
    if let Some((first, last)) = open {
        out.push(Version {
            start: &first.sequence,
            end: None,
            row: &last.row,
        });
    }
    out
}

fn scd2(c: &Columns, batch: &RecordBatch, store: &mut dyn StateStore) -> Result<Stepped> {
    let column = |i: &usize| Arc::clone(batch.column(*i));
    let sequences =
        RowConverter::new(c.fields(&[c.sequence]))?.convert_columns(&[column(&c.sequence)])?;
    let key_converter = RowConverter::new(c.fields(&c.keys))?;
    let key_rows = key_converter.convert_columns(&c.keys.iter().map(column).collect::<Vec<_>>())?;
    let tracked: Rows = RowConverter::new(c.fields(&c.tracked))?
        .convert_columns(&c.tracked.iter().map(column).collect::<Vec<_>>())?;
    let row_converter = RowConverter::new(c.fields(&c.columns))?;
    let rows = row_converter.convert_columns(&c.columns.iter().map(column).collect::<Vec<_>>())?;
    let deletes = flags(batch.column(c.delete));

    let mut by_key: HashMap<&[u8], Vec<usize>> = HashMap::new();
    let mut order: Vec<&[u8]> = vec![];
    for i in 0..batch.num_rows() {
        let key = key_rows.row(i).data();
        by_key
            .entry(key)
            .or_insert_with(|| {
                order.push(key);
                vec![]
            })
            .push(i);
    }
    let stored = store.multi_get(&order).map_err(state_error)?;
    let mut changes_out = ValueChanges::new();
    let mut touched: Vec<Vec<u8>> = vec![];
    let mut version_rows: Vec<Vec<u8>> = vec![];
    let mut starts: Vec<Vec<u8>> = vec![];
    let mut ends: Vec<Option<Vec<u8>>> = vec![];
    let mut updated = 0u64;
    for (key, stored) in order.iter().zip(stored) {
        let existed = stored.is_some();
        let old = match stored {
            Some(v) => decode_changes(&v).ok_or_else(|| damaged("key's changes"))?,
            None => vec![],
        };
        let mut changes = old.clone();
        for &i in &by_key[key] {
            let deleted = deletes.value(i);
            add_change(
                &mut changes,
                Change {
                    sequence: sequences.row(i).data().to_vec(),
                    deleted,
                    tracked: if deleted {
                        vec![]
                    } else {
                        tracked.row(i).data().to_vec()
                    },
                    row: if deleted {
                        vec![]
                    } else {
                        rows.row(i).data().to_vec()
                    },
                },
            );
        }
        if changes == old {
            continue;
        }
        let (before, after) = (versions(&old), versions(&changes));
        if before != after {
            touched.push(key.to_vec());
            for v in &after {
                version_rows.push(v.row.to_vec());
                starts.push(v.start.to_vec());
                ends.push(v.end.map(<[u8]>::to_vec));
            }
        }
        changes_out.put(key, encode_changes(&changes), existed);
        updated += 1;
    }
    changes_out.apply_to(store).map_err(state_error)?;

    let mut parts = vec![];
    if !touched.is_empty() {
        let n = touched.len();
        let sequence_type = c.sequence_type();
        let mut cols = key_rows_only(c, &key_converter, &touched)?;
        cols.push(arrow::array::new_null_array(sequence_type, n));
        cols.push(arrow::array::new_null_array(sequence_type, n));
        parts.push((ACTION_DELETE_KEY, cols));
    }
    if !version_rows.is_empty() {
        let parser = row_converter.parser();
        let mut cols = row_converter.convert_rows(version_rows.iter().map(|r| parser.parse(r)))?;
        let seq = RowConverter::new(c.fields(&[c.sequence]))?;
        let sparser = seq.parser();
        cols.extend(seq.convert_rows(starts.iter().map(|s| sparser.parse(s)))?);
        // A current version's end is null: decode the ends that exist, then spread them.
        let closed: Vec<&Vec<u8>> = ends.iter().flatten().collect();
        let decoded = seq.convert_rows(closed.iter().map(|s| sparser.parse(s)))?;
        let mut at = 0u32;
        let ix: UInt32Array = ends
            .iter()
            .map(|e| {
                e.as_ref().map(|_| {
                    at += 1;
                    at - 1
                })
            })
            .collect();
        cols.push(take(decoded[0].as_ref(), &ix, None)?);
        parts.push((ACTION_INSERT, cols));
    }
    Ok(Stepped {
        output: output(c, parts)?,
        updated,
        removed: 0,
    })
}

impl StatefulOperator for AutoCdc {
    fn name(&self) -> &'static str {
        "AutoCdcExec"
    }

    fn info(&self) -> &OperatorInfo {
        &self.info
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.columns.output)
    }

    fn inputs(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn shuffle_key(&self, _input: usize) -> Result<ShuffleKey> {
        Ok(
            ShuffleKey::columns(&self.input.schema(), &self.columns.keys)
                .broadcasting(self.columns.truncate),
        )
    }

    fn process(&self, step_in: Step<'_>) -> Result<Processed> {
        let started = Instant::now();
        let Step {
            input, stores, run, ..
        } = step_in;
        let batch = concat_batches(
            &self.input.schema(),
            &input.into_iter().next().unwrap_or_default(),
        )?;
        let now = now_ms();
        let gc_from = match stores.get(2) {
            Some(index) if self.columns.scd_type == 1 => run.eviction_floor(
                index.id(),
                now.saturating_sub(self.columns.tombstone_ttl_ms),
            ),
            _ => None,
        };
        let stepped = step(&self.columns, batch, stores, now, gc_from)?;
        Ok(Processed {
            output: stepped.output,
            rows_updated: stepped.updated,
            rows_removed: stepped.removed,
            rows_dropped_by_watermark: 0,
            rows_in_state: RowsInState::KeysOf(0),
            updates: started.elapsed(),
            removals: std::time::Duration::ZERO,
        })
    }

    fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        describe(&self.columns, f)
    }
}

fn describe(c: &Columns, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let keys: Vec<&str> = c
        .keys
        .iter()
        .map(|&k| c.input.field(k).name().as_str())
        .collect();
    write!(
        f,
        "AutoCdcExec: {} keys=[{}]",
        c.kind().name(),
        keys.join(", ")
    )
}

/// How AUTO CDC keeps its state: `default` holds each key's state (SCD 1: its winning
/// sequence and whether it is a tombstone; SCD 2: every change); SCD 1's `truncated` holds the
/// partition's truncate floor, and `tombstones-by-time` indexes tombstones by when they were
/// recorded.
pub(crate) struct AutoCdcFormat {
    pub(crate) scd_type: u8,
}

impl StateFormat for AutoCdcFormat {
    fn readable(&self, store: &str) -> bool {
        store == STORE
    }

    fn placement(&self, store: &str) -> Placement {
        match store {
            TOMBSTONES => Placement::ByKeyAfterTime,
            TRUNCATED => Placement::EveryPartition,
            _ => Placement::ByKey,
        }
    }

    /// SCD 2: one row per stored change.
    fn read_entries(&self, key: &[u8], value: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
        if self.scd_type == 1 {
            return Some(vec![(key.to_vec(), value.to_vec())]);
        }
        Some(
            decode_changes(value)?
                .into_iter()
                .map(|ch| (key.to_vec(), encode_changes(&[ch])))
                .collect(),
        )
    }

    fn decode_values(
        &self,
        fields: &arrow::datatypes::Fields,
        values: &[&[u8]],
    ) -> Result<Vec<ArrayRef>> {
        let Some(sequence_field) = fields.first() else {
            return Ok(vec![]);
        };
        let seq = RowConverter::new(vec![SortField::new(sequence_field.data_type().clone())])?;
        let parser = seq.parser();
        let bad = || damaged("state value");
        if self.scd_type == 1 {
            let states = values
                .iter()
                .map(|v| Scd1State::decode(v).ok_or_else(bad))
                .collect::<Result<Vec<_>>>()?;
            let sequences = seq.convert_rows(states.iter().map(|s| parser.parse(&s.sequence)))?;
            let deleted: BooleanArray = states
                .iter()
                .map(|s| Some(s.deleted_at_ms.is_some()))
                .collect();
            let at: arrow::array::Int64Array = states.iter().map(|s| s.deleted_at_ms).collect();
            return Ok(vec![
                Arc::clone(&sequences[0]),
                Arc::new(deleted),
                Arc::new(at),
            ]);
        }
        let changes = values
            .iter()
            .map(|v| decode_changes(v).and_then(|mut c| c.pop()).ok_or_else(bad))
            .collect::<Result<Vec<_>>>()?;
        let sequences = seq.convert_rows(changes.iter().map(|c| parser.parse(&c.sequence)))?;
        let deleted: BooleanArray = changes.iter().map(|c| Some(c.deleted)).collect();
        let row_fields: arrow::datatypes::Fields = fields.iter().skip(2).cloned().collect();
        // A delete stores no row: its columns are null.
        let upserts: Vec<&[u8]> = changes
            .iter()
            .filter(|c| !c.deleted)
            .map(|c| c.row.as_slice())
            .collect();
        let decoded = decode_rows(&row_fields, &upserts)?;
        let mut at = 0u32;
        let ix: UInt32Array = changes
            .iter()
            .map(|c| {
                (!c.deleted).then(|| {
                    at += 1;
                    at - 1
                })
            })
            .collect();
        let mut out = vec![Arc::clone(&sequences[0]), Arc::new(deleted) as ArrayRef];
        for d in decoded {
            out.push(take(d.as_ref(), &ix, None)?);
        }
        Ok(out)
    }
}

impl DisplayAs for AutoCdcExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        describe(&self.columns, f)
    }
}

impl ExecutionPlan for AutoCdcExec {
    fn name(&self) -> &str {
        "AutoCdcExec"
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
            .ok_or_else(|| DataFusionError::Internal("AUTO CDC without input".into()))?;
        Ok(Arc::new(Self::try_new(input, &self.node)?))
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Err(DataFusionError::Internal(
            "AUTO CDC ran outside a streaming batch".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    //! The operator against a straightforward model of the rules (`auto-cdc.md`), over change
    //! streams with out-of-order, duplicate and late records, applied batch by batch to a
    //! simulated target as the Delta MERGE applies them.

    use std::collections::BTreeMap;

    use arrow::array::{Int64Array, StringArray};
    use datafusion::common::DFSchema;
    use datafusion::logical_expr::{EmptyRelation, LogicalPlan};
    use weir_planner::auto_cdc::{AutoCdcOptions, auto_cdc};
    use weir_planner::pipeline::ColumnSelection;
    use weir_state::{MemoryStateStoreProvider, StateStoreProvider, StoreId};

    use super::*;

    /// One change: key, value, untracked value, sequence, delete, truncate.
    #[derive(Debug, Clone, PartialEq)]
    struct Ev {
        k: Option<i64>,
        v: Option<String>,
        w: i64,
        seq: Option<i64>,
        delete: bool,
        truncate: bool,
    }

    fn up(k: i64, v: &str, w: i64, seq: i64) -> Ev {
        Ev {
            k: Some(k),
            v: Some(v.into()),
            w,
            seq: Some(seq),
            delete: false,
            truncate: false,
        }
    }

    fn del(k: i64, seq: i64) -> Ev {
        Ev {
            delete: true,
            ..up(k, "", 0, seq)
        }
    }

    fn truncate(seq: i64) -> Ev {
        Ev {
            k: None,
            truncate: true,
            ..up(0, "", 0, seq)
        }
    }

    fn input_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
            Field::new("w", DataType::Int64, true),
            Field::new(SEQUENCE, DataType::Int64, true),
            Field::new(DELETE, DataType::Boolean, true),
            Field::new(TRUNCATE, DataType::Boolean, true),
        ]))
    }

    fn batch(events: &[Ev]) -> RecordBatch {
        RecordBatch::try_new(
            input_schema(),
            vec![
                Arc::new(events.iter().map(|e| e.k).collect::<Int64Array>()),
                Arc::new(events.iter().map(|e| e.v.clone()).collect::<StringArray>()),
                Arc::new(events.iter().map(|e| Some(e.w)).collect::<Int64Array>()),
                Arc::new(events.iter().map(|e| e.seq).collect::<Int64Array>()),
                Arc::new(
                    events
                        .iter()
                        .map(|e| Some(e.delete))
                        .collect::<BooleanArray>(),
                ),
                Arc::new(
                    events
                        .iter()
                        .map(|e| Some(e.truncate))
                        .collect::<BooleanArray>(),
                ),
            ],
        )
        .unwrap()
    }

    fn columns(scd_type: u8, track: ColumnSelection, ttl_ms: i64) -> Columns {
        let schema = input_schema();
        let plan = LogicalPlan::EmptyRelation(EmptyRelation {
            produce_one_row: false,
            schema: Arc::new(DFSchema::try_from(schema.as_ref().clone()).unwrap()),
        });
        let plan = auto_cdc(
            plan,
            &AutoCdcOptions {
                keys: vec!["k".into()],
                columns: ColumnSelection::All,
                scd_type,
                track_history: track,
                truncates: scd_type == 1,
                tombstone_ttl_ms: ttl_ms,
            },
        )
        .unwrap();
        let node = AutoCdcNode::of(&plan).unwrap();
        use datafusion::logical_expr::UserDefinedLogicalNodeCore;
        Columns::of(node, schema, Arc::new(node.schema().as_arrow().clone())).unwrap()
    }

    /// A target row: v, w, and SCD 2's start and end.
    type Row = (Option<String>, Option<i64>, Option<i64>, Option<i64>);

    /// Runs `batches` through the operator (one partition, stores committed after each) and
    /// applies each output to a target as the MERGE does. `clock`: the wall time of each batch.
    struct Run {
        c: Columns,
        provider: MemoryStateStoreProvider,
        version: u64,
        target: BTreeMap<i64, Vec<Row>>,
    }

    impl Run {
        fn new(c: Columns) -> Self {
            Self {
                c,
                provider: MemoryStateStoreProvider::with_retained_versions(2),
                version: 0,
                target: BTreeMap::new(),
            }
        }

        fn batch_at(&mut self, events: &[Ev], now_ms: i64) -> Result<RecordBatch> {
            let names = self.c.info(0, 1).store_names;
            let mut stores: Vec<Box<dyn StateStore>> = names
                .iter()
                .map(|n| {
                    self.provider
                        .open(&StoreId::new(0, 0, n.as_str()), self.version)
                        .unwrap()
                })
                .collect();
            let out = step(&self.c, batch(events), &mut stores, now_ms, None)?;
            for s in &mut stores {
                s.commit().unwrap();
            }
            self.version += 1;
            self.apply(&out.output);
            Ok(out.output)
        }

        fn batch(&mut self, events: &[Ev]) -> RecordBatch {
            self.batch_at(events, 1_000).unwrap()
        }

        fn apply(&mut self, out: &RecordBatch) {
            let action = out.column(0).as_primitive::<arrow::datatypes::Int8Type>();
            let k = out.column(1).as_primitive::<arrow::datatypes::Int64Type>();
            let v = out.column(2).as_string::<i32>();
            let w = out.column(3).as_primitive::<arrow::datatypes::Int64Type>();
            let seq = |c: usize, i: usize| {
                out.columns().get(c).and_then(|a| {
                    let a = a.as_primitive::<arrow::datatypes::Int64Type>();
                    a.is_valid(i).then(|| a.value(i))
                })
            };
            let mut keys = HashSet::new();
            let scd1 = self.c.scd_type == 1;
            for i in 0..out.num_rows() {
                if action.value(i) == ACTION_TRUNCATE {
                    let t = seq(4, i).unwrap();
                    for rows in self.target.values_mut() {
                        rows.retain(|r| r.2.is_some_and(|s| s >= t));
                    }
                    self.target.retain(|_, rows| !rows.is_empty());
                    continue;
                }
                let key = k.value(i);
                assert!(
                    action.value(i) == ACTION_INSERT || keys.insert(key),
                    "two delete or upsert rows for key {key} in one batch: the MERGE would fail"
                );
                let row = (
                    v.is_valid(i).then(|| v.value(i).to_string()),
                    w.is_valid(i).then(|| w.value(i)),
                    seq(4, i),
                    if scd1 { None } else { seq(5, i) },
                );
                // As the MERGE: an SCD 1 row is replaced or deleted only by a newer change.
                let stored = self
                    .target
                    .get(&key)
                    .and_then(|r| r.first())
                    .and_then(|r| r.2);
                match action.value(i) {
                    ACTION_DELETE_KEY => {
                        if !scd1 || stored.is_none_or(|s| row.2.unwrap() > s) {
                            self.target.remove(&key);
                        }
                    }
                    ACTION_UPSERT => {
                        if stored.is_none_or(|s| row.2.unwrap() >= s) {
                            self.target.insert(key, vec![row]);
                        }
                    }
                    _ => self.target.entry(key).or_default().push(row),
                }
            }
            for rows in self.target.values_mut() {
                rows.sort_by_key(|r| r.2);
            }
        }
    }

    impl Run {
        /// The target as users see it (SCD 1: without each row's sequence).
        fn visible(&self) -> BTreeMap<i64, Vec<Row>> {
            let scd1 = self.c.scd_type == 1;
            self.target
                .iter()
                .map(|(k, rows)| {
                    let rows = rows
                        .iter()
                        .map(|r| (r.0.clone(), r.1, if scd1 { None } else { r.2 }, r.3))
                        .collect();
                    (*k, rows)
                })
                .collect()
        }
    }

    /// SCD 1's model: per key the highest-sequence change wins (an upsert over a delete at an
    /// equal sequence); it shows if it is an upsert at or above the highest truncate.
    fn scd1_model(events: &[Ev]) -> BTreeMap<i64, Vec<Row>> {
        let floor = events
            .iter()
            .filter(|e| e.truncate)
            .filter_map(|e| e.seq)
            .max();
        let mut best: BTreeMap<i64, &Ev> = BTreeMap::new();
        for e in events.iter().filter(|e| !e.truncate) {
            let k = e.k.unwrap();
            let better = best
                .get(&k)
                .is_none_or(|b| e.seq > b.seq || (e.seq == b.seq && b.delete && !e.delete));
            if better {
                best.insert(k, e);
            }
        }
        best.into_iter()
            .filter(|(_, e)| !e.delete && floor.is_none_or(|f| e.seq.unwrap() >= f))
            .map(|(k, e)| (k, vec![(e.v.clone(), Some(e.w), None, None)]))
            .collect()
    }

    /// SCD 2's model: per key its changes in sequence order (a delete wins at an equal
    /// sequence); runs of upserts with equal tracked values are one version showing the last.
    fn scd2_model(events: &[Ev], tracks_w: bool) -> BTreeMap<i64, Vec<Row>> {
        let mut by_key: BTreeMap<i64, BTreeMap<i64, &Ev>> = BTreeMap::new();
        for e in events {
            let changes = by_key.entry(e.k.unwrap()).or_default();
            let s = e.seq.unwrap();
            match changes.get(&s) {
                Some(old) if old.delete => {}
                _ => {
                    changes.insert(s, e);
                }
            }
        }
        let mut out = BTreeMap::new();
        for (k, changes) in by_key {
            let mut rows: Vec<Row> = vec![];
            let mut open: Option<(i64, &Ev, &Ev)> = None;
            let tracked = |e: &Ev| (e.v.clone(), if tracks_w { Some(e.w) } else { None });
            for (&s, e) in &changes {
                if let Some((start, first, last)) = open {
                    if !e.delete && tracked(e) == tracked(first) {
                        open = Some((start, first, e));
                        continue;
                    }
                    rows.push((last.v.clone(), Some(last.w), Some(start), Some(s)));
                    open = None;
                }
                if !e.delete {
                    open = Some((s, e, e));
                }
            }
            if let Some((start, _, last)) = open {
                rows.push((last.v.clone(), Some(last.w), Some(start), None));
            }
            if !rows.is_empty() {
                out.insert(k, rows);
            }
        }
        out
    }

    /// A tiny deterministic generator (xorshift).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// A random change stream: keys 0..keys, each change a unique sequence per key (except
    /// exact re-sends), about 10 % deletes, shuffled so that many arrive out of order, some
    /// sent twice, cut into batches of random size.
    fn changes(rng: &mut Rng, keys: i64, n: usize, truncates: bool) -> Vec<Vec<Ev>> {
        let mut events = vec![];
        let mut next_seq: BTreeMap<i64, i64> = BTreeMap::new();
        for _ in 0..n {
            let k = rng.next(keys as u64) as i64;
            let seq = next_seq.entry(k).or_insert(1);
            // Sequences skip, so later changes can land between earlier ones.
            *seq += 1 + rng.next(3) as i64;
            let e = match rng.next(20) {
                0 | 1 => del(k, *seq),
                2 if truncates => truncate(*seq),
                _ => up(
                    k,
                    ["a", "b", "c"][rng.next(3) as usize],
                    rng.next(3) as i64,
                    *seq,
                ),
            };
            events.push(e);
        }
        // Out of order: swap about a third of neighbours-within-ten.
        for i in 0..events.len() {
            if rng.next(3) == 0 {
                let j = (i + 1 + rng.next(10) as usize).min(events.len() - 1);
                events.swap(i, j);
            }
        }
        let mut resent = vec![];
        for e in &events {
            resent.push(e.clone());
            if rng.next(10) == 0 {
                resent.push(e.clone());
            }
        }
        let mut batches = vec![];
        let mut rest = resent.as_slice();
        while !rest.is_empty() {
            let n = (1 + rng.next(12) as usize).min(rest.len());
            batches.push(rest[..n].to_vec());
            rest = &rest[n..];
        }
        batches
    }

    #[test]
    fn scd1_follows_the_model_over_random_change_streams() {
        for seed in 1..=40u64 {
            let mut rng = Rng(seed * 7919);
            let batches = changes(&mut rng, 8, 120, seed % 2 == 0);
            let mut run = Run::new(columns(1, ColumnSelection::All, i64::MAX / 2));
            for b in &batches {
                run.batch(b);
            }
            let all: Vec<Ev> = batches.concat();
            assert_eq!(run.visible(), scd1_model(&all), "seed {seed}");
        }
    }

    #[test]
    fn scd2_follows_the_model_over_random_change_streams() {
        for seed in 1..=40u64 {
            let mut rng = Rng(seed * 104_729);
            let batches = changes(&mut rng, 6, 100, false);
            let track = if seed % 2 == 0 {
                ColumnSelection::All
            } else {
                ColumnSelection::AllExcept(vec!["w".into()])
            };
            let mut run = Run::new(columns(2, track, i64::MAX / 2));
            for b in &batches {
                run.batch(b);
            }
            let all: Vec<Ev> = batches.concat();
            assert_eq!(run.target, scd2_model(&all, seed % 2 == 0), "seed {seed}");
        }
    }

    /// Databricks' SCD 1 example (the docs' input, one batch): out-of-order 125 keeps
    /// Guadalajara (seq 6 over 5), 123 is deleted at 6, and the truncate at 3 (the last row,
    /// with a null key) removes 124 and 126.
    #[test]
    fn scd1_docs_example() {
        let mut run = Run::new(columns(1, ColumnSelection::All, i64::MAX / 2));
        run.batch(&[
            up(124, "Raul Oaxaca", 0, 1),
            up(123, "Isabel Monterrey", 0, 1),
            up(125, "Mercedes Tijuana", 0, 2),
            up(126, "Lily Cancun", 0, 2),
            del(123, 6),
            up(125, "Mercedes Guadalajara", 0, 6),
            up(125, "Mercedes Mexicali", 0, 5),
            up(123, "Isabel Chihuahua", 0, 5),
            truncate(3),
        ]);
        let names: Vec<(i64, String)> = run
            .target
            .iter()
            .map(|(k, rows)| (*k, rows[0].0.clone().unwrap()))
            .collect();
        assert_eq!(names, vec![(125, "Mercedes Guadalajara".to_string())]);
    }

    #[test]
    fn scd1_tombstones_keep_older_changes_out_across_batches_until_they_expire() {
        let day = 24 * 3600 * 1000;
        let mut run = Run::new(columns(1, ColumnSelection::All, day));
        run.batch_at(&[up(1, "a", 0, 1)], 0).unwrap();
        run.batch_at(&[del(1, 5)], 0).unwrap();
        assert!(run.target.is_empty());
        // An older upsert arriving later is suppressed by the tombstone (R8) ...
        run.batch_at(&[up(1, "late", 0, 4)], day / 2).unwrap();
        assert!(run.target.is_empty());
        // ... a delete of an unknown key still records one ...
        run.batch_at(&[del(2, 9)], day / 2).unwrap();
        run.batch_at(&[up(2, "older", 0, 8)], day / 2).unwrap();
        assert!(run.target.is_empty());
        // ... a newer upsert revives the key ...
        run.batch_at(&[up(1, "new", 0, 6)], day / 2).unwrap();
        assert_eq!(run.target[&1][0].0.as_deref(), Some("new"));
        // ... and once a tombstone is older than the threshold it is gone (key 2's, recorded
        // at day/2; it is swept by the next batch after day/2 + day).
        run.batch_at(&[], 2 * day).unwrap();
        run.batch_at(&[up(2, "after expiry", 0, 3)], 2 * day)
            .unwrap();
        assert_eq!(run.target[&2][0].0.as_deref(), Some("after expiry"));
    }

    #[test]
    fn scd1_truncate_is_a_floor_for_later_batches() {
        let mut run = Run::new(columns(1, ColumnSelection::All, i64::MAX / 2));
        run.batch(&[up(1, "a", 0, 1), up(2, "b", 0, 7)]);
        run.batch(&[truncate(5)]);
        assert_eq!(run.target.keys().copied().collect::<Vec<_>>(), vec![2]);
        // Below the truncate: ignored, in any later batch; at or above: applied.
        run.batch(&[up(1, "below", 0, 4), up(3, "at", 0, 5)]);
        assert_eq!(run.target.keys().copied().collect::<Vec<_>>(), vec![2, 3]);
        // A truncate and an upsert above it of a truncated key in one batch: one row.
        run.batch(&[up(1, "x", 0, 9), truncate(8)]);
        assert_eq!(run.target.keys().copied().collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn a_batch_with_a_null_sequence_or_key_fails_and_changes_nothing() {
        let mut run = Run::new(columns(1, ColumnSelection::All, i64::MAX / 2));
        run.batch(&[up(1, "a", 0, 1)]);
        let null_seq = Ev {
            seq: None,
            ..up(2, "b", 0, 1)
        };
        let e = run.batch_at(&[up(1, "z", 0, 9), null_seq], 0).unwrap_err();
        assert!(
            e.to_string()
                .contains("AUTOCDC_MICROBATCH_VALIDATION.NULL_SEQUENCE"),
            "{e}"
        );
        let null_key = Ev {
            k: None,
            ..up(0, "b", 0, 3)
        };
        let e = run.batch_at(&[null_key], 0).unwrap_err();
        assert!(
            e.to_string()
                .contains("AUTOCDC_MICROBATCH_VALIDATION.NULL_KEY"),
            "{e}"
        );
        assert_eq!(run.target[&1][0].0.as_deref(), Some("a"));
    }

    /// Databricks' SCD 2 example with TRACK HISTORY ON * EXCEPT (city): a change of the
    /// untracked column updates the current version in place; a late change is put into
    /// history; a delete closes the version.
    #[test]
    fn scd2_untracked_changes_update_in_place_and_late_ones_go_into_history() {
        let mut run = Run::new(columns(2, ColumnSelection::AllExcept(vec!["w".into()]), 0));
        run.batch(&[up(1, "Isabel", 1, 1), up(2, "Mercedes", 1, 2)]);
        run.batch(&[up(2, "Mercedes", 2, 6), del(1, 6)]);
        assert_eq!(
            run.target[&1],
            vec![(Some("Isabel".into()), Some(1), Some(1), Some(6))]
        );
        assert_eq!(
            run.target[&2],
            vec![(Some("Mercedes".into()), Some(2), Some(2), None)]
        );
        // A late tracked change (seq 4) splits the version; a late upsert older than the
        // delete of key 1 becomes a closed version ending at the delete (R11).
        run.batch(&[up(2, "Merc", 3, 4), up(1, "Old", 0, 3)]);
        assert_eq!(
            run.target[&2],
            vec![
                (Some("Mercedes".into()), Some(1), Some(2), Some(4)),
                (Some("Merc".into()), Some(3), Some(4), Some(6)),
                (Some("Mercedes".into()), Some(2), Some(6), None),
            ]
        );
        assert_eq!(
            run.target[&1],
            vec![
                (Some("Isabel".into()), Some(1), Some(1), Some(3)),
                (Some("Old".into()), Some(0), Some(3), Some(6)),
            ]
        );
        // Re-sending a change already applied outputs nothing.
        let out = run.batch(&[up(2, "Merc", 3, 4)]);
        assert_eq!(out.num_rows(), 0);
    }

    #[test]
    fn read_state_decodes_both_layouts() {
        let c1 = columns(1, ColumnSelection::All, i64::MAX / 2);
        let info = c1.info(0, 1);
        let state = Scd1State {
            sequence: RowConverter::new(c1.fields(&[c1.sequence]))
                .unwrap()
                .convert_columns(&[Arc::new(Int64Array::from(vec![42]))])
                .unwrap()
                .row(0)
                .data()
                .to_vec(),
            deleted_at_ms: Some(7),
        };
        let f = AutoCdcFormat { scd_type: 1 };
        let cols = f
            .decode_values(info.value_schema.fields(), &[&state.encode()])
            .unwrap();
        assert_eq!(
            cols[0]
                .as_primitive::<arrow::datatypes::Int64Type>()
                .value(0),
            42
        );
        assert!(cols[1].as_boolean().value(0));
        assert_eq!(
            cols[2]
                .as_primitive::<arrow::datatypes::Int64Type>()
                .value(0),
            7
        );
    }
}
