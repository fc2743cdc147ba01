//! What the Delta Lake source and sink share: resolving a table's location to the URL delta-rs
//! takes, its storage options, opening the table, and turning delta-rs errors into classified
//! ones.

use std::collections::HashMap;

use deltalake::{DeltaTable, DeltaTableError};
use url::Url;

use crate::{ClassifiedError, Options};

/// The table's location as a URL: `s3://...` and `file://...` as given, a local path made
/// absolute (and, with `create`, created, as delta-rs needs the folder to exist).
pub fn table_url(path: &str, create: bool) -> Result<Url, ClassifiedError> {
    let trimmed = path.trim();
    if trimmed.is_empty() {
        return Err(ClassifiedError::new(
            "INVALID_EMPTY_LOCATION",
            "42K05",
            "An empty path was given for a Delta table; name its folder.",
        ));
    }
    let local = match trimmed.strip_prefix("file://") {
        Some(rest) => rest,
        None if trimmed.starts_with("s3://") => {
            return Url::parse(trimmed).map_err(|e| {
                ClassifiedError::invalid_option(format!(
                    "'{trimmed}' is not a valid s3:// URL: {e}."
                ))
            });
        }
        None if trimmed.contains("://") => {
            return Err(ClassifiedError::new(
                "UNSUPPORTED_STORAGE_SCHEME",
                "0A000",
                format!(
                    "The storage scheme of '{trimmed}' is not supported for Delta tables; use a \
                     local path, a file:// URL or an s3:// URL."
                ),
            ));
        }
        None => trimmed,
    };
    let abs = std::path::absolute(local).map_err(|e| cannot_access(local, e))?;
    if create {
        std::fs::create_dir_all(&abs).map_err(|e| cannot_access(local, e))?;
    }
    Url::from_directory_path(&abs).map_err(|()| {
        ClassifiedError::invalid_option(format!("'{}' is not a usable folder.", abs.display()))
    })
}

fn cannot_access(path: &str, e: std::io::Error) -> ClassifiedError {
    ClassifiedError::new(
        "CANNOT_ACCESS_PATH",
        "58030",
        format!("Cannot use the folder '{path}' for a Delta table: {e}."),
    )
}

/// Splits the storage client's `aws_*` options (object_store's `AmazonS3ConfigKey` names, which
/// take precedence over the `AWS_*` environment) from the connector's own.
pub fn storage_options(options: &Options) -> (HashMap<String, String>, Options) {
    let (storage, own) = options.split_prefixed("aws_");
    (
        storage
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect(),
        own,
    )
}

/// Opens the table at `url`, loaded at its latest version; a folder without a table gives an
/// uninitialised table (`version()` is `None`).
pub async fn open(
    url: &Url,
    storage: &HashMap<String, String>,
) -> Result<DeltaTable, ClassifiedError> {
    if let Ok(dir) = url.to_file_path()
        && url.scheme() == "file"
        && !dir.exists()
    {
        return Err(ClassifiedError::new(
            "DELTA_MISSING_DELTA_TABLE",
            "42P01",
            format!("There is no Delta table at {url}: the folder does not exist."),
        ));
    }
    let doing = format!("open the Delta table at {url}");
    let mut table = deltalake::DeltaTableBuilder::from_url(url.clone())
        .and_then(|b| b.with_storage_options(storage.clone()).build())
        .map_err(|e| error(e, &doing))?;
    // Loading a folder without a log fails (and logs an error): look first.
    if table
        .verify_deltatable_existence()
        .await
        .map_err(|e| error(e, &doing))?
        && let Err(e) = table.load().await
    {
        // delta-rs does not say which log file it could not read: find it.
        if let Some((file, problem)) = damaged_log_file(url, storage).await {
            return Err(ClassifiedError::new(
                "DELTA_LOG_CORRUPT",
                "KD001",
                format!(
                    "Cannot {doing}: the Delta log file '{file}' {problem} ({e}). Restore it \
                     from a backup; a query writing the table refuses to go on until then."
                ),
            ));
        }
        return Err(error(e, &doing));
    }
    Ok(table)
}

/// The first file of the table's `_delta_log` that does not hold one JSON object per line, and
/// what is wrong with it.
async fn damaged_log_file(
    url: &Url,
    storage: &HashMap<String, String>,
) -> Option<(String, String)> {
    let log = crate::Location::parse_with(url.as_str(), storage.clone())
        .ok()?
        .child("_delta_log");
    let mut names: Vec<String> = log
        .list_files("")
        .await
        .ok()?
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    // The commits' versions: contiguous, from 0 unless a checkpoint stands in for the first ones.
    let versions: Vec<u64> = names
        .iter()
        .filter_map(|n| n.strip_suffix(".json")?.parse().ok())
        .collect();
    let checkpointed = log
        .list_files("")
        .await
        .ok()?
        .iter()
        .any(|(n, _)| n.contains(".checkpoint"));
    let file_of = |v: u64| format!("{}/{v:020}.json", log.display());
    if let Some(&first) = versions.first()
        && first > 0
        && !checkpointed
    {
        return Some((file_of(0), "is missing (the log starts after it)".into()));
    }
    if let Some(w) = versions.windows(2).find(|w| w[1] != w[0] + 1) {
        return Some((
            file_of(w[0] + 1),
            format!(
                "is missing (the log goes from version {} to {})",
                w[0], w[1]
            ),
        ));
    }
    for name in names {
        let Ok(Some(bytes)) = log.get(&name).await else {
            continue;
        };
        let file = format!("{}/{name}", log.display());
        let Ok(text) = std::str::from_utf8(&bytes) else {
            return Some((file, "is not text".into()));
        };
        let mut actions = std::collections::BTreeSet::new();
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            match serde_json::from_str::<serde_json::Value>(line) {
                Ok(serde_json::Value::Object(o)) => actions.extend(o.keys().cloned()),
                _ => return Some((file, format!("has a damaged action at line {}", i + 1))),
            }
        }
        // The first commit creates the table: it must say what the table is.
        if name.starts_with(&format!("{:020}", 0))
            && !(actions.contains("metaData") && actions.contains("protocol"))
        {
            return Some((
                file,
                "has lost the table's metaData or protocol action (it was cut)".into(),
            ));
        }
    }
    None
}

/// A delta-rs error as a classified one; `doing` says what weir was doing ("write batch 3 to
/// the Delta table at ...").
pub fn error(e: DeltaTableError, doing: &str) -> ClassifiedError {
    let (class, sqlstate, hint) = match &e {
        DeltaTableError::NotATable(_) => (
            "DELTA_MISSING_DELTA_TABLE",
            "42P01",
            " Check the path; a Delta table has a _delta_log folder.",
        ),
        DeltaTableError::VersionAlreadyExists(_) | DeltaTableError::Transaction { .. } => (
            "DELTA_CONCURRENT_APPEND",
            "2D521",
            " Another writer committed to the table at the same time; make sure one query \
             writes to it, or restart to retry.",
        ),
        DeltaTableError::SchemaMismatch { .. } => (
            "DELTA_METADATA_MISMATCH",
            "42KDG",
            " The rows do not match the table's schema; write to a new table or set \
             mergeSchema 'true' to add new columns.",
        ),
        DeltaTableError::InvalidJsonLog { .. } | DeltaTableError::InvalidData { .. } => (
            "DELTA_LOG_CORRUPT",
            "KD001",
            " The table's _delta_log is damaged; restore it from a backup.",
        ),
        DeltaTableError::MissingFeature { .. } => (
            "DELTA_UNSUPPORTED_FEATURES_FOR_READ",
            "56038",
            " The table uses a Delta feature weir's client does not support.",
        ),
        DeltaTableError::ObjectStore { .. } | DeltaTableError::Io { .. } => (
            "DELTA_STORAGE_ERROR",
            "58030",
            " Check that the storage is reachable and its credentials (the AWS_* variables for \
             S3).",
        ),
        _ => ("DELTA_OPERATION_FAILED", "58030", ""),
    };
    ClassifiedError::new(class, sqlstate, format!("Cannot {doing}: {e}.{hint}"))
}
