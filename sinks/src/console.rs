//! The `console` sink: prints each batch as Spark's `Dataset.show` does, under a
//! `Batch: N` header. Options `numRows` (default 20) and `truncate` (default true: cells cut
//! to 20 characters and right-aligned).

use std::fmt::Write as _;
use std::io::Write;
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use async_trait::async_trait;
use weir_common::{ClassifiedError, Options};

use crate::{Result, Sink};

/// Where the console sink prints.
pub type ConsoleWriter = Arc<Mutex<dyn Write + Send>>;

/// Prints every batch.
#[derive(Clone)]
pub struct ConsoleSink {
    num_rows: usize,
    truncate: bool,
    out: ConsoleWriter,
}

impl std::fmt::Debug for ConsoleSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleSink")
            .field("num_rows", &self.num_rows)
            .field("truncate", &self.truncate)
            .finish()
    }
}

impl ConsoleSink {
    /// Reads `numRows` and `truncate`; prints to standard output.
    pub fn try_new(options: &Options) -> Result<Self> {
        Self::with_writer(options, Arc::new(Mutex::new(std::io::stdout())))
    }

    /// Like [`ConsoleSink::try_new`], printing to `out`.
    pub fn with_writer(options: &Options, out: ConsoleWriter) -> Result<Self> {
        let r = options.reader("console sink", &["numRows", "truncate"]);
        r.check_known()?;
        Ok(Self {
            num_rows: r.int_at_least("numRows", 20, 0)? as usize,
            truncate: r.bool("truncate", true)?,
            out,
        })
    }
}

#[async_trait]
impl Sink for ConsoleSink {
    fn description(&self) -> String {
        format!(
            "ConsoleSink[numRows={}, truncate={}]",
            self.num_rows, self.truncate
        )
    }

    fn is_idempotent(&self) -> bool {
        false
    }

    async fn add_batch(
        &self,
        batch_id: u64,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<()> {
        let text = show(batch_id, &schema, &batches, self.num_rows, self.truncate)?;
        let mut out = self.out.lock().map_err(|_| {
            ClassifiedError::new("INTERNAL_ERROR", "XX000", "console sink lock poisoned")
        })?;
        // A closed stdout (e.g. `weir run | head`) must not fail the query.
        let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        Ok(())
    }
}

/// Renders a batch the way Spark's console sink does.
pub(crate) fn show(
    batch_id: u64,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    num_rows: usize,
    truncate: bool,
) -> Result<String> {
    let total: usize = batches.iter().map(|b| b.num_rows()).sum();
    let mut cells: Vec<Vec<String>> =
        vec![schema.fields().iter().map(|f| f.name().clone()).collect()];
    // Close to Spark's show(): `2026-12-03 07:45:01.500`, whole seconds without a fraction.
    let opts = FormatOptions::default()
        .with_null("NULL")
        .with_timestamp_format(Some("%Y-%m-%d %H:%M:%S%.f"))
        .with_timestamp_tz_format(Some("%Y-%m-%d %H:%M:%S%.f"));
    'outer: for b in batches {
        let fmts = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for row in 0..b.num_rows() {
            if cells.len() > num_rows {
                break 'outer;
            }
            cells.push(fmts.iter().map(|f| f.value(row).to_string()).collect());
        }
    }
    if truncate {
        for row in &mut cells {
            for c in row.iter_mut() {
                if c.chars().count() > 20 {
                    *c = c.chars().take(17).collect::<String>() + "...";
                }
            }
        }
    }
    let ncols = cells[0].len();
    let widths: Vec<usize> = (0..ncols)
        .map(|i| {
            cells
                .iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
                .max(3)
        })
        .collect();
    let sep: String = widths
        .iter()
        .fold("+".to_string(), |s, w| s + &"-".repeat(*w) + "+");
    let mut s = String::new();
    let _ = writeln!(s, "-------------------------------------------");
    let _ = writeln!(s, "Batch: {batch_id}");
    let _ = writeln!(s, "-------------------------------------------");
    let _ = writeln!(s, "{sep}");
    for (i, row) in cells.iter().enumerate() {
        s.push('|');
        for (c, w) in row.iter().zip(&widths) {
            let pad = w - c.chars().count();
            if truncate {
                let _ = write!(s, "{}{c}|", " ".repeat(pad));
            } else {
                let _ = write!(s, "{c}{}|", " ".repeat(pad));
            }
        }
        s.push('\n');
        if i == 0 {
            let _ = writeln!(s, "{sep}");
        }
    }
    let _ = writeln!(s, "{sep}");
    if total > num_rows {
        let _ = writeln!(
            s,
            "only showing top {num_rows} row{}",
            if num_rows == 1 { "" } else { "s" }
        );
    }
    s.push('\n');
    Ok(s)
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn prints_like_spark_show_with_header_truncation_and_row_limit() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("value", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
        ]));
        let b = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 22, 333])),
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    None,
                    Some("abcdefghijklmnopqrstuvwxyz"),
                ])),
            ],
        )
        .unwrap();
        let text = show(7, &schema, &[b], 2, true).unwrap();
        let expected = "\
-------------------------------------------
Batch: 7
-------------------------------------------
+-----+----+
|value|   s|
+-----+----+
|    1|   a|
|   22|NULL|
+-----+----+
only showing top 2 rows

";
        assert_eq!(text, expected);
    }

    #[test]
    fn timestamps_print_as_spark_shows_them() {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "timestamp",
            DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, Some("UTC".into())),
            false,
        )]));
        let ts =
            arrow::array::TimestampMicrosecondArray::from(vec![0, 1_500_000]).with_timezone("UTC");
        let b = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(ts)]).unwrap();
        let text = show(0, &schema, &[b], 20, false).unwrap();
        assert!(text.contains("|1970-01-01 00:00:00    |"), "{text}");
        assert!(text.contains("|1970-01-01 00:00:01.500|"), "{text}");
    }
}
