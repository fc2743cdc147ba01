//! One update of a pipeline: every flow, stage after stage, into Delta tables under the
//! pipeline's storage.
//!
//! ```text
//! <storage>/tables/<dataset>                 each streaming table and materialized view (a
//!                                            Delta table; LOCATION '...' puts it elsewhere)
//! <storage>/_checkpoints/<table>/<flow>/     each flow's checkpoint: a streaming flow's
//!                                            offsets, commits and state; a once flow's id and
//!                                            its completion mark; a view's id
//!
//! per stage (flows of one stage run concurrently):
//!   append flow       the streaming query, trigger availableNow, into its table (Delta sink:
//!                     one commit per batch carrying the flow's txn, so a replay writes nothing)
//!   once flow         the batch query once: one Delta commit (txn: the flow's id, batch 0),
//!                     then the mark; a later update skips it
//!   materialized view the batch query, overwriting the table (one commit)
//! after a stage       its tables are registered by name: batch SQL reads them, STREAM name
//!                     streams their commits, for the next stages' flows
//! ```
//!
//! A flow that fails ends the update after its stage: the flows of later stages do not run
//! (they would read a table that missed its update), and the update reports which failed.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::dataframe::DataFrame;
use datafusion::prelude::SessionConfig;
use futures::future::join_all;
use weir_common::{ClassifiedError, Location, Options};
use weir_engine::{DataStreamWriter, Error, OutputMode, Trigger, WeirSession};
use weir_sinks::Sink;
use weir_sinks::delta::DeltaSink;

use serde_json::json;

use crate::events::UpdateEvents;
use crate::graph::{Dataset, DatasetKind, Flow, FlowKind, Graph};
use crate::spec::PipelineSpec;

/// How one flow of an update ended.
#[derive(Debug)]
pub struct FlowOutcome {
    /// The flow.
    pub flow: String,
    /// The dataset it writes.
    pub target: String,
    /// What it did, or why it failed.
    pub result: Result<FlowRun, Arc<Error>>,
}

/// What a flow did in an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlowRun {
    /// A streaming flow ran `batches` micro-batches reading `rows` rows.
    Streamed {
        /// Micro-batches run.
        batches: u64,
        /// Input rows read.
        rows: u64,
    },
    /// A once flow or a materialized view wrote `rows` rows.
    Wrote {
        /// Rows written.
        rows: u64,
    },
    /// A once flow that ran in an earlier update.
    AlreadyDone,
    /// Not run: another flow failed, or failed its checks before the update started.
    NotRun,
    /// Not run: the update refreshes other datasets only.
    NotSelected,
    /// A streaming flow that ran continuously until the update stopped.
    Continuous {
        /// Micro-batches with rows.
        batches: u64,
        /// Input rows read.
        rows: u64,
    },
}

/// What an update refreshes (`spark-pipelines run`'s selection flags).
#[derive(Debug, Clone, Default)]
pub struct UpdateOptions {
    /// `--refresh`: datasets to update; when this or `full_refresh` names any, only the named
    /// datasets update.
    pub refresh: Vec<String>,
    /// `--full-refresh`: datasets cleared, with every checkpoint of their flows, and recomputed
    /// (once flows run again).
    pub full_refresh: Vec<String>,
    /// `--full-refresh-all`: every dataset fully refreshed.
    pub full_refresh_all: bool,
    /// `--continuous`: after the update's first pass, the streaming flows keep running with
    /// this processing-time trigger interval and the materialized views are recomputed at
    /// each interval, until the update is stopped.
    pub continuous: Option<std::time::Duration>,
    /// The update's id; a new one if none (`weir serve` gives it before the update starts).
    pub update_id: Option<String>,
    /// Sees the update's events and its flows' micro-batches as they happen.
    pub observer: Option<crate::events::Observer>,
}

impl UpdateOptions {
    /// Refuses selections that do not mean one thing, as Spark does, before anything is read.
    pub fn check(&self) -> Result<(), ClassifiedError> {
        if self.full_refresh_all {
            let conflicting = if !self.full_refresh.is_empty() {
                Some("--full-refresh")
            } else if !self.refresh.is_empty() {
                Some("--refresh")
            } else {
                None
            };
            if let Some(option) = conflicting {
                return Err(ClassifiedError::new(
                    "CONFLICTING_PIPELINE_REFRESH_OPTIONS",
                    "42K06",
                    format!(
                        "--full-refresh-all conflicts with {option}: it fully refreshes every \
                         dataset, so naming datasets with {option} means nothing. Give one of \
                         the two."
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The datasets (keys) this update runs the flows of, and those it resets first.
    fn select(
        &self,
        graph: &Graph,
    ) -> Result<(BTreeSet<String>, BTreeSet<String>), ClassifiedError> {
        let stored: BTreeSet<String> = graph
            .datasets
            .iter()
            .filter(|(_, d)| d.kind != DatasetKind::TemporaryView)
            .map(|(k, _)| k.clone())
            .collect();
        let named = |names: &[String]| -> Result<BTreeSet<String>, ClassifiedError> {
            names
                .iter()
                .map(|n| {
                    let k = n.to_ascii_lowercase();
                    if stored.contains(&k) {
                        Ok(k)
                    } else {
                        Err(ClassifiedError::new(
                            "TABLE_OR_VIEW_NOT_FOUND",
                            "42P01",
                            format!(
                                "'{n}' is not a streaming table or materialized view of this \
                                 pipeline; its datasets are: {}.",
                                stored.iter().cloned().collect::<Vec<_>>().join(", ")
                            ),
                        ))
                    }
                })
                .collect()
        };
        let refresh = named(&self.refresh)?;
        let reset = if self.full_refresh_all {
            stored.clone()
        } else {
            named(&self.full_refresh)?
        };
        let update = if refresh.is_empty() && self.full_refresh.is_empty() {
            stored
        } else {
            refresh.union(&reset).cloned().collect()
        };
        Ok((update, reset))
    }
}

/// Where the pipeline keeps things.
#[derive(Debug, Clone)]
pub struct Layout {
    storage: String,
}

impl Layout {
    /// The layout under `storage` (a local path or a URL).
    pub fn new(storage: &str) -> Self {
        Self {
            storage: storage.trim_end_matches('/').to_string(),
        }
    }

    fn under(&self, rel: &str) -> String {
        format!("{}/{rel}", self.storage)
    }

    /// Where dataset `d` is stored.
    pub fn table(&self, d: &Dataset) -> String {
        d.table
            .as_ref()
            .and_then(|t| t.location.clone())
            .unwrap_or_else(|| self.under(&format!("tables/{}", d.name.to_ascii_lowercase())))
    }

    /// The checkpoints of every flow into `table`.
    pub fn checkpoints_of(&self, table: &str) -> String {
        self.under(&format!("_checkpoints/{}", table.to_ascii_lowercase()))
    }

    /// The checkpoint of `flow` into `table`.
    pub fn checkpoint(&self, table: &str, flow: &str) -> String {
        self.under(&format!(
            "_checkpoints/{}/{}",
            table.to_ascii_lowercase(),
            flow.to_ascii_lowercase()
        ))
    }
}

/// How long AUTO CDC remembers a delete (Databricks' table property, here a pipeline setting).
const TOMBSTONE_SETTING: &str = "pipelines.cdc.tombstoneGCThresholdInSeconds";

/// How often a continuous update's flows run (Databricks' pipeline setting): `weir serve`
/// reads it for a continuous pipeline; the CLI's `--trigger-interval` gives it there.
pub const TRIGGER_INTERVAL_SETTING: &str = "pipelines.trigger.interval";

/// The pipeline's AUTO CDC settings, kept in its sessions' configuration.
#[derive(Debug, Clone, Copy)]
struct CdcSettings {
    tombstone_ttl_ms: i64,
}

/// The plan of `flow`'s query; an AUTO CDC flow's reads its changes and applies them
/// ([`weir_planner::auto_cdc`]).
pub(crate) async fn flow_plan(
    session: &WeirSession,
    flow: &Flow,
) -> Result<datafusion::logical_expr::LogicalPlan, Error> {
    let plan = session.plan_sql(&flow.query).await?;
    let Some(cdc) = &flow.auto_cdc else {
        return Ok(plan);
    };
    let tombstone_ttl_ms = session
        .context()
        .state()
        .config()
        .get_extension::<CdcSettings>()
        .map_or(weir_planner::auto_cdc::DEFAULT_TOMBSTONE_TTL_MS, |s| {
            s.tombstone_ttl_ms
        });
    let options = weir_planner::auto_cdc::AutoCdcOptions::of(cdc, tombstone_ttl_ms);
    weir_planner::auto_cdc::auto_cdc(plan, &options).map_err(|e| {
        Error::from(ClassifiedError {
            message: format!("Flow '{}': {}", flow.name, e.message),
            ..e
        })
    })
}

/// A session with the spec's settings.
pub fn session_for(spec: &PipelineSpec) -> Result<WeirSession, Error> {
    let mut config = SessionConfig::new();
    for (k, v) in &spec.configuration {
        let lower = k.to_ascii_lowercase();
        if lower == "spark.sql.shuffle.partitions" || lower == "weir.sql.shuffle.partitions" {
            let n: usize = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                Error::user(
                    "INVALID_CONF_VALUE",
                    "22022",
                    format!("{k} must be a positive number of partitions, not '{v}'."),
                )
            })?;
            config = config.with_target_partitions(n);
        } else if lower == TOMBSTONE_SETTING.to_ascii_lowercase() {
            let seconds: i64 = v.trim().parse().ok().filter(|n| *n >= 0).ok_or_else(|| {
                Error::user(
                    "INVALID_CONF_VALUE",
                    "22022",
                    format!("{k} must be a whole number of seconds, not '{v}'."),
                )
            })?;
            config = config.with_extension(Arc::new(CdcSettings {
                tombstone_ttl_ms: seconds.saturating_mul(1000),
            }));
        } else if lower == TRIGGER_INTERVAL_SETTING {
            // Read where updates start; refused there when it is not a duration.
        } else if lower.starts_with("datafusion.") {
            config.options_mut().set(k, v).map_err(|e| {
                Error::user(
                    "INVALID_CONF_VALUE",
                    "22022",
                    format!("The pipeline setting {k} = '{v}' is refused: {e}."),
                )
            })?;
        } else {
            return Err(Error::user(
                "CONFIG_NOT_AVAILABLE",
                "42K0I",
                format!(
                    "The pipeline setting '{k}' is not one weir reads: give \
                     spark.sql.shuffle.partitions, {TOMBSTONE_SETTING}, \
                     {TRIGGER_INTERVAL_SETTING} or datafusion.* settings, or remove it."
                ),
            ));
        }
    }
    Ok(WeirSession::with_config(config))
}

/// Runs one update of the pipeline `spec` whose datasets and flows are `graph`: every flow,
/// stage after stage. Returns each flow's outcome in the order they ran.
pub async fn run_update(
    spec: &PipelineSpec,
    graph: &Graph,
    options: &UpdateOptions,
) -> Result<Vec<FlowOutcome>, Error> {
    run_update_until(spec, graph, options, std::future::pending()).await
}

/// [`run_update`]; a continuous update runs until `stop` completes (the CLI: Ctrl-C), then
/// stops its flows, and its events say CANCELED.
pub async fn run_update_until(
    spec: &PipelineSpec,
    graph: &Graph,
    options: &UpdateOptions,
    stop: impl std::future::Future<Output = ()>,
) -> Result<Vec<FlowOutcome>, Error> {
    options.check()?;
    let (update, reset) = options.select(graph)?;
    let mut events = UpdateEvents::new(
        &spec.name,
        &spec.storage,
        options.update_id.clone(),
        options.observer.clone(),
    );
    events.update(
        "create_update",
        format!(
            "Update {} of pipeline '{}' started.",
            events.update_id(),
            spec.name
        ),
        json!({ "create_update": {
            "refresh_selection": options.refresh,
            "full_refresh_selection": options.full_refresh,
            "full_refresh_all": options.full_refresh_all,
        }}),
    );
    let observed = |session: WeirSession| {
        if let Some(o) = &options.observer {
            session
                .streams()
                .add_listener(Arc::new(crate::events::FlowListener(Arc::clone(&o.0))));
        }
        session
    };
    let mut result = run_selected(spec, graph, &update, &reset, &mut events, &observed).await;
    let mut canceled = false;
    if let (Some(interval), Ok(outcomes)) = (options.continuous, &mut result)
        && outcomes.iter().all(|o| o.result.is_ok())
    {
        match run_continuously(spec, graph, &update, interval, &mut events, &observed, stop).await {
            Ok((more, stopped)) => {
                outcomes.extend(more);
                canceled = stopped;
            }
            Err(e) => result = Err(e),
        }
    }
    let (state, level_message) = match &result {
        Ok(outcomes) if canceled && outcomes.iter().all(|o| o.result.is_ok()) => (
            "CANCELED",
            "Update is CANCELED: it was stopped.".to_string(),
        ),
        Ok(outcomes) if outcomes.iter().all(|o| o.result.is_ok()) => {
            ("COMPLETED", "Update has COMPLETED.".to_string())
        }
        Ok(outcomes) => (
            "FAILED",
            format!(
                "Update has FAILED: {} flow(s) failed.",
                outcomes.iter().filter(|o| o.result.is_err()).count()
            ),
        ),
        Err(e) => ("FAILED", format!("Update has FAILED: {e}")),
    };
    events.update(
        "update_progress",
        level_message,
        json!({ "update_progress": { "state": state } }),
    );
    events.flush().await?;
    result
}

async fn run_selected(
    spec: &PipelineSpec,
    graph: &Graph,
    update: &BTreeSet<String>,
    reset: &BTreeSet<String>,
    events: &mut UpdateEvents,
    observed: &(dyn Fn(WeirSession) -> WeirSession + Sync),
) -> Result<Vec<FlowOutcome>, Error> {
    let layout = Layout::new(&spec.storage);
    // Every selected flow plans, and restarts from its checkpoint (unless a full refresh drops
    // it), before anything is written; otherwise the update does not start.
    let checks = crate::check::check_flows(&session_for(spec)?, &layout, graph).await?;
    let mut refused = vec![];
    for (flow, check) in graph.flows.iter().zip(checks) {
        let target = flow.target.to_ascii_lowercase();
        if !update.contains(&target) {
            continue;
        }
        if check.blocked_by.is_some() {
            continue;
        }
        let error = match (check.error, check.restart) {
            (Some(e), _) => Some(Arc::new(e)),
            (None, Some(r)) if !r.accepted && !reset.contains(&target) => {
                r.refusals.first().cloned()
            }
            _ => None,
        };
        if let Some(e) = error {
            events.flow_failed(&check.flow, &e);
            refused.push((check.flow, check.target, e));
        }
    }
    if !refused.is_empty() {
        let failing: BTreeSet<&str> = refused.iter().map(|(f, _, _)| f.as_str()).collect();
        let mut outcomes: Vec<FlowOutcome> = refused
            .iter()
            .map(|(flow, target, e)| FlowOutcome {
                flow: flow.clone(),
                target: target.clone(),
                result: Err(Arc::clone(e)),
            })
            .collect();
        outcomes.extend(
            graph
                .flows
                .iter()
                .filter(|f| !failing.contains(f.name.as_str()))
                .map(|f| FlowOutcome {
                    flow: f.name.clone(),
                    target: f.target.clone(),
                    result: Ok(FlowRun::NotRun),
                }),
        );
        return Ok(outcomes);
    }
    events.update(
        "update_progress",
        "Update is RUNNING.".into(),
        json!({ "update_progress": { "state": "RUNNING" } }),
    );
    events.flush().await?;
    let session = observed(session_for(spec)?);
    for k in reset {
        reset_dataset(&layout, &graph.datasets[k]).await?;
    }
    // Tables earlier updates wrote are readable before this update's flows run.
    register_tables(&session, &layout, graph).await;
    let mut outcomes = vec![];
    let mut failed = false;
    for stage in graph.stages()? {
        if failed {
            outcomes.extend(stage.iter().map(|&i| FlowOutcome {
                flow: graph.flows[i].name.clone(),
                target: graph.flows[i].target.clone(),
                result: Ok(FlowRun::NotRun),
            }));
            continue;
        }
        register_views(&session, graph).await;
        let (stage, skipped): (Vec<usize>, Vec<usize>) = stage
            .into_iter()
            .partition(|&i| update.contains(&graph.flows[i].target.to_ascii_lowercase()));
        outcomes.extend(skipped.iter().map(|&i| FlowOutcome {
            flow: graph.flows[i].name.clone(),
            target: graph.flows[i].target.clone(),
            result: Ok(FlowRun::NotSelected),
        }));
        for &i in &skipped {
            let f = &graph.flows[i];
            events.flow(
                &f.name,
                "EXCLUDED",
                format!(
                    "Flow '{}' is EXCLUDED: the update refreshes other datasets.",
                    f.name
                ),
                json!({}),
            );
        }
        for &i in &stage {
            let f = &graph.flows[i];
            events.flow(
                &f.name,
                "STARTING",
                format!("Flow '{}' is STARTING.", f.name),
                json!({}),
            );
        }
        let session = &session;
        let layout = &layout;
        let runs = sequential_groups(graph, &stage)
            .into_iter()
            .map(|group| async move {
                let mut out = vec![];
                for i in group {
                    let flow = &graph.flows[i];
                    let dataset = &graph.datasets[&flow.target.to_ascii_lowercase()];
                    out.push((i, run_flow(session, layout, graph, dataset, flow).await));
                }
                out
            });
        let mut by_flow: std::collections::BTreeMap<usize, _> =
            join_all(runs).await.into_iter().flatten().collect();
        let results: Vec<_> = stage.iter().filter_map(|i| by_flow.remove(i)).collect();
        for (&i, (result, progress)) in stage.iter().zip(results) {
            let name = &graph.flows[i].name;
            for p in progress {
                events.flow(
                    name,
                    "RUNNING",
                    format!("Flow '{name}' ran a micro-batch."),
                    json!({ "progress": p }),
                );
            }
            match &result {
                Ok(FlowRun::AlreadyDone) => events.flow(
                    name,
                    "SKIPPED",
                    format!("Flow '{name}' is SKIPPED: a once flow that ran in an earlier update."),
                    json!({}),
                ),
                Ok(run) => events.flow(
                    name,
                    "COMPLETED",
                    format!("Flow '{name}' has COMPLETED."),
                    json!({ "metrics": metrics(run) }),
                ),
                Err(e) => events.flow_failed(name, e),
            }
            failed |= result.is_err();
            outcomes.push(FlowOutcome {
                flow: graph.flows[i].name.clone(),
                target: graph.flows[i].target.clone(),
                result,
            });
        }
        for &i in &stage {
            let d = &graph.datasets[&graph.flows[i].target.to_ascii_lowercase()];
            let _ = session
                .register_delta_table(&d.name, &layout.table(d), &Options::new())
                .await;
        }
        events.flush().await?;
    }
    Ok(outcomes)
}

/// The flows of a stage as groups that run concurrently, each group's flows one after the
/// other: the AUTO CDC flows into one table form a group, once flows (an initial snapshot)
/// first, so their MERGEs never race and a snapshot lands before the changes that follow it;
/// every other flow is a group of its own.
fn sequential_groups(graph: &Graph, stage: &[usize]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = vec![];
    let mut by_target: std::collections::BTreeMap<String, usize> = Default::default();
    for &i in stage {
        let flow = &graph.flows[i];
        if flow.auto_cdc.is_none() {
            groups.push(vec![i]);
            continue;
        }
        match by_target.get(&flow.target.to_ascii_lowercase()) {
            Some(&g) => groups[g].push(i),
            None => {
                by_target.insert(flow.target.to_ascii_lowercase(), groups.len());
                groups.push(vec![i]);
            }
        }
    }
    for g in &mut groups {
        g.sort_by_key(|&i| (graph.flows[i].kind != FlowKind::Once, i));
    }
    groups
}

/// A full refresh of `d`: every checkpoint of its flows goes (once flows run again), and its
/// table is emptied by an overwrite commit, so the versions before stay readable (`VERSION AS
/// OF`) for a backfill.
async fn reset_dataset(layout: &Layout, d: &Dataset) -> Result<(), Error> {
    let checkpoints = Location::parse(&layout.checkpoints_of(&d.name))?;
    checkpoints.delete_all().await?;
    let path = layout.table(d);
    let url = weir_common::delta::table_url(&path, false)?;
    let Ok(table) = weir_common::delta::open(&url, &Default::default()).await else {
        return Ok(());
    };
    if table.version().is_none() {
        return Ok(());
    }
    let schema = table
        .snapshot()
        .map_err(|e| weir_common::delta::error(e, "read the table's schema"))?
        .snapshot()
        .arrow_schema();
    let sink = DeltaSink::try_new(
        &Options::new().with("path", &path),
        &schema,
        OutputMode::Complete,
    )?;
    sink.open(&uuid::Uuid::new_v4().to_string()).await?;
    sink.add_batch(0, schema, vec![]).await?;
    Ok(())
}

/// The source options that say where a source starts: a flow whose query gives one starts its
/// sources there after `--reset-checkpoint`, instead of where the checkpoint left off.
const STARTING_OPTIONS: [&str; 5] = [
    "modifiedafter",
    "startingoffsets",
    "startingversion",
    "startingtimestamp",
    "startingoffsetsbytimestamp",
];

/// `--reset-checkpoint`: fits each named flow's checkpoint to its query as `weir checkpoint
/// reset --query` does (state that still fits stays, changed or removed operators start empty
/// or go), and starts every source of the flow anew: from a position derived from the
/// checkpoint's committed offsets, or, where the flow's query gives a starting option
/// (`modifiedAfter`, `startingOffsets`, `startingVersion`, ...), from there; gaps and overlaps
/// against the committed offsets are warnings in the report. The table and every other flow are
/// left as they are. A flow without a checkpoint yet has nothing to reset.
pub async fn reset_flows(
    spec: &PipelineSpec,
    graph: &Graph,
    flows: &[String],
) -> Result<Vec<(String, weir_engine::tools::reset::ResetReport)>, Error> {
    let layout = Layout::new(&spec.storage);
    let mut selected = vec![];
    for name in flows {
        let Some(flow) = graph
            .flows
            .iter()
            .find(|f| f.name.eq_ignore_ascii_case(name))
        else {
            return Err(Error::user(
                "PIPELINE_FLOW_NOT_FOUND",
                "42704",
                format!(
                    "'{name}' is not a flow of this pipeline; its flows are: {}. Nothing was \
                     reset.",
                    graph
                        .flows
                        .iter()
                        .map(|f| f.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        };
        if flow.kind != FlowKind::Append {
            return Err(Error::user(
                "PIPELINE_FLOW_CHECKPOINT_NOT_RESETTABLE",
                "42K06",
                format!(
                    "Flow '{}' is a once flow or a materialized view: it keeps no streaming \
                     checkpoint to reset. A full refresh of '{}' (--full-refresh) runs it \
                     again. Nothing was reset.",
                    flow.name, flow.target
                ),
            ));
        }
        selected.push(flow);
    }
    let session = session_for(spec)?;
    register_tables(&session, &layout, graph).await;
    register_views(&session, graph).await;
    let mut reports = vec![];
    for flow in selected {
        let dataset = &graph.datasets[&flow.target.to_ascii_lowercase()];
        let checkpoint = layout.checkpoint(&dataset.name, &flow.name);
        let started =
            Location::parse_existing_with(&checkpoint, std::iter::empty::<(&str, &str)>()).ok();
        let started = match started {
            Some(l) => l.exists("metadata").await.unwrap_or(false),
            None => false,
        };
        if !started {
            continue;
        }
        let plan = flow_plan(&session, flow).await?;
        let sources: Vec<String> = (0..weir_planner::streaming_tables(&plan).len())
            .map(|i| i.to_string())
            .collect();
        let lower = flow.query.to_ascii_lowercase();
        let from_start = STARTING_OPTIONS.iter().any(|o| lower.contains(o));
        let df = DataFrame::new(session.context().state(), plan);
        let report = flow_writer(&session, &layout, dataset, flow, df, Trigger::AvailableNow)
            .reset_checkpoint_sources(&sources, from_start)
            .await?;
        reports.push((flow.name.clone(), report));
    }
    Ok(reports)
}

/// The writer of streaming flow `flow` into `dataset`: the Delta sink at the table (with its
/// partitioning), the flow's checkpoint and `trigger`.
pub(crate) fn flow_writer(
    session: &WeirSession,
    layout: &Layout,
    dataset: &Dataset,
    flow: &Flow,
    df: DataFrame,
    trigger: Trigger,
) -> DataStreamWriter {
    // An AUTO CDC flow's sink merges on its keys.
    let merge_keys =
        weir_planner::auto_cdc::AutoCdcNode::of(df.logical_plan()).map(|n| n.keys.join(","));
    let mut writer = session
        .write_stream(df)
        .format("delta")
        .option("path", layout.table(dataset))
        .checkpoint_location(layout.checkpoint(&dataset.name, &flow.name))
        .query_name(flow.name.clone())
        .trigger(trigger);
    if let Some(t) = &dataset.table
        && !t.partitioned_by.is_empty()
    {
        writer = writer.option("partitionBy", t.partitioned_by.join(","));
    }
    if let Some(keys) = merge_keys {
        writer = writer.option("weir.autoCdc.keys", keys);
    }
    writer
}

/// Makes every stored dataset whose table exists readable by name (batch SQL and `STREAM
/// name`): what earlier updates wrote, before this one's flows run.
pub(crate) async fn register_tables(session: &WeirSession, layout: &Layout, graph: &Graph) {
    for d in graph.datasets.values() {
        if d.kind != DatasetKind::TemporaryView {
            let _ = session
                .register_delta_table(&d.name, &layout.table(d), &Options::new())
                .await;
        }
    }
}

/// Registers the earlier table versions `flow` reads (a backfill's `t VERSION AS OF n`) under
/// the names its query reads them by.
pub(crate) async fn register_time_travel(
    session: &WeirSession,
    layout: &Layout,
    graph: &Graph,
    flow: &Flow,
) -> Result<(), Error> {
    use weir_engine::delta_table::TableAt;
    use weir_planner::pipeline::AsOf;
    for t in &flow.time_travel {
        let Some(d) = graph
            .datasets
            .get(&t.table.to_ascii_lowercase())
            .filter(|d| d.kind != DatasetKind::TemporaryView)
        else {
            return Err(Error::user(
                "TABLE_OR_VIEW_NOT_FOUND",
                "42P01",
                format!(
                    "Flow '{}' reads '{}' as of an earlier version, but it is not a streaming \
                     table or materialized view of this pipeline: only the pipeline's own \
                     tables keep their versions here.",
                    flow.name, t.table
                ),
            ));
        };
        let at = match &t.as_of {
            AsOf::Version(v) => TableAt::Version(*v),
            AsOf::Timestamp(ts) => TableAt::Timestamp(parse_time(ts).ok_or_else(|| {
                Error::user(
                    "INVALID_TIMESTAMP_AS_OF",
                    "22007",
                    format!(
                        "TIMESTAMP AS OF '{ts}' is not a time: write '2026-12-01 10:00:00' \
                         (UTC), '2026-12-01', or RFC 3339 ('2026-12-01T10:00:00+01:00')."
                    ),
                )
            })?),
        };
        session
            .register_delta_table_at(&t.alias, &layout.table(d), &Options::new(), Some(at))
            .await?;
    }
    Ok(())
}

/// A time as `TIMESTAMP AS OF` takes it: RFC 3339, or a date and time (UTC), or a date.
fn parse_time(s: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    use chrono::{NaiveDate, NaiveDateTime, TimeZone, Utc};
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Some(t.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, format) {
            return Some(Utc.from_utc_datetime(&t));
        }
    }
    NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| Utc.from_utc_datetime(&t))
}

/// Registers every temporary view whose query plans now (the tables it reads exist): a view
/// over a table a later stage writes first is registered before that stage. A view that does
/// not plan stays unregistered; a flow reading it fails with the view's name.
pub(crate) async fn register_views(session: &WeirSession, graph: &Graph) {
    for d in graph.datasets.values() {
        if let (DatasetKind::TemporaryView, Some(q)) = (d.kind, &d.query)
            && let Ok(plan) = session.plan_sql(q).await
        {
            let view = datafusion::datasource::ViewTable::new(plan, Some(q.clone()));
            let _ = session.context().deregister_table(d.name.as_str());
            let _ = session
                .context()
                .register_table(d.name.as_str(), Arc::new(view));
        }
    }
}

/// The continuous part of an update: every selected streaming flow runs with a processing-time
/// trigger of `interval`, the materialized views are recomputed (in dependency order) at each
/// interval, until `stop` completes (returns true) or a flow fails (false, with its outcome).
async fn run_continuously(
    spec: &PipelineSpec,
    graph: &Graph,
    update: &BTreeSet<String>,
    interval: std::time::Duration,
    events: &mut UpdateEvents,
    observed: &(dyn Fn(WeirSession) -> WeirSession + Sync),
    stop: impl std::future::Future<Output = ()>,
) -> Result<(Vec<FlowOutcome>, bool), Error> {
    let session = observed(session_for(spec)?);
    let layout = Layout::new(&spec.storage);
    register_tables(&session, &layout, graph).await;
    register_views(&session, graph).await;
    let selected = |f: &&Flow| update.contains(&f.target.to_ascii_lowercase());
    let mut queries = vec![];
    for flow in graph
        .flows
        .iter()
        .filter(|f| f.kind == FlowKind::Append)
        .filter(selected)
    {
        let dataset = &graph.datasets[&flow.target.to_ascii_lowercase()];
        let plan = flow_plan(&session, flow).await?;
        let df = DataFrame::new(session.context().state(), plan);
        let writer = flow_writer(
            &session,
            &layout,
            dataset,
            flow,
            df,
            Trigger::ProcessingTime(interval),
        );
        queries.push((flow, writer.start().await?));
        events.flow(
            &flow.name,
            "RUNNING",
            format!("Flow '{}' is RUNNING continuously.", flow.name),
            json!({}),
        );
    }
    let mut views = vec![];
    for stage in graph.stages()? {
        views.extend(
            stage
                .into_iter()
                .map(|i| &graph.flows[i])
                .filter(|f| f.kind == FlowKind::Complete)
                .filter(selected),
        );
    }
    let mut outcomes = vec![];
    let mut stopped = false;
    tokio::pin!(stop);
    let mut ticks = tokio::time::interval(interval);
    'run: loop {
        tokio::select! {
            () = &mut stop => {
                stopped = true;
                break 'run;
            }
            _ = ticks.tick() => {
                for (flow, q) in &queries {
                    if let Some(e) = q.exception() {
                        events.flow_failed(&flow.name, &e.cause);
                        outcomes.push(FlowOutcome {
                            flow: flow.name.clone(),
                            target: flow.target.clone(),
                            result: Err(e.cause),
                        });
                        break 'run;
                    }
                }
                for flow in &views {
                    let dataset = &graph.datasets[&flow.target.to_ascii_lowercase()];
                    let (result, _) = run_flow(&session, &layout, graph, dataset, flow).await;
                    if let Err(e) = result {
                        events.flow_failed(&flow.name, &e);
                        outcomes.push(FlowOutcome {
                            flow: flow.name.clone(),
                            target: flow.target.clone(),
                            result: Err(e),
                        });
                        break 'run;
                    }
                }
            }
        }
    }
    for (flow, q) in &queries {
        q.stop().await;
        let progress = q.recent_progress();
        let ran: Vec<_> = progress.iter().filter(|p| p.num_input_rows > 0).collect();
        for p in &ran {
            if let Ok(v) = serde_json::to_value(p) {
                events.flow(
                    &flow.name,
                    "RUNNING",
                    format!("Flow '{}' ran a micro-batch.", flow.name),
                    json!({ "progress": v }),
                );
            }
        }
        let run = FlowRun::Continuous {
            batches: ran.len() as u64,
            rows: ran.iter().map(|p| p.num_input_rows).sum(),
        };
        events.flow(
            &flow.name,
            "STOPPED",
            format!("Flow '{}' is STOPPED.", flow.name),
            json!({ "metrics": metrics(&run) }),
        );
        if !outcomes.iter().any(|o: &FlowOutcome| o.flow == flow.name) {
            outcomes.push(FlowOutcome {
                flow: flow.name.clone(),
                target: flow.target.clone(),
                result: Ok(run),
            });
        }
    }
    Ok((outcomes, stopped))
}

/// A flow's figures for its `COMPLETED` event.
fn metrics(run: &FlowRun) -> serde_json::Value {
    match run {
        FlowRun::Streamed { batches, rows } | FlowRun::Continuous { batches, rows } => {
            json!({ "num_batches": batches, "num_input_rows": rows })
        }
        FlowRun::Wrote { rows } => json!({ "num_output_rows": rows }),
        _ => json!({}),
    }
}

/// Runs one flow: how it ended, and the progress records of the micro-batches it ran (Spark's
/// JSON).
async fn run_flow(
    session: &WeirSession,
    layout: &Layout,
    graph: &Graph,
    dataset: &Dataset,
    flow: &Flow,
) -> (Result<FlowRun, Arc<Error>>, Vec<serde_json::Value>) {
    let mut progress = vec![];
    let result = run_flow_inner(session, layout, graph, dataset, flow, &mut progress)
        .await
        .map_err(|e| match e {
            Failed::Query(e) => e,
            Failed::Other(e) => Arc::new(e),
        });
    (result, progress)
}

/// Why a flow failed: its streaming query's error (shared with the query's handle), or any
/// other.
enum Failed {
    Query(Arc<Error>),
    Other(Error),
}

impl<E: Into<Error>> From<E> for Failed {
    fn from(e: E) -> Self {
        Failed::Other(e.into())
    }
}

async fn run_flow_inner(
    session: &WeirSession,
    layout: &Layout,
    graph: &Graph,
    dataset: &Dataset,
    flow: &Flow,
    progress_out: &mut Vec<serde_json::Value>,
) -> Result<FlowRun, Failed> {
    let table = layout.table(dataset);
    let checkpoint = layout.checkpoint(&dataset.name, &flow.name);
    match flow.kind {
        FlowKind::Append => {
            let plan = flow_plan(session, flow).await?;
            let df = DataFrame::new(session.context().state(), plan);
            let query = flow_writer(session, layout, dataset, flow, df, Trigger::AvailableNow)
                .start()
                .await?;
            let ended = query.await_termination().await;
            let progress = query.recent_progress();
            progress_out.extend(
                progress
                    .iter()
                    .filter(|p| p.num_input_rows > 0)
                    .filter_map(|p| serde_json::to_value(p).ok()),
            );
            if let Err(e) = ended {
                return Err(Failed::Query(e.cause));
            }
            Ok(FlowRun::Streamed {
                batches: progress.iter().filter(|p| p.num_input_rows > 0).count() as u64,
                rows: progress.iter().map(|p| p.num_input_rows).sum(),
            })
        }
        FlowKind::Once | FlowKind::Complete => {
            let dir = Location::parse(&checkpoint)?;
            if flow.kind == FlowKind::Once && dir.exists("once-complete").await.map_err(io)? {
                return Ok(FlowRun::AlreadyDone);
            }
            // The flow's id: the Delta txn's appId, the same in every update, so that a
            // replayed write is skipped.
            let _ = dir
                .put_if_absent("id", uuid::Uuid::new_v4().to_string().into())
                .await
                .map_err(io)?;
            let id = dir.get("id").await.map_err(io)?.unwrap_or_default();
            let id = String::from_utf8_lossy(&id).trim().to_string();
            register_time_travel(session, layout, graph, flow).await?;
            let plan = flow_plan(session, flow).await?;
            if weir_planner::is_streaming(&plan) {
                return Err(Failed::Other(Error::user(
                    "INVALID_FLOW_QUERY_TYPE.STREAMING_RELATION_FOR_ONCE_FLOW",
                    "42000",
                    format!(
                        "Flow '{}' reads a stream, but a {} runs a batch query: read the table \
                         without STREAM.",
                        flow.name,
                        if flow.kind == FlowKind::Once {
                            "once flow"
                        } else {
                            "materialized view"
                        }
                    ),
                )));
            }
            let mut sink_options = Options::new().with("path", &table);
            let (schema, batches, rows) = match weir_planner::auto_cdc::AutoCdcNode::of(&plan) {
                // An AUTO CDC once flow (an initial snapshot): its changes applied as the
                // stream's first batch would be, merged into the table.
                Some(node) => {
                    let input = DataFrame::new(session.context().state(), node.input.clone());
                    let changes = input.collect().await?;
                    let rows = changes.iter().map(|b| b.num_rows() as u64).sum();
                    let out = weir_engine::auto_cdc_apply_once(node, changes)?;
                    sink_options.set("weir.autoCdc.keys", node.keys.join(","));
                    (out.schema(), vec![out], rows)
                }
                None => {
                    let df = DataFrame::new(session.context().state(), plan);
                    let schema = Arc::new(df.schema().as_arrow().clone());
                    let batches = df.collect().await?;
                    let rows = batches.iter().map(|b| b.num_rows() as u64).sum();
                    (schema, batches, rows)
                }
            };
            let mode = if flow.kind == FlowKind::Once {
                OutputMode::Append
            } else {
                OutputMode::Complete
            };
            let sink = DeltaSink::try_new(&sink_options, &schema, mode)?;
            sink.open(&id).await?;
            // A once flow writes batch 0 once; a view's every update is a new batch.
            let batch = if flow.kind == FlowKind::Once {
                0
            } else {
                chrono_ms()
            };
            sink.add_batch(batch, schema, batches).await?;
            if flow.kind == FlowKind::Once {
                dir.put_if_absent("once-complete", bytes::Bytes::new())
                    .await
                    .map_err(io)?;
            }
            Ok(FlowRun::Wrote { rows })
        }
    }
}

fn chrono_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

fn io(e: object_store::Error) -> Failed {
    Failed::Other(Error::from(ClassifiedError::new(
        "PIPELINE_STORAGE_ERROR",
        "58030",
        format!("The pipeline's storage could not be read or written: {e}."),
    )))
}
