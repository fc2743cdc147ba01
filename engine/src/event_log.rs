//! A pipeline's event log: a Delta table at `<storage>/_event_log` that every pipeline update
//! appends its events to, and the table function `event_log('<storage>')` that reads it.
//!
//! ```text
//! id  sequence  timestamp  pipeline_name  update_id  event_type  flow_name  level  message
//! error_class  details (JSON: the flow's status and Spark's progress record, the update's state)
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Expr;
use weir_common::ClassifiedError;

/// Where under a pipeline's storage its event log is.
pub const EVENT_LOG_DIR: &str = "_event_log";

/// The event log's columns.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("sequence", DataType::Int64, false),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("pipeline_name", DataType::Utf8, false),
        Field::new("update_id", DataType::Utf8, false),
        Field::new("event_type", DataType::Utf8, false),
        Field::new("flow_name", DataType::Utf8, true),
        Field::new("level", DataType::Utf8, false),
        Field::new("message", DataType::Utf8, false),
        Field::new("error_class", DataType::Utf8, true),
        Field::new("details", DataType::Utf8, false),
    ]))
}

/// The event log of the pipeline whose storage is `storage`.
pub fn location(storage: &str) -> String {
    format!("{}/{EVENT_LOG_DIR}", storage.trim_end_matches('/'))
}

/// `event_log('<storage>')`.
#[derive(Debug)]
pub(crate) struct EventLogFunction;

impl TableFunctionImpl for EventLogFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let storage = match args.exprs() {
            [Expr::Literal(v, _)] => v.try_as_str().flatten().map(str::to_string),
            _ => None,
        }
        .ok_or_else(|| {
            DataFusionError::External(Box::new(ClassifiedError::new(
                "INVALID_EVENT_LOG_ARGUMENT",
                "42K09",
                "event_log takes one argument, the pipeline's storage as a string: \
                 event_log('/data/pipeline-storage').",
            )))
        })?;
        let url = weir_common::delta::table_url(&location(&storage), false)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(Arc::new(crate::delta_table::DeltaLatestTable::new(
            url,
            HashMap::new(),
            schema(),
        )))
    }
}
