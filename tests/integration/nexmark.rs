//! Nexmark: every query weir runs gives, over the generated events, what batch SQL over the
//! same events gives (differential tests); the generator replays the same events after a
//! `kill -9`.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, Float64Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionConfig;
use weir::nexmark::{NexmarkQuery, NexmarkStreams, QUERIES, generate_table, register_streams};
use weir::{StatementResult, WeirSession};
use weir_sources::nexmark::Table;

/// 200,000 events at 10,000 a second: 20 s of event time, so 10-second windows close.
fn streams() -> NexmarkStreams {
    NexmarkStreams {
        events: 200_000,
        events_per_batch: 40_000,
        partitions: 2,
        rate: 10_000,
        files: None,
    }
}

/// Each row as text, floats to 9 significant digits (a sum's last bits depend on the order
/// the rows were added in), sorted.
fn rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = vec![];
    for b in batches {
        let columns: Vec<ArrayRef> = b
            .columns()
            .iter()
            .map(|c| match c.data_type() {
                DataType::Float32 | DataType::Float64 | DataType::Decimal128(..) => {
                    let f = cast(c, &DataType::Float64).unwrap();
                    let f = f.as_any().downcast_ref::<Float64Array>().unwrap();
                    Arc::new(datafusion::arrow::array::StringArray::from_iter(
                        f.iter().map(|v| v.map(|v| format!("{v:.8e}"))),
                    )) as ArrayRef
                }
                _ => Arc::clone(c),
            })
            .collect();
        let fmt: Vec<ArrayFormatter> = columns
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &FormatOptions::default()).unwrap())
            .collect();
        for i in 0..b.num_rows() {
            out.push(
                fmt.iter()
                    .map(|f| f.value(i).to_string())
                    .collect::<Vec<_>>()
                    .join(" | "),
            );
        }
    }
    out.sort();
    out
}

/// The query run as a stream to its end (availableNow) into a memory table; update-mode
/// queries in complete mode, whose last batch is the whole result. Returns the rows and the
/// final watermark (ms).
async fn streamed(query: &NexmarkQuery) -> (Vec<RecordBatch>, i64) {
    let session = WeirSession::with_config(SessionConfig::new().with_target_partitions(2));
    register_streams(&session, &streams()).unwrap();
    let ck = tempfile::tempdir().unwrap();
    let mode = match query.output_mode() {
        "update" => "complete",
        m => m,
    };
    let sql = format!(
        "CREATE STREAMING TABLE out_{} USING memory OPTIONS (outputMode '{mode}', \
         trigger 'availableNow', checkpointLocation '{}') AS {}",
        query.name,
        ck.path().display(),
        query.select()
    );
    let StatementResult::Query(q) = session.sql(&sql).await.unwrap() else {
        panic!("{}: expected a streaming query", query.name)
    };
    q.await_termination().await.unwrap();
    let watermark = q
        .last_progress()
        .and_then(|p| p.event_time.get("watermark").cloned())
        .map(|w| {
            chrono::DateTime::parse_from_rfc3339(&w)
                .unwrap()
                .timestamp_millis()
        })
        .unwrap_or(0);
    let columns = query.compare().unwrap_or("*");
    let group = query
        .totals_by()
        .map(|by| format!(" GROUP BY {by}"))
        .unwrap_or_default();
    let out = session
        .context()
        .sql(&format!("SELECT {columns} FROM out_{}{group}", query.name))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    (out, watermark)
}

/// The query's batch SQL over tables of the same events, keeping what a run that ended at
/// `watermark_ms` has emitted (windows closed).
async fn batch(session: &WeirSession, query: &NexmarkQuery, watermark_ms: i64) -> Vec<RecordBatch> {
    let ctx = session.context();
    let mut sql = query.batch_sql();
    if let Some(predicate) = query.final_rows() {
        let wm = chrono::DateTime::from_timestamp_millis(watermark_ms)
            .unwrap()
            .naive_utc()
            .format("%Y-%m-%d %H:%M:%S%.3f");
        let predicate = predicate.replace(":watermark", &format!("TIMESTAMP '{wm}'"));
        sql = format!("SELECT * FROM ({sql}) AS q WHERE {predicate}");
    }
    if let Some(columns) = query.compare() {
        sql = format!("SELECT {columns} FROM ({sql}) AS c");
    }
    if let Some(by) = query.totals_by() {
        sql = format!("{sql} GROUP BY {by}");
    }
    ctx.sql(&sql)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}\n{sql}", query.name))
        .collect()
        .await
        .unwrap()
}

/// Every query weir runs, streamed in micro-batches of 40,000 events over 2 partitions, equals
/// batch SQL over all the events at once; queries weir cannot run say why in their file.
#[tokio::test]
async fn every_runnable_query_equals_batch_sql_over_the_same_events() {
    // Batch SQL reads tables of every event; q13's side input as the streams' registration
    // makes it.
    let tables = WeirSession::new();
    register_streams(&tables, &streams()).unwrap();
    for table in [Table::Person, Table::Auction, Table::Bid] {
        let batches = generate_table(&streams(), table).await.unwrap();
        let mem = MemTable::try_new(table.schema(), vec![batches]).unwrap();
        tables
            .context()
            .register_table(table.name(), Arc::new(mem))
            .unwrap();
    }
    let mut checked = vec![];
    let mut failed = vec![];
    for query in QUERIES {
        if query.unsupported().is_some() {
            continue;
        }
        let (out, watermark) = streamed(query).await;
        let expected = batch(&tables, query, watermark).await;
        let (got, want) = (rows(&out), rows(&expected));
        if want.is_empty() {
            failed.push(format!("{}: batch SQL returned no rows", query.name));
        } else if got != want {
            let missing: Vec<&String> = want.iter().filter(|r| !got.contains(r)).take(3).collect();
            let extra: Vec<&String> = got.iter().filter(|r| !want.contains(r)).take(3).collect();
            failed.push(format!(
                "{}: {} rows streamed, {} from batch SQL; missing {missing:?}, extra {extra:?}",
                query.name,
                got.len(),
                want.len()
            ));
        }
        checked.push(query.name);
    }
    assert!(failed.is_empty(), "{failed:#?}");
    assert!(checked.len() >= 22, "{checked:?}");
}

/// The real `weir` binary writes the generated bids to a Parquet sink and is killed with
/// SIGKILL at every stage of the loop in turn; restarted each time, the sink ends up holding
/// every bid of the first 20,000 events exactly once: a replayed batch generated the same bids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_stage_the_sink_holds_every_generated_bid_once() {
    let dir = tempfile::tempdir().unwrap();
    let (out, ck) = (dir.path().join("out"), dir.path().join("ck"));
    let (out, ck) = (out.to_str().unwrap(), ck.to_str().unwrap());
    let sql = format!(
        "CREATE STREAMING TABLE bids USING parquet LOCATION '{out}' AS \
         SELECT auction, bidder, price, channel, date_time, extra FROM STREAM nexmark(table => 'bid', \
         numEvents => 20000, maxEventsPerTrigger => 2000, numPartitions => 2, firstEventRate => 10000)"
    );
    let stages = [
        "after_wal",
        "after_get_batch",
        "sink_mid",
        "after_sink",
        "after_commit",
    ];
    for (i, stage) in stages.iter().enumerate() {
        crate::support::run_and_kill_at(&sql, ck, stage, i as u64 + 1);
    }
    let (ok, _, err) = crate::support::weir(&[
        "run",
        "-e",
        &sql,
        "--checkpoint",
        ck,
        "--trigger",
        "availableNow",
    ]);
    assert!(ok, "{err}");

    let session = WeirSession::new();
    session
        .context()
        .sql(&format!(
            "CREATE EXTERNAL TABLE got STORED AS PARQUET LOCATION '{out}'"
        ))
        .await
        .unwrap();
    let got = crate::support::text_rows(
        &session,
        "SELECT auction, bidder, price, channel, date_time, extra FROM got",
    )
    .await;
    let all = NexmarkStreams {
        events: 20_000,
        events_per_batch: 2_000,
        partitions: 1,
        rate: 10_000,
        files: None,
    };
    let bids = generate_table(&all, Table::Bid).await.unwrap();
    let mem = MemTable::try_new(Table::Bid.schema(), vec![bids]).unwrap();
    session
        .context()
        .register_table("want", Arc::new(mem))
        .unwrap();
    let want = crate::support::text_rows(
        &session,
        "SELECT auction, bidder, price, channel, date_time, extra FROM want",
    )
    .await;
    assert_eq!(want.len(), 18_400);
    let (mut got, mut want) = (got, want);
    got.sort();
    want.sort();
    assert_eq!(got.len(), want.len(), "bids in the sink");
    assert!(
        got == want,
        "the sink holds other bids than the generator's"
    );
}
