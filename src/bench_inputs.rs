//! Inputs of the `kafka` and `files` bench workloads, prepared before anything is measured: a
//! topic filled with records (on a given broker, or on a Tansu broker started here), and a
//! folder of Parquet files.

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use crate::bench::BenchConfig;
use crate::{Error, Result};

/// Writes `files` Parquet files of `rows` rows each into `dir`: `id` (unique), `k` (id % 1000)
/// and `v`, modification times in file order.
pub(crate) fn parquet_files(dir: &Path, files: u64, rows: u64) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Internal(format!("bench input: {e}")))?;
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Float64, false),
    ]));
    let now = std::time::SystemTime::now();
    for f in 0..files {
        let ids: Vec<i64> = (f * rows..(f + 1) * rows).map(|i| i as i64).collect();
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter_values(ids.iter().copied())),
                Arc::new(Int64Array::from_iter_values(ids.iter().map(|i| i % 1000))),
                Arc::new(Float64Array::from_iter_values(
                    ids.iter().map(|i| *i as f64 * 0.5),
                )),
            ],
        )
        .map_err(|e| Error::Internal(format!("bench input: {e}")))?;
        let path = dir.join(format!("part-{f:06}.parquet"));
        let io = |e: &dyn std::fmt::Display| Error::Internal(format!("bench input: {e}"));
        let file = std::fs::File::create(&path).map_err(|e| io(&e))?;
        let mut w = parquet::arrow::ArrowWriter::try_new(file, Arc::clone(&schema), None)
            .map_err(|e| io(&e))?;
        w.write(&batch).map_err(|e| io(&e))?;
        w.close().map_err(|e| io(&e))?;
        // Oldest first, one second apart: the source reads them in this order.
        let f_handle = std::fs::File::options()
            .write(true)
            .open(&path)
            .map_err(|e| io(&e))?;
        f_handle
            .set_modified(now - std::time::Duration::from_secs(files - f))
            .map_err(|e| io(&e))?;
    }
    Ok(())
}

/// A Tansu broker started for one bench run; stopped when dropped.
pub(crate) struct Tansu(std::process::Child);

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(feature = "kafka")]
pub(crate) async fn kafka(cfg: &BenchConfig, total: u64) -> Result<super::bench::InputKafka> {
    use std::time::{Duration, Instant};

    use rdkafka::ClientConfig;
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

    let (servers, broker) = match &cfg.bootstrap_servers {
        Some(s) => (s.clone(), None),
        None => {
            let tansu = std::env::var("WEIR_TANSU").map_err(|_| {
                Error::user(
                    "BENCH_NEEDS_KAFKA",
                    "42601",
                    "The kafka workload needs a broker: give --bootstrap-servers host:port, or \
                     set WEIR_TANSU to a Tansu binary (source scripts/test-servers) to start one \
                     on loopback.",
                )
            })?;
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| Error::Internal(format!("no free port: {e}")))?
                .port();
            let url = format!("tcp://127.0.0.1:{port}");
            let child = std::process::Command::new(&tansu)
                .args([
                    "broker",
                    "--listener-url",
                    &url,
                    "--advertised-listener-url",
                    &url,
                ])
                .args(["--storage-engine", "memory://tansu/"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| Error::Internal(format!("cannot start {tansu}: {e}")))?;
            let guard = Tansu(child);
            let started = Instant::now();
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                if started.elapsed() > Duration::from_secs(30) {
                    return Err(Error::Internal("Tansu did not come up".into()));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (format!("127.0.0.1:{port}"), Some(guard))
        }
    };
    let kafka = |e: rdkafka::error::KafkaError| Error::Internal(format!("bench input: {e}"));
    let topic = format!("weir-bench-{}", uuid::Uuid::new_v4());
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &servers)
        .create()
        .map_err(kafka)?;
    let partitions = cfg.partitions.max(1) as i32;
    admin
        .create_topics(
            &[NewTopic::new(
                &topic,
                partitions,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        )
        .await
        .map_err(kafka)?
        .into_iter()
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|(t, e)| Error::Internal(format!("cannot create {t}: {e}")))?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &servers)
        .set("linger.ms", "5")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .map_err(kafka)?;
    // 100-byte values, keys spread over the partitions.
    let value = [b'x'; 100];
    let mut pending = Vec::with_capacity(100_000);
    for i in 0..total {
        let key = i.to_string();
        let record = FutureRecord::to(&topic)
            .key(key.as_bytes())
            .payload(&value[..])
            .partition((i % partitions as u64) as i32);
        match producer.send_result(record) {
            Ok(f) => pending.push(f),
            Err((e, _)) => return Err(kafka(e)),
        }
        if pending.len() >= 100_000 {
            for f in pending.drain(..) {
                f.await
                    .map_err(|_| Error::Internal("delivery report dropped".into()))?
                    .map_err(|(e, _)| kafka(e))?;
            }
        }
    }
    for f in pending {
        f.await
            .map_err(|_| Error::Internal("delivery report dropped".into()))?
            .map_err(|(e, _)| kafka(e))?;
    }
    producer.flush(Duration::from_secs(30)).map_err(kafka)?;
    // Tansu 0.6 reports a partition's end as its last record batch's base offset + 1: one
    // record per partition on its own makes every record before it visible. (A real broker
    // needs nothing; the extra records are a few among millions.)
    for p in 0..partitions {
        producer
            .send(
                FutureRecord::<[u8], [u8]>::to(&topic)
                    .payload(&value[..])
                    .partition(p),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| kafka(e))?;
    }
    let baseline_rows_per_sec = {
        let (servers, topic) = (servers.clone(), topic.clone());
        tokio::task::spawn_blocking(move || consume_all(&servers, &topic, partitions))
            .await
            .map_err(|e| Error::Internal(format!("baseline consumer: {e}")))??
    };
    Ok(super::bench::InputKafka {
        servers,
        topic,
        baseline_rows_per_sec,
        broker,
    })
}

/// Reads every partition of `topic` from its start to its end with one bare consumer, as weir's
/// source does (assigned, not subscribed); returns records per second.
#[cfg(feature = "kafka")]
fn consume_all(servers: &str, topic: &str, partitions: i32) -> Result<f64> {
    use std::time::{Duration, Instant};

    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

    let kafka = |e: rdkafka::error::KafkaError| Error::Internal(format!("baseline: {e}"));
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("group.id", "weir-bench-baseline")
        .set("enable.auto.commit", "false")
        .create()
        .map_err(kafka)?;
    let mut tpl = TopicPartitionList::new();
    let mut ends = std::collections::HashMap::new();
    for p in 0..partitions {
        let (low, high) = c
            .fetch_watermarks(topic, p, Duration::from_secs(30))
            .map_err(kafka)?;
        tpl.add_partition_offset(topic, p, Offset::Offset(low))
            .map_err(kafka)?;
        ends.insert(p, high);
    }
    c.assign(&tpl).map_err(kafka)?;
    let started = Instant::now();
    let mut n = 0u64;
    let mut bytes = 0usize;
    while !ends.is_empty() {
        if started.elapsed() > Duration::from_secs(600) {
            return Err(Error::Internal("baseline consumer: timed out".into()));
        }
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m.map_err(kafka)?;
            n += 1;
            bytes += m.payload().map_or(0, <[u8]>::len) + m.key().map_or(0, <[u8]>::len);
            if ends
                .get(&m.partition())
                .is_some_and(|e| m.offset() >= e - 1)
            {
                ends.remove(&m.partition());
            }
        }
    }
    std::hint::black_box(bytes);
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

#[cfg(not(feature = "kafka"))]
pub(crate) async fn kafka(_cfg: &BenchConfig, _total: u64) -> Result<super::bench::InputKafka> {
    Err(Error::user(
        "BENCH_NEEDS_KAFKA",
        "0A000",
        "This weir was built without the kafka feature.",
    ))
}
