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

/// A checkpoint `<dir>/ck` of a `GROUP BY` into a Delta table at `<dir>/out`: batches 0..2
/// committed, batch 3 logged and killed before its commit. Returns the checkpoint's path.
fn killed_aggregation(dir: &std::path::Path) -> String {
    let ck = dir.join("ck").to_str().unwrap().to_string();
    let sql = format!(
        "CREATE STREAMING TABLE c USING delta LOCATION '{}' OPTIONS (outputMode 'complete') AS \
         SELECT value % 3 AS k, count(*) AS n FROM STREAM rate_micro_batch(rowsPerBatch => 10) \
         GROUP BY value % 3",
        dir.join("out").display()
    );
    run_and_kill_at(&sql, &ck, "after_sink", 3);
    ck
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
