//! The Rust embedding API end to end: memory stream in, DataFrame transformations, every
//! sink kind out, restart from a checkpoint, listeners and the query handle.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir::datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use weir::datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use weir::datafusion::prelude::{col, lit};
use weir::{
    DataFrameStreamExt, MemoryStream, QueryIdleEvent, QueryProgressEvent, QueryStartedEvent,
    QueryTerminatedEvent, StatementResult, StreamingQueryListener, Trigger, WeirSession,
};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
    ]))
}

fn rows(ks: &[i64]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(ks.to_vec())),
            Arc::new(StringArray::from(
                ks.iter().map(|k| format!("n{k}")).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

async fn ints(session: &WeirSession, sql: &str) -> Vec<i64> {
    let batches = session
        .context()
        .sql(sql)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect()
}

#[tokio::test]
async fn memory_stream_to_memory_sink_is_queryable_while_running_and_resumes_after_restart() {
    let session = WeirSession::new();
    let stream = MemoryStream::new("events", schema());
    session.register_memory_stream(&stream);
    stream.push(rows(&[1, 2, 3, 4])).unwrap();
    let ck = tempfile::tempdir().unwrap();

    let start = || async {
        session
            .read_stream()
            .table("events")
            .unwrap()
            .filter(col("k").gt(lit(1)))
            .unwrap()
            .select(vec![col("k"), (col("k") * lit(10)).alias("k10")])
            .unwrap()
            .write_stream()
            .unwrap()
            .format("memory")
            .query_name("out")
            .checkpoint_location(ck.path().to_str().unwrap())
            .start()
            .await
            .unwrap()
    };
    let q = start().await;
    q.process_all_available().await.unwrap();
    assert_eq!(
        ints(&session, "SELECT k FROM out ORDER BY k").await,
        vec![2, 3, 4]
    );
    stream.push(rows(&[5])).unwrap();
    q.process_all_available().await.unwrap();
    assert_eq!(
        ints(&session, "SELECT k10 FROM out ORDER BY k").await,
        vec![20, 30, 40, 50]
    );
    let first_id = q.id();
    let batches_before = q.recent_progress().len();
    assert!(batches_before >= 2);
    q.stop().await;
    assert!(!q.is_active());

    // Rows pushed while stopped are read after the restart; nothing is read twice.
    stream.push(rows(&[6, 0])).unwrap();
    let q2 = start().await;
    assert_eq!(q2.id(), first_id, "the query id comes from the checkpoint");
    assert_ne!(q2.run_id(), q.run_id());
    q2.process_all_available().await.unwrap();
    // The memory sink is new for the new run, as in Spark: it holds this run's output.
    assert_eq!(
        ints(&session, "SELECT k FROM out ORDER BY k").await,
        vec![6]
    );
    let p = q2.last_progress().unwrap();
    assert_eq!(p.num_input_rows, 2);
    assert_eq!(p.sources[0].start_offset, Some(serde_json::json!(5)));
    assert_eq!(p.sources[0].end_offset, Some(serde_json::json!(7)));
    q2.stop().await;
}

#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

impl StreamingQueryListener for Recorder {
    fn on_query_started(&self, e: &QueryStartedEvent) {
        self.0
            .lock()
            .unwrap()
            .push(format!("started {}", e.name.clone().unwrap_or_default()));
    }
    fn on_query_progress(&self, e: &QueryProgressEvent) {
        self.0
            .lock()
            .unwrap()
            .push(format!("progress {}", e.progress.batch_id));
    }
    fn on_query_idle(&self, _e: &QueryIdleEvent) {
        self.0.lock().unwrap().push("idle".into());
    }
    fn on_query_terminated(&self, e: &QueryTerminatedEvent) {
        self.0
            .lock()
            .unwrap()
            .push(format!("terminated {:?}", e.exception));
    }
}

#[tokio::test]
async fn a_query_without_data_records_no_data_progress_and_reports_idle_as_spark_does() {
    let session = WeirSession::new();
    let recorder = Arc::new(Recorder::default());
    session.streams().add_listener(recorder.clone());
    let stream = MemoryStream::new("quiet", schema());
    session.register_memory_stream(&stream);
    let q = session
        .read_stream()
        .table("quiet")
        .unwrap()
        .write_stream()
        .unwrap()
        .format("noop")
        .no_data_progress_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    // Idle from the start: a no-data progress entry at once, an idle event only from the
    // next interval on (Spark's ProgressReporter.updateIdleness).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        session.streams().flush_listeners().await;
        if recorder.0.lock().unwrap().iter().any(|e| e == "idle") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no idle event");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let idle_entries = q.recent_progress();
    assert!(idle_entries.len() >= 2, "{}", idle_entries.len());
    for p in &idle_entries {
        assert_eq!(
            (p.batch_id, p.num_input_rows, p.sink.num_output_rows),
            (0, 0, -1)
        );
        assert!(p.duration_ms.contains_key("latestOffset"));
    }
    stream.push(rows(&[1, 2])).unwrap();
    q.process_all_available().await.unwrap();
    q.stop().await;
    session.streams().flush_listeners().await;
    let events = recorder.0.lock().unwrap().clone();
    assert_eq!(events.first().unwrap(), "started ", "{events:?}");
    assert_eq!(events.get(1).unwrap(), "idle", "{events:?}");
    assert!(events.contains(&"progress 0".to_string()), "{events:?}");
    assert_eq!(events.last().unwrap(), "terminated None");
    let last = q.last_progress().unwrap();
    assert_eq!((last.batch_id, last.num_input_rows), (0, 2));
}

#[tokio::test]
async fn a_processing_time_trigger_starts_one_batch_per_interval_on_its_boundaries() {
    let session = WeirSession::new();
    let q = session
        .read_stream()
        .format("rate-micro-batch")
        .option("rowsPerBatch", 5)
        .load()
        .unwrap()
        .write_stream()
        .unwrap()
        .format("noop")
        .trigger(Trigger::ProcessingTime(Duration::from_millis(150)))
        .max_batches(4)
        .start()
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let starts: Vec<i64> = q
        .recent_progress()
        .iter()
        .map(|p| {
            chrono::DateTime::parse_from_rfc3339(&p.timestamp)
                .unwrap()
                .timestamp_millis()
        })
        .collect();
    assert_eq!(starts.len(), 4);
    // As Spark, triggers after the first start on whole multiples of the interval: no two of
    // them fall into the same 150 ms window.
    let windows: Vec<i64> = starts.iter().map(|t| t / 150).collect();
    assert!(
        windows.windows(2).all(|w| w[1] > w[0]),
        "two batches in one interval: {starts:?}"
    );
}

#[tokio::test]
async fn foreach_batch_sees_every_batch_and_listeners_see_the_lifecycle() {
    let session = WeirSession::new();
    let recorder = Arc::new(Recorder::default());
    session.streams().add_listener(recorder.clone());
    let seen: Arc<Mutex<Vec<(u64, usize)>>> = Arc::default();
    let seen2 = Arc::clone(&seen);
    let q = session
        .read_stream()
        .format("rate-micro-batch")
        .option("rowsPerBatch", 10)
        .option("numPartitions", 3)
        .load()
        .unwrap()
        .write_stream()
        .unwrap()
        .query_name("fe")
        .max_batches(3)
        .foreach_batch(move |id, batches: Vec<RecordBatch>| {
            let seen = Arc::clone(&seen2);
            async move {
                seen.lock()
                    .unwrap()
                    .push((id, batches.iter().map(|b| b.num_rows()).sum()));
                Ok(())
            }
        })
        .start()
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![(0, 10), (1, 10), (2, 10)]);
    assert_eq!(q.recent_progress().len(), 3);
    assert_eq!(q.status().message, "Stopped");
    // The listener thread delivers asynchronously.
    for _ in 0..100 {
        if recorder.0.lock().unwrap().len() >= 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        *recorder.0.lock().unwrap(),
        vec![
            "started fe",
            "progress 0",
            "progress 1",
            "progress 2",
            "terminated None"
        ]
    );
}

#[tokio::test]
async fn a_failing_foreach_batch_fails_the_query_with_stream_failed() {
    let session = WeirSession::new();
    let q = session
        .read_stream()
        .format("rate-micro-batch")
        .option("rowsPerBatch", 1)
        .load()
        .unwrap()
        .write_stream()
        .unwrap()
        .foreach_batch(|id, _| async move {
            if id == 1 {
                Err("boom".to_string())
            } else {
                Ok(())
            }
        })
        .start()
        .await
        .unwrap();
    let err = q.await_termination().await.unwrap_err();
    assert_eq!(err.error_class(), "STREAM_FAILED");
    assert_eq!(err.cause_error_class(), "FOREACH_BATCH_USER_FUNCTION_ERROR");
    assert!(err.to_string().contains("boom"), "{err}");
    assert_eq!(
        q.recent_progress().len(),
        1,
        "batch 0 committed, batch 1 failed"
    );
}

#[tokio::test]
async fn available_now_reads_what_is_there_in_batches_within_the_limit_then_stops() {
    let session = WeirSession::new();
    let stream = MemoryStream::with_max_rows_per_trigger("limited", schema(), 2);
    session.register_memory_stream(&stream);
    stream.push(rows(&[1, 2, 3, 4, 5])).unwrap();
    let q = session
        .read_stream()
        .table("limited")
        .unwrap()
        .write_stream()
        .unwrap()
        .format("noop")
        .trigger(Trigger::AvailableNow)
        .start()
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let sizes: Vec<u64> = q
        .recent_progress()
        .iter()
        .map(|p| p.num_input_rows)
        .collect();
    assert_eq!(sizes, vec![2, 2, 1]);
}

#[tokio::test]
async fn a_second_run_on_the_same_checkpoint_is_refused_and_the_first_keeps_running() {
    let session = WeirSession::new();
    let ck = tempfile::tempdir().unwrap();
    let start = || async {
        session
            .read_stream()
            .format("rate")
            .option("rowsPerSecond", 10)
            .load()
            .unwrap()
            .write_stream()
            .unwrap()
            .format("noop")
            .checkpoint_location(ck.path().to_str().unwrap())
            .start()
            .await
    };
    let first = start().await.unwrap();
    let err = start().await.unwrap_err();
    assert_eq!(err.error_class(), "CONCURRENT_QUERY");
    assert!(first.is_active());
    let active: Vec<_> = session.streams().active().iter().map(|q| q.id()).collect();
    assert_eq!(active, vec![first.id()], "only the first run is active");
    assert_eq!(
        session.streams().get(first.id()).unwrap().run_id(),
        first.run_id()
    );
    first.stop().await;
    assert!(first.exception().is_none());
    assert!(session.streams().active().is_empty());
    // Stopped, its checkpoint can be run again at once, with a new run id and the same id.
    let again = start().await.unwrap();
    assert_eq!(again.id(), first.id());
    assert_ne!(again.run_id(), first.run_id());
    again.stop().await;
}

#[tokio::test]
async fn a_streaming_frame_cannot_be_collected_as_a_batch() {
    let session = WeirSession::new();
    let df = session.read_stream().format("rate").load().unwrap();
    let err = df.collect().await.unwrap_err();
    assert!(
        err.to_string()
            .contains("NON_STREAMING_ACTION_ON_STREAMING_SOURCE"),
        "{err}"
    );
}

#[tokio::test]
async fn unsupported_operations_and_options_are_refused_at_start() {
    let session = WeirSession::new();
    let cases = [
        (
            "SELECT value FROM STREAM rate() ORDER BY value",
            "UNSUPPORTED_STREAMING_OPERATION.SORT",
        ),
        (
            "SELECT count(*) FROM STREAM rate()",
            "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION",
        ),
        (
            "SELECT * FROM STREAM rate(rowsPerSecond => 'fast')",
            "STREAMING_INVALID_OPTION",
        ),
        (
            "SELECT * FROM STREAM pulsar(topic => 'x')",
            "DATA_SOURCE_NOT_FOUND",
        ),
        ("SELECT * FROM STREAM nothing_here", "STREAM_NOT_FOUND"),
        ("SELEC 1", "PARSE_SYNTAX_ERROR"),
        (
            "CREATE STREAMING TABLE t USING parquet LOCATION '/tmp/weir-never' AS SELECT * FROM STREAM rate()",
            "CHECKPOINT_LOCATION_REQUIRED",
        ),
        (
            "CREATE STREAMING TABLE t USING noop OPTIONS (outputMode 'sideways') AS SELECT * FROM STREAM rate()",
            "STREAMING_OUTPUT_MODE.INVALID",
        ),
    ];
    for (sql, class) in cases {
        let err = session.sql(sql).await.unwrap_err();
        assert_eq!(err.error_class(), class, "{sql}: {err}");
    }
    // A stream joined with a static table is fine.
    session
        .context()
        .sql("CREATE TABLE dim AS VALUES (0, 'zero'), (2, 'two')")
        .await
        .unwrap();
    let r = session
        .sql(
            "CREATE STREAMING TABLE j USING memory OPTIONS (trigger 'once') AS \
             SELECT r.value, d.column2 AS name FROM STREAM rate_micro_batch(rowsPerBatch => 4) r \
             JOIN dim d ON r.value = d.column1",
        )
        .await
        .unwrap();
    let StatementResult::Query(q) = r else {
        panic!("expected a query")
    };
    q.await_termination().await.unwrap();
    assert_eq!(
        ints(&session, "SELECT value FROM j ORDER BY value").await,
        vec![0, 2]
    );
}

#[tokio::test]
async fn now_is_each_batchs_logged_time() {
    let session = WeirSession::new();
    let r = session
        .sql(
            "CREATE STREAMING TABLE clock OPTIONS (trigger 'processingTime=30 milliseconds') AS \
             SELECT value, CAST(now() AS BIGINT) / 1000000 AS now_ms \
             FROM STREAM rate_micro_batch(rowsPerBatch => 1, numPartitions => 1)",
        )
        .await
        .unwrap();
    let StatementResult::Query(q) = r else {
        panic!("expected a query")
    };
    while q.recent_progress().len() < 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    q.stop().await;
    let progress = q.recent_progress();
    let values = ints(&session, "SELECT value FROM clock ORDER BY value").await;
    let nows = ints(&session, "SELECT now_ms FROM clock ORDER BY value").await;
    assert!(values.len() >= 3);
    for (v, now) in values.iter().zip(&nows) {
        // With one row per batch, value = batch id.
        let p = progress.iter().find(|p| p.batch_id as i64 == *v).unwrap();
        let logged = chrono::DateTime::parse_from_rfc3339(&p.timestamp)
            .unwrap()
            .timestamp_millis();
        assert_eq!(*now, logged, "batch {v}");
    }
    assert!(nows.windows(2).all(|w| w[0] < w[1]), "{nows:?}");
}

#[tokio::test]
async fn old_log_entries_are_purged_past_min_batches_to_retain_and_a_restart_still_works() {
    let session = WeirSession::new();
    let ck = tempfile::tempdir().unwrap();
    let run = |batches: u64| {
        session
            .read_stream()
            .format("rate-micro-batch")
            .option("rowsPerBatch", 2)
            .load()
            .unwrap()
            .write_stream()
            .unwrap()
            .format("noop")
            .checkpoint_location(ck.path().to_str().unwrap())
            .min_batches_to_retain(3)
            .max_batches(batches)
            .start()
    };
    run(10).await.unwrap().await_termination().await.unwrap();
    let ids = |dir: &str| {
        let mut ids: Vec<u64> = std::fs::read_dir(ck.path().join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().parse().unwrap())
            .collect();
        ids.sort();
        ids
    };
    let offsets = ids("offsets");
    assert_eq!(offsets.last(), Some(&9));
    assert!(offsets.len() <= 4 && offsets.len() >= 3, "{offsets:?}");
    assert!(ids("commits").len() <= 4, "{:?}", ids("commits"));
    let q = run(1).await.unwrap();
    q.await_termination().await.unwrap();
    assert_eq!(q.last_progress().unwrap().batch_id, 10);
}

#[tokio::test]
async fn a_restart_keeps_the_partition_count_the_checkpoint_was_created_with() {
    let ck = tempfile::tempdir().unwrap();
    let run = |partitions: usize, batches: u64| {
        let session = WeirSession::with_config(
            weir::datafusion::prelude::SessionConfig::new().with_target_partitions(partitions),
        );
        let ck = ck.path().to_str().unwrap().to_string();
        async move {
            let q = session
                .read_stream()
                .format("rate-micro-batch")
                .option("rowsPerBatch", 2)
                .load()
                .unwrap()
                .write_stream()
                .unwrap()
                .format("noop")
                .checkpoint_location(ck)
                .max_batches(batches)
                .start()
                .await
                .unwrap();
            q.await_termination().await.unwrap();
        }
    };
    run(2, 2).await;
    run(3, 1).await;
    let logged = std::fs::read_to_string(ck.path().join("offsets/2")).unwrap();
    assert!(
        logged.contains(r#""weir.sql.shuffle.partitions":"2""#),
        "{logged}"
    );
}

#[tokio::test]
async fn a_scripts_streaming_table_refuses_the_clauses_only_pipelines_read() {
    let session = WeirSession::new();
    for sql in [
        "CREATE STREAMING TABLE t (value BIGINT) AS SELECT value FROM STREAM rate()",
        "CREATE STREAMING TABLE t PARTITIONED BY (value) AS SELECT value FROM STREAM rate()",
    ] {
        let err = session.sql(sql).await.unwrap_err();
        assert_eq!(
            err.error_class(),
            "UNSUPPORTED_FEATURE.PIPELINE_ONLY_CLAUSE",
            "{sql}: {err}"
        );
        assert!(
            session.streams().active().is_empty(),
            "{sql}: nothing started"
        );
    }
}
