//! `weir checkpoint replay DIR QUERY.sql --batch N`: runs batch N of a checkpoint again, for
//! debugging, and shows what it produced, touching neither the sink nor the checkpoint.
//!
//! ```text
//! offsets/N                     -> each source's (start, end], the batch's time and watermark
//! state/, sources/<i>           -> copied into a scratch folder (local or s3:// alike)
//! sources' get_batch(start, end) -> the query planned with state version N (the state before
//!                                   the batch) -> the batch's output, kept in memory
//! ```

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::physical_plan::collect;
use serde::Serialize;
use weir_common::Location;
use weir_sources::SourceContext;

use crate::api::{DataStreamWriter, SHUFFLE_PARTITIONS, STATE_STORE};
use crate::checkpoint::checks::{check_operators, check_state_durable, planned_operators};
use crate::checkpoint::state_mirror::StateMirror;
use crate::stateful::{BatchState, BatchWatermark, StateBackend, StateRun, plan_stateful};
use crate::{Checkpoint, Error, Result};

/// One source's part of a replayed batch.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayedSource {
    /// The source's identity.
    pub source: String,
    /// Where the batch started reading.
    pub start: serde_json::Value,
    /// Where it stopped.
    pub end: serde_json::Value,
    /// The rows it read.
    pub rows: u64,
}

/// What replaying a batch produced.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    /// The batch.
    pub batch: u64,
    /// Whether the batch is committed (otherwise it is the pending one).
    pub committed: bool,
    /// The watermark the batch ran with (epoch ms).
    pub watermark_ms: i64,
    /// Each source's range and rows.
    pub sources: Vec<ReplayedSource>,
    /// The schema of the output.
    pub schema: SchemaRef,
    /// The rows the batch gave its sink.
    pub output: Vec<RecordBatch>,
}

impl ReplayReport {
    /// The report as text for a terminal: the sources' ranges, then the output rows.
    pub fn table(&self) -> std::result::Result<String, arrow::error::ArrowError> {
        use std::fmt::Write as _;
        let mut out = String::new();
        let rows: usize = self.output.iter().map(|b| b.num_rows()).sum();
        let _ = writeln!(
            out,
            "batch {} ({}), watermark {} ms: {rows} output row(s); nothing was written",
            self.batch,
            if self.committed {
                "committed"
            } else {
                "pending"
            },
            self.watermark_ms
        );
        for s in &self.sources {
            let _ = writeln!(
                out,
                "  {}: {} row(s), from {} to {}",
                s.source, s.rows, s.start, s.end
            );
        }
        let shown = if self.output.is_empty() {
            vec![RecordBatch::new_empty(Arc::clone(&self.schema))]
        } else {
            self.output.clone()
        };
        let _ = writeln!(
            out,
            "{}",
            arrow::util::pretty::pretty_format_batches(&shown)?
        );
        Ok(out)
    }
}

fn not_found(batch: u64, offsets: &[u64]) -> Error {
    Error::user(
        "CHECKPOINT_BATCH_NOT_FOUND",
        "42704",
        format!(
            "Batch {batch} is not in the checkpoint's offsets log ({}). Replay a batch it holds; \
             older ones are purged past minBatchesToRetain.",
            match (offsets.first(), offsets.last()) {
                (Some(a), Some(b)) => format!("it holds batches {a}..{b}"),
                _ => "it holds none".into(),
            }
        ),
    )
}

impl DataStreamWriter {
    /// Runs batch `batch` of this query's checkpoint again, read-only: its logged offsets,
    /// time and watermark, the state as it was before the batch, and this query (which must
    /// pass the restart checks against the checkpoint's operators and sources). Returns what
    /// the batch gave its sink; the sink is not called and the checkpoint is not written (the
    /// state and the sources' files are read from a scratch copy).
    pub async fn replay_batch(mut self, batch: u64) -> Result<ReplayReport> {
        let planned = self.plan_query()?;
        let Some(dir) = self.checkpoint.clone() else {
            return Err(Error::user(
                "CHECKPOINT_LOCATION_REQUIRED",
                "42601",
                "A replay needs the checkpoint to replay: set checkpoint_location(...) (CLI: weir \
                 checkpoint replay DIR QUERY.sql --batch N).",
            ));
        };
        let location = Location::parse_existing_with(&dir, std::iter::empty::<(&str, &str)>())?;
        let checkpoint = Checkpoint::open_read_only(location).await?;
        let offsets = checkpoint.offset_ids().await?;
        if !offsets.contains(&batch) {
            return Err(not_found(batch, &offsets));
        }
        if let Some((n, r)) = checkpoint.resets().await?.last()
            && batch < r.next_batch
        {
            return Err(Error::user(
                "CHECKPOINT_BATCH_BEFORE_RESET",
                "42K03",
                format!(
                    "Batch {batch} ran before the checkpoint's reset resets/{n}, which changed its \
                     state from batch {} on; the state batch {batch} read is no longer kept. \
                     Replay batch {} or later.",
                    r.next_batch, r.next_batch
                ),
            ));
        }
        let entry = checkpoint.read_offsets(batch).await?;
        let planned =
            planned.for_checkpoint(&self.plan, self.output_mode, Some(&entry.metadata.conf))?;
        let committed = checkpoint.commit_ids().await?.contains(&batch);
        let evolution = entry
            .metadata
            .conf
            .get(crate::checkpoint::source_evolution::SOURCE_EVOLUTION)
            .is_some_and(|v| v == "true");
        let names: Vec<String> = planned
            .sources
            .iter()
            .map(|s| s.name.clone().unwrap_or_default())
            .collect();
        if !evolution {
            let identities: Vec<String> =
                planned.sources.iter().map(|s| s.identity.clone()).collect();
            crate::execution::check_sources_of(&entry, batch, &identities)?;
        }

        let scratch =
            crate::stateful::run_scratch_dir("weir-replay", checkpoint.id(), uuid::Uuid::new_v4());
        let result = async {
            // The state before the batch, in a copy whose commits go nowhere.
            let stored = checkpoint.read_state_metadata().await?;
            // The state's partition count (a repartition changes it), else the logged one.
            let partitions = stored
                .as_ref()
                .and_then(|m| m.operators.first())
                .map(|o| o.num_partitions)
                .or_else(|| {
                    entry
                        .metadata
                        .conf
                        .get(SHUFFLE_PARTITIONS)
                        .and_then(|p| p.parse().ok())
                })
                .unwrap_or_else(|| self.session.ctx.state().config().target_partitions());
            let mut state = crate::api::streaming_state(&self.session.ctx);
            state.config_mut().options_mut().execution.target_partitions = partitions;
            let run = if planned.stateful || stored.is_some() {
                let logged = entry.metadata.conf.get(STATE_STORE).map(String::as_str);
                check_state_durable(logged.unwrap_or("rocksdb"), true)?;
                let local = scratch.join("state");
                StateMirror::download(checkpoint.location().child("state"), local.clone()).await?;
                let run = Arc::new(StateRun::open(
                    StateBackend::default(),
                    Some(local),
                    None,
                    checkpoint.id(),
                    crate::stateful::Instances::Scratch(uuid::Uuid::new_v4()),
                    partitions,
                    self.output_mode,
                )?);
                if let Some(stored) = &stored {
                    run.set_layouts(&stored.operators);
                }
                let operators =
                    planned_operators(&state, &planned.plan, &planned.tables, &run).await?;
                check_operators(
                    stored.as_ref(),
                    &operators,
                    true,
                    self.allow_state_definition_change,
                )?;
                Some(run)
            } else {
                None
            };

            // The sources, opened on a copy of their files, read the batch's ranges.
            let mut streams = vec![];
            for (i, t) in planned.tables.iter().enumerate() {
                let rel = if evolution {
                    format!("sources/{}", names[i])
                } else {
                    format!("sources/{i}")
                };
                let local = scratch.join(&rel);
                StateMirror::download(checkpoint.location().child(&rel), local.clone()).await?;
                let metadata = Location::local(&local)?;
                streams.push(t.source().open(SourceContext { metadata }).await?);
            }
            let entry = if evolution {
                let identities: Vec<String> =
                    planned.sources.iter().map(|s| s.identity.clone()).collect();
                let initials: Vec<_> = streams.iter().map(|s| s.initial_offset()).collect();
                crate::checkpoint::source_evolution::align(&entry, &names, &identities, &initials)
            } else {
                entry
            };
            let mut sources = vec![];
            for ((s, r), t) in streams.iter_mut().zip(&entry.sources).zip(&planned.tables) {
                let parts = s.get_batch(&r.start, &r.end).await?;
                sources.push(ReplayedSource {
                    source: t.source().identity(),
                    start: r.start.0.clone(),
                    end: r.end.0.clone(),
                    rows: parts.iter().flatten().map(|b| b.num_rows() as u64).sum(),
                });
                t.set_batch(parts);
            }
            let late_ms = match batch.checked_sub(1) {
                Some(b) => checkpoint
                    .read_offsets(b)
                    .await
                    .map(|e| e.metadata.batch_watermark_ms)
                    .unwrap_or(entry.metadata.batch_watermark_ms),
                None => 0,
            };
            state.execution_props_mut().query_execution_start_time =
                chrono::DateTime::from_timestamp_millis(entry.metadata.batch_timestamp_ms);
            let physical = state.create_physical_plan(&planned.plan).await?;
            let batch_state = Arc::new(BatchState::new(
                run,
                batch,
                BatchWatermark {
                    late_ms,
                    eviction_ms: entry.metadata.batch_watermark_ms,
                },
            ));
            let (physical, _) = plan_stateful(physical, &batch_state)?;
            let schema = physical.schema();
            let output = collect(physical, state.task_ctx()).await;
            for t in &planned.tables {
                t.clear();
            }
            Ok(ReplayReport {
                batch,
                committed,
                watermark_ms: entry.metadata.batch_watermark_ms,
                sources,
                schema,
                output: output?,
            })
        }
        .await;
        let _ = std::fs::remove_dir_all(&scratch);
        result
    }
}
