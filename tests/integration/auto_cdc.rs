//! AUTO CDC flows in real pipelines: the seed's walkthrough end to end (an incremental flow over
//! JSON change files and a snapshot once flow into one SCD 1 table; the deduplication removed
//! and refused; `--reset-checkpoint` with `modifiedAfter`), SCD 2 history, and `kill -9` at every
//! stage of an AUTO CDC flow. Every table is compared with a model of the rules over the whole
//! input.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::support;

/// A change record: key, name, city, operation, sequence.
type Change = (Option<i64>, &'static str, &'static str, &'static str, i64);

/// The customers snapshot, at sequence 0 (the seed's `customers_snapshot_flow`).
const SNAPSHOT: [(i64, &str, &str); 4] = [
    (1, "Ana", "Lisbon"),
    (2, "Ben", "Porto"),
    (3, "Cy", "Faro"),
    (4, "Dee", "Braga"),
];

/// First update's files: an update, a delete, a re-sent insert, an out-of-order older update.
const FIRST: [&[Change]; 2] = [
    &[
        (Some(1), "Ana", "Madrid", "UPDATE", 3),
        (Some(2), "Ben", "Porto", "DELETE", 2),
        (Some(5), "Eve", "Rome", "INSERT", 1),
        (Some(5), "Eve", "Rome", "INSERT", 1),
        (Some(3), "Cy", "Faro2", "UPDATE", 5),
    ],
    &[
        (Some(3), "Cy", "Faro1", "UPDATE", 4),
        (Some(6), "Fay", "Oslo", "INSERT", 2),
    ],
];

/// Second update's file: an insert older than the delete of its key, a truncate at 4 (null
/// key), an update above it, one below it.
const SECOND: [&[Change]; 1] = [&[
    (Some(2), "Ben", "Paris", "INSERT", 1),
    (Some(7), "Gus", "Kyiv", "INSERT", 6),
    (None, "", "", "TRUNCATE", 4),
    (Some(1), "Ana", "Berlin", "UPDATE", 7),
    (Some(4), "Dee", "Old", "UPDATE", 3),
]];

/// After the reset (files modified later): an update, an insert, a delete, a stale update.
const THIRD: [&[Change]; 1] = [&[
    (Some(3), "Cy", "Nice", "UPDATE", 8),
    (Some(8), "Hal", "Bonn", "INSERT", 9),
    (Some(7), "", "", "DELETE", 10),
    (Some(3), "Cy", "Stale", "UPDATE", 6),
]];

/// SCD 1's model: per key the highest sequence wins (an upsert over a delete at an equal one),
/// shown if an upsert at or above the highest truncate. Rows `id,name,city`.
fn scd1_model(changes: &[Change]) -> Vec<String> {
    let floor = changes
        .iter()
        .filter(|c| c.3 == "TRUNCATE")
        .map(|c| c.4)
        .max();
    let mut best: BTreeMap<i64, &Change> = BTreeMap::new();
    for c in changes.iter().filter(|c| c.3 != "TRUNCATE") {
        let k = c.0.unwrap();
        if best
            .get(&k)
            .is_none_or(|b| c.4 > b.4 || (c.4 == b.4 && b.3 == "DELETE" && c.3 != "DELETE"))
        {
            best.insert(k, c);
        }
    }
    best.into_iter()
        .filter(|(_, c)| c.3 != "DELETE" && floor.is_none_or(|f| c.4 >= f))
        .map(|(k, c)| format!("{k},{},{}", c.1, c.2))
        .collect()
}

fn snapshot_changes() -> Vec<Change> {
    SNAPSHOT
        .iter()
        .map(|&(k, n, c)| (Some(k), n, c, "SNAPSHOT", 0))
        .collect()
}

/// Writes `files` into `dir` as JSON Lines, each modified at `at`.
fn land(dir: &Path, prefix: &str, files: &[&[Change]], at: SystemTime) {
    std::fs::create_dir_all(dir).unwrap();
    for (i, changes) in files.iter().enumerate() {
        let text: String = changes
            .iter()
            .map(|(k, name, city, op, seq)| {
                let k = k.map_or("null".to_string(), |k| k.to_string());
                let s = |v: &str| {
                    if v.is_empty() {
                        "null".to_string()
                    } else {
                        format!("\"{v}\"")
                    }
                };
                format!(
                    "{{\"customer_id\": {k}, \"name\": {}, \"city\": {}, \"operation\": \"{op}\", \
                     \"sequencenum\": {seq}}}\n",
                    s(name),
                    s(city)
                )
            })
            .collect();
        let path = dir.join(format!("{prefix}-{i}.json"));
        std::fs::write(&path, text).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(at)
            .unwrap();
    }
}

const SCHEMA: &str =
    "customer_id BIGINT, name STRING, city STRING, operation STRING, sequencenum BIGINT";

/// The seed's pipeline over the change files in `changes`; `dedupe`: the clean view drops
/// re-sent records; `starting`: extra source options.
fn seed_sql(changes: &Path, dedupe: bool, starting: &str) -> String {
    let distinct = if dedupe {
        "DISTINCT ON (customer_id, sequencenum) "
    } else {
        ""
    };
    let values: Vec<String> = SNAPSHOT
        .iter()
        .map(|(k, n, c)| format!("(CAST({k} AS BIGINT), '{n}', '{c}')"))
        .collect();
    format!(
        "CREATE OR REFRESH STREAMING TABLE customers;

CREATE TEMPORARY VIEW customers_cdc_clean AS
SELECT {distinct}* FROM STREAM read_files('{}', format => 'json', schema => '{SCHEMA}'{starting});

CREATE FLOW customers_incremental_flow AS AUTO CDC INTO customers
FROM STREAM(customers_cdc_clean)
KEYS (customer_id)
APPLY AS DELETE WHEN operation = 'DELETE'
APPLY AS TRUNCATE WHEN operation = 'TRUNCATE'
SEQUENCE BY sequenceNum
COLUMNS * EXCEPT (operation, sequenceNum)
STORED AS SCD TYPE 1;

CREATE TEMPORARY VIEW customers_snapshot AS
SELECT column1 AS customer_id, column2 AS name, column3 AS city FROM (VALUES {});

CREATE FLOW customers_snapshot_flow AS AUTO CDC ONCE INTO customers
FROM customers_snapshot
KEYS (customer_id)
SEQUENCE BY 0
STORED AS SCD TYPE 1;
",
        changes.display(),
        values.join(", ")
    )
}

/// A project in `dir` with `sql` and shuffle partitions 3 (so a truncate reaches several).
fn project(dir: &Path, sql: &str) -> std::path::PathBuf {
    let project = dir.join("p");
    std::fs::create_dir_all(project.join("transformations")).unwrap();
    std::fs::write(
        project.join("weir-pipeline.yml"),
        "name: cdc\nstorage: store\nlibraries:\n  - glob:\n      include: transformations/**\n\
         configuration:\n  spark.sql.shuffle.partitions: \"3\"\n",
    )
    .unwrap();
    std::fs::write(project.join("transformations/all.sql"), sql).unwrap();
    project
}

use crate::pipelines::update_with as update;

/// The rows of batch `sql` over the pipeline's table `table`.
fn rows(project: &Path, table: &str, sql: &str) -> Vec<String> {
    crate::pipelines::rows(project, &[table], sql)
}

fn customers(project: &Path) -> Vec<String> {
    rows(
        project,
        "customers",
        "SELECT customer_id, name, city FROM customers ORDER BY customer_id",
    )
}

fn jan() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600) // 2026-01-01
}

fn june() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_272_000) // 2026-06-01
}

#[test]
fn the_seed_walkthrough_keeps_customers_equal_to_an_scd1_model_of_all_its_changes() {
    let dir = tempfile::tempdir().unwrap();
    let changes = dir.path().join("changes");
    land(&changes, "a", &FIRST, jan());
    let project = project(dir.path(), &seed_sql(&changes, true, ""));
    let dry = support::weir_command()
        .args(["pipeline", "dry-run"])
        .current_dir(&project)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&dry.stdout).into_owned() + &String::from_utf8_lossy(&dry.stderr);
    assert!(dry.status.success(), "{said}");
    assert!(
        said.contains("customers_incremental_flow → customers (AUTO CDC, SCD type 1)")
            && said.contains("customers_snapshot_flow → customers (AUTO CDC once, SCD type 1)"),
        "{said}"
    );
    let (ok, stderr) = update(&project, &[]);
    assert!(ok, "{stderr}");
    let mut input = snapshot_changes();
    input.extend(FIRST.concat());
    assert_eq!(customers(&project), scd1_model(&input), "{stderr}");
    assert_eq!(
        customers(&project),
        [
            "1,Ana,Madrid",
            "3,Cy,Faro2",
            "4,Dee,Braga",
            "5,Eve,Rome",
            "6,Fay,Oslo"
        ]
    );
    // The target has the source's columns but the excepted ones (and, hidden from weir's
    // readers, each row's sequence).
    assert_eq!(
        rows(
            &project,
            "customers",
            "SELECT * FROM customers WHERE customer_id = 1"
        ),
        ["1,Ana,Madrid"]
    );

    // More changes: a stale insert under a tombstone, a truncate, changes around it.
    land(&changes, "b", &SECOND, jan());
    let (ok, stderr) = update(&project, &[]);
    assert!(ok, "{stderr}");
    input.extend(SECOND.concat());
    assert_eq!(customers(&project), scd1_model(&input), "{stderr}");
    assert_eq!(
        customers(&project),
        ["1,Ana,Berlin", "3,Cy,Faro2", "7,Gus,Kyiv"]
    );
    assert!(
        stderr
            .contains("customers_snapshot_flow → customers: once flow, done in an earlier update"),
        "{stderr}"
    );

    // The deduplication is removed: the flow's state no longer fits, and the update stops
    // before anything is written, naming the flow.
    std::fs::write(
        project.join("transformations/all.sql"),
        seed_sql(&changes, false, ""),
    )
    .unwrap();
    let data = || {
        let mut c = support::contents(&project.join("store"));
        c.retain(|(f, _)| !f.starts_with("_event_log"));
        c
    };
    let before = data();
    let (ok, stderr) = update(&project, &[]);
    assert!(!ok);
    assert!(
        stderr.contains("customers_incremental_flow → customers: FAILED")
            && stderr.contains("STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA"),
        "{stderr}"
    );
    assert_eq!(data(), before, "nothing was written");

    // New files, written later; the flow's source starts at modifiedAfter, its checkpoint is
    // reset: the AUTO CDC state (it still fits) stays, the deduplication's goes.
    land(&changes, "c", &THIRD, june());
    std::fs::write(
        project.join("transformations/all.sql"),
        seed_sql(&changes, false, ", modifiedAfter => '2026-03-01T00:00:00'"),
    )
    .unwrap();
    let (ok, stderr) = update(
        &project,
        &["--reset-checkpoint", "customers_incremental_flow"],
    );
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("Checkpoint of flow 'customers_incremental_flow' reset"),
        "{stderr}"
    );
    input.extend(THIRD.concat());
    assert_eq!(customers(&project), scd1_model(&input), "{stderr}");
    assert_eq!(
        customers(&project),
        ["1,Ana,Berlin", "3,Cy,Nice", "8,Hal,Bonn"]
    );
    // Each batch's MERGE is one Delta commit carrying the flow's transaction.
    let log = std::fs::read_dir(project.join("store/tables/customers/_delta_log"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .filter(|t| t.contains("\"MERGE\""))
        .collect::<Vec<_>>();
    assert!(log.len() >= 3, "{log:?}");
    assert!(log.iter().all(|t| t.contains("\"txn\"")), "{log:?}");
}

#[test]
fn an_auto_cdc_flow_killed_at_any_stage_loses_and_applies_no_change_twice() {
    let stages = [
        "after_wal",
        "after_get_batch",
        "state_committed",
        "after_sink",
        "after_commit",
    ];
    for stage in stages {
        let dir = tempfile::tempdir().unwrap();
        let changes = dir.path().join("changes");
        land(&changes, "a", &FIRST, jan());
        land(&changes, "b", &SECOND, jan());
        // One file per batch: three batches, the kill in the second.
        let project = project(
            dir.path(),
            &seed_sql(&changes, true, ", maxFilesPerTrigger => 1"),
        );
        let spec = project.join("weir-pipeline.yml");
        support::kill_at(
            &["pipeline", "run", "--spec", spec.to_str().unwrap()],
            stage,
            1,
            &[],
        );
        let (ok, stderr) = update(&project, &[]);
        assert!(ok, "{stage}: {stderr}");
        let mut input = snapshot_changes();
        input.extend(FIRST.concat());
        input.extend(SECOND.concat());
        assert_eq!(customers(&project), scd1_model(&input), "{stage}: {stderr}");
        // The state the flow keeps is readable offline, one row per key it has seen.
        let checkpoint = project.join("store/_checkpoints/customers/customers_incremental_flow");
        let keys = rows(
            &project,
            "customers",
            &format!(
                "SELECT count(*) FROM read_state('{}', operatorId => 0)",
                checkpoint.display()
            ),
        );
        assert_eq!(
            keys,
            ["3"],
            "{stage}: keys 1 (7), 3 (5) and 7 (6): the truncate at 4 took the keys below it"
        );
    }
}

/// Databricks' SCD 2 example input ([D1]): id, name, city, operation, sequence.
const DOCS: [&[Change]; 2] = [
    &[
        (Some(124), "Raul", "Oaxaca", "INSERT", 1),
        (Some(123), "Isabel", "Monterrey", "INSERT", 1),
        (Some(125), "Mercedes", "Tijuana", "INSERT", 2),
        (Some(126), "Lily", "Cancun", "INSERT", 2),
    ],
    &[
        (Some(123), "", "", "DELETE", 6),
        (Some(125), "Mercedes", "Guadalajara", "UPDATE", 6),
        (Some(125), "Mercedes", "Mexicali", "UPDATE", 5),
        (Some(123), "Isabel", "Chihuahua", "UPDATE", 5),
    ],
];

#[test]
fn scd2_tables_hold_the_docs_history_with_every_column_or_only_some_tracked() {
    let dir = tempfile::tempdir().unwrap();
    let changes = dir.path().join("changes");
    land(&changes, "a", &DOCS, jan());
    let flow = |name: &str, track: &str| {
        format!(
            "CREATE STREAMING TABLE {name};
CREATE FLOW {name}_flow AS AUTO CDC INTO {name} FROM STREAM(changes)
KEYS (customer_id) APPLY AS DELETE WHEN operation = 'DELETE' SEQUENCE BY sequencenum
COLUMNS * EXCEPT (operation, sequencenum) STORED AS SCD TYPE 2 {track};
"
        )
    };
    let sql = format!(
        "CREATE TEMPORARY VIEW changes AS SELECT * FROM STREAM read_files('{}', format => 'json', \
         schema => '{SCHEMA}', maxFilesPerTrigger => 1);
{}{}",
        changes.display(),
        flow("history", ""),
        flow("by_name", "TRACK HISTORY ON * EXCEPT (city)"),
    );
    let project = project(dir.path(), &sql);
    let (ok, stderr) = update(&project, &[]);
    assert!(ok, "{stderr}");
    let history = |table: &str| {
        rows(
            &project,
            table,
            &format!(
                "SELECT customer_id, name, city, \"__START_AT\", \"__END_AT\" FROM {table} \
                 ORDER BY customer_id, \"__START_AT\""
            ),
        )
    };
    // [D1]'s published SCD 2 table: the late Mexicali (5) is put between Tijuana and
    // Guadalajara, and Isabel's delete at 6 closes her Chihuahua version.
    assert_eq!(
        history("history"),
        [
            "123,Isabel,Monterrey,1,5",
            "123,Isabel,Chihuahua,5,6",
            "124,Raul,Oaxaca,1,",
            "125,Mercedes,Tijuana,2,5",
            "125,Mercedes,Mexicali,5,6",
            "125,Mercedes,Guadalajara,6,",
            "126,Lily,Cancun,2,"
        ]
    );
    // Changes of the untracked city update the version in place.
    assert_eq!(
        history("by_name"),
        [
            "123,Isabel,Chihuahua,1,6",
            "124,Raul,Oaxaca,1,",
            "125,Mercedes,Guadalajara,2,",
            "126,Lily,Cancun,2,"
        ]
    );
    // Sent again, the same changes change nothing.
    land(&changes, "again", &DOCS, jan());
    let (ok, stderr) = update(&project, &[]);
    assert!(ok, "{stderr}");
    assert_eq!(history("history").len(), 7);
    assert_eq!(history("by_name").len(), 4);
}

/// A tiny deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Random changes of keys 0..20: unique sequences per key (so no two different changes share
/// one), about 10 % deletes, some truncates (`truncates`), shuffled so that many arrive out of
/// order, one in ten sent twice; cut into `files` files.
fn random_changes(rng: &mut Rng, n: usize, truncates: bool, files: usize) -> Vec<Vec<Change>> {
    const NAMES: [&str; 3] = ["Ana", "Ben", "Cy"];
    const CITIES: [&str; 2] = ["Rome", "Oslo"];
    let mut changes: Vec<Change> = vec![];
    let mut next = 0i64;
    for _ in 0..n {
        // Sequences are global and rising, with gaps, so late changes land between others.
        next += 1 + rng.next(3) as i64;
        let k = rng.next(20) as i64;
        changes.push(match rng.next(30) {
            0..=2 => (Some(k), "", "", "DELETE", next),
            3 if truncates => (None, "", "", "TRUNCATE", next),
            _ => (
                Some(k),
                NAMES[rng.next(3) as usize],
                CITIES[rng.next(2) as usize],
                "UPSERT",
                next,
            ),
        });
    }
    for i in 0..changes.len() {
        if rng.next(3) == 0 {
            let j = (i + 1 + rng.next(15) as usize).min(changes.len() - 1);
            changes.swap(i, j);
        }
    }
    let mut sent = vec![];
    for c in changes {
        sent.push(c);
        if rng.next(10) == 0 {
            sent.push(c);
        }
    }
    let per_file = sent.len().div_ceil(files);
    sent.chunks(per_file).map(|c| c.to_vec()).collect()
}

/// SCD 2's model: per key its changes in sequence order; runs of upserts with equal values
/// are one version from the first, a delete ends the open one. Rows `id,name,city,start,end`.
fn scd2_model(changes: &[Change]) -> Vec<String> {
    let mut by_key: BTreeMap<i64, BTreeMap<i64, &Change>> = BTreeMap::new();
    for c in changes {
        by_key.entry(c.0.unwrap()).or_default().insert(c.4, c);
    }
    let mut out = vec![];
    for (k, changes) in by_key {
        let mut open: Option<(i64, &Change)> = None;
        for (&s, c) in &changes {
            if let Some((start, first)) = open {
                if c.3 != "DELETE" && (c.1, c.2) == (first.1, first.2) {
                    continue;
                }
                out.push(format!("{k},{},{},{start},{s}", first.1, first.2));
                open = None;
            }
            if c.3 != "DELETE" {
                open = Some((s, c));
            }
        }
        if let Some((start, first)) = open {
            out.push(format!("{k},{},{},{start},", first.1, first.2));
        }
    }
    out
}

#[test]
fn random_change_streams_through_delta_equal_the_scd1_and_scd2_models() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x05ee_dcdc);
    let scd1 = random_changes(&mut rng, 160, true, 6);
    let scd2 = random_changes(&mut rng, 120, false, 6);
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    let source = |name: &str, path: &Path| {
        format!(
            "CREATE TEMPORARY VIEW {name} AS SELECT * FROM STREAM read_files('{}', format => \
             'json', schema => '{SCHEMA}', maxFilesPerTrigger => 1);\n",
            path.display()
        )
    };
    let sql = format!(
        "{}{}CREATE STREAMING TABLE t1;
CREATE FLOW f1 AS AUTO CDC INTO t1 FROM STREAM(c1) KEYS (customer_id)
APPLY AS DELETE WHEN operation = 'DELETE' APPLY AS TRUNCATE WHEN operation = 'TRUNCATE'
SEQUENCE BY sequencenum COLUMNS * EXCEPT (operation, sequencenum);
CREATE STREAMING TABLE t2;
CREATE FLOW f2 AS AUTO CDC INTO t2 FROM STREAM(c2) KEYS (customer_id)
APPLY AS DELETE WHEN operation = 'DELETE' SEQUENCE BY sequencenum
COLUMNS * EXCEPT (operation, sequencenum) STORED AS SCD TYPE 2;
",
        source("c1", &one),
        source("c2", &two)
    );
    let project = project(dir.path(), &sql);
    // Two updates of three files (three batches) each.
    for half in [0..3, 3..6] {
        fn files(all: &[Vec<Change>], half: std::ops::Range<usize>) -> Vec<&[Change]> {
            all[half].iter().map(Vec::as_slice).collect()
        }
        land(
            &one,
            &format!("u{}", half.start),
            &files(&scd1, half.clone()),
            jan(),
        );
        land(
            &two,
            &format!("u{}", half.start),
            &files(&scd2, half.clone()),
            jan(),
        );
        let (ok, stderr) = update(&project, &[]);
        assert!(ok, "{stderr}");
        let sent = |all: &[Vec<Change>]| all[..half.end].concat();
        assert_eq!(
            rows(
                &project,
                "t1",
                "SELECT customer_id, name, city FROM t1 ORDER BY customer_id"
            ),
            scd1_model(&sent(&scd1)),
            "SCD 1 after {} files",
            half.end
        );
        assert_eq!(
            rows(
                &project,
                "t2",
                "SELECT customer_id, name, city, \"__START_AT\", \"__END_AT\" FROM t2 \
                 ORDER BY customer_id, \"__START_AT\""
            ),
            scd2_model(&sent(&scd2)),
            "SCD 2 after {} files",
            half.end
        );
    }
}

/// `weir checkpoint repartition` of an SCD 1 AUTO CDC query (DBSQL's form, `weir run`): its keys
/// move to 3 partitions, and the truncate floor reaches every one of them, so a change below it
/// stays out whichever partition its key now lives in.
#[test]
fn a_repartitioned_auto_cdc_checkpoint_keeps_its_keys_and_its_truncate_floor() {
    let dir = tempfile::tempdir().unwrap();
    let changes = dir.path().join("changes");
    let before: Vec<Change> = (0..10)
        .map(|k| (Some(k), "Ana", "Rome", "INSERT", 10 + k))
        .chain([(None, "", "", "TRUNCATE", 15)])
        .collect();
    land(&changes, "a", &[&before], jan());
    let ck = dir.path().join("ck").display().to_string();
    let sql = format!(
        "CREATE STREAMING TABLE customers LOCATION '{}' OPTIONS (trigger 'availableNow') \
         FLOW AUTO CDC FROM STREAM read_files('{}', format => 'json', schema => '{SCHEMA}') \
         KEYS (customer_id) APPLY AS TRUNCATE WHEN operation = 'TRUNCATE' \
         SEQUENCE BY sequencenum COLUMNS * EXCEPT (operation, sequencenum)",
        dir.path().join("out").display(),
        changes.display()
    );
    let (ok, _, err) = support::weir(&["run", "--checkpoint", &ck, "-e", &sql]);
    assert!(ok, "{err}");
    let (ok, _, err) = support::weir(&["checkpoint", "repartition", &ck, "--partitions", "3"]);
    assert!(ok, "{err}");
    // Below the floor for every key (0..4 were truncated), above it for key 20.
    let after: Vec<Change> = (0..5)
        .map(|k| (Some(k), "Old", "Rome", "UPDATE", 14))
        .chain([(Some(20), "New", "Oslo", "INSERT", 30)])
        .collect();
    land(&changes, "b", &[&after], jan());
    let (ok, _, err) = support::weir(&["run", "--checkpoint", &ck, "-e", &sql]);
    assert!(ok, "{err}");
    let mut input = before.clone();
    input.extend(after);
    let (ok, out, err) = support::weir(&[
        "run",
        "-e",
        &format!(
            "CREATE EXTERNAL TABLE c STORED AS DELTA LOCATION '{}'; \
             SELECT string_agg(CAST(customer_id AS VARCHAR), ',' ORDER BY customer_id) AS ids \
             FROM c",
            dir.path().join("out").display()
        ),
    ]);
    assert!(ok, "{err}");
    let expected: Vec<String> = scd1_model(&input)
        .iter()
        .map(|r| r.split(',').next().unwrap().to_string())
        .collect();
    assert_eq!(expected, ["5", "6", "7", "8", "9", "20"]);
    assert!(out.contains(&expected.join(",")), "{out}");
}
