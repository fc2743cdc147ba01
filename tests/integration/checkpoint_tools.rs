//! `weir checkpoint` tools against real checkpoints written by `weir run`.

use std::process::Output;

use crate::support;
use support::{kill_at, run_and_kill_at};

fn weir(args: &[&str]) -> Output {
    support::weir_command().args(args).output().unwrap()
}

/// Every file under `dir`, with its size.
fn files(dir: &std::path::Path) -> Vec<(String, u64)> {
    support::files(dir)
        .into_iter()
        .map(|p| {
            let size = std::fs::metadata(&p).unwrap().len();
            (p.display().to_string(), size)
        })
        .collect()
}

/// The query of [`killed_aggregation`], writing to `<dir>/<out>`, with `select` and `group` as
/// its projection and grouping.
fn aggregation_sql(
    dir: &std::path::Path,
    out: &str,
    source: &str,
    select: &str,
    group: &str,
) -> String {
    format!(
        "CREATE STREAMING TABLE c USING delta LOCATION '{}' OPTIONS (outputMode 'complete') AS \
         SELECT {select} FROM STREAM {source} {group}",
        dir.join(out).display()
    )
}

const RATE: &str = "rate_micro_batch(rowsPerBatch => 10)";

/// A checkpoint `<dir>/ck` of a `GROUP BY` into a Delta table at `<dir>/out`: batches 0..2
/// committed, batch 3 logged and killed before its commit. Returns the checkpoint's path.
fn killed_aggregation(dir: &std::path::Path) -> String {
    let ck = dir.join("ck").to_str().unwrap().to_string();
    let sql = aggregation_sql(
        dir,
        "out",
        RATE,
        "value % 3 AS k, count(*) AS n",
        "GROUP BY value % 3",
    );
    run_and_kill_at(&sql, &ck, "after_sink", 3);
    remove_killed_runs_state(&ck);
    ck
}

/// Removes the local state folders killed runs of the checkpoint's query left (the query's next
/// run would; these tests never run it again).
fn remove_killed_runs_state(ck: &str) {
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(format!("{ck}/metadata")).unwrap()).unwrap();
    let prefix = format!("weir-state-{}-", meta["id"].as_str().unwrap());
    for e in std::fs::read_dir(std::env::temp_dir()).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// `weir checkpoint validate ck <sql>`, the SQL written to a file in `dir`: exit status and
/// the JSON report.
fn validate(dir: &std::path::Path, ck: &str, sql: &str) -> (bool, serde_json::Value) {
    let file = dir.join("query.sql");
    std::fs::write(&file, sql).unwrap();
    let out = weir(&[
        "checkpoint",
        "validate",
        ck,
        file.to_str().unwrap(),
        "--json",
    ]);
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no report ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), report)
}

fn classes(report: &serde_json::Value) -> Vec<String> {
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["errorClass"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn validate_accepts_the_same_query_and_a_new_filter_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ck = killed_aggregation(dir.path());
    let before = files(&dir.path().join("ck"));

    let same = aggregation_sql(
        dir.path(),
        "out",
        RATE,
        "value % 3 AS k, count(*) AS n",
        "GROUP BY value % 3",
    );
    let (ok, r) = validate(dir.path(), &ck, &same);
    assert!(ok, "{r:#}");
    assert_eq!(r["accepted"], true);
    assert_eq!(r["lastCommitted"], 2);
    assert_eq!(r["nextBatch"], 3, "the pending batch runs again");
    assert_eq!(r["sources"][0]["change"], "same");
    assert_eq!(r["sink"]["change"], "same");
    assert_eq!(r["operators"][0]["change"], "same");
    assert_eq!(r["problems"], serde_json::json!([]));

    let filtered = aggregation_sql(
        dir.path(),
        "out",
        RATE,
        "value % 3 AS k, count(*) AS n",
        "WHERE value >= 0 GROUP BY value % 3",
    );
    let (ok, r) = validate(dir.path(), &ck, &filtered);
    assert!(ok, "a filter keeps the state's meaning: {r:#}");

    let file = dir.path().join("query.sql");
    let text = weir(&["checkpoint", "validate", &ck, file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("verdict     ACCEPTED"), "{text}");
    assert!(text.contains("[0] same     aggregate"), "{text}");

    // A renamed output column keeps the state but no longer fits the Delta table, which the
    // sink would refuse when it opens.
    let renamed = aggregation_sql(
        dir.path(),
        "out",
        RATE,
        "value % 3 AS key, count(*) AS n",
        "GROUP BY value % 3",
    );
    let table = files(&dir.path().join("out"));
    let (ok, r) = validate(dir.path(), &ck, &renamed);
    assert!(!ok);
    assert_eq!(classes(&r), ["DELTA_METADATA_MISMATCH"], "{r:#}");
    assert_eq!(r["operators"][0]["change"], "same");
    assert_eq!(
        files(&dir.path().join("out")),
        table,
        "the table is untouched"
    );
    assert_eq!(
        files(&dir.path().join("ck")),
        before,
        "validate wrote nothing"
    );
}

#[test]
fn validate_lists_every_check_that_refuses_a_changed_query_as_a_restart_would() {
    let dir = tempfile::tempdir().unwrap();
    let ck = killed_aggregation(dir.path());
    let before = files(&dir.path().join("ck"));

    // Another source, another output table, and a grouping key of another type: three problems
    // at once, where a restart stops at the first.
    let changed = aggregation_sql(
        dir.path(),
        "elsewhere",
        "rate(rowsPerSecond => 10)",
        "CAST(value % 3 AS VARCHAR) AS k, count(*) AS n",
        "GROUP BY CAST(value % 3 AS VARCHAR)",
    );
    let (ok, r) = validate(dir.path(), &ck, &changed);
    assert!(!ok, "{r:#}");
    assert_eq!(r["accepted"], false);
    assert_eq!(
        classes(&r),
        [
            "STREAMING_QUERY_SOURCES_CHANGED",
            "STREAMING_SINK_CHANGED",
            "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"
        ]
    );
    assert!(
        !dir.path().join("elsewhere").exists(),
        "validating creates no output folder"
    );
    let parquet = format!(
        "CREATE STREAMING TABLE p USING parquet LOCATION '{}' AS SELECT value FROM STREAM {RATE}",
        dir.path().join("parquet-out").display()
    );
    let (ok, _) = validate(dir.path(), &ck, &parquet);
    assert!(!ok);
    assert!(
        !dir.path().join("parquet-out").exists(),
        "nor a file sink's"
    );
    assert_eq!(r["sources"][0]["change"], "changed");
    assert_eq!(r["sources"][0]["checkpoint"], "rate-micro-batch");
    assert_eq!(r["sources"][0]["query"], "rate");
    assert_eq!(r["sink"]["change"], "changed");
    let op = &r["operators"][0];
    assert_eq!(op["change"], "changed");
    assert_eq!(
        op["differences"],
        serde_json::json!(["key schema", "definition"])
    );
    assert!(
        op["checkpoint"]["keySchema"]
            .as_str()
            .unwrap()
            .contains("BIGINT"),
        "{op}"
    );
    assert!(
        op["query"]["keySchema"]
            .as_str()
            .unwrap()
            .contains("STRING"),
        "{op}"
    );

    // A restart of the same query is refused with the first of them.
    let run = support::weir_command()
        .args([
            "run",
            "--checkpoint",
            &ck,
            "--max-batches",
            "1",
            "-e",
            &changed,
        ])
        .output()
        .unwrap();
    assert!(!run.status.success());
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("STREAMING_QUERY_SOURCES_CHANGED"),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );

    // The aggregation removed (Spark's §1b `no_groupby`).
    let (ok, r) = validate(
        dir.path(),
        &ck,
        &aggregation_sql(dir.path(), "out", RATE, "value % 3 AS k, value AS n", "")
            .replace("'complete'", "'append'"),
    );
    assert!(!ok);
    assert_eq!(
        classes(&r),
        ["STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA"]
    );
    assert_eq!(r["operators"][0]["change"], "removed");
    assert_eq!(r["operators"][0]["checkpoint"]["operatorName"], "aggregate");

    // The aggregate function changed (count -> sum): the state has the same shape but another
    // meaning.
    let file = dir.path().join("query.sql");
    std::fs::write(
        &file,
        aggregation_sql(
            dir.path(),
            "out",
            RATE,
            "value % 3 AS k, sum(value) AS n",
            "GROUP BY value % 3",
        ),
    )
    .unwrap();
    let out = weir(&["checkpoint", "validate", &ck, file.to_str().unwrap()]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("verdict     REFUSED"), "{text}");
    assert!(
        text.contains("[0] changed  aggregate: definition"),
        "{text}"
    );
    assert!(
        text.contains("STATEFUL_OPERATOR_DEFINITION_CHANGED"),
        "{text}"
    );

    assert_eq!(
        files(&dir.path().join("ck")),
        before,
        "neither validate nor the refused restart changed the checkpoint"
    );
}

#[test]
fn validate_refuses_a_missing_checkpoint_and_a_script_without_a_streaming_query() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("q.sql");
    std::fs::write(&file, format!("SELECT value FROM STREAM {RATE}")).unwrap();
    let missing = dir.path().join("missing");
    let out = weir(&[
        "checkpoint",
        "validate",
        missing.to_str().unwrap(),
        file.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CHECKPOINT_NOT_FOUND"));
    assert!(!missing.exists(), "no folder was created");

    let ck = killed_aggregation(dir.path());
    std::fs::write(&file, "SELECT 1").unwrap();
    let out = weir(&["checkpoint", "validate", &ck, file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("starts no streaming query"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn inspect_reports_batches_sources_and_operators_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ck = killed_aggregation(dir.path());
    let ck = ck.as_str();
    let before = files(dir.path());

    let out = weir(&["checkpoint", "inspect", ck, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["offsets"], serde_json::json!([0, 3]));
    assert_eq!(r["lastCommitted"], 2);
    assert_eq!(r["sink"]["format"], "delta");
    assert!(
        r["sink"]["identity"].as_str().unwrap().ends_with("/out/"),
        "{}",
        r["sink"]
    );
    assert_eq!(r["pending"], 3);
    let source = &r["sources"][0];
    assert_eq!(source["source"], "rate-micro-batch");
    assert_eq!(source["committedOffset"]["offset"], 30);
    assert_eq!(source["pendingOffset"]["offset"], 40);
    let op = &r["operators"][0];
    assert_eq!(op["operatorName"], "aggregate");
    assert_eq!(op["numPartitions"], 2);
    assert!(op["stateBytes"].as_u64().unwrap() > 0, "{op}");
    // Versions 1..3 are committed; batch 3 wrote version 4 before it was killed.
    assert_eq!(op["versions"], serde_json::json!([1, 4]));
    // Its retention window: the committed batches whose state is kept.
    assert_eq!(op["batches"], serde_json::json!([0, 2]));
    assert!(
        op["valueSchema"].as_str().unwrap().contains("BIGINT"),
        "{op}"
    );
    assert_eq!(r["conf"]["weir.sql.shuffle.partitions"], "2");

    let table = weir(&["checkpoint", "inspect", ck]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("last committed 2; batch 3 pending"), "{text}");
    assert!(text.contains("[0] aggregate  partitions 2"), "{text}");
    assert!(text.contains("retained for batches 0..2"), "{text}");
    assert_eq!(files(dir.path()), before, "inspect wrote nothing");
}

#[test]
fn inspect_refuses_what_is_not_a_checkpoint_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let out = weir(&["checkpoint", "inspect", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CHECKPOINT_NOT_FOUND"));
    assert!(!missing.exists(), "no folder was created");

    std::fs::write(dir.path().join("notes.txt"), "hello").unwrap();
    let out = weir(&["checkpoint", "inspect", dir.path().to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("CHECKPOINT_LOCATION_NOT_WEIR"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn read_state_metadata_lists_each_operator_store_and_the_batches_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let ck = killed_aggregation(dir.path());
    let ck = ck.as_str();
    let out = weir(&[
        "run",
        "-e",
        &format!(
            "SELECT \"operatorId\", \"operatorName\", \"stateStoreName\", \"numPartitions\", \
             \"minBatchId\", \"maxBatchId\" FROM read_state_metadata('{ck}')"
        ),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // State of batches 0..2 is committed; batch 3's uncommitted version does not count.
    assert!(
        text.contains("| 0          | aggregate    | default        | 2             | 0          | 2          |"),
        "{text}"
    );

    let out = weir(&["run", "-e", "SELECT * FROM read_state_metadata(42)"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("INVALID_STATE_READER_ARGUMENT"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn read_state_gives_an_aggregations_entries_after_the_last_or_a_chosen_committed_batch() {
    let dir = tempfile::tempdir().unwrap();
    let ck = killed_aggregation(dir.path());
    let entries = |args: &str| {
        let mut rows = query_rows(
            "",
            &format!("SELECT key, value, partition_id FROM read_state('{ck}', {args})"),
        );
        rows.sort();
        rows
    };
    let key = |k: u32| format!("{{rate_micro_batch.value % Int64(3): {k}}}");
    let count = |n: u32| format!("{{count(Int64(1))[count]: {n}}}");
    // Batches 0..2 (values 0..29) are committed; batch 3's state was written but is not.
    let got = entries("operatorId => 0");
    assert_eq!(got.len(), 3, "{got:?}");
    for k in 0..3 {
        assert!(
            got.iter()
                .any(|r| r.starts_with(&format!("{},{},", key(k), count(10)))),
            "{got:?}"
        );
    }
    // After batch 0 (values 0..9): 4, 3, 3; each key in one partition.
    let got = entries("operatorId => 0, batchId => 0");
    let counts: Vec<String> = got
        .iter()
        .map(|r| r.split(',').nth(1).unwrap().to_string())
        .collect();
    assert_eq!(
        counts.iter().filter(|c| **c == count(4)).count(),
        1,
        "{got:?}"
    );
    assert_eq!(
        counts.iter().filter(|c| **c == count(3)).count(),
        2,
        "{got:?}"
    );
    assert_eq!(
        query_rows(
            "",
            &format!("SELECT count(DISTINCT partition_id) FROM read_state('{ck}', 0)")
        ),
        ["2"]
    );

    for (args, class) in [
        ("operatorId => 5", "STDS_INVALID_OPTION_VALUE"),
        (
            "operatorId => 0, batchId => 3",
            "STDS_COMMITTED_BATCH_UNAVAILABLE",
        ),
        (
            "operatorId => 0, storeName => 'left'",
            "STDS_INVALID_OPTION_VALUE",
        ),
        (
            "operatorId => 0, colour => 'red'",
            "STDS_INVALID_OPTION_VALUE",
        ),
    ] {
        let out = weir(&[
            "run",
            "-e",
            &format!("SELECT * FROM read_state('{ck}', {args})"),
        ]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(class), "{args}: {err}");
    }
}

#[test]
fn read_state_metadata_refuses_a_bad_argument() {
    let out = weir(&["run", "-e", "SELECT * FROM read_state_metadata(42)"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("INVALID_STATE_READER_ARGUMENT"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `weir checkpoint reset ck --query file <extra> --json`, which must succeed: its record.
fn selective_reset(ck: &str, file: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["checkpoint", "reset", ck, "--query", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push("--json");
    let out = weir(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The rows of batch SQL `sql` run in a new session (after the `setup` statements).
fn query_rows(setup: &str, sql: &str) -> Vec<String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let session = weir::WeirSession::new();
        session
            .run_script(setup, &weir::ScriptOptions::default())
            .await
            .unwrap();
        support::text_rows(&session, sql).await
    })
}

/// `got` (values, ascending) holds one value of batch 0 (0..9) for each `value % 7`, then
/// exactly `after`.
fn assert_deduped_then_all(got: &[String], after: std::ops::Range<i64>) {
    let values: Vec<i64> = got.iter().map(|v| v.parse().unwrap()).collect();
    let (before, rest): (Vec<i64>, Vec<i64>) = values.iter().partition(|&&v| v < 10);
    let keys: std::collections::BTreeSet<i64> = before.iter().map(|v| v % 7).collect();
    assert_eq!(
        (before.len(), keys.len()),
        (7, 7),
        "one row per key: {values:?}"
    );
    assert_eq!(rest, after.collect::<Vec<_>>(), "{values:?}");
}

/// Seed 004's recovery walkthrough. A query deduplicating by `value % 7` is running; the user
/// removes the dedupe. The restart is refused, `validate` says why, a selective reset fits the
/// checkpoint to the new query, and it continues: the output holds what the dedupe let through
/// before the reset and every row after it, each exactly once, against the input.
#[test]
fn a_removed_dedupe_is_refused_then_a_selective_reset_continues_with_no_row_lost_or_doubled() {
    let dir = tempfile::tempdir().unwrap();
    let (ck, out) = (
        dir.path().join("ck").display().to_string(),
        dir.path().join("out").display().to_string(),
    );
    let query = |select: &str| {
        format!(
            "CREATE STREAMING TABLE t USING parquet LOCATION '{out}' AS SELECT {select} FROM \
             (SELECT value % 7 AS k, value FROM STREAM {RATE})"
        )
    };
    let deduped = query("DISTINCT ON (k) k, value");
    let plain = query("k, value");

    // Batches 0..2 commit; batch 3 is logged and killed before it writes.
    let (ok, _, err) = support::weir(&[
        "run",
        "--checkpoint",
        &ck,
        "--max-batches",
        "3",
        "-e",
        &deduped,
    ]);
    assert!(ok, "{err}");
    run_and_kill_at(&deduped, &ck, "after_wal", 3);
    // The dedupe's state: the 7 keys it has seen.
    let mut keys = query_rows(
        "",
        &format!("SELECT key FROM read_state('{ck}', operatorId => 0)"),
    );
    keys.sort();
    assert_eq!(
        keys,
        (0..7).map(|k| format!("{{k: {k}}}")).collect::<Vec<_>>()
    );

    let (ok, _, err) = support::weir(&[
        "run",
        "--checkpoint",
        &ck,
        "--max-batches",
        "1",
        "-e",
        &plain,
    ]);
    assert!(!ok);
    assert!(
        err.contains("STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA"),
        "{err}"
    );
    let (ok, report) = validate(dir.path(), &ck, &plain);
    assert!(!ok);
    assert_eq!(report["operators"][0]["change"], "removed");

    let file = dir.path().join("plain.sql");
    std::fs::write(&file, &plain).unwrap();
    let r = selective_reset(&ck, &file, &[]);
    assert_eq!(r["kind"], "selective");
    assert_eq!(
        r["nextBatch"], 3,
        "the logged batch 3 runs again, now without the dedupe"
    );
    assert_eq!(r["done"], true);
    assert_eq!(r["operators"][0]["action"], "dropped");
    assert_eq!(r["operators"][0]["operatorName"], "dedupe");
    assert!(
        !dir.path().join("ck/state/0").exists(),
        "the dropped dedupe's state is deleted"
    );
    let (ok, report) = validate(dir.path(), &ck, &plain);
    assert!(ok, "{report:#}");

    let (ok, _, err) = support::weir(&[
        "run",
        "--checkpoint",
        &ck,
        "--max-batches",
        "3",
        "-e",
        &plain,
    ]);
    assert!(ok, "{err}");
    let got = query_rows(
        &format!("CREATE EXTERNAL TABLE o STORED AS PARQUET LOCATION '{out}'"),
        "SELECT value FROM o ORDER BY value",
    );
    // The input: batch b is values 10b..10b+9. Batches 0..2 went through the dedupe (one value
    // of each k in 0..6, all in batch 0), batches 3..5 through the query without it.
    assert_deduped_then_all(&got, 30..60);

    let inspect = weir(&["checkpoint", "inspect", &ck]);
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(text.contains("selective: next batch 3"), "{text}");
    assert!(text.contains("state: dedupe dropped"), "{text}");
}

/// A dedupe removed below an aggregation: the aggregation keeps its state and its counts
/// continue.
#[test]
fn a_selective_reset_keeps_the_state_of_an_unchanged_aggregation() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck").display().to_string();
    let table = dir.path().join("out").display().to_string();
    let query = |inner: &str| {
        format!(
            "CREATE STREAMING TABLE c USING delta LOCATION '{table}' OPTIONS (outputMode \
             'complete') AS SELECT k % 2 AS parity, count(*) AS n FROM ({inner}) GROUP BY k % 2"
        )
    };
    let source = format!("(SELECT value % 20 AS k FROM STREAM {RATE})");
    let deduped = query(&format!("SELECT DISTINCT ON (k) k FROM {source}"));
    let plain = query(&format!("SELECT k FROM {source}"));

    // Batches 0..2: 20 distinct keys pass the dedupe, 10 of each parity.
    let (ok, _, err) = support::weir(&[
        "run",
        "--checkpoint",
        &ck,
        "--max-batches",
        "3",
        "-e",
        &deduped,
    ]);
    assert!(ok, "{err}");
    let file = dir.path().join("plain.sql");
    std::fs::write(&file, &plain).unwrap();
    let r = selective_reset(&ck, &file, &[]);
    let actions: Vec<(String, String)> = r["operators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["operatorName"].as_str().unwrap().to_string(),
                o["action"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("aggregate".to_string(), "kept".to_string()),
            ("dedupe".to_string(), "dropped".to_string())
        ]
    );
    assert_eq!(r["operators"][0]["operatorId"], 0);
    assert_eq!(
        r["operators"][0]["stateId"], 0,
        "the aggregate keeps its folder"
    );
    assert_eq!(r["operators"][1]["stateId"], 1);

    // Batches 3..5 count all 30 rows: 15 of each parity on top of 10.
    let (ok, _, err) = support::weir(&[
        "run",
        "--checkpoint",
        &ck,
        "--max-batches",
        "3",
        "-e",
        &plain,
    ]);
    assert!(ok, "{err}");
    let got = query_rows(
        &format!("CREATE EXTERNAL TABLE c STORED AS DELTA LOCATION '{table}'"),
        "SELECT parity, n FROM c ORDER BY parity",
    );
    assert_eq!(got, ["0,25", "1,25"]);

    // A restart after the reset still finds the moved state (read back from the checkpoint).
    let (ok, _, err) = support::weir(&[
        "run",
        "--checkpoint",
        &ck,
        "--max-batches",
        "1",
        "-e",
        &plain,
    ]);
    assert!(ok, "{err}");
    let got = query_rows(
        &format!("CREATE EXTERNAL TABLE c STORED AS DELTA LOCATION '{table}'"),
        "SELECT parity, n FROM c ORDER BY parity",
    );
    assert_eq!(got, ["0,30", "1,30"]);
}

/// Two dedupes; the outer one is removed, so the inner one's position in the plan moves from 1
/// to 0. Its state stays in its folder and still drops what it saw before the reset.
#[test]
fn a_selective_reset_keeps_the_state_of_an_operator_whose_position_moved() {
    let dir = tempfile::tempdir().unwrap();
    let (ck, out) = (
        dir.path().join("ck").display().to_string(),
        dir.path().join("out").display().to_string(),
    );
    let inner = format!(
        "SELECT DISTINCT ON (j) j, value % 7 AS k, value FROM (SELECT value % 40 AS j, value \
         FROM STREAM {RATE})"
    );
    let query = |select: &str| {
        format!(
            "CREATE STREAMING TABLE t USING parquet LOCATION '{out}' AS SELECT {select} FROM ({inner})"
        )
    };
    let both = query("DISTINCT ON (k) k, value");
    let inner_only = query("k, value");
    let (ok, _, err) = support::weir(&[
        "run",
        "--checkpoint",
        &ck,
        "--max-batches",
        "3",
        "-e",
        &both,
    ]);
    assert!(ok, "{err}");
    let file = dir.path().join("inner.sql");
    std::fs::write(&file, &inner_only).unwrap();
    let r = selective_reset(&ck, &file, &[]);
    assert_eq!(r["operators"][0]["action"], "kept");
    assert_eq!(r["operators"][0]["operatorId"], 0);
    assert_eq!(
        r["operators"][0]["stateId"], 1,
        "the inner dedupe keeps its folder"
    );
    assert_eq!(r["operators"][1]["action"], "dropped");

    let (ok, _, err) = support::weir(&[
        "run",
        "--checkpoint",
        &ck,
        "--max-batches",
        "3",
        "-e",
        &inner_only,
    ]);
    assert!(ok, "{err}");
    let got = query_rows(
        &format!("CREATE EXTERNAL TABLE o STORED AS PARQUET LOCATION '{out}'"),
        "SELECT value FROM o ORDER BY value",
    );
    // Before: values 0..29, one of each value % 7. After: batch 3's 30..39 are new keys of
    // value % 40; batches 4 and 5 (40..59) repeat keys the kept state has seen.
    assert_deduped_then_all(&got, 30..40);
    let inspect = weir(&["checkpoint", "inspect", &ck]);
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        text.contains("state in state/1, starting at batch 0"),
        "{text}"
    );
}

/// The aggregate function changed (count -> sum): the reset starts the aggregation's state
/// empty at the next batch, so the new sums cover the batches from the reset on.
#[test]
fn a_selective_reset_starts_a_changed_operator_empty_at_the_next_batch() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck").display().to_string();
    let counted = aggregation_sql(
        dir.path(),
        "out",
        RATE,
        "value % 3 AS k, count(*) AS n",
        "GROUP BY value % 3",
    );
    let summed = aggregation_sql(
        dir.path(),
        "out",
        RATE,
        "value % 3 AS k, sum(value) AS n",
        "GROUP BY value % 3",
    );
    let (ok, _, err) = support::weir(&[
        "run",
        "--checkpoint",
        &ck,
        "--max-batches",
        "3",
        "-e",
        &counted,
    ]);
    assert!(ok, "{err}");
    let file = dir.path().join("sum.sql");
    std::fs::write(&file, &summed).unwrap();
    let r = selective_reset(&ck, &file, &[]);
    assert_eq!(r["operators"][0]["action"], "reset");
    assert_eq!(r["operators"][0]["firstBatch"], 3);
    assert_eq!(r["operators"][1]["action"], "dropped");

    let (ok, _, err) = support::weir(&[
        "run",
        "--checkpoint",
        &ck,
        "--max-batches",
        "2",
        "-e",
        &summed,
    ]);
    assert!(ok, "{err}");
    let got = query_rows(
        &format!(
            "CREATE EXTERNAL TABLE c STORED AS DELTA LOCATION '{}'",
            dir.path().join("out").display()
        ),
        "SELECT k, n FROM c ORDER BY k",
    );
    // Batches 3 and 4: values 30..49.
    let expected: Vec<String> = (0..3)
        .map(|k| format!("{k},{}", (30..50).filter(|v| v % 3 == k).sum::<i64>()))
        .collect();
    assert_eq!(got, expected);
}

/// A full refresh clears the checkpoint and the file sink's folder and gives the query a new
/// ID; killed half-way, the checkpoint is refused until the refresh is run again; then the
/// query starts over from its sources' beginning, every row once.
#[test]
fn a_full_refresh_clears_checkpoint_and_sink_and_a_killed_one_is_finished_by_running_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let (ck, out) = (
        dir.path().join("ck").display().to_string(),
        dir.path().join("out").display().to_string(),
    );
    let sql = format!(
        "CREATE STREAMING TABLE t USING parquet LOCATION '{out}' AS SELECT value FROM STREAM {RATE}"
    );
    let (ok, _, err) =
        support::weir(&["run", "--checkpoint", &ck, "--max-batches", "3", "-e", &sql]);
    assert!(ok, "{err}");
    let id_before = std::fs::read_to_string(dir.path().join("ck/metadata")).unwrap();

    kill_at(&["checkpoint", "reset", &ck, "--full"], "reset_mid", 0, &[]);
    let (ok, _, err) =
        support::weir(&["run", "--checkpoint", &ck, "--max-batches", "1", "-e", &sql]);
    assert!(!ok);
    assert!(err.contains("CHECKPOINT_RESET_INCOMPLETE"), "{err}");

    let reset = weir(&["checkpoint", "reset", &ck, "--full", "--json"]);
    assert!(
        reset.status.success(),
        "{}",
        String::from_utf8_lossy(&reset.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&reset.stdout).unwrap();
    assert_eq!(r["kind"], "fullRefresh");
    assert_eq!(
        r["reset"], 0,
        "the killed reset's record is finished, not a new one"
    );
    assert!(
        r["sink"].as_str().unwrap().ends_with("output cleared"),
        "{r}"
    );
    assert_ne!(r["queryIdBefore"], r["queryIdAfter"]);
    assert_ne!(
        std::fs::read_to_string(dir.path().join("ck/metadata")).unwrap(),
        id_before
    );
    assert!(!dir.path().join("ck/offsets").exists());
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        0,
        "the sink's folder is empty"
    );

    let (ok, _, err) =
        support::weir(&["run", "--checkpoint", &ck, "--max-batches", "2", "-e", &sql]);
    assert!(ok, "{err}");
    let got = query_rows(
        &format!("CREATE EXTERNAL TABLE o STORED AS PARQUET LOCATION '{out}'"),
        "SELECT value FROM o ORDER BY value",
    );
    assert_eq!(got, (0..20).map(|v| v.to_string()).collect::<Vec<_>>());
}

#[test]
fn a_full_refresh_of_a_sink_weir_cannot_clear_is_refused_without_keep_sink_data() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck").display().to_string();
    let sql = format!("SELECT value FROM STREAM {RATE}");
    let (ok, _, err) =
        support::weir(&["run", "--checkpoint", &ck, "--max-batches", "2", "-e", &sql]);
    assert!(ok, "{err}");
    let before = files(&dir.path().join("ck"));
    let (ok, _, err) = support::weir(&["checkpoint", "reset", &ck, "--full"]);
    assert!(!ok);
    assert!(err.contains("FULL_REFRESH_SINK_NOT_CLEARABLE"), "{err}");
    assert_eq!(files(&dir.path().join("ck")), before, "nothing was touched");

    let (ok, _, err) = support::weir(&["checkpoint", "reset", &ck, "--full", "--keep-sink-data"]);
    assert!(ok, "{err}");
    assert!(!dir.path().join("ck/commits").exists());
}

/// A full refresh of a query writing to Delta removes the table's rows in a commit, and the
/// query's new ID makes the table take its batches from 0 again.
#[test]
fn a_full_refresh_empties_a_delta_table_and_the_query_writes_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck").display().to_string();
    let sql = aggregation_sql(
        dir.path(),
        "out",
        RATE,
        "value % 3 AS k, count(*) AS n",
        "GROUP BY value % 3",
    );
    let table = format!(
        "CREATE EXTERNAL TABLE c STORED AS DELTA LOCATION '{}'",
        dir.path().join("out").display()
    );
    let (ok, _, err) =
        support::weir(&["run", "--checkpoint", &ck, "--max-batches", "3", "-e", &sql]);
    assert!(ok, "{err}");
    let (ok, _, err) = support::weir(&["checkpoint", "reset", &ck, "--full"]);
    assert!(ok, "{err}");
    assert_eq!(query_rows(&table, "SELECT count(*) FROM c"), ["0"]);

    let (ok, _, err) =
        support::weir(&["run", "--checkpoint", &ck, "--max-batches", "2", "-e", &sql]);
    assert!(ok, "{err}");
    // Batches 0 and 1 again: values 0..19.
    assert_eq!(
        query_rows(&table, "SELECT k, n FROM c ORDER BY k"),
        ["0,7", "1,7", "2,6"]
    );
}

/// `weir checkpoint replay`: a batch runs again with its logged offsets and the state before it,
/// and shows its output; neither the checkpoint nor the Delta table changes.
#[test]
fn replay_runs_a_batch_again_from_the_state_before_it_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ck = killed_aggregation(dir.path());
    let file = dir.path().join("q.sql");
    let counted = aggregation_sql(
        dir.path(),
        "out",
        RATE,
        "value % 3 AS k, count(*) AS n",
        "GROUP BY value % 3",
    );
    std::fs::write(&file, &counted).unwrap();
    let before = files(dir.path());
    let replay = |batch: &str| {
        let out = weir(&[
            "checkpoint",
            "replay",
            &ck,
            file.to_str().unwrap(),
            "--batch",
            batch,
        ]);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let rows = |text: &str| -> Vec<String> {
        let mut r: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("| ") && !l.contains(" k "))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        r.sort();
        r
    };
    // Batch 1 (values 10..19) on the state after batch 0: the counts of values 0..19.
    let (ok, text, err) = replay("1");
    assert!(ok, "{err}");
    assert!(text.contains("batch 1 (committed)"), "{text}");
    assert!(text.contains("rate-micro-batch: 10 row(s)"), "{text}");
    assert_eq!(
        rows(&text),
        ["| 0 | 7 |", "| 1 | 7 |", "| 2 | 6 |"],
        "{text}"
    );
    // The pending batch 3 (values 30..39): the counts of values 0..39.
    let (ok, text, err) = replay("3");
    assert!(ok, "{err}");
    assert!(text.contains("batch 3 (pending)"), "{text}");
    assert_eq!(
        rows(&text),
        ["| 0 | 14 |", "| 1 | 13 |", "| 2 | 13 |"],
        "{text}"
    );
    assert_eq!(
        files(dir.path()),
        before,
        "the checkpoint and the table are untouched"
    );

    let (ok, _, err) = replay("9");
    assert!(!ok);
    assert!(err.contains("CHECKPOINT_BATCH_NOT_FOUND"), "{err}");
    std::fs::write(&file, counted.replace("count(*)", "sum(value)")).unwrap();
    let (ok, _, err) = replay("1");
    assert!(!ok);
    assert!(
        err.contains("STATEFUL_OPERATOR_DEFINITION_CHANGED"),
        "{err}"
    );
}

/// `weir checkpoint repartition`: a `GROUP BY`'s state moves from 2 to 3 partitions offline;
/// the next runs use 3 and the counts continue; batches before it cannot be replayed.
#[test]
fn repartition_rewrites_the_state_into_new_partitions_and_the_counts_continue() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck").display().to_string();
    let sql = aggregation_sql(
        dir.path(),
        "out",
        RATE,
        "value % 7 AS k, count(*) AS n",
        "GROUP BY value % 7",
    );
    let (ok, _, err) =
        support::weir(&["run", "--checkpoint", &ck, "--max-batches", "3", "-e", &sql]);
    assert!(ok, "{err}");
    let out = weir(&[
        "checkpoint",
        "repartition",
        &ck,
        "--partitions",
        "3",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["kind"], "repartition");
    assert_eq!(r["nextBatch"], 3);
    assert_eq!(r["operators"][0]["action"], "repartitioned 2 -> 3");
    // The entries are spread over 3 partitions and none was lost.
    let per_partition = query_rows(
        "",
        &format!(
            "SELECT partition_id, count(*) FROM read_state('{ck}', operatorId => 0) GROUP BY \
             partition_id ORDER BY partition_id"
        ),
    );
    assert_eq!(per_partition.len(), 3, "{per_partition:?}");
    let total: u32 = per_partition
        .iter()
        .map(|r| r.split(',').nth(1).unwrap().parse::<u32>().unwrap())
        .sum();
    assert_eq!(total, 7);

    // Batches 3 and 4 run with 3 partitions: the counts of values 0..49.
    let (ok, _, err) =
        support::weir(&["run", "--checkpoint", &ck, "--max-batches", "2", "-e", &sql]);
    assert!(ok, "{err}");
    let got = query_rows(
        &format!(
            "CREATE EXTERNAL TABLE c STORED AS DELTA LOCATION '{}'",
            dir.path().join("out").display()
        ),
        "SELECT k, n FROM c ORDER BY k",
    );
    let expected: Vec<String> = (0..7)
        .map(|k| format!("{k},{}", (0..50).filter(|v| v % 7 == k).count()))
        .collect();
    assert_eq!(got, expected);
    let inspect = weir(&["checkpoint", "inspect", &ck, "--json"]);
    let r: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(r["operators"][0]["numPartitions"], 3);
    assert_eq!(r["conf"]["weir.sql.shuffle.partitions"], "3");

    // Batch 1 ran before the repartition; batch 4 after it replays.
    let file = dir.path().join("q.sql");
    std::fs::write(&file, &sql).unwrap();
    let (ok, _, err) = support::weir(&[
        "checkpoint",
        "replay",
        &ck,
        file.to_str().unwrap(),
        "--batch",
        "1",
    ]);
    assert!(!ok);
    assert!(err.contains("CHECKPOINT_BATCH_BEFORE_RESET"), "{err}");
    let (ok, _, err) = support::weir(&[
        "checkpoint",
        "replay",
        &ck,
        file.to_str().unwrap(),
        "--batch",
        "4",
    ]);
    assert!(ok, "{err}");
}

/// A file source moved to another folder: the restart is refused; a reset of that source starts
/// it from its starting position (nothing can be derived from the old folder's log), and the
/// query continues into the same table, every file read once.
#[test]
fn a_source_reset_starts_a_moved_file_source_in_its_new_folder() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck").display().to_string();
    let out = dir.path().join("out").display().to_string();
    let (d1, d2) = (dir.path().join("in1"), dir.path().join("in2"));
    std::fs::create_dir_all(&d1).unwrap();
    std::fs::create_dir_all(&d2).unwrap();
    for (d, name, v) in [(&d1, "f1", 1), (&d1, "f2", 2), (&d2, "g1", 101)] {
        std::fs::write(
            d.join(format!("{name}.json")),
            format!("{{\"value\": {v}}}\n"),
        )
        .unwrap();
    }
    let query = |d: &std::path::Path| {
        format!(
            "CREATE STREAMING TABLE t USING parquet LOCATION '{out}' AS SELECT value FROM STREAM \
             read_files('{}', format => 'json', schema => 'value BIGINT')",
            d.display()
        )
    };
    let (ok, _, err) = support::weir(&[
        "run",
        "--checkpoint",
        &ck,
        "--max-batches",
        "1",
        "-e",
        &query(&d1),
    ]);
    assert!(ok, "{err}");
    let moved = query(&d2);
    let (ok, _, err) = support::weir(&[
        "run",
        "--checkpoint",
        &ck,
        "--max-batches",
        "1",
        "-e",
        &moved,
    ]);
    assert!(!ok);
    assert!(err.contains("STREAMING_QUERY_SOURCES_CHANGED"), "{err}");

    let file = dir.path().join("moved.sql");
    std::fs::write(&file, &moved).unwrap();
    let r = selective_reset(&ck, &file, &["--source", "0"]);
    let s = &r["sources"][0];
    assert_eq!(s["how"], "startingPosition");
    assert!(s["previous"].as_str().unwrap().ends_with("in1"), "{s}");
    assert!(s["source"].as_str().unwrap().ends_with("in2"), "{s}");
    let (ok, report) = validate(dir.path(), &ck, &moved);
    assert!(ok, "the reset source is accepted: {report:#}");

    let (ok, _, err) = support::weir(&[
        "run",
        "--checkpoint",
        &ck,
        "--max-batches",
        "1",
        "-e",
        &moved,
    ]);
    assert!(ok, "{err}");
    let got = query_rows(
        &format!("CREATE EXTERNAL TABLE o STORED AS PARQUET LOCATION '{out}'"),
        "SELECT value FROM o ORDER BY value",
    );
    assert_eq!(got, ["1", "2", "101"]);
    // The next restart checks against the new folder, as usual.
    let (ok, _, err) = support::weir(&[
        "run",
        "--checkpoint",
        &ck,
        "--max-batches",
        "1",
        "-e",
        &query(&d1),
    ]);
    assert!(!ok);
    assert!(err.contains("STREAMING_QUERY_SOURCES_CHANGED"), "{err}");
}

/// A global aggregate keeps one entry under an empty key: `read_state` shows it and a
/// repartition moves it where the shuffle sends the empty key.
#[test]
fn a_global_aggregates_state_is_read_and_repartitioned() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck").display().to_string();
    let sql = aggregation_sql(dir.path(), "out", RATE, "count(*) AS n", "");
    let (ok, _, err) =
        support::weir(&["run", "--checkpoint", &ck, "--max-batches", "3", "-e", &sql]);
    assert!(ok, "{err}");
    let entries = query_rows(
        "",
        &format!("SELECT value FROM read_state('{ck}', operatorId => 0)"),
    );
    assert_eq!(entries, ["{count(Int64(1))[count]: 30}"]);
    let (ok, _, err) = support::weir(&["checkpoint", "repartition", &ck, "--partitions", "3"]);
    assert!(ok, "{err}");
    let (ok, _, err) =
        support::weir(&["run", "--checkpoint", &ck, "--max-batches", "2", "-e", &sql]);
    assert!(ok, "{err}");
    let got = query_rows(
        &format!(
            "CREATE EXTERNAL TABLE c STORED AS DELTA LOCATION '{}'",
            dir.path().join("out").display()
        ),
        "SELECT n FROM c",
    );
    assert_eq!(got, ["50"], "the count continues after the repartition");
}

/// A full refresh never touches another engine's checkpoint.
#[test]
fn a_full_refresh_refuses_a_spark_checkpoint_and_leaves_it_alone() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    std::fs::create_dir_all(ck.join("offsets")).unwrap();
    std::fs::write(
        ck.join("metadata"),
        "{\"id\":\"3c3a6f0e-2f7e-4f86-9b6d-0d6b1a2d9e11\"}",
    )
    .unwrap();
    std::fs::write(ck.join("offsets/0"), "v1\n{}\n{\"logOffset\":0}").unwrap();
    let before = files(&ck);
    let (ok, _, err) = support::weir(&["checkpoint", "reset", ck.to_str().unwrap(), "--full"]);
    assert!(!ok);
    assert!(err.contains("CHECKPOINT_LOCATION_NOT_WEIR"), "{err}");
    assert_eq!(files(&ck), before);
}

/// `read_state` on a session-window aggregation: one row per session, with its bounds and its
/// accumulators' state.
#[test]
fn read_state_gives_each_session_of_a_session_window_aggregation() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck").display().to_string();
    let sql = "SELECT value % 2 AS k, session_window(timestamp, '10 seconds') AS s, count(*) \
               AS n FROM STREAM(rate_micro_batch(rowsPerBatch => 10), watermark => 'timestamp', \
               delay => '1 second') GROUP BY value % 2, session_window(timestamp, '10 seconds')";
    let (ok, _, err) =
        support::weir(&["run", "--checkpoint", &ck, "--max-batches", "2", "-e", sql]);
    assert!(ok, "{err}");
    let mut rows = query_rows(
        "",
        &format!("SELECT key, value FROM read_state('{ck}', operatorId => 0)"),
    );
    rows.sort();
    // 20 rows, 10 per key, all in one open session per key.
    let session = "session_start_us: 0, session_end_us: 11000000, count(Int64(1))[count]: 10";
    assert_eq!(
        rows,
        [0, 1]
            .map(|k| format!("{{rate_micro_batch.value % Int64(2): {k}}},{{{session}}}"))
            .to_vec()
    );
    let (ok, _, err) = support::weir(&[
        "run",
        "-e",
        &format!("SELECT * FROM read_state('{ck}', 0, storeName => 'sessions-by-end')"),
    ]);
    assert!(!ok);
    assert!(err.contains("STDS_UNSUPPORTED_OPERATOR"), "{err}");

    // Repartitioned (both stores, the index by the group key after the session's end), the
    // sessions keep growing: 20 rows per key after two more batches.
    let (ok, _, err) = support::weir(&["checkpoint", "repartition", &ck, "--partitions", "3"]);
    assert!(ok, "{err}");
    let (ok, _, err) =
        support::weir(&["run", "--checkpoint", &ck, "--max-batches", "2", "-e", sql]);
    assert!(ok, "{err}");
    let counts = query_rows(
        "",
        &format!(
            "SELECT count(*) AS sessions FROM read_state('{ck}', operatorId => 0) WHERE \
             value['count(Int64(1))[count]'] = 20"
        ),
    );
    assert_eq!(counts, ["2"]);
}

/// The last progress record in the file `weir run --progress` wrote: its state's row count.
fn last_rows_total(progress: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(progress).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    last["stateOperators"][0]["numRowsTotal"].as_u64().unwrap()
}

/// A stream-stream left join: `read_state` gives each side's rows under their join keys, and a
/// repartition (which splits the event-time index by join key and recounts each partition's
/// rows) leaves the join answering exactly as a run without it, matched rows and the unmatched
/// left rows emitted when evicted alike.
#[test]
fn a_stream_stream_joins_state_is_read_and_repartitioned_and_the_join_continues() {
    let dir = tempfile::tempdir().unwrap();
    let side = "rate_micro_batch(rowsPerBatch => 10, startTimestamp => 1000) WATERMARK \
                timestamp DELAY OF INTERVAL 1 SECOND";
    let sql = |out: &str| {
        format!(
            "CREATE STREAMING TABLE j USING delta LOCATION '{}' AS SELECT l.value AS lv, \
             r.value AS rv FROM STREAM {side} AS l LEFT JOIN STREAM {side} AS r ON l.value % 7 = \
             r.value % 7 AND r.value % 5 = 0 AND r.timestamp BETWEEN l.timestamp - INTERVAL 1 \
             SECOND AND l.timestamp + INTERVAL 1 SECOND",
            dir.path().join(out).display()
        )
    };
    let joined = |out: &str| {
        query_rows(
            &format!(
                "CREATE EXTERNAL TABLE j STORED AS DELTA LOCATION '{}'",
                dir.path().join(out).display()
            ),
            "SELECT lv, rv FROM j ORDER BY lv, rv",
        )
    };
    let progress = dir.path().join("progress.jsonl");
    let run = |ck: &str, out: &str, batches: &str| {
        let (ok, _, err) = support::weir(&[
            "run",
            "--checkpoint",
            ck,
            "--max-batches",
            batches,
            "--progress",
            progress.to_str().unwrap(),
            "-e",
            &sql(out),
        ]);
        assert!(ok, "{err}");
    };
    // What the join gives in 8 batches, run without a repartition.
    let reference_ck = dir.path().join("reference-ck").display().to_string();
    run(&reference_ck, "reference", "8");
    let expected = joined("reference");
    assert!(
        expected
            .iter()
            .any(|r| r.ends_with(",") && r.split(',').next().unwrap().parse::<u64>().unwrap() >= 40),
        "left rows of batch 4 on are emitted unmatched when evicted: {expected:?}"
    );

    let ck = dir.path().join("ck").display().to_string();
    run(&ck, "out", "4");
    let side_rows = |side: &str| {
        query_rows(
            "",
            &format!(
                "SELECT key['key0'], value['value'] FROM read_state('{ck}', operatorId => 0, \
                 joinSide => '{side}')"
            ),
        )
    };
    let (left, right) = (side_rows("left"), side_rows("right"));
    assert!(!left.is_empty() && !right.is_empty());
    for row in left.iter().chain(&right) {
        let (key, value) = row.split_once(',').unwrap();
        assert_eq!(
            key.parse::<i64>().unwrap(),
            value.parse::<i64>().unwrap() % 7,
            "each row is kept under its join key: {row}"
        );
    }
    assert_eq!(
        (left.len() + right.len()) as u64,
        last_rows_total(&progress),
        "read_state gives every row the join keeps"
    );
    for (args, class) in [
        (
            "joinSide => 'left', storeName => 'left'",
            "STDS_CONFLICT_OPTIONS",
        ),
        ("joinSide => 'middle'", "STDS_INVALID_OPTION_VALUE"),
        ("storeName => 'left-times'", "STDS_UNSUPPORTED_OPERATOR"),
    ] {
        let (ok, _, err) = support::weir(&[
            "run",
            "-e",
            &format!("SELECT * FROM read_state('{ck}', operatorId => 0, {args})"),
        ]);
        assert!(!ok && err.contains(class), "{args}: {err}");
    }

    let (ok, _, err) = support::weir(&["checkpoint", "repartition", &ck, "--partitions", "3"]);
    assert!(ok, "{err}");
    let mut moved = side_rows("left");
    let mut before = left.clone();
    moved.sort();
    before.sort();
    assert_eq!(moved, before, "the repartition keeps every left row");
    let partitions = query_rows(
        "",
        &format!(
            "SELECT max(partition_id) FROM read_state('{ck}', operatorId => 0, joinSide => \
             'right')"
        ),
    );
    assert_eq!(partitions, ["2"]);

    run(&ck, "out", "4");
    assert_eq!(joined("out"), expected);
    let kept = side_rows("left").len() + side_rows("right").len();
    assert_eq!(
        kept as u64,
        last_rows_total(&progress),
        "each new partition counts its own rows"
    );
}

/// A Delta source reset to an explicit `startingVersion` before what the query had read: the
/// reset warns of the overlap by commit, and the run then reads those commits' rows again, as
/// asked; a reset to the derived position reads only new rows.
#[test]
fn a_delta_source_reset_to_an_earlier_starting_version_warns_of_the_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src").display().to_string();
    let src_ck = dir.path().join("src-ck").display().to_string();
    let add_rows = |batches: &str| {
        let (ok, _, err) = support::weir(&[
            "run",
            "--checkpoint",
            &src_ck,
            "--max-batches",
            batches,
            "-e",
            &format!(
                "CREATE STREAMING TABLE src USING delta LOCATION '{src}' AS SELECT value FROM \
                 STREAM rate_micro_batch(rowsPerBatch => 5)"
            ),
        ]);
        assert!(ok, "{err}");
    };
    // Commits 1..=3 add values 0..15 (commit 0 makes the table).
    add_rows("3");
    let out = dir.path().join("out").display().to_string();
    let sql = |options: &str| {
        format!(
            "CREATE STREAMING TABLE o USING delta LOCATION '{out}' AS SELECT value FROM STREAM \
             delta(path => '{src}'{options})"
        )
    };
    let ck = dir.path().join("ck").display().to_string();
    let run = || {
        let (ok, _, err) = support::weir(&[
            "run",
            "--checkpoint",
            &ck,
            "--trigger",
            "availableNow",
            "-e",
            &sql(""),
        ]);
        assert!(ok, "{err}");
    };
    run();
    let values = || {
        query_rows(
            &format!("CREATE EXTERNAL TABLE o STORED AS DELTA LOCATION '{out}'"),
            "SELECT value FROM o ORDER BY value",
        )
    };
    assert_eq!(values().len(), 15);

    let file = dir.path().join("q.sql");
    std::fs::write(&file, sql(", startingVersion => 2")).unwrap();
    let r = selective_reset(&ck, &file, &["--source", "0", "--from-starting-position"]);
    let warning = r["sources"][0]["warning"].as_str().unwrap_or_default();
    assert!(
        warning.starts_with("overlaps: reads again what commits 2..=3 added"),
        "{r:#}"
    );
    run();
    // Commits 2 and 3 (values 5..15) are read again, as the warning said.
    let mut expected: Vec<i64> = (0..15).chain(5..15).collect();
    expected.sort_unstable();
    assert_eq!(
        values(),
        expected.iter().map(i64::to_string).collect::<Vec<_>>()
    );

    // A reset to the derived position: only the new commit's rows come next.
    let r = selective_reset(&ck, &file, &["--source", "0"]);
    assert_eq!(r["sources"][0]["how"], "derived", "{r:#}");
    add_rows("1");
    run();
    assert_eq!(values().len(), 30);
}
