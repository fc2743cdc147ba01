//! The `weir` command line, run as a real process.

use crate::support;

use support::weir;

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
    // A Nexmark query weir cannot run says so and where to read why; one that does not exist
    // names the ones that do.
    let (ok, _, stderr) = weir(&["bench", "--workload", "nexmark-q6", "--events", "1000"]);
    assert!(!ok);
    assert!(
        stderr.contains("[UNSUPPORTED_STREAMING_OPERATION] weir cannot run Nexmark q6")
            && stderr.contains("queries/nexmark/README.md"),
        "{stderr}"
    );
    let (ok, _, stderr) = weir(&["bench", "--workload", "nexmark-q99"]);
    assert!(!ok);
    assert!(
        stderr.contains("[UNKNOWN_BENCH_WORKLOAD]") && stderr.contains("nexmark-q22"),
        "{stderr}"
    );
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
    // Every file but the run lock, with its content.
    let snapshot = |p: &std::path::Path| {
        let mut files = support::contents(p);
        files.retain(|(f, _)| !std::path::Path::new(f).ends_with(".weir-lock"));
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

/// `bench --restart` restarts the join on its checkpoint twice (reusing the local instances,
/// then rebuilding them) and reports each restart's time up to its batch's end, and the batch's
/// own part of it.
#[test]
fn bench_restart_reports_the_restart_and_its_batch() {
    let (ok, stdout, stderr) = weir(&[
        "bench",
        "--workload",
        "q5",
        "--batches",
        "2",
        "--warmup",
        "1",
        "--rows-per-batch",
        "1000",
        "--restart",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    for (total, batch) in [
        ("restartMs", "restartBatchMs"),
        ("restartRebuildMs", "restartRebuildBatchMs"),
    ] {
        let (total, batch) = (
            r[total].as_f64().unwrap_or_else(|| panic!("{total}: {r}")),
            r[batch].as_f64().unwrap_or_else(|| panic!("{batch}: {r}")),
        );
        assert!(batch > 0.0 && batch <= total, "{total} {batch}: {r}");
    }
    // The state a batch touched, as Spark's RocksDB metrics name it: each batch stores 1,000
    // new rows a side, each under a key of at least 21 bytes (join key and batch/row suffix),
    // and reads the sides' row counts.
    let written = r["state"]["bytesWritten"].as_f64().unwrap_or(0.0);
    assert!(written >= 2.0 * 1000.0 * 21.0, "{r}");
    assert!(r["state"]["bytesRead"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
    let (ok, table, stderr) = weir(&[
        "bench",
        "--workload",
        "q5",
        "--batches",
        "1",
        "--warmup",
        "0",
        "--rows-per-batch",
        "100",
        "--restart",
    ]);
    assert!(ok, "{stderr}");
    let line = table
        .lines()
        .find(|l| l.starts_with("restart to the next batch committed: "))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(line.contains(", of which the batch "), "{line}");
    assert!(line.contains("rebuilt from the checkpoint: "), "{line}");
    assert!(
        table
            .lines()
            .any(|l| l
                .starts_with("state bytes per batch (median, summed over partitions): written ")),
        "{table}"
    );
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
    // snapshots every version with --min-deltas-for-snapshot 1 and no maintenance interval;
    // none in the 60 s maintenance interval (Spark's), nor in 4 versions by default (every
    // 10th).
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
        (
            &[
                "--min-deltas-for-snapshot",
                "1",
                "--state-maintenance-interval",
                "0",
            ][..],
            true,
        ),
        (&["--min-deltas-for-snapshot", "1"][..], false),
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

#[test]
fn reset_flags_that_do_not_mean_one_thing_are_refused_before_anything_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (ck, out) = (dir.path().join("ck"), dir.path().join("out"));
    let sql = format!(
        "CREATE STREAMING TABLE t USING parquet LOCATION '{}' AS SELECT value FROM STREAM \
         rate_micro_batch(rowsPerBatch => 5)",
        out.display()
    );
    let query = dir.path().join("q.sql");
    std::fs::write(&query, &sql).unwrap();
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
    let before = (support::contents(&ck), support::contents(&out));
    let q = query.to_str().unwrap();
    for args in [
        vec!["--full", "--source", "0"],
        vec!["--full", "--from-starting-position"],
        vec!["--full", "--source", "0", "--from-starting-position"],
        vec!["--query", q, "--keep-sink-data"],
        vec!["--query", q, "--from-starting-position"],
        vec!["--query", q, "--full"],
        vec![],
    ] {
        let mut all = vec!["checkpoint", "reset", ck_s];
        all.extend(&args);
        let (ok, _, stderr) = weir(&all);
        assert!(!ok, "{args:?} was accepted");
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
        assert_eq!(
            (support::contents(&ck), support::contents(&out)),
            before,
            "{args:?} changed the checkpoint or the output"
        );
    }
}

#[test]
fn max_batches_with_a_processing_time_trigger_exits_when_the_last_batch_commits() {
    // With an hour's trigger, the second batch would wait up to an hour: the run must end as
    // its one batch commits, not one interval later.
    let mut child = support::weir_command()
        .args([
            "run",
            "-e",
            "SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 3)",
            "--trigger",
            "processingTime=1 hour",
            "--max-batches",
            "1",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(
        status.is_some_and(|s| s.success()),
        "still waiting for the next trigger: {status:?}"
    );
}

/// The inputs that aborted the process or hung it: each gets an error class that says what is
/// wrong (or, for a ragged CSV and a JSON file without JSON, Spark's PERMISSIVE answer).
#[test]
fn malformed_inputs_get_classified_errors_not_aborts() {
    let dir = tempfile::tempdir().unwrap();
    let sum = |terms: usize, what: &str| vec![what; terms].join(" + ");
    let refused = |sql: &str, class: &str| {
        let (ok, _, stderr) = weir(&["run", "-e", sql, "--max-batches", "1"]);
        assert!(!ok, "accepted: {}", &sql[..sql.len().min(200)]);
        assert!(!stderr.contains("overflow"), "{stderr}");
        assert!(stderr.contains(class), "{class}: {stderr}");
    };
    // A sum of 10,000 terms, batch and streaming; 100,000 too.
    refused(
        &format!("SELECT {} AS s", sum(10_000, "1")),
        "EXPRESSION_NESTING_TOO_DEEP",
    );
    refused(
        &format!(
            "SELECT {} AS s FROM STREAM rate_micro_batch(rowsPerBatch => 1)",
            sum(10_000, "value")
        ),
        "EXPRESSION_NESTING_TOO_DEEP",
    );
    let file = dir.path().join("deep.sql");
    std::fs::write(&file, format!("SELECT {} AS s", sum(100_000, "1"))).unwrap();
    let (ok, _, stderr) = weir(&["run", file.to_str().unwrap()]);
    assert!(
        !ok && stderr.contains("EXPRESSION_NESTING_TOO_DEEP"),
        "{stderr}"
    );
    // Counts near i64::MAX, that allocated terabytes.
    for sql in [
        "SELECT * FROM STREAM rate_micro_batch(rowsPerBatch => 9223372036854775807)",
        "SELECT * FROM STREAM rate_micro_batch(rowsPerBatch => 4611686018427387904)",
        "SELECT * FROM STREAM rate(rowsPerSecond => 9223372036854775807)",
        "SELECT * FROM STREAM rate(rowsPerSecond => 4611686018427387904)",
        "SELECT * FROM STREAM rate(numPartitions => 4611686018427387904)",
    ] {
        refused(sql, "STREAMING_INVALID_OPTION");
    }
    // The same option twice.
    refused(
        "SELECT * FROM STREAM rate_micro_batch(rowsPerBatch => 2, ROWSPERBATCH => 3)",
        "DUPLICATE_ROUTINE_PARAMETER_ASSIGNMENT",
    );
    refused(
        &format!(
            "CREATE STREAMING TABLE t USING parquet LOCATION '{}' OPTIONS (compression 'zstd', \
             COMPRESSION 'none') AS SELECT * FROM STREAM rate_micro_batch(rowsPerBatch => 2)",
            dir.path().join("o").display()
        ),
        "DUPLICATE_KEY",
    );

    // A log entry named u64::MAX.
    let ck = dir.path().join("ck");
    let sql = "SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 2)";
    let ck_s = ck.to_str().unwrap();
    let (ok, _, stderr) = weir(&["run", "-e", sql, "--checkpoint", ck_s, "--max-batches", "1"]);
    assert!(ok, "{stderr}");
    for log in ["offsets", "commits"] {
        let name = format!("{log}/18446744073709551615");
        std::fs::copy(ck.join(format!("{log}/0")), ck.join(&name)).unwrap();
        let (ok, _, stderr) = weir(&["run", "-e", sql, "--checkpoint", ck_s, "--max-batches", "1"]);
        assert!(!ok);
        assert!(
            stderr.contains("CHECKPOINT_FILE_CORRUPT") && stderr.contains(&name),
            "{stderr}"
        );
        std::fs::remove_file(ck.join(&name)).unwrap();
    }

    let files = |name: &str, content: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("f"), content).unwrap();
        d.display().to_string()
    };
    let read = |path: &str, format: &str, extra: &str| {
        weir(&[
            "run",
            "-e",
            &format!("SELECT * FROM STREAM read_files('{path}', format => '{format}'{extra})"),
            "--trigger",
            "availableNow",
        ])
    };
    // A JSON line nested 50,000 deep, between two good ones: a malformed record.
    let deep = format!(
        "{{\"a\": 1}}\n{}1{}\n{{\"a\": 2}}\n",
        "{\"a\":".repeat(50_000),
        "}".repeat(50_000)
    );
    let (ok, stdout, stderr) = read(&files("deep", &deep), "json", "");
    assert!(ok, "{stderr}");
    assert!(stdout.contains("|                NULL|   1|"), "{stdout}");
    assert!(
        stdout.contains("|{\"a\":{\"a\":{\"a\":{\"...|NULL|"),
        "{stdout}"
    );
    let (ok, _, stderr) = read(
        &files("deep2", &deep),
        "json",
        ", mode => 'FAILFAST', schema => 'a BIGINT'",
    );
    assert!(!ok);
    assert!(
        stderr.contains("MALFORMED_RECORD_IN_PARSING") && stderr.contains("deeper than 1000"),
        "{stderr}"
    );
    // Ragged CSV rows with an inferred schema: missing fields null, extra ones dropped.
    let (ok, stdout, stderr) = read(
        &files("ragged", "a,b,c\n1,2,3\n4,5\n6,7,8,9\n"),
        "csv",
        ", header => true",
    );
    assert!(ok, "{stderr}");
    for row in ["|  1|  2|   3|", "|  4|  5|NULL|", "|  6|  7|   8|"] {
        assert!(stdout.contains(row), "{row}: {stdout}");
    }
    // No JSON line at all: the lines are _corrupt_record rows, as the README says.
    let (ok, stdout, stderr) = read(&files("nojson", "hello\nworld\n"), "json", "");
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("|_corrupt_record|")
            && stdout.contains("|          hello|")
            && stdout.contains("|          world|"),
        "{stdout}"
    );
    // 100,000 JSON fields, and a 10 MB CSV line of 5,000,000 fields: refused by width.
    let wide_json = format!(
        "{{{}}}\n",
        (0..100_000)
            .map(|i| format!("\"f{i}\":{i}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let (ok, _, stderr) = read(&files("widejson", &wide_json), "json", "");
    assert!(!ok);
    assert!(stderr.contains("INFERRED_SCHEMA_TOO_WIDE"), "{stderr}");
    let wide_csv = format!("{}\n", vec!["1"; 5_000_000].join(","));
    let (ok, _, stderr) = read(&files("widecsv", &wide_csv), "csv", "");
    assert!(!ok);
    assert!(stderr.contains("INFERRED_SCHEMA_TOO_WIDE"), "{stderr}");
    // One 10 MB field is a right answer, not a hang.
    let long = format!("{}\n", "x".repeat(10_000_000));
    let (ok, stdout, stderr) = weir(&[
        "run",
        "-e",
        &format!(
            "SELECT length(_c0) AS n FROM STREAM read_files('{}', format => 'csv')",
            files("longcsv", &long)
        ),
        "--trigger",
        "availableNow",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("10000000"), "{stdout}");
}

/// The console rows `weir run` printed for `sql` over `batches` batches, sorted.
fn console_rows(sql: &str, batches: &str) -> Vec<String> {
    let (ok, stdout, stderr) = weir(&["run", "-e", sql, "--max-batches", batches]);
    assert!(ok, "{stderr}");
    let mut rows: Vec<String> = stdout
        .lines()
        .filter(|l| l.starts_with('|'))
        .map(str::to_string)
        .collect();
    rows.sort();
    rows
}

/// Spark carries the event-time marking through a projection's alias of `window()` and
/// `session_window()`: grouping by the alias in an outer query is accepted in append mode and
/// gives what grouping by the call gives (tumbling, sliding and session windows).
#[test]
fn a_window_grouped_by_its_alias_in_an_outer_query_equals_grouping_by_the_call() {
    let events = "STREAM rate_micro_batch(rowsPerBatch => 4, advanceMillisPerBatch => 10000) \
                  WATERMARK timestamp DELAY OF INTERVAL 5 SECONDS";
    for (call, extra) in [
        ("window(timestamp, '10 seconds')", ""),
        ("window(timestamp, '10 seconds', '5 seconds')", ""),
        ("session_window(timestamp, '6 seconds')", ", value % 2"),
    ] {
        let (inner_extra, outer_extra) = if extra.is_empty() {
            ("", "")
        } else {
            (", value % 2 AS k", ", k")
        };
        let aliased = format!(
            "SELECT w, count(*) AS n FROM (SELECT {call} AS w{inner_extra} FROM {events}) \
             GROUP BY w{outer_extra}"
        );
        let direct =
            format!("SELECT {call} AS w, count(*) AS n FROM {events} GROUP BY {call}{extra}");
        let got = console_rows(&aliased, "6");
        assert!(
            got.iter().any(|r| r.contains("start: 1970")),
            "{call}: no window was emitted: {got:?}"
        );
        assert_eq!(got, console_rows(&direct, "6"), "{call}");
    }
}

/// A checkpoint an earlier weir wrote for a query grouping by a window's alias (in update mode,
/// then grouped as by a plain column: no event time in its state keys) goes on as that weir
/// would have, rather than being refused for a changed state key; new checkpoints group by the
/// call. The offsets log's conf says which.
#[test]
fn a_checkpoint_of_an_earlier_weir_grouping_by_a_window_alias_goes_on_as_it_was_planned() {
    let sql = "CREATE STREAMING TABLE c USING console OPTIONS (outputMode 'update') AS SELECT w, \
               count(*) AS n FROM (SELECT window(timestamp, '10 seconds') AS w FROM STREAM \
               rate_micro_batch(rowsPerBatch => 4, advanceMillisPerBatch => 4000) WATERMARK \
               timestamp DELAY OF INTERVAL 5 SECONDS) GROUP BY w";
    let dir = tempfile::tempdir().unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/window-alias-update-7161e53");
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    support::copy_dir(&fixture, &old);
    // Each batch's updated count, as printed.
    let counts = |ck: &std::path::Path, batches: &str| -> Vec<String> {
        run_on_checkpoint(ck, sql, batches)
            .lines()
            .filter(|l| l.starts_with("|{start"))
            .map(|l| {
                l.trim_end_matches('|')
                    .rsplit('|')
                    .next()
                    .unwrap()
                    .trim()
                    .to_string()
            })
            .collect()
    };
    // Batches 3..5, as the weir that wrote the fixture printed them.
    assert_eq!(counts(&old, "3"), ["4", "8", "4"]);
    let conf = |ck: &std::path::Path| {
        let (ok, stdout, stderr) = weir(&["checkpoint", "inspect", ck.to_str().unwrap()]);
        assert!(ok, "{stderr}");
        stdout
    };
    assert!(
        conf(&old).contains("weir.sql.streaming.groupByWindowAlias = false"),
        "{}",
        conf(&old)
    );
    // A new checkpoint of the same query groups by the call, with the same answer.
    assert_eq!(counts(&new, "6"), ["4", "8", "12", "4", "8", "4"]);
    assert!(conf(&new).contains("weir.sql.streaming.groupByWindowAlias = true"));
}

/// What `weir run --checkpoint ck -e sql --max-batches batches` printed; it must succeed.
fn run_on_checkpoint(ck: &std::path::Path, sql: &str, batches: &str) -> String {
    let (ok, stdout, stderr) = weir(&[
        "run",
        "--checkpoint",
        ck.to_str().unwrap(),
        "-e",
        sql,
        "--max-batches",
        batches,
    ]);
    assert!(ok, "{stderr}");
    stdout
}

/// The rows `weir run --checkpoint ck -e sql --max-batches batches` printed to the console,
/// sorted, by batch.
fn console_rows_by_batch(
    ck: &std::path::Path,
    sql: &str,
    batches: &str,
) -> std::collections::BTreeMap<u64, Vec<String>> {
    let stdout = run_on_checkpoint(ck, sql, batches);
    let mut by_batch: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
    let mut batch = None;
    for line in stdout.lines() {
        if let Some(n) = line.strip_prefix("Batch: ") {
            batch = Some(n.trim().parse::<u64>().unwrap());
            by_batch.entry(batch.unwrap()).or_default();
        } else if line.starts_with("|  ") {
            by_batch
                .get_mut(&batch.unwrap())
                .unwrap()
                .push(line.to_string());
        }
    }
    for rows in by_batch.values_mut() {
        rows.sort();
    }
    by_batch
}

/// A `dropDuplicatesWithinWatermark` checkpoint an earlier weir wrote (its keys in the store
/// `default` only, expired ones found by scanning it) goes on in that layout, with the rows a new
/// checkpoint of the same query gives, which also indexes its keys by expiry.
#[test]
fn an_earlier_weirs_dedupe_within_watermark_checkpoint_goes_on_in_its_layout() {
    let sql = "CREATE STREAMING TABLE d USING console AS SELECT DISTINCT ON (k) WITHIN WATERMARK \
               k, timestamp FROM (SELECT value % 3 AS k, timestamp FROM STREAM \
               rate_micro_batch(rowsPerBatch => 2, advanceMillisPerBatch => 1000) WATERMARK \
               timestamp DELAY OF INTERVAL 2 SECONDS)";
    let dir = tempfile::tempdir().unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/dedupe-within-watermark-5e02e2f");
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    support::copy_dir(&fixture, &old);
    let rows = |ck: &std::path::Path, batches: &str| console_rows_by_batch(ck, sql, batches);
    let stores = |ck: &std::path::Path| {
        let (ok, stdout, stderr) = weir(&["checkpoint", "inspect", ck.to_str().unwrap()]);
        assert!(ok, "{stderr}");
        stdout
            .lines()
            .find(|l| l.contains("dedupeWithinWatermark"))
            .unwrap()
            .to_string()
    };
    let went_on = rows(&old, "5");
    let fresh = rows(&new, "8");
    assert_eq!(went_on.keys().copied().collect::<Vec<_>>(), [3, 4, 5, 6, 7]);
    for (batch, rows) in &went_on {
        assert_eq!(rows, &fresh[batch], "batch {batch}");
    }
    // Keys come back once the watermark passes their expiry: more rows than the three keys.
    assert!(
        went_on.values().map(Vec::len).sum::<usize>() > 3,
        "{went_on:?}"
    );
    assert!(
        stores(&old).contains("stores default  state"),
        "{}",
        stores(&old)
    );
    assert!(
        stores(&new).contains("stores default, default-by-expiry  state"),
        "{}",
        stores(&new)
    );
}

/// A stream-stream join stores only the columns of its sides that are read (here not `lv` nor
/// `rv`), as Spark's optimizer prunes them; a checkpoint an earlier weir wrote with whole rows
/// goes on storing whole rows, as its state's schema says, with the rows a new checkpoint gives.
#[test]
fn a_join_stores_only_the_columns_read_and_an_earlier_weirs_whole_rows_go_on() {
    let sql = "CREATE STREAMING TABLE j USING console AS SELECT l.k, l.ts AS lt, r.ts AS rt \
               FROM (SELECT value % 4 AS k, timestamp AS ts, value * 10 AS lv FROM STREAM \
               rate_micro_batch(rowsPerBatch => 4, advanceMillisPerBatch => 1000) WATERMARK \
               timestamp DELAY OF INTERVAL 2 SECONDS) l JOIN (SELECT value % 4 AS k, timestamp \
               AS ts, value * 100 AS rv FROM STREAM rate_micro_batch(rowsPerBatch => 4, \
               advanceMillisPerBatch => 1000) WATERMARK timestamp DELAY OF INTERVAL 2 SECONDS) r \
               ON l.k = r.k AND r.ts BETWEEN l.ts - INTERVAL 1 SECOND AND l.ts + INTERVAL 1 SECOND";
    let dir = tempfile::tempdir().unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/join-whole-rows-a567ce3");
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    support::copy_dir(&fixture, &old);
    let rows = |ck: &std::path::Path, batches: &str| console_rows_by_batch(ck, sql, batches);
    // The join's stored value columns, and the conf, as `checkpoint inspect` prints them.
    let inspect = |ck: &std::path::Path| {
        let (ok, stdout, stderr) = weir(&["checkpoint", "inspect", ck.to_str().unwrap()]);
        assert!(ok, "{stderr}");
        let value = stdout
            .lines()
            .skip_while(|l| !l.contains("streamStreamJoin"))
            .find_map(|l| l.trim().strip_prefix("value: "))
            .unwrap()
            .to_string();
        (value, stdout)
    };
    let went_on = rows(&old, "3");
    let fresh = rows(&new, "6");
    assert_eq!(went_on.keys().copied().collect::<Vec<_>>(), [3, 4, 5]);
    for (batch, rows) in &went_on {
        assert_eq!(rows, &fresh[batch], "batch {batch}");
        assert!(!rows.is_empty(), "batch {batch} joined nothing");
    }
    let (old_value, old_text) = inspect(&old);
    assert_eq!(
        old_value,
        "`left.k` BIGINT, `left.ts` TIMESTAMP, `left.lv` BIGINT, `right.k` BIGINT, \
         `right.ts` TIMESTAMP, `right.rv` BIGINT"
    );
    assert!(
        old_text.contains("weir.sql.streaming.join.prunedInputs = false"),
        "{old_text}"
    );
    let (new_value, new_text) = inspect(&new);
    assert_eq!(
        new_value,
        "`left.k` BIGINT, `left.ts` TIMESTAMP, `right.k` BIGINT, `right.ts` TIMESTAMP"
    );
    assert!(
        new_text.contains("weir.sql.streaming.join.prunedInputs = true"),
        "{new_text}"
    );
}

/// `SELECT DISTINCT ON (keys) WITHIN WATERMARK` is Spark's `dropDuplicatesWithinWatermark`;
/// and, with the batch-0 watermark of 0, rows at event time 0 are late for deduplication, a
/// join and an aggregation by the raw event time (Spark's `eventTime <= watermark`), while a
/// window aggregation keeps them (its rows' event time is their window's end).
#[test]
fn dedupe_within_watermark_has_a_sql_form_and_event_time_zero_follows_sparks_rule() {
    let dir = tempfile::tempdir().unwrap();
    let events = "STREAM rate_micro_batch(rowsPerBatch => 4, advanceMillisPerBatch => 1000) \
                  WATERMARK timestamp DELAY OF INTERVAL 0 SECONDS";
    let progress = |sql: &str| -> Vec<(String, i64, i64)> {
        let file = dir.path().join("p.json");
        let (ok, _, stderr) = weir(&[
            "run",
            "-e",
            sql,
            "--max-batches",
            "2",
            "--progress",
            file.to_str().unwrap(),
        ]);
        assert!(ok, "{stderr}");
        std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .map(|l| {
                let p: serde_json::Value = serde_json::from_str(l).unwrap();
                let s = &p["stateOperators"][0];
                (
                    s["operatorName"].as_str().unwrap().to_string(),
                    s["numRowsTotal"].as_i64().unwrap(),
                    s["numRowsDroppedByWatermark"].as_i64().unwrap(),
                )
            })
            .collect()
    };
    let dropped_in_batch_0 = |sql: &str, name: &str| {
        let p = progress(sql);
        assert_eq!(p[0].0, name, "{sql}");
        p[0].2
    };
    assert_eq!(
        dropped_in_batch_0(
            &format!("SELECT DISTINCT ON (value) WITHIN WATERMARK value, timestamp FROM {events}"),
            "dedupeWithinWatermark"
        ),
        4
    );
    assert_eq!(
        dropped_in_batch_0(
            &format!("SELECT DISTINCT ON (value, timestamp) value, timestamp FROM {events}"),
            "dedupe"
        ),
        4
    );
    assert!(
        dropped_in_batch_0(
            &format!(
                "SELECT a.value FROM {events} AS a JOIN {events} AS b ON a.value = b.value AND \
                 a.timestamp BETWEEN b.timestamp - INTERVAL 1 SECOND AND b.timestamp + \
                 INTERVAL 1 SECOND"
            ),
            "streamStreamJoin"
        ) > 0
    );
    assert!(
        dropped_in_batch_0(
            &format!("SELECT timestamp, count(*) AS n FROM {events} GROUP BY timestamp"),
            "aggregate"
        ) > 0
    );
    let windowed = progress(&format!(
        "SELECT window(timestamp, '10 seconds') AS w, count(*) AS n FROM {events} GROUP BY \
         window(timestamp, '10 seconds')"
    ));
    assert_eq!(windowed[0], ("aggregate".to_string(), 1, 0));

    // Within the watermark a key is forgotten once the watermark passes its first event time
    // plus the delay: each key comes out again a few batches later.
    let rows = console_rows(
        "SELECT DISTINCT ON (k) WITHIN WATERMARK k FROM (SELECT value % 2 AS k, timestamp FROM \
         STREAM rate_micro_batch(rowsPerBatch => 2, advanceMillisPerBatch => 1000) WATERMARK \
         timestamp DELAY OF INTERVAL 1 SECOND)",
        "8",
    );
    let ones = rows.iter().filter(|r| r.as_str() == "|  1|").count();
    assert!(ones >= 2, "{rows:?}");
}

/// `weir checkpoint repartition` refuses a partition count that cannot be meant (each is a
/// store instance with files of its own) before touching anything, and a rewrite that fails
/// half-way (here on a damaged changelog) leaves the checkpoint exactly as it was: no new state
/// folders, no unfinished reset that would refuse the next run.
#[test]
fn repartition_is_bounded_and_a_failed_one_leaves_the_checkpoint_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (ck, out) = (dir.path().join("ck"), dir.path().join("out"));
    let sql = format!(
        "CREATE STREAMING TABLE d USING parquet LOCATION '{}' AS SELECT DISTINCT ON (k) k, value \
         FROM (SELECT value % 7 AS k, value FROM STREAM rate_micro_batch(rowsPerBatch => 5))",
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
        "3",
    ]);
    assert!(ok, "{stderr}");
    let before = support::contents(&ck);
    for n in ["1000000", "0"] {
        let (ok, _, stderr) = weir(&["checkpoint", "repartition", ck_s, "--partitions", n]);
        assert!(!ok, "{n} partitions accepted");
        assert!(stderr.contains("STREAMING_INVALID_OPTION"), "{stderr}");
        assert_eq!(support::contents(&ck), before, "{n}");
    }
    // A changelog the rewrite needs, damaged: the repartition fails and cleans up.
    let log = ck.join("state/0/0/default/3.changelog");
    let good = std::fs::read(&log).unwrap();
    let mut bad = good.clone();
    let at = bad.len() / 2;
    bad[at] ^= 0x40;
    std::fs::write(&log, &bad).unwrap();
    let damaged = support::contents(&ck);
    let (ok, _, stderr) = weir(&["checkpoint", "repartition", ck_s, "--partitions", "3"]);
    assert!(!ok);
    assert!(stderr.contains("STATE_STORE_FILE_CORRUPT"), "{stderr}");
    assert_eq!(
        support::contents(&ck),
        damaged,
        "the failed repartition left files behind"
    );
    std::fs::write(&log, &good).unwrap();
    let (ok, _, stderr) = weir(&[
        "run",
        "-e",
        &sql,
        "--checkpoint",
        ck_s,
        "--max-batches",
        "1",
    ]);
    assert!(
        ok,
        "the checkpoint refuses to run after a failed repartition: {stderr}"
    );
    let (ok, _, stderr) = weir(&["checkpoint", "repartition", ck_s, "--partitions", "3"]);
    assert!(ok, "{stderr}");
}

/// A second checkpoint writing to a file sink folder that another query's batches are in would
/// have its own batches 0, 1, ... skipped as already written: it is refused before it runs.
#[test]
fn a_second_checkpoint_on_one_file_sink_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sql = format!(
        "CREATE STREAMING TABLE t USING parquet LOCATION '{}' AS SELECT value FROM STREAM \
         rate_micro_batch(rowsPerBatch => 5)",
        dir.path().join("out").display()
    );
    let run = |ck: &str| {
        let ck = dir.path().join(ck);
        weir(&[
            "run",
            "-e",
            &sql,
            "--checkpoint",
            ck.to_str().unwrap(),
            "--max-batches",
            "2",
        ])
    };
    let (ok, _, stderr) = run("a");
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = run("b");
    assert!(!ok, "a second checkpoint wrote into the folder");
    assert!(
        stderr.contains("STREAMING_SINK_OUTPUT_OF_ANOTHER_QUERY"),
        "{stderr}"
    );
    assert!(!dir.path().join("b/offsets").exists());
}

/// A full refresh clears a file sink folder whose manifest is damaged (the part files are found
/// by their names), instead of stopping half-way with every run refused.
#[test]
fn a_full_refresh_clears_a_file_sink_whose_manifest_is_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let (ck, out) = (dir.path().join("ck"), dir.path().join("out"));
    let sql = format!(
        "CREATE STREAMING TABLE t USING parquet LOCATION '{}' AS SELECT value FROM STREAM \
         rate_micro_batch(rowsPerBatch => 5)",
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
    let entry = out.join("_weir_metadata/1");
    let mut bytes = std::fs::read(&entry).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&entry, bytes).unwrap();
    let (ok, _, stderr) = weir(&["checkpoint", "reset", ck_s, "--full"]);
    assert!(ok, "{stderr}");
    let parts = std::fs::read_dir(&out)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("part-")
        })
        .count();
    assert_eq!(parts, 0, "part files left after the refresh");
    let (ok, _, stderr) = weir(&[
        "run",
        "-e",
        &sql,
        "--checkpoint",
        ck_s,
        "--max-batches",
        "1",
    ]);
    assert!(ok, "{stderr}");
}

#[test]
fn pipeline_init_makes_a_project_once_and_refuses_to_overwrite_it() {
    let dir = tempfile::tempdir().unwrap();
    let init = || {
        let out = support::weir_command()
            .args(["pipeline", "init", "orders"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stdout, stderr) = init();
    assert!(ok, "{stderr}");
    assert!(stdout.contains("weir-pipeline.yml"), "{stdout}");
    let project = dir.path().join("orders");
    let spec = std::fs::read_to_string(project.join("weir-pipeline.yml")).unwrap();
    assert!(spec.contains("name: orders"), "{spec}");
    assert!(project.join("transformations/example.sql").is_file());
    let before = support::contents(&project);
    let (ok, _, stderr) = init();
    assert!(!ok);
    assert!(stderr.contains("PIPELINE_PROJECT_EXISTS"), "{stderr}");
    assert_eq!(support::contents(&project), before, "left as it was");
}

#[test]
fn pipeline_dry_run_shows_the_stages_of_a_sound_graph_and_every_problem_of_a_broken_one() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("orders");
    std::fs::create_dir_all(project.join("transformations/more")).unwrap();
    std::fs::write(
        project.join("weir-pipeline.yml"),
        "name: orders\nstorage: store\nlibraries:\n  - glob:\n      include: transformations/**\n",
    )
    .unwrap();
    std::fs::write(
        project.join("transformations/tables.sql"),
        "CREATE STREAMING TABLE raw AS SELECT * FROM STREAM rate_micro_batch(rowsPerBatch => 4);\n\
         CREATE STREAMING TABLE all_rows;\n\
         CREATE FLOW copy AS INSERT INTO all_rows BY NAME SELECT * FROM STREAM raw;\n",
    )
    .unwrap();
    std::fs::write(
        project.join("transformations/more/views.sql"),
        "CREATE MATERIALIZED VIEW total AS SELECT count(*) AS n FROM all_rows;\n",
    )
    .unwrap();
    let dry_run = |cwd: &std::path::Path| {
        let out = support::weir_command()
            .args(["pipeline", "dry-run"])
            .current_dir(cwd)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Found from a folder below the spec's.
    let (ok, stdout, stderr) = dry_run(&project.join("transformations/more"));
    assert!(ok, "{stderr}");
    let stages: Vec<&str> = stdout.lines().filter(|l| l.contains(" → ")).collect();
    assert_eq!(
        stages,
        [
            "    raw → raw (append)",
            "    copy → all_rows (append, reads raw)",
            "    total → total (materialized view, reads all_rows)"
        ],
        "{stdout}"
    );
    assert!(!project.join("store").exists(), "a dry run writes nothing");

    std::fs::write(
        project.join("transformations/more/broken.sql"),
        "CREATE MATERIALIZED VIEW raw AS SELECT 1;\n\
         CREATE FLOW lost AS INSERT INTO nowhere BY NAME SELECT * FROM STREAM raw;\n",
    )
    .unwrap();
    let (ok, _, stderr) = dry_run(&project);
    assert!(!ok);
    assert!(
        stderr.contains("PIPELINE_DUPLICATE_IDENTIFIERS.DATASET")
            && stderr.contains("TABLE_OR_VIEW_NOT_FOUND")
            && stderr.contains("2 problem(s) found"),
        "{stderr}"
    );
}
