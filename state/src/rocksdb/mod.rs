//! The RocksDB state store provider: each store instance is a local RocksDB database; each
//! committed version's changes are also written to a checksummed changelog file in the
//! checkpoint, from which a lost or diverged local instance is rebuilt.
//!
//! ```text
//! <checkpoint state dir>/<operator>/<partition>/<name>/<version>.changelog
//! <checkpoint state dir>/<operator>/<partition>/<name>/<version>.snapshot, files/
//! <local dir>/<operator>/<partition>/<name>/            the RocksDB instance
//! ```
//!
//! Opening at version v reuses the local instance when it is at v, replays the missing
//! changelogs when it is behind, and rebuilds it from version 1 when it is ahead (a batch that
//! committed locally but not in the checkpoint is being re-run). A store has one live instance at
//! a time: opening it again moves the shared local database, so an older instance must not be
//! used after that. Snapshots (uploading SST files so
//! a rebuild does not need every changelog) are not built yet: until they are, purging a store's
//! old changelogs means it can be rebuilt only from its local instance.

mod snapshot;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rocksdb::{
    BlockBasedOptions, Cache, DB, IteratorMode, Options, ReadOptions, WriteBufferManager,
};

use crate::store::{
    KeyRange, KeyShape, PrefixVisitor, StateStore, StateStoreProvider, StoreId, StoreMetrics,
    WriteBatch,
};
use crate::{Error, Result};

const META_CF: &str = "weir_meta";
const VERSION_KEY: &[u8] = b"version";
/// The number of keys at the local instance's version, kept exact: a changelog's count, or
/// [`count_keys`].
const NUM_KEYS_KEY: &[u8] = b"num_keys";
/// The last 8 bytes (the checksum) of the changelog of the local instance's version: a reused
/// instance is trusted only when the checkpoint's changelog of its version still ends so.
const APPLIED_KEY: &[u8] = b"applied";
/// Changelogs as weir wrote them until 2026-12: the magic, the operations, an FNV-1a checksum.
/// Still read.
const CHANGELOG_MAGIC_V1: &[u8] = b"WEIRCL1\n";
/// Changelogs as weir writes them: the magic, one zstd frame holding the store's key count
/// after the version (u64) and the operations, then a CRC-32 of all before it.
const CHANGELOG_MAGIC: &[u8] = b"WEIRCL2\n";
/// zstd's fastest level: a changelog is written on the commit path, and state keys and values
/// (arrow-row encoded numbers and times, repeated headers) still shrink 4-8 times at it.
const CHANGELOG_ZSTD_LEVEL: i32 = 1;

/// Memory bounds shared by every RocksDB instance of a provider, so state larger than memory
/// spills to disk instead of growing the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocksDbConfig {
    /// Block cache for all instances, bytes (default 64 MiB).
    pub block_cache_bytes: usize,
    /// Memtables of all instances together, bytes, charged to the block cache (default 64 MiB).
    pub memtable_bytes: usize,
    /// One memtable's size before it is flushed, bytes (default 64 MiB, RocksDB's and so
    /// Spark's; `memtable_bytes` bounds them all together). Rows a join stores and evicts
    /// within a few batches are then mostly deleted before they are flushed: at 16 MiB, q5
    /// ran ~10 % slower.
    pub write_buffer_bytes: usize,
    /// Take a snapshot once this many versions have passed since the last one (default 10,
    /// Spark's `minDeltasForSnapshot`); 0: never.
    pub snapshot_interval: u64,
    /// And once this long has passed since the last one, or since the store was first opened
    /// in this process (default 60 s, Spark's `stateStore.maintenanceInterval`: Spark uploads
    /// snapshots from a maintenance task that runs this often). A snapshot writes the whole
    /// state; this bounds how often a store pays for it however short its batches are. Zero:
    /// every `snapshot_interval` versions.
    pub snapshot_min_interval: Duration,
    /// Asynchronous checkpointing: a commit hands the version to the background and returns;
    /// the background writes its changelog to the checkpoint, applies it to the local instance
    /// and takes any snapshot, at most one version at a time per store, while the next batch
    /// reads the version's writes from memory. [`StateStoreProvider::wait_durable`] waits for it.
    pub async_checkpoint: bool,
    /// How the local instance compresses its SST files (default none; Spark's
    /// `stateStore.rocksdb.compression`, whose default is LZ4).
    pub compression: SstCompression,
}

/// How a local RocksDB instance compresses the SST files it writes. The local instance is a
/// cache of the checkpoint: changelogs and snapshot images are zstd-compressed on their own
/// whatever this says (Spark uploads the SST files themselves, so there they are the
/// checkpoint). Uncompressed, flushes and compactions write more bytes but spend no CPU
/// compressing: 13 % less CPU for Nexmark q7, which stores every bid, for 1.6 times its local
/// disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SstCompression {
    /// Files are written as they are.
    #[default]
    None,
    /// LZ4, as Spark's instances.
    Lz4,
}

impl SstCompression {
    /// The setting named `name` (`none` or `lz4`, any case), as Spark's
    /// `stateStore.rocksdb.compression` names it.
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "none" => Some(Self::None),
            "lz4" => Some(Self::Lz4),
            _ => None,
        }
    }

    fn rocksdb(self) -> rocksdb::DBCompressionType {
        match self {
            Self::None => rocksdb::DBCompressionType::None,
            Self::Lz4 => rocksdb::DBCompressionType::Lz4,
        }
    }
}

impl Default for RocksDbConfig {
    fn default() -> Self {
        Self {
            block_cache_bytes: 64 << 20,
            memtable_bytes: 64 << 20,
            write_buffer_bytes: 64 << 20,
            snapshot_interval: 10,
            snapshot_min_interval: Duration::from_secs(60),
            async_checkpoint: false,
            compression: SstCompression::None,
        }
    }
}

struct Shared {
    cache: Cache,
    memtables: WriteBufferManager,
    config: RocksDbConfig,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .finish()
    }
}

/// A committed version's writes, in key order with one operation per key, and the store's key
/// count after them. With async checkpointing the next batch reads them from here until the
/// background has applied them to the local instance.
#[derive(Debug)]
struct Pending {
    batch: WriteBatch,
    num_keys: u64,
}

impl Pending {
    /// The pending operations on keys that begin with `prefix`, in key order.
    fn with_prefix<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = OpRef<'a>> {
        let from = partition_point(&self.batch, 0..self.batch.len(), |k| k < prefix);
        (from..self.batch.len())
            .map(|i| self.batch.at(i))
            .take_while(move |(k, _)| k.starts_with(prefix))
    }

    /// The pending operations on keys in `range`, in key order.
    fn range(&self, range: &KeyRange) -> impl Iterator<Item = OpRef<'_>> {
        let all = 0..self.batch.len();
        let from = partition_point(&self.batch, all.clone(), |k| range.before_start(k));
        let to = partition_point(&self.batch, all, |k| !range.past_end(k));
        (from..to.max(from)).map(|i| self.batch.at(i))
    }
}

/// Work on a version in the background: with async checkpointing, applying it and making it
/// durable (`pending` holds its writes until then); otherwise only copying its snapshot into the
/// checkpoint (`pending` is `None`: the version is already durable and in the local instance).
#[derive(Debug)]
struct Upload {
    version: u64,
    pending: Option<Arc<Pending>>,
    handle: std::thread::JoinHandle<Result<Option<snapshot::Uploaded>>>,
}

/// What runs in the background: at most one upload per store, and the purges asked for while
/// one was in flight (run after it, as it adds files no manifest lists yet); and when each
/// store's next snapshot may be taken.
#[derive(Debug, Default)]
struct Background {
    uploads: HashMap<StoreId, Upload>,
    purges: HashMap<StoreId, u64>,
    snapshots: HashMap<StoreId, SnapshotClock>,
}

/// When a store's next snapshot is due: `interval` versions after its last one and not before
/// `not_before` (see [`RocksDbConfig::snapshot_min_interval`]).
#[derive(Debug, Clone, Copy)]
struct SnapshotClock {
    last: u64,
    not_before: Instant,
}

type Uploads = Arc<Mutex<Background>>;

/// Waits for `id`'s upload in flight, if any, and returns the snapshot it copied; its error is
/// the store's.
fn finish_upload(uploads: &Uploads, id: &StoreId) -> Result<Option<snapshot::Uploaded>> {
    let pending = uploads
        .lock()
        .map_err(|_| backend(id, "lock poisoned"))?
        .uploads
        .remove(id);
    match pending {
        Some(u) => u
            .handle
            .join()
            .map_err(|_| backend(id, "the background upload panicked"))?,
        None => Ok(None),
    }
}

/// State in RocksDB, made durable through changelog files in the checkpoint.
#[derive(Debug)]
pub struct RocksDbStateStoreProvider {
    checkpoint_dir: PathBuf,
    local_dir: PathBuf,
    shared: Shared,
    open: Mutex<HashMap<StoreId, Arc<DB>>>,
    /// The shape each open instance was opened (or restored) with, by the options of which
    /// it reads: a store asking for another shape reads it as opaque.
    shapes: Mutex<HashMap<StoreId, KeyShape>>,
    uploads: Uploads,
    /// Replays in progress: they share [`REPLAY_BUDGET_BYTES`].
    replaying: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for RocksDbStateStoreProvider {
    fn drop(&mut self) {
        // Let background uploads finish before the instances close.
        let ids: Vec<StoreId> = self
            .uploads
            .lock()
            .map(|b| b.uploads.keys().cloned().collect())
            .unwrap_or_default();
        for id in ids {
            let _ = finish_upload(&self.uploads, &id);
        }
    }
}

impl RocksDbStateStoreProvider {
    /// A provider keeping changelogs under `checkpoint_dir` and RocksDB instances under
    /// `local_dir`.
    pub fn new(checkpoint_dir: impl Into<PathBuf>, local_dir: impl Into<PathBuf>) -> Self {
        Self::with_config(checkpoint_dir, local_dir, RocksDbConfig::default())
    }

    /// Like [`RocksDbStateStoreProvider::new`], with memory bounds.
    pub fn with_config(
        checkpoint_dir: impl Into<PathBuf>,
        local_dir: impl Into<PathBuf>,
        config: RocksDbConfig,
    ) -> Self {
        let cache = Cache::new_lru_cache(config.block_cache_bytes);
        // A soft bound: writers do not stall while a flush is pending (stalling deadlocked
        // with one writer in a test).
        let memtables = WriteBufferManager::new_write_buffer_manager_with_cache(
            config.memtable_bytes,
            false,
            cache.clone(),
        );
        Self {
            checkpoint_dir: checkpoint_dir.into(),
            local_dir: local_dir.into(),
            shared: Shared {
                cache,
                memtables,
                config,
            },
            open: Mutex::new(HashMap::new()),
            shapes: Mutex::new(HashMap::new()),
            uploads: Arc::default(),
            replaying: Arc::default(),
        }
    }

    /// Bytes the provider's RocksDB instances hold in memory now: block cache (which the
    /// memtables are charged to).
    pub fn memory_used_bytes(&self) -> usize {
        self.shared.cache.get_usage()
    }

    fn rel(id: &StoreId) -> PathBuf {
        Path::new(&id.operator.to_string())
            .join(id.partition.to_string())
            .join(&id.name)
    }

    fn changelog(&self, id: &StoreId, version: u64) -> PathBuf {
        self.checkpoint_dir
            .join(Self::rel(id))
            .join(format!("{version}.changelog"))
    }

    /// The open instance of `id`, or the local one opened with the options of `shape`.
    fn db(&self, id: &StoreId, shape: KeyShape) -> Result<Arc<DB>> {
        let lock = || self.open.lock().map_err(|_| backend(id, "lock poisoned"));
        if let Some(db) = lock()?.get(id) {
            return Ok(Arc::clone(db));
        }
        // Opened without the lock, so that a restart opens its stores in parallel (tens of
        // milliseconds each). Only one task opens a given store; were two to race, RocksDB's
        // lock file would fail the second open, which returns the first's instance if that is
        // in the map by then and the lock error otherwise.
        let path = self.local_dir.join(Self::rel(id));
        let opened = open_db(&path, &self.shared, shape);
        let mut open = lock()?;
        if let Some(db) = open.get(id) {
            return Ok(Arc::clone(db));
        }
        let db = Arc::new(opened.map_err(|e| backend(id, e))?);
        self.opened_as(id, shape)?;
        open.insert(id.clone(), Arc::clone(&db));
        Ok(db)
    }

    /// Records that `id`'s instance was opened with the options of `shape`.
    fn opened_as(&self, id: &StoreId, shape: KeyShape) -> Result<()> {
        self.shapes
            .lock()
            .map_err(|_| backend(id, "lock poisoned"))?
            .insert(id.clone(), shape);
        Ok(())
    }

    /// The shape `id`'s instance was opened with (opaque if none was said).
    fn shape(&self, id: &StoreId) -> KeyShape {
        self.shapes
            .lock()
            .ok()
            .and_then(|s| s.get(id).copied())
            .unwrap_or_default()
    }

    fn store_dir(&self, id: &StoreId) -> PathBuf {
        self.checkpoint_dir.join(Self::rel(id))
    }

    /// Whether the changelogs of versions `from..=to` are all there.
    fn has_changelogs(&self, id: &StoreId, from: u64, to: u64) -> bool {
        (from..=to).all(|v| self.changelog(id, v).exists())
    }

    /// Gives up the local instance `db` of `id` (it is about to be replaced): closes it and
    /// removes its folder.
    fn release_local(&self, id: &StoreId, db: Arc<DB>) -> Result<()> {
        let mut open = self.open.lock().map_err(|_| backend(id, "lock poisoned"))?;
        open.remove(id);
        if Arc::strong_count(&db) > 1 {
            return Err(backend(
                id,
                "cannot restore a snapshot while an older instance of the store is in use",
            ));
        }
        drop(db);
        let path = self.local_dir.join(Self::rel(id));
        if path.exists() {
            std::fs::remove_dir_all(&path).map_err(|e| backend(id, e))?;
        }
        Ok(())
    }

    /// Makes snapshot `version` the local instance (whose folder is gone): loads its image (its
    /// CRC checked as it is read), or for a version-1 snapshot copies its files, opens them and
    /// reads every entry once, so that a damaged snapshot is found now, while an older one can
    /// still be used, rather than by a later batch. A failed restore leaves no local folder
    /// behind.
    fn restore(&self, id: &StoreId, version: u64, shape: KeyShape) -> Result<Arc<DB>> {
        let path = self.local_dir.join(Self::rel(id));
        let restored = self.restore_at(id, version, &path, shape);
        if restored.is_err() {
            let _ = std::fs::remove_dir_all(&path);
        }
        restored
    }

    fn restore_at(
        &self,
        id: &StoreId,
        version: u64,
        path: &Path,
        shape: KeyShape,
    ) -> Result<Arc<DB>> {
        let file = snapshot::manifest_path(&self.store_dir(id), version);
        let damaged = |problem: String| Error::Corrupt {
            file: file.display().to_string(),
            problem,
        };
        let db = match snapshot::read(&self.store_dir(id), version)? {
            snapshot::Snapshot::Image(bytes) => {
                let db = open_db(path, &self.shared, shape).map_err(|e| backend(id, e))?;
                let sst = path.with_extension("restore.sst");
                // Written with the instance's options: its filters, prefixes' included.
                let opts = db_options(&self.shared, shape);
                let loaded = snapshot::load_image(&file, &bytes, &db, &sst, &opts);
                let _ = std::fs::remove_file(&sst);
                let header = loaded?;
                if header.version != version {
                    return Err(damaged(format!(
                        "holds version {} where its name says {version}",
                        header.version
                    )));
                }
                write_counted(
                    &db,
                    id,
                    std::iter::empty(),
                    version,
                    header.num_keys,
                    &header.applied,
                )?;
                db
            }
            snapshot::Snapshot::Files(manifest) => {
                snapshot::restore(&self.store_dir(id), &manifest, path)?;
                let db = open_db(path, &self.shared, shape)
                    .map_err(|e| damaged(format!("lists files RocksDB cannot open ({e})")))?;
                verify_all(&db).map_err(|e| damaged(format!("lists a damaged file ({e})")))?;
                db
            }
        };
        if local_version(&db, id)? != version {
            return Err(damaged(
                "restores to another version than its name says".into(),
            ));
        }
        let db = Arc::new(db);
        let mut open = self.open.lock().map_err(|_| backend(id, "lock poisoned"))?;
        self.opened_as(id, shape)?;
        open.insert(id.clone(), Arc::clone(&db));
        Ok(db)
    }

    /// Empties the local instance (to be rebuilt from the changelogs).
    fn clear_local(&self, id: &StoreId, db: &DB) -> Result<()> {
        let mut wb = rocksdb::WriteBatch::default();
        for item in db.iterator_opt(IteratorMode::Start, total_order()) {
            let (k, _) = item.map_err(|e| backend(id, e))?;
            wb.delete(k);
        }
        let cf = db
            .cf_handle(META_CF)
            .ok_or_else(|| backend(id, "the meta column family is missing"))?;
        wb.put_cf(cf, VERSION_KEY, 0u64.to_le_bytes());
        wb.put_cf(cf, NUM_KEYS_KEY, 0u64.to_le_bytes());
        wb.delete_cf(cf, APPLIED_KEY);
        db.write_opt(wb, &no_wal()).map_err(|e| backend(id, e))
    }

    /// Rebuilds the local instance `db` of `id` at `version`: from the newest snapshot the
    /// changelogs can bring to `version`; when that snapshot is damaged, from the one before it
    /// (the purge keeps two), and so on down to the changelogs alone. The first failure is the
    /// error when nothing works.
    fn rebuild(&self, id: &StoreId, db: Arc<DB>, version: u64, shape: KeyShape) -> Result<Arc<DB>> {
        let mut bases: Vec<Option<u64>> = snapshot::list(&self.store_dir(id))
            .into_iter()
            .rev()
            .filter(|&s| s <= version && self.has_changelogs(id, s + 1, version))
            .map(Some)
            .collect();
        if self.has_changelogs(id, 1, version) {
            bases.push(None);
        }
        if bases.is_empty() {
            return Err(self.not_found(id, version));
        }
        let mut db = Some(db);
        let mut first_error = None;
        for base in bases {
            let attempt = match base {
                Some(s) => {
                    if let Some(d) = db.take() {
                        self.release_local(id, d)?;
                    }
                    self.restore(id, s, shape).and_then(|d| {
                        db = Some(Arc::clone(&d));
                        self.replay(id, &d, s + 1, version).map(|()| d)
                    })
                }
                None => {
                    let d = match db.take() {
                        Some(d) => d,
                        None => self.db(id, shape)?,
                    };
                    db = Some(Arc::clone(&d));
                    self.clear_local(id, &d)
                        .and_then(|()| self.replay(id, &d, 1, version))
                        .map(|()| d)
                }
            };
            match attempt {
                Ok(d) => {
                    if let Some(e) = &first_error {
                        tracing::warn!(
                            store = %id,
                            "rebuilt version {version} from {} instead: {e}",
                            base.map_or("the changelogs alone".to_string(), |s| format!("snapshot {s}"))
                        );
                    }
                    return Ok(d);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        Err(first_error.unwrap_or_else(|| self.not_found(id, version)))
    }

    fn available(&self, id: &StoreId) -> String {
        let snapshots = snapshot::list(&self.store_dir(id));
        let snapshots = match snapshots.as_slice() {
            [] => String::new(),
            s => format!(
                ", snapshots {}",
                s.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
            ),
        };
        format!("{}{snapshots}", self.available_changelogs(id))
    }

    fn available_changelogs(&self, id: &StoreId) -> String {
        let mut v: Vec<u64> = std::fs::read_dir(self.checkpoint_dir.join(Self::rel(id)))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_string_lossy()
                    .strip_suffix(".changelog")?
                    .parse()
                    .ok()
            })
            .collect();
        v.sort_unstable();
        match v.as_slice() {
            [] => "no changelogs".into(),
            [first, .., last] => format!("changelogs {first}..={last}"),
            [only] => format!("changelog {only}"),
        }
    }

    /// Whether the local instance `db`, at version `local`, is what the checkpoint's changelog
    /// of that version made: it recorded the changelog's checksum when it applied it.
    fn matches_checkpoint(&self, id: &StoreId, db: &DB, local: u64) -> Result<bool> {
        use std::io::{Read, Seek, SeekFrom};
        if local == 0 {
            // Empty: nothing was applied, so nothing can disagree.
            return Ok(true);
        }
        let cf = db
            .cf_handle(META_CF)
            .ok_or_else(|| backend(id, "the meta column family is missing"))?;
        let Some(applied) = db.get_cf(cf, APPLIED_KEY).map_err(|e| backend(id, e))? else {
            return Ok(false);
        };
        let end = std::fs::File::open(self.changelog(id, local)).and_then(|mut f| {
            f.seek(SeekFrom::End(-8))?;
            let mut end = [0u8; 8];
            f.read_exact(&mut end)?;
            Ok(end)
        });
        Ok(end.is_ok_and(|end| end[..] == applied[..]))
    }

    fn not_found(&self, id: &StoreId, version: u64) -> Error {
        Error::VersionNotFound {
            store: id.to_string(),
            version,
            available: self.available(id),
        }
    }

    /// Brings the local instance `db` from version `from - 1` to `to` with the checkpoint's
    /// changelogs. Their writes are merged first (the newest per key), a chunk of changelogs
    /// at a time (this replay's share of [`REPLAY_BUDGET_BYTES`]), and each merge written at
    /// once in key order: a row a later version deletes is never inserted, and RocksDB takes
    /// one sorted batch instead of one per version. Where nothing lies under the merged writes
    /// (an empty instance, and keys no earlier chunk put, up to [`REPLAY_TRACKED_KEYS`] of
    /// them), a delete has nothing to remove and is not written: a rebuild leaves no tombstone
    /// for every row the watermark ever evicted.
    fn replay(&self, id: &StoreId, db: &DB, from: u64, to: u64) -> Result<()> {
        use std::sync::atomic::Ordering;
        struct Replaying<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Replaying<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.replaying.fetch_add(1, Ordering::Relaxed);
        let replaying = Replaying(&self.replaying);
        // This replay's share of the budget, as many replays run now (a restart replays its
        // stores in parallel).
        let chunk_bytes = || {
            (REPLAY_BUDGET_BYTES / replaying.0.load(Ordering::Relaxed).max(1))
                .max(REPLAY_BUDGET_BYTES / 8)
        };
        // The keys the replay has put into an instance that was empty (hashes, never removed:
        // a collision then only keeps a delete): a later chunk's delete of any other key is
        // left out.
        let mut below = if is_empty(db).map_err(|e| backend(id, e))? {
            Below::Replayed(HashSet::default())
        } else {
            Below::Unknown
        };
        let mut chunk: Vec<Changelog> = Vec::new();
        let mut held = 0usize;
        for version in from..=to {
            let path = self.changelog(id, version);
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(self.not_found(id, to));
                }
                Err(e) => return Err(backend(id, format!("{}: {e}", path.display()))),
            };
            let changelog = Changelog::decode(&bytes).ok_or_else(|| Error::Corrupt {
                file: path.display().to_string(),
                problem: crate::error::corrupt_problem(&bytes, b"WEIRCL", b'2'),
            })?;
            held += changelog.held_bytes();
            chunk.push(changelog);
            if held < chunk_bytes() && chunk.len() < REPLAY_CHUNK_CHANGELOGS && version < to {
                continue;
            }
            {
                let ops = merge_changelogs(&chunk, &below);
                let ops = || ops.iter().map(|m| m.write(&chunk));
                let num_keys = match chunk.last().and_then(|c| c.num_keys) {
                    Some(n) => n,
                    // A version-1 changelog does not say: the merged writes' keys are looked
                    // up in the instance they are applied to.
                    None => count_keys_after(db, id, ops().map(|(k, v)| (k, v.is_some())))?,
                };
                write_counted(db, id, ops(), version, num_keys, trailer(&bytes))?;
                if let Below::Replayed(put) = &mut below
                    && version < to
                {
                    let puts = ops().filter(|(_, v)| v.is_some()).count();
                    if put.len() + puts > REPLAY_TRACKED_KEYS {
                        // Past this, keeping every delete costs less than tracking the keys.
                        below = Below::Unknown;
                    } else {
                        put.reserve(puts);
                        put.extend(ops().filter(|(_, v)| v.is_some()).map(|(k, _)| key_hash(k)));
                    }
                }
            }
            chunk.clear();
            held = 0;
        }
        Ok(())
    }
}

/// The most keys a replay tracks to leave out later chunks' deletes (~18 bytes each); past it,
/// every delete is written.
const REPLAY_TRACKED_KEYS: usize = if cfg!(test) { 64 } else { 4 << 20 };

/// What lies under a replay's next chunk of changelogs.
enum Below {
    /// Only what the replay wrote into an empty instance: the hashes of the keys it put (deleted
    /// since or not).
    Replayed(HashSet<u64, foldhash::fast::FixedState>),
    /// An instance's entries (a snapshot's, or its own).
    Unknown,
}

impl Below {
    /// Whether a delete of `key` may have something to remove.
    fn may_hold(&self, key: &[u8]) -> bool {
        match self {
            Below::Replayed(put) => put.contains(&key_hash(key)),
            Below::Unknown => true,
        }
    }
}

fn key_hash(key: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0).hash_one(key)
}

/// Whether `db` holds no entry (deleted ones aside).
fn is_empty(db: &DB) -> std::result::Result<bool, rocksdb::Error> {
    db.iterator_opt(IteratorMode::Start, total_order())
        .next()
        .transpose()
        .map(|first| first.is_none())
}

/// One write of a changelog, borrowed from its decoded bytes: the key and the value (`None`: a
/// delete).
type OpRef<'a> = (&'a [u8], Option<&'a [u8]>);

/// A write being merged: its key's first 16 bytes as a big-endian integer (zeros past its end),
/// which order most pairs of keys without reading them (see [`key_prefix`]), and where the
/// write is: its changelog's place in the chunk (the top 16 bits) and its offset there. 24
/// bytes, where the write's key and value slices and the prefix took 48: a replay holds one
/// per write of its chunk.
#[derive(Clone, Copy)]
struct MergeOp {
    head: [u64; 2],
    at: u64,
}

impl MergeOp {
    const OFFSET_BITS: u32 = 48;

    fn new(key: &[u8], changelog: usize, at: usize) -> Self {
        // `Changelog::decode` and `REPLAY_CHUNK_CHANGELOGS` keep both in their bits.
        debug_assert!((at as u64) < 1 << Self::OFFSET_BITS && changelog < REPLAY_CHUNK_CHANGELOGS);
        let prefix = key_prefix(key);
        Self {
            head: [(prefix >> 64) as u64, prefix as u64],
            at: ((changelog as u64) << Self::OFFSET_BITS) | at as u64,
        }
    }

    fn write<'a>(&self, changelogs: &'a [Changelog]) -> OpRef<'a> {
        let c = &changelogs[(self.at >> Self::OFFSET_BITS) as usize];
        let at = (self.at & ((1 << Self::OFFSET_BITS) - 1)) as usize;
        // Checked when the changelog was decoded.
        Changelog::op_at(&c.raw, at).map_or((&[][..], None), |(op, _)| op)
    }
}

/// The most changelogs a replay merges at once: [`MergeOp`] has 16 bits for their place.
const REPLAY_CHUNK_CHANGELOGS: usize = 1 << (64 - MergeOp::OFFSET_BITS);

/// The newest write of each key in `changelogs` (oldest first), in key order, leaving out the
/// deletes of keys nothing `below` can hold.
fn merge_changelogs(changelogs: &[Changelog], below: &Below) -> Vec<MergeOp> {
    let mut ops: Vec<MergeOp> = Vec::with_capacity(changelogs.iter().map(|c| c.ops).sum());
    for (i, c) in changelogs.iter().enumerate() {
        c.for_each_op(|at, k, _| ops.push(MergeOp::new(k, i, at)));
    }
    let key = |m: &MergeOp| m.write(changelogs).0;
    // A stable sort keeps each key's writes in version order, the newest last. Every changelog
    // is in key order already (a commit sorts its writes), and the sort merges such runs.
    ops.sort_by(|a, b| a.head.cmp(&b.head).then_with(|| key(a).cmp(key(b))));
    let mut kept = 0;
    for i in 0..ops.len() {
        let (k, v) = ops[i].write(changelogs);
        let newest = ops
            .get(i + 1)
            .is_none_or(|next| next.head != ops[i].head || key(next) != k);
        if newest && (v.is_some() || below.may_hold(k)) {
            ops[kept] = ops[i];
            kept += 1;
        }
    }
    ops.truncate(kept);
    ops
}

/// A changelog, checked and decoded: its operations' bytes and, from version 2 on, the store's
/// key count after them.
struct Changelog {
    raw: Vec<u8>,
    /// Where the operations start in `raw`.
    start: usize,
    num_keys: Option<u64>,
    /// How many operations it holds.
    ops: usize,
}

impl Changelog {
    /// `None` when the file is damaged or truncated.
    fn decode(bytes: &[u8]) -> Option<Self> {
        let (raw, start, num_keys) = if bytes.starts_with(CHANGELOG_MAGIC_V1) {
            let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(8)?)?;
            if checksum(body) != u64::from_le_bytes(sum.try_into().ok()?) {
                return None;
            }
            (body.to_vec(), CHANGELOG_MAGIC_V1.len(), None)
        } else {
            let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
            if crc32fast::hash(body) != u32::from_le_bytes(sum.try_into().ok()?) {
                return None;
            }
            let frame = body.strip_prefix(CHANGELOG_MAGIC)?;
            // One frame, whose header says its decoded size (since 2026-12-07): decoded into a
            // buffer of that size, reserved fallibly (a damaged header is an error, not an
            // abort) and only when the frame could plausibly hold that much.
            let stated = zstd::zstd_safe::get_frame_content_size(frame)
                .ok()
                .flatten();
            let raw = match stated.and_then(|n| usize::try_from(n).ok()) {
                Some(n) if n <= frame.len().saturating_mul(MAX_CHANGELOG_RATIO) => {
                    let mut raw = Vec::new();
                    raw.try_reserve_exact(n).ok()?;
                    zstd::bulk::Decompressor::new()
                        .ok()?
                        .decompress_to_buffer(frame, &mut raw)
                        .ok()?;
                    (raw.len() == n).then_some(raw)?
                }
                _ => zstd::stream::decode_all(frame).ok()?,
            };
            let num_keys = u64::from_le_bytes(raw.get(..8)?.try_into().ok()?);
            (raw, 8, Some(num_keys))
        };
        // Offsets into it must fit a [`MergeOp`].
        if raw.len() as u64 >= 1 << MergeOp::OFFSET_BITS {
            return None;
        }
        let mut changelog = Self {
            raw,
            start,
            num_keys,
            ops: 0,
        };
        changelog.ops = changelog.for_each_op(|_, _, _| {})?;
        Some(changelog)
    }

    /// Calls `each` with every operation, in order, and its offset; returns how many there
    /// were, `None` when they are cut short.
    fn for_each_op<'a>(
        &'a self,
        mut each: impl FnMut(usize, &'a [u8], Option<&'a [u8]>),
    ) -> Option<usize> {
        let mut at = self.start;
        let mut n = 0;
        while at < self.raw.len() {
            let ((k, v), next) = Self::op_at(&self.raw, at)?;
            each(at, k, v);
            at = next;
            n += 1;
        }
        Some(n)
    }

    /// The operation at offset `at` of `raw` and the offset after it: `[put 1][key length
    /// u32][key]([value length u32][value])`; `None` when it is cut short.
    fn op_at(raw: &[u8], at: usize) -> Option<(OpRef<'_>, usize)> {
        let mut rest = raw.get(at..)?;
        let mut take = |n: usize| -> Option<&[u8]> {
            let (head, tail) = rest.split_at_checked(n)?;
            rest = tail;
            Some(head)
        };
        let op = take(1)?[0];
        let klen = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let key = take(klen)?;
        let value = if op == 1 {
            let vlen = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
            Some(take(vlen)?)
        } else {
            None
        };
        Some(((key, value), raw.len() - rest.len()))
    }

    /// What a replay holds for it: its bytes and a merge entry per operation.
    fn held_bytes(&self) -> usize {
        self.raw.len() + self.ops * std::mem::size_of::<MergeOp>()
    }

    #[cfg(test)]
    fn batch(&self) -> WriteBatch {
        let mut batch = WriteBatch::new();
        self.for_each_op(|_, k, v| match v {
            Some(v) => batch.put(k, v),
            None => batch.delete(k),
        });
        batch
    }
}

/// The first 16 bytes of `key` (zeros past its end) as a big-endian integer: two keys whose
/// prefixes differ sort as their prefixes do; equal prefixes leave the order to the whole keys.
fn key_prefix(key: &[u8]) -> u128 {
    let mut head = [0u8; 16];
    let n = key.len().min(16);
    head[..n].copy_from_slice(&key[..n]);
    u128::from_be_bytes(head)
}

/// Keys per RocksDB MultiGet call (see [`RocksDbStateStore::multi_get`]).
const MULTI_GET_CHUNK: usize = 4096;

/// About how many bytes of changelogs the replays in progress merge before writing them: their
/// decoded bytes plus a [`MergeOp`] per write, shared evenly among the replays running at once
/// (each gets at least an eighth); a chunk ends with the changelog that reaches its share. A
/// join side's 23 changelogs of 100 k writes each, as q5 at 100 k rows per batch leaves between
/// snapshots, are ~140 MiB: with two replays at once, one chunk each. On top of a chunk, a
/// replay holds the sort's scratch (half the references at most), the sorted batch it writes
/// (the kept writes) and the tracked keys. Tests replay in chunks of a few versions, so that
/// they cover a replay written in several chunks.
const REPLAY_BUDGET_BYTES: usize = if cfg!(test) { 4 << 10 } else { 512 << 20 };

/// The most a changelog's zstd frame may say it decodes to, per byte of the frame, for the
/// decoder to reserve that much up front (a header saying more is decoded as it comes).
const MAX_CHANGELOG_RATIO: usize = 1 << 12;

/// Reads every entry of every column family of `db` once, checking RocksDB's block checksums.
fn verify_all(db: &DB) -> std::result::Result<(), rocksdb::Error> {
    for cf in [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, META_CF] {
        let Some(handle) = db.cf_handle(cf) else {
            continue;
        };
        let mut read = total_order();
        read.set_verify_checksums(true);
        read.fill_cache(false);
        for item in db.iterator_cf_opt(handle, read, IteratorMode::Start) {
            item?;
        }
    }
    Ok(())
}

/// The options of an instance's column family of data for a store of `shape`; the meta column
/// family is the same without a prefix extractor.
fn db_options(shared: &Shared, shape: KeyShape) -> Options {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(&shared.cache);
    // Index and filter blocks stay in each table reader (about 1-2 % of the data, counted in
    // `memory_used_bytes`), not in the cache: a join opens an iterator per key it reads, and
    // each new iterator reads every file's index block, which when evicted from a cache
    // squeezed by the memtables was decompressed again per key (a quarter of Nexmark q20's
    // time).
    table.set_cache_index_and_filter_blocks(false);
    // Most lookups of a batch's new keys miss: a bloom filter answers them without reading.
    // With a prefix extractor it holds the prefixes too, for seeks.
    table.set_bloom_filter(10.0, false);
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_block_based_table_factory(&table);
    opts.set_write_buffer_manager(&shared.memtables);
    opts.set_write_buffer_size(shared.config.write_buffer_bytes);
    opts.set_max_write_buffer_number(2);
    // Every level alike (RocksDB's bottommost level takes this setting too).
    opts.set_compression_type(shared.config.compression.rocksdb());
    // Writes skip the WAL (see `no_wal`): flush the data and the version marker together.
    opts.set_atomic_flush(true);
    // RocksDB's info log notes every flush and snapshot (about 14 KB per snapshot), which over
    // a long run of a query would fill the disk: warnings only, in at most two 1 MB files.
    opts.set_log_level(rocksdb::LogLevel::Warn);
    opts.set_max_log_file_size(1 << 20);
    opts.set_keep_log_file_num(2);
    if let KeyShape::Prefixed { suffix } = shape
        && let Some(extractor) = prefix_extractor(suffix)
    {
        opts.set_prefix_extractor(extractor);
        // The memtables hold most of a join's recent rows: a prefix filter of their own
        // (2 % of a memtable's size) spares a skip-list search per absent prefix.
        opts.set_memtable_prefix_bloom_ratio(0.02);
    }
    opts
}

/// The prefix extractor of a [`KeyShape::Prefixed`] store with `suffix` bytes after the prefix
/// (the suffixes weir's operators use; another gets none and its scans read without the
/// filter). RocksDB records an extractor's name in each file it filters and uses a file's prefix
/// filter only under the same name, so a name is never reused for another extractor.
fn prefix_extractor(suffix: usize) -> Option<rocksdb::SliceTransform> {
    fn before<const N: usize>(key: &[u8]) -> &[u8] {
        &key[..key.len().saturating_sub(N)]
    }
    fn holds<const N: usize>(key: &[u8]) -> bool {
        key.len() >= N
    }
    let create = rocksdb::SliceTransform::create;
    match suffix {
        8 => Some(create("weir.prefix-then-8", before::<8>, Some(holds::<8>))),
        12 => Some(create(
            "weir.prefix-then-12",
            before::<12>,
            Some(holds::<12>),
        )),
        16 => Some(create(
            "weir.prefix-then-16",
            before::<16>,
            Some(holds::<16>),
        )),
        _ => None,
    }
}

/// Reads in key order over every key: an instance of a [`KeyShape::Prefixed`] store seeks
/// within one prefix unless told otherwise, which a range scan must be.
fn total_order() -> ReadOptions {
    let mut read = ReadOptions::default();
    read.set_total_order_seek(true);
    read
}

fn open_db(
    path: &Path,
    shared: &Shared,
    shape: KeyShape,
) -> std::result::Result<DB, rocksdb::Error> {
    let data = db_options(shared, shape);
    let meta = db_options(shared, KeyShape::Opaque);
    DB::open_cf_descriptors(&data, path, families(&data, &meta))
}

/// An instance's column families: the data with `data`, the version marker and key count with
/// `meta`. `DB::open_cf` gives the ones it names RocksDB's defaults (its own 32 MiB block cache
/// per family and instance, 64 MiB memtables, no bloom filter), which grew a join's memory by
/// a cache per store whatever the bounds said.
fn families(data: &Options, meta: &Options) -> [rocksdb::ColumnFamilyDescriptor; 2] {
    [
        rocksdb::ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, data.clone()),
        rocksdb::ColumnFamilyDescriptor::new(META_CF, meta.clone()),
    ]
}

fn backend(id: &StoreId, e: impl std::fmt::Display) -> Error {
    Error::Backend {
        store: id.to_string(),
        message: e.to_string(),
    }
}

fn meta_u64(db: &DB, id: &StoreId, key: &[u8]) -> Result<u64> {
    let cf = db
        .cf_handle(META_CF)
        .ok_or_else(|| backend(id, "the meta column family is missing"))?;
    match db.get_cf(cf, key).map_err(|e| backend(id, e))? {
        None => Ok(0),
        Some(v) => v
            .as_slice()
            .try_into()
            .map(u64::from_le_bytes)
            .map_err(|_| backend(id, "the local instance's metadata is damaged")),
    }
}

fn local_version(db: &DB, id: &StoreId) -> Result<u64> {
    meta_u64(db, id, VERSION_KEY)
}

/// The end of a changelog that [`APPLIED_KEY`] records: its checksum.
fn trailer(changelog: &[u8]) -> &[u8] {
    &changelog[changelog.len().saturating_sub(8)..]
}

/// The store's key count once `batch` is applied to the local instance as it is now.
fn count_keys<'a>(
    db: &DB,
    id: &StoreId,
    key_delta: Option<i64>,
    ops: impl Iterator<Item = OpRef<'a>>,
) -> Result<u64> {
    match key_delta {
        // The writer counted.
        Some(d) => Ok(meta_u64(db, id, NUM_KEYS_KEY)?.saturating_add_signed(d)),
        None => count_keys_after(db, id, ops.map(|(k, v)| (k, v.is_some()))),
    }
}

/// The store's key count once `ops` (key, whether a put; at most one per key) are applied to
/// the local instance as it is now: batched lookups tell which keys exist, so the count stays
/// exact.
fn count_keys_after<'a>(
    db: &DB,
    id: &StoreId,
    ops: impl Iterator<Item = (&'a [u8], bool)>,
) -> Result<u64> {
    let mut num_keys = meta_u64(db, id, NUM_KEYS_KEY)?;
    let mut ops = ops.peekable();
    while ops.peek().is_some() {
        let chunk: Vec<_> = ops.by_ref().take(MULTI_GET_CHUNK).collect();
        let existed = db.multi_get(chunk.iter().map(|(k, _)| k));
        for ((_, put), existed) in chunk.iter().zip(existed) {
            let existed = existed.map_err(|e| backend(id, e))?.is_some();
            match (put, existed) {
                (true, false) => num_keys += 1,
                (false, true) => num_keys = num_keys.saturating_sub(1),
                _ => {}
            }
        }
    }
    Ok(num_keys)
}

/// Applies `ops` (at most one per key) and records `version`, `num_keys` and the end of the
/// version's changelog (`applied`), atomically.
fn write_counted<'a>(
    db: &DB,
    id: &StoreId,
    ops: impl Iterator<Item = OpRef<'a>> + Clone,
    version: u64,
    num_keys: u64,
    applied: &[u8],
) -> Result<()> {
    let cf = db
        .cf_handle(META_CF)
        .ok_or_else(|| backend(id, "the meta column family is missing"))?;
    // Sized up front: a batch of a million rows grows RocksDB's buffer by doubling otherwise,
    // copying it each time. Each entry costs its bytes, a tag and two varint lengths.
    let bytes: usize = ops
        .clone()
        .map(|(k, v)| k.len() + v.map_or(0, <[u8]>::len) + 11)
        .sum();
    let mut wb = rocksdb::WriteBatch::with_capacity_bytes(bytes + 256);
    for (k, v) in ops {
        match v {
            Some(v) => wb.put(k, v),
            None => wb.delete(k),
        }
    }
    wb.put_cf(cf, VERSION_KEY, version.to_le_bytes());
    wb.put_cf(cf, NUM_KEYS_KEY, num_keys.to_le_bytes());
    wb.put_cf(cf, APPLIED_KEY, applied);
    db.write_opt(wb, &no_wal()).map_err(|e| backend(id, e))
}

/// Writes to a local instance skip RocksDB's write-ahead log: the checkpoint's changelogs are
/// the durable copy, and an instance that lost its unflushed writes in a crash reopens at an
/// older version (the marker is written with the data) and is brought forward from them.
fn no_wal() -> rocksdb::WriteOptions {
    let mut wo = rocksdb::WriteOptions::default();
    wo.disable_wal(true);
    wo
}

/// FNV-1a, 64 bits: enough to notice a damaged or truncated changelog.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Writes changelog `version` whole (a temporary file renamed), so it is complete or absent.
#[cfg(test)]
fn write_changelog(id: &StoreId, dir: &Path, version: u64, bytes: &[u8]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| backend(id, e))?;
    let path = dir.join(format!("{version}.changelog"));
    let tmp = dir.join(format!(".{version}.changelog.tmp"));
    std::fs::write(&tmp, bytes).map_err(|e| backend(id, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| backend(id, e))
}

/// Writes changelog `version` of `batch` (leaving the store with `num_keys` keys) whole: streamed
/// into a temporary file that is renamed once complete, so the changelog is complete or absent.
/// Returns its [`trailer`].
fn store_changelog<'a>(
    id: &StoreId,
    dir: &Path,
    version: u64,
    batch: impl Iterator<Item = OpRef<'a>> + Clone,
    num_keys: u64,
) -> Result<[u8; 8]> {
    let io = |e: std::io::Error| backend(id, e);
    std::fs::create_dir_all(dir).map_err(io)?;
    let path = dir.join(format!("{version}.changelog"));
    let tmp = dir.join(format!(".{version}.changelog.tmp"));
    let written = std::fs::File::create(&tmp).and_then(|file| {
        let out = Crc32Writer::new(std::io::BufWriter::with_capacity(1 << 20, file));
        let (out, trailer) = encode_changelog_into(batch, num_keys, out)?;
        out.flush_file()?;
        Ok(trailer)
    });
    match written {
        Ok(trailer) => {
            std::fs::rename(&tmp, &path).map_err(io)?;
            Ok(trailer)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(io(e))
        }
    }
}

/// Changelog `version`'s bytes: `batch`, leaving the store with `num_keys` keys.
#[cfg(test)]
fn encode_changelog(batch: &WriteBatch, num_keys: u64) -> std::io::Result<Vec<u8>> {
    let (out, _) = encode_changelog_into(batch.iter(), num_keys, Crc32Writer::new(Vec::new()))?;
    Ok(out.inner)
}

/// Writes the changelog of `batch` (leaving the store with `num_keys` keys) into `out`,
/// compressed as it is encoded (no uncompressed copy of the batch is made), and seals it:
/// returns the writer and the changelog's [`trailer`].
fn encode_changelog_into<'a, W: std::io::Write>(
    batch: impl Iterator<Item = OpRef<'a>> + Clone,
    num_keys: u64,
    mut out: Crc32Writer<W>,
) -> std::io::Result<(Crc32Writer<W>, [u8; 8])> {
    use std::io::Write;
    out.write_all(CHANGELOG_MAGIC)?;
    let mut encoder = zstd::stream::write::Encoder::new(out, CHANGELOG_ZSTD_LEVEL)?;
    // The frame says how large it decodes to, so that a replay decodes it into a buffer of that
    // size rather than one doubling as it fills.
    let size: usize = batch
        .clone()
        .map(|(k, v)| 5 + k.len() + v.map_or(0, |v| 4 + v.len()))
        .sum();
    encoder.set_pledged_src_size(Some(8 + size as u64))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 16, encoder);
    w.write_all(&num_keys.to_le_bytes())?;
    for (k, v) in batch {
        w.write_all(&[u8::from(v.is_some())])?;
        w.write_all(&(k.len() as u32).to_le_bytes())?;
        w.write_all(k)?;
        if let Some(v) = v {
            w.write_all(&(v.len() as u32).to_le_bytes())?;
            w.write_all(v)?;
        }
    }
    w.into_inner().map_err(|e| e.into_error())?.finish()?.seal()
}

/// Passes writes through to `inner`, keeping a CRC-32 of them, their count and their last four
/// bytes; [`Crc32Writer::seal`] appends the CRC. Changelogs and snapshot images end so.
pub(super) struct Crc32Writer<W> {
    pub(super) inner: W,
    crc: crc32fast::Hasher,
    pub(super) written: u64,
    last: [u8; 4],
}

impl<W: std::io::Write> Crc32Writer<W> {
    pub(super) fn new(inner: W) -> Self {
        Self {
            inner,
            crc: crc32fast::Hasher::new(),
            written: 0,
            last: [0; 4],
        }
    }

    /// Appends the CRC-32 of everything written before it; returns the writer and the last
    /// eight bytes written (the [`trailer`]).
    pub(super) fn seal(mut self) -> std::io::Result<(Self, [u8; 8])> {
        let sum = self.crc.clone().finalize().to_le_bytes();
        self.inner.write_all(&sum)?;
        self.written += 4;
        let mut trailer = [0; 8];
        trailer[..4].copy_from_slice(&self.last);
        trailer[4..].copy_from_slice(&sum);
        Ok((self, trailer))
    }
}

impl Crc32Writer<std::io::BufWriter<std::fs::File>> {
    /// Writes out what is buffered and closes the file.
    pub(super) fn flush_file(self) -> std::io::Result<()> {
        self.inner.into_inner().map_err(|e| e.into_error())?;
        Ok(())
    }
}

impl<W: std::io::Write> std::io::Write for Crc32Writer<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        let buf = &buf[..n];
        self.crc.update(buf);
        self.written += n as u64;
        if n >= 4 {
            self.last.copy_from_slice(&buf[n - 4..]);
        } else {
            self.last.rotate_left(n);
            self.last[4 - n..].copy_from_slice(buf);
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A changelog's operations and, from version 2 on, the key count after them; `None` when the
/// file is damaged or truncated.
#[cfg(test)]
fn decode_changelog(bytes: &[u8]) -> Option<(WriteBatch, Option<u64>)> {
    Changelog::decode(bytes).map(|c| (c.batch(), c.num_keys))
}

impl RocksDbStateStoreProvider {
    /// Opens `id` at `version` as a store of `shape`; an instance not open yet is opened with
    /// that shape's options.
    fn open_store(
        &self,
        id: &StoreId,
        version: u64,
        shape: KeyShape,
    ) -> Result<Box<dyn StateStore>> {
        // An instance this provider has not opened yet was left by an earlier run (or is new).
        let reopened = !self
            .open
            .lock()
            .map_err(|_| backend(id, "lock poisoned"))?
            .contains_key(id);
        let mut db = self.db(id, shape)?;
        // The version the background is applying is read through its writes, at once.
        let in_flight = self
            .uploads
            .lock()
            .map_err(|_| backend(id, "lock poisoned"))?
            .uploads
            .get(id)
            .map(|u| (u.version, u.pending.clone()));
        let overlay = match in_flight {
            Some((v, pending)) if v == version => pending,
            Some(_) => {
                // Another version: it must be applied (and in the checkpoint, which a rebuild
                // reads) before the local instance tells where it is.
                finish_upload(&self.uploads, id)?;
                None
            }
            None => None,
        };
        let local = if overlay.is_some() {
            version
        } else {
            local_version(&db, id)?
        };
        // An earlier run's instance is used only if the checkpoint still holds the version it
        // is at (a checkpoint restored from a copy, or reset, has other changelogs).
        let diverged = reopened && !self.matches_checkpoint(id, &db, local)?;
        // How many changelogs this open replays (a rebuild: all since the snapshot it starts
        // from, counted below from the newest).
        let mut replayed = Some(0);
        // A snapshot newer than the instance (an empty one above all: a new machine, a lost
        // folder) is restored rather than every changelog since the instance's version replayed.
        let snapshot_ahead = local < version
            && snapshot::list(&self.store_dir(id))
                .into_iter()
                .any(|s| local < s && s <= version);
        if !diverged
            && !snapshot_ahead
            && local < version
            && self.has_changelogs(id, local + 1, version)
        {
            self.replay(id, &db, local + 1, version)?;
            replayed = Some(version - local);
        } else if diverged || local != version {
            // Rebuild: from the newest snapshot the changelogs can bring to `version`, or from
            // nothing. Only what can be rebuilt is cleared.
            db = self.rebuild(id, db, version, shape)?;
            replayed = None;
        }
        // The first snapshot of a store this process opens comes an interval after it opened,
        // as Spark's first maintenance run comes an interval after its provider loaded.
        let mut background = self
            .uploads
            .lock()
            .map_err(|_| backend(id, "lock poisoned"))?;
        let clock = background
            .snapshots
            .entry(id.clone())
            .or_insert_with(|| SnapshotClock {
                last: snapshot::list(&self.store_dir(id))
                    .into_iter()
                    .rfind(|&s| s <= version)
                    .unwrap_or(0),
                not_before: Instant::now() + self.shared.config.snapshot_min_interval,
            });
        // Except after replaying at least `snapshot_interval` changelogs since the last
        // snapshot: the next commit snapshots whatever the clock says, so that the next process
        // to rebuild the store (a restart on another machine, or after the local folder was
        // lost) does not replay them all again.
        let interval = self.shared.config.snapshot_interval;
        let since_snapshot = version.saturating_sub(clock.last);
        if interval > 0 && replayed.unwrap_or(since_snapshot).min(since_snapshot) >= interval {
            clock.not_before = Instant::now();
        }
        drop(background);
        Ok(Box::new(RocksDbStateStore {
            id: id.clone(),
            version,
            // Prefix reads seek within a prefix only where the instance has that extractor.
            shape: if self.shape(id) == shape {
                shape
            } else {
                KeyShape::Opaque
            },
            db,
            db_path: self.local_dir.join(Self::rel(id)),
            staged: Staged::default(),
            changelog_dir: self.store_dir(id),
            memtables: MemtableBound {
                manager: self.shared.memtables.clone(),
                bytes: self.shared.config.memtable_bytes,
            },
            snapshot_interval: self.shared.config.snapshot_interval,
            snapshot_min_interval: self.shared.config.snapshot_min_interval,
            uploaded: None,
            key_delta: Some(0),
            overlay,
            background: Arc::clone(&self.uploads),
            asynchronous: self.shared.config.async_checkpoint,
            io: BatchBytes::default(),
        }))
    }
}

impl StateStoreProvider for RocksDbStateStoreProvider {
    fn name(&self) -> &'static str {
        "rocksdb"
    }

    fn supports_async_checkpoint(&self) -> bool {
        true
    }

    fn wait_durable(&self, version: u64) -> Result<()> {
        let ids: Vec<StoreId> = self
            .uploads
            .lock()
            .map_err(|_| Error::Backend {
                store: "uploads".into(),
                message: "lock poisoned".into(),
            })?
            .uploads
            .iter()
            .filter(|(_, u)| u.pending.is_some() && u.version <= version)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            finish_upload(&self.uploads, &id)?;
        }
        Ok(())
    }

    fn close(&self) -> Result<()> {
        let ids: Vec<StoreId> = self
            .uploads
            .lock()
            .map_err(|_| Error::Backend {
                store: "uploads".into(),
                message: "lock poisoned".into(),
            })?
            .uploads
            .keys()
            .cloned()
            .collect();
        let mut first_error = None;
        for id in ids {
            if let Err(e) = finish_upload(&self.uploads, &id) {
                first_error.get_or_insert(e);
            }
        }
        // Writes skip RocksDB's WAL: flush them so that the next run of the query finds the
        // instances at their versions rather than replaying the last changelogs, then close
        // them (the next run of the query in this process opens them again).
        let open = std::mem::take(&mut *self.open.lock().map_err(|_| Error::Backend {
            store: "instances".into(),
            message: "lock poisoned".into(),
        })?);
        for (id, db) in open {
            if let Err(e) = db.flush() {
                first_error.get_or_insert(backend(&id, e));
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn open(&self, id: &StoreId, version: u64) -> Result<Box<dyn StateStore>> {
        self.open_store(id, version, KeyShape::Opaque)
    }

    fn open_shaped(
        &self,
        id: &StoreId,
        version: u64,
        shape: KeyShape,
    ) -> Result<Box<dyn StateStore>> {
        self.open_store(id, version, shape)
    }

    fn purge_below(&self, id: &StoreId, version: u64) -> Result<()> {
        // An upload in flight adds files no manifest lists yet: never purge under it, but leave
        // the purge to the store's next commit (waiting here would undo the overlap). The lock
        // is held while purging so that no upload starts meanwhile.
        let mut bg = self
            .uploads
            .lock()
            .map_err(|_| backend(id, "lock poisoned"))?;
        if bg.uploads.contains_key(id) {
            let below = bg.purges.entry(id.clone()).or_insert(version);
            *below = (*below).max(version);
            return Ok(());
        }
        snapshot::purge(&self.store_dir(id), version).map_err(|e| backend(id, e))?;
        Ok(())
    }
}

/// Writes applied since opening, newest per key: the applied batches as they came (their keys
/// and values are not copied again) and a hash table of where each key's newest write lies. A
/// batch stages hundreds of thousands of keys and looks each up; only a scan and the commit
/// need them in order.
#[derive(Default)]
struct Staged {
    batches: Vec<WriteBatch>,
    /// (batch, operation) of each staged key's newest write: 32 bits each, half the table a
    /// pair of `usize`s makes (a join's batch stages hundreds of thousands of keys).
    newest: hashbrown::HashTable<(u32, u32)>,
    hasher: foldhash::fast::RandomState,
}

impl Staged {
    fn op(&self, (b, i): (u32, u32)) -> OpRef<'_> {
        self.batches[b as usize].at(i as usize)
    }

    /// Stages `batch`'s operations over those staged before (a later write of a key wins).
    /// Refuses a batch past 2^32 - 1 operations, or past that many batches, which the table's
    /// positions cannot name.
    fn apply(&mut self, batch: WriteBatch) -> std::result::Result<(), &'static str> {
        let too_many = "more than 2^32 - 1 writes or batches staged in one version";
        let b = u32::try_from(self.batches.len()).map_err(|_| too_many)?;
        if u32::try_from(batch.len()).is_err() {
            return Err(too_many);
        }
        let (batches, hasher) = (&self.batches, &self.hasher);
        self.newest.reserve(batch.len(), |&(ob, oi)| {
            hasher.hash_one(batches[ob as usize].at(oi as usize).0)
        });
        for i in 0..batch.len() as u32 {
            let key = batch.at(i as usize).0;
            let hash = self.hasher.hash_one(key);
            let batches = &self.batches;
            let found = self.newest.find_mut(hash, |&(ob, oi)| {
                let other = if ob == b {
                    &batch
                } else {
                    &batches[ob as usize]
                };
                other.at(oi as usize).0 == key
            });
            match found {
                Some(at) => *at = (b, i),
                None => {
                    // Room was reserved above: the hasher is not called.
                    self.newest.insert_unique(hash, (b, i), |_| hash);
                }
            }
        }
        self.batches.push(batch);
        Ok(())
    }

    /// The newest staged write of `key`: `Some(None)` if it deletes it, `None` if none.
    fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        let hash = self.hasher.hash_one(key);
        let at = self.newest.find(hash, |&at| self.op(at).0 == key)?;
        Some(self.op(*at).1)
    }

    /// Each staged key's newest write, in no order.
    fn iter(&self) -> impl Iterator<Item = OpRef<'_>> {
        self.newest.iter().map(|&at| self.op(at))
    }

    /// Each staged key's newest write in key order (RocksDB's memtable takes sorted inserts
    /// much faster), each with its key's first 16 bytes.
    fn sorted(&self) -> Vec<(u128, OpRef<'_>)> {
        // Compared by their first 16 bytes as one integer first: the staged writes come in
        // random order, and sorting a join's 400 k keys with `memcmp` alone was 9 % of q5's
        // time.
        let mut ops: Vec<(u128, OpRef<'_>)> =
            self.iter().map(|op| (key_prefix(op.0), op)).collect();
        ops.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.0.cmp(b.1.0)));
        ops
    }
}

struct RocksDbStateStore {
    id: StoreId,
    version: u64,
    /// The shape of the store's keys: a [`KeyShape::Prefixed`] store's prefix scans seek the
    /// first key of a prefix, which the instance's prefix filter then recognises.
    shape: KeyShape,
    db: Arc<DB>,
    db_path: PathBuf,
    /// Writes applied since opening, newest per key; `None` deletes. Hashed: a batch stages
    /// hundreds of thousands of keys and looks each up; only a scan needs them in order.
    staged: Staged,
    changelog_dir: PathBuf,
    memtables: MemtableBound,
    snapshot_interval: u64,
    snapshot_min_interval: Duration,
    /// The snapshot the last commit took, if it took one.
    uploaded: Option<snapshot::Uploaded>,
    /// The key count change the applied batches stated; `None` once one did not.
    key_delta: Option<i64>,
    /// With async checkpointing, the writes of this store's version that the background may
    /// not have applied to the local instance yet; read before it.
    overlay: Option<Arc<Pending>>,
    /// Where the provider tracks this store's upload in flight.
    background: Uploads,
    /// Whether commits leave the version's writes to the background (async checkpointing).
    asynchronous: bool,
    /// The batch's reads and writes, in bytes, for Spark's `rocksdbTotalBytesRead` (values
    /// point reads returned), `rocksdbTotalBytesReadThroughIterator` (keys and values scans
    /// visited) and `rocksdbTotalBytesWritten` (keys and values the commit wrote).
    io: BatchBytes,
}

/// Bytes a store's batch read and wrote (reads take `&self`: hence cells).
#[derive(Debug, Default)]
struct BatchBytes {
    read: std::cell::Cell<u64>,
    read_by_iterator: std::cell::Cell<u64>,
    written: u64,
}

impl BatchBytes {
    fn add(cell: &std::cell::Cell<u64>, bytes: usize) {
        cell.set(cell.get().saturating_add(bytes as u64));
    }
}

/// The memtables' memory bound. It is soft while writing; each commit enforces it by flushing,
/// so memory stays bounded however far RocksDB's background flushes lag.
#[derive(Clone)]
struct MemtableBound {
    manager: WriteBufferManager,
    bytes: usize,
}

/// Makes `version` (`batch`, leaving `num_keys` keys) durable and local: its changelog into the
/// checkpoint first (once there, the version can be rebuilt), then the local instance, flushed
/// when the memtables are over their bound.
fn persist<'a>(
    db: &DB,
    id: &StoreId,
    changelog_dir: &Path,
    batch: impl Iterator<Item = OpRef<'a>> + Clone,
    version: u64,
    num_keys: u64,
    memtables: &MemtableBound,
) -> Result<()> {
    let trailer = store_changelog(id, changelog_dir, version, batch.clone(), num_keys)?;
    write_counted(db, id, batch, version, num_keys, &trailer)?;
    if memtables.manager.get_usage() > memtables.bytes {
        db.flush().map_err(|e| backend(id, e))?;
    }
    Ok(())
}

/// The first position at or after `from` in `ops` (in key order) whose key is not below `key`:
/// an exponential search, as the keys asked for come in order and the next is usually near.
fn seek(ops: &WriteBatch, from: usize, key: &[u8]) -> usize {
    let below = |i: usize| ops.at(i).0 < key;
    // Every position before `lo` is below `key`.
    let (mut lo, mut step) = (from, 1);
    while lo + step <= ops.len() && below(lo + step - 1) {
        lo += step;
        step *= 2;
    }
    let hi = (lo + step).min(ops.len());
    partition_point(ops, lo..hi, |k| k < key)
}

/// The first position in `within` of `ops` (in key order) whose key `below` is false for.
fn partition_point(
    ops: &WriteBatch,
    within: std::ops::Range<usize>,
    below: impl Fn(&[u8]) -> bool,
) -> usize {
    let std::ops::Range {
        start: mut lo,
        end: mut hi,
    } = within;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if below(ops.at(mid).0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// `upper` and `lower`, both in key order, merged in key order; on a key in both, `upper`'s.
fn merge_sorted<'a>(
    upper: Vec<OpRef<'a>>,
    lower: impl Iterator<Item = OpRef<'a>>,
) -> Vec<OpRef<'a>> {
    let mut lower = lower.peekable();
    let mut out = Vec::with_capacity(upper.len() + lower.size_hint().0);
    for u in upper {
        while let Some(l) = lower.next_if(|l| l.0 < u.0) {
            out.push(l);
        }
        lower.next_if(|l| l.0 == u.0);
        out.push(u);
    }
    out.extend(lower);
    out
}

impl RocksDbStateStore {
    /// Whether committing `next` takes a snapshot: `snapshot_interval` versions since the last
    /// one and `snapshot_min_interval` since it (or since the store was first opened). If so,
    /// the snapshot is counted as taken now.
    fn snapshot_due(&self, next: u64) -> Result<bool> {
        if self.snapshot_interval == 0 {
            return Ok(false);
        }
        let mut bg = self
            .background
            .lock()
            .map_err(|_| backend(&self.id, "lock poisoned"))?;
        // `open` started the store's clock.
        let clock = bg
            .snapshots
            .get_mut(&self.id)
            .ok_or_else(|| backend(&self.id, "the store's snapshot clock is missing"))?;
        let now = Instant::now();
        let due =
            next.saturating_sub(clock.last) >= self.snapshot_interval && now >= clock.not_before;
        if due {
            *clock = SnapshotClock {
                last: next,
                not_before: now + self.snapshot_min_interval,
            };
        }
        Ok(due)
    }
}

impl StateStore for RocksDbStateStore {
    fn id(&self) -> &StoreId {
        &self.id
    }

    fn version(&self) -> u64 {
        self.version
    }

    fn multi_get(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        // In key order: the overlay (sorted) is then walked once rather than searched per key,
        // and RocksDB's batched MultiGet is fastest on sorted keys.
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_unstable_by(|&a, &b| keys[a].cmp(keys[b]));
        let empty = WriteBatch::new();
        let overlay = self.overlay.as_ref().map_or(&empty, |p| &p.batch);
        let mut out: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        let mut from_db = Vec::with_capacity(keys.len());
        let mut next = 0;
        for &i in &order {
            let key = keys[i];
            if let Some(written) = self.staged.get(key) {
                out[i] = written.map(<[u8]>::to_vec);
                continue;
            }
            next = seek(overlay, next, key);
            match overlay.get(next) {
                Some((k, written)) if k == key => out[i] = written.map(<[u8]>::to_vec),
                _ => from_db.push(i),
            }
        }
        let cf = self
            .db
            .cf_handle("default")
            .ok_or_else(|| backend(&self.id, "the default column family is missing"))?;
        // In chunks: RocksDB's MultiGet allocates its per-key contexts for the whole call
        // (about a kilobyte a key), which for a batch's hundreds of thousands of keys was most
        // of a join's peak memory (issue 21).
        for chunk in from_db.chunks(MULTI_GET_CHUNK) {
            let found = self
                .db
                .batched_multi_get_cf(&cf, chunk.iter().map(|&i| keys[i]), true);
            for (&i, v) in chunk.iter().zip(found) {
                out[i] = v.map_err(|e| backend(&self.id, e))?.map(|v| v.to_vec());
            }
        }
        BatchBytes::add(&self.io.read, out.iter().flatten().map(Vec::len).sum());
        Ok(out)
    }

    fn scan_each(&self, range: &KeyRange, visit: &mut dyn FnMut(&[u8], &[u8])) -> Result<()> {
        let mut read = 0usize;
        let mut visit = |k: &[u8], v: &[u8]| {
            read += k.len() + v.len();
            visit(k, v);
        };
        let mut ro = total_order();
        if let std::ops::Bound::Included(s) | std::ops::Bound::Excluded(s) = &range.start {
            ro.set_iterate_lower_bound(s.clone());
        }
        if let std::ops::Bound::Excluded(e) = &range.end {
            ro.set_iterate_upper_bound(e.clone());
        }
        // The instance's keys and the staged writes in the range, both in key order: merged in
        // one pass.
        let mut in_range: Vec<OpRef<'_>> = self
            .staged
            .iter()
            .filter(|(k, _)| range.contains(k))
            .collect();
        in_range.sort_unstable_by(|a, b| a.0.cmp(b.0));
        if let Some(overlay) = &self.overlay {
            // The version's writes not yet in the instance, under the staged ones.
            in_range = merge_sorted(in_range, overlay.range(range));
        }
        let mut staged = in_range.into_iter().peekable();
        // A raw iterator lends each entry: nothing is copied that `visit` does not keep.
        let mut it = self.db.raw_iterator_opt(ro);
        it.seek_to_first();
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if range.past_end(k) {
                break;
            }
            if range.contains(k) {
                while let Some((sk, sv)) = staged.next_if(|(sk, _)| *sk < k) {
                    if let Some(sv) = sv {
                        visit(sk, sv);
                    }
                }
                match staged.next_if(|(sk, _)| *sk == k) {
                    Some((_, Some(sv))) => visit(k, sv),
                    Some((_, None)) => {}
                    None => visit(k, v),
                }
            }
            it.next();
        }
        it.status().map_err(|e| backend(&self.id, e))?;
        for (sk, sv) in staged {
            if let Some(sv) = sv {
                visit(sk, sv);
            }
        }
        BatchBytes::add(&self.io.read_by_iterator, read);
        Ok(())
    }

    fn scan_prefixes(&self, prefixes: &[&[u8]], visit: &mut PrefixVisitor<'_>) -> Result<()> {
        let mut read = 0usize;
        let mut visit = |i: usize, k: &[u8], v: &[u8]| {
            read += k.len() + v.len();
            visit(i, k, v);
        };
        // One iterator for every prefix, in order. In a prefixed store's instance, a seek to a
        // prefix that no file or memtable holds (by their prefix filters) reads nothing, and
        // the iterator ends with the prefix; elsewhere the prefix test below ends it.
        let (suffix, ro) = match self.shape {
            KeyShape::Prefixed { suffix } => {
                let mut ro = ReadOptions::default();
                ro.set_prefix_same_as_start(true);
                (suffix, ro)
            }
            KeyShape::Opaque => (0, total_order()),
        };
        let mut order: Vec<usize> = (0..prefixes.len()).collect();
        order.sort_by(|&a, &b| prefixes[a].cmp(prefixes[b]));
        // The staged writes (and the version's not yet in the instance, under them) in key
        // order, once for all prefixes.
        let mut written: Vec<OpRef<'_>> = self.staged.iter().collect();
        written.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut it = self.db.raw_iterator_opt(ro);
        let mut target = Vec::new();
        for i in order {
            let prefix = prefixes[i];
            // The prefix's first possible key, in which the extractor sees the whole prefix.
            target.clear();
            target.extend_from_slice(prefix);
            target.resize(prefix.len() + suffix, 0);
            it.seek(&target);
            let from = written.partition_point(|(k, _)| *k < prefix);
            let to = from + written[from..].partition_point(|(k, _)| k.starts_with(prefix));
            // The version's writes not yet in the instance, under the staged ones: only the
            // prefix's, as the overlay is a whole version's writes.
            let merged;
            let staged = match &self.overlay {
                Some(overlay) => {
                    merged = merge_sorted(written[from..to].to_vec(), overlay.with_prefix(prefix));
                    &merged[..]
                }
                None => &written[from..to],
            };
            let mut staged = staged.iter().copied().peekable();
            while let (Some(k), Some(v)) = (it.key(), it.value()) {
                if !k.starts_with(prefix) {
                    break;
                }
                while let Some((sk, sv)) = staged.next_if(|(sk, _)| *sk < k) {
                    if let Some(sv) = sv {
                        visit(i, sk, sv);
                    }
                }
                match staged.next_if(|(sk, _)| *sk == k) {
                    Some((_, Some(sv))) => visit(i, k, sv),
                    Some((_, None)) => {}
                    None => visit(i, k, v),
                }
                it.next();
            }
            it.status().map_err(|e| backend(&self.id, e))?;
            for (sk, sv) in staged {
                if let Some(sv) = sv {
                    visit(i, sk, sv);
                }
            }
        }
        BatchBytes::add(&self.io.read_by_iterator, read);
        Ok(())
    }

    fn apply(&mut self, batch: WriteBatch) -> Result<()> {
        self.key_delta = match (self.key_delta, batch.key_delta()) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        self.staged.apply(batch).map_err(|e| backend(&self.id, e))
    }

    fn commit(&mut self) -> Result<u64> {
        let next = self.version + 1;
        let staged = std::mem::take(&mut self.staged);
        // Each key's newest write, in key order, read where it was staged (not copied: a
        // batch's writes are most of a join's memory at its peak).
        let sorted = staged.sorted();
        let ops = sorted.iter().map(|&(_, op)| op);
        // The slices' lengths only: the pass reads none of the bytes.
        self.io.written = ops
            .clone()
            .map(|(k, v)| (k.len() + v.map_or(0, <[u8]>::len)) as u64)
            .sum();
        let key_delta = self.key_delta.replace(0);
        // At most one upload in flight per store: wait for the last one (its failure is this
        // commit's; with async checkpointing the instance is then at this store's version) and
        // report the snapshot it copied, then run the purges asked for meanwhile.
        let uploads = Arc::clone(&self.background);
        self.uploaded = finish_upload(&uploads, &self.id)?;
        let purge = uploads
            .lock()
            .map_err(|_| backend(&self.id, "lock poisoned"))?
            .purges
            .remove(&self.id);
        if let Some(below) = purge {
            snapshot::purge(&self.changelog_dir, below).map_err(|e| backend(&self.id, e))?;
        }
        let num_keys = count_keys(&self.db, &self.id, key_delta, ops.clone())?;
        let snapshot_due = self.snapshot_due(next)?;
        let upload = if self.asynchronous {
            // Leave writing the version to the local instance, its changelog and any snapshot
            // to the background. Readers of the new version read its writes from the overlay
            // until then.
            let pending = Arc::new(Pending {
                batch: WriteBatch::of(ops),
                num_keys,
            });
            let handle = {
                let (id, dir) = (self.id.clone(), self.changelog_dir.clone());
                let (db, db_path) = (Arc::clone(&self.db), self.db_path.clone());
                let memtables = self.memtables.clone();
                let pending = Arc::clone(&pending);
                std::thread::spawn(move || {
                    let p = &pending;
                    persist(&db, &id, &dir, p.batch.iter(), next, p.num_keys, &memtables)?;
                    // The next version is written only after this upload is finished.
                    if snapshot_due {
                        let staged = snapshot::stage(&db, &id, &db_path, next)?;
                        return snapshot::upload(staged, &id, &dir).map(Some);
                    }
                    Ok(None)
                })
            };
            self.overlay = Some(Arc::clone(&pending));
            Some(Upload {
                version: next,
                pending: Some(pending),
                handle,
            })
        } else {
            persist(
                &self.db,
                &self.id,
                &self.changelog_dir,
                ops,
                next,
                num_keys,
                &self.memtables,
            )?;
            // The version is durable through its changelog; a snapshot only shortens a
            // rebuild. It is fixed here, before the instance changes again (a RocksDB
            // checkpoint of hard links), and its files are copied into the checkpoint in the
            // background while the next batch runs.
            if snapshot_due {
                let staged = snapshot::stage(&self.db, &self.id, &self.db_path, next)?;
                let (id, dir) = (self.id.clone(), self.changelog_dir.clone());
                Some(Upload {
                    version: next,
                    pending: None,
                    handle: std::thread::spawn(move || {
                        snapshot::upload(staged, &id, &dir).map(Some)
                    }),
                })
            } else {
                None
            }
        };
        if let Some(upload) = upload {
            uploads
                .lock()
                .map_err(|_| backend(&self.id, "lock poisoned"))?
                .uploads
                .insert(self.id.clone(), upload);
        }
        self.version = next;
        Ok(next)
    }

    fn metrics(&self) -> StoreMetrics {
        let prop = |name: &str| self.db.property_int_value(name).ok().flatten().unwrap_or(0);
        let mut custom = BTreeMap::new();
        custom.insert(
            "rocksdbSstFileSize".to_string(),
            prop("rocksdb.total-sst-files-size") as i64,
        );
        let up = self.uploaded.unwrap_or_default();
        custom.insert("rocksdbBytesCopied".into(), up.bytes_copied as i64);
        custom.insert("rocksdbFilesCopied".into(), up.files_copied as i64);
        custom.insert("rocksdbFilesReused".into(), up.files_reused as i64);
        custom.insert("rocksdbCommitCheckpointLatency".into(), up.millis as i64);
        custom.insert("rocksdbTotalBytesRead".into(), self.io.read.get() as i64);
        custom.insert(
            "rocksdbTotalBytesReadThroughIterator".into(),
            self.io.read_by_iterator.get() as i64,
        );
        custom.insert("rocksdbTotalBytesWritten".into(), self.io.written as i64);
        StoreMetrics {
            num_keys: match &self.overlay {
                Some(p) => p.num_keys,
                None => meta_u64(&self.db, &self.id, NUM_KEYS_KEY).unwrap_or(0),
            },
            memory_used_bytes: prop("rocksdb.cur-size-all-mem-tables")
                + prop("rocksdb.estimate-table-readers-mem"),
            custom,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(dir: &tempfile::TempDir, local: &str) -> RocksDbStateStoreProvider {
        RocksDbStateStoreProvider::new(dir.path().join("checkpoint"), dir.path().join(local))
    }

    #[test]
    fn seek_finds_the_first_key_not_below_from_any_start() {
        for n in 0..40u8 {
            // Even keys 0, 2, ..: every odd key falls between two, every even one is present.
            let mut ops = WriteBatch::new();
            (0..n).for_each(|i| ops.delete([2 * i]));
            for key in 0..2 * n + 2 {
                let want = (0..n).filter(|i| 2 * i < key).count();
                for from in 0..=want {
                    assert_eq!(
                        seek(&ops, from, &[key]),
                        want,
                        "n {n} key {key} from {from}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_rocksdb_provider_meets_the_state_store_contract() {
        let dir = tempfile::tempdir().unwrap();
        crate::conformance::check(&provider(&dir, "local"), false);
    }

    #[test]
    fn a_batch_reports_the_bytes_it_read_and_wrote_under_sparks_metric_names() {
        let dir = tempfile::tempdir().unwrap();
        let p = provider(&dir, "local");
        let id = StoreId::new(1, 0, "default");
        let bytes = |s: &dyn StateStore, name: &str| s.metrics().custom[name];
        let mut s = p.open(&id, 0).unwrap();
        let mut b = WriteBatch::new();
        b.put(b"k1", b"value-1");
        b.put(b"k2", b"v2");
        b.put(b"k3", b"v3");
        s.apply(b).unwrap();
        s.commit().unwrap();
        // Keys and values of the newest write of each key: 2 + 7, 2 + 2, 2 + 2.
        assert_eq!(bytes(s.as_ref(), "rocksdbTotalBytesWritten"), 17);

        // The next batch's figures start from nothing.
        let mut s = p.open(&id, 1).unwrap();
        assert_eq!(bytes(s.as_ref(), "rocksdbTotalBytesRead"), 0);
        // Point reads count the values found (a staged write's too), not the keys asked for.
        let mut b = WriteBatch::new();
        b.put(b"k4", b"v4-new");
        b.delete(b"k3");
        s.apply(b).unwrap();
        s.multi_get(&[b"k1", b"k4", b"k3", b"zz"]).unwrap();
        assert_eq!(bytes(s.as_ref(), "rocksdbTotalBytesRead"), 7 + 6);
        // Scans count the keys and values they visit: k1, k2 and the staged k4.
        s.scan(&KeyRange::all()).unwrap();
        s.scan_prefixes(&[b"k2"], &mut |_, _, _| {}).unwrap();
        assert_eq!(
            bytes(s.as_ref(), "rocksdbTotalBytesReadThroughIterator"),
            (9 + 4 + 8) + 4
        );
        s.commit().unwrap();
        // A delete writes its key.
        assert_eq!(bytes(s.as_ref(), "rocksdbTotalBytesWritten"), 8 + 2);
    }

    #[test]
    fn a_new_process_rebuilds_its_state_from_the_checkpoints_changelogs() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(1, 0, "default");
        {
            let p = provider(&dir, "local-a");
            let mut s = p.open(&id, 0).unwrap();
            let mut b = WriteBatch::new();
            b.put(b"k1", b"v1");
            b.put(b"k2", b"v2");
            s.apply(b).unwrap();
            s.commit().unwrap();
            let mut s = p.open(&id, 1).unwrap();
            let mut b = WriteBatch::new();
            b.delete(b"k1");
            s.apply(b).unwrap();
            s.commit().unwrap();
        }
        // Another machine: no local instance, only the checkpoint.
        let p = provider(&dir, "local-b");
        let s = p.open(&id, 2).unwrap();
        assert_eq!(
            s.multi_get(&[b"k1", b"k2"]).unwrap(),
            vec![None, Some(b"v2".to_vec())]
        );
        // The local instance ahead of the asked version is rolled back by a rebuild.
        let s1 = p.open(&id, 1).unwrap();
        assert_eq!(s1.multi_get(&[b"k1"]).unwrap(), vec![Some(b"v1".to_vec())]);
    }

    #[test]
    fn the_next_run_reuses_the_local_instance_and_rebuilds_a_diverged_one() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        drop_after(provider(&dir, "local"), |p| write_versions(p, &id, 5));
        // Only the newest changelog is left: a rebuild could not reach version 5, so opening
        // it works only by reusing the instance the last run left.
        let store_dir = dir.path().join("checkpoint/0/0/default");
        for v in 1..5 {
            std::fs::remove_file(store_dir.join(format!("{v}.changelog"))).unwrap();
        }
        drop_after(provider(&dir, "local"), |p| {
            check_version(p.open(&id, 5).unwrap().as_ref(), 5);
        });
        // A checkpoint whose changelog 5 is another one (a copy restored over it, say): the
        // instance is not trusted, and the rebuild from what the checkpoint has fails loudly
        // rather than serving the old instance.
        let mut other = WriteBatch::new();
        other.put(b"other", b"x");
        write_changelog(&id, &store_dir, 5, &encode_changelog(&other, 1).unwrap()).unwrap();
        let err = provider(&dir, "local")
            .open(&id, 5)
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(err, Error::VersionNotFound { .. }), "{err}");
        // With its changelogs all there, the diverged instance is rebuilt from them.
        let dir = tempfile::tempdir().unwrap();
        drop_after(provider(&dir, "local"), |p| write_versions(p, &id, 3));
        let store_dir = dir.path().join("checkpoint/0/0/default");
        write_changelog(&id, &store_dir, 3, &encode_changelog(&other, 1).unwrap()).unwrap();
        let p = provider(&dir, "local");
        let s = p.open(&id, 3).unwrap();
        assert_eq!(s.multi_get(&[b"other"]).unwrap(), vec![Some(b"x".to_vec())]);
        assert_eq!(s.scan(&KeyRange::all()).unwrap().len(), 21);
    }

    #[test]
    fn a_local_instance_is_reused_across_a_change_of_compression() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        let with = |compression| {
            RocksDbStateStoreProvider::with_config(
                dir.path().join("checkpoint"),
                dir.path().join("local"),
                RocksDbConfig {
                    compression,
                    ..RocksDbConfig::default()
                },
            )
        };
        // Each run flushes its versions to SST files when it closes, compressed as it says.
        drop_after(with(SstCompression::Lz4), |p| write_versions(p, &id, 3));
        drop_after(with(SstCompression::None), |p| {
            check_version(p.open(&id, 3).unwrap().as_ref(), 3);
            write_versions_from(p, &id, 3, 6);
        });
        // Only the newest changelog is left: the instance must be reused, files of both kinds.
        let store_dir = dir.path().join("checkpoint/0/0/default");
        for v in 1..6 {
            std::fs::remove_file(store_dir.join(format!("{v}.changelog"))).unwrap();
        }
        drop_after(with(SstCompression::Lz4), |p| {
            check_version(p.open(&id, 6).unwrap().as_ref(), 6);
        });
    }

    /// Flips the bits of byte `at` of the file at `path`.
    fn flip_byte(path: &Path, at: usize) {
        let mut bytes = std::fs::read(path).unwrap();
        bytes[at] ^= 0xff;
        std::fs::write(path, bytes).unwrap();
    }

    /// Runs `f` on `p`, then closes it as a run's end does.
    fn drop_after(p: RocksDbStateStoreProvider, f: impl FnOnce(&RocksDbStateStoreProvider)) {
        f(&p);
        p.close().unwrap();
    }

    #[test]
    fn a_damaged_changelog_is_reported_not_applied() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        {
            let p = provider(&dir, "local-a");
            let mut s = p.open(&id, 0).unwrap();
            let mut b = WriteBatch::new();
            b.put(b"k", b"v");
            s.apply(b).unwrap();
            s.commit().unwrap();
        }
        let path = dir.path().join("checkpoint/0/0/default/1.changelog");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 9;
        bytes[last] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        let err = provider(&dir, "local-b").open(&id, 1).err().unwrap();
        assert_eq!(err.error_class(), "STATE_STORE_FILE_CORRUPT", "{err}");
        assert!(err.to_string().contains("1.changelog"), "{err}");
    }

    fn with_snapshots(
        dir: &tempfile::TempDir,
        local: &str,
        every: u64,
    ) -> RocksDbStateStoreProvider {
        clocked(dir, local, every, Duration::ZERO)
    }

    /// A provider snapshotting every `every` versions once `min_interval` has passed.
    fn clocked(
        dir: &tempfile::TempDir,
        local: &str,
        every: u64,
        min_interval: Duration,
    ) -> RocksDbStateStoreProvider {
        RocksDbStateStoreProvider::with_config(
            dir.path().join("checkpoint"),
            dir.path().join(local),
            RocksDbConfig {
                snapshot_interval: every,
                snapshot_min_interval: min_interval,
                ..RocksDbConfig::default()
            },
        )
    }

    /// Version v holds keys 0..v*10 with value v for the keys written at v, and key "gone"
    /// deleted at version 7.
    fn write_versions(p: &RocksDbStateStoreProvider, id: &StoreId, versions: u64) {
        write_versions_from(p, id, 0, versions);
    }

    /// Commits versions `from + 1..=to`.
    fn write_versions_from(p: &RocksDbStateStoreProvider, id: &StoreId, from: u64, to: u64) {
        for v in from..to {
            write_version(p, id, v);
        }
    }

    fn write_version(p: &RocksDbStateStoreProvider, id: &StoreId, v: u64) {
        let mut s = p.open(id, v).unwrap();
        let mut b = WriteBatch::new();
        for i in 0..10u64 {
            b.put((v * 10 + i).to_be_bytes(), v.to_be_bytes());
        }
        if v == 3 {
            b.put(b"gone", b"x");
        }
        if v == 7 {
            b.delete(b"gone");
        }
        s.apply(b).unwrap();
        s.commit().unwrap();
    }

    fn check_version(s: &dyn StateStore, v: u64) {
        let all = s.scan(&KeyRange::all()).unwrap();
        assert_eq!(
            all.len() as u64,
            v * 10 + u64::from((4..8).contains(&v)),
            "version {v}"
        );
        assert_eq!(s.metrics().num_keys, all.len() as u64, "version {v}");
    }

    /// A provider snapshotting every `snapshot_interval` versions, asynchronous or not.
    fn configured(
        dir: &tempfile::TempDir,
        local: &str,
        snapshot_interval: u64,
        async_checkpoint: bool,
    ) -> RocksDbStateStoreProvider {
        RocksDbStateStoreProvider::with_config(
            dir.path().join("checkpoint"),
            dir.path().join(local),
            RocksDbConfig {
                snapshot_interval,
                snapshot_min_interval: Duration::ZERO,
                async_checkpoint,
                ..RocksDbConfig::default()
            },
        )
    }

    fn asynchronous(dir: &tempfile::TempDir, local: &str) -> RocksDbStateStoreProvider {
        configured(dir, local, 5, true)
    }

    /// RocksDB's own log stays small however many versions and snapshots a store goes through.
    #[test]
    fn the_rocksdb_info_log_does_not_grow_with_every_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let p = configured(&dir, "local", 1, false);
        let id = StoreId::new(0, 0, "default");
        for v in 0..60u64 {
            let mut s = p.open(&id, v).unwrap();
            let mut b = WriteBatch::new();
            b.put(v.to_be_bytes(), vec![1]);
            s.apply(b).unwrap();
            s.commit().unwrap();
        }
        let mut logged = 0;
        let mut todo = vec![dir.path().join("local")];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(d).unwrap().flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if e.file_type().unwrap().is_dir() {
                    todo.push(e.path());
                } else if name.starts_with("LOG") {
                    logged += e.metadata().unwrap().len();
                }
            }
        }
        // At info level this is about 14 KB per snapshot: 800 KB here.
        assert!(logged < 64 << 10, "RocksDB logged {logged} bytes");
    }

    #[test]
    fn the_asynchronous_provider_meets_the_state_store_contract() {
        let dir = tempfile::tempdir().unwrap();
        crate::conformance::check(&asynchronous(&dir, "local"), false);
    }

    #[test]
    fn asynchronous_versions_become_durable_and_rebuild_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        let p = asynchronous(&dir, "local-a");
        write_versions(&p, &id, 12);
        // Committed locally at once, readable at the next version before any upload is waited
        // for; durable after wait_durable.
        check_version(p.open(&id, 12).unwrap().as_ref(), 12);
        p.wait_durable(12).unwrap();
        assert!(p.changelog(&id, 12).exists());
        let store_dir = dir.path().join("checkpoint/0/0/default");
        assert_eq!(snapshot::list(&store_dir), vec![5, 10]);
        check_version(
            asynchronous(&dir, "local-b")
                .open(&id, 12)
                .unwrap()
                .as_ref(),
            12,
        );
    }

    #[test]
    fn a_failed_asynchronous_upload_fails_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        let p = asynchronous(&dir, "local");
        write_versions(&p, &id, 1);
        p.wait_durable(1).unwrap();
        // The store's checkpoint folder becomes a file: the next upload cannot write.
        let store_dir = dir.path().join("checkpoint/0/0/default");
        std::fs::remove_dir_all(&store_dir).unwrap();
        std::fs::write(&store_dir, b"not a folder").unwrap();
        let mut s = p.open(&id, 1).unwrap();
        s.apply(WriteBatch::new()).unwrap();
        s.commit().unwrap();
        let err = p.wait_durable(2).unwrap_err();
        assert_eq!(err.error_class(), "STATE_STORE_IO_ERROR", "{err}");
    }

    #[test]
    fn the_next_batch_reads_a_version_the_background_has_not_applied() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        let p = asynchronous(&dir, "local");
        let mut s = p.open(&id, 0).unwrap();
        let mut b = WriteBatch::new();
        b.put(b"a", b"1");
        b.put(b"b", b"2");
        s.apply(b).unwrap();
        s.commit().unwrap();
        p.wait_durable(1).unwrap();
        // The store's checkpoint folder becomes a file: version 2's background work fails at
        // its changelog, before it touches the local instance.
        let store_dir = dir.path().join("checkpoint/0/0/default");
        std::fs::remove_dir_all(&store_dir).unwrap();
        std::fs::write(&store_dir, b"not a folder").unwrap();
        let mut s = p.open(&id, 1).unwrap();
        let mut b = WriteBatch::new();
        b.put(b"a", b"10");
        b.delete(b"b");
        b.put(b"c", b"3");
        s.apply(b).unwrap();
        s.commit().unwrap();
        assert_eq!(s.metrics().num_keys, 2);
        // Version 2 is readable all the same, from its writes: point reads, scans, the count.
        let mut s = p.open(&id, 2).unwrap();
        assert_eq!(
            s.multi_get(&[b"a", b"b", b"c"]).unwrap(),
            vec![Some(b"10".to_vec()), None, Some(b"3".to_vec())]
        );
        s.apply({
            let mut b = WriteBatch::new();
            b.put(b"d", b"4");
            b
        })
        .unwrap();
        assert_eq!(
            s.scan(&KeyRange::all()).unwrap(),
            vec![
                (b"a".to_vec(), b"10".to_vec()),
                (b"c".to_vec(), b"3".to_vec()),
                (b"d".to_vec(), b"4".to_vec()),
            ]
        );
        assert_eq!(
            s.scan(&KeyRange::below(b"c".to_vec())).unwrap(),
            vec![(b"a".to_vec(), b"10".to_vec())]
        );
        assert_eq!(s.metrics().num_keys, 2);
        // The next commit is where the failure surfaces; the local instance never saw version 2.
        let err = s.commit().unwrap_err();
        assert_eq!(err.error_class(), "STATE_STORE_IO_ERROR", "{err}");
        assert_eq!(
            local_version(&p.db(&id, KeyShape::Opaque).unwrap(), &id).unwrap(),
            1
        );
    }

    #[test]
    fn a_snapshot_is_copied_while_the_next_batch_runs_and_a_failed_copy_fails_the_next_commit() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        let p = configured(&dir, "local", 1, false);
        let put = |s: &mut Box<dyn StateStore>, k: &[u8]| {
            let mut b = WriteBatch::new();
            b.put(k, b"v");
            s.apply(b).unwrap();
        };
        let copied = |s: &dyn StateStore| s.metrics().custom["rocksdbFilesCopied"];
        // Version 1's snapshot is copied in the background; the next commit waits for it and
        // reports it.
        let mut s = p.open(&id, 0).unwrap();
        put(&mut s, b"a");
        s.commit().unwrap();
        assert_eq!(
            copied(s.as_ref()),
            0,
            "not reported by the commit that started it"
        );
        let mut s = p.open(&id, 1).unwrap();
        put(&mut s, b"b");
        s.commit().unwrap();
        assert!(copied(s.as_ref()) > 0);
        let store_dir = dir.path().join("checkpoint/0/0/default");
        assert!(store_dir.join("1.snapshot").is_file());
        // Version 3's manifest cannot be written (a folder is in its place): its commit still
        // succeeds, as the version is durable through its changelog; the next one fails.
        std::fs::create_dir_all(store_dir.join("3.snapshot/blocked")).unwrap();
        let mut s = p.open(&id, 2).unwrap();
        put(&mut s, b"c");
        s.commit().unwrap();
        let mut s = p.open(&id, 3).unwrap();
        assert!(store_dir.join("3.changelog").is_file());
        assert_eq!(s.multi_get(&[b"c"]).unwrap(), vec![Some(b"v".to_vec())]);
        put(&mut s, b"d");
        let err = s.commit().unwrap_err();
        assert_eq!(err.error_class(), "STATE_STORE_IO_ERROR", "{err}");
    }

    #[test]
    fn a_purge_asked_for_during_an_upload_runs_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        let p = configured(&dir, "local", 2, true);
        write_versions(&p, &id, 5);
        // Version 5 may still be uploading: the purge waits for the store's next commit.
        p.purge_below(&id, 4).unwrap();
        write_version(&p, &id, 5);
        p.wait_durable(6).unwrap();
        let store_dir = dir.path().join("checkpoint/0/0/default");
        let mut left: Vec<u64> = std::fs::read_dir(&store_dir)
            .unwrap()
            .filter_map(|e| {
                e.unwrap()
                    .file_name()
                    .to_string_lossy()
                    .strip_suffix(".changelog")?
                    .parse()
                    .ok()
            })
            .collect();
        left.sort_unstable();
        assert_eq!(
            left,
            vec![3, 4, 5, 6],
            "changelogs left after purging below 4 (snapshot 4, and snapshot 2 in case 4 is damaged)"
        );
        drop(p);
        // A new process rebuilds version 6 from snapshot 6.
        let p = asynchronous(&dir, "local-b");
        check_version(p.open(&id, 6).unwrap().as_ref(), 6);
    }

    /// As Spark's maintenance task, a store snapshots at most once per `snapshot_min_interval`
    /// (the first an interval after it was opened), at the first commit `snapshot_interval`
    /// versions after its last snapshot once the interval has passed.
    #[test]
    fn snapshots_wait_for_the_maintenance_interval() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        let store_dir = dir.path().join("checkpoint/0/0/default");
        let gated = |local: &str, every: Duration| clocked(&dir, local, 2, every);
        // Within the hour after the store opened: changelogs only.
        let p = gated("local-a", Duration::from_secs(3600));
        write_versions(&p, &id, 12);
        assert_eq!(snapshot::list(&store_dir), Vec::<u64>::new());
        drop(p);
        // With a short interval: none before it has passed, then one at the first commit
        // after it, then none until two more versions and the interval have passed again.
        let every = Duration::from_secs(1);
        let p = gated("local-a", every);
        write_versions_from(&p, &id, 12, 14);
        assert_eq!(snapshot::list(&store_dir), Vec::<u64>::new());
        std::thread::sleep(every);
        write_version(&p, &id, 14);
        drop(p);
        assert_eq!(snapshot::list(&store_dir), vec![15]);
        let p = gated("local-a", every);
        drop(p.open(&id, 15).unwrap()); // the store's clock starts when it is opened
        std::thread::sleep(every);
        write_version(&p, &id, 15);
        assert_eq!(snapshot::list(&store_dir), vec![15], "one version since 15");
        write_version(&p, &id, 16);
        drop(p);
        assert_eq!(snapshot::list(&store_dir), vec![15, 17]);
    }

    /// An instance behind the newest snapshot (an empty one on a new machine) starts from the
    /// snapshot, not from every changelog since its own version, even while those are kept.
    #[test]
    fn an_empty_instance_starts_from_the_newest_snapshot_while_the_changelogs_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        let p = with_snapshots(&dir, "local-a", 5);
        write_versions(&p, &id, 12);
        drop(p);
        let store_dir = dir.path().join("checkpoint/0/0/default");
        assert_eq!(snapshot::list(&store_dir), vec![5, 10]);
        // Changelog 3, which only a replay from the start reads, is damaged.
        let path = store_dir.join("3.changelog");
        flip_byte(&path, std::fs::metadata(&path).unwrap().len() as usize / 2);
        let q = with_snapshots(&dir, "local-b", 5);
        check_version(q.open(&id, 12).unwrap().as_ref(), 12);
        // The instance left at 12 goes on from itself.
        write_version(&q, &id, 12);
        check_version(q.open(&id, 13).unwrap().as_ref(), 13);
    }

    /// A rebuild that replayed `snapshot_interval` changelogs or more snapshots at its next
    /// commit, whatever the maintenance clock says, so the next rebuild does not replay them
    /// again; a reused local instance waits for the clock as before.
    #[test]
    fn a_rebuild_that_replayed_many_changelogs_snapshots_at_its_next_commit() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        let store_dir = dir.path().join("checkpoint/0/0/default");
        let gated = |local: &str| clocked(&dir, local, 5, Duration::from_secs(3600));
        let p = gated("local-a");
        write_versions(&p, &id, 12);
        drop(p);
        // The same folder: the instance is reused, nothing replayed, no snapshot.
        let p = gated("local-a");
        write_version(&p, &id, 12);
        drop(p);
        assert_eq!(snapshot::list(&store_dir), Vec::<u64>::new());
        // Another folder: 13 changelogs replayed, so version 14 is a snapshot.
        let q = gated("local-b");
        write_version(&q, &id, 13);
        write_version(&q, &id, 14);
        drop(q);
        assert_eq!(
            snapshot::list(&store_dir),
            vec![14],
            "then the clock runs again"
        );
        // A rebuild from snapshot 14 replays one changelog: the clock decides.
        let r = gated("local-c");
        write_version(&r, &id, 15);
        drop(r);
        assert_eq!(snapshot::list(&store_dir), vec![14]);
        check_version(gated("local-d").open(&id, 16).unwrap().as_ref(), 16);
    }

    #[test]
    fn snapshots_let_old_changelogs_go_and_a_rebuild_start_from_them() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 1, "default");
        let p = with_snapshots(&dir, "local-a", 5);
        write_versions(&p, &id, 23);
        let store_dir = dir.path().join("checkpoint/0/1/default");
        assert_eq!(snapshot::list(&store_dir), vec![5, 10, 15, 20]);
        // Keep what versions >= 17 need: snapshot 15 and changelogs 16.., and snapshot 10 and
        // changelogs 11.. to fall back on if snapshot 15 is damaged; nothing older.
        p.purge_below(&id, 17).unwrap();
        assert_eq!(snapshot::list(&store_dir), vec![10, 15, 20]);
        assert!(!p.changelog(&id, 10).exists() && p.changelog(&id, 11).exists());

        // Another machine rebuilds 23 from snapshot 20, 17 from snapshot 15; 7 is gone.
        let q = with_snapshots(&dir, "local-b", 5);
        check_version(q.open(&id, 23).unwrap().as_ref(), 23);
        check_version(q.open(&id, 17).unwrap().as_ref(), 17);
        let err = q.open(&id, 7).err().unwrap();
        assert_eq!(err.error_class(), "STATE_STORE_VERSION_NOT_FOUND", "{err}");
        assert!(err.to_string().contains("snapshots 10, 15, 20"), "{err}");

        // A restored instance goes on committing and snapshotting.
        write_version(&q, &id, 19);
        check_version(q.open(&id, 20).unwrap().as_ref(), 20);
        let r = with_snapshots(&dir, "local-c", 5);
        check_version(r.open(&id, 20).unwrap().as_ref(), 20);

        // A damaged snapshot is not used: the store is rebuilt from the one before it and the
        // changelogs after that; with every kept snapshot damaged, the first is reported.
        let damage = |v: u64| flip_byte(&snapshot::manifest_path(&store_dir, v), 10);
        damage(20);
        check_version(
            with_snapshots(&dir, "local-d", 5)
                .open(&id, 21)
                .unwrap()
                .as_ref(),
            21,
        );
        damage(15);
        check_version(
            with_snapshots(&dir, "local-e", 5)
                .open(&id, 21)
                .unwrap()
                .as_ref(),
            21,
        );
        damage(10);
        let err = with_snapshots(&dir, "local-f", 5)
            .open(&id, 21)
            .err()
            .unwrap();
        assert_eq!(err.error_class(), "STATE_STORE_FILE_CORRUPT", "{err}");
        assert!(err.to_string().contains("20.snapshot"), "{err}");
    }

    #[test]
    fn a_damaged_newest_snapshot_is_found_at_restore_and_an_older_one_used() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        let p = with_snapshots(&dir, "local-a", 5);
        write_versions(&p, &id, 12);
        drop(p);
        let store_dir = dir.path().join("checkpoint/0/0/default");
        assert_eq!(snapshot::list(&store_dir), vec![5, 10]);
        // One byte flipped in the middle of image 10 (inside its compressed entries).
        let path = snapshot::manifest_path(&store_dir, 10);
        flip_byte(&path, std::fs::metadata(&path).unwrap().len() as usize / 2);
        let q = with_snapshots(&dir, "local-b", 5);
        check_version(q.open(&id, 12).unwrap().as_ref(), 12);
    }

    #[test]
    fn an_image_holds_only_live_entries_and_restores_them_with_the_key_count() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        let p = with_snapshots(&dir, "local-a", 5);
        // Version 5: 40 keys written over five versions, "gone" put at 4 and all of version 1's
        // keys deleted at 5.
        write_versions(&p, &id, 4);
        let mut s = p.open(&id, 4).unwrap();
        let mut b = WriteBatch::new();
        for i in 0..10u64 {
            b.delete(i.to_be_bytes());
        }
        s.apply(b).unwrap();
        s.commit().unwrap();
        drop(s);
        drop(p);
        let store_dir = dir.path().join("checkpoint/0/0/default");
        let snapshot::Snapshot::Image(bytes) = snapshot::read(&store_dir, 5).unwrap() else {
            panic!("snapshots are written as images");
        };
        assert!(bytes.starts_with(b"WEIRSN2\n"));
        // Restored elsewhere from the image and no changelog before it.
        for v in 1..5 {
            std::fs::remove_file(store_dir.join(format!("{v}.changelog"))).unwrap();
        }
        let q = with_snapshots(&dir, "local-b", 5);
        let s = q.open(&id, 5).unwrap();
        let all = s.scan(&KeyRange::all()).unwrap();
        assert_eq!(all.len(), 31, "30 keys of versions 2-4 and 'gone'");
        assert!(
            all.iter()
                .all(|(k, _)| k.as_slice() >= 10u64.to_be_bytes().as_slice())
        );
        assert_eq!(s.metrics().num_keys, 31);
        // The restored instance records the end of changelog 5 as the image did: the next run
        // reuses it, with the image gone too.
        drop(s);
        q.close().unwrap();
        drop(q);
        std::fs::remove_file(snapshot::manifest_path(&store_dir, 5)).unwrap();
        let r = with_snapshots(&dir, "local-b", 5);
        assert_eq!(r.open(&id, 5).unwrap().scan(&KeyRange::all()).unwrap(), all);
    }

    /// Writes snapshot `version` of `db` as weir did before images: its SST and RocksDB files
    /// copied into `files/` and a manifest listing them.
    fn write_files_snapshot(db: &DB, db_path: &Path, store_dir: &Path, version: u64) {
        let staged = db_path.with_extension("v1");
        rocksdb::checkpoint::Checkpoint::new(db)
            .unwrap()
            .create_checkpoint(&staged)
            .unwrap();
        let files_dir = store_dir.join(snapshot::FILES);
        std::fs::create_dir_all(&files_dir).unwrap();
        let mut files = vec![];
        for entry in std::fs::read_dir(&staged).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().to_string();
            let stored = format!("{version}-{name}");
            let size = std::fs::copy(entry.path(), files_dir.join(&stored)).unwrap();
            files.push(snapshot::SnapshotFile { name, stored, size });
        }
        let manifest = snapshot::Manifest { version, files };
        std::fs::write(
            snapshot::manifest_path(store_dir, version),
            snapshot::encode(&manifest),
        )
        .unwrap();
        std::fs::remove_dir_all(staged).unwrap();
    }

    #[test]
    fn version_one_snapshots_of_sst_files_still_restore_and_purge() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        // No snapshots of its own: version 8's is the only one.
        let p = configured(&dir, "local-a", 0, false);
        write_versions(&p, &id, 8);
        let store_dir = dir.path().join("checkpoint/0/0/default");
        let db = p.db(&id, KeyShape::Opaque).unwrap();
        db.flush().unwrap();
        write_files_snapshot(&db, &dir.path().join("local-a/0/0/default"), &store_dir, 8);
        drop(db);
        write_versions_from(&p, &id, 8, 10);
        drop(p);
        for v in 1..=8 {
            std::fs::remove_file(store_dir.join(format!("{v}.changelog"))).unwrap();
        }
        let q = provider(&dir, "local-b");
        check_version(q.open(&id, 10).unwrap().as_ref(), 10);
        // Its files go once two newer snapshots (images, 5 and 10 versions after it) are kept.
        let q = with_snapshots(&dir, "local-c", 5);
        write_versions_from(&q, &id, 10, 21);
        q.purge_below(&id, 21).unwrap();
        assert_eq!(snapshot::list(&store_dir), vec![13, 18]);
        let left = std::fs::read_dir(store_dir.join(snapshot::FILES))
            .unwrap()
            .count();
        assert_eq!(left, 0, "no image needs version 1's files");
    }

    /// The SST prefix-filter checks that said "absent" while `f` ran on this thread.
    fn prefix_filter_misses(f: impl FnOnce()) -> u64 {
        use rocksdb::perf::{PerfContext, PerfMetric, PerfStatsLevel, set_perf_stats};
        set_perf_stats(PerfStatsLevel::EnableCount);
        let mut perf = PerfContext::default();
        perf.reset();
        f();
        let misses = perf.metric(PerfMetric::BloomSstMissCount);
        set_perf_stats(PerfStatsLevel::Disable);
        misses
    }

    #[test]
    fn a_prefixed_stores_files_answer_absent_prefixes_from_their_filter() {
        let dir = tempfile::tempdir().unwrap();
        let p = provider(&dir, "local");
        // Join-like keys: a 4-byte join key (even numbers only) and the 12-byte row suffix.
        let key = |k: u32, row: u32| [&k.to_be_bytes()[..], &[0; 8], &row.to_be_bytes()].concat();
        let write = |id: &StoreId, shape: KeyShape| {
            let mut s = p.open_shaped(id, 0, shape).unwrap();
            let mut batch = WriteBatch::new();
            for k in (0..2000).step_by(2) {
                batch.put(key(k, 0), b"x");
                batch.put(key(k, 1), b"y");
            }
            s.apply(batch).unwrap();
            s.commit().unwrap();
            p.open.lock().unwrap()[id].flush().unwrap();
            p.open_shaped(id, 1, shape).unwrap()
        };
        let prefixed = StoreId::new(0, 0, "left-rows");
        let opaque = StoreId::new(0, 1, "default");
        let rows = write(&prefixed, KeyShape::Prefixed { suffix: 12 });
        let plain = write(&opaque, KeyShape::Opaque);
        let odd: Vec<[u8; 4]> = (1..400).step_by(2).map(|k: u32| k.to_be_bytes()).collect();
        let odd: Vec<&[u8]> = odd.iter().map(|k| &k[..]).collect();
        for store in [&rows, &plain] {
            let mut found = 0;
            let misses = prefix_filter_misses(|| {
                store
                    .scan_prefixes(&odd, &mut |_, _, _| found += 1)
                    .unwrap()
            });
            assert_eq!(found, 0);
            if std::ptr::eq(store, &rows) {
                // At 10 bits a prefix, about 1 % of the 200 absent prefixes pass the filter.
                assert!(misses >= 180, "{misses} of 200 absent prefixes filtered");
            } else {
                assert_eq!(misses, 0, "an opaque store has no prefix filter");
            }
            // Present prefixes: both rows, under the index asked with, from the file.
            let even: Vec<[u8; 4]> = [1998u32, 0, 500].map(u32::to_be_bytes).to_vec();
            let even: Vec<&[u8]> = even.iter().map(|k| &k[..]).collect();
            let mut seen = vec![];
            store
                .scan_prefixes(&even, &mut |i, k, v| seen.push((i, k.to_vec(), v.to_vec())))
                .unwrap();
            let row = |i: usize, k: u32, r: u32, v: &[u8]| (i, key(k, r), v.to_vec());
            assert_eq!(
                seen,
                vec![
                    row(1, 0, 0, b"x"),
                    row(1, 0, 1, b"y"),
                    row(2, 500, 0, b"x"),
                    row(2, 500, 1, b"y"),
                    row(0, 1998, 0, b"x"),
                    row(0, 1998, 1, b"y"),
                ]
            );
        }
        // The instance's options say so, for its data and not its meta column family.
        let options = std::fs::read_dir(
            dir.path()
                .join("local")
                .join(RocksDbStateStoreProvider::rel(&prefixed)),
        )
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("OPTIONS-")
        })
        .max()
        .unwrap();
        let text = std::fs::read_to_string(options).unwrap();
        assert_eq!(
            text.matches("\n  prefix_extractor=weir.prefix-then-12")
                .count(),
            1
        );
        assert_eq!(text.matches("\n  prefix_extractor=nullptr").count(), 1);
    }

    #[test]
    fn staged_writes_keep_each_keys_newest_across_and_within_batches() {
        let mut staged = Staged::default();
        let mut first = WriteBatch::new();
        first.put(b"a", b"1");
        first.put(b"b", b"1");
        first.delete(b"c");
        first.put(b"a", b"2");
        staged.apply(first).unwrap();
        let mut second = WriteBatch::new();
        second.delete(b"b");
        second.put_parts(&[b"c", b""], &[b"3", b"!"]);
        second.put(b"d", b"4");
        second.put(b"d", b"5");
        staged.apply(second).unwrap();
        assert_eq!(staged.get(b"a"), Some(Some(&b"2"[..])));
        assert_eq!(staged.get(b"b"), Some(None));
        assert_eq!(staged.get(b"c"), Some(Some(&b"3!"[..])));
        assert_eq!(staged.get(b"d"), Some(Some(&b"5"[..])));
        assert_eq!(staged.get(b"e"), None);
        let ops: Vec<(&[u8], Option<&[u8]>)> =
            staged.sorted().into_iter().map(|(_, op)| op).collect();
        assert_eq!(
            ops,
            vec![
                (&b"a"[..], Some(&b"2"[..])),
                (b"b", None),
                (b"c", Some(b"3!")),
                (b"d", Some(b"5")),
            ]
        );
    }

    #[test]
    fn a_commit_writes_its_keys_in_byte_order_whatever_their_lengths() {
        // Keys that share 16-byte prefixes, end in zero bytes, or are prefixes of each other.
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize
        };
        let mut staged = Staged::default();
        let mut keys = vec![];
        for _ in 0..2000 {
            let len = next() % 24;
            let key: Vec<u8> = (0..len)
                .map(|i| if i < 14 { 0 } else { (next() % 3) as u8 })
                .collect();
            let mut batch = WriteBatch::new();
            if next() % 2 == 0 {
                batch.put(&key, b"v");
            } else {
                batch.delete(&key);
            }
            staged.apply(batch).unwrap();
            keys.push(key);
        }
        keys.sort_unstable();
        keys.dedup();
        let written: Vec<Vec<u8>> = staged
            .sorted()
            .iter()
            .map(|(_, (k, _))| k.to_vec())
            .collect();
        assert_eq!(written, keys);
    }

    #[test]
    fn every_column_family_runs_with_the_providers_cache_and_options() {
        for (compression, recorded) in [
            (SstCompression::default(), "compression=kNoCompression"),
            (SstCompression::Lz4, "compression=kLZ4Compression"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let budget = 3 << 20;
            let p = RocksDbStateStoreProvider::with_config(
                dir.path().join("checkpoint"),
                dir.path().join("local"),
                RocksDbConfig {
                    block_cache_bytes: budget,
                    write_buffer_bytes: 1 << 20,
                    compression,
                    ..RocksDbConfig::default()
                },
            );
            let id = StoreId::new(0, 0, "default");
            let mut s = p.open(&id, 0).unwrap();
            let mut b = WriteBatch::new();
            b.put(b"k", b"v");
            s.apply(b).unwrap();
            s.commit().unwrap();
            let db = p.db(&id, KeyShape::Opaque).unwrap();
            for name in [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, META_CF] {
                let cf = db.cf_handle(name).unwrap();
                let capacity = db
                    .property_int_value_cf(cf, "rocksdb.block-cache-capacity")
                    .unwrap();
                assert_eq!(capacity, Some(budget as u64), "{name}'s block cache");
            }
            // What RocksDB itself recorded it runs with, family by family.
            let local = dir
                .path()
                .join("local")
                .join(RocksDbStateStoreProvider::rel(&id));
            let options = std::fs::read_dir(&local)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|f| {
                    f.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with("OPTIONS-")
                })
                .max()
                .unwrap();
            let text = std::fs::read_to_string(options).unwrap();
            let families: Vec<&str> = text.split("[CFOptions ").skip(1).collect();
            assert_eq!(families.len(), 2);
            for family in families {
                let table = family.split("[TableOptions").nth(1).unwrap_or_default();
                assert!(family.contains("write_buffer_size=1048576"), "{family}");
                assert!(
                    family.lines().any(|l| l.trim() == recorded),
                    "{compression:?}: {family}"
                );
                assert!(table.contains("filter_policy=bloomfilter"), "{table}");
                assert!(
                    table.contains("cache_index_and_filter_blocks=false"),
                    "{table}"
                );
            }
        }
    }

    #[test]
    fn state_ten_times_the_memory_bound_stays_within_it_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let budget = 4 << 20;
        let p = RocksDbStateStoreProvider::with_config(
            dir.path().join("checkpoint"),
            dir.path().join("local"),
            RocksDbConfig {
                block_cache_bytes: budget,
                memtable_bytes: budget / 2,
                write_buffer_bytes: 1 << 20,
                snapshot_interval: 10,
                snapshot_min_interval: Duration::ZERO,
                async_checkpoint: false,
                compression: SstCompression::None,
            },
        );
        let id = StoreId::new(0, 0, "default");
        let value = vec![7u8; 1000];
        let (batches, per_batch) = (40u64, 1000u64); // 40 MB of values
        let mut peak = 0;
        for v in 0..batches {
            let mut s = p.open(&id, v).unwrap();
            let mut b = WriteBatch::new();
            for i in 0..per_batch {
                b.put((v * per_batch + i).to_be_bytes(), value.clone());
            }
            s.apply(b).unwrap();
            s.commit().unwrap();
            peak = peak.max(p.memory_used_bytes());
        }
        // Each commit flushes when memtables are over their bound, so after a commit memory is
        // within the budget plus one batch (1 MB); unbounded, this state holds about 40 MB.
        assert!(
            peak <= budget + (1 << 20),
            "memory used {peak}, budget {budget}"
        );
        let s = p.open(&id, batches).unwrap();
        let keys: Vec<Vec<u8>> = (0..batches * per_batch)
            .step_by(997)
            .map(|k| k.to_be_bytes().to_vec())
            .collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        assert!(
            s.multi_get(&refs)
                .unwrap()
                .iter()
                .all(|v| v.as_deref() == Some(&value[..]))
        );
        assert_eq!(
            s.scan(&KeyRange::all()).unwrap().len() as u64,
            batches * per_batch
        );
    }

    /// A join-like history: each version puts four rows, deletes those of three versions before
    /// and a key that was never put.
    fn write_join_like_versions(p: &RocksDbStateStoreProvider, id: &StoreId, to: u64) {
        // Half the keys share their first 16 bytes, so that only whole keys order them.
        let row = |v: u64, i: u64| {
            let head: &[u8] = if i.is_multiple_of(2) {
                b"shared-16-bytes:"
            } else {
                b""
            };
            [head, &(v * 100 + i).to_be_bytes()].concat()
        };
        for v in 1..=to {
            let mut s = p.open(id, v - 1).unwrap();
            let mut b = WriteBatch::new();
            for i in 0..4 {
                b.put(row(v, i), v.to_be_bytes());
                if v > 3 {
                    b.delete(row(v - 3, i));
                }
            }
            b.delete(b"never put");
            s.apply(b).unwrap();
            s.commit().unwrap();
        }
    }

    fn memtable_deletes(db: &DB) -> u64 {
        [
            "rocksdb.num-deletes-active-mem-table",
            "rocksdb.num-deletes-imm-mem-tables",
        ]
        .iter()
        .map(|p| db.property_int_value(*p).unwrap().unwrap())
        .sum()
    }

    #[test]
    fn a_replay_into_an_empty_instance_leaves_out_deletes_of_keys_it_never_put() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        let p = provider(&dir, "a");
        write_join_like_versions(&p, &id, 30);
        let want = p.open(&id, 30).unwrap().scan(&KeyRange::all()).unwrap();
        assert_eq!(want.len(), 12);
        drop(p);

        // Rebuilt elsewhere from the changelogs alone, in several chunks (a few versions each
        // in tests): the same entries and count.
        let elsewhere = provider(&dir, "b");
        let s = elsewhere.open(&id, 30).unwrap();
        assert_eq!(s.scan(&KeyRange::all()).unwrap(), want);
        assert_eq!(s.metrics().num_keys, 12);
        // 108 rows deleted, 30 deletes of a key never put: only the deletes of rows an earlier
        // chunk put are written, fewer than half of them.
        let deletes = memtable_deletes(&elsewhere.db(&id, KeyShape::Opaque).unwrap());
        assert!(
            0 < deletes && deletes < 108 / 2,
            "{deletes} deletes written"
        );
        drop(s);

        // Caught up from an instance that holds rows: every delete counts.
        let behind = provider(&dir, "c");
        let s = behind.open(&id, 15).unwrap();
        assert_eq!(s.scan(&KeyRange::all()).unwrap().len(), 12);
        drop(s);
        let s = behind.open(&id, 30).unwrap();
        assert_eq!(s.scan(&KeyRange::all()).unwrap(), want);
        assert_eq!(s.metrics().num_keys, 12);
    }

    #[test]
    fn changelogs_round_trip_and_truncation_is_detected() {
        let mut b = WriteBatch::new();
        b.put(b"a", b"");
        b.delete(b"b");
        b.put(Vec::new(), b"xyz");
        let bytes = encode_changelog(&b, 7).unwrap();
        assert!(bytes.starts_with(CHANGELOG_MAGIC));
        assert_eq!(decode_changelog(&bytes), Some((b.clone(), Some(7))));
        for cut in 0..bytes.len() {
            assert_eq!(decode_changelog(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut garbled = bytes.clone();
        let mid = garbled.len() / 2;
        garbled[mid] ^= 0x40;
        assert_eq!(decode_changelog(&garbled), None);

        // The frame says its decoded size; one written before it did still decodes.
        let frame = &bytes[CHANGELOG_MAGIC.len()..bytes.len() - 4];
        let raw = zstd::stream::decode_all(frame).unwrap();
        assert_eq!(
            zstd::zstd_safe::get_frame_content_size(frame).ok(),
            Some(Some(raw.len() as u64))
        );
        let mut unsized_ = CHANGELOG_MAGIC.to_vec();
        unsized_.extend(zstd::stream::encode_all(&raw[..], 1).unwrap());
        assert_eq!(
            zstd::zstd_safe::get_frame_content_size(&unsized_[CHANGELOG_MAGIC.len()..]).ok(),
            Some(None)
        );
        let crc = crc32fast::hash(&unsized_);
        unsized_.extend(crc.to_le_bytes());
        assert_eq!(decode_changelog(&unsized_), Some((b, Some(7))));

        // Operations cut short inside a frame whose CRC holds (a faulty writer): refused.
        for cut in [raw.len() - 1, raw.len() - 3, 9] {
            let mut bytes = CHANGELOG_MAGIC.to_vec();
            bytes.extend(zstd::stream::encode_all(&raw[..cut], 1).unwrap());
            let crc = crc32fast::hash(&bytes);
            bytes.extend(crc.to_le_bytes());
            assert_eq!(decode_changelog(&bytes), None, "cut at {cut}");
        }
    }

    #[test]
    fn a_stored_changelog_is_its_encoding_and_its_trailer_is_its_last_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let id = StoreId::new(0, 0, "default");
        for rows in [0usize, 1, 3, 50_000] {
            let mut b = WriteBatch::new();
            for i in 0..rows {
                b.put(format!("key{i:08}").into_bytes(), vec![i as u8; i % 7]);
            }
            let trailer = store_changelog(&id, dir.path(), 4, b.iter(), rows as u64).unwrap();
            let stored = std::fs::read(dir.path().join("4.changelog")).unwrap();
            assert_eq!(stored, encode_changelog(&b, rows as u64).unwrap());
            assert_eq!(trailer, trailer_of(&stored), "{rows} rows");
            assert_eq!(decode_changelog(&stored), Some((b, Some(rows as u64))));
        }
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "no temporary file is left: {names:?}");
    }

    fn trailer_of(bytes: &[u8]) -> [u8; 8] {
        trailer(bytes).try_into().unwrap()
    }

    /// A changelog as weir wrote them before version 2 (uncompressed, FNV-1a, no key count).
    fn encode_v1(batch: &WriteBatch) -> Vec<u8> {
        let mut out = CHANGELOG_MAGIC_V1.to_vec();
        for (k, v) in batch.iter() {
            out.push(u8::from(v.is_some()));
            out.extend((k.len() as u32).to_le_bytes());
            out.extend(k);
            if let Some(v) = v {
                out.extend((v.len() as u32).to_le_bytes());
                out.extend(v);
            }
        }
        let sum = checksum(&out);
        out.extend(sum.to_le_bytes());
        out
    }

    #[test]
    fn version_one_changelogs_are_still_read_and_their_keys_counted() {
        let dir = tempfile::tempdir().unwrap();
        let p = provider(&dir, "a");
        let id = StoreId::new(0, 0, "default");
        write_versions(&p, &id, 3);
        // Rewrite the checkpoint's changelogs in the old format and rebuild from them elsewhere.
        let store_dir = p.store_dir(&id);
        for v in 1..=3 {
            let path = store_dir.join(format!("{v}.changelog"));
            let (batch, _) = decode_changelog(&std::fs::read(&path).unwrap()).unwrap();
            std::fs::write(&path, encode_v1(&batch)).unwrap();
        }
        let elsewhere = provider(&dir, "b");
        // check_version compares the key count with a scan's.
        check_version(elsewhere.open(&id, 3).unwrap().as_ref(), 3);
    }

    #[test]
    fn changelogs_are_compressed() {
        // Keys and values like a join's: sequential numbers, repeated headers.
        let mut b = WriteBatch::new();
        for i in 0..20_000u64 {
            let mut v = vec![0u8; 13];
            v.extend((1_700_000_000_000 + i / 100).to_be_bytes());
            v.extend(i.to_be_bytes());
            b.put(i.to_be_bytes(), v);
        }
        let raw: usize = b
            .iter()
            .map(|(k, v)| 9 + k.len() + v.map_or(0, <[u8]>::len))
            .sum();
        let bytes = encode_changelog(&b, 20_000).unwrap();
        assert!(bytes.len() * 4 < raw, "{} bytes for {raw} raw", bytes.len());
        assert_eq!(decode_changelog(&bytes).unwrap().0, b);
    }
}
