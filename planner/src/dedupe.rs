//! Streaming deduplication (Spark's `dropDuplicates` and `dropDuplicatesWithinWatermark`): a
//! logical node that keeps the first row of each key and drops later ones.
//!
//! SQL: `SELECT DISTINCT ON (k1, k2) ...` over a stream becomes this node (keys must be columns;
//! no `ORDER BY`: the first row is the first to arrive); `SELECT DISTINCT ON (k1, k2) WITHIN
//! WATERMARK ...` is `dropDuplicatesWithinWatermark`. Rust: [`drop_duplicates`] and
//! [`drop_duplicates_within_watermark`]. The engine plans it as a stateful operator that keeps
//! every key seen; when an event-time column is among the keys (or, within the watermark, for
//! each key's first event time plus the delay) the watermark evicts keys that can no longer
//! repeat.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchemaRef, Result, plan_err};
use datafusion::logical_expr::{
    Distinct, Expr, Extension, LogicalPlan, LogicalPlanBuilder, UserDefinedLogicalNodeCore,
};
use weir_common::ClassifiedError;

use crate::analysis::is_streaming;

/// `input` without the rows whose `keys` were seen before.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct DeduplicateNode {
    /// The stream.
    pub input: LogicalPlan,
    /// The key columns.
    pub keys: Vec<Column>,
    /// `dropDuplicatesWithinWatermark`: a key is remembered only until the watermark passes its
    /// first event time plus the watermark delay.
    pub within_watermark: bool,
}

impl DeduplicateNode {
    /// The node of `plan`, if it is one.
    pub fn of(plan: &LogicalPlan) -> Option<&DeduplicateNode> {
        match plan {
            LogicalPlan::Extension(e) => e.node.as_any().downcast_ref::<DeduplicateNode>(),
            _ => None,
        }
    }
}

impl UserDefinedLogicalNodeCore for DeduplicateNode {
    fn name(&self) -> &str {
        if self.within_watermark {
            "DeduplicateWithinWatermark"
        } else {
            "Deduplicate"
        }
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        self.input.schema()
    }

    fn expressions(&self) -> Vec<Expr> {
        self.keys.iter().cloned().map(Expr::Column).collect()
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> = self.keys.iter().map(|k| k.to_string()).collect();
        write!(f, "{}: keys=[{}]", self.name(), keys.join(", "))
    }

    fn with_exprs_and_inputs(
        &self,
        exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let keys = exprs
            .into_iter()
            .map(|e| match e {
                Expr::Column(c) => Ok(c),
                other => plan_err!("Deduplicate keys must be columns, not {other}"),
            })
            .collect::<Result<Vec<_>>>()?;
        let Some(input) = inputs.pop() else {
            return plan_err!("Deduplicate takes one input");
        };
        Ok(Self {
            input,
            keys,
            within_watermark: self.within_watermark,
        })
    }
}

fn invalid(message: String) -> ClassifiedError {
    ClassifiedError::new("UNRESOLVED_COLUMN.WITH_SUGGESTION", "42703", message)
}

fn dedupe(
    plan: LogicalPlan,
    columns: &[&str],
    within_watermark: bool,
) -> std::result::Result<LogicalPlan, ClassifiedError> {
    let names: Vec<&str> = if columns.is_empty() {
        plan.schema()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect()
    } else {
        columns.to_vec()
    };
    let keys = names
        .iter()
        .map(|name| {
            plan.schema()
                .qualified_field_with_unqualified_name(name)
                .map(|(q, f)| Column::new(q.cloned(), f.name()))
                .map_err(|_| {
                    invalid(format!(
                        "Cannot deduplicate on '{name}': the stream has no such column (it has {}).",
                        plan.schema()
                            .fields()
                            .iter()
                            .map(|f| f.name().as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(LogicalPlan::Extension(Extension {
        node: Arc::new(DeduplicateNode {
            input: plan,
            keys,
            within_watermark,
        }),
    }))
}

/// `plan` keeping the first row of each value of `columns` (all columns when empty), as Spark's
/// `dropDuplicates`.
pub fn drop_duplicates(
    plan: LogicalPlan,
    columns: &[&str],
) -> std::result::Result<LogicalPlan, ClassifiedError> {
    dedupe(plan, columns, false)
}

/// As [`drop_duplicates`], but a key is forgotten once the watermark passes its first event
/// time plus the watermark delay (Spark's `dropDuplicatesWithinWatermark`); the stream needs a
/// watermark.
pub fn drop_duplicates_within_watermark(
    plan: LogicalPlan,
    columns: &[&str],
) -> std::result::Result<LogicalPlan, ClassifiedError> {
    dedupe(plan, columns, true)
}

/// The key `DISTINCT ON (...) WITHIN WATERMARK` adds to the list (a string literal, harmless
/// as a key) to mark a deduplication within the watermark.
pub const WITHIN_WATERMARK_MARKER: &str = "__weir_dedupe_within_watermark";

fn is_marker(e: &Expr) -> bool {
    matches!(e, Expr::Literal(datafusion::common::ScalarValue::Utf8(Some(s)), _) if s == WITHIN_WATERMARK_MARKER)
}

fn distinct_on(message: String) -> ClassifiedError {
    ClassifiedError::new(
        "UNSUPPORTED_STREAMING_OPERATION.DISTINCT_ON",
        "0A000",
        message,
    )
}

/// Replaces each `SELECT DISTINCT ON (columns) ...` over a stream with deduplication on those
/// columns followed by the select list.
pub fn rewrite_distinct_on(plan: LogicalPlan) -> std::result::Result<LogicalPlan, ClassifiedError> {
    let mut problem = None;
    let rewritten = plan
        .transform_up(|node| {
            let LogicalPlan::Distinct(Distinct::On(on)) = &node else {
                return Ok(Transformed::no(node));
            };
            if !is_streaming(&on.input) {
                return Ok(Transformed::no(node));
            }
            if on.sort_expr.is_some() {
                problem = Some(distinct_on(
                    "SELECT DISTINCT ON over a stream keeps the first row to arrive for each key; \
                     it takes no ORDER BY. Remove the ORDER BY."
                        .into(),
                ));
                return Ok(Transformed::no(node));
            }
            let mut keys = vec![];
            let within_watermark = on.on_expr.iter().any(is_marker);
            for e in on.on_expr.iter().filter(|e| !is_marker(e)) {
                match e {
                    Expr::Column(c) => keys.push(c.clone()),
                    other => {
                        problem = Some(distinct_on(format!(
                            "SELECT DISTINCT ON over a stream takes columns, not '{other}': \
                             compute it in a subquery and deduplicate on its alias."
                        )));
                        return Ok(Transformed::no(node));
                    }
                }
            }
            let dedupe = LogicalPlan::Extension(Extension {
                node: Arc::new(DeduplicateNode {
                    input: on.input.as_ref().clone(),
                    keys,
                    within_watermark,
                }),
            });
            let projected = LogicalPlanBuilder::from(dedupe)
                .project(on.select_expr.clone())?
                .build()?;
            Ok(Transformed::yes(projected))
        })
        .map_err(|e| ClassifiedError::new("INVALID_QUERY", "42000", e.to_string()))?;
    match problem {
        Some(p) => Err(p),
        None => Ok(rewritten.data),
    }
}
