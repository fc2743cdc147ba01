//! The Kafka source (`format("kafka")`, `STREAM kafka(...)`), as Spark's
//! `KafkaMicroBatchStream`: offsets are `{"topic":{"partition":offset}}` kept in weir's offsets
//! log (never consumer-group commits), each batch reads `[start, end)` of every partition by
//! assignment (no group join), and Spark's columns come out: `key`, `value` (binary), `topic`,
//! `partition`, `offset`, `timestamp`, `timestampType` and, with `includeHeaders`, `headers`.
//!
//! ```text
//! open:          resolve startingOffsets (earliest, latest, per-partition JSON, a timestamp)
//!                once; kept in sources/<i>/initial so a restart before batch 0 starts the same
//! latest_offset: the topics' partitions now (new ones start at their earliest), each one's
//!                high watermark, bounded by maxOffsetsPerTrigger (prorated by lag) and held
//!                back while below minOffsetsPerTrigger for at most maxTriggerDelay
//! get_batch:     one consumer assigned every partition at its start offset, polled until each
//!                reaches its end: one Arrow partition per Kafka partition
//! ```

mod read;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::{Offset as KafkaOffset, TopicPartitionList};
use weir_common::{ClassifiedError, Location, Options};

use crate::kept::KeptFile;
use crate::{
    Error, MicroBatchStream, Offset, Partitions, ReadLimit, Result, SourceContext, SourceProvider,
};

/// Offsets by topic and partition.
pub type PartitionOffsets = BTreeMap<String, BTreeMap<i32, i64>>;

/// Low and high watermarks by (topic, partition).
type Watermarks = BTreeMap<(String, i32), (i64, i64)>;

/// Which partitions the source reads.
#[derive(Debug, Clone)]
pub enum Strategy {
    /// These topics, every partition (`subscribe`).
    Subscribe(Vec<String>),
    /// Every topic whose name matches (`subscribePattern`).
    Pattern(regex::Regex),
    /// Exactly these partitions (`assign`, `{"topic":[0,1]}`).
    Assign(BTreeMap<String, Vec<i32>>),
}

impl Strategy {
    /// Whether the strategy reads partition `p` of `topic`.
    fn covers(&self, topic: &str, p: i32) -> bool {
        match self {
            Self::Subscribe(t) => t.iter().any(|t| t == topic),
            Self::Pattern(r) => r.is_match(topic),
            Self::Assign(a) => a.get(topic).is_some_and(|ps| ps.contains(&p)),
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Subscribe(t) => format!("Subscribe[{}]", t.join(",")),
            Self::Pattern(p) => format!("SubscribePattern[{}]", p.as_str()),
            Self::Assign(a) => format!(
                "Assign[{}]",
                a.iter()
                    .flat_map(|(t, ps)| ps.iter().map(move |p| format!("{t}-{p}")))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// Where a query that has never read the topics starts.
#[derive(Debug, Clone, PartialEq)]
pub enum Starting {
    /// Each partition's first offset.
    Earliest,
    /// Each partition's end at the first start (the default).
    Latest,
    /// Given per partition; `-2` is earliest and `-1` latest, as in Spark.
    Offsets(PartitionOffsets),
    /// The first offset at or after this time (epoch ms), every partition.
    Timestamp(i64),
}

/// The typed options of a Kafka source.
#[derive(Debug, Clone)]
pub struct KafkaSourceOptions {
    /// `kafka.bootstrap.servers`.
    pub bootstrap_servers: String,
    /// `subscribe`, `subscribePattern` or `assign`.
    pub strategy: Strategy,
    /// `startingOffsets` / `startingTimestamp`.
    pub starting: Starting,
    /// At most this many offsets per batch over all partitions.
    pub max_offsets_per_trigger: Option<u64>,
    /// Wait for at least this many new offsets, for at most `max_trigger_delay`.
    pub min_offsets_per_trigger: Option<u64>,
    /// How long `min_offsets_per_trigger` may hold a batch back.
    pub max_trigger_delay: Duration,
    /// Fail when offsets the log asks for are gone (deleted by retention, topic deleted).
    pub fail_on_data_loss: bool,
    /// Add the `headers` column.
    pub include_headers: bool,
    /// How long reading a batch may wait for the broker.
    pub poll_timeout: Duration,
    /// Other `kafka.*` options, passed to librdkafka without the prefix.
    pub client: Vec<(String, String)>,
}

const ACCEPTED: &[&str] = &[
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "startingTimestamp",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "failOnDataLoss",
    "includeHeaders",
    "kafkaConsumer.pollTimeoutMs",
    "kafka.<librdkafka option>",
];

/// Consumer settings weir owns: offsets live in the checkpoint, not in Kafka.
const REFUSED_CLIENT: &[&str] = &[
    "group.id",
    "auto.offset.reset",
    "enable.auto.commit",
    "key.deserializer",
    "value.deserializer",
];

fn bad(message: String) -> Error {
    Error::User(ClassifiedError::invalid_option(message))
}

impl KafkaSourceOptions {
    /// Reads Spark's Kafka source options.
    pub fn try_new(options: &Options) -> Result<Self> {
        let (client, own) = options.split_prefixed("kafka.");
        let r = own.reader("kafka source", ACCEPTED);
        r.check_known()?;
        let mut bootstrap = None;
        let mut rest = vec![];
        for (k, v) in client {
            let key = k["kafka.".len()..].to_string();
            if key.eq_ignore_ascii_case("bootstrap.servers") {
                bootstrap = Some(v);
            } else if REFUSED_CLIENT.iter().any(|r| r.eq_ignore_ascii_case(&key)) {
                return Err(bad(format!(
                    "Kafka option '{k}' is not supported: weir keeps the source's offsets in the \
                     checkpoint and reads by partition assignment; use startingOffsets to choose \
                     where a new query starts."
                )));
            } else {
                rest.push((key, v));
            }
        }
        let bootstrap_servers = bootstrap.ok_or_else(|| {
            bad(
                "The kafka source needs option 'kafka.bootstrap.servers', e.g. \
                 'localhost:9092'."
                    .into(),
            )
        })?;
        let strategies: Vec<&str> = ["subscribe", "subscribePattern", "assign"]
            .into_iter()
            .filter(|k| own.get(k).is_some())
            .collect();
        let strategy = match strategies.as_slice() {
            ["subscribe"] => {
                let topics: Vec<String> = r
                    .required("subscribe")?
                    .split(',')
                    .map(|t| t.trim().to_string())
                    .filter(|t| !t.is_empty())
                    .collect();
                if topics.is_empty() {
                    return Err(bad(
                        "Option 'subscribe' of the kafka source names no topic.".into(),
                    ));
                }
                Strategy::Subscribe(topics)
            }
            ["subscribePattern"] => {
                let p = r.required("subscribePattern")?;
                Strategy::Pattern(regex::Regex::new(&format!("^(?:{p})$")).map_err(|e| {
                    bad(format!(
                        "Option 'subscribePattern' '{p}' is not a regex: {e}"
                    ))
                })?)
            }
            ["assign"] => {
                let a = r.required("assign")?;
                Strategy::Assign(serde_json::from_str(&a).map_err(|e| {
                    bad(format!(
                        "Option 'assign' must be JSON such as {{\"topicA\":[0,1]}}, not '{a}': {e}"
                    ))
                })?)
            }
            _ => {
                return Err(bad(
                    "The kafka source needs exactly one of the options 'subscribe', \
                     'subscribePattern' and 'assign'."
                        .into(),
                ));
            }
        };
        let starting = match (own.get("startingOffsets"), own.get("startingTimestamp")) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "Options 'startingOffsets' and 'startingTimestamp' of the kafka source \
                     cannot both be set."
                        .into(),
                ));
            }
            (None, Some(_)) => Starting::Timestamp(r.int_at_least("startingTimestamp", 0, 0)?),
            (None, None) => Starting::Latest,
            (Some(s), None) => match s.trim().to_ascii_lowercase().as_str() {
                "earliest" => Starting::Earliest,
                "latest" => Starting::Latest,
                _ => Starting::Offsets(serde_json::from_str(s).map_err(|e| {
                    bad(format!(
                        "Option 'startingOffsets' must be earliest, latest or JSON such as \
                         {{\"topicA\":{{\"0\":23,\"1\":-2}}}}, not '{s}': {e}"
                    ))
                })?),
            },
        };
        let positive = |key: &str| -> Result<Option<u64>> {
            Ok(match own.get(key) {
                None => None,
                Some(_) => Some(r.int_at_least(key, 1, 1)? as u64),
            })
        };
        Ok(Self {
            bootstrap_servers,
            strategy,
            starting,
            max_offsets_per_trigger: positive("maxOffsetsPerTrigger")?,
            min_offsets_per_trigger: positive("minOffsetsPerTrigger")?,
            max_trigger_delay: r.duration(
                "maxTriggerDelay",
                Duration::from_secs(15 * 60),
                Duration::from_millis(1),
            )?,
            fail_on_data_loss: r.bool("failOnDataLoss", true)?,
            include_headers: r.bool("includeHeaders", false)?,
            poll_timeout: Duration::from_millis(r.int_at_least(
                "kafkaConsumer.pollTimeoutMs",
                120_000,
                1,
            )? as u64),
            client: rest,
        })
    }

    fn consumer(&self) -> Result<BaseConsumer> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap_servers)
            .set("group.id", format!("weir-source-{}", std::process::id()))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            // librdkafka waits this long before fetching more once its local queue is full
            // (default 1 s): a batch that reads past one queue-full would stall for it.
            .set("fetch.queue.backoff.ms", "10");
        for (k, v) in &self.client {
            c.set(k, v);
        }
        c.create()
            .map_err(|e| client_error("create a Kafka consumer", &e))
    }
}

/// A Kafka client call failed.
fn client_error(what: &str, e: &KafkaError) -> Error {
    Error::User(ClassifiedError::new(
        "KAFKA_CLIENT_ERROR",
        "08000",
        format!(
            "Could not {what}: {e}. Check kafka.bootstrap.servers and that the broker is \
             reachable."
        ),
    ))
}

/// Spark's Kafka source schema.
pub fn kafka_schema(include_headers: bool) -> SchemaRef {
    let mut fields = vec![
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, true),
        Field::new("topic", DataType::Utf8, false),
        Field::new("partition", DataType::Int32, false),
        Field::new("offset", DataType::Int64, false),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("timestampType", DataType::Int32, false),
    ];
    if include_headers {
        fields.push(Field::new(
            "headers",
            DataType::List(Arc::new(Field::new_list_field(
                DataType::Struct(Fields::from(vec![
                    Field::new("key", DataType::Utf8, false),
                    Field::new("value", DataType::Binary, true),
                ])),
                true,
            ))),
            true,
        ));
    }
    Arc::new(Schema::new(fields))
}

/// A Kafka source as a query is planned against it.
#[derive(Debug)]
pub struct KafkaSourceProvider {
    options: Arc<KafkaSourceOptions>,
    schema: SchemaRef,
}

impl KafkaSourceProvider {
    /// A Kafka source with Spark's options.
    pub fn try_new(options: &Options) -> Result<Self> {
        let options = KafkaSourceOptions::try_new(options)?;
        Ok(Self {
            schema: kafka_schema(options.include_headers),
            options: Arc::new(options),
        })
    }
}

#[async_trait]
impl SourceProvider for KafkaSourceProvider {
    fn format(&self) -> &str {
        "kafka"
    }

    fn identity(&self) -> String {
        format!("kafka:{}", self.options.strategy.describe())
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Another subscription: the partitions both read continue from their committed offsets,
    /// partitions only the new one reads start from their earliest, as new partitions do.
    fn derive_start(&self, previous: &str, previous_end: &Offset) -> Option<Offset> {
        if !previous.starts_with("kafka:") {
            return None;
        }
        let mut kept = offsets_of(previous_end).ok()?;
        for (topic, parts) in kept.iter_mut() {
            parts.retain(|p, _| self.options.strategy.covers(topic, *p));
        }
        kept.retain(|_, parts| !parts.is_empty());
        Some(to_offset(&kept))
    }

    fn start_difference(&self, derived: &Offset, chosen: &Offset) -> Option<String> {
        let (derived, chosen) = (offsets_of(derived).ok()?, offsets_of(chosen).ok()?);
        let mut skipped = vec![];
        let mut again = vec![];
        for (topic, parts) in &derived {
            for (p, &d) in parts {
                match get(&chosen, topic, *p) {
                    Some(c) if c > d => skipped.push(format!("{topic}-{p}: offsets {d}..{c}")),
                    Some(c) if c < d => again.push(format!("{topic}-{p}: offsets {c}..{d}")),
                    Some(_) => {}
                    None => again.push(format!("{topic}-{p}: from its earliest to {d}")),
                }
            }
        }
        // A partition only `chosen` has starts at its earliest when derived.
        for (topic, parts) in &chosen {
            for (p, &c) in parts {
                if get(&derived, topic, *p).is_none() && c > 0 {
                    skipped.push(format!("{topic}-{p}: offsets before {c}"));
                }
            }
        }
        let mut out = vec![];
        if !skipped.is_empty() {
            out.push(format!("leaves a gap: never reads {}", skipped.join(", ")));
        }
        if !again.is_empty() {
            out.push(format!("overlaps: reads again {}", again.join(", ")));
        }
        (!out.is_empty()).then(|| out.join("; "))
    }

    async fn open(&self, ctx: SourceContext) -> Result<Box<dyn MicroBatchStream>> {
        let consumer = Arc::new(self.options.consumer()?);
        let mut stream = KafkaStream {
            options: Arc::clone(&self.options),
            schema: Arc::clone(&self.schema),
            consumer,
            initial: PartitionOffsets::new(),
            first_held_back: None,
            target: None,
            last_partitions: None,
            latest: None,
        };
        stream.initial = stream.initial_offsets(&ctx.metadata).await?;
        Ok(Box::new(stream))
    }
}

struct KafkaStream {
    options: Arc<KafkaSourceOptions>,
    schema: SchemaRef,
    consumer: Arc<BaseConsumer>,
    initial: PartitionOffsets,
    /// When minOffsetsPerTrigger first held a batch back.
    first_held_back: Option<Instant>,
    /// With the available-now trigger: the end offsets at its start.
    target: Option<PartitionOffsets>,
    /// The partitions and watermarks `latest_offset` just read, for the `get_batch` that
    /// follows it (a replay after a restart reads them afresh).
    last_partitions: Option<Watermarks>,
    latest: Option<Offset>,
}

/// Runs a blocking client call on the blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Corrupt(format!("a Kafka client call failed: {e}")))?
}

const METADATA_TIMEOUT: Duration = Duration::from_secs(30);

impl KafkaStream {
    /// Every partition the strategy selects now, with its low and high watermarks.
    async fn partitions(&self) -> Result<Watermarks> {
        let consumer = Arc::clone(&self.consumer);
        let strategy = self.options.strategy.clone();
        blocking(move || {
            let md = consumer
                .fetch_metadata(None, METADATA_TIMEOUT)
                .map_err(|e| client_error("read the topics' metadata", &e))?;
            let mut out = BTreeMap::new();
            for t in md.topics() {
                let wanted: Vec<i32> = match &strategy {
                    Strategy::Subscribe(topics) if topics.iter().any(|n| n == t.name()) => {
                        t.partitions().iter().map(|p| p.id()).collect()
                    }
                    Strategy::Pattern(p) if p.is_match(t.name()) => {
                        t.partitions().iter().map(|p| p.id()).collect()
                    }
                    Strategy::Assign(a) => a.get(t.name()).cloned().unwrap_or_default(),
                    _ => vec![],
                };
                for p in wanted {
                    let marks = consumer
                        .fetch_watermarks(t.name(), p, METADATA_TIMEOUT)
                        .map_err(|e| {
                            client_error(&format!("read the offsets of {}-{p}", t.name()), &e)
                        })?;
                    out.insert((t.name().to_string(), p), marks);
                }
            }
            Ok(out)
        })
        .await
    }

    /// The starting offsets: resolved once and kept in the source's checkpoint folder.
    async fn initial_offsets(&self, dir: &Location) -> Result<PartitionOffsets> {
        let kept = KeptFile {
            dir,
            name: "initial",
            what: "The Kafka source's starting offsets",
        };
        let file = format!("{}/initial", dir.display());
        if let Some(body) = kept.read().await? {
            return parse_offsets(body.as_bytes(), &file);
        }
        let parts = self.partitions().await?;
        let mut initial = PartitionOffsets::new();
        let timestamps = match &self.options.starting {
            Starting::Timestamp(ts) => Some(self.offsets_for_time(&parts, *ts).await?),
            _ => None,
        };
        for ((topic, p), (low, high)) in &parts {
            let at = match &self.options.starting {
                Starting::Earliest => *low,
                Starting::Latest => *high,
                Starting::Offsets(given) => match given.get(topic).and_then(|m| m.get(p)) {
                    Some(-2) => *low,
                    Some(-1) | None => *high,
                    Some(o) => *o,
                },
                Starting::Timestamp(_) => timestamps
                    .as_ref()
                    .and_then(|t| t.get(&(topic.clone(), *p)).copied())
                    .unwrap_or(*high),
            };
            initial.entry(topic.clone()).or_default().insert(*p, at);
        }
        if let Starting::Offsets(given) = &self.options.starting {
            for (topic, ps) in given {
                for p in ps.keys() {
                    if !parts.contains_key(&(topic.clone(), *p)) {
                        return Err(bad(format!(
                            "startingOffsets names {topic}-{p}, which the source does not read \
                             (no such partition, or not subscribed)."
                        )));
                    }
                }
            }
        }
        let text = serde_json::to_string(&initial)
            .map_err(|e| Error::Corrupt(format!("cannot serialize offsets: {e}")))?;
        // Another run may have resolved them first: theirs count.
        parse_offsets(kept.keep(text).await?.as_bytes(), &file)
    }

    async fn offsets_for_time(
        &self,
        parts: &Watermarks,
        ts: i64,
    ) -> Result<BTreeMap<(String, i32), i64>> {
        let consumer = Arc::clone(&self.consumer);
        let mut tpl = TopicPartitionList::new();
        for (t, p) in parts.keys() {
            tpl.add_partition_offset(t, *p, KafkaOffset::Offset(ts))
                .map_err(|e| client_error("build a partition list", &e))?;
        }
        let highs: BTreeMap<(String, i32), i64> =
            parts.iter().map(|(k, (_, h))| (k.clone(), *h)).collect();
        blocking(move || {
            let found = consumer
                .offsets_for_times(tpl, METADATA_TIMEOUT)
                .map_err(|e| client_error("find offsets by timestamp", &e))?;
            Ok(found
                .elements()
                .iter()
                .map(|e| {
                    let key = (e.topic().to_string(), e.partition());
                    let at = match e.offset() {
                        KafkaOffset::Offset(o) => o,
                        // No record at or after the time: the end.
                        _ => highs.get(&key).copied().unwrap_or(0),
                    };
                    (key, at)
                })
                .collect())
        })
        .await
    }

    fn data_loss(&self, what: String) -> Result<()> {
        if self.options.fail_on_data_loss {
            Err(Error::User(ClassifiedError::new(
                "KAFKA_DATA_LOSS",
                "22000",
                format!(
                    "{what}. Some data may have been lost because it is not available in Kafka \
                     any more (retention, or a deleted topic). If you want the query to go on \
                     past it, set the source option failOnDataLoss to false."
                ),
            )))
        } else {
            tracing::warn!("{what}; going on (failOnDataLoss is false)");
            Ok(())
        }
    }
}

fn parse_offsets(bytes: &[u8], file: &str) -> Result<PartitionOffsets> {
    serde_json::from_slice(bytes).map_err(|e| {
        Error::Corrupt(format!(
            "'{file}' does not hold Kafka offsets ({{\"topic\":{{\"0\":12}}}}): {e}. Restore \
             it, or use a new checkpoint location."
        ))
    })
}

fn offsets_of(o: &Offset) -> Result<PartitionOffsets> {
    serde_json::from_value(o.0.clone()).map_err(|_| {
        Error::Corrupt(format!(
            "The offsets log holds '{o}' for a kafka source, which expects \
             {{\"topic\":{{\"0\":12}}}}. Restore the offsets file or use a new checkpoint \
             location."
        ))
    })
}

fn to_offset(o: &PartitionOffsets) -> Offset {
    Offset(serde_json::to_value(o).unwrap_or_default())
}

fn get(o: &PartitionOffsets, topic: &str, p: i32) -> Option<i64> {
    o.get(topic).and_then(|m| m.get(&p)).copied()
}

#[async_trait]
impl MicroBatchStream for KafkaStream {
    fn description(&self) -> String {
        format!("KafkaV2[{}]", self.options.strategy.describe())
    }

    fn initial_offset(&self) -> Offset {
        to_offset(&self.initial)
    }

    fn default_read_limit(&self) -> ReadLimit {
        match (
            self.options.max_offsets_per_trigger,
            self.options.min_offsets_per_trigger,
        ) {
            (Some(max), _) => ReadLimit::MaxRows(max),
            // Not "all available", so that minOffsetsPerTrigger applies (the once trigger
            // asks for all available and ignores it, as Spark's).
            (None, Some(_)) => ReadLimit::MaxRows(u64::MAX),
            (None, None) => ReadLimit::AllAvailable,
        }
    }

    fn runs_first_batch_without_data(&self) -> bool {
        false
    }

    async fn latest_offset(&mut self, start: &Offset, limit: ReadLimit) -> Result<Offset> {
        let start = offsets_of(start)?;
        let parts = self.partitions().await?;
        self.last_partitions = Some(parts.clone());
        for (topic, ps) in &start {
            for p in ps.keys() {
                if !parts.contains_key(&(topic.clone(), *p)) {
                    self.data_loss(format!("The partition {topic}-{p} is gone"))?;
                }
            }
        }
        // Where each partition starts: its logged end, or (a new partition) its earliest.
        let begin: BTreeMap<(String, i32), i64> = parts
            .iter()
            .map(|((t, p), (low, _))| ((t.clone(), *p), get(&start, t, *p).unwrap_or(*low)))
            .collect();
        let lag = |k: &(String, i32)| -> u64 {
            let high = parts[k].1;
            (high - begin[k]).max(0) as u64
        };
        let total: u64 = parts.keys().map(lag).sum();
        if let Some(min) = self.options.min_offsets_per_trigger
            && total < min
            && limit != ReadLimit::AllAvailable
            && self.target.is_none()
        {
            let since = *self.first_held_back.get_or_insert_with(Instant::now);
            if since.elapsed() < self.options.max_trigger_delay {
                self.latest = Some(to_offset(&start));
                return Ok(to_offset(&start));
            }
        }
        let mut end = PartitionOffsets::new();
        for (k, (_, high)) in &parts {
            let b = begin[k];
            let e = match limit {
                // Spark's rate limit: each partition's share of the limit, by its lag.
                ReadLimit::MaxRows(max) if total > max => {
                    let share = max as f64 * (lag(k) as f64 / total as f64);
                    let take = if share < 1.0 {
                        share.ceil()
                    } else {
                        share.floor()
                    } as i64;
                    (b + take).min(*high)
                }
                _ => (*high).max(b),
            };
            // With the available-now trigger, nothing past what was there at its start.
            let e = match &self.target {
                Some(t) => e.min(get(t, &k.0, k.1).unwrap_or(b)).max(b),
                None => e,
            };
            end.entry(k.0.clone()).or_default().insert(k.1, e);
        }
        // A partition that moved backwards (recreated topic) keeps its start: nothing to read.
        let end_offset = to_offset(&end);
        if end_offset != to_offset(&start) {
            self.first_held_back = None;
        }
        self.latest = Some(end_offset.clone());
        Ok(end_offset)
    }

    fn reported_latest_offset(&self) -> Option<Offset> {
        self.latest.clone()
    }

    async fn get_batch(&mut self, start: &Offset, end: &Offset) -> Result<Partitions> {
        let (start, end) = (offsets_of(start)?, offsets_of(end)?);
        let parts = match self.last_partitions.take() {
            Some(p) => p,
            None => self.partitions().await?,
        };
        let mut ranges = vec![];
        for (topic, ps) in &end {
            for (p, e) in ps {
                let low = parts.get(&(topic.clone(), *p)).map(|(l, _)| *l);
                let mut s = get(&start, topic, *p).or(low).unwrap_or(*e);
                if let Some(low) = low
                    && s < low
                    && s < *e
                {
                    self.data_loss(format!(
                        "Offsets {s} to {} of {topic}-{p} are gone (the earliest offset is now \
                         {low})",
                        low - 1
                    ))?;
                    s = low.min(*e);
                }
                if s < *e {
                    ranges.push(read::Range {
                        topic: topic.clone(),
                        partition: *p,
                        start: s,
                        end: *e,
                    });
                }
            }
        }
        let consumer = Arc::clone(&self.consumer);
        let schema = Arc::clone(&self.schema);
        let timeout = self.options.poll_timeout;
        blocking(move || read::read(&consumer, &schema, &ranges, timeout)).await
    }

    async fn prepare_for_available_now(&mut self, start: &Offset) -> Result<Offset> {
        // Everything up to each partition's end now.
        let start = offsets_of(start)?;
        let parts = self.partitions().await?;
        let mut end = PartitionOffsets::new();
        for ((t, p), (low, high)) in parts {
            let b = get(&start, &t, p).unwrap_or(low);
            end.entry(t).or_default().insert(p, high.max(b));
        }
        self.target = Some(end.clone());
        Ok(to_offset(&end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_read_as_spark_names_them_and_bad_ones_refused() {
        let o = KafkaSourceOptions::try_new(
            &Options::new()
                .with("kafka.bootstrap.servers", "h:9092")
                .with("subscribe", "a, b")
                .with("startingOffsets", r#"{"a":{"0":5,"1":-2}}"#)
                .with("maxOffsetsPerTrigger", "100")
                .with("kafka.fetch.min.bytes", "1"),
        )
        .unwrap();
        assert!(matches!(&o.strategy, Strategy::Subscribe(t) if t == &["a", "b"]));
        assert_eq!(
            o.starting,
            Starting::Offsets(BTreeMap::from([(
                "a".to_string(),
                BTreeMap::from([(0, 5), (1, -2)])
            )]))
        );
        assert_eq!(
            o.client,
            vec![("fetch.min.bytes".to_string(), "1".to_string())]
        );
        for (opts, says) in [
            (vec![("subscribe", "a")], "kafka.bootstrap.servers"),
            (
                vec![
                    ("kafka.bootstrap.servers", "h"),
                    ("subscribe", "a"),
                    ("assign", "{}"),
                ],
                "exactly one of",
            ),
            (vec![("kafka.bootstrap.servers", "h")], "exactly one of"),
            (
                vec![
                    ("kafka.bootstrap.servers", "h"),
                    ("subscribe", "a"),
                    ("kafka.group.id", "g"),
                ],
                "is not supported",
            ),
            (
                vec![("kafka.bootstrap.servers", "h"), ("assign", "[0]")],
                "{\"topicA\":[0,1]}",
            ),
            (
                vec![
                    ("kafka.bootstrap.servers", "h"),
                    ("subscribe", "a"),
                    ("startingOffsets", "first"),
                ],
                "earliest, latest or JSON",
            ),
            (
                vec![
                    ("kafka.bootstrap.servers", "h"),
                    ("subscribe", "a"),
                    ("topic", "x"),
                ],
                "Unknown option 'topic'",
            ),
        ] {
            let err = KafkaSourceOptions::try_new(&opts.into_iter().collect()).unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
    }
}
