//! Stateful operators (DESIGN.md §5): how a batch's physical plan gets them, and what they
//! share.
//!
//! DataFusion plans each batch as if it were a table. [`plan_stateful`] then walks the
//! physical plan top-down and replaces each operator that needs state across batches and sees
//! the stream (it has a `StreamScanExec` below it) with weir's stateful version, giving it the
//! next operator ID (0, 1, ... in that order, as Spark numbers its stateful operators). Each
//! stateful operator reads and writes one state store per shuffle partition at the batch's
//! version, commits it when its partition finishes, and reports its figures for the batch's
//! progress record.

mod aggregate;
mod auto_cdc;
mod changelog;
mod dedupe;
mod join;
mod kind;
mod metadata;
mod operator;
mod session;
#[cfg(test)]
mod testing;
mod top_n;
mod watermark;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use datafusion::error::Result;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use weir_planner::StreamScanExec;
use weir_sinks::OutputMode;
use weir_state::{
    MemoryStateStoreProvider, RocksDbConfig, RocksDbStateStoreProvider, StateStoreProvider,
};

use aggregate::StreamingAggregate;
pub(crate) use metadata::{OperatorInfo, StateLayout, StateMetadata, same_types};
use operator::StatefulExec;

/// The column an operator's state key starts with when the key has an event-time component
/// (so that watermark eviction is a range scan); the shuffle key is the rest.
pub(crate) const EVENT_TIME_KEY: &str = "__event_time_us";
pub use auto_cdc::apply_once as auto_cdc_apply_once;
pub(crate) use join::stored as join_state;
pub(crate) use kind::{OperatorKind, Placement, decode_rows, value_struct};
use watermark::WatermarkExec;
pub(crate) use watermark::{
    EventTimeStats, WeirQueryPlanner, next_watermark_ms, record_event_times,
};

use crate::execution::progress::StateOperatorProgress;
use crate::{Error, Result as EngineResult};

/// Where stateful operators keep their state (Spark's
/// `spark.sql.streaming.stateStore.providerClass`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateBackend {
    /// RocksDB instances on local disk, made durable as changelogs in the checkpoint (the
    /// default): state may be larger than memory and survives restarts.
    RocksDb(RocksDbConfig),
    /// Process memory: fast, for tests; the state does not survive the run, so a query
    /// with state cannot be restarted from its checkpoint.
    Memory,
}

impl Default for StateBackend {
    fn default() -> Self {
        Self::RocksDb(RocksDbConfig::default())
    }
}

impl StateBackend {
    /// The name users configure (`rocksdb`, `memory`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::RocksDb(_) => "rocksdb",
            Self::Memory => "memory",
        }
    }

    /// Parses a configured name.
    pub fn parse(name: &str) -> EngineResult<Self> {
        match name.to_ascii_lowercase().as_str() {
            "rocksdb" => Ok(Self::default()),
            "memory" => Ok(Self::Memory),
            other => Err(Error::user(
                "STREAMING_INVALID_OPTION",
                "42616",
                format!("Unknown state store '{other}': use 'rocksdb' (default) or 'memory'."),
            )),
        }
    }
}

/// What a checkpoint records of one operator's state: where it lives when a reset moved it, and
/// its stores (an operator whose layout changed since an earlier weir keeps the recorded one
/// where it can).
#[derive(Debug)]
struct Recorded {
    layout: Option<StateLayout>,
    stores: Vec<String>,
}

/// A directory removed when dropped.
#[derive(Debug)]
struct ScratchDir(Option<PathBuf>);

/// `<temp>/<kind>-<query id>-<run id>`, a folder of this run, after removing the folders of
/// the query's earlier runs: the checkpoint's lock or lease is ours, so those were left by
/// runs that died.
pub(crate) fn run_scratch_dir(kind: &str, query_id: uuid::Uuid, run_id: uuid::Uuid) -> PathBuf {
    let prefix = format!("{kind}-{query_id}-");
    for stale in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
    {
        let _ = std::fs::remove_dir_all(stale.path());
    }
    std::env::temp_dir().join(format!("{prefix}{run_id}"))
}

/// Where a run keeps its RocksDB instances.
#[derive(Debug, Clone)]
pub(crate) enum Instances {
    /// A folder of this run (see [`run_scratch_dir`]), removed when it ends: tools that work on
    /// a copy of a checkpoint's state.
    Scratch(uuid::Uuid),
    /// The query's folder on this machine for the checkpoint at `location` (see
    /// [`kept_instances_dir`]), kept when the run ends: the next run finds its instances at
    /// their versions and opens them as they are, instead of rebuilding them from the
    /// checkpoint.
    Kept { location: String },
}

/// `<temp>/weir-state-<query id>-at-<hash of the checkpoint's location>`: the RocksDB instances
/// of the query's runs on this machine, which the next run reuses where they match the
/// checkpoint (the provider checks each against its changelog). Two copies of one checkpoint
/// share a query ID but not a location. An `owner` file names the location; folders whose local
/// checkpoint folder is gone are removed here, as are the per-run folders of runs that died.
pub(crate) fn kept_instances_dir(query_id: uuid::Uuid, location: &str) -> PathBuf {
    let hash = weir_common::sealed::checksum(location);
    let name = format!("weir-state-{query_id}-at-{hash}");
    let run_prefix = format!("weir-state-{query_id}-");
    for entry in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let file_name = entry.file_name().to_string_lossy().to_string();
        if !file_name.starts_with("weir-state-") || file_name == name {
            continue;
        }
        let stale = if file_name.contains("-at-") {
            // Another checkpoint's: gone when its local checkpoint folder is.
            std::fs::read_to_string(entry.path().join("owner"))
                .ok()
                .and_then(|owner| local_folder(&owner))
                .is_some_and(|folder| !folder.exists())
        } else {
            // A run folder of this query (an older weir's, or a tool's that died).
            file_name.starts_with(&run_prefix)
        };
        if stale {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let dir = std::env::temp_dir().join(name);
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join("owner"), location);
    }
    dir
}

/// The local folder a checkpoint location names (`file://` or a plain path), if it is local.
fn local_folder(location: &str) -> Option<PathBuf> {
    let path = location.strip_prefix("file://").unwrap_or(location);
    path.starts_with('/').then(|| PathBuf::from(path))
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Some(d) = &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// One output partition of a stateful operator: `run` yields its single batch.
fn one_batch_stream(
    schema: arrow::datatypes::SchemaRef,
    run: impl std::future::Future<Output = Result<arrow::array::RecordBatch>> + Send + 'static,
) -> datafusion::execution::SendableRecordBatchStream {
    Box::pin(
        datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(run),
        ),
    )
}

/// Runs a partition's state work on the blocking pool: state store calls block, so they stay
/// off the async workers.
async fn on_blocking_pool(
    work: impl FnOnce() -> Result<arrow::array::RecordBatch> + Send + 'static,
) -> Result<arrow::array::RecordBatch> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?
}

fn state_error(e: weir_state::Error) -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::External(Box::new(weir_common::ClassifiedError::from(e)))
}

/// The exchange of a stateful operator: runs `input` over all its partitions and splits its
/// rows by `key_partition` of the arrow-row encoding of `key` into `partitions` buckets,
/// keeping each bucket's rows in arrival order.
async fn shuffle(
    input: Arc<dyn ExecutionPlan>,
    context: Arc<datafusion::execution::TaskContext>,
    key: &operator::ShuffleKey,
    partitions: usize,
) -> Result<Vec<Vec<arrow::array::RecordBatch>>> {
    use arrow::array::{Array, AsArray, UInt32Array};
    use arrow::compute::take_record_batch;
    let collected = datafusion::physical_plan::collect_partitioned(input, context).await?;
    let converter = arrow::row::RowConverter::new(key.fields.clone())?;
    let mut out = vec![vec![]; partitions];
    for batch in collected.into_iter().flatten() {
        if batch.num_rows() == 0 {
            continue;
        }
        let mut indices = vec![vec![]; partitions];
        let everywhere = key.broadcast.map(|c| batch.column(c).as_boolean().clone());
        let everywhere = |i: usize| {
            everywhere
                .as_ref()
                .is_some_and(|b| b.is_valid(i) && b.value(i))
        };
        if key.exprs.is_empty() {
            indices[weir_state::key_partition(&[], partitions)] =
                (0..batch.num_rows() as u32).collect();
        } else {
            let columns = key
                .exprs
                .iter()
                .map(|e| e.evaluate(&batch)?.into_array(batch.num_rows()))
                .collect::<Result<Vec<_>>>()?;
            let rows = converter.convert_columns(&columns)?;
            for (i, row) in rows.iter().enumerate() {
                if everywhere(i) {
                    for ix in &mut indices {
                        ix.push(i as u32);
                    }
                } else {
                    indices[weir_state::key_partition(row.as_ref(), partitions)].push(i as u32);
                }
            }
        }
        for (p, ix) in indices.into_iter().enumerate() {
            if ix.len() == batch.num_rows() {
                out[p].push(batch.clone());
            } else if !ix.is_empty() {
                out[p].push(take_record_batch(&batch, &UInt32Array::from(ix))?);
            }
        }
    }
    Ok(out)
}

/// What every batch of one query run shares: the state backend, the partition count fixed by
/// the checkpoint, and the output mode.
#[derive(Debug)]
pub(crate) struct StateRun {
    pub(crate) provider: Arc<dyn StateStoreProvider>,
    pub(crate) partitions: usize,
    pub(crate) output_mode: OutputMode,
    /// Per event-time index store, the time up to which this run has evicted everything: the
    /// next eviction scan starts there instead of wading through the deleted keys below it.
    evicted_up_to: Mutex<BTreeMap<weir_state::StoreId, i64>>,
    /// On an object-store checkpoint: the mirror of the provider's local `state/` folder.
    pub(crate) mirror: Option<crate::checkpoint::state_mirror::StateMirror>,
    /// What the checkpoint records of each operator's state, by operator ID.
    recorded: std::sync::RwLock<BTreeMap<u32, Recorded>>,
    /// The local RocksDB instances; declared after `provider` so they are closed first.
    _local: ScratchDir,
    /// The mirror's local folder, removed when the run ends.
    _mirrored: ScratchDir,
}

impl StateRun {
    /// Opens `backend` for one run: RocksDB keeps its changelogs in `state_dir` (the
    /// checkpoint's `state/`) and its instances where `instances` says: kept for the query's
    /// next run, or in a folder of this run (`<temp>/weir-state-<query id>-<run id>`) removed
    /// when it ends. A run killed before that leaves its folder: the next run of the query
    /// removes it, so crashes do not pile folders up.
    pub(crate) fn open(
        backend: StateBackend,
        state_dir: Option<PathBuf>,
        mirror: Option<crate::checkpoint::state_mirror::StateMirror>,
        query_id: uuid::Uuid,
        instances: Instances,
        partitions: usize,
        output_mode: OutputMode,
    ) -> EngineResult<Self> {
        let (provider, local): (Arc<dyn StateStoreProvider>, _) = match backend {
            // A run opens only the newest version: keep two (Spark's
            // maxBatchesToRetainInMemory), not a full copy per retained batch.
            StateBackend::Memory => (
                Arc::new(MemoryStateStoreProvider::with_retained_versions(2)),
                None,
            ),
            StateBackend::RocksDb(config) => {
                let dir = match (&state_dir, &mirror) {
                    (Some(d), _) => d.clone(),
                    (None, Some(m)) => m.local().to_path_buf(),
                    (None, None) => {
                        return Err(Error::user(
                            "STATE_STORE_UNSUPPORTED_LOCATION",
                            "0A000",
                            "The RocksDB state store needs a local checkpoint folder or a \
                             mirror of an object-store one.",
                        ));
                    }
                };
                let (local, removed) = match instances {
                    Instances::Scratch(run_id) => {
                        let d = run_scratch_dir("weir-state", query_id, run_id);
                        (d.clone(), Some(d))
                    }
                    Instances::Kept { location } => (kept_instances_dir(query_id, &location), None),
                };
                (
                    Arc::new(RocksDbStateStoreProvider::with_config(dir, local, config)),
                    removed,
                )
            }
        };
        Ok(Self {
            provider,
            partitions,
            output_mode,
            evicted_up_to: Mutex::new(BTreeMap::new()),
            recorded: std::sync::RwLock::new(BTreeMap::new()),
            _mirrored: ScratchDir(mirror.as_ref().map(|m| m.local().to_path_buf())),
            mirror,
            _local: ScratchDir(local),
        })
    }
}

impl StateRun {
    /// Takes where each operator's state lives, and in which stores, from the checkpoint's
    /// record of `operators`, before the query is planned.
    pub(crate) fn set_layouts(&self, operators: &[OperatorInfo]) {
        if let Ok(mut r) = self.recorded.write() {
            *r = operators
                .iter()
                .map(|o| {
                    let recorded = Recorded {
                        layout: o.layout,
                        stores: o.store_names.clone(),
                    };
                    (o.operator_id, recorded)
                })
                .collect();
        }
    }

    /// The stores the checkpoint records for operator `operator`, if it records it.
    pub(crate) fn recorded_stores(&self, operator: u32) -> Option<Vec<String>> {
        self.recorded
            .read()
            .ok()
            .and_then(|r| r.get(&operator).map(|r| r.stores.clone()))
    }

    /// Where this run's last eviction from index store `id` stopped (`None` the first time),
    /// moved on to `up_to`: below it the index holds only deleted keys, so an eviction's range
    /// scan starts there instead of wading through them.
    pub(crate) fn eviction_floor(&self, id: &weir_state::StoreId, up_to: i64) -> Option<i64> {
        let mut floors = self.evicted_up_to.lock().ok()?;
        let floor = floors.get(id).copied();
        let moved = floors.entry(id.clone()).or_insert(up_to);
        *moved = (*moved).max(up_to);
        floor
    }

    /// Operator `operator` with its layout, as far as state goes.
    fn layout_of(&self, operator: u32) -> OperatorInfo {
        let mut info = OperatorInfo::placeholder();
        info.operator_id = operator;
        info.layout = self
            .recorded
            .read()
            .ok()
            .and_then(|r| r.get(&operator).and_then(|r| r.layout));
        info
    }

    /// Opens store `name` of operator `operator` for `partition`, at the state version batch
    /// `batch` reads; its keys have `shape`.
    pub(crate) fn open_store(
        &self,
        operator: u32,
        partition: usize,
        (name, shape): (&str, weir_state::KeyShape),
        batch: u64,
    ) -> weir_state::Result<Box<dyn weir_state::StateStore>> {
        let info = self.layout_of(operator);
        self.provider.open_shaped(
            &weir_state::StoreId::new(info.state_id(), partition as u32, name),
            info.state_version(batch),
            shape,
        )
    }

    /// Opens every store of `operators` at the version batch `batch` reads, so that a restart
    /// rebuilds (and so checks) the state it needs from the checkpoint's changelogs and
    /// snapshots before it writes anything: a damaged or lost state file is refused here, not
    /// found inside the batch after its offsets were logged and older ones purged. The rebuilt
    /// instances stay open for the batch. Stores open in parallel, as the batch would.
    pub(crate) fn prepare(&self, operators: &[OperatorInfo], batch: u64) -> EngineResult<()> {
        let stores: Vec<(&OperatorInfo, usize, &str)> = stores_of(operators).collect();
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(stores.len().max(1));
        let chunk = stores.len().div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            let handles: Vec<_> = stores
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        for &(op, partition, name) in part {
                            let shape = op.key_shape(name);
                            self.open_store(op.operator_id, partition, (name, shape), batch)?;
                        }
                        Ok::<_, weir_state::Error>(())
                    })
                })
                .collect();
            for h in handles {
                h.join()
                    .map_err(|_| Error::Internal("a state store panicked while opening".into()))?
                    .map_err(|e| Error::User(e.into()))?;
            }
            Ok(())
        })
    }

    /// Lets every store of `operators` forget what batches from `batch` on do not need.
    pub(crate) fn purge_below(&self, operators: &[OperatorInfo], batch: u64) -> EngineResult<()> {
        for (op, partition, name) in stores_of(operators) {
            let info = self.layout_of(op.operator_id);
            let id = weir_state::StoreId::new(info.state_id(), partition as u32, name);
            self.provider
                .purge_below(&id, info.state_version(batch))
                .map_err(|e| Error::User(e.into()))?;
        }
        Ok(())
    }
}

/// Every state store of `operators`: (operator, partition, store name).
fn stores_of(operators: &[OperatorInfo]) -> impl Iterator<Item = (&OperatorInfo, usize, &str)> {
    operators.iter().flat_map(|op| {
        (0..op.num_partitions)
            .flat_map(move |p| op.store_names.iter().map(move |n| (op, p, n.as_str())))
    })
}

/// The watermarks a batch runs with, in milliseconds: stateful operators drop input rows at
/// or behind `late_ms` (the previous batch's watermark) and finalise and evict state at or
/// behind `eviction_ms` (this batch's), as Spark does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct BatchWatermark {
    pub(crate) late_ms: i64,
    pub(crate) eviction_ms: i64,
}

/// One batch's view of the stateful operators: its ID (batch N reads state version N and
/// commits N+1), its watermarks, and where operators leave their figures.
#[derive(Debug)]
pub(crate) struct BatchState {
    pub(crate) run: Option<Arc<StateRun>>,
    pub(crate) batch: u64,
    pub(crate) watermark: BatchWatermark,
    metrics: Mutex<BTreeMap<u32, StateOperatorProgress>>,
    event_times: Mutex<BTreeMap<usize, EventTimeStats>>,
}

impl BatchState {
    pub(crate) fn new(run: Option<Arc<StateRun>>, batch: u64, watermark: BatchWatermark) -> Self {
        Self {
            run,
            batch,
            watermark,
            metrics: Mutex::new(BTreeMap::new()),
            event_times: Mutex::new(BTreeMap::new()),
        }
    }

    /// The state backend; only queries with stateful operators have one.
    pub(crate) fn run(&self) -> Result<&Arc<StateRun>> {
        self.run.as_ref().ok_or_else(|| {
            datafusion::error::DataFusionError::Internal(
                "a stateful operator in a query planned without state".into(),
            )
        })
    }

    /// Adds one partition's figures to operator `id`'s.
    pub(crate) fn record(&self, id: u32, part: StateOperatorProgress) {
        if let Ok(mut m) = self.metrics.lock() {
            m.entry(id)
                .and_modify(|total| total.add(&part))
                .or_insert(part);
        }
    }

    /// Adds event times seen by watermark operator `id`.
    pub(crate) fn record_event_times(&self, id: usize, stats: EventTimeStats) {
        if let Ok(mut m) = self.event_times.lock() {
            m.entry(id)
                .and_modify(|total| total.merge(&stats))
                .or_insert(stats);
        }
    }

    /// The figures of every operator, by ID.
    pub(crate) fn progress(&self) -> Vec<StateOperatorProgress> {
        self.metrics
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The event times each watermark operator saw, by operator.
    pub(crate) fn event_times(&self) -> BTreeMap<usize, EventTimeStats> {
        self.event_times
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default()
    }
}

/// `plan` with its stateful operators in place, and what they are, by ID.
pub(crate) fn plan_stateful(
    plan: Arc<dyn ExecutionPlan>,
    batch: &Arc<BatchState>,
) -> Result<(Arc<dyn ExecutionPlan>, Vec<OperatorInfo>)> {
    let mut operators = vec![];
    let mut watermarks = 0;
    let plan = rewrite(plan, batch, &mut operators, &mut watermarks)?;
    Ok((plan, operators))
}

/// The event-time columns (name, delay) of the watermark operators in `plan`.
/// A projection's `column AS alias` of a watermarked column is watermarked too (as Spark keeps
/// the event-time metadata of an aliased attribute).
pub(crate) fn watermark_columns(plan: &Arc<dyn ExecutionPlan>) -> Vec<(String, i64)> {
    let mut out = vec![];
    if let Some(w) = plan.downcast_ref::<WatermarkExec>() {
        out.push((w.column.clone(), w.delay_ms));
    }
    for c in plan.children() {
        out.extend(watermark_columns(c));
    }
    // An aggregation's event-time key (its window) is event time for what follows it.
    if let Some(a) = plan.downcast_ref::<StatefulExec<StreamingAggregate>>()
        && let Some(i) = a.operator().event_time_column()
        && let Some(&(_, delay)) = out.first()
    {
        out.push((a.schema().field(i).name().clone(), delay));
    }
    if let Some(p) = plan.downcast_ref::<datafusion::physical_plan::projection::ProjectionExec>() {
        let mut aliases = vec![];
        for e in p.expr() {
            if let Some(c) = e
                .expr
                .downcast_ref::<datafusion::physical_expr::expressions::Column>()
                && let Some((_, delay)) = out.iter().find(|(w, _)| w == c.name())
                && e.alias != c.name()
            {
                aliases.push((e.alias.clone(), *delay));
            }
        }
        out.extend(aliases);
    }
    out
}

fn rewrite(
    plan: Arc<dyn ExecutionPlan>,
    batch: &Arc<BatchState>,
    operators: &mut Vec<OperatorInfo>,
    watermarks: &mut usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    if let Some(w) = plan.downcast_ref::<WatermarkExec>() {
        let id = *watermarks;
        *watermarks += 1;
        let children = plan
            .children()
            .into_iter()
            .map(|c| rewrite(Arc::clone(c), batch, operators, watermarks))
            .collect::<Result<Vec<_>>>()?;
        let attached: Arc<dyn ExecutionPlan> = Arc::new(w.attached(id, Arc::clone(batch)));
        return datafusion::physical_plan::execution_plan::replace_children_if_necessary(
            attached, children,
        );
    }
    if let Some(d) = plan.downcast_ref::<dedupe::DedupeExec>()
        && StreamScanExec::is_below(&plan)
    {
        let id = operators.len() as u32;
        operators.push(OperatorInfo::placeholder());
        let input = rewrite(Arc::clone(d.children()[0]), batch, operators, watermarks)?;
        let exec = d.attach(input, id, Arc::clone(batch))?;
        operators[id as usize] = exec.info().clone();
        return Ok(Arc::new(exec));
    }
    if let Some(t) = plan.downcast_ref::<top_n::TopNExec>() {
        let id = operators.len() as u32;
        operators.push(OperatorInfo::placeholder());
        let input = rewrite(Arc::clone(t.children()[0]), batch, operators, watermarks)?;
        let exec = t.attach(input, id, Arc::clone(batch))?;
        operators[id as usize] = exec.info().clone();
        return Ok(Arc::new(exec));
    }
    if let Some(a) = plan.downcast_ref::<auto_cdc::AutoCdcExec>() {
        let id = operators.len() as u32;
        operators.push(OperatorInfo::placeholder());
        let input = rewrite(Arc::clone(a.children()[0]), batch, operators, watermarks)?;
        let exec = a.attach(input, id, Arc::clone(batch))?;
        operators[id as usize] = exec.info().clone();
        return Ok(Arc::new(exec));
    }
    if let Some(j) = plan.downcast_ref::<join::StreamJoinExec>() {
        let id = operators.len() as u32;
        operators.push(OperatorInfo::placeholder());
        let [l, r] = j.inputs();
        let left = rewrite(Arc::clone(l), batch, operators, watermarks)?;
        let right = rewrite(Arc::clone(r), batch, operators, watermarks)?;
        let exec = j.attach(left, right, id, Arc::clone(batch))?;
        operators[id as usize] = exec.info().clone();
        return Ok(Arc::new(exec));
    }
    if let Some(c) = plan.downcast_ref::<changelog::ChangelogExec>() {
        return attach_aggregate(c.aggregate()?, true, batch, operators, watermarks);
    }
    if let Some(agg) = plan.downcast_ref::<AggregateExec>()
        && !matches!(
            agg.mode(),
            AggregateMode::Partial | AggregateMode::PartialReduce
        )
        && StreamScanExec::is_below(&plan)
    {
        return attach_aggregate(agg, false, batch, operators, watermarks);
    }
    let children = plan
        .children()
        .into_iter()
        .map(|c| rewrite(Arc::clone(c), batch, operators, watermarks))
        .collect::<Result<Vec<_>>>()?;
    if children.is_empty() {
        return Ok(plan);
    }
    datafusion::physical_plan::execution_plan::replace_children_if_necessary(plan, children)
}

/// DataFusion's aggregate `agg` (not the partial one) as the next stateful operator; with
/// `changelog`, one that emits retractions for an aggregation above it.
fn attach_aggregate(
    agg: &AggregateExec,
    changelog: bool,
    batch: &Arc<BatchState>,
    operators: &mut Vec<OperatorInfo>,
    watermarks: &mut usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    let id = operators.len() as u32;
    operators.push(OperatorInfo::placeholder());
    // Below it: watermarks that record event times, and maybe a deduplication, a join or an
    // aggregation (that one's changelog, or its final rows in append mode).
    let input = rewrite(Arc::clone(agg.input()), batch, operators, watermarks)?;
    let agg = AggregateExec::try_new(
        *agg.mode(),
        Arc::new(agg.group_expr().clone()),
        agg.aggr_expr().to_vec(),
        agg.filter_expr().to_vec(),
        input,
        agg.input_schema(),
    )?;
    let partitions = batch.run()?.partitions;
    if !changelog && let Some(key) = session::session_key(&agg)? {
        let exec = StatefulExec::new(
            session::SessionWindowAggregate::try_new(&agg, key, id, partitions)?,
            Arc::clone(batch),
        );
        operators[id as usize] = exec.info().clone();
        return Ok(Arc::new(exec));
    }
    let mut operator = StreamingAggregate::try_new(&agg, id, partitions)?;
    if changelog {
        operator = operator.emitting_changelog();
    }
    let exec = StatefulExec::new(operator, Arc::clone(batch));
    operators[id as usize] = exec.info().clone();
    Ok(Arc::new(exec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_instance_folders_go_with_their_checkpoint_and_dead_runs_folders_go() {
        let (query, other) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        let ck = tempfile::tempdir().unwrap();
        let gone = tempfile::tempdir().unwrap();
        let gone_path = gone.path().display().to_string();
        let live = kept_instances_dir(other, &ck.path().display().to_string());
        let orphan = kept_instances_dir(other, &gone_path);
        drop(gone);
        let s3 = kept_instances_dir(other, "s3://bucket/ck");
        let dead_run = run_scratch_dir("weir-state", query, uuid::Uuid::new_v4());
        std::fs::create_dir_all(&dead_run).unwrap();
        let ours = kept_instances_dir(query, &ck.path().display().to_string());
        assert_ne!(ours, live, "two queries on one location share no folder");
        assert!(ours.is_dir() && ours.join("owner").is_file());
        assert!(live.is_dir(), "its checkpoint is there");
        assert!(s3.is_dir(), "an object-store checkpoint cannot be checked");
        assert!(!orphan.exists(), "its checkpoint folder is gone");
        assert!(
            !dead_run.exists(),
            "a dead run's folder of the query is removed"
        );
        // The same query and location find the same folder again.
        assert_eq!(
            kept_instances_dir(query, &ck.path().display().to_string()),
            ours
        );
        for d in [ours, live, s3] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }
}
