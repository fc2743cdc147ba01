//! The file source: `read_files(path, format => 'json')` in SQL, `format("json")` with a `path`
//! option in Rust. It streams the JSON (one record per line), CSV and Parquet files that appear
//! in a directory of the local filesystem or of S3, each file exactly once.
//!
//! As Spark's `FileStreamSource`, the source keeps its own log in the checkpoint
//! (`sources/<i>/<n>`: the files of its n-th batch, one JSON line each after a `v1` line), and
//! its offset is the number of the newest log entry (`{"logOffset":n}`):
//!
//! ```text
//! latest_offset(start = n):  list the directory (filters: glob, pathGlobFilter, modified
//!                            times, maxFileAge), drop files already in the log, order by
//!                            modification time (newest first with latestFirst), take up to
//!                            maxFilesPerTrigger / maxBytesPerTrigger, write them create-only as
//!                            entry n+1 (or reuse an entry n+1 a killed run wrote)  -> n+1
//! get_batch(n, m):           read the files of entries n+1..=m, one partition per group of files
//! commit(m):                 cleanSource: delete or archive the files of entries <= m
//! ```
//!
//! The schema is given (`schema => 'a BIGINT, b STRING'`, Spark DDL) or inferred from the files
//! present when the query is defined; the first run records it in `sources/<i>/schema`, and a
//! later run whose inferred schema differs is refused, with the recorded schema to pass as
//! `schema`. Malformed JSON and CSV records follow `mode`: PERMISSIVE (a row of nulls, the
//! record's text in the corrupt-record column if the schema has one), DROPMALFORMED or FAILFAST.

mod ddl;
mod listing;
mod log;
mod read;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{Schema, SchemaRef};
use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use weir_common::{ClassifiedError, Location, Options};

pub use ddl::{parse_ddl, to_ddl};
use listing::{FileMeta, Listing};
use log::SourceLog;
pub use read::{CsvOptions, FileFormat, Mode};
#[cfg(feature = "delta")]
pub(crate) use read::{conform, failed_read};

use crate::{
    Error, MicroBatchStream, Offset, Partitions, ReadLimit, Result, SourceContext, SourceProvider,
};

/// The source's record of how far cleanSource got, in its checkpoint folder.
const CLEANED: &str = "cleaned";

/// Options every file format accepts.
const COMMON: &[&str] = &[
    "path",
    "format",
    "schema",
    "maxFilesPerTrigger",
    "maxBytesPerTrigger",
    "latestFirst",
    "modifiedAfter",
    "modifiedBefore",
    "pathGlobFilter",
    "recursiveFileLookup",
    "maxFileAge",
    "cleanSource",
    "maxColumns",
    "sourceArchiveDir",
    "mode",
    "columnNameOfCorruptRecord",
    "schemaLocation",
];

/// Options of CSV files only.
const CSV: &[&str] = &[
    "header",
    "sep",
    "delimiter",
    "quote",
    "escape",
    "comment",
    "nullValue",
    "inferSchema",
];

/// What happens to a file once the batch that read it is committed (`cleanSource`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CleanSource {
    /// Nothing (the default).
    Off,
    /// The file is deleted.
    Delete,
    /// The file is moved into this directory, at its path relative to the source's directory.
    Archive(String),
}

/// The typed options of a file source.
#[derive(Debug, Clone)]
pub struct FileSourceOptions {
    /// The directory (or glob) the files appear in: a local path, `file://` or `s3://` URL.
    pub path: String,
    /// The file format.
    pub format: FileFormat,
    /// The schema given with the `schema` option, if any.
    pub schema: Option<Schema>,
    /// At most this many new files per micro-batch.
    pub max_files_per_trigger: Option<u64>,
    /// At most about this many bytes of new files per micro-batch (at least one file).
    pub max_bytes_per_trigger: Option<u64>,
    /// Newest files first.
    pub latest_first: bool,
    /// Only files modified after this time (epoch ms).
    pub modified_after_ms: Option<i64>,
    /// Only files modified before this time (epoch ms).
    pub modified_before_ms: Option<i64>,
    /// Only files whose name matches this glob.
    pub path_glob_filter: Option<String>,
    /// Files in subdirectories too.
    pub recursive: bool,
    /// Files older than the newest file seen by more than this are ignored.
    pub max_file_age: Duration,
    /// What to do with files once read and committed.
    pub clean_source: CleanSource,
    /// What to do with malformed records.
    pub mode: Mode,
    /// The column that receives a malformed record's text in PERMISSIVE mode.
    pub corrupt_column: String,
    /// CSV parsing options.
    pub csv: CsvOptions,
    /// Where an inferred schema is kept (`<schemaLocation>/_schemas/0`) and read back from by
    /// later runs instead of inferring again (Auto Loader's `schemaLocation`).
    pub schema_location: Option<String>,
    /// S3 client options (`aws_*`), over the environment.
    pub storage: Vec<(String, String)>,
    /// The most columns an inferred schema may have (`maxColumns`, Spark's CSV option, here
    /// for JSON too): wider files are refused rather than planned for minutes.
    pub max_columns: usize,
}

/// The default of `maxColumns` (Spark's CSV default).
pub const DEFAULT_MAX_COLUMNS: i64 = 20_480;

impl FileSourceOptions {
    /// Reads the options of a file source of `format`.
    pub fn try_new(format: FileFormat, options: &Options) -> Result<Self> {
        let what = format!("{} file source", format.name());
        let accepted: Vec<&str> = COMMON
            .iter()
            .chain(if format == FileFormat::Csv { CSV } else { &[] })
            .copied()
            .collect();
        let (storage, own) = options.split_prefixed("aws_");
        let r = own.reader(&what, &accepted);
        r.check_known()?;
        let path = r.required("path")?;
        let schema = r.string("schema").map(|s| parse_ddl(&s)).transpose()?;
        let positive = |key: &str| -> Result<Option<u64>> {
            Ok(match own.get(key) {
                None => None,
                Some(_) => Some(r.int_at_least(key, 1, 1)? as u64),
            })
        };
        let max_files_per_trigger = positive("maxFilesPerTrigger")?;
        let max_bytes_per_trigger = match own.get("maxBytesPerTrigger") {
            None => None,
            Some(v) => Some(parse_bytes(v).ok_or_else(|| {
                ClassifiedError::invalid_option(format!(
                    "Invalid value '{v}' for option 'maxBytesPerTrigger' of the {what}: \
                     expected a size such as 1048576, '64m' or '1g'."
                ))
            })?),
        };
        if max_files_per_trigger.is_some() && max_bytes_per_trigger.is_some() {
            return Err(ClassifiedError::invalid_option(format!(
                "Options 'maxFilesPerTrigger' and 'maxBytesPerTrigger' of the {what} cannot \
                 both be set; choose one."
            ))
            .into());
        }
        let time = |key: &str| -> Result<Option<i64>> {
            own.get(key)
                .map(|v| {
                    parse_time(v).ok_or_else(|| {
                        Error::User(ClassifiedError::invalid_option(format!(
                            "Invalid value '{v}' for option '{key}' of the {what}: expected a \
                             time such as 2026-01-31T08:00:00 (UTC) or 2026-01-31T08:00:00+01:00."
                        )))
                    })
                })
                .transpose()
        };
        let clean_source = match own
            .get("cleanSource")
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("off") => CleanSource::Off,
            Some("delete") => CleanSource::Delete,
            Some("archive") => {
                CleanSource::Archive(r.string("sourceArchiveDir").ok_or_else(|| {
                    ClassifiedError::invalid_option(format!(
                        "cleanSource 'archive' of the {what} needs option 'sourceArchiveDir', \
                         the directory to move read files into."
                    ))
                })?)
            }
            Some(other) => {
                return Err(ClassifiedError::invalid_option(format!(
                    "Invalid value '{other}' for option 'cleanSource' of the {what}: expected \
                     off, delete or archive."
                ))
                .into());
            }
        };
        if let CleanSource::Archive(dir) = &clean_source {
            let norm = |p: &str| p.trim_end_matches('/').to_string() + "/";
            if norm(dir).starts_with(&norm(&path)) || norm(&path).starts_with(&norm(dir)) {
                return Err(ClassifiedError::invalid_option(format!(
                    "sourceArchiveDir '{dir}' of the {what} must not be inside the source path \
                     '{path}' or contain it: archived files would be read again."
                ))
                .into());
            }
        } else if own.get("sourceArchiveDir").is_some() {
            return Err(ClassifiedError::invalid_option(format!(
                "Option 'sourceArchiveDir' of the {what} applies only with cleanSource 'archive'."
            ))
            .into());
        }
        let mode = match own.get("mode").map(str::to_ascii_uppercase).as_deref() {
            None | Some("PERMISSIVE") => Mode::Permissive,
            Some("DROPMALFORMED") => Mode::DropMalformed,
            Some("FAILFAST") => Mode::FailFast,
            Some(other) => {
                return Err(ClassifiedError::invalid_option(format!(
                    "Invalid value '{other}' for option 'mode' of the {what}: expected \
                     PERMISSIVE, DROPMALFORMED or FAILFAST."
                ))
                .into());
            }
        };
        let csv = CsvOptions::try_new(&r, &own)?;
        Ok(Self {
            format,
            schema,
            max_files_per_trigger,
            max_bytes_per_trigger,
            latest_first: r.bool("latestFirst", false)?,
            modified_after_ms: time("modifiedAfter")?,
            modified_before_ms: time("modifiedBefore")?,
            path_glob_filter: r.string("pathGlobFilter"),
            recursive: r.bool("recursiveFileLookup", false)?,
            max_file_age: r.duration(
                "maxFileAge",
                Duration::from_secs(7 * 86400),
                Duration::from_millis(1),
            )?,
            clean_source,
            mode,
            corrupt_column: r
                .string("columnNameOfCorruptRecord")
                .unwrap_or_else(|| "_corrupt_record".to_string()),
            csv,
            schema_location: r.string("schemaLocation"),
            storage,
            path,
            max_columns: r.int_between("maxColumns", DEFAULT_MAX_COLUMNS, 1, 1 << 20)? as usize,
        })
    }
}

/// `1048576`, `64k`, `64m`, `1g` (binary multiples, as Spark's byte strings).
fn parse_bytes(v: &str) -> Option<u64> {
    let v = v.trim().to_ascii_lowercase();
    let v = v.strip_suffix('b').unwrap_or(&v);
    let (num, mult) = match v.char_indices().last()? {
        (i, 'k') => (&v[..i], 1u64 << 10),
        (i, 'm') => (&v[..i], 1 << 20),
        (i, 'g') => (&v[..i], 1 << 30),
        (i, 't') => (&v[..i], 1 << 40),
        _ => (v, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(mult)
        .filter(|n| *n > 0)
}

/// `2026-01-31T08:00:00` (UTC), with optional fraction and offset, as epoch ms.
fn parse_time(v: &str) -> Option<i64> {
    let v = v.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(v) {
        return Some(t.timestamp_millis());
    }
    chrono::NaiveDateTime::parse_from_str(v, "%Y-%m-%dT%H:%M:%S%.f")
        .ok()
        .map(|t| t.and_utc().timestamp_millis())
}

/// A file source as a query is planned against it.
#[derive(Debug)]
pub struct FileSourceProvider {
    options: Arc<FileSourceOptions>,
    schema: SchemaRef,
    /// Whether the schema was given (not inferred).
    schema_given: bool,
}

impl FileSourceProvider {
    /// A file source of `format` with `options`; without a `schema` option, the schema is
    /// inferred from the files present now.
    pub fn try_new(format: FileFormat, options: &Options) -> Result<Self> {
        let options = FileSourceOptions::try_new(format, options)?;
        let (schema, given) = match &options.schema {
            Some(s) => (s.clone(), true),
            None => (read::resolve_blocking(&options)?, false),
        };
        Ok(Self {
            schema: Arc::new(read::nullable(&schema)),
            options: Arc::new(options),
            schema_given: given,
        })
    }

    /// `read_files(path, format => 'json' | 'csv' | 'parquet', ...)`.
    pub fn read_files(options: &Options) -> Result<Self> {
        let format = options.get("format").ok_or_else(|| {
            ClassifiedError::invalid_option(
                "read_files needs option 'format': 'json', 'csv' or 'parquet'.",
            )
        })?;
        Self::try_new(FileFormat::parse(format)?, options)
    }
}

/// What the checkpoint records about the schema (`sources/<i>/schema`, and
/// `<schemaLocation>/_schemas/0`).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RecordedSchema {
    ddl: Option<String>,
    schema: Schema,
}

impl RecordedSchema {
    pub(crate) fn new(schema: &Schema) -> Self {
        Self {
            ddl: to_ddl(schema),
            schema: schema.clone(),
        }
    }

    pub(crate) fn json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec_pretty(self)
            .map_err(|e| Error::Corrupt(format!("cannot serialize the schema: {e}")))
    }

    pub(crate) fn parse(bytes: &[u8], file: &str) -> Result<Schema> {
        serde_json::from_slice::<Self>(bytes)
            .map(|r| r.schema)
            .map_err(|e| {
                Error::Corrupt(format!(
                    "The file source's schema record '{file}' cannot be read: {e}. Restore it, \
                     delete it to record the current schema again, start the query over (weir \
                     checkpoint reset DIR --full), or use a new checkpoint location."
                ))
            })
    }
}

#[async_trait]
impl SourceProvider for FileSourceProvider {
    fn format(&self) -> &str {
        self.options.format.name()
    }

    fn identity(&self) -> String {
        format!("{}:{}", self.options.format.name(), self.options.path)
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// A file source started from its starting position has no log of the files it read, so
    /// every file its options select is new to it.
    fn start_difference(&self, derived: &Offset, chosen: &Offset) -> Option<String> {
        let (d, c) = (
            FileOffset::from(derived).ok()?,
            FileOffset::from(chosen).ok()?,
        );
        (d.log_offset > c.log_offset).then(|| {
            format!(
                "overlaps: reads again every file of its {} earlier batches that its options \
                 still select (the record of the files it read is dropped; modifiedAfter or \
                 maxFileAge keep old files out)",
                d.log_offset - c.log_offset
            )
        })
    }

    async fn open(&self, ctx: SourceContext) -> Result<Box<dyn MicroBatchStream>> {
        self.check_recorded_schema(&ctx.metadata).await?;
        let listing = Arc::new(Listing::new(&self.options)?);
        // How far cleanSource got, so a restart does not visit every file ever read again.
        let cleaned_through = match ctx.metadata.get(CLEANED).await? {
            Some(b) => std::str::from_utf8(&b)
                .ok()
                .and_then(|t| t.trim().parse().ok()),
            None => None,
        };
        let metadata = ctx.metadata.clone();
        let log = SourceLog::open(ctx.metadata).await?;
        let clean_to = match &self.options.clean_source {
            CleanSource::Off => None,
            CleanSource::Delete => Some(None),
            CleanSource::Archive(dir) => Some(Some(
                Location::parse_with(dir, self.options.storage.clone()).map_err(Error::User)?,
            )),
        };
        let mut seen = HashMap::new();
        let mut newest = i64::MIN;
        for f in log.all_files() {
            newest = newest.max(f.timestamp);
            seen.insert(f.path.clone(), f.timestamp);
        }
        Ok(Box::new(FileStream {
            options: Arc::clone(&self.options),
            schema: Arc::clone(&self.schema),
            listing,
            log,
            seen,
            newest,
            clean_to,
            cleaned_through,
            metadata,
            available_now: None,
            latest: None,
        }))
    }
}

impl FileSourceProvider {
    async fn check_recorded_schema(&self, dir: &Location) -> Result<()> {
        let file = format!("{}/schema", dir.display());
        let recorded = match dir.get("schema").await? {
            None => None,
            Some(bytes) => Some(RecordedSchema::parse(&bytes, &file)?),
        };
        let ddl = |s: &Schema| to_ddl(s).unwrap_or_else(|| "(no DDL form)".into());
        match recorded {
            Some(r) if r == *self.schema => return Ok(()),
            Some(r) if !self.schema_given => {
                return Err(Error::User(ClassifiedError::new(
                    "STREAMING_SOURCE_SCHEMA_CHANGED",
                    "42K09",
                    format!(
                        "The files in '{}' now give the schema [{}], but this query's checkpoint \
                         read them with [{}] (recorded in '{}/schema'). Pass the recorded schema \
                         with the source's `schema` option to keep reading with it, or use a new \
                         checkpoint location to start over with the new one.",
                        self.options.path,
                        ddl(&self.schema),
                        ddl(&r),
                        dir.display()
                    ),
                )));
            }
            Some(_) => tracing::info!(
                path = %self.options.path,
                "the file source's given schema differs from the recorded one; recording it"
            ),
            None => {}
        }
        dir.put("schema", RecordedSchema::new(&self.schema).json()?.into())
            .await?;
        Ok(())
    }
}

/// Offset of a file source: the newest entry of its log, `-1` before the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct FileOffset {
    #[serde(rename = "logOffset")]
    log_offset: i64,
}

impl FileOffset {
    fn from(o: &Offset) -> Result<Self> {
        serde_json::from_value(o.0.clone()).map_err(|_| {
            Error::Corrupt(format!(
                "The offsets log holds '{o}' for a file source, which expects \
                 {{\"logOffset\":N}}. Restore the offsets file or use a new checkpoint location."
            ))
        })
    }

    fn to_offset(self) -> Offset {
        Offset(serde_json::json!({"logOffset": self.log_offset}))
    }
}

struct FileStream {
    options: Arc<FileSourceOptions>,
    schema: SchemaRef,
    listing: Arc<Listing>,
    log: SourceLog,
    /// Every file in the log, with its modification time.
    seen: HashMap<String, i64>,
    /// The newest modification time in the log (for maxFileAge).
    newest: i64,
    /// `Some(None)`: delete committed files; `Some(Some(dir))`: move them there.
    clean_to: Option<Option<Location>>,
    /// The last log entry whose files cleanSource handled (kept in `sources/<i>/cleaned`).
    cleaned_through: Option<i64>,
    /// The source's folder in the checkpoint.
    metadata: Location,
    /// With the available-now trigger: the files that may still be read.
    available_now: Option<HashSet<String>>,
    latest: Option<Offset>,
}

impl FileStream {
    /// New files in the order they are taken.
    async fn new_files(&self) -> Result<Vec<FileMeta>> {
        let mut files = self.listing.list().await?;
        let o = &self.options;
        // As Spark: with latestFirst and maxFilesPerTrigger, maxFileAge does not apply.
        let age_applies = !(o.latest_first && o.max_files_per_trigger.is_some());
        let oldest = if age_applies && self.newest != i64::MIN {
            self.newest
                .saturating_sub(o.max_file_age.as_millis().min(i64::MAX as u128) as i64)
        } else {
            i64::MIN
        };
        files.retain(|f| {
            !self.seen.contains_key(&f.path)
                && f.timestamp >= oldest
                && self
                    .available_now
                    .as_ref()
                    .is_none_or(|set| set.contains(&f.path))
        });
        files.sort_by(|a, b| (a.timestamp, &a.path).cmp(&(b.timestamp, &b.path)));
        if o.latest_first {
            files.reverse();
        }
        Ok(files)
    }
}

#[async_trait]
impl MicroBatchStream for FileStream {
    fn description(&self) -> String {
        format!("FileStreamSource[{}]", self.listing.display())
    }

    fn initial_offset(&self) -> Offset {
        FileOffset { log_offset: -1 }.to_offset()
    }

    fn default_read_limit(&self) -> ReadLimit {
        match (
            self.options.max_files_per_trigger,
            self.options.max_bytes_per_trigger,
        ) {
            (Some(n), _) => ReadLimit::MaxFiles(n),
            (_, Some(b)) => ReadLimit::MaxBytes(b),
            _ => ReadLimit::AllAvailable,
        }
    }

    async fn latest_offset(&mut self, start: &Offset, limit: ReadLimit) -> Result<Offset> {
        let start = FileOffset::from(start)?;
        self.log.check_complete_through(start.log_offset)?;
        let next = start.log_offset + 1;
        // An entry a killed run wrote but never ran: the same files, the same batch.
        let files = match self.log.entry(next).await? {
            Some(files) => files,
            None => {
                let mut files = self.new_files().await?;
                match limit {
                    ReadLimit::MaxFiles(n) => files.truncate(n as usize),
                    ReadLimit::MaxBytes(max) => {
                        let mut total = 0u64;
                        let keep = files
                            .iter()
                            .take_while(|f| {
                                let first = total == 0;
                                total = total.saturating_add(f.size);
                                first || total <= max
                            })
                            .count();
                        files.truncate(keep);
                    }
                    ReadLimit::AllAvailable | ReadLimit::MaxRows(_) => {}
                }
                if files.is_empty() {
                    self.latest = Some(start.to_offset());
                    return Ok(start.to_offset());
                }
                self.log.add(next, files).await?
            }
        };
        for f in &files {
            self.newest = self.newest.max(f.timestamp);
            self.seen.insert(f.path.clone(), f.timestamp);
        }
        let end = FileOffset { log_offset: next }.to_offset();
        self.latest = Some(end.clone());
        Ok(end)
    }

    fn reported_latest_offset(&self) -> Option<Offset> {
        self.latest.clone()
    }

    async fn get_batch(&mut self, start: &Offset, end: &Offset) -> Result<Partitions> {
        let (s, e) = (FileOffset::from(start)?, FileOffset::from(end)?);
        let mut files = vec![];
        for n in s.log_offset + 1..=e.log_offset {
            let entry = self.log.entry(n).await?.ok_or_else(|| {
                Error::Corrupt(format!(
                    "The file source's log has no entry {n} in '{}', but the offsets log \
                     asks for it. Restore the file, or use a new checkpoint location.",
                    self.log.display()
                ))
            })?;
            files.extend(entry);
        }
        let parallelism = std::thread::available_parallelism().map_or(1, |n| n.get());
        let groups = group_files(files, parallelism);
        let jobs: Vec<(usize, FileMeta)> = groups
            .iter()
            .enumerate()
            .flat_map(|(g, files)| files.iter().map(move |f| (g, f.clone())))
            .collect();
        let read: Vec<(usize, Vec<arrow::record_batch::RecordBatch>)> =
            futures::stream::iter(jobs.into_iter().map(|(g, f)| {
                let (options, schema) = (Arc::clone(&self.options), Arc::clone(&self.schema));
                let listing = Arc::clone(&self.listing);
                async move {
                    let bytes = listing.get(&f).await?;
                    let batches = tokio::task::spawn_blocking(move || {
                        read::read_file(&options, &schema, &f.path, bytes)
                    })
                    .await
                    .map_err(|e| Error::Corrupt(format!("a file reader failed: {e}")))??;
                    Ok::<_, Error>((g, batches))
                }
            }))
            .buffered(parallelism * 2)
            .try_collect()
            .await?;
        let mut partitions: Partitions = vec![vec![]; groups.len().max(1)];
        for (g, batches) in read {
            partitions[g].extend(batches.into_iter().filter(|b| b.num_rows() > 0));
        }
        Ok(partitions)
    }

    async fn commit(&mut self, end: &Offset) -> Result<()> {
        let Some(archive) = &self.clean_to else {
            return Ok(());
        };
        let end = FileOffset::from(end)?.log_offset;
        // Entries a killed run committed but did not finish cleaning are cleaned again: a file
        // already moved or deleted is skipped.
        let from = self.cleaned_through.map_or(0, |c| c + 1);
        if from > end {
            return Ok(());
        }
        for n in from..=end {
            for f in self.log.entry(n).await?.unwrap_or_default() {
                self.listing.clean(&f, archive.as_ref()).await?;
            }
        }
        self.metadata.put(CLEANED, end.to_string().into()).await?;
        self.cleaned_through = Some(end);
        Ok(())
    }

    async fn prepare_for_available_now(&mut self, start: &Offset) -> Result<Offset> {
        let files = self.new_files().await?;
        self.available_now = Some(files.iter().map(|f| f.path.clone()).collect());
        // The target: one more entry if anything is there.
        let start = FileOffset::from(start)?;
        Ok(FileOffset {
            log_offset: start.log_offset + i64::from(!files.is_empty()),
        }
        .to_offset())
    }
}

/// Splits `files` into at most `n` groups of about equal size, keeping their order in each.
fn group_files(files: Vec<FileMeta>, n: usize) -> Vec<Vec<FileMeta>> {
    let n = n.clamp(1, files.len().max(1));
    let mut groups: Vec<(u64, Vec<FileMeta>)> = (0..n).map(|_| (0, vec![])).collect();
    for f in files {
        if let Some(g) = groups.iter_mut().min_by_key(|(size, _)| *size) {
            g.0 += f.size.max(1);
            g.1.push(f);
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

#[cfg(test)]
mod tests;
