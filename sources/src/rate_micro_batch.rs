//! The `rate-micro-batch` source: exactly `rowsPerBatch` rows per micro-batch, whatever the
//! wall clock says, with event time advancing `advanceMillisPerBatch` per batch, as Spark's
//! source of the same name. Deterministic, so benchmarks and crash tests are reproducible.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use weir_common::Options;

use crate::error::overflow;
use crate::rate::{MAX_PARTITIONS, MAX_ROWS_PER_BATCH, generate_partition, rate_schema};
use crate::{
    Error, MicroBatchStream, Offset, Partitions, ReadLimit, Result, SourceContext, SourceProvider,
};

/// Definition of a `rate-micro-batch` source.
#[derive(Debug, Clone)]
pub struct RateMicroBatchSourceProvider {
    rows_per_batch: i64,
    num_partitions: Option<i64>,
    start_timestamp_ms: i64,
    advance_millis_per_batch: i64,
    schema: SchemaRef,
}

const ACCEPTED: &[&str] = &[
    "rowsPerBatch",
    "numPartitions",
    "startTimestamp",
    "advanceMillisPerBatch",
];

impl RateMicroBatchSourceProvider {
    /// Reads the options `rowsPerBatch` (required, > 0), `numPartitions` (default: the number
    /// of cores), `startTimestamp` (epoch ms of the first batch's rows, default 0) and
    /// `advanceMillisPerBatch` (default 1000).
    pub fn try_new(options: &Options) -> Result<Self> {
        let r = options.reader("rate-micro-batch source", ACCEPTED);
        r.check_known()?;
        r.required("rowsPerBatch")?;
        let rows_per_batch = r.int_between("rowsPerBatch", 1, 1, MAX_ROWS_PER_BATCH)?;
        let num_partitions = match options.get("numPartitions") {
            None => None,
            Some(_) => Some(r.int_between("numPartitions", 1, 1, MAX_PARTITIONS)?),
        };
        Ok(Self {
            rows_per_batch,
            num_partitions,
            start_timestamp_ms: r.int_at_least("startTimestamp", 0, 0)?,
            advance_millis_per_batch: r.int_at_least("advanceMillisPerBatch", 1000, 0)?,
            schema: rate_schema(),
        })
    }
}

/// Offset of a rate-micro-batch source: rows produced so far and the event time of the next
/// batch's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct RateMicroBatchOffset {
    offset: i64,
    timestamp: i64,
}

impl RateMicroBatchOffset {
    fn from(o: &Offset) -> Result<Self> {
        serde_json::from_value(o.0.clone()).map_err(|_| {
            Error::Corrupt(format!(
                "The offsets log holds '{o}' for a rate-micro-batch source, which expects \
                 {{\"offset\":N,\"timestamp\":T}}. Restore the offsets file or use a new \
                 checkpoint location."
            ))
        })
    }

    fn to_offset(self) -> Offset {
        Offset(serde_json::json!({"offset": self.offset, "timestamp": self.timestamp}))
    }
}

#[async_trait]
impl SourceProvider for RateMicroBatchSourceProvider {
    fn format(&self) -> &str {
        "rate-micro-batch"
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    async fn open(&self, _ctx: SourceContext) -> Result<Box<dyn MicroBatchStream>> {
        Ok(Box::new(RateMicroBatchStream {
            partitions: self.num_partitions.unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, |n| n.get() as i64)
            }),
            def: self.clone(),
            available_now_target: None,
            latest: None,
        }))
    }
}

struct RateMicroBatchStream {
    def: RateMicroBatchSourceProvider,
    partitions: i64,
    available_now_target: Option<RateMicroBatchOffset>,
    latest: Option<Offset>,
}

impl RateMicroBatchStream {
    fn next_after(&self, start: RateMicroBatchOffset) -> Result<RateMicroBatchOffset> {
        match (
            start.offset.checked_add(self.def.rows_per_batch),
            start
                .timestamp
                .checked_add(self.def.advance_millis_per_batch)
                .filter(|t| t.checked_mul(1000).is_some()),
        ) {
            (Some(offset), Some(timestamp)) => Ok(RateMicroBatchOffset { offset, timestamp }),
            _ => Err(overflow(format!(
                "The rate-micro-batch source cannot go past offset {} / timestamp {} ms: the \
                 next batch's values or timestamps would not fit in 64 bits. Use a smaller \
                 startTimestamp, or a new checkpoint location to start from 0.",
                start.offset, start.timestamp
            ))),
        }
    }
}

#[async_trait]
impl MicroBatchStream for RateMicroBatchStream {
    fn description(&self) -> String {
        format!(
            "RatePerMicroBatchStream[rowsPerBatch={}, numPartitions={}, startTimestamp={}, advanceMsPerBatch={}]",
            self.def.rows_per_batch,
            self.def
                .num_partitions
                .map_or("default".to_string(), |n| n.to_string()),
            self.def.start_timestamp_ms,
            self.def.advance_millis_per_batch
        )
    }

    fn initial_offset(&self) -> Offset {
        RateMicroBatchOffset {
            offset: 0,
            timestamp: self.def.start_timestamp_ms,
        }
        .to_offset()
    }

    async fn latest_offset(&mut self, start: &Offset, _limit: ReadLimit) -> Result<Offset> {
        let start = RateMicroBatchOffset::from(start)?;
        let end = match self.available_now_target {
            Some(target) if start.offset >= target.offset => start,
            _ => self.next_after(start)?,
        };
        let end = end.to_offset();
        self.latest = Some(end.clone());
        Ok(end)
    }

    fn reported_latest_offset(&self) -> Option<Offset> {
        self.latest.clone()
    }

    async fn get_batch(&mut self, start: &Offset, end: &Offset) -> Result<Partitions> {
        let (s, e) = (
            RateMicroBatchOffset::from(start)?,
            RateMicroBatchOffset::from(end)?,
        );
        if e.offset < s.offset || s.offset < 0 {
            return Err(Error::Corrupt(format!(
                "The offsets log asks the rate-micro-batch source for values {}..{}, which is \
                 not a valid range. Restore the offsets file or use a new checkpoint location.",
                s.offset, e.offset
            )));
        }
        let ts_micros = s
            .timestamp
            .checked_mul(1000)
            .ok_or_else(|| overflow(format!("timestamp {} ms is out of range", s.timestamp)))?;
        (0..self.partitions)
            .map(|p| {
                generate_partition(
                    &self.def.schema,
                    s.offset,
                    e.offset,
                    p,
                    self.partitions,
                    |_| ts_micros,
                )
            })
            .collect()
    }

    async fn prepare_for_available_now(&mut self, start: &Offset) -> Result<Offset> {
        // "Available now" for a generator is one more batch.
        let target = self.next_after(RateMicroBatchOffset::from(start)?)?;
        self.available_now_target = Some(target);
        Ok(target.to_offset())
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, TimestampMicrosecondArray};

    use super::*;

    fn ctx(dir: &tempfile::TempDir) -> SourceContext {
        SourceContext {
            metadata: weir_common::Location::local(dir.path()).unwrap(),
        }
    }

    #[tokio::test]
    async fn offsets_past_64_bits_and_damaged_ranges_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let def = RateMicroBatchSourceProvider::try_new(
            &Options::new()
                .with("rowsPerBatch", "10")
                .with("startTimestamp", i64::MAX.to_string()),
        )
        .unwrap();
        let mut s = def.open(ctx(&dir)).await.unwrap();
        let o0 = s.initial_offset();
        let err = s
            .latest_offset(&o0, ReadLimit::AllAvailable)
            .await
            .unwrap_err();
        assert_eq!(err.error_class(), "ARITHMETIC_OVERFLOW", "{err}");
        let backwards = (
            Offset(serde_json::json!({"offset": 20, "timestamp": 0})),
            Offset(serde_json::json!({"offset": 10, "timestamp": 0})),
        );
        let err = s.get_batch(&backwards.0, &backwards.1).await.unwrap_err();
        assert_eq!(err.error_class(), "CHECKPOINT_FILE_CORRUPT", "{err}");
    }

    #[tokio::test]
    async fn every_batch_has_exactly_rows_per_batch_consecutive_values_at_its_batch_time() {
        let dir = tempfile::tempdir().unwrap();
        let def = RateMicroBatchSourceProvider::try_new(
            &Options::new()
                .with("rowsPerBatch", "7")
                .with("numPartitions", "2"),
        )
        .unwrap();
        let mut s = def.open(ctx(&dir)).await.unwrap();
        let o0 = s.initial_offset();
        let o1 = s.latest_offset(&o0, ReadLimit::AllAvailable).await.unwrap();
        let o2 = s.latest_offset(&o1, ReadLimit::AllAvailable).await.unwrap();
        assert_eq!(o2.json(), r#"{"offset":14,"timestamp":2000}"#);
        let parts = s.get_batch(&o1, &o2).await.unwrap();
        let mut values = vec![];
        for b in parts.iter().flatten() {
            let v = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
            let t = b
                .column(0)
                .as_any()
                .downcast_ref::<TimestampMicrosecondArray>()
                .unwrap();
            values.extend(v.values().iter().copied());
            assert!(t.values().iter().all(|&t| t == 1_000_000));
        }
        values.sort();
        assert_eq!(values, (7..14).collect::<Vec<_>>());
        // Deterministic: the same offsets give the same rows.
        assert_eq!(s.get_batch(&o1, &o2).await.unwrap(), parts);
    }

    #[tokio::test]
    async fn available_now_stops_after_one_more_batch() {
        let dir = tempfile::tempdir().unwrap();
        let def = RateMicroBatchSourceProvider::try_new(&Options::new().with("rowsPerBatch", "5"))
            .unwrap();
        let mut s = def.open(ctx(&dir)).await.unwrap();
        let o0 = s.initial_offset();
        let target = s.prepare_for_available_now(&o0).await.unwrap();
        let o1 = s.latest_offset(&o0, ReadLimit::AllAvailable).await.unwrap();
        assert_eq!(o1, target);
        assert_eq!(
            s.latest_offset(&o1, ReadLimit::AllAvailable).await.unwrap(),
            o1
        );
    }

    #[test]
    fn rows_per_batch_is_required() {
        let err = RateMicroBatchSourceProvider::try_new(&Options::new()).unwrap_err();
        assert!(err.to_string().contains("'rowsPerBatch'"), "{err}");
    }
}
