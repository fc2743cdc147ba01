//! Event-time watermarks (Spark's `withWatermark`): a logical node that marks a timestamp
//! column of a stream as event time with an allowed lateness (`delay`).
//!
//! The node passes rows through unchanged. The engine plans it as a physical operator that
//! records the batch's event times; the watermark of the next batch is `max(event time seen) -
//! delay` (the minimum over the query's watermark nodes), and stateful operators use it to
//! drop late rows and to finalise and evict state.
//!
//! SQL: `FROM STREAM src WATERMARK col DELAY OF INTERVAL 10 SECONDS` (Databricks' form) or
//! `STREAM(src, watermark => 'col', delay => '10 seconds')`. Rust:
//! [`with_watermark`]`(plan, "col", "10 seconds")`.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::TreeNode;
use datafusion::common::{Column, DFSchemaRef, Result, plan_err};
use datafusion::logical_expr::{Expr, Extension, LogicalPlan, UserDefinedLogicalNodeCore};
use weir_common::ClassifiedError;

/// `input` with `column` as its event time, `delay` milliseconds of lateness allowed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct WatermarkNode {
    /// The stream.
    pub input: LogicalPlan,
    /// The event-time column (a timestamp).
    pub column: Column,
    /// How late a row may arrive, in milliseconds.
    pub delay_ms: i64,
}

impl WatermarkNode {
    /// The node of `plan`, if it is one.
    pub fn of(plan: &LogicalPlan) -> Option<&WatermarkNode> {
        match plan {
            LogicalPlan::Extension(e) => e.node.as_any().downcast_ref::<WatermarkNode>(),
            _ => None,
        }
    }
}

impl UserDefinedLogicalNodeCore for WatermarkNode {
    fn name(&self) -> &str {
        "EventTimeWatermark"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        self.input.schema()
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![Expr::Column(self.column.clone())]
    }

    /// Filters on other columns may run before the node; a filter on the event time may not,
    /// or it would hide rows from the watermark.
    fn prevent_predicate_push_down_columns(&self) -> HashSet<String> {
        HashSet::from([self.column.name.clone()])
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "EventTimeWatermark: {} delay={}ms",
            self.column, self.delay_ms
        )
    }

    fn with_exprs_and_inputs(
        &self,
        exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let column = match exprs.as_slice() {
            [Expr::Column(c)] => c.clone(),
            _ => return plan_err!("EventTimeWatermark takes one column"),
        };
        let Some(input) = inputs.pop() else {
            return plan_err!("EventTimeWatermark takes one input");
        };
        Ok(Self {
            input,
            column,
            delay_ms: self.delay_ms,
        })
    }

    fn necessary_children_exprs(&self, output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        let mut needed = output_columns.to_vec();
        let idx = self.input.schema().index_of_column(&self.column).ok()?;
        if !needed.contains(&idx) {
            needed.push(idx);
            needed.sort_unstable();
        }
        Some(vec![needed])
    }

    fn supports_limit_pushdown(&self) -> bool {
        false
    }
}

fn invalid(message: String) -> ClassifiedError {
    ClassifiedError::new("INVALID_WATERMARK", "42K0E", message)
}

/// `plan` with `column` as event time and `delay` (e.g. `"10 seconds"`) of lateness allowed.
pub fn with_watermark(
    plan: LogicalPlan,
    column: &str,
    delay: &str,
) -> std::result::Result<LogicalPlan, ClassifiedError> {
    let col = plan
        .schema()
        .qualified_field_with_unqualified_name(column)
        .map(|(q, f)| Column::new(q.cloned(), f.name()))
        .map_err(|_| {
            invalid(format!(
                "The watermark column '{column}' is not a column of the stream (it has {}).",
                plan.schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
    let (_, field) = plan
        .schema()
        .qualified_field_with_unqualified_name(column)
        .map_err(|e| invalid(e.to_string()))?;
    if !matches!(field.data_type(), DataType::Timestamp(..)) {
        return Err(invalid(format!(
            "The watermark column '{column}' is {}, not a timestamp. Cast it, e.g. \
             to_timestamp_millis(...), and put the watermark on the result.",
            field.data_type()
        )));
    }
    let d = weir_common::parse_duration(delay, Duration::from_secs(1))
        .map_err(|e| invalid(format!("The watermark delay {e}")))?;
    let delay_ms = i64::try_from(d.as_millis())
        .map_err(|_| invalid(format!("The watermark delay '{delay}' is too long.")))?;
    Ok(LogicalPlan::Extension(Extension {
        node: Arc::new(WatermarkNode {
            input: plan,
            column: col,
            delay_ms,
        }),
    }))
}

/// The names of `plan`'s watermarked columns: each watermark node's column, the aliases
/// projections give them (`timestamp AS t`), as Spark keeps an aliased attribute's event-time
/// metadata, and an aggregation's event-time key (its window, whose end is the event time of
/// the group's row), as Spark's chained time-window aggregations.
pub fn watermarked_columns(plan: &LogicalPlan) -> Vec<String> {
    let mut out: Vec<String> = plan
        .inputs()
        .into_iter()
        .flat_map(watermarked_columns)
        .collect();
    if let Some(w) = WatermarkNode::of(plan) {
        out.push(w.column.name.clone());
    }
    if let LogicalPlan::Aggregate(agg) = plan {
        let session_time = crate::session_window::session_time_column(&agg.input);
        for (i, e) in agg.group_expr.iter().enumerate() {
            if crate::analysis::is_event_time_key(e, &out, session_time.as_ref()) {
                out.push(agg.schema.field(i).name().clone());
            }
        }
    }
    if let LogicalPlan::Projection(p) = plan {
        for e in &p.expr {
            if let Expr::Alias(a) = e
                && let Expr::Column(c) = a.expr.as_ref()
                && out.contains(&c.name)
            {
                out.push(a.name.clone());
            }
        }
    }
    out
}

/// The watermark nodes of `plan`, in plan-traversal order.
pub fn watermark_nodes(plan: &LogicalPlan) -> Vec<WatermarkNode> {
    let mut out = vec![];
    let _ = plan.apply(|n| {
        if let Some(w) = WatermarkNode::of(n) {
            out.push(w.clone());
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    out
}
