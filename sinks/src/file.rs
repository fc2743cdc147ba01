//! File sinks (`parquet`, `csv`, `json`): each micro-batch's rows go to new part files in the
//! output directory, then a manifest entry `_weir_metadata/<batchId>` listing them is written
//! create-only. The entry is the commit: a reader (weir's batch SQL over the directory) sees
//! only files listed in the manifest, and a re-delivered batch whose entry exists is skipped,
//! so output is exactly-once. Part files of an attempt that crashed before its entry was
//! written are never listed, hence never read.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, GzipLevel, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};
use weir_common::location::Created;
use weir_common::{ClassifiedError, Location, Options};

use crate::{CheckpointBatches, Error, OutputMode, Result, Sink};

/// Folder of the manifest log inside the output directory.
pub const MANIFEST_DIR: &str = "_weir_metadata";

/// The file formats a file sink writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    /// Apache Parquet.
    Parquet,
    /// Comma-separated values.
    Csv,
    /// Newline-delimited JSON.
    Json,
}

impl FileFormat {
    /// The format's name and file extension.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::Csv => "csv",
            Self::Json => "json",
        }
    }

    fn accepted_options(&self) -> &'static [&'static str] {
        match self {
            Self::Parquet => &["path", "compression"],
            Self::Csv => &["path", "header", "delimiter"],
            Self::Json => &["path"],
        }
    }
}

/// Writes each batch as files plus a manifest entry.
#[derive(Debug)]
pub struct FileSink {
    location: Location,
    format: FileFormat,
    options: BTreeMap<String, String>,
    compression: Compression,
    header: bool,
    delimiter: u8,
    /// The query writing, once opened: each manifest entry names it.
    query_id: std::sync::Mutex<Option<String>>,
}

impl FileSink {
    /// Opens a file sink writing `format` into `path` (a local path, `file://` or `s3://` URL).
    pub fn try_new(format: FileFormat, path: &str, options: &Options) -> Result<Self> {
        let what = format!("{} sink", format.name());
        let r = options.reader(&what, format.accepted_options());
        r.check_known()?;
        let compression = match r
            .string("compression")
            .map(|c| c.to_ascii_lowercase())
            .as_deref()
        {
            None | Some("snappy") => Compression::SNAPPY,
            Some("none") | Some("uncompressed") => Compression::UNCOMPRESSED,
            Some("zstd") => Compression::ZSTD(ZstdLevel::default()),
            Some("gzip") => Compression::GZIP(GzipLevel::default()),
            Some("lz4") => Compression::LZ4_RAW,
            Some(other) => {
                return Err(ClassifiedError::invalid_option(format!(
                    "Invalid value '{other}' for option 'compression' of the parquet sink: \
                     expected one of snappy, zstd, gzip, lz4, none."
                ))
                .into());
            }
        };
        let delimiter = match r.string("delimiter") {
            None => b',',
            Some(d) if d.len() == 1 && d.is_ascii() => d.as_bytes()[0],
            Some(d) => {
                return Err(ClassifiedError::invalid_option(format!(
                    "Invalid value '{d}' for option 'delimiter' of the csv sink: expected a single ASCII character."
                ))
                .into());
            }
        };
        let header = r.bool("header", false)?;
        let mut kept = BTreeMap::new();
        if format == FileFormat::Csv {
            kept.insert("header".to_string(), header.to_string());
            kept.insert("delimiter".to_string(), (delimiter as char).to_string());
        }
        // Made when the query starts (`open`), so that checking a query creates nothing.
        let location = Location::parse_existing_with(path, std::iter::empty::<(&str, &str)>())?;
        Ok(Self {
            location,
            format,
            options: kept,
            compression,
            header,
            delimiter,
            query_id: std::sync::Mutex::new(None),
        })
    }

    /// The output directory.
    pub fn location(&self) -> &Location {
        &self.location
    }

    fn encode(&self, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        match self.format {
            FileFormat::Parquet => {
                let props = WriterProperties::builder()
                    .set_compression(self.compression)
                    .build();
                let mut w = ArrowWriter::try_new(&mut buf, Arc::clone(schema), Some(props))?;
                for b in batches {
                    w.write(b)?;
                }
                w.close()?;
            }
            FileFormat::Csv => {
                let mut w = arrow::csv::WriterBuilder::new()
                    .with_header(self.header)
                    .with_delimiter(self.delimiter)
                    .build(&mut buf);
                for b in batches {
                    w.write(b)?;
                }
            }
            FileFormat::Json => {
                let mut w = arrow::json::LineDelimitedWriter::new(&mut buf);
                for b in batches {
                    w.write(b)?;
                }
                w.finish()?;
            }
        }
        Ok(buf)
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EntryHeader {
    batch_id: u64,
    format: FileFormat,
    options: BTreeMap<String, String>,
    schema: Schema,
    /// The query that wrote the batch (entries of format v2 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    query_id: Option<String>,
}

/// One committed file, as its manifest entry lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// The path relative to the output directory.
    pub path: String,
    /// Its rows.
    pub rows: u64,
    /// Its size in bytes.
    pub size: u64,
    /// CRC-32 of its bytes (entries of format v2 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32: Option<u32>,
}

/// The format version of manifest entries this weir writes: v2 ends with a checksum line
/// (`#fnv64=`) and names the query; v1 entries (no checksum) still read.
const ENTRY_VERSION: &str = "v2";

#[async_trait]
impl Sink for FileSink {
    fn description(&self) -> String {
        format!(
            "FileSink[{}, {}]",
            self.format.name(),
            self.location.display()
        )
    }

    fn read_back(&self) -> Option<crate::ReadBack> {
        Some(crate::ReadBack::Files(self.location.clone()))
    }

    fn output_can_outlive_a_refresh(&self) -> bool {
        false
    }

    fn identity(&self) -> Option<String> {
        Some(self.location.display().to_string())
    }

    fn is_idempotent(&self) -> bool {
        true
    }

    fn supported_output_modes(&self) -> &'static [OutputMode] {
        &[OutputMode::Append]
    }

    /// The manifest against the checkpoint: every committed batch has its entry, no entry is
    /// of a batch the checkpoint never planned or of another query, and every listed file is
    /// there with the size it was written with.
    async fn check_batches(&self, batches: &CheckpointBatches<'_>) -> Result<()> {
        let entries = read_entries(&self.location).await?;
        let display = self.location.display();
        for (id, header, _) in &entries {
            if let Some(q) = &header.query_id
                && q != batches.query_id
            {
                return Err(ClassifiedError::new(
                    "STREAMING_SINK_OUTPUT_OF_ANOTHER_QUERY",
                    "42K03",
                    format!(
                        "The output folder '{display}' holds batch {id} of another query (ID {q}; \
                         this checkpoint's query is {}). Two queries must not write to one \
                         file sink folder: their batches would hide each other's. Write this \
                         query to its own folder (with a new checkpoint location), or restore \
                         the checkpoint that wrote the folder.",
                        batches.query_id
                    ),
                )
                .into());
            }
            let Some(planned) = batches.last_planned else {
                return Err(ClassifiedError::new(
                    "STREAMING_SINK_OUTPUT_OF_ANOTHER_QUERY",
                    "42K03",
                    format!(
                        "The output folder '{display}' already holds batches of another query \
                         (batch {id}, written with another checkpoint), and this query has run \
                         none: its batches would be skipped as already written. Write to an \
                         empty folder, or run the query with the checkpoint that wrote this one."
                    ),
                )
                .into());
            };
            if *id > planned {
                return Err(Error::Corrupt(format!(
                    "The file sink's manifest entry '{display}/{MANIFEST_DIR}/{id}' is of a batch \
                     the checkpoint never planned (its newest batch is {planned}): the \
                     checkpoint is older than the output (restored from an earlier copy?), and \
                     batches it runs again would be skipped as already written. Restore the \
                     checkpoint that wrote the folder, or start the query over with `weir \
                     checkpoint reset DIR --full` (which clears the folder's output)."
                )));
            }
        }
        if let Some(last) = batches.last_committed {
            let mut present = entries.iter().map(|(id, _, _)| *id).peekable();
            for b in 0..=last {
                while present.next_if(|id| *id < b).is_some() {}
                if present.next_if_eq(&b).is_none() {
                    return Err(Error::Corrupt(format!(
                        "The file sink's manifest entry '{display}/{MANIFEST_DIR}/{b}' is \
                         missing, although the checkpoint committed batch {b}: its files are \
                         hidden from every reader, and the query will not write the batch \
                         again. Restore the entry from a backup; or start the query over with \
                         `weir checkpoint reset DIR --full`, which clears the folder and \
                         writes every batch again."
                    )));
                }
            }
        }
        let files: Vec<ManifestFile> = entries.into_iter().flat_map(|(_, _, f)| f).collect();
        // Sizes only: a restart does not read the committed output (readers check contents).
        check_files(&self.location, &files, false).await
    }

    /// Creates a local output folder, and keeps the query ID for the manifest entries.
    async fn open(&self, query_id: &str) -> Result<()> {
        if let Ok(mut q) = self.query_id.lock() {
            *q = Some(query_id.to_string());
        }
        if let Some(dir) = self.location.local_dir() {
            std::fs::create_dir_all(dir).map_err(|e| {
                ClassifiedError::new(
                    "CANNOT_ACCESS_PATH",
                    "58030",
                    format!(
                        "Cannot create the output directory '{}': {e}. Check that the path is \
                         writable, or choose another one.",
                        dir.display()
                    ),
                )
            })?;
        }
        Ok(())
    }

    /// Deletes the files the sink wrote: those its log lists, and parts of batches that never
    /// committed (`part-<batch>-...`); other files in the folder stay. The log goes first: a
    /// folder without its log is read as empty, and the parts left by a stop half-way are
    /// found by their names when the refresh runs again.
    async fn clear_output(&self) -> Result<()> {
        // Best effort on a damaged manifest: the part files it lists are found by their names
        // below anyway, and a refresh that stopped here could not be finished.
        let listed: Vec<String> = match read_manifest(&self.location).await {
            Ok(m) => m
                .map(|m| m.files.into_iter().map(|f| f.path).collect())
                .unwrap_or_default(),
            Err(Error::Corrupt(_)) => vec![],
            Err(e) => return Err(e),
        };
        let log = self.location.child(MANIFEST_DIR);
        log.delete_all().await?;
        if let Some(dir) = log.local_dir() {
            let _ = std::fs::remove_dir(dir);
        }
        for file in listed {
            self.location.delete(&file).await?;
        }
        for (name, _) in self.location.list_files("").await? {
            if is_part_file(&name) {
                self.location.delete(&name).await?;
            }
        }
        Ok(())
    }

    async fn add_batch(
        &self,
        batch_id: u64,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<()> {
        let query_id = self.query_id.lock().ok().and_then(|q| q.clone());
        let entry = format!("{MANIFEST_DIR}/{batch_id}");
        if self.location.exists(&entry).await? {
            tracing::info!(
                batch_id,
                "file sink already holds this batch; skipping the replay"
            );
            return Ok(());
        }
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        let mut files = vec![];
        if rows > 0 {
            let bytes = self.encode(&schema, &batches)?;
            let name = format!(
                "part-{batch_id:05}-{}.{}",
                uuid::Uuid::new_v4(),
                self.format.name()
            );
            let size = bytes.len() as u64;
            let crc32 = crc32fast::hash(&bytes);
            self.location.put(&name, Bytes::from(bytes)).await?;
            weir_common::failpoint::pause_point("sink_mid", batch_id);
            files.push(ManifestFile {
                path: name,
                rows: rows as u64,
                size,
                crc32: Some(crc32),
            });
        }
        let header = EntryHeader {
            batch_id,
            format: self.format,
            options: self.options.clone(),
            schema: schema.as_ref().clone(),
            query_id,
        };
        let mut text = format!("{ENTRY_VERSION}\n");
        text += &serde_json::to_string(&header).map_err(internal)?;
        for f in &files {
            text.push('\n');
            text += &serde_json::to_string(f).map_err(internal)?;
        }
        let text = weir_common::sealed::seal(text);
        if self
            .location
            .put_if_absent(&entry, Bytes::from(text))
            .await?
            == Created::AlreadyExisted
        {
            // Another writer committed this batch first; our part file is an orphan no reader
            // will see.
            tracing::warn!(
                batch_id,
                "file sink manifest entry appeared concurrently; keeping the first"
            );
        }
        Ok(())
    }
}

fn internal(e: serde_json::Error) -> Error {
    ClassifiedError::new(
        "INTERNAL_ERROR",
        "XX000",
        format!("cannot encode a manifest entry: {e}"),
    )
    .into()
}

/// Whether `name` is a part file as the sink names them: `part-<5-digit batch>-<uuid>.<ext>`.
fn is_part_file(name: &str) -> bool {
    name.strip_prefix("part-")
        .and_then(|r| r.split_once('-'))
        .is_some_and(|(batch, rest)| {
            batch.len() >= 5 && batch.bytes().all(|b| b.is_ascii_digit()) && rest.len() > 36
        })
}

/// What a file sink's manifest says: the committed files and how to read them.
#[derive(Debug, Clone)]
pub struct SinkManifest {
    /// The format of every file.
    pub format: FileFormat,
    /// Format options the files were written with (e.g. csv `header`).
    pub options: BTreeMap<String, String>,
    /// The schema of the newest batch.
    pub schema: SchemaRef,
    /// The committed files, in batch order.
    pub files: Vec<ManifestFile>,
    /// The newest committed batch.
    pub latest_batch_id: u64,
}

/// Reads the manifest of a file sink's output directory; `None` if it has none (not a weir
/// sink directory, or no batch committed yet).
pub async fn read_manifest(location: &Location) -> Result<Option<SinkManifest>> {
    let mut out: Option<SinkManifest> = None;
    for (id, header, files) in read_entries(location).await? {
        let m = out.get_or_insert_with(|| SinkManifest {
            format: header.format,
            options: header.options.clone(),
            schema: Arc::new(header.schema.clone()),
            files: vec![],
            latest_batch_id: id,
        });
        m.files.extend(files);
        m.schema = Arc::new(header.schema);
        m.latest_batch_id = id;
    }
    Ok(out)
}

/// Checks that every file of `files` is in the output directory with the size its manifest
/// entry recorded, and with `contents`, the bytes it was written with (its CRC-32): a reader
/// would otherwise skip a lost or emptied file silently, fail on a cut or damaged one without
/// naming it, or read changed values.
pub async fn check_files(
    location: &Location,
    files: &[ManifestFile],
    contents: bool,
) -> Result<()> {
    if files.is_empty() {
        return Ok(());
    }
    let found: std::collections::HashMap<String, u64> =
        location.list_files("").await?.into_iter().collect();
    for f in files {
        let (class, problem) = match found.get(&f.path) {
            None => ("FAILED_READ_FILE.FILE_NOT_EXIST", "is missing".to_string()),
            Some(&size) if size != f.size => (
                "FAILED_READ_FILE.FILE_SIZE_MISMATCH",
                format!(
                    "has {size} bytes where its manifest entry recorded {} (it was cut, emptied \
                     or replaced)",
                    f.size
                ),
            ),
            Some(_) => match f.crc32.filter(|_| contents) {
                None => continue,
                Some(crc) => {
                    let bytes = location.get(&f.path).await?.unwrap_or_default();
                    if crc32fast::hash(&bytes) == crc {
                        continue;
                    }
                    (
                        "FAILED_READ_FILE.FILE_CHECKSUM_MISMATCH",
                        "has other bytes than it was written with (its checksum does not match)"
                            .to_string(),
                    )
                }
            },
        };
        return Err(ClassifiedError::new(
            class,
            "KD001",
            format!(
                "The file sink's part file '{}/{}' {problem}; its {} rows are committed output. \
                 Restore the file from a backup; or rewrite the folder by starting the query \
                 over with `weir checkpoint reset DIR --full`.",
                location.display(),
                f.path,
                f.rows
            ),
        )
        .into());
    }
    Ok(())
}

/// Every manifest entry of `location` in batch order: its batch, header and files.
async fn read_entries(location: &Location) -> Result<Vec<(u64, EntryHeader, Vec<ManifestFile>)>> {
    let mut ids = vec![];
    for (name, _) in location.list_files(MANIFEST_DIR).await? {
        match weir_common::batch_id::entry_name(&name) {
            weir_common::batch_id::EntryName::Other => {}
            weir_common::batch_id::EntryName::Batch(id) => ids.push(id),
            weir_common::batch_id::EntryName::OutOfRange => {
                return Err(Error::Corrupt(format!(
                    "The file sink's manifest entry '{}/{MANIFEST_DIR}/{name}' is named as no \
                     batch weir writes (batch IDs stay below 2^63): move it out of the folder.",
                    location.display()
                )));
            }
        }
    }
    ids.sort_unstable();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let rel = format!("{MANIFEST_DIR}/{id}");
        let corrupt = |why: &str| {
            Error::Corrupt(format!(
                "The file sink manifest entry '{}/{rel}' {why}. Restore it from a backup: \
                 deleting it would hide batch {id} from every reader for good, because the \
                 query has committed that batch and will not write it again.",
                location.display()
            ))
        };
        let Some(bytes) = location.get(&rel).await? else {
            continue;
        };
        let text = std::str::from_utf8(&bytes).map_err(|_| corrupt("is not text"))?;
        let body = weir_common::sealed::unseal(text)
            .map_err(|_| corrupt("is damaged (its checksum does not match its content)"))?;
        let mut lines = body.lines();
        match lines.next() {
            Some("v1") => {}
            Some(ENTRY_VERSION) if body.len() < text.len() => {}
            Some(ENTRY_VERSION) => {
                return Err(corrupt("has lost its checksum line (it was cut short)"));
            }
            Some(v) if v.starts_with('v') => {
                return Err(corrupt(&format!(
                    "has version '{v}', which this weir does not read (it reads v1 and \
                     {ENTRY_VERSION})"
                )));
            }
            _ => return Err(corrupt("has no version header")),
        }
        let header: EntryHeader = lines
            .next()
            .and_then(|l| serde_json::from_str(l).ok())
            .ok_or_else(|| corrupt("has no readable header line"))?;
        if header.batch_id != id {
            return Err(corrupt(&format!(
                "is the entry of batch {} under the name of batch {id}",
                header.batch_id
            )));
        }
        let files = lines
            .map(serde_json::from_str::<ManifestFile>)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| corrupt("has an unreadable file line"))?;
        out.push((id, header, files));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field};

    use super::*;

    #[tokio::test]
    async fn a_replayed_batch_is_skipped_and_the_manifest_lists_committed_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let rows = |v: Vec<i64>| {
            vec![
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from(v))])
                    .unwrap(),
            ]
        };
        let sink = FileSink::try_new(
            FileFormat::Parquet,
            dir.path().to_str().unwrap(),
            &Options::new(),
        )
        .unwrap();
        sink.add_batch(0, Arc::clone(&schema), rows(vec![1, 2]))
            .await
            .unwrap();
        // An orphan file from a crashed attempt of batch 1: not in the manifest.
        std::fs::write(dir.path().join("part-00001-orphan.parquet"), b"junk").unwrap();
        sink.add_batch(1, Arc::clone(&schema), rows(vec![3]))
            .await
            .unwrap();
        sink.add_batch(1, Arc::clone(&schema), rows(vec![3]))
            .await
            .unwrap();
        sink.add_batch(2, Arc::clone(&schema), rows(vec![]))
            .await
            .unwrap();
        let m = read_manifest(sink.location()).await.unwrap().unwrap();
        assert_eq!(m.files.len(), 2);
        assert!(m.files.iter().all(|f| !f.path.contains("orphan")));
        assert_eq!(m.latest_batch_id, 2);
        let parquet_files = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".parquet")
            })
            .count();
        assert_eq!(
            parquet_files, 3,
            "two committed files and the orphan; the replay wrote none"
        );
    }

    #[test]
    fn an_unknown_option_names_the_accepted_ones() {
        let dir = tempfile::tempdir().unwrap();
        let err = FileSink::try_new(
            FileFormat::Csv,
            dir.path().to_str().unwrap(),
            &Options::new().with("headr", "true"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("path, header, delimiter"), "{err}");
    }
}
