//! Checkpoints on S3, against a real S3 server started on loopback: SeaweedFS (`weed mini`),
//! which `scripts/test-servers` installs (and `scripts/test` runs) and names in `WEIR_WEED`.
//! Without it the tests fail, unless `WEIR_SKIP_SERVER_TESTS=1` asks to skip them, loudly.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use weir_common::Location;
use weir_common::location::Created;

use crate::support;

/// A SeaweedFS server with an S3 endpoint and a bucket `weir`, stopped when dropped.
struct S3Server {
    _turn: std::sync::MutexGuard<'static, ()>,
    child: Child,
    endpoint: String,
    _dir: tempfile::TempDir,
}

/// A free loopback port whose gRPC companion (SeaweedFS uses port + 10000) is free too.
fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if port < 55000 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

/// Two SeaweedFS servers at once get in each other's way: the tests take turns.
static ONE_SERVER_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl S3Server {
    /// The server, or `None` when the caller asked to skip server tests.
    fn start() -> Option<Self> {
        let weed = match std::env::var("WEIR_WEED") {
            Ok(w) => w,
            Err(_) if std::env::var("WEIR_SKIP_SERVER_TESTS").is_ok_and(|v| v == "1") => {
                eprintln!(
                    "\n!!! SKIPPED: the S3 checkpoint tests (WEIR_SKIP_SERVER_TESTS=1) !!!\n"
                );
                return None;
            }
            Err(_) => panic!(
                "WEIR_WEED is not set. Run the tests with scripts/test, which installs \
                 SeaweedFS (scripts/test-servers), or set WEIR_SKIP_SERVER_TESTS=1 to skip them"
            ),
        };
        let turn = ONE_SERVER_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = tempfile::tempdir().unwrap();
        // One identity, whose keys `options` signs with.
        let config = dir.path().join("s3.json");
        std::fs::write(
            &config,
            r#"{"identities":[{"name":"weir","credentials":[{"accessKey":"weir","secretKey":"weir-secret"}],"actions":["Admin","Read","Write","List","Tagging"]}]}"#,
        )
        .unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        // Free ports are picked, then bound by SeaweedFS: another process (a test's server on
        // port 0) may take one in between, and then SeaweedFS exits or never serves. Try again
        // with other ports.
        for attempt in 1..=3 {
            let [master, volume, filer, s3] = [(); 4].map(|()| free_port());
            let mut child = Command::new(&weed)
                .arg("mini")
                .arg(format!("-dir={}", data.display()))
                .arg(format!("-s3.config={}", config.display()))
                .arg("-master.telemetry=false")
                .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-bucket=weir"])
                .args(["-webdav=false", "-admin.ui=false"])
                .arg(format!("-master.port={master}"))
                .arg(format!("-volume.port={volume}"))
                .arg(format!("-filer.port={filer}"))
                .arg(format!("-s3.port={s3}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {weed}: {e}"));
            let started = Instant::now();
            let up = loop {
                if TcpStream::connect(("127.0.0.1", s3)).is_ok() {
                    break true;
                }
                if started.elapsed() > Duration::from_secs(30)
                    || child.try_wait().ok().flatten().is_some()
                {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            if up {
                return Some(Self {
                    _turn: turn,
                    child,
                    endpoint: format!("http://127.0.0.1:{s3}"),
                    _dir: dir,
                });
            }
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("SeaweedFS did not come up (attempt {attempt}); trying other ports");
            let _ = std::fs::remove_dir_all(&data);
            std::fs::create_dir(&data).unwrap();
        }
        panic!("SeaweedFS's S3 endpoint did not come up in three attempts")
    }

    /// The client options that point object_store at this server.
    fn options(&self) -> Vec<(&'static str, String)> {
        vec![
            ("aws_endpoint_url", self.endpoint.clone()),
            ("aws_allow_http", "true".into()),
            ("aws_region", "us-east-1".into()),
            ("aws_access_key_id", "weir".into()),
            ("aws_secret_access_key", "weir-secret".into()),
        ]
    }

    /// The `AWS_*` variables that point a client at this server.
    fn env(&self) -> Vec<(String, String)> {
        self.options()
            .into_iter()
            .map(|(k, v)| (k.to_ascii_uppercase(), v))
            .collect()
    }

    /// Runs `weir run args...` against this server (with `env` too); it must succeed. Its
    /// standard output.
    fn weir(&self, args: &[&str], env: &[(&str, &str)]) -> String {
        let out = support::weir_command()
            .arg("run")
            .args(args)
            .envs(self.env())
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "weir run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// `location` on this server, retried while the bucket is still being created.
    async fn location(&self, url: &str) -> Location {
        let location = Location::parse_with(url, self.options()).unwrap();
        let started = Instant::now();
        // A missing bucket answers a GET with 404, which reads as "no such object": listing
        // tells whether the bucket is there yet.
        while location.list_all().await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the bucket did not become readable"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        location
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn on_s3_a_log_entry_is_written_once_and_a_query_resumes_from_its_checkpoint() {
    let Some(server) = S3Server::start() else {
        return;
    };

    // The fence of every weir log: of two writers of one entry, exactly one wins.
    let a = server.location("s3://weir/fence").await;
    let b = server.location("s3://weir/fence/").await;
    assert_eq!(
        a.put_if_absent("offsets/0", Bytes::from("first"))
            .await
            .unwrap(),
        Created::Yes
    );
    assert_eq!(
        b.put_if_absent("offsets/0", Bytes::from("second"))
            .await
            .unwrap(),
        Created::AlreadyExisted
    );
    assert_eq!(
        b.get("offsets/0").await.unwrap().unwrap(),
        Bytes::from("first")
    );

    // A query checkpointed on S3 runs three batches, then a restart runs two more from where
    // it stopped.
    let run = |batches: &str| {
        let mut c = support::weir_command();
        c.args([
            "run",
            "-e",
            "SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 10)",
            "--checkpoint",
            "s3://weir/queries/q1",
            "--max-batches",
            batches,
        ]);
        for (k, v) in server.options() {
            c.env(k.to_ascii_uppercase(), v);
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "weir run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run("3");
    let ck = server.location("s3://weir/queries/q1").await;
    let first = ck.get("offsets/2").await.unwrap().expect("offsets/2");
    assert!(ck.get("commits/2").await.unwrap().is_some());
    assert!(ck.get("offsets/3").await.unwrap().is_none());
    run("2");
    for n in 3..5 {
        assert!(
            ck.get(&format!("commits/{n}")).await.unwrap().is_some(),
            "commits/{n}"
        );
    }
    assert_eq!(
        ck.get("offsets/2").await.unwrap().unwrap(),
        first,
        "the restart left the first run's log alone"
    );
    let next = weir::checkpoint::OffsetEntry::decode(&ck.get("offsets/3").await.unwrap().unwrap())
        .unwrap();
    assert_eq!(
        next.sources[0].start.0["offset"], 30,
        "batch 3 starts after the 30 rows of batches 0-2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_source_on_s3_reads_each_landed_file_once_and_archives_it_on_s3() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let landing = server.location("s3://weir/landing").await;
    let land = |i: i64| {
        let landing = landing.clone();
        async move {
            let text: String = (10 * i..10 * i + 10)
                .map(|id| format!("{{\"id\":{id}}}\n"))
                .collect();
            landing
                .put(&format!("day=1/f{i}.json"), Bytes::from(text))
                .await
                .unwrap();
        }
    };
    land(0).await;
    land(1).await;
    let out = tempfile::tempdir().unwrap();
    let sql = format!(
        "CREATE STREAMING TABLE landed USING parquet LOCATION '{}' AS SELECT id \
         FROM STREAM read_files('s3://weir/landing', format => 'json', recursiveFileLookup => true, \
         cleanSource => 'archive', sourceArchiveDir => 's3://weir/archive', \
         schemaLocation => 's3://weir/schemas/landed')",
        out.path().display()
    );
    let run = || {
        let mut c = support::weir_command();
        c.args(["run", "-e", &sql])
            .args(["--checkpoint", "s3://weir/queries/files"])
            .args(["--trigger", "availableNow"]);
        for (k, v) in server.options() {
            c.env(k.to_ascii_uppercase(), v);
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "weir run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run();
    land(2).await;
    run();
    // Nothing new, and nothing left to infer a schema from: the schema kept at schemaLocation
    // plans the query; a third run reads nothing and writes nothing.
    run();

    let session = weir::WeirSession::new();
    session
        .context()
        .sql(&format!(
            "CREATE EXTERNAL TABLE landed STORED AS PARQUET LOCATION '{}'",
            out.path().display()
        ))
        .await
        .unwrap();
    let counts = session
        .context()
        .sql("SELECT count(*) AS n, count(DISTINCT id) AS d, max(id) AS hi FROM landed")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let text = weir::datafusion::arrow::util::pretty::pretty_format_batches(&counts)
        .unwrap()
        .to_string();
    assert!(text.contains("| 30 | 30 | 29 |"), "{text}");
    assert!(
        landing.list_all().await.unwrap().is_empty(),
        "every committed file is archived"
    );
    let archive = server.location("s3://weir/archive").await;
    let mut archived = archive.list_all().await.unwrap();
    archived.sort();
    assert_eq!(
        archived,
        vec!["day=1/f0.json", "day=1/f1.json", "day=1/f2.json"]
    );
    let ck = server.location("s3://weir/queries/files").await;
    assert!(ck.get("sources/0/schema").await.unwrap().is_some());
    let kept = server.location("s3://weir/schemas/landed").await;
    assert!(kept.get("_schemas/0").await.unwrap().is_some());
    assert!(ck.get("commits/1").await.unwrap().is_some());
    assert!(ck.get("offsets/2").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_s3_a_lease_refuses_a_second_live_run_and_expires_after_a_kill() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let ck_url = "s3://weir/queries/leased";
    let weir = |extra: &[&str]| {
        let mut c = support::weir_command();
        c.args([
            "run",
            "-e",
            "SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 10)",
            "--checkpoint",
            ck_url,
        ])
        .args(extra)
        .env("WEIR_CHECKPOINT_LEASE_MS", "3000")
        .stdout(Stdio::null());
        for (k, v) in server.options() {
            c.env(k.to_ascii_uppercase(), v);
        }
        c
    };
    let ck = server.location(ck_url).await;
    let mut first = weir(&["--trigger", "processingTime=100 milliseconds"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while ck.get("commits/0").await.unwrap().is_none() {
        if let Ok(Some(status)) = first.try_wait() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut first.stderr.take().unwrap(), &mut err).unwrap();
            panic!("the first run ended ({status}): {err}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the first run never committed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ck.get(".weir-lease").await.unwrap().is_some());

    // A second run while the first is live: refused, before it writes anything.
    let second = weir(&["--max-batches", "1"]).output().unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("CONCURRENT_QUERY"), "{stderr}");
    assert!(stderr.contains("lease runs until"), "{stderr}");

    // The first is killed: its lease blocks a restart until it expires (3 s here).
    first.kill().unwrap();
    first.wait().unwrap();
    let killed_at = Instant::now();
    let early = weir(&["--max-batches", "1"]).output().unwrap();
    assert!(!early.status.success() && killed_at.elapsed() < Duration::from_secs(3));
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let late = weir(&["--max-batches", "1"]).output().unwrap();
    assert!(
        late.status.success(),
        "after the lease expired: {}",
        String::from_utf8_lossy(&late.stderr)
    );
    // A clean stop gives the lease back: the next run starts at once.
    assert!(ck.get(".weir-lease").await.unwrap().is_none());
    let next = weir(&["--max-batches", "1"]).output().unwrap();
    assert!(
        next.status.success(),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parquet_sink_on_s3_is_read_back_through_its_manifest() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let _ = server.location("s3://weir/sinks").await;
    let weir = |sql: &str, extra: &[&str]| server.weir(&[&["-e", sql], extra].concat(), &[]);
    let write = "CREATE STREAMING TABLE evens USING parquet LOCATION 's3://weir/sinks/evens' AS \
                 SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 10) WHERE value % 2 = 0";
    weir(
        write,
        &[
            "--checkpoint",
            "s3://weir/queries/evens",
            "--max-batches",
            "3",
        ],
    );
    weir(
        write,
        &[
            "--checkpoint",
            "s3://weir/queries/evens",
            "--max-batches",
            "2",
        ],
    );
    let sink = server.location("s3://weir/sinks/evens").await;
    assert!(sink.get("_weir_metadata/4").await.unwrap().is_some());
    let read = weir(
        "CREATE EXTERNAL TABLE evens STORED AS PARQUET LOCATION 's3://weir/sinks/evens'; \
         SELECT count(*) AS n, count(DISTINCT value) AS d, max(value) AS hi FROM evens",
        &[],
    );
    assert!(read.contains("| 25 | 25 | 48 |"), "{read}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_table_on_s3_is_written_exactly_once_and_streamed_into_another() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let _ = server.location("s3://weir/delta").await;
    let weir = |sql: &str, extra: &[&str]| server.weir(&[&["-e", sql], extra].concat(), &[]);
    let write = "CREATE STREAMING TABLE evens USING delta LOCATION 's3://weir/delta/evens' AS \
                 SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 10) WHERE value % 2 = 0";
    for batches in ["3", "2"] {
        weir(
            write,
            &[
                "--checkpoint",
                "s3://weir/queries/delta-evens",
                "--max-batches",
                batches,
            ],
        );
    }
    // A second streaming table reads the first from S3, to the end of what is there now.
    let copy = "CREATE STREAMING TABLE copy USING delta LOCATION 's3://weir/delta/copy' AS \
                SELECT value FROM STREAM delta(path => 's3://weir/delta/evens')";
    weir(
        copy,
        &[
            "--checkpoint",
            "s3://weir/queries/delta-copy",
            "--trigger",
            "availableNow",
        ],
    );
    let table = server.location("s3://weir/delta/evens").await;
    assert!(
        table
            .get("_delta_log/00000000000000000005.json")
            .await
            .unwrap()
            .is_some(),
        "one commit per batch after the table's creation"
    );
    let read = weir(
        "CREATE EXTERNAL TABLE evens STORED AS DELTA LOCATION 's3://weir/delta/evens'; \
         CREATE EXTERNAL TABLE copy STORED AS DELTA LOCATION 's3://weir/delta/copy'; \
         SELECT count(*) AS n, count(DISTINCT value) AS d, max(value) AS hi FROM evens \
         UNION ALL SELECT count(*), count(DISTINCT value), max(value) FROM copy",
        &[],
    );
    assert_eq!(read.matches("| 25 | 25 | 48 |").count(), 2, "{read}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateful_query_on_an_s3_checkpoint_keeps_its_state_across_kills() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let ck = server.location("s3://weir/queries/counts").await;
    let mut env = server.env();
    env.push(("WEIR_CHECKPOINT_LEASE_MS".into(), "1000".into()));
    let sql = "CREATE STREAMING TABLE counts USING delta LOCATION 's3://weir/delta/counts' \
               OPTIONS (outputMode 'complete', stateStore.minDeltasForSnapshot '2', \
               stateStore.maintenanceInterval '0') AS \
               SELECT value % 5 AS k, count(*) AS n, sum(value) AS s \
               FROM STREAM rate_micro_batch(rowsPerBatch => 10) GROUP BY value % 5";
    let weir = |args: &[&str]| server.weir(args, &[("WEIR_CHECKPOINT_LEASE_MS", "1000")]);
    let query = [
        "-e",
        sql,
        "--checkpoint",
        "s3://weir/queries/counts",
        "--max-batches",
        "2",
    ];
    weir(&query);
    // Killed after the state of a batch is committed but before the batch is; after the sink;
    // and before the offsets: each restart must resume from the state of the last commit.
    for (stage, batch) in [("state_committed", 2), ("after_sink", 3), ("before_wal", 4)] {
        support::run_and_kill_at_with_env(sql, "s3://weir/queries/counts", stage, batch, &env);
        // The killed run's lease must expire before the next run may start.
        tokio::time::sleep(Duration::from_millis(1300)).await;
    }
    weir(&query);

    let names = ck.list_all().await.unwrap();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("state/") && n.ends_with(".changelog")),
        "the state's changelogs are in the S3 checkpoint: {names:?}"
    );
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("state/") && n.ends_with(".snapshot")),
        "and its snapshots (images, which need no other files): {names:?}"
    );
    let batches = names.iter().filter(|n| n.starts_with("commits/")).count() as i64;
    assert!(batches >= 5, "{names:?}");
    let rows = 10 * batches;
    let read = weir(&[
        "-e",
        "CREATE EXTERNAL TABLE counts STORED AS DELTA LOCATION 's3://weir/delta/counts'; \
         SELECT sum(n) AS n, sum(s) AS s, min(n) AS lo, max(n) AS hi FROM counts",
    ]);
    let expected = format!(
        "| {rows} | {} | {} | {} |",
        rows * (rows - 1) / 2,
        rows / 5,
        rows / 5
    );
    assert!(read.contains(&expected), "expected {expected} in {read}");
}

/// `weir checkpoint repartition` on an S3 checkpoint: the state is rewritten in a local copy
/// and uploaded; the next runs use the new count and the sums continue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_checkpoint_is_repartitioned_and_the_sums_continue() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let ck = server.location("s3://weir/queries/parts").await;
    let sql = "CREATE STREAMING TABLE parts USING delta LOCATION 's3://weir/delta/parts' \
               OPTIONS (outputMode 'complete') AS \
               SELECT value % 5 AS k, sum(value) AS s \
               FROM STREAM rate_micro_batch(rowsPerBatch => 10) GROUP BY value % 5";
    let run = |batches: &str| {
        server.weir(
            &[
                "-e",
                sql,
                "--checkpoint",
                "s3://weir/queries/parts",
                "--max-batches",
                batches,
            ],
            &[],
        )
    };
    run("3");
    let out = support::weir_command()
        .args([
            "checkpoint",
            "repartition",
            "s3://weir/queries/parts",
            "--partitions",
            "3",
        ])
        .envs(server.env())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names = ck.list_all().await.unwrap();
    let folders: std::collections::BTreeSet<&str> = names
        .iter()
        .filter_map(|n| n.strip_prefix("state/")?.split('/').next())
        .filter(|f| *f != "_metadata")
        .collect();
    assert_eq!(folders.len(), 1, "only the new folder is left: {names:?}");
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("state/") && n.contains("/2/default/1.changelog")),
        "the third partition's state is on S3: {names:?}"
    );
    run("2");
    let read = server.weir(
        &[
            "-e",
            "CREATE EXTERNAL TABLE parts STORED AS DELTA LOCATION 's3://weir/delta/parts'; \
             SELECT sum(s) AS s FROM parts",
        ],
        &[],
    );
    // Batches 0..4: values 0..49.
    assert!(read.contains(&format!("| {} |", 49 * 50 / 2)), "{read}");

    // read_state copies the operator's state from S3: one entry per key.
    let entries = server.weir(
        &[
            "-e",
            "SELECT count(*) AS n FROM read_state('s3://weir/queries/parts', operatorId => 0)",
        ],
        &[],
    );
    assert!(entries.contains("| 5 |"), "{entries}");

    // A selective reset with another grouping: the operator's state starts empty on S3, so the
    // complete output of the next batch (values 50..59) is that batch's alone.
    let dir = tempfile::tempdir().unwrap();
    let changed = dir.path().join("q.sql");
    let changed_sql = sql.replace("value % 5", "value % 7");
    std::fs::write(&changed, &changed_sql).unwrap();
    let tool = |args: &[&str]| {
        let out = support::weir_command()
            .arg("checkpoint")
            .args(args)
            .envs(server.env())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    tool(&[
        "reset",
        "s3://weir/queries/parts",
        "--query",
        changed.to_str().unwrap(),
    ]);
    let sum = || {
        server.weir(
            &[
                "-e",
                "CREATE EXTERNAL TABLE parts STORED AS DELTA LOCATION \
                 's3://weir/delta/parts'; SELECT sum(s) AS s FROM parts",
            ],
            &[],
        )
    };
    let run_changed = || {
        server.weir(
            &[
                "-e",
                &changed_sql,
                "--checkpoint",
                "s3://weir/queries/parts",
                "--max-batches",
                "1",
            ],
            &[],
        )
    };
    run_changed();
    let read = sum();
    assert!(
        read.contains(&format!("| {} |", (50..60).sum::<i64>())),
        "{read}"
    );

    // A full refresh on S3: the checkpoint and the table are cleared, and the query starts over
    // from value 0.
    tool(&["reset", "s3://weir/queries/parts", "--full"]);
    run_changed();
    let read = sum();
    assert!(
        read.contains(&format!("| {} |", (0..10).sum::<i64>())),
        "{read}"
    );

    // validate and replay read an S3 checkpoint too; replay writes nothing to it.
    tool(&[
        "validate",
        "s3://weir/queries/parts",
        changed.to_str().unwrap(),
    ]);
    let before = ck.list_all().await.unwrap();
    tool(&[
        "replay",
        "s3://weir/queries/parts",
        changed.to_str().unwrap(),
        "--batch",
        "0",
    ]);
    assert_eq!(ck.list_all().await.unwrap(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_with_its_storage_on_s3_keeps_tables_checkpoints_and_events_there() {
    let Some(server) = S3Server::start() else {
        return;
    };
    let _ = server.location("s3://weir/pipelines").await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("transformations")).unwrap();
    std::fs::write(
        dir.path().join("weir-pipeline.yml"),
        "name: on_s3\nstorage: s3://weir/pipelines/on_s3\nlibraries:\n  - glob:\n      include: transformations/**\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("transformations/all.sql"),
        "CREATE STREAMING TABLE raw AS SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 4);\n\
         CREATE STREAMING TABLE evens AS SELECT value FROM STREAM raw WHERE value % 2 = 0;\n\
         CREATE MATERIALIZED VIEW total AS SELECT count(*) AS n FROM evens;\n\
         CREATE STREAMING TABLE latest;\n\
         CREATE FLOW latest_flow AS AUTO CDC INTO latest \
         FROM (SELECT value % 3 AS k, value FROM STREAM raw) KEYS (k) SEQUENCE BY value;\n",
    )
    .unwrap();
    for _ in 0..2 {
        let out = support::weir_command()
            .args(["pipeline", "run"])
            .current_dir(dir.path())
            .envs(server.env())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let storage = server.location("s3://weir/pipelines/on_s3").await;
    let files = storage.list_all().await.unwrap();
    for expected in [
        "tables/evens/_delta_log/",
        "tables/total/_delta_log/",
        "_checkpoints/evens/evens/commits/1",
        "_event_log/_delta_log/",
    ] {
        assert!(
            files.iter().any(|f| f.contains(expected)),
            "{expected} in {files:?}"
        );
    }
    let read = server.weir(
        &[
            "-e",
            "CREATE EXTERNAL TABLE evens STORED AS DELTA LOCATION 's3://weir/pipelines/on_s3/tables/evens'; \
             CREATE EXTERNAL TABLE total STORED AS DELTA LOCATION 's3://weir/pipelines/on_s3/tables/total'; \
             SELECT e.n AS evens, e.hi AS highest, t.n AS total \
             FROM (SELECT count(*) AS n, max(value) AS hi FROM evens) e CROSS JOIN total t",
        ],
        &[],
    );
    // Two updates: raw holds 0..7, evens 0, 2, 4, 6 once each, the view counts them.
    assert!(read.contains("| 4     | 6       | 4     |"), "{read}");
    // AUTO CDC on S3: per key value % 3, the highest value, each batch one MERGE.
    let latest = server.weir(
        &[
            "-e",
            "CREATE EXTERNAL TABLE latest STORED AS DELTA LOCATION 's3://weir/pipelines/on_s3/tables/latest'; \
             SELECT string_agg(CAST(k AS VARCHAR) || ':' || CAST(value AS VARCHAR), ',' ORDER BY k) \
             AS latest FROM latest",
        ],
        &[],
    );
    assert!(latest.contains("0:6,1:7,2:5"), "{latest}");
    let events = server.weir(
        &[
            "-e",
            "SELECT count(DISTINCT update_id) AS updates FROM event_log('s3://weir/pipelines/on_s3')",
        ],
        &[],
    );
    assert!(events.contains("| 2 "), "{events}");
}
