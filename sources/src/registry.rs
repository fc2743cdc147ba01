//! The registry of source formats: the engine and planner look sources up here by name.

use std::collections::BTreeMap;
use std::sync::Arc;

use weir_common::{ClassifiedError, Options};

use crate::files::FileFormat;
use crate::{
    FileSourceProvider, NexmarkSourceProvider, RateMicroBatchSourceProvider, RateSourceProvider,
    Result, SourceProvider,
};

/// Builds a source definition from its options, refusing unknown or malformed ones.
pub type SourceFactory = Arc<dyn Fn(&Options) -> Result<Arc<dyn SourceProvider>> + Send + Sync>;

/// Source formats by name (`rate`, `rate-micro-batch`, ...). Names compare case-insensitively
/// and `_` equals `-`, so SQL can say `rate_micro_batch`.
#[derive(Clone)]
pub struct SourceRegistry {
    factories: BTreeMap<String, SourceFactory>,
}

impl std::fmt::Debug for SourceRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceRegistry")
            .field("formats", &self.formats())
            .finish()
    }
}

fn normalize(format: &str) -> String {
    format.trim().to_ascii_lowercase().replace('_', "-")
}

impl Default for SourceRegistry {
    fn default() -> Self {
        Self::with_builtins()
    }
}

impl SourceRegistry {
    /// A registry with no formats.
    pub fn empty() -> Self {
        Self {
            factories: BTreeMap::new(),
        }
    }

    /// A registry with weir's built-in formats: `rate`, `rate-micro-batch`, `nexmark`, the file
    /// formats `json`, `csv` and `parquet`, and `read-files` (the file source with a `format`
    /// option).
    pub fn with_builtins() -> Self {
        let mut r = Self::empty();
        r.register(
            "rate",
            Arc::new(|o: &Options| Ok(Arc::new(RateSourceProvider::try_new(o)?) as _)),
        );
        r.register(
            "rate-micro-batch",
            Arc::new(|o: &Options| Ok(Arc::new(RateMicroBatchSourceProvider::try_new(o)?) as _)),
        );
        for format in [FileFormat::Json, FileFormat::Csv, FileFormat::Parquet] {
            r.register(
                format.name(),
                Arc::new(move |o: &Options| {
                    Ok(Arc::new(FileSourceProvider::try_new(format, o)?) as _)
                }),
            );
        }
        #[cfg(feature = "kafka")]
        r.register(
            "kafka",
            Arc::new(|o: &Options| {
                Ok(Arc::new(crate::kafka::KafkaSourceProvider::try_new(o)?) as _)
            }),
        );
        #[cfg(feature = "delta")]
        r.register(
            "delta",
            Arc::new(|o: &Options| {
                Ok(Arc::new(crate::delta::DeltaSourceProvider::try_new(o)?) as _)
            }),
        );
        r.register(
            "nexmark",
            Arc::new(|o: &Options| Ok(Arc::new(NexmarkSourceProvider::try_new(o)?) as _)),
        );
        r.register(
            "read-files",
            Arc::new(|o: &Options| Ok(Arc::new(FileSourceProvider::read_files(o)?) as _)),
        );
        r
    }

    /// Adds or replaces the format `name`.
    pub fn register(&mut self, name: &str, factory: SourceFactory) {
        self.factories.insert(normalize(name), factory);
    }

    /// Whether `name` is a registered format.
    pub fn contains(&self, name: &str) -> bool {
        self.factories.contains_key(&normalize(name))
    }

    /// The registered format names.
    pub fn formats(&self) -> Vec<String> {
        self.factories.keys().cloned().collect()
    }

    /// Creates the source `format` with `options`.
    pub fn create(&self, format: &str, options: &Options) -> Result<Arc<dyn SourceProvider>> {
        let factory = self.factories.get(&normalize(format)).ok_or_else(|| {
            ClassifiedError::new(
                "DATA_SOURCE_NOT_FOUND",
                "42K02",
                format!(
                    "Failed to find the streaming source '{format}'. Available source formats: {}.",
                    self.formats().join(", ")
                ),
            )
        })?;
        factory(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_format_is_refused_with_the_available_ones() {
        let err = SourceRegistry::with_builtins()
            .create("kafak", &Options::new())
            .unwrap_err();
        assert_eq!(err.error_class(), "DATA_SOURCE_NOT_FOUND");
        for format in [
            "csv",
            "json",
            "nexmark",
            "parquet",
            "rate",
            "rate-micro-batch",
            "read-files",
        ] {
            assert!(err.to_string().contains(format), "{err}");
        }
    }

    #[test]
    fn sql_spelling_with_underscores_finds_the_format() {
        let r = SourceRegistry::with_builtins();
        let src = r
            .create(
                "RATE_MICRO_BATCH",
                &Options::new().with("rowsPerBatch", "5"),
            )
            .unwrap();
        assert_eq!(src.format(), "rate-micro-batch");
    }
}
