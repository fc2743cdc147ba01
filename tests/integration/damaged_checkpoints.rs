//! Every kind of checkpoint file, truncated, garbled, deleted or from a newer format: a restart
//! either fails with a classified error naming the file, leaving every file it found as it was,
//! or (where the damage is recoverable) continues to the right answer. Never a panic, never a
//! silent fresh start.

use std::path::Path;

use crate::support;
use support::{contents, copy_dir};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Damage {
    Truncated,
    /// Cut at its last line end (a checksummed file loses its checksum line).
    CutAtLine,
    /// Six bytes overwritten, starting at this fraction of the file (in tenths).
    Garbled(usize),
    Deleted,
    Newer,
}

/// Every damage, each file gets each.
const DAMAGES: [Damage; 7] = [
    Damage::Truncated,
    Damage::CutAtLine,
    Damage::Garbled(2),
    Damage::Garbled(5),
    Damage::Garbled(8),
    Damage::Deleted,
    Damage::Newer,
];

/// Asserts that `dir` holds exactly the files of `damaged` (the checkpoint as a refused run
/// found it), each as it was: the run refused before writing anything.
fn assert_unchanged(case: &str, damaged: &[(String, Vec<u8>)], dir: &Path) {
    let after = contents(dir);
    for (rel, bytes) in damaged.iter().filter(|(rel, _)| rel != ".weir-lock") {
        assert!(
            after.iter().any(|(r, b)| r == rel && b == bytes),
            "{case}: {rel} was changed"
        );
    }
    for (rel, _) in after.iter().filter(|(rel, _)| rel != ".weir-lock") {
        assert!(
            damaged.iter().any(|(r, _)| r == rel),
            "{case}: {rel} was written by a refused run"
        );
    }
}

fn damage(path: &Path, how: Damage) {
    let bytes = std::fs::read(path).unwrap();
    let damaged = match how {
        Damage::Truncated => bytes[..bytes.len() / 2].to_vec(),
        Damage::CutAtLine => match bytes.iter().rposition(|&b| b == b'\n') {
            Some(at) => bytes[..at].to_vec(),
            None => bytes[..bytes.len() / 2].to_vec(),
        },
        Damage::Garbled(tenths) => {
            let mut b = bytes.clone();
            let at = b.len() * tenths / 10;
            for x in b.iter_mut().skip(at).take(6) {
                *x = b'~';
            }
            b
        }
        Damage::Deleted => {
            std::fs::remove_file(path).unwrap();
            return;
        }
        // The format version a newer weir would write: the digit after a binary file's magic,
        // a text log's `v1` line, the metadata's checkpoint version; a file without a version
        // gets a version line it does not have.
        Damage::Newer => {
            let text = String::from_utf8_lossy(&bytes);
            if bytes.starts_with(b"WEIRCL") || bytes.starts_with(b"WEIRSN") {
                let mut b = bytes.clone();
                b[6] = b'9';
                b
            } else if let Some(rest) = text.strip_prefix("v2").or(text.strip_prefix("v1")) {
                format!("v9{rest}").into_bytes()
            } else if text.contains("\"weirCheckpointVersion\":2") {
                text.replace("\"weirCheckpointVersion\":2", "\"weirCheckpointVersion\":9")
                    .into_bytes()
            } else {
                format!("v9\n{text}").into_bytes()
            }
        }
    };
    std::fs::write(path, damaged).unwrap();
}

struct Setup {
    work: tempfile::TempDir,
    base: tempfile::TempDir,
    sql: String,
}

impl Setup {
    fn ck(&self) -> std::path::PathBuf {
        self.work.path().join("ck")
    }

    /// Puts the undamaged checkpoint and table back in place.
    fn restore(&self) {
        for d in ["ck", "out"] {
            let _ = std::fs::remove_dir_all(self.work.path().join(d));
            copy_dir(&self.base.path().join(d), &self.work.path().join(d));
        }
    }

    /// Runs the query until its input is consumed: success and stderr.
    fn run(&self) -> (bool, String) {
        let out = support::weir_command()
            .args(["run", "--checkpoint", self.ck().to_str().unwrap()])
            .args(["--trigger", "availableNow", "-e", &self.sql])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The Delta table's counts, `k,n` by `k`.
    fn counts(&self) -> Vec<String> {
        let out = support::weir_command()
            .args([
                "run",
                "-e",
                &format!(
                    "CREATE EXTERNAL TABLE c STORED AS DELTA LOCATION '{}'; SELECT \
                     concat(k, ',', n) AS r FROM c ORDER BY k",
                    self.work.path().join("out").display()
                ),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let cell = l.trim_matches(|c| c == '|' || c == ' ');
                cell.contains(',').then(|| cell.to_string())
            })
            .collect()
    }
}

/// A `GROUP BY` over a file source into Delta (complete mode), with RocksDB snapshots every 2
/// versions: batches 0..2 read one file each; a fourth file waits.
fn setup() -> Setup {
    let (work, base) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let input = work.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    let write = |i: u32| {
        std::fs::write(
            input.join(format!("f{i}.json")),
            format!("{{\"k\": {}}}\n{{\"k\": {}}}\n", i % 2, i % 3),
        )
        .unwrap();
    };
    let sql = format!(
        "CREATE STREAMING TABLE c USING delta LOCATION '{}' OPTIONS (outputMode 'complete', \
         stateStore.minDeltasForSnapshot '2', stateStore.maintenanceInterval '0') AS SELECT k, \
         count(*) AS n FROM STREAM \
         read_files('{}', format => 'json', schema => 'k BIGINT', maxFilesPerTrigger => 1) \
         GROUP BY k",
        work.path().join("out").display(),
        input.display()
    );
    let s = Setup { work, base, sql };
    for i in 0..3 {
        write(i);
    }
    let (ok, err) = s.run();
    assert!(ok, "{err}");
    assert_eq!(s.counts(), ["0,3", "1,2", "2,1"]);
    for d in ["ck", "out"] {
        copy_dir(&s.work.path().join(d), &s.base.path().join(d));
    }
    write(3);
    s
}

/// After the fourth file: f0 = {0, 0}, f1 = {1, 1}, f2 = {0, 2}, f3 = {1, 0}.
const ALL_FOUR: [&str; 3] = ["0,4", "1,3", "2,1"];

#[test]
fn every_damaged_checkpoint_file_is_refused_by_name_or_recovered_exactly() {
    use Damage::*;
    let s = setup();
    let files = [
        "metadata",
        "offsets/2",
        "commits/2",
        "sink",
        "state/_metadata",
        "state/0/0/default/3.changelog",
        "state/0/0/default/2.snapshot",
        "sources/0/2",
        "sources/0/schema",
    ];
    // The damage a restart recovers from, with the right answer:
    let recovers = |file: &str, how: Damage| {
        matches!(
            (file, how),
            // the last batch runs again with its logged offsets; the sink skips what it has
            ("commits/2", Deleted)
            // the record is written again; cut at its line end it is whole (it has no version
            // line to require its checksum)
            | ("sink", Deleted | CutAtLine)
            // the schema is recorded again (the documented recovery)
            | ("sources/0/schema", Deleted)
            // the store is rebuilt from its changelogs
            | ("state/0/0/default/2.snapshot", _)
        )
    };
    let mut report = vec![];
    for file in files {
        for how in DAMAGES {
            s.restore();
            damage(&s.ck().join(file), how);
            let damaged = contents(&s.ck());
            let (ok, err) = s.run();
            let case = format!("{file} {how:?}");
            assert!(!err.contains("panicked"), "{case}: {err}");
            if recovers(file, how) {
                assert!(ok, "{case}: {err}");
                assert_eq!(s.counts(), ALL_FOUR, "{case}");
                continue;
            }
            assert!(!ok, "{case} was not refused");
            let class = [
                "CHECKPOINT_FILE_CORRUPT",
                "STATE_STORE_FILE_CORRUPT",
                "STATE_STORE_VERSION_NOT_FOUND",
            ]
            .into_iter()
            .find(|c| err.contains(c));
            assert!(class.is_some(), "{case}: {err}");
            let named = match (file, how) {
                // A lost changelog is named by its store and version.
                ("state/0/0/default/3.changelog", Deleted) => "0/0/default has no version 3",
                // A lost offsets entry is named by the log's gap.
                ("offsets/2", Deleted) => "offsets/1",
                _ => file,
            };
            assert!(
                err.contains(named),
                "{case}: the error does not name it: {err}"
            );
            assert!(
                err.to_lowercase().contains("restore") && err.contains("new checkpoint location"),
                "{case}: no recovery options: {err}"
            );
            // Nothing the run found was overwritten or removed, and nothing was added.
            assert_unchanged(&case, &damaged, &s.ck());
            report.push(format!("{case}: {}", class.unwrap_or_default()));
        }
    }
    assert_eq!(report.len(), files.len() * 7 - 11, "{report:#?}");
}

#[test]
fn a_full_refresh_recovers_a_checkpoint_whose_metadata_is_lost() {
    let s = setup();
    s.restore();
    std::fs::remove_file(s.ck().join("metadata")).unwrap();
    let (ok, err) = s.run();
    assert!(!ok);
    assert!(
        err.contains("CHECKPOINT_FILE_CORRUPT") && err.contains("metadata"),
        "{err}"
    );
    let out = support::weir_command()
        .args(["checkpoint", "reset", s.ck().to_str().unwrap(), "--full"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The query starts over: all four files, each once.
    let (ok, err) = s.run();
    assert!(ok, "{err}");
    assert_eq!(s.counts(), ALL_FOUR);
}

/// `weir run -e <sql>` with `args`: success and stderr.
fn weir_run(args: &[&str], sql: &str) -> (bool, String) {
    let out = support::weir_command()
        .arg("run")
        .args(args)
        .args(["-e", sql])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The files sources keep of where they start, `sources/0/initial` of a Delta source and
/// `sources/0/0` of a rate source: damaged, a restart is refused naming the file and leaving
/// every file as it was; lost, the start is resolved again, which only a query that never ran a
/// batch would use (the Delta query then reads exactly its new rows).
#[test]
fn a_sources_damaged_start_file_is_refused_by_name_and_a_lost_one_is_resolved_again() {
    use Damage::*;
    let (work, base) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let src = work.path().join("src").display().to_string();
    let src_ck = work.path().join("src-ck").display().to_string();
    let add_rows = |batches: &str| {
        let (ok, err) = weir_run(
            &["--checkpoint", &src_ck, "--max-batches", batches],
            &format!(
                "CREATE STREAMING TABLE src USING delta LOCATION '{src}' AS SELECT value FROM \
                 STREAM rate_micro_batch(rowsPerBatch => 5)"
            ),
        );
        assert!(ok, "{err}");
    };
    add_rows("2");
    let delta_sql = format!(
        "CREATE STREAMING TABLE c USING delta LOCATION '{}' OPTIONS (outputMode 'complete') AS \
         SELECT value % 3 AS k, count(*) AS n FROM STREAM delta(path => '{src}') GROUP BY \
         value % 3",
        work.path().join("out").display()
    );
    let rate_sql = format!(
        "CREATE STREAMING TABLE r USING delta LOCATION '{}' AS SELECT value FROM STREAM \
         rate(rowsPerSecond => 50)",
        work.path().join("rate-out").display()
    );
    let delta = Setup {
        work,
        base,
        sql: delta_sql,
    };
    let (ok, err) = delta.run();
    assert!(ok, "{err}");
    assert_eq!(delta.counts(), ["0,4", "1,3", "2,3"]);
    let rate_ck = delta.work.path().join("rate-ck").display().to_string();
    let (ok, err) = weir_run(&["--checkpoint", &rate_ck, "--max-batches", "2"], &rate_sql);
    assert!(ok, "{err}");
    for d in ["ck", "out", "rate-ck", "rate-out"] {
        copy_dir(&delta.work.path().join(d), &delta.base.path().join(d));
    }
    // Five more rows in the table: 0..15 in all.
    add_rows("1");

    let mut refused = 0;
    for (ck, file) in [("ck", "sources/0/initial"), ("rate-ck", "sources/0/0")] {
        for how in DAMAGES {
            let case = format!("{ck}/{file} {how:?}");
            delta.restore();
            // The rate query's checkpoint and its table go back together: a table ahead of
            // its checkpoint is refused.
            for d in ["rate-ck", "rate-out"] {
                let _ = std::fs::remove_dir_all(delta.work.path().join(d));
                copy_dir(&delta.base.path().join(d), &delta.work.path().join(d));
            }
            let dir = delta.work.path().join(ck);
            damage(&dir.join(file), how);
            let damaged = contents(&dir);
            let (ok, err) = if ck == "ck" {
                delta.run()
            } else {
                weir_run(&["--checkpoint", &rate_ck, "--max-batches", "1"], &rate_sql)
            };
            assert!(!err.contains("panicked"), "{case}: {err}");
            if how == Deleted {
                assert!(ok, "{case}: {err}");
                assert!(dir.join(file).exists(), "{case}: not written again");
                if ck == "ck" {
                    assert_eq!(delta.counts(), ["0,5", "1,5", "2,5"], "{case}");
                }
                continue;
            }
            assert!(!ok, "{case} was not refused");
            assert!(
                err.contains("CHECKPOINT_FILE_CORRUPT") && err.contains(file),
                "{case}: {err}"
            );
            assert!(
                err.to_lowercase().contains("restore") && err.contains("new checkpoint location"),
                "{case}: no recovery options: {err}"
            );
            assert_unchanged(&case, &damaged, &dir);
            refused += 1;
        }
    }
    assert_eq!(refused, 12);
}

/// A file source's log compacted (every 10 batches, as Spark): 11 batches leave `9.compact` and
/// entry 10. A restart reads only new files; the compact file damaged or lost is refused by
/// name, leaving every file as it was.
#[test]
fn a_file_sources_compacted_log_is_read_whole_and_refused_by_name_when_damaged() {
    let work = tempfile::tempdir().unwrap();
    let input = work.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    let write = |i: u32| {
        std::fs::write(
            input.join(format!("f{i:02}.json")),
            format!("{{\"k\": {i}}}\n"),
        )
        .unwrap();
    };
    for i in 0..11 {
        write(i);
    }
    let ck = work.path().join("ck");
    let sql = format!(
        "CREATE STREAMING TABLE c USING delta LOCATION '{}' OPTIONS (outputMode 'complete') AS \
         SELECT count(*) AS n, sum(k) AS s FROM STREAM read_files('{}', format => 'json', \
         schema => 'k BIGINT', maxFilesPerTrigger => 1)",
        work.path().join("out").display(),
        input.display()
    );
    let run = || {
        weir_run(
            &[
                "--checkpoint",
                ck.to_str().unwrap(),
                "--trigger",
                "availableNow",
            ],
            &sql,
        )
    };
    let (ok, err) = run();
    assert!(ok, "{err}");
    let mut log: Vec<String> = std::fs::read_dir(ck.join("sources/0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".compact") || n.parse::<u32>().is_ok())
        .collect();
    log.sort();
    assert_eq!(log, ["10", "9.compact"]);
    let base = tempfile::tempdir().unwrap();
    copy_dir(&ck, base.path());
    write(11);

    for how in DAMAGES {
        let case = format!("sources/0/9.compact {how:?}");
        let _ = std::fs::remove_dir_all(&ck);
        copy_dir(base.path(), &ck);
        damage(&ck.join("sources/0/9.compact"), how);
        let damaged = contents(&ck);
        let (ok, err) = run();
        assert!(!err.contains("panicked"), "{case}: {err}");
        assert!(!ok, "{case} was not refused");
        assert!(
            err.contains("CHECKPOINT_FILE_CORRUPT") && err.contains("9.compact"),
            "{case}: {err}"
        );
        assert!(err.contains("new checkpoint location"), "{case}: {err}");
        assert_unchanged(&case, &damaged, &ck);
    }

    // Undamaged: every file of the compacted log is known, and only f11 is read.
    let _ = std::fs::remove_dir_all(&ck);
    copy_dir(base.path(), &ck);
    let (ok, err) = run();
    assert!(ok, "{err}");
    let out = support::weir_command()
        .args([
            "run",
            "-e",
            &format!(
                "CREATE EXTERNAL TABLE c STORED AS DELTA LOCATION '{}'; SELECT concat(n, ',', s) \
                 AS r FROM c",
                work.path().join("out").display()
            ),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("12,66"), "each of the 12 files once: {text}");
}

/// One bit of the query ID in `metadata` flipped, so that it still reads as a UUID (the first
/// hex digit that has a one-bit neighbour among the hex digits).
fn flip_a_bit_of_the_query_id(metadata: &Path) {
    let text = std::fs::read_to_string(metadata).unwrap();
    let start = text.find("\"id\":\"").unwrap() + 6;
    let at = (start..start + 36)
        .find(|&i| matches!(text.as_bytes()[i], b'0'..=b'9' | b'b'..=b'e'))
        .unwrap();
    let mut bytes = text.into_bytes();
    bytes[at] ^= 1;
    std::fs::write(metadata, bytes).unwrap();
}

/// The Delta table's rows and distinct values of `value`.
fn delta_rows(table: &Path) -> (i64, i64) {
    let out = support::weir_command()
        .args([
            "run",
            "-e",
            &format!(
                "CREATE EXTERNAL TABLE d STORED AS DELTA LOCATION '{}'; SELECT concat('rows=', \
                 count(*), ',distinct=', count(DISTINCT value)) AS r FROM d",
                table.display()
            ),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("rows="))
        .unwrap_or_else(|| panic!("{text} {}", String::from_utf8_lossy(&out.stderr)));
    let cell = line.trim_matches(|c| c == '|' || c == ' ');
    let (rows, distinct) = cell.split_once(',').unwrap();
    (
        rows.trim_start_matches("rows=").parse().unwrap(),
        distinct.trim_start_matches("distinct=").parse().unwrap(),
    )
}

/// The issue's case: a batch is committed to Delta, the process is killed before `commits/N`,
/// and one bit of the query ID in `metadata` flips. The restart is refused by name (the Delta
/// sink would not recognise the batch under another ID and append it again); with the ID
/// restored the batch is replayed and skipped. A `metadata` replaced whole, with its checksum
/// (another checkpoint's), is refused by the sink record's query ID.
#[test]
fn a_flipped_bit_in_metadata_is_refused_and_never_doubles_a_delta_batch() {
    let work = tempfile::tempdir().unwrap();
    let (ck, table) = (work.path().join("ck"), work.path().join("t"));
    let sql = format!(
        "CREATE STREAMING TABLE t USING delta LOCATION '{}' AS SELECT value FROM STREAM \
         rate_micro_batch(rowsPerBatch => 10)",
        table.display()
    );
    let ck_s = ck.to_str().unwrap();
    let (ok, err) = weir_run(&["--checkpoint", ck_s, "--max-batches", "2"], &sql);
    assert!(ok, "{err}");
    support::run_and_kill_at(&sql, ck_s, "after_sink", 2);
    assert!(!ck.join("commits/2").exists());
    assert_eq!(delta_rows(&table), (30, 30));
    let good = std::fs::read(ck.join("metadata")).unwrap();

    flip_a_bit_of_the_query_id(&ck.join("metadata"));
    let damaged = contents(&ck);
    let (ok, err) = weir_run(&["--checkpoint", ck_s, "--max-batches", "1"], &sql);
    assert!(!ok, "a flipped query ID was accepted");
    assert!(
        err.contains("CHECKPOINT_FILE_CORRUPT") && err.contains("metadata"),
        "{err}"
    );
    assert_unchanged("flipped metadata", &damaged, &ck);
    assert_eq!(delta_rows(&table), (30, 30), "nothing appended");

    // Another checkpoint's metadata, whole and checksummed.
    let other = work.path().join("other");
    let (ok, err) = weir_run(
        &[
            "--checkpoint",
            other.to_str().unwrap(),
            "--max-batches",
            "1",
        ],
        &format!(
            "CREATE STREAMING TABLE o USING delta LOCATION '{}' AS SELECT value FROM STREAM \
             rate_micro_batch(rowsPerBatch => 1)",
            work.path().join("o").display()
        ),
    );
    assert!(ok, "{err}");
    std::fs::copy(other.join("metadata"), ck.join("metadata")).unwrap();
    let replaced = contents(&ck);
    let (ok, err) = weir_run(&["--checkpoint", ck_s, "--max-batches", "1"], &sql);
    assert!(!ok, "another checkpoint's metadata was accepted");
    assert!(
        err.contains("CHECKPOINT_FILE_CORRUPT") && err.contains("'sink' record"),
        "{err}"
    );
    assert_unchanged("replaced metadata", &replaced, &ck);

    // Restored: batch 2 is replayed and skipped, batch 3 appended; every value once.
    std::fs::write(ck.join("metadata"), good).unwrap();
    let (ok, err) = weir_run(&["--checkpoint", ck_s, "--max-batches", "2"], &sql);
    assert!(ok, "{err}");
    assert_eq!(delta_rows(&table), (40, 40));
}

/// A file sink's output, damaged: a lost manifest entry of a committed batch, or a listed part
/// file lost, emptied or cut. A restart is refused by name before it writes anything, and
/// batch SQL over the folder names a damaged part file instead of reading fewer rows.
#[test]
fn a_file_sinks_lost_entry_or_damaged_part_file_is_refused_by_name() {
    let work = tempfile::tempdir().unwrap();
    let (ck, out) = (work.path().join("ck"), work.path().join("out"));
    let sql = format!(
        "CREATE STREAMING TABLE t USING parquet LOCATION '{}' AS SELECT value FROM STREAM \
         rate_micro_batch(rowsPerBatch => 5)",
        out.display()
    );
    let ck_s = ck.to_str().unwrap();
    let (ok, err) = weir_run(&["--checkpoint", ck_s, "--max-batches", "3"], &sql);
    assert!(ok, "{err}");
    let base = tempfile::tempdir().unwrap();
    copy_dir(&ck, &base.path().join("ck"));
    copy_dir(&out, &base.path().join("out"));
    let restore = || {
        for d in ["ck", "out"] {
            let _ = std::fs::remove_dir_all(work.path().join(d));
            copy_dir(&base.path().join(d), &work.path().join(d));
        }
    };
    let count = || {
        let o = support::weir_command()
            .args([
                "run",
                "-e",
                &format!(
                    "CREATE EXTERNAL TABLE r STORED AS PARQUET LOCATION '{}'; SELECT \
                     concat('n=', count(*)) AS n FROM r",
                    out.display()
                ),
            ])
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let part_of_batch_1 = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("part-00001-"))
        .unwrap();

    // The issue's case: entry 1 deleted; before, one more batch ran and readers counted 15.
    std::fs::remove_file(out.join("_weir_metadata/1")).unwrap();
    let (damaged_ck, damaged_out) = (contents(&ck), contents(&out));
    let (ok, err) = weir_run(&["--checkpoint", ck_s, "--max-batches", "1"], &sql);
    assert!(!ok, "a lost manifest entry was accepted");
    assert!(
        err.contains("SINK_MANIFEST_CORRUPT") && err.contains("_weir_metadata/1"),
        "{err}"
    );
    assert_unchanged("lost entry", &damaged_ck, &ck);
    assert_unchanged("lost entry", &damaged_out, &out);

    type Damage = fn(&Path);
    let damages: [(&str, Damage, &str); 3] = [
        (
            "deleted",
            |p| std::fs::remove_file(p).unwrap(),
            "FAILED_READ_FILE.FILE_NOT_EXIST",
        ),
        (
            "emptied",
            |p| std::fs::write(p, b"").unwrap(),
            "FAILED_READ_FILE.FILE_SIZE_MISMATCH",
        ),
        (
            "cut",
            |p| {
                let b = std::fs::read(p).unwrap();
                std::fs::write(p, &b[..b.len() / 2]).unwrap();
            },
            "FAILED_READ_FILE.FILE_SIZE_MISMATCH",
        ),
    ];
    for (how, damage, class) in damages {
        restore();
        damage(&out.join(&part_of_batch_1));
        let (stdout, stderr) = count();
        assert!(!stdout.contains("n="), "{how}: read {stdout}");
        assert!(
            stderr.contains(class) && stderr.contains(&part_of_batch_1),
            "{how}: {stderr}"
        );
        let (damaged_ck, damaged_out) = (contents(&ck), contents(&out));
        let (ok, err) = weir_run(&["--checkpoint", ck_s, "--max-batches", "1"], &sql);
        assert!(!ok, "{how}: accepted");
        assert!(
            err.contains(class) && err.contains(&part_of_batch_1),
            "{how}: {err}"
        );
        assert_unchanged(how, &damaged_ck, &ck);
        assert_unchanged(how, &damaged_out, &out);
    }
    restore();
    let (ok, err) = weir_run(&["--checkpoint", ck_s, "--max-batches", "1"], &sql);
    assert!(ok, "{err}");
    assert!(count().0.contains("n=20"), "{:?}", count());
}

/// Damage to any one file, as a storage fault or an unlucky operator makes it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// The second half gone.
    Truncated,
    /// Cut at its last line end.
    CutAtLine,
    /// One bit flipped, in the middle.
    FlippedBit,
    /// Every byte replaced by other bytes (the same length).
    Garbage,
    Deleted,
}

const FAULTS: [Fault; 5] = [
    Fault::Truncated,
    Fault::CutAtLine,
    Fault::FlippedBit,
    Fault::Garbage,
    Fault::Deleted,
];

fn fault(path: &Path, how: Fault) {
    let bytes = std::fs::read(path).unwrap();
    let damaged = match how {
        Fault::Truncated => bytes[..bytes.len() / 2].to_vec(),
        Fault::CutAtLine => match bytes.iter().rposition(|&b| b == b'\n') {
            Some(at) => bytes[..at].to_vec(),
            None => bytes[..bytes.len() / 2].to_vec(),
        },
        Fault::FlippedBit => {
            let mut b = bytes.clone();
            if !b.is_empty() {
                let at = b.len() / 2;
                b[at] ^= 0x04;
            }
            b
        }
        Fault::Garbage => bytes
            .iter()
            .enumerate()
            .map(|(i, b)| b.wrapping_mul(31).wrapping_add(i as u8) ^ 0x5a)
            .collect(),
        Fault::Deleted => {
            std::fs::remove_file(path).unwrap();
            return;
        }
    };
    std::fs::write(path, damaged).unwrap();
}

/// The parquet sink's rows, `value` sorted, through batch SQL over its folder.
fn parquet_values(out: &Path) -> Result<Vec<i64>, String> {
    let o = support::weir_command()
        .args([
            "run",
            "-e",
            &format!(
                "CREATE EXTERNAL TABLE r STORED AS PARQUET LOCATION '{}'; SELECT \
                 concat('v=', value) AS v FROM r",
                out.display()
            ),
        ])
        .output()
        .unwrap();
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    let mut v: Vec<i64> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.trim_matches(|c| c == '|' || c == ' ').strip_prefix("v="))
        .map(|n| n.parse().unwrap())
        .collect();
    v.sort_unstable();
    Ok(v)
}

/// What a run after damaging one file did.
#[derive(Debug, Default)]
struct MatrixCounts {
    /// It ran, and the output is what an undamaged run gives.
    harmless: usize,
    /// It refused, naming the file, before writing anything.
    refused: usize,
    /// It ran, writing what an undamaged run writes, and a reader names the damaged file.
    named_by_readers: usize,
}

/// The files of `<dir>/ck` and `<dir>/out`, as `ck/...` and `out/...`.
fn files_of(dir: &Path) -> Vec<String> {
    ["ck", "out"]
        .iter()
        .flat_map(|d| {
            contents(&dir.join(d))
                .into_iter()
                .map(move |(rel, _)| format!("{d}/{rel}"))
        })
        .filter(|f| !f.ends_with(".weir-lock"))
        .collect()
}

/// Damages each of `files` (under `work`, whose `ck` and `out` folders `restore` puts back) in
/// every way, runs the query (`run`), and checks the outcome: a refusal must name the file (or
/// its store, for a snapshot's data file) and leave both folders as they were; after a run that
/// went on, `output` says whether the output is right (`Ok`), or gives a reader's error, which
/// `read_error_allowed` must accept for that file.
fn damage_matrix(
    work: &Path,
    files: &[String],
    restore: impl Fn(),
    run: impl Fn() -> (bool, String),
    output: impl Fn() -> Result<(), String>,
    read_error_allowed: impl Fn(&str, &str) -> bool,
) -> MatrixCounts {
    let (ck, out) = (work.join("ck"), work.join("out"));
    let mut counts = MatrixCounts::default();
    for file in files {
        for how in FAULTS {
            let case = format!("{file} {how:?}");
            restore();
            fault(&work.join(file), how);
            let (damaged_ck, damaged_out) = (contents(&ck), contents(&out));
            let (ok, err) = run();
            assert!(!err.contains("panicked"), "{case}: {err}");
            if ok {
                match output() {
                    Ok(()) => counts.harmless += 1,
                    Err(read) => {
                        assert!(read_error_allowed(file, &read), "{case}: {read} {err}");
                        counts.named_by_readers += 1;
                    }
                }
                continue;
            }
            let rel = file.split_once('/').map_or(file.as_str(), |(_, r)| r);
            let named = match rel.rsplit_once("/files/") {
                // A snapshot's data file: named by its store (the snapshot listing it).
                Some((store, _)) => err.contains(store),
                None => {
                    err.contains(rel)
                        // A lost changelog: its store has no such version.
                        || (how == Fault::Deleted
                            && rel.ends_with(".changelog")
                            && err.contains("STATE_STORE_VERSION_NOT_FOUND"))
                        // A lost offsets entry: the gap it leaves in the log.
                        || (how == Fault::Deleted
                            && rel.starts_with("offsets/")
                            && err.contains("offsets"))
                }
            };
            assert!(named, "{case}: the error does not name it: {err}");
            assert_unchanged(&case, &damaged_ck, &ck);
            assert_unchanged(&case, &damaged_out, &out);
            counts.refused += 1;
        }
    }
    assert_eq!(
        counts.harmless + counts.refused + counts.named_by_readers,
        files.len() * FAULTS.len()
    );
    counts
}

/// Every file of a checkpoint of a deduplication (RocksDB state, a snapshot every 2 versions)
/// and of its parquet sink's output, damaged in every way: each case either leaves the output
/// of the next run exactly what an undamaged run gives, or is refused, naming the file (or its
/// state store, for a snapshot's data file), before anything is written to either folder. A
/// committed part file damaged in place (the same size) is the exception: a restart does not
/// read the committed output, so the query goes on, writing what an undamaged run writes, and a
/// reader names the file by its checksum.
#[test]
fn every_file_of_a_checkpoint_and_its_parquet_output_damaged_is_harmless_or_refused_first() {
    let work = tempfile::tempdir().unwrap();
    let base = tempfile::tempdir().unwrap();
    let (ck, out) = (work.path().join("ck"), work.path().join("out"));
    let sql = format!(
        "CREATE STREAMING TABLE d USING parquet LOCATION '{}' OPTIONS \
         (stateStore.minDeltasForSnapshot '2', stateStore.maintenanceInterval '0') AS SELECT \
         DISTINCT ON (k) k, value FROM \
         (SELECT value % 13 AS k, value FROM STREAM rate_micro_batch(rowsPerBatch => 5, \
         numPartitions => 2))",
        out.display()
    );
    let ck_s = ck.to_str().unwrap().to_string();
    let run = |batches: &str| weir_run(&["--checkpoint", &ck_s, "--max-batches", batches], &sql);
    let (ok, err) = run("3");
    assert!(ok, "{err}");
    for d in ["ck", "out"] {
        copy_dir(&work.path().join(d), &base.path().join(d));
    }
    let restore = || {
        for d in ["ck", "out"] {
            let _ = std::fs::remove_dir_all(work.path().join(d));
            copy_dir(&base.path().join(d), &work.path().join(d));
        }
    };
    let (ok, err) = run("1");
    assert!(ok, "{err}");
    let expected = parquet_values(&out).unwrap();
    assert_eq!(expected, (0..13).collect::<Vec<_>>());

    let files = files_of(base.path());
    assert!(files.len() > 20, "{files:?}");
    let counts = damage_matrix(
        work.path(),
        &files,
        restore,
        || run("1"),
        || {
            let values = parquet_values(&out)?;
            assert_eq!(values, expected);
            Ok(())
        },
        |file, read| {
            file.starts_with("out/part-")
                && read.contains("FAILED_READ_FILE.FILE_CHECKSUM_MISMATCH")
                && read.contains(file.trim_start_matches("out/"))
        },
    );
    eprintln!(
        "parquet matrix: {} files x {} faults: {} harmless, {} refused before writing, {} \
         (committed part files damaged in place) named by readers",
        files.len(),
        FAULTS.len(),
        counts.harmless,
        counts.refused,
        counts.named_by_readers
    );
}

/// The Delta table's `k,n` rows by `k`, or the reader's error.
fn delta_counts(out: &Path) -> Result<Vec<String>, String> {
    let o = support::weir_command()
        .args([
            "run",
            "-e",
            &format!(
                "CREATE EXTERNAL TABLE c STORED AS DELTA LOCATION '{}'; SELECT \
                 concat(k, ',', n) AS r FROM c ORDER BY k",
                out.display()
            ),
        ])
        .output()
        .unwrap();
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let cell = l.trim_matches(|c| c == '|' || c == ' ');
            cell.contains(',').then(|| cell.to_string())
        })
        .collect())
}

/// Every file of the checkpoint of a `GROUP BY` into Delta (complete mode, RocksDB state with a
/// snapshot every 2 versions) and of the Delta table (its log and its data files), damaged in
/// every way: each case either leaves the table after the next run exactly as an undamaged run
/// does, or is refused, naming the file (or its store, for a snapshot's data file), before
/// anything is written.
#[test]
fn every_file_of_a_checkpoint_and_its_delta_table_damaged_is_harmless_or_refused_first() {
    let s = setup();
    let files = files_of(s.base.path());
    let out = s.work.path().join("out");
    // A log file that does not parse is named.
    s.restore();
    let log = "_delta_log/00000000000000000001.json";
    fault(&out.join(log), Fault::Truncated);
    let (ok, err) = s.run();
    assert!(
        !ok && err.contains("DELTA_LOG_CORRUPT") && err.contains(log),
        "{err}"
    );
    let counts = damage_matrix(
        s.work.path(),
        &files,
        || s.restore(),
        || s.run(),
        || {
            assert_eq!(delta_counts(&out)?, ALL_FOUR);
            Ok(())
        },
        |_, _| false,
    );
    eprintln!(
        "delta matrix: {} files x {} faults: {} harmless, {} refused before writing",
        files.len(),
        FAULTS.len(),
        counts.harmless,
        counts.refused
    );
}
