//! Tests of the nexmark source: its events against the `nexmark` crate's, determinism across
//! ranges and partitions, offsets and read limits, and its options.

use arrow::array::{Array, AsArray, RecordBatch, StructArray};
use arrow::compute::concat_batches;
use arrow::datatypes::{Int32Type, Int64Type, TimestampMicrosecondType};
use nexmark::event::Event;

use super::*;

fn ctx(dir: &tempfile::TempDir) -> SourceContext {
    SourceContext {
        metadata: weir_common::Location::local(dir.path()).unwrap(),
    }
}

fn source(options: &[(&str, &str)]) -> NexmarkSourceProvider {
    let o = options
        .iter()
        .fold(Options::new(), |o, (k, v)| o.with(*k, *v));
    NexmarkSourceProvider::try_new(&o).unwrap()
}

fn one(batches: Vec<RecordBatch>, table: Table) -> RecordBatch {
    concat_batches(&table.schema(), &batches).unwrap()
}

fn s(b: &RecordBatch, name: &str, i: usize) -> String {
    b.column_by_name(name)
        .unwrap()
        .as_string::<i32>()
        .value(i)
        .to_string()
}

fn n(b: &RecordBatch, name: &str, i: usize) -> i64 {
    let c = b.column_by_name(name).unwrap();
    match c.data_type() {
        DataType::Int64 => c.as_primitive::<Int64Type>().value(i),
        _ => c.as_primitive::<TimestampMicrosecondType>().value(i) / 1000,
    }
}

use arrow::datatypes::DataType;

/// The first 50,000 events (1,000 people, 3,000 auctions, 46,000 bids), every field, equal to
/// what the `nexmark` crate generates from the same configuration: the same draws in the same
/// order. Event times agree too this early (the crate's 32-bit float times are exact here).
#[test]
fn events_equal_the_nexmark_crates_field_for_field() {
    let base = 1_436_918_400_000u64;
    let crate_cfg = nexmark::config::NexmarkConfig {
        base_time: base,
        ..Default::default()
    };
    let expected: Vec<Event> = nexmark::EventGenerator::new(crate_cfg)
        .take(50_000)
        .collect();
    let g = Generator::new(NexmarkConfig::default());
    let people = one(
        g.generate(Table::Person, 0..50_000, 7_000).unwrap(),
        Table::Person,
    );
    let auctions = one(
        g.generate(Table::Auction, 0..50_000, 7_000).unwrap(),
        Table::Auction,
    );
    let bids = one(
        g.generate(Table::Bid, 0..50_000, 7_000).unwrap(),
        Table::Bid,
    );
    assert_eq!(
        (people.num_rows(), auctions.num_rows(), bids.num_rows()),
        (1_000, 3_000, 46_000)
    );
    let (mut p, mut a, mut b) = (0, 0, 0);
    for event in expected {
        match event {
            Event::Person(e) => {
                let got = (
                    n(&people, "id", p),
                    s(&people, "name", p),
                    s(&people, "email_address", p),
                    s(&people, "credit_card", p),
                    s(&people, "city", p),
                    s(&people, "state", p),
                    n(&people, "date_time", p),
                    s(&people, "extra", p),
                );
                let want = (
                    e.id as i64,
                    e.name,
                    e.email_address,
                    e.credit_card,
                    e.city,
                    e.state,
                    e.date_time as i64,
                    e.extra,
                );
                assert_eq!(got, want, "person {p}");
                p += 1;
            }
            Event::Auction(e) => {
                let got = (
                    n(&auctions, "id", a),
                    s(&auctions, "item_name", a),
                    s(&auctions, "description", a),
                    n(&auctions, "initial_bid", a),
                    n(&auctions, "reserve", a),
                    n(&auctions, "date_time", a),
                    n(&auctions, "expires", a),
                    n(&auctions, "seller", a),
                    n(&auctions, "category", a),
                    s(&auctions, "extra", a),
                );
                let want = (
                    e.id as i64,
                    e.item_name,
                    e.description,
                    e.initial_bid as i64,
                    e.reserve as i64,
                    e.date_time as i64,
                    e.expires as i64,
                    e.seller as i64,
                    e.category as i64,
                    e.extra,
                );
                assert_eq!(got, want, "auction {a}");
                a += 1;
            }
            Event::Bid(e) => {
                let got = (
                    n(&bids, "auction", b),
                    n(&bids, "bidder", b),
                    n(&bids, "price", b),
                    s(&bids, "channel", b),
                    s(&bids, "url", b),
                    n(&bids, "date_time", b),
                    s(&bids, "extra", b),
                );
                let want = (
                    e.auction as i64,
                    e.bidder as i64,
                    e.price as i64,
                    e.channel,
                    e.url,
                    e.date_time as i64,
                    e.extra,
                );
                assert_eq!(got, want, "bid {b}");
                b += 1;
            }
        }
    }
    assert_eq!((p, a, b), (1_000, 3_000, 46_000));
}

/// Far into the stream the values still equal the crate's (only the crate's times drift, by
/// its 32-bit float arithmetic): each event depends on its number alone.
#[test]
fn events_a_billion_in_equal_the_crates_values() {
    let start = 1_000_000_000u64;
    let crate_cfg = nexmark::config::NexmarkConfig {
        base_time: 0,
        ..Default::default()
    };
    let expected: Vec<Event> = nexmark::EventGenerator::new(crate_cfg)
        .with_offset(start)
        .take(500)
        .collect();
    let g = Generator::new(NexmarkConfig::default());
    let bids = one(
        g.generate(Table::Bid, start..start + 500, 100).unwrap(),
        Table::Bid,
    );
    let want: Vec<(i64, i64, i64, String)> = expected
        .into_iter()
        .filter_map(|e| match e {
            Event::Bid(b) => Some((b.auction as i64, b.bidder as i64, b.price as i64, b.extra)),
            _ => None,
        })
        .collect();
    let got: Vec<_> = (0..bids.num_rows())
        .map(|i| {
            (
                n(&bids, "auction", i),
                n(&bids, "bidder", i),
                n(&bids, "price", i),
                s(&bids, "extra", i),
            )
        })
        .collect();
    assert_eq!(got, want);
    // Exact times: 10,000 events a second, so event 10^9 is 10^5 seconds after the base time.
    assert_eq!(
        g.timestamp_ms(1_000_000_000),
        100_000_000 + 1_436_918_400_000
    );
}

/// The same events however they are cut: one range, several record batches, several
/// partitions, or read again.
#[tokio::test]
async fn the_same_offsets_give_the_same_events_however_partitioned() {
    let dir = tempfile::tempdir().unwrap();
    let whole = {
        let src = source(&[
            ("table", "bid"),
            ("eventsPerBatch", "5000"),
            ("numPartitions", "1"),
        ]);
        let mut st = src.open(ctx(&dir)).await.unwrap();
        let parts = st.get_batch(&offset(1234), &offset(6234)).await.unwrap();
        one(parts.concat(), Table::Bid)
    };
    let src = source(&[
        ("table", "bid"),
        ("eventsPerBatch", "5000"),
        ("numPartitions", "3"),
    ]);
    let mut st = src.open(ctx(&dir)).await.unwrap();
    let parts = st.get_batch(&offset(1234), &offset(6234)).await.unwrap();
    assert_eq!(parts.len(), 3);
    assert!(parts.iter().all(|p| !p.is_empty()));
    assert_eq!(one(parts.concat(), Table::Bid), whole);
    let again = st.get_batch(&offset(1234), &offset(6234)).await.unwrap();
    assert_eq!(one(again.concat(), Table::Bid), whole);
    let g = &src.generator;
    let cut = [
        g.generate(Table::Bid, 1234..3000, 333).unwrap(),
        g.generate(Table::Bid, 3000..6234, 10_000).unwrap(),
    ]
    .concat();
    assert_eq!(one(cut, Table::Bid), whole);
}

/// Two scans of one stream (q7's two `STREAM bid`) generate a batch once and read the same
/// columns; one scan alone keeps nothing between batches.
#[tokio::test]
async fn two_scans_of_one_stream_share_each_generated_batch() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(&[
        ("table", "bid"),
        ("eventsPerBatch", "5000"),
        ("numPartitions", "2"),
    ]);
    let same = |a: &Partitions, b: &Partitions| {
        a.iter().flatten().zip(b.iter().flatten()).all(|(x, y)| {
            x.columns()
                .iter()
                .zip(y.columns())
                .all(|(c, d)| c.to_data().ptr_eq(&d.to_data()))
        })
    };
    let mut first = src.open(ctx(&dir)).await.unwrap();
    let mut second = src.open(ctx(&dir)).await.unwrap();
    for (from, to) in [(0, 5000), (5000, 10000)] {
        let a = first.get_batch(&offset(from), &offset(to)).await.unwrap();
        let b = second.get_batch(&offset(from), &offset(to)).await.unwrap();
        assert!(same(&a, &b), "batch {from}..{to} was generated twice");
        assert!(
            src.shared().last.is_none(),
            "a batch read by both is let go"
        );
    }
    // Read in the other order, and by a stream reading a range the other has not.
    let b = second
        .get_batch(&offset(10000), &offset(15000))
        .await
        .unwrap();
    let a = first
        .get_batch(&offset(10000), &offset(15000))
        .await
        .unwrap();
    assert!(same(&a, &b));
    let other = first
        .get_batch(&offset(15000), &offset(20000))
        .await
        .unwrap();
    let fresh = second
        .get_batch(&offset(15000), &offset(16000))
        .await
        .unwrap();
    assert_eq!(
        one(fresh.concat(), Table::Bid),
        one(
            src.generate(15000..16000, 2).await.unwrap().concat(),
            Table::Bid
        )
    );
    assert!(!same(&other, &fresh));
    drop(second);
    let alone = first
        .get_batch(&offset(20000), &offset(25000))
        .await
        .unwrap();
    assert!(alone.iter().flatten().map(|b| b.num_rows()).sum::<usize>() > 0);
    assert!(src.shared().last.is_none(), "one scan keeps no batch");
}

/// The `events` table holds every event once, with its type, the right struct filled in, and
/// the per-type tables' rows.
#[test]
fn the_events_table_holds_each_tables_rows_under_its_type() {
    let g = Generator::new(NexmarkConfig::default());
    let events = one(
        g.generate(Table::Events, 0..5000, 1024).unwrap(),
        Table::Events,
    );
    assert_eq!(events.num_rows(), 5000);
    let kinds = events.column(0).as_primitive::<Int32Type>();
    for (table, kind, column) in [
        (Table::Person, 0, 1),
        (Table::Auction, 1, 2),
        (Table::Bid, 2, 3),
    ] {
        let rows: Vec<u32> = (0..5000u32)
            .filter(|&i| kinds.value(i as usize) == kind)
            .collect();
        let strukt: &StructArray = events.column(column).as_struct();
        assert_eq!(strukt.null_count(), 5000 - rows.len(), "{table:?}");
        let picked =
            arrow::compute::take(strukt, &arrow::array::UInt32Array::from(rows.clone()), None)
                .unwrap();
        let picked = RecordBatch::from(picked.as_struct().clone());
        let alone = one(g.generate(table, 0..5000, 5000).unwrap(), table);
        assert_eq!(picked.columns(), alone.columns(), "{table:?}");
    }
    // 1:3:46.
    assert_eq!(kinds.values().iter().filter(|&&k| k == 0).count(), 100);
    assert_eq!(kinds.values().iter().filter(|&&k| k == 1).count(), 300);
}

#[tokio::test]
async fn events_per_batch_reads_that_many_more_events_each_batch_until_num_events() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(&[("eventsPerBatch", "400"), ("numEvents", "1000")]);
    let mut st = src.open(ctx(&dir)).await.unwrap();
    let mut at = st.initial_offset();
    let mut ends = vec![];
    for _ in 0..4 {
        at = st
            .latest_offset(&at, ReadLimit::AllAvailable)
            .await
            .unwrap();
        ends.push(at.as_long().unwrap());
    }
    assert_eq!(ends, [400, 800, 1000, 1000]);
}

#[tokio::test]
async fn num_events_alone_is_available_at_once_within_max_events_per_trigger() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(&[("numEvents", "1000"), ("maxEventsPerTrigger", "300")]);
    let mut st = src.open(ctx(&dir)).await.unwrap();
    let limit = st.default_read_limit();
    assert_eq!(limit, ReadLimit::MaxRows(300));
    let o1 = st.latest_offset(&offset(0), limit).await.unwrap();
    assert_eq!(o1, offset(300));
    assert_eq!(st.reported_latest_offset(), Some(offset(1000)));
    let o4 = st.latest_offset(&offset(900), limit).await.unwrap();
    assert_eq!(o4, offset(1000));
    assert_eq!(
        st.latest_offset(&o4, ReadLimit::AllAvailable)
            .await
            .unwrap(),
        o4
    );
}

#[tokio::test]
async fn available_now_reads_to_the_end_or_one_more_batch() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(&[("numEvents", "1000"), ("maxEventsPerTrigger", "300")]);
    let mut st = src.open(ctx(&dir)).await.unwrap();
    assert_eq!(
        st.prepare_for_available_now(&offset(100)).await.unwrap(),
        offset(1000)
    );
    let src = source(&[("eventsPerBatch", "50")]);
    let mut st = src.open(ctx(&dir)).await.unwrap();
    let target = st.prepare_for_available_now(&offset(100)).await.unwrap();
    assert_eq!(target, offset(150));
    let o = st
        .latest_offset(&offset(150), ReadLimit::AllAvailable)
        .await
        .unwrap();
    assert_eq!(o, offset(150));
}

#[tokio::test]
async fn damaged_offsets_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(&[("eventsPerBatch", "50")]);
    let mut st = src.open(ctx(&dir)).await.unwrap();
    let err = st.get_batch(&offset(20), &offset(10)).await.unwrap_err();
    assert_eq!(err.error_class(), "CHECKPOINT_FILE_CORRUPT", "{err}");
    let text = Offset(serde_json::json!({"offset": 3}));
    let err = st
        .latest_offset(&text, ReadLimit::AllAvailable)
        .await
        .unwrap_err();
    assert_eq!(err.error_class(), "CHECKPOINT_FILE_CORRUPT", "{err}");
}

#[test]
fn bad_options_are_refused_naming_the_option() {
    for (options, needle) in [
        (vec![], "'eventsPerBatch'"),
        (vec![("eventsPerBatch", "10"), ("table", "bids")], "'table'"),
        (vec![("eventsPerBatch", "0")], "'eventsPerBatch'"),
        (
            vec![("eventsPerBatch", "10"), ("rateShape", "saw")],
            "'rateShape'",
        ),
        (
            vec![("eventsPerBatch", "10"), ("personProportion", "0")],
            "'personProportion'",
        ),
        (
            vec![("eventsPerBatch", "10"), ("baseTime", "yesterday")],
            "'baseTime'",
        ),
        (
            vec![("eventsPerBatch", "10"), ("firstEventRate", "-5")],
            "'firstEventRate'",
        ),
        (
            vec![("eventsPerBatch", "10"), ("eventsPerSecond", "5")],
            "'eventsPerSecond'",
        ),
    ] {
        let o = options
            .iter()
            .fold(Options::new(), |o, (k, v)| o.with(*k, *v));
        let err = NexmarkSourceProvider::try_new(&o).unwrap_err();
        assert_eq!(err.error_class(), "STREAMING_INVALID_OPTION", "{err}");
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
    let ok = source(&[
        ("eventsPerBatch", "10"),
        ("baseTime", "2015-07-15T00:00:00Z"),
        ("table", "AUCTION"),
    ]);
    assert_eq!(ok.generator.timestamp_ms(0), 1_436_918_400_000);
    assert_eq!(ok.table(), Table::Auction);
}

/// A varying rate follows its schedule: a square wave alternates between its two rates.
#[test]
fn a_square_rate_alternates_between_its_rates() {
    let g = Generator::new(NexmarkConfig {
        first_rate: 1000,
        next_rate: 100,
        rate_shape: RateShape::Square,
        rate_period_s: 20,
        base_time_ms: 0,
        ..Default::default()
    });
    // 10 s at 1,000/s (10,000 events, 1 ms apart), then 10 s at 100/s (1,000, 10 ms apart).
    assert_eq!(g.timestamp_ms(5), 5);
    assert_eq!(g.timestamp_ms(10_000), 10_000);
    assert_eq!(g.timestamp_ms(10_001), 10_010);
    assert_eq!(g.timestamp_ms(11_000), 20_000);
    assert_eq!(g.timestamp_ms(11_001), 20_001);
}
