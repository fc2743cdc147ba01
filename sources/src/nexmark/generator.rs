//! Nexmark's event generator, writing Arrow columns directly.
//!
//! Each event is a pure function of the configuration and its event number, as in the Nexmark
//! suite's generator (Beam's, ported to Flink and to the `nexmark` crate RisingWave uses): its
//! values come from a small random generator seeded with the event's id, its time from its
//! number and the rate. So any range of events can be generated on its own, in any partition,
//! after any restart, and gives the same values. The formulas, the random draws and their order
//! are the `nexmark` crate's (0.2), checked against it in the tests, so a query over weir's events
//! sees the data RisingWave's and Arroyo's users see. Two differences, both on purpose: event
//! times are computed in 64-bit floats (the crate's 32-bit ones step by 2 ms past 4.7 hours of
//! event time), and a varying rate follows its schedule through every step (the crate, like
//! Beam's, only ever uses the first step's rate).

use std::f64::consts::PI;
use std::sync::{Arc, OnceLock};

use arrow::array::{
    ArrayRef, Int32Builder, Int64Builder, StringBuilder, StructArray, TimestampMicrosecondBuilder,
};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::Result;

/// People, auctions and bids are ids from these on, so queries find matches even in few events.
const FIRST_PERSON_ID: u64 = 1000;
const FIRST_AUCTION_ID: u64 = 1000;
const FIRST_CATEGORY_ID: u64 = 10;
/// How far past the newest id a random person or auction id may reach.
const PERSON_ID_LEAD: usize = 10;
const AUCTION_ID_LEAD: usize = 10;
/// 1 in this many people / auctions is "hot".
const HOT_SELLER_RATIO: usize = 100;
const HOT_AUCTION_RATIO: usize = 100;
const HOT_BIDDER_RATIO: usize = 100;
const SINE_APPROX_STEPS: usize = 10;
const CHANNELS: usize = 10_000;
const MIN_STRING_LENGTH: usize = 3;
const US_STATES: &[&str] = &["az", "ca", "id", "or", "wa", "wy"];
const US_CITIES: &[&str] = &[
    "phoenix",
    "los angeles",
    "san francisco",
    "boise",
    "portland",
    "bend",
    "redmond",
    "seattle",
    "kent",
    "cheyenne",
];
const FIRST_NAMES: &[&str] = &[
    "peter", "paul", "luke", "john", "saul", "vicky", "kate", "julie", "sarah", "deiter", "walter",
];
const LAST_NAMES: &[&str] = &[
    "shultz", "abrams", "spencer", "white", "bartels", "walton", "smith", "jones", "noris",
];
const HOT_CHANNELS: &[&str] = &["Google", "Facebook", "Baidu", "Apple"];

/// The kind of an event, numbered as Flink's `event_type` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Person = 0,
    Auction = 1,
    Bid = 2,
}

/// How the event rate varies between `first_rate` and `next_rate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateShape {
    Square,
    Sine,
}

/// The generator's parameters, with the Nexmark suite's defaults.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NexmarkConfig {
    /// At most this many of the newest people place auctions and bids.
    pub active_people: usize,
    /// About this many auctions are open at any time.
    pub in_flight_auctions: usize,
    /// Events come in groups of this size, each in a scrambled order (1: in order).
    pub out_of_order_group_size: usize,
    pub avg_person_byte_size: usize,
    pub avg_auction_byte_size: usize,
    pub avg_bid_byte_size: usize,
    /// 1 - 1/ratio of auctions are by a hot seller, of bids on a hot auction, by a hot bidder,
    /// on a hot channel.
    pub hot_seller_ratio: usize,
    pub hot_auction_ratio: usize,
    pub hot_bidder_ratio: usize,
    pub hot_channel_ratio: usize,
    /// The id of event 0 (Nexmark's `firstEventId`): each event's values are drawn from a
    /// generator seeded with its id, so this is the seed.
    pub first_event_id: usize,
    /// Event time of event 0, ms since the epoch.
    pub base_time_ms: i64,
    pub num_categories: usize,
    /// Of every `person + auction + bid` events, the first `person` are people, the next
    /// `auction` auctions, the rest bids.
    pub person_proportion: usize,
    pub auction_proportion: usize,
    pub bid_proportion: usize,
    /// Events per second of event time, at first and after each rate period.
    pub first_rate: usize,
    pub next_rate: usize,
    pub rate_shape: RateShape,
    /// Seconds of event time one cycle of the rate takes.
    pub rate_period_s: usize,
}

impl Default for NexmarkConfig {
    fn default() -> Self {
        Self {
            active_people: 1000,
            in_flight_auctions: 100,
            out_of_order_group_size: 1,
            avg_person_byte_size: 200,
            avg_auction_byte_size: 500,
            avg_bid_byte_size: 100,
            hot_seller_ratio: 4,
            hot_auction_ratio: 2,
            hot_bidder_ratio: 4,
            hot_channel_ratio: 2,
            first_event_id: 0,
            // 2015-07-15, RisingWave's fixed base time: the same events every run.
            base_time_ms: 1_436_918_400_000,
            num_categories: 5,
            person_proportion: 1,
            auction_proportion: 3,
            bid_proportion: 46,
            first_rate: 10_000,
            next_rate: 10_000,
            rate_shape: RateShape::Sine,
            rate_period_s: 600,
        }
    }
}

/// A configuration with what is derived from it: the delays between events.
#[derive(Debug, Clone)]
pub(crate) struct Generator {
    cfg: NexmarkConfig,
    denominator: usize,
    /// Microseconds between events, per step of the rate's cycle (one entry: a constant rate).
    delays_us: Vec<f64>,
    /// Events in each step of the cycle, and in the whole cycle.
    events_per_step: Vec<usize>,
    events_per_epoch: usize,
    /// Milliseconds one whole cycle takes.
    epoch_ms: f64,
    hot_urls: Vec<String>,
}

impl Generator {
    pub fn new(cfg: NexmarkConfig) -> Self {
        let denominator = cfg.person_proportion + cfg.auction_proportion + cfg.bid_proportion;
        let period = |rate: usize| 1_000_000.0 / rate as f64;
        let delays_us = if cfg.first_rate == cfg.next_rate {
            vec![period(cfg.first_rate)]
        } else {
            match cfg.rate_shape {
                RateShape::Square => vec![period(cfg.first_rate), period(cfg.next_rate)],
                RateShape::Sine => {
                    let mid = (cfg.first_rate + cfg.next_rate) as f64 / 2.0;
                    let amp = (cfg.first_rate as f64 - cfg.next_rate as f64) / 2.0;
                    (0..SINE_APPROX_STEPS)
                        .map(|i| {
                            let r = 2.0 * PI * i as f64 / SINE_APPROX_STEPS as f64;
                            period(((mid + amp * r.cos()).round() as usize).max(1))
                        })
                        .collect()
                }
            }
        };
        let steps = delays_us.len();
        let step_s = cfg.rate_period_s.div_ceil(steps);
        let events_per_step: Vec<usize> = delays_us
            .iter()
            .map(|d| ((step_s as f64 * 1_000_000.0 / d).round() as usize).max(1))
            .collect();
        let epoch_ms = events_per_step
            .iter()
            .zip(&delays_us)
            .map(|(n, d)| *n as f64 * d / 1000.0)
            .sum();
        Self {
            denominator,
            events_per_epoch: events_per_step.iter().sum(),
            events_per_step,
            delays_us,
            epoch_ms,
            hot_urls: (0..HOT_CHANNELS.len() as u64).map(base_url).collect(),
            cfg,
        }
    }

    /// The number of the `offset`-th event emitted: events are scrambled within groups of
    /// `out_of_order_group_size`.
    pub fn event_number(&self, offset: u64) -> usize {
        let n = self.cfg.out_of_order_group_size;
        let e = offset as usize;
        (e / n) * n + (e.wrapping_mul(953)) % n
    }

    pub fn event_type(&self, event_number: usize) -> EventType {
        let rem = event_number % self.denominator;
        if rem < self.cfg.person_proportion {
            EventType::Person
        } else if rem < self.cfg.person_proportion + self.cfg.auction_proportion {
            EventType::Auction
        } else {
            EventType::Bid
        }
    }

    /// Event time of event `event_number`, ms since the epoch.
    pub fn timestamp_ms(&self, event_number: usize) -> i64 {
        let offset_ms = if let [delay] = self.delays_us[..] {
            event_number as f64 * delay / 1000.0
        } else {
            let epoch = event_number / self.events_per_epoch;
            let mut i = event_number % self.events_per_epoch;
            let mut in_epoch = 0.0;
            let mut at = 0.0;
            for (n, d) in self.events_per_step.iter().zip(&self.delays_us) {
                if i < *n {
                    at = in_epoch + i as f64 * d / 1000.0;
                    break;
                }
                i -= n;
                in_epoch += *n as f64 * d / 1000.0;
            }
            epoch as f64 * self.epoch_ms + at
        };
        self.cfg.base_time_ms + offset_ms.round() as i64
    }

    /// The newest person id (from 0) at event id `event_id`.
    fn last_person_id(&self, event_id: usize) -> usize {
        let epoch = event_id / self.denominator;
        let offset = (event_id % self.denominator).min(self.cfg.person_proportion - 1);
        epoch * self.cfg.person_proportion + offset
    }

    /// A random person among the active ones (from 0).
    fn next_person_id(&self, event_id: usize, rng: &mut SmallRng) -> usize {
        let people = self.last_person_id(event_id) + 1;
        let active = people.min(self.cfg.active_people);
        people - active + rng.gen_range(0..active + PERSON_ID_LEAD)
    }

    /// The newest auction id (from 0) at event id `event_id`.
    fn last_auction_id(&self, event_id: usize) -> usize {
        let c = &self.cfg;
        let mut epoch = event_id / self.denominator;
        let mut offset = event_id % self.denominator;
        if offset < c.person_proportion {
            epoch = epoch.saturating_sub(1);
            offset = c.auction_proportion - 1;
        } else if c.person_proportion + c.auction_proportion <= offset {
            offset = c.auction_proportion - 1;
        } else {
            offset -= c.person_proportion;
        }
        epoch * c.auction_proportion + offset
    }

    /// A random auction among the in-flight ones (from 0).
    fn next_auction_id(&self, event_id: usize, rng: &mut SmallRng) -> usize {
        let max = self.last_auction_id(event_id);
        let min = max.saturating_sub(self.cfg.in_flight_auctions);
        min + rng.gen_range(0..max - min + 1 + AUCTION_ID_LEAD)
    }

    /// How long an auction opened at `time_ms` by event `event_number` runs, in ms.
    fn auction_length(&self, event_number: usize, rng: &mut SmallRng, time_ms: i64) -> u64 {
        let c = &self.cfg;
        let events_for_auctions = (c.in_flight_auctions * self.denominator) / c.auction_proportion;
        let future = self.timestamp_ms(event_number + events_for_auctions);
        let horizon = future.saturating_sub(time_ms).max(0) as u64;
        1 + rng.gen_range(0..(horizon * 2).max(1))
    }

    /// Events `offsets` (event counts, not numbers) of `table`, in record batches of at most
    /// `chunk` events each.
    pub fn generate(
        &self,
        table: Table,
        offsets: std::ops::Range<u64>,
        chunk: u64,
    ) -> Result<Vec<RecordBatch>> {
        let schema = table.schema();
        let mut out = vec![];
        let mut start = offsets.start;
        while start < offsets.end {
            let end = offsets.end.min(start.saturating_add(chunk.max(1)));
            let batch = self.generate_chunk(table, &schema, start..end)?;
            if batch.num_rows() > 0 {
                out.push(batch);
            }
            start = end;
        }
        Ok(out)
    }

    fn generate_chunk(
        &self,
        table: Table,
        schema: &SchemaRef,
        offsets: std::ops::Range<u64>,
    ) -> Result<RecordBatch> {
        let capacity = (offsets.end - offsets.start) as usize;
        let only = |t: EventType| match table {
            Table::Events => capacity,
            _ if table.event_type() == Some(t) => capacity * self.share(t) / self.denominator + 1,
            _ => 0,
        };
        let mut people = PersonColumns::with_capacity(only(EventType::Person));
        let mut auctions = AuctionColumns::with_capacity(only(EventType::Auction));
        let mut bids = BidColumns::with_capacity(only(EventType::Bid));
        let all = table == Table::Events;
        let mut kinds = Int32Builder::with_capacity(if all { capacity } else { 0 });
        let mut times = TimestampMicrosecondBuilder::with_capacity(if all { capacity } else { 0 });
        let mut s = Scratch::default();
        for offset in offsets {
            let n = self.event_number(offset);
            let kind = self.event_type(n);
            if !all && table.event_type() != Some(kind) {
                continue;
            }
            let id = self.cfg.first_event_id + n;
            let time = self.timestamp_ms(n);
            match kind {
                EventType::Person => people.append(self, id, time, &mut s),
                EventType::Auction => auctions.append(self, n, id, time, &mut s),
                EventType::Bid => bids.append(self, id, time, &mut s),
            }
            if all {
                kinds.append_value(kind as i32);
                times.append_value(time * 1000);
                if kind != EventType::Person {
                    people.append_null();
                }
                if kind != EventType::Auction {
                    auctions.append_null();
                }
                if kind != EventType::Bid {
                    bids.append_null();
                }
            }
        }
        let columns = match table {
            Table::Person => people.finish(),
            Table::Auction => auctions.finish(),
            Table::Bid => bids.finish(),
            Table::Events => {
                let strukt = |columns: Vec<ArrayRef>, fields: Fields| -> Result<ArrayRef> {
                    // A row's struct is null where its children are: they were appended
                    // together, so the children's nulls are all under the struct's.
                    let nulls = columns[0].logical_nulls();
                    Ok(Arc::new(StructArray::try_new(fields, columns, nulls)?))
                };
                vec![
                    Arc::new(kinds.finish()) as ArrayRef,
                    strukt(people.finish(), person_fields())?,
                    strukt(auctions.finish(), auction_fields())?,
                    strukt(bids.finish(), bid_fields())?,
                    Arc::new(times.finish()),
                ]
            }
        };
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }

    fn share(&self, t: EventType) -> usize {
        match t {
            EventType::Person => self.cfg.person_proportion,
            EventType::Auction => self.cfg.auction_proportion,
            EventType::Bid => self.cfg.bid_proportion,
        }
    }
}

/// Which events a nexmark source yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// Person events, one row each.
    Person,
    /// Auction events.
    Auction,
    /// Bid events.
    Bid,
    /// Every event: its type, a struct column per type (null unless of that type), its time.
    Events,
}

impl Table {
    /// The table named `name` (any case), if any.
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "person" => Some(Table::Person),
            "auction" => Some(Table::Auction),
            "bid" => Some(Table::Bid),
            "events" => Some(Table::Events),
            _ => None,
        }
    }

    /// The name the `table` option spells.
    pub fn name(self) -> &'static str {
        match self {
            Table::Person => "person",
            Table::Auction => "auction",
            Table::Bid => "bid",
            Table::Events => "events",
        }
    }

    fn event_type(self) -> Option<EventType> {
        match self {
            Table::Person => Some(EventType::Person),
            Table::Auction => Some(EventType::Auction),
            Table::Bid => Some(EventType::Bid),
            Table::Events => None,
        }
    }

    /// The columns of this table, in snake case as RisingWave's nexmark source (Flink's
    /// `dateTime` is `date_time`): SQL can name them unquoted.
    pub fn schema(self) -> SchemaRef {
        let fields = match self {
            Table::Person => person_fields(),
            Table::Auction => auction_fields(),
            Table::Bid => bid_fields(),
            Table::Events => Fields::from(vec![
                Field::new("event_type", DataType::Int32, false),
                Field::new("person", DataType::Struct(person_fields()), true),
                Field::new("auction", DataType::Struct(auction_fields()), true),
                Field::new("bid", DataType::Struct(bid_fields()), true),
                Field::new("date_time", timestamp(), false),
            ]),
        };
        Arc::new(Schema::new(fields))
    }
}

fn timestamp() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, None)
}

fn person_fields() -> Fields {
    Fields::from(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("email_address", DataType::Utf8, false),
        Field::new("credit_card", DataType::Utf8, false),
        Field::new("city", DataType::Utf8, false),
        Field::new("state", DataType::Utf8, false),
        Field::new("date_time", timestamp(), false),
        Field::new("extra", DataType::Utf8, false),
    ])
}

fn auction_fields() -> Fields {
    Fields::from(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("item_name", DataType::Utf8, false),
        Field::new("description", DataType::Utf8, false),
        Field::new("initial_bid", DataType::Int64, false),
        Field::new("reserve", DataType::Int64, false),
        Field::new("date_time", timestamp(), false),
        Field::new("expires", timestamp(), false),
        Field::new("seller", DataType::Int64, false),
        Field::new("category", DataType::Int64, false),
        Field::new("extra", DataType::Utf8, false),
    ])
}

fn bid_fields() -> Fields {
    Fields::from(vec![
        Field::new("auction", DataType::Int64, false),
        Field::new("bidder", DataType::Int64, false),
        Field::new("price", DataType::Int64, false),
        Field::new("channel", DataType::Utf8, false),
        Field::new("url", DataType::Utf8, false),
        Field::new("date_time", timestamp(), false),
        Field::new("extra", DataType::Utf8, false),
    ])
}

/// Reused text buffers, so an event's strings cost no allocation.
#[derive(Default)]
struct Scratch {
    a: String,
    b: String,
}

/// `len` random lower-case letters appended to `out`.
fn push_letters(rng: &mut SmallRng, len: usize, out: &mut String) {
    out.reserve(len);
    for _ in 0..len {
        out.push(rng.gen_range(b'a'..=b'z') as char);
    }
}

/// Random letters to bring an event of `current` bytes to about `average` bytes.
fn push_extra(rng: &mut SmallRng, current: usize, average: usize, out: &mut String) {
    out.clear();
    if current > average {
        return;
    }
    let wanted = average - current;
    let delta = (wanted + 2) / 5;
    let size = wanted - delta
        + if delta == 0 {
            0
        } else {
            rng.gen_range(0..2 * delta)
        };
    push_letters(rng, size, out);
}

/// A price in cents, log-uniform from $0.01 to $10,000.
fn price(rng: &mut SmallRng) -> i64 {
    (10.0_f32.powf(rng.r#gen::<f32>() * 6.0) * 100.0).round() as i64
}

/// Letters with about one in 13 being `delimiter`, 3 to `max - 1` of them.
fn push_delimited(rng: &mut SmallRng, max: usize, delimiter: char, out: &mut String) {
    let len = rng.gen_range(MIN_STRING_LENGTH..max);
    for _ in 0..len {
        if rng.gen_range(0..13) == 0 {
            out.push(delimiter);
        } else {
            out.push(rng.gen_range(b'a'..=b'z') as char);
        }
    }
}

/// The item URL of channel `seed`.
fn base_url(seed: u64) -> String {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut url = String::from("https://www.nexmark.com/");
    for i in 0..3 {
        if i > 0 {
            url.push('/');
        }
        push_delimited(&mut rng, 5, '_', &mut url);
    }
    url.push_str("/item.htm?query=1");
    url
}

/// The 10,000 non-hot channels and their URLs, nine in ten with a `channel_id`.
fn channels() -> &'static [(String, String)] {
    static CHANNEL_URLS: OnceLock<Vec<(String, String)>> = OnceLock::new();
    CHANNEL_URLS.get_or_init(|| {
        (0..CHANNELS)
            .map(|i| {
                let mut url = base_url(i as u64);
                let mut rng = SmallRng::seed_from_u64(i as u64);
                if rng.gen_range(0..10) > 0 {
                    url.push_str("&channel_id=");
                    url.push_str(&i64::abs((i as i32).reverse_bits() as i64).to_string());
                }
                (format!("channel-{i}"), url)
            })
            .collect()
    })
}

struct PersonColumns {
    id: Int64Builder,
    name: StringBuilder,
    email: StringBuilder,
    card: StringBuilder,
    city: StringBuilder,
    state: StringBuilder,
    time: TimestampMicrosecondBuilder,
    extra: StringBuilder,
}

impl PersonColumns {
    fn with_capacity(n: usize) -> Self {
        Self {
            id: Int64Builder::with_capacity(n),
            name: StringBuilder::with_capacity(n, n * 12),
            email: StringBuilder::with_capacity(n, n * 17),
            card: StringBuilder::with_capacity(n, n * 19),
            city: StringBuilder::with_capacity(n, n * 8),
            state: StringBuilder::with_capacity(n, n * 2),
            time: TimestampMicrosecondBuilder::with_capacity(n),
            extra: StringBuilder::with_capacity(n, n * 150),
        }
    }

    fn append(&mut self, g: &Generator, event_id: usize, time: i64, s: &mut Scratch) {
        let rng = &mut SmallRng::seed_from_u64(event_id as u64);
        let id = g.last_person_id(event_id) as u64 + FIRST_PERSON_ID;
        let (first, last) = (pick(FIRST_NAMES, rng), pick(LAST_NAMES, rng));
        s.a.clear();
        s.a.push_str(first);
        s.a.push(' ');
        s.a.push_str(last);
        self.name.append_value(&s.a);
        let mut size = 8 + s.a.len();
        s.a.clear();
        push_letters(rng, 7, &mut s.a);
        s.a.push('@');
        push_letters(rng, 5, &mut s.a);
        s.a.push_str(".com");
        self.email.append_value(&s.a);
        size += s.a.len();
        let card: [i32; 4] = std::array::from_fn(|_| rng.gen_range(0..10000));
        s.a.clear();
        use std::fmt::Write;
        let _ = write!(
            s.a,
            "{:04} {:04} {:04} {:04}",
            card[0], card[1], card[2], card[3]
        );
        self.card.append_value(&s.a);
        let city = pick(US_CITIES, rng);
        let state = pick(US_STATES, rng);
        self.city.append_value(city);
        self.state.append_value(state);
        size += s.a.len() + city.len() + state.len();
        push_extra(rng, size, g.cfg.avg_person_byte_size, &mut s.b);
        self.id.append_value(id as i64);
        self.time.append_value(time * 1000);
        self.extra.append_value(&s.b);
    }

    fn append_null(&mut self) {
        self.id.append_null();
        self.name.append_null();
        self.email.append_null();
        self.card.append_null();
        self.city.append_null();
        self.state.append_null();
        self.time.append_null();
        self.extra.append_null();
    }

    fn finish(mut self) -> Vec<ArrayRef> {
        vec![
            Arc::new(self.id.finish()),
            Arc::new(self.name.finish()),
            Arc::new(self.email.finish()),
            Arc::new(self.card.finish()),
            Arc::new(self.city.finish()),
            Arc::new(self.state.finish()),
            Arc::new(self.time.finish()),
            Arc::new(self.extra.finish()),
        ]
    }
}

fn pick<'a>(from: &[&'a str], rng: &mut SmallRng) -> &'a str {
    from.choose(rng).copied().unwrap_or_default()
}

struct AuctionColumns {
    id: Int64Builder,
    item_name: StringBuilder,
    description: StringBuilder,
    initial_bid: Int64Builder,
    reserve: Int64Builder,
    time: TimestampMicrosecondBuilder,
    expires: TimestampMicrosecondBuilder,
    seller: Int64Builder,
    category: Int64Builder,
    extra: StringBuilder,
}

impl AuctionColumns {
    fn with_capacity(n: usize) -> Self {
        Self {
            id: Int64Builder::with_capacity(n),
            item_name: StringBuilder::with_capacity(n, n * 20),
            description: StringBuilder::with_capacity(n, n * 100),
            initial_bid: Int64Builder::with_capacity(n),
            reserve: Int64Builder::with_capacity(n),
            time: TimestampMicrosecondBuilder::with_capacity(n),
            expires: TimestampMicrosecondBuilder::with_capacity(n),
            seller: Int64Builder::with_capacity(n),
            category: Int64Builder::with_capacity(n),
            extra: StringBuilder::with_capacity(n, n * 360),
        }
    }

    fn append(
        &mut self,
        g: &Generator,
        event_number: usize,
        event_id: usize,
        time: i64,
        s: &mut Scratch,
    ) {
        let c = &g.cfg;
        let rng = &mut SmallRng::seed_from_u64(event_id as u64);
        let id = g.last_auction_id(event_id) as u64 + FIRST_AUCTION_ID;
        s.a.clear();
        push_letters(rng, 20, &mut s.a);
        self.item_name.append_value(&s.a);
        let mut size = 8 + s.a.len();
        s.a.clear();
        push_letters(rng, 100, &mut s.a);
        self.description.append_value(&s.a);
        size += s.a.len() + 8 * 5;
        let initial_bid = price(rng);
        let reserve = initial_bid + price(rng);
        let expires = time.saturating_add(g.auction_length(event_number, rng, time) as i64);
        let seller = if rng.gen_range(0..c.hot_seller_ratio) > 0 {
            // The first person of the newest HOT_SELLER_RATIO people.
            (g.last_person_id(event_id) / HOT_SELLER_RATIO) * HOT_SELLER_RATIO
        } else {
            g.next_person_id(event_id, rng)
        };
        let category = FIRST_CATEGORY_ID + rng.gen_range(0..c.num_categories) as u64;
        push_extra(rng, size, c.avg_auction_byte_size, &mut s.b);
        self.id.append_value(id as i64);
        self.initial_bid.append_value(initial_bid);
        self.reserve.append_value(reserve);
        self.time.append_value(time * 1000);
        self.expires.append_value(expires.saturating_mul(1000));
        self.seller
            .append_value(seller as i64 + FIRST_PERSON_ID as i64);
        self.category.append_value(category as i64);
        self.extra.append_value(&s.b);
    }

    fn append_null(&mut self) {
        self.id.append_null();
        self.item_name.append_null();
        self.description.append_null();
        self.initial_bid.append_null();
        self.reserve.append_null();
        self.time.append_null();
        self.expires.append_null();
        self.seller.append_null();
        self.category.append_null();
        self.extra.append_null();
    }

    fn finish(mut self) -> Vec<ArrayRef> {
        vec![
            Arc::new(self.id.finish()),
            Arc::new(self.item_name.finish()),
            Arc::new(self.description.finish()),
            Arc::new(self.initial_bid.finish()),
            Arc::new(self.reserve.finish()),
            Arc::new(self.time.finish()),
            Arc::new(self.expires.finish()),
            Arc::new(self.seller.finish()),
            Arc::new(self.category.finish()),
            Arc::new(self.extra.finish()),
        ]
    }
}

struct BidColumns {
    auction: Int64Builder,
    bidder: Int64Builder,
    price: Int64Builder,
    channel: StringBuilder,
    url: StringBuilder,
    time: TimestampMicrosecondBuilder,
    extra: StringBuilder,
}

impl BidColumns {
    fn with_capacity(n: usize) -> Self {
        Self {
            auction: Int64Builder::with_capacity(n),
            bidder: Int64Builder::with_capacity(n),
            price: Int64Builder::with_capacity(n),
            channel: StringBuilder::with_capacity(n, n * 10),
            url: StringBuilder::with_capacity(n, n * 60),
            time: TimestampMicrosecondBuilder::with_capacity(n),
            extra: StringBuilder::with_capacity(n, n * 70),
        }
    }

    fn append(&mut self, g: &Generator, event_id: usize, time: i64, s: &mut Scratch) {
        let c = &g.cfg;
        let rng = &mut SmallRng::seed_from_u64(event_id as u64);
        let auction = if 0 < rng.gen_range(0..c.hot_auction_ratio) {
            // The first auction of the newest HOT_AUCTION_RATIO auctions.
            (g.last_auction_id(event_id) / HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
        } else {
            g.next_auction_id(event_id, rng)
        };
        let bidder = if 0 < rng.gen_range(0..c.hot_bidder_ratio) {
            // The second person of the newest HOT_BIDDER_RATIO people, so hot bidders are not
            // hot sellers.
            (g.last_person_id(event_id) / HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
        } else {
            g.next_person_id(event_id, rng)
        };
        let price = price(rng);
        let (channel, url) = if rng.gen_range(0..c.hot_channel_ratio) > 0 {
            let i = rng.gen_range(0..HOT_CHANNELS.len());
            (HOT_CHANNELS[i], g.hot_urls[i].as_str())
        } else {
            let all = channels();
            let (channel, url) = &all[rng.gen_range(0..all.len() as u32) as usize];
            (channel.as_str(), url.as_str())
        };
        push_extra(rng, 32, c.avg_bid_byte_size, &mut s.b);
        self.auction
            .append_value((auction as u64 + FIRST_AUCTION_ID) as i64);
        self.bidder
            .append_value((bidder as u64 + FIRST_PERSON_ID) as i64);
        self.price.append_value(price);
        self.channel.append_value(channel);
        self.url.append_value(url);
        self.time.append_value(time * 1000);
        self.extra.append_value(&s.b);
    }

    fn append_null(&mut self) {
        self.auction.append_null();
        self.bidder.append_null();
        self.price.append_null();
        self.channel.append_null();
        self.url.append_null();
        self.time.append_null();
        self.extra.append_null();
    }

    fn finish(mut self) -> Vec<ArrayRef> {
        vec![
            Arc::new(self.auction.finish()),
            Arc::new(self.bidder.finish()),
            Arc::new(self.price.finish()),
            Arc::new(self.channel.finish()),
            Arc::new(self.url.finish()),
            Arc::new(self.time.finish()),
            Arc::new(self.extra.finish()),
        ]
    }
}
