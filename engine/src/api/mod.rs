//! The embedding API in the shape Spark users know: a session, `read_stream()` giving a
//! DataFusion `DataFrame`, and `write_stream()` starting a [`StreamingQuery`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProviderFactory;
use datafusion::dataframe::DataFrame;
use datafusion::datasource::provider_as_source;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder};
use datafusion::prelude::SessionConfig;
use weir_common::{Location, Options};
use weir_planner::sink_table::{FileSinkTable, ManifestAwareTableFactory};
use weir_planner::{
    StreamCatalog, StreamRelationPlanner, StreamingTable, check_streaming_plan,
    has_stateful_operator, is_streaming, streaming_tables, with_fresh_streaming_tables,
};
use weir_sinks::{
    ForeachBatchFn, ForeachBatchSink, OutputMode, ReadBack, Sink, SinkRegistry, SinkSpec,
};
use weir_sources::{MemoryStream, MemoryStreamProvider, SourceRegistry};

pub(crate) mod memory_table;
pub(crate) mod script;

pub use crate::tools::replay::{ReplayReport, ReplayedSource};

use crate::checkpoint::checks::{
    check_restart_sources, check_sink, check_sink_batches, check_sink_query_id, check_state,
    check_state_durable, partitions_for,
};

use crate::checkpoint::RestartPoint;
use crate::checkpoint::source_evolution::{QuerySource, SOURCE_EVOLUTION};
use crate::execution::{Execution, NO_DATA_PROGRESS_INTERVAL};
use crate::stateful::{StateBackend, StateMetadata, StateRun, WeirQueryPlanner};

/// A RocksDB setting given as a writer option.
#[derive(Debug, Clone, Copy)]
enum RocksDbSetting {
    BlockCacheMb,
    WriteBufferMb,
    MemtablesMb,
    SnapshotInterval,
}

impl RocksDbSetting {
    fn of(key: &str) -> Option<Self> {
        let k = key.to_ascii_lowercase();
        Some(match k.as_str() {
            "statestore.rocksdb.blockcachesizemb" => Self::BlockCacheMb,
            "statestore.rocksdb.writebuffersizemb" => Self::WriteBufferMb,
            "statestore.rocksdb.maxmemtablememorymb" => Self::MemtablesMb,
            "statestore.mindeltasforsnapshot" => Self::SnapshotInterval,
            _ => return None,
        })
    }

    fn apply(self, config: &mut weir_state::RocksDbConfig, n: usize) {
        match self {
            Self::BlockCacheMb => config.block_cache_bytes = n << 20,
            Self::WriteBufferMb => config.write_buffer_bytes = n << 20,
            Self::MemtablesMb => config.memtable_bytes = n << 20,
            Self::SnapshotInterval => config.snapshot_interval = n as u64,
        }
    }
}

/// The offsets log's conf key for the partition count a checkpoint was created with.
pub(crate) const SHUFFLE_PARTITIONS: &str = "weir.sql.shuffle.partitions";
/// The offsets log's conf key for the state store a checkpoint was created with.
pub(crate) const STATE_STORE: &str = "weir.sql.streaming.stateStore.provider";
/// The offsets log's conf key for how a query with several watermarks combines them.
pub(crate) const WATERMARK_POLICY: &str = "weir.sql.streaming.multipleWatermarkPolicy";
/// The offsets log's conf key saying a `GROUP BY` of a `window()`'s alias groups by the call
/// (see [`weir_planner::window::inline_window_aliases`]): `true` in checkpoints created since,
/// absent in older ones, which keep grouping by the column so that their state still fits.
pub(crate) const WINDOW_ALIAS_GROUPING: &str = "weir.sql.streaming.groupByWindowAlias";
/// The offsets log's conf key saying the sink was given every batch to record, empty ones too
/// (a Delta sink commits them): `true` in checkpoints created since, absent in older ones.
pub(crate) const EVERY_BATCH_RECORDED: &str = "weir.sink.everyBatchRecorded";
/// The offsets log's conf key saying a stream-stream join's sides are pruned to the columns
/// read before the join, so that its state stores only those (see
/// [`weir_planner::join::rewrite_stream_joins`]): `true` in checkpoints created since, absent in
/// older ones, whose joins keep storing whole rows as their state's schema says.
pub(crate) const PRUNED_JOIN_INPUTS: &str = "weir.sql.streaming.join.prunedInputs";

/// How a query is planned where weir's planning changed in a way a checkpoint's state depends
/// on: as the checkpoint was created (each `true` in checkpoints created since the change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlanBehaviours {
    /// A `GROUP BY` of a `window()`'s alias groups by the call ([`WINDOW_ALIAS_GROUPING`]).
    pub(crate) window_aliases: bool,
    /// Stream-stream joins store only the columns read ([`PRUNED_JOIN_INPUTS`]).
    pub(crate) pruned_join_inputs: bool,
}

impl PlanBehaviours {
    /// A new checkpoint's.
    pub(crate) const NEW: Self = Self {
        window_aliases: true,
        pruned_join_inputs: true,
    };

    /// Those of the checkpoint whose batches ran with `conf` (`None`: a new one).
    pub(crate) fn of(conf: Option<&BTreeMap<String, String>>) -> Self {
        Self {
            window_aliases: created_with(conf, WINDOW_ALIAS_GROUPING),
            pruned_join_inputs: created_with(conf, PRUNED_JOIN_INPUTS),
        }
    }
}

/// Whether a checkpoint was created with a behaviour that a conf key marks (`key` is `true` in
/// its logged conf); a new checkpoint (`conf` is `None`) is.
pub(crate) fn created_with(conf: Option<&BTreeMap<String, String>>, key: &str) -> bool {
    conf.is_none_or(|c| c.get(key).is_some_and(|v| v == "true"))
}

use crate::api::memory_table::MemorySinkTable;
use crate::execution::query::{Shared, StreamingQuery, StreamingQueryManager};
use crate::{Checkpoint, Error, Result, Trigger};

/// A weir session: a DataFusion `SessionContext` that also knows streams, sinks and running
/// streaming queries.
#[derive(Clone, Debug)]
pub struct WeirSession {
    inner: Arc<SessionInner>,
}

pub(crate) struct SessionInner {
    pub(crate) ctx: SessionContext,
    pub(crate) catalog: Arc<StreamCatalog>,
    pub(crate) sinks: RwLock<SinkRegistry>,
    pub(crate) manager: StreamingQueryManager,
    /// `CREATE STREAMING TABLE` declarations without a query, by lower-case name.
    pub(crate) declared: Mutex<BTreeMap<String, weir_planner::statement::CreateStreamingTable>>,
    /// The state store queries started in this session use unless they say otherwise.
    pub(crate) state_backend: RwLock<StateBackend>,
    /// The in-memory state of this session's running queries, for `read_state`.
    pub(crate) live_states: Arc<crate::tools::state_reader::LiveStates>,
    /// Every query's per-batch health, for `streaming_health`.
    pub(crate) health: Arc<crate::execution::health::HealthLog>,
}

impl std::fmt::Debug for SessionInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionInner")
            .field("session_id", &self.ctx.session_id())
            .finish()
    }
}

/// The session, reachable from a `DataFrame`'s config so `df.write_stream()` works.
#[derive(Debug)]
struct SessionHandle(std::sync::Weak<SessionInner>);

impl Default for WeirSession {
    fn default() -> Self {
        Self::new()
    }
}

impl WeirSession {
    /// A session with weir's built-in sources and sinks and DataFusion's defaults.
    pub fn new() -> Self {
        Self::with_config(SessionConfig::new())
    }

    /// A session with a DataFusion `config` (e.g. `target_partitions`).
    pub fn with_config(config: SessionConfig) -> Self {
        let catalog = Arc::new(StreamCatalog::new(SourceRegistry::with_builtins()));
        Arc::new_cyclic(|weak: &std::sync::Weak<SessionInner>| {
            let config = config.with_extension(Arc::new(SessionHandle(weak.clone())));
            let mut state = SessionStateBuilder::new()
                .with_config(config)
                .with_default_features()
                .with_query_planner(Arc::new(WeirQueryPlanner))
                .build();
            let factories = state.table_factories_mut();
            for name in ["PARQUET", "CSV", "JSON", "NDJSON"] {
                if let Some(f) = factories.get(name).cloned() {
                    factories.insert(
                        name.to_string(),
                        Arc::new(ManifestAwareTableFactory::new(f))
                            as Arc<dyn TableProviderFactory>,
                    );
                }
            }
            #[cfg(feature = "delta")]
            factories.insert(
                "DELTA".to_string(),
                Arc::new(crate::delta_table::DeltaTableFactory) as Arc<dyn TableProviderFactory>,
            );
            let ctx = SessionContext::new_with_state(state);
            ctx.register_udf(weir_planner::window::window_udf());
            ctx.register_udf(weir_planner::to_char::to_char_udf());
            let live_states = Arc::new(crate::tools::state_reader::LiveStates::default());
            ctx.register_udtf(
                "read_state_metadata",
                Arc::new(crate::tools::state_reader::ReadStateMetadata::new(
                    Arc::clone(&live_states),
                )),
            );
            ctx.register_udf(weir_planner::session_window::session_window_udf());
            #[cfg(feature = "delta")]
            ctx.register_udtf("event_log", Arc::new(crate::event_log::EventLogFunction));
            let _ = ctx.register_relation_planner(Arc::new(StreamRelationPlanner::new(
                Arc::clone(&catalog),
            )));
            let _ = ctx.register_relation_planner(Arc::new(
                crate::tools::state_reader::StateReaderPlanner::new(Arc::clone(&live_states)),
            ));
            let manager = StreamingQueryManager::new();
            let health = Arc::new(crate::execution::health::HealthLog::default());
            manager.add_listener(Arc::clone(&health) as _);
            ctx.register_udtf(
                "streaming_health",
                Arc::new(crate::execution::health::StreamingHealthFunction {
                    log: Arc::clone(&health),
                    manager: manager.clone(),
                }),
            );
            SessionInner {
                live_states,
                health,
                ctx,
                catalog,
                sinks: RwLock::new(SinkRegistry::with_builtins()),
                manager,
                declared: Mutex::new(BTreeMap::new()),
                state_backend: RwLock::new(StateBackend::default()),
            }
        })
        .into()
    }

    /// Makes `backend` the state store of the queries started from now on in this session
    /// (Spark's `spark.sql.streaming.stateStore.providerClass`); a writer's `state_store` or
    /// `stateStore` option still wins, and a checkpoint keeps the store it was created with.
    pub fn set_state_store(&self, backend: StateBackend) {
        if let Ok(mut b) = self.inner.state_backend.write() {
            *b = backend;
        }
    }

    /// The per-batch health of the query named `query` or with id `query` (what `SELECT *
    /// FROM streaming_health('<query>')` shows), oldest first; `None` when no query of this
    /// session by that name or id has run a batch.
    pub fn health(&self, query: &str) -> Option<Vec<crate::HealthRecord>> {
        self.inner.health.records(&self.inner.manager, query)
    }

    /// The DataFusion context: register static tables, run batch SQL.
    pub fn context(&self) -> &SessionContext {
        &self.inner.ctx
    }

    /// The streaming queries of this session and their listeners.
    pub fn streams(&self) -> &StreamingQueryManager {
        &self.inner.manager
    }

    /// The catalog of source formats and named streams.
    pub fn stream_catalog(&self) -> &Arc<StreamCatalog> {
        &self.inner.catalog
    }

    /// Adds a sink format.
    pub fn register_sink_format(&self, name: &str, factory: weir_sinks::SinkFactory) {
        if let Ok(mut s) = self.inner.sinks.write() {
            s.register(name, factory);
        }
    }

    /// Makes `stream` readable as `STREAM <name>` in SQL and through
    /// `read_stream().table(name)`.
    pub fn register_memory_stream(&self, stream: &MemoryStream) {
        self.inner.catalog.register_stream(
            stream.name(),
            Arc::new(MemoryStreamProvider::new(stream.clone())),
        );
    }

    /// Starts reading a stream.
    pub fn read_stream(&self) -> DataStreamReader {
        DataStreamReader {
            session: self.clone(),
            format: None,
            options: Options::new(),
            name: None,
        }
    }

    /// Starts writing the streaming `df`.
    pub fn write_stream(&self, df: DataFrame) -> DataStreamWriter {
        DataStreamWriter::new(Arc::clone(&self.inner), df.logical_plan().clone())
    }

    pub(crate) fn inner(&self) -> &Arc<SessionInner> {
        &self.inner
    }

    /// Makes the Delta table at `path` readable as `name`: in batch SQL (its latest version at
    /// every scan) and as `STREAM name` (its commits). `options` are the object store's
    /// (`aws_*`). Refused when there is no table at `path` yet.
    #[cfg(feature = "delta")]
    pub async fn register_delta_table(
        &self,
        name: &str,
        path: &str,
        options: &weir_common::Options,
    ) -> Result<()> {
        self.register_delta_table_at(name, path, options, None)
            .await
    }

    /// [`WeirSession::register_delta_table`], read at `at` (Delta's time travel) when given;
    /// a pinned version is not streamed.
    #[cfg(feature = "delta")]
    pub async fn register_delta_table_at(
        &self,
        name: &str,
        path: &str,
        options: &weir_common::Options,
        at: Option<crate::delta_table::TableAt>,
    ) -> Result<()> {
        let (storage, _) = weir_common::delta::storage_options(options);
        let url = weir_common::delta::table_url(path, false)?;
        let mut table = weir_common::delta::open(&url, &storage).await?;
        if table.version().is_none() {
            return Err(Error::user(
                "DELTA_MISSING_DELTA_TABLE",
                "42P01",
                format!("There is no Delta table at {url} to read as '{name}'."),
            ));
        }
        // A pinned version is loaded now: one the table does not have is refused here, and
        // the rows have that version's schema.
        let pinned = match &at {
            None => Ok(()),
            Some(crate::delta_table::TableAt::Version(v)) => table.load_version(*v as _).await,
            Some(crate::delta_table::TableAt::Timestamp(t)) => table.load_with_datetime(*t).await,
        };
        if let Err(e) = pinned {
            return Err(Error::user(
                "DELTA_VERSION_NOT_FOUND",
                "22003",
                format!(
                    "The Delta table '{name}' at {url} cannot be read as of {}: {e}. Its \
                     _delta_log folder lists the versions it keeps.",
                    match &at {
                        Some(crate::delta_table::TableAt::Version(v)) => format!("version {v}"),
                        Some(crate::delta_table::TableAt::Timestamp(t)) => format!("{t}"),
                        None => String::new(),
                    }
                ),
            ));
        }
        let schema = table
            .snapshot()
            .map_err(|e| weir_common::delta::error(e, "read the table's schema"))?
            .snapshot()
            .arrow_schema();
        let ctx = &self.inner.ctx;
        let mut table =
            crate::delta_table::DeltaLatestTable::new(url.clone(), storage.clone(), schema);
        if let Some(at) = at {
            table = table.at(at);
            let _ = ctx.deregister_table(name);
            ctx.register_table(name, Arc::new(table))?;
            return Ok(());
        }
        let _ = ctx.deregister_table(name);
        ctx.register_table(name, Arc::new(table))?;
        let mut source_options = weir_common::Options::new().with("path", url.as_str());
        for (k, v) in &storage {
            source_options.set(k.clone(), v.clone());
        }
        let source = self.inner.catalog.create_source("delta", &source_options)?;
        self.inner.catalog.register_stream(name, source);
        Ok(())
    }

    /// Plans `sql` (one statement of DataFusion SQL with weir's streaming relations) without
    /// running it.
    pub async fn plan_sql(&self, sql: &str) -> Result<LogicalPlan> {
        let state = self.inner.ctx.state();
        // Parsed and its expressions' depth bounded before DataFusion plans it.
        let statement = weir_planner::limits::parse_statement(&state, sql)?;
        Ok(state.statement_to_plan(statement).await?)
    }
}

impl From<Arc<SessionInner>> for WeirSession {
    fn from(inner: Arc<SessionInner>) -> Self {
        Self { inner }
    }
}

/// Builds a streaming `DataFrame` (Spark's `DataStreamReader`).
#[derive(Debug)]
pub struct DataStreamReader {
    session: WeirSession,
    format: Option<String>,
    options: Options,
    name: Option<String>,
}

impl DataStreamReader {
    /// Names the source (Spark's `.name("orders_us")`; letters, digits and underscores, unique
    /// in the query). With source evolution on, the checkpoint keeps the source's offsets under
    /// its name, so a restart may reorder, add or remove named sources.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// The source format, e.g. `rate`.
    pub fn format(mut self, format: &str) -> Self {
        self.format = Some(format.to_string());
        self
    }

    /// Sets a source option (names are case-insensitive).
    pub fn option(mut self, key: &str, value: impl ToString) -> Self {
        self.options.set(key, value.to_string());
        self
    }

    /// Sets several source options.
    pub fn options<K: Into<String>, V: Into<String>>(
        mut self,
        opts: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        for (k, v) in opts {
            self.options.set(k, v);
        }
        self
    }

    fn frame(
        &self,
        name: &str,
        source: Arc<dyn weir_sources::SourceProvider>,
    ) -> Result<DataFrame> {
        let mut table = StreamingTable::new(name, source);
        if let Some(n) = &self.name {
            weir_planner::check_source_name(n)?;
            table = table.with_source_name(n.clone());
        }
        let plan =
            LogicalPlanBuilder::scan(name, provider_as_source(Arc::new(table)), None)?.build()?;
        Ok(DataFrame::new(self.session.inner.ctx.state(), plan))
    }

    /// The schema of a file source's files, instead of inferring it from the files present
    /// (Spark's `.schema(...)`); the same as the `schema` option in DDL form.
    pub fn schema(mut self, schema: &arrow::datatypes::Schema) -> Result<Self> {
        let ddl = weir_sources::files::to_ddl(schema).ok_or_else(|| {
            Error::user(
                "INVALID_SCHEMA",
                "42K07",
                format!(
                    "The schema {schema} has a type a file source cannot read; use BOOLEAN, \
                     integers, FLOAT, DOUBLE, DECIMAL, STRING, BINARY, DATE, TIMESTAMP \
                     (microseconds, UTC), TIMESTAMP_NTZ, lists, maps and structs of them."
                ),
            )
        })?;
        self.options.set("schema", ddl);
        Ok(self)
    }

    /// The files under `path` (Spark's `.load(path)`): the same as the `path` option.
    pub fn load_path(mut self, path: &str) -> Result<DataFrame> {
        self.options.set("path", path);
        self.load()
    }

    /// The stream of the chosen format with the given options.
    pub fn load(self) -> Result<DataFrame> {
        let format = self.format.clone().ok_or_else(|| {
            Error::user(
                "STREAMING_SOURCE_FORMAT_MISSING",
                "42601",
                "read_stream() needs a format: .format(\"rate\"), .format(\"rate-micro-batch\"), ...",
            )
        })?;
        if let Some(n) = &self.name {
            weir_planner::check_source_name(n)?;
        }
        let source = self
            .session
            .inner
            .catalog
            .create_source(&format, &self.options)?;
        self.frame(&format, source)
    }

    /// The stream registered under `name` (e.g. a memory stream).
    pub fn table(self, name: &str) -> Result<DataFrame> {
        let source = self.session.inner.catalog.stream(name).ok_or_else(|| {
            Error::user(
                "STREAM_NOT_FOUND",
                "42P01",
                format!("There is no stream named '{name}'."),
            )
        })?;
        self.frame(name, source)
    }
}

/// Adds `write_stream()` to DataFusion's `DataFrame`, for frames made by a [`WeirSession`].
pub trait DataFrameStreamExt {
    /// Starts writing this streaming frame (Spark's `df.writeStream`).
    fn write_stream(self) -> Result<DataStreamWriter>;

    /// Declares `column` (a timestamp) as this stream's event time, with `delay` (e.g. `"10
    /// seconds"`) of lateness allowed (Spark's `withWatermark`).
    fn with_watermark(self, column: &str, delay: &str) -> Result<DataFrame>;

    /// Keeps the first row of each value of `columns` (every column when empty), across
    /// batches (Spark's `dropDuplicates`). With the watermarked column among them, the
    /// watermark bounds the state.
    fn drop_duplicates(self, columns: &[&str]) -> Result<DataFrame>;

    /// As `drop_duplicates`, forgetting a key once the watermark passes its first event time
    /// plus the delay (Spark's `dropDuplicatesWithinWatermark`); needs a watermark.
    fn drop_duplicates_within_watermark(self, columns: &[&str]) -> Result<DataFrame>;
}

impl DataFrameStreamExt for DataFrame {
    fn drop_duplicates(self, columns: &[&str]) -> Result<DataFrame> {
        let (state, plan) = self.into_parts();
        let plan = weir_planner::dedupe::drop_duplicates(plan, columns)?;
        Ok(DataFrame::new(state, plan))
    }

    fn drop_duplicates_within_watermark(self, columns: &[&str]) -> Result<DataFrame> {
        let (state, plan) = self.into_parts();
        let plan = weir_planner::dedupe::drop_duplicates_within_watermark(plan, columns)?;
        Ok(DataFrame::new(state, plan))
    }

    fn with_watermark(self, column: &str, delay: &str) -> Result<DataFrame> {
        let (state, plan) = self.into_parts();
        let plan = weir_planner::watermark::with_watermark(plan, column, delay)?;
        Ok(DataFrame::new(state, plan))
    }

    fn write_stream(self) -> Result<DataStreamWriter> {
        let (state, plan) = self.into_parts();
        let inner = state
            .config()
            .get_extension::<SessionHandle>()
            .and_then(|h| h.0.upgrade())
            .ok_or_else(|| {
                Error::user(
                    "NOT_A_WEIR_SESSION",
                    "42000",
                    "This DataFrame was not made by a weir session: create it with \
                     WeirSession::read_stream() or WeirSession::context().",
                )
            })?;
        Ok(DataStreamWriter::new(inner, plan))
    }
}

/// Configures and starts a streaming query (Spark's `DataStreamWriter`).
pub struct DataStreamWriter {
    pub(crate) session: Arc<SessionInner>,
    pub(crate) plan: LogicalPlan,
    pub(crate) format: String,
    pub(crate) options: Options,
    pub(crate) output_mode: OutputMode,
    pub(crate) trigger: Trigger,
    pub(crate) checkpoint: Option<String>,
    pub(crate) query_name: Option<String>,
    pub(crate) foreach: Option<ForeachBatchFn>,
    pub(crate) max_batches: Option<u64>,
    pub(crate) min_batches_to_retain: u64,
    pub(crate) no_data_progress_interval: Duration,
    pub(crate) state_backend: StateBackend,
    pub(crate) allow_state_definition_change: bool,
    /// With several watermarks, the query's is their maximum rather than their minimum.
    pub(crate) max_watermark: bool,
    /// Asynchronous state checkpointing (RocksDB only).
    pub(crate) async_state_checkpoint: bool,
    /// RocksDB settings given as options (`stateStore.rocksdb.*`), applied at start.
    rocksdb_options: Vec<(RocksDbSetting, usize)>,
    /// `stateStore.rocksdb.compression`.
    sst_compression: Option<weir_state::SstCompression>,
    /// `stateStore.maintenanceInterval`: the least time between a RocksDB store's snapshots.
    state_maintenance_interval: Option<Duration>,
    /// A malformed writer-level option, reported by `start`.
    pub(crate) invalid: Option<Error>,
    /// Source evolution: sources are named and their offsets kept by name.
    pub(crate) source_evolution: bool,
}

impl std::fmt::Debug for DataStreamWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataStreamWriter")
            .field("format", &self.format)
            .field("output_mode", &self.output_mode)
            .field("trigger", &self.trigger)
            .field("checkpoint", &self.checkpoint)
            .field("query_name", &self.query_name)
            .finish()
    }
}

impl DataStreamWriter {
    pub(crate) fn new(session: Arc<SessionInner>, plan: LogicalPlan) -> Self {
        Self {
            plan,
            format: "console".into(),
            options: Options::new(),
            output_mode: OutputMode::Append,
            trigger: Trigger::Default,
            checkpoint: None,
            query_name: None,
            foreach: None,
            max_batches: None,
            min_batches_to_retain: 100,
            no_data_progress_interval: NO_DATA_PROGRESS_INTERVAL,
            state_backend: session.state_backend.read().map(|b| *b).unwrap_or_default(),
            allow_state_definition_change: false,
            max_watermark: false,
            async_state_checkpoint: false,
            rocksdb_options: vec![],
            sst_compression: None,
            state_maintenance_interval: None,
            invalid: None,
            source_evolution: false,
            session,
        }
    }

    /// The sink format: `console` (default), `noop`, `memory`, `parquet`, `csv`, `json`.
    pub fn format(mut self, format: &str) -> Self {
        self.format = format.to_string();
        self
    }

    /// Sets a sink option. These keys configure the query instead: `checkpointLocation`,
    /// `stateStore` (`rocksdb` or `memory`), `allowStateDefinitionChange` (`true`/`false`),
    /// `multipleWatermarkPolicy` (`min`, the default, or `max`, as Spark's
    /// `spark.sql.streaming.multipleWatermarkPolicy`), `asyncStateCheckpoint` (`true`/`false`),
    /// and the RocksDB store's memory and snapshots: `stateStore.rocksdb.blockCacheSizeMB`
    /// (64), `stateStore.rocksdb.maxMemtableMemoryMB` (64, all memtables),
    /// `stateStore.rocksdb.writeBufferSizeMB` (64, one memtable),
    /// `stateStore.rocksdb.compression` (`none`, the default, or `lz4`: how the local
    /// instance's SST files are compressed; the checkpoint is zstd-compressed either way),
    /// `stateStore.minDeltasForSnapshot` (10 versions between snapshots) and
    /// `stateStore.maintenanceInterval` (60 s at least between a store's snapshots, as Spark's
    /// maintenance task; `0` snapshots every `minDeltasForSnapshot` versions).
    pub fn option(mut self, key: &str, value: impl ToString) -> Self {
        let value = value.to_string();
        if key.eq_ignore_ascii_case("checkpointLocation") {
            self.checkpoint = Some(value);
        } else if key.eq_ignore_ascii_case("asyncStateCheckpoint") {
            if let Some(b) = self.flag(key, &value) {
                self.async_state_checkpoint = b;
            }
        } else if key.eq_ignore_ascii_case("multipleWatermarkPolicy") {
            match value.to_ascii_lowercase().as_str() {
                "min" => self.max_watermark = false,
                "max" => self.max_watermark = true,
                _ => {
                    self.invalid = Some(Error::user(
                        "STREAMING_INVALID_OPTION",
                        "42616",
                        format!(
                            "Option 'multipleWatermarkPolicy' must be min or max, not '{value}'."
                        ),
                    ))
                }
            }
        } else if key.eq_ignore_ascii_case("stateStore.maintenanceInterval") {
            match weir_common::parse_duration(&value, Duration::from_millis(1)) {
                Ok(d) => self.state_maintenance_interval = Some(d),
                Err(e) => {
                    self.invalid = Some(Error::user(
                        "STREAMING_INVALID_OPTION",
                        "42616",
                        format!("Option '{key}': {e} (a bare number is milliseconds, as Spark's)."),
                    ))
                }
            }
        } else if key.eq_ignore_ascii_case("stateStore.rocksdb.compression") {
            match weir_state::SstCompression::parse(&value) {
                Some(c) => self.sst_compression = Some(c),
                None => {
                    self.invalid = Some(Error::user(
                        "STREAMING_INVALID_OPTION",
                        "42616",
                        format!(
                            "Option '{key}' must be none or lz4 (the codecs this build of \
                             RocksDB has), not '{value}'."
                        ),
                    ))
                }
            }
        } else if let Some(setting) = RocksDbSetting::of(key) {
            match value.trim().parse::<usize>() {
                Ok(n) if n > 0 => self.rocksdb_options.push((setting, n)),
                _ => {
                    self.invalid = Some(Error::user(
                        "STREAMING_INVALID_OPTION",
                        "42616",
                        format!("Option '{key}' must be a positive whole number, not '{value}'."),
                    ))
                }
            }
        } else if key.eq_ignore_ascii_case("stateStore") {
            match StateBackend::parse(&value) {
                Ok(b) => self.state_backend = b,
                Err(e) => self.invalid = Some(e),
            }
        } else if key.eq_ignore_ascii_case("allowStateDefinitionChange") {
            if let Some(b) = self.flag(key, &value) {
                self.allow_state_definition_change = b;
            }
        } else if crate::checkpoint::source_evolution::OPTION_KEYS
            .iter()
            .any(|k| k.eq_ignore_ascii_case(key))
        {
            if let Some(b) = self.flag(key, &value) {
                self.source_evolution = b;
            }
        } else {
            self.options.set(key, value);
        }
        self
    }

    /// A true/false option's value; anything else makes `start` fail.
    fn flag(&mut self, key: &str, value: &str) -> Option<bool> {
        match value.to_ascii_lowercase().as_str() {
            "true" => Some(true),
            "false" => Some(false),
            _ => {
                self.invalid = Some(Error::user(
                    "STREAMING_INVALID_OPTION",
                    "42616",
                    format!("Option '{key}' must be true or false, not '{value}'."),
                ));
                None
            }
        }
    }

    /// Source evolution (Spark's `spark.sql.streaming.queryEvolution.enableSourceEvolution`;
    /// as an option, `queryEvolution.enableSourceEvolution`): every source must be named, and
    /// a restart may reorder, add or remove named sources. Fixed when the checkpoint is
    /// created.
    pub fn source_evolution(mut self, on: bool) -> Self {
        self.source_evolution = on;
        self
    }

    /// Where stateful operators keep their state (default: RocksDB). A checkpoint keeps the
    /// backend it was created with.
    pub fn state_store(mut self, backend: StateBackend) -> Self {
        self.state_backend = backend;
        self
    }

    /// Asynchronous state checkpointing (RocksDB only): batch N + 1 runs while batch N's state
    /// is written to the checkpoint, and `commits/N` waits for it; a restart may re-run two
    /// batches. Off by default.
    pub fn async_state_checkpoint(mut self, on: bool) -> Self {
        self.async_state_checkpoint = on;
        self
    }

    /// Accepts, for this start, stateful operators whose definition changed while their state
    /// kept its shape (a grouping expression or aggregate function replaced by one of the same
    /// types). Off by default: such state was computed for the old definition.
    pub fn allow_state_definition_change(mut self, allow: bool) -> Self {
        self.allow_state_definition_change = allow;
        self
    }

    /// The output mode.
    pub fn output_mode(mut self, mode: OutputMode) -> Self {
        self.output_mode = mode;
        self
    }

    /// When batches run.
    pub fn trigger(mut self, trigger: Trigger) -> Self {
        self.trigger = trigger;
        self
    }

    /// Where the checkpoint lives. Without one, a temporary checkpoint is used (and deleted on
    /// a clean stop), which cannot survive a restart.
    pub fn checkpoint_location(mut self, dir: impl Into<String>) -> Self {
        self.checkpoint = Some(dir.into());
        self
    }

    /// The query name (also the memory sink's table name).
    pub fn query_name(mut self, name: impl Into<String>) -> Self {
        self.query_name = Some(name.into());
        self
    }

    /// Stop after this many batches in this run (as `weir run --max-batches`).
    pub fn max_batches(mut self, n: u64) -> Self {
        self.max_batches = Some(n);
        self
    }

    /// How often a query without new data records a no-data progress entry and posts
    /// `on_query_idle` (Spark's `spark.sql.streaming.noDataProgressEventInterval`, default 10 s).
    pub fn no_data_progress_interval(mut self, every: Duration) -> Self {
        self.no_data_progress_interval = every;
        self
    }

    /// How many batches of logs the checkpoint keeps (`minBatchesToRetain`, default 100).
    pub fn min_batches_to_retain(mut self, n: u64) -> Self {
        self.min_batches_to_retain = n.max(1);
        self
    }

    /// Sends every batch to `f` instead of a sink format (Spark's `foreachBatch`).
    pub fn foreach_batch<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(u64, Vec<arrow::record_batch::RecordBatch>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = std::result::Result<(), String>> + Send + 'static,
    {
        let f = Arc::new(f);
        self.foreach = Some(Arc::new(move |id, batches| {
            let f = Arc::clone(&f);
            Box::pin(async move { f(id, batches).await })
        }));
        self.format = "foreach_batch".into();
        self
    }

    /// Rewrites the plan for streaming, checks it, and creates the sink; nothing is opened or
    /// written.
    pub(crate) fn plan_query(&mut self) -> Result<Planned> {
        if let Some(e) = self.invalid.take() {
            return Err(e);
        }
        let inner = &self.session;
        if !is_streaming(&self.plan) {
            return Err(Error::user(
                "NOT_A_STREAMING_QUERY",
                "42K0E",
                "This query reads no stream, so it cannot be started as a streaming query: read a \
                 source with read_stream() or FROM STREAM ..., or run it as a batch query.",
            ));
        }
        let (plan, stateful) = streaming_plan(&self.plan, self.output_mode, PlanBehaviours::NEW)?;
        // Optimized here only to find errors before anything starts; each batch optimizes the
        // plan again with its own batch time, so now() is the batch's time, as in Spark.
        let optimized = streaming_state(&inner.ctx).optimize(&plan)?;
        let tables = streaming_tables(&plan);
        let schema = Arc::new(optimized.schema().as_arrow().clone());

        let sink: Arc<dyn Sink> = match &self.foreach {
            Some(f) => Arc::new(ForeachBatchSink::new(Arc::clone(f))),
            None => {
                let spec = SinkSpec {
                    format: self.format.clone(),
                    options: self.options.clone(),
                    output_mode: self.output_mode,
                    query_name: self.query_name.clone(),
                    schema: Arc::clone(&schema),
                };
                let registry = inner
                    .sinks
                    .read()
                    .map_err(|_| Error::Internal("sink registry lock poisoned".into()))?;
                registry.create(&spec)?
            }
        };
        let sink_record = crate::checkpoint::SinkRecord {
            format: self.format.to_ascii_lowercase(),
            identity: sink.identity(),
            query_id: None,
        };
        let sources: Vec<QuerySource> = tables
            .iter()
            .map(|t| QuerySource {
                name: t.source_name().map(String::from),
                identity: t.source().identity(),
            })
            .collect();
        crate::checkpoint::source_evolution::check_names(&sources, self.source_evolution)?;
        Ok(Planned {
            sources,
            plan,
            stateful,
            tables,
            schema,
            sink,
            sink_record,
        })
    }

    /// Checks the query, opens the checkpoint and starts the query.
    pub async fn start(mut self) -> Result<StreamingQuery> {
        let planned = self.plan_query()?;
        let (sources, sink) = (planned.sources.clone(), Arc::clone(&planned.sink));
        let inner = self.session;
        let state = streaming_state(&inner.ctx);
        let (location, temporary) = match &self.checkpoint {
            Some(dir) => (Location::parse(dir)?, false),
            None if sink.is_idempotent() && sink.identity().is_some() => {
                return Err(Error::user(
                    "CHECKPOINT_LOCATION_REQUIRED",
                    "42601",
                    format!(
                        "The {} sink keeps exactly-once output only with a checkpoint: set \
                         checkpoint_location(...) (SQL: OPTIONS (checkpointLocation '...'), CLI: \
                         --checkpoint DIR).",
                        self.format
                    ),
                ));
            }
            None => {
                let dir =
                    std::env::temp_dir().join(format!("weir-checkpoint-{}", uuid::Uuid::new_v4()));
                tracing::warn!(
                    "no checkpoint location given: using the temporary checkpoint {} (deleted when \
                     the query stops cleanly); this query cannot be restarted where it left off",
                    dir.display()
                );
                (Location::local(&dir)?, true)
            }
        };
        let checkpoint = Checkpoint::open(location, temporary).await?;
        let resets = checkpoint.resets().await?;
        checkpoint.check_resets_done(&resets)?;
        let restart = RestartPoint::read_after_resets(&checkpoint, &resets).await?;
        let logged_conf = restart.as_ref().map(RestartPoint::logged);
        let Planned {
            plan,
            stateful,
            tables,
            schema,
            sink_record,
            ..
        } = planned.for_checkpoint(&self.plan, self.output_mode, logged_conf)?;
        let removed_sources = check_restart_sources(
            &checkpoint,
            restart.as_ref(),
            &sources,
            self.source_evolution,
        )
        .await?;
        let logged = restart.is_some();
        // The sink's record of its batches first: a lost entry or a replaced checkpoint is
        // refused before anything is written.
        let sink_checked = async {
            let was = checkpoint.read_sink().await?;
            // The query ID first: the sink's records are of the ID they were written with.
            check_sink_query_id(&checkpoint, was.as_ref())?;
            check_sink_batches(
                &checkpoint,
                sink.as_ref(),
                &sink_record,
                was.as_ref(),
                restart.as_ref(),
            )
            .await
        }
        .await;
        sink_checked?;
        check_sink(&checkpoint, &sink_record, logged).await?;

        let mut state = state;
        let stored_state = checkpoint.read_state_metadata().await?;
        let partitions = partitions_for(restart.as_ref(), stored_state.as_ref(), &state);
        if partitions != state.config().target_partitions() {
            tracing::warn!(
                "the checkpoint was created with {SHUFFLE_PARTITIONS}={partitions}; using it \
                 instead of this session's {}",
                state.config().target_partitions()
            );
            state.config_mut().options_mut().execution.target_partitions = partitions;
        }
        let mut conf = BTreeMap::new();
        conf.insert(SHUFFLE_PARTITIONS.to_string(), partitions.to_string());
        // As Spark, the policy a checkpoint was created with stays.
        let max_watermark = match restart
            .as_ref()
            .and_then(|r| r.logged_conf(WATERMARK_POLICY))
        {
            Some(logged) => logged == "max",
            None => self.max_watermark,
        };
        conf.insert(
            WATERMARK_POLICY.to_string(),
            if max_watermark { "max" } else { "min" }.to_string(),
        );
        conf.insert(
            SOURCE_EVOLUTION.to_string(),
            self.source_evolution.to_string(),
        );
        // Behaviours a checkpoint was created with (or without) stay.
        for key in [
            WINDOW_ALIAS_GROUPING,
            EVERY_BATCH_RECORDED,
            PRUNED_JOIN_INPUTS,
        ] {
            conf.insert(key.to_string(), created_with(logged_conf, key).to_string());
        }

        let shared = Shared::new(checkpoint.id(), self.query_name.clone());
        let state_run = if stateful || stored_state.is_some() {
            let backend = match restart.as_ref().and_then(|r| r.logged_conf(STATE_STORE)) {
                Some(logged) if logged != self.state_backend.name() => {
                    tracing::warn!(
                        "the checkpoint was created with the {logged} state store; using it \
                         instead of {}",
                        self.state_backend.name()
                    );
                    StateBackend::parse(logged)?
                }
                _ => self.state_backend,
            };
            let backend = match backend {
                StateBackend::RocksDb(mut config) => {
                    for (setting, n) in &self.rocksdb_options {
                        setting.apply(&mut config, *n);
                    }
                    if let Some(d) = self.state_maintenance_interval {
                        config.snapshot_min_interval = d;
                    }
                    if let Some(c) = self.sst_compression {
                        config.compression = c;
                    }
                    StateBackend::RocksDb(config)
                }
                memory => memory,
            };
            let backend = match (backend, self.async_state_checkpoint) {
                (StateBackend::RocksDb(mut config), true) => {
                    config.async_checkpoint = true;
                    StateBackend::RocksDb(config)
                }
                (StateBackend::Memory, true) => {
                    return Err(Error::user(
                        "ASYNC_STATE_CHECKPOINT_NOT_SUPPORTED",
                        "0A000",
                        "Asynchronous state checkpointing needs the RocksDB state store, whose \
                         versions are made durable in the checkpoint in the background; the \
                         memory store keeps nothing durable. Use stateStore 'rocksdb', or turn \
                         asyncStateCheckpoint off.",
                    ));
                }
                (b, false) => b,
            };
            // State on an object store: the provider works on a local copy of `state/`,
            // mirrored back before each commit.
            let mirror = match (&backend, checkpoint.state_dir()) {
                (StateBackend::RocksDb(_), None) => {
                    let local = crate::stateful::run_scratch_dir(
                        "weir-mirror",
                        checkpoint.id(),
                        shared.run_id,
                    );
                    let mirror = crate::checkpoint::state_mirror::StateMirror::download(
                        checkpoint.location().child("state"),
                        local,
                    )
                    .await;
                    Some(mirror?)
                }
                _ => None,
            };
            let run = Arc::new(StateRun::open(
                backend,
                checkpoint.state_dir(),
                mirror,
                checkpoint.id(),
                crate::stateful::Instances::Kept {
                    location: checkpoint.location().display().to_string(),
                },
                partitions,
                self.output_mode,
            )?);
            let committed = restart.as_ref().is_some_and(|r| r.has_committed_batches());
            if let Some(stored) = &stored_state {
                run.set_layouts(&stored.operators);
            }
            let operators = check_state(
                &state,
                &plan,
                &tables,
                &run,
                stored_state.as_ref(),
                committed,
                self.allow_state_definition_change,
            )
            .await?;
            if stored_state.is_none() && !operators.is_empty() {
                checkpoint
                    .write_state_metadata(&StateMetadata {
                        operators: operators.clone(),
                    })
                    .await?;
            }
            check_state_durable(backend.name(), committed)?;
            // The state the first batch reads, rebuilt and so checked before anything is
            // written (blocking work: RocksDB and the checkpoint's files).
            if committed {
                let (_, first) = crate::checkpoint::checks::next_batch(restart.as_ref());
                let (run, ops) = (Arc::clone(&run), operators.clone());
                tokio::task::spawn_blocking(move || run.prepare(&ops, first))
                    .await
                    .map_err(|e| {
                        Error::Internal(format!("opening the state stores failed: {e}"))
                    })??;
            }
            conf.insert(STATE_STORE.to_string(), backend.name().to_string());
            if matches!(backend, StateBackend::Memory) {
                inner.live_states.register(checkpoint.id(), &run);
            }
            Some((run, operators))
        } else {
            None
        };

        // Every check passed: sources the query no longer has are gone for good.
        if !removed_sources.is_empty() {
            checkpoint.add_removed_sources(&removed_sources).await?;
        }
        // The sink's own set-up (a transactional Kafka producer fences earlier runs' here).
        sink.open(&checkpoint.id().to_string()).await?;
        let query = StreamingQuery {
            shared: Arc::clone(&shared),
            task: Arc::new(Mutex::new(None)),
        };
        let registered = register_sink_table(&inner, &sink, self.query_name.as_deref(), &schema)
            .and_then(|()| inner.manager.register(&query));
        registered?;

        let has_watermarks = !weir_planner::watermark::watermark_nodes(&plan).is_empty();
        let async_state_checkpoint = self.async_state_checkpoint && state_run.is_some();
        let exec = Execution {
            has_watermarks,
            max_watermark,
            async_state_checkpoint,
            shared,
            manager: inner.manager.clone(),
            state,
            plan,
            tables,
            sink,
            checkpoint,
            trigger: self.trigger,
            max_batches: self.max_batches,
            min_batches_to_retain: self.min_batches_to_retain,
            conf,
            restart,
            no_data_progress_interval: self.no_data_progress_interval,
            state_run,
            source_names: self.source_evolution.then(|| {
                sources
                    .iter()
                    .map(|s| s.name.clone().unwrap_or_default())
                    .collect()
            }),
        };
        let handle = tokio::spawn(exec.run());
        if let Ok(mut t) = query.task.lock() {
            *t = Some(handle);
        }
        Ok(query)
    }
}

/// A query planned for streaming, with its sink, before anything is opened.
pub(crate) struct Planned {
    /// Its sources' names and identities, in query order.
    pub(crate) sources: Vec<QuerySource>,
    pub(crate) plan: LogicalPlan,
    pub(crate) stateful: bool,
    pub(crate) tables: Vec<Arc<StreamingTable>>,
    pub(crate) schema: SchemaRef,
    pub(crate) sink: Arc<dyn Sink>,
    /// What the checkpoint records of the sink.
    pub(crate) sink_record: crate::checkpoint::SinkRecord,
}

/// DataFusion's optimizer rule that turns `count(DISTINCT x) GROUP BY k` into two aggregations
/// (`GROUP BY k, x`, then `count(x) GROUP BY k`). Over a stream the outer one would count the
/// inner one's updates, so streaming queries plan distinct aggregates with their own
/// accumulators (the distinct values are the group's state) instead.
const SINGLE_DISTINCT_RULE: &str = "single_distinct_aggregation_to_group_by";

/// The session's state for planning and running a streaming query: without the optimizer rules
/// that are wrong over a stream ([`SINGLE_DISTINCT_RULE`]).
pub(crate) fn streaming_state(ctx: &SessionContext) -> datafusion::execution::SessionState {
    let state = ctx.state();
    let rules: Vec<_> = state
        .optimizers()
        .iter()
        .filter(|r| r.name() != SINGLE_DISTINCT_RULE)
        .cloned()
        .collect();
    SessionStateBuilder::new_from_existing(state)
        .with_optimizer_rules(rules)
        .build()
}

/// `plan` rewritten for streaming (each stateful operator recognised) and checked, with fresh
/// streaming tables, and whether it has stateful operators; planned as `behaviours` say.
pub(crate) fn streaming_plan(
    plan: &LogicalPlan,
    output_mode: OutputMode,
    behaviours: PlanBehaviours,
) -> Result<(LogicalPlan, bool)> {
    let plan = weir_planner::dedupe::rewrite_distinct_on(plan.clone())?;
    let plan = weir_planner::join::rewrite_stream_joins(plan, behaviours.pruned_join_inputs)?;
    let plan = weir_planner::top_n::rewrite_top_n(plan)?;
    let plan = if behaviours.window_aliases {
        weir_planner::window::inline_window_aliases(plan)?
    } else {
        plan
    };
    let plan = weir_planner::window::expand_sliding_windows(plan)?;
    let plan = weir_planner::session_window::rewrite_session_windows(plan)?;
    let plan = weir_planner::changelog::rewrite_aggregations_over_updates(plan, output_mode)?;
    check_streaming_plan(&plan, output_mode)?;
    let stateful = has_stateful_operator(&plan);
    Ok((with_fresh_streaming_tables(plan)?, stateful))
}

impl Planned {
    /// This plan of `query` as the checkpoint whose batches ran with `conf` planned it (see
    /// [`PlanBehaviours`]): e.g. a checkpoint created before a `GROUP BY` of a `window()`'s alias
    /// grouped by the call keeps grouping by the column, and one created before joins pruned
    /// their sides keeps storing whole rows, as its state's operators were checked against.
    pub(crate) fn for_checkpoint(
        mut self,
        query: &LogicalPlan,
        output_mode: OutputMode,
        conf: Option<&BTreeMap<String, String>>,
    ) -> Result<Self> {
        let behaviours = PlanBehaviours::of(conf);
        if behaviours != PlanBehaviours::NEW {
            let (plan, stateful) = streaming_plan(query, output_mode, behaviours)?;
            self.tables = streaming_tables(&plan);
            self.plan = plan;
            self.stateful = stateful;
        }
        Ok(self)
    }
}

/// Makes a memory sink's table, or a named file sink's output, queryable in the session under
/// the query's name.
fn register_sink_table(
    inner: &SessionInner,
    sink: &Arc<dyn Sink>,
    query_name: Option<&str>,
    schema: &SchemaRef,
) -> Result<()> {
    let ctx = &inner.ctx;
    match (sink.read_back(), query_name) {
        (Some(ReadBack::Memory { name, data }), _) => {
            let _ = ctx.deregister_table(name.as_str());
            ctx.register_table(name.as_str(), Arc::new(MemorySinkTable::new(data)))?;
        }
        (Some(ReadBack::Files(location)), Some(name)) => {
            let table = FileSinkTable::new(location, Arc::clone(schema));
            let _ = ctx.deregister_table(name);
            ctx.register_table(name, Arc::new(table))?;
        }
        // A Delta streaming table: its name reads the table in batch SQL, and `STREAM name`
        // streams its commits (one streaming table feeding the next).
        #[cfg(feature = "delta")]
        (
            Some(ReadBack::Delta {
                url,
                storage,
                source_options,
            }),
            Some(name),
        ) => {
            // An AUTO CDC flow's output leads with its action, which the table does not keep.
            let schema = match schema.fields().first() {
                Some(f) if f.name() == weir_planner::auto_cdc::ACTION => {
                    Arc::new(arrow::datatypes::Schema::new(
                        schema.fields().iter().skip(1).cloned().collect::<Vec<_>>(),
                    ))
                }
                _ => Arc::clone(schema),
            };
            let table = crate::delta_table::DeltaLatestTable::new(url, storage, schema);
            let _ = ctx.deregister_table(name);
            ctx.register_table(name, Arc::new(table))?;
            let source = inner.catalog.create_source("delta", &source_options)?;
            inner.catalog.register_stream(name, source);
        }
        _ => {}
    }
    Ok(())
}
