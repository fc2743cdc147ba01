//! The streaming sqllogictest harness: runs every `tests/slt/*.slt` file against a fresh
//! `WeirSession`.
//!
//! Each record goes through `WeirSession::run_script`, so weir's statements (`CREATE STREAMING
//! TABLE`, `INSERT INTO` a streaming table, a streaming `SELECT`) start queries and anything else
//! is DataFusion SQL. Before each record the harness waits until every query started so far has
//! processed all its available input (`process_all_available`), so results are deterministic for
//! queries with an `availableNow`/`once` trigger or finite sources. A query that failed meanwhile
//! fails the record that follows it, with the query's error.
//!
//! `cargo test --test sqllogictest [-- FILTER]` runs the files whose name contains FILTER. Files
//! use `control substitution on` and `$__TEST_DIR__` for checkpoint and output folders.
//!
//! A file runs on the RocksDB state store; a first line `# state stores: rocksdb memory` runs it
//! once per listed store, each time in a fresh session, so both must give the same results (files
//! that restart queries from a checkpoint need a durable store: rocksdb only).
//!
//! Every file with a query that has a `checkpointLocation` also runs a third way, killed and
//! restarted (RocksDB): before such a `CREATE [OR REFRESH] STREAMING TABLE` runs in the session,
//! the real `weir` binary runs the same statement in a process of its own, which is SIGKILLed in
//! the middle of the run's first batch (after its offsets are logged, after its input is read,
//! after its state is committed, or after its sink wrote: stages taken in turn, never after the
//! batch's commit); then the session runs the statement, which restarts from that checkpoint
//! and replays the batch. The file's expected results must hold unchanged, and at least one
//! query must have been killed, unless the file says why not in a line
//! `# killed and restarted: no (...)`.

#![expect(
    clippy::unwrap_used,
    reason = "a test fails loudly on any unexpected error"
)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqllogictest::{AsyncDB, DBOutput, DefaultColumnType};
use weir::datafusion::arrow::datatypes::DataType;
use weir::datafusion::arrow::record_batch::RecordBatch;
use weir::datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use weir::{ScriptOptions, StateBackend, StatementResult, StreamingQuery, WeirSession};

struct WeirDb {
    session: WeirSession,
    queries: Vec<StreamingQuery>,
    /// In the killed-and-restarted run: how many statements were killed so far.
    kills: Option<Arc<AtomicUsize>>,
}

/// Where a killed run stops, in turn: each is before the batch's commit, so the restart
/// replays the batch (with `availableNow`, the same batch: the run's target is that batch's
/// end). `state_committed` is reached only by stateful queries.
const KILL_STAGES: &[&str] = &[
    "after_wal",
    "state_committed",
    "after_get_batch",
    "after_sink",
];

/// The checkpoint of a statement that starts a checkpointed streaming table, if it is one.
fn killable_checkpoint(sql: &str) -> Option<PathBuf> {
    let upper = sql.trim_start().to_ascii_uppercase();
    let starts = upper.starts_with("CREATE STREAMING TABLE")
        || upper.starts_with("CREATE OR REFRESH STREAMING TABLE");
    let at = sql.find("checkpointLocation")?;
    let rest = &sql[at..];
    let open = rest.find('\'')?;
    let close = rest[open + 1..].find('\'')?;
    starts.then(|| PathBuf::from(&rest[open + 1..open + 1 + close]))
}

/// The batch a run on checkpoint `ck` starts with: the one after the last committed.
fn next_batch(ck: &Path) -> u64 {
    std::fs::read_dir(ck.join("commits"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .map_or(0, |b| b + 1)
}

/// Runs `sql` in a `weir` process of its own and SIGKILLs it at `stage` of its first batch.
/// Returns whether it was killed: a statement the process cannot run alone (it reads a table
/// created earlier in the file) fails there before logging anything, and is not killed.
fn run_and_kill(sql: &str, ck: &Path, stage: &str) -> Result<bool, SltError> {
    let batch = next_batch(ck);
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["run", "-e", sql])
        .env("WEIR_TEST_PAUSE_AT", format!("{stage}:{batch}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| SltError(format!("cannot start weir: {e}")))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| SltError("no stderr".into()))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = vec![];
    loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(line) if line.starts_with("WEIR_PAUSED") => {
                child
                    .kill()
                    .map_err(|e| SltError(format!("cannot kill weir: {e}")))?;
                let _ = child.wait();
                return Ok(true);
            }
            Ok(line) => seen.push(line),
            Err(_) => {}
        }
        if let Ok(Some(status)) = child.try_wait() {
            if ck.join("offsets").join(batch.to_string()).exists() {
                return Err(SltError(format!(
                    "the run to kill finished batch {batch} without reaching {stage} \
                     ({status}); the restart would not be the same run: {seen:?}"
                )));
            }
            return Ok(false);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(SltError(format!(
                "the run to kill did not reach {stage} of batch {batch} within 60 s: {seen:?}"
            )));
        }
    }
}

#[derive(Debug)]
struct SltError(String);

impl std::fmt::Display for SltError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SltError {}

impl WeirDb {
    /// Lets every started query catch up; reports (once) a query that failed.
    async fn settle(&mut self) -> Result<(), SltError> {
        let mut failed = None;
        for q in &self.queries {
            let waited =
                tokio::time::timeout(Duration::from_secs(60), q.process_all_available()).await;
            match waited {
                Err(_) => {
                    return Err(SltError(format!(
                        "query {:?} did not catch up within 60 s; give it an availableNow or \
                         once trigger",
                        q.name()
                    )));
                }
                Ok(Err(e)) if failed.is_none() => failed = Some(e.to_string()),
                Ok(_) => {}
            }
        }
        self.queries.retain(|q| q.is_active());
        match failed {
            Some(e) => Err(SltError(e)),
            None => Ok(()),
        }
    }
}

fn column_type(t: &DataType) -> DefaultColumnType {
    if t.is_integer() {
        DefaultColumnType::Integer
    } else if t.is_floating() || matches!(t, DataType::Decimal128(..) | DataType::Decimal256(..)) {
        DefaultColumnType::FloatingPoint
    } else {
        DefaultColumnType::Text
    }
}

fn to_output(batches: &[RecordBatch]) -> Result<DBOutput<DefaultColumnType>, SltError> {
    let Some(first) = batches.first() else {
        return Ok(DBOutput::Rows {
            types: vec![],
            rows: vec![],
        });
    };
    let types = first
        .schema()
        .fields()
        .iter()
        .map(|f| column_type(f.data_type()))
        .collect();
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = vec![];
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SltError(e.to_string()))?;
        for row in 0..batch.num_rows() {
            rows.push(
                formatters
                    .iter()
                    .map(|f| match f.value(row).to_string() {
                        s if s.is_empty() => "(empty)".to_string(),
                        s => s,
                    })
                    .collect(),
            );
        }
    }
    Ok(DBOutput::Rows { types, rows })
}

#[async_trait]
impl AsyncDB for WeirDb {
    type Error = SltError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<Self::ColumnType>, Self::Error> {
        self.settle().await?;
        if let Some(kills) = &self.kills
            && let Some(ck) = killable_checkpoint(sql)
        {
            let done = kills.load(Ordering::SeqCst);
            let upper = sql.to_ascii_uppercase();
            let stateful = upper.contains("GROUP BY")
                || upper.contains("DISTINCT ON")
                || upper.matches("STREAM ").count() > 1;
            let stages: Vec<&str> = KILL_STAGES
                .iter()
                .copied()
                .filter(|s| stateful || *s != "state_committed")
                .collect();
            let stage = stages[done % stages.len()];
            let sql = sql.to_string();
            let killed = tokio::task::spawn_blocking(move || run_and_kill(&sql, &ck, stage))
                .await
                .map_err(|e| SltError(e.to_string()))??;
            kills.fetch_add(usize::from(killed), Ordering::SeqCst);
        }
        let results = self
            .session
            .run_script(sql, &ScriptOptions::default())
            .await
            .map_err(|e| SltError(e.to_string()))?;
        let mut output = DBOutput::StatementComplete(0);
        for r in results {
            output = match r {
                StatementResult::Query(q) => {
                    self.queries.push(q);
                    DBOutput::StatementComplete(0)
                }
                StatementResult::Rows(batches) => to_output(&batches)?,
                StatementResult::Done
                | StatementResult::Validated(_)
                | StatementResult::Reset(_)
                | StatementResult::Replayed(_) => DBOutput::StatementComplete(0),
            };
        }
        Ok(output)
    }

    async fn shutdown(&mut self) {
        for q in self.queries.drain(..) {
            q.stop().await;
        }
    }

    fn engine_name(&self) -> &str {
        "weir"
    }

    async fn sleep(dur: Duration) {
        tokio::time::sleep(dur).await;
    }
}

fn slt_files(filter: Option<&str>) -> Vec<PathBuf> {
    // At run time (cargo sets it): a binary shared through CARGO_TARGET_DIR by several clones
    // may have been built from another one.
    let root =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let dir = Path::new(&root).join("tests/slt");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "slt"))
        .filter(|p| filter.is_none_or(|f| p.to_string_lossy().contains(f)))
        .collect();
    files.sort();
    files
}

fn main() {
    // `cargo test` passes libtest flags (e.g. `--quiet`); the first free argument filters files.
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let files = slt_files(filter.as_deref());
    let mut failures = vec![];
    let mut runs = 0;
    for file in &files {
        let header = std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        let stores: Vec<&str> = match header.strip_prefix("# state stores:") {
            Some(list) => list.split_whitespace().collect(),
            None => vec!["rocksdb"],
        };
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let has_checkpoints = text.contains("checkpointLocation")
            && !text
                .lines()
                .any(|l| l.starts_with("# killed and restarted: no"));
        let mut runs_of_file: Vec<(&str, bool)> = stores.iter().map(|s| (*s, false)).collect();
        if has_checkpoints {
            runs_of_file.push(("rocksdb", true));
        }
        for (store, killed) in runs_of_file {
            let backend = match store {
                "memory" => StateBackend::Memory,
                "rocksdb" => StateBackend::default(),
                other => panic!("{}: unknown state store '{other}'", file.display()),
            };
            runs += 1;
            let kills = killed.then(|| Arc::new(AtomicUsize::new(0)));
            let db_kills = kills.clone();
            let mut runner = sqllogictest::Runner::new(move || {
                let kills = db_kills.clone();
                async move {
                    let session = WeirSession::new();
                    session.set_state_store(backend);
                    Ok(WeirDb {
                        session,
                        queries: vec![],
                        kills,
                    })
                }
            });
            let result = runtime.block_on(async {
                let r = runner.run_file_async(file).await;
                runner.shutdown_async().await;
                r
            });
            let how = match &kills {
                Some(k) => format!(
                    "{store}, killed {} times and restarted",
                    k.load(Ordering::SeqCst)
                ),
                None => store.to_string(),
            };
            match result {
                Ok(())
                    if kills
                        .as_ref()
                        .is_some_and(|k| k.load(Ordering::SeqCst) == 0) =>
                {
                    println!("FAILED  {} ({how}): no query was killed", file.display());
                    failures.push(file.clone());
                }
                Ok(()) => println!("ok      {} ({how})", file.display()),
                Err(e) => {
                    println!("FAILED  {} ({how})\n{}", file.display(), e.display(false));
                    failures.push(file.clone());
                }
            }
        }
    }
    assert!(!files.is_empty() || filter.is_some(), "no .slt files found");
    if !failures.is_empty() {
        eprintln!("{} of {runs} sqllogictest runs failed", failures.len());
        std::process::exit(1);
    }
    println!("{runs} sqllogictest runs of {} files passed", files.len());
}
