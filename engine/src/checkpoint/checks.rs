//! The restart checks `start`, `validate` and the reset share (DESIGN.md §6): sources, sink,
//! stateful operators, the state store. Each is a function of what the checkpoint recorded and
//! what the query plans; only `check_sink` writes (the sink record, once the check passed).

use std::sync::Arc;

use datafusion::logical_expr::LogicalPlan;
use weir_planner::StreamingTable;

use crate::checkpoint::RestartPoint;
use crate::checkpoint::source_evolution::{QuerySource, SOURCE_EVOLUTION};
use crate::stateful::{
    BatchState, BatchWatermark, OperatorInfo, StateBackend, StateMetadata, StateRun, plan_stateful,
};
use crate::{Checkpoint, Error, Result};

/// The restart rule for sources: by position, or by name with source evolution (which must be
/// on or off as when the checkpoint was created). Returns the names the query no longer has.
pub(crate) async fn check_restart_sources(
    checkpoint: &Checkpoint,
    restart: Option<&RestartPoint>,
    sources: &[QuerySource],
    evolution: bool,
) -> Result<Vec<String>> {
    let Some(r) = restart else {
        return Ok(vec![]);
    };
    crate::checkpoint::source_evolution::check_setting(r.logged_conf(SOURCE_EVOLUTION), evolution)?;
    if !evolution {
        let identities: Vec<String> = sources.iter().map(|s| s.identity.clone()).collect();
        r.check_sources(&identities)?;
        return Ok(vec![]);
    }
    let (batch, entry) = r.entry();
    let removed = checkpoint.removed_sources().await?;
    crate::checkpoint::source_evolution::check_named(&entry.sources, batch, sources, &removed)
}

/// The last committed batch and the batch a restart runs first.
pub(crate) fn next_batch(restart: Option<&RestartPoint>) -> (Option<u64>, u64) {
    match restart {
        None => (None, 0),
        Some(RestartPoint::After { last, .. }) => (Some(*last), last + 1),
        Some(RestartPoint::Replay { batch, .. }) => (batch.checked_sub(1), *batch),
    }
}

/// Plans the query once without rows to learn its stateful operators, and refuses it when the
/// checkpoint's state (`stored`, its record of them) cannot serve them (DESIGN.md §6). Nothing
/// is executed.
pub(crate) async fn check_state(
    state: &datafusion::execution::SessionState,
    plan: &LogicalPlan,
    tables: &[Arc<StreamingTable>],
    run: &Arc<StateRun>,
    stored: Option<&StateMetadata>,
    committed: bool,
    allow_definition_change: bool,
) -> Result<Vec<OperatorInfo>> {
    let operators = planned_operators(state, plan, tables, run).await?;
    check_operators(stored, &operators, committed, allow_definition_change)?;
    Ok(operators)
}

/// The stateful operators the query plans, learnt by planning it once without rows.
pub(crate) async fn planned_operators(
    state: &datafusion::execution::SessionState,
    plan: &LogicalPlan,
    tables: &[Arc<StreamingTable>],
    run: &Arc<StateRun>,
) -> Result<Vec<OperatorInfo>> {
    for t in tables {
        t.set_batch(vec![]);
    }
    let physical = state.create_physical_plan(plan).await;
    for t in tables {
        t.clear();
    }
    let batch = Arc::new(BatchState::new(
        Some(Arc::clone(run)),
        0,
        BatchWatermark::default(),
    ));
    let (_, operators): (_, Vec<OperatorInfo>) = plan_stateful(physical?, &batch)?;
    Ok(operators)
}

/// The restart rule for stateful operators: `stored` is the checkpoint's record of them, and
/// `committed` says whether some batch committed.
pub(crate) fn check_operators(
    stored: Option<&StateMetadata>,
    operators: &[OperatorInfo],
    committed: bool,
    allow_definition_change: bool,
) -> Result<()> {
    match stored {
        Some(stored) => stored.check(operators, allow_definition_change),
        // A checkpoint whose batches ran without state: the new operators would start empty,
        // as if the earlier rows had never been seen.
        None if committed => {
            StateMetadata { operators: vec![] }.check(operators, allow_definition_change)
        }
        None => Ok(()),
    }
}

/// Refuses a checkpoint with committed batches whose state was kept in memory.
pub(crate) fn check_state_durable(backend: &str, committed: bool) -> Result<()> {
    if committed && backend == StateBackend::Memory.name() {
        return Err(Error::user(
            "STATE_STORE_NOT_DURABLE",
            "0A000",
            "This checkpoint's state was kept in memory (stateStore 'memory'), which does not \
             survive the run that wrote it, so the query cannot continue from it. Start it with \
             a new checkpoint location, and use the rocksdb state store for queries that must \
             survive a restart.",
        ));
    }
    Ok(())
}

/// Refuses a restart whose exactly-once sink writes somewhere else than the checkpoint's
/// batches went (their output would be split between two places), and records the sink.
/// Writing to a sink without an identity (console, Kafka, foreach-batch) after a file sink is
/// allowed, as Spark allows a file sink changed to Kafka; the reverse is refused.
pub(crate) async fn check_sink(
    checkpoint: &Checkpoint,
    now: &crate::checkpoint::SinkRecord,
    logged: bool,
) -> Result<()> {
    let was = checkpoint.read_sink().await?;
    check_sink_change(was.as_ref(), now, logged)?;
    check_sink_query_id(checkpoint, was.as_ref())?;
    let now = crate::checkpoint::SinkRecord {
        query_id: Some(checkpoint.id()),
        ..now.clone()
    };
    if was.as_ref() != Some(&now) {
        checkpoint.write_sink(&now).await?;
    }
    Ok(())
}

/// The sink's own record of its batches against the checkpoint's ([`Sink::check_batches`]):
/// `was` is the checkpoint's record of the sink; only when it names `sink` was the sink given
/// every batch, so that each committed one must be there. Writes nothing.
///
/// [`Sink::check_batches`]: weir_sinks::Sink::check_batches
pub(crate) async fn check_sink_batches(
    checkpoint: &Checkpoint,
    sink: &dyn weir_sinks::Sink,
    now: &crate::checkpoint::SinkRecord,
    was: Option<&crate::checkpoint::SinkRecord>,
    restart: Option<&RestartPoint>,
) -> Result<()> {
    let query_id = checkpoint.id().to_string();
    let every_batch = was.is_some_and(|w| w.same_target(now));
    let (last_committed, _) = next_batch(restart);
    sink.check_batches(&weir_sinks::CheckpointBatches {
        query_id: &query_id,
        last_committed: last_committed.filter(|_| every_batch),
        last_planned: restart.map(RestartPoint::last_planned),
        every_batch_recorded: crate::api::created_with(
            restart.map(RestartPoint::logged),
            crate::api::EVERY_BATCH_RECORDED,
        ),
    })
    .await?;
    Ok(())
}

/// Refuses a checkpoint whose `metadata` holds another query ID than the one its batches were
/// written with (`was`, the sink record): an exactly-once sink recognises a replayed batch by
/// the ID, so with another one it would write the batch again. Both files are checksummed, so
/// this is one of them replaced (from another checkpoint, or by hand), not a flipped bit.
pub(crate) fn check_sink_query_id(
    checkpoint: &Checkpoint,
    was: Option<&crate::checkpoint::SinkRecord>,
) -> Result<()> {
    match was.and_then(|w| w.query_id) {
        Some(written) if written != checkpoint.id() => Err(Error::Corrupt {
            file: format!("{}/metadata", checkpoint.location().display()),
            problem: format!(
                "holds the query ID {}, but the checkpoint's batches were written with the ID \
                 {written} (its 'sink' record): with another ID an exactly-once sink would \
                 write a replayed batch again, so one of the two files was replaced",
                checkpoint.id()
            ),
        }),
        _ => Ok(()),
    }
}

/// The restart rule for sinks: `was` is the checkpoint's record (when `logged`, some batch was
/// planned), `now` the query's sink.
pub(crate) fn check_sink_change(
    was: Option<&crate::checkpoint::SinkRecord>,
    now: &crate::checkpoint::SinkRecord,
    logged: bool,
) -> Result<()> {
    if let (true, Some(was), Some(identity)) = (logged, was, &now.identity)
        && (was.format != now.format || was.identity.as_ref() != Some(identity))
    {
        let target = |r: &crate::checkpoint::SinkRecord| match &r.identity {
            Some(i) => format!("the {} sink at '{i}'", r.format),
            None => format!("the {} sink", r.format),
        };
        return Err(Error::user(
            "STREAMING_SINK_CHANGED",
            "42K03",
            format!(
                "The checkpoint's batches were written to {}, but the query now writes to {}. \
                 An exactly-once sink's output belongs to the checkpoint's batches: the new \
                 target would miss the batches already written and would not be read with \
                 them. Write to {} again, or start the changed query with a new checkpoint \
                 location.",
                target(was),
                target(now),
                target(was)
            ),
        ));
    }
    Ok(())
}

/// The partition count is fixed when the checkpoint is created (state is partitioned by it): a
/// restart reuses the count of the checkpoint's state (which `weir checkpoint repartition`
/// changes), else the logged value; a different session value is reported, not applied, as
/// Spark does with spark.sql.shuffle.partitions.
pub(crate) fn partitions_for(
    restart: Option<&RestartPoint>,
    stored: Option<&StateMetadata>,
    state: &datafusion::execution::SessionState,
) -> usize {
    stored
        .and_then(|m| m.operators.first())
        .map(|o| o.num_partitions)
        .or_else(|| restart.and_then(|r| r.logged_partitions()))
        .unwrap_or_else(|| state.config().target_partitions())
}
