//! The Delta Lake sink (`format("delta")`, `USING delta LOCATION ...`), as Spark's Delta sink:
//! each micro-batch is one Delta commit (an append, or in complete mode an overwrite of the whole
//! table), and the commit carries a transaction action `txn {appId: <query id>, version:
//! <batch id>}`. A batch replayed after a crash whose `txn` version is already in the table is
//! skipped, so the table holds every batch exactly once.
//!
//! An AUTO CDC flow's sink merges instead (option `weir.autoCdc.keys`): its input leads with
//! `__weir_cdc_action` (`weir_planner::auto_cdc`), and each batch is one MERGE on the keys
//! (delete a key's rows, upsert a row, insert a version), committed with the same `txn`.
//!
//! ```text
//! open:      load the table; create it from the query's schema if the folder has none;
//!            refuse a table whose columns or partitioning differ (before any batch runs)
//! add_batch: refresh the snapshot; txn version of this query >= batch id -> skip;
//!            else write parquet files + commit {add..., txn, commitInfo} (create-only);
//!            an empty append-mode batch commits {txn, commitInfo} alone, as Spark's
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use deltalake::DeltaTable;
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::{StructType, Transaction};
use deltalake::protocol::{DeltaOperation, SaveMode};
use tokio::sync::Mutex;
use url::Url;
use weir_common::delta::{self, table_url};
use weir_common::{ClassifiedError, Options};

use crate::{CheckpointBatches, Error, OutputMode, Result, Sink};

const ACCEPTED: &[&str] = &[
    "path",
    "partitionBy",
    "mergeSchema",
    "userMetadata",
    "weir.autoCdc.keys",
    "aws_<option>",
];

/// The column an AUTO CDC flow's output leads with (`weir_planner::auto_cdc::ACTION`).
const CDC_ACTION: &str = "__weir_cdc_action";
/// An SCD 1 target's column of each row's winning sequence (`weir_planner::auto_cdc::SEQUENCE`).
const CDC_SEQUENCE: &str = "__weir_cdc_sequence";

/// The typed options of a Delta sink.
#[derive(Debug, Clone)]
pub struct DeltaSinkOptions {
    /// The table's folder as given (`path` / `LOCATION`).
    pub path: String,
    /// `partitionBy`: partition columns of a table the sink creates (comma-separated).
    pub partition_by: Vec<String>,
    /// `mergeSchema`: new output columns are added to the table's schema.
    pub merge_schema: bool,
    /// `userMetadata`: kept in each commit's `commitInfo`.
    pub user_metadata: Option<String>,
    /// `aws_*` options of the S3 client.
    pub storage: HashMap<String, String>,
    /// `weir.autoCdc.keys`: an AUTO CDC flow's key columns; each batch is a MERGE on them.
    pub merge_keys: Vec<String>,
}

impl DeltaSinkOptions {
    /// Reads the options, refusing unknown or malformed ones.
    pub fn parse(options: &Options) -> Result<Self> {
        let (storage, own) = delta::storage_options(options);
        let r = own.reader("delta sink", ACCEPTED);
        r.check_known()?;
        let path = r.string("path").ok_or_else(|| {
            ClassifiedError::invalid_option(
                "The delta sink needs the table's folder: give LOCATION '...' in SQL or the \
                 option 'path'.",
            )
        })?;
        let columns = |option: &str| -> Vec<String> {
            r.string(option)
                .map(|s| {
                    s.split(',')
                        .map(|c| c.trim().to_string())
                        .filter(|c| !c.is_empty())
                        .collect()
                })
                .unwrap_or_default()
        };
        let partition_by = columns("partitionBy");
        let merge_keys = columns("weir.autoCdc.keys");
        Ok(Self {
            path,
            partition_by,
            merge_schema: r.bool("mergeSchema", false)?,
            user_metadata: r.string("userMetadata"),
            storage,
            merge_keys,
        })
    }
}

/// Writes each batch as one Delta commit with the query's transaction action.
#[derive(Debug)]
pub struct DeltaSink {
    options: DeltaSinkOptions,
    url: Url,
    schema: SchemaRef,
    mode: OutputMode,
    /// The query id (the `txn` appId) and the table as last loaded, once opened.
    opened: Mutex<Option<(String, DeltaTable)>>,
    /// What the last MERGE did (AUTO CDC).
    last_merge: std::sync::Mutex<Option<MergeFigures>>,
}

/// What one AUTO CDC batch's MERGE did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeFigures {
    /// Wall time of the MERGE, commit included (ms).
    pub merge_ms: u64,
    /// Rows of the batch's changes.
    pub source_rows: u64,
    /// Files the commit added.
    pub files_added: u64,
    /// Files the commit removed (rewritten).
    pub files_removed: u64,
    /// Rows written, copies of unchanged rows of rewritten files included.
    pub rows_written: u64,
}

impl DeltaSink {
    /// A sink writing the rows of `schema` into the table at `options.path`.
    pub fn try_new(options: &Options, schema: &SchemaRef, mode: OutputMode) -> Result<Self> {
        let options = DeltaSinkOptions::parse(options)?;
        for c in &options.partition_by {
            if schema.field_with_name(c).is_err() {
                return Err(ClassifiedError::invalid_option(format!(
                    "The partition column '{c}' of the delta sink is not an output column; the \
                     output has: {}.",
                    column_names(schema)
                ))
                .into());
            }
        }
        let url = table_url(&options.path, false)?;
        // An AUTO CDC flow's output: the table has its columns but the action.
        let schema = if options.merge_keys.is_empty() {
            Arc::clone(schema)
        } else {
            if schema.fields().first().map(|f| f.name().as_str()) != Some(CDC_ACTION) {
                return Err(ClassifiedError::invalid_option(
                    "The option weir.autoCdc.keys is for the output of an AUTO CDC flow.",
                )
                .into());
            }
            for k in &options.merge_keys {
                if schema.field_with_name(k).is_err() {
                    return Err(ClassifiedError::invalid_option(format!(
                        "The AUTO CDC key '{k}' is not an output column."
                    ))
                    .into());
                }
            }
            Arc::new(arrow::datatypes::Schema::new(
                schema.fields().iter().skip(1).cloned().collect::<Vec<_>>(),
            ))
        };
        Ok(Self {
            options,
            url,
            schema,
            mode,
            opened: Mutex::new(None),
            last_merge: std::sync::Mutex::new(None),
        })
    }

    /// What the last batch's MERGE did (an AUTO CDC flow's sink), if one ran.
    pub fn last_merge(&self) -> Option<MergeFigures> {
        self.last_merge.lock().ok().and_then(|m| *m)
    }

    /// Applies an AUTO CDC batch's changes as one MERGE on the keys, committed with `props`
    /// (the flow's `txn`): action 1 deletes the key's rows, 2 replaces or inserts the key's
    /// row, 0 inserts a row (an SCD 2 version; it never matches), 3 deletes every row below
    /// its sequence (a truncate). In an SCD 1 table, whose rows keep their sequence, a row is
    /// replaced only by a change at or above it and deleted only by one above it, so that
    /// several flows into one table order their changes by sequence.
    async fn merge(
        &self,
        table: &DeltaTable,
        rows: Vec<RecordBatch>,
        props: CommitProperties,
    ) -> Result<DeltaTable> {
        use deltalake::datafusion::common::Column;
        use deltalake::datafusion::logical_expr::{Expr, lit};
        let started = std::time::Instant::now();
        let source_rows = rows.iter().map(|b| b.num_rows() as u64).sum();
        let truncate_at = truncate_sequence(&rows)?;
        let ctx = deltalake::datafusion::prelude::SessionContext::new();
        let source = ctx
            .read_batches(rows)
            .map_err(|e| Error::Corrupt(format!("the AUTO CDC changes: {e}")))?;
        let side = |alias: &str, name: &str| Expr::Column(Column::new(Some(alias), name));
        let action = || side("source", CDC_ACTION);
        let on = self
            .options
            .merge_keys
            .iter()
            .map(|k| side("target", k).eq(side("source", k)))
            .fold(action().not_eq(lit(0i8)), |all, e| all.and(e));
        let columns: Vec<String> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let sequenced = columns.iter().any(|c| c == CDC_SEQUENCE);
        let newer = |at_equal: bool| {
            if !sequenced {
                return lit(true);
            }
            let (s, t) = (side("source", CDC_SEQUENCE), side("target", CDC_SEQUENCE));
            let newer = if at_equal {
                s.gt_eq(t.clone())
            } else {
                s.gt(t.clone())
            };
            t.is_null().or(newer)
        };
        let doing = format!(
            "merge an AUTO CDC batch into the Delta table at {}",
            self.url
        );
        let fail = |e| delta::error(e, &doing);
        let mut merge = table
            .clone()
            .merge(source, on)
            .with_source_alias("source")
            .with_target_alias("target")
            .with_commit_properties(props)
            .when_matched_delete(|d| d.predicate(action().eq(lit(1i8)).and(newer(false))))
            .map_err(fail)?
            .when_matched_update(|u| {
                columns.iter().fold(
                    u.predicate(action().eq(lit(2i8)).and(newer(true))),
                    |u, c| u.update(Column::new_unqualified(c), side("source", c)),
                )
            })
            .map_err(fail)?
            .when_not_matched_insert(|i| {
                columns.iter().fold(
                    i.predicate(action().eq(lit(0i8)).or(action().eq(lit(2i8)))),
                    |i, c| i.set(Column::new_unqualified(c), side("source", c)),
                )
            })
            .map_err(fail)?;
        if let Some(t) = truncate_at {
            merge = merge
                .when_not_matched_by_source_delete(|d| {
                    d.predicate(side("target", CDC_SEQUENCE).lt(lit(t)))
                })
                .map_err(fail)?;
        }
        if self.options.merge_schema {
            merge = merge.with_merge_schema(true);
        }
        let (table, metrics) = merge.await.map_err(fail)?;
        if let Ok(mut last) = self.last_merge.lock() {
            *last = Some(MergeFigures {
                merge_ms: started.elapsed().as_millis() as u64,
                source_rows,
                files_added: metrics.num_target_files_added as u64,
                files_removed: metrics.num_target_files_removed as u64,
                rows_written: metrics.num_output_rows as u64,
            });
        }
        Ok(table)
    }

    /// The options a Delta source reading this table needs (`path` and the S3 client's).
    pub fn source_options(&self) -> Options {
        let mut o = Options::new().with("path", self.url.as_str());
        for (k, v) in &self.options.storage {
            o.set(k.clone(), v.clone());
        }
        o
    }

    fn kernel_schema(&self) -> Result<StructType> {
        let normalized = deltalake::kernel::schema::cast::normalize_for_delta(&self.schema);
        normalized.as_ref().try_into_kernel().map_err(|e| {
            ClassifiedError::new(
                "DELTA_UNSUPPORTED_DATA_TYPE",
                "0AKDC",
                format!(
                    "The query's output cannot be stored in a Delta table: {e}. Cast the \
                     column to a type Delta supports."
                ),
            )
            .into()
        })
    }

    /// Creates the table from the query's schema, or checks that the existing one fits.
    async fn prepare(&self, table: DeltaTable) -> Result<DeltaTable> {
        let wanted = self.kernel_schema()?;
        if table.version().is_none() {
            let created = table
                .create()
                .with_columns(wanted.fields().cloned())
                .with_partition_columns(self.options.partition_by.clone())
                .await;
            return match created {
                Ok(t) => Ok(t),
                // Another writer may have created it meanwhile: check that one.
                Err(e) => {
                    let t = delta::open(&self.url, &self.options.storage).await?;
                    if t.version().is_none() {
                        return Err(delta::error(
                            e,
                            &format!("create the Delta table at {}", self.url),
                        )
                        .into());
                    }
                    self.check_fits(&t, &wanted)?;
                    Ok(t)
                }
            };
        }
        self.check_fits(&table, &wanted)?;
        Ok(table)
    }

    fn check_fits(&self, table: &DeltaTable, wanted: &StructType) -> Result<()> {
        let snapshot = table
            .snapshot()
            .map_err(|e| delta::error(e, &format!("read the Delta table at {}", self.url)))?;
        let have = snapshot.schema();
        let mut problems = vec![];
        for f in wanted.fields() {
            match have.field(f.name()) {
                None if self.options.merge_schema => {}
                None => problems.push(format!(
                    "the output column '{}' is not in the table",
                    f.name()
                )),
                Some(t) if t.data_type() != f.data_type() => problems.push(format!(
                    "column '{}' is {} in the table and {} in the output",
                    f.name(),
                    t.data_type(),
                    f.data_type()
                )),
                Some(_) => {}
            }
        }
        for t in have.fields() {
            if wanted.field(t.name()).is_none() {
                problems.push(format!(
                    "the table's column '{}' is not in the output",
                    t.name()
                ));
            }
        }
        let parts = snapshot.metadata().partition_columns().to_vec();
        if !self.options.partition_by.is_empty() && parts != self.options.partition_by {
            problems.push(format!(
                "the table is partitioned by [{}], the sink asks for [{}]",
                parts.join(", "),
                self.options.partition_by.join(", ")
            ));
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(ClassifiedError::new(
            "DELTA_METADATA_MISMATCH",
            "42KDG",
            format!(
                "The query's output does not fit the Delta table at {}: {}. Write to a new \
                 table, change the query to match, or set mergeSchema 'true' to add new columns.",
                self.url,
                problems.join("; ")
            ),
        )
        .into())
    }
}

impl DeltaSink {
    /// No table where the checkpoint says batches were committed: the sink created it when the
    /// query first started, so it was deleted, and its rows with it.
    fn missing_table(&self, batches: &CheckpointBatches<'_>) -> Result<()> {
        let Some(last) = batches.last_committed else {
            return Ok(());
        };
        Err(ClassifiedError::new(
            "DELTA_STREAMING_TABLE_MISSING",
            "42P01",
            format!(
                "There is no Delta table at {}, although the checkpoint committed batches 0..={last} \
                 into it (the query created it when it first started): it was deleted, and the \
                 rows of those batches with it. Restore the table, or start the query over with \
                 `weir checkpoint reset DIR --full`, which writes every batch again.",
                self.url
            ),
        )
        .into())
    }
}

/// The highest sequence of an AUTO CDC batch's truncates (action 3), if it has any.
fn truncate_sequence(
    rows: &[RecordBatch],
) -> Result<Option<deltalake::datafusion::scalar::ScalarValue>> {
    use arrow::array::{Array, AsArray};
    use deltalake::datafusion::scalar::ScalarValue;
    let mut highest: Option<ScalarValue> = None;
    for b in rows {
        let (Ok(action), Ok(sequence)) = (
            b.schema().index_of(CDC_ACTION),
            b.schema().index_of(CDC_SEQUENCE),
        ) else {
            continue;
        };
        let action = b
            .column(action)
            .as_primitive::<arrow::datatypes::Int8Type>();
        for i in 0..b.num_rows() {
            if action.is_valid(i) && action.value(i) == 3 {
                let v = ScalarValue::try_from_array(b.column(sequence), i)
                    .map_err(|e| Error::Corrupt(format!("an AUTO CDC truncate: {e}")))?;
                if highest
                    .as_ref()
                    .is_none_or(|h| v.partial_cmp(h) == Some(std::cmp::Ordering::Greater))
                {
                    highest = Some(v);
                }
            }
        }
    }
    Ok(highest)
}

fn column_names(schema: &SchemaRef) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[async_trait]
impl Sink for DeltaSink {
    fn description(&self) -> String {
        format!("DeltaSink[{}]", self.url)
    }

    fn read_back(&self) -> Option<crate::ReadBack> {
        Some(crate::ReadBack::Delta {
            url: self.url.clone(),
            storage: self.options.storage.clone(),
            source_options: self.source_options(),
        })
    }

    fn identity(&self) -> Option<String> {
        Some(self.url.to_string())
    }

    /// An AUTO CDC batch's MERGE, under Delta's operation metric names.
    fn batch_metrics(&self) -> std::collections::BTreeMap<String, String> {
        let Some(m) = self.last_merge() else {
            return Default::default();
        };
        [
            ("executionTimeMs", m.merge_ms),
            ("numSourceRows", m.source_rows),
            ("numTargetFilesAdded", m.files_added),
            ("numTargetFilesRemoved", m.files_removed),
            ("numOutputRows", m.rows_written),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn is_idempotent(&self) -> bool {
        true
    }

    fn supported_output_modes(&self) -> &'static [OutputMode] {
        &[OutputMode::Append, OutputMode::Complete]
    }

    /// Commits the removal of every row: the table and its history stay.
    async fn clear_output(&self) -> Result<()> {
        let table = match delta::open(&self.url, &self.options.storage).await {
            Ok(t) => t,
            Err(e) if e.class == "DELTA_MISSING_DELTA_TABLE" => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if table.version().is_none() {
            return Ok(());
        }
        let doing = format!("remove every row of the Delta table at {}", self.url);
        table.delete().await.map_err(|e| delta::error(e, &doing))?;
        Ok(())
    }

    async fn open(&self, query_id: &str) -> Result<()> {
        // delta-rs needs a local table's folder to exist.
        table_url(&self.options.path, true)?;
        let table = delta::open(&self.url, &self.options.storage).await?;
        let table = self.prepare(table).await?;
        *self.opened.lock().await = Some((query_id.to_string(), table));
        Ok(())
    }

    /// The table's `txn` for the query against the checkpoint: no version past the batches the
    /// checkpoint planned; in complete mode, where every batch commits, none short of the last
    /// committed batch; and a table gone while the checkpoint has committed batches is refused.
    async fn check_batches(&self, batches: &CheckpointBatches<'_>) -> Result<()> {
        let table = match delta::open(&self.url, &self.options.storage).await {
            Ok(t) if t.version().is_some() => t,
            Ok(_) => return self.missing_table(batches),
            Err(e) if e.class == "DELTA_MISSING_DELTA_TABLE" => {
                return self.missing_table(batches);
            }
            Err(e) => return Err(e.into()),
        };
        let doing = format!("read the transactions of the Delta table at {}", self.url);
        let snapshot = table.snapshot().map_err(|e| delta::error(e, &doing))?;
        let version = snapshot
            .transaction_version(table.log_store().as_ref(), batches.query_id)
            .await
            .map_err(|e| delta::error(e, &doing))?
            .and_then(|v| u64::try_from(v).ok());
        if let Some(v) = version
            && batches.last_planned.is_none_or(|p| v > p)
        {
            return Err(ClassifiedError::new(
                "DELTA_STREAMING_TXN_AHEAD_OF_CHECKPOINT",
                "55000",
                format!(
                    "The Delta table at {} holds batch {v} of query {}, which this checkpoint \
                     never planned ({}): the checkpoint is older than the table (restored from \
                     an earlier copy?), and the batches it runs again would be skipped as \
                     already written. The table is intact: restore the checkpoint that wrote it. \
                     (`weir checkpoint reset DIR --full` would start over, but it empties the \
                     whole table, other writers' rows too.)",
                    self.url,
                    batches.query_id,
                    match batches.last_planned {
                        Some(p) => format!("its newest batch is {p}"),
                        None => "it has planned none".into(),
                    }
                ),
            )
            .into());
        }
        // Every batch commits, but an older weir's append-mode empty batches did not.
        if (self.mode == OutputMode::Complete || batches.every_batch_recorded)
            && let Some(last) = batches.last_committed
            && version.is_none_or(|v| v < last)
        {
            // Where the commit should be: the newest log file (cut), or the one after it (lost).
            let newest: u64 = table.version().unwrap_or(0);
            return Err(ClassifiedError::new(
                "DELTA_STREAMING_TXN_MISSING",
                "55000",
                format!(
                    "The Delta table at {} has no commit of batch {last} of query {} (its newest \
                     is {}), although the checkpoint committed that batch and every batch \
                     commits. The newest log file '_delta_log/{newest:020}.json' was cut or \
                     '_delta_log/{:020}.json' lost, the table was replaced, the checkpoint's \
                     query ID is not the one that wrote it, or the query ran in append mode with \
                     a weir whose empty batches committed nothing before it was changed to \
                     complete. Restore the table or the checkpoint; `weir checkpoint reset DIR \
                     --full` starts over, emptying the whole table.",
                    self.url,
                    batches.query_id,
                    version.map_or("none".to_string(), |v| format!("batch {v}")),
                    newest + 1
                ),
            )
            .into());
        }
        Ok(())
    }

    async fn check(&self) -> Result<()> {
        // A table not made yet is made to fit by `open`.
        if let Ok(url) = table_url(&self.options.path, false)
            && let Ok(dir) = url.to_file_path()
            && !dir.join("_delta_log").exists()
        {
            return Ok(());
        }
        let table = delta::open(&self.url, &self.options.storage).await?;
        if table.version().is_none() {
            return Ok(());
        }
        self.check_fits(&table, &self.kernel_schema()?)
    }

    async fn add_batch(
        &self,
        batch_id: u64,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<()> {
        if let Ok(mut last) = self.last_merge.lock() {
            *last = None;
        }
        let mut opened = self.opened.lock().await;
        let Some((app_id, table)) = opened.as_mut() else {
            return Err(Error::Corrupt("the delta sink was not opened".into()));
        };
        let doing =
            |what: &str| format!("{what} batch {batch_id} of the Delta table at {}", self.url);
        table
            .update_state()
            .await
            .map_err(|e| delta::error(e, &doing("refresh the table before")))?;
        let snapshot = table
            .snapshot()
            .map_err(|e| delta::error(e, &doing("read the table before")))?;
        let done = snapshot
            .transaction_version(table.log_store().as_ref(), app_id.as_str())
            .await
            .map_err(|e| delta::error(e, &doing("read the transactions before")))?;
        if done.is_some_and(|v| v >= batch_id as i64) {
            tracing::info!(batch_id, table = %self.url, "batch already committed to the Delta table; skipped");
            return Ok(());
        }
        let mut rows: Vec<RecordBatch> = batches.into_iter().filter(|b| b.num_rows() > 0).collect();
        let save_mode = match self.mode {
            OutputMode::Complete => SaveMode::Overwrite,
            _ => SaveMode::Append,
        };
        let mut props = CommitProperties::default()
            .with_application_transaction(Transaction::new(app_id.as_str(), batch_id as i64));
        if let Some(m) = &self.options.user_metadata {
            props = props.with_metadata([(
                "userMetadata".to_string(),
                serde_json::Value::from(m.clone()),
            )]);
        }
        if !self.options.merge_keys.is_empty() && !rows.is_empty() {
            *table = self.merge(table, rows, props).await?;
            return Ok(());
        }
        if rows.is_empty() {
            if save_mode == SaveMode::Append {
                // As Spark's Delta sink, an empty batch still commits its `txn`: the table's
                // record of the query's batches then ends at the checkpoint's last commit, in
                // either mode (a restart checks it, and may switch to complete mode).
                CommitBuilder::from(props)
                    .build(
                        Some(snapshot),
                        table.log_store(),
                        DeltaOperation::StreamingUpdate {
                            output_mode: deltalake::protocol::OutputMode::Append,
                            query_id: app_id.clone(),
                            epoch_id: batch_id as i64,
                        },
                    )
                    .await
                    .map_err(|e| delta::error(e, &doing("commit the empty")))?;
                return Ok(());
            }
            // Complete mode with an empty result: the table becomes empty.
            rows.push(RecordBatch::new_empty(schema));
        }
        let mut write = table
            .clone()
            .write(rows)
            .with_save_mode(save_mode)
            .with_commit_properties(props);
        if !self.options.partition_by.is_empty() {
            write = write.with_partition_columns(self.options.partition_by.clone());
        }
        if self.options.merge_schema {
            write = write.with_schema_mode(deltalake::operations::write::SchemaMode::Merge);
        }
        *table = write.await.map_err(|e| delta::error(e, &doing("write")))?;
        Ok(())
    }
}
