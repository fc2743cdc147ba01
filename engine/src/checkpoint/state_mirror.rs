//! State on an object store: the RocksDB provider writes its changelogs and snapshots to a
//! local folder, and this mirror keeps the checkpoint's `state/` on the object store equal to it.
//!
//! ```text
//! start:         download <checkpoint>/state/** (but _metadata) into <temp>/weir-mirror-<query>-<run>
//! before commit: upload what is new or changed locally (snapshot manifests last, so a manifest
//!                never names a file the store lacks), then delete what the provider purged
//! ```
//!
//! Sync runs before each `commits/<batch>` entry is written, so a committed batch's state
//! (changelog, and any finished snapshot) is on the object store first: the same order as on a
//! local disk. Every file the provider writes appears whole (written under a `.` name, then
//! renamed), and `.` names are never uploaded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use weir_common::Location;

use crate::error::{Error, Result};

/// The state metadata file, written by the checkpoint itself, not by the provider.
const OWN_FILES: &[&str] = &["_metadata"];
/// How many files move at once.
const PARALLEL: usize = 8;

/// What the object store holds of one local file: its size and modification time when copied.
type Seen = (u64, SystemTime);

/// Keeps `<checkpoint>/state/` on an object store equal to a local folder.
#[derive(Debug)]
pub(crate) struct StateMirror {
    remote: Location,
    local: PathBuf,
    known: Mutex<BTreeMap<String, Seen>>,
}

fn storage(e: impl std::fmt::Display, what: &str) -> Error {
    Error::user(
        "CANNOT_ACCESS_CHECKPOINT",
        "58030",
        format!(
            "Cannot {what} the state in the checkpoint: {e}. Check that the storage is reachable."
        ),
    )
}

/// Every file under `dir` not named with a leading `.`, as (path relative to `dir`, size, mtime).
fn walk(dir: &Path) -> std::io::Result<Vec<(String, u64, SystemTime)>> {
    let mut out = vec![];
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            // Purged while we looked.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let meta = match entry.metadata() {
                Ok(m) => m,
                // Purged while we looked.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let path = entry.path();
            if meta.is_dir() {
                todo.push(path);
            } else if let Ok(rel) = path.strip_prefix(dir) {
                let rel = rel.to_string_lossy().replace('\\', "/");
                if OWN_FILES.contains(&rel.as_str()) {
                    continue;
                }
                let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                out.push((rel, meta.len(), modified));
            }
        }
    }
    Ok(out)
}

impl StateMirror {
    /// Downloads `remote` (the checkpoint's `state/`) into `local`, a new folder.
    pub(crate) async fn download(remote: Location, local: PathBuf) -> Result<Self> {
        std::fs::create_dir_all(&local).map_err(|e| storage(e, "prepare a local copy of"))?;
        let names = remote
            .list_all()
            .await
            .map_err(|e| storage(e, "list"))?
            .into_iter()
            .filter(|n| !OWN_FILES.contains(&n.as_str()))
            .collect::<Vec<_>>();
        let fetched: Vec<(String, Seen)> = futures::stream::iter(names.into_iter().map(|name| {
            let (remote, local) = (remote.clone(), local.clone());
            async move {
                let bytes = remote
                    .get(&name)
                    .await
                    .map_err(|e| storage(e, "download"))?
                    .ok_or_else(|| storage(format!("{name} vanished"), "download"))?;
                let path = local.join(&name);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| storage(e, "copy"))?;
                }
                std::fs::write(&path, &bytes).map_err(|e| storage(e, "copy"))?;
                let meta = std::fs::metadata(&path).map_err(|e| storage(e, "copy"))?;
                Ok::<_, Error>((
                    name,
                    (
                        meta.len(),
                        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    ),
                ))
            }
        }))
        .buffer_unordered(PARALLEL)
        .try_collect()
        .await?;
        Ok(Self {
            remote,
            local,
            known: Mutex::new(fetched.into_iter().collect()),
        })
    }

    /// The local folder the provider writes to.
    pub(crate) fn local(&self) -> &Path {
        &self.local
    }

    fn known(&self) -> BTreeMap<String, Seen> {
        self.known.lock().map(|k| k.clone()).unwrap_or_default()
    }

    /// Makes the object store hold what the local folder holds.
    pub(crate) async fn sync(&self) -> Result<()> {
        // Manifests from a first look, other files from a second: every file a manifest names
        // was there before the manifest, so the second look sees it.
        let first = walk(&self.local).map_err(|e| storage(e, "read the local copy of"))?;
        let second = walk(&self.local).map_err(|e| storage(e, "read the local copy of"))?;
        let is_manifest = |rel: &str| rel.ends_with(".snapshot");
        let known = self.known();
        let changed = |files: Vec<(String, u64, SystemTime)>, manifests: bool| {
            files
                .into_iter()
                .filter(|(rel, ..)| is_manifest(rel) == manifests)
                .filter(|(rel, size, modified)| known.get(rel) != Some(&(*size, *modified)))
                .collect::<Vec<_>>()
        };
        let present: std::collections::BTreeSet<String> = first
            .iter()
            .chain(second.iter())
            .map(|(rel, ..)| rel.clone())
            .collect();
        let data = changed(second, false);
        let manifests = changed(first, true);
        for round in [data, manifests] {
            let uploaded: Vec<Option<(String, Seen)>> =
                futures::stream::iter(round.into_iter().map(|(rel, size, modified)| {
                    let (remote, local) = (self.remote.clone(), self.local.clone());
                    async move {
                        let bytes = match std::fs::read(local.join(&rel)) {
                            Ok(b) => b,
                            // Purged since the look: nothing to upload.
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                            Err(e) => return Err(storage(e, "read the local copy of")),
                        };
                        remote
                            .put(&rel, Bytes::from(bytes))
                            .await
                            .map_err(|e| storage(e, "upload"))?;
                        Ok::<_, Error>(Some((rel, (size, modified))))
                    }
                }))
                .buffer_unordered(PARALLEL)
                .try_collect()
                .await?;
            if let Ok(mut k) = self.known.lock() {
                k.extend(uploaded.into_iter().flatten());
            }
        }
        let gone: Vec<String> = known
            .keys()
            .filter(|rel| !present.contains(*rel))
            .cloned()
            .collect();
        // Purged manifests first: a manifest must never outlive a file it names.
        let (gone_manifests, gone_files): (Vec<String>, Vec<String>) =
            gone.iter().cloned().partition(|rel| is_manifest(rel));
        for round in [gone_manifests, gone_files] {
            futures::stream::iter(round.into_iter().map(|rel| {
                let remote = self.remote.clone();
                async move {
                    remote
                        .delete(&rel)
                        .await
                        .map_err(|e| storage(e, "remove purged files of"))
                }
            }))
            .buffer_unordered(PARALLEL)
            .try_collect::<Vec<()>>()
            .await?;
        }
        if let Ok(mut k) = self.known.lock() {
            for rel in &gone {
                k.remove(rel);
            }
        }
        Ok(())
    }
}
