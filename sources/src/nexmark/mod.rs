//! The `nexmark` source: the Nexmark benchmark's online auction, people opening auctions and
//! bidding on them, generated deterministically from event counts.
//!
//! `STREAM nexmark(table => 'bid', eventsPerBatch => 100000)`. Offsets are counts of events
//! (people, auctions and bids together, in the proportion 1:3:46), so the `person`, `auction`
//! and `bid` tables of one configuration, read by one query, see one consistent history, and a
//! replay after a crash reads exactly the same events. Each batch is generated straight into
//! Arrow columns by [`generator`], one partition per task.

mod generator;

use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use weir_common::{ClassifiedError, Options};

pub use generator::Table;
use generator::{Generator, NexmarkConfig, RateShape};

use crate::rate::{MAX_PARTITIONS, MAX_ROWS_PER_BATCH};
use crate::{
    Error, MicroBatchStream, Offset, Partitions, ReadLimit, Result, SourceContext, SourceProvider,
};

/// Events per record batch: large enough to amortise each operator's per-batch work, small
/// enough to stay in cache through a projection.
const EVENTS_PER_RECORD_BATCH: u64 = 1 << 16;

/// Largest value of the generator's count options (people, auctions, ratios, proportions):
/// their products stay far inside 64 bits.
const MAX_PARAMETER: i64 = 1 << 24;

/// Latest base time accepted: 9999-12-31, whose microseconds still fit in 64 bits.
const MAX_BASE_TIME_MS: i64 = 253_402_300_799_999;

const ACCEPTED: &[&str] = &[
    "table",
    "eventsPerBatch",
    "numEvents",
    "maxEventsPerTrigger",
    "numPartitions",
    "firstEventRate",
    "nextEventRate",
    "rateShape",
    "ratePeriod",
    "activePeople",
    "inFlightAuctions",
    "outOfOrderGroupSize",
    "avgPersonByteSize",
    "avgAuctionByteSize",
    "avgBidByteSize",
    "hotSellerRatio",
    "hotAuctionRatio",
    "hotBidderRatio",
    "hotChannelRatio",
    "personProportion",
    "auctionProportion",
    "bidProportion",
    "numCategories",
    "baseTime",
    "seed",
];

/// Definition of a `nexmark` source.
#[derive(Debug, Clone)]
pub struct NexmarkSourceProvider {
    table: Table,
    events_per_batch: Option<u64>,
    num_events: Option<u64>,
    max_events_per_trigger: Option<u64>,
    num_partitions: Option<u64>,
    generator: Arc<Generator>,
    schema: SchemaRef,
    /// The streams open on this definition and the last batch one of them generated, for the
    /// others to read rather than generate again.
    shared: Arc<Mutex<Shared>>,
}

/// What the streams of one definition share: a query that scans a stream twice (Nexmark q7
/// reads `STREAM bid` on both sides of a join) generates each batch once, and both scans read
/// the same columns.
#[derive(Debug, Default)]
struct Shared {
    /// Streams open on the definition.
    readers: usize,
    /// The last batch generated, while some open stream has yet to read it.
    last: Option<Generated>,
}

struct Generated {
    events: Range<u64>,
    partitions: u64,
    rows: Partitions,
    /// How many more reads of it are expected (the other open streams).
    unread: usize,
}

impl std::fmt::Debug for Generated {
    // The range, not the rows.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generated")
            .field("events", &self.events)
            .field("partitions", &self.partitions)
            .field("unread", &self.unread)
            .finish_non_exhaustive()
    }
}

impl NexmarkSourceProvider {
    /// Reads the options: `table` (`person`, `auction`, `bid` or `events`, default `events`);
    /// how far each batch reads: `eventsPerBatch` (each batch N more events, whatever the
    /// clock says) and/or `numEvents` (the stream ends after N events; alone, everything up to
    /// it is available at once, in batches of `maxEventsPerTrigger`); `numPartitions`; and the
    /// Nexmark generator's parameters (`firstEventRate`, `seed`, ...; see the README).
    pub fn try_new(options: &Options) -> Result<Self> {
        let r = options.reader("nexmark source", ACCEPTED);
        r.check_known()?;
        let table = match r.string("table") {
            None => Table::Events,
            Some(t) => Table::parse(&t).ok_or_else(|| {
                ClassifiedError::invalid_option(format!(
                    "Invalid value '{t}' for option 'table' of the nexmark source: expected \
                     person, auction, bid or events."
                ))
            })?,
        };
        let count = |key: &str| -> Result<Option<u64>> {
            Ok(match options.get(key) {
                None => None,
                Some(_) => Some(r.int_between(key, 1, 1, MAX_ROWS_PER_BATCH)? as u64),
            })
        };
        let events_per_batch = count("eventsPerBatch")?;
        let max_events_per_trigger = count("maxEventsPerTrigger")?;
        let num_events = match options.get("numEvents") {
            None => None,
            Some(_) => Some(r.int_at_least("numEvents", 0, 0)? as u64),
        };
        if events_per_batch.is_none() && num_events.is_none() {
            return Err(ClassifiedError::invalid_option(
                "The nexmark source needs 'eventsPerBatch' (each micro-batch reads that many \
                 more events) or 'numEvents' (a stream of that many events), or both."
                    .to_string(),
            )
            .into());
        }
        let num_partitions = match options.get("numPartitions") {
            None => None,
            Some(_) => Some(r.int_between("numPartitions", 1, 1, MAX_PARTITIONS)? as u64),
        };
        let d = NexmarkConfig::default();
        let param = |key: &str, default: usize, min: i64| -> Result<usize> {
            Ok(r.int_between(key, default as i64, min, MAX_PARAMETER)? as usize)
        };
        let first_rate = param("firstEventRate", d.first_rate, 1)?;
        let rate_shape = match r.string("rateShape") {
            None => d.rate_shape,
            Some(s) if s.eq_ignore_ascii_case("sine") => RateShape::Sine,
            Some(s) if s.eq_ignore_ascii_case("square") => RateShape::Square,
            Some(s) => {
                return Err(ClassifiedError::invalid_option(format!(
                    "Invalid value '{s}' for option 'rateShape' of the nexmark source: expected \
                     sine or square."
                ))
                .into());
            }
        };
        let rate_period = r.duration(
            "ratePeriod",
            std::time::Duration::from_secs(d.rate_period_s as u64),
            std::time::Duration::from_secs(1),
        )?;
        let cfg = NexmarkConfig {
            active_people: param("activePeople", d.active_people, 1)?,
            in_flight_auctions: param("inFlightAuctions", d.in_flight_auctions, 1)?,
            out_of_order_group_size: param("outOfOrderGroupSize", d.out_of_order_group_size, 1)?,
            avg_person_byte_size: param("avgPersonByteSize", d.avg_person_byte_size, 1)?,
            avg_auction_byte_size: param("avgAuctionByteSize", d.avg_auction_byte_size, 1)?,
            avg_bid_byte_size: param("avgBidByteSize", d.avg_bid_byte_size, 1)?,
            hot_seller_ratio: param("hotSellerRatio", d.hot_seller_ratio, 1)?,
            hot_auction_ratio: param("hotAuctionRatio", d.hot_auction_ratio, 1)?,
            hot_bidder_ratio: param("hotBidderRatio", d.hot_bidder_ratio, 1)?,
            hot_channel_ratio: param("hotChannelRatio", d.hot_channel_ratio, 1)?,
            first_event_id: r.int_between("seed", 0, 0, 1 << 48)? as usize,
            base_time_ms: base_time(&r, d.base_time_ms)?,
            num_categories: param("numCategories", d.num_categories, 1)?,
            person_proportion: param("personProportion", d.person_proportion, 1)?,
            auction_proportion: param("auctionProportion", d.auction_proportion, 1)?,
            bid_proportion: param("bidProportion", d.bid_proportion, 1)?,
            first_rate,
            next_rate: param("nextEventRate", first_rate, 1)?,
            rate_shape,
            rate_period_s: (rate_period.as_secs() as usize).clamp(1, MAX_PARAMETER as usize),
        };
        Ok(Self {
            table,
            events_per_batch,
            num_events,
            max_events_per_trigger,
            num_partitions,
            generator: Arc::new(Generator::new(cfg)),
            schema: table.schema(),
            shared: Arc::default(),
        })
    }

    /// The table this source yields.
    pub fn table(&self) -> Table {
        self.table
    }

    /// The rows of events `events` (event counts), as a batch of the stream over them reads
    /// them: `partitions` contiguous slices, generated in parallel off the async runtime.
    pub async fn generate(&self, events: Range<u64>, partitions: u64) -> Result<Partitions> {
        let (s, len, n) = (events.start, events.end - events.start, partitions.max(1));
        let tasks: Vec<_> = (0..n)
            .map(|p| {
                let from = s + (len as u128 * p as u128 / n as u128) as u64;
                let to = s + (len as u128 * (p + 1) as u128 / n as u128) as u64;
                let generator = Arc::clone(&self.generator);
                let table = self.table;
                tokio::task::spawn_blocking(move || {
                    generator.generate(table, from..to, EVENTS_PER_RECORD_BATCH)
                })
            })
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        for task in tasks {
            let part = task.await.map_err(|e| {
                Error::User(ClassifiedError::new(
                    "INTERNAL_ERROR",
                    "XX000",
                    format!("The nexmark generator's task failed: {e}"),
                ))
            })??;
            out.push(part);
        }
        Ok(out)
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        // The guarded fields are consistent after any panic (plain assignments).
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The rows of `events` in `partitions` as another stream of this definition generated
    /// them, when it did so last and some stream has yet to read them.
    fn take_generated(&self, events: &Range<u64>, partitions: u64) -> Option<Partitions> {
        let mut shared = self.shared();
        let last = shared.last.as_mut()?;
        // A kept batch has `unread > 0`: it is let go when that reaches 0.
        if last.events != *events || last.partitions != partitions {
            return None;
        }
        last.unread -= 1;
        let rows = last.rows.clone();
        if last.unread == 0 {
            shared.last = None;
        }
        Some(rows)
    }

    /// Keeps rows just generated for the other open streams of this definition (none: nothing
    /// is kept, so a query that scans a stream once holds no batch between its reads).
    fn keep_generated(&self, events: Range<u64>, partitions: u64, rows: &Partitions) {
        let mut shared = self.shared();
        let others = shared.readers.saturating_sub(1);
        shared.last = (others > 0).then(|| Generated {
            events,
            partitions,
            rows: rows.clone(),
            unread: others,
        });
    }

    /// The partitions a stream of this source generates each batch in.
    fn partitions(&self) -> u64 {
        self.num_partitions
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
    }
}

/// `baseTime`: epoch milliseconds, or a timestamp such as `2015-07-15T00:00:00Z`.
fn base_time(r: &weir_common::OptionReader<'_>, default: i64) -> Result<i64> {
    let Some(text) = r.string("baseTime") else {
        return Ok(default);
    };
    let ms = match text.trim().parse::<i64>() {
        Ok(ms) => Some(ms),
        Err(_) => chrono::DateTime::parse_from_rfc3339(text.trim())
            .ok()
            .map(|t| t.timestamp_millis()),
    };
    match ms {
        Some(ms) if (0..=MAX_BASE_TIME_MS).contains(&ms) => Ok(ms),
        _ => Err(ClassifiedError::invalid_option(format!(
            "Invalid value '{text}' for option 'baseTime' of the nexmark source: expected \
             milliseconds since the epoch or an RFC 3339 timestamp (2015-07-15T00:00:00Z), \
             from 1970 to 9999."
        ))
        .into()),
    }
}

#[async_trait]
impl SourceProvider for NexmarkSourceProvider {
    fn format(&self) -> &str {
        "nexmark"
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    async fn open(&self, _ctx: SourceContext) -> Result<Box<dyn MicroBatchStream>> {
        self.shared().readers += 1;
        Ok(Box::new(NexmarkStream {
            def: self.clone(),
            partitions: self.partitions(),
            available_now_target: None,
            latest: None,
        }))
    }
}

struct NexmarkStream {
    def: NexmarkSourceProvider,
    partitions: u64,
    available_now_target: Option<u64>,
    latest: Option<Offset>,
}

impl Drop for NexmarkStream {
    fn drop(&mut self) {
        let mut shared = self.def.shared();
        shared.readers = shared.readers.saturating_sub(1);
        if shared.readers <= 1 {
            shared.last = None;
        }
    }
}

/// The event count an offset holds.
fn events(o: &Offset) -> Result<u64> {
    o.as_long()
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| {
            Error::Corrupt(format!(
                "The offsets log holds '{o}' for a nexmark source, which expects a count of \
                 events. Restore the offsets file or use a new checkpoint location."
            ))
        })
}

fn offset(events: u64) -> Offset {
    Offset::long(events as i64)
}

impl NexmarkStream {
    /// Where the stream ends after `start` with no read limit: one batch more, or its end.
    fn available_after(&self, start: u64) -> u64 {
        let next = match self.def.events_per_batch {
            Some(n) => start.saturating_add(n),
            None => u64::MAX,
        };
        let next = next.min(i64::MAX as u64);
        match self.def.num_events {
            Some(end) => next.min(end.max(start)),
            None => next,
        }
    }
}

#[async_trait]
impl MicroBatchStream for NexmarkStream {
    fn description(&self) -> String {
        let opt = |v: Option<u64>| v.map_or("none".to_string(), |n| n.to_string());
        format!(
            "NexmarkStream[table={}, eventsPerBatch={}, numEvents={}, numPartitions={}]",
            self.def.table.name(),
            opt(self.def.events_per_batch),
            opt(self.def.num_events),
            self.partitions
        )
    }

    fn initial_offset(&self) -> Offset {
        offset(0)
    }

    fn default_read_limit(&self) -> ReadLimit {
        match self.def.max_events_per_trigger {
            Some(n) => ReadLimit::MaxRows(n),
            None => ReadLimit::AllAvailable,
        }
    }

    async fn latest_offset(&mut self, start: &Offset, limit: ReadLimit) -> Result<Offset> {
        let start = events(start)?;
        let available = match self.available_now_target {
            Some(target) => self.available_after(start).min(target.max(start)),
            None => self.available_after(start),
        };
        self.latest = Some(offset(available));
        let end = match limit {
            ReadLimit::MaxRows(n) => available.min(start.saturating_add(n.max(1))),
            _ => available,
        };
        Ok(offset(end))
    }

    fn reported_latest_offset(&self) -> Option<Offset> {
        self.latest.clone()
    }

    async fn get_batch(&mut self, start: &Offset, end: &Offset) -> Result<Partitions> {
        let (s, e) = (events(start)?, events(end)?);
        if e < s || e - s > MAX_ROWS_PER_BATCH as u64 {
            return Err(Error::Corrupt(format!(
                "The offsets log asks the nexmark source for events {s}..{e}, which is not a \
                 range one batch reads. Restore the offsets file or use a new checkpoint \
                 location."
            )));
        }
        // A batch another scan of this stream generated is read, not generated again.
        if let Some(rows) = self.def.take_generated(&(s..e), self.partitions) {
            return Ok(rows);
        }
        let rows = self.def.generate(s..e, self.partitions).await?;
        self.def.keep_generated(s..e, self.partitions, &rows);
        Ok(rows)
    }

    async fn prepare_for_available_now(&mut self, start: &Offset) -> Result<Offset> {
        // Available now: up to `numEvents` when the stream has an end, else one more batch.
        let start = events(start)?;
        let target = self.available_after(start);
        self.available_now_target = Some(target);
        Ok(offset(target))
    }
}

#[cfg(test)]
mod tests;
