//! Snapshots of a RocksDB store instance in the checkpoint, so that a rebuild does not need
//! every changelog since version 1 and old changelogs can be purged.
//!
//! ```text
//! <store dir>/<v>.snapshot        manifest: the files of the instance at version v (checksummed)
//! <store dir>/files/<instance>-<n>.sst        SST files, uploaded once and shared by snapshots
//! <store dir>/files/<v>-<instance>-<name>     the snapshot's MANIFEST, CURRENT and OPTIONS files
//! ```
//!
//! Taking one: flush and make a RocksDB checkpoint of the instance (hard links, so nothing is
//! copied locally) — [`stage`], before the instance changes again — then copy the files the
//! checkpoint does not have yet and write the manifest — [`upload`], which may run in the
//! background: until the manifest exists the snapshot does not. SST files are immutable and numbered per
//! instance, and every instance gets a fresh ID when it is created or restored, so an uploaded
//! name always means the same bytes.

use std::path::{Path, PathBuf};
use std::time::Instant;

use rocksdb::DB;
use rocksdb::checkpoint::Checkpoint;
use serde::{Deserialize, Serialize};

use super::{INSTANCE_KEY, META_CF, backend, checksum};
use crate::store::StoreId;
use crate::{Error, Result};

const MAGIC: &[u8] = b"WEIRSN1\n";
pub(super) const FILES: &str = "files";

/// One file of a snapshot: its name in the instance, its name in `files/`, its size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct SnapshotFile {
    pub(super) name: String,
    pub(super) stored: String,
    pub(super) size: u64,
}

/// What a snapshot holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Manifest {
    pub(super) version: u64,
    pub(super) files: Vec<SnapshotFile>,
}

/// Figures of one snapshot, for the progress record.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Uploaded {
    pub(super) files_copied: u64,
    pub(super) files_reused: u64,
    pub(super) bytes_copied: u64,
    pub(super) millis: u64,
}

pub(super) fn manifest_path(store_dir: &Path, version: u64) -> PathBuf {
    store_dir.join(format!("{version}.snapshot"))
}

fn encode(m: &Manifest) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend(serde_json::to_vec(m).unwrap_or_default());
    let sum = checksum(&out);
    out.extend(sum.to_le_bytes());
    out
}

fn decode(bytes: &[u8]) -> Option<Manifest> {
    let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(8)?)?;
    if checksum(body) != u64::from_le_bytes(sum.try_into().ok()?) {
        return None;
    }
    serde_json::from_slice(body.strip_prefix(MAGIC)?).ok()
}

/// Reads the manifest of the snapshot at `version`.
pub(super) fn read(store_dir: &Path, version: u64) -> Result<Manifest> {
    let path = manifest_path(store_dir, version);
    let bytes = std::fs::read(&path).map_err(|e| Error::Backend {
        store: store_dir.display().to_string(),
        message: format!("{}: {e}", path.display()),
    })?;
    decode(&bytes).ok_or_else(|| Error::Corrupt {
        file: path.display().to_string(),
        problem: crate::error::corrupt_problem(&bytes, b"WEIRSN", b'1'),
    })
}

/// The versions that have a snapshot, ascending.
pub(super) fn list(store_dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(store_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_suffix(".snapshot")?
                .parse()
                .ok()
        })
        .collect();
    v.sort_unstable();
    v
}

fn instance(db: &DB, id: &StoreId) -> Result<String> {
    let cf = db
        .cf_handle(META_CF)
        .ok_or_else(|| backend(id, "the meta column family is missing"))?;
    let v = db
        .get_cf(cf, INSTANCE_KEY)
        .map_err(|e| backend(id, e))?
        .ok_or_else(|| backend(id, "the local instance has no ID"))?;
    String::from_utf8(v).map_err(|_| backend(id, "the local instance's ID is damaged"))
}

/// Copies `from` to `to` through a temporary name, so `to` is whole or absent.
fn copy_whole(from: &Path, to: &Path) -> std::io::Result<u64> {
    let tmp = to.with_file_name(format!(
        ".{}.tmp",
        to.file_name().unwrap_or_default().to_string_lossy()
    ));
    let n = std::fs::copy(from, &tmp)?;
    std::fs::rename(&tmp, to)?;
    Ok(n)
}

/// A snapshot made locally (hard links of the instance's files at one version), not uploaded.
#[derive(Debug)]
pub(super) struct Staged {
    version: u64,
    dir: PathBuf,
    instance: String,
    started: Instant,
}

/// Fixes the instance `db` (at `version`, files in `db_path`) as a local RocksDB checkpoint: the
/// part of a snapshot that must happen before the instance changes again.
pub(super) fn stage(db: &DB, id: &StoreId, db_path: &Path, version: u64) -> Result<Staged> {
    let started = Instant::now();
    db.flush().map_err(|e| backend(id, e))?;
    let dir = db_path.with_extension(format!("snapshot-{version}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| backend(id, e))?;
    }
    Checkpoint::new(db)
        .and_then(|c| c.create_checkpoint(&dir))
        .map_err(|e| backend(id, e))?;
    Ok(Staged {
        version,
        dir,
        instance: instance(db, id)?,
        started,
    })
}

/// Copies a staged snapshot's new files into `store_dir` and writes its manifest (last: until
/// then the snapshot does not exist); removes the local staging.
pub(super) fn upload(staged: Staged, id: &StoreId, store_dir: &Path) -> Result<Uploaded> {
    let io = |e: std::io::Error| backend(id, e);
    let Staged {
        version,
        dir: staging,
        instance,
        started,
    } = staged;
    let files_dir = store_dir.join(FILES);
    std::fs::create_dir_all(&files_dir).map_err(io)?;
    let mut up = Uploaded::default();
    let mut files = vec![];
    for entry in std::fs::read_dir(&staging).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().to_string();
        let size = entry.metadata().map_err(io)?.len();
        let sst = name.ends_with(".sst");
        let stored = if sst {
            format!("{instance}-{name}")
        } else {
            format!("{version}-{instance}-{name}")
        };
        let target = files_dir.join(&stored);
        if sst && target.exists() {
            up.files_reused += 1;
        } else {
            up.bytes_copied += copy_whole(&entry.path(), &target).map_err(io)?;
            up.files_copied += 1;
        }
        files.push(SnapshotFile { name, stored, size });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    let manifest = encode(&Manifest { version, files });
    let path = manifest_path(store_dir, version);
    let tmp = store_dir.join(format!(".{version}.snapshot.tmp"));
    std::fs::write(&tmp, manifest).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    std::fs::remove_dir_all(&staging).map_err(io)?;
    up.millis = started.elapsed().as_millis() as u64;
    Ok(up)
}

/// Puts the files of snapshot `manifest` into the empty directory `db_path`.
pub(super) fn restore(store_dir: &Path, manifest: &Manifest, db_path: &Path) -> Result<()> {
    let io = |e: std::io::Error| Error::Backend {
        store: store_dir.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(db_path).map_err(io)?;
    for f in &manifest.files {
        let from = store_dir.join(FILES).join(&f.stored);
        let n = std::fs::copy(&from, db_path.join(&f.name)).map_err(|e| Error::Backend {
            store: store_dir.display().to_string(),
            message: format!(
                "snapshot {} needs {}: {e}",
                manifest.version,
                from.display()
            ),
        })?;
        if n != f.size {
            return Err(Error::Corrupt {
                file: from.display().to_string(),
                problem: format!("has {n} bytes where the snapshot recorded {}", f.size),
            });
        }
    }
    Ok(())
}

/// Removes what versions at or above `version` need neither from the newest snapshot at or
/// below it nor from the one before (the fallback when the newest is damaged): older snapshots,
/// the changelogs they cover, and files no remaining snapshot lists. Until there are two such
/// snapshots, the changelogs from version 1 are the fallback and stay. Returns the snapshot
/// kept as the oldest base, if any.
pub(super) fn purge(store_dir: &Path, version: u64) -> std::io::Result<Option<u64>> {
    let snapshots = list(store_dir);
    let Some(&base) = snapshots.iter().rev().filter(|&&s| s <= version).nth(1) else {
        return Ok(None);
    };
    let remove = |p: PathBuf| match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    };
    for entry in std::fs::read_dir(store_dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(v) = name
            .strip_suffix(".changelog")
            .and_then(|v| v.parse::<u64>().ok())
            && v <= base
        {
            remove(entry.path())?;
        }
    }
    for s in snapshots.iter().filter(|&&s| s < base) {
        remove(manifest_path(store_dir, *s))?;
    }
    let mut referenced = std::collections::HashSet::new();
    for s in snapshots.iter().filter(|&&s| s >= base) {
        if let Ok(m) = read(store_dir, *s) {
            referenced.extend(m.files.into_iter().map(|f| f.stored));
        } else {
            // A damaged manifest: keep every file rather than guess.
            return Ok(Some(base));
        }
    }
    for entry in std::fs::read_dir(store_dir.join(FILES))?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.starts_with('.') && !referenced.contains(&name) {
            remove(entry.path())?;
        }
    }
    Ok(Some(base))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_round_trip_and_damage_is_detected() {
        let m = Manifest {
            version: 10,
            files: vec![SnapshotFile {
                name: "000012.sst".into(),
                stored: "abc-000012.sst".into(),
                size: 1234,
            }],
        };
        let bytes = encode(&m);
        assert_eq!(decode(&bytes), Some(m));
        let mut flipped = bytes.clone();
        flipped[12] ^= 1;
        assert_eq!(decode(&flipped), None);
        assert_eq!(decode(&bytes[..bytes.len() - 3]), None);
    }
}
