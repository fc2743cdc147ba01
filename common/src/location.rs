//! Storage locations for checkpoints and file sinks: a directory on an `object_store`, with the
//! few operations weir's logs need (create-only put, put, get, list, delete).
//!
//! Local paths (and `file://` URLs) use the local filesystem; `s3://bucket/prefix` uses S3 (or
//! an S3-compatible server), configured from the usual `AWS_*` environment variables
//! (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_ALLOW_HTTP`, ...), with create-only writes made by S3 conditional puts (`If-None-Match`),
//! so the write-ahead log's fence holds there too. Other schemes are refused.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::ClassifiedError;

/// A directory on an object store.
#[derive(Debug, Clone)]
pub struct Location {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    local_dir: Option<PathBuf>,
    display: String,
}

/// Outcome of a create-only write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// The object did not exist and now holds the payload.
    Yes,
    /// An object already existed there; nothing was written.
    AlreadyExisted,
}

impl Location {
    /// Resolves `location`: a local path (relative paths are taken from the current directory),
    /// a `file://` URL, or an `s3://bucket/prefix` URL. A local directory is created if it does
    /// not exist.
    pub fn parse(location: &str) -> Result<Self, ClassifiedError> {
        Self::parse_with(location, std::iter::empty::<(&str, &str)>())
    }

    /// Like [`Location::parse`], with client options for object stores, which take precedence
    /// over the environment: for S3, object_store's `AmazonS3ConfigKey` names
    /// (`aws_endpoint_url`, `aws_region`, `aws_access_key_id`, `aws_secret_access_key`,
    /// `aws_allow_http`, ...). An unknown option is an error naming it.
    pub fn parse_with<K: AsRef<str>, V: Into<String>>(
        location: &str,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, ClassifiedError> {
        let trimmed = location.trim();
        if trimmed.is_empty() {
            return Err(ClassifiedError::new(
                "INVALID_EMPTY_LOCATION",
                "42K05",
                "An empty path was given; name a directory.",
            ));
        }
        let path = if let Some(rest) = trimmed.strip_prefix("file://") {
            PathBuf::from(rest)
        } else if let Some(rest) = trimmed.strip_prefix("s3://") {
            return Self::s3(trimmed, rest, options);
        } else if let Some((scheme, _)) = trimmed.split_once("://") {
            return Err(ClassifiedError::new(
                "UNSUPPORTED_STORAGE_SCHEME",
                "0A000",
                format!(
                    "The storage scheme '{scheme}://' of '{trimmed}' is not supported; use a \
                     local path, a file:// URL or an s3:// URL."
                ),
            ));
        } else {
            PathBuf::from(trimmed)
        };
        Self::local(&path)
    }

    /// Like [`Location::parse_with`] for a directory that is only read: a local directory is
    /// not created (listing a missing one finds nothing).
    pub fn parse_existing_with<K: AsRef<str>, V: Into<String>>(
        location: &str,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, ClassifiedError> {
        let trimmed = location.trim();
        let local = match trimmed.strip_prefix("file://") {
            Some(rest) => rest,
            None if trimmed.contains("://") || trimmed.is_empty() => {
                return Self::parse_with(location, options);
            }
            None => trimmed,
        };
        let abs = std::path::absolute(local).map_err(|e| {
            ClassifiedError::new(
                "CANNOT_ACCESS_PATH",
                "58030",
                format!("Cannot resolve the path '{local}': {e}."),
            )
        })?;
        if abs.exists() && !abs.is_dir() {
            return Err(ClassifiedError::new(
                "PATH_NOT_A_DIRECTORY",
                "42K0F",
                format!("'{}' exists and is not a directory.", abs.display()),
            ));
        }
        let prefix = Path::from_absolute_path(&abs).map_err(|e| {
            ClassifiedError::new(
                "CANNOT_ACCESS_PATH",
                "58030",
                format!("Cannot use the path '{}': {e}.", abs.display()),
            )
        })?;
        Ok(Self {
            store: Arc::new(LocalFileSystem::new()),
            prefix,
            display: abs.display().to_string(),
            local_dir: Some(abs),
        })
    }

    /// `s3://<rest>`: a bucket and a prefix in it, the client configured from the environment
    /// and `options`.
    fn s3<K: AsRef<str>, V: Into<String>>(
        url: &str,
        rest: &str,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, ClassifiedError> {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(ClassifiedError::new(
                "INVALID_STORAGE_LOCATION",
                "42K05",
                format!("'{url}' names no bucket; write s3://<bucket>/<path>."),
            ));
        }
        let mut builder = object_store::aws::AmazonS3Builder::from_env();
        for (key, value) in options {
            let key = key.as_ref();
            let parsed = key.to_ascii_lowercase().parse().map_err(|_| {
                ClassifiedError::new(
                    "INVALID_STORAGE_OPTION",
                    "42K06",
                    format!(
                        "'{key}' is not an S3 client option. Use object_store's names, e.g. \
                         aws_endpoint_url, aws_region, aws_access_key_id, \
                         aws_secret_access_key, aws_allow_http."
                    ),
                )
            })?;
            builder = builder.with_config(parsed, value);
        }
        let store = builder
            .with_bucket_name(bucket)
            // Create-only puts as S3 conditional writes (`If-None-Match: *`).
            .with_conditional_put(object_store::aws::S3ConditionalPut::ETagMatch)
            .build()
            .map_err(|e| {
                ClassifiedError::new(
                    "CANNOT_ACCESS_PATH",
                    "58030",
                    format!(
                        "Cannot set up the S3 client for '{url}': {e}. Check the AWS_* \
                         environment variables (AWS_ENDPOINT_URL, AWS_REGION, credentials)."
                    ),
                )
            })?;
        let prefix = Path::from_iter(prefix.split('/').filter(|p| !p.is_empty()));
        Ok(Self {
            store: Arc::new(store),
            prefix,
            local_dir: None,
            display: url.trim_end_matches('/').to_string(),
        })
    }

    /// A directory on the local filesystem, created if missing.
    pub fn local(dir: &FsPath) -> Result<Self, ClassifiedError> {
        let cannot = |e: &dyn std::fmt::Display| {
            ClassifiedError::new(
                "CANNOT_ACCESS_PATH",
                "58030",
                format!(
                    "Cannot create or open the directory '{}': {e}. Check that the path is \
                     writable, or choose another one.",
                    dir.display()
                ),
            )
        };
        let abs = std::path::absolute(dir).map_err(|e| cannot(&e))?;
        if abs.exists() && !abs.is_dir() {
            return Err(ClassifiedError::new(
                "PATH_NOT_A_DIRECTORY",
                "42K0F",
                format!("'{}' exists and is not a directory.", abs.display()),
            ));
        }
        std::fs::create_dir_all(&abs).map_err(|e| cannot(&e))?;
        let store = LocalFileSystem::new_with_prefix(&abs).map_err(|e| cannot(&e))?;
        Ok(Self {
            store: Arc::new(store),
            prefix: Path::default(),
            display: abs.display().to_string(),
            local_dir: Some(abs),
        })
    }

    /// The location as the user should see it in messages.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// The directory on the local filesystem, if this location is local.
    pub fn local_dir(&self) -> Option<&FsPath> {
        self.local_dir.as_deref()
    }

    /// The object store behind this location.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The object path of `rel` (a `/`-separated path relative to this directory).
    pub fn path(&self, rel: &str) -> Path {
        rel.split('/')
            .filter(|p| !p.is_empty())
            .fold(self.prefix.clone(), |p, part| p.clone().join(part))
    }

    /// A sub-directory of this location.
    pub fn child(&self, rel: &str) -> Self {
        Self {
            store: Arc::clone(&self.store),
            prefix: self.path(rel),
            local_dir: self.local_dir.as_ref().map(|d| d.join(rel)),
            display: format!("{}/{rel}", self.display),
        }
    }

    /// Writes `bytes` at `rel` only if nothing is there: the fence of every weir log.
    pub async fn put_if_absent(&self, rel: &str, bytes: Bytes) -> object_store::Result<Created> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&self.path(rel), PutPayload::from(bytes), opts)
            .await
        {
            Ok(_) => Ok(Created::Yes),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Created::AlreadyExisted),
            Err(e) => Err(e),
        }
    }

    /// Writes `bytes` at `rel` atomically, replacing what was there.
    pub async fn put(&self, rel: &str, bytes: Bytes) -> object_store::Result<()> {
        self.store
            .put(&self.path(rel), PutPayload::from(bytes))
            .await
            .map(|_| ())
    }

    /// The whole object at `rel`, or `None` if there is none.
    pub async fn get(&self, rel: &str) -> object_store::Result<Option<Bytes>> {
        match self.store.get(&self.path(rel)).await {
            Ok(r) => r.bytes().await.map(Some),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether an object exists at `rel`.
    pub async fn exists(&self, rel: &str) -> object_store::Result<bool> {
        match self.store.head(&self.path(rel)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Names (relative to `rel_dir`) and sizes of the objects directly inside `rel_dir`.
    pub async fn list_files(&self, rel_dir: &str) -> object_store::Result<Vec<(String, u64)>> {
        let dir = self.path(rel_dir);
        let listing = self.store.list_with_delimiter(Some(&dir)).await?;
        Ok(listing
            .objects
            .into_iter()
            .filter_map(|m| {
                let name = m.location.filename()?.to_string();
                Some((name, m.size))
            })
            .collect())
    }

    /// Every object under this location, as paths relative to it.
    pub async fn list_all(&self) -> object_store::Result<Vec<String>> {
        Ok(self
            .list_all_sized()
            .await?
            .into_iter()
            .map(|(rel, _)| rel)
            .collect())
    }

    /// Every object under this location, as (path relative to it, size in bytes).
    pub async fn list_all_sized(&self) -> object_store::Result<Vec<(String, u64)>> {
        let metas: Vec<_> = self.store.list(Some(&self.prefix)).try_collect().await?;
        let prefix_parts = self.prefix.parts().count();
        Ok(metas
            .into_iter()
            .map(|m| {
                let rel = m
                    .location
                    .parts()
                    .skip(prefix_parts)
                    .map(|p| p.as_ref().to_string())
                    .collect::<Vec<_>>()
                    .join("/");
                (rel, m.size)
            })
            .collect())
    }

    /// Deletes everything under this location (a local folder with its sub-folders; the
    /// location itself stays).
    pub async fn delete_all(&self) -> object_store::Result<()> {
        if let Some(dir) = &self.local_dir {
            let entries = match std::fs::read_dir(dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(io_error(dir, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| io_error(dir, e))?;
                let path = entry.path();
                let removed = if entry.file_type().map_err(|e| io_error(&path, e))?.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                match removed {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_error(&path, e)),
                }
            }
            return Ok(());
        }
        for rel in self.list_all().await? {
            self.delete(&rel).await?;
        }
        Ok(())
    }

    /// Deletes the object at `rel`; a missing object is not an error.
    pub async fn delete(&self, rel: &str) -> object_store::Result<()> {
        match self.store.delete(&self.path(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn io_error(path: &FsPath, e: std::io::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: "LocalFileSystem",
        source: format!("{}: {e}", path.display()).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn create_only_put_never_replaces_an_existing_object() {
        let dir = tempfile::tempdir().unwrap();
        let loc = Location::local(dir.path()).unwrap();
        assert_eq!(
            loc.put_if_absent("offsets/0", Bytes::from_static(b"a"))
                .await
                .unwrap(),
            Created::Yes
        );
        assert_eq!(
            loc.put_if_absent("offsets/0", Bytes::from_static(b"b"))
                .await
                .unwrap(),
            Created::AlreadyExisted
        );
        assert_eq!(
            loc.get("offsets/0").await.unwrap().unwrap(),
            Bytes::from_static(b"a")
        );
        assert_eq!(
            loc.list_files("offsets").await.unwrap(),
            vec![("0".to_string(), 1)]
        );
        assert_eq!(loc.get("offsets/1").await.unwrap(), None);
    }

    #[test]
    fn a_remote_scheme_is_refused_with_a_class() {
        let err = Location::parse("hdfs://nn/x").unwrap_err();
        assert_eq!(err.class, "UNSUPPORTED_STORAGE_SCHEME");
    }
}
