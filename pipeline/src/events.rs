//! The events of one update, appended to the pipeline's event log (a Delta table at
//! `<storage>/_event_log`, read with `event_log('<storage>')` or `weir pipeline events`).
//!
//! ```text
//! create_update     the update and what it selected
//! update_progress   RUNNING, then COMPLETED / FAILED
//! flow_progress     per flow: STARTING, then per micro-batch RUNNING with Spark's progress
//!                   record, then COMPLETED (with its figures) / FAILED (with the error class) /
//!                   SKIPPED (a once flow done earlier) / EXCLUDED (not selected) / STOPPED
//!                   (another flow failed)
//! ```
//!
//! The events are written as the update goes: at each [`UpdateEvents::flush`] (when the update
//! starts running, after each stage, when it ends) the events since the last one are one
//! commit, carrying the update's id and the flush's number as the Delta transaction, so a
//! killed update leaves the events up to its last flush.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use serde_json::{Value, json};
use weir_common::Options;
use weir_engine::{Error, OutputMode};
use weir_sinks::Sink;
use weir_sinks::delta::DeltaSink;

/// One event.
#[derive(Debug, Clone)]
pub struct Event {
    /// When, in microseconds since the epoch.
    pub time_us: i64,
    /// `create_update`, `update_progress`, `flow_progress`.
    pub event_type: &'static str,
    /// The flow it is about, if any.
    pub flow: Option<String>,
    /// `INFO`, `WARN` or `ERROR`.
    pub level: &'static str,
    /// What happened, for a person.
    pub message: String,
    /// The error class of a failure.
    pub error_class: Option<String>,
    /// The event's details as JSON.
    pub details: Value,
}

/// Watches an update as it goes (`weir serve` shows live flow statuses and rates): every event
/// as it is recorded, before it reaches the event log, and every micro-batch of its flows.
/// Methods are called on the update's task or the session's listener thread: keep them short.
pub trait UpdateObserver: Send + Sync {
    /// An event of update `update_id` was recorded.
    fn on_event(&self, _update_id: &str, _event: &Event) {}
    /// Flow `flow` committed a micro-batch.
    fn on_flow_progress(&self, _flow: &str, _progress: &weir_engine::StreamingQueryProgress) {}
}

/// An [`UpdateObserver`] in [`crate::UpdateOptions`].
#[derive(Clone)]
pub struct Observer(pub Arc<dyn UpdateObserver>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

/// Passes each flow's micro-batches (its query is named after it) to an observer.
pub(crate) struct FlowListener(pub(crate) Arc<dyn UpdateObserver>);

impl weir_engine::StreamingQueryListener for FlowListener {
    fn on_query_progress(&self, e: &weir_engine::QueryProgressEvent) {
        if let Some(flow) = &e.progress.name {
            self.0.on_flow_progress(flow, &e.progress);
        }
    }
}

/// The events of one update, kept until it ends.
#[derive(Debug)]
pub struct UpdateEvents {
    pipeline: String,
    storage: String,
    update_id: String,
    observer: Option<Observer>,
    events: Vec<Event>,
    /// How many of `events` are in the event log.
    written: usize,
    /// How many flushes wrote.
    flushes: u64,
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

impl UpdateEvents {
    /// A new update of pipeline `pipeline` whose storage is `storage`, with `update_id` (a new
    /// one if none), its events also passed to `observer`.
    pub fn new(
        pipeline: &str,
        storage: &str,
        update_id: Option<String>,
        observer: Option<Observer>,
    ) -> Self {
        Self {
            pipeline: pipeline.to_string(),
            storage: storage.to_string(),
            update_id: update_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            observer,
            events: vec![],
            written: 0,
            flushes: 0,
        }
    }

    /// The update's id.
    pub fn update_id(&self) -> &str {
        &self.update_id
    }

    fn record(&mut self, event: Event) {
        if let Some(o) = &self.observer {
            o.0.on_event(&self.update_id, &event);
        }
        self.events.push(event);
    }

    /// Records an update-level event.
    pub fn update(&mut self, event_type: &'static str, message: String, details: Value) {
        self.record(Event {
            time_us: now_us(),
            event_type,
            flow: None,
            level: "INFO",
            message,
            error_class: None,
            details,
        });
    }

    /// Records a flow's status change.
    pub fn flow(&mut self, flow: &str, status: &str, message: String, details: Value) {
        self.record(Event {
            time_us: now_us(),
            event_type: "flow_progress",
            flow: Some(flow.to_string()),
            level: "INFO",
            message,
            error_class: None,
            details: json!({ "flow_progress": merge(json!({ "status": status }), details) }),
        });
    }

    /// Records a flow's failure with `error`.
    pub fn flow_failed(&mut self, flow: &str, error: &Error) {
        self.record(Event {
            time_us: now_us(),
            event_type: "flow_progress",
            flow: Some(flow.to_string()),
            level: "ERROR",
            message: format!("Flow '{flow}' has FAILED: {error}"),
            error_class: Some(error.error_class().to_string()),
            details: json!({ "flow_progress": {
                "status": "FAILED",
                "error": { "error_class": error.error_class(), "sql_state": error.sql_state() },
            }}),
        });
    }

    /// Appends the events recorded since the last flush to the event log, in one commit.
    pub async fn flush(&mut self) -> Result<(), Error> {
        if self.written == self.events.len() {
            return Ok(());
        }
        let schema = weir_engine::event_log::schema();
        let new = &self.events[self.written..];
        let n = new.len();
        let first = self.written as i64;
        let strings = |f: &dyn Fn(&Event) -> Option<String>| -> ArrayRef {
            Arc::new(StringArray::from(new.iter().map(f).collect::<Vec<_>>()))
        };
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(
                (0..n)
                    .map(|_| uuid::Uuid::new_v4().to_string())
                    .collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from_iter_values(first..first + n as i64)),
            Arc::new(
                TimestampMicrosecondArray::from_iter_values(new.iter().map(|e| e.time_us))
                    .with_timezone("UTC"),
            ),
            strings(&|_| Some(self.pipeline.clone())),
            strings(&|_| Some(self.update_id.clone())),
            strings(&|e| Some(e.event_type.to_string())),
            strings(&|e| e.flow.clone()),
            strings(&|e| Some(e.level.to_string())),
            strings(&|e| Some(e.message.clone())),
            strings(&|e| e.error_class.clone()),
            strings(&|e| Some(e.details.to_string())),
        ];
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns)
            .map_err(|e| Error::Internal(format!("the event log's rows: {e}")))?;
        let path = weir_engine::event_log::location(&self.storage);
        let sink = DeltaSink::try_new(
            &Options::new().with("path", &path),
            &schema,
            OutputMode::Append,
        )?;
        sink.open(&self.update_id).await?;
        sink.add_batch(self.flushes, schema, vec![batch]).await?;
        self.written = self.events.len();
        self.flushes += 1;
        Ok(())
    }
}

/// `a` with the fields of `b` added (both objects).
fn merge(mut a: Value, b: Value) -> Value {
    if let (Value::Object(a), Value::Object(b)) = (&mut a, b) {
        a.extend(b);
    }
    a
}
