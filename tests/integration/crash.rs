//! Crash test: the real `weir` binary writes a parquet sink from `rate-micro-batch` and is
//! killed with SIGKILL at 24 points spread over every stage of the micro-batch loop, restarted
//! each time; the sink must end up holding every value exactly once.

use std::process::Command;

use weir::datafusion::arrow::array::{Array, Int64Array};
use weir::{StatementResult, WeirSession};

use crate::support;
use support::run_and_kill_at;

const ROWS_PER_BATCH: i64 = 50;
const STAGES: &[&str] = &[
    "before_wal",
    "after_wal",
    "after_get_batch",
    "sink_mid",
    "after_sink",
    "after_commit",
];

fn weir(sql: &str, ck: &str, extra: &[&str]) -> Command {
    let mut c = support::weir_command();
    c.args(["run", "-e", sql, "--checkpoint", ck]).args(extra);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_stage_of_the_loop_the_parquet_sink_holds_every_value_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let ck = dir.path().join("ck");
    let (out, ck) = (out.to_str().unwrap(), ck.to_str().unwrap());
    let sql = format!(
        "CREATE STREAMING TABLE crash USING parquet LOCATION '{out}' AS \
         SELECT value, timestamp FROM STREAM rate_micro_batch(rowsPerBatch => {ROWS_PER_BATCH}, numPartitions => 2)"
    );
    let mut kills = 0;
    for i in 0..24u64 {
        let stage = STAGES[i as usize % STAGES.len()];
        run_and_kill_at(&sql, ck, stage, i + 1);
        kills += 1;
    }
    assert!(kills >= 20);
    let status = weir(&sql, ck, &["--max-batches", "3"]).status().unwrap();
    assert!(status.success());

    let committed = std::fs::read_dir(format!("{ck}/commits"))
        .unwrap()
        .map(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .parse::<i64>()
                .unwrap()
        })
        .max()
        .unwrap()
        + 1;
    let mid_sink_kills = (0..24)
        .filter(|i| STAGES[i % STAGES.len()] == "sink_mid")
        .count() as i64;
    let session = WeirSession::new();
    session
        .context()
        .sql(&format!(
            "CREATE EXTERNAL TABLE crashed STORED AS PARQUET LOCATION '{out}'"
        ))
        .await
        .unwrap();
    let r = session
        .sql("SELECT count(*) AS n, count(DISTINCT value) AS d, min(value) AS lo, max(value) AS hi FROM crashed")
        .await
        .unwrap();
    let StatementResult::Rows(rows) = r else {
        panic!("expected rows")
    };
    let get = |i: usize| {
        rows[0]
            .column(i)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .value(0)
    };
    let (n, d, lo, hi) = (get(0), get(1), get(2), get(3));
    let expected = committed * ROWS_PER_BATCH;
    assert_eq!(n, expected, "rows in the sink vs committed batches");
    assert_eq!(d, n, "no value twice");
    assert_eq!((lo, hi), (0, expected - 1), "no gap");
    // Every batch wrote one part file; each kill during the sink write left one more that no
    // manifest lists, and the reader ignored it.
    let on_disk = std::fs::read_dir(out)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".parquet")
        })
        .count() as i64;
    assert_eq!(on_disk, committed + mid_sink_kills, "part files on disk");
    assert!(rows[0].column(0).len() == 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_of_a_sink_folder_never_sees_the_part_file_of_a_crashed_first_batch() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let ck = dir.path().join("ck");
    let (out, ck) = (out.to_str().unwrap(), ck.to_str().unwrap());
    let sql = format!(
        "CREATE STREAMING TABLE first USING parquet LOCATION '{out}' AS \
         SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => {ROWS_PER_BATCH})"
    );
    // Killed after batch 0's part file is written, before any manifest entry exists.
    run_and_kill_at(&sql, ck, "sink_mid", 0);
    let session = WeirSession::new();
    session
        .context()
        .sql(&format!(
            "CREATE EXTERNAL TABLE early STORED AS PARQUET LOCATION '{out}'"
        ))
        .await
        .unwrap();
    let count = || async {
        let r = session.sql("SELECT count(*) FROM early").await.unwrap();
        let StatementResult::Rows(rows) = r else {
            panic!("expected rows")
        };
        rows[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .value(0)
    };
    assert_eq!(count().await, 0, "the uncommitted part file was read");
    let status = weir(&sql, ck, &["--max-batches", "1"]).status().unwrap();
    assert!(status.success());
    // The same table, created before the restart, now sees the replayed batch exactly once.
    assert_eq!(count().await, ROWS_PER_BATCH);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_stage_a_windowed_aggregation_emits_every_window_once_and_whole() {
    windowed_aggregation_survives_kills("").await;
}

/// With asynchronous state checkpointing a kill can leave two batches uncommitted (the second
/// planned while the first's state was being written): both are re-run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_async_state_checkpointing_a_windowed_aggregation_survives_every_kill() {
    windowed_aggregation_survives_kills("OPTIONS (asyncStateCheckpoint 'true')").await;
}

async fn windowed_aggregation_survives_kills(options: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let ck = dir.path().join("ck");
    let (out, ck) = (out.to_str().unwrap(), ck.to_str().unwrap());
    // Batch b's rows are values 50b..50b+49 at b seconds; a window holds 5 batches and is
    // final once the watermark (the last event time, no delay) reaches its end.
    let sql = format!(
        "CREATE STREAMING TABLE windows USING parquet LOCATION '{out}' {options} AS \
         SELECT window(timestamp, '5 seconds') AS w, count(*) AS n, sum(value) AS s \
         FROM STREAM rate_micro_batch(rowsPerBatch => {ROWS_PER_BATCH}, numPartitions => 2) \
         WATERMARK timestamp DELAY OF INTERVAL 0 SECONDS \
         GROUP BY window(timestamp, '5 seconds')"
    );
    let stages: Vec<&str> = STAGES.iter().copied().chain(["state_committed"]).collect();
    let (mut kills, mut batch) = (0, 1u64);
    for i in 0..21usize {
        let stage = stages[i % stages.len()];
        // Only batches that finalise a window (6, 11, 16, ...: batch b evicts with the
        // watermark b - 1 s) write a part file.
        batch = match stage {
            "sink_mid" => (batch + 1).div_ceil(5) * 5 + 1,
            _ => batch + 1,
        };
        run_and_kill_at(&sql, ck, stage, batch);
        kills += 1;
    }
    assert!(kills >= 20);
    let status = weir(&sql, ck, &["--max-batches", "6"]).status().unwrap();
    assert!(status.success());
    // Every run, killed or not, kept its RocksDB instances in the one folder of the query's
    // checkpoint on this machine, for the next run to reuse (or rebuild where the kill left
    // them ahead of or apart from the checkpoint): nothing else piles up.
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(format!("{ck}/metadata")).unwrap()).unwrap();
    let prefix = format!("weir-state-{}-", meta["id"].as_str().unwrap());
    let left: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(
        left.len() == 1 && left[0].contains("-at-"),
        "local state folders: {left:?}"
    );

    let session = WeirSession::new();
    session
        .context()
        .sql(&format!(
            "CREATE EXTERNAL TABLE windows STORED AS PARQUET LOCATION '{out}'"
        ))
        .await
        .unwrap();
    let r = session
        .sql(
            "SELECT CAST(to_unixtime(w['start']) AS BIGINT) / 5 AS k, n, s FROM windows \
             ORDER BY k",
        )
        .await
        .unwrap();
    let StatementResult::Rows(rows) = r else {
        panic!("expected rows")
    };
    let mut windows = vec![];
    for b in &rows {
        let col = |i: usize| {
            b.column(i)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .clone()
        };
        let (k, n, s) = (col(0), col(1), col(2));
        for r in 0..b.num_rows() {
            windows.push((k.value(r), n.value(r), s.value(r)));
        }
    }
    // Every window from the first on, once, with all its rows and nothing else.
    let rows5 = 5 * ROWS_PER_BATCH;
    assert!(windows.len() >= 4, "{windows:?}");
    for (i, (k, n, s)) in windows.iter().enumerate() {
        assert_eq!(
            *k, i as i64,
            "windows in order, none missing or twice: {windows:?}"
        );
        assert_eq!(*n, rows5, "window {k} has every row once");
        assert_eq!(
            *s,
            rows5 * rows5 * k + rows5 * (rows5 - 1) / 2,
            "window {k}'s sum"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_stage_a_deduplication_keeps_each_key_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let ck = dir.path().join("ck");
    let (out, ck) = (out.to_str().unwrap(), ck.to_str().unwrap());
    // Key value / 3: three consecutive values per key, and a batch of 50 splits some keys, so
    // a key's later rows meet its stored first row in the next batch.
    let sql = format!(
        "CREATE STREAMING TABLE firsts USING parquet LOCATION '{out}' AS \
         SELECT DISTINCT ON (k) k, value FROM (SELECT value / 3 AS k, value \
         FROM STREAM rate_micro_batch(rowsPerBatch => {ROWS_PER_BATCH}, numPartitions => 2))"
    );
    let stages: Vec<&str> = STAGES.to_vec();
    let mut kills = 0;
    for i in 0..21u64 {
        run_and_kill_at(&sql, ck, stages[i as usize % stages.len()], i + 1);
        kills += 1;
    }
    assert!(kills >= 20);
    let status = weir(&sql, ck, &["--max-batches", "2"]).status().unwrap();
    assert!(status.success());
    let committed = std::fs::read_dir(format!("{ck}/commits")).unwrap().count() as i64;

    let session = WeirSession::new();
    session
        .context()
        .sql(&format!(
            "CREATE EXTERNAL TABLE firsts STORED AS PARQUET LOCATION '{out}'"
        ))
        .await
        .unwrap();
    let r = session
        .sql(
            "SELECT count(*), count(DISTINCT k), min(k), max(k), \
             sum(CASE WHEN value / 3 = k THEN 1 ELSE 0 END) FROM firsts",
        )
        .await
        .unwrap();
    let StatementResult::Rows(rows) = r else {
        panic!("expected rows")
    };
    let get = |i: usize| {
        rows[0]
            .column(i)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .value(0)
    };
    // The checkpoint keeps the newest batches only; the last one committed is the highest.
    let last = std::fs::read_dir(format!("{ck}/commits"))
        .unwrap()
        .map(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .parse::<i64>()
                .unwrap()
        })
        .max()
        .unwrap();
    assert!(committed >= 1);
    let values = (last + 1) * ROWS_PER_BATCH;
    let keys = (values - 1) / 3 + 1;
    assert_eq!(get(0), keys, "one row per key");
    assert_eq!(get(1), keys, "no key twice");
    assert_eq!((get(2), get(3)), (0, keys - 1), "no key missing");
    // Which of a key's rows is first depends on the order partitions are read in (as in Spark),
    // but it is always one of the key's own rows.
    assert_eq!(get(4), keys, "each row under its own key");
}

/// Writes input file `i` of the file-source crash test: ten JSON lines, ids `10 i .. 10 i + 9`.
fn write_input_file(dir: &std::path::Path, i: i64) {
    let lines: String = (10 * i..10 * i + 10)
        .map(|id| format!("{{\"id\":{id},\"file\":{i}}}\n"))
        .collect();
    // Written under a hidden name, then renamed: a file appears whole, as from an uploader.
    let tmp = dir.join(format!(".f{i:03}.json.tmp"));
    std::fs::write(&tmp, lines).unwrap();
    std::fs::rename(tmp, dir.join(format!("f{i:03}.json"))).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_stage_a_file_source_moves_every_file_into_the_sink_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (input, archive) = (dir.path().join("in"), dir.path().join("archive"));
    std::fs::create_dir_all(&input).unwrap();
    let out = dir.path().join("out");
    let ck = dir.path().join("ck");
    let (out, ck) = (out.to_str().unwrap(), ck.to_str().unwrap());
    let sql = format!(
        "CREATE STREAMING TABLE moved USING parquet LOCATION '{out}' AS \
         SELECT id, file FROM STREAM read_files('{}', format => 'json', \
         schema => 'id BIGINT, file BIGINT', maxFilesPerTrigger => 1, \
         cleanSource => 'archive', sourceArchiveDir => '{}')",
        input.display(),
        archive.display()
    );
    let mut files = 0;
    for _ in 0..4 {
        write_input_file(&input, files);
        files += 1;
    }
    // One file per batch; a new file arrives before every restart.
    for i in 0..18u64 {
        write_input_file(&input, files);
        files += 1;
        run_and_kill_at(&sql, ck, STAGES[i as usize % STAGES.len()], i + 1);
    }
    let status = weir(&sql, ck, &["--trigger", "availableNow"])
        .status()
        .unwrap();
    assert!(status.success());

    let session = WeirSession::new();
    session
        .context()
        .sql(&format!(
            "CREATE EXTERNAL TABLE moved STORED AS PARQUET LOCATION '{out}'"
        ))
        .await
        .unwrap();
    let StatementResult::Rows(rows) = session
        .sql("SELECT count(*), count(DISTINCT id), min(id), max(id), count(DISTINCT file) FROM moved")
        .await
        .unwrap()
    else {
        panic!("expected rows")
    };
    let get = |i: usize| {
        rows[0]
            .column(i)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .value(0)
    };
    let ids = files * 10;
    assert_eq!(get(0), ids, "every row once");
    assert_eq!(get(1), ids, "no row twice");
    assert_eq!((get(2), get(3)), (0, ids - 1), "no gap");
    assert_eq!(get(4), files, "every file");
    // Every file was committed, so every file was archived, at its own name.
    let left: Vec<_> = std::fs::read_dir(&input)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| !n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(left.is_empty(), "files left in the source folder: {left:?}");
    assert_eq!(std::fs::read_dir(&archive).unwrap().count() as i64, files);
}
