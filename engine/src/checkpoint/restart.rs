//! Where a run on an existing checkpoint continues ([`RestartPoint`]): read from the offsets and
//! commits logs (through [`super::resume_point`]) with a selective reset's sources in place,
//! before anything starts, and checked against the query by the restart checks.
//!
//! ```text
//! offsets/0..=N, commits/0..=N  ->  After { last: N, entry: offsets/N, commit: commits/N }
//! offsets/0..=N, commits/0..N   ->  Replay { batch: N, entry: offsets/N, later: [] }
//! ```

use std::collections::BTreeMap;

use weir_sources::Offset;

use super::{Checkpoint, CommitEntry, OffsetEntry, Resume};
use crate::Result;
use crate::execution::check_sources_of;

/// Where a run on an existing checkpoint continues, read and checked before the query starts.
pub(crate) enum RestartPoint {
    /// After batch `last`, which committed: `entry` is its offsets log entry, `commit` its
    /// commit entry (which carries the next batch's watermark).
    After {
        last: u64,
        entry: OffsetEntry,
        commit: CommitEntry,
    },
    /// Re-run `batch`, which was logged (`entry`) but not committed.
    Replay {
        batch: u64,
        entry: OffsetEntry,
        /// Logged batches after it, also uncommitted (asynchronous state checkpointing).
        later: Vec<OffsetEntry>,
    },
}

impl RestartPoint {
    /// The partition count the checkpoint was created with, as logged.
    pub(crate) fn logged_partitions(&self) -> Option<usize> {
        self.logged_conf(crate::api::SHUFFLE_PARTITIONS)?
            .parse()
            .ok()
    }

    /// A conf value the checkpoint's last logged batch ran with.
    pub(crate) fn logged_conf(&self, key: &str) -> Option<&str> {
        self.logged().get(key).map(String::as_str)
    }

    /// The conf the checkpoint's last logged batch ran with.
    pub(crate) fn logged(&self) -> &BTreeMap<String, String> {
        &self.entry().1.metadata.conf
    }

    /// The newest batch the checkpoint planned (logged).
    pub(crate) fn last_planned(&self) -> u64 {
        match self {
            Self::After { last, .. } => *last,
            Self::Replay { batch, later, .. } => batch + later.len() as u64,
        }
    }

    /// Whether some batch of the checkpoint committed.
    pub(crate) fn has_committed_batches(&self) -> bool {
        match self {
            Self::After { .. } => true,
            Self::Replay { batch, .. } => *batch > 0,
        }
    }

    /// Reads where `checkpoint` left off (a damaged log is an error).
    pub(crate) async fn read(checkpoint: &Checkpoint) -> Result<Option<Self>> {
        let point = match checkpoint.resume_point().await? {
            Resume::Fresh => return Ok(None),
            Resume::After { last } => {
                let entry = checkpoint.read_offsets(last).await?;
                let commit = checkpoint.read_commit(last).await?;
                Self::After {
                    last,
                    entry,
                    commit,
                }
            }
            Resume::Replay { batch, last } => {
                let entry = checkpoint.read_offsets(batch).await?;
                let mut later = vec![];
                for b in batch + 1..=last {
                    later.push(checkpoint.read_offsets(b).await?);
                }
                Self::Replay {
                    batch,
                    entry,
                    later,
                }
            }
        };
        Ok(Some(point))
    }

    /// Where `checkpoint` left off, with the sources resets (`resets`) started anew in place.
    pub(crate) async fn read_after_resets(
        checkpoint: &Checkpoint,
        resets: &[(u64, crate::checkpoint::resets::ResetRecord)],
    ) -> Result<Option<Self>> {
        Ok(Self::read(checkpoint)
            .await?
            .map(|r| r.with_source_resets(resets)))
    }

    /// The point with the sources a selective reset started anew (`resets`, the checkpoint's
    /// reset records) in place, while no batch has run since that reset.
    pub(crate) fn with_source_resets(
        self,
        resets: &[(u64, crate::checkpoint::resets::ResetRecord)],
    ) -> Self {
        match self {
            Self::After {
                last,
                mut entry,
                commit,
            } => {
                // Every reset since the last batch, in order (a later one may not name the
                // sources an earlier one started anew).
                let since = resets
                    .iter()
                    .filter(|(_, r)| r.done && r.next_batch == last + 1);
                for s in since.flat_map(|(_, r)| &r.sources) {
                    if let Some(range) = entry.sources.get_mut(s.position) {
                        let start = Offset(s.start.clone());
                        *range = crate::checkpoint::SourceRange {
                            start: start.clone(),
                            end: start,
                            source: Some(s.source.clone()),
                            name: s.name.clone(),
                        };
                    }
                }
                Self::After {
                    last,
                    entry,
                    commit,
                }
            }
            other => other,
        }
    }

    /// The same point with `f` applied to every offsets entry.
    pub(crate) fn aligned(self, f: impl Fn(&OffsetEntry) -> OffsetEntry) -> Self {
        match self {
            Self::After {
                last,
                entry,
                commit,
            } => Self::After {
                last,
                entry: f(&entry),
                commit,
            },
            Self::Replay {
                batch,
                entry,
                later,
            } => Self::Replay {
                batch,
                entry: f(&entry),
                later: later.iter().map(&f).collect(),
            },
        }
    }

    /// The newest logged batch a restart starts from, and its offsets entry.
    pub(crate) fn entry(&self) -> (u64, &OffsetEntry) {
        match self {
            Self::After { last, entry, .. } => (*last, entry),
            Self::Replay { batch, entry, .. } => (*batch, entry),
        }
    }

    /// Refuses `sources` (the identities of the query's sources now, by position) when the
    /// logged batch read other sources or another number of them.
    pub(crate) fn check_sources(&self, sources: &[String]) -> Result<()> {
        let (batch, entry) = self.entry();
        check_sources_of(entry, batch, sources)
    }
}
