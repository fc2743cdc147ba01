//! Session-window aggregation (Spark's `session_window`): per group, the rows' sessions
//! `[time, time + gap)` merge while they overlap or touch, and each merged session is one output
//! row, final when the watermark passes its end.
//!
//! ```text
//! AggregateExec(Partial)                 DataFusion's: group keys + each row's own session
//!                                        (`__session_window`) + accumulator state
//!   └─ shuffle                           by the group keys without the session
//! StatefulExec<SessionWindowAggregate>, partition p (see `operator.rs` for the shell)
//!                                        multi_get the batch's keys' sessions ("sessions")
//!                                        sort stored and new sessions by start, merge those
//!                                        that overlap or touch (start <= end so far), merge
//!                                        their accumulator state (GroupsAccumulator)
//!                                        evict sessions whose end the watermark passed, found
//!                                        through the index "sessions-by-end" (append: emit
//!                                        them); complete: emit every session
//!                                        one ValueChanges per store → commit N+1
//! ```
//!
//! "sessions" maps a group key (arrow-row) to its sessions, in start order:
//! `[start i64][end i64][length u32][state row]...` (state as arrow-row of the accumulators'
//! state columns). "sessions-by-end" has one empty-valued entry per session, keyed by its end
//! (µs, as arrow-row, so eviction is a range scan) then the group key. Update mode is refused
//! at start, as in Spark: a later row can merge sessions already emitted.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{
    Array, ArrayRef, RecordBatch, StructArray, TimestampMicrosecondArray, UInt32Array,
};
use arrow::compute::{concat, take_record_batch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::EmitTo;
use datafusion::physical_expr::ScalarFunctionExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{ExecutionPlan, PhysicalExpr};
use weir_planner::session_window::SESSION_WINDOW_COLUMN;
use weir_sinks::OutputMode;
use weir_state::table::{ValueChanges, after_time, time_key_with, times_up_to};
use weir_state::{KeyRange, StateStore};

use super::aggregate::{Aggregates, partial_of, without_positions};
use super::kind::{OperatorKind, Placement, StateFormat, decode_rows, sort_fields};
use super::operator::{Processed, RowsInState, ShuffleKey, StatefulOperator, Step};
use super::watermark::event_micros;
use super::{BatchWatermark, OperatorInfo, StateRun, state_error, watermark_columns};

const SESSIONS: &str = "sessions";
const BY_END: &str = "sessions-by-end";

/// The position of the session key among `agg`'s partial aggregate's group columns, when `agg`
/// is a session-window aggregation.
pub(crate) fn session_key(agg: &AggregateExec) -> Result<Option<usize>> {
    let partial = partial_of(agg)?;
    let Some(partial) = partial.downcast_ref::<AggregateExec>() else {
        return Ok(None);
    };
    Ok(partial
        .group_expr()
        .expr()
        .iter()
        .position(|(e, _)| is_session_column(e)))
}

fn is_session_column(e: &Arc<dyn PhysicalExpr>) -> bool {
    e.downcast_ref::<Column>()
        .is_some_and(|c| c.name() == SESSION_WINDOW_COLUMN)
}

/// The per-row session call below `plan` (the projection that computes
/// [`SESSION_WINDOW_COLUMN`]).
fn session_call(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn PhysicalExpr>> {
    if let Some(p) = plan.downcast_ref::<ProjectionExec>()
        && let Some(e) = p.expr().iter().find(|e| e.alias == SESSION_WINDOW_COLUMN)
    {
        return Some(Arc::clone(&e.expr));
    }
    plan.children().into_iter().find_map(session_call)
}

/// A stored session.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    pub(crate) start: i64,
    pub(crate) end: i64,
    /// The accumulators' state, as an arrow row of the value schema's columns after the two
    /// session bounds.
    pub(crate) state: Vec<u8>,
}

/// A group key's sessions as the "sessions" store keeps them; `None` if damaged.
fn decode_sessions(v: &[u8]) -> Option<Vec<Session>> {
    let mut rest = v;
    let mut out = vec![];
    while !rest.is_empty() {
        let (start, r) = rest.split_at_checked(8)?;
        let (end, r) = r.split_at_checked(8)?;
        let (len, r) = r.split_at_checked(4)?;
        let len = u32::from_be_bytes(len.try_into().ok()?) as usize;
        let (state, r) = r.split_at_checked(len)?;
        out.push(Session {
            start: i64::from_be_bytes(start.try_into().ok()?),
            end: i64::from_be_bytes(end.try_into().ok()?),
            state: state.to_vec(),
        });
        rest = r;
    }
    Some(out)
}

fn encode_sessions(sessions: &[Session]) -> Vec<u8> {
    let mut v = Vec::with_capacity(sessions.iter().map(|s| 20 + s.state.len()).sum());
    for s in sessions {
        v.extend(s.start.to_be_bytes());
        v.extend(s.end.to_be_bytes());
        v.extend((s.state.len() as u32).to_be_bytes());
        v.extend(&s.state);
    }
    v
}

fn corrupt(store: &str) -> DataFusionError {
    DataFusionError::External(Box::new(weir_common::ClassifiedError::new(
        "STATE_STORE_FILE_CORRUPT",
        "XX001",
        format!("A value in the session-window aggregation's {store} state store is damaged."),
    )))
}

/// One group key's sessions as read at the start of the batch, and as they are now.
struct KeySessions {
    existed: bool,
    /// The ends of the stored sessions: their index entries.
    stored_ends: Vec<i64>,
    sessions: Vec<Session>,
}

/// A session-window aggregation: DataFusion's final aggregate over session windows, with each
/// group's sessions kept across batches.
pub(crate) struct SessionWindowAggregate {
    /// DataFusion's partial aggregate of the batch: group columns (one of them each row's
    /// session), then each aggregate's state.
    partial: Arc<dyn ExecutionPlan>,
    num_group: usize,
    /// The session column's position among the group columns.
    session: usize,
    aggregates: Aggregates,
    /// The session's time column has a watermark: late rows are dropped and, in append mode,
    /// sessions the watermark passed are emitted and evicted.
    watermarked: bool,
    /// The group columns without the session.
    key_fields: Vec<SortField>,
    value_fields: Vec<SortField>,
    schema: SchemaRef,
    info: OperatorInfo,
}

impl SessionWindowAggregate {
    /// Replaces DataFusion's aggregate `agg`, grouped by a session window at `session` among
    /// its group columns, as stateful operator `id` over `partitions` shuffle partitions.
    pub(crate) fn try_new(
        agg: &AggregateExec,
        session: usize,
        id: u32,
        partitions: usize,
    ) -> Result<Self> {
        let partial = partial_of(agg)?;
        let Some(partial_agg) = partial.downcast_ref::<AggregateExec>() else {
            return Err(DataFusionError::Internal(
                "partial is not an aggregate".into(),
            ));
        };
        let num_group = partial_agg.group_expr().expr().len();
        let partial_schema = partial.schema();
        let call = session_call(&partial).ok_or_else(|| {
            DataFusionError::Internal("a session window without its per-row session".into())
        })?;
        let time_column = call
            .downcast_ref::<ScalarFunctionExpr>()
            .and_then(|f| f.args().first().cloned())
            .and_then(|a| a.downcast_ref::<Column>().map(|c| c.name().to_string()));
        let watermarked = time_column.is_some_and(|t| {
            watermark_columns(&partial)
                .iter()
                .any(|(w, _)| w == t.as_str())
        });
        let key_schema = Schema::new(
            partial_schema.fields()[..num_group]
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != session)
                .map(|(_, f)| Arc::clone(f))
                .collect::<Vec<_>>(),
        );
        let state_fields = partial_schema.fields()[num_group..].to_vec();
        let aggregates = Aggregates::new(partial_agg, state_fields.len())?;
        let mut value_fields = vec![
            Arc::new(Field::new("session_start_us", DataType::Int64, false)),
            Arc::new(Field::new("session_end_us", DataType::Int64, false)),
        ];
        value_fields.extend(state_fields.iter().cloned());
        let mut fingerprint: Vec<String> = partial_agg
            .group_expr()
            .expr()
            .iter()
            .map(|(e, _)| {
                let e = if is_session_column(e) { &call } else { e };
                format!("group by {}", without_positions(&e.to_string()))
            })
            .collect();
        fingerprint.extend(aggregates.fingerprint().iter().cloned());
        let info = OperatorInfo {
            operator_id: id,
            operator_name: OperatorKind::SessionWindowAggregate.name().into(),
            num_partitions: partitions,
            store_names: vec![SESSIONS.into(), BY_END.into()],
            key_schema: key_schema.clone(),
            value_schema: Schema::new(value_fields),
            fingerprint,
            layout: None,
        };
        Ok(Self {
            partial,
            num_group,
            session,
            aggregates,
            watermarked,
            key_fields: sort_fields(&key_schema),
            value_fields: sort_fields(&Schema::new(state_fields)),
            schema: agg.schema(),
            info,
        })
    }
}

/// The index key of a session of `key` ending at `end`.
fn index_key(end: i64, key: &[u8]) -> Result<Vec<u8>> {
    Ok(time_key_with(end, key))
}

impl SessionWindowAggregate {
    /// The group columns without the session.
    fn key_columns<'a>(&self, batch: &'a RecordBatch) -> Vec<&'a ArrayRef> {
        batch.columns()[..self.num_group]
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.session)
            .map(|(_, c)| c)
            .collect()
    }

    /// The output rows of `sessions`: (group key, start, end, state row).
    fn evaluate(&self, sessions: &[(&[u8], &Session)]) -> Result<RecordBatch> {
        if sessions.is_empty() {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
        let n = sessions.len();
        let values = RowConverter::new(self.value_fields.clone())?;
        let parser = values.parser();
        let state = values.convert_rows(sessions.iter().map(|(_, s)| parser.parse(&s.state)))?;
        let mut accs = self.aggregates.accumulators()?;
        let groups: Vec<usize> = (0..n).collect();
        self.aggregates.merge(&mut accs, &state, &groups, n)?;
        let mut keys = if self.key_fields.is_empty() {
            vec![]
        } else {
            let converter = RowConverter::new(self.key_fields.clone())?;
            let parser = converter.parser();
            converter.convert_rows(sessions.iter().map(|(k, _)| parser.parse(k)))?
        };
        let session_type = self.schema.field(self.session).data_type().clone();
        let DataType::Struct(fields) = &session_type else {
            return Err(DataFusionError::Internal(
                "a session window is not a struct".into(),
            ));
        };
        let tz = match fields.first().map(|f| f.data_type()) {
            Some(DataType::Timestamp(_, tz)) => tz.clone(),
            _ => None,
        };
        let starts =
            TimestampMicrosecondArray::from_iter_values(sessions.iter().map(|(_, s)| s.start))
                .with_timezone_opt(tz.clone());
        let ends = TimestampMicrosecondArray::from_iter_values(sessions.iter().map(|(_, s)| s.end))
            .with_timezone_opt(tz);
        let window = StructArray::try_new(
            fields.clone(),
            vec![Arc::new(starts) as ArrayRef, Arc::new(ends)],
            None,
        )?;
        keys.insert(self.session, Arc::new(window));
        for acc in &mut accs {
            keys.push(acc.evaluate(EmitTo::All)?);
        }
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), keys)?)
    }

    /// Reads the stored sessions of `keys` not read yet into `by_key`.
    fn load(
        &self,
        store: &dyn StateStore,
        keys: Vec<Vec<u8>>,
        by_key: &mut HashMap<Vec<u8>, KeySessions>,
    ) -> Result<()> {
        let missing: Vec<Vec<u8>> = keys
            .into_iter()
            .filter(|k| !by_key.contains_key(k))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let refs: Vec<&[u8]> = missing.iter().map(Vec::as_slice).collect();
        let values = store.multi_get(&refs).map_err(state_error)?;
        for (k, v) in missing.into_iter().zip(values) {
            let sessions = match v {
                Some(v) => decode_sessions(&v).ok_or_else(|| corrupt(SESSIONS))?,
                None => vec![],
            };
            by_key.insert(
                k,
                KeySessions {
                    existed: !sessions.is_empty(),
                    stored_ends: sessions.iter().map(|s| s.end).collect(),
                    sessions,
                },
            );
        }
        Ok(())
    }

    /// Merges a partition's partial rows into its stored sessions, evicts and emits by output
    /// mode, and writes the new state to both stores.
    fn merge(&self, step: Step<'_>) -> Result<Processed> {
        let started = Instant::now();
        let Step {
            input,
            stores,
            run,
            watermark,
            ..
        } = step;
        let [store, index] = stores else {
            return Err(DataFusionError::Internal(
                "a session-window aggregation has two stores".into(),
            ));
        };
        let input = input.into_iter().next().unwrap_or_default();
        let new = self.new_rows(&input, watermark)?;
        let dropped = new.dropped;
        let mut by_key: HashMap<Vec<u8>, KeySessions> = HashMap::new();
        let updated = self.merge_sessions(store.as_ref(), new, &mut by_key)?;
        let updates = started.elapsed();

        let removing = Instant::now();
        let evicted = self.evict(store.as_ref(), index.as_ref(), run, watermark, &mut by_key)?;
        let removed = evicted.len() as u64;
        self.write(store.as_mut(), index.as_mut(), &by_key)?;
        let removals = removing.elapsed();

        let output = self.emit(store.as_ref(), run.output_mode, &evicted)?;
        Ok(Processed {
            output,
            rows_updated: updated,
            rows_removed: removed,
            rows_dropped_by_watermark: dropped,
            // Sessions in state: one index entry each.
            rows_in_state: RowsInState::KeysOf(1),
            updates,
            removals,
        })
    }

    /// The batch's rows, each with its own session; rows without a session are in none, rows
    /// whose session ended at or behind the previous watermark are late (dropped, counted).
    fn new_rows(&self, input: &[RecordBatch], watermark: BatchWatermark) -> Result<NewRows> {
        // This batch's rows, each with its own session; rows without a session are in none,
        // rows whose session ended at or behind the previous watermark are late.
        let keys_conv = RowConverter::new(self.key_fields.clone())?;
        let late_us = watermark.late_ms.saturating_mul(1000);
        let mut dropped = 0u64;
        let mut rows: Vec<(Vec<u8>, i64, i64)> = vec![];
        let mut row_state: Vec<Vec<ArrayRef>> = vec![];
        for batch in input {
            let session = batch
                .column(self.session)
                .as_any()
                .downcast_ref::<StructArray>()
                .ok_or_else(|| DataFusionError::Internal("a session is not a struct".into()))?;
            let starts = event_micros(session.column(0).as_ref())?;
            let ends = event_micros(session.column(1).as_ref())?;
            let mut keep = vec![];
            for i in 0..batch.num_rows() {
                if session.is_null(i) || starts.is_null(i) || ends.is_null(i) {
                    continue;
                }
                if self.watermarked && ends.value(i) <= late_us {
                    dropped += 1;
                    continue;
                }
                keep.push(i as u32);
            }
            if keep.is_empty() {
                continue;
            }
            let kept = take_record_batch(batch, &UInt32Array::from(keep.clone()))?;
            let keys = if self.key_fields.is_empty() {
                None
            } else {
                let columns: Vec<ArrayRef> = self.key_columns(&kept).into_iter().cloned().collect();
                Some(keys_conv.convert_columns(&columns)?)
            };
            for (j, &i) in keep.iter().enumerate() {
                let key = keys.as_ref().map_or(vec![], |k| k.row(j).as_ref().to_vec());
                rows.push((key, starts.value(i as usize), ends.value(i as usize)));
            }
            row_state.push(kept.columns()[self.num_group..].to_vec());
        }

        Ok(NewRows {
            rows,
            state: row_state,
            dropped,
        })
    }

    /// Reads the stored sessions of the new rows' keys into `by_key` and merges the new rows
    /// into them; returns how many sessions the merge gave.
    fn merge_sessions(
        &self,
        store: &dyn StateStore,
        new: NewRows,
        by_key: &mut HashMap<Vec<u8>, KeySessions>,
    ) -> Result<u64> {
        // The stored sessions of these keys, and the merge: per key, stored and new sessions
        // by start; one that starts at or before the merged end so far joins it (Spark's
        // MergingSessionsIterator rule).
        let NewRows {
            rows,
            state: row_state,
            ..
        } = new;
        let values = RowConverter::new(self.value_fields.clone())?;
        self.load(
            store,
            rows.iter().map(|(k, _, _)| k.clone()).collect(),
            by_key,
        )?;
        let mut touched: Vec<Vec<u8>> = by_key.keys().cloned().collect();
        touched.sort();
        // Sources of a merged session: a new row (its index in `rows`), or a stored session.
        enum Part {
            Row(usize),
            Stored(usize),
        }
        let mut rows_of_key: HashMap<&[u8], Vec<usize>> = HashMap::new();
        for (r, (k, _, _)) in rows.iter().enumerate() {
            rows_of_key.entry(k.as_slice()).or_default().push(r);
        }
        let mut stored_state: Vec<&[u8]> = vec![];
        let mut stored_group: Vec<usize> = vec![];
        let mut row_group = vec![0usize; rows.len()];
        // Per merged session: its key and extent.
        let mut merged: Vec<(usize, i64, i64)> = vec![];
        for (ki, key) in touched.iter().enumerate() {
            let stored = &by_key[key].sessions;
            let mut parts: Vec<(i64, i64, Part)> = stored
                .iter()
                .enumerate()
                .map(|(j, s)| (s.start, s.end, Part::Stored(j)))
                .collect();
            for &r in rows_of_key.get(key.as_slice()).into_iter().flatten() {
                parts.push((rows[r].1, rows[r].2, Part::Row(r)));
            }
            parts.sort_by_key(|(start, _, _)| *start);
            for (start, end, part) in parts {
                match merged.last_mut() {
                    Some((k, _, e)) if *k == ki && start <= *e => *e = (*e).max(end),
                    _ => merged.push((ki, start, end)),
                }
                let g = merged.len() - 1;
                match part {
                    Part::Row(r) => row_group[r] = g,
                    Part::Stored(j) => {
                        stored_state.push(&stored[j].state);
                        stored_group.push(g);
                    }
                }
            }
        }
        let n = merged.len();
        let mut new_state: Vec<Vec<u8>> = vec![];
        if n > 0 {
            // Every source's state in one merge, so every group appears in it.
            let parser = values.parser();
            let stored_columns =
                values.convert_rows(stored_state.iter().map(|s| parser.parse(s)))?;
            let width = self.value_fields.len();
            let mut state = Vec::with_capacity(width);
            for c in 0..width {
                let mut parts: Vec<&dyn Array> =
                    row_state.iter().map(|cols| cols[c].as_ref()).collect();
                parts.push(stored_columns[c].as_ref());
                state.push(concat(&parts)?);
            }
            let mut groups = row_group;
            groups.extend(stored_group);
            let mut accs = self.aggregates.accumulators()?;
            self.aggregates.merge(&mut accs, &state, &groups, n)?;
            let mut out = Vec::with_capacity(width);
            for acc in &mut accs {
                out.extend(acc.state(EmitTo::All)?);
            }
            new_state = values
                .convert_columns(&out)?
                .iter()
                .map(|r| r.as_ref().to_vec())
                .collect();
        }
        for ks in by_key.values_mut() {
            ks.sessions.clear();
        }
        for ((ki, start, end), state) in merged.into_iter().zip(new_state) {
            if let Some(ks) = by_key.get_mut(&touched[ki]) {
                ks.sessions.push(Session { start, end, state });
            }
        }
        Ok(n as u64)
    }

    /// Sessions whose end the watermark passed are final: append mode emits them, and they
    /// leave state (complete mode keeps everything). They are found through the index, from
    /// where this run's last eviction ended, plus this batch's own sessions; they are taken
    /// out of `by_key` and returned.
    fn evict(
        &self,
        store: &dyn StateStore,
        index: &dyn StateStore,
        run: &StateRun,
        watermark: BatchWatermark,
        by_key: &mut HashMap<Vec<u8>, KeySessions>,
    ) -> Result<Vec<(Vec<u8>, Session)>> {
        let mut evicted: Vec<(Vec<u8>, Session)> = vec![];
        if self.watermarked && run.output_mode == OutputMode::Append {
            let wm_us = watermark.eviction_ms.saturating_mul(1000);
            let floor = run.eviction_floor(index.id(), wm_us);
            let expired = index
                .scan(&times_up_to(floor, wm_us))
                .map_err(state_error)?;
            let mut keys = vec![];
            for (k, _) in expired {
                let key = after_time(&k).ok_or_else(|| corrupt(BY_END))?;
                keys.push(key.to_vec());
            }
            self.load(store, keys, by_key)?;
            let mut candidates: Vec<&Vec<u8>> = by_key.keys().collect();
            candidates.sort();
            let candidates: Vec<Vec<u8>> = candidates.into_iter().cloned().collect();
            for key in candidates {
                let Some(ks) = by_key.get_mut(&key) else {
                    continue;
                };
                let (gone, kept): (Vec<Session>, Vec<Session>) = std::mem::take(&mut ks.sessions)
                    .into_iter()
                    .partition(|s| s.end <= wm_us);
                ks.sessions = kept;
                evicted.extend(gone.into_iter().map(|s| (key.clone(), s)));
            }
        }
        Ok(evicted)
    }

    /// One write batch per store: each changed key's sessions, and the index entries of the
    /// sessions that came or went.
    fn write(
        &self,
        store: &mut dyn StateStore,
        index: &mut dyn StateStore,
        by_key: &HashMap<Vec<u8>, KeySessions>,
    ) -> Result<()> {
        // One write batch per store: each changed key's sessions, and the index entries of
        // the sessions that came or went.
        let mut writes = ValueChanges::new();
        let mut index_writes = ValueChanges::new();
        let mut changed: Vec<(&Vec<u8>, &KeySessions)> = by_key.iter().collect();
        changed.sort_by(|a, b| a.0.cmp(b.0));
        for (key, ks) in changed {
            let now: BTreeSet<i64> = ks.sessions.iter().map(|s| s.end).collect();
            let before: BTreeSet<i64> = ks.stored_ends.iter().copied().collect();
            for end in before.difference(&now) {
                index_writes.remove(index_key(*end, key)?);
            }
            for end in now.difference(&before) {
                index_writes.put(index_key(*end, key)?, Vec::new(), false);
            }
            if ks.sessions.is_empty() {
                if ks.existed {
                    writes.remove(key.clone());
                }
            } else {
                writes.put(key.clone(), encode_sessions(&ks.sessions), ks.existed);
            }
        }
        writes.apply_to(store).map_err(state_error)?;
        index_writes.apply_to(index).map_err(state_error)?;
        Ok(())
    }

    /// The rows the output mode emits: every session in complete mode, else the evicted ones.
    fn emit(
        &self,
        store: &dyn StateStore,
        mode: OutputMode,
        evicted: &[(Vec<u8>, Session)],
    ) -> Result<RecordBatch> {
        let output = match mode {
            OutputMode::Complete => {
                let all = store.scan(&KeyRange::all()).map_err(state_error)?;
                let mut decoded = vec![];
                for (k, v) in &all {
                    let sessions = decode_sessions(v).ok_or_else(|| corrupt(SESSIONS))?;
                    decoded.push((k.as_slice(), sessions));
                }
                let flat: Vec<(&[u8], &Session)> = decoded
                    .iter()
                    .flat_map(|(k, ss)| ss.iter().map(move |s| (*k, s)))
                    .collect();
                self.evaluate(&flat)?
            }
            _ => {
                let flat: Vec<(&[u8], &Session)> =
                    evicted.iter().map(|(k, s)| (k.as_slice(), s)).collect();
                self.evaluate(&flat)?
            }
        };
        Ok(output)
    }
}

/// The rows of a batch that join sessions: each row's group key and session bounds (µs), and
/// the rows' accumulator state columns, one entry per input batch.
struct NewRows {
    rows: Vec<(Vec<u8>, i64, i64)>,
    state: Vec<Vec<ArrayRef>>,
    dropped: u64,
}

/// How a session-window aggregation keeps its state (see the module's notes): `read_state`
/// shows one row per session, its bounds (µs) then its accumulators' state; repartitioning
/// places an index entry by the group key after its end time.
pub(crate) struct SessionFormat;

impl StateFormat for SessionFormat {
    fn readable(&self, store: &str) -> bool {
        store == SESSIONS
    }

    fn read_entries(&self, key: &[u8], value: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
        Some(
            decode_sessions(value)?
                .into_iter()
                .map(|s| {
                    let mut value = s.start.to_be_bytes().to_vec();
                    value.extend(s.end.to_be_bytes());
                    value.extend(s.state);
                    (key.to_vec(), value)
                })
                .collect(),
        )
    }

    fn decode_values(
        &self,
        fields: &arrow::datatypes::Fields,
        values: &[&[u8]],
    ) -> Result<Vec<ArrayRef>> {
        let bound = |at: usize| -> arrow::array::Int64Array {
            values
                .iter()
                .map(|v| {
                    v.get(at..at + 8)
                        .and_then(|b| <[u8; 8]>::try_from(b).ok())
                        .map(i64::from_be_bytes)
                })
                .collect()
        };
        let state_fields: arrow::datatypes::Fields = fields.iter().skip(2).cloned().collect();
        let states: Vec<&[u8]> = values.iter().map(|v| v.get(16..).unwrap_or(&[])).collect();
        let mut columns: Vec<ArrayRef> = vec![Arc::new(bound(0)), Arc::new(bound(8))];
        columns.extend(decode_rows(&state_fields, &states)?);
        Ok(columns)
    }

    fn placement(&self, store: &str) -> Placement {
        if store == BY_END {
            Placement::ByKeyAfterTime
        } else {
            Placement::ByKey
        }
    }
}

impl StatefulOperator for SessionWindowAggregate {
    fn name(&self) -> &'static str {
        "SessionWindowAggregateExec"
    }

    fn info(&self) -> &OperatorInfo {
        &self.info
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn inputs(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.partial]
    }

    fn shuffle_key(&self, _input: usize) -> Result<ShuffleKey> {
        let keys: Vec<usize> = (0..self.num_group).filter(|&i| i != self.session).collect();
        Ok(ShuffleKey::columns(&self.partial.schema(), &keys))
    }

    fn process(&self, step: Step<'_>) -> Result<Processed> {
        self.merge(step)
    }

    fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SessionWindowAggregateExec: operator={}, {}",
            self.info.operator_id,
            self.info.fingerprint.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_sessions_round_trip_and_damage_is_detected() {
        let sessions = vec![
            Session {
                start: -5,
                end: 10,
                state: vec![1, 2, 3],
            },
            Session {
                start: 20,
                end: 30,
                state: vec![],
            },
        ];
        let bytes = encode_sessions(&sessions);
        let back = decode_sessions(&bytes).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(
            (back[0].start, back[0].end, &back[0].state[..]),
            (-5, 10, &[1u8, 2, 3][..])
        );
        assert_eq!(
            (back[1].start, back[1].end, back[1].state.len()),
            (20, 30, 0)
        );
        assert!(decode_sessions(&bytes[..bytes.len() - 1]).is_none());
    }

    use crate::stateful::testing::{Harness, event_schema, events, lines, watermark};

    const SESSIONS_SQL: &str = "SELECT k, session_window(t, '5 seconds') AS s, count(*) AS n, \
        sum(v) AS total FROM STREAM e WATERMARK t DELAY OF INTERVAL 2 SECONDS \
        GROUP BY k, session_window(t, '5 seconds')";

    async fn harness(mode: OutputMode) -> Harness {
        Harness::new(SESSIONS_SQL, &[("e", event_schema())], mode).await
    }

    /// Batch 0 of every test: a at 1 s and 3 s (one session), b at 10 s.
    async fn first_batch(h: &mut Harness) -> Processed {
        h.step::<SessionWindowAggregate>(
            &[(
                "e",
                events(&[("a", Some(1), 1), ("a", Some(3), 2), ("b", Some(10), 5)]),
            )],
            watermark(0, 0),
        )
        .await
    }

    /// Each key's sessions in `by_key`, as (start s, end s), keys in order.
    fn extents(by_key: &HashMap<Vec<u8>, KeySessions>) -> Vec<Vec<(i64, i64)>> {
        let mut keys: Vec<&Vec<u8>> = by_key.keys().collect();
        keys.sort();
        keys.iter()
            .map(|k| {
                by_key[*k]
                    .sessions
                    .iter()
                    .map(|s| (s.start / 1_000_000, s.end / 1_000_000))
                    .collect()
            })
            .collect()
    }

    #[tokio::test]
    async fn merging_joins_a_keys_rows_and_stored_sessions_that_overlap_or_touch() {
        let mut h = harness(OutputMode::Complete).await;
        let none = watermark(0, 0);
        first_batch(&mut h).await;

        // The next batch's phases: a row at 8 s touches a's stored [1 s, 8 s); one at 20 s
        // opens a session of its own; b is not read.
        let planned = h
            .phases::<SessionWindowAggregate>(
                &[("e", events(&[("a", Some(20), 7), ("a", Some(8), 10)]))],
                none,
            )
            .await;
        let op = planned.operator::<SessionWindowAggregate>();
        let stores = h.stores(op);
        let new = op.new_rows(&planned.input[0], none).unwrap();
        assert_eq!(
            new.rows
                .iter()
                .map(|r| (r.1 / 1_000_000, r.2 / 1_000_000))
                .collect::<Vec<_>>(),
            [(20, 25), (8, 13)]
        );
        let mut by_key = HashMap::new();
        let merged = op
            .merge_sessions(stores[0].as_ref(), new, &mut by_key)
            .unwrap();
        assert_eq!(merged, 2);
        assert_eq!(extents(&by_key), [vec![(1, 13), (20, 25)]]);
        let a = by_key.values().next().unwrap();
        assert!(a.existed);
        assert_eq!(a.stored_ends, [8_000_000]);
    }

    #[tokio::test]
    async fn complete_mode_emits_every_session_with_its_merged_aggregates() {
        let mut h = harness(OutputMode::Complete).await;
        let none = watermark(0, 0);
        let first = first_batch(&mut h).await;
        assert_eq!(
            lines(&first.output),
            [
                "a,{start: 1970-01-01T00:00:01, end: 1970-01-01T00:00:08},2,3",
                "b,{start: 1970-01-01T00:00:10, end: 1970-01-01T00:00:15},1,5",
            ]
        );
        assert_eq!(first.rows_updated, 2);
        let second = h
            .step::<SessionWindowAggregate>(
                &[("e", events(&[("a", Some(20), 7), ("a", Some(8), 10)]))],
                none,
            )
            .await;
        assert_eq!(
            lines(&second.output),
            [
                "a,{start: 1970-01-01T00:00:01, end: 1970-01-01T00:00:13},3,13",
                "a,{start: 1970-01-01T00:00:20, end: 1970-01-01T00:00:25},1,7",
                "b,{start: 1970-01-01T00:00:10, end: 1970-01-01T00:00:15},1,5",
            ]
        );
        assert_eq!((second.rows_updated, second.rows_removed), (2, 0));
    }

    #[tokio::test]
    async fn append_mode_emits_and_evicts_the_sessions_the_watermark_passed_and_drops_late_rows() {
        let mut h = harness(OutputMode::Append).await;
        let first = first_batch(&mut h).await;
        assert!(lines(&first.output).is_empty());
        // The watermark at 9 s passes a's session (ends 8 s), not b's (ends 15 s).
        let second = h
            .step::<SessionWindowAggregate>(&[], watermark(0, 9_000))
            .await;
        assert_eq!(
            lines(&second.output),
            ["a,{start: 1970-01-01T00:00:01, end: 1970-01-01T00:00:08},2,3"]
        );
        assert_eq!(second.rows_removed, 1);
        // A row whose session would end at 7 s is late behind 9 s; b's row at 12 s merges.
        let third = h
            .step::<SessionWindowAggregate>(
                &[("e", events(&[("a", Some(2), 100), ("b", Some(12), 1)]))],
                watermark(9_000, 9_000),
            )
            .await;
        assert!(lines(&third.output).is_empty());
        assert_eq!(third.rows_dropped_by_watermark, 1);
        let last = h
            .step::<SessionWindowAggregate>(&[], watermark(9_000, 30_000))
            .await;
        assert_eq!(
            lines(&last.output),
            ["b,{start: 1970-01-01T00:00:10, end: 1970-01-01T00:00:17},2,6"]
        );
        // Nothing is left: a's state went with its session.
        let planned = h
            .phases::<SessionWindowAggregate>(&[], watermark(0, 0))
            .await;
        let stores = h.stores(planned.operator::<SessionWindowAggregate>());
        assert!(stores.iter().all(|s| s.metrics().num_keys == 0));
    }
}
