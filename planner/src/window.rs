//! `window(time, width[, slide[, start]])`: the event-time window a row falls into, as Spark's
//! `window` function: a struct `{start, end}` of timestamps, `start` inclusive, `end` exclusive,
//! windows aligned to `start` (an offset from the epoch, default 0).
//!
//! Durations are strings (`'10 seconds'`, `'1 minute'`) or intervals without months. Tumbling
//! windows (no slide, or a slide equal to the width) are computed here. With a shorter slide a
//! row falls into several windows: [`expand_sliding_windows`] rewrites a `GROUP BY window(...)`
//! with a slide into an unnest of every window of each row (`__sliding_windows`), as Spark
//! expands rows; elsewhere a sliding `window()` is refused.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, ArrayRef, StructArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Fields, TimeUnit, TimestampMicrosecondType};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, Expr, LogicalPlan, LogicalPlanBuilder, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};

/// The `window` scalar function.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct WindowFunction {
    signature: Signature,
}

impl Default for WindowFunction {
    fn default() -> Self {
        Self {
            signature: Signature::variadic_any(Volatility::Immutable),
        }
    }
}

/// `window` as a UDF to register in a session.
pub fn window_udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(WindowFunction::default())
}

pub(crate) fn struct_fields(tz: Option<Arc<str>>) -> Fields {
    let ts = DataType::Timestamp(TimeUnit::Microsecond, tz);
    Fields::from(vec![
        Field::new("start", ts.clone(), true),
        Field::new("end", ts, true),
    ])
}

pub(crate) fn micros(func: &str, name: &str, v: &ScalarValue) -> Result<i64> {
    let d = match v {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => {
            let d = weir_common::parse_duration(s, Duration::from_secs(1))
                .or_else(|e| plan_err!("{func}(): the {name} '{s}' is not a duration: {e}"))?;
            i64::try_from(d.as_micros())
                .or_else(|_| plan_err!("{func}(): the {name} is too long"))?
        }
        ScalarValue::IntervalMonthDayNano(Some(i)) if i.months == 0 => {
            i64::from(i.days) * 86_400_000_000 + i.nanoseconds / 1000
        }
        ScalarValue::IntervalDayTime(Some(i)) => {
            i64::from(i.days) * 86_400_000_000 + i64::from(i.milliseconds) * 1000
        }
        ScalarValue::IntervalMonthDayNano(Some(_)) | ScalarValue::IntervalYearMonth(Some(_)) => {
            return plan_err!(
                "{func}(): the {name} has months or years, whose length varies; use days or less"
            );
        }
        other => {
            return plan_err!(
                "{func}(): the {name} must be a duration such as '10 seconds' or INTERVAL '10' SECOND, not {other}"
            );
        }
    };
    Ok(d)
}

impl ScalarUDFImpl for WindowFunction {
    fn name(&self) -> &str {
        "window"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        if !(2..=4).contains(&arg_types.len()) {
            return plan_err!(
                "window() takes (time, width[, slide[, start]]), got {} arguments",
                arg_types.len()
            );
        }
        match &arg_types[0] {
            DataType::Timestamp(_, tz) => Ok(DataType::Struct(struct_fields(tz.clone()))),
            other => plan_err!("window(): the time column must be a TIMESTAMP, not {other}"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = |i: usize, name: &str| match args.args.get(i) {
            Some(ColumnarValue::Scalar(v)) => micros("window", name, v).map(Some),
            Some(ColumnarValue::Array(_)) => {
                plan_err!("window(): the {name} must be a constant")
            }
            None => Ok(None),
        };
        let width = scalar(1, "width")?.unwrap_or(0);
        let slide = scalar(2, "slide")?.unwrap_or(width);
        let start = scalar(3, "start")?.unwrap_or(0);
        if width <= 0 || slide <= 0 {
            return plan_err!("window(): the width and slide must be positive");
        }
        if slide != width {
            return plan_err!(
                "window(): a sliding window (a slide shorter than the width) puts a row into \
                 several windows, so it can only be a GROUP BY key; use it there, or a tumbling \
                 window (no slide)"
            );
        }
        if start.abs() >= slide {
            return plan_err!("window(): the start offset must be smaller than the slide");
        }
        let DataType::Timestamp(_, tz) = args.args[0].data_type() else {
            return exec_err!("window(): the time column must be a TIMESTAMP");
        };
        let time = args.args[0].to_array(args.number_rows)?;
        let time = arrow::compute::cast(
            &time,
            &DataType::Timestamp(TimeUnit::Microsecond, tz.clone()),
        )?;
        let Some(time) = time.as_any().downcast_ref::<TimestampMicrosecondArray>() else {
            return exec_err!("window(): cannot read the time column as microseconds");
        };
        // As Spark: the window start is the last start at or before the time. Every row
        // passes through here, so the values are mapped in place (nulls kept as they are;
        // the arithmetic wraps, so a null slot's arbitrary value cannot overflow).
        let starts: TimestampMicrosecondArray = time
            .unary::<_, TimestampMicrosecondType>(|t| {
                t.wrapping_sub(t.wrapping_sub(start).rem_euclid(slide))
            })
            .with_timezone_opt(tz.clone());
        let ends: TimestampMicrosecondArray = starts
            .unary::<_, TimestampMicrosecondType>(|s| s.wrapping_add(width))
            .with_timezone_opt(tz.clone());
        let columns: Vec<ArrayRef> = vec![Arc::new(starts), Arc::new(ends)];
        let out = StructArray::try_new(struct_fields(tz), columns, time.nulls().cloned())?;
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// The column an expanded sliding window becomes.
pub const SLIDING_WINDOW_COLUMN: &str = "__sliding_window";

/// `__sliding_windows(time, width, slide[, start])`: every window containing the time, as a
/// list of `{start, end}` structs (the expansion behind a sliding `window()`).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SlidingWindowsFunction {
    signature: Signature,
}

impl Default for SlidingWindowsFunction {
    fn default() -> Self {
        Self {
            signature: Signature::variadic_any(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SlidingWindowsFunction {
    fn name(&self) -> &str {
        "__sliding_windows"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first() {
            Some(DataType::Timestamp(_, tz)) => Ok(DataType::List(Arc::new(Field::new(
                "item",
                DataType::Struct(struct_fields(tz.clone())),
                true,
            )))),
            _ => plan_err!("window(): the time column must be a TIMESTAMP"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = |i: usize, name: &str| match args.args.get(i) {
            Some(ColumnarValue::Scalar(v)) => micros("window", name, v).map(Some),
            Some(ColumnarValue::Array(_)) => plan_err!("window(): the {name} must be a constant"),
            None => Ok(None),
        };
        let width = scalar(1, "width")?.unwrap_or(0);
        let slide = scalar(2, "slide")?.unwrap_or(width);
        let start = scalar(3, "start")?.unwrap_or(0);
        if width <= 0 || slide <= 0 || slide > width {
            return plan_err!(
                "window(): the width and slide must be positive, the slide no longer than the width"
            );
        }
        let DataType::Timestamp(_, tz) = args.args[0].data_type() else {
            return exec_err!("window(): the time column must be a TIMESTAMP");
        };
        let time = args.args[0].to_array(args.number_rows)?;
        let time = arrow::compute::cast(
            &time,
            &DataType::Timestamp(TimeUnit::Microsecond, tz.clone()),
        )?;
        let Some(time) = time.as_any().downcast_ref::<TimestampMicrosecondArray>() else {
            return exec_err!("window(): cannot read the time column as microseconds");
        };
        // As Spark: every window start s with s <= t < s + width, aligned to the slide.
        let mut offsets = vec![0i32];
        let (mut starts, mut ends) = (vec![], vec![]);
        for t in time.iter() {
            if let Some(t) = t {
                let last = t - (t - start).rem_euclid(slide);
                let mut s = last;
                let mut these = vec![];
                while s + width > t {
                    these.push(s);
                    s -= slide;
                }
                for s in these.into_iter().rev() {
                    starts.push(s);
                    ends.push(s + width);
                }
            }
            offsets.push(starts.len() as i32);
        }
        let starts = TimestampMicrosecondArray::from(starts).with_timezone_opt(tz.clone());
        let ends = TimestampMicrosecondArray::from(ends).with_timezone_opt(tz.clone());
        let windows = StructArray::try_new(
            struct_fields(tz.clone()),
            vec![Arc::new(starts) as ArrayRef, Arc::new(ends)],
            None,
        )?;
        let list = arrow::array::ListArray::try_new(
            Arc::new(Field::new(
                "item",
                DataType::Struct(struct_fields(tz)),
                true,
            )),
            arrow::buffer::OffsetBuffer::new(offsets.into()),
            Arc::new(windows),
            time.nulls().cloned(),
        )?;
        Ok(ColumnarValue::Array(Arc::new(list)))
    }
}

/// Whether `e` is a sliding `window(time, width, slide[, start])` call (slide != width).
fn sliding_window_call(e: &Expr) -> Option<&datafusion::logical_expr::expr::ScalarFunction> {
    let Expr::ScalarFunction(f) = e else {
        return None;
    };
    if f.name() != "window" || f.args.len() < 3 {
        return None;
    }
    let lit = |i: usize| match &f.args[i] {
        Expr::Literal(v, _) => micros("window", "width", v).ok(),
        _ => None,
    };
    (lit(1)? != lit(2)?).then_some(f)
}

/// Rewrites each `GROUP BY window(time, width, slide)` with a slide shorter than the width so
/// that every row is grouped into every window containing it: the aggregate's input gets the
/// list of those windows, unnested into the column [`SLIDING_WINDOW_COLUMN`], which replaces the
/// call as the grouping key (under the call's name, so the query's references still resolve).
pub fn expand_sliding_windows(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up(|node| {
        let LogicalPlan::Aggregate(agg) = &node else {
            return Ok(Transformed::no(node));
        };
        let Some((i, call)) = agg.group_expr.iter().enumerate().find_map(|(i, e)| {
            let inner = match e {
                Expr::Alias(a) => a.expr.as_ref(),
                other => other,
            };
            sliding_window_call(inner).map(|f| (i, f))
        }) else {
            return Ok(Transformed::no(node));
        };
        let name = agg.group_expr[i].schema_name().to_string();
        let expansion =
            Expr::ScalarFunction(datafusion::logical_expr::expr::ScalarFunction::new_udf(
                Arc::new(ScalarUDF::new_from_impl(SlidingWindowsFunction::default())),
                call.args.clone(),
            ))
            .alias(SLIDING_WINDOW_COLUMN);
        let mut columns: Vec<Expr> = agg
            .input
            .schema()
            .columns()
            .into_iter()
            .map(Expr::Column)
            .collect();
        columns.push(expansion);
        let input = LogicalPlanBuilder::from(agg.input.as_ref().clone())
            .project(columns)?
            // As Spark, a row without a time is in no sliding window.
            .unnest_column_with_options(
                SLIDING_WINDOW_COLUMN,
                datafusion::common::UnnestOptions::new().with_preserve_nulls(false),
            )?
            .build()?;
        let mut group = agg.group_expr.clone();
        group[i] = datafusion::prelude::col(SLIDING_WINDOW_COLUMN).alias(name);
        let rebuilt = datafusion::logical_expr::Aggregate::try_new(
            Arc::new(input),
            group,
            agg.aggr_expr.clone(),
        )?;
        Ok(Transformed::yes(LogicalPlan::Aggregate(rebuilt)))
    })
    .map(|t| t.data)
}

/// Rewrites an aggregate grouped by a column that a projection below it defines as
/// `window(time, ...)` or `session_window(time, gap)` (`SELECT w, count(*) FROM (SELECT
/// window(ts, '10 seconds') AS w FROM ...) GROUP BY w`) to group by the call itself, as if the
/// query had been written so: Spark carries the watermark's event-time marking through such
/// aliases, and the streaming checks, the sliding-window expansion, the session-window rewrite
/// and the stateful operators all recognise the call. The projection also passes the call's
/// time column on, under a name of its own; the aggregate's output keeps the column's name.
///
/// ```text
/// Aggregate [w]            ─►  Aggregate [window(__weir_window_time_0, ...) AS sub.w]
///   SubqueryAlias sub            SubqueryAlias sub
///     Projection [window(ts, ...) AS w]     Projection [window(ts, ...) AS w, ts AS __weir_window_time_0]
/// ```
/// Between the aggregate and the projection there may be filters and subquery aliases.
pub fn inline_window_aliases(plan: LogicalPlan) -> Result<LogicalPlan> {
    let mut counter = 0usize;
    plan.transform_up(|node| {
        let LogicalPlan::Aggregate(agg) = &node else {
            return Ok(Transformed::no(node));
        };
        let mut input = agg.input.as_ref().clone();
        let mut group = agg.group_expr.clone();
        let mut changed = false;
        for g in group.iter_mut() {
            let Expr::Column(c) = g else {
                continue;
            };
            let name = format!("{INLINED_TIME_PREFIX}{counter}");
            if let Some((rewritten, call)) = pass_time_column(&input, c, &name)? {
                counter += 1;
                let (relation, out_name) = (c.relation.clone(), c.name.clone());
                let time = Expr::Column(datafusion::common::Column::new(
                    rewritten
                        .schema()
                        .qualified_field_with_unqualified_name(&name)?
                        .0
                        .cloned(),
                    name,
                ));
                let mut args = call.args.clone();
                args[0] = time;
                *g = Expr::ScalarFunction(datafusion::logical_expr::expr::ScalarFunction::new_udf(
                    Arc::clone(&call.func),
                    args,
                ))
                .alias_qualified(relation, out_name);
                input = rewritten;
                changed = true;
            }
        }
        if !changed {
            return Ok(Transformed::no(node));
        }
        let rebuilt = datafusion::logical_expr::Aggregate::try_new(
            Arc::new(input),
            group,
            agg.aggr_expr.clone(),
        )?;
        Ok(Transformed::yes(LogicalPlan::Aggregate(rebuilt)))
    })
    .map(|t| t.data)
}

/// The prefix of the time columns [`inline_window_aliases`] passes on.
const INLINED_TIME_PREFIX: &str = "__weir_window_time_";

/// When `column` of `plan` (through filters and subquery aliases) is a projection's
/// `window(time, <literals>)` or `session_window(time, <literal>)` over a column `time`: the
/// plan with that projection also passing `time` on as `name`, and the call.
fn pass_time_column(
    plan: &LogicalPlan,
    column: &datafusion::common::Column,
    name: &str,
) -> Result<Option<(LogicalPlan, datafusion::logical_expr::expr::ScalarFunction)>> {
    match plan {
        LogicalPlan::Filter(f) => {
            let Some((input, call)) = pass_time_column(&f.input, column, name)? else {
                return Ok(None);
            };
            let filter =
                datafusion::logical_expr::Filter::try_new(f.predicate.clone(), Arc::new(input))?;
            Ok(Some((LogicalPlan::Filter(filter), call)))
        }
        LogicalPlan::SubqueryAlias(a) => {
            let inner = datafusion::common::Column::new_unqualified(&column.name);
            let Some((input, call)) = pass_time_column(&a.input, &inner, name)? else {
                return Ok(None);
            };
            let alias =
                datafusion::logical_expr::SubqueryAlias::try_new(Arc::new(input), a.alias.clone())?;
            Ok(Some((LogicalPlan::SubqueryAlias(alias), call)))
        }
        LogicalPlan::Projection(p) => {
            let Some(defined) = p.expr.iter().find_map(|e| match e {
                Expr::Alias(a) if a.name == column.name => Some(a.expr.as_ref()),
                _ => None,
            }) else {
                return Ok(None);
            };
            let Expr::ScalarFunction(call) = defined else {
                return Ok(None);
            };
            let is_window = matches!(call.name(), "window" | "session_window");
            let literal_rest = call
                .args
                .iter()
                .skip(1)
                .all(|a| matches!(a, Expr::Literal(..)));
            let Some(Expr::Column(time)) = call.args.first() else {
                return Ok(None);
            };
            if !is_window || !literal_rest {
                return Ok(None);
            }
            let mut exprs = p.expr.clone();
            exprs.push(Expr::Column(time.clone()).alias(name));
            let projection =
                datafusion::logical_expr::Projection::try_new(exprs, Arc::clone(&p.input))?;
            Ok(Some((LogicalPlan::Projection(projection), call.clone())))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    use super::*;

    async fn run(sql: &str) -> Result<Vec<String>> {
        let ctx = SessionContext::new();
        ctx.register_udf(window_udf());
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(arrow::util::pretty::pretty_format_batches(&batches)?
            .to_string()
            .lines()
            .map(str::to_string)
            .collect())
    }

    #[tokio::test]
    async fn a_row_falls_into_the_tumbling_window_that_contains_it() {
        let out = run(
            "SELECT window(t, '10 seconds') AS w, window(t, INTERVAL '1' MINUTE, '1 minute', '5 seconds') AS m \
             FROM (VALUES (TIMESTAMP '2026-01-01 00:00:09.999'), (TIMESTAMP '2026-01-01 00:00:10'), \
                          (TIMESTAMP '1969-12-31 23:59:55'), (NULL)) AS v(t)",
        )
        .await
        .unwrap()
        .join("\n");
        assert!(
            out.contains("{start: 2026-01-01T00:00:00, end: 2026-01-01T00:00:10}"),
            "{out}"
        );
        assert!(
            out.contains("{start: 2026-01-01T00:00:10, end: 2026-01-01T00:00:20}"),
            "{out}"
        );
        assert!(
            out.contains("{start: 1969-12-31T23:59:50, end: 1970-01-01T00:00:00}"),
            "{out}"
        );
        // Aligned to the start offset: minutes starting at :05.
        assert!(
            out.contains("{start: 1969-12-31T23:59:05, end: 1970-01-01T00:00:05}"),
            "{out}"
        );
        assert!(
            out.contains("{start: 2026-01-01T00:00:05, end: 2026-01-01T00:01:05}"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn a_sliding_group_by_counts_each_row_in_every_window_containing_it() {
        let ctx = SessionContext::new();
        ctx.register_udf(window_udf());
        let df = ctx
            .sql(
                "SELECT window(t, '10 seconds', '4 seconds', '1 second')['start'] AS s, count(*) AS n \
                 FROM (VALUES (TIMESTAMP '1970-01-01 00:00:00'), (TIMESTAMP '1970-01-01 00:00:06'), \
                              (NULL)) AS v(t) \
                 GROUP BY window(t, '10 seconds', '4 seconds', '1 second')",
            )
            .await
            .unwrap();
        let (state, plan) = df.into_parts();
        let plan = expand_sliding_windows(plan).unwrap();
        let batches = datafusion::dataframe::DataFrame::new(state, plan)
            .sort(vec![datafusion::prelude::col("s").sort(true, true)])
            .unwrap()
            .collect()
            .await
            .unwrap();
        let out = arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        // Windows start at 1 + 4k s: 0 s is in [-7, 3), [-3, 7); 6 s in [-3, 7), [1, 11), [5, 15).
        for (start, n) in [
            ("1969-12-31T23:59:53", 1),
            ("1969-12-31T23:59:57", 2),
            ("1970-01-01T00:00:01", 1),
            ("1970-01-01T00:00:05", 1),
        ] {
            assert!(out.contains(&format!("| {start} | {n} |")), "{out}");
        }
        assert_eq!(
            batches.iter().map(|b| b.num_rows()).sum::<usize>(),
            4,
            "{out}"
        );
    }

    #[tokio::test]
    async fn bad_arguments_are_plan_errors() {
        for (sql, says) in [
            ("SELECT window(1, '10 seconds')", "TIMESTAMP"),
            ("SELECT window(now(), 'soon')", "not a duration"),
            ("SELECT window(now(), INTERVAL '1' MONTH)", "months"),
            (
                "SELECT window(now(), '10 seconds', '5 seconds')",
                "sliding window",
            ),
            ("SELECT window(now())", "arguments"),
        ] {
            let err = run(sql).await.unwrap_err().to_string();
            assert!(err.contains(says), "{sql}: {err}");
        }
    }
}
