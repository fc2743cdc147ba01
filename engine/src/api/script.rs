//! Running SQL: a script of statements, each either weir's (`CREATE STREAMING TABLE`,
//! `INSERT INTO` a streaming table), a streaming `SELECT` (written to the console by default),
//! or DataFusion batch SQL.

use arrow::record_batch::RecordBatch;
use datafusion::logical_expr::LogicalPlan;
use weir_common::Options;
use weir_planner::is_streaming;
use weir_planner::statement::{CreateStreamingTable, Statement, parse_script};
use weir_sinks::OutputMode;

use crate::api::DataStreamWriter;
use crate::{Error, Result, StreamingQuery, Trigger, WeirSession};

/// Settings that apply to every streaming query a script starts (the CLI's flags). Each wins
/// over the statement's own option of the same meaning.
#[derive(Debug, Clone, Default)]
pub struct ScriptOptions {
    /// Checkpoint location (`--checkpoint`). A script that starts several queries must give
    /// each its own `checkpointLocation` instead.
    pub checkpoint: Option<String>,
    /// Trigger (`--trigger`).
    pub trigger: Option<Trigger>,
    /// Stop each query after this many batches (`--max-batches`).
    pub max_batches: Option<u64>,
    /// Sink format for a bare streaming `SELECT` (default `console`).
    pub default_sink: Option<String>,
}

/// What a statement did.
#[derive(Debug)]
pub enum StatementResult {
    /// It started a streaming query.
    Query(StreamingQuery),
    /// It was a batch query; these are its rows.
    Rows(Vec<RecordBatch>),
    /// It changed the session (DDL, a declaration), or it was skipped while validating.
    Done,
    /// It was a streaming query checked against its checkpoint, not started
    /// ([`WeirSession::validate_script`]).
    Validated(Box<crate::ValidationReport>),
    /// It was a streaming query whose checkpoint was fitted to it, not started
    /// ([`WeirSession::reset_script`]).
    Reset(Box<crate::tools::reset::ResetReport>),
    /// It was a streaming query whose batch was run again read-only
    /// ([`WeirSession::replay_script`]).
    Replayed(Box<crate::ReplayReport>),
}

/// Whether a script's streaming queries start or are only checked.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    Run,
    Validate,
    /// A selective reset; these sources (positions or names) start anew, from their starting
    /// position if the flag says so.
    Reset(Vec<String>, bool),
    Replay(u64),
}

const RESERVED: &[&str] = &[
    "checkpointLocation",
    "trigger",
    "outputMode",
    "queryName",
    TOMBSTONE_SETTING,
];

/// How long an AUTO CDC table remembers a delete (Databricks' table property).
const TOMBSTONE_SETTING: &str = "pipelines.cdc.tombstoneGCThresholdInSeconds";

impl WeirSession {
    /// Runs one statement with default settings.
    pub async fn sql(&self, sql: &str) -> Result<StatementResult> {
        let mut all = self.run_script(sql, &ScriptOptions::default()).await?;
        match all.len() {
            1 => Ok(all.remove(0)),
            n => Err(Error::user(
                "PARSE_SYNTAX_ERROR",
                "42601",
                format!("sql() takes exactly one statement, found {n}; use run_script()."),
            )),
        }
    }

    /// Runs every statement of `script` in order. Streaming queries are started and keep
    /// running; the results say which.
    pub async fn run_script(
        &self,
        script: &str,
        opts: &ScriptOptions,
    ) -> Result<Vec<StatementResult>> {
        self.script(script, opts, Mode::Run).await
    }

    /// Checks each streaming query of `script` against its checkpoint
    /// ([`DataStreamWriter::validate`]) instead of starting it. Declarations and DDL run, as
    /// the queries need them; batch queries and DML are skipped, so nothing is written.
    pub async fn validate_script(
        &self,
        script: &str,
        opts: &ScriptOptions,
    ) -> Result<Vec<StatementResult>> {
        self.script(script, opts, Mode::Validate).await
    }

    /// Fits the checkpoint of each streaming query of `script` to it
    /// ([`DataStreamWriter::reset_checkpoint_sources`], a selective reset) instead of starting
    /// it, starting the sources `sources` anew. Declarations and DDL run; batch queries and DML
    /// are skipped.
    pub async fn reset_script(
        &self,
        script: &str,
        opts: &ScriptOptions,
        sources: &[String],
        from_starting_position: bool,
    ) -> Result<Vec<StatementResult>> {
        let mode = Mode::Reset(sources.to_vec(), from_starting_position);
        self.script(script, opts, mode).await
    }

    /// Runs batch `batch` of the checkpoint of each streaming query of `script` again,
    /// read-only ([`DataStreamWriter::replay_batch`]), instead of starting it. Declarations and
    /// DDL run; batch queries and DML are skipped.
    pub async fn replay_script(
        &self,
        script: &str,
        opts: &ScriptOptions,
        batch: u64,
    ) -> Result<Vec<StatementResult>> {
        self.script(script, opts, Mode::Replay(batch)).await
    }

    async fn script(
        &self,
        script: &str,
        opts: &ScriptOptions,
        mode: Mode,
    ) -> Result<Vec<StatementResult>> {
        let mut out = vec![];
        let mut started_with_shared_checkpoint = 0;
        for stmt in parse_script(script)? {
            let result = match stmt {
                Statement::CreateStreamingTable(decl)
                    if decl.columns.is_some() || !decl.partitioned_by.is_empty() =>
                {
                    return Err(Error::user(
                        "UNSUPPORTED_FEATURE.PIPELINE_ONLY_CLAUSE",
                        "0A000",
                        format!(
                            "CREATE STREAMING TABLE {}: a column list and PARTITIONED BY are read \
                             in pipelines (weir pipeline run); in a script, the query decides the \
                             columns. Remove them, or define the table in a pipeline.",
                            decl.name
                        ),
                    ));
                }
                Statement::CreateStreamingTable(decl) if decl.auto_cdc.is_some() => {
                    let (decl, plan) = self.auto_cdc_table(decl).await?;
                    self.start_into(
                        &decl,
                        plan,
                        opts,
                        &mut started_with_shared_checkpoint,
                        mode.clone(),
                    )
                    .await?
                }
                Statement::CreateStreamingTable(decl) => match &decl.query {
                    None => {
                        self.declare(decl)?;
                        StatementResult::Done
                    }
                    Some(q) => {
                        let plan = self.plan_sql(q).await?;
                        self.start_into(
                            &decl,
                            plan,
                            opts,
                            &mut started_with_shared_checkpoint,
                            mode.clone(),
                        )
                        .await?
                    }
                },
                Statement::Insert { table, query, sql } => {
                    let decl = self
                        .inner()
                        .declared
                        .lock()
                        .ok()
                        .and_then(|d| d.get(&table.to_ascii_lowercase()).cloned());
                    match decl {
                        Some(decl) => {
                            let plan = self.plan_sql(&query).await?;
                            self.start_into(
                                &decl,
                                plan,
                                opts,
                                &mut started_with_shared_checkpoint,
                                mode.clone(),
                            )
                            .await?
                        }
                        None if mode != Mode::Run => StatementResult::Done,
                        None => self.batch(&sql).await?,
                    }
                }
                Statement::Sql(sql) => {
                    let plan = self.plan_sql(&sql).await?;
                    if is_streaming(&plan) {
                        let decl = CreateStreamingTable {
                            name: String::new(),
                            or_refresh: false,
                            if_not_exists: false,
                            format: Some(
                                opts.default_sink
                                    .clone()
                                    .unwrap_or_else(|| "console".into()),
                            ),
                            location: None,
                            options: Options::new(),
                            query: Some(sql),
                            columns: None,
                            partitioned_by: vec![],
                            auto_cdc: None,
                        };
                        self.start_into(
                            &decl,
                            plan,
                            opts,
                            &mut started_with_shared_checkpoint,
                            mode.clone(),
                        )
                        .await?
                    } else if mode != Mode::Run && !matches!(plan, LogicalPlan::Ddl(_)) {
                        StatementResult::Done
                    } else {
                        let df = self.context().execute_logical_plan(plan).await?;
                        StatementResult::Rows(df.collect().await?)
                    }
                }
            };
            out.push(result);
        }
        Ok(out)
    }

    /// DBSQL's `CREATE STREAMING TABLE t LOCATION '...' FLOW AUTO CDC FROM src KEYS ...`: the
    /// flow's plan (its changes through AUTO CDC) and the table as a Delta sink merging on the
    /// keys.
    async fn auto_cdc_table(
        &self,
        mut decl: CreateStreamingTable,
    ) -> Result<(CreateStreamingTable, LogicalPlan)> {
        let Some(cdc) = decl.auto_cdc.take() else {
            return Err(Error::Internal("not an AUTO CDC table".into()));
        };
        let invalid = |message: String| Error::user("INVALID_AUTO_CDC_FLOW", "42K06", message);
        if decl
            .format
            .as_deref()
            .is_some_and(|f| !f.eq_ignore_ascii_case("delta"))
        {
            return Err(invalid(format!(
                "Streaming table {} is kept by AUTO CDC, which merges into a Delta table: write \
                 USING delta, or leave USING out.",
                decl.name
            )));
        }
        if decl.location.is_none() {
            return Err(invalid(format!(
                "Streaming table {} is kept by AUTO CDC into a Delta table: give its folder with \
                 LOCATION '...'.",
                decl.name
            )));
        }
        if cdc.ignore_null_updates {
            return Err(Error::user(
                "UNSUPPORTED_FEATURE.AUTO_CDC_IGNORE_NULL_UPDATES",
                "0A000",
                format!(
                    "Streaming table {} asks for IGNORE NULL UPDATES, which this weir does not \
                     apply yet (a null in an upsert overwrites the stored value). Remove the \
                     clause.",
                    decl.name
                ),
            ));
        }
        let ttl_ms = match decl.options.get(TOMBSTONE_SETTING) {
            None => weir_planner::auto_cdc::DEFAULT_TOMBSTONE_TTL_MS,
            Some(v) => v
                .trim()
                .parse::<i64>()
                .ok()
                .filter(|s| *s >= 0)
                .map(|s| s.saturating_mul(1000))
                .ok_or_else(|| {
                    Error::user(
                        "STREAMING_INVALID_OPTION",
                        "42616",
                        format!(
                            "{TOMBSTONE_SETTING} must be a whole number of seconds, not '{v}'."
                        ),
                    )
                })?,
        };
        let plan = self
            .plan_sql(&weir_planner::auto_cdc::auto_cdc_input(&cdc))
            .await?;
        let plan = weir_planner::auto_cdc::auto_cdc(
            plan,
            &weir_planner::auto_cdc::AutoCdcOptions::of(&cdc, ttl_ms),
        )
        .map_err(Error::User)?;
        if let Some(node) = weir_planner::auto_cdc::AutoCdcNode::of(&plan) {
            decl.options.set("weir.autoCdc.keys", node.keys.join(","));
        }
        decl.format = Some("delta".into());
        Ok((decl, plan))
    }

    async fn batch(&self, sql: &str) -> Result<StatementResult> {
        let plan = self.plan_sql(sql).await?;
        let df = self.context().execute_logical_plan(plan).await?;
        Ok(StatementResult::Rows(df.collect().await?))
    }

    fn declare(&self, decl: CreateStreamingTable) -> Result<()> {
        let mut d = self
            .inner()
            .declared
            .lock()
            .map_err(|_| Error::Internal("declaration lock poisoned".into()))?;
        let key = decl.name.to_ascii_lowercase();
        if d.contains_key(&key) && !decl.or_refresh && !decl.if_not_exists {
            return Err(Error::user(
                "TABLE_OR_VIEW_ALREADY_EXISTS",
                "42P07",
                format!(
                    "The streaming table '{}' is already declared; use CREATE OR REFRESH STREAMING \
                     TABLE to redefine it.",
                    decl.name
                ),
            ));
        }
        if !(d.contains_key(&key) && decl.if_not_exists) {
            d.insert(key, decl);
        }
        Ok(())
    }

    async fn start_into(
        &self,
        decl: &CreateStreamingTable,
        plan: LogicalPlan,
        opts: &ScriptOptions,
        shared_checkpoint_uses: &mut usize,
        mode: Mode,
    ) -> Result<StatementResult> {
        let o = &decl.options;
        let format = decl.format.clone().unwrap_or_else(|| {
            if decl.location.is_some() {
                "parquet".into()
            } else {
                "memory".into()
            }
        });
        let mut w =
            DataStreamWriter::new(std::sync::Arc::clone(self.inner()), plan).format(&format);
        if !decl.name.is_empty() {
            w = w.query_name(decl.name.clone());
        } else if let Some(n) = o.get("queryName") {
            w = w.query_name(n);
        }
        for (k, v) in o.iter() {
            if !RESERVED.iter().any(|r| r.eq_ignore_ascii_case(k)) {
                w = w.option(k, v);
            }
        }
        if let Some(path) = &decl.location {
            w = w.option("path", path);
        }
        if let Some(m) = o.get("outputMode") {
            w = w.output_mode(OutputMode::parse(m)?);
        }
        match (&opts.checkpoint, o.get("checkpointLocation")) {
            (Some(dir), _) => {
                *shared_checkpoint_uses += 1;
                if *shared_checkpoint_uses > 1 {
                    return Err(Error::user(
                        "CHECKPOINT_LOCATION_SHARED",
                        "42601",
                        "--checkpoint names one checkpoint, but this script starts more than one \
                         streaming query: give each CREATE STREAMING TABLE its own OPTIONS \
                         (checkpointLocation '...') instead.",
                    ));
                }
                w = w.checkpoint_location(dir.clone());
            }
            (None, Some(dir)) => w = w.checkpoint_location(dir),
            (None, None) => {}
        }
        if let Some(t) = opts.trigger {
            w = w.trigger(t);
        } else if let Some(t) = o.get("trigger") {
            w = w.trigger(Trigger::parse(t)?);
        }
        if let Some(n) = opts.max_batches {
            w = w.max_batches(n);
        }
        Ok(match mode {
            Mode::Run => StatementResult::Query(w.start().await?),
            Mode::Validate => StatementResult::Validated(Box::new(w.validate().await?)),
            Mode::Reset(sources, from_start) => StatementResult::Reset(Box::new(
                w.reset_checkpoint_sources(&sources, from_start).await?,
            )),
            Mode::Replay(b) => StatementResult::Replayed(Box::new(w.replay_batch(b).await?)),
        })
    }
}
