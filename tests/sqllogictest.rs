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

#![expect(
    clippy::unwrap_used,
    reason = "a test fails loudly on any unexpected error"
)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use sqllogictest::{AsyncDB, DBOutput, DefaultColumnType};
use weir::datafusion::arrow::datatypes::DataType;
use weir::datafusion::arrow::record_batch::RecordBatch;
use weir::datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use weir::{ScriptOptions, StateBackend, StatementResult, StreamingQuery, WeirSession};

struct WeirDb {
    session: WeirSession,
    queries: Vec<StreamingQuery>,
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
                StatementResult::Done => DBOutput::StatementComplete(0),
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
        for store in stores {
            let backend = match store {
                "memory" => StateBackend::Memory,
                "rocksdb" => StateBackend::default(),
                other => panic!("{}: unknown state store '{other}'", file.display()),
            };
            runs += 1;
            let mut runner = sqllogictest::Runner::new(move || async move {
                let session = WeirSession::new();
                session.set_state_store(backend);
                Ok(WeirDb {
                    session,
                    queries: vec![],
                })
            });
            let result = runtime.block_on(async {
                let r = runner.run_file_async(file).await;
                runner.shutdown_async().await;
                r
            });
            match result {
                Ok(()) => println!("ok      {} ({store})", file.display()),
                Err(e) => {
                    println!("FAILED  {} ({store})\n{}", file.display(), e.display(false));
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
