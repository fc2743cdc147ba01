//! Reading offset ranges of Kafka partitions into Arrow batches.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{
    ArrayRef, BinaryBuilder, Int32Builder, Int64Builder, ListBuilder, RecordBatch, StringBuilder,
    StructBuilder, TimestampMicrosecondBuilder,
};
use arrow::datatypes::{DataType, SchemaRef};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message, Timestamp};
use rdkafka::topic_partition_list::{Offset as KafkaOffset, TopicPartitionList};
use weir_common::ClassifiedError;

use super::client_error;
use crate::{Error, Partitions, Result};

const BATCH_ROWS: usize = 8192;

/// Offsets `[start, end)` of one partition.
#[derive(Debug, Clone)]
pub struct Range {
    pub topic: String,
    pub partition: i32,
    pub start: i64,
    pub end: i64,
}

/// The columns of one partition's rows being built.
struct Columns {
    schema: SchemaRef,
    key: BinaryBuilder,
    value: BinaryBuilder,
    topic: StringBuilder,
    partition: Int32Builder,
    offset: Int64Builder,
    timestamp: TimestampMicrosecondBuilder,
    timestamp_type: Int32Builder,
    headers: Option<ListBuilder<StructBuilder>>,
    rows: usize,
    done: Vec<RecordBatch>,
}

impl Columns {
    fn new(schema: &SchemaRef) -> Self {
        let headers = schema
            .field_with_name("headers")
            .ok()
            .map(|f| match f.data_type() {
                DataType::List(item) => match item.data_type() {
                    DataType::Struct(fields) => {
                        ListBuilder::new(StructBuilder::from_fields(fields.clone(), 0))
                            .with_field(Arc::clone(item))
                    }
                    _ => unreachable!("the headers column is a list of structs"),
                },
                _ => unreachable!("the headers column is a list"),
            });
        Self {
            schema: Arc::clone(schema),
            key: BinaryBuilder::new(),
            value: BinaryBuilder::new(),
            topic: StringBuilder::new(),
            partition: Int32Builder::new(),
            offset: Int64Builder::new(),
            timestamp: TimestampMicrosecondBuilder::new().with_timezone("UTC"),
            timestamp_type: Int32Builder::new(),
            headers,
            rows: 0,
            done: vec![],
        }
    }

    fn push<M: Message>(&mut self, m: &M) {
        self.key.append_option(m.key());
        self.value.append_option(m.payload());
        self.topic.append_value(m.topic());
        self.partition.append_value(m.partition());
        self.offset.append_value(m.offset());
        let (ts, kind) = match m.timestamp() {
            Timestamp::NotAvailable => (-1, -1),
            Timestamp::CreateTime(t) => (t, 0),
            Timestamp::LogAppendTime(t) => (t, 1),
        };
        self.timestamp.append_value(ts.saturating_mul(1000));
        self.timestamp_type.append_value(kind);
        if let Some(h) = &mut self.headers {
            if let Some(headers) = m.headers() {
                for header in headers.iter() {
                    let s = h.values();
                    if let Some(b) = s.field_builder::<StringBuilder>(0) {
                        b.append_value(header.key);
                    }
                    if let Some(b) = s.field_builder::<BinaryBuilder>(1) {
                        b.append_option(header.value);
                    }
                    s.append(true);
                }
                h.append(true);
            } else {
                h.append(true);
            }
        }
        self.rows += 1;
    }

    fn flush(&mut self) -> Result<()> {
        if self.rows == 0 {
            return Ok(());
        }
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(self.key.finish()),
            Arc::new(self.value.finish()),
            Arc::new(self.topic.finish()),
            Arc::new(self.partition.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(self.timestamp.finish()),
            Arc::new(self.timestamp_type.finish()),
        ];
        if let Some(h) = &mut self.headers {
            columns.push(Arc::new(h.finish()));
        }
        self.done
            .push(RecordBatch::try_new(Arc::clone(&self.schema), columns)?);
        self.rows = 0;
        Ok(())
    }
}

/// Reads every range with `consumer` (assigned, not subscribed): one Arrow partition each.
pub fn read(
    consumer: &BaseConsumer,
    schema: &SchemaRef,
    ranges: &[Range],
    timeout: Duration,
) -> Result<Partitions> {
    if ranges.is_empty() {
        return Ok(vec![]);
    }
    let mut tpl = TopicPartitionList::with_capacity(ranges.len());
    for r in ranges {
        tpl.add_partition_offset(&r.topic, r.partition, KafkaOffset::Offset(r.start))
            .map_err(|e| client_error("build a partition list", &e))?;
    }
    // Partitions stay assigned (and paused) between batches: when every range's partition is
    // assigned already, seek where the consumer is not at the range's start and resume, which
    // keeps librdkafka's connections and fetch state warm. Otherwise assign afresh.
    let assigned = consumer.assignment().ok();
    let all_assigned = assigned.as_ref().is_some_and(|a| {
        ranges
            .iter()
            .all(|r| a.find_partition(&r.topic, r.partition).is_some())
    });
    if all_assigned {
        let positions = consumer
            .position()
            .map_err(|e| client_error("read the consumer's positions", &e))?;
        for r in ranges {
            let at = positions
                .find_partition(&r.topic, r.partition)
                .map(|e| e.offset());
            if at != Some(KafkaOffset::Offset(r.start)) {
                consumer
                    .seek(
                        &r.topic,
                        r.partition,
                        KafkaOffset::Offset(r.start),
                        Duration::from_secs(10),
                    )
                    .map_err(|e| client_error("seek to the batch's start", &e))?;
            }
        }
    } else {
        consumer
            .assign(&tpl)
            .map_err(|e| client_error("assign the batch's partitions", &e))?;
    }
    // Partitions paused when an earlier batch reached their end stay paused until resumed.
    consumer
        .resume(&tpl)
        .map_err(|e| client_error("resume the batch's partitions", &e))?;
    // librdkafka's broker thread, idle while every partition was paused, notices a resume only
    // at its next wake-up (up to a second later); a request to the broker wakes it now.
    if let Some(r) = ranges.first() {
        let _ = consumer.fetch_watermarks(&r.topic, r.partition, Duration::from_secs(5));
    }
    let result = poll_all(consumer, schema, ranges, timeout);
    if result.is_err() {
        // After a failure, start the next batch from a clean assignment.
        let _ = consumer.unassign();
    }
    result
}

fn poll_all(
    consumer: &BaseConsumer,
    schema: &SchemaRef,
    ranges: &[Range],
    timeout: Duration,
) -> Result<Partitions> {
    let index: HashMap<(&str, i32), usize> = ranges
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.topic.as_str(), r.partition), i))
        .collect();
    let mut columns: Vec<Columns> = ranges.iter().map(|_| Columns::new(schema)).collect();
    let mut open: Vec<bool> = vec![true; ranges.len()];
    let mut left = ranges.len();
    let deadline = Instant::now() + timeout;
    while left > 0 {
        if Instant::now() > deadline {
            let waiting: Vec<String> = ranges
                .iter()
                .zip(&open)
                .filter(|(_, o)| **o)
                .map(|(r, _)| format!("{}-{} [{}, {})", r.topic, r.partition, r.start, r.end))
                .collect();
            return Err(Error::User(ClassifiedError::new(
                "KAFKA_FETCH_TIMEOUT",
                "08000",
                format!(
                    "Kafka did not return the records of {} within {} ms. Check the broker, or \
                     raise the source option kafkaConsumer.pollTimeoutMs.",
                    waiting.join(", "),
                    timeout.as_millis()
                ),
            )));
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let Some(&i) = index.get(&(m.topic(), m.partition())) else {
                    continue;
                };
                let r = &ranges[i];
                if !open[i] || m.offset() < r.start {
                    continue;
                }
                if m.offset() < r.end {
                    columns[i].push(&m);
                    if columns[i].rows >= BATCH_ROWS {
                        columns[i].flush()?;
                    }
                }
                if m.offset() >= r.end - 1 {
                    open[i] = false;
                    left -= 1;
                    pause(consumer, r);
                }
            }
            Some(Err(e)) => return Err(client_error("read records", &e)),
            None => {
                // Gaps (compaction, transaction markers) may end a range without a record at
                // end - 1: the consumer's position tells.
                if let Ok(positions) = consumer.position() {
                    for e in positions.elements() {
                        if let (Some(&i), KafkaOffset::Offset(pos)) =
                            (index.get(&(e.topic(), e.partition())), e.offset())
                            && open[i]
                            && pos >= ranges[i].end
                        {
                            open[i] = false;
                            left -= 1;
                            pause(consumer, &ranges[i]);
                        }
                    }
                }
            }
        }
    }
    columns
        .into_iter()
        .map(|mut c| {
            c.flush()?;
            Ok(c.done)
        })
        .collect()
}

fn pause(consumer: &BaseConsumer, r: &Range) {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&r.topic, r.partition);
    let _ = consumer.pause(&tpl);
}
