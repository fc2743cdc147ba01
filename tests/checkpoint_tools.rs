//! `weir checkpoint` tools against real checkpoints written by `weir run`.

#![expect(
    clippy::unwrap_used,
    reason = "a test fails loudly on any unexpected error"
)]

use std::process::{Command, Output};

mod support;
use support::run_and_kill_at;

fn weir(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .output()
        .unwrap()
}

/// Every file under `dir`, with its size.
fn files(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = vec![];
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            } else {
                out.push((e.path().display().to_string(), e.metadata().unwrap().len()));
            }
        }
    }
    out.sort();
    out
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
    ck
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
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
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
    assert!(
        op["valueSchema"].as_str().unwrap().contains("BIGINT"),
        "{op}"
    );
    assert_eq!(r["conf"]["weir.sql.shuffle.partitions"], "2");

    let table = weir(&["checkpoint", "inspect", ck]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("last committed 2; batch 3 pending"), "{text}");
    assert!(text.contains("[0] aggregate  partitions 2"), "{text}");
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
