//! Every query's per-batch health, built in (the seed's listener tutorial, without user code):
//! a listener every session has keeps each query's recent health records, which
//! `SELECT * FROM streaming_health('<query name or id>')` and [`crate::WeirSession::health`]
//! read.
//!
//! ```text
//! query ─progress event─▶ HealthLog (listener bus thread): one HealthRecord per batch,
//!                         the newest RECORDS_KEPT per query, stopped queries' too
//! streaming_health('q') ─▶ the records of the query named q (or with id q), as a table: an
//!                         active query's recent progress (up to its last batch, as the
//!                         listeners may not have had it yet) with the log's older records
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::datasource::MemTable;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Expr;
use uuid::Uuid;
use weir_common::ClassifiedError;

use super::listener::{QueryProgressEvent, StreamingQueryListener};
use super::progress::StreamingQueryProgress;
use super::query::StreamingQueryManager;

/// How many records are kept per query (the newest).
pub const RECORDS_KEPT: usize = 1000;

/// One batch's health.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthRecord {
    /// The query's id.
    pub query_id: Uuid,
    /// The query's name, if it has one.
    pub query_name: Option<String>,
    /// The batch.
    pub batch_id: u64,
    /// When the batch started (the progress record's `timestamp`).
    pub timestamp: String,
    /// Rows the batch read.
    pub num_input_rows: u64,
    /// Rows per second arriving since the previous batch.
    pub input_rows_per_second: f64,
    /// Rows per second the batch processed.
    pub processed_rows_per_second: f64,
    /// Rows arrive faster than the query processes them: input rate above 0 and processed
    /// rate below it.
    pub falling_behind: bool,
}

impl HealthRecord {
    /// The health of the batch `p` reports.
    pub fn of(p: &StreamingQueryProgress) -> Self {
        Self {
            query_id: p.id,
            query_name: p.name.clone(),
            batch_id: p.batch_id,
            timestamp: p.timestamp.clone(),
            num_input_rows: p.num_input_rows,
            input_rows_per_second: p.input_rows_per_second,
            processed_rows_per_second: p.processed_rows_per_second,
            falling_behind: p.input_rows_per_second > 0.0
                && p.processed_rows_per_second < p.input_rows_per_second,
        }
    }

    /// The columns of `streaming_health`, named as the progress record names them.
    pub fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("queryId", DataType::Utf8, false),
            Field::new("queryName", DataType::Utf8, true),
            Field::new("batchId", DataType::Int64, false),
            Field::new("timestamp", DataType::Utf8, false),
            Field::new("numInputRows", DataType::Int64, false),
            Field::new("inputRowsPerSecond", DataType::Float64, false),
            Field::new("processedRowsPerSecond", DataType::Float64, false),
            Field::new("fallingBehind", DataType::Boolean, false),
        ]))
    }

    /// `records` as one batch of [`HealthRecord::schema`].
    pub fn batch(records: &[HealthRecord]) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(
                records.iter().map(|r| r.query_id.to_string()),
            )),
            Arc::new(
                records
                    .iter()
                    .map(|r| r.query_name.clone())
                    .collect::<StringArray>(),
            ),
            Arc::new(Int64Array::from_iter_values(
                records.iter().map(|r| r.batch_id as i64),
            )),
            Arc::new(StringArray::from_iter_values(
                records.iter().map(|r| r.timestamp.clone()),
            )),
            Arc::new(Int64Array::from_iter_values(
                records.iter().map(|r| r.num_input_rows as i64),
            )),
            Arc::new(Float64Array::from_iter_values(
                records.iter().map(|r| r.input_rows_per_second),
            )),
            Arc::new(Float64Array::from_iter_values(
                records.iter().map(|r| r.processed_rows_per_second),
            )),
            Arc::new(
                records
                    .iter()
                    .map(|r| Some(r.falling_behind))
                    .collect::<BooleanArray>(),
            ),
        ];
        Ok(RecordBatch::try_new(Self::schema(), columns)?)
    }
}

/// The health records of a session's queries, by query id.
#[derive(Debug, Default)]
pub(crate) struct HealthLog {
    queries: Mutex<HashMap<Uuid, VecDeque<HealthRecord>>>,
}

impl HealthLog {
    /// The records of the query named `query` or whose id is `query` (an active one first,
    /// else the most recently active one of that name), oldest first; `None` when no query of
    /// this session matches.
    pub(crate) fn records(
        &self,
        manager: &StreamingQueryManager,
        query: &str,
    ) -> Option<Vec<HealthRecord>> {
        let query = query.trim();
        let active = manager
            .active()
            .into_iter()
            .find(|q| q.id().to_string() == query || q.name() == Some(query));
        let Some(active) = active else {
            return self.of(query);
        };
        let mut by_batch: std::collections::BTreeMap<u64, HealthRecord> = self
            .queries
            .lock()
            .ok()
            .and_then(|q| q.get(&active.id()).cloned())
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.batch_id, r))
            .collect();
        for p in active.recent_progress() {
            by_batch.insert(p.batch_id, HealthRecord::of(&p));
        }
        Some(by_batch.into_values().collect())
    }

    /// The logged records of the query named or with id `query`.
    fn of(&self, query: &str) -> Option<Vec<HealthRecord>> {
        let queries = self.queries.lock().ok()?;
        if let Ok(id) = Uuid::parse_str(query.trim())
            && let Some(r) = queries.get(&id)
        {
            return Some(r.iter().cloned().collect());
        }
        queries
            .values()
            .filter(|r| {
                r.back()
                    .is_some_and(|h| h.query_name.as_deref() == Some(query))
            })
            .max_by(|a, b| {
                a.back()
                    .map(|h| &h.timestamp)
                    .cmp(&b.back().map(|h| &h.timestamp))
            })
            .map(|r| r.iter().cloned().collect())
    }
}

impl StreamingQueryListener for HealthLog {
    fn on_query_progress(&self, e: &QueryProgressEvent) {
        if let Ok(mut queries) = self.queries.lock() {
            let records = queries.entry(e.progress.id).or_default();
            if records.len() == RECORDS_KEPT {
                records.pop_front();
            }
            records.push_back(HealthRecord::of(&e.progress));
        }
    }
}

/// `streaming_health('<query name or id>')`.
#[derive(Debug)]
pub(crate) struct StreamingHealthFunction {
    pub(crate) log: Arc<HealthLog>,
    pub(crate) manager: StreamingQueryManager,
}

impl TableFunctionImpl for StreamingHealthFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let query = match args.exprs() {
            [Expr::Literal(v, _)] => v.try_as_str().flatten().map(str::to_string),
            _ => None,
        }
        .ok_or_else(|| {
            DataFusionError::External(Box::new(ClassifiedError::new(
                "INVALID_STREAMING_HEALTH_ARGUMENT",
                "42K09",
                "streaming_health takes one argument, a streaming query's name or id as a \
                 string: streaming_health('clicks').",
            )))
        })?;
        let records = self.log.records(&self.manager, &query).ok_or_else(|| {
            DataFusionError::External(Box::new(ClassifiedError::new(
                "STREAMING_QUERY_NOT_FOUND",
                "42704",
                format!(
                    "No streaming query named '{query}' (or with that id) has run a batch in \
                     this session. Name a query with queryName / CREATE STREAMING TABLE name, \
                     and ask again once it has run a batch."
                ),
            )))
        })?;
        let batch = HealthRecord::batch(&records)?;
        Ok(Arc::new(MemTable::try_new(
            HealthRecord::schema(),
            vec![vec![batch]],
        )?))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::execution::progress::SinkProgress;

    fn progress(
        id: Uuid,
        name: &str,
        batch: u64,
        input: f64,
        processed: f64,
    ) -> QueryProgressEvent {
        QueryProgressEvent {
            progress: StreamingQueryProgress {
                id,
                run_id: Uuid::nil(),
                name: Some(name.into()),
                timestamp: format!("2026-12-06T10:00:{batch:02}.000Z"),
                batch_id: batch,
                batch_duration: 1,
                num_input_rows: 10,
                input_rows_per_second: input,
                processed_rows_per_second: processed,
                duration_ms: BTreeMap::new(),
                event_time: BTreeMap::new(),
                state_operators: vec![],
                sources: vec![],
                sink: SinkProgress {
                    description: "NoopSink".into(),
                    num_output_rows: 10,
                    metrics: BTreeMap::new(),
                },
            },
        }
    }

    #[test]
    fn falling_behind_is_input_arriving_faster_than_it_is_processed() {
        let id = Uuid::new_v4();
        let behind = |i, p| HealthRecord::of(&progress(id, "q", 0, i, p).progress).falling_behind;
        assert!(behind(100.0, 50.0));
        assert!(!behind(100.0, 100.0));
        assert!(!behind(100.0, 150.0));
        assert!(!behind(0.0, 0.0), "no input, nothing to fall behind on");
    }

    #[test]
    fn records_are_found_by_name_or_id_newest_run_first_and_bounded() {
        let log = HealthLog::default();
        let manager = StreamingQueryManager::new();
        let (old, new) = (Uuid::new_v4(), Uuid::new_v4());
        log.on_query_progress(&progress(old, "q", 0, 1.0, 1.0));
        for b in 0..(RECORDS_KEPT as u64 + 5) {
            log.on_query_progress(&progress(new, "q", b, 1.0, 1.0));
        }
        // A name finds the query that ran most recently under it.
        let by_name = log.records(&manager, "q").unwrap();
        assert_eq!(by_name.len(), RECORDS_KEPT);
        assert!(by_name.iter().all(|r| r.query_id == new));
        assert_eq!(by_name[0].batch_id, 5, "the oldest records go first");
        let by_id = log.records(&manager, &old.to_string()).unwrap();
        assert_eq!(by_id.len(), 1);
        assert!(log.records(&manager, "other").is_none());
        let batch = HealthRecord::batch(&by_id).unwrap();
        assert_eq!(batch.num_rows(), 1);
        assert_eq!(batch.schema(), HealthRecord::schema());
    }
}
