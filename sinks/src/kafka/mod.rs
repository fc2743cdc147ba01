//! The Kafka sink (`format("kafka")`, `USING kafka`), as Spark's: each row of the output becomes
//! a record of its `value` column, with its `key`, `headers` and `partition` when those columns
//! exist, sent to the `topic` option or the row's `topic` column.
//!
//! Delivery is at-least-once by default, as Spark's: a batch replayed after a crash is sent
//! again. With `deliveryGuarantee 'exactlyOnce'` (beyond Spark) each batch is one Kafka
//! transaction whose transactional id is the query's id, so a restarted run fences any producer
//! of an earlier one, and the transaction also writes a marker record (query id → batch id) to a
//! marker topic; a replayed batch whose marker is committed is skipped. Readers see whole
//! batches with `isolation.level=read_committed`.
//!
//! ```text
//! open:      (exactly-once) init the transactional producer (fences the old one); read the
//!            marker topic (read_committed) for this query's last committed batch
//! add_batch: rows -> records (queued; when librdkafka's queue is full, wait for deliveries)
//!            at-least-once: wait for every delivery report
//!            exactly-once: begin, records + marker, commit (abort on any error)
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::{Array, AsArray, BinaryArray, Int32Array, ListArray, StringArray, StructArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::topic_partition_list::{Offset as KafkaOffset, TopicPartitionList};
use weir_common::{ClassifiedError, Options};

use crate::{Error, OutputMode, Result, Sink};

/// How the sink delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Every record at least once (Spark's guarantee).
    AtLeastOnce,
    /// Every batch once, as a Kafka transaction.
    ExactlyOnce,
}

/// The typed options of a Kafka sink.
#[derive(Debug, Clone)]
pub struct KafkaSinkOptions {
    /// `kafka.bootstrap.servers`.
    pub bootstrap_servers: String,
    /// The topic of every record (overrides a `topic` column).
    pub topic: Option<String>,
    /// `deliveryGuarantee`.
    pub delivery: Delivery,
    /// The topic of exactly-once markers.
    pub marker_topic: String,
    /// How long a batch may wait for delivery or a transaction's commit.
    pub timeout: Duration,
    /// Other `kafka.*` options, passed to librdkafka without the prefix.
    pub client: Vec<(String, String)>,
}

const ACCEPTED: &[&str] = &[
    "path",
    "topic",
    "deliveryGuarantee",
    "transactionMarkerTopic",
    "kafka.timeoutMs",
    "kafka.<librdkafka option>",
];

fn invalid(message: String) -> Error {
    Error::User(ClassifiedError::invalid_option(message))
}

impl KafkaSinkOptions {
    /// Reads the sink's options.
    pub fn try_new(options: &Options) -> Result<Self> {
        let (client, own) = options.split_prefixed("kafka.");
        let r = own.reader("kafka sink", ACCEPTED);
        r.check_known()?;
        let mut bootstrap = None;
        let mut timeout = Duration::from_secs(60);
        let mut rest = vec![];
        for (k, v) in client {
            let key = &k["kafka.".len()..];
            if key.eq_ignore_ascii_case("bootstrap.servers") {
                bootstrap = Some(v);
            } else if key.eq_ignore_ascii_case("timeoutMs") {
                timeout = Duration::from_millis(v.trim().parse().map_err(|_| {
                    invalid(format!(
                        "Option '{k}' of the kafka sink must be milliseconds, not '{v}'."
                    ))
                })?);
            } else if key.eq_ignore_ascii_case("transactional.id") {
                return Err(invalid(
                    "Option 'kafka.transactional.id' of the kafka sink is set by weir: with \
                     deliveryGuarantee 'exactlyOnce' it is the query's id."
                        .into(),
                ));
            } else {
                rest.push((key.to_string(), v));
            }
        }
        let delivery = match own
            .get("deliveryGuarantee")
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("atleastonce") | Some("at-least-once") => Delivery::AtLeastOnce,
            Some("exactlyonce") | Some("exactly-once") => Delivery::ExactlyOnce,
            Some(other) => {
                return Err(invalid(format!(
                    "Invalid value '{other}' for option 'deliveryGuarantee' of the kafka sink: \
                     expected atLeastOnce or exactlyOnce."
                )));
            }
        };
        Ok(Self {
            bootstrap_servers: bootstrap.ok_or_else(|| {
                invalid(
                    "The kafka sink needs option 'kafka.bootstrap.servers', e.g. \
                     'localhost:9092'."
                        .into(),
                )
            })?,
            topic: r.string("topic").or_else(|| r.string("path")),
            delivery,
            marker_topic: r
                .string("transactionMarkerTopic")
                .unwrap_or_else(|| "_weir_sink_batches".into()),
            timeout,
            client: rest,
        })
    }

    fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap_servers);
        for (k, v) in &self.client {
            c.set(k, v);
        }
        c
    }
}

/// Where each record field comes from in the output rows.
#[derive(Debug, Clone)]
struct Columns {
    topic: Option<usize>,
    key: Option<usize>,
    value: usize,
    headers: Option<usize>,
    partition: Option<usize>,
}

fn bad_column(message: String) -> Error {
    Error::User(ClassifiedError::new(
        "KAFKA_SINK_INVALID_COLUMNS",
        "42K09",
        message,
    ))
}

fn is_bytes(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
    )
}

impl Columns {
    fn of(schema: &Schema, topic_option: bool) -> Result<Self> {
        let find = |name: &str| schema.index_of(name).ok();
        let value = find("value").ok_or_else(|| {
            bad_column(format!(
                "The kafka sink writes the column 'value', which the query's output \
                 ({}) does not have: alias the column to send AS value.",
                schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        for (name, idx) in [("value", Some(value)), ("key", find("key"))] {
            if let Some(i) = idx
                && !is_bytes(schema.field(i).data_type())
            {
                return Err(bad_column(format!(
                    "The kafka sink's '{name}' column must be a string or binary, not {}: \
                     CAST it, e.g. CAST({name} AS STRING) or to_json(...).",
                    schema.field(i).data_type()
                )));
            }
        }
        let topic = find("topic");
        if let Some(i) = topic
            && !matches!(
                schema.field(i).data_type(),
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            )
        {
            return Err(bad_column(format!(
                "The kafka sink's 'topic' column must be a string, not {}.",
                schema.field(i).data_type()
            )));
        }
        if topic.is_none() && !topic_option {
            return Err(bad_column(
                "The kafka sink needs a topic: set the option 'topic', or give the output a \
                 'topic' column."
                    .into(),
            ));
        }
        let partition = find("partition");
        if let Some(i) = partition
            && schema.field(i).data_type() != &DataType::Int32
        {
            return Err(bad_column(format!(
                "The kafka sink's 'partition' column must be an INT, not {}.",
                schema.field(i).data_type()
            )));
        }
        let headers = find("headers");
        if let Some(i) = headers {
            let ok = match schema.field(i).data_type() {
                DataType::List(item) => match item.data_type() {
                    DataType::Struct(f) => {
                        f.len() == 2
                            && f[0].name() == "key"
                            && f[0].data_type() == &DataType::Utf8
                            && f[1].name() == "value"
                            && f[1].data_type() == &DataType::Binary
                    }
                    _ => false,
                },
                _ => false,
            };
            if !ok {
                return Err(bad_column(format!(
                    "The kafka sink's 'headers' column must be ARRAY<STRUCT<key: STRING, value: \
                     BINARY>>, as the kafka source's, not {}.",
                    schema.field(i).data_type()
                )));
            }
        }
        Ok(Self {
            topic,
            key: find("key"),
            value,
            headers,
            partition,
        })
    }
}

/// The Kafka sink.
pub struct KafkaSink {
    options: KafkaSinkOptions,
    columns: Columns,
    producer: Mutex<Option<Arc<FutureProducer>>>,
    /// Exactly-once: the query id and the last batch whose transaction committed.
    txn: Mutex<Option<(String, Option<u64>)>>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("options", &self.options)
            .finish()
    }
}

fn client_error(what: &str, e: &KafkaError) -> Error {
    Error::User(ClassifiedError::new(
        "KAFKA_CLIENT_ERROR",
        "08000",
        format!(
            "The kafka sink could not {what}: {e}. Check kafka.bootstrap.servers and that the \
             broker is reachable."
        ),
    ))
}

impl KafkaSink {
    /// A Kafka sink for output rows of `schema`.
    pub fn try_new(options: &Options, schema: &SchemaRef) -> Result<Self> {
        let options = KafkaSinkOptions::try_new(options)?;
        let columns = Columns::of(schema, options.topic.is_some())?;
        Ok(Self {
            options,
            columns,
            producer: Mutex::new(None),
            txn: Mutex::new(None),
        })
    }

    fn producer(&self) -> Result<Arc<FutureProducer>> {
        let mut slot = self
            .producer
            .lock()
            .map_err(|_| Error::Corrupt("kafka sink lock poisoned".into()))?;
        if let Some(p) = slot.as_ref() {
            return Ok(Arc::clone(p));
        }
        let mut config = self.options.config();
        if self.options.delivery == Delivery::ExactlyOnce {
            let id = self.query_id()?.ok_or_else(|| {
                Error::Corrupt("the exactly-once kafka sink was not opened with a query id".into())
            })?;
            config.set("transactional.id", format!("weir-{id}"));
        }
        let p: FutureProducer = config
            .create()
            .map_err(|e| client_error("create a producer", &e))?;
        let p = Arc::new(p);
        *slot = Some(Arc::clone(&p));
        Ok(p)
    }

    fn query_id(&self) -> Result<Option<String>> {
        Ok(self
            .txn
            .lock()
            .map_err(|_| Error::Corrupt("kafka sink lock poisoned".into()))?
            .as_ref()
            .map(|(id, _)| id.clone()))
    }

    /// Queues every row of `batches` as a record; returns their delivery futures.
    async fn send_rows(
        &self,
        producer: &FutureProducer,
        batches: &[RecordBatch],
    ) -> Result<Vec<rdkafka::producer::DeliveryFuture>> {
        let mut pending = vec![];
        for batch in batches {
            let bytes = |i: usize| -> Result<BinaryArray> {
                Ok(cast(batch.column(i), &DataType::Binary)?
                    .as_binary::<i32>()
                    .clone())
            };
            let value = bytes(self.columns.value)?;
            let key = self.columns.key.map(bytes).transpose()?;
            let topic = self
                .columns
                .topic
                .map(|i| -> Result<StringArray> {
                    Ok(cast(batch.column(i), &DataType::Utf8)?
                        .as_string::<i32>()
                        .clone())
                })
                .transpose()?;
            let partition: Option<&Int32Array> = self
                .columns
                .partition
                .map(|i| batch.column(i).as_primitive());
            let headers: Option<&ListArray> = self
                .columns
                .headers
                .map(|i| batch.column(i).as_list::<i32>());
            for row in 0..batch.num_rows() {
                let topic_name = match (&self.options.topic, &topic) {
                    (Some(t), _) => t.as_str(),
                    (None, Some(col)) if col.is_valid(row) => col.value(row),
                    _ => {
                        return Err(bad_column(format!(
                            "Row {row} of the batch has a null 'topic' and the kafka sink has \
                             no 'topic' option."
                        )));
                    }
                };
                let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic_name);
                if value.is_valid(row) {
                    record = record.payload(value.value(row));
                }
                if let Some(k) = &key
                    && k.is_valid(row)
                {
                    record = record.key(k.value(row));
                }
                if let Some(p) = partition
                    && p.is_valid(row)
                {
                    record = record.partition(p.value(row));
                }
                if let Some(h) = headers
                    && h.is_valid(row)
                {
                    let entries = h.value(row);
                    let entries: &StructArray = entries.as_struct();
                    let keys = entries.column(0).as_string::<i32>();
                    let values = entries.column(1).as_binary::<i32>();
                    let mut owned = OwnedHeaders::new_with_capacity(entries.len());
                    for j in 0..entries.len() {
                        owned = owned.insert(Header {
                            key: keys.value(j),
                            value: values.is_valid(j).then(|| values.value(j)),
                        });
                    }
                    record = record.headers(owned);
                }
                let mut record = record;
                loop {
                    match producer.send_result(record) {
                        Ok(f) => {
                            pending.push(f);
                            break;
                        }
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                            // librdkafka's queue is full: wait for what is in flight.
                            record = r;
                            wait_all(std::mem::take(&mut pending)).await?;
                        }
                        Err((e, _)) => return Err(client_error("queue a record", &e)),
                    }
                }
            }
        }
        Ok(pending)
    }
}

/// Exactly-once: the last batch the query `query_id` committed to Kafka, from the marker topic.
fn last_committed(options: &KafkaSinkOptions, query_id: &str) -> Result<Option<u64>> {
    let mut c = options.config();
    c.set("group.id", format!("weir-sink-{query_id}"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        // The sink's kafka.* options are meant for its producer: a consumer warns about each
        // producer-only one.
        .set_log_level(rdkafka::config::RDKafkaLogLevel::Error);
    let consumer: BaseConsumer = c
        .create()
        .map_err(|e| client_error("create the marker reader", &e))?;
    let topic = &options.marker_topic;
    let timeout = options.timeout;
    let (low, high) = consumer
        .fetch_watermarks(topic, 0, timeout)
        .map_err(|e| client_error(&format!("read the end of the marker topic '{topic}'"), &e))?;
    if high <= low {
        return Ok(None);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, KafkaOffset::Offset(low))
        .map_err(|e| client_error("build a partition list", &e))?;
    consumer
        .assign(&tpl)
        .map_err(|e| client_error("read the marker topic", &e))?;
    let deadline = std::time::Instant::now() + timeout;
    let mut last = None;
    loop {
        if std::time::Instant::now() > deadline {
            return Err(Error::User(ClassifiedError::new(
                "KAFKA_FETCH_TIMEOUT",
                "08000",
                format!(
                    "The kafka sink could not read its marker topic '{topic}' within {} ms.",
                    timeout.as_millis()
                ),
            )));
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                if m.key() == Some(query_id.as_bytes())
                    && let Some(batch) = m
                        .payload()
                        .and_then(|p| std::str::from_utf8(p).ok())
                        .and_then(|s| s.parse::<u64>().ok())
                {
                    last = Some(last.map_or(batch, |l: u64| l.max(batch)));
                }
                if m.offset() >= high - 1 {
                    return Ok(last);
                }
            }
            Some(Err(e)) => return Err(client_error("read the marker topic", &e)),
            None => {
                // Transaction markers may end the partition without a record at high - 1.
                let done = consumer.position().ok().is_some_and(|p| {
                    p.elements()
                        .iter()
                        .any(|e| matches!(e.offset(), KafkaOffset::Offset(o) if o >= high))
                });
                if done {
                    return Ok(last);
                }
            }
        }
    }
}

impl KafkaSink {
    async fn ensure_marker_topic(&self) -> Result<()> {
        let admin: AdminClient<DefaultClientContext> = self
            .options
            .config()
            .create()
            .map_err(|e| client_error("create an admin client", &e))?;
        let results = admin
            .create_topics(
                &[
                    NewTopic::new(&self.options.marker_topic, 1, TopicReplication::Fixed(1))
                        .set("cleanup.policy", "compact"),
                ],
                &AdminOptions::new().operation_timeout(Some(self.options.timeout)),
            )
            .await
            .map_err(|e| client_error("create the marker topic", &e))?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((t, code)) => {
                    return Err(client_error(
                        &format!("create the marker topic '{t}'"),
                        &KafkaError::AdminOp(code),
                    ));
                }
            }
        }
        Ok(())
    }
}

async fn wait_all(pending: Vec<rdkafka::producer::DeliveryFuture>) -> Result<()> {
    for f in pending {
        match f.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => return Err(client_error("deliver a record", &e)),
            Err(_) => {
                return Err(Error::Corrupt(
                    "the Kafka producer dropped a record's delivery report".into(),
                ));
            }
        }
    }
    Ok(())
}

/// Runs a blocking client call on the blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Corrupt(format!("a Kafka client call failed: {e}")))?
}

#[async_trait]
impl Sink for KafkaSink {
    fn description(&self) -> String {
        format!(
            "KafkaSink[{}{}]",
            self.options
                .topic
                .as_deref()
                .unwrap_or("topic from the 'topic' column"),
            if self.options.delivery == Delivery::ExactlyOnce {
                ", exactly-once"
            } else {
                ""
            }
        )
    }

    fn is_idempotent(&self) -> bool {
        self.options.delivery == Delivery::ExactlyOnce
    }

    fn supported_output_modes(&self) -> &'static [OutputMode] {
        &[OutputMode::Append, OutputMode::Update, OutputMode::Complete]
    }

    async fn open(&self, query_id: &str) -> Result<()> {
        if self.options.delivery != Delivery::ExactlyOnce {
            return Ok(());
        }
        self.ensure_marker_topic().await?;
        *self
            .txn
            .lock()
            .map_err(|_| Error::Corrupt("kafka sink lock poisoned".into()))? =
            Some((query_id.to_string(), None));
        let producer = self.producer()?;
        let timeout = self.options.timeout;
        let p = Arc::clone(&producer);
        // Fences every earlier producer of this query and aborts its open transaction.
        blocking(move || {
            p.init_transactions(timeout)
                .map_err(|e| client_error("start its transactions", &e))
        })
        .await?;
        let (options, id) = (self.options.clone(), query_id.to_string());
        let last = blocking(move || last_committed(&options, &id)).await?;
        *self
            .txn
            .lock()
            .map_err(|_| Error::Corrupt("kafka sink lock poisoned".into()))? =
            Some((query_id.to_string(), last));
        Ok(())
    }

    async fn add_batch(
        &self,
        batch_id: u64,
        _schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<()> {
        let producer = self.producer()?;
        if self.options.delivery == Delivery::AtLeastOnce {
            let pending = self.send_rows(&producer, &batches).await?;
            return wait_all(pending).await;
        }
        let (query_id, last) = self
            .txn
            .lock()
            .map_err(|_| Error::Corrupt("kafka sink lock poisoned".into()))?
            .clone()
            .ok_or_else(|| Error::Corrupt("the exactly-once kafka sink was not opened".into()))?;
        if last.is_some_and(|l| batch_id <= l) {
            tracing::info!(batch_id, "batch already committed to Kafka; skipping it");
            return Ok(());
        }
        producer
            .begin_transaction()
            .map_err(|e| client_error("begin a transaction", &e))?;
        let sent = async {
            let mut pending = self.send_rows(&producer, &batches).await?;
            let marker = batch_id.to_string();
            let record: FutureRecord<'_, str, str> = FutureRecord::to(&self.options.marker_topic)
                .key(query_id.as_str())
                .payload(marker.as_str())
                .partition(0);
            pending.push(
                producer
                    .send_result(record)
                    .map_err(|(e, _)| client_error("queue the batch marker", &e))?,
            );
            wait_all(pending).await?;
            // Crash tests stop here: records sent, transaction open.
            weir_common::failpoint::pause_point("sink_mid", batch_id);
            Ok(())
        }
        .await;
        let timeout = self.options.timeout;
        let p = Arc::clone(&producer);
        match sent {
            Ok(()) => {
                blocking(move || {
                    p.commit_transaction(timeout)
                        .map_err(|e| client_error("commit the batch's transaction", &e))
                })
                .await?;
                if let Ok(mut t) = self.txn.lock() {
                    *t = Some((query_id, Some(batch_id)));
                }
                Ok(())
            }
            Err(e) => {
                let _ = blocking(move || {
                    p.abort_transaction(timeout)
                        .map_err(|e| client_error("abort the batch's transaction", &e))
                })
                .await;
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::{Field, Fields};

    use super::*;

    fn schema(fields: Vec<Field>) -> SchemaRef {
        Arc::new(Schema::new(fields))
    }

    #[test]
    fn the_output_columns_are_checked_as_spark_does() {
        let o = Options::new().with("kafka.bootstrap.servers", "h:9092");
        let with_topic = o.clone().with("topic", "t");
        let ok = schema(vec![
            Field::new("key", DataType::Utf8, true),
            Field::new("value", DataType::Binary, true),
            Field::new(
                "headers",
                DataType::List(Arc::new(Field::new_list_field(
                    DataType::Struct(Fields::from(vec![
                        Field::new("key", DataType::Utf8, false),
                        Field::new("value", DataType::Binary, true),
                    ])),
                    true,
                ))),
                true,
            ),
        ]);
        KafkaSink::try_new(&with_topic, &ok).unwrap();
        for (opts, fields, says) in [
            (
                &with_topic,
                vec![Field::new("v", DataType::Utf8, true)],
                "column 'value'",
            ),
            (
                &with_topic,
                vec![Field::new("value", DataType::Int64, true)],
                "string or binary",
            ),
            (
                &o,
                vec![Field::new("value", DataType::Utf8, true)],
                "needs a topic",
            ),
            (
                &o,
                vec![
                    Field::new("value", DataType::Utf8, true),
                    Field::new("topic", DataType::Int32, true),
                ],
                "'topic' column must be a string",
            ),
            (
                &with_topic,
                vec![
                    Field::new("value", DataType::Utf8, true),
                    Field::new("partition", DataType::Int64, true),
                ],
                "must be an INT",
            ),
        ] {
            let err = KafkaSink::try_new(opts, &schema(fields)).unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
        let err = KafkaSink::try_new(&with_topic.clone().with("deliveryGuarantee", "twice"), &ok)
            .unwrap_err();
        assert!(
            err.to_string().contains("atLeastOnce or exactlyOnce"),
            "{err}"
        );
        let err = KafkaSink::try_new(&with_topic.clone().with("kafka.transactional.id", "x"), &ok)
            .unwrap_err();
        assert!(err.to_string().contains("set by weir"), "{err}");
    }
}
