//! The `weir` command line: run streaming SQL, benchmark workloads.

#[cfg(feature = "server")]
mod load;
mod shell;

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use clap::{Parser, Subcommand};
use weir::bench::{BenchConfig, run_bench};
use weir::{
    QueryProgressEvent, ScriptOptions, StatementResult, StreamingQueryListener, Trigger,
    WeirSession,
};

/// The CLI allocates with mimalloc: stateful operators allocate a key and a value per state
/// row, where glibc's allocator spends its time consolidating and unlinking chunks (embedding
/// programs choose their own allocator).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's options that the CLI sets differently from mimalloc's defaults.
#[cfg(feature = "mimalloc")]
#[expect(
    unsafe_code,
    reason = "mimalloc's options are set through its C API only"
)]
mod allocator {
    use std::ffi::{c_int, c_long};

    unsafe extern "C" {
        #[cfg(test)]
        fn mi_option_get(option: c_int) -> c_long;
        fn mi_option_set(option: c_int, value: c_long);
    }

    /// `mi_option_purge_delay` in mimalloc v3's `mi_option_t` (libmimalloc-sys 0.1.49, as
    /// `Cargo.lock` pins it; a test checks the index still holds v3's default of 1000 ms).
    const PURGE_DELAY: c_int = 15;

    /// How long, in milliseconds, mimalloc keeps memory freed before returning it to the
    /// system: 250 instead of v3's 1000. A micro-batch frees most of what it allocated within
    /// a few hundred milliseconds; kept a second, the last batch's buffers stayed resident
    /// beside the next one's. `weir bench --workload q5` at 100 k rows per batch, three
    /// alternating runs each: anonymous memory at its peak 282-296 MiB at 1000 ms, 242-255 at
    /// 250, 229-237 at 100; median rows/s 631 k, 622 k, 577 k. At 200 k: 36 MiB less at 250
    /// for the same rate; Nexmark q7 on one core: 35-48 MiB less, the same events/s.
    const PURGE_DELAY_MS: c_long = 250;

    /// Sets the options, where the environment (`MIMALLOC_PURGE_DELAY`) does not: first thing
    /// in `main`, before any other thread exists.
    pub(crate) fn configure() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            // SAFETY: mimalloc's options are plain integers it reads without locking; this
            // runs before the process starts a second thread, so nothing reads it meanwhile.
            // `PURGE_DELAY` is an index of the linked mimalloc's `mi_option_t`.
            unsafe { mi_option_set(PURGE_DELAY, PURGE_DELAY_MS) }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_purge_delay_option_is_where_mimalloc_v3_has_it() {
            // The test process never calls `configure`: the option holds mimalloc v3's default
            // (an index that moved would name another option, with another default).
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
                // SAFETY: reads an option's value; `PURGE_DELAY` is within `mi_option_t`.
                assert_eq!(unsafe { mi_option_get(PURGE_DELAY) }, 1000);
            }
        }
    }
}

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "Streaming SQL, micro-batch by micro-batch, exactly-once"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum CheckpointCommand {
    /// What a checkpoint holds: query id, batches, watermark, sources and their committed
    /// offsets, stateful operators with their schemas and state size. Reads only; a running
    /// query may own the checkpoint.
    Inspect {
        /// The checkpoint location (local path, file:// or s3:// URL).
        dir: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Recovers a checkpoint that no longer fits its query, and records what it did
    /// (`resets/<n>`). Stop the query first: a running query's checkpoint is refused.
    ///
    /// --query NEW.sql (selective reset): fits the checkpoint to the changed query so that it
    /// continues where it left off: stateful operators whose state still fits keep it; changed,
    /// added or removed ones start empty (or go); each source continues from its committed
    /// offsets, so the sink's output continues with no row lost or doubled.
    ///
    /// --full (full refresh): deletes the batches, state and sources' files, clears the sink's
    /// output (file sinks, Delta) and gives the query a new ID: it starts over.
    Reset {
        /// The checkpoint location (local path, file:// or s3:// URL).
        dir: String,
        /// Selective reset for the changed query in this SQL file.
        #[arg(long, conflicts_with = "full", required_unless_present = "full")]
        query: Option<PathBuf>,
        /// With --query: start this source (a position or a name) anew, e.g. after its Kafka
        /// subscription or folder changed; it continues from a position derived from the
        /// committed offsets where one can be (repeatable).
        #[arg(long = "source", requires = "query", conflicts_with = "full")]
        sources: Vec<String>,
        /// With --source: start the sources from their own starting options (startingOffsets,
        /// ...) instead; a gap or overlap against the committed offsets is reported.
        #[arg(long, requires = "sources", conflicts_with = "full")]
        from_starting_position: bool,
        /// Full refresh.
        #[arg(long)]
        full: bool,
        /// With --full: keep what the sink wrote (needed for sinks weir cannot clear, such as
        /// Kafka or the console).
        #[arg(long, requires = "full")]
        keep_sink_data: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Rewrites every stateful operator's state into N shuffle partitions, offline, so that
    /// the next run uses N (aggregations and deduplications). Stop the query first.
    Repartition {
        /// The checkpoint location (local path, file:// or s3:// URL).
        dir: String,
        /// The new number of shuffle partitions.
        #[arg(long)]
        partitions: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Runs batch N of a checkpoint again, read-only, and prints each source's range and the
    /// rows the batch produced: its logged offsets, time and watermark, and the state as it was
    /// before the batch. Neither the sink nor the checkpoint is touched. For debugging.
    Replay {
        /// The checkpoint location (local path, file:// or s3:// URL).
        dir: String,
        /// The SQL file of the query (it must pass the restart checks against the checkpoint).
        file: PathBuf,
        /// The batch to run again.
        #[arg(long)]
        batch: u64,
    },
    /// Whether a query (a SQL file) would restart from a checkpoint: runs every restart check
    /// without executing anything or writing to the checkpoint, and prints the checkpoint's
    /// and the query's sources, sink and stateful operators side by side with what refuses
    /// the restart. Exit code 0 only when the restart would be accepted.
    Validate {
        /// The checkpoint location (local path, file:// or s3:// URL).
        dir: String,
        /// The SQL file of the query (its streaming statement's own checkpointLocation is
        /// replaced by DIR).
        file: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum PipelineCommand {
    /// Create a pipeline project: NAME/weir-pipeline.yml, NAME/transformations/example.sql
    /// and NAME/pipeline-storage/ (as `spark-pipelines init --name NAME`).
    Init {
        /// The pipeline's name, and its folder's (letters, digits, '_', '-').
        name: String,
    },
    /// Run one update: every flow in dependency order (flows that do not depend on each other
    /// concurrently), streaming flows until their sources hold nothing new (availableNow),
    /// into Delta tables under the spec's storage.
    Run {
        /// The spec file; by default weir-pipeline.yml in this folder or the nearest above.
        #[arg(long)]
        spec: Option<PathBuf>,
        /// Update only these datasets (comma-separated; repeatable).
        #[arg(long, value_delimiter = ',')]
        refresh: Vec<String>,
        /// Clear these datasets and every checkpoint of their flows, then recompute them
        /// (comma-separated; repeatable). Older table versions stay readable.
        #[arg(long, value_delimiter = ',')]
        full_refresh: Vec<String>,
        /// Fully refresh every dataset.
        #[arg(long)]
        full_refresh_all: bool,
        /// Reset these flows' checkpoints first (comma-separated; repeatable): each fits its
        /// checkpoint to its query and starts its sources anew, from where the checkpoint left
        /// off or from the starting option its query gives; the tables and other flows stay.
        #[arg(long, value_delimiter = ',')]
        reset_checkpoint: Vec<String>,
        /// Keep running after the first pass: streaming flows with a processing-time trigger,
        /// materialized views recomputed at each interval, until Ctrl-C.
        #[arg(long)]
        continuous: bool,
        /// The interval of a continuous update (e.g. "5 seconds").
        #[arg(long, default_value = "1 second", requires = "continuous")]
        trigger_interval: String,
    },
    /// The pipeline's event log: every update's events (update created, its state, each
    /// flow's status and per-batch progress), oldest first.
    Events {
        /// The spec file; by default weir-pipeline.yml in this folder or the nearest above.
        #[arg(long)]
        spec: Option<PathBuf>,
        /// Print every column of every event as one JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Check the pipeline without reading or writing data: its spec, its files' statements,
    /// its dataset graph (two definitions of a name, flows into undefined tables, tables no
    /// flow writes, cycles), every flow's query planned, and every flow with a checkpoint
    /// against it (the restart checks of `weir checkpoint validate`). Exit code 0 only when
    /// the update would start.
    DryRun {
        /// The spec file; by default weir-pipeline.yml in this folder or the nearest above.
        #[arg(long)]
        spec: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Tools for checkpoints.
    Checkpoint {
        #[command(subcommand)]
        command: CheckpointCommand,
    },
    /// Declarative pipelines: projects of streaming tables, flows and views defined in SQL.
    Pipeline {
        #[command(subcommand)]
        command: PipelineCommand,
    },
    /// Run a SQL script; streaming queries run until stopped (Ctrl-C), done, or --max-batches.
    Run {
        /// The SQL file to run.
        file: Option<PathBuf>,
        /// SQL text to run instead of a file.
        #[arg(short = 'e', long = "execute")]
        execute: Option<String>,
        /// Checkpoint location of the streaming query.
        #[arg(long)]
        checkpoint: Option<String>,
        /// Trigger: default, once, availableNow, processingTime=<interval>.
        #[arg(long)]
        trigger: Option<String>,
        /// Stop each streaming query after this many batches.
        #[arg(long)]
        max_batches: Option<u64>,
        /// Write every progress record as one JSON line to this file (`-` = stdout).
        #[arg(long)]
        progress: Option<String>,
    },
    /// Serve the HTTP API: submit, list, watch and stop streaming queries, kept across
    /// restarts of the server (issue 20, first part).
    #[cfg(feature = "server")]
    Serve {
        /// Where to listen; anything but loopback needs a token.
        #[arg(long, default_value = "127.0.0.1:4040")]
        listen: std::net::SocketAddr,
        /// Where the server keeps its registry and the checkpoints it assigns.
        #[arg(long, default_value = "weir-server")]
        data: PathBuf,
        /// The bearer token every request must carry (default: $WEIR_SERVER_TOKEN).
        #[arg(long)]
        token: Option<String>,
    },
    /// An interactive SQL shell (line editing, history, multi-line statements, \q to leave), on
    /// a local session or on a running `weir serve`. A streaming SELECT prints its batches until
    /// Ctrl-C, which stops that query and keeps the shell.
    Shell {
        /// A `weir serve` to run the statements on, e.g. http://127.0.0.1:4040.
        #[arg(long)]
        server: Option<String>,
        /// The server's bearer token (default: $WEIR_SERVER_TOKEN).
        #[arg(long)]
        token: Option<String>,
    },
    /// Run a named benchmark workload (into the noop sink, but files-delta and cdc-*).
    Bench {
        /// Workload: q1 (stateless), q2 (aggregation), q3 (windows), q4 (dedupe), q5 (join),
        /// kafka (Kafka source), files (Parquet files, aggregation), files-delta (the same into
        /// a Delta table, complete mode), cdc-scd1 / cdc-scd2 (AUTO CDC of 1,000,000 keys into
        /// a Delta table, one change in ten late: warm up with 1,000,000 rows), server-load
        /// (weir serve hosting --queries queries under --rps API requests per second),
        /// nexmark-q0 ... nexmark-q22 (queries/nexmark over --events generated events).
        #[arg(long, default_value = "q1")]
        workload: String,
        /// Measured batches.
        #[arg(long, default_value_t = 20)]
        batches: u64,
        /// Warm-up batches (not measured).
        #[arg(long, default_value_t = 5)]
        warmup: u64,
        /// Rows per batch.
        #[arg(long, default_value_t = 1_000_000)]
        rows_per_batch: u64,
        /// Partitions.
        #[arg(long, default_value_t = 2)]
        partitions: usize,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Stateful workloads: asynchronous state checkpointing.
        #[arg(long)]
        async_state_checkpoint: bool,
        /// Stateful workloads: a RocksDB snapshot every N state versions
        /// (`stateStore.minDeltasForSnapshot`, default 10).
        #[arg(long)]
        min_deltas_for_snapshot: Option<u64>,
        /// Stateful workloads: the least time between a store's snapshots
        /// (`stateStore.maintenanceInterval`, default 60s; 0: every --min-deltas-for-snapshot
        /// versions).
        #[arg(long)]
        state_maintenance_interval: Option<String>,
        /// The kafka workload's broker (host:port); by default a Tansu broker started on
        /// loopback from $WEIR_TANSU.
        #[arg(long)]
        bootstrap_servers: Option<String>,
        /// The files workload: write the input files here (unless it has files already) and
        /// keep them, e.g. for Spark to read the same files. nexmark-qN: read the events from
        /// Parquet files here (written first unless they hold these events), one per batch.
        #[arg(long)]
        input_dir: Option<PathBuf>,
        /// server-load: queries hosted by the server.
        #[arg(long, default_value_t = 50)]
        queries: usize,
        /// server-load: API requests per second.
        #[arg(long, default_value_t = 100)]
        rps: u64,
        /// server-load: how long the requests go on, in seconds.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// After the run, restart the query on its checkpoint for one more batch and report how
        /// long that took (state reopened from the checkpoint).
        #[arg(long)]
        restart: bool,
        /// nexmark-qN: events generated (people, auctions and bids together).
        #[arg(long, default_value_t = 10_000_000)]
        events: u64,
        /// nexmark-qN: events per micro-batch at most (the streams' maxEventsPerTrigger).
        #[arg(long, default_value_t = 1_000_000)]
        events_per_batch: u64,
        /// nexmark-qN: events per second of event time (the generator's firstEventRate;
        /// Flink's and Feldera's runs use 10,000,000).
        #[arg(long, default_value_t = 10_000_000)]
        event_rate: u64,
    },
}

struct ProgressWriter(Mutex<Box<dyn Write + Send>>);

impl StreamingQueryListener for ProgressWriter {
    fn on_query_progress(&self, e: &QueryProgressEvent) {
        if let Ok(mut w) = self.0.lock() {
            let _ = writeln!(w, "{}", e.progress.json());
            let _ = w.flush();
        }
    }
}

fn main() -> std::process::ExitCode {
    #[cfg(feature = "mimalloc")]
    allocator::configure();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
                // delta-rs's kernel logs (with a backtrace) the errors weir reports itself.
                // Pipeline flows into one table commit concurrently: delta-rs retries a commit
                // that lost the race (and warns of it), which is how it is meant to go. Its
                // MERGE warns of a scan metric it derives itself.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new(
                        "warn,buoyant_kernel=off,deltalake_core::kernel::transaction=error,\
                         deltalake_core::operations::merge=error",
                    )
                }),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    // DataFusion plans and evaluates expressions by recursion: deeper stacks than tokio's
    // 2 MiB default keep the deepest expression weir accepts (weir::MAX_EXPRESSION_DEPTH) far
    // from overflowing them. The memory is only reserved; pages are used as they are touched.
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(16 << 20)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            match e.downcast_ref::<weir::Error>() {
                // weir's errors already say what is wrong and what to do; the chain would repeat it.
                Some(w) => eprintln!("error: {w}"),
                None => eprintln!("error: {e:#}"),
            }
            std::process::ExitCode::FAILURE
        }
    }
}

/// The pipeline spec at `spec`, or the one found from the working directory upwards.
fn pipeline_spec(spec: Option<PathBuf>) -> anyhow::Result<weir_pipeline::PipelineSpec> {
    let path = match spec {
        Some(p) => p,
        None => weir_pipeline::PipelineSpec::find(&std::env::current_dir()?)
            .map_err(weir::Error::from)?,
    };
    Ok(weir_pipeline::PipelineSpec::load(&path).map_err(weir::Error::from)?)
}

/// The SQL file of a checkpoint tool, and the options that point its query at checkpoint `dir`.
fn tool_script(file: &std::path::Path, dir: String) -> anyhow::Result<(String, ScriptOptions)> {
    let sql = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the SQL file {}", file.display()))?;
    let opts = ScriptOptions {
        checkpoint: Some(dir),
        ..ScriptOptions::default()
    };
    Ok((sql, opts))
}

/// Refuses `weir checkpoint reset` flags that do not mean one thing: `--source` and
/// `--from-starting-position` belong to a selective reset (`--query`), `--keep-sink-data` to a
/// full refresh (`--full`), and exactly one of the two is asked for.
fn check_reset_flags(
    query: bool,
    full: bool,
    source: bool,
    from_starting_position: bool,
    keep_sink_data: bool,
) -> anyhow::Result<()> {
    let refuse = |what: &str| {
        anyhow::bail!(
            "{what}; nothing was changed. Run `weir checkpoint reset --help` for the two kinds of \
             reset: --query NEW.sql [--source S [--from-starting-position]] fits the checkpoint \
             to a changed query, --full [--keep-sink-data] starts it over"
        )
    };
    match (query, full) {
        (true, true) => {
            refuse("--query (a selective reset) and --full (a full refresh) exclude each other")
        }
        (false, false) => refuse("give --query NEW.sql or --full"),
        (false, true) if source => {
            refuse("--source needs --query: a full refresh starts every source over anyway")
        }
        (false, true) if from_starting_position => refuse(
            "--from-starting-position needs --query and --source: a full refresh starts every source from its starting position anyway",
        ),
        (true, false) if keep_sink_data => refuse(
            "--keep-sink-data needs --full: a selective reset keeps the sink's output anyway",
        ),
        (true, false) if from_starting_position && !source => refuse(
            "--from-starting-position needs --source S: it says where the reset sources start",
        ),
        _ => Ok(()),
    }
}

async fn run(cli: Cli) -> anyhow::Result<std::process::ExitCode> {
    use std::process::ExitCode;
    match cli.command {
        Command::Run {
            file,
            execute,
            checkpoint,
            trigger,
            max_batches,
            progress,
        } => {
            let sql = match (file, execute) {
                (_, Some(sql)) => sql,
                (Some(f), None) => std::fs::read_to_string(&f)
                    .with_context(|| format!("cannot read the SQL file {}", f.display()))?,
                (None, None) => anyhow::bail!("give a SQL file or -e 'SQL'"),
            };
            let session = WeirSession::new();
            if let Some(p) = progress {
                let w: Box<dyn Write + Send> = if p == "-" {
                    Box::new(std::io::stdout())
                } else {
                    Box::new(
                        std::fs::File::create(&p)
                            .with_context(|| format!("cannot create the progress file {p}"))?,
                    )
                };
                session
                    .streams()
                    .add_listener(Arc::new(ProgressWriter(Mutex::new(w))));
            }
            let opts = ScriptOptions {
                checkpoint,
                trigger: trigger.as_deref().map(Trigger::parse).transpose()?,
                max_batches,
                default_sink: None,
            };
            let results = session.run_script(&sql, &opts).await?;
            let mut queries = vec![];
            for r in results {
                match r {
                    StatementResult::Rows(rows) => {
                        println!(
                            "{}",
                            weir::datafusion::arrow::util::pretty::pretty_format_batches(&rows)?
                        );
                    }
                    StatementResult::Query(q) => queries.push(q),
                    StatementResult::Done
                    | StatementResult::Validated(_)
                    | StatementResult::Reset(_)
                    | StatementResult::Replayed(_) => {}
                }
            }
            if queries.is_empty() {
                return Ok(ExitCode::SUCCESS);
            }
            let all = futures::future::join_all(queries.iter().map(|q| q.await_termination()));
            tokio::select! {
                results = all => {
                    for r in results { r?; }
                }
                _ = tokio::signal::ctrl_c() => {
                    for q in &queries { q.stop().await; }
                }
            }
            // The last progress lines are written by the listener thread; wait for them.
            session.streams().flush_listeners().await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Pipeline {
            command: PipelineCommand::Init { name },
        } => {
            let dir = weir_pipeline::init_project(&std::env::current_dir()?, &name)
                .map_err(weir::Error::from)?;
            println!(
                "Created the pipeline project '{name}' in {}: its spec is weir-pipeline.yml, \
                 its datasets are defined in transformations/*.sql.\nTo run it: cd '{name}' \
                 && weir pipeline run",
                dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Pipeline {
            command:
                PipelineCommand::Run {
                    spec,
                    refresh,
                    full_refresh,
                    full_refresh_all,
                    reset_checkpoint,
                    continuous,
                    trigger_interval,
                },
        } => {
            let trim = |v: Vec<String>| -> Vec<String> {
                v.into_iter()
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            };
            let options = weir_pipeline::UpdateOptions {
                refresh: trim(refresh),
                full_refresh: trim(full_refresh),
                full_refresh_all,
                continuous: if continuous {
                    let interval = weir_common::parse_duration(
                        &trigger_interval,
                        std::time::Duration::from_millis(1),
                    )
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| {
                        weir::Error::user(
                            "INVALID_TRIGGER_INTERVAL",
                            "42K06",
                            format!(
                                "--trigger-interval '{trigger_interval}' is not a duration: \
                                 write e.g. '500 milliseconds' or '5 seconds'."
                            ),
                        )
                    })?;
                    Some(interval)
                } else {
                    None
                },
                ..Default::default()
            };
            options.check().map_err(weir::Error::from)?;
            let spec = pipeline_spec(spec)?;
            let files = spec.library_files().map_err(weir::Error::from)?;
            let graph = match weir_pipeline::Graph::from_files(&files) {
                Ok(g) => g,
                Err(errors) => {
                    for e in &errors {
                        eprintln!("error: {}", weir::Error::from(e.clone()));
                    }
                    eprintln!(
                        "{} problem(s) found; the update did not start (weir pipeline dry-run \
                         shows them too).",
                        errors.len()
                    );
                    return Ok(ExitCode::FAILURE);
                }
            };
            eprintln!(
                "Update of pipeline '{}': {} flow(s), storage {}",
                spec.name,
                graph.flows.len(),
                spec.storage
            );
            let reset_checkpoint = trim(reset_checkpoint);
            if !reset_checkpoint.is_empty() {
                for (flow, report) in
                    weir_pipeline::reset_flows(&spec, &graph, &reset_checkpoint).await?
                {
                    eprintln!("Checkpoint of flow '{flow}' reset:\n{}", report.table());
                }
            }
            let stop = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            let outcomes = weir_pipeline::run_update_until(&spec, &graph, &options, stop).await?;
            let mut failed = 0;
            for o in &outcomes {
                let what = match &o.result {
                    Ok(weir_pipeline::FlowRun::Streamed { batches, rows }) => {
                        format!("{batches} batch(es), {rows} row(s) read")
                    }
                    Ok(weir_pipeline::FlowRun::Wrote { rows }) => format!("{rows} row(s) written"),
                    Ok(weir_pipeline::FlowRun::AlreadyDone) => {
                        "once flow, done in an earlier update".into()
                    }
                    Ok(weir_pipeline::FlowRun::NotRun) => "not run: another flow failed".into(),
                    Ok(weir_pipeline::FlowRun::Continuous { batches, rows }) => {
                        format!("ran continuously: {batches} batch(es), {rows} row(s) read")
                    }
                    Ok(weir_pipeline::FlowRun::NotSelected) => {
                        "not selected by --refresh / --full-refresh".into()
                    }
                    Err(e) => {
                        failed += 1;
                        format!("FAILED: {e}")
                    }
                };
                eprintln!("  {} → {}: {what}", o.flow, o.target);
            }
            if failed > 0 {
                eprintln!("The update failed: {failed} flow(s) failed.");
                return Ok(ExitCode::FAILURE);
            }
            eprintln!(
                "{}",
                if options.continuous.is_some() {
                    "The update was stopped."
                } else {
                    "The update completed."
                }
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Pipeline {
            command: PipelineCommand::Events { spec, json },
        } => {
            let spec = pipeline_spec(spec)?;
            let session = WeirSession::new();
            let storage = spec.storage.replace('\'', "''");
            let columns = if json {
                "*"
            } else {
                "timestamp, update_id, event_type, flow_name, level, message"
            };
            let df = session
                .context()
                .sql(&format!(
                    "SELECT {columns} FROM event_log('{storage}') ORDER BY timestamp, sequence"
                ))
                .await
                .map_err(weir::Error::from)?;
            let batches = df.collect().await.map_err(weir::Error::from)?;
            if json {
                let mut writer = arrow::json::LineDelimitedWriter::new(std::io::stdout());
                for b in &batches {
                    writer.write(b)?;
                }
                writer.finish()?;
            } else {
                println!("{}", arrow::util::pretty::pretty_format_batches(&batches)?);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Pipeline {
            command: PipelineCommand::DryRun { spec },
        } => {
            let spec = pipeline_spec(spec)?;
            let path = spec.path.clone();
            let files = spec.library_files().map_err(weir::Error::from)?;
            println!(
                "Pipeline '{}' ({}): {} SQL file(s), storage {}",
                spec.name,
                path.display(),
                files.len(),
                spec.storage
            );
            match weir_pipeline::Graph::from_files(&files) {
                Ok(graph) => {
                    print!("{}", graph.describe().map_err(weir::Error::from)?);
                    let session = weir_pipeline::session_for(&spec)?;
                    let layout = weir_pipeline::Layout::new(&spec.storage);
                    let checks = weir_pipeline::check_flows(&session, &layout, &graph).await?;
                    let mut failed = 0;
                    for c in &checks {
                        match (&c.error, &c.restart) {
                            _ if c.blocked_by.is_some() => eprintln!(
                                "flow '{}' not checked: it reads '{}', whose flows did not pass",
                                c.flow,
                                c.blocked_by.as_deref().unwrap_or_default()
                            ),
                            (Some(e), _) => eprintln!("error: flow '{}': {e}", c.flow),
                            (None, Some(r)) if !r.accepted => {
                                eprintln!(
                                    "error: flow '{}' cannot restart from its checkpoint:\n{}",
                                    c.flow,
                                    r.table()
                                )
                            }
                            _ => {}
                        }
                        failed += usize::from(!c.ok());
                    }
                    if failed > 0 {
                        eprintln!("{failed} flow(s) would not start; nothing was read or written.");
                        return Ok(ExitCode::FAILURE);
                    }
                    println!("Every flow plans and can start: the update would run.");
                    Ok(ExitCode::SUCCESS)
                }
                Err(errors) => {
                    for e in &errors {
                        eprintln!("error: {}", weir::Error::from(e.clone()));
                    }
                    eprintln!(
                        "{} problem(s) found; nothing was read or written.",
                        errors.len()
                    );
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Checkpoint {
            command: CheckpointCommand::Inspect { dir, json },
        } => {
            let location =
                weir::Location::parse_existing_with(&dir, std::iter::empty::<(&str, &str)>())?;
            let report = weir::tools::inspect::inspect(location).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.table());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Checkpoint {
            command: CheckpointCommand::Validate { dir, file, json },
        } => {
            let (sql, opts) = tool_script(&file, dir)?;
            let results = WeirSession::new().validate_script(&sql, &opts).await?;
            let Some(report) = results.into_iter().find_map(|r| match r {
                StatementResult::Validated(r) => Some(r),
                _ => None,
            }) else {
                anyhow::bail!(
                    "{} starts no streaming query: there is nothing to validate against the \
                     checkpoint",
                    file.display()
                );
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.table());
            }
            Ok(if report.accepted {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Checkpoint {
            command:
                CheckpointCommand::Reset {
                    dir,
                    query,
                    sources,
                    from_starting_position,
                    full,
                    keep_sink_data,
                    json,
                },
        } => {
            // clap lets a flag whose required flag conflicts with a given one pass: refuse
            // every combination that does not mean one thing before anything is touched.
            check_reset_flags(
                query.is_some(),
                full,
                !sources.is_empty(),
                from_starting_position,
                keep_sink_data,
            )?;
            let session = WeirSession::new();
            let report = match (query, full) {
                (_, true) => session.refresh_checkpoint(&dir, keep_sink_data).await?,
                (Some(file), false) => {
                    let (sql, opts) = tool_script(&file, dir)?;
                    let found = session
                        .reset_script(&sql, &opts, &sources, from_starting_position)
                        .await?
                        .into_iter()
                        .find_map(|r| match r {
                            StatementResult::Reset(r) => Some(*r),
                            _ => None,
                        });
                    found.with_context(|| {
                        format!(
                            "{} starts no streaming query: there is nothing to fit the \
                             checkpoint to",
                            file.display()
                        )
                    })?
                }
                (None, false) => anyhow::bail!("give --query QUERY.sql or --full"),
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.table());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Checkpoint {
            command:
                CheckpointCommand::Repartition {
                    dir,
                    partitions,
                    json,
                },
        } => {
            let location =
                weir::Location::parse_existing_with(&dir, std::iter::empty::<(&str, &str)>())?;
            let report = weir::tools::repartition::repartition(location, partitions).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.table());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Checkpoint {
            command: CheckpointCommand::Replay { dir, file, batch },
        } => {
            let (sql, opts) = tool_script(&file, dir)?;
            let report = WeirSession::new()
                .replay_script(&sql, &opts, batch)
                .await?
                .into_iter()
                .find_map(|r| match r {
                    StatementResult::Replayed(r) => Some(r),
                    _ => None,
                })
                .with_context(|| {
                    format!(
                        "{} starts no streaming query: there is nothing to replay",
                        file.display()
                    )
                })?;
            print!("{}", report.table()?);
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(feature = "server")]
        Command::Serve {
            listen,
            data,
            token,
        } => {
            let token = token.or_else(|| std::env::var(weir_server::TOKEN_ENV).ok());
            weir_server::serve(
                weir_server::ServerConfig {
                    listen,
                    data,
                    token,
                },
                async {
                    let _ = tokio::signal::ctrl_c().await;
                },
            )
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Shell { server, token } => {
            let token = token.or_else(|| std::env::var("WEIR_SERVER_TOKEN").ok());
            shell::run(server, token).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            workload,
            batches,
            warmup,
            rows_per_batch,
            partitions,
            json,
            async_state_checkpoint,
            min_deltas_for_snapshot,
            state_maintenance_interval,
            bootstrap_servers,
            input_dir,
            queries,
            rps,
            seconds,
            events,
            events_per_batch,
            event_rate,
            restart,
        } => {
            let state = weir::bench::StateOptions {
                async_checkpoint: async_state_checkpoint,
                min_deltas_for_snapshot,
                maintenance_interval: state_maintenance_interval,
            };
            if workload.to_ascii_lowercase().starts_with("nexmark-") {
                let report = weir::nexmark::run_nexmark_bench(&weir::nexmark::NexmarkBenchConfig {
                    query: workload,
                    streams: weir::nexmark::NexmarkStreams {
                        events,
                        events_per_batch,
                        partitions,
                        rate: event_rate,
                        files: input_dir,
                    },
                    state,
                })
                .await?;
                if json {
                    println!("{}", serde_json::to_string(&report)?);
                } else {
                    print!("{}", report.table());
                }
                return Ok(ExitCode::SUCCESS);
            }
            if workload.eq_ignore_ascii_case("server-load") {
                #[cfg(feature = "server")]
                {
                    load::run(load::LoadConfig {
                        queries,
                        rps,
                        seconds,
                        json,
                    })
                    .await?;
                    return Ok(ExitCode::SUCCESS);
                }
                #[cfg(not(feature = "server"))]
                anyhow::bail!("the server-load workload needs weir built with the server feature");
            }
            let _ = (queries, rps, seconds);
            let report = run_bench(&BenchConfig {
                workload,
                batches,
                warmup,
                rows_per_batch,
                partitions,
                state,
                bootstrap_servers,
                input_dir,
                restart,
            })
            .await?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print!("{}", report.table());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
