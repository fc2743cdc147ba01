//! The micro-batch loop's fixed costs per batch, each beside a baseline measured in the same run:
//! the offsets-log (WAL) write and the commit write against a bare create-new file write of the
//! same size, and building + serializing a progress record against serializing an empty JSON
//! object.
//!
//! `cargo bench --bench loop_costs`

#![expect(
    clippy::unwrap_used,
    reason = "a benchmark stops on any unexpected error"
)]
#![allow(
    missing_docs,
    reason = "criterion_group! generates undocumented public items"
)]

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use weir::Location;
use weir::checkpoint::{BatchMetadata, CommitEntry, OffsetEntry, SourceRange};
use weir::{Checkpoint, Offset, SinkProgress, SourceProgress, StreamingQueryProgress};

fn offset_entry(batch: i64) -> OffsetEntry {
    let mut conf = BTreeMap::new();
    conf.insert("weir.sql.shuffle.partitions".to_string(), "2".to_string());
    OffsetEntry {
        metadata: BatchMetadata {
            batch_watermark_ms: 0,
            batch_timestamp_ms: 1_764_000_000_000 + batch,
            conf,
        },
        sources: vec![SourceRange {
            start: Offset(serde_json::json!({"offset": batch * 1000, "timestamp": batch * 1000})),
            end: Offset(
                serde_json::json!({"offset": (batch + 1) * 1000, "timestamp": (batch + 1) * 1000}),
            ),
            source: Some("rate-micro-batch".into()),
            name: None,
        }],
    }
}

fn bench_log_writes(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = rt
        .block_on(Checkpoint::open(
            Location::local(&dir.path().join("ck")).unwrap(),
            false,
        ))
        .unwrap();
    let raw_dir = dir.path().join("raw");
    std::fs::create_dir_all(&raw_dir).unwrap();
    let wal_bytes = format!(
        "v1\n{}\n{{\"start\":{{\"offset\":0,\"timestamp\":0}},\"end\":{{\"offset\":1000,\"timestamp\":1000}}}}",
        serde_json::json!({"batchWatermarkMs":0,"batchTimestampMs":1_764_000_000_000i64,"conf":{"weir.sql.shuffle.partitions":"2"}})
    );
    let next = AtomicU64::new(0);

    let mut g = c.benchmark_group("log_write");
    g.bench_function("baseline: create-new file write, same size", |b| {
        b.iter(|| {
            let n = next.fetch_add(1, Ordering::Relaxed);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(raw_dir.join(n.to_string()))
                .unwrap();
            f.write_all(wal_bytes.as_bytes()).unwrap();
        })
    });
    g.bench_function("offsets/N (WAL) write", |b| {
        b.iter(|| {
            let n = next.fetch_add(1, Ordering::Relaxed);
            rt.block_on(checkpoint.write_offsets(n, &offset_entry(n as i64)))
                .unwrap();
        })
    });
    g.bench_function("commits/N write", |b| {
        b.iter(|| {
            let n = next.fetch_add(1, Ordering::Relaxed);
            rt.block_on(checkpoint.write_commit(
                n,
                &CommitEntry {
                    next_batch_watermark_ms: 0,
                },
            ))
            .unwrap();
        })
    });
    g.finish();
}

fn progress(batch: u64) -> StreamingQueryProgress {
    let mut duration_ms = BTreeMap::new();
    for (k, v) in [
        ("latestOffset", 0),
        ("walCommit", 1),
        ("getBatch", 0),
        ("queryPlanning", 2),
        ("addBatch", 30),
        ("commitOffsets", 1),
        ("triggerExecution", 35),
    ] {
        duration_ms.insert(k.to_string(), v);
    }
    StreamingQueryProgress {
        id: uuid::Uuid::nil(),
        run_id: uuid::Uuid::nil(),
        name: Some("bench".into()),
        timestamp: weir::format_timestamp(1_764_000_000_000),
        batch_id: batch,
        batch_duration: 35,
        num_input_rows: 1_000_000,
        input_rows_per_second: 28_571_428.5,
        processed_rows_per_second: 28_571_428.5,
        duration_ms,
        event_time: Default::default(),
        state_operators: vec![],
        sources: vec![SourceProgress {
            description: "RatePerMicroBatchStream[rowsPerBatch=1000000, numPartitions=2, startTimestamp=0, advanceMsPerBatch=1000]".into(),
            start_offset: Some(serde_json::json!({"offset": 0, "timestamp": 0})),
            end_offset: Some(serde_json::json!({"offset": 1_000_000, "timestamp": 1000})),
            latest_offset: Some(serde_json::json!({"offset": 1_000_000, "timestamp": 1000})),
            num_input_rows: 1_000_000,
            input_rows_per_second: 28_571_428.5,
            processed_rows_per_second: 28_571_428.5,
        }],
        sink: SinkProgress {
            description: "NoopSink".into(),
            num_output_rows: 500_000,
            metrics: Default::default(),
        },
    }
}

fn bench_progress(c: &mut Criterion) {
    let mut g = c.benchmark_group("progress");
    g.bench_function("baseline: serialize an empty JSON object", |b| {
        b.iter(|| serde_json::json!({}).to_string())
    });
    g.bench_function("build + serialize a progress record", |b| {
        let mut n = 0;
        b.iter(|| {
            n += 1;
            progress(n).json()
        })
    });
    g.finish();
}

criterion_group!(benches, bench_log_writes, bench_progress);
criterion_main!(benches);
