//! The `memory` source: record batches pushed from Rust (embedding and tests). Offsets count
//! the rows pushed so far; data is append-only, so a replayed batch reads the same rows. The
//! data lives only as long as the process, as Spark's `MemoryStream`.

use std::sync::{Arc, RwLock};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use weir_common::ClassifiedError;

use crate::{
    Error, MicroBatchStream, Offset, Partitions, ReadLimit, Result, SourceContext, SourceProvider,
};

/// A stream that Rust code appends record batches to. Cloning gives another handle on the same
/// stream.
#[derive(Debug, Clone)]
pub struct MemoryStream {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    schema: SchemaRef,
    /// Pushed batches with the row count before each.
    batches: RwLock<Vec<(u64, RecordBatch)>>,
    max_rows_per_trigger: Option<u64>,
}

impl MemoryStream {
    /// A new empty stream called `name` whose batches have `schema`.
    pub fn new(name: impl Into<String>, schema: SchemaRef) -> Self {
        Self::with_limit(name, schema, None)
    }

    /// A new stream whose micro-batches read at most `max_rows_per_trigger` rows each.
    pub fn with_max_rows_per_trigger(
        name: impl Into<String>,
        schema: SchemaRef,
        max_rows_per_trigger: u64,
    ) -> Self {
        Self::with_limit(name, schema, Some(max_rows_per_trigger.max(1)))
    }

    fn with_limit(
        name: impl Into<String>,
        schema: SchemaRef,
        max_rows_per_trigger: Option<u64>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                name: name.into(),
                schema,
                batches: RwLock::new(Vec::new()),
                max_rows_per_trigger,
            }),
        }
    }

    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The stream's schema.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.inner.schema)
    }

    /// Appends `batch` and returns the offset after it. The batch must have the stream's schema.
    pub fn push(&self, batch: RecordBatch) -> Result<Offset> {
        if batch.schema().fields() != self.inner.schema.fields() {
            return Err(ClassifiedError::new(
                "MEMORY_STREAM_SCHEMA_MISMATCH",
                "42K09",
                format!(
                    "A batch with schema {:?} was pushed to the memory stream '{}', whose schema is {:?}.",
                    batch.schema().fields(),
                    self.inner.name,
                    self.inner.schema.fields()
                ),
            )
            .into());
        }
        let mut batches = self.inner.batches.write().map_err(|_| poisoned())?;
        let before = batches
            .last()
            .map_or(0, |(start, b)| start + b.num_rows() as u64);
        let after = before + batch.num_rows() as u64;
        if batch.num_rows() > 0 {
            batches.push((before, batch));
        }
        Ok(Offset::long(after as i64))
    }

    /// Rows pushed so far.
    pub fn len(&self) -> u64 {
        self.inner
            .batches
            .read()
            .map_or(0, |b| b.last().map_or(0, |(s, b)| s + b.num_rows() as u64))
    }

    /// True when nothing was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn rows(&self, start: u64, end: u64) -> Result<Vec<RecordBatch>> {
        if end < start {
            return Err(Error::Corrupt(format!(
                "The offsets log asks the memory stream '{}' for rows {start}..{end}, which run \
                 backwards. Restore the offsets file or use a new checkpoint location.",
                self.name()
            )));
        }
        let batches = self.inner.batches.read().map_err(|_| poisoned())?;
        let mut out = vec![];
        for (first, b) in batches.iter() {
            let last = first + b.num_rows() as u64;
            if last <= start || *first >= end {
                continue;
            }
            let from = start.max(*first) - first;
            let to = end.min(last) - first;
            out.push(b.slice(from as usize, (to - from) as usize));
        }
        Ok(out)
    }
}

fn poisoned() -> Error {
    ClassifiedError::new(
        "INTERNAL_ERROR",
        "XX000",
        "a thread panicked while pushing to a memory stream",
    )
    .into()
}

/// The memory stream as a source definition.
#[derive(Debug, Clone)]
pub struct MemoryStreamProvider {
    stream: MemoryStream,
}

impl MemoryStreamProvider {
    /// The definition of `stream`.
    pub fn new(stream: MemoryStream) -> Self {
        Self { stream }
    }
}

#[async_trait]
impl SourceProvider for MemoryStreamProvider {
    fn format(&self) -> &str {
        "memory"
    }

    fn identity(&self) -> String {
        format!("memory:{}", self.stream.name())
    }

    fn schema(&self) -> SchemaRef {
        self.stream.schema()
    }

    async fn open(&self, _ctx: SourceContext) -> Result<Box<dyn MicroBatchStream>> {
        Ok(Box::new(MemoryReader {
            stream: self.stream.clone(),
            target: None,
            latest: None,
        }))
    }
}

struct MemoryReader {
    stream: MemoryStream,
    target: Option<u64>,
    latest: Option<u64>,
}

fn rows_of(o: &Offset) -> Result<u64> {
    o.as_long()
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| {
            Error::Corrupt(format!(
                "The offsets log holds '{o}' for a memory source, which expects a row count."
            ))
        })
}

#[async_trait]
impl MicroBatchStream for MemoryReader {
    fn description(&self) -> String {
        format!("MemoryStream[{}]", self.stream.name())
    }

    fn initial_offset(&self) -> Offset {
        Offset::long(0)
    }

    fn default_read_limit(&self) -> ReadLimit {
        self.stream
            .inner
            .max_rows_per_trigger
            .map_or(ReadLimit::AllAvailable, ReadLimit::MaxRows)
    }

    async fn latest_offset(&mut self, start: &Offset, limit: ReadLimit) -> Result<Offset> {
        let start = rows_of(start)?;
        let available = self.stream.len();
        self.latest = Some(available);
        let mut end = self.target.map_or(available, |t| t.min(available));
        if let ReadLimit::MaxRows(n) = limit {
            end = end.min(start.saturating_add(n));
        }
        Ok(Offset::long(end.max(start) as i64))
    }

    fn reported_latest_offset(&self) -> Option<Offset> {
        self.latest.map(|n| Offset::long(n as i64))
    }

    async fn get_batch(&mut self, start: &Offset, end: &Offset) -> Result<Partitions> {
        Ok(vec![self.stream.rows(rows_of(start)?, rows_of(end)?)?])
    }

    async fn prepare_for_available_now(&mut self, _start: &Offset) -> Result<Offset> {
        let t = self.stream.len();
        self.target = Some(t);
        Ok(Offset::long(t as i64))
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch(schema: &SchemaRef, v: &[i64]) -> RecordBatch {
        RecordBatch::try_new(
            Arc::clone(schema),
            vec![Arc::new(Int64Array::from(v.to_vec()))],
        )
        .unwrap()
    }

    #[tokio::test]
    async fn reads_respect_the_row_limit_and_replay_the_same_rows() {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let stream = MemoryStream::with_max_rows_per_trigger("m", Arc::clone(&schema), 3);
        stream.push(batch(&schema, &[1, 2])).unwrap();
        stream.push(batch(&schema, &[3, 4, 5])).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ctx = SourceContext {
            metadata: weir_common::Location::local(dir.path()).unwrap(),
        };
        let mut r = MemoryStreamProvider::new(stream.clone())
            .open(ctx)
            .await
            .unwrap();
        let limit = r.default_read_limit();
        let o0 = r.initial_offset();
        let o1 = r.latest_offset(&o0, limit).await.unwrap();
        assert_eq!(o1, Offset::long(3));
        let err = r.get_batch(&o1, &o0).await.unwrap_err();
        assert_eq!(err.error_class(), "CHECKPOINT_FILE_CORRUPT", "{err}");
        let got: Vec<i64> = r.get_batch(&o0, &o1).await.unwrap()[0]
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(got, vec![1, 2, 3]);
        let o2 = r.latest_offset(&o1, limit).await.unwrap();
        assert_eq!(o2, Offset::long(5));
        let again = r.get_batch(&o1, &o2).await.unwrap();
        assert_eq!(again[0].iter().map(|b| b.num_rows()).sum::<usize>(), 2);
    }

    #[test]
    fn a_batch_of_another_schema_is_refused() {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let other = Arc::new(Schema::new(vec![Field::new("w", DataType::Int64, false)]));
        let stream = MemoryStream::new("m", schema);
        let err = stream.push(batch(&other, &[1])).unwrap_err();
        assert_eq!(err.error_class(), "MEMORY_STREAM_SCHEMA_MISMATCH");
    }
}
