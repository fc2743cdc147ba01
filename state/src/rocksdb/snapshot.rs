//! Snapshots of a RocksDB store instance in the checkpoint, so that a rebuild does not need
//! every changelog since version 1 and old changelogs can be purged.
//!
//! ```text
//! <store dir>/<v>.snapshot        an image: every live key and value of the instance at version
//!                                 v, in key order, zstd-compressed, with a CRC-32
//! <store dir>/files/...           SST files of version-1 snapshots (read, no longer written)
//! ```
//!
//! Taking one: flush and make a RocksDB checkpoint of the instance (hard links, so nothing is
//! copied locally) — [`stage`], before the instance changes again — then read that checkpoint
//! and write its image — [`upload`], which may run in the background: the image is written
//! under a temporary name and renamed, so until it is whole the snapshot does not exist.
//! Restoring one writes the image into an SST file that a fresh instance ingests ([`load_image`]).
//!
//! An image holds only what is live: rows the watermark evicted, overwritten values and
//! RocksDB's tombstones, which an instance's SST files keep until compaction, are not in it; and
//! compressed as one stream it is several times smaller than SST files compressed block by
//! block (issue 21: 8 MB of LZ4 SST files against under 1 MB of image for a join side of 200,000
//! rows).

use std::path::{Path, PathBuf};
use std::time::Instant;

use rocksdb::checkpoint::Checkpoint;
use rocksdb::{DB, Options};
use serde::{Deserialize, Serialize};

use super::{APPLIED_KEY, META_CF, NUM_KEYS_KEY, VERSION_KEY, backend, checksum};
use crate::store::StoreId;
use crate::{Error, Result};

/// Version-1 snapshots: a manifest of SST files in `files/`.
const MAGIC: &[u8] = b"WEIRSN1\n";
/// Version-2 snapshots: an image (see the module's documentation).
const IMAGE_MAGIC: &[u8] = b"WEIRSN2\n";
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

#[cfg(test)]
pub(super) fn encode(m: &Manifest) -> Vec<u8> {
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

/// A snapshot as the checkpoint holds it.
#[derive(Debug)]
pub(super) enum Snapshot {
    /// Version 1: SST files in `files/`.
    Files(Manifest),
    /// Version 2: the image's bytes, their CRC checked.
    Image(Vec<u8>),
}

impl Snapshot {
    /// The files of `files/` the snapshot needs.
    fn files(&self) -> impl Iterator<Item = &str> {
        let files = match self {
            Snapshot::Files(m) => m.files.as_slice(),
            Snapshot::Image(_) => &[],
        };
        files.iter().map(|f| f.stored.as_str())
    }
}

/// Reads the snapshot at `version`, checking its checksum.
pub(super) fn read(store_dir: &Path, version: u64) -> Result<Snapshot> {
    let path = manifest_path(store_dir, version);
    let bytes = std::fs::read(&path).map_err(|e| Error::Backend {
        store: store_dir.display().to_string(),
        message: format!("{}: {e}", path.display()),
    })?;
    let damaged = |bytes: &[u8]| Error::Corrupt {
        file: path.display().to_string(),
        problem: crate::error::corrupt_problem(bytes, b"WEIRSN", b'2'),
    };
    if bytes.starts_with(IMAGE_MAGIC) {
        let whole = bytes
            .split_at_checked(bytes.len().saturating_sub(4))
            .filter(|&(body, sum)| {
                body.len() >= IMAGE_MAGIC.len()
                    && <[u8; 4]>::try_from(sum)
                        .is_ok_and(|s| crc32fast::hash(body) == u32::from_le_bytes(s))
            })
            .is_some();
        return if whole {
            Ok(Snapshot::Image(bytes))
        } else {
            Err(damaged(&bytes))
        };
    }
    decode(&bytes)
        .map(Snapshot::Files)
        .ok_or_else(|| damaged(&bytes))
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

/// A snapshot made locally (hard links of the instance's files at one version), not uploaded.
#[derive(Debug)]
pub(super) struct Staged {
    version: u64,
    dir: PathBuf,
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
        started,
    })
}

/// Writes the image of a staged snapshot into `store_dir` (whole, through a temporary name:
/// until then the snapshot does not exist) and removes the local staging.
pub(super) fn upload(staged: Staged, id: &StoreId, store_dir: &Path) -> Result<Uploaded> {
    let io = |e: std::io::Error| backend(id, e);
    let Staged {
        version,
        dir: staging,
        started,
    } = staged;
    std::fs::create_dir_all(store_dir).map_err(io)?;
    let tmp = store_dir.join(format!(".{version}.snapshot.tmp"));
    let bytes = write_image(&staging, id, version, &tmp).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    std::fs::rename(&tmp, manifest_path(store_dir, version)).map_err(io)?;
    std::fs::remove_dir_all(&staging).map_err(io)?;
    Ok(Uploaded {
        files_copied: 1,
        files_reused: 0,
        bytes_copied: bytes,
        millis: started.elapsed().as_millis() as u64,
    })
}

/// zstd level of images: as the changelogs'.
const IMAGE_ZSTD_LEVEL: i32 = super::CHANGELOG_ZSTD_LEVEL;

/// Writes the image of the RocksDB checkpoint in `staging` (at `version`) to the file `out`,
/// streamed (an image is as large as the state: it is never held in memory), and returns its
/// size: the magic, one zstd frame of `[version u64][key count u64][applied length u32][applied]`
/// and then each live entry as `[key length u32][key][value length u32][value]` in key order,
/// and a CRC-32 of all before it.
fn write_image(staging: &Path, id: &StoreId, version: u64, out: &Path) -> Result<u64> {
    use std::io::Write;
    // Read once, in order: no block cache (by default RocksDB would give each column family
    // one of 32 MiB).
    let mut table = rocksdb::BlockBasedOptions::default();
    table.disable_cache();
    let mut opts = Options::default();
    opts.set_block_based_table_factory(&table);
    let db =
        DB::open_cf_descriptors_read_only(&opts, staging, super::families(&opts, &opts), false)
            .map_err(|e| backend(id, e))?;
    let meta = |key: &[u8]| -> Result<Option<Vec<u8>>> {
        let cf = db
            .cf_handle(META_CF)
            .ok_or_else(|| backend(id, "the meta column family is missing"))?;
        db.get_cf(cf, key).map_err(|e| backend(id, e))
    };
    let u64_of = |v: Option<Vec<u8>>| {
        v.and_then(|v| v.as_slice().try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    if u64_of(meta(VERSION_KEY)?) != version {
        return Err(backend(id, "the staged snapshot is at another version"));
    }
    let num_keys = u64_of(meta(NUM_KEYS_KEY)?);
    let applied = meta(APPLIED_KEY)?.unwrap_or_default();
    let io = |e: std::io::Error| backend(id, e);
    let file = std::fs::File::create(out).map_err(io)?;
    let mut sealed = super::Crc32Writer::new(std::io::BufWriter::with_capacity(1 << 20, file));
    sealed.write_all(IMAGE_MAGIC).map_err(io)?;
    let encoder = zstd::stream::write::Encoder::new(sealed, IMAGE_ZSTD_LEVEL).map_err(io)?;
    let mut w = std::io::BufWriter::with_capacity(1 << 16, encoder);
    w.write_all(&version.to_le_bytes()).map_err(io)?;
    w.write_all(&num_keys.to_le_bytes()).map_err(io)?;
    w.write_all(&(applied.len() as u32).to_le_bytes())
        .map_err(io)?;
    w.write_all(&applied).map_err(io)?;
    let mut read = super::total_order();
    read.fill_cache(false);
    // A raw iterator lends each entry: nothing is copied out of RocksDB's blocks.
    let mut it = db.raw_iterator_opt(read);
    it.seek_to_first();
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        w.write_all(&(k.len() as u32).to_le_bytes()).map_err(io)?;
        w.write_all(k).map_err(io)?;
        w.write_all(&(v.len() as u32).to_le_bytes()).map_err(io)?;
        w.write_all(v).map_err(io)?;
        it.next();
    }
    it.status().map_err(|e| backend(id, e))?;
    let sealed = w
        .into_inner()
        .map_err(|e| io(e.into_error()))?
        .finish()
        .map_err(io)?;
    let (file, _) = sealed.seal().map_err(io)?;
    let written = file.written;
    file.flush_file().map_err(io)?;
    Ok(written)
}

/// What an image says of the instance it was taken of.
pub(super) struct ImageHeader {
    pub(super) version: u64,
    pub(super) num_keys: u64,
    pub(super) applied: Vec<u8>,
}

/// Loads the image `bytes` (of the snapshot file `file`, its CRC checked by [`read`]) into the
/// empty instance `db`: its entries through an SST file at `sst` that the instance ingests, so
/// they skip the memtable. Returns the header, for the caller to record in the instance.
pub(super) fn load_image(
    file: &Path,
    bytes: &[u8],
    db: &DB,
    sst: &Path,
    opts: &Options,
) -> Result<ImageHeader> {
    use std::io::Read;
    let damaged = |problem: String| Error::Corrupt {
        file: file.display().to_string(),
        problem,
    };
    let body = &bytes[IMAGE_MAGIC.len()..bytes.len() - 4];
    let decoder = zstd::stream::read::Decoder::new(body)
        .map_err(|e| damaged(format!("cannot be decompressed ({e})")))?;
    let mut r = std::io::BufReader::with_capacity(1 << 16, decoder);
    let cut = |e: std::io::Error| damaged(format!("is cut short or damaged ({e})"));
    let mut word = [0u8; 8];
    let mut read_u64 = |r: &mut dyn Read| -> Result<u64> {
        r.read_exact(&mut word).map_err(cut)?;
        Ok(u64::from_le_bytes(word))
    };
    let version = read_u64(&mut r)?;
    let num_keys = read_u64(&mut r)?;
    let mut applied = vec![0u8; read_len(&mut r).map_err(cut)?.unwrap_or(0) as usize];
    r.read_exact(&mut applied).map_err(cut)?;
    let mut writer = rocksdb::SstFileWriter::create(opts);
    let rocks = |e: rocksdb::Error| Error::Backend {
        store: file.display().to_string(),
        message: e.to_string(),
    };
    let (mut key, mut value, mut entries) = (Vec::new(), Vec::new(), 0u64);
    while let Some(klen) = read_len(&mut r).map_err(cut)? {
        key.resize(klen as usize, 0);
        r.read_exact(&mut key).map_err(cut)?;
        let vlen = read_len(&mut r)
            .map_err(cut)?
            .ok_or_else(|| damaged("ends in the middle of an entry".into()))?;
        value.resize(vlen as usize, 0);
        r.read_exact(&mut value).map_err(cut)?;
        if entries == 0 {
            writer.open(sst).map_err(rocks)?;
        }
        writer.put(&key, &value).map_err(rocks)?;
        entries += 1;
    }
    if entries != num_keys {
        return Err(damaged(format!(
            "holds {entries} entries where its header says {num_keys}"
        )));
    }
    if entries > 0 {
        writer.finish().map_err(rocks)?;
        let mut ingest = rocksdb::IngestExternalFileOptions::default();
        ingest.set_move_files(true);
        db.ingest_external_file_opts(&ingest, vec![sst])
            .map_err(rocks)?;
    }
    Ok(ImageHeader {
        version,
        num_keys,
        applied,
    })
}

/// A little-endian u32 length, or `None` at a clean end of the stream.
fn read_len(r: &mut impl std::io::Read) -> std::io::Result<Option<u32>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..])? {
            0 if got == 0 => return Ok(None),
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    Ok(Some(u32::from_le_bytes(len)))
}

/// Puts the files of the version-1 snapshot `manifest` into the empty directory `db_path`.
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
        if let Ok(snapshot) = read(store_dir, *s) {
            referenced.extend(snapshot.files().map(str::to_string));
        } else {
            // A damaged manifest: keep every file rather than guess.
            return Ok(Some(base));
        }
    }
    let files = match std::fs::read_dir(store_dir.join(FILES)) {
        Ok(files) => files,
        // Images need no files/.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Some(base)),
        Err(e) => return Err(e),
    };
    for entry in files.flatten() {
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
