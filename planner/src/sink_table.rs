//! Reading a weir file sink's output directory with batch SQL: only the files its manifest
//! lists, so a reader never sees a half-written or replayed batch.
//!
//! [`FileSinkTable`] reads the manifest afresh on every scan, so a query in the same session
//! sees each newly committed batch. [`ManifestAwareTableFactory`] makes DataFusion's
//! `CREATE EXTERNAL TABLE ... STORED AS PARQUET LOCATION '<dir>'` use it whenever `<dir>`
//! holds a weir manifest, and DataFusion's own listing table otherwise.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::datasource::TableType;
use datafusion::datasource::file_format::FileFormat as DfFileFormat;
use datafusion::datasource::file_format::csv::CsvFormat;
use datafusion::datasource::file_format::json::JsonFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{CreateExternalTable, Expr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use weir_common::Location;
use weir_sinks::{FileFormat, SinkManifest, check_files, read_manifest};

fn ext(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// A weir file sink's output directory as a table.
#[derive(Debug)]
pub struct FileSinkTable {
    location: Location,
    schema: SchemaRef,
}

impl FileSinkTable {
    /// Opens the directory at `path`; `None` if it holds no weir manifest (yet).
    pub async fn try_open(path: &str) -> Result<Option<Self>> {
        let location = Location::parse(path).map_err(ext)?;
        let Some(manifest) = read_manifest(&location).await.map_err(ext)? else {
            return Ok(None);
        };
        Ok(Some(Self {
            schema: Arc::clone(&manifest.schema),
            location,
        }))
    }

    /// A table over `location` with `schema`, before any batch is committed.
    pub fn new(location: Location, schema: SchemaRef) -> Self {
        Self { location, schema }
    }

    fn listing(&self, state: &dyn Session, manifest: &SinkManifest) -> Result<ListingTable> {
        let urls = match self.location.local_dir() {
            Some(dir) => manifest
                .files
                .iter()
                .map(|f| ListingTableUrl::parse(dir.join(&f.path).to_string_lossy()))
                .collect::<Result<Vec<_>>>()?,
            None => {
                // An object store (S3): DataFusion reads the part files through the sink
                // location's own client, registered for the bucket's URL.
                let root = self.location.display();
                let bucket = root
                    .split_once("://")
                    .and_then(|(scheme, rest)| {
                        let bucket = rest.split('/').next()?;
                        datafusion::execution::object_store::ObjectStoreUrl::parse(format!(
                            "{scheme}://{bucket}"
                        ))
                        .ok()
                    })
                    .ok_or_else(|| {
                        DataFusionError::Plan(format!("'{root}' is not an object store URL"))
                    })?;
                state
                    .runtime_env()
                    .register_object_store(bucket.as_ref(), Arc::clone(self.location.store()));
                manifest
                    .files
                    .iter()
                    .map(|f| ListingTableUrl::parse(format!("{root}/{}", f.path)))
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let format: Arc<dyn DfFileFormat> = match manifest.format {
            FileFormat::Parquet => Arc::new(ParquetFormat::default()),
            FileFormat::Csv => {
                let header = manifest.options.get("header").is_some_and(|h| h == "true");
                let delimiter = manifest
                    .options
                    .get("delimiter")
                    .and_then(|d| d.bytes().next())
                    .unwrap_or(b',');
                Arc::new(
                    CsvFormat::default()
                        .with_has_header(header)
                        .with_delimiter(delimiter),
                )
            }
            FileFormat::Json => Arc::new(JsonFormat::default()),
        };
        let options =
            ListingOptions::new(format).with_file_extension(format!(".{}", manifest.format.name()));
        let config = ListingTableConfig::new_with_multi_paths(urls)
            .with_listing_options(options)
            .with_schema(Arc::clone(&self.schema));
        ListingTable::try_new(config)
    }
}

#[async_trait]
impl TableProvider for FileSinkTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match read_manifest(&self.location).await.map_err(ext)? {
            Some(m) if !m.files.is_empty() => {
                // A listed file lost, emptied, cut or damaged is an error naming it, not fewer
                // or other rows.
                check_files(&self.location, &m.files, true)
                    .await
                    .map_err(ext)?;
                self.listing(state, &m)?
                    .scan(state, projection, filters, limit)
                    .await
            }
            _ => {
                let schema = match projection {
                    Some(p) => Arc::new(self.schema.project(p)?),
                    None => Arc::clone(&self.schema),
                };
                Ok(Arc::new(EmptyExec::new(schema)))
            }
        }
    }
}

/// Wraps DataFusion's factory for file tables so that a weir sink directory is read through
/// its manifest.
#[derive(Debug)]
pub struct ManifestAwareTableFactory {
    inner: Arc<dyn TableProviderFactory>,
}

impl ManifestAwareTableFactory {
    /// Falls back to `inner` for directories without a weir manifest.
    pub fn new(inner: Arc<dyn TableProviderFactory>) -> Self {
        Self { inner }
    }
}

#[async_trait]
impl TableProviderFactory for ManifestAwareTableFactory {
    async fn create(
        &self,
        state: &dyn Session,
        cmd: &CreateExternalTable,
    ) -> Result<Arc<dyn TableProvider>> {
        if let [location] = cmd.locations.as_slice()
            && location.starts_with("s3://")
        {
            // A sink folder on S3 is read through its manifest; anything else goes to
            // DataFusion, which needs its own object store set up for S3.
            if let Some(t) = FileSinkTable::try_open(location).await? {
                return Ok(Arc::new(t));
            }
        }
        if let [location] = cmd.locations.as_slice()
            && (!location.contains("://") || location.starts_with("file://"))
            && is_sink_directory(std::path::Path::new(location.trim_start_matches("file://")))
        {
            if let Some(t) = FileSinkTable::try_open(location).await? {
                return Ok(Arc::new(t));
            }
            // A sink that has not committed a batch yet: any part file is uncommitted. Take the
            // schema DataFusion finds (or was given), and read the manifest at each scan.
            let schema = self.inner.create(state, cmd).await?.schema();
            let location = Location::parse(location).map_err(ext)?;
            return Ok(Arc::new(FileSinkTable::new(location, schema)));
        }
        self.inner.create(state, cmd).await
    }
}

/// Whether `dir` is a weir file sink's output: it has a manifest folder, or part files named
/// the way the sink names them (`part-<batch, 5 digits>-<uuid>.<ext>`), which a crash before the
/// first manifest entry leaves behind.
fn is_sink_directory(dir: &std::path::Path) -> bool {
    if dir.join(weir_sinks::MANIFEST_DIR).is_dir() {
        return true;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name.strip_prefix("part-").is_some_and(|rest| {
            rest.len() > 6
                && rest.as_bytes()[..5].iter().all(u8::is_ascii_digit)
                && rest.as_bytes()[5] == b'-'
        })
    })
}
