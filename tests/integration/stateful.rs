//! Stateful streaming through the Rust API: streaming aggregation in update and complete mode,
//! on the RocksDB and in-memory state stores, across restarts, with the restart checks of the
//! operators' state (reference §1b).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use weir::datafusion::arrow::array::{Array, Int64Array, RecordBatch};
use weir::datafusion::arrow::compute::cast;
use weir::datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use weir::{MemoryStream, OutputMode, StateBackend, StreamingQuery, WeirSession};

use crate::support;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
    ]))
}

fn rows(pairs: &[(i64, Option<i64>)]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(
                pairs.iter().map(|p| p.0).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                pairs.iter().map(|p| p.1).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

/// Every row of `batches` as strings, one `Vec` per row, sorted.
fn table(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    let mut out = vec![];
    for b in batches {
        for r in 0..b.num_rows() {
            out.push(
                b.columns()
                    .iter()
                    .map(|c| {
                        let c = cast(c, &DataType::Utf8).unwrap();
                        let s = c
                            .as_any()
                            .downcast_ref::<weir::datafusion::arrow::array::StringArray>()
                            .unwrap();
                        if s.is_null(r) {
                            "NULL".to_string()
                        } else {
                            s.value(r).to_string()
                        }
                    })
                    .collect(),
            );
        }
    }
    out.sort();
    out
}

fn strs(rows: &[&[&str]]) -> Vec<Vec<String>> {
    let mut v: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|s| s.to_string()).collect())
        .collect();
    v.sort();
    v
}

type Outputs = Arc<Mutex<BTreeMap<u64, Vec<RecordBatch>>>>;

struct Setup {
    session: WeirSession,
    stream: MemoryStream,
    outputs: Outputs,
}

fn setup() -> Setup {
    let session = WeirSession::new();
    let stream = MemoryStream::new("events", schema());
    session.register_memory_stream(&stream);
    // The stream as a view, so DataFusion SQL can read it.
    let df = session.read_stream().table("events").unwrap();
    session
        .context()
        .register_table("ev", df.into_view())
        .unwrap();
    Setup {
        session,
        stream,
        outputs: Arc::default(),
    }
}

impl Setup {
    /// Starts `sql` (reading the stream as `ev`) into a foreach-batch sink that keeps each batch.
    async fn start(
        &self,
        sql: &str,
        mode: OutputMode,
        checkpoint: &std::path::Path,
        backend: StateBackend,
    ) -> weir::Result<StreamingQuery> {
        let df = self.session.context().sql(sql).await?;
        let outputs = Arc::clone(&self.outputs);
        self.session
            .write_stream(df)
            .output_mode(mode)
            .checkpoint_location(checkpoint.to_str().unwrap())
            .state_store(backend)
            .foreach_batch(move |id, batches| {
                let outputs = Arc::clone(&outputs);
                async move {
                    outputs.lock().unwrap().insert(id, batches);
                    Ok(())
                }
            })
            .start()
            .await
    }

    fn output(&self, batch: u64) -> Vec<Vec<String>> {
        table(self.outputs.lock().unwrap().get(&batch).unwrap())
    }
}

const COUNTS: &str = "SELECT k, count(*) AS n, sum(v) AS s FROM ev GROUP BY k";

async fn update_mode_emits_changed_groups(backend: StateBackend) {
    let t = setup();
    let ck = tempfile::tempdir().unwrap();
    let q = t
        .start(COUNTS, OutputMode::Update, ck.path(), backend)
        .await
        .unwrap();
    t.stream
        .push(rows(&[(1, Some(10)), (1, Some(5)), (2, None)]))
        .unwrap();
    q.process_all_available().await.unwrap();
    t.stream.push(rows(&[(2, Some(7)), (3, Some(1))])).unwrap();
    q.process_all_available().await.unwrap();
    t.stream.push(rows(&[(1, Some(1))])).unwrap();
    q.process_all_available().await.unwrap();
    assert_eq!(t.output(0), strs(&[&["1", "2", "15"], &["2", "1", "NULL"]]));
    assert_eq!(t.output(1), strs(&[&["2", "2", "7"], &["3", "1", "1"]]));
    assert_eq!(t.output(2), strs(&[&["1", "3", "16"]]));

    let p = q.last_progress().unwrap();
    assert_eq!(p.state_operators.len(), 1);
    let op = &p.state_operators[0];
    assert_eq!(op.operator_name, "aggregate");
    assert_eq!(op.num_rows_total, 3);
    assert_eq!(op.num_rows_updated, 1);
    assert_eq!(
        op.num_shuffle_partitions as usize,
        op.num_state_store_instances as usize
    );
    let json = p.json();
    assert!(
        json.contains(r#""stateOperators":[{"operatorName":"aggregate","numRowsTotal":3"#),
        "{json}"
    );
    q.stop().await;
}

support::on_each_backend!(
    update_mode_emits_the_groups_each_batch_changed,
    update_mode_emits_changed_groups
);

#[tokio::test]
async fn complete_mode_emits_the_whole_result_and_a_restart_continues_from_state() {
    let t = setup();
    let ck = tempfile::tempdir().unwrap();
    let q = t
        .start(
            COUNTS,
            OutputMode::Complete,
            ck.path(),
            StateBackend::default(),
        )
        .await
        .unwrap();
    t.stream.push(rows(&[(1, Some(1)), (2, Some(2))])).unwrap();
    q.process_all_available().await.unwrap();
    t.stream.push(rows(&[(1, Some(3))])).unwrap();
    q.process_all_available().await.unwrap();
    assert_eq!(t.output(0), strs(&[&["1", "1", "1"], &["2", "1", "2"]]));
    assert_eq!(t.output(1), strs(&[&["1", "2", "4"], &["2", "1", "2"]]));
    q.stop().await;

    // A new run rebuilds the state from the checkpoint (its local RocksDB is gone). Group 4,
    // new and all NULL next to stored groups, must sum to NULL.
    t.stream.push(rows(&[(2, Some(5)), (4, None)])).unwrap();
    let q = t
        .start(
            COUNTS,
            OutputMode::Complete,
            ck.path(),
            StateBackend::default(),
        )
        .await
        .unwrap();
    q.process_all_available().await.unwrap();
    assert_eq!(
        t.output(2),
        strs(&[&["1", "2", "4"], &["2", "2", "7"], &["4", "1", "NULL"]])
    );
    q.stop().await;
}

#[tokio::test]
async fn every_aggregate_function_matches_batch_sql_over_the_same_rows() {
    let t = setup();
    let ck = tempfile::tempdir().unwrap();
    let sql = "SELECT k % 7 AS g, count(*) AS n, count(v) AS nv, sum(v) AS s, min(v) AS lo, \
               max(v) AS hi, avg(v) AS mean, stddev(v) AS sd, bool_and(v > 0) AS pos, \
               approx_distinct(v) AS d FROM ev GROUP BY k % 7";
    let q = t
        .start(
            sql,
            OutputMode::Complete,
            ck.path(),
            StateBackend::default(),
        )
        .await
        .unwrap();
    let mut all = vec![];
    let mut seed = 42u64;
    for batch in 0..5 {
        let pairs: Vec<(i64, Option<i64>)> = (0..200)
            .map(|i| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let v = (seed >> 33) as i64 % 1000 - 100;
                (i * 31 + batch, (i % 11 != 0).then_some(v))
            })
            .collect();
        all.extend(pairs.clone());
        t.stream.push(rows(&pairs)).unwrap();
        q.process_all_available().await.unwrap();
    }
    q.stop().await;
    let last = t.outputs.lock().unwrap().keys().max().copied().unwrap();
    let streamed = t.output(last);

    // The same rows as a table, the same query as batch SQL.
    let ctx = weir::datafusion::prelude::SessionContext::new();
    let mem =
        weir::datafusion::datasource::MemTable::try_new(schema(), vec![vec![rows(&all)]]).unwrap();
    ctx.register_table("ev", Arc::new(mem)).unwrap();
    let batch = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let round = |rows: Vec<Vec<String>>| -> Vec<Vec<String>> {
        rows.into_iter()
            .map(|r| {
                r.into_iter()
                    .map(|c| match c.parse::<f64>() {
                        Ok(f) if c.contains('.') => format!("{f:.6}"),
                        _ => c,
                    })
                    .collect()
            })
            .collect()
    };
    assert_eq!(round(streamed), round(table(&batch)));
    assert_eq!(table(&batch).len(), 7);
}

/// The §1b restart cases: run the base query, then restart its checkpoint with a changed one.
/// The error is `(class, message)`.
async fn restart_with(base: &str, changed: &str, allow: bool) -> Result<(), (String, String)> {
    let refused = |e: weir::Error| (e.error_class().to_string(), e.to_string());
    let t = setup();
    let ck = tempfile::tempdir().unwrap();
    let q = t
        .start(base, OutputMode::Update, ck.path(), StateBackend::default())
        .await
        .unwrap();
    t.stream.push(rows(&[(1, Some(1)), (12, Some(2))])).unwrap();
    q.process_all_available().await.unwrap();
    q.stop().await;
    t.stream.push(rows(&[(1, Some(3))])).unwrap();
    let df = t
        .session
        .context()
        .sql(changed)
        .await
        .map_err(|e| refused(e.into()))?;
    let q = t
        .session
        .write_stream(df)
        .output_mode(OutputMode::Update)
        .checkpoint_location(ck.path().to_str().unwrap())
        .allow_state_definition_change(allow)
        .format("noop")
        .start()
        .await
        .map_err(refused)?;
    q.process_all_available()
        .await
        .map_err(|e| (e.cause_error_class().to_string(), e.to_string()))?;
    q.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_restart_is_checked_against_the_state_of_every_operator() {
    let base = "SELECT k % 10 AS g, count(*) AS n FROM ev GROUP BY k % 10";
    let refused = [
        // key_add_col: an extra grouping column.
        (
            "SELECT k % 10 AS g, k % 3 AS h, count(*) AS n FROM ev GROUP BY k % 10, k % 3",
            "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
        ),
        // key_string: the key cast to a string.
        (
            "SELECT CAST(k % 10 AS VARCHAR) AS g, count(*) AS n FROM ev GROUP BY CAST(k % 10 AS VARCHAR)",
            "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
        ),
        // agg_avg: count → avg (the state becomes a count and a sum).
        (
            "SELECT k % 10 AS g, avg(v) AS n FROM ev GROUP BY k % 10",
            "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
        ),
        // no_groupby: the aggregation removed.
        (
            "SELECT k AS g FROM ev",
            "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
        ),
        // Beyond Spark: key_mod7 and agg_sum keep the state's shape but change its meaning.
        (
            "SELECT k % 7 AS g, count(*) AS n FROM ev GROUP BY k % 7",
            "STATEFUL_OPERATOR_DEFINITION_CHANGED",
        ),
        (
            "SELECT k % 10 AS g, sum(v) AS n FROM ev GROUP BY k % 10",
            "STATEFUL_OPERATOR_DEFINITION_CHANGED",
        ),
    ];
    for (changed, class) in refused {
        let (got, message) = restart_with(base, changed, false).await.unwrap_err();
        assert_eq!(got, class, "{changed}: {message}");
    }
    let accepted = [
        // unchanged, an extra filter before the aggregation, a projection after it.
        base,
        "SELECT k % 10 AS g, count(*) AS n FROM ev WHERE v > 0 GROUP BY k % 10",
        "SELECT g * 2 AS g2, n FROM (SELECT k % 10 AS g, count(*) AS n FROM ev GROUP BY k % 10)",
    ];
    for changed in accepted {
        restart_with(base, changed, false)
            .await
            .unwrap_or_else(|e| panic!("{changed}: {e:?}"));
    }
    // The opt-out accepts a definition change of the same shape.
    restart_with(
        base,
        "SELECT k % 7 AS g, count(*) AS n FROM ev GROUP BY k % 7",
        true,
    )
    .await
    .unwrap_or_else(|e| panic!("{e:?}"));
}

#[tokio::test]
async fn a_stateless_checkpoint_refuses_an_added_aggregation_and_memory_state_does_not_restart() {
    let t = setup();
    let ck = tempfile::tempdir().unwrap();
    let q = t
        .start(
            "SELECT k FROM ev",
            OutputMode::Append,
            ck.path(),
            StateBackend::default(),
        )
        .await
        .unwrap();
    t.stream.push(rows(&[(1, None)])).unwrap();
    q.process_all_available().await.unwrap();
    q.stop().await;
    let err = t
        .start(
            COUNTS,
            OutputMode::Update,
            ck.path(),
            StateBackend::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.error_class(),
        "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
        "{err}"
    );

    let ck = tempfile::tempdir().unwrap();
    let q = t
        .start(COUNTS, OutputMode::Update, ck.path(), StateBackend::Memory)
        .await
        .unwrap();
    t.stream.push(rows(&[(1, None)])).unwrap();
    q.process_all_available().await.unwrap();
    q.stop().await;
    let err = t
        .start(COUNTS, OutputMode::Update, ck.path(), StateBackend::Memory)
        .await
        .unwrap_err();
    assert_eq!(err.error_class(), "STATE_STORE_NOT_DURABLE", "{err}");
}

#[tokio::test]
async fn old_state_is_purged_with_the_logs_and_a_restart_rebuilds_from_a_snapshot() {
    let t = setup();
    let ck = tempfile::tempdir().unwrap();
    let start = || async {
        let df = t.session.context().sql(COUNTS).await.unwrap();
        let outputs = Arc::clone(&t.outputs);
        t.session
            .write_stream(df)
            .output_mode(OutputMode::Complete)
            .checkpoint_location(ck.path().to_str().unwrap())
            .min_batches_to_retain(3)
            .option("stateStore.maintenanceInterval", 0)
            .foreach_batch(move |id, batches| {
                let outputs = Arc::clone(&outputs);
                async move {
                    outputs.lock().unwrap().insert(id, batches);
                    Ok(())
                }
            })
            .start()
            .await
            .unwrap()
    };
    let q = start().await;
    for i in 0..25 {
        t.stream.push(rows(&[(i % 4, Some(i))])).unwrap();
        q.process_all_available().await.unwrap();
    }
    q.stop().await;
    // Batches 0..=24 committed state versions 1..=25; re-running batch 22 (the oldest kept)
    // needs version 22, so snapshot 20 and the changelogs after it stay, and snapshot 10 and
    // the changelogs after it to fall back on if snapshot 20 is damaged; older ones go.
    let mut stores = 0;
    for part in std::fs::read_dir(ck.path().join("state/0")).unwrap() {
        let dir = part.unwrap().path().join("default");
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| !n.starts_with("files"))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "10.snapshot",
                "11.changelog",
                "12.changelog",
                "13.changelog",
                "14.changelog",
                "15.changelog",
                "16.changelog",
                "17.changelog",
                "18.changelog",
                "19.changelog",
                "20.changelog",
                "20.snapshot",
                "21.changelog",
                "22.changelog",
                "23.changelog",
                "24.changelog",
                "25.changelog"
            ],
            "{}",
            dir.display()
        );
        stores += 1;
    }
    assert!(stores >= 1);
    let p = t.outputs.lock().unwrap().len();
    assert_eq!(p, 25);

    // A new run (new local RocksDB) starts from snapshot 20 and replays 21..=25.
    t.stream.push(rows(&[(0, Some(100))])).unwrap();
    let q = start().await;
    q.process_all_available().await.unwrap();
    let last = q.last_progress().unwrap();
    assert_eq!(last.batch_id, 25);
    q.stop().await;
    let sum0: i64 = (0..25).filter(|i| i % 4 == 0).sum::<i64>() + 100;
    assert!(
        t.output(25)
            .contains(&vec!["0".to_string(), "8".to_string(), sum0.to_string()]),
        "{:?}",
        t.output(25)
    );
}

fn events_schema() -> SchemaRef {
    use weir::datafusion::arrow::datatypes::TimeUnit;
    Arc::new(Schema::new(vec![
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            false,
        ),
        Field::new("k", DataType::Int64, false),
    ]))
}

fn events(secs: &[i64]) -> RecordBatch {
    use weir::datafusion::arrow::array::TimestampMillisecondArray;
    RecordBatch::try_new(
        events_schema(),
        vec![
            Arc::new(
                TimestampMillisecondArray::from(secs.iter().map(|s| s * 1000).collect::<Vec<_>>())
                    .with_timezone("UTC"),
            ),
            Arc::new(Int64Array::from(
                secs.iter().map(|s| s % 2).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

/// Rows of [`events_schema`] from `(milliseconds, key)` pairs.
fn keyed_events(rows: &[(i64, i64)]) -> RecordBatch {
    use weir::datafusion::arrow::array::TimestampMillisecondArray;
    RecordBatch::try_new(
        events_schema(),
        vec![
            Arc::new(
                TimestampMillisecondArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())
                    .with_timezone("UTC"),
            ),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

/// A 10-second tumbling window count with a 5-second watermark, through the Rust API.
async fn windowed_counts(
    session: &WeirSession,
    mode: OutputMode,
    ck: &std::path::Path,
) -> (Outputs, StreamingQuery) {
    use weir::DataFrameStreamExt;
    let df = session
        .read_stream()
        .table("clicks")
        .unwrap()
        .with_watermark("ts", "5 seconds")
        .unwrap();
    let _ = session.context().deregister_table("clicks_wm");
    session
        .context()
        .register_table("clicks_wm", df.into_view())
        .unwrap();
    let df = session
        .context()
        .sql(
            "SELECT window(ts, '10 seconds') AS w, count(*) AS n FROM clicks_wm \
             GROUP BY window(ts, '10 seconds')",
        )
        .await
        .unwrap();
    let outputs: Outputs = Arc::default();
    let sink = Arc::clone(&outputs);
    let q = session
        .write_stream(df)
        .output_mode(mode)
        .checkpoint_location(ck.to_str().unwrap())
        .foreach_batch(move |id, batches| {
            let sink = Arc::clone(&sink);
            async move {
                sink.lock().unwrap().insert(id, batches);
                Ok(())
            }
        })
        .start()
        .await
        .unwrap();
    (outputs, q)
}

fn clicks() -> (WeirSession, MemoryStream) {
    let session = WeirSession::new();
    let stream = MemoryStream::new("clicks", events_schema());
    session.register_memory_stream(&stream);
    (session, stream)
}

fn window_rows(outputs: &Outputs, batch: u64) -> Vec<String> {
    let all = outputs.lock().unwrap();
    let Some(batches) = all.get(&batch) else {
        return vec![];
    };
    let mut out = vec![];
    for b in batches {
        let w = b
            .column(0)
            .as_any()
            .downcast_ref::<weir::datafusion::arrow::array::StructArray>()
            .unwrap();
        let start = cast(w.column(0), &DataType::Int64).unwrap();
        let start = start.as_any().downcast_ref::<Int64Array>().unwrap();
        let n = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
        for r in 0..b.num_rows() {
            out.push(format!("[{}s) {}", start.value(r) / 1_000_000, n.value(r)));
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn append_mode_emits_each_window_once_when_the_watermark_passes_it_and_drops_late_rows() {
    let ck = tempfile::tempdir().unwrap();
    let (session, stream) = clicks();
    let (outputs, q) = windowed_counts(&session, OutputMode::Append, ck.path()).await;
    // Batch 0: windows [0s) and [10s); the watermark becomes 12 - 5 = 7 s, so a batch without
    // data (1) runs with it, as in Spark; no window ends by 7 s.
    stream.push(events(&[1, 2, 12])).unwrap();
    q.process_all_available().await.unwrap();
    assert_eq!(q.last_progress().unwrap().batch_id, 1);
    // Batch 2: 3 s is not late (its window ends at 10 s, after the 7 s watermark); 25 s moves
    // the watermark to 20 s, so batch 3 emits the windows ending by 20 s.
    stream.push(events(&[3, 25])).unwrap();
    q.process_all_available().await.unwrap();
    for b in 0..=2 {
        assert_eq!(window_rows(&outputs, b), Vec::<String>::new(), "batch {b}");
    }
    assert_eq!(window_rows(&outputs, 3), vec!["[0s) 3", "[10s) 1"]);
    let p = q.last_progress().unwrap();
    assert_eq!(p.batch_id, 3);
    assert_eq!(p.num_input_rows, 0, "a batch the watermark alone started");
    assert_eq!(
        p.event_time.get("watermark").unwrap(),
        "1970-01-01T00:00:20.000Z"
    );
    assert_eq!(p.state_operators[0].num_rows_removed, 2);
    assert_eq!(p.state_operators[0].num_rows_total, 1);

    // Batch 4: 4 s is behind the watermark (20 s): dropped and counted. 41 s moves it to 36 s
    // and batch 5 emits [20s).
    stream.push(events(&[4, 41])).unwrap();
    q.process_all_available().await.unwrap();
    let p4 = q
        .recent_progress()
        .into_iter()
        .find(|p| p.batch_id == 4)
        .unwrap();
    assert_eq!(p4.state_operators[0].num_rows_dropped_by_watermark, 1);
    assert_eq!(
        p4.event_time.get("min").unwrap(),
        "1970-01-01T00:00:04.000Z"
    );
    assert_eq!(
        p4.event_time.get("max").unwrap(),
        "1970-01-01T00:00:41.000Z"
    );
    assert_eq!(window_rows(&outputs, 4), Vec::<String>::new());
    assert_eq!(window_rows(&outputs, 5), vec!["[20s) 1"]);
    q.stop().await;

    // A restart keeps the watermark (36 s, so 5 s is late) and the open window [40s).
    let (outputs, q) = windowed_counts(&session, OutputMode::Append, ck.path()).await;
    stream.push(events(&[5, 42, 60])).unwrap();
    q.process_all_available().await.unwrap();
    let p = q.recent_progress();
    let first = p.first().unwrap();
    assert_eq!(first.batch_id, 6);
    assert_eq!(first.state_operators[0].num_rows_dropped_by_watermark, 1);
    assert_eq!(window_rows(&outputs, 7), vec!["[40s) 2"]);
    q.stop().await;
}

#[tokio::test]
async fn update_mode_with_a_watermark_evicts_finished_windows_without_emitting_them_again() {
    let ck = tempfile::tempdir().unwrap();
    let (session, stream) = clicks();
    let (outputs, q) = windowed_counts(&session, OutputMode::Update, ck.path()).await;
    stream.push(events(&[1, 12])).unwrap();
    q.process_all_available().await.unwrap();
    stream.push(events(&[2, 30])).unwrap();
    q.process_all_available().await.unwrap();
    assert_eq!(window_rows(&outputs, 0), vec!["[0s) 1", "[10s) 1"]);
    assert_eq!(window_rows(&outputs, 1), Vec::<String>::new());
    assert_eq!(window_rows(&outputs, 2), vec!["[0s) 2", "[30s) 1"]);
    // Batch 3 (the watermark moved to 25 s) evicts [0s) and [10s) and emits nothing.
    assert_eq!(window_rows(&outputs, 3), Vec::<String>::new());
    let p = q.last_progress().unwrap();
    assert_eq!(p.batch_id, 3);
    assert_eq!(p.state_operators[0].num_rows_removed, 2);
    assert_eq!(p.state_operators[0].num_rows_total, 1);
    q.stop().await;
}

fn first_column(outputs: &Outputs, batch: u64) -> Vec<i64> {
    let all = outputs.lock().unwrap();
    let mut v: Vec<i64> = all
        .get(&batch)
        .map(|bs| {
            bs.iter()
                .flat_map(|b| {
                    let c = cast(b.column(0), &DataType::Int64).unwrap();
                    c.as_any()
                        .downcast_ref::<Int64Array>()
                        .unwrap()
                        .values()
                        .to_vec()
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

#[tokio::test]
async fn drop_duplicates_keeps_the_first_row_of_each_key_across_batches_and_restarts() {
    use weir::DataFrameStreamExt;
    let t = setup();
    let ck = tempfile::tempdir().unwrap();
    let start = |sql: bool| {
        let t = &t;
        let ck = ck.path().to_path_buf();
        async move {
            let df = if sql {
                t.session
                    .context()
                    .sql("SELECT DISTINCT ON (k) k, v FROM ev")
                    .await
                    .unwrap()
            } else {
                t.session
                    .read_stream()
                    .table("events")
                    .unwrap()
                    .drop_duplicates(&["k"])
                    .unwrap()
            };
            let outputs = Arc::clone(&t.outputs);
            t.session
                .write_stream(df)
                .checkpoint_location(ck.to_str().unwrap())
                .foreach_batch(move |id, batches| {
                    let outputs = Arc::clone(&outputs);
                    async move {
                        outputs.lock().unwrap().insert(id, batches);
                        Ok(())
                    }
                })
                .start()
                .await
                .unwrap()
        }
    };
    let q = start(false).await;
    t.stream
        .push(rows(&[(1, Some(10)), (2, Some(20)), (1, Some(11))]))
        .unwrap();
    q.process_all_available().await.unwrap();
    t.stream
        .push(rows(&[(2, Some(21)), (3, Some(30))]))
        .unwrap();
    q.process_all_available().await.unwrap();
    assert_eq!(t.output(0), strs(&[&["1", "10"], &["2", "20"]]));
    assert_eq!(t.output(1), strs(&[&["3", "30"]]));
    let p = q.last_progress().unwrap();
    assert_eq!(p.state_operators[0].operator_name, "dedupe");
    assert_eq!(p.state_operators[0].num_rows_total, 3);
    q.stop().await;
    // The same operator written as SQL's DISTINCT ON continues from the same state.
    t.stream
        .push(rows(&[(1, Some(12)), (4, Some(40)), (4, Some(41))]))
        .unwrap();
    let q = start(true).await;
    q.process_all_available().await.unwrap();
    assert_eq!(t.output(2), strs(&[&["4", "40"]]));
    q.stop().await;
}

#[tokio::test]
async fn dedupe_with_event_time_among_the_keys_and_within_the_watermark_forgets_old_keys() {
    use weir::DataFrameStreamExt;
    for within in [false, true] {
        let (session, stream) = clicks();
        let ck = tempfile::tempdir().unwrap();
        let df = session
            .read_stream()
            .table("clicks")
            .unwrap()
            .with_watermark("ts", "5 seconds")
            .unwrap();
        let df = if within {
            df.drop_duplicates_within_watermark(&["k"]).unwrap()
        } else {
            df.drop_duplicates(&["ts", "k"]).unwrap()
        };
        let outputs: Outputs = Arc::default();
        let sink = Arc::clone(&outputs);
        let q = session
            .write_stream(df)
            .checkpoint_location(ck.path().to_str().unwrap())
            .foreach_batch(move |id, batches| {
                let sink = Arc::clone(&sink);
                async move {
                    sink.lock().unwrap().insert(id, batches);
                    Ok(())
                }
            })
            .start()
            .await
            .unwrap();
        // k = seconds % 2. Batch 0: 1 s (k 1) and 2 s (k 0); the watermark becomes 0 s
        // (2 - 5 < 0), so nothing is evicted yet.
        stream.push(events(&[1, 2, 1])).unwrap();
        q.process_all_available().await.unwrap();
        assert_eq!(
            first_column(&outputs, 0),
            vec![1000, 2000],
            "within={within}"
        );
        // 20 s moves the watermark to 15 s: keys with event time (or expiry) by 15 s go.
        stream.push(events(&[20])).unwrap();
        q.process_all_available().await.unwrap();
        let last = q.last_progress().unwrap();
        let removed: u64 = q
            .recent_progress()
            .iter()
            .flat_map(|p| p.state_operators.iter().map(|o| o.num_rows_removed))
            .sum();
        assert_eq!(removed, 2, "within={within}: both early keys evicted");
        // Within the watermark, 20 s (k 0) arrived while k 0 (expiring at 7 s) was still
        // known, under watermark 0: a duplicate, as in Spark. With the event time in the key,
        // (20 s, 0) is a new key.
        let total = u64::from(!within);
        assert_eq!(
            last.state_operators[0].num_rows_total, total,
            "within={within}"
        );
        // 3 s is behind the watermark: dropped, not deduplicated.
        stream.push(events(&[3, 22])).unwrap();
        q.process_all_available().await.unwrap();
        let dropped: u64 = q
            .recent_progress()
            .iter()
            .flat_map(|p| {
                p.state_operators
                    .iter()
                    .map(|o| o.num_rows_dropped_by_watermark)
            })
            .sum();
        assert_eq!(dropped, 1, "within={within}");
        let name = &last.state_operators[0].operator_name;
        assert_eq!(
            name,
            if within {
                "dedupeWithinWatermark"
            } else {
                "dedupe"
            }
        );
        // 22 s (k 0) is new either way: within the watermark k 0 was forgotten at 15 s.
        let all: Vec<i64> = (0..10).flat_map(|b| first_column(&outputs, b)).collect();
        if within {
            assert_eq!(all, vec![1000, 2000, 22000]);
        } else {
            assert_eq!(all, vec![1000, 2000, 20000, 22000]);
        }
        q.stop().await;
    }
}

/// `(key, left seconds, right seconds)` rows of a join's outputs, sorted; NULL as -1.
fn join_rows(outputs: &Outputs) -> Vec<(i64, i64, i64)> {
    let all = outputs.lock().unwrap();
    let mut out = vec![];
    for b in all.values().flatten() {
        let get = |i: usize| {
            let c = cast(b.column(i), &DataType::Int64).unwrap();
            c.as_any().downcast_ref::<Int64Array>().unwrap().clone()
        };
        let (k, l, r) = (get(0), get(1), get(2));
        for i in 0..b.num_rows() {
            let secs = |a: &Int64Array| if a.is_null(i) { -1 } else { a.value(i) / 1000 };
            out.push((k.value(i), secs(&l), secs(&r)));
        }
    }
    out.sort_unstable();
    out
}

/// A query over two memory streams of [`events_schema`] rows, `lefts` and `rights`, seen as the
/// views `lw` and `rw` with a 2-second watermark on `ts`, each batch's output kept by batch ID.
struct WatermarkedJoin {
    lefts: MemoryStream,
    rights: MemoryStream,
    outputs: Outputs,
    query: StreamingQuery,
    checkpoint: tempfile::TempDir,
}

impl WatermarkedJoin {
    async fn start(sql: &str) -> weir::Result<Self> {
        use weir::DataFrameStreamExt;
        let session = WeirSession::new();
        let lefts = MemoryStream::new("lefts", events_schema());
        let rights = MemoryStream::new("rights", events_schema());
        session.register_memory_stream(&lefts);
        session.register_memory_stream(&rights);
        for (name, view) in [("lefts", "lw"), ("rights", "rw")] {
            let df = session
                .read_stream()
                .table(name)?
                .with_watermark("ts", "2 seconds")?;
            session
                .context()
                .register_table(view, df.into_view())
                .unwrap();
        }
        let df = session.context().sql(sql).await.unwrap();
        let outputs: Outputs = Arc::default();
        let sink = Arc::clone(&outputs);
        let checkpoint = tempfile::tempdir().unwrap();
        let query = session
            .write_stream(df)
            .checkpoint_location(checkpoint.path().to_str().unwrap())
            .foreach_batch(move |id, batches| {
                let sink = Arc::clone(&sink);
                async move {
                    sink.lock().unwrap().insert(id, batches);
                    Ok(())
                }
            })
            .start()
            .await?;
        Ok(Self {
            lefts,
            rights,
            outputs,
            query,
            checkpoint,
        })
    }
}

#[tokio::test]
async fn a_stream_stream_join_matches_rows_across_batches_and_pads_unmatched_outer_rows() {
    for join in ["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"] {
        let sql = format!(
            "SELECT coalesce(l.k, r.k) AS k, l.ts AS lt, r.ts AS rt FROM lw l {join} rw r \
             ON l.k = r.k AND r.ts BETWEEN l.ts - INTERVAL 1 SECOND AND l.ts + INTERVAL 1 SECOND"
        );
        let WatermarkedJoin {
            lefts,
            rights,
            outputs,
            query: q,
            checkpoint: _ck,
        } = WatermarkedJoin::start(&sql)
            .await
            .unwrap_or_else(|e| panic!("{join}: {e}"));
        // k = seconds % 2. 10 s meets 10 s; 11 s and 13 s are too far apart.
        lefts.push(events(&[10, 11])).unwrap();
        rights.push(events(&[10, 13])).unwrap();
        q.process_all_available().await.unwrap();
        // A new right row meets a stored left row: 11 s and 11 s.
        lefts.push(events(&[12])).unwrap();
        rights.push(events(&[11])).unwrap();
        q.process_all_available().await.unwrap();
        let inner = vec![(0, 10, 10), (1, 11, 11)];
        assert_eq!(join_rows(&outputs), inner, "{join}");
        // 20 s on both sides moves the watermark to 18 s: left rows up to 17 s can no longer
        // match and leave state; outer joins emit those that never matched with nulls: left
        // 12 s, right 13 s.
        lefts.push(events(&[20])).unwrap();
        rights.push(events(&[20])).unwrap();
        q.process_all_available().await.unwrap();
        let mut expected = inner.clone();
        expected.push((0, 20, 20));
        if join == "LEFT JOIN" || join == "FULL JOIN" {
            expected.push((0, 12, -1));
        }
        if join == "RIGHT JOIN" || join == "FULL JOIN" {
            expected.push((1, -1, 13));
        }
        expected.sort_unstable();
        assert_eq!(join_rows(&outputs), expected, "{join}");
        let removed: u64 = q
            .recent_progress()
            .iter()
            .flat_map(|p| p.state_operators.iter().map(|o| o.num_rows_removed))
            .sum();
        assert_eq!(removed, 6, "{join}: three rows per side left state");
        let last = q.last_progress().unwrap();
        assert_eq!(last.state_operators[0].operator_name, "streamStreamJoin");
        assert_eq!(
            last.state_operators[0].num_rows_total, 2,
            "{join}: the 20 s rows stay"
        );
        q.stop().await;
    }
}

/// What an inner join's condition or `WHERE` says of one side only is applied to that side
/// before the join, as Spark's optimizer does: rows that cannot pass are neither paired nor
/// stored (Nexmark q20 kept and paired every auction for a filter on one category).
#[tokio::test]
async fn a_one_sided_filter_of_an_inner_join_keeps_its_rows_out_of_state() {
    let sql = "SELECT l.k AS k, l.ts AS lt, r.ts AS rt FROM lw l JOIN rw r \
               ON l.k = r.k AND l.k = 0 \
               AND r.ts BETWEEN l.ts - INTERVAL 1 SECOND AND l.ts + INTERVAL 1 SECOND \
               WHERE r.k = 0";
    let WatermarkedJoin {
        lefts,
        rights,
        outputs,
        query: q,
        checkpoint: _ck,
    } = WatermarkedJoin::start(sql).await.unwrap();
    // k = seconds % 2: two rows of each side have k = 0.
    lefts.push(events(&[10, 11, 12, 13])).unwrap();
    rights.push(events(&[10, 11, 12, 13])).unwrap();
    q.process_all_available().await.unwrap();
    assert_eq!(join_rows(&outputs), vec![(0, 10, 10), (0, 12, 12)]);
    let stored: u64 = q
        .recent_progress()
        .iter()
        .flat_map(|p| p.state_operators.iter().map(|o| o.num_rows_updated))
        .sum();
    let total = q.last_progress().unwrap().state_operators[0].num_rows_total;
    assert_eq!(
        (stored, total),
        (4, 4),
        "only the k = 0 rows of each side are stored"
    );
    q.stop().await;
}

/// An outer join's one-sided conjuncts move where Spark's optimizer moves them: a `WHERE` on
/// the preserved side, and the condition's on the other side, keep those rows out of state; the
/// condition's conjunct on the preserved side stays in the join, whose rows that fail it are
/// still output with nulls once the watermark passes them.
#[tokio::test]
async fn an_outer_join_filters_before_the_join_only_what_cannot_change_its_output() {
    for (join, preserved, other) in [("LEFT JOIN", "l", "r"), ("RIGHT JOIN", "r", "l")] {
        // Only rows of k = 0 reach the join: the WHERE on the preserved side, the condition on
        // the other.
        let sql = format!(
            "SELECT coalesce(l.k, r.k) AS k, l.ts AS lt, r.ts AS rt FROM lw l {join} rw r \
             ON l.k = r.k AND {other}.k = 0 \
             AND r.ts BETWEEN l.ts - INTERVAL 1 SECOND AND l.ts + INTERVAL 1 SECOND \
             WHERE {preserved}.k = 0"
        );
        let WatermarkedJoin {
            lefts,
            rights,
            outputs,
            query: q,
            checkpoint: _ck,
        } = WatermarkedJoin::start(&sql).await.unwrap();
        // k = seconds % 2; 14 s has no partner on the other side.
        let (mine, theirs) = (events(&[10, 11, 12, 13, 14]), events(&[10, 11, 12, 13]));
        let (l, r) = if preserved == "l" {
            (mine, theirs)
        } else {
            (theirs, mine)
        };
        lefts.push(l).unwrap();
        rights.push(r).unwrap();
        q.process_all_available().await.unwrap();
        let stored: u64 = q
            .recent_progress()
            .iter()
            .flat_map(|p| p.state_operators.iter().map(|o| o.num_rows_updated))
            .sum();
        assert_eq!(
            stored, 5,
            "{join}: only the k = 0 rows are stored (9 of them are k = 0 or 1)"
        );
        lefts.push(events(&[20])).unwrap();
        rights.push(events(&[20])).unwrap();
        q.process_all_available().await.unwrap();
        let padded = if preserved == "l" {
            (0, 14, -1)
        } else {
            (0, -1, 14)
        };
        let mut expected = vec![(0, 10, 10), (0, 12, 12), (0, 20, 20), padded];
        expected.sort_unstable();
        assert_eq!(join_rows(&outputs), expected, "{join}");
        q.stop().await;

        // The condition's conjunct on the preserved side stays in the join: the preserved
        // side's rows that fail it come out with nulls.
        let sql = format!(
            "SELECT coalesce(l.k, r.k) AS k, l.ts AS lt, r.ts AS rt FROM lw l {join} rw r \
             ON l.k = r.k AND {preserved}.k = 0 \
             AND r.ts BETWEEN l.ts - INTERVAL 1 SECOND AND l.ts + INTERVAL 1 SECOND"
        );
        let WatermarkedJoin {
            lefts,
            rights,
            outputs,
            query: q,
            checkpoint: _ck,
        } = WatermarkedJoin::start(&sql).await.unwrap();
        lefts.push(events(&[10, 11])).unwrap();
        rights.push(events(&[10, 11])).unwrap();
        q.process_all_available().await.unwrap();
        lefts.push(events(&[20])).unwrap();
        rights.push(events(&[20])).unwrap();
        q.process_all_available().await.unwrap();
        let padded = if preserved == "l" {
            (1, 11, -1)
        } else {
            (1, -1, 11)
        };
        let mut expected = vec![(0, 10, 10), (0, 20, 20), padded];
        expected.sort_unstable();
        assert_eq!(join_rows(&outputs), expected, "{join}");
        q.stop().await;
    }
}

#[tokio::test]
async fn a_join_that_evicts_equals_the_batch_join_when_rows_share_keys_and_times() {
    // Rows arrive in event-time order (batch b holds times in [3b+3, 3b+6) s), so none is late
    // (an event time at the initial watermark, 0, would be) and a row leaves state only once no
    // later row can meet it: the streaming join must equal the batch join. Many rows share a
    // time (whole 100 ms) and a key (3 keys), so index entries hold several rows and an
    // eviction takes only part of a key's list: the rest still meets the next batch.
    let sql = "SELECT l.k AS k, l.ts AS lt, r.ts AS rt FROM lw l JOIN rw r \
               ON l.k = r.k AND r.ts BETWEEN l.ts - INTERVAL 1 SECOND AND l.ts + INTERVAL 1 SECOND";
    let WatermarkedJoin {
        lefts,
        rights,
        outputs,
        query: q,
        checkpoint: _ck,
    } = WatermarkedJoin::start(sql).await.unwrap();
    let mut seed = 11u64;
    let mut next = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        (seed >> 33) as i64
    };
    let (mut all_l, mut all_r) = (vec![], vec![]);
    for b in 0..8 {
        let mut rows = |n: usize| -> Vec<(i64, i64)> {
            (0..n)
                .map(|_| ((3 * b + 3) * 1000 + next() % 30 * 100, next() % 3))
                .collect()
        };
        let (l, r) = (rows(12), rows(9));
        lefts.push(keyed_events(&l)).unwrap();
        rights.push(keyed_events(&r)).unwrap();
        all_l.extend(l);
        all_r.extend(r);
        q.process_all_available().await.unwrap();
    }
    let progress = q.recent_progress();
    q.stop().await;
    let removed: u64 = progress
        .iter()
        .flat_map(|p| p.state_operators.iter().map(|o| o.num_rows_removed))
        .sum();
    let total = progress.last().unwrap().state_operators[0].num_rows_total;
    assert!(removed > 100, "rows left state: {removed}");
    assert_eq!(
        total + removed,
        (all_l.len() + all_r.len()) as u64,
        "every row is in state or was removed, once"
    );

    let ctx = weir::datafusion::prelude::SessionContext::new();
    for (name, data) in [("lw", &all_l), ("rw", &all_r)] {
        let mem = weir::datafusion::datasource::MemTable::try_new(
            events_schema(),
            vec![vec![keyed_events(data)]],
        )
        .unwrap();
        ctx.register_table(name, Arc::new(mem)).unwrap();
    }
    let batch = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let expected: Outputs = Arc::default();
    expected.lock().unwrap().insert(0, batch);
    let expected = join_rows(&expected);
    assert!(
        expected.len() > 150,
        "a join worth checking: {}",
        expected.len()
    );
    assert_eq!(join_rows(&outputs), expected);
}

#[tokio::test]
async fn restarts_check_deduplications_and_joins_too() {
    // dedup_removed (reference §1b): the deduplication taken out is refused, as is another key.
    let dedupe = "SELECT DISTINCT ON (k) k, v FROM ev";
    let (class, message) = restart_with(dedupe, "SELECT k, v FROM ev", false)
        .await
        .unwrap_err();
    assert_eq!(
        class, "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
        "{message}"
    );
    assert!(message.contains("0 dedupe"), "{message}");
    let (class, message) = restart_with(dedupe, "SELECT DISTINCT ON (v) k, v FROM ev", false)
        .await
        .unwrap_err();
    assert_eq!(class, "STATEFUL_OPERATOR_DEFINITION_CHANGED", "{message}");
    // dedup_same: unchanged is accepted.
    restart_with(dedupe, dedupe, false)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    // A deduplication replaced by an aggregation.
    let (class, _) = restart_with(dedupe, "SELECT k, count(*) AS n FROM ev GROUP BY k", false)
        .await
        .unwrap_err();
    assert_eq!(
        class,
        "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA"
    );
}

#[tokio::test]
async fn a_stream_stream_join_equals_the_batch_join_of_the_same_rows() {
    // Both sides see every row (generous watermark), so the streaming inner join of all
    // batches must equal DataFusion's join of all rows.
    let session = WeirSession::new();
    let lefts = MemoryStream::new("lefts", schema());
    let rights = MemoryStream::new("rights", schema());
    session.register_memory_stream(&lefts);
    session.register_memory_stream(&rights);
    for (name, view) in [("lefts", "lw"), ("rights", "rw")] {
        let df = session.read_stream().table(name).unwrap();
        session
            .context()
            .register_table(view, df.into_view())
            .unwrap();
    }
    let sql =
        "SELECT l.k AS k, l.v AS lv, r.v AS rv FROM lw l JOIN rw r ON l.k = r.k AND l.v < r.v";
    let df = session.context().sql(sql).await.unwrap();
    let outputs: Outputs = Arc::default();
    let sink = Arc::clone(&outputs);
    let ck = tempfile::tempdir().unwrap();
    let q = session
        .write_stream(df)
        .checkpoint_location(ck.path().to_str().unwrap())
        .foreach_batch(move |id, batches| {
            let sink = Arc::clone(&sink);
            async move {
                sink.lock().unwrap().insert(id, batches);
                Ok(())
            }
        })
        .start()
        .await
        .unwrap();
    let (mut all_l, mut all_r) = (vec![], vec![]);
    let mut seed = 7u64;
    let mut next = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        (seed >> 33) as i64
    };
    for _ in 0..6 {
        let l: Vec<(i64, Option<i64>)> =
            (0..40).map(|_| (next() % 13, Some(next() % 100))).collect();
        let r: Vec<(i64, Option<i64>)> =
            (0..30).map(|_| (next() % 13, Some(next() % 100))).collect();
        lefts.push(rows(&l)).unwrap();
        rights.push(rows(&r)).unwrap();
        all_l.extend(l);
        all_r.extend(r);
        q.process_all_available().await.unwrap();
    }
    q.stop().await;
    let streamed: Vec<RecordBatch> = outputs
        .lock()
        .unwrap()
        .values()
        .flatten()
        .cloned()
        .collect();

    let ctx = weir::datafusion::prelude::SessionContext::new();
    for (name, data) in [("lw", &all_l), ("rw", &all_r)] {
        let mem = weir::datafusion::datasource::MemTable::try_new(schema(), vec![vec![rows(data)]])
            .unwrap();
        ctx.register_table(name, Arc::new(mem)).unwrap();
    }
    let batch = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let expected = table(&batch);
    assert!(
        expected.len() > 100,
        "a join worth checking: {}",
        expected.len()
    );
    assert_eq!(table(&streamed), expected);
}

#[tokio::test]
async fn several_watermarks_combine_by_min_or_by_max_as_configured() {
    use weir::DataFrameStreamExt;
    for (policy, expected) in [
        (None, "1970-01-01T00:00:08.000Z"),
        (Some("max"), "1970-01-01T00:00:18.000Z"),
    ] {
        let session = WeirSession::new();
        let lefts = MemoryStream::new("lefts", events_schema());
        let rights = MemoryStream::new("rights", events_schema());
        session.register_memory_stream(&lefts);
        session.register_memory_stream(&rights);
        for (name, view) in [("lefts", "lw"), ("rights", "rw")] {
            let df = session
                .read_stream()
                .table(name)
                .unwrap()
                .with_watermark("ts", "2 seconds")
                .unwrap();
            session
                .context()
                .register_table(view, df.into_view())
                .unwrap();
        }
        let df = session
            .context()
            .sql("SELECT l.k FROM lw l JOIN rw r ON l.k = r.k")
            .await
            .unwrap();
        let ck = tempfile::tempdir().unwrap();
        let mut w = session
            .write_stream(df)
            .format("noop")
            .checkpoint_location(ck.path().to_str().unwrap());
        if let Some(p) = policy {
            w = w.option("multipleWatermarkPolicy", p);
        }
        let q = w.start().await.unwrap();
        lefts.push(events(&[10])).unwrap();
        rights.push(events(&[20])).unwrap();
        q.process_all_available().await.unwrap();
        let p = q.last_progress().unwrap();
        assert_eq!(
            p.event_time.get("watermark").unwrap(),
            expected,
            "{policy:?}"
        );
        q.stop().await;
    }
    let session = WeirSession::new();
    let err = session
        .sql("CREATE STREAMING TABLE t USING noop OPTIONS (multipleWatermarkPolicy 'avg') AS SELECT * FROM STREAM rate()")
        .await
        .unwrap_err();
    assert_eq!(err.error_class(), "STREAMING_INVALID_OPTION", "{err}");
}

#[tokio::test]
async fn damaged_state_files_are_named_and_nothing_runs_on_them() {
    let t = setup();
    let ck = tempfile::tempdir().unwrap();
    let q = t
        .start(
            COUNTS,
            OutputMode::Update,
            ck.path(),
            StateBackend::default(),
        )
        .await
        .unwrap();
    t.stream.push(rows(&[(1, Some(1)), (2, Some(2))])).unwrap();
    q.process_all_available().await.unwrap();
    q.stop().await;

    // The operators' record: refused at start, naming the file.
    let meta = ck.path().join("state/_metadata");
    let good = std::fs::read(&meta).unwrap();
    std::fs::write(&meta, &good[..good.len() / 2]).unwrap();
    let err = t
        .start(
            COUNTS,
            OutputMode::Update,
            ck.path(),
            StateBackend::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.error_class(), "CHECKPOINT_FILE_CORRUPT", "{err}");
    assert!(err.to_string().contains("state/_metadata"), "{err}");
    std::fs::write(&meta, &good).unwrap();

    // A changelog: the restart rebuilds the state it needs before it writes anything, and
    // refuses the damaged file by name; no batch is logged.
    let mut damaged = 0;
    for part in std::fs::read_dir(ck.path().join("state/0")).unwrap() {
        let log = part.unwrap().path().join("default/1.changelog");
        let mut bytes = std::fs::read(&log).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&log, bytes).unwrap();
        damaged += 1;
    }
    assert!(damaged > 0);
    t.stream.push(rows(&[(1, Some(3))])).unwrap();
    let err = t
        .start(
            COUNTS,
            OutputMode::Update,
            ck.path(),
            StateBackend::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.error_class(), "STATE_STORE_FILE_CORRUPT", "{err}");
    assert!(err.to_string().contains("1.changelog"), "{err}");
    assert!(
        !ck.path().join("offsets/1").exists(),
        "nothing was logged for the next batch"
    );
}

#[tokio::test]
async fn async_state_checkpointing_gives_the_same_results_and_commits_every_batch_on_stop() {
    let t = setup();
    let ck = tempfile::tempdir().unwrap();
    let start = |asynchronous: bool| {
        let t = &t;
        let ck = ck.path().to_path_buf();
        async move {
            let df = t.session.context().sql(COUNTS).await.unwrap();
            let outputs = Arc::clone(&t.outputs);
            t.session
                .write_stream(df)
                .output_mode(OutputMode::Update)
                .checkpoint_location(ck.to_str().unwrap())
                .async_state_checkpoint(asynchronous)
                .foreach_batch(move |id, batches| {
                    let outputs = Arc::clone(&outputs);
                    async move {
                        outputs.lock().unwrap().insert(id, batches);
                        Ok(())
                    }
                })
                .start()
                .await
                .unwrap()
        }
    };
    let q = start(true).await;
    t.stream
        .push(rows(&[(1, Some(10)), (1, Some(5)), (2, None)]))
        .unwrap();
    q.process_all_available().await.unwrap();
    t.stream.push(rows(&[(2, Some(7)), (3, Some(1))])).unwrap();
    q.process_all_available().await.unwrap();
    // Idle: the batch whose state was in flight is committed too.
    assert!(ck.path().join("commits/1").exists());
    t.stream.push(rows(&[(1, Some(1))])).unwrap();
    q.process_all_available().await.unwrap();
    q.stop().await;
    assert!(
        ck.path().join("commits/2").exists(),
        "a clean stop commits the last batch"
    );
    assert_eq!(t.output(0), strs(&[&["1", "2", "15"], &["2", "1", "NULL"]]));
    assert_eq!(t.output(1), strs(&[&["2", "2", "7"], &["3", "1", "1"]]));
    assert_eq!(t.output(2), strs(&[&["1", "3", "16"]]));
    // The state was durable: a synchronous restart continues from it.
    t.stream.push(rows(&[(3, Some(2))])).unwrap();
    let q = start(false).await;
    q.process_all_available().await.unwrap();
    assert_eq!(t.output(3), strs(&[&["3", "2", "3"]]));
    q.stop().await;

    let err = t
        .session
        .write_stream(t.session.context().sql(COUNTS).await.unwrap())
        .output_mode(OutputMode::Update)
        .state_store(StateBackend::Memory)
        .async_state_checkpoint(true)
        .format("noop")
        .start()
        .await
        .unwrap_err();
    assert_eq!(
        err.error_class(),
        "ASYNC_STATE_CHECKPOINT_NOT_SUPPORTED",
        "{err}"
    );
}

#[tokio::test]
async fn a_failed_asynchronous_state_upload_fails_the_query_before_its_batch_commits() {
    let t = setup();
    let ck = tempfile::tempdir().unwrap();
    let df = t.session.context().sql(COUNTS).await.unwrap();
    let q = t
        .session
        .write_stream(df)
        .output_mode(OutputMode::Update)
        .checkpoint_location(ck.path().to_str().unwrap())
        .async_state_checkpoint(true)
        .format("noop")
        .start()
        .await
        .unwrap();
    t.stream.push(rows(&[(1, Some(1)), (2, Some(2))])).unwrap();
    q.process_all_available().await.unwrap();
    assert!(ck.path().join("commits/0").exists());
    // Every store's checkpoint folder becomes a file: the next batch's uploads cannot write.
    for part in std::fs::read_dir(ck.path().join("state/0")).unwrap() {
        let dir = part.unwrap().path().join("default");
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::write(&dir, b"not a folder").unwrap();
    }
    t.stream.push(rows(&[(1, Some(3)), (2, Some(4))])).unwrap();
    let err = q.process_all_available().await.unwrap_err();
    assert_eq!(err.cause_error_class(), "STATE_STORE_IO_ERROR", "{err}");
    assert!(
        !ck.path().join("commits/1").exists(),
        "the batch did not commit"
    );
}

#[tokio::test]
async fn the_rocksdb_store_is_configured_by_options() {
    let t = setup();
    let ck = tempfile::tempdir().unwrap();
    let df = t.session.context().sql(COUNTS).await.unwrap();
    let q = t
        .session
        .write_stream(df)
        .output_mode(OutputMode::Update)
        .checkpoint_location(ck.path().to_str().unwrap())
        .option("stateStore.minDeltasForSnapshot", 3)
        .option("stateStore.maintenanceInterval", "0s")
        .option("stateStore.rocksdb.blockCacheSizeMB", 8)
        .option("stateStore.rocksdb.maxMemtableMemoryMB", 8)
        .option("stateStore.rocksdb.writeBufferSizeMB", 2)
        .option("stateStore.rocksdb.compression", "LZ4")
        .format("noop")
        .start()
        .await
        .unwrap();
    for i in 0..7 {
        t.stream.push(rows(&[(i, Some(i))])).unwrap();
        q.process_all_available().await.unwrap();
    }
    q.stop().await;
    // The local instances run as told (RocksDB records its options next to its files).
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ck.path().join("metadata")).unwrap()).unwrap();
    let prefix = format!("weir-state-{}-", meta["id"].as_str().unwrap());
    let mut options = vec![];
    let mut dirs: Vec<std::path::PathBuf> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            if e.path().is_dir() {
                dirs.push(e.path());
            } else if e.file_name().to_string_lossy().starts_with("OPTIONS-") {
                options.push(std::fs::read_to_string(e.path()).unwrap());
            }
        }
    }
    assert!(!options.is_empty(), "no local instance under {prefix}");
    for text in &options {
        let codecs: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("compression="))
            .collect();
        assert_eq!(codecs, ["compression=kLZ4Compression"; 2], "{text}");
    }
    for e in std::fs::read_dir(std::env::temp_dir()).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let mut snapshots: Vec<String> = std::fs::read_dir(ck.path().join("state/0"))
        .unwrap()
        .flat_map(|p| std::fs::read_dir(p.unwrap().path().join("default")).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".snapshot"))
        .collect();
    snapshots.sort();
    snapshots.dedup();
    assert_eq!(snapshots, ["3.snapshot", "6.snapshot"]);

    let df = t.session.context().sql(COUNTS).await.unwrap();
    let err = t
        .session
        .write_stream(df)
        .output_mode(OutputMode::Update)
        .option("stateStore.rocksdb.blockCacheSizeMB", "lots")
        .format("noop")
        .start()
        .await
        .unwrap_err();
    assert_eq!(err.error_class(), "STREAMING_INVALID_OPTION", "{err}");
    let df = t.session.context().sql(COUNTS).await.unwrap();
    let err = t
        .session
        .write_stream(df)
        .output_mode(OutputMode::Update)
        .option("stateStore.rocksdb.compression", "zstd")
        .format("noop")
        .start()
        .await
        .unwrap_err();
    assert_eq!(err.error_class(), "STREAMING_INVALID_OPTION", "{err}");
    assert!(err.to_string().contains("none or lz4"), "{err}");
}

#[tokio::test]
async fn state_several_times_the_memory_bound_stays_correct_and_within_it() {
    use weir::DataFrameStreamExt;
    use weir::datafusion::arrow::array::StringArray;
    let session = WeirSession::new();
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false)]));
    let stream = MemoryStream::new("ids", Arc::clone(&schema));
    session.register_memory_stream(&stream);
    let df = session
        .read_stream()
        .table("ids")
        .unwrap()
        .drop_duplicates(&["id"])
        .unwrap();
    let ck = tempfile::tempdir().unwrap();
    let kept = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&kept);
    let q = session
        .write_stream(df)
        .checkpoint_location(ck.path().to_str().unwrap())
        .option("stateStore.rocksdb.blockCacheSizeMB", 1)
        .option("stateStore.rocksdb.maxMemtableMemoryMB", 1)
        .option("stateStore.rocksdb.writeBufferSizeMB", 1)
        .foreach_batch(move |_, batches: Vec<RecordBatch>| {
            let counter = Arc::clone(&counter);
            async move {
                let n: usize = batches.iter().map(|b| b.num_rows()).sum();
                counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
        })
        .start()
        .await
        .unwrap();
    // 8 batches of 20,000 new 96-byte keys: about 15 MB of keys against 2 MB of memory.
    // Keys of pseudo-random hex, so compression does not shrink the state away.
    let mix = |x: u64| {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let key = move |i: usize| {
        (0..6)
            .map(|j| format!("{:016x}", mix((i * 6 + j) as u64)))
            .collect::<String>()
    };
    let batch = |from: usize| {
        let ids: Vec<String> = (from..from + 20_000).map(key).collect();
        RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(StringArray::from(ids))]).unwrap()
    };
    let mut peak_memory = 0;
    for b in 0..8 {
        stream.push(batch(b * 20_000)).unwrap();
        q.process_all_available().await.unwrap();
        let op = &q.last_progress().unwrap().state_operators[0];
        peak_memory = peak_memory.max(op.memory_used_bytes);
    }
    // Every key seen again: all duplicates, found on disk.
    stream.push(batch(0)).unwrap();
    stream.push(batch(140_000)).unwrap();
    q.process_all_available().await.unwrap();
    let p = q.last_progress().unwrap();
    let op = &p.state_operators[0];
    q.stop().await;
    assert_eq!(kept.load(std::sync::atomic::Ordering::Relaxed), 160_000);
    assert_eq!(op.num_rows_total, 160_000);
    let on_disk = op.custom_metrics["rocksdbSstFileSize"] as u64;
    eprintln!("state on disk {on_disk} bytes, peak memory {peak_memory} bytes");
    assert!(on_disk > 8 << 20, "state on disk: {on_disk} bytes");
    assert!(
        peak_memory < on_disk / 3,
        "memory {peak_memory} bytes for {on_disk} bytes of state"
    );
}

/// A per-key session-window count (gap 5 s) over `clicks` with a 2-second watermark.
async fn session_counts(
    session: &WeirSession,
    gap: &str,
    mode: OutputMode,
    ck: &std::path::Path,
) -> weir::Result<(Outputs, StreamingQuery)> {
    use weir::DataFrameStreamExt;
    let df = session
        .read_stream()
        .table("clicks")?
        .with_watermark("ts", "2 seconds")?;
    let _ = session.context().deregister_table("clicks_wm");
    session
        .context()
        .register_table("clicks_wm", df.into_view())?;
    let df = session
        .context()
        .sql(&format!(
            "SELECT k, session_window(ts, '{gap}') AS s, count(*) AS n, max(ts) AS last \
             FROM clicks_wm GROUP BY k, session_window(ts, '{gap}')"
        ))
        .await?;
    let outputs: Outputs = Arc::default();
    let sink = Arc::clone(&outputs);
    let q = session
        .write_stream(df)
        .output_mode(mode)
        .checkpoint_location(ck.to_str().unwrap())
        .foreach_batch(move |id, batches| {
            let sink = Arc::clone(&sink);
            async move {
                sink.lock().unwrap().insert(id, batches);
                Ok(())
            }
        })
        .start()
        .await?;
    Ok((outputs, q))
}

/// Session rows of batch `batch`: `k [start s, end s) n`, sorted.
fn session_rows(outputs: &Outputs, batch: u64) -> Vec<String> {
    let all = outputs.lock().unwrap();
    let mut out = vec![];
    for b in all.get(&batch).into_iter().flatten() {
        let k = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let s = b
            .column(1)
            .as_any()
            .downcast_ref::<weir::datafusion::arrow::array::StructArray>()
            .unwrap();
        let secs = |c: usize| {
            let c = cast(s.column(c), &DataType::Int64).unwrap();
            c.as_any().downcast_ref::<Int64Array>().unwrap().clone()
        };
        let (start, end) = (secs(0), secs(1));
        let n = b.column(2).as_any().downcast_ref::<Int64Array>().unwrap();
        for r in 0..b.num_rows() {
            out.push(format!(
                "{} [{}, {}) {}",
                k.value(r),
                start.value(r) / 1_000_000,
                end.value(r) / 1_000_000,
                n.value(r)
            ));
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn session_windows_merge_across_batches_and_are_emitted_once_the_watermark_closes_them() {
    // `events` puts even seconds in key 0 and odd seconds in key 1; each row opens [t, t + 5).
    let ck = tempfile::tempdir().unwrap();
    let (session, stream) = clicks();
    let (outputs, q) = session_counts(&session, "5 seconds", OutputMode::Append, ck.path())
        .await
        .unwrap();
    // Batch 0: key 0's 0 s and 4 s merge into [0, 9); key 1 has [1, 6). Watermark 4 - 2 = 2 s,
    // so batch 1 runs without data; nothing has ended by then.
    stream.push(events(&[0, 4, 1])).unwrap();
    q.process_all_available().await.unwrap();
    // Batch 2: 10 s starts after [0, 9) ends, a new session; 7 s after [1, 6) ends, too.
    // The watermark moves to 18 s: batch 3 closes every session ending by then.
    stream.push(events(&[10, 7, 20])).unwrap();
    q.process_all_available().await.unwrap();
    for b in 0..=2 {
        assert_eq!(session_rows(&outputs, b), Vec::<String>::new(), "batch {b}");
    }
    assert_eq!(
        session_rows(&outputs, 3),
        vec!["0 [0, 9) 2", "0 [10, 15) 1", "1 [1, 6) 1", "1 [7, 12) 1"]
    );
    let p = q.last_progress().unwrap();
    assert_eq!(p.state_operators[0].operator_name, "sessionWindowAggregate");
    assert_eq!(p.state_operators[0].num_rows_removed, 4);
    assert_eq!(p.state_operators[0].num_rows_total, 1, "[20, 25) is open");
    // Batch 4: 8 s (its session ends at 13 s, behind the 18 s watermark) is late; 22 s joins
    // the stored [20, 25); 31 s and 37 s are two sessions of key 1 (37 > 31 + 5).
    stream.push(events(&[8, 22, 31, 37])).unwrap();
    q.process_all_available().await.unwrap();
    let p4 = q
        .recent_progress()
        .into_iter()
        .find(|p| p.batch_id == 4)
        .unwrap();
    assert_eq!(p4.state_operators[0].num_rows_dropped_by_watermark, 1);
    assert_eq!(session_rows(&outputs, 5), vec!["0 [20, 27) 2"]);
    q.stop().await;

    // A restart with another gap changes what the stored sessions mean: refused.
    let err = match session_counts(&session, "6 seconds", OutputMode::Append, ck.path()).await {
        Ok((_, q)) => {
            q.stop().await;
            panic!("a changed gap was accepted");
        }
        Err(e) => e,
    };
    assert_eq!(
        err.error_class(),
        "STATEFUL_OPERATOR_DEFINITION_CHANGED",
        "{err}"
    );
    assert!(err.to_string().contains("6 seconds"), "{err}");

    // The same query restarts from its state: 35 s bridges key 1's [31, 36) and [37, 42)
    // into one session of three rows.
    let (outputs, q) = session_counts(&session, "5 seconds", OutputMode::Append, ck.path())
        .await
        .unwrap();
    stream.push(events(&[35, 50])).unwrap();
    q.process_all_available().await.unwrap();
    assert_eq!(session_rows(&outputs, 6), Vec::<String>::new());
    assert_eq!(session_rows(&outputs, 7), vec!["1 [31, 42) 3"]);
    let p = q.last_progress().unwrap();
    assert_eq!(p.batch_id, 7);
    assert_eq!(p.state_operators[0].num_rows_total, 1, "[50, 55) is open");
    q.stop().await;
}

#[tokio::test]
async fn session_windows_in_update_mode_or_without_a_watermark_in_append_mode_are_refused() {
    let ck = tempfile::tempdir().unwrap();
    let (session, _stream) = clicks();
    let df = session.read_stream().table("clicks").unwrap();
    session
        .context()
        .register_table("clicks_v", df.into_view())
        .unwrap();
    let err = session_counts(&session, "5 seconds", OutputMode::Update, ck.path())
        .await
        .err()
        .unwrap();
    assert_eq!(
        err.error_class(),
        "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION"
    );
    assert!(err.to_string().contains("session-window"), "{err}");
    let df = session
        .context()
        .sql("SELECT k, count(*) FROM clicks_v GROUP BY k, session_window(ts, '5 seconds')")
        .await
        .unwrap();
    let err = session
        .write_stream(df)
        .checkpoint_location(ck.path().to_str().unwrap())
        .format("noop")
        .start()
        .await
        .err()
        .unwrap();
    assert_eq!(
        err.error_class(),
        "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION"
    );
    assert!(err.to_string().contains("watermark"), "{err}");
}

/// Sessions of all rows of `clicks` by batch SQL: gaps and islands with window functions.
const BATCH_SESSIONS: &str = "WITH o AS ( \
       SELECT k, ts, max(ts) OVER (PARTITION BY k ORDER BY ts \
         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev FROM clicks), \
     g AS ( \
       SELECT k, ts, sum(CASE WHEN prev IS NULL OR ts > prev + INTERVAL '5 seconds' \
         THEN 1 ELSE 0 END) OVER (PARTITION BY k ORDER BY ts ROWS UNBOUNDED PRECEDING) AS sid \
       FROM o) \
     SELECT k, min(ts) AS s, max(ts) + INTERVAL '5 seconds' AS e, count(*) AS n, max(ts) AS last \
     FROM g GROUP BY k, sid";

async fn session_windows_equal_batch_sessions(backend: StateBackend) {
    let ck = tempfile::tempdir().unwrap();
    let (session, stream) = clicks();
    let df = session.read_stream().table("clicks").unwrap();
    session
        .context()
        .register_table("clicks_v", df.into_view())
        .unwrap();
    // Complete mode, no watermark: every session stays, rows may come in any order.
    let df = session
        .context()
        .sql(
            "SELECT k, session_window(ts, '5 seconds') AS w, count(*) AS n, max(ts) AS last \
             FROM clicks_v GROUP BY k, session_window(ts, '5 seconds')",
        )
        .await
        .unwrap();
    let outputs: Outputs = Arc::default();
    let sink = Arc::clone(&outputs);
    let q = session
        .write_stream(df)
        .output_mode(OutputMode::Complete)
        .state_store(backend)
        .checkpoint_location(ck.path().to_str().unwrap())
        .foreach_batch(move |id, batches| {
            let sink = Arc::clone(&sink);
            async move {
                sink.lock().unwrap().insert(id, batches);
                Ok(())
            }
        })
        .start()
        .await
        .unwrap();
    let mut all = vec![];
    let mut seed = 11u64;
    for _ in 0..8 {
        let secs: Vec<i64> = (0..25)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                ((seed >> 33) % 400) as i64
            })
            .collect();
        stream.push(events(&secs)).unwrap();
        all.push(events(&secs));
        q.process_all_available().await.unwrap();
    }
    let last = q.last_progress().unwrap().batch_id;
    q.stop().await;
    let streamed: Vec<RecordBatch> = outputs.lock().unwrap()[&last].clone();
    // The window struct as its two fields, to compare with the batch query's columns.
    let flat: Vec<RecordBatch> = streamed
        .iter()
        .map(|b| {
            let w = b
                .column(1)
                .as_any()
                .downcast_ref::<weir::datafusion::arrow::array::StructArray>()
                .unwrap();
            RecordBatch::try_from_iter(vec![
                ("k", Arc::clone(b.column(0))),
                ("s", Arc::clone(w.column(0))),
                ("e", Arc::clone(w.column(1))),
                ("n", Arc::clone(b.column(2))),
                ("last", Arc::clone(b.column(3))),
            ])
            .unwrap()
        })
        .collect();

    let ctx = weir::datafusion::prelude::SessionContext::new();
    let mem = weir::datafusion::datasource::MemTable::try_new(events_schema(), vec![all]).unwrap();
    ctx.register_table("clicks", Arc::new(mem)).unwrap();
    let batch = ctx
        .sql(BATCH_SESSIONS)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let expected = table(&batch);
    assert!(
        expected.len() > 20 && expected.len() < 150,
        "sessions worth checking: {}",
        expected.len()
    );
    assert_eq!(table(&flat), expected);
}

support::on_each_backend!(
    session_windows_equal_batch_sessions_of_the_same_rows,
    session_windows_equal_batch_sessions
);

/// `read_state` over a checkpoint whose state is in memory reads the running query's state, in
/// the session running it; a version the memory store no longer keeps, or a stopped query's
/// state, is refused.
#[tokio::test]
async fn read_state_reads_a_running_querys_in_memory_state() {
    let t = setup();
    let ck = tempfile::tempdir().unwrap();
    let q = t
        .start(COUNTS, OutputMode::Update, ck.path(), StateBackend::Memory)
        .await
        .unwrap();
    for batch in [
        &[(1, Some(10)), (2, Some(5))][..],
        &[(1, Some(1))],
        &[(3, None)],
    ] {
        t.stream.push(rows(batch)).unwrap();
        q.process_all_available().await.unwrap();
    }
    // Spelled otherwise than the query's checkpoint location: the query is found by its ID.
    let dir = format!("{}/", ck.path().display());
    let read = |extra: &'static str| {
        let sql = format!(
            "SELECT key['k'] AS k, value['count(Int64(1))[count]'] AS n FROM read_state('{dir}', \
             operatorId => 0{extra}) ORDER BY k"
        );
        let session = &t.session;
        async move {
            match session.context().sql(&sql).await {
                Ok(df) => df.collect().await.map(|b| table(&b)),
                Err(e) => Err(e),
            }
        }
    };
    assert_eq!(
        read("").await.unwrap(),
        strs(&[&["1", "2"], &["2", "1"], &["3", "1"]])
    );
    // The state after batch 1, still kept, had no key 3.
    assert_eq!(
        read(", batchId => 1").await.unwrap(),
        strs(&[&["1", "2"], &["2", "1"]])
    );
    let err = read(", batchId => 0").await.unwrap_err().to_string();
    assert!(err.contains("STDS_COMMITTED_BATCH_UNAVAILABLE"), "{err}");
    // read_state_metadata gives the batches whose state the memory store holds: 1 and 2.
    let metadata = || async {
        let df = t
            .session
            .context()
            .sql(&format!(
                "SELECT \"minBatchId\", \"maxBatchId\" FROM read_state_metadata('{dir}')"
            ))
            .await
            .unwrap();
        table(&df.collect().await.unwrap())
    };
    assert_eq!(metadata().await, strs(&[&["1", "2"]]));
    q.stop().await;
    let err = read("").await.unwrap_err().to_string();
    assert!(err.contains("STATE_STORE_NOT_DURABLE"), "{err}");
    assert_eq!(metadata().await, strs(&[&["NULL", "NULL"]]));
}
