//! `session_window(time, gap)`: Spark's session windows. A row opens a session
//! `[time, time + gap)`; sessions of the same group that overlap or touch (a row at or before
//! the current session's end) merge into one, so a session ends after `gap` without rows.
//!
//! Merging needs every row of a group, across batches, so a session window can only be a
//! GROUP BY key of a streaming aggregation. [`rewrite_session_windows`] turns that key into the
//! column [`SESSION_WINDOW_COLUMN`], computed below the aggregate by `__session_window` (each
//! row's own session); the engine's session-window operator merges those per group with the
//! sessions in state. Anywhere else `session_window()` is an error, not a silently unmerged
//! per-row window.
//!
//! The gap is a constant duration (`'5 minutes'`, `INTERVAL '5' MINUTE`) or, as in Spark, an
//! expression evaluated per row; a row whose time is null, or whose gap is null, not a duration
//! or not positive, is in no session.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, StructArray, TimestampMicrosecondArray};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    ColumnarValue, Expr, LogicalPlan, LogicalPlanBuilder, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};

use crate::window::{micros, struct_fields};

/// The column a session window key becomes below its aggregate.
pub const SESSION_WINDOW_COLUMN: &str = "__session_window";

/// The name of the per-row session function.
const PER_ROW: &str = "__session_window";

fn return_type(name: &str, arg_types: &[DataType]) -> Result<DataType> {
    if arg_types.len() != 2 {
        return plan_err!(
            "{name}() takes (time, gap), got {} arguments",
            arg_types.len()
        );
    }
    match &arg_types[0] {
        DataType::Timestamp(_, tz) => Ok(DataType::Struct(struct_fields(tz.clone()))),
        other => plan_err!("session_window(): the time column must be a TIMESTAMP, not {other}"),
    }
}

/// The `session_window` function users call.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SessionWindowFunction {
    signature: Signature,
}

impl Default for SessionWindowFunction {
    fn default() -> Self {
        Self {
            signature: Signature::variadic_any(Volatility::Immutable),
        }
    }
}

/// `session_window` as a UDF to register in a session.
pub fn session_window_udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(SessionWindowFunction::default())
}

impl ScalarUDFImpl for SessionWindowFunction {
    fn name(&self) -> &str {
        "session_window"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        return_type("session_window", arg_types)
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        plan_err!(
            "session_window() merges the rows of a group into sessions, so it can only be a \
             GROUP BY key of a streaming aggregation; use it there (GROUP BY key, \
             session_window(time, gap)), or window() for fixed windows"
        )
    }
}

/// `__session_window(time, gap)`: each row's own session `{start: time, end: time + gap}`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct PerRowSessionFunction {
    signature: Signature,
}

impl Default for PerRowSessionFunction {
    fn default() -> Self {
        Self {
            signature: Signature::variadic_any(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for PerRowSessionFunction {
    fn name(&self) -> &str {
        PER_ROW
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        return_type("session_window", arg_types)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [time, gap] = args.args.as_slice() else {
            return plan_err!("session_window() takes (time, gap)");
        };
        let DataType::Timestamp(_, tz) = time.data_type() else {
            return exec_err!("session_window(): the time column must be a TIMESTAMP");
        };
        let time = time.to_array(args.number_rows)?;
        let time = arrow::compute::cast(
            &time,
            &DataType::Timestamp(TimeUnit::Microsecond, tz.clone()),
        )?;
        let Some(time) = time.as_any().downcast_ref::<TimestampMicrosecondArray>() else {
            return exec_err!("session_window(): cannot read the time column as microseconds");
        };
        let gaps: Vec<Option<i64>> = match gap {
            ColumnarValue::Scalar(v) => {
                let g = micros("session_window", "gap", v)?;
                if g <= 0 {
                    return plan_err!("session_window(): the gap must be positive");
                }
                vec![Some(g); time.len()]
            }
            // A gap per row (Spark's dynamic gap): a row without a usable one is in no session.
            ColumnarValue::Array(a) => (0..a.len())
                .map(|i| {
                    let v = ScalarValue::try_from_array(a, i).ok()?;
                    micros("session_window", "gap", &v).ok().filter(|g| *g > 0)
                })
                .collect(),
        };
        let ends: TimestampMicrosecondArray = time
            .iter()
            .zip(&gaps)
            .map(|(t, g)| t?.checked_add((*g)?))
            .collect();
        let nulls = NullBuffer::union(time.nulls(), ends.nulls());
        let starts = TimestampMicrosecondArray::new(time.values().clone(), nulls.clone())
            .with_timezone_opt(tz.clone());
        let ends = ends.with_timezone_opt(tz.clone());
        let columns: Vec<ArrayRef> = vec![Arc::new(starts), Arc::new(ends)];
        let out = StructArray::try_new(struct_fields(tz.clone()), columns, nulls)?;
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

fn unaliased(e: &Expr) -> &Expr {
    match e {
        Expr::Alias(a) => unaliased(&a.expr),
        other => other,
    }
}

/// Rewrites each aggregate grouped by `session_window(time, gap)`: its input gets each row's
/// own session as the column [`SESSION_WINDOW_COLUMN`], which replaces the call as the grouping
/// key (under the call's name, so the query's references still resolve). The engine plans an
/// aggregate grouped by that column as a session-window aggregation.
pub fn rewrite_session_windows(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up(|node| {
        let LogicalPlan::Aggregate(agg) = &node else {
            return Ok(Transformed::no(node));
        };
        let calls: Vec<(usize, &ScalarFunction)> = agg
            .group_expr
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match unaliased(e) {
                Expr::ScalarFunction(f) if f.name() == "session_window" => Some((i, f)),
                _ => None,
            })
            .collect();
        let (i, call) = match calls.as_slice() {
            [] => return Ok(Transformed::no(node)),
            [one] => *one,
            _ => {
                return plan_err!(
                    "session_window(): a GROUP BY can have one session window, not {}",
                    calls.len()
                );
            }
        };
        if call.args.len() != 2 {
            return plan_err!(
                "session_window() takes (time, gap), got {} arguments",
                call.args.len()
            );
        }
        let name = agg.group_expr[i].schema_name().to_string();
        let per_row = Expr::ScalarFunction(ScalarFunction::new_udf(
            Arc::new(ScalarUDF::new_from_impl(PerRowSessionFunction::default())),
            call.args.clone(),
        ))
        .alias(SESSION_WINDOW_COLUMN);
        let mut columns: Vec<Expr> = agg
            .input
            .schema()
            .columns()
            .into_iter()
            .map(Expr::Column)
            .collect();
        columns.push(per_row);
        let input = LogicalPlanBuilder::from(agg.input.as_ref().clone())
            .project(columns)?
            .build()?;
        let mut group = agg.group_expr.clone();
        group[i] = datafusion::prelude::col(SESSION_WINDOW_COLUMN).alias(name);
        let rebuilt = datafusion::logical_expr::Aggregate::try_new(
            Arc::new(input),
            group,
            agg.aggr_expr.clone(),
        )?;
        Ok(Transformed::yes(LogicalPlan::Aggregate(rebuilt)))
    })
    .map(|t| t.data)
}

/// The time column of the session window that `input` (a rewritten session aggregate's input)
/// computes, when it is a plain column.
pub fn session_time_column(input: &LogicalPlan) -> Option<String> {
    let LogicalPlan::Projection(p) = input else {
        return None;
    };
    p.expr.iter().find_map(|e| match e {
        Expr::Alias(a) if a.name == SESSION_WINDOW_COLUMN => match a.expr.as_ref() {
            Expr::ScalarFunction(f) if f.name() == PER_ROW => match f.args.first() {
                Some(Expr::Column(c)) => Some(c.name.clone()),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    use super::*;

    fn context() -> SessionContext {
        let ctx = SessionContext::new();
        ctx.register_udf(session_window_udf());
        ctx
    }

    #[tokio::test]
    async fn each_row_gets_its_own_session_below_the_aggregate() {
        let ctx = context();
        let df = ctx
            .sql(
                "SELECT k, session_window(t, gap) AS s, count(*) AS n \
                 FROM (VALUES ('a', TIMESTAMP '1970-01-01 00:00:01', '5 seconds'), \
                              ('a', TIMESTAMP '1970-01-01 00:00:02', '0 seconds'), \
                              ('a', NULL, '5 seconds'), \
                              ('b', TIMESTAMP '1970-01-01 00:00:03', 'soon')) AS v(k, t, gap) \
                 GROUP BY k, session_window(t, gap)",
            )
            .await
            .unwrap();
        let (state, plan) = df.into_parts();
        let plan = rewrite_session_windows(plan).unwrap();
        let text = plan.display_indent().to_string();
        assert!(
            text.contains("__session_window(v.t, v.gap) AS __session_window"),
            "{text}"
        );
        let batches = datafusion::dataframe::DataFrame::new(state, plan)
            .collect()
            .await
            .unwrap();
        let out = arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        // Without merging (that is the engine's operator), one group per row's session; rows
        // without a time or a usable gap are in the null session.
        assert!(
            out.contains("| a | {start: 1970-01-01T00:00:01, end: 1970-01-01T00:00:06} | 1 |"),
            "{out}"
        );
        let null_session = |k: &str, n: &str| {
            out.lines().any(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                cells.get(1..4) == Some(&[k, "", n][..])
            })
        };
        assert!(null_session("a", "2"), "{out}");
        assert!(null_session("b", "1"), "{out}");
    }

    #[tokio::test]
    async fn session_window_outside_a_group_by_and_bad_arguments_are_errors() {
        let ctx = context();
        let err = ctx
            .sql("SELECT session_window(TIMESTAMP '2026-01-01 00:00:00', '5 seconds')")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("GROUP BY key of a streaming aggregation"),
            "{err}"
        );
        for (sql, says) in [
            ("SELECT session_window(1, '5 seconds')", "TIMESTAMP"),
            ("SELECT session_window(now())", "arguments"),
        ] {
            let err = match ctx.sql(sql).await {
                Ok(df) => df.collect().await.unwrap_err().to_string(),
                Err(e) => e.to_string(),
            };
            assert!(err.contains(says), "{sql}: {err}");
        }
        let df = ctx
            .sql(
                "SELECT count(*) FROM (VALUES (TIMESTAMP '2026-01-01 00:00:00')) AS v(t) \
                 GROUP BY session_window(t, '5 seconds'), session_window(t, '6 seconds')",
            )
            .await
            .unwrap();
        let err = rewrite_session_windows(df.into_parts().1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("one session window"), "{err}");
    }
}
