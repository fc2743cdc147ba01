//! The pipeline spec: `weir-pipeline.yml`, with the fields of Spark's `spark-pipeline.yml`.
//!
//! ```text
//! name: orders                       required
//! storage: pipeline-storage          required: a local folder (relative to the spec's folder)
//!                                    or a URL (file://, s3://); checkpoints, tables and the
//!                                    event log live under it
//! catalog: main                      optional
//! database: sales                    optional (`schema` is its other name, as in Spark)
//! configuration:                     optional, string → string: session settings
//!   spark.sql.shuffle.partitions: "4"
//! libraries:                         the SQL files: a path, or `<folder>/**` for every file
//!   - glob:                          below a folder (Spark's two glob forms)
//!       include: transformations/**
//! ```
//!
//! The spec is found as Spark finds its own: `--spec FILE`, or the first folder from the
//! working directory upwards holding `weir-pipeline.yml` (or `.yaml`, or Spark's
//! `spark-pipeline.yml` / `.yaml`, so a Spark project runs as it is). Errors carry Spark's
//! classes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_norway::Value;
use weir_common::ClassifiedError;

/// The names a spec file may have, in the order they are looked for.
pub const SPEC_FILE_NAMES: [&str; 4] = [
    "weir-pipeline.yml",
    "weir-pipeline.yaml",
    "spark-pipeline.yml",
    "spark-pipeline.yaml",
];

const ALLOWED_FIELDS: [&str; 7] = [
    "name",
    "storage",
    "catalog",
    "database",
    "schema",
    "configuration",
    "libraries",
];
const REQUIRED_FIELDS: [&str; 2] = ["name", "storage"];

/// A pipeline's spec, read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineSpec {
    /// The spec file.
    pub path: PathBuf,
    /// The pipeline's name.
    pub name: String,
    /// Where the pipeline keeps checkpoints, tables and its event log: a URL, or an absolute
    /// local path.
    pub storage: String,
    /// The default catalog, if given.
    pub catalog: Option<String>,
    /// The default database (`database`, or else `schema`), if given.
    pub database: Option<String>,
    /// Session settings for every flow.
    pub configuration: BTreeMap<String, String>,
    /// The libraries' include patterns, as written.
    pub libraries: Vec<String>,
}

fn spec_error(class: &'static str, message: impl Into<String>) -> ClassifiedError {
    ClassifiedError::new(class, "42K06", message)
}

fn not_found(class: &'static str, message: impl Into<String>) -> ClassifiedError {
    ClassifiedError::new(class, "42K03", message)
}

impl PipelineSpec {
    /// The spec file in `dir` or the nearest folder above it.
    pub fn find(dir: &Path) -> Result<PathBuf, ClassifiedError> {
        let mut here = Some(dir);
        while let Some(d) = here {
            let found: Vec<PathBuf> = SPEC_FILE_NAMES
                .iter()
                .map(|n| d.join(n))
                .filter(|p| p.is_file())
                .collect();
            match found.as_slice() {
                [] => here = d.parent(),
                [one] => return Ok(one.clone()),
                _ => {
                    return Err(spec_error(
                        "MULTIPLE_PIPELINE_SPEC_FILES_FOUND",
                        format!(
                            "The folder '{}' holds more than one pipeline spec ({}); keep one, \
                             or name the one to use with --spec.",
                            d.display(),
                            found
                                .iter()
                                .filter_map(|p| p.file_name())
                                .map(|n| n.to_string_lossy())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
            }
        }
        Err(not_found(
            "PIPELINE_SPEC_FILE_NOT_FOUND",
            format!(
                "No pipeline spec (weir-pipeline.yml) in '{}' or any folder above it. Run the \
                 command inside a pipeline project, pass --spec FILE, or create a project with \
                 `weir pipeline init NAME`.",
                dir.display()
            ),
        ))
    }

    /// Reads and checks the spec file at `path`.
    pub fn load(path: &Path) -> Result<Self, ClassifiedError> {
        if !path.is_file() {
            return Err(not_found(
                "PIPELINE_SPEC_FILE_DOES_NOT_EXIST",
                format!(
                    "The pipeline spec file '{}' does not exist.",
                    path.display()
                ),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| {
            not_found(
                "PIPELINE_SPEC_FILE_DOES_NOT_EXIST",
                format!("Cannot read the pipeline spec '{}': {e}.", path.display()),
            )
        })?;
        Self::parse(&text, path)
    }

    /// Checks the spec `text` of the file at `path` (relative storage and library paths are
    /// taken from its folder).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ClassifiedError> {
        let value: Value = serde_norway::from_str(text).map_err(|e| {
            let at = e
                .location()
                .map(|l| format!(" at line {}, column {}", l.line(), l.column()))
                .unwrap_or_default();
            ClassifiedError::new(
                "PARSE_SYNTAX_ERROR",
                "42601",
                format!(
                    "The pipeline spec '{}' is not valid YAML{at}: {e}",
                    path.display()
                ),
            )
        })?;
        let Value::Mapping(fields) = value else {
            return Err(spec_error(
                "PIPELINE_SPEC_FIELD_NOT_DICT",
                format!(
                    "The pipeline spec '{}' must be a mapping of fields (name: ..., storage: \
                     ...), not {}.",
                    path.display(),
                    kind(&value)
                ),
            ));
        };
        let mut by_name: BTreeMap<String, Value> = BTreeMap::new();
        for (k, v) in fields {
            let Value::String(k) = k else {
                return Err(spec_error(
                    "PIPELINE_SPEC_UNEXPECTED_FIELD",
                    format!("Pipeline spec field {} is not a name.", render(&k)),
                ));
            };
            if !ALLOWED_FIELDS.contains(&k.as_str()) {
                return Err(spec_error(
                    "PIPELINE_SPEC_UNEXPECTED_FIELD",
                    format!(
                        "Pipeline spec field '{k}' is unexpected; the fields are {}.",
                        ALLOWED_FIELDS.join(", ")
                    ),
                ));
            }
            by_name.insert(k, v);
        }
        for f in REQUIRED_FIELDS {
            if !by_name.contains_key(f) {
                return Err(spec_error(
                    "PIPELINE_SPEC_MISSING_REQUIRED_FIELD",
                    format!("The pipeline spec has no field '{f}', which is required."),
                ));
            }
        }
        let string = |field: &str| -> Result<Option<String>, ClassifiedError> {
            match by_name.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
                Some(other) => Err(spec_error(
                    "PIPELINE_SPEC_FIELD_NOT_STRING",
                    format!(
                        "Pipeline spec field '{field}' must be a non-empty string, not {}.",
                        kind(other)
                    ),
                )),
            }
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = string("name")?.unwrap_or_default();
        let storage = resolve_storage(&string("storage")?.unwrap_or_default(), dir)?;
        let catalog = string("catalog")?;
        let database = match string("database")? {
            Some(d) => Some(d),
            None => string("schema")?,
        };
        let configuration = match by_name.get("configuration") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Mapping(m)) => {
                let mut out = BTreeMap::new();
                for (k, v) in m {
                    let Value::String(k) = k else {
                        return Err(spec_error(
                            "PIPELINE_SPEC_DICT_KEY_NOT_STRING",
                            format!(
                                "The keys of pipeline spec field 'configuration' must be \
                                 strings, not {}.",
                                render(k)
                            ),
                        ));
                    };
                    let Value::String(v) = v else {
                        return Err(spec_error(
                            "PIPELINE_SPEC_DICT_VALUE_NOT_STRING",
                            format!(
                                "The value of '{k}' in pipeline spec field 'configuration' must \
                                 be a string: write it in quotes ({k}: \"{}\").",
                                render(v)
                            ),
                        ));
                    };
                    out.insert(k.clone(), v.clone());
                }
                out
            }
            Some(other) => {
                return Err(spec_error(
                    "PIPELINE_SPEC_FIELD_NOT_DICT",
                    format!(
                        "Pipeline spec field 'configuration' must be a mapping of settings, not \
                         {}.",
                        kind(other)
                    ),
                ));
            }
        };
        let libraries = match by_name.get("libraries") {
            None | Some(Value::Null) => vec![],
            Some(Value::Sequence(entries)) => entries
                .iter()
                .map(library_include)
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(spec_error(
                    "PIPELINE_SPEC_INVALID_LIBRARY",
                    format!(
                        "Pipeline spec field 'libraries' must be a list of `- glob: {{include: \
                         PATTERN}}` entries, not {}.",
                        kind(other)
                    ),
                ));
            }
        };
        for pattern in &libraries {
            check_glob(pattern)?;
        }
        Ok(Self {
            path: path.to_path_buf(),
            name,
            storage,
            catalog,
            database,
            configuration,
            libraries,
        })
    }

    /// The folder the spec is in: library patterns are relative to it.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// The SQL files the libraries name, sorted by path, each once.
    pub fn library_files(&self) -> Result<Vec<PathBuf>, ClassifiedError> {
        let mut out: Vec<PathBuf> = vec![];
        for pattern in &self.libraries {
            let matched: Vec<PathBuf> = if let Some(folder) = pattern.strip_suffix("/**") {
                let full = self.dir().join(folder).join("**").join("*");
                let full = full.to_string_lossy().into_owned();
                glob::glob(&full)
                    .map_err(|e| invalid_glob(pattern, &e.to_string()))?
                    .filter_map(Result::ok)
                    .filter(|p| p.is_file())
                    .collect()
            } else {
                let p = self.dir().join(pattern);
                if !p.is_file() {
                    return Err(not_found(
                        "PIPELINE_LIBRARY_FILE_NOT_FOUND",
                        format!(
                            "The pipeline library '{pattern}' (at '{}') is not a file.",
                            p.display()
                        ),
                    ));
                }
                vec![p]
            };
            for p in matched {
                if p.extension().and_then(|e| e.to_str()) != Some("sql") {
                    return Err(spec_error(
                        "PIPELINE_UNSUPPORTED_DEFINITIONS_FILE_EXTENSION",
                        format!(
                            "The pipeline library file '{}' is not a .sql file: weir \
                             pipelines are defined in SQL. Move other files out of the \
                             libraries' folders, or name the SQL files one by one.",
                            p.display()
                        ),
                    ));
                }
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
        out.sort();
        Ok(out)
    }
}

/// `storage` as a URL or an absolute local path (a relative path is under `dir`).
fn resolve_storage(storage: &str, dir: &Path) -> Result<String, ClassifiedError> {
    if let Some((scheme, rest)) = storage.split_once("://") {
        let known = ["file", "s3", "s3a"];
        if !known.contains(&scheme.to_ascii_lowercase().as_str()) || rest.is_empty() {
            return Err(spec_error(
                "PIPELINE_STORAGE_ROOT_INVALID",
                format!(
                    "The pipeline storage '{storage}' is not a place weir can write: use a \
                     local folder (absolute, or relative to the spec), file:///path or \
                     s3://bucket/path."
                ),
            ));
        }
        return Ok(storage.to_string());
    }
    let p = Path::new(storage);
    let p = if p.is_absolute() {
        p.to_path_buf()
    } else {
        dir.join(p)
    };
    Ok(p.to_string_lossy().into_owned())
}

fn library_include(entry: &Value) -> Result<String, ClassifiedError> {
    let bad = || {
        spec_error(
            "PIPELINE_SPEC_INVALID_LIBRARY",
            format!(
                "The pipeline library entry {} is not of the form `- glob: {{include: \
                 PATTERN}}`.",
                render(entry)
            ),
        )
    };
    let Value::Mapping(m) = entry else {
        return Err(bad());
    };
    let Some(Value::Mapping(glob)) = m.get("glob") else {
        return Err(bad());
    };
    match glob.get("include") {
        Some(Value::String(s)) if m.len() == 1 && glob.len() == 1 => Ok(s.clone()),
        _ => Err(bad()),
    }
}

fn invalid_glob(pattern: &str, why: &str) -> ClassifiedError {
    spec_error(
        "PIPELINE_SPEC_INVALID_GLOB_PATTERN",
        format!(
            "The library pattern '{pattern}' is not supported{why}: name a file \
             (transformations/orders.sql) or every file below a folder (transformations/**)."
        ),
    )
}

/// Spark's two forms: a path without wildcards, or `<folder>/**` with none in the folder.
fn check_glob(pattern: &str) -> Result<(), ClassifiedError> {
    let wild = |s: &str| s.contains(['*', '?', '[', ']', '{', '}']);
    let plain = pattern.strip_suffix("/**").unwrap_or(pattern);
    if pattern.trim().is_empty() || wild(plain) {
        return Err(invalid_glob(pattern, ""));
    }
    if Path::new(plain).is_absolute() || plain.split('/').any(|c| c == "..") {
        return Err(invalid_glob(
            pattern,
            " (it must stay inside the project's folder)",
        ));
    }
    Ok(())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

fn render(v: &Value) -> String {
    serde_norway::to_string(v)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| kind(v).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PipelineSpec, ClassifiedError> {
        PipelineSpec::parse(text, Path::new("/p/weir-pipeline.yml"))
    }

    fn class(text: &str) -> &'static str {
        parse(text).expect_err("the spec is refused").class
    }

    #[test]
    fn a_spec_with_every_field_is_read_and_paths_resolve_from_its_folder() {
        let spec = parse(
            "name: orders\nstorage: store\ncatalog: main\nschema: sales\n\
             configuration:\n  spark.sql.shuffle.partitions: \"4\"\n\
             libraries:\n  - glob:\n      include: transformations/**\n  - glob:\n      include: extra/one.sql\n",
        )
        .unwrap();
        assert_eq!(spec.name, "orders");
        assert_eq!(spec.storage, "/p/store");
        assert_eq!(spec.catalog.as_deref(), Some("main"));
        assert_eq!(spec.database.as_deref(), Some("sales"));
        assert_eq!(
            spec.configuration.get("spark.sql.shuffle.partitions"),
            Some(&"4".to_string())
        );
        assert_eq!(spec.libraries, ["transformations/**", "extra/one.sql"]);
        assert_eq!(
            parse("name: a\nstorage: s3://bucket/p\ndatabase: d\nschema: s\n")
                .unwrap()
                .storage,
            "s3://bucket/p"
        );
        assert_eq!(
            parse("name: a\nstorage: /abs\ndatabase: d\nschema: s\n")
                .unwrap()
                .database
                .as_deref(),
            Some("d")
        );
    }

    #[test]
    fn bad_specs_get_sparks_error_classes() {
        assert_eq!(
            class("name: a\nstorage: s\nlibrary: x\n"),
            "PIPELINE_SPEC_UNEXPECTED_FIELD"
        );
        assert_eq!(class("name: a\n"), "PIPELINE_SPEC_MISSING_REQUIRED_FIELD");
        assert_eq!(
            class("name: a\nstorage: s\nconfiguration:\n  k: 4\n"),
            "PIPELINE_SPEC_DICT_VALUE_NOT_STRING"
        );
        assert_eq!(
            class("name: a\nstorage: s\nconfiguration:\n  4: v\n"),
            "PIPELINE_SPEC_DICT_KEY_NOT_STRING"
        );
        assert_eq!(
            class("name: a\nstorage: s\nconfiguration: [a]\n"),
            "PIPELINE_SPEC_FIELD_NOT_DICT"
        );
        assert_eq!(class("- a\n- b\n"), "PIPELINE_SPEC_FIELD_NOT_DICT");
        assert_eq!(class("name: [a\n"), "PARSE_SYNTAX_ERROR");
        assert_eq!(
            class("name: a\nstorage: 3\n"),
            "PIPELINE_SPEC_FIELD_NOT_STRING"
        );
        assert_eq!(
            class("name: a\nstorage: hdfs://x/y\n"),
            "PIPELINE_STORAGE_ROOT_INVALID"
        );
        for pattern in [
            "t/**/*.sql",
            "**/*.sql",
            "*/main.sql",
            "d/*/f.sql",
            "../x/**",
        ] {
            assert_eq!(
                class(&format!(
                    "name: a\nstorage: s\nlibraries:\n  - glob:\n      include: \"{pattern}\"\n"
                )),
                "PIPELINE_SPEC_INVALID_GLOB_PATTERN",
                "{pattern}"
            );
        }
        assert_eq!(
            class("name: a\nstorage: s\nlibraries:\n  - t/**\n"),
            "PIPELINE_SPEC_INVALID_LIBRARY"
        );
    }

    #[test]
    fn the_spec_is_found_upwards_and_libraries_list_their_sql_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("t/deep")).unwrap();
        std::fs::create_dir_all(root.join("other")).unwrap();
        std::fs::write(root.join("t/b.sql"), "").unwrap();
        std::fs::write(root.join("t/deep/a.sql"), "").unwrap();
        std::fs::write(root.join("other/c.sql"), "").unwrap();
        let spec_path = root.join("weir-pipeline.yml");
        std::fs::write(
            &spec_path,
            "name: p\nstorage: s\nlibraries:\n  - glob:\n      include: t/**\n  - glob:\n      include: other/c.sql\n  - glob:\n      include: t/b.sql\n",
        )
        .unwrap();
        assert_eq!(PipelineSpec::find(&root.join("t/deep")).unwrap(), spec_path);
        let spec = PipelineSpec::load(&spec_path).unwrap();
        assert_eq!(
            spec.library_files().unwrap(),
            [
                root.join("other/c.sql"),
                root.join("t/b.sql"),
                root.join("t/deep/a.sql")
            ]
        );
        // A file that is not SQL below a library folder is refused, as in Spark.
        std::fs::write(root.join("t/notes.md"), "").unwrap();
        assert_eq!(
            spec.library_files().unwrap_err().class,
            "PIPELINE_UNSUPPORTED_DEFINITIONS_FILE_EXTENSION"
        );
        std::fs::write(root.join("spark-pipeline.yml"), "").unwrap();
        assert_eq!(
            PipelineSpec::find(root).unwrap_err().class,
            "MULTIPLE_PIPELINE_SPEC_FILES_FOUND"
        );
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            PipelineSpec::find(empty.path()).unwrap_err().class,
            "PIPELINE_SPEC_FILE_NOT_FOUND"
        );
        assert_eq!(
            PipelineSpec::load(&empty.path().join("nope.yml"))
                .unwrap_err()
                .class,
            "PIPELINE_SPEC_FILE_DOES_NOT_EXIST"
        );
    }
}
