//! The file source end to end: files that arrive while a query runs, from SQL and from Rust,
//! into stateless and stateful queries, and a restart that reads only the new files.

use std::path::Path;

use weir::datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use weir::datafusion::prelude::col;
use weir::{DataFrameStreamExt, StatementResult, StreamingQuery, WeirSession};

use crate::support;
use support::text_rows as rows;

/// Writes `name` whole: under a hidden name first, then renamed, as an uploader does.
fn land(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, dir.join(name)).unwrap();
}

fn query(r: StatementResult) -> StreamingQuery {
    match r {
        StatementResult::Query(q) => q,
        other => panic!("expected a query, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_read_files_infers_json_and_reads_files_that_land_while_it_runs() {
    let (dir, ck) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    land(
        dir.path(),
        "a.json",
        "{\"user\":\"ann\",\"n\":1}\n{\"user\":\"bob\",\"n\":2}\n",
    );
    let session = WeirSession::new();
    let sql = format!(
        "CREATE STREAMING TABLE totals OPTIONS (checkpointLocation '{}', outputMode 'complete') AS \
         SELECT user, sum(n) AS total, count(*) AS files_rows \
         FROM STREAM read_files('{}', format => 'json') GROUP BY user",
        ck.path().display(),
        dir.path().display()
    );
    let q = query(session.sql(&sql).await.unwrap());
    q.process_all_available().await.unwrap();
    assert_eq!(
        rows(&session, "SELECT * FROM totals ORDER BY user").await,
        vec!["ann,1,1", "bob,2,1"]
    );
    land(dir.path(), "b.json", "{\"user\":\"ann\",\"n\":10}\n");
    q.process_all_available().await.unwrap();
    assert_eq!(
        rows(&session, "SELECT * FROM totals ORDER BY user").await,
        vec!["ann,11,2", "bob,2,1"]
    );
    let p = q.last_progress().unwrap();
    assert_eq!(p.num_input_rows, 1);
    assert!(
        p.sources[0].description.starts_with("FileStreamSource["),
        "{}",
        p.sources[0].description
    );
    assert_eq!(
        p.sources[0].end_offset,
        Some(serde_json::json!({"logOffset": 1}))
    );
    q.stop().await;

    // Restarted: the state and the log are in the checkpoint; only the new file is read.
    land(dir.path(), "c.json", "{\"user\":\"cid\",\"n\":5}\n");
    let q = query(session.sql(&sql).await.unwrap());
    q.process_all_available().await.unwrap();
    assert_eq!(
        rows(&session, "SELECT * FROM totals ORDER BY user").await,
        vec!["ann,11,2", "bob,2,1", "cid,5,1"]
    );
    assert_eq!(q.last_progress().unwrap().num_input_rows, 1);
    q.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_api_reads_csv_with_a_given_schema_and_timestamps() {
    let (dir, ck) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let schema = Schema::new(vec![
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("page", DataType::Utf8, true),
    ]);
    land(
        dir.path(),
        "a.csv",
        "at,page\n2026-01-01T00:00:05Z,home\n2026-01-01T00:00:50Z,\n2026-01-01T00:01:10Z,docs\n",
    );
    let session = WeirSession::new();
    let q = session
        .read_stream()
        .format("csv")
        .option("header", true)
        .schema(&schema)
        .unwrap()
        .load_path(dir.path().to_str().unwrap())
        .unwrap()
        .filter(col("page").is_not_null())
        .unwrap()
        .write_stream()
        .unwrap()
        .format("memory")
        .query_name("visits")
        .checkpoint_location(ck.path().to_str().unwrap())
        .start()
        .await
        .unwrap();
    q.process_all_available().await.unwrap();
    land(dir.path(), "b.csv", "at,page\n2026-01-01T00:02:00Z,blog\n");
    q.process_all_available().await.unwrap();
    assert_eq!(
        rows(&session, "SELECT at, page FROM visits ORDER BY at").await,
        vec![
            "2026-01-01T00:00:05Z,home",
            "2026-01-01T00:01:10Z,docs",
            "2026-01-01T00:02:00Z,blog"
        ]
    );
    q.stop().await;

    // A schema with a type no file source reads is refused before anything runs.
    let odd = Schema::new(vec![Field::new("d", DataType::Float16, true)]);
    let err = session
        .read_stream()
        .format("csv")
        .schema(&odd)
        .unwrap_err();
    assert_eq!(err.error_class(), "INVALID_SCHEMA");
}
