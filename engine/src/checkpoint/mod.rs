//! The checkpoint directory of a query and the logs in it.
//!
//! ```text
//! <checkpoint>/metadata        {"id":"<query uuid>","weirCheckpointVersion":2,"fnv64":"<hex>"}
//! <checkpoint>/offsets/<N>     write-ahead log entry of batch N (see [`log`])
//! <checkpoint>/commits/<N>     commit marker of batch N
//! <checkpoint>/sink            the sink the batches were written to (format, location)
//! <checkpoint>/sources/<i>/    source-private files of the source at position i
//! <checkpoint>/state/_metadata the stateful operators (IDs, names, schemas, fingerprints)
//! <checkpoint>/state/<op>/<partition>/<store>/   each state store's files
//! <checkpoint>/.weir-lock      held (flock) by the run that owns the checkpoint (local only)
//! <checkpoint>/.weir-lease     on an object store: the owning run's lease (see `lease`)
//! ```
//!
//! Every path is built here. What to replay and what to purge are pure functions in
//! [`recovery`].

pub(crate) mod checks;
mod lease;
pub mod log;
pub mod recovery;
pub mod resets;
mod restart;
pub(crate) mod source_evolution;
pub(crate) mod state_mirror;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use uuid::Uuid;
use weir_common::Location;
use weir_common::batch_id::{EntryName, entry_name};
use weir_common::location::Created;

pub use log::{BatchMetadata, CommitEntry, OffsetEntry, SourceRange};
pub use recovery::{Resume, purge_below, resume_point};
pub(crate) use restart::RestartPoint;

use crate::stateful::StateMetadata;
use crate::{Error, Result};

const METADATA: &str = "metadata";
pub(crate) const OFFSETS: &str = "offsets";
pub(crate) const COMMITS: &str = "commits";
pub(crate) const SOURCES: &str = "sources";
pub(crate) const STATE: &str = "state";
const STATE_METADATA: &str = "state/_metadata";
const SINK: &str = "sink";
const LOCK: &str = ".weir-lock";
pub(crate) const RESETS: &str = "resets";
const SOURCE_NAMES: &str = "source_names";
/// The checkpoint format this weir writes: 2 checksums `metadata` (1 did not; still read).
const CHECKPOINT_VERSION: u32 = 2;

/// `metadata`: one JSON object, as Spark's, so its `id` reads the same; from checkpoint version
/// 2 on with `fnv64`, a checksum of the ID and version. A flipped bit in the query ID still
/// parses as a UUID, and the ID is what exactly-once sinks recognise the query's batches by
/// (Delta's `txn.appId`): an ID changed unnoticed would write a replayed batch twice.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    id: Uuid,
    #[serde(default)]
    weir_checkpoint_version: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fnv64: Option<String>,
}

impl Metadata {
    fn new(id: Uuid) -> Self {
        Self {
            id,
            weir_checkpoint_version: Some(CHECKPOINT_VERSION),
            fnv64: Some(Self::checksum(id, CHECKPOINT_VERSION)),
        }
    }

    fn checksum(id: Uuid, version: u32) -> String {
        weir_common::sealed::checksum(&format!("{id}/{version}"))
    }

    fn encode(&self) -> Result<Bytes> {
        serde_json::to_string(self)
            .map(Bytes::from)
            .map_err(|e| Error::Internal(e.to_string()))
    }
}

/// The sink a checkpoint's batches were written to (`<checkpoint>/sink`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkRecord {
    /// The sink format.
    pub format: String,
    /// Where an exactly-once sink keeps its output ([`weir_sinks::Sink::identity`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The query ID the batches were written with (the ID an exactly-once sink recognises them
    /// by): a checkpoint whose `metadata` now holds another ID is refused. Not compared by
    /// [`SinkRecord::same_target`].
    #[serde(default, rename = "queryId", skip_serializing_if = "Option::is_none")]
    pub query_id: Option<Uuid>,
}

impl SinkRecord {
    /// Whether both records name the same sink and target (their query IDs aside).
    pub fn same_target(&self, other: &SinkRecord) -> bool {
        self.format == other.format && self.identity == other.identity
    }
}

/// An open checkpoint, owned by one run of one query.
#[derive(Debug)]
pub struct Checkpoint {
    location: Location,
    id: Uuid,
    temporary: bool,
    lock: Option<std::fs::File>,
    /// On an object store: the lease in place of the lock.
    lease: Option<lease::Lease>,
}

impl Checkpoint {
    /// Opens the checkpoint at `location`, creating it if the directory is empty. Refuses a
    /// directory that holds something other than a weir checkpoint, a checkpoint of a newer
    /// weir, and a checkpoint another run holds.
    pub async fn open(location: Location, temporary: bool) -> Result<Self> {
        let id = match location.get(METADATA).await? {
            Some(bytes) => parse_metadata(&location, &bytes)?,
            None => {
                let foreign: Vec<String> = location
                    .list_all()
                    .await?
                    .into_iter()
                    .filter(|p| p != LOCK && p != lease::LEASE)
                    .collect();
                if foreign.iter().any(|p| is_log(p)) {
                    return Err(Error::Corrupt {
                        file: format!("{}/{METADATA}", location.display()),
                        problem: "is missing, although the folder holds a weir checkpoint's logs"
                            .into(),
                    });
                }
                if !foreign.is_empty() {
                    return Err(Error::user(
                        "CHECKPOINT_LOCATION_NOT_WEIR",
                        "42K04",
                        format!(
                            "The checkpoint location '{}' is not empty and holds no weir checkpoint \
                             (no 'metadata' file; found e.g. '{}'). weir never writes into such a \
                             directory: choose an empty or new directory as checkpoint location.",
                            location.display(),
                            foreign[0]
                        ),
                    ));
                }
                let fresh = Metadata::new(Uuid::new_v4());
                location.put_if_absent(METADATA, fresh.encode()?).await?;
                // Another starter may have won the race: its id counts.
                let bytes = location
                    .get(METADATA)
                    .await?
                    .ok_or_else(|| Error::Corrupt {
                        file: format!("{}/{METADATA}", location.display()),
                        problem: "vanished right after it was written".into(),
                    })?;
                parse_metadata(&location, &bytes)?
            }
        };
        let lock = take_lock(&location, id)?;
        let lease = match location.local_dir() {
            None => Some(lease::Lease::take(&location, id).await?),
            Some(_) => None,
        };
        Ok(Self {
            location,
            id,
            temporary,
            lock,
            lease,
        })
    }

    /// Opens the checkpoint at `location` for a full refresh, which gives the query a new ID
    /// anyway: a damaged, newer or lost `metadata` file of a folder holding a weir
    /// checkpoint's logs is replaced first.
    pub(crate) async fn open_for_refresh(location: Location) -> Result<Self> {
        let readable = match location.get(METADATA).await? {
            Some(bytes) => match parse_metadata(&location, &bytes) {
                Ok(_) => true,
                Err(Error::Corrupt { .. }) => false,
                // Another engine's checkpoint (Spark's) is never touched.
                Err(e) => return Err(e),
            },
            None => false,
        };
        if !readable && location.list_all().await?.iter().any(|p| is_log(p)) {
            // Record the refresh before the metadata changes, so that runs refuse the
            // checkpoint until the refresh is done.
            resets::record_refresh_start(&location).await?;
            let fresh = Metadata::new(Uuid::new_v4());
            location.put(METADATA, fresh.encode()?).await?;
        }
        Self::open_read_only(location.clone()).await?;
        Self::open(location, false).await
    }

    /// Opens the checkpoint at `location` to read it only: no lock or lease is taken (a running
    /// query may own it) and nothing is written. A location without a weir checkpoint is
    /// refused.
    pub async fn open_read_only(location: Location) -> Result<Self> {
        let Some(bytes) = location.get(METADATA).await? else {
            let anything = !location.list_all().await?.is_empty();
            return Err(Error::user(
                if anything {
                    "CHECKPOINT_LOCATION_NOT_WEIR"
                } else {
                    "CHECKPOINT_NOT_FOUND"
                },
                "42K04",
                format!(
                    "There is no weir checkpoint at '{}' (no 'metadata' file{}).",
                    location.display(),
                    if anything {
                        "; it holds other files"
                    } else {
                        "; it is empty or missing"
                    }
                ),
            ));
        };
        let id = parse_metadata(&location, &bytes)?;
        Ok(Self {
            location,
            id,
            temporary: false,
            lock: None,
            lease: None,
        })
    }

    /// The query's ID, kept across restarts.
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// The checkpoint directory.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// Whether weir made this checkpoint up because the user gave none.
    pub fn is_temporary(&self) -> bool {
        self.temporary
    }

    /// The private directory of the source at `position`.
    pub fn source_dir(&self, position: usize) -> Location {
        self.location.child(&format!("{SOURCES}/{position}"))
    }

    /// The private directory of the source named `name` (with source evolution).
    pub fn named_source_dir(&self, name: &str) -> Location {
        self.location.child(&format!("{SOURCES}/{name}"))
    }

    /// The source names removed from the query (with source evolution), never to come back.
    pub(crate) async fn removed_sources(&self) -> Result<std::collections::BTreeSet<String>> {
        #[derive(Deserialize)]
        struct Names {
            removed: Vec<String>,
        }
        let Some(bytes) = self.location.get(SOURCE_NAMES).await? else {
            return Ok(Default::default());
        };
        serde_json::from_slice::<Names>(&bytes)
            .map(|n| n.removed.into_iter().collect())
            .map_err(|e| Error::Corrupt {
                file: self.file(SOURCE_NAMES),
                problem: format!("is not a record of removed sources ({e})"),
            })
    }

    /// Records `names` as removed from the query.
    pub(crate) async fn add_removed_sources(&self, names: &[String]) -> Result<()> {
        self.check_lease()?;
        let mut all = self.removed_sources().await?;
        all.extend(names.iter().cloned());
        let text = serde_json::json!({ "removed": all }).to_string();
        self.location.put(SOURCE_NAMES, Bytes::from(text)).await?;
        Ok(())
    }

    /// The directory of the operators' state stores (local checkpoints only).
    pub(crate) fn state_dir(&self) -> Option<std::path::PathBuf> {
        self.location.local_dir().map(|d| d.join(STATE))
    }

    /// Reads `state/_metadata`, if the query has ever had stateful operators.
    pub(crate) async fn read_state_metadata(&self) -> Result<Option<StateMetadata>> {
        let Some(bytes) = self.location.get(STATE_METADATA).await? else {
            if let Some(id) = self.state_folder_ids().await?.first() {
                return Err(Error::Corrupt {
                    file: self.file(STATE_METADATA),
                    problem: format!(
                        "is missing, although state/{id} holds an operator's state (the record \
                         of the stateful operators is needed to read it)"
                    ),
                });
            }
            return Ok(None);
        };
        StateMetadata::decode(&bytes)
            .map(Some)
            .map_err(|problem| Error::Corrupt {
                file: self.file(STATE_METADATA),
                problem,
            })
    }

    /// Writes `state/_metadata` unless it exists (then it was checked against `metadata`).
    pub(crate) async fn write_state_metadata(&self, metadata: &StateMetadata) -> Result<()> {
        self.location
            .put_if_absent(STATE_METADATA, Bytes::from(metadata.encode()))
            .await?;
        Ok(())
    }

    /// Replaces `state/_metadata` (a checkpoint reset), or deletes it when the query keeps no
    /// state.
    pub(crate) async fn replace_state_metadata(&self, metadata: &StateMetadata) -> Result<()> {
        self.check_lease()?;
        if metadata.operators.is_empty() {
            self.location.delete(STATE_METADATA).await?;
        } else {
            self.location
                .put(STATE_METADATA, Bytes::from(metadata.encode()))
                .await?;
        }
        Ok(())
    }

    /// The IDs of the folders under `state/` (`state/<id>/...`).
    pub(crate) async fn state_folder_ids(&self) -> Result<Vec<u32>> {
        let mut ids: Vec<u32> = self
            .location
            .child(STATE)
            .list_all()
            .await?
            .iter()
            .filter_map(|rel| rel.split('/').next()?.parse().ok())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// Deletes everything under `rel` (a folder of the checkpoint), and a local folder itself.
    pub(crate) async fn delete_folder(&self, rel: &str) -> Result<()> {
        self.check_lease()?;
        let folder = self.location.child(rel);
        folder.delete_all().await?;
        if let Some(dir) = folder.local_dir() {
            match std::fs::remove_dir(dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::Internal(format!(
                        "cannot remove the folder {}: {e}",
                        dir.display()
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Deletes `sink`, the record of the sink, and `source_names`, the record of removed
    /// sources (a full refresh).
    pub(crate) async fn delete_sink_record(&self) -> Result<()> {
        self.check_lease()?;
        self.location.delete(SINK).await?;
        self.location.delete(SOURCE_NAMES).await?;
        Ok(())
    }

    /// Gives the checkpoint a new query ID (a full refresh: an exactly-once sink then takes the
    /// query's batches for new ones).
    pub(crate) async fn renew_id(&mut self) -> Result<Uuid> {
        self.check_lease()?;
        let fresh = Metadata::new(Uuid::new_v4());
        self.location.put(METADATA, fresh.encode()?).await?;
        self.id = fresh.id;
        Ok(fresh.id)
    }

    /// Reads `sink`: what the batches so far were written to, if recorded.
    pub async fn read_sink(&self) -> Result<Option<SinkRecord>> {
        let Some(bytes) = self.location.get(SINK).await? else {
            return Ok(None);
        };
        let corrupt = |problem: String| Error::Corrupt {
            file: self.file(SINK),
            problem,
        };
        let text = std::str::from_utf8(&bytes).map_err(|_| corrupt("is not UTF-8 text".into()))?;
        let body = log::unseal(text).map_err(corrupt)?;
        serde_json::from_str(body)
            .map(Some)
            .map_err(|e| corrupt(format!("is not a sink record ({e})")))
    }

    /// Records the sink the next batches are written to.
    pub async fn write_sink(&self, record: &SinkRecord) -> Result<()> {
        self.check_lease()?;
        let text = serde_json::to_string(record).map_err(|e| Error::Internal(e.to_string()))?;
        self.location
            .put(SINK, Bytes::from(log::seal(text)))
            .await?;
        Ok(())
    }

    fn file(&self, rel: &str) -> String {
        format!("{}/{rel}", self.location.display())
    }

    async fn ids(&self, dir: &str) -> Result<Vec<u64>> {
        let mut ids = vec![];
        for (name, _) in self.location.list_files(dir).await? {
            match entry_name(&name) {
                EntryName::Other => {}
                EntryName::Batch(id) => ids.push(id),
                EntryName::OutOfRange => {
                    return Err(Error::Corrupt {
                        file: self.file(&format!("{dir}/{name}")),
                        problem: format!(
                            "is named as no batch weir writes (batch IDs stay below 2^63, as \
                             Spark's): move it out of '{dir}/'"
                        ),
                    });
                }
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// Batch IDs present in the offsets log.
    pub async fn offset_ids(&self) -> Result<Vec<u64>> {
        self.ids(OFFSETS).await
    }

    /// Batch IDs present in the commits log.
    pub async fn commit_ids(&self) -> Result<Vec<u64>> {
        self.ids(COMMITS).await
    }

    /// Where this checkpoint resumes.
    pub async fn resume_point(&self) -> Result<Resume> {
        let (offsets, commits) = (self.offset_ids().await?, self.commit_ids().await?);
        resume_point(&offsets, &commits).map_err(|problem| Error::Corrupt {
            file: format!("{}/{{{OFFSETS},{COMMITS}}}", self.location.display()),
            problem,
        })
    }

    /// Reads `offsets/<batch>`.
    pub async fn read_offsets(&self, batch: u64) -> Result<OffsetEntry> {
        let rel = format!("{OFFSETS}/{batch}");
        let bytes = self
            .location
            .get(&rel)
            .await?
            .ok_or_else(|| Error::Corrupt {
                file: self.file(&rel),
                problem: "is missing".into(),
            })?;
        OffsetEntry::decode(&bytes).map_err(|problem| Error::Corrupt {
            file: self.file(&rel),
            problem,
        })
    }

    /// Reads `commits/<batch>`.
    pub async fn read_commit(&self, batch: u64) -> Result<CommitEntry> {
        let rel = format!("{COMMITS}/{batch}");
        let bytes = self
            .location
            .get(&rel)
            .await?
            .ok_or_else(|| Error::Corrupt {
                file: self.file(&rel),
                problem: "is missing".into(),
            })?;
        CommitEntry::decode(&bytes).map_err(|problem| Error::Corrupt {
            file: self.file(&rel),
            problem,
        })
    }

    async fn create(&self, rel: String, text: String, batch: u64) -> Result<()> {
        match self.location.put_if_absent(&rel, Bytes::from(text)).await? {
            Created::Yes => Ok(()),
            Created::AlreadyExisted => Err(Error::user(
                "CONCURRENT_STREAM_LOG_UPDATE",
                "40000",
                format!(
                    "Concurrent update to the log: '{}' was written by another run while this one \
                     was running batch {batch}. Make sure only one query runs on the checkpoint \
                     location '{}' at a time.",
                    self.file(&rel),
                    self.location.display()
                ),
            )),
        }
    }

    /// Writes `offsets/<batch>`, create-only: the fence against a second writer.
    pub async fn write_offsets(&self, batch: u64, entry: &OffsetEntry) -> Result<()> {
        self.check_lease()?;
        self.create(format!("{OFFSETS}/{batch}"), entry.encode(), batch)
            .await
    }

    /// Writes `commits/<batch>`, create-only.
    pub async fn write_commit(&self, batch: u64, entry: &CommitEntry) -> Result<()> {
        self.check_lease()?;
        self.create(format!("{COMMITS}/{batch}"), entry.encode(), batch)
            .await
    }

    /// Deletes log entries of batches below `below`.
    pub async fn purge_below(&self, below: u64) -> Result<()> {
        for dir in [OFFSETS, COMMITS] {
            for id in self
                .ids(dir)
                .await?
                .into_iter()
                .take_while(|&id| id < below)
            {
                self.location.delete(&format!("{dir}/{id}")).await?;
            }
        }
        Ok(())
    }

    /// Lets another run take the checkpoint (the run that owns it is ending).
    pub async fn release(&mut self) {
        self.lock = None;
        if let Some(lease) = self.lease.take() {
            lease.release().await;
        }
    }

    /// Refuses a write when this run lost the checkpoint's lease.
    pub(crate) fn check_lease(&self) -> Result<()> {
        self.lease.as_ref().map_or(Ok(()), lease::Lease::check)
    }

    /// Keeps a temporary checkpoint on disk after this run (a failed run's, for inspection, as
    /// Spark keeps it); it is otherwise removed when the run lets go of it.
    pub fn keep(&mut self) {
        self.temporary = false;
    }

    /// Removes a temporary checkpoint from disk.
    pub fn delete_if_temporary(&self) {
        if self.temporary
            && let Some(dir) = self.location.local_dir()
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Drop for Checkpoint {
    /// A temporary checkpoint goes with its run however the run ends unless [`Self::keep`] was
    /// called: a start that failed after creating it, a clean stop, a query whose runtime was
    /// shut down under it.
    fn drop(&mut self) {
        self.delete_if_temporary();
    }
}

/// Whether `rel` is one of a weir checkpoint's logs.
fn is_log(rel: &str) -> bool {
    [OFFSETS, COMMITS, STATE]
        .iter()
        .any(|d| rel.strip_prefix(d).is_some_and(|r| r.starts_with('/')))
}

fn parse_metadata(location: &Location, bytes: &[u8]) -> Result<Uuid> {
    let file = format!("{}/{METADATA}", location.display());
    let corrupt = |problem: String| Error::Corrupt {
        file: file.clone(),
        problem,
    };
    // One JSON object, as Spark's, so that tools reading Spark's metadata read it too.
    let body = std::str::from_utf8(bytes).map_err(|_| corrupt("is not UTF-8 text".into()))?;
    let json: serde_json::Value = serde_json::from_str(body)
        .map_err(|e| corrupt(format!("is not a readable metadata file ({e})")))?;
    // Spark's metadata holds the query id only; anything else without weir's version is damage.
    let foreign = json
        .as_object()
        .is_some_and(|o| o.keys().all(|k| k == "id"));
    let meta: Metadata = serde_json::from_value(json)
        .map_err(|e| corrupt(format!("is not a readable metadata file ({e})")))?;
    match meta.weir_checkpoint_version {
        None if !foreign => Err(corrupt(
            "has no weir checkpoint version where weir writes one".into(),
        )),
        None => Err(Error::user(
            "CHECKPOINT_LOCATION_NOT_WEIR",
            "42K04",
            format!(
                "The checkpoint location '{}' holds a checkpoint of another engine (its metadata \
                 has no weir version; Apache Spark writes such checkpoints). weir cannot resume it \
                 and will not overwrite it: choose a new checkpoint location.",
                location.display()
            ),
        )),
        // A flipped bit in the version of a checksummed file is damage, not a newer weir.
        Some(v)
            if v > CHECKPOINT_VERSION
                && meta
                    .fnv64
                    .as_ref()
                    .is_some_and(|sum| *sum != Metadata::checksum(meta.id, v)) =>
        {
            Err(corrupt(
                "is damaged: its checksum does not match its query ID and version".into(),
            ))
        }
        Some(v) if v > CHECKPOINT_VERSION => Err(Error::Corrupt {
            file,
            problem: format!(
                "has checkpoint version {v}, newer than this weir understands ({CHECKPOINT_VERSION}): \
                 run the weir that wrote it"
            ),
        }),
        // Version 1 had no checksum; from 2 on it must be there and match.
        Some(1) => Ok(meta.id),
        Some(v) if v == CHECKPOINT_VERSION => match &meta.fnv64 {
            Some(sum) if *sum == Metadata::checksum(meta.id, v) => Ok(meta.id),
            Some(_) => Err(corrupt(
                "is damaged: its checksum does not match its query ID (the ID is how an \
                 exactly-once sink recognises the batches it holds: a changed one would write \
                 them again)"
                    .into(),
            )),
            None => Err(corrupt("is damaged: it has lost its checksum".into())),
        },
        Some(v) => Err(corrupt(format!(
            "has checkpoint version {v}, which no weir writes"
        ))),
    }
}

fn take_lock(location: &Location, id: Uuid) -> Result<Option<std::fs::File>> {
    let Some(dir) = location.local_dir() else {
        return Ok(None);
    };
    let path = dir.join(LOCK);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| {
            Error::user(
                "CANNOT_ACCESS_CHECKPOINT",
                "58030",
                format!("Cannot open the lock file '{}': {e}.", path.display()),
            )
        })?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::user(
            "CONCURRENT_QUERY",
            "0A000",
            format!(
                "Cannot start query with id {id}: another run of it is already active on the \
                 checkpoint location '{}' (in this or another process). Stop that run first, or \
                 give this query a new checkpoint location.",
                location.display()
            ),
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(Error::user(
            "CANNOT_ACCESS_CHECKPOINT",
            "58030",
            format!("Cannot lock '{}': {e}.", path.display()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary checkpoint goes when its run lets go of it, whichever way (a failed start
    /// returns early, a dropped runtime drops the run), unless kept (a failed run's).
    #[tokio::test]
    async fn a_temporary_checkpoint_goes_with_its_run_unless_kept() {
        let parent = tempfile::tempdir().unwrap();
        let open = |name: &str, temporary: bool| {
            let dir = parent.path().join(name);
            async move {
                let cp = Checkpoint::open(Location::local(&dir).unwrap(), temporary)
                    .await
                    .unwrap();
                assert!(dir.join(METADATA).is_file());
                (cp, dir)
            }
        };
        let (cp, dir) = open("dropped", true).await;
        drop(cp);
        assert!(
            !dir.exists(),
            "a dropped temporary checkpoint was left behind"
        );
        let (mut cp, dir) = open("kept", true).await;
        cp.keep();
        drop(cp);
        assert!(dir.join(METADATA).is_file(), "a kept one was removed");
        let (cp, dir) = open("given", false).await;
        drop(cp);
        assert!(
            dir.join(METADATA).is_file(),
            "a checkpoint the user gave was removed"
        );
    }

    #[tokio::test]
    async fn a_second_open_of_a_held_checkpoint_is_refused_and_the_first_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = Checkpoint::open(Location::local(dir.path()).unwrap(), false)
            .await
            .unwrap();
        let err = Checkpoint::open(Location::local(dir.path()).unwrap(), false)
            .await
            .unwrap_err();
        assert_eq!(err.error_class(), "CONCURRENT_QUERY");
        let id = first.id();
        drop(first);
        let again = Checkpoint::open(Location::local(dir.path()).unwrap(), false)
            .await
            .unwrap();
        assert_eq!(again.id(), id, "the query id survives a restart");
    }

    #[tokio::test]
    async fn a_foreign_directory_is_refused_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("data.csv"), "a,b\n").unwrap();
        let err = Checkpoint::open(Location::local(dir.path()).unwrap(), false)
            .await
            .unwrap_err();
        assert_eq!(err.error_class(), "CHECKPOINT_LOCATION_NOT_WEIR");
        assert!(!dir.path().join("metadata").exists());

        let spark = tempfile::tempdir().unwrap();
        std::fs::write(
            spark.path().join("metadata"),
            r#"{"id":"57d2ba4f-554e-42f5-aba4-a54496a75da3"}"#,
        )
        .unwrap();
        let err = Checkpoint::open(Location::local(spark.path()).unwrap(), false)
            .await
            .unwrap_err();
        assert_eq!(err.error_class(), "CHECKPOINT_LOCATION_NOT_WEIR");
        assert!(err.to_string().contains("Apache Spark"), "{err}");
    }

    #[test]
    fn no_single_flipped_bit_of_metadata_passes_as_another_query_id() {
        let dir = tempfile::tempdir().unwrap();
        let location = Location::local(dir.path()).unwrap();
        let meta = Metadata::new(Uuid::new_v4());
        let bytes = meta.encode().unwrap().to_vec();
        assert_eq!(parse_metadata(&location, &bytes).unwrap(), meta.id);
        let mut refused = 0;
        for at in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[at] ^= 1 << bit;
                match parse_metadata(&location, &b) {
                    // A hex digit's case, or JSON whitespace: the same ID.
                    Ok(id) => assert_eq!(id, meta.id, "byte {at} bit {bit}"),
                    Err(e) => {
                        assert!(
                            matches!(e.error_class(), "CHECKPOINT_FILE_CORRUPT"),
                            "byte {at} bit {bit}: {e}"
                        );
                        refused += 1;
                    }
                }
            }
        }
        assert!(
            refused > bytes.len() * 6,
            "{refused} of {}",
            bytes.len() * 8
        );
        // A checkpoint of the first format (no checksum) still opens.
        let v1 = format!(r#"{{"id":"{}","weirCheckpointVersion":1}}"#, meta.id);
        assert_eq!(parse_metadata(&location, v1.as_bytes()).unwrap(), meta.id);
    }

    #[tokio::test]
    async fn the_wal_is_create_only() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(Location::local(dir.path()).unwrap(), false)
            .await
            .unwrap();
        let e = OffsetEntry {
            metadata: BatchMetadata {
                batch_watermark_ms: 0,
                batch_timestamp_ms: 1,
                conf: Default::default(),
            },
            sources: vec![],
        };
        cp.write_offsets(0, &e).await.unwrap();
        let err = cp.write_offsets(0, &e).await.unwrap_err();
        assert_eq!(err.error_class(), "CONCURRENT_STREAM_LOG_UPDATE");
        assert_eq!(
            cp.resume_point().await.unwrap(),
            Resume::Replay { batch: 0, last: 0 }
        );
        cp.write_commit(
            0,
            &CommitEntry {
                next_batch_watermark_ms: 0,
            },
        )
        .await
        .unwrap();
        assert_eq!(cp.resume_point().await.unwrap(), Resume::After { last: 0 });
    }
}
