//! The `weir` command line, run as a real process.

#![expect(
    clippy::unwrap_used,
    reason = "a test fails loudly on any unexpected error"
)]

use std::process::Command;

fn weir(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn console_output_and_progress_lines_with_sparks_field_names() {
    let (ok, stdout, stderr) = weir(&[
        "run",
        "-e",
        "SELECT value, value * 2 AS doubled FROM STREAM rate_micro_batch(rowsPerBatch => 4) WHERE value % 2 = 0",
        "--max-batches",
        "2",
        "--progress",
        "-",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("Batch: 0\n"), "{stdout}");
    assert!(stdout.contains("|value|doubled|"), "{stdout}");
    assert!(stdout.contains("|    6|     12|"), "{stdout}");
    let progress: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(progress.len(), 2);
    let p = &progress[1];
    assert_eq!(p["batchId"], 1);
    assert_eq!(p["numInputRows"], 4);
    assert_eq!(p["sink"]["numOutputRows"], 2);
    for k in [
        "latestOffset",
        "walCommit",
        "getBatch",
        "queryPlanning",
        "addBatch",
        "commitOffsets",
        "triggerExecution",
    ] {
        assert!(
            p["durationMs"].get(k).is_some(),
            "durationMs.{k} missing: {p}"
        );
    }
    assert_eq!(
        p["sources"][0]["endOffset"],
        serde_json::json!({"offset": 8, "timestamp": 2000})
    );
}

#[test]
fn file_sinks_are_read_back_by_batch_sql_through_their_manifest() {
    let dir = tempfile::tempdir().unwrap();
    for format in ["csv", "json", "parquet"] {
        let out = dir.path().join(format!("out-{format}"));
        let ck = dir.path().join(format!("ck-{format}"));
        let sql = format!(
            "CREATE STREAMING TABLE t USING {format} LOCATION '{}' AS \
             SELECT value, value % 3 AS m FROM STREAM rate_micro_batch(rowsPerBatch => 5)",
            out.display()
        );
        let (ok, _, stderr) = weir(&[
            "run",
            "-e",
            &sql,
            "--checkpoint",
            ck.to_str().unwrap(),
            "--max-batches",
            "3",
        ]);
        assert!(ok, "{format}: {stderr}");
        let read = format!(
            "CREATE EXTERNAL TABLE r STORED AS {} LOCATION '{}'; SELECT count(*) AS n, sum(value) AS s FROM r",
            format.to_uppercase(),
            out.display()
        );
        let (ok, stdout, stderr) = weir(&["run", "-e", &read]);
        assert!(ok, "{format}: {stderr}");
        // 3 batches of 5 rows: values 0..15, sum 105.
        assert!(stdout.contains("| 15 | 105 |"), "{format}: {stdout}");
    }
}

#[test]
fn errors_have_a_class_and_a_nonzero_exit() {
    let (ok, _, stderr) = weir(&["run", "-e", "SELECT * FROM STREAM rate(rowsPerSecnd => 5)"]);
    assert!(!ok);
    assert!(
        stderr.contains("[STREAMING_INVALID_OPTION] Unknown option 'rowsPerSecnd'"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Accepted options: rowsPerSecond, rampUpTime, numPartitions"),
        "{stderr}"
    );
    let (ok, _, stderr) = weir(&["run", "-e", "SELECT value FROM STREAM rate() LIMIT 1"]);
    assert!(!ok);
    assert!(
        stderr.contains("UNSUPPORTED_STREAMING_OPERATION.LIMIT"),
        "{stderr}"
    );
    let (ok, _, stderr) = weir(&[
        "run",
        "-e",
        "SELECT value FROM STREAM rate()",
        "--trigger",
        "hourly-ish",
    ]);
    assert!(!ok);
    assert!(stderr.contains("INVALID_TRIGGER"), "{stderr}");
}

#[test]
fn a_foreign_checkpoint_directory_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
    let (ok, _, stderr) = weir(&[
        "run",
        "-e",
        "SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 1)",
        "--checkpoint",
        dir.path().to_str().unwrap(),
        "--max-batches",
        "1",
    ]);
    assert!(!ok);
    assert!(stderr.contains("CHECKPOINT_LOCATION_NOT_WEIR"), "{stderr}");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec!["notes.txt"]);
}

#[test]
fn a_restart_continues_after_the_last_committed_batch() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let ck = ck.to_str().unwrap();
    let sql = "SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 2)";
    let (ok, first, _) = weir(&["run", "-e", sql, "--checkpoint", ck, "--max-batches", "2"]);
    assert!(ok);
    assert!(
        first.contains("Batch: 1\n") && !first.contains("Batch: 2\n"),
        "{first}"
    );
    let (ok, second, _) = weir(&["run", "-e", sql, "--checkpoint", ck, "--max-batches", "1"]);
    assert!(ok);
    assert!(second.contains("Batch: 2\n"), "{second}");
    assert!(
        second.contains("|    4|") && second.contains("|    5|"),
        "{second}"
    );
}

#[test]
fn a_damaged_checkpoint_is_reported_with_its_path_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let out = dir.path().join("out");
    let sql = format!(
        "CREATE STREAMING TABLE d USING parquet LOCATION '{}' AS \
         SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 3)",
        out.display()
    );
    let ck_s = ck.to_str().unwrap();
    let (ok, _, stderr) = weir(&[
        "run",
        "-e",
        &sql,
        "--checkpoint",
        ck_s,
        "--max-batches",
        "2",
    ]);
    assert!(ok, "{stderr}");
    let snapshot = |p: &std::path::Path| {
        let mut files: Vec<(String, Vec<u8>)> = walk(p)
            .into_iter()
            .map(|f| (f.display().to_string(), std::fs::read(&f).unwrap()))
            .collect();
        files.sort();
        files
    };
    let run_one = || {
        weir(&[
            "run",
            "-e",
            &sql,
            "--checkpoint",
            ck_s,
            "--max-batches",
            "1",
        ])
    };
    let damages: [(&str, &[u8], &str); 3] = [
        ("offsets/1", b"v1\n{not json", "offsets/1"),
        ("commits/1", b"v9\n{}", "commits/1"),
        ("metadata", b"", "metadata"),
    ];
    for (file, garbage, named) in damages {
        let path = ck.join(file);
        let original = std::fs::read(&path).unwrap();
        std::fs::write(&path, garbage).unwrap();
        let (before_ck, before_out) = (snapshot(&ck), snapshot(&out));
        let (ok, _, stderr) = run_one();
        assert!(!ok, "a damaged {file} must stop the run");
        assert!(
            stderr.contains("CHECKPOINT_FILE_CORRUPT"),
            "{file}: {stderr}"
        );
        assert!(
            stderr.contains(named),
            "{file}: the error names the file: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(
            snapshot(&ck),
            before_ck,
            "{file}: the checkpoint was changed"
        );
        assert_eq!(snapshot(&out), before_out, "{file}: the sink was changed");
        std::fs::write(&path, original).unwrap();
    }
    // Repaired, it runs on from batch 2.
    let (ok, _, stderr) = run_one();
    assert!(ok, "{stderr}");
    assert!(ck.join("commits/2").exists());
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if !p.ends_with(".weir-lock") {
            out.push(p);
        }
    }
    out
}

#[test]
fn without_a_checkpoint_location_a_temporary_one_is_used_announced_and_removed() {
    let (ok, _, stderr) = weir(&[
        "run",
        "-e",
        "SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 1)",
        "--max-batches",
        "1",
    ]);
    assert!(ok, "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("temporary checkpoint"))
        .unwrap_or_else(|| panic!("no warning: {stderr}"));
    let dir = line
        .split_whitespace()
        .find(|w| w.contains("weir-checkpoint-"))
        .unwrap();
    assert!(
        dir.starts_with(std::env::temp_dir().to_str().unwrap()),
        "not a temporary path: {dir}"
    );
    assert!(
        !line.contains('\u{1b}'),
        "colour codes in a log that is not a terminal: {line}"
    );
    assert!(!std::path::Path::new(dir).exists(), "{dir} was left behind");
}

#[test]
fn bench_reports_rates_latencies_and_the_duration_breakdown() {
    let (ok, stdout, stderr) = weir(&[
        "bench",
        "--workload",
        "q1",
        "--batches",
        "3",
        "--warmup",
        "1",
        "--rows-per-batch",
        "1000",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(r["batches"], 3);
    assert_eq!(r["rowsPerBatch"], 1000);
    assert!(r["rowsPerSec"]["median"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["batchLatencyMs"]["p99"].is_number(), "{r}");
    for key in [
        "latestOffset",
        "walCommit",
        "getBatch",
        "queryPlanning",
        "addBatch",
        "commitOffsets",
        "triggerExecution",
    ] {
        assert!(r["durationMsMedian"][key].is_number(), "{key} missing: {r}");
    }
    let (ok, table, _) = weir(&[
        "bench",
        "--batches",
        "2",
        "--warmup",
        "0",
        "--rows-per-batch",
        "10",
    ]);
    assert!(ok);
    assert!(
        table.contains("rows/s (median per batch)") && table.contains("p99"),
        "{table}"
    );
    let (ok, _, stderr) = weir(&["bench", "--workload", "q9"]);
    assert!(!ok);
    assert!(stderr.contains("UNKNOWN_BENCH_WORKLOAD"), "{stderr}");
    assert!(
        r.get("state").is_none(),
        "a stateless workload has no state figures: {r}"
    );
}

#[test]
fn every_stateful_bench_workload_runs_and_reports_its_state() {
    // Each workload's state after a few small batches: q2 1000 groups, q3 the open windows,
    // q4 every key seen (values 0..4999 are all distinct keys), q5 rows waiting for a match.
    for (workload, rows) in [("q2", 2000), ("q3", 1000), ("q4", 1000), ("q5", 200)] {
        let (ok, stdout, stderr) = weir(&[
            "bench",
            "--workload",
            workload,
            "--batches",
            "3",
            "--warmup",
            "2",
            "--rows-per-batch",
            &rows.to_string(),
            "--json",
        ]);
        assert!(ok, "{workload}: {stderr}");
        let r: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(r["batches"], 3, "{workload}: {r}");
        let total = r["state"]["numRowsTotal"].as_u64().unwrap();
        match workload {
            "q2" => assert_eq!(total, 1000, "{r}"),
            "q4" => assert_eq!(total, 5 * 1000, "{r}"),
            _ => assert!(total > 0, "{workload}: {r}"),
        }
        assert!(r["state"]["commitTimeMs"].is_number(), "{r}");
    }
    // q2 with other state options: the same state; with asynchronous checkpointing too;
    // snapshots every version with --min-deltas-for-snapshot 1, none in 4 versions by default
    // (every 10th).
    let q2 = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "bench",
            "--workload",
            "q2",
            "--batches",
            "3",
            "--warmup",
            "1",
            "--rows-per-batch",
            "2000",
            "--json",
        ];
        args.extend(extra);
        let (ok, stdout, stderr) = weir(&args);
        assert!(ok, "{extra:?}: {stderr}");
        serde_json::from_str(stdout.trim()).unwrap()
    };
    let r = q2(&["--async-state-checkpoint"]);
    assert_eq!(r["state"]["numRowsTotal"], 1000, "{r}");
    for (extra, copies) in [
        (&["--min-deltas-for-snapshot", "1"][..], true),
        (&[], false),
    ] {
        let r = q2(extra);
        assert_eq!(r["state"]["numRowsTotal"], 1000, "{r}");
        let copied = r["state"]["snapshotFilesCopied"].as_i64().unwrap();
        assert_eq!(copied > 0, copies, "{extra:?}: {r}");
    }
}

#[test]
fn bench_files_and_kafka_workloads_run_on_prepared_inputs() {
    let args = |w: &'static str| {
        vec![
            "bench",
            "--workload",
            w,
            "--batches",
            "2",
            "--warmup",
            "1",
            "--rows-per-batch",
            "400",
            "--json",
        ]
    };
    let (ok, stdout, stderr) = weir(&args("files"));
    assert!(ok, "{stderr}");
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(r["batches"], 2, "{r}");
    // 4 files of 100 rows per batch (2 partitions x 2 files): 1200 ids, keys id % 1000.
    assert_eq!(r["state"]["numRowsTotal"], 1000, "{r}");
    if std::env::var("WEIR_TANSU").is_err()
        && std::env::var("WEIR_SKIP_SERVER_TESTS").is_ok_and(|v| v == "1")
    {
        eprintln!("\n!!! SKIPPED: the kafka bench workload (WEIR_SKIP_SERVER_TESTS=1) !!!\n");
        return;
    }
    let (ok, stdout, stderr) = weir(&args("kafka"));
    assert!(ok, "{stderr}");
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(r["batches"], 2, "{r}");
    assert!(r["rowsPerSec"]["median"].as_f64().unwrap() > 0.0, "{r}");
    assert!(
        r["baselineConsumerRowsPerSec"].as_f64().unwrap() > 0.0,
        "{r}"
    );
}
