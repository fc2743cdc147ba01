use std::path::Path;
use std::time::{Duration, SystemTime};

use arrow::array::{Array, Int64Array, StringArray};
use arrow::util::pretty::pretty_format_batches;

use super::*;
use crate::SourceRegistry;

/// Writes `name` under `dir` with `text`, modified `age_s` seconds ago.
fn write(dir: &Path, name: &str, text: &str, age_s: u64) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    let f = std::fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(age_s))
        .unwrap();
}

fn source(format: &str, dir: &Path, extra: &[(&str, &str)]) -> Result<Arc<dyn SourceProvider>> {
    let mut o = Options::new().with("path", dir.to_str().unwrap());
    for (k, v) in extra {
        o.set(*k, *v);
    }
    SourceRegistry::with_builtins().create(format, &o)
}

struct Run {
    stream: Box<dyn MicroBatchStream>,
    at: Offset,
}

impl Run {
    async fn open(src: &Arc<dyn SourceProvider>, ck: &Path) -> Result<Self> {
        let metadata = Location::local(&ck.join("sources/0")).unwrap();
        let stream = src.open(SourceContext { metadata }).await?;
        let at = stream.initial_offset();
        Ok(Self { stream, at })
    }

    /// The next batch's rows as text (sorted lines), or None when nothing is new.
    async fn next(&mut self) -> Option<String> {
        let limit = self.stream.default_read_limit();
        let end = self.stream.latest_offset(&self.at, limit).await.unwrap();
        if end == self.at {
            return None;
        }
        let parts = self.stream.get_batch(&self.at, &end).await.unwrap();
        self.stream.commit(&end).await.unwrap();
        self.at = end;
        Some(table(&parts.concat()))
    }
}

fn table(batches: &[RecordBatch]) -> String {
    let text = pretty_format_batches(batches).unwrap().to_string();
    let mut lines: Vec<&str> = text.lines().filter(|l| l.starts_with('|')).collect();
    let header = lines.remove(0);
    lines.sort();
    std::iter::once(header)
        .chain(lines)
        .collect::<Vec<_>>()
        .join("\n")
}

use arrow::record_batch::RecordBatch;

#[tokio::test]
async fn json_files_are_read_once_each_in_arrival_order_also_after_a_restart() {
    let (dir, ck) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(
        dir.path(),
        "a.json",
        "{\"id\":1,\"name\":\"x\"}\n{\"id\":2}\n",
        30,
    );
    let src = source("json", dir.path(), &[]).unwrap();
    // Inferred as Spark does: fields sorted by name, every column nullable.
    assert_eq!(to_ddl(&src.schema()).unwrap(), "id BIGINT, name STRING");

    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(
        run.next().await.unwrap(),
        "| id | name |\n| 1  | x    |\n| 2  |      |"
    );
    assert_eq!(run.next().await, None);
    write(dir.path(), "b.json", "{\"id\":3,\"name\":\"y\"}", 20);
    assert_eq!(run.next().await.unwrap(), "| id | name |\n| 3  | y    |");
    let ended_at = run.at.clone();

    // A restart: the log knows a.json and b.json; only the new file is read.
    write(dir.path(), "c.json", "{\"id\":4}", 10);
    let mut again = Run::open(&src, ck.path()).await.unwrap();
    again.at = ended_at;
    assert_eq!(again.next().await.unwrap(), "| id | name |\n| 4  |      |");
    assert_eq!(again.next().await, None);
    assert_eq!(again.at.json(), r#"{"logOffset":2}"#);
}

#[tokio::test]
async fn an_entry_a_killed_run_wrote_is_the_next_batch_again() {
    let (dir, ck) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(dir.path(), "a.json", "{\"id\":1}", 30);
    let src = source("json", dir.path(), &[]).unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    let end = run
        .stream
        .latest_offset(&run.at, ReadLimit::AllAvailable)
        .await
        .unwrap();
    // Killed before the batch ran; a new file arrives meanwhile.
    drop(run);
    write(dir.path(), "b.json", "{\"id\":2}", 20);
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(
        run.stream
            .latest_offset(&run.at, ReadLimit::AllAvailable)
            .await
            .unwrap(),
        end
    );
    assert_eq!(run.next().await.unwrap(), "| id |\n| 1  |");
    assert_eq!(run.next().await.unwrap(), "| id |\n| 2  |");
}

#[tokio::test]
async fn max_files_and_max_bytes_per_trigger_and_latest_first_bound_and_order_batches() {
    let (dir, ck) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for (i, age) in [(1, 50), (2, 40), (3, 30)] {
        write(
            dir.path(),
            &format!("f{i}.json"),
            &format!("{{\"id\":{i}}}"),
            age,
        );
    }
    let src = source("json", dir.path(), &[("maxFilesPerTrigger", "2")]).unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(run.next().await.unwrap(), "| id |\n| 1  |\n| 2  |");
    assert_eq!(run.next().await.unwrap(), "| id |\n| 3  |");

    let ck = tempfile::tempdir().unwrap();
    let src = source(
        "json",
        dir.path(),
        &[("maxFilesPerTrigger", "1"), ("latestFirst", "true")],
    )
    .unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(run.next().await.unwrap(), "| id |\n| 3  |");
    assert_eq!(run.next().await.unwrap(), "| id |\n| 2  |");

    // Each file is 8 bytes: 12 bytes take two files only if the first fits... at least one.
    let ck = tempfile::tempdir().unwrap();
    let src = source("json", dir.path(), &[("maxBytesPerTrigger", "17")]).unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(run.next().await.unwrap(), "| id |\n| 1  |\n| 2  |");
    assert_eq!(run.next().await.unwrap(), "| id |\n| 3  |");
    let ck = tempfile::tempdir().unwrap();
    let src = source("json", dir.path(), &[("maxBytesPerTrigger", "1")]).unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(run.next().await.unwrap(), "| id |\n| 1  |");
}

#[tokio::test]
async fn filters_select_files_by_name_glob_directory_and_time() {
    let (dir, ck) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(dir.path(), "a.json", "{\"id\":1}", 7200);
    write(dir.path(), "b.jsonl", "{\"id\":2}", 60);
    write(dir.path(), "c.txt", "{\"id\":3}", 60);
    write(dir.path(), "sub/d.json", "{\"id\":4}", 60);
    write(dir.path(), "_SUCCESS", "", 60);
    write(dir.path(), ".e.json.crc", "junk", 60);
    let run_with = |extra: &'static [(&'static str, &'static str)]| {
        let dir = dir.path().to_path_buf();
        let ck = ck.path().join(rand_suffix().to_string());
        async move {
            let src = source("json", &dir, extra).unwrap();
            let mut run = Run::open(&src, &ck).await.unwrap();
            run.next().await.unwrap_or_default()
        }
    };
    assert_eq!(
        run_with(&[("pathGlobFilter", "*.{json,jsonl}")]).await,
        "| id |\n| 1  |\n| 2  |"
    );
    assert_eq!(
        run_with(&[
            ("recursiveFileLookup", "true"),
            ("pathGlobFilter", "*.json")
        ])
        .await,
        "| id |\n| 1  |\n| 4  |"
    );
    let an_hour_ago = chrono::Utc::now() - chrono::Duration::hours(1);
    let after: &'static str = Box::leak(
        an_hour_ago
            .format("%Y-%m-%dT%H:%M:%S")
            .to_string()
            .into_boxed_str(),
    );
    let filters: &'static [(&str, &str)] = Box::leak(Box::new([
        ("modifiedAfter", after),
        ("pathGlobFilter", "*.json*"),
    ]));
    assert_eq!(run_with(filters).await, "| id |\n| 2  |");
    let before: &'static [(&str, &str)] = Box::leak(Box::new([("modifiedBefore", after)]));
    assert_eq!(run_with(before).await, "| id |\n| 1  |");

    // A glob in the path: files in the directories it matches.
    let glob = format!("{}/s*", dir.path().display());
    let src = SourceRegistry::with_builtins()
        .create("json", &Options::new().with("path", glob))
        .unwrap();
    let mut run = Run::open(&src, &ck.path().join("glob")).await.unwrap();
    assert_eq!(run.next().await.unwrap(), "| id |\n| 4  |");
}

fn rand_suffix() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(100);
    N.fetch_add(1, Ordering::Relaxed)
}

#[tokio::test]
async fn max_file_age_ignores_files_much_older_than_the_newest_seen() {
    let (dir, ck) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(dir.path(), "new.json", "{\"id\":1}", 10);
    let src = source("json", dir.path(), &[("maxFileAge", "1 hour")]).unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(run.next().await.unwrap(), "| id |\n| 1  |");
    write(dir.path(), "late-but-old.json", "{\"id\":2}", 3 * 3600);
    write(dir.path(), "late.json", "{\"id\":3}", 1800);
    assert_eq!(run.next().await.unwrap(), "| id |\n| 3  |");
}

#[tokio::test]
async fn malformed_json_lines_follow_the_mode() {
    // Inference in PERMISSIVE mode adds the corrupt-record column, as Spark's.
    let broken = tempfile::tempdir().unwrap();
    write(
        broken.path(),
        "a.json",
        "{\"id\":1}\n{\"id\": oops\n{\"id\":4}\n",
        10,
    );
    let src = source("json", broken.path(), &[]).unwrap();
    assert_eq!(
        to_ddl(&src.schema()).unwrap(),
        "_corrupt_record STRING, id BIGINT"
    );
    let ck = tempfile::tempdir().unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(
        run.next().await.unwrap(),
        "| _corrupt_record | id |\n|                 | 1  |\n|                 | 4  |\n| {\"id\": oops     |    |"
    );

    // A record of the wrong type is malformed too when the schema is given.
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a.json",
        "{\"id\":1}\n{\"id\": oops\n{\"id\":\"not a number\"}\n{\"id\":4}\n",
        10,
    );
    let ck = tempfile::tempdir().unwrap();
    let src = source(
        "json",
        dir.path(),
        &[("schema", "id BIGINT, _corrupt_record STRING")],
    )
    .unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    let text = run.next().await.unwrap();
    assert!(
        text.contains("|    | {\"id\":\"not a number\"} |"),
        "{text}"
    );
    assert!(text.contains("|    | {\"id\": oops           |"), "{text}");
    assert!(text.contains("| 4  |                       |"), "{text}");
    assert_eq!(text.lines().count(), 5, "{text}");
    // Without a corrupt-record column, PERMISSIVE gives a row of nulls.
    let ck = tempfile::tempdir().unwrap();
    let src = source("json", dir.path(), &[("schema", "id BIGINT")]).unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(
        run.next().await.unwrap(),
        "| id |\n|    |\n|    |\n| 1  |\n| 4  |"
    );
    // Mixed types infer as a string, and numbers read as their text, as Spark.
    let src = source("json", dir.path(), &[("mode", "DROPMALFORMED")]).unwrap();
    assert_eq!(to_ddl(&src.schema()).unwrap(), "id STRING");
    let ck = tempfile::tempdir().unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(
        run.next().await.unwrap(),
        "| id           |\n| 1            |\n| 4            |\n| not a number |"
    );

    let ck = tempfile::tempdir().unwrap();
    let src = source(
        "json",
        dir.path(),
        &[("mode", "DROPMALFORMED"), ("schema", "id BIGINT")],
    )
    .unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(run.next().await.unwrap(), "| id |\n| 1  |\n| 4  |");

    let ck = tempfile::tempdir().unwrap();
    let src = source(
        "json",
        dir.path(),
        &[("mode", "failfast"), ("schema", "id BIGINT")],
    )
    .unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    let end = run
        .stream
        .latest_offset(&run.at, ReadLimit::AllAvailable)
        .await
        .unwrap();
    let err = run.stream.get_batch(&run.at, &end).await.unwrap_err();
    assert_eq!(err.error_class(), "MALFORMED_RECORD_IN_PARSING");
    assert!(err.to_string().contains("line 2 of 'a.json'"), "{err}");

    // FAILFAST also refuses to infer a schema from malformed files.
    let err = source("json", broken.path(), &[("mode", "FAILFAST")]).unwrap_err();
    assert_eq!(err.error_class(), "MALFORMED_RECORD_IN_PARSING");
}

#[tokio::test]
async fn csv_with_a_header_and_inferred_types_and_malformed_rows() {
    let (dir, ck) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(dir.path(), "a.csv", "id,name\n1,x\n2,\n", 20);
    let src = source(
        "csv",
        dir.path(),
        &[("header", "true"), ("inferSchema", "true")],
    )
    .unwrap();
    assert_eq!(to_ddl(&src.schema()).unwrap(), "id BIGINT, name STRING");
    // Without inferSchema every column is a string; without header the names are _c0, _c1.
    let plain = source("csv", dir.path(), &[]).unwrap();
    assert_eq!(to_ddl(&plain.schema()).unwrap(), "_c0 STRING, _c1 STRING");

    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(
        run.next().await.unwrap(),
        "| id | name |\n| 1  | x    |\n| 2  |      |"
    );
    write(dir.path(), "b.csv", "id,name\nthree,z\n4,w\n", 10);
    assert_eq!(
        run.next().await.unwrap(),
        "| id | name |\n|    |      |\n| 4  | w    |"
    );

    let ck = tempfile::tempdir().unwrap();
    let src = source(
        "csv",
        dir.path(),
        &[
            ("header", "true"),
            ("sep", ";"),
            ("schema", "id BIGINT, name STRING, _corrupt_record STRING"),
        ],
    )
    .unwrap();
    write(dir.path(), "c.csv", "id;name\n5;v\nsix;u\n", 5);
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    let all = run.next().await.unwrap();
    assert!(all.contains("| 5  | v    |                 |"), "{all}");
    assert!(all.contains("|    |      | six;u           |"), "{all}");
}

#[tokio::test]
async fn parquet_files_are_matched_to_the_schema_by_column_name() {
    use parquet::arrow::ArrowWriter;
    let (dir, ck) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let write_parquet = |name: &str, batch: RecordBatch| {
        let f = std::fs::File::create(dir.path().join(name)).unwrap();
        let mut w = ArrowWriter::try_new(f, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    };
    write_parquet(
        "a.parquet",
        RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1, 2])) as _),
            ("name", Arc::new(StringArray::from(vec!["x", "y"])) as _),
        ])
        .unwrap(),
    );
    let src = source("parquet", dir.path(), &[]).unwrap();
    assert_eq!(to_ddl(&src.schema()).unwrap(), "id BIGINT, name STRING");
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(
        run.next().await.unwrap(),
        "| id | name |\n| 1  | x    |\n| 2  | y    |"
    );
    // A later file without `name` and with an extra column: nulls, and the extra is not read.
    write_parquet(
        "b.parquet",
        RecordBatch::try_from_iter([
            ("extra", Arc::new(Int64Array::from(vec![9])) as _),
            ("id", Arc::new(Int64Array::from(vec![3])) as _),
        ])
        .unwrap(),
    );
    assert_eq!(run.next().await.unwrap(), "| id | name |\n| 3  |      |");
    // A damaged file fails the batch, naming it.
    std::fs::write(dir.path().join("c.parquet"), b"PAR1 not really").unwrap();
    let end = run
        .stream
        .latest_offset(&run.at, ReadLimit::AllAvailable)
        .await
        .unwrap();
    let err = run.stream.get_batch(&run.at, &end).await.unwrap_err();
    assert_eq!(err.error_class(), "FAILED_READ_FILE");
    assert!(err.to_string().contains("c.parquet"), "{err}");
}

#[tokio::test]
async fn clean_source_deletes_or_archives_files_once_committed() {
    let (dir, ck, archive) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    write(dir.path(), "sub/a.json", "{\"id\":1}", 10);
    let src = source(
        "json",
        dir.path(),
        &[
            ("recursiveFileLookup", "true"),
            ("cleanSource", "archive"),
            ("sourceArchiveDir", archive.path().to_str().unwrap()),
        ],
    )
    .unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(run.next().await.unwrap(), "| id |\n| 1  |");
    assert!(!dir.path().join("sub/a.json").exists());
    assert_eq!(
        std::fs::read_to_string(archive.path().join("sub/a.json")).unwrap(),
        "{\"id\":1}"
    );

    let ck = tempfile::tempdir().unwrap();
    write(dir.path(), "b.json", "{\"id\":2}", 10);
    let src = source(
        "json",
        dir.path(),
        &[("cleanSource", "delete"), ("schema", "id BIGINT")],
    )
    .unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    assert_eq!(run.next().await.unwrap(), "| id |\n| 2  |");
    assert!(!dir.path().join("b.json").exists());
}

#[tokio::test]
async fn an_inferred_schema_is_fixed_by_the_first_run() {
    let (dir, ck) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(dir.path(), "a.json", "{\"id\":1}", 10);
    let src = source("json", dir.path(), &[]).unwrap();
    Run::open(&src, ck.path()).await.unwrap();
    assert!(ck.path().join("sources/0/schema").exists());

    write(dir.path(), "b.json", "{\"id\":2,\"extra\":true}", 5);
    let changed = source("json", dir.path(), &[]).unwrap();
    let err = Run::open(&changed, ck.path()).await.err().unwrap();
    assert_eq!(err.error_class(), "STREAMING_SOURCE_SCHEMA_CHANGED");
    assert!(
        err.to_string()
            .contains("now give the schema [extra BOOLEAN, id BIGINT]")
            && err.to_string().contains("read them with [id BIGINT]"),
        "{err}"
    );
    // The recorded schema, given explicitly, is accepted.
    let pinned = source("json", dir.path(), &[("schema", "id BIGINT")]).unwrap();
    Run::open(&pinned, ck.path()).await.unwrap();
}

#[tokio::test]
async fn available_now_reads_only_the_files_present_when_it_started() {
    let (dir, ck) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(dir.path(), "a.json", "{\"id\":1}", 20);
    write(dir.path(), "b.json", "{\"id\":2}", 10);
    let src = source("json", dir.path(), &[("maxFilesPerTrigger", "1")]).unwrap();
    let mut run = Run::open(&src, ck.path()).await.unwrap();
    run.stream.prepare_for_available_now(&run.at).await.unwrap();
    assert_eq!(run.next().await.unwrap(), "| id |\n| 1  |");
    write(dir.path(), "c.json", "{\"id\":3}", 0);
    assert_eq!(run.next().await.unwrap(), "| id |\n| 2  |");
    assert_eq!(run.next().await, None);
}

#[test]
fn bad_options_are_refused_naming_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("maxFilesPerTrigger", "1"), ("maxBytesPerTrigger", "1m")],
            "cannot both be set",
        ),
        (
            &[("cleanSource", "archive")],
            "needs option 'sourceArchiveDir'",
        ),
        (
            &[("cleanSource", "move")],
            "expected off, delete or archive",
        ),
        (
            &[("mode", "LENIENT")],
            "PERMISSIVE, DROPMALFORMED or FAILFAST",
        ),
        (&[("modifiedAfter", "yesterday")], "2026-01-31T08:00:00"),
        (&[("maxBytesPerTrigger", "lots")], "'64m'"),
        (&[("header", "true")], "Unknown option 'header'"),
        (&[("schema", "id BIGNUM")], "unknown type 'BIGNUM'"),
    ];
    for (extra, says) in cases {
        let mut extra = extra.to_vec();
        if !extra.iter().any(|(k, _)| *k == "schema") {
            extra.push(("schema", "id BIGINT"));
        }
        let err = source("json", dir.path(), &extra).unwrap_err();
        assert!(err.to_string().contains(says), "{extra:?}: {err}");
    }
    let err = source("json", dir.path(), &[]).unwrap_err();
    assert_eq!(err.error_class(), "UNABLE_TO_INFER_SCHEMA");
    let inside = dir.path().join("archive");
    let err = source(
        "json",
        dir.path(),
        &[
            ("schema", "id BIGINT"),
            ("cleanSource", "archive"),
            ("sourceArchiveDir", inside.to_str().unwrap()),
        ],
    )
    .unwrap_err();
    assert!(err.to_string().contains("must not be inside"), "{err}");
    let err = SourceRegistry::with_builtins()
        .create(
            "read_files",
            &Options::new()
                .with("path", "/x")
                .with("format", "avro")
                .with("schema", "a INT"),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("'json', 'csv' and 'parquet'"),
        "{err}"
    );
    let _ = StringArray::from(vec!["unused"]).len();
}

#[test]
fn a_schema_location_keeps_the_first_inferred_schema_for_later_runs() {
    let (dir, kept) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(dir.path(), "a.json", "{\"id\":1}", 10);
    let at = [("schemaLocation", kept.path().to_str().unwrap())];
    let first = source("json", dir.path(), &at).unwrap();
    assert_eq!(to_ddl(&first.schema()).unwrap(), "id BIGINT");
    assert!(kept.path().join("_schemas/0").exists());
    // The files are gone (cleanSource) and a new one has another column: the kept schema plans.
    std::fs::remove_file(dir.path().join("a.json")).unwrap();
    assert_eq!(
        source("json", dir.path(), &[]).unwrap_err().error_class(),
        "UNABLE_TO_INFER_SCHEMA"
    );
    assert_eq!(
        to_ddl(&source("json", dir.path(), &at).unwrap().schema()).unwrap(),
        "id BIGINT"
    );
    write(dir.path(), "b.json", "{\"id\":2,\"extra\":1}", 5);
    assert_eq!(
        to_ddl(&source("json", dir.path(), &at).unwrap().schema()).unwrap(),
        "id BIGINT"
    );
    std::fs::write(kept.path().join("_schemas/0"), "{garbled").unwrap();
    let err = source("json", dir.path(), &at).unwrap_err();
    assert_eq!(err.error_class(), "CHECKPOINT_FILE_CORRUPT");
    assert!(err.to_string().contains("_schemas/0"), "{err}");
}

#[test]
fn a_restart_from_the_starting_position_warns_that_earlier_files_may_be_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let src = source("json", dir.path(), &[("schema", "a BIGINT")]).unwrap();
    let at = |n: i64| Offset(serde_json::json!({ "logOffset": n }));
    let warning = src.start_difference(&at(4), &at(-1)).unwrap();
    assert!(
        warning.starts_with("overlaps: reads again every file of its 5 earlier batches"),
        "{warning}"
    );
    assert_eq!(src.start_difference(&at(-1), &at(-1)), None);
}
