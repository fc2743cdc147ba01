//! The seed's listener tutorial as a program: a listener buffers every batch's health record
//! (never doing I/O on the listener's thread), and a writer appends the buffered records to a
//! Delta table every 10 seconds, through a memory stream and a streaming query into Delta (so
//! the table gets each record exactly once, also across restarts of the writer's query).
//!
//! ```text
//! cargo run --release --example health_to_delta -- /tmp/health [seconds to run, 25] [flush every, 10]
//! ```
//!
//! weir has the same health built in: `SELECT * FROM streaming_health('<query>')`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir::{
    HealthRecord, MemoryStream, QueryProgressEvent, StreamingQueryListener, Trigger, WeirSession,
};

/// Keeps each batch's health record until the writer takes them.
#[derive(Default)]
struct HealthBuffer(Mutex<Vec<HealthRecord>>);

impl StreamingQueryListener for HealthBuffer {
    fn on_query_progress(&self, e: &QueryProgressEvent) {
        // The watched query only; the writer's own query reports progress too.
        if e.progress.name.as_deref() == Some("clicks")
            && let Ok(mut b) = self.0.lock()
        {
            b.push(HealthRecord::of(&e.progress));
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = args.next().unwrap_or_else(|| "/tmp/health".into());
    let seconds: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(25);
    let every: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);

    let session = WeirSession::new();
    let buffer = Arc::new(HealthBuffer::default());
    session.streams().add_listener(Arc::clone(&buffer) as _);

    // The query being watched.
    let clicks = session
        .sql(
            "CREATE STREAMING TABLE clicks USING noop OPTIONS (trigger '1 second', outputMode 'update') AS \
             SELECT value % 10 AS page, count(*) AS n \
             FROM STREAM rate(rowsPerSecond => 1000) GROUP BY value % 10",
        )
        .await?;
    let weir::StatementResult::Query(clicks) = clicks else {
        return Err("the watched query did not start".into());
    };

    // The writer: buffered records into a memory stream, which a query writes to Delta.
    let health = MemoryStream::new("health", HealthRecord::schema());
    session.register_memory_stream(&health);
    let plan = session.plan_sql("SELECT * FROM STREAM(health)").await?;
    let df = weir::datafusion::dataframe::DataFrame::new(session.context().state(), plan);
    let writer = session
        .write_stream(df)
        .format("delta")
        .option("path", &out)
        .checkpoint_location(format!("{out}/_checkpoint"))
        .trigger(Trigger::ProcessingTime(Duration::from_secs(every)))
        .start()
        .await?;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    let mut ticks = tokio::time::interval(Duration::from_secs(every));
    ticks.tick().await;
    while tokio::time::Instant::now() < deadline {
        ticks.tick().await;
        let taken: Vec<HealthRecord> = buffer
            .0
            .lock()
            .map(|mut b| std::mem::take(&mut *b))
            .unwrap_or_default();
        if !taken.is_empty() {
            health.push(HealthRecord::batch(&taken)?)?;
            println!("buffered {} health record(s) for the table", taken.len());
        }
    }
    clicks.stop().await;
    writer.process_all_available().await?;
    writer.stop().await;

    session
        .sql(&format!(
            "CREATE EXTERNAL TABLE written STORED AS DELTA LOCATION '{out}'"
        ))
        .await?;
    let summary = session
        .sql(
            "SELECT count(*) AS records, max(\"batchId\") AS last_batch, \
             count(*) FILTER (WHERE \"fallingBehind\") AS behind FROM written",
        )
        .await?;
    if let weir::StatementResult::Rows(batches) = summary {
        println!(
            "{}",
            weir::datafusion::arrow::util::pretty::pretty_format_batches(&batches)?
        );
    }
    Ok(())
}
