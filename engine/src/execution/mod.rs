//! The micro-batch loop (DESIGN.md §2): for batch N, plan offsets, write the WAL, read, plan,
//! execute into the sink, commit, report progress. A restart replays an uncommitted batch with
//! exactly its logged offsets; the idempotent sink makes that exactly-once.

pub(crate) mod health;
pub(crate) mod listener;
pub(crate) mod progress;
pub(crate) mod query;
pub(crate) mod trigger;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::execution::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::collect;
use futures::FutureExt;
use tracing::{Instrument, debug, info, info_span};
use weir_common::failpoint::pause_point;
use weir_planner::StreamingTable;
use weir_sinks::Sink;
use weir_sources::{MicroBatchStream, Offset, ReadLimit, SourceContext};

use crate::checkpoint::{
    BatchMetadata, Checkpoint, CommitEntry, OffsetEntry, RestartPoint, SourceRange, purge_below,
};
use crate::execution::listener::{
    Event, QueryIdleEvent, QueryProgressEvent, QueryStartedEvent, QueryTerminatedEvent,
};
use crate::execution::progress::{
    SinkProgress, SourceProgress, StateOperatorProgress, StreamingQueryProgress, format_timestamp,
};
use crate::execution::query::{RECENT_PROGRESS, Shared, StreamingQueryManager};
use crate::stateful::{
    BatchState, BatchWatermark, EventTimeStats, OperatorInfo, StateRun, plan_stateful,
};
use crate::{Error, Result, Trigger};

/// How long an idle query waits before asking its sources again (`spark.sql.streaming.pollingDelay`).
const POLLING_DELAY: Duration = Duration::from_millis(10);
/// Default of `spark.sql.streaming.noDataProgressEventInterval`: a no-data progress entry and an
/// idle event at most this often.
pub(crate) const NO_DATA_PROGRESS_INTERVAL: Duration = Duration::from_secs(10);

/// Everything one run of a query needs.
pub(crate) struct Execution {
    pub(crate) shared: Arc<Shared>,
    pub(crate) manager: StreamingQueryManager,
    pub(crate) state: SessionState,
    /// The analyzed plan, optimized again for each batch with that batch's time.
    pub(crate) plan: LogicalPlan,
    pub(crate) tables: Vec<Arc<StreamingTable>>,
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) checkpoint: Checkpoint,
    pub(crate) trigger: Trigger,
    pub(crate) max_batches: Option<u64>,
    pub(crate) min_batches_to_retain: u64,
    pub(crate) conf: BTreeMap<String, String>,
    /// How often an idle query records no-data progress and posts an idle event.
    pub(crate) no_data_progress_interval: Duration,
    /// Where a restarted run continues; `None` for a fresh checkpoint.
    pub(crate) restart: Option<RestartPoint>,
    /// The state backend of a query with stateful operators, and the operators.
    pub(crate) state_run: Option<(Arc<StateRun>, Vec<OperatorInfo>)>,
    /// Whether the query declares event-time watermarks.
    pub(crate) has_watermarks: bool,
    /// With several watermarks, the query's is their maximum (Spark's `max` policy).
    pub(crate) max_watermark: bool,
    /// Asynchronous state checkpointing: `commits/N` waits for batch N's state to be durable
    /// while batch N + 1 runs.
    pub(crate) async_state_checkpoint: bool,
    /// With source evolution: the sources' names, in query order (their offsets and private
    /// files are kept by name).
    pub(crate) source_names: Option<Vec<String>>,
}

/// What executing one batch gave.
struct Executed {
    rows_per_source: Vec<u64>,
    output_rows: usize,
    state_operators: Vec<StateOperatorProgress>,
    event_times: BTreeMap<usize, EventTimeStats>,
}

/// Refuses `sources` (the query's sources' identities, by position) when batch `batch`
/// (`entry`) read other sources or another number of them.
pub(crate) fn check_sources_of(entry: &OffsetEntry, batch: u64, sources: &[String]) -> Result<()> {
    let logged = entry.sources.len();
    let sources_now = sources.len();
    if let Some((i, was, now)) =
        entry
            .sources
            .iter()
            .zip(sources)
            .enumerate()
            .find_map(|(i, (r, now))| match &r.source {
                Some(was) if was != now => Some((i, was, now)),
                _ => None,
            })
    {
        return Err(Error::user(
            "STREAMING_QUERY_SOURCES_CHANGED",
            "42K03",
            format!(
                "Source {i} of the query is now '{now}', but the checkpoint's batch {batch} \
                     read '{was}' there; its offsets cannot be read by another source. A query \
                     restarted from a checkpoint must read the same sources in the same order; \
                     undo the change, or start the changed query with a new checkpoint location."
            ),
        ));
    }
    if logged != sources_now {
        return Err(Error::user(
            "STREAMING_QUERY_SOURCES_CHANGED",
            "42K03",
            format!(
                "The checkpoint's batch {batch} read {logged} source(s), but the query now has \
                     {sources_now}. A query restarted from a checkpoint must read the same sources in \
                     the same order; undo the change, or start the changed query with a new \
                     checkpoint location."
            ),
        ));
    }
    Ok(())
}

/// A batch that ran, waiting for its state to be durable before `commits/N`.
struct Pending {
    batch: u64,
    commit: CommitEntry,
    ends: Vec<Offset>,
}

enum TriggerOutcome {
    Ran,
    /// No new data; `latest_offset` is how long asking the sources took.
    NoData {
        latest_offset: Duration,
    },
}

struct Loop {
    streams: Vec<Box<dyn MicroBatchStream>>,
    limits: Vec<ReadLimit>,
    starts: Vec<Offset>,
    next_batch: u64,
    /// Logged but uncommitted batches to re-run first, oldest first.
    replay: VecDeque<OffsetEntry>,
    /// With asynchronous state checkpointing, the batch that ran but is not committed yet: it
    /// commits once its state is durable, after the next batch ran (or when the query idles or
    /// stops).
    pending: Option<Pending>,
    /// The newest committed batch.
    last_committed: Option<u64>,
    /// Batch 0 of a fresh checkpoint is still to run even without new data (see
    /// [`MicroBatchStream::runs_first_batch_without_data`]).
    first_batch_ever: bool,
    /// The event-time watermark the next batch runs with.
    watermark_ms: i64,
    /// The watermark the last batch ran with: the next batch drops rows at or behind it.
    last_batch_watermark_ms: i64,
    /// The largest event time each watermark operator has seen (microseconds), and its delay.
    event_time_max: BTreeMap<usize, (i64, i64)>,
    last_trigger_start: Option<Instant>,
    /// When the last progress or idle event was posted.
    last_event: Option<Instant>,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// When the trigger after one that started at `start_ms` starts: the next multiple of the
/// interval, as Spark's `ProcessingTimeExecutor.nextBatchTime` (so batches start on whole
/// intervals, and a batch longer than the interval is followed at once by the next).
fn next_trigger_ms(start_ms: i64, interval_ms: i64) -> i64 {
    if interval_ms <= 0 {
        start_ms
    } else {
        start_ms / interval_ms * interval_ms + interval_ms
    }
}

fn push_recent(recent: &mut VecDeque<StreamingQueryProgress>, p: StreamingQueryProgress) {
    if recent.len() >= RECENT_PROGRESS {
        recent.pop_front();
    }
    recent.push_back(p);
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl Execution {
    /// Runs the query until it is stopped, its trigger is done, or it fails; then reports the
    /// termination.
    pub(crate) async fn run(mut self) {
        self.manager.post(Event::Started(QueryStartedEvent {
            id: self.shared.id,
            run_id: self.shared.run_id,
            name: self.shared.name.clone(),
            timestamp: format_timestamp(now_ms()),
        }));
        let span = info_span!("query", query_id = %self.shared.id, run_id = %self.shared.run_id);
        // A panic anywhere below (a bug, or one re-raised from a DataFusion operator) must
        // still end the query as failed, or stop() and await_termination() would wait forever.
        let result = match std::panic::AssertUnwindSafe(self.run_loop().instrument(span))
            .catch_unwind()
            .await
        {
            Ok(r) => r,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(Error::Internal(format!("the query panicked: {what}")))
            }
        };
        for t in &self.tables {
            t.clear();
        }
        let (exception, class) = match &result {
            Ok(()) => (None, None),
            Err(e) => (Some(e.to_string()), Some(e.error_class().to_string())),
        };
        if let Err(e) = &result {
            tracing::error!(query_id = %self.shared.id, "query failed: {e}");
            if self.checkpoint.is_temporary()
                && let Some(dir) = self.checkpoint.location().local_dir()
            {
                tracing::warn!(
                    query_id = %self.shared.id,
                    "the failed query's temporary checkpoint is kept for inspection: {}",
                    dir.display()
                );
            }
            self.checkpoint.keep();
        } else {
            self.checkpoint.delete_if_temporary();
        }
        // Close the state (RocksDB: instances flushed and closed, kept for the next run) and
        // free the checkpoint and the query's slot before anyone waiting sees it stopped, so a
        // restart right after await_termination() is not refused as concurrent and finds the
        // instances free.
        if let Some((run, _)) = self.state_run.take()
            && let Err(e) = run.provider.close()
        {
            tracing::warn!(query_id = %self.shared.id, "closing the state stores: {e}");
        }
        self.checkpoint.release().await;
        self.manager.unregister(self.shared.id);
        self.shared.update(|s| {
            s.active = false;
            s.status.message = "Stopped".into();
            s.status.is_trigger_active = false;
            s.exception = result.err().map(Arc::new);
        });
        self.manager.post(Event::Terminated(QueryTerminatedEvent {
            id: self.shared.id,
            run_id: self.shared.run_id,
            exception,
            error_class_on_exception: class,
        }));
    }

    async fn run_loop(&mut self) -> Result<()> {
        let mut streams = Vec::with_capacity(self.tables.len());
        for (i, t) in self.tables.iter().enumerate() {
            let metadata = match &self.source_names {
                Some(names) => self.checkpoint.named_source_dir(&names[i]),
                None => self.checkpoint.source_dir(i),
            };
            streams.push(t.source().open(SourceContext { metadata }).await?);
        }
        // With source evolution the logged ranges are found by name, in the query's order.
        let restart = match (self.restart.take(), &self.source_names) {
            (Some(r), Some(names)) => {
                let identities: Vec<String> =
                    self.tables.iter().map(|t| t.source().identity()).collect();
                let initials: Vec<Offset> = streams.iter().map(|s| s.initial_offset()).collect();
                Some(r.aligned(|e| {
                    crate::checkpoint::source_evolution::align(e, names, &identities, &initials)
                }))
            }
            (r, _) => r,
        };
        let mut replay_later = vec![];
        let (next_batch, starts, replay, watermark_ms, last_batch_watermark_ms) = match restart {
            None => (
                0,
                streams.iter().map(|s| s.initial_offset()).collect(),
                None,
                0,
                0,
            ),
            Some(RestartPoint::After {
                last,
                entry,
                commit,
            }) => (
                last + 1,
                entry.sources.iter().map(|r| r.end.clone()).collect(),
                None,
                commit.next_batch_watermark_ms,
                entry.metadata.batch_watermark_ms,
            ),
            Some(RestartPoint::Replay {
                batch,
                entry,
                later,
            }) => {
                info!(
                    batch,
                    later = later.len(),
                    "replaying the batches that were planned but not committed"
                );
                replay_later = later;
                let starts = entry.sources.iter().map(|r| r.start.clone()).collect();
                let watermark_ms = entry.metadata.batch_watermark_ms;
                // The batch drops late rows with the watermark of the batch before it.
                let before = match batch.checked_sub(1) {
                    Some(b) => match self.checkpoint.read_offsets(b).await {
                        Ok(e) => e.metadata.batch_watermark_ms,
                        Err(_) => watermark_ms,
                    },
                    None => 0,
                };
                (batch, starts, Some(entry), watermark_ms, before)
            }
        };
        let limits = streams
            .iter()
            .map(|s| match self.trigger {
                Trigger::Once => ReadLimit::AllAvailable,
                _ => s.default_read_limit(),
            })
            .collect();
        let first_batch_ever = next_batch == 0
            && replay.is_none()
            && streams.iter().any(|s| s.runs_first_batch_without_data());
        let mut replay: VecDeque<OffsetEntry> = replay.into_iter().collect();
        replay.extend(replay_later);
        let mut lp = Loop {
            streams,
            limits,
            starts,
            first_batch_ever,
            watermark_ms,
            last_batch_watermark_ms,
            event_time_max: BTreeMap::new(),
            next_batch,
            replay,
            pending: None,
            last_committed: next_batch.checked_sub(1),
            last_trigger_start: None,
            last_event: None,
        };
        if self.trigger == Trigger::AvailableNow {
            for (s, start) in lp.streams.iter_mut().zip(&lp.starts) {
                s.prepare_for_available_now(start).await?;
            }
        }
        let mut stop = self.shared.stop.subscribe();
        let mut ran = 0u64;
        loop {
            if *stop.borrow() || self.max_batches.is_some_and(|m| ran >= m) {
                break;
            }
            let trigger_start = Instant::now();
            let trigger_epoch_ms = now_ms();
            self.shared.update(|s| {
                s.triggers += 1;
                s.status.is_trigger_active = true;
            });
            let outcome = self
                .run_trigger(&mut lp, trigger_start, trigger_epoch_ms)
                .await?;
            lp.last_trigger_start = Some(trigger_start);
            let seq = self.shared.state.lock().map(|s| s.triggers).unwrap_or(0);
            match outcome {
                TriggerOutcome::Ran => {
                    ran += 1;
                    lp.last_event = Some(Instant::now());
                    self.shared.update(|s| {
                        s.status = status("Waiting for next trigger", true, false);
                    });
                    // The N-th batch of --max-batches ends the run as it commits, not one
                    // trigger interval later.
                    if self.trigger == Trigger::Once || self.max_batches.is_some_and(|m| ran >= m) {
                        break;
                    }
                }
                TriggerOutcome::NoData { latest_offset } => {
                    // Nothing to overlap with: the batch waiting for durable state commits.
                    self.finish_pending(&mut lp).await?;
                    if matches!(self.trigger, Trigger::Once | Trigger::AvailableNow) {
                        // process_all_available() returns when the run has ended (its state
                        // closed, its checkpoint free), not before: a run started right after
                        // it finds the checkpoint free.
                        info!("all data available at start is processed; stopping");
                        break;
                    }
                    self.shared.update(|s| {
                        s.last_idle_trigger = seq;
                        s.status = status("Waiting for data to arrive", false, false);
                    });
                    // As Spark's ProgressReporter.updateIdleness: once per interval since the
                    // last progress, record a no-data progress entry; post an idle event for
                    // it unless it is the first entry of this run.
                    let due = lp
                        .last_event
                        .is_none_or(|t| t.elapsed() >= self.no_data_progress_interval);
                    if due {
                        let entry = self.no_data_progress(
                            &lp,
                            trigger_epoch_ms,
                            latest_offset,
                            trigger_start.elapsed(),
                        );
                        self.shared.update(|s| push_recent(&mut s.recent, entry));
                        if lp.last_event.is_some() {
                            self.manager.post(Event::Idle(QueryIdleEvent {
                                id: self.shared.id,
                                run_id: self.shared.run_id,
                                timestamp: format_timestamp(trigger_epoch_ms),
                            }));
                        }
                        lp.last_event = Some(Instant::now());
                    }
                }
            }
            let until_next = |d: Duration| {
                let next = next_trigger_ms(trigger_epoch_ms, d.as_millis() as i64);
                Duration::from_millis(next.saturating_sub(now_ms()).max(0) as u64)
            };
            let wait = match (self.trigger, &outcome) {
                // As Spark, a trigger without data also sleeps the polling delay.
                (Trigger::ProcessingTime(d), TriggerOutcome::NoData { .. }) => {
                    until_next(d).max(POLLING_DELAY)
                }
                (Trigger::ProcessingTime(d), _) => until_next(d),
                (_, TriggerOutcome::NoData { .. }) => POLLING_DELAY,
                _ => Duration::ZERO,
            };
            if !wait.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.changed() => {}
                }
            }
        }
        // A clean stop commits the batch whose state was still being made durable.
        self.finish_pending(&mut lp).await
    }

    /// Commits the batch waiting for its state to be durable, if any.
    async fn finish_pending(&mut self, lp: &mut Loop) -> Result<()> {
        let Some(p) = lp.pending.take() else {
            return Ok(());
        };
        if let Some((run, _)) = &self.state_run {
            // Batch N's state is version N + 1.
            run.provider
                .wait_durable(p.batch + 1)
                .map_err(|e| Error::User(e.into()))?;
        }
        self.commit_batch(lp, p.batch, &p.commit, &p.ends).await
    }

    /// Writes `commits/<batch>` and tells the sources.
    async fn commit_batch(
        &mut self,
        lp: &mut Loop,
        batch: u64,
        commit: &CommitEntry,
        ends: &[Offset],
    ) -> Result<()> {
        // On an object store, the batch's state goes there before the batch is committed; a
        // run that lost the checkpoint's lease uploads nothing.
        if let Some(mirror) = self
            .state_run
            .as_ref()
            .and_then(|(run, _)| run.mirror.as_ref())
        {
            self.checkpoint.check_lease()?;
            mirror.sync().await?;
        }
        self.checkpoint.write_commit(batch, commit).await?;
        pause_point("after_commit", batch);
        for (s, end) in lp.streams.iter_mut().zip(ends) {
            s.commit(end).await?;
        }
        lp.last_committed = Some(batch);
        Ok(())
    }

    async fn run_trigger(
        &mut self,
        lp: &mut Loop,
        trigger_start: Instant,
        timestamp_ms: i64,
    ) -> Result<TriggerOutcome> {
        let batch = lp.next_batch;
        let mut durations: BTreeMap<String, u64> = BTreeMap::new();
        let (entry, latest): (OffsetEntry, Vec<Option<Offset>>) = match lp.replay.pop_front() {
            Some(e) => {
                let latest = lp
                    .streams
                    .iter()
                    .map(|s| s.reported_latest_offset())
                    .collect();
                (e, latest)
            }
            None => {
                let t = Instant::now();
                let mut ends = Vec::with_capacity(lp.streams.len());
                for ((s, start), limit) in lp.streams.iter_mut().zip(&lp.starts).zip(&lp.limits) {
                    ends.push(s.latest_offset(start, *limit).await?);
                }
                durations.insert("latestOffset".into(), ms(t.elapsed()));
                let new_data = ends != lp.starts;
                // As Spark, a batch without new data still runs when the watermark moved, so
                // stateful operators can emit and evict what it finalised.
                let watermark_moved =
                    self.state_run.is_some() && lp.watermark_ms > lp.last_batch_watermark_ms;
                if !new_data && !lp.first_batch_ever && !watermark_moved {
                    return Ok(TriggerOutcome::NoData {
                        latest_offset: t.elapsed(),
                    });
                }
                self.shared.update(|s| {
                    s.status = status("Processing new data", true, true);
                });
                let entry = OffsetEntry {
                    metadata: BatchMetadata {
                        batch_watermark_ms: lp.watermark_ms,
                        batch_timestamp_ms: timestamp_ms,
                        conf: self.conf.clone(),
                    },
                    sources: lp
                        .starts
                        .iter()
                        .zip(ends)
                        .zip(&self.tables)
                        .map(|((start, end), table)| SourceRange {
                            start: start.clone(),
                            end,
                            source: Some(table.source().identity()),
                            name: table.source_name().map(String::from),
                        })
                        .collect(),
                };
                let t = Instant::now();
                pause_point("before_wal", batch);
                self.checkpoint.write_offsets(batch, &entry).await?;
                pause_point("after_wal", batch);
                if let Some(committed) = lp.last_committed {
                    let below = purge_below(committed, self.min_batches_to_retain);
                    if below > 0 {
                        self.checkpoint.purge_below(below).await?;
                        // Re-running batch `below` needs state version `below`.
                        if let Some((run, operators)) = &self.state_run {
                            run.purge_below(operators, below)?;
                        }
                    }
                }
                durations.insert("walCommit".into(), ms(t.elapsed()));
                let latest = lp
                    .streams
                    .iter()
                    .map(|s| s.reported_latest_offset())
                    .collect();
                (entry, latest)
            }
        };
        lp.first_batch_ever = false;
        let span = info_span!("batch", batch_id = batch);
        let executed = self
            .execute_batch(lp, batch, &entry, &mut durations)
            .instrument(span)
            .await?;
        let Executed {
            rows_per_source,
            output_rows,
            state_operators,
            event_times,
        } = executed;
        let batch_watermark_ms = entry.metadata.batch_watermark_ms;
        crate::stateful::record_event_times(&mut lp.event_time_max, &event_times);
        lp.watermark_ms = crate::stateful::next_watermark_ms(
            lp.watermark_ms,
            &lp.event_time_max,
            self.max_watermark,
        );
        lp.last_batch_watermark_ms = batch_watermark_ms;
        let event_time = self.has_watermarks.then(|| {
            let mut m = BTreeMap::new();
            let all = event_times.values().fold(None::<EventTimeStats>, |acc, s| {
                Some(match acc {
                    Some(mut a) => {
                        a.merge(s);
                        a
                    }
                    None => *s,
                })
            });
            if let Some(a) = all {
                let avg_us = (a.sum_us / i128::from(a.count.max(1))) as i64;
                m.insert("avg".to_string(), format_timestamp(avg_us.div_euclid(1000)));
                m.insert(
                    "max".to_string(),
                    format_timestamp(a.max_us.div_euclid(1000)),
                );
                m.insert(
                    "min".to_string(),
                    format_timestamp(a.min_us.div_euclid(1000)),
                );
            }
            m.insert(
                "watermark".to_string(),
                format_timestamp(batch_watermark_ms),
            );
            m
        });
        let t = Instant::now();
        let commit = CommitEntry {
            next_batch_watermark_ms: lp.watermark_ms,
        };
        let ends: Vec<Offset> = entry.sources.iter().map(|r| r.end.clone()).collect();
        if self.async_state_checkpoint {
            // This batch's state is made durable in the background while the next batch runs:
            // commit the previous batch now (its state is durable once this batch's operators
            // committed, one upload per store at a time), and this one after the next.
            self.finish_pending(lp).await?;
            lp.pending = Some(Pending {
                batch,
                commit,
                ends,
            });
        } else {
            self.commit_batch(lp, batch, &commit, &ends).await?;
        }
        durations.insert("commitOffsets".into(), ms(t.elapsed()));
        let trigger_ms = trigger_start.elapsed();
        durations.insert("triggerExecution".into(), ms(trigger_ms));
        lp.starts = entry.sources.iter().map(|r| r.end.clone()).collect();
        lp.next_batch += 1;

        // As Spark: input rate over the time since the previous trigger started (idle ones
        // included), processing rate over this trigger's time, at least 1 ms.
        let processing = trigger_ms.max(Duration::from_millis(1));
        let since_last = lp
            .last_trigger_start
            .map(|t| trigger_start.duration_since(t));
        let rate = |rows: u64, d: Option<Duration>| match d {
            Some(d) if d.as_secs_f64() > 0.0 => rows as f64 / d.as_secs_f64(),
            _ => 0.0,
        };
        let total: u64 = rows_per_source.iter().sum();
        let progress = StreamingQueryProgress {
            id: self.shared.id,
            run_id: self.shared.run_id,
            name: self.shared.name.clone(),
            timestamp: format_timestamp(timestamp_ms),
            batch_id: batch,
            batch_duration: ms(trigger_ms),
            num_input_rows: total,
            input_rows_per_second: rate(total, since_last),
            processed_rows_per_second: rate(total, Some(processing)),
            duration_ms: durations,
            event_time: event_time.unwrap_or_default(),
            state_operators,
            sources: lp
                .streams
                .iter()
                .zip(&entry.sources)
                .zip(latest)
                .zip(&rows_per_source)
                .map(|(((s, r), latest), rows)| SourceProgress {
                    description: s.description(),
                    start_offset: Some(r.start.0.clone()),
                    end_offset: Some(r.end.0.clone()),
                    latest_offset: latest.map(|o| o.0),
                    num_input_rows: *rows,
                    input_rows_per_second: rate(*rows, since_last),
                    processed_rows_per_second: rate(*rows, Some(processing)),
                })
                .collect(),
            sink: SinkProgress {
                description: self.sink.description(),
                num_output_rows: output_rows as i64,
                metrics: self.sink.batch_metrics(),
            },
        };
        debug!(batch, rows = total, ms = ms(trigger_ms), "batch committed");
        self.shared
            .update(|s| push_recent(&mut s.recent, progress.clone()));
        self.manager
            .post(Event::Progress(Box::new(QueryProgressEvent { progress })));
        Ok(TriggerOutcome::Ran)
    }

    /// The progress entry of a trigger that found no new data (Spark's shape: the next batch's
    /// id, no rows, sink `numOutputRows` -1).
    fn no_data_progress(
        &self,
        lp: &Loop,
        timestamp_ms: i64,
        latest_offset: Duration,
        trigger: Duration,
    ) -> StreamingQueryProgress {
        let mut duration_ms = BTreeMap::new();
        duration_ms.insert("latestOffset".to_string(), ms(latest_offset));
        duration_ms.insert("triggerExecution".to_string(), ms(trigger));
        StreamingQueryProgress {
            id: self.shared.id,
            run_id: self.shared.run_id,
            name: self.shared.name.clone(),
            timestamp: format_timestamp(timestamp_ms),
            batch_id: lp.next_batch,
            batch_duration: ms(trigger),
            num_input_rows: 0,
            input_rows_per_second: 0.0,
            processed_rows_per_second: 0.0,
            duration_ms,
            event_time: if self.has_watermarks {
                BTreeMap::from([(
                    "watermark".to_string(),
                    format_timestamp(lp.last_batch_watermark_ms),
                )])
            } else {
                BTreeMap::new()
            },
            state_operators: vec![],
            sources: lp
                .streams
                .iter()
                .zip(&lp.starts)
                .map(|(s, start)| SourceProgress {
                    description: s.description(),
                    start_offset: Some(start.0.clone()),
                    end_offset: Some(start.0.clone()),
                    latest_offset: s.reported_latest_offset().map(|o| o.0),
                    num_input_rows: 0,
                    input_rows_per_second: 0.0,
                    processed_rows_per_second: 0.0,
                })
                .collect(),
            sink: SinkProgress {
                description: self.sink.description(),
                num_output_rows: -1,
                metrics: Default::default(),
            },
        }
    }

    /// getBatch, queryPlanning and addBatch of one batch. Returns rows read per source, rows
    /// written and the stateful operators' figures.
    async fn execute_batch(
        &mut self,
        lp: &mut Loop,
        batch: u64,
        entry: &OffsetEntry,
        durations: &mut BTreeMap<String, u64>,
    ) -> Result<Executed> {
        let t = Instant::now();
        let mut rows = Vec::with_capacity(entry.sources.len());
        for ((s, r), table) in lp.streams.iter_mut().zip(&entry.sources).zip(&self.tables) {
            let parts = s.get_batch(&r.start, &r.end).await?;
            rows.push(parts.iter().flatten().map(|b| b.num_rows() as u64).sum());
            table.set_batch(parts);
        }
        durations.insert("getBatch".into(), ms(t.elapsed()));
        pause_point("after_get_batch", batch);

        let t = Instant::now();
        // now() and current_date() read the batch's logged time, so a replay computes the same.
        let mut state = self.state.clone();
        state.execution_props_mut().query_execution_start_time =
            chrono::DateTime::from_timestamp_millis(entry.metadata.batch_timestamp_ms);
        let physical = state.create_physical_plan(&self.plan).await?;
        // Stateful operators read state version `batch` and commit `batch + 1`.
        let (physical, batch_state) = if self.state_run.is_some() || self.has_watermarks {
            let b = Arc::new(BatchState::new(
                self.state_run.as_ref().map(|(run, _)| Arc::clone(run)),
                batch,
                BatchWatermark {
                    late_ms: lp.last_batch_watermark_ms,
                    eviction_ms: entry.metadata.batch_watermark_ms,
                },
            ));
            (plan_stateful(physical, &b)?.0, Some(b))
        } else {
            (physical, None)
        };
        durations.insert("queryPlanning".into(), ms(t.elapsed()));

        let t = Instant::now();
        let schema = physical.schema();
        let output = collect(physical, self.state.task_ctx()).await;
        for table in &self.tables {
            table.clear();
        }
        let output = output?;
        let out_rows = output.iter().map(|b| b.num_rows()).sum();
        self.sink.add_batch(batch, schema, output).await?;
        pause_point("after_sink", batch);
        durations.insert("addBatch".into(), ms(t.elapsed()));
        Ok(Executed {
            rows_per_source: rows,
            output_rows: out_rows,
            state_operators: batch_state
                .as_ref()
                .map(|b| b.progress())
                .unwrap_or_default(),
            event_times: batch_state.map(|b| b.event_times()).unwrap_or_default(),
        })
    }
}

fn status(message: &str, data: bool, active: bool) -> crate::QueryStatus {
    crate::QueryStatus {
        message: message.into(),
        is_data_available: data,
        is_trigger_active: active,
    }
}

#[cfg(test)]
mod tests {
    use super::next_trigger_ms;

    #[test]
    fn processing_time_triggers_start_on_whole_intervals() {
        assert_eq!(next_trigger_ms(1_000, 1_000), 2_000);
        assert_eq!(next_trigger_ms(1_999, 1_000), 2_000);
        assert_eq!(next_trigger_ms(2_000, 1_000), 3_000);
        assert_eq!(next_trigger_ms(1_234, 0), 1_234);
    }
}
