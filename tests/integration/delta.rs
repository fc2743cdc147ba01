//! The Delta Lake sink and source end to end, on local folders: each batch one commit with the
//! query's `txn`, a streaming table feeding the next, complete mode, the source's starting
//! positions and rate limits, change commits, and a file → Delta query killed at every stage.

use std::sync::Arc;

use weir::datafusion::arrow::array::Int64Array;
use weir::datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use weir::datafusion::arrow::record_batch::RecordBatch;
use weir::datafusion::prelude::col;
use weir::{DataFrameStreamExt, MemoryStream, StatementResult, StreamingQuery, WeirSession};

use crate::support;
use support::{run_and_kill_at, text_rows as rows};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]))
}

fn batch(ks: &[i64]) -> RecordBatch {
    RecordBatch::try_new(schema(), vec![Arc::new(Int64Array::from(ks.to_vec()))]).unwrap()
}

fn query(r: StatementResult) -> StreamingQuery {
    match r {
        StatementResult::Query(q) => q,
        other => panic!("expected a query, got {other:?}"),
    }
}

/// Starts `events` → Delta table at `path` (append), named `name`.
async fn to_delta(session: &WeirSession, name: &str, path: &str, ck: &str) -> StreamingQuery {
    session
        .read_stream()
        .table("events")
        .unwrap()
        .write_stream()
        .unwrap()
        .format("delta")
        .option("path", path)
        .query_name(name)
        .checkpoint_location(ck)
        .start()
        .await
        .unwrap()
}

/// Runs `weir run -e sql --checkpoint ck extra...` to its end; it must succeed.
fn weir_run(sql: &str, ck: &str, extra: &[&str]) {
    let status = support::weir_command()
        .args(["run", "-e", sql, "--checkpoint", ck])
        .args(extra)
        .status()
        .unwrap();
    assert!(status.success());
}

/// A session where the Delta table at `path` is the table `name`.
async fn reading(name: &str, path: &str) -> WeirSession {
    let session = WeirSession::new();
    session
        .context()
        .sql(&format!(
            "CREATE EXTERNAL TABLE {name} STORED AS DELTA LOCATION '{path}'"
        ))
        .await
        .unwrap();
    session
}

/// The commit files of the table at `path`, in version order.
fn commits(path: &str) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(format!("{path}/_delta_log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_batch_is_one_commit_with_the_query_txn_and_a_streaming_table_feeds_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let path = |p: &str| dir.path().join(p).to_str().unwrap().to_string();
    let session = WeirSession::new();
    let events = MemoryStream::new("events", schema());
    session.register_memory_stream(&events);

    let bronze = to_delta(&session, "bronze", &path("bronze"), &path("ck1")).await;
    events.push(batch(&[1, 2, 3])).unwrap();
    bronze.process_all_available().await.unwrap();
    events.push(batch(&[4, 5])).unwrap();
    bronze.process_all_available().await.unwrap();
    assert_eq!(
        rows(&session, "SELECT k FROM bronze ORDER BY k").await,
        vec!["1", "2", "3", "4", "5"]
    );
    // Version 0 creates the table; each batch is one more commit, with the query's txn.
    let log = commits(&path("bronze"));
    assert_eq!(log.len(), 3, "{log:?}");
    let txn = format!("\"txn\":{{\"appId\":\"{}\",\"version\":1", bronze.id());
    assert!(log[2].contains(&txn), "{}", log[2]);

    // A second streaming table reads the first: its snapshot, then each new commit.
    let silver_sql = format!(
        "CREATE STREAMING TABLE silver USING delta LOCATION '{}' \
         OPTIONS (checkpointLocation '{}') AS SELECT k * 10 AS k10 FROM STREAM bronze",
        path("silver"),
        path("ck2")
    );
    let silver = query(session.sql(&silver_sql).await.unwrap());
    silver.process_all_available().await.unwrap();
    assert_eq!(
        rows(&session, "SELECT k10 FROM silver ORDER BY k10").await,
        vec!["10", "20", "30", "40", "50"]
    );
    events.push(batch(&[6])).unwrap();
    bronze.process_all_available().await.unwrap();
    silver.process_all_available().await.unwrap();
    assert_eq!(silver.last_progress().unwrap().num_input_rows, 1);
    assert!(
        silver.last_progress().unwrap().sources[0]
            .description
            .starts_with("DeltaSource["),
    );
    bronze.stop().await;
    silver.stop().await;

    // Both restart from their checkpoints: nothing is read or written twice.
    events.push(batch(&[7])).unwrap();
    let bronze = to_delta(&session, "bronze", &path("bronze"), &path("ck1")).await;
    bronze.process_all_available().await.unwrap();
    let silver = query(session.sql(&silver_sql).await.unwrap());
    silver.process_all_available().await.unwrap();
    assert_eq!(
        rows(&session, "SELECT k10 FROM silver ORDER BY k10").await,
        vec!["10", "20", "30", "40", "50", "60", "70"]
    );
    assert_eq!(
        rows(&session, "SELECT count(*), count(DISTINCT k) FROM bronze").await,
        vec!["7,7"]
    );
    bronze.stop().await;
    silver.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_table_already_has_is_skipped_when_replayed() {
    // The query is killed after the Delta commit and before its own commits log: the restart
    // replays the batch, and the sink finds the query's txn version in the table.
    let dir = tempfile::tempdir().unwrap();
    let (out, ck) = (dir.path().join("t"), dir.path().join("ck"));
    let (out, ck) = (out.to_str().unwrap(), ck.to_str().unwrap());
    let sql = format!(
        "CREATE STREAMING TABLE t USING delta LOCATION '{out}' AS \
         SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 10)"
    );
    run_and_kill_at(&sql, ck, "after_sink", 2);
    assert!(!dir.path().join("ck/commits/2").exists());
    weir_run(&sql, ck, &["--max-batches", "2"]);
    let session = reading("t", out).await;
    assert_eq!(
        rows(
            &session,
            "SELECT count(*), count(DISTINCT value), max(value) FROM t"
        )
        .await,
        vec!["40,40,39"]
    );
    // One commit per batch, none for the replay.
    assert_eq!(commits(out).len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_mode_rewrites_the_table_and_streaming_it_needs_skip_change_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = |p: &str| dir.path().join(p).to_str().unwrap().to_string();
    let session = WeirSession::new();
    let events = MemoryStream::new("events", schema());
    session.register_memory_stream(&events);
    let counts = session
        .read_stream()
        .table("events")
        .unwrap()
        .aggregate(
            vec![(col("k") % weir::datafusion::prelude::lit(2)).alias("parity")],
            vec![weir::datafusion::functions_aggregate::count::count(col("k")).alias("n")],
        )
        .unwrap()
        .write_stream()
        .unwrap()
        .format("delta")
        .option("path", path("counts"))
        .output_mode(weir::OutputMode::Complete)
        .query_name("counts")
        .checkpoint_location(path("ck"))
        .start()
        .await
        .unwrap();
    events.push(batch(&[1, 2, 3])).unwrap();
    counts.process_all_available().await.unwrap();
    events.push(batch(&[5])).unwrap();
    counts.process_all_available().await.unwrap();
    assert_eq!(
        rows(&session, "SELECT parity, n FROM counts ORDER BY parity").await,
        vec!["0,1", "1,3"]
    );
    counts.stop().await;

    // From version 0 on, the second batch's overwrite removes rows: refused by default.
    let stream = |extra: &str| {
        format!(
            "CREATE STREAMING TABLE copy{n} OPTIONS (checkpointLocation '{ck}') AS \
             SELECT parity, n FROM STREAM delta(path => '{src}', startingVersion => 0{extra})",
            n = extra.len(),
            ck = path(&format!("ck-copy{}", extra.len())),
            src = path("counts"),
        )
    };
    // One file per batch: the first commit's rows arrive before the overwrite fails the query
    // (the source does not read a commit beyond the batch it plans).
    let limited = ", maxFilesPerTrigger => 1";
    let refused = query(session.sql(&stream(limited)).await.unwrap());
    let err = refused.process_all_available().await.unwrap_err();
    assert_eq!(
        rows(
            &session,
            &format!(
                "SELECT parity, n FROM copy{} ORDER BY parity",
                limited.len()
            )
        )
        .await,
        vec!["0,1", "1,2"]
    );
    assert_eq!(
        err.cause_error_class(),
        "DELTA_SOURCE_TABLE_IGNORE_CHANGES",
        "{err}"
    );
    assert!(err.to_string().contains("skipChangeCommits"), "{err}");

    // With skipChangeCommits the overwrite is skipped whole: only the first batch's rows.
    let sql = stream(", skipChangeCommits => 'true'");
    let copy = query(session.sql(&sql).await.unwrap());
    copy.process_all_available().await.unwrap();
    let name = format!("copy{}", ", skipChangeCommits => 'true'".len());
    assert_eq!(
        rows(
            &session,
            &format!("SELECT parity, n FROM {name} ORDER BY parity")
        )
        .await,
        vec!["0,1", "1,2"]
    );
    copy.stop().await;
}

/// A Delta table at `path` with `n` commits after its creation, each of one file of two rows:
/// commit v holds 10 v and 10 v + 1.
async fn table_with_commits(
    session: &WeirSession,
    events: &MemoryStream,
    path: &str,
    ck: &str,
    n: i64,
) {
    let q = to_delta(session, "source_table", path, ck).await;
    for v in 1..=n {
        events.push(batch(&[10 * v, 10 * v + 1])).unwrap();
        q.process_all_available().await.unwrap();
    }
    q.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_starts_where_told_and_keeps_to_its_rate_limits() {
    let dir = tempfile::tempdir().unwrap();
    let path = |p: &str| dir.path().join(p).to_str().unwrap().to_string();
    let session = WeirSession::new();
    let events = MemoryStream::new("events", schema());
    session.register_memory_stream(&events);
    table_with_commits(&session, &events, &path("t"), &path("ck-t"), 4).await;

    let mut n = 0;
    let mut read = |options: &'static str| {
        n += 1;
        let sql = format!(
            "CREATE STREAMING TABLE r{n} OPTIONS (checkpointLocation '{}') AS \
             SELECT k FROM STREAM delta(path => '{}'{options})",
            path(&format!("ck{n}")),
            path("t")
        );
        (format!("r{n}"), sql)
    };
    let batches_with_rows = |q: &StreamingQuery| {
        q.recent_progress()
            .iter()
            .filter(|p| p.num_input_rows > 0)
            .map(|p| p.num_input_rows)
            .collect::<Vec<_>>()
    };

    // The snapshot, one file per batch.
    let (name, sql) = read(", maxFilesPerTrigger => 1");
    let q = query(session.sql(&sql).await.unwrap());
    q.process_all_available().await.unwrap();
    assert_eq!(batches_with_rows(&q), vec![2, 2, 2, 2]);
    assert_eq!(
        rows(&session, &format!("SELECT count(*) FROM {name}")).await,
        vec!["8"]
    );
    q.stop().await;

    // maxBytesPerTrigger smaller than a file: still one file per batch.
    let (_, sql) = read(", maxBytesPerTrigger => 1");
    let q = query(session.sql(&sql).await.unwrap());
    q.process_all_available().await.unwrap();
    assert_eq!(batches_with_rows(&q), vec![2, 2, 2, 2]);
    q.stop().await;

    // startingVersion: the changes from version 3 on (commits 3 and 4).
    let (name, sql) = read(", startingVersion => 3");
    let q = query(session.sql(&sql).await.unwrap());
    q.process_all_available().await.unwrap();
    assert_eq!(
        rows(&session, &format!("SELECT k FROM {name} ORDER BY k")).await,
        vec!["30", "31", "40", "41"]
    );
    q.stop().await;

    // startingVersion latest and a startingTimestamp in the future: only what comes next.
    let (latest, sql) = read(", startingVersion => 'latest'");
    let q_latest = query(session.sql(&sql).await.unwrap());
    let (future, sql) = read(", startingTimestamp => '2999-01-01'");
    let q_future = query(session.sql(&sql).await.unwrap());
    // A timestamp before the table: every change from version 0.
    let (past, sql) = read(", startingTimestamp => '2000-01-01 00:00:00'");
    let q_past = query(session.sql(&sql).await.unwrap());
    for q in [&q_latest, &q_future, &q_past] {
        q.process_all_available().await.unwrap();
    }
    assert!(
        rows(&session, &format!("SELECT k FROM {latest}"))
            .await
            .is_empty()
    );
    assert!(
        rows(&session, &format!("SELECT k FROM {future}"))
            .await
            .is_empty()
    );
    assert_eq!(
        rows(&session, &format!("SELECT count(*) FROM {past}")).await,
        vec!["8"]
    );
    table_with_commits(&session, &events, &path("t"), &path("ck-t"), 1).await;
    for q in [&q_latest, &q_future, &q_past] {
        q.process_all_available().await.unwrap();
    }
    for name in [&latest, &future] {
        assert_eq!(
            rows(&session, &format!("SELECT k FROM {name} ORDER BY k")).await,
            vec!["10", "11"],
            "{name}"
        );
    }
    assert_eq!(
        rows(&session, &format!("SELECT count(*) FROM {past}")).await,
        vec!["10"]
    );
    for q in [q_latest, q_future, q_past] {
        q.stop().await;
    }

    // From Rust: format("delta").load_path(dir), the whole table (5 commits now).
    let q = session
        .read_stream()
        .format("delta")
        .option("maxFilesPerTrigger", 2)
        .load_path(&path("t"))
        .unwrap()
        .write_stream()
        .unwrap()
        .format("memory")
        .query_name("from_rust")
        .checkpoint_location(path("ck-rust"))
        .start()
        .await
        .unwrap();
    q.process_all_available().await.unwrap();
    assert_eq!(batches_with_rows(&q), vec![4, 4, 2]);
    assert_eq!(
        rows(&session, "SELECT count(*) FROM from_rust").await,
        vec!["10"]
    );
    q.stop().await;

    // Options are checked when the query is planned.
    let err = session
        .sql(&format!(
            "SELECT k FROM STREAM delta(path => '{}', startingVersion => 1, startingTimestamp => '2020-01-01')",
            path("t")
        ))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("DELTA_STARTING_VERSION_AND_TIMESTAMP_BOTH_SET"),
        "{err}"
    );
    let err = session
        .sql(&format!(
            "SELECT k FROM STREAM delta(path => '{}')",
            path("nothing")
        ))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("DELTA_MISSING_DELTA_TABLE"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_whose_output_does_not_fit_the_table_is_refused_before_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = |p: &str| dir.path().join(p).to_str().unwrap().to_string();
    let session = WeirSession::new();
    let events = MemoryStream::new("events", schema());
    session.register_memory_stream(&events);
    table_with_commits(&session, &events, &path("t"), &path("ck-t"), 1).await;
    let err = session
        .read_stream()
        .table("events")
        .unwrap()
        .select(vec![col("k").alias("other")])
        .unwrap()
        .write_stream()
        .unwrap()
        .format("delta")
        .option("path", path("t"))
        .checkpoint_location(path("ck2"))
        .start()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("DELTA_METADATA_MISMATCH"), "{err}");
    assert!(err.to_string().contains("'other'"), "{err}");
    assert_eq!(commits(&path("t")).len(), 2, "nothing was written");
}

const STAGES: &[&str] = &[
    "before_wal",
    "after_wal",
    "after_get_batch",
    "after_sink",
    "after_commit",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_stage_a_file_to_delta_query_writes_every_row_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    let (out, ck) = (dir.path().join("out"), dir.path().join("ck"));
    let (out, ck) = (out.to_str().unwrap(), ck.to_str().unwrap());
    let sql = format!(
        "CREATE STREAMING TABLE moved USING delta LOCATION '{out}' AS \
         SELECT id, file FROM STREAM read_files('{}', format => 'json', \
         schema => 'id BIGINT, file BIGINT', maxFilesPerTrigger => 1)",
        input.display()
    );
    let write = |i: i64| {
        let lines: String = (10 * i..10 * i + 10)
            .map(|id| format!("{{\"id\":{id},\"file\":{i}}}\n"))
            .collect();
        let tmp = input.join(format!(".f{i:03}.tmp"));
        std::fs::write(&tmp, lines).unwrap();
        std::fs::rename(tmp, input.join(format!("f{i:03}.json"))).unwrap();
    };
    let mut files = 0;
    for _ in 0..3 {
        write(files);
        files += 1;
    }
    for i in 0..12u64 {
        write(files);
        files += 1;
        run_and_kill_at(&sql, ck, STAGES[i as usize % STAGES.len()], i + 1);
    }
    weir_run(&sql, ck, &["--trigger", "availableNow"]);
    let session = reading("moved", out).await;
    let ids = files * 10;
    assert_eq!(
        rows(
            &session,
            "SELECT count(*), count(DISTINCT id), min(id), max(id), count(DISTINCT file) FROM moved"
        )
        .await,
        vec![format!("{ids},{ids},0,{},{files}", ids - 1)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_table_streams_back_with_its_partition_values_and_an_empty_result_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = |p: &str| dir.path().join(p).to_str().unwrap().to_string();
    // Partitioned by a string and a number, with a space in a value (escaped in the log).
    let write = format!(
        "CREATE STREAMING TABLE parts USING delta LOCATION '{}' \
         OPTIONS (partitionBy 'day,bucket') AS \
         SELECT value, CASE WHEN value % 2 = 0 THEN 'even day' ELSE 'odd' END AS day, \
         value % 3 AS bucket FROM STREAM rate_micro_batch(rowsPerBatch => 6)",
        path("parts")
    );
    weir_run(&write, &path("ck"), &["--max-batches", "2"]);
    assert!(
        dir.path().join("parts/day=even day").is_dir()
            || dir.path().join("parts/day=even%20day").is_dir()
    );
    let copy = format!(
        "CREATE STREAMING TABLE copy USING delta LOCATION '{}' AS \
         SELECT value, day, bucket FROM STREAM delta(path => '{}')",
        path("copy"),
        path("parts")
    );
    weir_run(&copy, &path("ck-copy"), &["--trigger", "availableNow"]);
    let session = reading("copy", &path("copy")).await;
    let got = rows(
        &session,
        "SELECT count(*), sum(value), \
         sum(CASE WHEN (value % 2 = 0) = (day = 'even day') THEN 1 ELSE 0 END), \
         sum(CASE WHEN value % 3 = bucket THEN 1 ELSE 0 END) FROM copy",
    )
    .await;
    assert_eq!(got, vec!["12,66,12,12"]);

    // Complete mode with an empty result: each batch still commits (an empty overwrite with the
    // query's txn), where delta-rs refuses a write without batches.
    let empty = format!(
        "CREATE STREAMING TABLE e USING delta LOCATION '{}' OPTIONS (outputMode 'complete') AS \
         SELECT value % 2 AS k, count(*) AS n FROM STREAM rate_micro_batch(rowsPerBatch => 4) \
         WHERE value < 0 GROUP BY value % 2",
        path("e")
    );
    weir_run(&empty, &path("ck-e"), &["--max-batches", "2"]);
    let session = reading("e", &path("e")).await;
    assert_eq!(rows(&session, "SELECT count(*) FROM e").await, vec!["0"]);
    let log = commits(&path("e"));
    assert_eq!(
        log.len(),
        3,
        "the table's creation and one commit per batch"
    );
    assert!(log[2].contains("\"txn\":{\"appId\""), "{}", log[2]);
}

/// As Spark's Delta sink, a batch with no rows still commits the query's `txn`: in append mode
/// too the table's record of the query ends at the checkpoint's last committed batch. So a lost
/// newest commit is refused at restart (a batch would otherwise be lost silently), and a
/// windowed count whose append-mode batches emitted nothing yet can go on in complete mode.
#[test]
fn an_empty_append_batch_commits_its_txn_so_a_lost_commit_is_refused_and_modes_can_change() {
    let dir = tempfile::tempdir().unwrap();
    let (out, ck) = (dir.path().join("t"), dir.path().join("ck"));
    let (out_s, ck_s) = (out.to_str().unwrap(), ck.to_str().unwrap());
    let sql = |mode: &str| {
        format!(
            "CREATE STREAMING TABLE t USING delta LOCATION '{out_s}' OPTIONS (outputMode \
             '{mode}') AS SELECT count(*) AS n FROM STREAM rate_micro_batch(rowsPerBatch => 2) \
             WATERMARK timestamp DELAY OF INTERVAL 0 SECONDS GROUP BY window(timestamp, '10 \
             seconds')"
        )
    };
    // Three batches 1 s apart: the first 10-second window is still open, so each emits nothing.
    weir_run(&sql("append"), ck_s, &["--max-batches", "3"]);
    let log = commits(out_s);
    assert_eq!(
        log.len(),
        4,
        "the table's creation and one commit per batch: {log:?}"
    );
    for (batch, commit) in log[1..].iter().enumerate() {
        assert!(
            commit.contains("\"txn\"") && commit.contains(&format!("\"version\":{batch}")),
            "{commit}"
        );
        assert!(!commit.contains("\"add\""), "{commit}");
    }

    // The newest commit lost: the checkpoint's batch 2 is not in the table.
    let saved = dir.path().join("saved");
    std::fs::create_dir(&saved).unwrap();
    let newest = out.join("_delta_log/00000000000000000003.json");
    std::fs::copy(&newest, saved.join("3.json")).unwrap();
    std::fs::remove_file(&newest).unwrap();
    let o = support::weir_command()
        .args([
            "run",
            "-e",
            &sql("append"),
            "--checkpoint",
            ck_s,
            "--max-batches",
            "1",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("DELTA_STREAMING_TXN_MISSING") && err.contains("00000000000000000003.json"),
        "{err}"
    );
    assert!(!ck.join("offsets/3").exists());

    // Put back, the query goes on in complete mode: the count of the open window so far.
    std::fs::copy(saved.join("3.json"), &newest).unwrap();
    weir_run(&sql("complete"), ck_s, &["--max-batches", "1"]);
    let o = support::weir_command()
        .args([
            "run",
            "-e",
            &format!("CREATE EXTERNAL TABLE c STORED AS DELTA LOCATION '{out_s}'; SELECT n FROM c"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        text.contains("| 8 |"),
        "four batches of two rows in one window: {text}"
    );
}
