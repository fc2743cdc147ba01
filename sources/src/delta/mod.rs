//! The Delta Lake source (`STREAM delta(path => ...)`, `format("delta").load(path)`, and
//! `STREAM <name>` of a streaming table written by the Delta sink), as Spark's Delta source: it
//! reads the table's snapshot when the query first starts, then each new commit's added files.
//!
//! ```text
//! offset  {"sourceVersion":1,"reservoirId":<table id>,"reservoirVersion":v,"index":i,
//!          "isStartingVersion":s}: every file up to index i (-1: none) of version v's list is
//!          read; the list is the snapshot at v (sorted by path) when s, else the files commit v
//!          added (in commit order)
//! initial sources/<i>/initial, fixed at the first start: the snapshot at the latest version,
//!          or startingVersion / startingTimestamp (changes only, from that version)
//! latest  walk versions from the start offset, taking files until maxFilesPerTrigger (1000)
//!          or maxBytesPerTrigger; a commit that removes data fails the query, or is skipped with
//!          skipChangeCommits (ignoreDeletes: commits that only delete)
//! batch   read the files in (start, end], columns matched to the table's schema by name,
//!          partition values as columns
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{ArrayRef, StringArray, new_null_array};
use arrow::compute::cast_with_options;
use arrow::datatypes::{Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, NaiveDateTime};
use deltalake::DeltaTable;
use deltalake::kernel::Action;
use deltalake::logstore::get_actions;
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use object_store::path::Path;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::{Deserialize, Serialize};
use url::Url;
use weir_common::delta::{self as common, table_url};
use weir_common::{ClassifiedError, Location, Options};

use crate::files::{conform, failed_read};
use crate::kept::KeptFile;
use crate::{
    Error, MicroBatchStream, Offset, Partitions, ReadLimit, Result, SourceContext, SourceProvider,
};

const ACCEPTED: &[&str] = &[
    "path",
    "startingVersion",
    "startingTimestamp",
    "maxFilesPerTrigger",
    "maxBytesPerTrigger",
    "skipChangeCommits",
    "ignoreDeletes",
    "aws_<option>",
];

/// Spark's default `maxFilesPerTrigger` for Delta sources.
const DEFAULT_MAX_FILES: u64 = 1000;

/// Where a query that has never read the table starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Starting {
    /// The snapshot at the latest version, then the changes after it.
    Snapshot,
    /// The changes from this version on.
    Version(u64),
    /// The changes after the latest version.
    Latest,
    /// The changes from the first version committed at or after this instant (ms since epoch).
    Timestamp(i64),
}

/// The typed options of a Delta source.
#[derive(Debug, Clone)]
pub struct DeltaSourceOptions {
    /// The table's folder as given.
    pub path: String,
    /// `startingVersion` / `startingTimestamp`.
    pub starting: Starting,
    /// `maxFilesPerTrigger`, if given.
    pub max_files: Option<u64>,
    /// `maxBytesPerTrigger`, if given.
    pub max_bytes: Option<u64>,
    /// `skipChangeCommits`: commits that remove data are skipped whole.
    pub skip_change_commits: bool,
    /// `ignoreDeletes`: commits that only remove data are skipped.
    pub ignore_deletes: bool,
    /// `aws_*` options of the S3 client.
    pub storage: HashMap<String, String>,
}

fn invalid(message: String) -> Error {
    Error::User(ClassifiedError::invalid_option(message))
}

fn parse_timestamp(s: &str) -> Option<i64> {
    let t = s.trim();
    if let Ok(d) = DateTime::parse_from_rfc3339(t) {
        return Some(d.timestamp_millis());
    }
    for f in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"] {
        if let Ok(d) = NaiveDateTime::parse_from_str(t, f) {
            return Some(d.and_utc().timestamp_millis());
        }
    }
    NaiveDate::parse_from_str(t, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|d| d.and_utc().timestamp_millis())
}

impl DeltaSourceOptions {
    /// Reads the options, refusing unknown or malformed ones.
    pub fn parse(options: &Options) -> Result<Self> {
        let (storage, own) = common::storage_options(options);
        let r = own.reader("delta source", ACCEPTED);
        r.check_known()?;
        let path = r.required("path")?;
        let starting = match (r.string("startingVersion"), r.string("startingTimestamp")) {
            (Some(_), Some(_)) => {
                return Err(Error::User(ClassifiedError::new(
                    "DELTA_STARTING_VERSION_AND_TIMESTAMP_BOTH_SET",
                    "42613",
                    "Give either startingVersion or startingTimestamp, not both.",
                )));
            }
            (Some(v), None) if v.trim().eq_ignore_ascii_case("latest") => Starting::Latest,
            (Some(v), None) => Starting::Version(v.trim().parse().map_err(|_| {
                invalid(format!(
                    "Invalid value '{v}' for option 'startingVersion' of the delta source: \
                     expected a version number (0 or more) or 'latest'."
                ))
            })?),
            (None, Some(t)) => Starting::Timestamp(parse_timestamp(&t).ok_or_else(|| {
                invalid(format!(
                    "Invalid value '{t}' for option 'startingTimestamp' of the delta source: \
                     expected a timestamp such as '2026-12-04 10:00:00' (UTC) or a date."
                ))
            })?),
            (None, None) => Starting::Snapshot,
        };
        let positive = |key: &str| -> Result<Option<u64>> {
            match r.string(key) {
                None => Ok(None),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if n > 0 => Ok(Some(n)),
                    _ => Err(invalid(format!(
                        "Invalid value '{v}' for option '{key}' of the delta source: expected a \
                         positive whole number."
                    ))),
                },
            }
        };
        Ok(Self {
            path,
            starting,
            max_files: positive("maxFilesPerTrigger")?,
            max_bytes: positive("maxBytesPerTrigger")?,
            skip_change_commits: r.bool("skipChangeCommits", false)?,
            ignore_deletes: r.bool("ignoreDeletes", false)?,
            storage,
        })
    }
}

/// A Delta table as a streaming source.
#[derive(Debug)]
pub struct DeltaSourceProvider {
    options: Arc<DeltaSourceOptions>,
    url: Url,
    schema: SchemaRef,
}

impl DeltaSourceProvider {
    /// A source over the table at `path`, whose schema is read from the table now.
    pub fn try_new(options: &Options) -> Result<Self> {
        let options = DeltaSourceOptions::parse(options)?;
        let url = table_url(&options.path, false)?;
        let (u, storage) = (url.clone(), options.storage.clone());
        let schema = weir_common::block_on(async move {
            let table = common::open(&u, &storage).await?;
            table_schema(&table, &u)
        })??;
        Ok(Self {
            options: Arc::new(options),
            url,
            schema,
        })
    }
}

/// The table's schema as arrow, refusing tables whose files weir cannot read column by name.
fn table_schema(table: &DeltaTable, url: &Url) -> Result<SchemaRef, ClassifiedError> {
    if table.version().is_none() {
        return Err(ClassifiedError::new(
            "DELTA_MISSING_DELTA_TABLE",
            "42P01",
            format!(
                "There is no Delta table at {url} (no _delta_log with a commit). Check the path, \
                 or start the query that writes the table first."
            ),
        ));
    }
    let snapshot = table
        .snapshot()
        .map_err(|e| common::error(e, &format!("read the Delta table at {url}")))?;
    let mode = snapshot
        .metadata()
        .configuration()
        .get("delta.columnMapping.mode")
        .cloned()
        .unwrap_or_default();
    if !mode.is_empty() && mode != "none" {
        return Err(unsupported(url, &format!("column mapping (mode '{mode}')")));
    }
    Ok(snapshot.snapshot().arrow_schema())
}

fn unsupported(url: &Url, what: &str) -> ClassifiedError {
    ClassifiedError::new(
        "DELTA_UNSUPPORTED_FEATURES_FOR_READ",
        "56038",
        format!(
            "The Delta table at {url} uses {what}, which weir's Delta source cannot stream yet. \
             Rewrite the table without it, or read it with batch SQL."
        ),
    )
}

#[async_trait]
impl SourceProvider for DeltaSourceProvider {
    fn format(&self) -> &str {
        "delta"
    }

    fn identity(&self) -> String {
        format!("delta:{}", self.url)
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn start_difference(&self, derived: &Offset, chosen: &Offset) -> Option<String> {
        let position = |o: &Offset| {
            serde_json::from_value::<DeltaSourceOffset>(o.0.clone())
                .ok()
                .map(|o| Position {
                    version: o.reservoir_version,
                    index: o.index,
                    snapshot: o.is_starting_version,
                })
        };
        start_difference(position(derived)?, position(chosen)?)
    }

    async fn open(&self, ctx: SourceContext) -> Result<Box<dyn MicroBatchStream>> {
        let table = common::open(&self.url, &self.options.storage).await?;
        table_schema(&table, &self.url)?;
        let reservoir_id = table
            .snapshot()
            .map_err(|e| common::error(e, &format!("read the Delta table at {}", self.url)))?
            .metadata()
            .id()
            .to_string();
        let partition_columns: Vec<String> = table
            .snapshot()
            .map_err(|e| common::error(e, &format!("read the Delta table at {}", self.url)))?
            .metadata()
            .partition_columns()
            .to_vec();
        let loaded = table.version().unwrap_or(0);
        let mut stream = DeltaStream {
            options: Arc::clone(&self.options),
            url: self.url.clone(),
            schema: Arc::clone(&self.schema),
            file_schema: Arc::new(Schema::new(
                self.schema
                    .fields()
                    .iter()
                    .filter(|f| !partition_columns.contains(f.name()))
                    .cloned()
                    .collect::<Vec<_>>(),
            )),
            partition_columns,
            table,
            reservoir_id,
            initial: Position::default(),
            versions: BTreeMap::new(),
            snapshot: None,
            // Where the log starts being listed: old commit files may have been cleaned up.
            latest_version: loaded,
            latest: None,
            cap: None,
        };
        stream.initial = stream.initial_position(&ctx.metadata).await?;
        Ok(Box::new(stream))
    }
}

/// How starting at `chosen` (a starting position: index -1) instead of where the query was,
/// `derived`, reads commits twice or never, in words; `None` when it does neither. A position
/// covers every file up to its index of its version's list (the snapshot at that version, or
/// the files the commit added).
fn start_difference(derived: Position, chosen: Position) -> Option<String> {
    if derived == chosen {
        return None;
    }
    let list = |p: Position| match p.snapshot {
        true => format!("the snapshot at version {}", p.version),
        false => format!("commit {}", p.version),
    };
    // A snapshot not read yet: the query would read every row up to its version.
    if derived.snapshot && derived.index < 0 {
        return match (chosen.snapshot, chosen.version) {
            // Another snapshot holds the same rows up to its own version; changes follow.
            (true, _) | (false, 0) => None,
            (false, c) => Some(format!(
                "leaves a gap: never reads the rows commits 0..={} added (the query had not \
                 read {} yet)",
                c - 1,
                list(derived)
            )),
        };
    }
    let was = match derived.index {
        -1 => format!("the start of {}", list(derived)),
        i => format!("file {i} of {}", list(derived)),
    };
    if chosen.snapshot {
        return Some(format!(
            "overlaps: reads the table as of version {} again, as a snapshot, though the query \
             had read up to {was}",
            chosen.version
        ));
    }
    // The last version whose rows the query has read (all or some), if any; a batch can end
    // inside a version's list, whose other files a later start would then skip.
    let (read_through, rest) = match derived.index {
        -1 => (derived.version.checked_sub(1), None),
        i => (
            Some(derived.version),
            Some(format!(
                "the files of {} after its file {i}, if it has more",
                list(derived)
            )),
        ),
    };
    let next = read_through.map_or(0, |v| v + 1);
    match (chosen.version, rest) {
        (c, _) if c < next => Some(format!(
            "overlaps: reads again what commits {c}..={} added (the query had read up to {was})",
            next - 1
        )),
        (c, rest) if c > next => Some(format!(
            "leaves a gap: never reads commits {next}..={}{} (the query had read up to {was})",
            c - 1,
            rest.map(|r| format!(", nor {r}")).unwrap_or_default()
        )),
        (_, Some(rest)) => Some(format!("may leave a gap: never reads {rest}")),
        (_, None) => None,
    }
}

/// A position in the table; serialized as Spark's `DeltaSourceOffset`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Position {
    version: u64,
    index: i64,
    snapshot: bool,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeltaSourceOffset {
    source_version: u32,
    reservoir_id: String,
    reservoir_version: u64,
    index: i64,
    is_starting_version: bool,
}

/// How far a walk over the table goes.
#[derive(Debug, Clone, Copy, Default)]
struct Limits {
    /// At most this many files.
    files: Option<u64>,
    /// About this many bytes, at least one file.
    bytes: Option<u64>,
    /// Up to and including this position.
    end: Option<Position>,
}

/// One data file to read.
#[derive(Debug, Clone)]
struct DataFile {
    /// Relative to the table's folder, URL-decoded.
    path: String,
    size: u64,
    partition_values: HashMap<String, Option<String>>,
}

struct DeltaStream {
    options: Arc<DeltaSourceOptions>,
    url: Url,
    schema: SchemaRef,
    partition_columns: Vec<String>,
    /// The columns the data files hold: the schema without the partition columns.
    file_schema: SchemaRef,
    table: DeltaTable,
    reservoir_id: String,
    initial: Position,
    /// The data files each commit added, by version (versions below the last committed offset
    /// are dropped).
    versions: BTreeMap<u64, Arc<Vec<DataFile>>>,
    /// The snapshot being read first, if any: its version and files.
    snapshot: Option<(u64, Arc<Vec<DataFile>>)>,
    latest_version: u64,
    latest: Option<Offset>,
    /// With the available-now trigger: the last version to read.
    cap: Option<u64>,
}

impl DeltaStream {
    fn offset(&self, p: Position) -> Offset {
        let o = DeltaSourceOffset {
            source_version: 1,
            reservoir_id: self.reservoir_id.clone(),
            reservoir_version: p.version,
            index: p.index,
            is_starting_version: p.snapshot,
        };
        Offset(serde_json::to_value(o).unwrap_or_default())
    }

    fn position(&self, o: &Offset) -> Result<Position> {
        let o: DeltaSourceOffset = serde_json::from_value(o.0.clone()).map_err(|e| {
            Error::Corrupt(format!(
                "The offsets log holds '{o}' for the Delta source on {}, which is not a Delta \
                 source offset ({e}). Restore the offsets file, or use a new checkpoint.",
                self.url
            ))
        })?;
        if o.reservoir_id != self.reservoir_id {
            return Err(Error::User(ClassifiedError::new(
                "DIFFERENT_DELTA_TABLE_READ_BY_STREAMING_SOURCE",
                "55019",
                format!(
                    "The checkpoint was reading the Delta table with id {}, but the table at {} \
                     now has id {} (it was deleted and created again). Use a new checkpoint \
                     location to read the new table.",
                    o.reservoir_id, self.url, self.reservoir_id
                ),
            )));
        }
        Ok(Position {
            version: o.reservoir_version,
            index: o.index,
            snapshot: o.is_starting_version,
        })
    }

    fn doing(&self, what: &str) -> String {
        format!("{what} of the Delta table at {}", self.url)
    }

    /// Where a fresh query starts, fixed in `sources/<i>/initial` at its first start.
    async fn initial_position(&mut self, dir: &Location) -> Result<Position> {
        let file = format!("{}/initial", dir.display());
        let parse = |bytes: &[u8]| {
            serde_json::from_slice::<Position>(bytes).map_err(|e| {
                Error::Corrupt(format!(
                    "The Delta source's starting position '{file}' is damaged ({e}). Restore \
                     it, or use a new checkpoint location."
                ))
            })
        };
        let kept = KeptFile {
            dir,
            name: "initial",
            what: "The Delta source's starting position",
        };
        if let Some(body) = kept.read().await? {
            return parse(body.as_bytes());
        }
        let latest = self.refresh_latest().await?;
        let at = match self.options.starting {
            Starting::Snapshot => Position {
                version: latest,
                index: -1,
                snapshot: true,
            },
            Starting::Version(v) => Position {
                version: v,
                index: -1,
                snapshot: false,
            },
            Starting::Latest => Position {
                version: latest + 1,
                index: -1,
                snapshot: false,
            },
            Starting::Timestamp(ms) => Position {
                version: self.first_version_at(ms, latest).await?,
                index: -1,
                snapshot: false,
            },
        };
        let text = serde_json::to_string(&at).map_err(|e| Error::Corrupt(e.to_string()))?;
        // Another run may have resolved it first: theirs counts.
        parse(kept.keep(text).await?.as_bytes())
    }

    /// The first version whose commit file was written at or after `ms`, or the one after the
    /// latest (Spark's `startingTimestamp`).
    async fn first_version_at(&self, ms: i64, latest: u64) -> Result<u64> {
        let store = self.table.log_store().object_store(None);
        for v in 0..=latest {
            let path = Path::from(format!("_delta_log/{v:020}.json"));
            match store.head(&path).await {
                Ok(meta) if meta.last_modified.timestamp_millis() >= ms => return Ok(v),
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(latest + 1)
    }

    async fn refresh_latest(&mut self) -> Result<u64> {
        let from = self.latest_version;
        let v = self
            .table
            .log_store()
            .get_latest_version(from)
            .await
            .map_err(|e| common::error(e, &self.doing("find the latest version")))?;
        self.latest_version = v;
        Ok(v)
    }

    /// The files of `version`'s list: the snapshot at it, or what its commit added.
    async fn files(&mut self, version: u64, snapshot: bool) -> Result<Arc<Vec<DataFile>>> {
        if snapshot {
            if let Some((v, files)) = &self.snapshot
                && *v == version
            {
                return Ok(Arc::clone(files));
            }
            let files = Arc::new(self.snapshot_files(version).await?);
            self.snapshot = Some((version, Arc::clone(&files)));
            return Ok(files);
        }
        if let Some(files) = self.versions.get(&version) {
            return Ok(Arc::clone(files));
        }
        let files = Arc::new(self.commit_files(version).await?);
        self.versions.insert(version, Arc::clone(&files));
        Ok(files)
    }

    async fn snapshot_files(&self, version: u64) -> Result<Vec<DataFile>> {
        let mut table = self.table.clone();
        table
            .load_version(version)
            .await
            .map_err(|e| common::error(e, &self.doing(&format!("load version {version}"))))?;
        let snapshot = table
            .snapshot()
            .map_err(|e| common::error(e, &self.doing(&format!("read version {version}"))))?;
        let views: Vec<deltalake::kernel::LogicalFileView> = snapshot
            .snapshot()
            .file_views(table.log_store().as_ref(), None)
            .try_collect()
            .await
            .map_err(|e| {
                common::error(
                    e,
                    &self.doing(&format!("list the files of version {version}")),
                )
            })?;
        let mut files = views
            .iter()
            .map(|f| {
                if f.deletion_vector_descriptor().is_some() {
                    return Err(self.has_deletion_vector(&f.path(), version));
                }
                self.data_file(f.path().into_owned(), f.size(), f.partition_values_map())
            })
            .collect::<Result<Vec<_>>>()?;
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    fn has_deletion_vector(&self, path: &str, version: u64) -> Error {
        unsupported(
            &self.url,
            &format!("deletion vectors (file {path} at version {version})"),
        )
        .into()
    }

    /// A file of the table; `path` is URL-decoded.
    fn data_file(
        &self,
        path: String,
        size: i64,
        partition_values: HashMap<String, Option<String>>,
    ) -> Result<DataFile> {
        if path.contains("://") {
            return Err(
                unsupported(&self.url, &format!("files outside its folder ({path})")).into(),
            );
        }
        Ok(DataFile {
            path,
            size: size.max(0) as u64,
            partition_values,
        })
    }

    /// The data files commit `version` added, after checking what else it did.
    async fn commit_files(&self, version: u64) -> Result<Vec<DataFile>> {
        let bytes = self
            .table
            .log_store()
            .read_commit_entry(version)
            .await
            .map_err(|e| common::error(e, &self.doing(&format!("read commit {version}"))))?
            .ok_or_else(|| {
                ClassifiedError::new(
                    "DELTA_LOG_FILE_NOT_FOUND_FOR_STREAMING_SOURCE",
                    "42K03",
                    format!(
                        "The commit file of version {version} of the Delta table at {} is gone \
                         (the table's log retention removed it before the query read it). Start \
                         a new checkpoint with startingVersion set to a version still in the log.",
                        self.url
                    ),
                )
            })?;
        let actions = get_actions(version, &bytes)
            .map_err(|e| common::error(e, &self.doing(&format!("parse commit {version}"))))?;
        let (mut adds, mut removed) = (vec![], None);
        for action in actions {
            match action {
                Action::Add(a) if a.data_change => adds.push(a),
                Action::Remove(r) if r.data_change => {
                    removed.get_or_insert(r.path);
                }
                Action::Metadata(m) => {
                    let fields = m
                        .parse_schema()
                        .ok()
                        .and_then(|s| {
                            use deltalake::kernel::engine::arrow_conversion::TryIntoArrow;
                            let a: std::result::Result<Schema, _> = (&s).try_into_arrow();
                            a.ok()
                        })
                        .map(|s| s.fields().clone());
                    if fields.as_ref() != Some(self.schema.fields()) {
                        return Err(ClassifiedError::new(
                            "DELTA_SCHEMA_CHANGED_WITH_VERSION",
                            "KD007",
                            format!(
                                "The schema of the Delta table at {} changed at version \
                                 {version}. A streaming query reads one schema; restart it to \
                                 read the new one (the restart is checked against the \
                                 checkpoint), or use a new checkpoint.",
                                self.url
                            ),
                        )
                        .into());
                    }
                }
                _ => {}
            }
        }
        if let Some(path) = removed {
            let deletes_only = adds.is_empty();
            if self.options.skip_change_commits || (deletes_only && self.options.ignore_deletes) {
                return Ok(vec![]);
            }
            let (class, what) = if deletes_only {
                ("DELTA_SOURCE_IGNORE_DELETE", "a data deletion")
            } else {
                ("DELTA_SOURCE_TABLE_IGNORE_CHANGES", "a data update")
            };
            return Err(ClassifiedError::new(
                class,
                "0A000",
                format!(
                    "Detected {what} (for example {path}) in the Delta table at {} at version \
                     {version}; a streaming read takes appends only. To skip commits that change \
                     or delete rows, set the option skipChangeCommits 'true'{}.",
                    self.url,
                    if deletes_only {
                        " (or ignoreDeletes 'true')"
                    } else {
                        ""
                    }
                ),
            )
            .into());
        }
        adds.into_iter()
            .map(|a| {
                if a.deletion_vector.is_some() {
                    return Err(self.has_deletion_vector(&a.path, version));
                }
                self.data_file(percent_decode(&a.path), a.size, a.partition_values)
            })
            .collect()
    }

    /// Walks from `start` towards the end of the table (or the cap), taking files in order
    /// until `limits` are reached; returns the position of the last file taken and the files.
    /// It stops before reading a commit it does not need, so a commit beyond the batch (one
    /// that would fail the query, say) is not read early.
    async fn walk(&mut self, start: Position, limits: Limits) -> Result<(Position, Vec<DataFile>)> {
        let last = self
            .cap
            .unwrap_or(self.latest_version)
            .min(self.latest_version);
        let key = |p: Position| (p.version, p.index);
        let (mut at, mut end, mut taken) = (start, start, vec![]);
        let (mut files_n, mut bytes_n) = (0u64, 0u64);
        loop {
            let reached_end = limits.end.is_some_and(|e| key(at) >= key(e));
            let full = limits.files.is_some_and(|m| files_n >= m)
                || limits.bytes.is_some_and(|m| bytes_n >= m);
            if reached_end || full || (!at.snapshot && at.version > last) {
                break;
            }
            let files = self.files(at.version, at.snapshot).await?;
            let next = (at.index + 1) as usize;
            let Some(f) = files.get(next) else {
                at = Position {
                    version: at.version + 1,
                    index: -1,
                    snapshot: false,
                };
                continue;
            };
            // Bytes are a soft limit: at least one file per batch.
            if limits
                .bytes
                .is_some_and(|m| files_n > 0 && bytes_n + f.size > m)
            {
                break;
            }
            at.index += 1;
            end = at;
            files_n += 1;
            bytes_n += f.size;
            taken.push(f.clone());
        }
        Ok((end, taken))
    }

    async fn read(&self, f: DataFile) -> Result<Vec<RecordBatch>> {
        let store = self.table.log_store().object_store(None);
        let path = Path::parse(&f.path).unwrap_or_else(|_| Path::from(f.path.as_str()));
        let bytes = store
            .get(&path)
            .await
            .map_err(|e| failed_read(&f.path, e))?
            .bytes()
            .await
            .map_err(|e| failed_read(&f.path, e))?;
        let name = f.path.clone();
        let batches = tokio::task::spawn_blocking(move || {
            ParquetRecordBatchReaderBuilder::try_new(bytes)
                .and_then(|b| b.with_batch_size(8192).build())
                .map_err(|e| failed_read(&name, e))?
                .map(|b| b.map_err(|e| failed_read(&name, e)))
                .collect::<Result<Vec<RecordBatch>>>()
        })
        .await
        .map_err(|e| Error::Corrupt(format!("a Delta file reader failed: {e}")))??;
        batches
            .iter()
            .map(|b| {
                let data = conform(&self.file_schema, b, &f.path)?;
                self.with_partition_values(&data, &f)
            })
            .collect()
    }

    fn with_partition_values(&self, data: &RecordBatch, f: &DataFile) -> Result<RecordBatch> {
        let n = data.num_rows();
        let columns =
            self.schema
                .fields()
                .iter()
                .map(|field: &Arc<Field>| {
                    if !self.partition_columns.contains(field.name()) {
                        return data.column_by_name(field.name()).cloned().ok_or_else(|| {
                            Error::Corrupt(format!("column {} lost", field.name()))
                        });
                    }
                    match f.partition_values.get(field.name()).cloned().flatten() {
                        None => Ok(new_null_array(field.data_type(), n)),
                        Some(v) => {
                            let text: ArrayRef = Arc::new(StringArray::from(vec![v.as_str(); n]));
                            let strict = arrow::compute::CastOptions {
                                safe: false,
                                ..Default::default()
                            };
                            cast_with_options(&text, field.data_type(), &strict).map_err(|e| {
                                failed_read(
                                    &f.path,
                                    format!(
                                        "its partition value {}={v} is not a {}: {e}",
                                        field.name(),
                                        field.data_type()
                                    ),
                                )
                            })
                        }
                    }
                })
                .collect::<Result<Vec<_>>>()?;
        let options = arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(n));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &options,
        )?)
    }
}

/// A path as the Delta log writes it (URL-encoded) as a plain path.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[async_trait]
impl MicroBatchStream for DeltaStream {
    fn description(&self) -> String {
        format!("DeltaSource[{}]", self.url)
    }

    fn initial_offset(&self) -> Offset {
        self.offset(self.initial)
    }

    fn default_read_limit(&self) -> ReadLimit {
        match (self.options.max_files, self.options.max_bytes) {
            (Some(n), _) => ReadLimit::MaxFiles(n),
            (None, Some(b)) => ReadLimit::MaxBytes(b),
            (None, None) => ReadLimit::MaxFiles(DEFAULT_MAX_FILES),
        }
    }

    async fn latest_offset(&mut self, start: &Offset, limit: ReadLimit) -> Result<Offset> {
        let start = self.position(start)?;
        self.refresh_latest().await?;
        // Both limits apply when both are set, whichever is reached first (as Spark).
        let (max_files, max_bytes) = match limit {
            ReadLimit::AllAvailable | ReadLimit::MaxRows(_) => (None, None),
            ReadLimit::MaxFiles(n) => (Some(n), self.options.max_bytes),
            ReadLimit::MaxBytes(b) => (self.options.max_files, Some(b)),
        };
        let limits = Limits {
            files: max_files,
            bytes: max_bytes,
            end: None,
        };
        let (end, _) = self.walk(start, limits).await?;
        // Everything up to the latest version, without reading the commits in between.
        self.latest = Some(self.offset(Position {
            version: self.latest_version + 1,
            index: -1,
            snapshot: false,
        }));
        Ok(self.offset(end))
    }

    fn reported_latest_offset(&self) -> Option<Offset> {
        self.latest.clone()
    }

    async fn get_batch(&mut self, start: &Offset, end: &Offset) -> Result<Partitions> {
        let (start, end) = (self.position(start)?, self.position(end)?);
        if end.version > self.latest_version {
            self.refresh_latest().await?;
        }
        let limits = Limits {
            end: Some(end),
            ..Limits::default()
        };
        let (reached, files) = self.walk(start, limits).await?;
        if reached != end {
            return Err(Error::Corrupt(format!(
                "The offsets log asks the Delta source on {} for the files up to {}, which the \
                 table does not have. Restore the offsets file, or use a new checkpoint.",
                self.url,
                self.offset(end)
            )));
        }
        let parallelism = std::thread::available_parallelism().map_or(1, |n| n.get());
        let this = &*self;
        let read: Vec<Vec<RecordBatch>> =
            futures::stream::iter(files.into_iter().map(|f| this.read(f)))
                .buffered(parallelism * 2)
                .try_collect()
                .await?;
        let mut partitions: Partitions = vec![vec![]; parallelism.min(read.len()).max(1)];
        for (i, batches) in read.into_iter().enumerate() {
            let n = partitions.len();
            partitions[i % n].extend(batches.into_iter().filter(|b| b.num_rows() > 0));
        }
        Ok(partitions)
    }

    async fn commit(&mut self, end: &Offset) -> Result<()> {
        let end = self.position(end)?;
        self.versions.retain(|v, _| *v >= end.version);
        if !end.snapshot {
            self.snapshot = None;
        }
        Ok(())
    }

    async fn prepare_for_available_now(&mut self, start: &Offset) -> Result<Offset> {
        let start = self.position(start)?;
        let latest = self.refresh_latest().await?;
        self.cap = Some(latest);
        let (end, _) = self.walk(start, Limits::default()).await?;
        Ok(self.offset(end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_starting_version_before_or_after_the_read_commits_is_an_overlap_or_a_gap() {
        let at = |version, index, snapshot| Position {
            version,
            index,
            snapshot,
        };
        let diff = |derived, chosen| start_difference(derived, chosen).unwrap_or_default();
        // The query read commit 5 up to its file 2.
        let derived = at(5, 2, false);
        assert!(
            diff(derived, at(3, -1, false)).starts_with("overlaps: reads again what commits 3..=5")
        );
        assert!(
            diff(derived, at(5, -1, false)).starts_with("overlaps: reads again what commits 5..=5")
        );
        // Commit 5 may have more files than the query read.
        assert_eq!(
            diff(derived, at(6, -1, false)),
            "may leave a gap: never reads the files of commit 5 after its file 2, if it has more"
        );
        assert!(
            diff(derived, at(9, -1, false))
                .starts_with("leaves a gap: never reads commits 6..=8, nor the files of commit 5")
        );
        assert!(
            diff(derived, at(9, -1, true)).starts_with("overlaps: reads the table as of version 9")
        );
        // At the start of commit 7: nothing of it read, so nothing of it is skipped.
        assert!(
            diff(at(7, -1, false), at(6, -1, false))
                .starts_with("overlaps: reads again what commits 6..=6")
        );
        assert!(
            diff(at(7, -1, false), at(8, -1, false))
                .starts_with("leaves a gap: never reads commits 7..=7 (")
        );
        // The query had read a snapshot at 4 up to its file 7 (its rows hold commits 0..=4).
        let snap = at(4, 7, true);
        assert!(
            diff(snap, at(2, -1, false)).starts_with("overlaps: reads again what commits 2..=4")
        );
        assert!(diff(snap, at(5, -1, false)).starts_with(
            "may leave a gap: never reads the files of the snapshot at version 4 after its file 7"
        ));
        // A snapshot not read yet: another snapshot reads the same rows; changes from a later
        // commit never read the earlier ones.
        let unread = at(4, -1, true);
        assert_eq!(start_difference(unread, at(6, -1, true)), None);
        assert_eq!(start_difference(unread, at(0, -1, false)), None);
        assert!(
            diff(unread, at(3, -1, false))
                .starts_with("leaves a gap: never reads the rows commits 0..=2 added")
        );
        // Nothing read yet: starting later skips commits.
        assert!(
            diff(at(0, -1, false), at(2, -1, false))
                .starts_with("leaves a gap: never reads commits 0..=1")
        );
        assert_eq!(start_difference(derived, derived), None);
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<DeltaSourceOptions> {
        let mut o = Options::new().with("path", "/t");
        for (k, v) in pairs {
            o.set(*k, *v);
        }
        DeltaSourceOptions::parse(&o)
    }

    #[test]
    fn starting_positions_and_limits_are_read_as_spark_writes_them() {
        assert_eq!(parse(&[]).unwrap().starting, Starting::Snapshot);
        assert_eq!(
            parse(&[("startingVersion", "7")]).unwrap().starting,
            Starting::Version(7)
        );
        assert_eq!(
            parse(&[("STARTINGVERSION", "Latest")]).unwrap().starting,
            Starting::Latest
        );
        assert_eq!(
            parse(&[("startingTimestamp", "2026-12-04")])
                .unwrap()
                .starting,
            Starting::Timestamp(1_796_342_400_000)
        );
        assert_eq!(
            parse(&[("startingTimestamp", "2026-12-04T00:00:01Z")])
                .unwrap()
                .starting,
            Starting::Timestamp(1_796_342_401_000)
        );
        let o = parse(&[("maxFilesPerTrigger", "3"), ("maxBytesPerTrigger", "10")]).unwrap();
        assert_eq!((o.max_files, o.max_bytes), (Some(3), Some(10)));
        let o = parse(&[("aws_endpoint_url", "http://127.0.0.1:1")]).unwrap();
        assert_eq!(o.storage["aws_endpoint_url"], "http://127.0.0.1:1");
    }

    #[test]
    fn bad_options_are_refused_naming_them() {
        for (pairs, named) in [
            (vec![("startingVersion", "-1")], "startingVersion"),
            (
                vec![("startingTimestamp", "yesterday")],
                "startingTimestamp",
            ),
            (vec![("maxFilesPerTrigger", "0")], "maxFilesPerTrigger"),
            (vec![("maxBytesPerTrigger", "1k")], "maxBytesPerTrigger"),
            (vec![("skipChangeCommits", "maybe")], "skipChangeCommits"),
            (vec![("ignoreChanges", "true")], "ignoreChanges"),
        ] {
            let err = parse(&pairs).unwrap_err();
            assert_eq!(err.error_class(), "STREAMING_INVALID_OPTION", "{err}");
            assert!(err.to_string().contains(named), "{err}");
        }
        let err = parse(&[
            ("startingVersion", "1"),
            ("startingTimestamp", "2026-01-01"),
        ])
        .unwrap_err();
        assert_eq!(
            err.error_class(),
            "DELTA_STARTING_VERSION_AND_TIMESTAMP_BOTH_SET"
        );
    }

    #[test]
    fn log_paths_are_url_decoded() {
        assert_eq!(
            percent_decode("day=2026-12-04%2010%3A00/part-0.parquet"),
            "day=2026-12-04 10:00/part-0.parquet"
        );
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
    }
}
