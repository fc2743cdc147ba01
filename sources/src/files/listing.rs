//! Finding a file source's files: the directory (or glob) and the filters of its options, on
//! the local filesystem or S3 through `object_store`.

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use serde::{Deserialize, Serialize};
use weir_common::{ClassifiedError, Location};

use super::FileSourceOptions;
use crate::{Error, Result};

/// One file of a file source: its path relative to the source's directory, its size and its
/// modification time (epoch ms). Also the line format of the source's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMeta {
    pub path: String,
    pub size: u64,
    pub timestamp: i64,
}

/// A glob pattern with `{a,b}` alternatives, as Hadoop's globs.
#[derive(Debug, Clone)]
struct Glob(Vec<glob::Pattern>);

impl Glob {
    fn new(text: &str, option: &str) -> Result<Self> {
        expand_braces(text)
            .iter()
            .map(|p| glob::Pattern::new(p))
            .collect::<Result<Vec<_>, _>>()
            .map(Glob)
            .map_err(|e| {
                Error::User(ClassifiedError::invalid_option(format!(
                    "The {option} '{text}' is not a valid glob: {e}."
                )))
            })
    }

    fn matches(&self, s: &str) -> bool {
        self.0.iter().any(|p| p.matches(s))
    }
}

/// `a{b,c}d{e,f}` → `abde`, `abdf`, `acde`, `acdf`.
fn expand_braces(s: &str) -> Vec<String> {
    let Some(open) = s.find('{') else {
        return vec![s.to_string()];
    };
    let Some(close) = s[open..].find('}').map(|c| open + c) else {
        return vec![s.to_string()];
    };
    let (head, alts, tail) = (&s[..open], &s[open + 1..close], &s[close + 1..]);
    alts.split(',')
        .flat_map(|alt| expand_braces(&format!("{head}{alt}{tail}")))
        .collect()
}

fn is_glob(component: &str) -> bool {
    component.contains(['*', '?', '[', '{'])
}

/// The files of a file source.
#[derive(Debug)]
pub struct Listing {
    root: Location,
    /// Glob components of the path below `root`.
    pattern: Vec<Glob>,
    name_filter: Option<Glob>,
    recursive: bool,
    modified_after_ms: Option<i64>,
    modified_before_ms: Option<i64>,
}

impl Listing {
    pub fn new(o: &FileSourceOptions) -> Result<Self> {
        // The directory part of the path is everything before its first glob component.
        let (scheme_root, rest) = match o.path.split_once("://") {
            Some((scheme, rest)) => {
                let (bucket, rest) = rest.split_once('/').unwrap_or((rest, ""));
                (format!("{scheme}://{bucket}/"), rest.to_string())
            }
            None if o.path.starts_with('/') => ("/".to_string(), o.path[1..].to_string()),
            None => (String::new(), o.path.clone()),
        };
        let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
        let first_glob = parts.iter().position(|p| is_glob(p)).unwrap_or(parts.len());
        let dir = format!("{scheme_root}{}", parts[..first_glob].join("/"));
        let dir = if dir.is_empty() { ".".to_string() } else { dir };
        let pattern = parts[first_glob..]
            .iter()
            .map(|p| Glob::new(p, "path"))
            .collect::<Result<_>>()?;
        Ok(Self {
            root: Location::parse_existing_with(&dir, o.storage.clone())?,
            pattern,
            name_filter: o
                .path_glob_filter
                .as_deref()
                .map(|g| Glob::new(g, "pathGlobFilter"))
                .transpose()?,
            recursive: o.recursive,
            modified_after_ms: o.modified_after_ms,
            modified_before_ms: o.modified_before_ms,
        })
    }

    pub fn display(&self) -> &str {
        self.root.display()
    }

    /// Whether the file at the relative path `parts` belongs to the source.
    fn wanted(&self, parts: &[&str]) -> bool {
        let Some((name, dirs)) = parts.split_last() else {
            return false;
        };
        // Hidden and marker files (`.x`, `_SUCCESS`, `_weir_metadata/...`), as Spark.
        if parts
            .iter()
            .any(|p| p.starts_with('.') || p.starts_with('_'))
        {
            return false;
        }
        let k = self.pattern.len();
        let placed = if parts.len() == k {
            // The pattern names the file itself.
            true
        } else {
            // A file in a directory the pattern names (or below it, recursively).
            dirs.len() >= k && (self.recursive || dirs.len() == k)
        };
        placed
            && self.pattern.iter().zip(parts).all(|(g, p)| g.matches(p))
            && self.name_filter.as_ref().is_none_or(|g| g.matches(name))
    }

    /// Every file of the source now present, in no particular order.
    pub async fn list(&self) -> Result<Vec<FileMeta>> {
        let prefix = self.root.path("");
        let skip = prefix.parts().count();
        let listed: Vec<_> = match self.root.store().list(Some(&prefix)).try_collect().await {
            Ok(l) => l,
            Err(object_store::Error::NotFound { .. }) => vec![],
            Err(e) => return Err(cannot_list(self.root.display(), e)),
        };
        Ok(listed
            .into_iter()
            .filter_map(|m| {
                let parts: Vec<String> = m
                    .location
                    .parts()
                    .skip(skip)
                    .map(|p| p.as_ref().to_string())
                    .collect();
                let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
                let timestamp = m.last_modified.timestamp_millis();
                (self.wanted(&refs)
                    && self.modified_after_ms.is_none_or(|t| timestamp > t)
                    && self.modified_before_ms.is_none_or(|t| timestamp < t))
                .then(|| FileMeta {
                    path: parts.join("/"),
                    size: m.size,
                    timestamp,
                })
            })
            .collect())
    }

    fn object(&self, f: &FileMeta) -> Path {
        self.root.path(&f.path)
    }

    /// The content of `f`.
    pub async fn get(&self, f: &FileMeta) -> Result<Bytes> {
        let read = async { self.root.store().get(&self.object(f)).await?.bytes().await };
        read.await.map_err(|e| {
            Error::User(ClassifiedError::new(
                "FAILED_READ_FILE",
                "KD001",
                format!(
                    "Cannot read the file '{}/{}', which the source's log lists: {e}. If it was \
                     removed after it was listed, restore it, or reset the source.",
                    self.root.display(),
                    f.path
                ),
            ))
        })
    }

    /// cleanSource: deletes `f`, or moves it into `archive` at the same relative path. A file
    /// that is already gone is skipped.
    pub async fn clean(&self, f: &FileMeta, archive: Option<&Location>) -> Result<()> {
        let from = self.object(f);
        let result = match (
            archive,
            self.root.local_dir(),
            archive.and_then(Location::local_dir),
        ) {
            (None, ..) => self.root.store().delete(&from).await,
            // Both on the local disk: a rename, not a copy.
            (Some(_), Some(src), Some(dst)) => {
                let (src, dst) = (src.join(&f.path), dst.join(&f.path));
                let moved = async {
                    if let Some(parent) = dst.parent() {
                        tokio::fs::create_dir_all(parent).await?;
                    }
                    tokio::fs::rename(&src, &dst).await
                };
                match moved.await {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(object_store::Error::Generic {
                        store: "LocalFileSystem",
                        source: Box::new(e),
                    }),
                }
            }
            (Some(dir), ..) => match self.root.store().get(&from).await {
                Ok(r) => {
                    let bytes = r.bytes().await?;
                    dir.put(&f.path, bytes).await?;
                    self.root.store().delete(&from).await
                }
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::User(ClassifiedError::new(
                "CANNOT_CLEAN_SOURCE_FILE",
                "58030",
                format!(
                    "cleanSource could not {} '{}/{}': {e}. The file was read and committed; \
                     check the permissions of the source and archive directories.",
                    if archive.is_some() {
                        "archive"
                    } else {
                        "delete"
                    },
                    self.root.display(),
                    f.path
                ),
            ))),
        }
    }
}

fn cannot_list(dir: &str, e: object_store::Error) -> Error {
    Error::User(ClassifiedError::new(
        "CANNOT_ACCESS_PATH",
        "58030",
        format!("Cannot list the file source's directory '{dir}': {e}."),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_expand_to_every_alternative() {
        assert_eq!(
            expand_braces("a{b,c}d{e,f}"),
            vec!["abde", "abdf", "acde", "acdf"]
        );
        let g = Glob::new("*.{json,jsonl}", "pathGlobFilter").unwrap();
        assert!(g.matches("x.json") && g.matches("y.jsonl") && !g.matches("z.csv"));
    }
}
