//! The registry of sink formats: the engine looks sinks up here by name.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use weir_common::{ClassifiedError, Options};

use crate::{ConsoleSink, FileFormat, FileSink, MemorySink, NoopSink, OutputMode, Result, Sink};

/// Everything a sink is built from.
#[derive(Debug, Clone)]
pub struct SinkSpec {
    /// Format name, e.g. `parquet`.
    pub format: String,
    /// Options of the sink (`path` among them for file sinks).
    pub options: Options,
    /// The output mode of the query.
    pub output_mode: OutputMode,
    /// The query name, if any (the memory sink's table name).
    pub query_name: Option<String>,
    /// The schema of the query's output.
    pub schema: SchemaRef,
}

/// Builds a sink from its spec, refusing unknown or malformed options.
pub type SinkFactory = Arc<dyn Fn(&SinkSpec) -> Result<Arc<dyn Sink>> + Send + Sync>;

/// Sink formats by name (case-insensitive).
#[derive(Clone)]
pub struct SinkRegistry {
    factories: BTreeMap<String, SinkFactory>,
}

impl std::fmt::Debug for SinkRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkRegistry")
            .field("formats", &self.formats())
            .finish()
    }
}

impl Default for SinkRegistry {
    fn default() -> Self {
        Self::with_builtins()
    }
}

fn file_factory(format: FileFormat) -> SinkFactory {
    Arc::new(move |spec: &SinkSpec| {
        let mut options = spec.options.clone();
        let path = options.get("path").map(str::to_string).ok_or_else(|| {
            ClassifiedError::invalid_option(format!(
                "The {} sink needs an output directory: give LOCATION '...' in SQL or the \
                 option 'path'.",
                format.name()
            ))
        })?;
        options.set("path", path.clone());
        Ok(Arc::new(FileSink::try_new(format, &path, &options)?) as Arc<dyn Sink>)
    })
}

impl SinkRegistry {
    /// A registry with no formats.
    pub fn empty() -> Self {
        Self {
            factories: BTreeMap::new(),
        }
    }

    /// weir's built-in sinks: console, noop, memory, parquet, csv, json.
    pub fn with_builtins() -> Self {
        let mut r = Self::empty();
        r.register(
            "console",
            Arc::new(|s: &SinkSpec| Ok(Arc::new(ConsoleSink::try_new(&s.options)?) as _)),
        );
        r.register(
            "noop",
            Arc::new(|s: &SinkSpec| {
                s.options.reader("noop sink", &[]).check_known()?;
                Ok(Arc::new(NoopSink) as _)
            }),
        );
        r.register(
            "memory",
            Arc::new(|s: &SinkSpec| {
                s.options.reader("memory sink", &[]).check_known()?;
                let name = s.query_name.clone().ok_or_else(|| {
                    ClassifiedError::new(
                        "MEMORY_SINK_QUERY_NAME_REQUIRED",
                        "42601",
                        "The memory sink needs a query name, which becomes the name of its \
                         table: set query_name(...) or use CREATE STREAMING TABLE <name>.",
                    )
                })?;
                Ok(Arc::new(MemorySink::new(name, s.schema.clone(), s.output_mode)) as _)
            }),
        );
        for f in [FileFormat::Parquet, FileFormat::Csv, FileFormat::Json] {
            r.register(f.name(), file_factory(f));
        }
        #[cfg(feature = "kafka")]
        r.register(
            "kafka",
            Arc::new(|s: &SinkSpec| {
                Ok(Arc::new(crate::kafka::KafkaSink::try_new(&s.options, &s.schema)?) as _)
            }),
        );
        #[cfg(feature = "delta")]
        r.register(
            "delta",
            Arc::new(|s: &SinkSpec| {
                Ok(Arc::new(crate::delta::DeltaSink::try_new(
                    &s.options,
                    &s.schema,
                    s.output_mode,
                )?) as _)
            }),
        );
        r
    }

    /// Adds or replaces the format `name`.
    pub fn register(&mut self, name: &str, factory: SinkFactory) {
        self.factories.insert(name.to_ascii_lowercase(), factory);
    }

    /// The registered format names.
    pub fn formats(&self) -> Vec<String> {
        self.factories.keys().cloned().collect()
    }

    /// Creates the sink described by `spec`, checking that it supports the output mode.
    pub fn create(&self, spec: &SinkSpec) -> Result<Arc<dyn Sink>> {
        let factory = self
            .factories
            .get(&spec.format.to_ascii_lowercase())
            .ok_or_else(|| {
                ClassifiedError::new(
                    "DATA_SOURCE_NOT_FOUND",
                    "42K02",
                    format!(
                        "Failed to find the streaming sink '{}'. Available sink formats: {}.",
                        spec.format,
                        self.formats().join(", ")
                    ),
                )
            })?;
        let sink = factory(spec)?;
        if !sink.supported_output_modes().contains(&spec.output_mode) {
            return Err(ClassifiedError::new(
                "STREAMING_OUTPUT_MODE.UNSUPPORTED_DATASOURCE",
                "42KDE",
                format!(
                    "The {} sink does not support the {} output mode; it supports: {}.",
                    spec.format,
                    spec.output_mode,
                    sink.supported_output_modes()
                        .iter()
                        .map(|m| m.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
            .into());
        }
        Ok(sink)
    }
}
