//! `weir pipeline run` on real projects: flows in stages into Delta tables, checkpoints per
//! flow, once flows, materialized views.

use crate::support;

/// A project in `dir` whose one library file holds `sql`.
pub(crate) fn project(dir: &std::path::Path, sql: &str) -> std::path::PathBuf {
    let project = dir.join("p");
    std::fs::create_dir_all(project.join("transformations")).unwrap();
    std::fs::write(
        project.join("weir-pipeline.yml"),
        "name: p\nstorage: store\nlibraries:\n  - glob:\n      include: transformations/**\n",
    )
    .unwrap();
    std::fs::write(project.join("transformations/all.sql"), sql).unwrap();
    project
}

/// `weir pipeline run` in `project`: whether it succeeded, and its stderr.
fn update(project: &std::path::Path) -> (bool, String) {
    update_with(project, &[])
}

/// `weir pipeline run ARGS` in `project`.
pub(crate) fn update_with(project: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = support::weir_command()
        .args(["pipeline", "run"])
        .args(args)
        .current_dir(project)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The rows of batch `sql` over the pipeline's `tables` (read from their Delta folders).
pub(crate) fn rows(project: &std::path::Path, tables: &[&str], sql: &str) -> Vec<String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let session = weir::WeirSession::new();
        for t in tables {
            let path = project.join("store/tables").join(t);
            session
                .register_delta_table(t, path.to_str().unwrap(), &weir::Options::new())
                .await
                .unwrap();
        }
        support::text_rows(&session, sql).await
    })
}

pub(crate) const PIPELINE: &str = "
CREATE STREAMING TABLE raw AS
SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 4);

-- One table fed by three flows: two streaming, one once.
CREATE STREAMING TABLE all_rows;
CREATE FLOW evens AS INSERT INTO all_rows BY NAME SELECT value FROM STREAM raw WHERE value % 2 = 0;
CREATE FLOW odds AS INSERT INTO all_rows BY NAME SELECT value FROM STREAM raw WHERE value % 2 = 1;
CREATE FLOW seed AS INSERT INTO ONCE all_rows BY NAME SELECT CAST(-1 AS BIGINT) AS value;

CREATE TEMPORARY VIEW positive AS SELECT value FROM all_rows WHERE value >= 0;
CREATE MATERIALIZED VIEW total AS SELECT count(*) AS n, sum(value) AS s FROM positive;
";

#[test]
fn an_update_runs_every_flow_in_stages_and_the_next_goes_on_from_each_flows_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let project = project(dir.path(), PIPELINE);
    let (ok, stderr) = update(&project);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("seed → all_rows: 1 row(s) written"),
        "{stderr}"
    );
    assert_eq!(
        rows(
            &project,
            &["all_rows"],
            "SELECT value FROM all_rows ORDER BY value"
        ),
        ["-1", "0", "1", "2", "3"]
    );
    assert_eq!(
        rows(&project, &["total"], "SELECT n, s FROM total"),
        ["4,6"]
    );
    for flow in [
        "raw/raw",
        "all_rows/evens",
        "all_rows/odds",
        "all_rows/seed",
        "total/total",
    ] {
        assert!(
            project.join("store/_checkpoints").join(flow).is_dir(),
            "{flow}: {stderr}"
        );
    }

    // The next update: each streaming flow reads the source's next batch once, the once flow
    // does not run again, the view is recomputed.
    let (ok, stderr) = update(&project);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("seed → all_rows: once flow, done in an earlier update"),
        "{stderr}"
    );
    assert_eq!(
        rows(
            &project,
            &["all_rows"],
            "SELECT value FROM all_rows ORDER BY value"
        ),
        ["-1", "0", "1", "2", "3", "4", "5", "6", "7"]
    );
    assert_eq!(
        rows(&project, &["total"], "SELECT n, s FROM total"),
        ["8,28"]
    );
}

#[test]
fn a_flow_that_does_not_plan_stops_the_update_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let project = project(
        dir.path(),
        "CREATE STREAMING TABLE raw AS SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 4);
         CREATE STREAMING TABLE bad AS SELECT no_such_column FROM STREAM raw;
         CREATE MATERIALIZED VIEW after_bad AS SELECT count(*) AS n FROM bad;",
    );
    let (ok, stderr) = update(&project);
    assert!(!ok);
    assert!(
        stderr.contains("bad → bad: FAILED") && stderr.contains("no_such_column"),
        "{stderr}"
    );
    assert!(
        stderr.contains("after_bad → after_bad: not run") && stderr.contains("raw → raw: not run"),
        "{stderr}"
    );
    assert!(stderr.contains("1 flow(s) failed"), "{stderr}");
    assert!(
        !project.join("store/tables").exists(),
        "nothing was written"
    );
}

#[test]
fn refresh_selections_update_only_the_named_datasets_and_a_full_refresh_recomputes_one() {
    let dir = tempfile::tempdir().unwrap();
    let project = project(dir.path(), PIPELINE);
    let all_rows = || {
        rows(
            &project,
            &["all_rows"],
            "SELECT value FROM all_rows ORDER BY value",
        )
    };
    let (ok, stderr) = update(&project);
    assert!(ok, "{stderr}");

    // Only raw: it reads its next batch; all_rows and total stay as they were.
    let (ok, stderr) = update_with(&project, &["--refresh", "raw"]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("evens → all_rows: not selected by --refresh / --full-refresh"),
        "{stderr}"
    );
    assert_eq!(rows(&project, &["raw"], "SELECT count(*) FROM raw"), ["8"]);
    assert_eq!(all_rows(), ["-1", "0", "1", "2", "3"]);
    assert_eq!(
        rows(&project, &["total"], "SELECT n, s FROM total"),
        ["4,6"]
    );

    // all_rows starts over: its flows read raw from the start again and the once flow runs
    // again; raw (not selected) reads nothing new.
    let (ok, stderr) = update_with(&project, &["--full-refresh", "all_rows"]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("seed → all_rows: 1 row(s) written"),
        "{stderr}"
    );
    assert_eq!(all_rows(), ["-1", "0", "1", "2", "3", "4", "5", "6", "7"]);
    assert_eq!(rows(&project, &["raw"], "SELECT count(*) FROM raw"), ["8"]);

    // Selections that do not mean one thing, or name no dataset, are refused before anything
    // runs.
    let before = support::contents(&project.join("store"));
    let (ok, stderr) = update_with(&project, &["--full-refresh-all", "--refresh", "raw"]);
    assert!(
        !ok && stderr.contains("CONFLICTING_PIPELINE_REFRESH_OPTIONS"),
        "{stderr}"
    );
    let (ok, stderr) = update_with(&project, &["--refresh", "nope"]);
    assert!(
        !ok && stderr.contains("TABLE_OR_VIEW_NOT_FOUND"),
        "{stderr}"
    );
    assert_eq!(support::contents(&project.join("store")), before);
}

const RAW: &str = "CREATE STREAMING TABLE raw AS \
                   SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 4);\n";
const FIRSTS_DEDUPED: &str = "CREATE STREAMING TABLE firsts AS SELECT DISTINCT ON (k) k, value \
                              FROM (SELECT value % 3 AS k, value FROM STREAM raw);";

/// Rewrites the project of [`RAW`] and [`FIRSTS_DEDUPED`] without the deduplication.
fn remove_dedupe(project: &std::path::Path) {
    std::fs::write(
        project.join("transformations/all.sql"),
        format!(
            "{RAW}CREATE STREAMING TABLE firsts AS SELECT value % 3 AS k, value FROM STREAM raw;"
        ),
    )
    .unwrap();
}

#[test]
fn a_flow_whose_state_no_longer_fits_its_query_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let project = project(dir.path(), &format!("{RAW}{FIRSTS_DEDUPED}"));
    let (ok, stderr) = update(&project);
    assert!(ok, "{stderr}");
    // One row per key (which row of a key a deduplication keeps is not defined, as in Spark).
    assert_eq!(
        rows(&project, &["firsts"], "SELECT k FROM firsts ORDER BY k"),
        ["0", "1", "2"]
    );

    // The deduplication is removed: its state no longer fits the flow's query.
    remove_dedupe(&project);
    // Tables and checkpoints, not the event log (which records the refused update).
    let data = || {
        let mut c = support::contents(&project.join("store"));
        c.retain(|(f, _)| !f.starts_with("_event_log"));
        c
    };
    let before = data();
    let out = support::weir_command()
        .args(["pipeline", "dry-run"])
        .current_dir(&project)
        .output()
        .unwrap();
    let dry = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        dry.contains("flow 'firsts' cannot restart from its checkpoint")
            && dry.contains("STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA"),
        "{dry}"
    );
    let (ok, stderr) = update(&project);
    assert!(!ok);
    assert!(
        stderr.contains("firsts → firsts: FAILED")
            && stderr.contains("STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA")
            && stderr.contains("raw → raw: not run"),
        "{stderr}"
    );
    assert_eq!(data(), before, "nothing was written");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let failures = rt.block_on(async {
        let storage = project.join("store").display().to_string();
        support::text_rows(
            &weir::WeirSession::new(),
            &format!(
                "SELECT flow_name, error_class FROM event_log('{storage}') WHERE level = 'ERROR'"
            ),
        )
        .await
    });
    assert_eq!(
        failures,
        ["firsts,STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA"]
    );

    // A full refresh of the table starts its flow over with the new query.
    let (ok, stderr) = update_with(&project, &["--full-refresh", "firsts"]);
    assert!(ok, "{stderr}");
    assert_eq!(
        rows(&project, &["firsts"], "SELECT count(*) FROM firsts"),
        ["4"]
    );
}

#[test]
fn a_reset_checkpoint_lets_a_changed_flow_go_on_and_keeps_its_tables_rows() {
    let dir = tempfile::tempdir().unwrap();
    let project = project(dir.path(), &format!("{RAW}{FIRSTS_DEDUPED}"));
    let (ok, stderr) = update(&project);
    assert!(ok, "{stderr}");
    remove_dedupe(&project);
    let (ok, stderr) = update(&project);
    assert!(!ok, "{stderr}");

    // Only the flow's checkpoint is fitted to the new query: the deduplication's state goes,
    // the flow continues after the raw rows it read, and the table keeps its three rows.
    let (ok, stderr) = update_with(&project, &["--reset-checkpoint", "firsts"]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("Checkpoint of flow 'firsts' reset"),
        "{stderr}"
    );
    assert_eq!(rows(&project, &["raw"], "SELECT count(*) FROM raw"), ["8"]);
    assert_eq!(
        rows(
            &project,
            &["firsts"],
            "SELECT count(*), count(*) FILTER (WHERE value >= 4) FROM firsts"
        ),
        ["7,4"]
    );
    let (ok, stderr) = update_with(&project, &["--reset-checkpoint", "nope"]);
    assert!(
        !ok && stderr.contains("PIPELINE_FLOW_NOT_FOUND"),
        "{stderr}"
    );
}

#[test]
fn every_update_writes_its_events_to_the_event_log() {
    let dir = tempfile::tempdir().unwrap();
    let project = project(dir.path(), PIPELINE);
    let (ok, stderr) = update(&project);
    assert!(ok, "{stderr}");
    let (ok, stderr) = update_with(&project, &["--refresh", "raw"]);
    assert!(ok, "{stderr}");

    let storage = project.join("store");
    let events = |sql: &str| {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let session = weir::WeirSession::new();
            support::text_rows(
                &session,
                &sql.replace("STORE", &storage.display().to_string()),
            )
            .await
        })
    };
    assert_eq!(
        events("SELECT count(DISTINCT update_id) FROM event_log('STORE')"),
        ["2"]
    );
    // Per update: created, running, completed; per flow its statuses.
    assert_eq!(
        events(
            "SELECT event_type, count(*) FROM event_log('STORE') \
             WHERE event_type <> 'flow_progress' GROUP BY event_type ORDER BY event_type"
        ),
        ["create_update,2", "update_progress,4"]
    );
    let seed: Vec<String> = events(
        "SELECT details FROM event_log('STORE') WHERE flow_name = 'seed' \
         ORDER BY timestamp, sequence",
    );
    let statuses: Vec<String> = seed
        .iter()
        .map(|d| {
            let v: serde_json::Value = serde_json::from_str(d).unwrap();
            v["flow_progress"]["status"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(statuses, ["STARTING", "COMPLETED", "EXCLUDED"]);
    // Each micro-batch's progress record is in the log, with Spark's field names.
    let progress = events(
        "SELECT details FROM event_log('STORE') WHERE flow_name = 'raw' \
         AND details LIKE '%\"RUNNING\"%' ORDER BY timestamp, sequence",
    );
    assert_eq!(progress.len(), 2, "{progress:?}");
    let p: serde_json::Value = serde_json::from_str(&progress[1]).unwrap();
    assert_eq!(p["flow_progress"]["progress"]["numInputRows"], 4);
    assert_eq!(p["flow_progress"]["progress"]["batchId"], 1);

    let out = support::weir_command()
        .args(["pipeline", "events"])
        .current_dir(&project)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        table.contains("Update has COMPLETED.") && table.contains("Flow 'seed' is EXCLUDED"),
        "{table}"
    );
}

#[test]
fn an_update_killed_inside_a_flow_loses_and_doubles_nothing_when_run_again() {
    for stage in ["after_wal", "after_get_batch", "after_sink", "after_commit"] {
        let dir = tempfile::tempdir().unwrap();
        let project = project(dir.path(), PIPELINE);
        let spec = project.join("weir-pipeline.yml");
        support::kill_at(
            &["pipeline", "run", "--spec", spec.to_str().unwrap()],
            stage,
            0,
            &[],
        );
        // The killed update's events up to its start are in the event log: it reads RUNNING.
        let rt = tokio::runtime::Runtime::new().unwrap();
        let progress = rt.block_on(async {
            let storage = project.join("store").display().to_string();
            support::text_rows(
                &weir::WeirSession::new(),
                &format!(
                    "SELECT count(DISTINCT update_id), string_agg(message, ' | ') \
                     FROM event_log('{storage}') WHERE event_type = 'update_progress'"
                ),
            )
            .await
        });
        assert_eq!(progress, ["1,Update is RUNNING."], "{stage}");
        for _ in 0..2 {
            let (ok, stderr) = update(&project);
            assert!(ok, "{stage}: {stderr}");
        }
        let raw: Vec<i64> = rows(&project, &["raw"], "SELECT value FROM raw ORDER BY value")
            .iter()
            .map(|v| v.parse().unwrap())
            .collect();
        assert!(
            raw.len() >= 8 && raw.len().is_multiple_of(4),
            "{stage}: whole batches: {raw:?}"
        );
        assert_eq!(
            raw,
            (0..raw.len() as i64).collect::<Vec<_>>(),
            "{stage}: each value once"
        );
        let all: Vec<i64> = rows(
            &project,
            &["all_rows"],
            "SELECT value FROM all_rows ORDER BY value",
        )
        .iter()
        .map(|v| v.parse().unwrap())
        .collect();
        let mut expected = vec![-1];
        expected.extend(&raw);
        assert_eq!(all, expected, "{stage}: every raw row once, the seed once");
        let n = raw.len() as i64;
        assert_eq!(
            rows(&project, &["total"], "SELECT n, s FROM total"),
            [format!("{n},{}", n * (n - 1) / 2)],
            "{stage}"
        );
    }
}

#[test]
fn a_once_flow_backfills_a_fully_refreshed_table_from_a_version_kept_before_the_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let project = project(
        dir.path(),
        &format!("{RAW}CREATE STREAMING TABLE events AS SELECT value FROM STREAM raw;"),
    );
    for _ in 0..2 {
        let (ok, stderr) = update(&project);
        assert!(ok, "{stderr}");
    }
    let events = || {
        rows(
            &project,
            &["events"],
            "SELECT value FROM events ORDER BY value",
        )
    };
    let all: Vec<String> = (0..8).map(|v| v.to_string()).collect();
    assert_eq!(events(), all);
    // The table keeps only new values from now on; a once flow restores version `v`.
    let backfill_from = |v: u32| {
        std::fs::write(
            project.join("transformations/all.sql"),
            format!(
                "{RAW}CREATE STREAMING TABLE events AS SELECT value FROM STREAM raw \
                 WHERE value >= 100;\n\
                 CREATE FLOW backfill AS INSERT INTO ONCE events BY NAME \
                 SELECT value FROM events VERSION AS OF {v};"
            ),
        )
        .unwrap();
    };

    // The table's query changes to keep only new values and the table is fully refreshed: the
    // refresh empties it, and a once flow puts back what version 2 (before the refresh) held.
    backfill_from(2);
    let (ok, stderr) = update_with(&project, &["--full-refresh", "events"]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("backfill → events: 8 row(s) written"),
        "{stderr}"
    );
    assert_eq!(events(), all);

    // A version the table does not have stops the update before anything is written.
    backfill_from(99);
    let (ok, stderr) = update_with(&project, &["--full-refresh", "events"]);
    assert!(!ok);
    assert!(stderr.contains("DELTA_VERSION_NOT_FOUND"), "{stderr}");
    assert_eq!(events(), all, "nothing was written");
}

#[test]
fn a_continuous_update_keeps_its_flows_running_until_stopped_and_records_it_canceled() {
    let dir = tempfile::tempdir().unwrap();
    let project = project(
        dir.path(),
        &format!(
            "{RAW}CREATE STREAMING TABLE evens AS SELECT value FROM STREAM raw WHERE value % 2 = 0;\n\
             CREATE MATERIALIZED VIEW total AS SELECT count(*) AS n FROM evens;"
        ),
    );
    let mut child = support::weir_command()
        .args([
            "pipeline",
            "run",
            "--continuous",
            "--trigger-interval",
            "200 milliseconds",
        ])
        .current_dir(&project)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let count = |table: &str| -> i64 {
        let path = project.join("store/tables").join(table);
        if !path.join("_delta_log").is_dir() {
            return 0;
        }
        rows(&project, &[table], &format!("SELECT count(*) FROM {table}"))[0]
            .parse()
            .unwrap()
    };
    let started = std::time::Instant::now();
    // Batches keep coming after the first pass (which reads one), and the view follows.
    while count("raw") < 16 || count("evens") < 8 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the flows did not keep running"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the update ended by itself"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("The update was stopped.")
            && stderr.contains("raw → raw: ran continuously"),
        "{stderr}"
    );
    // Every even value the table holds once; the view counted a state of it.
    let evens: Vec<i64> = rows(
        &project,
        &["evens"],
        "SELECT value FROM evens ORDER BY value",
    )
    .iter()
    .map(|v| v.parse().unwrap())
    .collect();
    assert_eq!(
        evens,
        (0..evens.len() as i64).map(|i| 2 * i).collect::<Vec<_>>()
    );
    let total: i64 = rows(&project, &["total"], "SELECT n FROM total")[0]
        .parse()
        .unwrap();
    assert!(total >= 4 && total <= evens.len() as i64, "{total}");
    let storage = project.join("store").display().to_string();
    let states = tokio::runtime::Runtime::new().unwrap().block_on(async {
        support::text_rows(
            &weir::WeirSession::new(),
            &format!(
                "SELECT message FROM event_log('{storage}') \
                 WHERE event_type = 'update_progress' ORDER BY sequence"
            ),
        )
        .await
    });
    assert_eq!(
        states,
        ["Update is RUNNING.", "Update is CANCELED: it was stopped."]
    );
}
