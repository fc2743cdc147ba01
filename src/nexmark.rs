//! Nexmark: the suite's queries (`queries/nexmark/q*.sql`), the streams they read, and
//! `weir bench --workload nexmark-qN`.
//!
//! The query files read `STREAM bid`, `STREAM auction` and `STREAM person`, as Nexmark's SQL
//! reads its views of that name; [`register_streams`] names three `nexmark` sources of one
//! configuration so, and a batch table `side_input` for q13. A line `-- weir: outputMode=update`
//! in a file gives the output mode the query needs; `-- weir: unsupported: <why>` marks a query
//! weir cannot run yet.

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionConfig;
use serde::Serialize;
use weir_sources::NexmarkSourceProvider;
use weir_sources::nexmark::Table;

use crate::{
    Error, Options, Result, ScriptOptions, SourceProvider, StatementResult, StreamingQueryListener,
    Trigger, WeirSession,
};

/// One Nexmark query as kept in the repository.
#[derive(Debug, Clone)]
pub struct NexmarkQuery {
    /// `q0` ... `q22`.
    pub name: &'static str,
    /// The file's text.
    pub sql: &'static str,
}

macro_rules! queries {
    ($($q:literal),*) => {
        &[$(NexmarkQuery {
            name: $q,
            sql: include_str!(concat!("../queries/nexmark/", $q, ".sql")),
        }),*]
    };
}

/// Nexmark's queries q0 to q22.
pub const QUERIES: &[NexmarkQuery] = queries!(
    "q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q9", "q10", "q11", "q12", "q13", "q14",
    "q15", "q16", "q17", "q18", "q19", "q20", "q21", "q22"
);

/// Batch SQL computing what a query computes, where its streaming form has no batch form.
const BATCH_EQUIVALENTS: &[(&str, &str)] = &[
    ("q5", include_str!("../queries/nexmark/batch/q5.sql")),
    ("q11", include_str!("../queries/nexmark/batch/q11.sql")),
];

impl NexmarkQuery {
    /// The query named `name` (`q5`, `nexmark-q5`).
    pub fn find(name: &str) -> Option<&'static NexmarkQuery> {
        let name = name.trim().to_ascii_lowercase();
        let name = name.strip_prefix("nexmark-").unwrap_or(&name);
        QUERIES.iter().find(|q| q.name == name)
    }

    fn directive(&self, key: &str) -> Option<&'static str> {
        self.sql.lines().find_map(|l| {
            l.trim()
                .strip_prefix("-- weir:")
                .and_then(|d| d.trim().strip_prefix(key))
                .map(|v| v.trim_start_matches(['=', ':']).trim())
        })
    }

    /// The output mode the query runs in: `append` unless the file says otherwise.
    pub fn output_mode(&self) -> &'static str {
        self.directive("outputMode").unwrap_or("append")
    }

    /// Why weir cannot run this query, when it cannot.
    pub fn unsupported(&self) -> Option<&'static str> {
        self.directive("unsupported")
    }

    /// The statement: the file's query, without its comments and final `;`.
    pub fn select(&self) -> String {
        let text: Vec<&str> = self
            .sql
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect();
        text.join("\n").trim().trim_end_matches(';').to_string()
    }

    /// The query as batch SQL over tables `bid`, `auction` and `person` holding the same
    /// events: without `STREAM` and the watermarks, and without lines marked
    /// `-- weir: streaming only` (event-time bounds that let the watermark evict state, which
    /// the batch run leaves out to check they change nothing). A file
    /// `queries/nexmark/batch/qN.sql` replaces it where the streaming form has no batch
    /// equivalent in DataFusion (a session window).
    pub fn batch_sql(&self) -> String {
        if let Some(b) = BATCH_EQUIVALENTS.iter().find(|b| b.0 == self.name) {
            return NexmarkQuery {
                name: b.0,
                sql: b.1,
            }
            .select();
        }
        let text: Vec<&str> = self
            .sql
            .lines()
            .filter(|l| !l.trim_start().starts_with("--") && !l.contains("-- weir: streaming only"))
            .collect();
        let text = text.join("\n");
        let watermark =
            regex::Regex::new(r"(?i)\s+WATERMARK\s+\w+\s+DELAY\s+OF\s+INTERVAL\s+\d+\s+\w+")
                .map(|r| r.replace_all(&text, "").to_string())
                .unwrap_or(text);
        let stream = regex::Regex::new(r"(?i)\bSTREAM\s+")
            .map(|r| r.replace_all(&watermark, "").to_string())
            .unwrap_or(watermark);
        stream.trim().trim_end_matches(';').to_string()
    }

    /// A predicate over the query's output that holds for the rows an append-mode run has
    /// emitted by the time the watermark is at `:watermark` (its windows closed), from a line
    /// `-- weir: final: <predicate>`.
    pub fn final_rows(&self) -> Option<&'static str> {
        self.directive("final")
    }

    /// The columns to compare a run's output with batch SQL's on, from a line
    /// `-- weir: compare: <columns>`: where ties make which row a query keeps arbitrary (a top-N
    /// by price keeps one of two equal bids), the columns both results agree on.
    pub fn compare(&self) -> Option<&'static str> {
        self.directive("compare")
    }

    /// The columns whose totals are compared, from a line `-- weir: totalsBy: <columns>`: the
    /// compared columns (`-- weir: compare:`) are then aggregates grouped by these. Processing-time
    /// windows (q12) put a key's rows in the windows of the batches that read them, which a
    /// batch run cannot know; a run and batch SQL agree on each key's totals.
    pub fn totals_by(&self) -> Option<&'static str> {
        self.directive("totalsBy")
    }

    /// The tables of the generator the query reads.
    pub fn tables(&self) -> Vec<Table> {
        let text = self.select().to_ascii_lowercase();
        [Table::Person, Table::Auction, Table::Bid]
            .into_iter()
            .filter(|t| text.contains(&format!("stream {}", t.name())))
            .collect()
    }
}

/// How the streams are generated.
#[derive(Debug, Clone)]
pub struct NexmarkStreams {
    /// Events in all (people, auctions and bids).
    pub events: u64,
    /// Events per micro-batch at most (`maxEventsPerTrigger`).
    pub events_per_batch: u64,
    /// Partitions each stream is generated in.
    pub partitions: usize,
    /// Events per second of event time (`firstEventRate`).
    pub rate: u64,
    /// Read the events from Parquet files in this folder (`<dir>/<table>/part-N.parquet`, one
    /// file per batch, as [`write_parquet`] writes them) with weir's file source, instead of
    /// generating them: the input Spark's file source reads in the side-by-side run.
    pub files: Option<std::path::PathBuf>,
}

impl NexmarkStreams {
    fn options(&self, table: Table) -> Options {
        Options::new()
            .with("table", table.name())
            .with("numEvents", self.events.to_string())
            .with("maxEventsPerTrigger", self.events_per_batch.to_string())
            .with("numPartitions", self.partitions.to_string())
            .with("firstEventRate", self.rate.to_string())
    }

    /// The stream `table` of these events: generated, or read from the Parquet files.
    fn stream(&self, table: Table) -> Result<Arc<dyn SourceProvider>> {
        let Some(dir) = &self.files else {
            return Ok(self.source(table)? as Arc<dyn SourceProvider>);
        };
        let options = Options::new()
            .with("path", dir.join(table.name()).to_string_lossy().to_string())
            .with("maxFilesPerTrigger", "1");
        weir_sources::FileSourceProvider::try_new(
            weir_sources::files::FileFormat::Parquet,
            &options,
        )
        .map(|s| Arc::new(s) as Arc<dyn SourceProvider>)
        .map_err(|e| Error::Internal(e.to_string()))
    }

    fn source(&self, table: Table) -> Result<Arc<NexmarkSourceProvider>> {
        NexmarkSourceProvider::try_new(&self.options(table))
            .map(Arc::new)
            .map_err(|e| Error::Internal(e.to_string()))
    }
}

/// Names the streams `bid`, `auction` and `person` in `session`, and the batch table
/// `side_input` (q13: keys 0 to 9,999, each with its decimal text as value).
pub fn register_streams(session: &WeirSession, streams: &NexmarkStreams) -> Result<()> {
    for table in [Table::Person, Table::Auction, Table::Bid] {
        session
            .stream_catalog()
            .register_stream(table.name(), streams.stream(table)?);
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Int64, false),
        Field::new("value", DataType::Utf8, false),
    ]));
    let side = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from_iter_values(0..10_000)),
            Arc::new(StringArray::from_iter_values(
                (0..10_000).map(|k| k.to_string()),
            )),
        ],
    )
    .map_err(|e| Error::Internal(e.to_string()))?;
    let table = MemTable::try_new(schema, vec![vec![side]])?;
    session
        .context()
        .register_table("side_input", Arc::new(table))?;
    Ok(())
}

/// Every event of `table` among the first `streams.events`, in one partition: what the
/// streams yield, for batch SQL over the same events.
pub async fn generate_table(streams: &NexmarkStreams, table: Table) -> Result<Vec<RecordBatch>> {
    let parts = streams
        .source(table)?
        .generate(0..streams.events, 1)
        .await
        .map_err(|e| Error::Internal(e.to_string()))?;
    Ok(parts.concat())
}

/// Writes the events of `streams` to Parquet files under `dir`: `<table>/part-N.parquet`, file N
/// holding batch N's rows (`events_per_batch` events each), modified one second apart in
/// order so file sources read them in it, and `nexmark.json` saying what they hold. Returns
/// whether it wrote them (false: `dir` already held these events).
pub async fn write_parquet(streams: &NexmarkStreams, dir: &std::path::Path) -> Result<bool> {
    let io = |e: &dyn std::fmt::Display| Error::Internal(format!("writing the Nexmark files: {e}"));
    let manifest = serde_json::json!({
        "events": streams.events,
        "eventsPerBatch": streams.events_per_batch,
        "firstEventRate": streams.rate,
    });
    let manifest_path = dir.join("nexmark.json");
    if let Ok(text) = std::fs::read_to_string(&manifest_path)
        && serde_json::from_str::<serde_json::Value>(&text).ok() == Some(manifest.clone())
    {
        return Ok(false);
    }
    let batches = streams.events.div_ceil(streams.events_per_batch.max(1));
    let now = std::time::SystemTime::now();
    for table in [Table::Person, Table::Auction, Table::Bid] {
        let folder = dir.join(table.name());
        let _ = std::fs::remove_dir_all(&folder);
        std::fs::create_dir_all(&folder).map_err(|e| io(&e))?;
        let source = streams.source(table)?;
        for b in 0..batches {
            let (from, to) = (
                b * streams.events_per_batch,
                ((b + 1) * streams.events_per_batch).min(streams.events),
            );
            let parts = source.generate(from..to, 1).await.map_err(|e| io(&e))?;
            let path = folder.join(format!("part-{b:06}.parquet"));
            let file = std::fs::File::create(&path).map_err(|e| io(&e))?;
            let mut w = parquet::arrow::ArrowWriter::try_new(file, table.schema(), None)
                .map_err(|e| io(&e))?;
            for batch in parts.iter().flatten() {
                w.write(batch).map_err(|e| io(&e))?;
            }
            w.close().map_err(|e| io(&e))?;
            std::fs::File::options()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_modified(now - std::time::Duration::from_secs(batches - b)))
                .map_err(|e| io(&e))?;
        }
    }
    std::fs::write(&manifest_path, manifest.to_string()).map_err(|e| io(&e))?;
    Ok(true)
}

/// What `weir bench --workload nexmark-qN` runs.
#[derive(Debug, Clone)]
pub struct NexmarkBenchConfig {
    /// The query (`q5` or `nexmark-q5`).
    pub query: String,
    /// The streams.
    pub streams: NexmarkStreams,
    /// How state is checkpointed.
    pub state: crate::bench::StateOptions,
}

/// The figures of one Nexmark run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NexmarkReport {
    /// The query.
    pub query: String,
    /// Events generated and processed.
    pub events: u64,
    /// Partitions.
    pub partitions: usize,
    /// Cores this process may run on (its CPU affinity: `taskset` limits it).
    pub cores: usize,
    /// Micro-batches run.
    pub batches: usize,
    /// Events per second, from the query's start to its end, generation included.
    pub events_per_sec: f64,
    /// `events_per_sec` / `cores`.
    pub events_per_sec_per_core: f64,
    /// CPU time the process used while the query ran (all threads), in seconds.
    pub cpu_seconds: f64,
    /// Events per CPU-second (Flink's Nexmark "throughput / cores", with measured cores).
    pub events_per_cpu_sec: f64,
    /// The generator alone, in the same process and partitions over the same events: events
    /// per second (0 when the events were read from files).
    pub generation_events_per_sec: f64,
    /// Where the events came from: `generator`, or the Parquet files' folder.
    pub input: String,
    /// Rows the query wrote.
    pub output_rows: u64,
    /// Peak resident memory while the query ran, bytes.
    pub peak_rss_bytes: u64,
    /// State rows after the last batch (all stateful operators).
    pub state_rows: u64,
    /// The stateful operators' memory after the last batch, bytes.
    pub state_memory_bytes: u64,
    /// The checkpoint's size on disk at the end, bytes.
    pub checkpoint_bytes: u64,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// Runs a Nexmark query over generated events into the noop sink.
pub async fn run_nexmark_bench(cfg: &NexmarkBenchConfig) -> Result<NexmarkReport> {
    let query = NexmarkQuery::find(&cfg.query).ok_or_else(|| {
        Error::user(
            "UNKNOWN_BENCH_WORKLOAD",
            "42601",
            format!(
                "Unknown Nexmark query '{}': expected nexmark-q0 to nexmark-q22.",
                cfg.query
            ),
        )
    })?;
    if let Some(why) = query.unsupported() {
        return Err(Error::user(
            "UNSUPPORTED_STREAMING_OPERATION",
            "0A000",
            format!(
                "weir cannot run Nexmark {} yet: {why} (see queries/nexmark/README.md).",
                query.name
            ),
        ));
    }
    let s = &cfg.streams;
    if let Some(dir) = &s.files
        && write_parquet(s, dir).await?
    {
        eprintln!("wrote the events to Parquet files in {}", dir.display());
    }
    let session =
        WeirSession::with_config(SessionConfig::new().with_target_partitions(s.partitions.max(1)));
    register_streams(&session, s)?;
    let dir = std::env::temp_dir().join(format!("weir-nexmark-{}", uuid::Uuid::new_v4()));
    let sql = format!(
        "CREATE STREAMING TABLE nexmark_{} USING noop OPTIONS (outputMode '{}', \
         checkpointLocation '{}'{}) AS {}",
        query.name,
        query.output_mode(),
        dir.display(),
        cfg.state.sql(),
        query.select()
    );
    let opts = ScriptOptions {
        trigger: Some(Trigger::AvailableNow),
        ..Default::default()
    };
    let collected = Arc::new(crate::bench::Collector::default());
    let listener: Arc<dyn StreamingQueryListener> = Arc::clone(&collected) as _;
    session.streams().add_listener(Arc::clone(&listener));
    crate::bench::reset_peak_rss();
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    let mut results = session.run_script(&sql, &opts).await?;
    let Some(StatementResult::Query(q)) = results.pop() else {
        return Err(Error::Internal("the Nexmark query did not start".into()));
    };
    let done = q.await_termination().await;
    let seconds = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let peak_rss_bytes = crate::bench::peak_rss();
    let progress = collected.detach(&session, &listener).await;
    let checkpoint_bytes = crate::bench::dir_bytes(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    done.map_err(|e| Error::Internal(e.to_string()))?;
    let generation = match s.files {
        Some(_) => 0.0,
        None => generation_rate(s, &query.tables()).await?,
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let last_state = progress
        .iter()
        .rev()
        .find(|p| !p.state_operators.is_empty());
    let events_per_sec = s.events as f64 / seconds.max(1e-9);
    Ok(NexmarkReport {
        query: query.name.to_string(),
        events: s.events,
        partitions: s.partitions,
        cores,
        batches: progress.len(),
        events_per_sec,
        events_per_sec_per_core: events_per_sec / cores as f64,
        cpu_seconds: cpu,
        events_per_cpu_sec: s.events as f64 / cpu.max(1e-9),
        generation_events_per_sec: generation,
        input: s
            .files
            .as_ref()
            .map_or("generator".to_string(), |d| d.display().to_string()),
        output_rows: progress
            .iter()
            .map(|p| p.sink.num_output_rows.max(0) as u64)
            .sum(),
        peak_rss_bytes,
        state_rows: last_state.map_or(0, |p| {
            p.state_operators.iter().map(|o| o.num_rows_total).sum()
        }),
        state_memory_bytes: last_state.map_or(0, |p| {
            p.state_operators.iter().map(|o| o.memory_used_bytes).sum()
        }),
        checkpoint_bytes,
        seconds,
    })
}

/// Events per second the generator alone produces for `tables` over the run's events, in the
/// run's batches and partitions.
async fn generation_rate(s: &NexmarkStreams, tables: &[Table]) -> Result<f64> {
    let start = Instant::now();
    for table in tables {
        let source = s.source(*table)?;
        let mut at = 0u64;
        while at < s.events {
            let end = (at + s.events_per_batch.max(1)).min(s.events);
            source
                .generate(at..end, s.partitions as u64)
                .await
                .map_err(|e| Error::Internal(e.to_string()))?;
            at = end;
        }
    }
    Ok(s.events as f64 / start.elapsed().as_secs_f64().max(1e-9))
}

/// CPU time of this process so far (user + system, all threads), seconds.
fn cpu_seconds() -> f64 {
    // /proc/self/stat fields 14 and 15 (after the parenthesised name), in clock ticks of
    // 1/100 s on Linux.
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = f.get(11)?.parse().ok()?;
            let stime: f64 = f.get(12)?.parse().ok()?;
            Some((utime + stime) / 100.0)
        })
        .unwrap_or(0.0)
}

impl NexmarkReport {
    /// The report for people.
    pub fn table(&self) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        format!(
            "nexmark {}  events {}  input {}  partitions {}  cores {}  batches {}\n\
             events/s          {:>12.0}   ({:.0} per core)\n\
             events/CPU-second {:>12.0}   ({:.2} CPU-seconds)\n\
             generator alone   {:>12.0}   events/s\n\
             output rows       {:>12}\n\
             peak RSS          {:>12.1}   MiB\n\
             state             {:>12}   rows, {:.1} MiB in memory, checkpoint {:.1} MiB\n\
             wall              {:>12.2}   s\n",
            self.query,
            self.events,
            self.input,
            self.partitions,
            self.cores,
            self.batches,
            self.events_per_sec,
            self.events_per_sec_per_core,
            self.events_per_cpu_sec,
            self.cpu_seconds,
            self.generation_events_per_sec,
            self.output_rows,
            mib(self.peak_rss_bytes),
            self.state_rows,
            mib(self.state_memory_bytes),
            mib(self.checkpoint_bytes),
            self.seconds,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_query_file_is_found_with_its_directives() {
        assert_eq!(QUERIES.len(), 23);
        let q5 = NexmarkQuery::find("nexmark-q5").map(|q| q.name);
        assert_eq!(q5, Some("q5"));
        let q15 = NexmarkQuery::find("q15").map(|q| q.output_mode());
        assert_eq!(q15, Some("update"));
        let q3 = NexmarkQuery::find("q3").map(|q| q.tables());
        assert_eq!(q3, Some(vec![Table::Person, Table::Auction]));
        let q0 = NexmarkQuery::find("q0").map(|q| (q.output_mode(), q.select()));
        assert_eq!(
            q0,
            Some((
                "append",
                "SELECT auction, bidder, price, date_time, extra FROM STREAM bid".to_string()
            ))
        );
    }
}
