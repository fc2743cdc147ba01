//! Reading a file source's files into Arrow: the formats, malformed-record modes, and schema
//! inference.

use std::cell::RefCell;
use std::io::Cursor;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray, new_null_array};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use weir_common::{ClassifiedError, OptionReader, Options};

use super::listing::Listing;
use super::{FileSourceOptions, RecordedSchema};
use crate::{Error, Result};

const BATCH_ROWS: usize = 8192;

/// The deepest a JSON record may nest objects and arrays (Jackson's default, which Spark
/// reads with): a deeper one is a malformed record. arrow's decoder reads any depth, but its
/// error message for a record of the wrong shape recurses once per level, and 50,000 levels
/// overflow the stack. (Schema inference, through serde_json, stops at 128 levels.)
pub const MAX_JSON_DEPTH: usize = 1000;

/// Whether some line of `bytes` nests objects and arrays deeper than [`MAX_JSON_DEPTH`]
/// (brackets inside strings do not count). One pass over the bytes, no recursion.
fn json_too_deep(bytes: &[u8]) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                b'\n' => in_string = false,
                _ => {}
            }
            if b == b'\n' {
                depth = 0;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'\n' => depth = 0,
            _ => {}
        }
    }
    false
}

/// The formats of the file source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// JSON Lines: one JSON object per line.
    Json,
    /// CSV.
    Csv,
    /// Apache Parquet.
    Parquet,
}

impl FileFormat {
    /// The format's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Csv => "csv",
            Self::Parquet => "parquet",
        }
    }

    /// `json`, `csv` or `parquet`, in any case.
    pub fn parse(name: &str) -> Result<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "json" => Ok(Self::Json),
            "csv" => Ok(Self::Csv),
            "parquet" => Ok(Self::Parquet),
            other => Err(ClassifiedError::invalid_option(format!(
                "read_files cannot read the format '{other}'; it reads 'json', 'csv' and \
                 'parquet'."
            ))
            .into()),
        }
    }
}

/// What happens to a malformed JSON or CSV record (`mode`, as Spark's parse modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A row of nulls, with the record's text in the corrupt-record column if the schema has
    /// one (the default).
    Permissive,
    /// The record is dropped.
    DropMalformed,
    /// The query fails, naming the file and line.
    FailFast,
}

/// CSV parsing options (Spark's names).
#[derive(Debug, Clone)]
pub struct CsvOptions {
    /// The first line of each file names the columns.
    pub header: bool,
    /// The field separator (`sep` or `delimiter`).
    pub delimiter: u8,
    /// The quote character.
    pub quote: u8,
    /// The escape character inside quotes.
    pub escape: Option<u8>,
    /// Lines starting with this character are skipped.
    pub comment: Option<u8>,
    /// The text that reads as null (default: the empty field).
    pub null_value: Option<String>,
    /// Infer column types when inferring the schema (otherwise every column is a string).
    pub infer_schema: bool,
}

fn one_byte(r: &OptionReader<'_>, key: &str) -> Result<Option<u8>> {
    let Some(v) = r.string(key) else {
        return Ok(None);
    };
    let v = match v.as_str() {
        "\\t" => "\t".to_string(),
        _ => v,
    };
    match v.as_bytes() {
        [b] => Ok(Some(*b)),
        _ => Err(ClassifiedError::invalid_option(format!(
            "Invalid value '{v}' for option '{key}' of the csv file source: expected one \
             ASCII character."
        ))
        .into()),
    }
}

impl CsvOptions {
    pub(super) fn try_new(r: &OptionReader<'_>, own: &Options) -> Result<Self> {
        let sep = one_byte(r, "sep")?;
        let delimiter = one_byte(r, "delimiter")?;
        if own.get("sep").is_some() && own.get("delimiter").is_some() {
            return Err(ClassifiedError::invalid_option(
                "Options 'sep' and 'delimiter' of the csv file source mean the same; set one.",
            )
            .into());
        }
        Ok(Self {
            header: r.bool("header", false)?,
            delimiter: sep.or(delimiter).unwrap_or(b','),
            quote: one_byte(r, "quote")?.unwrap_or(b'"'),
            escape: one_byte(r, "escape")?,
            comment: one_byte(r, "comment")?,
            null_value: r.string("nullValue"),
            infer_schema: r.bool("inferSchema", false)?,
        })
    }
}

/// `schema` with every column nullable, as Spark's file sources read.
pub fn nullable(schema: &Schema) -> Schema {
    Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    )
}

/// The schema read from the files (without the corrupt-record column) and where that column is.
fn split_corrupt(o: &FileSourceOptions, schema: &SchemaRef) -> (SchemaRef, Option<usize>) {
    match schema.index_of(&o.corrupt_column) {
        Ok(i)
            if o.format != super::FileFormat::Parquet
                && schema.field(i).data_type() == &DataType::Utf8 =>
        {
            let fields: Vec<_> = schema
                .fields()
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, f)| Arc::clone(f))
                .collect();
            (Arc::new(Schema::new(fields)), Some(i))
        }
        _ => (Arc::clone(schema), None),
    }
}

/// Reads one file, whose relative path is `path`, as batches of `schema`.
pub fn read_file(
    o: &FileSourceOptions,
    schema: &SchemaRef,
    path: &str,
    bytes: Bytes,
) -> Result<Vec<RecordBatch>> {
    match o.format {
        FileFormat::Parquet => read_parquet(schema, path, bytes),
        FileFormat::Json | FileFormat::Csv => {
            let (read_schema, corrupt) = split_corrupt(o, schema);
            if read_schema.fields().is_empty() && o.format == FileFormat::Json {
                // Only the corrupt-record column (inferred from files holding no JSON object):
                // one row per record, the text of those that are not JSON objects.
                return corrupt_only(o, schema, corrupt, path, &bytes);
            }
            let decoder = RecordDecoder {
                o,
                schema: &read_schema,
            };
            // A record nested too deep goes to the record-by-record path, which takes it for
            // a malformed one before the decoder sees it.
            let whole = match o.format {
                FileFormat::Json if json_too_deep(&bytes) => Err(Error::Corrupt(String::new())),
                _ => decoder.all(&bytes),
            };
            let batches = match whole {
                Ok(batches) => batches
                    .into_iter()
                    .map(|b| with_corrupt(schema, corrupt, b, None))
                    .collect::<Result<Vec<_>>>()?,
                Err(_) => decoder.record_by_record(schema, corrupt, path, &bytes)?,
            };
            Ok(batches)
        }
    }
}

/// The records of a file read with no column but the corrupt-record one: a row per non-blank
/// line, null for a JSON object and the line's text for anything else (per the mode).
fn corrupt_only(
    o: &FileSourceOptions,
    schema: &SchemaRef,
    corrupt: Option<usize>,
    path: &str,
    bytes: &[u8],
) -> Result<Vec<RecordBatch>> {
    let mut texts: Vec<Option<String>> = vec![];
    for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let object = !json_too_deep(line)
            && matches!(
                serde_json::from_slice::<serde_json::Value>(line),
                Ok(serde_json::Value::Object(_))
            );
        if object {
            texts.push(None);
            continue;
        }
        match o.mode {
            Mode::DropMalformed => {}
            Mode::Permissive => texts.push(Some(String::from_utf8_lossy(line).into_owned())),
            Mode::FailFast => {
                return Err(ClassifiedError::new(
                    "MALFORMED_RECORD_IN_PARSING",
                    "22023",
                    format!(
                        "Malformed json record at line {} of '{path}' (mode FAILFAST): it is \
                         not a JSON object. Record: {}. Fix or remove the file, or read with \
                         mode PERMISSIVE or DROPMALFORMED.",
                        i + 1,
                        truncate(&String::from_utf8_lossy(line), 200)
                    ),
                )
                .into());
            }
        }
    }
    if texts.is_empty() {
        return Ok(vec![]);
    }
    let rows = texts.len();
    let columns: Vec<ArrayRef> = match corrupt {
        Some(_) => vec![Arc::new(StringArray::from(texts))],
        None => vec![],
    };
    let options = arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(vec![RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &options,
    )?])
}

/// Puts the corrupt-record column (null, or `text` for a one-row batch) into `b`.
fn with_corrupt(
    schema: &SchemaRef,
    corrupt: Option<usize>,
    b: RecordBatch,
    text: Option<&str>,
) -> Result<RecordBatch> {
    let Some(i) = corrupt else {
        return Ok(b);
    };
    let mut columns: Vec<ArrayRef> = b.columns().to_vec();
    let texts: ArrayRef = Arc::new(StringArray::from(vec![text; b.num_rows()]));
    columns.insert(i, texts);
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

struct RecordDecoder<'a> {
    o: &'a FileSourceOptions,
    schema: &'a SchemaRef,
}

/// Either format's push decoder.
enum Decoder {
    Json(arrow::json::reader::Decoder),
    Csv(Box<arrow::csv::reader::Decoder>),
}

impl Decoder {
    fn decode(&mut self, buf: &[u8]) -> Result<usize, arrow::error::ArrowError> {
        match self {
            Self::Json(d) => d.decode(buf),
            Self::Csv(d) => d.decode(buf),
        }
    }

    fn flush(&mut self) -> Result<Option<RecordBatch>, arrow::error::ArrowError> {
        match self {
            Self::Json(d) => d.flush(),
            Self::Csv(d) => d.flush(),
        }
    }
}

impl RecordDecoder<'_> {
    fn decoder(&self, batch_rows: usize, header: bool) -> Result<Decoder> {
        Ok(match self.o.format {
            FileFormat::Json => Decoder::Json(
                arrow::json::ReaderBuilder::new(Arc::clone(self.schema))
                    .with_batch_size(batch_rows)
                    // A number or boolean read into a string column is its text, as Spark.
                    .with_coerce_primitive(true)
                    .build_decoder()?,
            ),
            _ => {
                let c = &self.o.csv;
                let mut b = arrow::csv::ReaderBuilder::new(Arc::clone(self.schema))
                    .with_batch_size(batch_rows)
                    .with_header(header)
                    .with_delimiter(c.delimiter)
                    .with_quote(c.quote);
                if let Some(e) = c.escape {
                    b = b.with_escape(e);
                }
                if let Some(cm) = c.comment {
                    b = b.with_comment(cm);
                }
                if let Some(n) = &c.null_value {
                    let re =
                        regex::Regex::new(&format!("^{}$", regex::escape(n))).map_err(|e| {
                            ClassifiedError::invalid_option(format!("nullValue '{n}': {e}"))
                        })?;
                    b = b.with_null_regex(re);
                }
                Decoder::Csv(Box::new(b.build_decoder()))
            }
        })
    }

    /// The whole file at once; fails on the first malformed record.
    fn all(&self, bytes: &[u8]) -> Result<Vec<RecordBatch>> {
        let header = self.o.format == FileFormat::Csv && self.o.csv.header;
        let mut d = self.decoder(BATCH_ROWS, header)?;
        let mut out = vec![];
        let mut buf = bytes;
        while !buf.is_empty() {
            let n = d.decode(buf)?;
            buf = &buf[n..];
            match d.flush()? {
                Some(b) => out.push(b),
                None if n == 0 => {
                    return Err(Error::Corrupt("the decoder made no progress".into()));
                }
                None => {}
            }
        }
        // The end of the input completes a last record without a line break.
        d.decode(&[])?;
        out.extend(d.flush()?);
        Ok(out)
    }

    /// Line by line, after the whole file failed: each malformed record per the mode.
    fn record_by_record(
        &self,
        schema: &SchemaRef,
        corrupt: Option<usize>,
        path: &str,
        bytes: &[u8],
    ) -> Result<Vec<RecordBatch>> {
        let header = self.o.format == FileFormat::Csv && self.o.csv.header;
        let mut rows = vec![];
        let mut d = self.decoder(1, false)?;
        for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if (header && i == 0) || line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let parsed = if self.o.format == FileFormat::Json && json_too_deep(line) {
                Err(arrow::error::ArrowError::JsonError(format!(
                    "it nests objects and arrays deeper than {MAX_JSON_DEPTH} levels"
                )))
            } else {
                d.decode(line).and_then(|_| {
                    if self.o.format == FileFormat::Csv {
                        d.decode(b"\n")?;
                    }
                    d.flush()
                })
            };
            // A CSV record with fewer or more fields than the schema's columns, in PERMISSIVE
            // mode: as Spark, the missing fields are null, the extra ones dropped, and the
            // record's text goes into the corrupt-record column.
            let parsed = match parsed {
                Err(e) if self.o.format == FileFormat::Csv && self.o.mode == Mode::Permissive => {
                    d = self.decoder(1, false)?;
                    match self.ragged_csv(&mut d, line) {
                        Some(b) => {
                            rows.push(with_corrupt(
                                schema,
                                corrupt,
                                b,
                                Some(&String::from_utf8_lossy(line)),
                            )?);
                            continue;
                        }
                        None => Err(e),
                    }
                }
                other => other,
            };
            match parsed {
                Ok(Some(b)) if b.num_rows() == 1 => {
                    rows.push(with_corrupt(schema, corrupt, b, None)?);
                }
                other => {
                    let why = match other {
                        Err(e) => e.to_string(),
                        _ => "the record is incomplete".to_string(),
                    };
                    d = self.decoder(1, false)?;
                    let text = String::from_utf8_lossy(line);
                    match self.o.mode {
                        Mode::DropMalformed => {}
                        Mode::FailFast => {
                            return Err(ClassifiedError::new(
                                "MALFORMED_RECORD_IN_PARSING",
                                "22023",
                                format!(
                                    "Malformed {} record at line {} of '{path}' (mode \
                                     FAILFAST): {why}. Record: {}. Fix or remove the file, or \
                                     read with mode PERMISSIVE or DROPMALFORMED.",
                                    self.o.format.name(),
                                    i + 1,
                                    truncate(&text, 200)
                                ),
                            )
                            .into());
                        }
                        Mode::Permissive => {
                            let nulls: Vec<ArrayRef> = self
                                .schema
                                .fields()
                                .iter()
                                .map(|f| new_null_array(f.data_type(), 1))
                                .collect();
                            let b = RecordBatch::try_new(Arc::clone(self.schema), nulls)?;
                            rows.push(with_corrupt(schema, corrupt, b, Some(&text))?);
                        }
                    }
                }
            }
        }
        if rows.is_empty() {
            return Ok(vec![]);
        }
        Ok(rows
            .chunks(BATCH_ROWS)
            .map(|c| concat_batches(schema, c))
            .collect::<Result<Vec<_>, _>>()?)
    }
}

impl RecordDecoder<'_> {
    /// The CSV record `line`, whose number of fields differs from the schema's columns, read
    /// with the missing fields null and the extra ones dropped; `None` when its field count is
    /// not what is wrong, or it does not read even so. `d` is a fresh one-row decoder.
    fn ragged_csv(&self, d: &mut Decoder, line: &[u8]) -> Option<RecordBatch> {
        let c = &self.o.csv;
        let mut reader = csv::ReaderBuilder::new();
        reader
            .has_headers(false)
            .flexible(true)
            .delimiter(c.delimiter)
            .quote(c.quote)
            .escape(c.escape);
        let mut record = csv::ByteRecord::new();
        if !reader
            .from_reader(line)
            .read_byte_record(&mut record)
            .ok()?
        {
            return None;
        }
        let n = self.schema.fields().len();
        if record.len() == n || n == 0 {
            return None;
        }
        let mut writer = csv::WriterBuilder::new();
        writer.delimiter(c.delimiter).quote(c.quote);
        if let Some(e) = c.escape {
            writer.double_quote(false).escape(e);
        }
        let mut w = writer.from_writer(vec![]);
        w.write_record((0..n).map(|i| record.get(i).unwrap_or(b"")))
            .ok()?;
        let fixed = w.into_inner().ok()?;
        d.decode(&fixed).ok()?;
        let b = d.flush().ok()??;
        if b.num_rows() != 1 {
            return None;
        }
        // Padded fields are null, whatever nullValue says of an empty field.
        let columns: Vec<ArrayRef> = b
            .columns()
            .iter()
            .zip(self.schema.fields())
            .enumerate()
            .map(|(i, (col, f))| {
                if i < record.len() {
                    Arc::clone(col)
                } else {
                    new_null_array(f.data_type(), 1)
                }
            })
            .collect();
        RecordBatch::try_new(Arc::clone(self.schema), columns).ok()
    }
}

fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

pub(crate) fn failed_read(path: &str, e: impl std::fmt::Display) -> Error {
    Error::User(ClassifiedError::new(
        "FAILED_READ_FILE",
        "KD001",
        format!(
            "Cannot read the file '{path}': {e}. Replace or remove the damaged file (a file \
             already in the source's log is read again by a replayed batch)."
        ),
    ))
}

/// A Parquet file, its columns matched to `schema` by name (missing ones null, others cast).
fn read_parquet(schema: &SchemaRef, path: &str, bytes: Bytes) -> Result<Vec<RecordBatch>> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .and_then(|b| b.with_batch_size(BATCH_ROWS).build())
        .map_err(|e| failed_read(path, e))?;
    let mut out = vec![];
    for batch in reader {
        let batch = batch.map_err(|e| failed_read(path, e))?;
        out.push(conform(schema, &batch, path)?);
    }
    Ok(out)
}

/// `batch` with its columns matched to `schema` by name: missing ones null, others cast. A
/// column that cannot be cast fails with `FAILED_READ_FILE` naming `path`.
pub(crate) fn conform(schema: &SchemaRef, batch: &RecordBatch, path: &str) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            None => Ok(new_null_array(f.data_type(), batch.num_rows())),
            Some(c) if c.data_type() == f.data_type() => Ok(Arc::clone(c)),
            Some(c) => cast(c, f.data_type()).map_err(|e| {
                failed_read(
                    path,
                    format!(
                        "its column '{}' of type {} cannot be read as {}: {e}",
                        f.name(),
                        c.data_type(),
                        f.data_type()
                    ),
                )
            }),
        })
        .collect::<Result<Vec<_>>>()?;
    let options =
        arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &options,
    )?)
}

/// The schema of a source without a `schema` option: the one kept at `schemaLocation`, or
/// inferred from the files present now (and then kept there). Runs on a thread of its own, as
/// planning is synchronous and may itself run on an async runtime.
pub fn resolve_blocking(o: &FileSourceOptions) -> Result<Schema> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::Corrupt(format!("cannot start schema inference: {e}")))?;
            rt.block_on(resolve(o))
        })
        .join()
        .map_err(|_| Error::Corrupt("schema inference panicked".into()))?
    })
}

async fn resolve(o: &FileSourceOptions) -> Result<Schema> {
    const KEPT: &str = "_schemas/0";
    let Some(at) = &o.schema_location else {
        return infer(o).await;
    };
    let dir = weir_common::Location::parse_with(at, o.storage.clone())?;
    let file = format!("{}/{KEPT}", dir.display());
    if let Some(bytes) = dir.get(KEPT).await? {
        return RecordedSchema::parse(&bytes, &file);
    }
    let schema = infer(o).await?;
    // Two queries inferring at once: the first kept schema wins for both.
    if dir
        .put_if_absent(KEPT, RecordedSchema::new(&schema).json()?.into())
        .await?
        == weir_common::Created::AlreadyExisted
        && let Some(bytes) = dir.get(KEPT).await?
    {
        return RecordedSchema::parse(&bytes, &file);
    }
    Ok(schema)
}

async fn infer(o: &FileSourceOptions) -> Result<Schema> {
    let listing = Listing::new(o)?;
    let mut files = listing.list().await?;
    files.sort_by(|a, b| (a.timestamp, &a.path).cmp(&(b.timestamp, &b.path)));
    if files.is_empty() {
        return Err(ClassifiedError::new(
            "UNABLE_TO_INFER_SCHEMA",
            "42KD9",
            format!(
                "Unable to infer the schema of the {} files in '{}': there are none (yet, or \
                 any more after cleanSource). Give it with the `schema` option, e.g. schema => \
                 'id BIGINT, name STRING', or set `schemaLocation` so that the schema inferred \
                 once is kept there for later runs.",
                o.format.name(),
                o.path
            ),
        )
        .into());
    }
    let mut contents = Vec::with_capacity(files.len());
    for f in &files {
        contents.push((f.path.clone(), listing.get(f).await?));
    }
    let schema = match o.format {
        FileFormat::Json => infer_json(o, &contents)?,
        FileFormat::Csv => infer_csv(o, &contents)?,
        FileFormat::Parquet => {
            let mut schemas = vec![];
            for (path, bytes) in contents {
                let b = ParquetRecordBatchReaderBuilder::try_new(bytes)
                    .map_err(|e| failed_read(&path, e))?;
                schemas.push(b.schema().as_ref().clone());
            }
            union(schemas, |a, _| a.clone())
        }
    };
    if schema.fields().len() > o.max_columns {
        return Err(too_wide(o, schema.fields().len()).into());
    }
    if schema.fields().is_empty() {
        return Err(ClassifiedError::new(
            "UNABLE_TO_INFER_SCHEMA",
            "42KD9",
            format!(
                "Unable to infer the schema of the {} files in '{}': they hold no columns. \
                 Give it with the `schema` option.",
                o.format.name(),
                o.path
            ),
        )
        .into());
    }
    Ok(schema)
}

/// The error for files whose inferred schema has `columns` columns, more than `maxColumns`.
fn too_wide(o: &FileSourceOptions, columns: usize) -> ClassifiedError {
    ClassifiedError::new(
        "INFERRED_SCHEMA_TOO_WIDE",
        "54011",
        format!(
            "The {} files in '{}' have at least {columns} columns, more than maxColumns ({}). \
             Give the columns to read with the `schema` option, or raise maxColumns if the \
             files really are this wide (planning a query grows with the square of its \
             columns).",
            o.format.name(),
            o.path,
            o.max_columns
        ),
    )
}

/// JSON: every line of every file, fields sorted by name as Spark's inference.
fn infer_json(o: &FileSourceOptions, contents: &[(String, Bytes)]) -> Result<Schema> {
    let malformed = RefCell::new(None::<(String, usize)>);
    let values = contents.iter().flat_map(|(path, bytes)| {
        let malformed = &malformed;
        bytes
            .split(|b| *b == b'\n')
            .enumerate()
            .filter(|(_, l)| !l.iter().all(u8::is_ascii_whitespace))
            .filter_map(
                move |(i, l)| match serde_json::from_slice::<serde_json::Value>(l) {
                    Ok(v @ serde_json::Value::Object(_)) => {
                        Some(Ok::<_, arrow::error::ArrowError>(v))
                    }
                    _ => {
                        malformed
                            .borrow_mut()
                            .get_or_insert_with(|| (path.clone(), i + 1));
                        None
                    }
                },
            )
    });
    let inferred = arrow::json::reader::infer_json_schema_from_iterator(values)?;
    let mut fields: Vec<Field> = inferred
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_data_type(json_type(f.data_type())))
        .collect();
    if let Some((path, line)) = malformed.take() {
        match o.mode {
            Mode::FailFast => {
                return Err(ClassifiedError::new(
                    "MALFORMED_RECORD_IN_PARSING",
                    "22023",
                    format!(
                        "Malformed json record at line {line} of '{path}' while inferring the \
                         schema (mode FAILFAST). Fix or remove the file, or read with mode \
                         PERMISSIVE or DROPMALFORMED."
                    ),
                )
                .into());
            }
            Mode::Permissive => {
                if !fields.iter().any(|f| f.name() == &o.corrupt_column) {
                    fields.push(Field::new(&o.corrupt_column, DataType::Utf8, true));
                }
            }
            Mode::DropMalformed => {}
        }
    }
    fields.sort_by(|a, b| a.name().cmp(b.name()));
    Ok(Schema::new(fields))
}

/// Spark's view of a JSON-inferred type: all-null fields are strings, struct fields sorted.
fn json_type(t: &DataType) -> DataType {
    match t {
        DataType::Null => DataType::Utf8,
        DataType::List(f) => DataType::List(Arc::new(
            f.as_ref().clone().with_data_type(json_type(f.data_type())),
        )),
        DataType::Struct(fields) => {
            let mut fs: Vec<Field> = fields
                .iter()
                .map(|f| f.as_ref().clone().with_data_type(json_type(f.data_type())))
                .collect();
            fs.sort_by(|a, b| a.name().cmp(b.name()));
            DataType::Struct(Fields::from(fs))
        }
        other => other.clone(),
    }
}

/// CSV: column names from the header (or `_c0`, `_c1`, ...), all strings unless inferSchema.
fn infer_csv(o: &FileSourceOptions, contents: &[(String, Bytes)]) -> Result<Schema> {
    let c = &o.csv;
    let mut schemas = vec![];
    for (path, bytes) in contents {
        // Rows with fewer or more fields than the header (or the first row) are read as
        // Spark's PERMISSIVE inference does: the columns are the header's.
        let mut format = arrow::csv::reader::Format::default()
            .with_header(c.header)
            .with_delimiter(c.delimiter)
            .with_quote(c.quote)
            .with_truncated_rows(true);
        if let Some(e) = c.escape {
            format = format.with_escape(e);
        }
        if let Some(cm) = c.comment {
            format = format.with_comment(cm);
        }
        let (schema, _) = format
            .infer_schema(Cursor::new(bytes), None)
            .map_err(|e| failed_read(path, e))?;
        if schema.fields().len() > o.max_columns {
            return Err(too_wide(o, schema.fields().len()).into());
        }
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let name = if c.header {
                    f.name().clone()
                } else {
                    format!("_c{i}")
                };
                let t = match f.data_type() {
                    _ if !c.infer_schema => DataType::Utf8,
                    DataType::Null => DataType::Utf8,
                    DataType::Timestamp(_, _) => {
                        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
                    }
                    t => t.clone(),
                };
                Field::new(name, t, true)
            })
            .collect();
        schemas.push(Schema::new(fields));
    }
    Ok(union(schemas, |a, b| match (a, b) {
        (DataType::Int64, DataType::Float64) | (DataType::Float64, DataType::Int64) => {
            DataType::Float64
        }
        _ => DataType::Utf8,
    }))
}

/// Columns of all `schemas` by name in first-seen order; `widen` settles differing types.
fn union(schemas: Vec<Schema>, widen: impl Fn(&DataType, &DataType) -> DataType) -> Schema {
    let mut fields: Vec<Field> = vec![];
    // By name, so that wide files do not make this quadratic.
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for s in schemas {
        for f in s.fields() {
            match index.get(f.name()) {
                None => {
                    index.insert(f.name().clone(), fields.len());
                    fields.push(f.as_ref().clone());
                }
                Some(&i) if fields[i].data_type() != f.data_type() => {
                    let t = widen(fields[i].data_type(), f.data_type());
                    fields[i] = fields[i].clone().with_data_type(t);
                }
                Some(_) => {}
            }
        }
    }
    Schema::new(fields)
}
