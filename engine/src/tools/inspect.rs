//! `weir checkpoint inspect`: what a checkpoint holds, read without taking it over.
//!
//! ```text
//! metadata            -> query id, format version
//! offsets/, commits/  -> batches present, last committed, a pending batch, next watermark
//! offsets/<last>      -> each source's identity and offsets (committed end, pending end), conf
//! state/_metadata     -> each stateful operator: id, name, partitions, stores, schemas
//! state/<op>/**       -> its files' total size and the state versions its changelogs hold
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use uuid::Uuid;
use weir_common::Location;

use crate::Result;
use crate::checkpoint::{self, Checkpoint, Resume};

/// What a checkpoint holds.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointReport {
    /// The checkpoint's location.
    pub location: String,
    /// The query's ID.
    pub query_id: Uuid,
    /// The sink the batches were written to, as recorded.
    pub sink: Option<checkpoint::SinkRecord>,
    /// Batch IDs with an offsets entry: the first and the last (`None` when there is none).
    pub offsets: Option<(u64, u64)>,
    /// The last batch with a commits entry.
    pub last_committed: Option<u64>,
    /// The first batch whose offsets are written but which is not committed: a restart runs it
    /// again with the same offsets.
    pub pending: Option<u64>,
    /// The watermark the next batch runs with (from the last commit), epoch ms.
    pub watermark_ms: Option<i64>,
    /// Each source, by position in the query.
    pub sources: Vec<SourceReport>,
    /// Each stateful operator.
    pub operators: Vec<OperatorReport>,
    /// The session settings fixed in the offsets log.
    pub conf: BTreeMap<String, String>,
    /// The resets done to the checkpoint (`resets/<n>`), oldest first.
    pub resets: Vec<super::reset::ResetReport>,
}

/// One source of a checkpoint.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceReport {
    /// Its position in the query.
    pub position: usize,
    /// The name the user gave it, if any.
    pub name: Option<String>,
    /// What the offsets log records to recognise it (`rate`, `delta:file:///...`).
    pub source: Option<String>,
    /// Where the last committed batch ended.
    pub committed_offset: Option<serde_json::Value>,
    /// Where the pending batch ends, if one is pending.
    pub pending_offset: Option<serde_json::Value>,
}

/// One stateful operator of a checkpoint.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorReport {
    /// Its ID (position in the physical plan).
    pub operator_id: u32,
    /// `aggregate`, `dedupe`, `streamStreamJoin`, ...
    pub operator_name: String,
    /// Shuffle partitions.
    pub num_partitions: usize,
    /// Its state stores.
    pub store_names: Vec<String>,
    /// The key columns of its state, as Spark DDL.
    pub key_schema: String,
    /// The value columns of its state, as Spark DDL.
    pub value_schema: String,
    /// The folder its state is kept in (`state/<stateId>`; its ID unless a reset moved it).
    pub state_id: u32,
    /// The first batch of its state (0 unless a reset started it afresh): batch N reads state
    /// version N - firstBatch.
    pub first_batch: u64,
    /// Bytes of its files in the checkpoint (changelogs and snapshots).
    pub state_bytes: u64,
    /// The lowest and highest state version its changelogs or snapshots hold.
    pub versions: Option<(u64, u64)>,
    /// The same per store (`<op>/<partition>/<store>/...`).
    pub store_versions: BTreeMap<String, (u64, u64)>,
    /// Its retention window: the committed batches whose state the checkpoint holds (Spark's
    /// `minBatchId` and `maxBatchId`), from `versions`.
    pub batches: Option<(u64, u64)>,
}

impl OperatorReport {
    /// The committed batches (up to `last_committed`) whose state the state versions
    /// `versions` hold: version v is the state after batch v - 1 of the operator's first batch.
    pub(crate) fn batches_of(
        &self,
        versions: (u64, u64),
        last_committed: Option<u64>,
    ) -> Option<(u64, u64)> {
        let (a, b) = versions;
        let first = self.first_batch + a.saturating_sub(1);
        let last = (self.first_batch + b.saturating_sub(1)).min(last_committed?);
        (first <= last).then_some((first, last))
    }
}

/// A schema as Spark DDL for people to read (a type DDL has no name for is shown as Arrow
/// names it).
pub(crate) fn ddl(schema: &arrow::datatypes::Schema) -> String {
    use arrow::datatypes::{DataType, Field, Schema};
    schema
        .fields()
        .iter()
        .map(|f| {
            // A view type holds the same values as its plain counterpart.
            let plain = match f.data_type() {
                DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
                DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
                t => t.clone(),
            };
            let one = Schema::new(vec![Field::new(f.name(), plain, f.is_nullable())]);
            weir_sources::files::to_ddl(&one)
                .unwrap_or_else(|| format!("`{}` {}", f.name(), f.data_type()))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The state version a checkpoint file holds: `<v>.changelog` or `<v>.snapshot`.
fn version_of(rel: &str) -> Option<u64> {
    let name = rel.rsplit('/').next()?;
    let (v, kind) = name.split_once('.')?;
    matches!(kind, "changelog" | "snapshot")
        .then(|| v.parse().ok())
        .flatten()
}

/// Reads what the checkpoint at `location` holds, writing nothing.
pub async fn inspect(location: Location) -> Result<CheckpointReport> {
    let ck = Checkpoint::open_read_only(location).await?;
    let (offsets, commits) = (ck.offset_ids().await?, ck.commit_ids().await?);
    let resume = ck.resume_point().await?;
    let (last_committed, pending) = match resume {
        Resume::Fresh => (None, None),
        Resume::After { last } => (Some(last), None),
        Resume::Replay { batch, .. } => (
            commits.iter().copied().filter(|c| *c < batch).max(),
            Some(batch),
        ),
    };
    let watermark_ms = match last_committed {
        Some(b) => Some(ck.read_commit(b).await?.next_batch_watermark_ms),
        None => None,
    };
    let committed_entry = match last_committed {
        Some(b) => Some(ck.read_offsets(b).await?),
        None => None,
    };
    let pending_entry = match pending {
        Some(b) => Some(ck.read_offsets(b).await?),
        None => None,
    };
    let newest = pending_entry.as_ref().or(committed_entry.as_ref());
    let count = newest.map_or(0, |e| e.sources.len());
    let sources = (0..count)
        .map(|position| SourceReport {
            position,
            name: newest.and_then(|e| e.sources[position].name.clone()),
            source: newest.and_then(|e| e.sources[position].source.clone()),
            committed_offset: committed_entry
                .as_ref()
                .and_then(|e| e.sources.get(position))
                .map(|r| r.end.0.clone()),
            pending_offset: pending_entry
                .as_ref()
                .and_then(|e| e.sources.get(position))
                .map(|r| r.end.0.clone()),
        })
        .collect();
    let files = ck
        .location()
        .child(checkpoint::STATE)
        .list_all_sized()
        .await?;
    let operators = match ck.read_state_metadata().await? {
        None => vec![],
        Some(m) => m
            .operators
            .iter()
            .map(|op| {
                let prefix = format!("{}/", op.state_id());
                let mine = files.iter().filter(|(rel, _)| rel.starts_with(&prefix));
                let versions: Vec<u64> = mine
                    .clone()
                    .filter_map(|(rel, _)| version_of(rel))
                    .collect();
                let mut store_versions: BTreeMap<String, (u64, u64)> = BTreeMap::new();
                for (rel, _) in mine.clone() {
                    let (Some(store), Some(v)) = (rel.split('/').nth(2), version_of(rel)) else {
                        continue;
                    };
                    let e = store_versions.entry(store.to_string()).or_insert((v, v));
                    *e = (e.0.min(v), e.1.max(v));
                }
                let mut report = OperatorReport {
                    operator_id: op.operator_id,
                    operator_name: op.operator_name.clone(),
                    num_partitions: op.num_partitions,
                    store_names: op.store_names.clone(),
                    state_id: op.state_id(),
                    first_batch: op.layout.map_or(0, |l| l.base_batch),
                    key_schema: ddl(&op.key_schema),
                    value_schema: ddl(&op.value_schema),
                    state_bytes: mine.map(|(_, size)| *size).sum(),
                    versions: versions
                        .iter()
                        .min()
                        .copied()
                        .zip(versions.iter().max().copied()),
                    store_versions,
                    batches: None,
                };
                report.batches = report
                    .versions
                    .and_then(|v| report.batches_of(v, last_committed));
                report
            })
            .collect(),
    };
    Ok(CheckpointReport {
        location: ck.location().display().to_string(),
        query_id: ck.id(),
        sink: ck.read_sink().await?,
        offsets: offsets.first().copied().zip(offsets.last().copied()),
        last_committed,
        pending,
        watermark_ms,
        sources,
        operators,
        conf: newest.map(|e| e.metadata.conf.clone()).unwrap_or_default(),
        resets: ck
            .resets()
            .await?
            .into_iter()
            .map(|(reset, record)| super::reset::ResetReport {
                location: ck.location().display().to_string(),
                reset,
                record,
            })
            .collect(),
    })
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

impl CheckpointReport {
    /// The report as text for a terminal.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "checkpoint      {}", self.location);
        let _ = writeln!(out, "query id        {}", self.query_id);
        if let Some(sink) = &self.sink {
            let _ = writeln!(
                out,
                "sink            {}{}",
                sink.format,
                sink.identity
                    .as_ref()
                    .map_or(String::new(), |i| format!(" at {i}"))
            );
        }
        let batches = match (self.offsets, self.last_committed, self.pending) {
            (None, ..) => "none yet".to_string(),
            (Some((lo, hi)), committed, pending) => format!(
                "offsets {lo}..{hi}; last committed {}{}",
                committed.map_or("none".to_string(), |c| c.to_string()),
                pending.map_or(String::new(), |p| format!(
                    "; batch {p} pending (its offsets are written, it is not committed: a \
                     restart runs it again with the same offsets)"
                ))
            ),
        };
        let _ = writeln!(out, "batches         {batches}");
        if let Some(w) = self.watermark_ms {
            let _ = writeln!(
                out,
                "watermark       {w} ms ({})",
                crate::execution::progress::format_timestamp(w)
            );
        }
        let _ = writeln!(out, "\nsources");
        if self.sources.is_empty() {
            let _ = writeln!(out, "  (no batch has been planned)");
        }
        for s in &self.sources {
            let _ = writeln!(
                out,
                "  [{}] {}{}\n      committed end: {}",
                s.position,
                s.name.as_ref().map_or(String::new(), |n| format!("'{n}' ")),
                s.source.as_deref().unwrap_or("(not recorded)"),
                s.committed_offset
                    .as_ref()
                    .map_or("none".to_string(), |o| o.to_string())
            );
            if let Some(p) = &s.pending_offset {
                let _ = writeln!(out, "      pending end:   {p}");
            }
        }
        let _ = writeln!(out, "\nstateful operators");
        if self.operators.is_empty() {
            let _ = writeln!(out, "  (none)");
        }
        for op in &self.operators {
            let _ = writeln!(
                out,
                "  [{}] {}  partitions {}  stores {}  state {}  retained for batches {}",
                op.operator_id,
                op.operator_name,
                op.num_partitions,
                op.store_names.join(", "),
                bytes(op.state_bytes),
                op.batches
                    .map_or("none".to_string(), |(lo, hi)| format!("{lo}..{hi}"))
            );
            if op.state_id != op.operator_id || op.first_batch != 0 {
                let _ = writeln!(
                    out,
                    "      state in state/{}, starting at batch {} (a reset moved it)",
                    op.state_id, op.first_batch
                );
            }
            let _ = writeln!(out, "      key:   {}", op.key_schema);
            let _ = writeln!(out, "      value: {}", op.value_schema);
        }
        if !self.resets.is_empty() {
            let _ = writeln!(out, "\nresets");
            for r in &self.resets {
                let kind = match r.record.kind {
                    super::reset::ResetKind::FullRefresh => "full refresh",
                    super::reset::ResetKind::Selective => "selective",
                    super::reset::ResetKind::Repartition => "repartition",
                };
                let ops: Vec<String> = r
                    .record
                    .operators
                    .iter()
                    .map(|o| format!("{} {}", o.operator_name, o.action))
                    .collect();
                let _ = writeln!(
                    out,
                    "  [{}] {} {kind}{}: next batch {}; {}{}",
                    r.reset,
                    r.record.time,
                    if r.record.done { "" } else { " (NOT FINISHED)" },
                    r.record.next_batch,
                    r.record.sink,
                    if ops.is_empty() {
                        String::new()
                    } else {
                        format!("; state: {}", ops.join(", "))
                    }
                );
            }
        }
        if !self.conf.is_empty() {
            let _ = writeln!(out, "\nconf");
            for (k, v) in &self.conf {
                let _ = writeln!(out, "  {k} = {v}");
            }
        }
        out
    }
}
