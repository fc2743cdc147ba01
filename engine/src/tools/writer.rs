//! The checkpoint tools on the writer and the session: `validate` (every restart check, read
//! only), `reset_checkpoint` (a selective reset) and `refresh_checkpoint` (a full refresh).

use std::collections::BTreeMap;
use std::sync::Arc;

use weir_common::{Location, Options};
use weir_sinks::{OutputMode, SinkSpec};

use crate::api::{DataStreamWriter, Planned, SHUFFLE_PARTITIONS, STATE_STORE, WATERMARK_POLICY};
use crate::checkpoint::RestartPoint;
use crate::checkpoint::checks::{
    check_operators, check_restart_sources, check_sink_batches, check_sink_change,
    check_sink_query_id, check_state_durable, next_batch, partitions_for, planned_operators,
};
use crate::stateful::{OperatorInfo, StateBackend, StateMetadata, StateRun};
use crate::{Checkpoint, Error, Result, WeirSession};

impl DataStreamWriter {
    /// Checks whether this query could restart from its checkpoint location, without running
    /// anything or writing to the checkpoint: every restart check [`DataStreamWriter::start`]
    /// makes (sources, sink, stateful operators and their schemas, the state store), each
    /// reported, with the checkpoint's and the query's side by side. An error means the
    /// checkpoint could not be read at all (missing, damaged, or the query is not valid).
    pub async fn validate(mut self) -> Result<crate::tools::validate::ValidationReport> {
        let planned = self.plan_query()?;
        let Some(dir) = self.checkpoint.clone() else {
            return Err(Error::user(
                "CHECKPOINT_LOCATION_REQUIRED",
                "42601",
                "Validating a query needs the checkpoint to check it against: set \
                 checkpoint_location(...) (CLI: weir checkpoint validate DIR QUERY.sql).",
            ));
        };
        let location = Location::parse_existing_with(&dir, std::iter::empty::<(&str, &str)>())?;
        let checkpoint = Checkpoint::open_read_only(location).await?;
        let resets = checkpoint.resets().await?;
        let restart = RestartPoint::read_after_resets(&checkpoint, &resets).await?;
        let planned = planned.for_checkpoint(
            &self.plan,
            self.output_mode,
            restart.as_ref().map(RestartPoint::logged),
        )?;
        let mut problems = vec![];
        if let Err(e) = check_restart_sources(
            &checkpoint,
            restart.as_ref(),
            &planned.sources,
            self.source_evolution,
        )
        .await
        {
            problems.push(e);
        }
        let was_sink = checkpoint.read_sink().await?;
        if let Err(e) =
            check_sink_change(was_sink.as_ref(), &planned.sink_record, restart.is_some())
        {
            problems.push(e);
        }
        if let Err(e) = check_sink_query_id(&checkpoint, was_sink.as_ref()) {
            problems.push(e);
        }
        if let Err(e) = check_sink_batches(
            &checkpoint,
            planned.sink.as_ref(),
            &planned.sink_record,
            was_sink.as_ref(),
            restart.as_ref(),
        )
        .await
        {
            problems.push(e);
        }

        // What the sink checks when it opens, as far as that writes nothing.
        if let Err(e) = planned.sink.check().await {
            problems.push(e.into());
        }
        if let Err(e) = checkpoint.check_resets_done(&resets) {
            problems.push(e);
        }
        let state = self.session.ctx.state();
        let session_conf = BTreeMap::from([
            (
                SHUFFLE_PARTITIONS.to_string(),
                state.config().target_partitions().to_string(),
            ),
            (
                STATE_STORE.to_string(),
                self.state_backend.name().to_string(),
            ),
            (
                WATERMARK_POLICY.to_string(),
                if self.max_watermark { "max" } else { "min" }.to_string(),
            ),
        ]);
        let (operators, stored) = self
            .operators_against(&planned, &checkpoint, restart.as_ref())
            .await?;
        let committed = restart.as_ref().is_some_and(|r| r.has_committed_batches());
        if let Err(e) = check_operators(
            stored.as_ref(),
            &operators,
            committed,
            self.allow_state_definition_change,
        ) {
            problems.push(e);
        }
        let backend = restart
            .as_ref()
            .and_then(|r| r.logged_conf(STATE_STORE))
            .unwrap_or(self.state_backend.name());
        if let Err(e) = check_state_durable(backend, committed && !operators.is_empty()) {
            problems.push(e);
        }

        let logged: &[crate::checkpoint::SourceRange] = match &restart {
            None => &[],
            Some(r) => &r.entry().1.sources,
        };
        let logged_conf = restart
            .as_ref()
            .map(|r| r.entry().1.metadata.conf.clone())
            .unwrap_or_default();
        let now = &planned.sources;
        let pairs: Vec<crate::tools::validate::SourcePair> = if self.source_evolution {
            let named =
                |n: &Option<String>| logged.iter().find(|r| r.name.is_some() && r.name == *n);
            now.iter()
                .map(|q| {
                    (
                        q.name.clone(),
                        named(&q.name).map(|r| r.source.clone()),
                        Some(q.identity.clone()),
                    )
                })
                .chain(
                    logged
                        .iter()
                        .filter(|r| !now.iter().any(|q| q.name.is_some() && q.name == r.name))
                        .map(|r| (r.name.clone(), Some(r.source.clone()), None)),
                )
                .collect()
        } else {
            (0..logged.len().max(now.len()))
                .map(|i| {
                    let q = now.get(i);
                    (
                        q.and_then(|q| q.name.clone())
                            .or_else(|| logged.get(i).and_then(|r| r.name.clone())),
                        logged.get(i).map(|r| r.source.clone()),
                        q.map(|q| q.identity.clone()),
                    )
                })
                .collect()
        };
        let (last_committed, next_batch) = next_batch(restart.as_ref());
        let stored_ops = stored.map(|s| s.operators).unwrap_or_default();
        Ok(crate::tools::validate::Sides {
            location: checkpoint.location().display().to_string(),
            query_id: checkpoint.id(),
            last_committed,
            next_batch,
            sources: pairs,
            sink: (was_sink, planned.sink_record),
            operators: (&stored_ops, &operators),
            settings: (logged_conf, session_conf),
            problems,
        }
        .report())
    }
}

impl DataStreamWriter {
    /// The stateful operators this query plans with the checkpoint's partition count, and the
    /// checkpoint's record of its operators. Nothing is opened: planning uses the memory state
    /// store.
    async fn operators_against(
        &self,
        planned: &Planned,
        checkpoint: &Checkpoint,
        restart: Option<&RestartPoint>,
    ) -> Result<(Vec<OperatorInfo>, Option<StateMetadata>)> {
        let mut state = crate::api::streaming_state(&self.session.ctx);
        let stored = checkpoint.read_state_metadata().await?;
        let partitions = partitions_for(restart, stored.as_ref(), &state);
        state.config_mut().options_mut().execution.target_partitions = partitions;
        if !planned.stateful && stored.is_none() {
            return Ok((vec![], None));
        }
        let run = Arc::new(StateRun::open(
            StateBackend::Memory,
            None,
            None,
            checkpoint.id(),
            crate::stateful::Instances::Scratch(uuid::Uuid::new_v4()),
            partitions,
            self.output_mode,
        )?);
        if let Some(stored) = &stored {
            run.set_layouts(&stored.operators);
        }
        let operators = planned_operators(&state, &planned.plan, &planned.tables, &run).await?;
        Ok((operators, stored))
    }

    /// Fits the checkpoint to this query, which changed, so that it continues where the
    /// checkpoint left off (a selective reset, `weir checkpoint reset DIR --query QUERY.sql`):
    /// stateful operators whose state still fits keep it, changed or added ones start empty
    /// at the next batch, removed ones' state is deleted, and every source continues from its
    /// committed offsets, so the sink's output continues with no row lost or doubled. The
    /// sources and the sink must be the ones the checkpoint has. The reset is recorded in
    /// `resets/<n>`; the query is not started.
    pub async fn reset_checkpoint(self) -> Result<crate::tools::reset::ResetReport> {
        self.reset_checkpoint_sources(&[], false).await
    }

    /// [`DataStreamWriter::reset_checkpoint`], also starting the sources `sources` (positions
    /// or names) anew, so that a changed source (another Kafka subscription, another folder)
    /// is accepted. Each continues from a position derived from the committed offsets of the
    /// source it replaces (for Kafka, the partitions both read continue and new ones start
    /// from their earliest), or, with `from_starting_position` or when none can be derived,
    /// from its own starting options; a start that leaves a gap or an overlap against the
    /// committed offsets is reported as a warning in the record. The last batch must be
    /// committed.
    pub async fn reset_checkpoint_sources(
        mut self,
        sources: &[String],
        from_starting_position: bool,
    ) -> Result<crate::tools::reset::ResetReport> {
        use crate::tools::reset::{
            ResetKind, ResetRecord, ResetReport, delete_unused_state, next_reset, plan_state,
        };
        if from_starting_position && sources.is_empty() {
            return Err(Error::user(
                "CHECKPOINT_RESET_INVALID_OPTIONS",
                "42K06",
                "from_starting_position says where the sources being reset start, but no source \
                 is reset: name the sources to start anew (CLI: --source S). Nothing was changed.",
            ));
        }
        let planned = self.plan_query()?;
        let Some(dir) = self.checkpoint.clone() else {
            return Err(Error::user(
                "CHECKPOINT_LOCATION_REQUIRED",
                "42601",
                "A reset needs the checkpoint to reset: set checkpoint_location(...) (CLI: weir \
                 checkpoint reset DIR --query QUERY.sql).",
            ));
        };
        let location = Location::parse_existing_with(&dir, std::iter::empty::<(&str, &str)>())?;
        // Refuses a missing or foreign location before anything is created.
        Checkpoint::open_read_only(location.clone()).await?;
        let mut checkpoint = Checkpoint::open(location, false).await?;
        let result = async {
            let resets = checkpoint.resets().await?;
            let (n, unfinished) = next_reset(&resets);
            if unfinished.is_some_and(|r| r.kind != ResetKind::Selective) {
                return Err(Error::user(
                    "CHECKPOINT_RESET_INCOMPLETE",
                    "55000",
                    format!(
                        "resets/{n} of the checkpoint is a full refresh or repartition that did \
                         not finish: run it again to finish it first."
                    ),
                ));
            }
            let restart = RestartPoint::read_after_resets(&checkpoint, &resets).await?;
            let planned = planned.for_checkpoint(
                &self.plan,
                self.output_mode,
                restart.as_ref().map(RestartPoint::logged),
            )?;
            let (restart, source_resets) = self
                .reset_sources(
                    &planned,
                    &checkpoint,
                    restart,
                    sources,
                    from_starting_position,
                )
                .await?;
            check_restart_sources(
                &checkpoint,
                restart.as_ref(),
                &planned.sources,
                self.source_evolution,
            )
            .await?;
            let sink = checkpoint.read_sink().await?;
            check_sink_change(sink.as_ref(), &planned.sink_record, restart.is_some())?;
            check_sink_query_id(&checkpoint, sink.as_ref())?;
            let (operators, stored) = self
                .operators_against(&planned, &checkpoint, restart.as_ref())
                .await?;
            let (_, next) = next_batch(restart.as_ref());
            let taken = checkpoint.state_folder_ids().await?.into_iter().collect();
            let stored = stored.map(|s| s.operators).unwrap_or_default();
            let plan = plan_state(&stored, &operators, next, &taken);
            let mut record = match unfinished {
                Some(r) => r.clone(),
                None => ResetRecord {
                    kind: ResetKind::Selective,
                    time: crate::execution::progress::format_timestamp(
                        chrono::Utc::now().timestamp_millis(),
                    ),
                    query_id_before: checkpoint.id(),
                    query_id_after: checkpoint.id(),
                    next_batch: next,
                    operators: plan.changes.clone(),
                    sources: source_resets.clone(),
                    sink: match &sink {
                        Some(s) => format!(
                            "{} output kept and continued",
                            crate::tools::reset::describe(s)
                        ),
                        None => "none recorded".into(),
                    },
                    done: false,
                },
            };
            if unfinished.is_none() {
                checkpoint.write_reset(n, &record).await?;
            }
            // A source started from its starting position keeps nothing of the one it replaces
            // (a derived start continues with the source's own files).
            for s in record.sources.iter().filter(|s| s.how != "derived") {
                let rel = match (&s.name, self.source_evolution) {
                    (Some(name), true) => format!("sources/{name}"),
                    _ => format!("sources/{}", s.position),
                };
                checkpoint.delete_folder(&rel).await?;
            }
            // The dropped operators' folders go first: until the record of the operators is
            // replaced, a run is refused (the reset is not done) and the reset can run again.
            delete_unused_state(&checkpoint, &plan.operators).await?;
            checkpoint
                .replace_state_metadata(&StateMetadata {
                    operators: plan.operators.clone(),
                })
                .await?;
            record.done = true;
            checkpoint.write_reset(n, &record).await?;
            Ok(ResetReport {
                location: checkpoint.location().display().to_string(),
                reset: n,
                record,
            })
        }
        .await;
        checkpoint.release().await;
        result
    }
}

impl DataStreamWriter {
    /// The restart point with the sources `keys` (positions or names) started anew, and the
    /// record of each.
    async fn reset_sources(
        &self,
        planned: &Planned,
        checkpoint: &Checkpoint,
        restart: Option<RestartPoint>,
        keys: &[String],
        from_starting_position: bool,
    ) -> Result<(Option<RestartPoint>, Vec<crate::tools::reset::SourceReset>)> {
        if keys.is_empty() {
            return Ok((restart, vec![]));
        }
        let (last, mut entry, commit) = match restart {
            Some(RestartPoint::After {
                last,
                entry,
                commit,
            }) => (last, entry, commit),
            Some(RestartPoint::Replay { batch, .. }) => {
                return Err(Error::user(
                    "CHECKPOINT_RESET_PENDING_BATCH",
                    "55000",
                    format!(
                        "Batch {batch} is logged but not committed, and a source reset needs the \
                         last batch committed (the sink may hold part of it). Run the query as \
                         it was once (e.g. --max-batches 1) to commit it, then reset."
                    ),
                ));
            }
            None => {
                return Err(Error::user(
                    "CHECKPOINT_RESET_NOTHING",
                    "55000",
                    "No batch has run on this checkpoint: its sources start from their \
                     starting positions anyway, so there is no source to reset.",
                ));
            }
        };
        let mut records = vec![];
        for key in keys {
            let i = planned
                .sources
                .iter()
                .position(|s| s.name.as_deref() == Some(key.as_str()))
                .or_else(|| {
                    key.parse::<usize>()
                        .ok()
                        .filter(|&i| i < planned.sources.len())
                })
                .ok_or_else(|| {
                    Error::user(
                        "STREAMING_INVALID_OPTION",
                        "42616",
                        format!(
                            "The query has no source '{key}': give a position (0..{}) or a \
                             source name.",
                            planned.sources.len()
                        ),
                    )
                })?;
            let q = &planned.sources[i];
            let logged = if self.source_evolution {
                entry
                    .sources
                    .iter()
                    .position(|r| r.name.is_some() && r.name == q.name)
            } else {
                (i < entry.sources.len()).then_some(i)
            }
            .ok_or_else(|| {
                Error::user(
                    "CHECKPOINT_RESET_NOTHING",
                    "55000",
                    format!(
                        "Source '{key}' is not in the checkpoint's last batch: it is new, and \
                         starts from its starting position without a reset (with source \
                         evolution), or the sources changed in number (a new checkpoint)."
                    ),
                )
            })?;
            let previous = entry.sources[logged].clone();
            let provider = planned.tables[i].source();
            let derived = previous
                .source
                .as_deref()
                .and_then(|p| provider.derive_start(p, &previous.end));
            let initial = if from_starting_position || derived.is_none() {
                // The source's own start, from a scratch folder (the checkpoint is untouched).
                let scratch = crate::stateful::run_scratch_dir(
                    "weir-reset-source",
                    checkpoint.id(),
                    uuid::Uuid::new_v4(),
                );
                std::fs::create_dir_all(&scratch)
                    .map_err(|e| Error::Internal(format!("cannot make a scratch folder: {e}")))?;
                let opened = async {
                    let metadata = Location::local(&scratch)?;
                    let stream = provider
                        .open(weir_sources::SourceContext { metadata })
                        .await?;
                    Ok::<_, Error>(stream.initial_offset())
                }
                .await;
                let _ = std::fs::remove_dir_all(&scratch);
                Some(opened?)
            } else {
                None
            };
            let (start, how, warning) = match (derived, initial) {
                (Some(d), Some(c)) => {
                    let w = provider.start_difference(&d, &c);
                    (c, "startingPosition", w)
                }
                (Some(d), None) => (d, "derived", None),
                (None, Some(c)) => (c, "startingPosition", None),
                (None, None) => {
                    return Err(Error::Internal("a source reset found no start".into()));
                }
            };
            if let Some(w) = &warning {
                tracing::warn!("the reset source '{key}' starts where it {w}");
            }
            entry.sources[logged] = crate::checkpoint::SourceRange {
                start: start.clone(),
                end: start.clone(),
                source: Some(q.identity.clone()),
                name: q.name.clone(),
            };
            records.push(crate::tools::reset::SourceReset {
                position: logged,
                name: q.name.clone(),
                previous: previous.source.clone(),
                source: q.identity.clone(),
                start: start.0,
                how: how.into(),
                warning,
            });
        }
        Ok((
            Some(RestartPoint::After {
                last,
                entry,
                commit,
            }),
            records,
        ))
    }
}

impl WeirSession {
    /// Full refresh of the checkpoint at `dir` (`weir checkpoint reset DIR --full`): deletes
    /// its batches, state and sources' files, clears what its sink wrote (file sinks, Delta;
    /// with `keep_sink_data` the output stays, and a file sink is refused as its log would
    /// skip the rerun's batches), and gives the query a new ID, so that it starts over from its
    /// sources' starting positions. Recorded in `resets/<n>`.
    pub async fn refresh_checkpoint(
        &self,
        dir: &str,
        keep_sink_data: bool,
    ) -> Result<crate::tools::reset::ResetReport> {
        let location = Location::parse_existing_with(dir, std::iter::empty::<(&str, &str)>())?;
        let mut checkpoint = Checkpoint::open_for_refresh(location).await?;
        let sinks = &self.inner().sinks;
        // What the refresh does to the sink: `Ok(None)` keeps its output (saying so), `Ok(Some)`
        // is the sink to clear; an error refuses the refresh.
        let plan =
            |record: &crate::checkpoint::SinkRecord| -> Result<Option<Arc<dyn weir_sinks::Sink>>> {
                let what = crate::tools::reset::describe(record);
                let Some(identity) = record.identity.clone() else {
                    if keep_sink_data {
                        return Ok(None);
                    }
                    return Err(Error::user(
                        "FULL_REFRESH_SINK_NOT_CLEARABLE",
                        "0A000",
                        format!(
                            "The checkpoint's batches were written to the {what} sink, whose output \
                         weir cannot take back. Clear it yourself if needed, then run the full \
                         refresh again with --keep-sink-data (the checkpoint is unchanged)."
                        ),
                    ));
                };
                let sink = {
                    let registry = sinks
                        .read()
                        .map_err(|_| Error::Internal("sink registry lock poisoned".into()))?;
                    let mut options = Options::new();
                    options.set("path", identity);
                    registry.create(&SinkSpec {
                        format: record.format.clone(),
                        options,
                        output_mode: OutputMode::Append,
                        query_name: None,
                        schema: Arc::new(datafusion::arrow::datatypes::Schema::empty()),
                    })?
                };
                if keep_sink_data {
                    if !sink.output_can_outlive_a_refresh() {
                        return Err(Error::user(
                            "FULL_REFRESH_SINK_NOT_CLEARABLE",
                            "0A000",
                            format!(
                                "The {what} sink's log records which batches it holds, so a rerun \
                             from batch 0 would be skipped as already written: its output cannot \
                             be kept. Move the folder away, or run the full refresh without \
                             --keep-sink-data."
                            ),
                        ));
                    }
                    return Ok(None);
                }
                Ok(Some(sink))
            };
        let clear = |record: crate::checkpoint::SinkRecord| {
            let planned = plan(&record);
            async move {
                let what = crate::tools::reset::describe(&record);
                match planned? {
                    None => Ok(format!("{what} output kept")),
                    Some(sink) => {
                        sink.clear_output().await?;
                        Ok(format!("{what} output cleared"))
                    }
                }
            }
        };
        // Refuse before touching anything when the sink cannot be dealt with: every sink is
        // made (not cleared) first. A damaged sink record is only passed with the output kept.
        let precheck = match checkpoint.read_sink().await {
            Ok(Some(r)) => plan(&r).map(|_| ()),
            Ok(None) => Ok(()),
            Err(_) if keep_sink_data => Ok(()),
            Err(e) => Err(e),
        };
        let result = match precheck {
            Err(e) => Err(e),
            Ok(()) => {
                crate::tools::reset::full_refresh(&mut checkpoint, keep_sink_data, clear).await
            }
        };
        checkpoint.release().await;
        result
    }
}
