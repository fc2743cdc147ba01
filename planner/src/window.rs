//! `window(time, width[, slide[, start]])`: the event-time window a row falls into, as Spark's
//! `window` function: a struct `{start, end}` of timestamps, `start` inclusive, `end` exclusive,
//! windows aligned to `start` (an offset from the epoch, default 0).
//!
//! Durations are strings (`'10 seconds'`, `'1 minute'`) or intervals without months. Tumbling
//! windows (no slide, or a slide equal to the width) are computed here; sliding windows, where a
//! row falls into several windows, need the planner to expand rows and are refused for now.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, ArrayRef, StructArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Fields, TimeUnit};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
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

fn struct_fields(tz: Option<Arc<str>>) -> Fields {
    let ts = DataType::Timestamp(TimeUnit::Microsecond, tz);
    Fields::from(vec![
        Field::new("start", ts.clone(), true),
        Field::new("end", ts, true),
    ])
}

fn micros(name: &str, v: &ScalarValue) -> Result<i64> {
    let d = match v {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => {
            let d = weir_common::parse_duration(s, Duration::from_secs(1))
                .or_else(|e| plan_err!("window(): the {name} '{s}' is not a duration: {e}"))?;
            i64::try_from(d.as_micros())
                .or_else(|_| plan_err!("window(): the {name} is too long"))?
        }
        ScalarValue::IntervalMonthDayNano(Some(i)) if i.months == 0 => {
            i64::from(i.days) * 86_400_000_000 + i.nanoseconds / 1000
        }
        ScalarValue::IntervalDayTime(Some(i)) => {
            i64::from(i.days) * 86_400_000_000 + i64::from(i.milliseconds) * 1000
        }
        ScalarValue::IntervalMonthDayNano(Some(_)) | ScalarValue::IntervalYearMonth(Some(_)) => {
            return plan_err!(
                "window(): the {name} has months or years, whose length varies; use days or less"
            );
        }
        other => {
            return plan_err!(
                "window(): the {name} must be a duration such as '10 seconds' or INTERVAL '10' SECOND, not {other}"
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
            Some(ColumnarValue::Scalar(v)) => micros(name, v).map(Some),
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
                "window(): sliding windows (a slide shorter than the width) are not supported yet; \
                 use a tumbling window (no slide)"
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
        // As Spark: the window start is the last start at or before the time.
        let starts: TimestampMicrosecondArray = time
            .iter()
            .map(|t| t.map(|t| t - (t - start).rem_euclid(slide)))
            .collect::<TimestampMicrosecondArray>()
            .with_timezone_opt(tz.clone());
        let ends: TimestampMicrosecondArray = starts
            .iter()
            .map(|s| s.map(|s| s + width))
            .collect::<TimestampMicrosecondArray>()
            .with_timezone_opt(tz.clone());
        let columns: Vec<ArrayRef> = vec![Arc::new(starts), Arc::new(ends)];
        let out = StructArray::try_new(struct_fields(tz), columns, time.nulls().cloned())?;
        Ok(ColumnarValue::Array(Arc::new(out)))
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
    async fn bad_arguments_are_plan_errors() {
        for (sql, says) in [
            ("SELECT window(1, '10 seconds')", "TIMESTAMP"),
            ("SELECT window(now(), 'soon')", "not a duration"),
            ("SELECT window(now(), INTERVAL '1' MONTH)", "months"),
            (
                "SELECT window(now(), '10 seconds', '5 seconds')",
                "sliding windows",
            ),
            ("SELECT window(now())", "arguments"),
        ] {
            let err = run(sql).await.unwrap_err().to_string();
            assert!(err.contains(says), "{sql}: {err}");
        }
    }
}
