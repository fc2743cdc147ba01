//! `weir bench`: named whole-query workloads on the deterministic `rate-micro-batch` source,
//! the same ones as the Spark side-by-side script (`shared/reference/spark-bench`).

use std::sync::Arc;

use datafusion::prelude::SessionConfig;
use serde::Serialize;

use crate::{
    Error, QueryProgressEvent, Result, ScriptOptions, StatementResult, StreamingQueryListener,
    StreamingQueryProgress, WeirSession,
};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Workload name (`q1`).
    pub workload: String,
    /// Measured batches.
    pub batches: u64,
    /// Warm-up batches, run first and not measured.
    pub warmup: u64,
    /// Rows per batch.
    pub rows_per_batch: u64,
    /// Source partitions and DataFusion target partitions.
    pub partitions: usize,
    /// Stateful workloads: how state is checkpointed.
    pub state: StateOptions,
    /// The `kafka` workload: the broker (`host:port`); without it, a Tansu broker is started
    /// on loopback from `$WEIR_TANSU` (see `scripts/test-servers`).
    pub bootstrap_servers: Option<String>,
    /// The `files` workload: write (or reuse) the input files in this folder and keep them, so
    /// another engine can read the same files.
    pub input_dir: Option<std::path::PathBuf>,
    /// After the run, restart the query on its checkpoint for one more batch and time it.
    pub restart: bool,
}

/// Summary statistics of a series.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    /// Median.
    pub median: f64,
    /// 99th percentile (linear interpolation).
    pub p99: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

/// The result of a bench run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchReport {
    /// Workload name.
    pub workload: String,
    /// Rows per batch.
    pub rows_per_batch: u64,
    /// Partitions.
    pub partitions: usize,
    /// Measured batches.
    pub batches: u64,
    /// numInputRows / triggerExecution per measured batch (as Spark's summary).
    pub rows_per_sec: Stats,
    /// Measured rows / wall time of the measured batches.
    pub rows_per_sec_wall: f64,
    /// triggerExecution per measured batch, ms.
    pub batch_latency_ms: Stats,
    /// Median of each durationMs key over the measured batches.
    pub duration_ms_median: std::collections::BTreeMap<String, f64>,
    /// Stateful workloads: medians over the measured batches of the stateful operators'
    /// `commitTimeMs`, `allUpdatesTimeMs` and `allRemovalsTimeMs` (summed over operators), and
    /// `numRowsTotal` after the last batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<StateFigures>,
    /// The kafka workload: records per second a bare librdkafka consumer reads the same topic
    /// at, in the same run (the broker's and client's ceiling).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_consumer_rows_per_sec: Option<f64>,
    /// The AUTO CDC workloads: each batch's MERGE and Delta commit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge: Option<MergeFigures>,
    /// Peak resident memory during the run (warm-up included), bytes.
    pub peak_rss_bytes: u64,
    /// The checkpoint's size on disk after the run, bytes.
    pub checkpoint_bytes: u64,
    /// With `--restart`: from starting the query again on its checkpoint to its next batch
    /// committed, in the same process, reusing the RocksDB instances the run left, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_ms: Option<f64>,
    /// With `--restart`: the same once more after removing those instances, so the state is
    /// rebuilt from the checkpoint (its newest snapshot and the changelogs after it), as on
    /// another machine, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_rebuild_ms: Option<f64>,
    /// Of `restart_ms`, the batch itself (its progress record's `batchDuration`): the rest is
    /// starting the query up to the batch's trigger.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_batch_ms: Option<f64>,
    /// Of `restart_rebuild_ms`, the batch itself (rebuilding the instances happens in it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_rebuild_batch_ms: Option<f64>,
}

/// The state figures of a bench run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StateFigures {
    /// Median commitTimeMs.
    pub commit_time_ms: f64,
    /// Median allUpdatesTimeMs.
    pub all_updates_time_ms: f64,
    /// Median allRemovalsTimeMs.
    pub all_removals_time_ms: f64,
    /// numRowsTotal after the last measured batch.
    pub num_rows_total: u64,
    /// RocksDB snapshot files copied into the checkpoint during the measured batches
    /// (`rocksdbFilesCopied`, summed): 0 when no snapshot was due.
    pub snapshot_files_copied: i64,
    /// Median bytes (keys and values) a batch wrote to state (`rocksdbTotalBytesWritten`,
    /// summed over operators and partitions); 0 without RocksDB.
    pub bytes_written: f64,
    /// Median bytes a batch read from state: point reads' values and scans' keys and values
    /// (`rocksdbTotalBytesRead` + `rocksdbTotalBytesReadThroughIterator`).
    pub bytes_read: f64,
}

/// How a benchmark's stateful query checkpoints its state: `weir bench`'s state flags.
#[derive(Debug, Clone, Default)]
pub struct StateOptions {
    /// Asynchronous state checkpointing (`asyncStateCheckpoint`).
    pub async_checkpoint: bool,
    /// A RocksDB snapshot every this many versions (`stateStore.minDeltasForSnapshot`); `None`:
    /// the default, 10.
    pub min_deltas_for_snapshot: Option<u64>,
    /// The least time between a store's snapshots (`stateStore.maintenanceInterval`, e.g.
    /// `0` or `60s`); `None`: the default, 60 s.
    pub maintenance_interval: Option<String>,
}

impl StateOptions {
    /// The options, each as `, key 'value'`, to follow others in a SQL `OPTIONS` list.
    pub fn sql(&self) -> String {
        let mut s = format!(", asyncStateCheckpoint '{}'", self.async_checkpoint);
        if let Some(n) = self.min_deltas_for_snapshot {
            s += &format!(", stateStore.minDeltasForSnapshot '{n}'");
        }
        if let Some(d) = &self.maintenance_interval {
            s += &format!(
                ", stateStore.maintenanceInterval '{}'",
                d.replace('\'', "''")
            );
        }
        s
    }
}

fn workload_sql(cfg: &BenchConfig, input: &Input) -> Result<String> {
    let src = format!(
        "STREAM rate_micro_batch(rowsPerBatch => {}, numPartitions => {})",
        cfg.rows_per_batch, cfg.partitions
    );
    let state = cfg.state.sql();
    let table = |mode: &str, query: String| {
        format!(
            "CREATE STREAMING TABLE bench USING noop OPTIONS (outputMode '{mode}'{state}) AS \
             {query}"
        )
    };
    match cfg.workload.to_ascii_lowercase().as_str() {
        "q1" => Ok(format!(
            "SELECT value, value * 2 AS v2 FROM {src} WHERE value % 2 = 0"
        )),
        "q2" => Ok(table(
            "update",
            format!("SELECT value % 1000 AS k, count(*) AS n FROM {src} GROUP BY value % 1000"),
        )),
        "q3" => Ok(table(
            "append",
            format!(
                "SELECT window(timestamp, '10 seconds') AS w, count(*) AS n \
                 FROM {src} WATERMARK timestamp DELAY OF INTERVAL 10 SECONDS \
                 GROUP BY window(timestamp, '10 seconds')"
            ),
        )),
        "q4" => Ok(table(
            "append",
            format!(
                "SELECT DISTINCT ON (k) timestamp, value, k \
                 FROM (SELECT timestamp, value, value % 100000 AS k FROM {src})"
            ),
        )),
        "q5" => Ok(table(
            "append",
            format!(
                "SELECT l.value AS lk, l.timestamp AS lt, r.value AS rk, r.timestamp AS rt \
                 FROM {src} WATERMARK timestamp DELAY OF INTERVAL 2 SECONDS AS l \
                 JOIN {src} WATERMARK timestamp DELAY OF INTERVAL 2 SECONDS AS r \
                 ON l.value = r.value \
                 AND r.timestamp BETWEEN l.timestamp - INTERVAL 1 SECOND AND l.timestamp + INTERVAL 1 SECOND"
            ),
        )),
        "kafka" => match input {
            Input::Kafka(InputKafka { servers, topic, .. }) => Ok(format!(
                "SELECT key, value, \"offset\" FROM STREAM kafka(\"kafka.bootstrap.servers\" => \
                 '{servers}', subscribe => '{topic}', startingOffsets => 'earliest', \
                 maxOffsetsPerTrigger => {})",
                cfg.rows_per_batch
            )),
            _ => Err(Error::Internal("the kafka workload has no topic".into())),
        },
        "files" => match input {
            Input::Files { dir, per_batch, .. } => Ok(format!(
                "CREATE STREAMING TABLE bench USING noop OPTIONS (outputMode 'update') AS \
                 SELECT k, count(*) AS n, sum(v) AS total \
                 FROM STREAM read_files('{}', format => 'parquet', maxFilesPerTrigger => \
                 {per_batch}) GROUP BY k",
                dir.display()
            )),
            _ => Err(Error::Internal("the files workload has no files".into())),
        },
        "files-delta" => match input {
            Input::Files {
                dir,
                per_batch,
                out,
            } => Ok(format!(
                "CREATE STREAMING TABLE bench USING delta LOCATION '{}' \
                 OPTIONS (outputMode 'complete') AS \
                 SELECT k, count(*) AS n, sum(v) AS total \
                 FROM STREAM read_files('{}', format => 'parquet', maxFilesPerTrigger => \
                 {per_batch}) GROUP BY k",
                out.display(),
                dir.display()
            )),
            _ => Err(Error::Internal("the files workload has no files".into())),
        },
        other => Err(Error::user(
            "UNKNOWN_BENCH_WORKLOAD",
            "42601",
            format!(
                "Unknown workload '{other}'. Available: q1 (filter and projection), q2 (GROUP BY \
                 value % 1000, update), q3 (10-second windows with a watermark, append), q4 \
                 (deduplication on value % 100000), q5 (stream-stream inner join with \
                 watermarks and a time range; run it with --rows-per-batch 100000 as Spark's), \
                 kafka (Kafka source into noop; records produced first), files (Parquet files \
                 into GROUP BY, update mode; files written first), files-delta (the same \
                 aggregation into a Delta table, complete mode), cdc-scd1 and cdc-scd2 (AUTO \
                 CDC of 1,000,000 keys into a Delta table, one change in ten late; the first \
                 1,000,000 rows insert the keys, so warm up with that many)."
            ),
        )),
    }
}

fn stats(mut xs: Vec<f64>) -> Stats {
    xs.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| {
        if xs.is_empty() {
            return 0.0;
        }
        let k = (xs.len() - 1) as f64 * p / 100.0;
        let (lo, hi) = (k.floor() as usize, k.ceil() as usize);
        xs[lo] + (xs[hi] - xs[lo]) * (k - lo as f64)
    };
    Stats {
        median: pct(50.0),
        p99: pct(99.0),
        min: xs.first().copied().unwrap_or(0.0),
        max: xs.last().copied().unwrap_or(0.0),
    }
}

/// The `kafka` workload's topic, and the broker started for it, if any.
pub(crate) struct InputKafka {
    pub(crate) servers: String,
    pub(crate) topic: String,
    /// Records per second a bare librdkafka consumer reads the whole topic at.
    pub(crate) baseline_rows_per_sec: f64,
    #[expect(
        dead_code,
        reason = "held to keep the broker running, stopped when dropped"
    )]
    pub(crate) broker: Option<crate::bench_inputs::Tansu>,
}

/// What a workload reads, prepared before it is measured.
enum Input {
    /// The `rate-micro-batch` source: nothing to prepare.
    Rate,
    /// A topic filled with every record the run reads.
    Kafka(InputKafka),
    /// A folder of Parquet files, `per_batch` files per batch, and the sink's folder.
    Files {
        dir: std::path::PathBuf,
        per_batch: u64,
        out: std::path::PathBuf,
    },
}

impl Input {
    async fn prepare(cfg: &BenchConfig, scratch: &std::path::Path) -> Result<Self> {
        let total = cfg.rows_per_batch * (cfg.warmup + cfg.batches);
        match cfg.workload.to_ascii_lowercase().as_str() {
            "kafka" => Ok(Input::Kafka(crate::bench_inputs::kafka(cfg, total).await?)),
            "files" | "files-delta" => {
                let per_batch = (cfg.partitions as u64 * 2).max(1);
                let dir = cfg
                    .input_dir
                    .clone()
                    .unwrap_or_else(|| scratch.join("files"));
                let present = std::fs::read_dir(&dir).map_or(0, |d| d.count());
                if present == 0 {
                    crate::bench_inputs::parquet_files(
                        &dir,
                        per_batch * (cfg.warmup + cfg.batches),
                        cfg.rows_per_batch / per_batch,
                    )?;
                }
                Ok(Input::Files {
                    dir,
                    per_batch,
                    out: scratch.join("delta"),
                })
            }
            _ => Ok(Input::Rate),
        }
    }
}

/// Runs a workload into the noop sink with a temporary checkpoint.
pub async fn run_bench(cfg: &BenchConfig) -> Result<BenchReport> {
    match cfg.workload.to_ascii_lowercase().as_str() {
        "cdc-scd1" => return run_cdc(cfg, 1).await,
        "cdc-scd2" => return run_cdc(cfg, 2).await,
        _ => {}
    }
    let scratch = std::env::temp_dir().join(format!("weir-bench-in-{}", uuid::Uuid::new_v4()));
    let input = Input::prepare(cfg, &scratch).await;
    let report = match input {
        Ok(input) => run_prepared(cfg, &input).await,
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_dir_all(&scratch);
    report
}

async fn run_prepared(cfg: &BenchConfig, input: &Input) -> Result<BenchReport> {
    let sql = workload_sql(cfg, input)?;
    let session = WeirSession::with_config(
        SessionConfig::new().with_target_partitions(cfg.partitions.max(1)),
    );
    let dir = std::env::temp_dir().join(format!("weir-bench-{}", uuid::Uuid::new_v4()));
    let opts = ScriptOptions {
        checkpoint: Some(dir.to_string_lossy().to_string()),
        max_batches: Some(cfg.warmup + cfg.batches),
        default_sink: Some("noop".into()),
        ..Default::default()
    };
    // A listener sees every batch's progress (recent_progress keeps only the last 100).
    let collected = Arc::new(Collector::default());
    let collector: Arc<dyn StreamingQueryListener> = Arc::clone(&collected) as _;
    session.streams().add_listener(Arc::clone(&collector));
    reset_peak_rss();
    let run = |max_batches: u64| {
        let opts = ScriptOptions {
            max_batches: Some(max_batches),
            ..opts.clone()
        };
        let (session, sql) = (&session, &sql);
        async move {
            let mut results = session.run_script(sql, &opts).await?;
            let Some(StatementResult::Query(q)) = results.pop() else {
                return Err(Error::Internal(
                    "the bench workload started no query".into(),
                ));
            };
            q.await_termination()
                .await
                .map_err(|e| Error::Internal(e.to_string()))
        }
    };
    let done = run(cfg.warmup + cfg.batches).await;
    let peak_rss_bytes = peak_rss();
    let checkpoint_bytes = dir_bytes(&dir);
    let progress = collected.detach(&session, &collector).await;
    let (mut restart, mut restart_rebuild) = (None, None);
    if done.is_ok() && cfg.restart {
        // Until the end of the batch as its progress record tells (its start and duration):
        // the run then closes its instances (flushing their memtables for the next run), which
        // ends a run rather than restarting one.
        let timed = |batches: u64| {
            let (run, session) = (&run, &session);
            async move {
                let first = Arc::new(FirstProgress::default());
                let listener: Arc<dyn StreamingQueryListener> = Arc::clone(&first) as _;
                session.streams().add_listener(Arc::clone(&listener));
                let started = chrono::Utc::now();
                let again = run(batches).await;
                session.streams().flush_listeners().await;
                session.streams().remove_listener(&listener);
                again.ok()?;
                let batch = first.0.get()?;
                let batch_start = chrono::DateTime::parse_from_rfc3339(&batch.timestamp).ok()?;
                let to_start = batch_start
                    .signed_duration_since(started)
                    .num_microseconds()?;
                let batch_ms = batch.batch_duration as f64;
                Some((to_start as f64 / 1000.0 + batch_ms, batch_ms))
            }
        };
        // One batch each (--max-batches counts a run's own batches).
        restart = timed(1).await;
        remove_local_state(&dir);
        restart_rebuild = timed(1).await;
    }
    remove_local_state(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    done?;
    let mut report = summarize(cfg, &progress, input);
    report.peak_rss_bytes = peak_rss_bytes;
    report.checkpoint_bytes = checkpoint_bytes;
    report.restart_ms = restart.map(|(total, _)| total);
    report.restart_batch_ms = restart.map(|(_, batch)| batch);
    report.restart_rebuild_ms = restart_rebuild.map(|(total, _)| total);
    report.restart_rebuild_batch_ms = restart_rebuild.map(|(_, batch)| batch);
    Ok(report)
}

/// Starts a new peak of the resident set (`VmHWM`), as Linux allows by `/proc/self/clear_refs`.
pub(crate) fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The resident set's peak since the last reset, bytes.
pub(crate) fn peak_rss() -> u64 {
    proc_status_bytes("VmHWM:")
}

/// A size line of `/proc/self/status` (`VmRSS:`, `VmHWM:`), bytes; 0 where there is none.
pub fn proc_status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Bytes of the files under `dir`.
pub(crate) fn dir_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

/// The report of a run from its progress records.
fn summarize(cfg: &BenchConfig, progress: &[StreamingQueryProgress], input: &Input) -> BenchReport {
    let measured: Vec<&StreamingQueryProgress> =
        progress.iter().skip(cfg.warmup as usize).collect();
    let trig = |p: &StreamingQueryProgress| {
        p.duration_ms.get("triggerExecution").copied().unwrap_or(0) as f64
    };
    let rows_per_sec = stats(
        measured
            .iter()
            .map(|p| p.num_input_rows as f64 / (trig(p).max(1.0) / 1000.0))
            .collect(),
    );
    let wall_ms: f64 = measured.iter().map(|p| p.batch_duration as f64).sum();
    let rows: f64 = measured.iter().map(|p| p.num_input_rows as f64).sum();
    let mut keys: Vec<String> = measured
        .iter()
        .flat_map(|p| p.duration_ms.keys().cloned())
        .collect();
    keys.sort();
    keys.dedup();
    let duration_ms_median = keys
        .into_iter()
        .map(|k| {
            let v = measured
                .iter()
                .map(|p| p.duration_ms.get(&k).copied().unwrap_or(0) as f64)
                .collect();
            (k, stats(v).median)
        })
        .collect();
    // Per measured batch, a figure summed over the stateful operators.
    let state_sum = |f: &dyn Fn(&crate::StateOperatorProgress) -> u64| -> Vec<f64> {
        measured
            .iter()
            .map(|p| p.state_operators.iter().map(f).sum::<u64>() as f64)
            .collect()
    };
    // Custom metrics named `names`, added up (0 where an operator has none).
    let custom = |names: &'static [&'static str]| {
        move |o: &crate::StateOperatorProgress| -> u64 {
            names
                .iter()
                .filter_map(|n| o.custom_metrics.get(*n))
                .map(|v| (*v).max(0) as u64)
                .sum()
        }
    };
    let state = measured
        .last()
        .filter(|p| !p.state_operators.is_empty())
        .map(|last| StateFigures {
            commit_time_ms: stats(state_sum(&|o| o.commit_time_ms)).median,
            all_updates_time_ms: stats(state_sum(&|o| o.all_updates_time_ms)).median,
            all_removals_time_ms: stats(state_sum(&|o| o.all_removals_time_ms)).median,
            num_rows_total: last.state_operators.iter().map(|o| o.num_rows_total).sum(),
            snapshot_files_copied: measured
                .iter()
                .flat_map(|p| &p.state_operators)
                .filter_map(|o| o.custom_metrics.get("rocksdbFilesCopied"))
                .sum(),
            bytes_written: stats(state_sum(&custom(&["rocksdbTotalBytesWritten"]))).median,
            bytes_read: stats(state_sum(&custom(&[
                "rocksdbTotalBytesRead",
                "rocksdbTotalBytesReadThroughIterator",
            ])))
            .median,
        });
    BenchReport {
        workload: cfg.workload.clone(),
        rows_per_batch: cfg.rows_per_batch,
        partitions: cfg.partitions,
        batches: measured.len() as u64,
        rows_per_sec,
        rows_per_sec_wall: if wall_ms > 0.0 {
            rows / (wall_ms / 1000.0)
        } else {
            0.0
        },
        batch_latency_ms: stats(measured.iter().map(|p| trig(p)).collect()),
        duration_ms_median,
        state,
        baseline_consumer_rows_per_sec: match input {
            Input::Kafka(k) => Some(k.baseline_rows_per_sec),
            _ => None,
        },
        merge: None,
        peak_rss_bytes: 0,
        checkpoint_bytes: 0,
        restart_ms: None,
        restart_rebuild_ms: None,
        restart_batch_ms: None,
        restart_rebuild_batch_ms: None,
    }
}

/// How many keys the AUTO CDC workloads change.
const CDC_KEYS: u64 = 1_000_000;

/// `cdc-scd1` / `cdc-scd2`: change records from `rate-micro-batch` (key `value * 7919 mod
/// 1,000,000`, so the first million rows insert every key once and later ones update them;
/// one change in ten arrives late, with a sequence older than the key's stored one) through
/// AUTO CDC into a Delta table, each batch one MERGE. Reports each measured batch's MERGE time
/// (`addBatch`) and the size of its Delta commit.
async fn run_cdc(cfg: &BenchConfig, scd_type: u8) -> Result<BenchReport> {
    let scratch = std::env::temp_dir().join(format!("weir-bench-cdc-{}", uuid::Uuid::new_v4()));
    let result = run_cdc_in(cfg, scd_type, &scratch).await;
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

async fn run_cdc_in(
    cfg: &BenchConfig,
    scd_type: u8,
    scratch: &std::path::Path,
) -> Result<BenchReport> {
    use weir_planner::auto_cdc::{AutoCdcOptions, DEFAULT_TOMBSTONE_TTL_MS, auto_cdc};
    use weir_planner::pipeline::ColumnSelection;
    let session = WeirSession::with_config(
        SessionConfig::new().with_target_partitions(cfg.partitions.max(1)),
    );
    let changes = format!(
        "SELECT (value * 7919) % {CDC_KEYS} AS id, value AS v, value % 97 AS w, \
         CASE WHEN value % 10 = 5 THEN value - {late} ELSE value END AS __weir_cdc_sequence, \
         false AS __weir_cdc_delete, false AS __weir_cdc_truncate \
         FROM STREAM(rate_micro_batch(rowsPerBatch => {}, numPartitions => {}))",
        cfg.rows_per_batch,
        cfg.partitions,
        late = CDC_KEYS + 1
    );
    let plan = session.plan_sql(&changes).await?;
    let plan = auto_cdc(
        plan,
        &AutoCdcOptions {
            keys: vec!["id".into()],
            columns: ColumnSelection::All,
            scd_type,
            track_history: ColumnSelection::All,
            truncates: false,
            tombstone_ttl_ms: DEFAULT_TOMBSTONE_TTL_MS,
        },
    )
    .map_err(Error::User)?;
    let table = scratch.join("target");
    let df = datafusion::dataframe::DataFrame::new(session.context().state(), plan);
    let collected = Arc::new(Collector::default());
    let collector: Arc<dyn StreamingQueryListener> = Arc::clone(&collected) as _;
    session.streams().add_listener(Arc::clone(&collector));
    let q = session
        .write_stream(df)
        .format("delta")
        .option("path", table.display())
        .option("weir.autoCdc.keys", "id")
        .checkpoint_location(scratch.join("checkpoint").display().to_string())
        .max_batches(cfg.warmup + cfg.batches)
        .start()
        .await?;
    q.await_termination()
        .await
        .map_err(|e| Error::Internal(e.to_string()))?;
    let progress = collected.detach(&session, &collector).await;
    let mut report = summarize(cfg, &progress, &Input::Rate);
    report.merge = Some(merge_figures(&table, &progress, cfg.warmup as usize)?);
    Ok(report)
}

/// The MERGE time and Delta commit of each measured batch, from the progress records and the
/// table's log (the commits carrying the batches' `txn`).
fn merge_figures(
    table: &std::path::Path,
    progress: &[StreamingQueryProgress],
    warmup: usize,
) -> Result<MergeFigures> {
    let measured = &progress[warmup.min(progress.len())..];
    let merge_ms = stats(
        measured
            .iter()
            .map(|p| {
                p.sink
                    .metrics
                    .get("executionTimeMs")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0)
            })
            .collect(),
    );
    let mut commits = vec![];
    let log = table.join("_delta_log");
    for entry in std::fs::read_dir(&log)
        .map_err(|e| Error::Internal(format!("read {}: {e}", log.display())))?
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(version) = name
            .strip_suffix(".json")
            .and_then(|v| v.parse::<u64>().ok())
        else {
            continue;
        };
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let (mut added, mut removed, mut bytes, mut batch) = (0u64, 0u64, 0u64, None);
        for line in text.lines() {
            let Ok(action) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if let Some(a) = action.get("add") {
                added += 1;
                bytes += a.get("size").and_then(|s| s.as_u64()).unwrap_or(0);
            }
            if action.get("remove").is_some() {
                removed += 1;
            }
            if let Some(t) = action.get("txn") {
                batch = t.get("version").and_then(|v| v.as_u64());
            }
        }
        commits.push((version, batch, added, removed, bytes));
    }
    let first_measured = warmup as u64;
    let of_measured: Vec<_> = commits
        .iter()
        .filter(|c| c.1.is_some_and(|b| b >= first_measured))
        .collect();
    let total_bytes: u64 = commits.iter().map(|c| c.4).sum();
    Ok(MergeFigures {
        merge_ms,
        files_added: stats(of_measured.iter().map(|c| c.2 as f64).collect()).median,
        files_removed: stats(of_measured.iter().map(|c| c.3 as f64).collect()).median,
        bytes_added: stats(of_measured.iter().map(|c| c.4 as f64).collect()).median,
        table_bytes_written: total_bytes,
    })
}

/// The AUTO CDC workloads' MERGE figures over the measured batches.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MergeFigures {
    /// Time spent in each batch's MERGE, commit included (the sink's `executionTimeMs`), ms.
    pub merge_ms: Stats,
    /// Median files each batch's commit added.
    pub files_added: f64,
    /// Median files each batch's commit removed (rewritten).
    pub files_removed: f64,
    /// Median bytes each batch's commit added.
    pub bytes_added: f64,
    /// Bytes of every file the run's commits added, warm-up included.
    pub table_bytes_written: u64,
}

/// Keeps every progress record of the bench's only query.
#[derive(Default)]
pub(crate) struct Collector(std::sync::Mutex<Vec<StreamingQueryProgress>>);

impl Collector {
    /// Stops `listener` (this collector) listening to `session`, after its last events, and
    /// hands over the records.
    pub(crate) async fn detach(
        &self,
        session: &WeirSession,
        listener: &Arc<dyn StreamingQueryListener>,
    ) -> Vec<StreamingQueryProgress> {
        session.streams().flush_listeners().await;
        session.streams().remove_listener(listener);
        self.0
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    }
}

/// The first progress record it heard.
#[derive(Default)]
struct FirstProgress(std::sync::OnceLock<StreamingQueryProgress>);

impl StreamingQueryListener for FirstProgress {
    fn on_query_progress(&self, e: &QueryProgressEvent) {
        let _ = self.0.set(e.progress.clone());
    }
}

impl StreamingQueryListener for Collector {
    fn on_query_progress(&self, e: &QueryProgressEvent) {
        if let Ok(mut p) = self.0.lock() {
            p.push(e.progress.clone());
        }
    }
}

impl BenchReport {
    /// The report as a table for people.
    pub fn table(&self) -> String {
        let mut s = format!(
            "workload {}  rows/batch {}  partitions {}  measured batches {}\n",
            self.workload, self.rows_per_batch, self.partitions, self.batches
        );
        s += &format!(
            "rows/s (median per batch)  {:>14.0}\nrows/s (wall)               {:>14.0}\n",
            self.rows_per_sec.median, self.rows_per_sec_wall
        );
        s += &format!(
            "batch latency ms  median {:.1}  p99 {:.1}\n",
            self.batch_latency_ms.median, self.batch_latency_ms.p99
        );
        s += "durationMs (median):\n";
        for (k, v) in &self.duration_ms_median {
            s += &format!("  {k:<18} {v:>8.1}\n");
        }
        if let Some(b) = self.baseline_consumer_rows_per_sec {
            s += &format!("baseline: a bare librdkafka consumer, rows/s {b:>14.0}\n");
        }
        if let Some(m) = &self.merge {
            s += &format!(
                "MERGE ms  median {:.1}  p99 {:.1}\nDelta commit per batch (median): \
                 {:.0} files added, {:.0} removed, {:.1} MB added\n",
                m.merge_ms.median,
                m.merge_ms.p99,
                m.files_added,
                m.files_removed,
                m.bytes_added / 1e6
            );
        }
        s += &format!(
            "peak RSS {:.1} MiB  checkpoint {:.1} MiB\n",
            self.peak_rss_bytes as f64 / 1048576.0,
            self.checkpoint_bytes as f64 / 1048576.0
        );
        if let Some(r) = self.restart_ms {
            s += &format!("restart to the next batch committed: {r:.0} ms");
            if let Some(b) = self.restart_batch_ms {
                s += &format!(", of which the batch {b:.0} ms");
            }
            if let Some(b) = self.restart_rebuild_ms {
                s += &format!(
                    " (local RocksDB instances removed, rebuilt from the checkpoint: {b:.0} ms"
                );
                if let Some(batch) = self.restart_rebuild_batch_ms {
                    s += &format!(", of which the batch {batch:.0} ms");
                }
                s += ")";
            }
            s += "\n";
        }
        if let Some(st) = &self.state {
            s += &format!(
                "state (median ms, summed over partitions): updates {:.1}  removals {:.1}  commit \
                 {:.1}; rows in state {}\n",
                st.all_updates_time_ms,
                st.all_removals_time_ms,
                st.commit_time_ms,
                st.num_rows_total
            );
            if st.bytes_written > 0.0 || st.bytes_read > 0.0 {
                s += &format!(
                    "state bytes per batch (median, summed over partitions): written {:.1} MiB  \
                     read {:.1} MiB\n",
                    st.bytes_written / 1048576.0,
                    st.bytes_read / 1048576.0
                );
            }
        }
        s
    }
}

/// Removes the RocksDB instances the query of the checkpoint in `dir` keeps on this machine
/// (`<temp>/weir-state-<query id>-at-...`), as a restart elsewhere would not find them.
fn remove_local_state(dir: &std::path::Path) {
    let id = std::fs::read(dir.join("metadata"))
        .ok()
        .and_then(|m| serde_json::from_slice::<serde_json::Value>(&m).ok())
        .and_then(|m| m["id"].as_str().map(str::to_string));
    let Some(id) = id else { return };
    let prefix = format!("weir-state-{id}-");
    for e in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
