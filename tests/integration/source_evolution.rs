//! Named sources and source evolution across real restarts: sources reordered, added and
//! removed from one checkpoint, each read exactly once; a removed name cannot come back; the
//! setting cannot change on a checkpoint.

use crate::support;

const EVOLUTION: &str = "queryEvolution.enableSourceEvolution";

/// `weir run --checkpoint ck --max-batches n -e sql`: success and stderr.
fn run(ck: &str, batches: u32, sql: &str) -> (bool, String) {
    let out = support::weir_command()
        .args([
            "run",
            "--checkpoint",
            ck,
            "--max-batches",
            &batches.to_string(),
        ])
        .args(["-e", sql])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A query of `sources` (SQL selects of one column `value`, unioned) into the parquet folder
/// `out`, with source evolution `on` or off.
fn query(out: &str, on: bool, sources: &[&str]) -> String {
    format!(
        "CREATE STREAMING TABLE t USING parquet LOCATION '{out}' OPTIONS ({EVOLUTION} '{on}') AS \
         {}",
        sources.join(" UNION ALL ")
    )
}

/// Source `a`: 10 rows a batch, values from 0. Source `b`: 5 rows a batch, values from 1000.
const A: &str = "SELECT value FROM STREAM(rate_micro_batch(rowsPerBatch => 10), name => 'a')";
const B: &str =
    "SELECT value + 1000 AS value FROM STREAM(rate_micro_batch(rowsPerBatch => 5), name => 'b')";

fn values(out: &str) -> Vec<i64> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rows = rt.block_on(async {
        let session = weir::WeirSession::new();
        session
            .run_script(
                &format!("CREATE EXTERNAL TABLE o STORED AS PARQUET LOCATION '{out}'"),
                &weir::ScriptOptions::default(),
            )
            .await
            .unwrap();
        support::text_rows(&session, "SELECT value FROM o ORDER BY value").await
    });
    rows.iter().map(|v| v.parse().unwrap()).collect()
}

#[test]
fn named_sources_are_reordered_added_and_removed_each_reading_every_row_once() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck").display().to_string();
    let out = dir.path().join("out").display().to_string();

    // Batches 0, 1: a reads 0..19.
    let (ok, err) = run(&ck, 2, &query(&out, true, &[A]));
    assert!(ok, "{err}");
    // validate pairs the sources by name.
    let file = dir.path().join("q.sql");
    std::fs::write(&file, query(&out, true, &[B, A])).unwrap();
    let v = support::weir_command()
        .args([
            "checkpoint",
            "validate",
            &ck,
            file.to_str().unwrap(),
            "--json",
        ])
        .output()
        .unwrap();
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stdout));
    let r: serde_json::Value = serde_json::from_slice(&v.stdout).unwrap();
    let changes: Vec<(String, String)> = r["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["change"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [("b".into(), "added".into()), ("a".into(), "same".into())]
    );
    // Batches 2, 3: b added in front of a; a continues with 20..39, b starts: 1000..1009.
    let (ok, err) = run(&ck, 2, &query(&out, true, &[B, A]));
    assert!(ok, "{err}");
    // Batch 4: a removed; b continues: 1010..1014.
    let (ok, err) = run(&ck, 1, &query(&out, true, &[B]));
    assert!(ok, "{err}");
    let expected: Vec<i64> = (0..40).chain(1000..1015).collect();
    assert_eq!(values(&out), expected);

    // A removed source cannot come back (its offsets are gone).
    let (ok, err) = run(&ck, 1, &query(&out, true, &[B, A]));
    assert!(!ok);
    assert!(err.contains("STREAMING_SOURCE_NAME_REMOVED"), "{err}");
    // Another source behind a kept name is refused.
    let other_b = "SELECT value FROM STREAM(rate(rowsPerSecond => 5), name => 'b')";
    let (ok, err) = run(&ck, 1, &query(&out, true, &[other_b]));
    assert!(!ok);
    assert!(err.contains("STREAMING_QUERY_SOURCES_CHANGED"), "{err}");
    // Turning evolution off is refused.
    let (ok, err) = run(&ck, 1, &query(&out, false, &[B]));
    assert!(!ok);
    assert!(
        err.contains("STREAMING_QUERY_EVOLUTION_SETTING_CHANGED"),
        "{err}"
    );
    assert_eq!(values(&out), expected, "the refused restarts wrote nothing");

    // The offsets log keys each range by name; the removed name is recorded.
    let entry = std::fs::read_to_string(dir.path().join("ck/offsets/4")).unwrap();
    assert!(entry.contains("\"name\":\"b\""), "{entry}");
    let names = std::fs::read_to_string(dir.path().join("ck/source_names")).unwrap();
    assert!(names.contains("\"a\""), "{names}");
}

#[test]
fn source_evolution_needs_named_sources_and_a_checkpoint_created_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck").display().to_string();
    let out = dir.path().join("out").display().to_string();
    let unnamed = "SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 10)";
    let (ok, err) = run(&ck, 1, &query(&out, true, &[unnamed]));
    assert!(!ok);
    assert!(
        err.contains("UNNAMED_STREAMING_SOURCES_WITH_ENFORCEMENT"),
        "{err}"
    );
    let (ok, err) = run(&ck, 1, &query(&out, false, &[A, A]));
    assert!(!ok);
    assert!(err.contains("DUPLICATE_STREAMING_SOURCE_NAME"), "{err}");
    let bad = "SELECT value FROM STREAM(rate_micro_batch(rowsPerBatch => 10), name => 'a-b')";
    let (ok, err) = run(&ck, 1, &query(&out, false, &[bad]));
    assert!(!ok);
    assert!(err.contains("INVALID_STREAMING_SOURCE_NAME"), "{err}");

    // A checkpoint created without evolution keeps sources by position.
    let (ok, err) = run(&ck, 1, &query(&out, false, &[A]));
    assert!(ok, "{err}");
    let (ok, err) = run(&ck, 1, &query(&out, true, &[A]));
    assert!(!ok);
    assert!(
        err.contains("STREAMING_QUERY_EVOLUTION_SETTING_CHANGED"),
        "{err}"
    );
    // Without evolution, a second source is refused as Spark refuses it.
    let (ok, err) = run(&ck, 1, &query(&out, false, &[A, B]));
    assert!(!ok);
    assert!(err.contains("STREAMING_QUERY_SOURCES_CHANGED"), "{err}");
}

#[tokio::test]
async fn the_rust_reader_names_a_source() {
    let dir = tempfile::tempdir().unwrap();
    let session = weir::WeirSession::new();
    let df = session
        .read_stream()
        .format("rate-micro-batch")
        .option("rowsPerBatch", 3)
        .name("clicks")
        .load()
        .unwrap();
    let q = session
        .write_stream(df)
        .format("noop")
        .source_evolution(true)
        .checkpoint_location(dir.path().join("ck").display().to_string())
        .max_batches(1)
        .start()
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let entry = std::fs::read_to_string(dir.path().join("ck/offsets/0")).unwrap();
    assert!(entry.contains("\"name\":\"clicks\""), "{entry}");

    let err = session
        .read_stream()
        .format("rate-micro-batch")
        .name("not ok")
        .load()
        .unwrap_err();
    assert_eq!(err.error_class(), "INVALID_STREAMING_SOURCE_NAME");
}

/// File sources keep their log under their name (`sources/<name>`), so reordering them leaves
/// each with its own record of the files it read.
#[test]
fn reordered_file_sources_keep_their_own_logs() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck").display().to_string();
    let out = dir.path().join("out").display().to_string();
    let (d1, d2) = (dir.path().join("in1"), dir.path().join("in2"));
    std::fs::create_dir_all(&d1).unwrap();
    std::fs::create_dir_all(&d2).unwrap();
    let file = |d: &std::path::Path, name: &str, v: i64| {
        std::fs::write(d.join(name), format!("{{\"value\": {v}}}\n")).unwrap();
    };
    let source = |d: &std::path::Path, name: &str| {
        format!(
            "SELECT value FROM STREAM(read_files('{}', format => 'json', schema => 'value \
             BIGINT'), name => '{name}')",
            d.display()
        )
    };
    let (a, b) = (source(&d1, "a"), source(&d2, "b"));
    file(&d1, "f1.json", 1);
    let (ok, err) = run(&ck, 1, &query(&out, true, &[&a]));
    assert!(ok, "{err}");
    file(&d1, "f2.json", 2);
    file(&d2, "g1.json", 101);
    let (ok, err) = run(&ck, 1, &query(&out, true, &[&b, &a]));
    assert!(ok, "{err}");
    assert_eq!(values(&out), [1, 2, 101]);
    assert!(dir.path().join("ck/sources/a").exists());
    assert!(dir.path().join("ck/sources/b").exists());
}
