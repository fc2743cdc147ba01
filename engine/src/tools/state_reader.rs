//! SQL over a checkpoint's state, read without a lock (a running query may own the checkpoint):
//!
//! - `read_state_metadata('DIR')`, as Spark's `state-metadata` data source: one row per
//!   stateful operator and store with `operatorId`, `operatorName`, `stateStoreName`,
//!   `numPartitions`, `minBatchId`, `maxBatchId` (the batches whose state the checkpoint still
//!   holds, up to the last committed one);
//! - `read_state('DIR', operatorId => k [, batchId => b] [, storeName => s] [, joinSide => j])`,
//!   as Spark's `statestore` data source: the entries of an operator's state after a batch, as
//!   `key` and `value` structs with `partition_id` (a session window's sessions and a join
//!   side's rows one row each).

use std::sync::Arc;

use arrow::array::{Int32Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::datasource::provider_as_source;
use datafusion::datasource::{MemTable, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion::logical_expr::planner::{
    PlannedRelation, RelationPlanner, RelationPlannerContext, RelationPlanning,
};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, TableFactor, Value,
};
use weir_common::{ClassifiedError, Location};

use crate::checkpoint::Checkpoint;
use crate::stateful::{OperatorInfo, OperatorKind, StateRun, decode_rows, value_struct};
use crate::tools::inspect::inspect;

/// The state of a session's queries that keep it in memory, by query ID (the checkpoint's):
/// nothing of it is in the checkpoint, so `read_state` reads it from the running query, in its
/// session.
#[derive(Debug, Default)]
pub(crate) struct LiveStates(std::sync::Mutex<Vec<(uuid::Uuid, std::sync::Weak<StateRun>)>>);

impl LiveStates {
    /// Makes the state of the run of query `id` readable while the run lasts.
    pub(crate) fn register(&self, id: uuid::Uuid, run: &Arc<StateRun>) {
        if let Ok(mut runs) = self.0.lock() {
            runs.retain(|(q, r)| r.strong_count() > 0 && *q != id);
            runs.push((id, Arc::downgrade(run)));
        }
    }

    fn find(&self, id: uuid::Uuid) -> Option<std::sync::Weak<StateRun>> {
        let runs = self.0.lock().ok()?;
        runs.iter()
            .find(|(q, r)| *q == id && r.strong_count() > 0)
            .map(|(_, r)| r.clone())
    }
}

fn user(e: impl Into<ClassifiedError>) -> DataFusionError {
    DataFusionError::External(Box::new(e.into()))
}

/// The table function `read_state_metadata('DIR')`.
#[derive(Debug)]
pub(crate) struct ReadStateMetadata {
    live: Arc<LiveStates>,
}

impl ReadStateMetadata {
    pub(crate) fn new(live: Arc<LiveStates>) -> Self {
        Self { live }
    }
}

impl TableFunctionImpl for ReadStateMetadata {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let dir = match args.exprs() {
            [Expr::Literal(v, _)] => v.try_as_str().flatten().map(str::to_string),
            _ => None,
        }
        .ok_or_else(|| {
            user(ClassifiedError::new(
                "INVALID_STATE_READER_ARGUMENT",
                "42K09",
                "read_state_metadata takes one argument, the checkpoint location as a string: \
                 read_state_metadata('/data/ck').",
            ))
        })?;
        Ok(Arc::new(StateMetadataTable {
            dir,
            live: Arc::clone(&self.live),
        }))
    }
}

/// The operators of the checkpoint at `dir`, read at each scan.
#[derive(Debug)]
struct StateMetadataTable {
    dir: String,
    /// Where the state of a checkpoint kept in memory is, while its query runs.
    live: Arc<LiveStates>,
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("operatorId", DataType::Int64, false),
        Field::new("operatorName", DataType::Utf8, false),
        Field::new("stateStoreName", DataType::Utf8, false),
        Field::new("numPartitions", DataType::Int32, false),
        Field::new("minBatchId", DataType::Int64, true),
        Field::new("maxBatchId", DataType::Int64, true),
    ]))
}

impl StateMetadataTable {
    async fn rows(&self) -> Result<RecordBatch> {
        let location = Location::parse_existing_with(&self.dir, std::iter::empty::<(&str, &str)>())
            .map_err(user)?;
        let report = inspect(location)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        // A memory store's versions are in the running query, not in the checkpoint.
        let run = (report.conf.get(crate::api::STATE_STORE).map(String::as_str) == Some("memory"))
            .then(|| self.live.find(report.query_id)?.upgrade())
            .flatten();
        let (mut id, mut name, mut store, mut parts, mut lo, mut hi) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for op in &report.operators {
            for s in &op.store_names {
                id.push(i64::from(op.operator_id));
                name.push(op.operator_name.clone());
                store.push(s.clone());
                parts.push(op.num_partitions as i32);
                // State version v holds the state after batch v - 1; only committed batches
                // count.
                let versions = match &run {
                    // The versions every partition holds.
                    Some(run) => (0..op.num_partitions as u32)
                        .map(|p| {
                            run.provider.versions_held(&weir_state::StoreId::new(
                                op.state_id,
                                p,
                                s.as_str(),
                            ))
                        })
                        .try_fold((0, u64::MAX), |(lo, hi), v| {
                            v.map(|(a, b)| (lo.max(a), hi.min(b)))
                        }),
                    None => op.store_versions.get(s).copied(),
                };
                let range = versions.and_then(|v| op.batches_of(v, report.last_committed));
                lo.push(range.map(|r| r.0 as i64));
                hi.push(range.map(|r| r.1 as i64));
            }
        }
        Ok(RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(id)),
                Arc::new(StringArray::from(name)),
                Arc::new(StringArray::from(store)),
                Arc::new(Int32Array::from(parts)),
                Arc::new(Int64Array::from(lo)),
                Arc::new(Int64Array::from(hi)),
            ],
        )?)
    }
}

#[async_trait]
impl TableProvider for StateMetadataTable {
    fn schema(&self) -> SchemaRef {
        schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let table = MemTable::try_new(schema(), vec![vec![self.rows().await?]])?;
        table.scan(state, projection, filters, limit).await
    }
}

/// The relation `read_state('DIR', operatorId => k [, batchId => b] [, storeName => s])`, as
/// Spark's `statestore` data source: one row per state entry of operator `k` after batch `b`
/// (the last committed batch by default), with columns `key` and `value` (structs of the
/// operator's key and value columns) and `partition_id`. It reads the state of aggregations,
/// session windows, deduplications and stream-stream joins, from checkpoints of the RocksDB state store (local or `s3://`); the
/// memory store keeps nothing in the checkpoint. Planned by [`StateReaderPlanner`].
#[derive(Debug)]
struct StateTable {
    dir: String,
    operator: OperatorInfo,
    store: String,
    batch: u64,
    /// Whether the batch was asked for, rather than the last committed one.
    batch_given: bool,
    schema: SchemaRef,
    /// The running query's state, when it is kept in memory.
    live: Option<std::sync::Weak<StateRun>>,
}

/// Plans `read_state(...)`, whose named arguments DataFusion's table functions do not take.
#[derive(Debug)]
pub(crate) struct StateReaderPlanner {
    live: Arc<LiveStates>,
}

impl StateReaderPlanner {
    pub(crate) fn new(live: Arc<LiveStates>) -> Self {
        Self { live }
    }
}

fn invalid(message: impl Into<String>) -> DataFusionError {
    user(ClassifiedError::new(
        "STDS_INVALID_OPTION_VALUE",
        "42616",
        message,
    ))
}

fn arg_text(e: &SqlExpr) -> Option<String> {
    match e {
        SqlExpr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => Some(s.clone()),
            Value::Number(n, _) => Some(n.to_string()),
            _ => None,
        },
        _ => None,
    }
}

/// `read_state`'s arguments, as Spark's `statestore` source's options.
#[derive(Debug)]
struct ReadStateArgs {
    dir: String,
    operator: u32,
    batch: Option<u64>,
    store: Option<String>,
    /// A stream-stream join's side, `left` or `right`.
    join_side: Option<String>,
}

/// The names of `read_state`'s arguments, in the order they may be given without names.
const READ_STATE_ARGS: [&str; 5] = ["path", "operatorId", "batchId", "storeName", "joinSide"];

/// `read_state`'s arguments: the checkpoint, then `operatorId`, `batchId`, `storeName`,
/// `joinSide` by name or in that order.
fn read_state_args(args: &[FunctionArg]) -> Result<ReadStateArgs> {
    const USAGE: &str = "read_state takes the checkpoint location, then operatorId => n and \
                         optionally batchId => n, and storeName => 'name' or (for a \
                         stream-stream join) joinSide => 'left' | 'right': \
                         read_state('/data/ck', operatorId => 0).";
    let mut named: Vec<(String, String)> = vec![];
    for (i, a) in args.iter().enumerate() {
        let (name, e) = match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => {
                let name = READ_STATE_ARGS.get(i).ok_or_else(|| invalid(USAGE))?;
                (name.to_string(), e)
            }
            FunctionArg::Named {
                name,
                arg: FunctionArgExpr::Expr(e),
                ..
            } => (name.value.clone(), e),
            _ => return Err(invalid(USAGE)),
        };
        let value =
            arg_text(e).ok_or_else(|| invalid(format!("'{e}' is not a literal. {USAGE}")))?;
        named.push((name, value));
    }
    let get = |key: &str| {
        named
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.clone())
    };
    if let Some((k, _)) = named
        .iter()
        .find(|(k, _)| !READ_STATE_ARGS.iter().any(|n| n.eq_ignore_ascii_case(k)))
    {
        return Err(invalid(format!("Unknown argument '{k}'. {USAGE}")));
    }
    let dir = get("path").ok_or_else(|| invalid(USAGE))?;
    let number = |key: &str| -> Result<Option<u64>> {
        get(key)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| invalid(format!("{key} must be a number at least 0, not '{v}'.")))
            })
            .transpose()
    };
    let operator = number("operatorId")?.unwrap_or(0);
    let operator = u32::try_from(operator)
        .map_err(|_| invalid(format!("operatorId {operator} is too large.")))?;
    Ok(ReadStateArgs {
        dir,
        operator,
        batch: number("batchId")?,
        store: get("storeName"),
        join_side: get("joinSide"),
    })
}

impl RelationPlanner for StateReaderPlanner {
    fn plan_relation(
        &self,
        relation: TableFactor,
        _ctx: &mut dyn RelationPlannerContext,
    ) -> Result<RelationPlanning> {
        let TableFactor::Table {
            name,
            args: Some(args),
            alias,
            ..
        } = &relation
        else {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        };
        let fname = weir_planner::relation::last_name(name);
        if !fname.eq_ignore_ascii_case("read_state") {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        }
        let args = read_state_args(&args.args)?;
        // DataFusion compares table scans by name, not by what they read: two reads of state in
        // one query (operators 0 and 1 of one checkpoint) under one name were planned as one
        // of them. Each scan is named by its arguments, and aliased back to `read_state`.
        let scan_name = format!("{args:?}");
        let table =
            weir_common::block_on(StateTable::try_new(args, &self.live)).map_err(user)??;
        let plan = LogicalPlanBuilder::scan(scan_name, provider_as_source(Arc::new(table)), None)?
            .alias("read_state")?
            .build()?;
        Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
            plan,
            alias.clone(),
        ))))
    }
}

/// A checkpoint whose state was kept in memory by a query not running in this session.
fn not_durable(dir: &str) -> DataFusionError {
    user(ClassifiedError::new(
        "STATE_STORE_NOT_DURABLE",
        "0A000",
        format!(
            "The checkpoint '{dir}' keeps its state in memory (stateStore 'memory'), and no \
             query of this session is running on it, so there is no state to read. Read it \
             while the query runs, in the session running it, or run the query with the \
             rocksdb state store to keep its state in the checkpoint."
        ),
    ))
}

fn engine_err(e: crate::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

impl StateTable {
    /// Reads what the checkpoint says of the operator and the batch, checking both.
    async fn try_new(args: ReadStateArgs, live: &LiveStates) -> Result<Self> {
        let ReadStateArgs {
            dir,
            operator,
            batch,
            store,
            join_side,
        } = args;
        let location = Location::parse_existing_with(&dir, std::iter::empty::<(&str, &str)>())
            .map_err(user)?;
        let ck = Checkpoint::open_read_only(location)
            .await
            .map_err(engine_err)?;
        let ops = ck
            .read_state_metadata()
            .await
            .map_err(engine_err)?
            .map(|m| m.operators)
            .unwrap_or_default();
        let Some(op) = ops.iter().find(|o| o.operator_id == operator).cloned() else {
            let have: Vec<String> = ops
                .iter()
                .map(|o| format!("{} ({})", o.operator_id, o.operator_name))
                .collect();
            return Err(invalid(format!(
                "The checkpoint '{dir}' has no stateful operator {operator}; it has [{}].",
                have.join(", ")
            )));
        };
        let join = op.kind() == Some(OperatorKind::StreamStreamJoin);
        let store = match (join_side, store) {
            (Some(_), Some(_)) => {
                return Err(user(ClassifiedError::new(
                    "STDS_CONFLICT_OPTIONS",
                    "42613",
                    "read_state takes joinSide or storeName, not both: joinSide => 'left' \
                     reads the join's store 'left-rows'.",
                )));
            }
            (Some(side), None) if !join => {
                return Err(invalid(format!(
                    "joinSide => '{side}' reads a stream-stream join; operator {operator} is a \
                     {}. Leave joinSide out.",
                    op.operator_name
                )));
            }
            (Some(side), None) => match side.to_ascii_lowercase().as_str() {
                s @ ("left" | "right") => Some(format!("{s}-rows")),
                _ => {
                    return Err(invalid(format!(
                        "joinSide must be 'left' or 'right', not '{side}'."
                    )));
                }
            },
            (None, store) => store,
        };
        // An operator's first store holds its state ("default", a session window's
        // "sessions", a join's "left-rows"); the others are indexes.
        let store = store
            .or_else(|| op.store_names.first().cloned())
            .unwrap_or_default();
        if !op.store_names.contains(&store) {
            return Err(invalid(format!(
                "Operator {operator} ({}) has no store '{store}'; its stores are [{}].",
                op.operator_name,
                op.store_names.join(", ")
            )));
        }
        let last = last_committed(&ck).await?;
        let batch_given = batch.is_some();
        let batch = match (batch, last) {
            (Some(b), Some(l)) if b <= l => b,
            (None, Some(l)) => l,
            _ => {
                return Err(user(ClassifiedError::new(
                    "STDS_COMMITTED_BATCH_UNAVAILABLE",
                    "KD006",
                    format!(
                        "No committed batch{} in the checkpoint '{dir}' (the last committed is \
                         {}). Read a committed batch, or let the query commit one first.",
                        batch.map_or(String::new(), |b| format!(" {b}")),
                        last.map_or("none".to_string(), |l| l.to_string())
                    ),
                )));
            }
        };
        if let Some((n, r)) = ck.resets().await.map_err(engine_err)?.last()
            && batch + 1 < r.next_batch
        {
            return Err(user(ClassifiedError::new(
                "STDS_COMMITTED_BATCH_UNAVAILABLE",
                "KD006",
                format!(
                    "The state after batch {batch} is no longer kept: the reset resets/{n} of \
                     the checkpoint '{dir}' changed the state from batch {} on. Read batch {} \
                     or later.",
                    r.next_batch,
                    r.next_batch.saturating_sub(1)
                ),
            )));
        }
        let logged_store = match ck.read_offsets(batch).await {
            Ok(entry) => entry.metadata.conf.get(crate::api::STATE_STORE).cloned(),
            Err(_) => None,
        };
        let live = match logged_store.as_deref() {
            Some("memory") => Some(live.find(ck.id()).ok_or_else(|| not_durable(&dir))?),
            _ => None,
        };
        let format = op.kind().map(OperatorKind::format);
        let Some(format) = format.filter(|f| f.readable(&store)) else {
            return Err(user(ClassifiedError::new(
                "STDS_UNSUPPORTED_OPERATOR",
                "0A000",
                format!(
                    "read_state reads the state of aggregations, session-window aggregations \
                     (store 'sessions'), deduplications and stream-stream joins (stores 'left' \
                     and 'right'); the store '{store}' of operator {operator} (a {}) is an \
                     index it does not decode.",
                    op.operator_name
                ),
            )));
        };
        let value_fields: Fields = format.read_fields(&op, &store);
        let schema = Arc::new(Schema::new(vec![
            Field::new(
                "key",
                DataType::Struct(op.key_schema.fields().clone()),
                true,
            ),
            Field::new("value", DataType::Struct(value_fields), true),
            Field::new("partition_id", DataType::Int32, true),
        ]));
        Ok(Self {
            dir,
            operator: op,
            store,
            batch,
            batch_given,
            schema,
            live,
        })
    }

    /// The entries of a running query's memory state store.
    async fn live_rows(
        &self,
        live: &std::sync::Weak<StateRun>,
        ck: &Checkpoint,
    ) -> Result<RecordBatch> {
        let run = live.upgrade().ok_or_else(|| not_durable(&self.dir))?;
        // The query goes on meanwhile: the last committed batch is the one now.
        let batch = match self.batch_given {
            true => self.batch,
            false => last_committed(ck).await?.unwrap_or(self.batch),
        };
        // A memory store keeps the newest versions only (two).
        let entries = read_entries(run.provider.as_ref(), &self.operator, &self.store, batch)
            .map_err(|e| match e {
                weir_state::Error::VersionNotFound { .. } => user(ClassifiedError::new(
                    "STDS_COMMITTED_BATCH_UNAVAILABLE",
                    "KD006",
                    format!(
                        "The state after batch {batch} of the query at '{}' is no longer in \
                         memory: a memory state store keeps the last two versions. Read the \
                         last committed batch (leave batchId out).",
                        self.dir
                    ),
                )),
                e => user(ClassifiedError::from(e)),
            })?;
        decode(&self.operator, &self.schema, entries)
    }

    /// Opens the operator's stores at the state after the batch and decodes their entries.
    async fn rows(&self) -> Result<RecordBatch> {
        let location = Location::parse_existing_with(&self.dir, std::iter::empty::<(&str, &str)>())
            .map_err(user)?;
        let ck = Checkpoint::open_read_only(location)
            .await
            .map_err(engine_err)?;
        if let Some(live) = &self.live {
            return self.live_rows(live, &ck).await;
        }
        let scratch =
            crate::stateful::run_scratch_dir("weir-read-state", ck.id(), uuid::Uuid::new_v4());
        let state_dir = match ck.state_dir() {
            Some(d) => d,
            None => {
                // An object-store checkpoint: copy the operator's folder first.
                let sid = self.operator.state_id();
                let local = scratch.join("state");
                crate::checkpoint::state_mirror::StateMirror::download(
                    ck.location().child(&format!("state/{sid}")),
                    local.join(sid.to_string()),
                )
                .await
                .map_err(engine_err)?;
                local
            }
        };
        let (op, store, batch) = (self.operator.clone(), self.store.clone(), self.batch);
        let scratch_for_db = scratch.join("db");
        let entries = tokio::task::spawn_blocking(move || {
            let provider = weir_state::RocksDbStateStoreProvider::new(state_dir, scratch_for_db);
            read_entries(&provider, &op, &store, batch).map_err(|e| user(ClassifiedError::from(e)))
        })
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)));
        let _ = std::fs::remove_dir_all(&scratch);
        let entries = entries??;
        decode(&self.operator, &self.schema, entries)
    }
}

/// A partition and its store's entries (encoded key, encoded value).
type PartitionEntries = (u32, Vec<(Vec<u8>, Vec<u8>)>);

/// Every entry of `store` of `op`, per partition, in the state after batch `batch`.
fn read_entries(
    provider: &dyn weir_state::StateStoreProvider,
    op: &OperatorInfo,
    store: &str,
    batch: u64,
) -> weir_state::Result<Vec<PartitionEntries>> {
    let mut out = vec![];
    for partition in 0..op.num_partitions as u32 {
        let id = weir_state::StoreId::new(op.state_id(), partition, store);
        let s = provider.open(&id, op.state_version(batch + 1))?;
        out.push((partition, s.scan(&weir_state::KeyRange::all())?));
    }
    Ok(out)
}

/// The checkpoint's last committed batch, if any.
async fn last_committed(ck: &Checkpoint) -> Result<Option<u64>> {
    Ok(ck
        .resume_point()
        .await
        .map_err(engine_err)?
        .last_committed())
}

/// The entries as rows of `schema`: keys and values decoded as the operator's kind lays them
/// out (a session window's entry holds a group key's sessions, a join side's a join key's
/// rows: one row each).
fn decode(
    op: &OperatorInfo,
    schema: &SchemaRef,
    entries: Vec<PartitionEntries>,
) -> Result<RecordBatch> {
    use arrow::array::StructArray;
    let format = op.kind().map(OperatorKind::format).ok_or_else(|| {
        DataFusionError::Internal(format!("read_state of a {} operator", op.operator_name))
    })?;
    let entries: Vec<PartitionEntries> = entries
        .into_iter()
        .map(|(p, e)| {
            let mut rows = vec![];
            for (k, v) in e {
                rows.extend(format.read_entries(&k, &v).ok_or_else(|| {
                    user(ClassifiedError::new(
                        "STATE_STORE_FILE_CORRUPT",
                        "XX001",
                        format!(
                            "A value of the state of operator {} (a {}) is damaged.",
                            op.operator_id, op.operator_name
                        ),
                    ))
                })?);
            }
            Ok((p, rows))
        })
        .collect::<Result<_>>()?;
    let n: usize = entries.iter().map(|(_, e)| e.len()).sum();
    let partitions: Vec<i32> = entries
        .iter()
        .flat_map(|(p, e)| std::iter::repeat_n(*p as i32, e.len()))
        .collect();
    let pairs: Vec<&(Vec<u8>, Vec<u8>)> = entries.iter().flat_map(|(_, e)| e).collect();
    // A global aggregate's key has no columns.
    let keys: Vec<&[u8]> = pairs.iter().map(|(k, _)| k.as_slice()).collect();
    let key = value_struct(
        op.key_schema.fields(),
        decode_rows(op.key_schema.fields(), &keys)?,
        n,
    )?;
    let DataType::Struct(fields) = schema.field(1).data_type() else {
        return Err(DataFusionError::Internal(
            "read_state's value column is not a struct".into(),
        ));
    };
    let values: Vec<&[u8]> = pairs.iter().map(|(_, v)| v.as_slice()).collect();
    let value: StructArray = value_struct(fields, format.decode_values(fields, &values)?, n)?;
    Ok(RecordBatch::try_new(
        Arc::clone(schema),
        vec![
            Arc::new(key),
            Arc::new(value),
            Arc::new(Int32Array::from(partitions)),
        ],
    )?)
}

#[async_trait]
impl TableProvider for StateTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let table = MemTable::try_new(self.schema(), vec![vec![self.rows().await?]])?;
        table.scan(state, projection, filters, limit).await
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, ArrayRef, StructArray};
    use arrow::row::{RowConverter, SortField};
    use weir_state::{MemoryStateStoreProvider, StateStoreProvider, StoreId, WriteBatch};

    use super::*;

    fn op(name: &str, key: Schema, value: Schema) -> OperatorInfo {
        let mut op = OperatorInfo::placeholder();
        op.operator_id = 0;
        op.operator_name = name.into();
        op.num_partitions = 2;
        op.store_names = vec!["default".into()];
        op.key_schema = key;
        op.value_schema = value;
        op
    }

    fn row(fields: &Schema, column: ArrayRef) -> Vec<u8> {
        let c = RowConverter::new(
            fields
                .fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )
        .unwrap();
        c.convert_columns(&[column])
            .unwrap()
            .row(0)
            .as_ref()
            .to_vec()
    }

    /// Writes `entries` into partition `p`'s store at version 1.
    fn write(provider: &MemoryStateStoreProvider, p: u32, entries: Vec<(Vec<u8>, Vec<u8>)>) {
        let mut s = provider.open(&StoreId::new(0, p, "default"), 0).unwrap();
        let mut batch = WriteBatch::new();
        for (k, v) in entries {
            batch.put(k, v);
        }
        s.apply(batch).unwrap();
        s.commit().unwrap();
    }

    fn schema_of(op: &OperatorInfo) -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new(
                "key",
                DataType::Struct(op.key_schema.fields().clone()),
                true,
            ),
            Field::new(
                "value",
                DataType::Struct(op.value_schema.fields().clone()),
                true,
            ),
            Field::new("partition_id", DataType::Int32, true),
        ]))
    }

    #[test]
    fn aggregate_entries_decode_into_key_and_value_structs_by_partition() {
        let key = Schema::new(vec![Field::new("k", DataType::Utf8, true)]);
        let value = Schema::new(vec![Field::new("count", DataType::Int64, true)]);
        let op = op("aggregate", key.clone(), value.clone());
        let provider = MemoryStateStoreProvider::new();
        let entry = |k: &str, n: i64| {
            (
                row(&key, Arc::new(StringArray::from(vec![k]))),
                row(&value, Arc::new(Int64Array::from(vec![n]))),
            )
        };
        write(&provider, 0, vec![entry("a", 3)]);
        write(&provider, 1, vec![entry("b", 5), entry("c", 7)]);
        // The state after batch 0 is version 1.
        let rows = decode(
            &op,
            &schema_of(&op),
            read_entries(&provider, &op, "default", 0).unwrap(),
        )
        .unwrap();
        assert_eq!(rows.num_rows(), 3);
        let keys = rows
            .column(0)
            .as_any()
            .downcast_ref::<StructArray>()
            .unwrap();
        let k = keys
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        let values = rows
            .column(1)
            .as_any()
            .downcast_ref::<StructArray>()
            .unwrap();
        let n = values
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let p = rows
            .column(2)
            .as_any()
            .downcast_ref::<Int32Array>()
            .unwrap();
        let got: Vec<(String, i64, i32)> = (0..3)
            .map(|i| (k.value(i).to_string(), n.value(i), p.value(i)))
            .collect();
        assert_eq!(
            got,
            [("a".into(), 3, 0), ("b".into(), 5, 1), ("c".into(), 7, 1)]
        );
    }

    #[test]
    fn a_dedupe_within_watermark_shows_each_keys_expiry() {
        let key = Schema::new(vec![Field::new("id", DataType::Int64, true)]);
        let value = Schema::new(vec![Field::new("expires_at_us", DataType::Int64, false)]);
        let op = op("dedupeWithinWatermark", key.clone(), value);
        let provider = MemoryStateStoreProvider::new();
        write(
            &provider,
            0,
            vec![(
                row(&key, Arc::new(Int64Array::from(vec![42]))),
                1_000_000i64.to_be_bytes().to_vec(),
            )],
        );
        write(&provider, 1, vec![]);
        let rows = decode(
            &op,
            &schema_of(&op),
            read_entries(&provider, &op, "default", 0).unwrap(),
        )
        .unwrap();
        let values = rows
            .column(1)
            .as_any()
            .downcast_ref::<StructArray>()
            .unwrap();
        let expiry = values
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!((rows.num_rows(), expiry.value(0)), (1, 1_000_000));
        assert!(!expiry.is_null(0));
    }
}
