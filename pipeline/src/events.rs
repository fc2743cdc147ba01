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

/// The events of one update, kept until it ends.
#[derive(Debug)]
pub struct UpdateEvents {
    pipeline: String,
    storage: String,
    update_id: String,
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
    /// A new update of pipeline `pipeline` whose storage is `storage`.
    pub fn new(pipeline: &str, storage: &str) -> Self {
        Self {
            pipeline: pipeline.to_string(),
            storage: storage.to_string(),
            update_id: uuid::Uuid::new_v4().to_string(),
            events: vec![],
            written: 0,
            flushes: 0,
        }
    }

    /// The update's id.
    pub fn update_id(&self) -> &str {
        &self.update_id
    }

    /// Records an update-level event.
    pub fn update(&mut self, event_type: &'static str, message: String, details: Value) {
        self.events.push(Event {
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
        self.events.push(Event {
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
        self.events.push(Event {
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
