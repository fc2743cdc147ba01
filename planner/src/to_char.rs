//! `to_char(timestamp, format)` with the format parsed once per batch.
//!
//! DataFusion's `to_char` formats each value through arrow's display, which hands chrono the
//! format string for every value, so chrono parses it again for each row (Nexmark q10 formats
//! two per bid). This one parses it once into chrono's items and formats every value of the
//! batch with them: the same items, so the same text. Anything else (another input type, a
//! time zone, a format per row, a format chrono cannot parse, a value out of chrono's range)
//! goes to DataFusion's `to_char`, errors included.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, StringBuilder};
use arrow::datatypes::{DataType, TimeUnit};
use arrow::temporal_conversions::{
    timestamp_ms_to_datetime, timestamp_ns_to_datetime, timestamp_s_to_datetime,
    timestamp_us_to_datetime,
};
use chrono::format::{Item, StrftimeItems};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
};

/// DataFusion's `to_char`, with a fast path for timestamp columns and a constant format.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ToChar {
    inner: Arc<ScalarUDF>,
}

/// The `to_char` weir registers in place of DataFusion's.
pub fn to_char_udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(ToChar {
        inner: datafusion::functions::datetime::to_char(),
    })
}

impl ScalarUDFImpl for ToChar {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        if let [
            ColumnarValue::Array(values),
            ColumnarValue::Scalar(ScalarValue::Utf8(Some(f))),
        ] = args.args.as_slice()
            && let DataType::Timestamp(unit, None) = values.data_type()
            && let Some(formatted) = format_timestamps(values, *unit, f)
        {
            return Ok(ColumnarValue::Array(formatted));
        }
        self.inner.invoke_with_args(args)
    }
}

/// `values` (timestamps without a time zone, in `unit`) formatted with `format`; `None` when
/// chrono cannot parse the format or a value is out of its range (DataFusion's `to_char` then
/// says so).
fn format_timestamps(values: &ArrayRef, unit: TimeUnit, format: &str) -> Option<ArrayRef> {
    use std::fmt::Write;
    let items: Vec<Item<'_>> = StrftimeItems::new(format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return None;
    }
    // Every timestamp unit is an i64 underneath.
    let data = values.to_data();
    let ints = Int64Array::from(
        data.into_builder()
            .data_type(DataType::Int64)
            .build()
            .ok()?,
    );
    let to_datetime = match unit {
        TimeUnit::Second => timestamp_s_to_datetime,
        TimeUnit::Millisecond => timestamp_ms_to_datetime,
        TimeUnit::Microsecond => timestamp_us_to_datetime,
        TimeUnit::Nanosecond => timestamp_ns_to_datetime,
    };
    let mut out = StringBuilder::with_capacity(ints.len(), ints.len() * (format.len() + 10));
    for v in ints.iter() {
        match v {
            None => out.append_null(),
            Some(v) => {
                let t = to_datetime(v)?;
                write!(out, "{}", t.format_with_items(items.iter())).ok()?;
                out.append_value("");
            }
        }
    }
    Some(Arc::new(out.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{StringArray, TimestampMicrosecondArray, TimestampSecondArray};
    use datafusion::prelude::SessionContext;

    /// The same text as DataFusion's `to_char` for each unit, format and null, through SQL.
    #[tokio::test]
    async fn formats_as_datafusions_to_char_does() {
        let ours = SessionContext::new();
        ours.register_udf(to_char_udf());
        let theirs = SessionContext::new();
        for (unit, value) in [
            ("s", "1436918400"),
            ("ms", "1436918400123"),
            ("us", "1436918400123456"),
            ("ns", "1436918400123456789"),
        ] {
            for format in [
                "%Y-%m-%d",
                "%H:%M",
                "%Y-%m-%dT%H:%M:%S%.f",
                "%a %e %b %j",
                "x %% y",
            ] {
                let sql = format!(
                    "SELECT to_char(arrow_cast(column1, 'Timestamp({unit}, None)'), '{format}') \
                     FROM (VALUES ({value}), (NULL), (0), (-86400))"
                );
                let run = |ctx: &SessionContext| {
                    let sql = sql.clone();
                    let ctx = ctx.clone();
                    async move {
                        let batches = ctx.sql(&sql).await?.collect().await?;
                        Ok::<_, datafusion::error::DataFusionError>(
                            arrow::util::pretty::pretty_format_batches(&batches)?.to_string(),
                        )
                    }
                };
                let (a, b) = (run(&ours).await.unwrap(), run(&theirs).await.unwrap());
                assert_eq!(a, b, "{unit} {format}");
            }
        }
    }

    #[test]
    fn a_batch_is_formatted_with_one_parse_and_an_unparsable_format_is_left_to_datafusion() {
        let values: ArrayRef = Arc::new(TimestampMicrosecondArray::from(vec![
            Some(1_436_918_400_000_000),
            None,
        ]));
        let out = format_timestamps(&values, TimeUnit::Microsecond, "%Y-%m-%d %H:%M").unwrap();
        let out = out.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(out.value(0), "2015-07-15 00:00");
        assert!(out.is_null(1));
        assert!(format_timestamps(&values, TimeUnit::Microsecond, "%Q").is_none());
        let seconds: ArrayRef = Arc::new(TimestampSecondArray::from(vec![i64::MAX]));
        assert!(
            format_timestamps(&seconds, TimeUnit::Second, "%Y").is_none(),
            "out of chrono's range"
        );
    }
}
