//! The `rate` source: `rowsPerSecond` rows every second (after an optional ramp-up), with
//! columns `timestamp` and `value`, as Spark's rate source. Offsets are whole seconds since the
//! query's first start, which is kept in the checkpoint so a restart continues the same
//! sequence.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow::array::{Int64Array, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use weir_common::{ClassifiedError, Options};

use crate::kept::KeptFile;
use crate::{
    Error, MicroBatchStream, Offset, Partitions, ReadLimit, Result, SourceContext, SourceProvider,
};

/// Rows per generated record batch.
pub(crate) const CHUNK_ROWS: usize = 1 << 17;

/// The most rows one micro-batch of a rate source holds (16 GiB of `timestamp` and `value`):
/// `rowsPerSecond` and `rowsPerBatch` are at most this, and a rate source that fell behind
/// catches up over several batches of at most this many rows.
pub const MAX_ROWS_PER_BATCH: i64 = 1 << 30;

/// The most partitions a rate source's batch is split into (`numPartitions`).
pub const MAX_PARTITIONS: i64 = 1 << 16;

/// The schema of the rate sources: `timestamp TIMESTAMP, value BIGINT`.
pub(crate) fn rate_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("value", DataType::Int64, false),
    ]))
}

/// Builds partition `p` of `num_partitions` of the values `range_start..range_end`: the values
/// `range_start + p`, stepping by `num_partitions`, each with the timestamp `ts_micros(v)`.
pub(crate) fn generate_partition(
    schema: &SchemaRef,
    range_start: i64,
    range_end: i64,
    p: i64,
    num_partitions: i64,
    ts_micros: impl Fn(i64) -> i64,
) -> Result<Vec<RecordBatch>> {
    match range_end.checked_sub(range_start) {
        Some(rows) if (0..=MAX_ROWS_PER_BATCH).contains(&rows) => {}
        _ => {
            return Err(Error::Corrupt(format!(
                "A rate source was asked for the values {range_start}..{range_end}, more than \
                 the {MAX_ROWS_PER_BATCH} rows a batch holds: the offsets log does not hold what \
                 weir wrote. Restore it, or use a new checkpoint location."
            )));
        }
    }
    let Some(first) = range_start.checked_add(p).filter(|f| *f < range_end) else {
        return Ok(vec![]);
    };
    // range_end - first is at most MAX_ROWS_PER_BATCH and num_partitions at most
    // MAX_PARTITIONS, so neither this sum nor the values below overflow.
    let count = (range_end - first + num_partitions - 1) / num_partitions;
    let mut out = Vec::with_capacity(count as usize / CHUNK_ROWS + 1);
    let mut i = 0i64;
    while i < count {
        let n = (count - i).min(CHUNK_ROWS as i64);
        let values = Int64Array::from_iter_values((i..i + n).map(|k| first + k * num_partitions));
        let ts = TimestampMicrosecondArray::from_iter_values(
            values.values().iter().map(|&v| ts_micros(v)),
        )
        .with_timezone("UTC");
        out.push(RecordBatch::try_new(
            Arc::clone(schema),
            vec![Arc::new(ts), Arc::new(values)],
        )?);
        i += n;
    }
    Ok(out)
}

/// Definition of a `rate` source.
#[derive(Debug, Clone)]
pub struct RateSourceProvider {
    rows_per_second: i64,
    ramp_up_seconds: i64,
    num_partitions: Option<i64>,
    schema: SchemaRef,
}

const ACCEPTED: &[&str] = &["rowsPerSecond", "rampUpTime", "numPartitions"];

impl RateSourceProvider {
    /// Reads the options `rowsPerSecond` (default 1), `rampUpTime` (default 0 seconds) and
    /// `numPartitions` (default: the number of cores).
    pub fn try_new(options: &Options) -> Result<Self> {
        let r = options.reader("rate source", ACCEPTED);
        r.check_known()?;
        let rows_per_second = r.int_between("rowsPerSecond", 1, 1, MAX_ROWS_PER_BATCH)?;
        let ramp_up = r.duration("rampUpTime", Duration::ZERO, Duration::from_secs(1))?;
        let num_partitions = match options.get("numPartitions") {
            None => None,
            Some(_) => Some(r.int_between("numPartitions", 1, 1, MAX_PARTITIONS)?),
        };
        // As Spark: every offset the source can reach must fit in 64 bits.
        let max_seconds = i64::MAX / rows_per_second;
        let ramp_up_seconds = i64::try_from(ramp_up.as_secs())
            .ok()
            .filter(|s| *s <= max_seconds)
            .ok_or_else(|| {
                ClassifiedError::invalid_option(format!(
                    "Invalid value for option 'rampUpTime' of the rate source: {} seconds is \
                     longer than the {max_seconds} seconds after which {rows_per_second} rows \
                     per second overflow a BIGINT.",
                    ramp_up.as_secs()
                ))
            })?;
        Ok(Self {
            rows_per_second,
            ramp_up_seconds,
            num_partitions,
            schema: rate_schema(),
        })
    }
}

#[async_trait]
impl SourceProvider for RateSourceProvider {
    fn format(&self) -> &str {
        "rate"
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    async fn open(&self, ctx: SourceContext) -> Result<Box<dyn MicroBatchStream>> {
        let start_time_ms = read_or_write_start_time(&ctx).await?;
        Ok(Box::new(RateStream {
            def: self.clone(),
            start_time_ms,
            partitions: self.num_partitions.unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, |n| n.get() as i64)
            }),
            latest: None,
            available_now_target: None,
        }))
    }
}

/// The rate source remembers when the query first started (`sources/<i>/0`, a kept file
/// holding the epoch milliseconds), so a restarted query continues the same sequence of values
/// and timestamps.
async fn read_or_write_start_time(ctx: &SourceContext) -> Result<i64> {
    let kept = KeptFile {
        dir: &ctx.metadata,
        name: "0",
        what: "The rate source's start time",
    };
    let parse = |body: String| -> Result<i64> {
        body.trim().parse().map_err(|_| {
            Error::Corrupt(format!(
                "The rate source's start time '{}/0' in the checkpoint does not hold a time \
                 ('{body}'). Restore it, or use a new checkpoint location.",
                ctx.metadata.display()
            ))
        })
    };
    if let Some(body) = kept.read().await? {
        return parse(body);
    }
    // If another run wrote it first, its time is the one that counts.
    parse(kept.keep(now_ms().to_string()).await?)
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The number of values generated in the first `seconds` seconds, with a linear ramp-up of
/// `ramp_up` seconds to `rows_per_second` (Spark's `valueAtSecond`).
pub(crate) fn value_at_second(seconds: i64, rows_per_second: i64, ramp_up: i64) -> i64 {
    let speed_delta_per_second = rows_per_second / (ramp_up + 1);
    if seconds <= ramp_up {
        if seconds % 2 == 1 {
            (seconds + 1) / 2 * speed_delta_per_second * seconds
        } else {
            seconds / 2 * speed_delta_per_second * (seconds + 1)
        }
    } else {
        let ramp_up_part = value_at_second(ramp_up, rows_per_second, ramp_up);
        ramp_up_part + (seconds - ramp_up) * rows_per_second
    }
}

struct RateStream {
    def: RateSourceProvider,
    start_time_ms: i64,
    partitions: i64,
    latest: Option<i64>,
    available_now_target: Option<i64>,
}

impl RateStream {
    fn seconds(offset: &Offset) -> Result<i64> {
        offset.as_long().ok_or_else(|| {
            Error::Corrupt(format!(
                "The offsets log holds '{offset}' for a rate source, which expects a number of \
                 seconds. Restore the offsets file or use a new checkpoint location."
            ))
        })
    }
}

#[async_trait]
impl MicroBatchStream for RateStream {
    fn runs_first_batch_without_data(&self) -> bool {
        true
    }

    fn description(&self) -> String {
        format!(
            "RateStreamV2[rowsPerSecond={}, rampUpTimeSeconds={}, numPartitions={}",
            self.def.rows_per_second,
            self.def.ramp_up_seconds,
            self.def
                .num_partitions
                .map_or("default".to_string(), |n| n.to_string())
        )
    }

    fn initial_offset(&self) -> Offset {
        Offset::long(0)
    }

    async fn latest_offset(&mut self, start: &Offset, _limit: ReadLimit) -> Result<Offset> {
        let start = Self::seconds(start)?;
        let elapsed = (now_ms().saturating_sub(self.start_time_ms) / 1000).max(start);
        self.latest = Some(elapsed);
        let end = self
            .available_now_target
            .map_or(elapsed, |t| elapsed.min(t).max(start));
        // A source that fell behind (a query stopped for a day) catches up in batches of at
        // most MAX_ROWS_PER_BATCH rows.
        let most = start.saturating_add((MAX_ROWS_PER_BATCH / self.def.rows_per_second).max(1));
        let end = end.min(most);
        Ok(Offset::long(end))
    }

    fn reported_latest_offset(&self) -> Option<Offset> {
        self.latest.map(Offset::long)
    }

    async fn get_batch(&mut self, start: &Offset, end: &Offset) -> Result<Partitions> {
        let (start_s, end_s) = (Self::seconds(start)?, Self::seconds(end)?);
        if end_s < start_s {
            return Err(ClassifiedError::new(
                "INTERNAL_ERROR",
                "XX000",
                format!("rate source asked for seconds {start_s}..{end_s}, which run backwards"),
            )
            .into());
        }
        let (rps, ramp) = (self.def.rows_per_second, self.def.ramp_up_seconds);
        let max_seconds = i64::MAX / rps;
        let local_start_ms = start_s
            .checked_mul(1000)
            .and_then(|ms| ms.checked_add(self.start_time_ms))
            .filter(|_| start_s >= 0 && end_s <= max_seconds)
            .filter(|_| end_s.checked_mul(1_000_000).is_some())
            .ok_or_else(|| {
                crate::error::overflow(format!(
                    "Integer overflow. Max offset with {rps} rowsPerSecond is {max_seconds}, but \
                     it is {end_s} now. Use a new checkpoint location."
                ))
            })?;
        let range_start = value_at_second(start_s, rps, ramp);
        let range_end = value_at_second(end_s, rps, ramp);
        let ms_per_value = if range_end > range_start {
            ((end_s - start_s) * 1000) as f64 / (range_end - range_start) as f64
        } else {
            0.0
        };
        let ts = |v: i64| {
            (local_start_ms + ((v - range_start) as f64 * ms_per_value).round() as i64) * 1000
        };
        (0..self.partitions)
            .map(|p| {
                generate_partition(
                    &self.def.schema,
                    range_start,
                    range_end,
                    p,
                    self.partitions,
                    ts,
                )
            })
            .collect()
    }

    async fn prepare_for_available_now(&mut self, start: &Offset) -> Result<Offset> {
        let start = Self::seconds(start)?;
        let target = ((now_ms() - self.start_time_ms) / 1000).max(start);
        self.available_now_target = Some(target);
        Ok(Offset::long(target))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_at_second_ramps_up_linearly_then_runs_at_the_rate() {
        // rampUpTime 4 s to 10 rows/s: speeds 0 2 4 6 8 10 10 -> ends 0 2 6 12 20 30 40.
        let ends: Vec<i64> = (0..7).map(|s| value_at_second(s, 10, 4)).collect();
        assert_eq!(ends, vec![0, 2, 6, 12, 20, 30, 40]);
        assert_eq!(value_at_second(3, 100, 0), 300);
    }

    #[test]
    fn a_ramp_up_too_long_for_64_bit_offsets_is_an_option_error() {
        let err = RateSourceProvider::try_new(
            &Options::new()
                .with("rowsPerSecond", "1000000")
                .with("rampUpTime", "1000000000000000 seconds"),
        )
        .unwrap_err();
        assert_eq!(err.error_class(), "STREAMING_INVALID_OPTION", "{err}");
    }

    #[tokio::test]
    async fn an_offset_past_64_bits_is_an_overflow_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let def =
            RateSourceProvider::try_new(&Options::new().with("rowsPerSecond", "1000")).unwrap();
        let mut s = def
            .open(SourceContext {
                metadata: weir_common::Location::local(dir.path()).unwrap(),
            })
            .await
            .unwrap();
        let huge = Offset(serde_json::json!(i64::MAX / 10));
        let err = s
            .get_batch(&Offset(serde_json::json!(0)), &huge)
            .await
            .unwrap_err();
        assert_eq!(err.error_class(), "ARITHMETIC_OVERFLOW", "{err}");
    }

    #[tokio::test]
    async fn counts_that_size_a_batch_are_bounded_by_errors_not_allocations() {
        for (key, value) in [
            ("rowsPerSecond", i64::MAX.to_string()),
            ("rowsPerSecond", (1i64 << 62).to_string()),
            ("numPartitions", "1000000000000".to_string()),
        ] {
            let err =
                RateSourceProvider::try_new(&Options::new().with(key, value.as_str())).unwrap_err();
            assert_eq!(err.error_class(), "STREAMING_INVALID_OPTION", "{err}");
            assert!(err.to_string().contains(key), "{err}");
        }
        // A source far behind its clock catches up in bounded batches.
        let def = RateSourceProvider::try_new(
            &Options::new().with("rowsPerSecond", MAX_ROWS_PER_BATCH.to_string()),
        )
        .unwrap();
        let mut s = RateStream {
            def,
            start_time_ms: now_ms() - 3_600_000,
            partitions: 1,
            latest: None,
            available_now_target: None,
        };
        let end = s
            .latest_offset(&Offset::long(0), ReadLimit::AllAvailable)
            .await
            .unwrap();
        assert_eq!(end, Offset::long(1), "one second of 2^30 rows, not an hour");
        // A range of 2^62 values is refused before anything is allocated.
        let err = generate_partition(&rate_schema(), 0, 1 << 62, 0, 1, |v| v).unwrap_err();
        assert_eq!(err.error_class(), "CHECKPOINT_FILE_CORRUPT", "{err}");
        let err = generate_partition(&rate_schema(), i64::MIN, i64::MAX, 0, 1, |v| v).unwrap_err();
        assert_eq!(err.error_class(), "CHECKPOINT_FILE_CORRUPT", "{err}");
        assert!(
            generate_partition(&rate_schema(), i64::MAX - 2, i64::MAX, 5, 7, |v| v)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn options_are_checked() {
        assert!(RateSourceProvider::try_new(&Options::new().with("rowsPerSecond", "0")).is_err());
        assert!(RateSourceProvider::try_new(&Options::new().with("rampUpTime", "later")).is_err());
        let p = RateSourceProvider::try_new(&Options::new().with("rampUpTime", "5s")).unwrap();
        assert_eq!(p.ramp_up_seconds, 5);
    }

    #[tokio::test]
    async fn a_batch_holds_each_value_once_spread_over_partitions_with_timestamps_in_its_seconds() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = SourceContext {
            metadata: weir_common::Location::local(dir.path()).unwrap(),
        };
        let def = RateSourceProvider::try_new(
            &Options::new()
                .with("rowsPerSecond", "10")
                .with("numPartitions", "3"),
        )
        .unwrap();
        let mut s = def.open(ctx.clone()).await.unwrap();
        let start_file = std::fs::read_to_string(dir.path().join("0")).unwrap();
        let start_ms: i64 = start_file.lines().nth(1).unwrap().parse().unwrap();
        let parts = s
            .get_batch(&Offset::long(1), &Offset::long(3))
            .await
            .unwrap();
        assert_eq!(parts.len(), 3);
        let mut values: Vec<i64> = vec![];
        for b in parts.iter().flatten() {
            let v = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
            let t = b
                .column(0)
                .as_any()
                .downcast_ref::<TimestampMicrosecondArray>()
                .unwrap();
            for i in 0..b.num_rows() {
                values.push(v.value(i));
                let rel_ms = t.value(i) / 1000 - start_ms;
                assert!(
                    (1000..3000).contains(&rel_ms),
                    "timestamp {rel_ms} ms outside seconds 1..3"
                );
            }
        }
        values.sort();
        assert_eq!(values, (10..30).collect::<Vec<_>>());
        // The start time is kept: opening again (a restart) does not rewrite it.
        let _again = def.open(ctx).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("0")).unwrap(),
            start_file
        );
    }
}
