//! Pure checkpoint decisions: where a (re)started query resumes, and which log entries may be
//! purged. Tested without any storage.

/// Where a query resumes, from the batch IDs present in the offsets and commits logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// No batch was ever planned: start batch 0 from the sources' initial offsets.
    Fresh,
    /// Batch `last` is committed: run `last + 1`, starting from `last`'s end offsets.
    After {
        /// The last committed batch.
        last: u64,
    },
    /// Batch `batch` was planned (its offsets are logged) but not committed: run it again with
    /// exactly the logged offsets and watermark, and so every later logged batch (with
    /// asynchronous state checkpointing the batch after it may be logged too).
    Replay {
        /// The first batch to re-run.
        batch: u64,
        /// The newest logged batch.
        last: u64,
    },
}

impl Resume {
    /// The last committed batch, if any.
    pub fn last_committed(self) -> Option<u64> {
        match self {
            Resume::Fresh => None,
            Resume::After { last } => Some(last),
            Resume::Replay { batch, .. } => batch.checked_sub(1),
        }
    }
}

/// Decides where to resume. `offsets` and `commits` are the batch IDs present in each log.
pub fn resume_point(offsets: &[u64], commits: &[u64]) -> Result<Resume, String> {
    let Some(&latest) = offsets.iter().max() else {
        if let Some(c) = commits.iter().max() {
            return Err(format!(
                "commits/{c} exists but the offsets log is empty: the offsets log was deleted"
            ));
        }
        return Ok(Resume::Fresh);
    };
    let latest_commit = commits.iter().max().copied();
    // At most two uncommitted batches: the second was planned while the first's state was
    // being made durable in the background.
    match latest_commit {
        Some(c) if c == latest => Ok(Resume::After { last: latest }),
        Some(c) if c.checked_add(1) == Some(latest) || c.checked_add(2) == Some(latest) => {
            Ok(Resume::Replay {
                // c < latest, so c + 1 cannot overflow.
                batch: c + 1,
                last: latest,
            })
        }
        Some(c) if c > latest => Err(format!(
            "commits/{c} exists but the newest offsets entry is offsets/{latest}: the offsets \
             log lost entries"
        )),
        Some(c) => Err(format!(
            "the newest offsets entry is offsets/{latest} but the newest commit is commits/{c}: \
             batches {}..{latest} were planned without the one before being committed",
            c.saturating_add(1)
        )),
        None if latest <= 1 && offsets.iter().min() == Some(&0) => Ok(Resume::Replay {
            batch: 0,
            last: latest,
        }),
        None => Err(format!(
            "offsets/{latest} exists but no batch was ever committed: the commits log was deleted"
        )),
    }
}

/// Entries with an ID below the returned one may be deleted once batch `committed` is
/// committed, keeping `min_batches_to_retain` batches (and never the newest).
pub fn purge_below(committed: u64, min_batches_to_retain: u64) -> u64 {
    (committed + 1).saturating_sub(min_batches_to_retain.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resumes_after_the_last_commit_or_replays_the_uncommitted_batch() {
        assert_eq!(resume_point(&[], &[]), Ok(Resume::Fresh));
        assert_eq!(
            resume_point(&[0, 1, 2], &[0, 1, 2]),
            Ok(Resume::After { last: 2 })
        );
        assert_eq!(
            resume_point(&[0, 1, 2], &[0, 1]),
            Ok(Resume::Replay { batch: 2, last: 2 })
        );
        assert_eq!(
            resume_point(&[0], &[]),
            Ok(Resume::Replay { batch: 0, last: 0 })
        );
        // Purged logs keep working: only the newest entries matter.
        assert_eq!(
            resume_point(&[98, 99, 100], &[98, 99]),
            Ok(Resume::Replay {
                batch: 100,
                last: 100
            })
        );
        // Asynchronous state checkpointing: two batches may be uncommitted.
        assert_eq!(
            resume_point(&[0, 1, 2, 3], &[0, 1]),
            Ok(Resume::Replay { batch: 2, last: 3 })
        );
        assert_eq!(
            resume_point(&[0, 1], &[]),
            Ok(Resume::Replay { batch: 0, last: 1 })
        );
    }

    #[test]
    fn inconsistent_logs_are_refused_not_guessed() {
        assert!(resume_point(&[], &[0]).is_err());
        assert!(resume_point(&[0, 1, 2, 3, 4], &[0, 1]).is_err());
        assert!(resume_point(&[0, 1, 2], &[]).is_err());
        assert!(resume_point(&[0, 1], &[0, 1, 2]).is_err());
        assert!(resume_point(&[5, 6], &[]).is_err());
        // IDs at the end of the range never overflow.
        assert!(resume_point(&[0, 1, u64::MAX], &[u64::MAX - 5]).is_err());
        assert!(resume_point(&[0], &[u64::MAX]).is_err());
        assert_eq!(
            resume_point(&[u64::MAX], &[u64::MAX - 1]),
            Ok(Resume::Replay {
                batch: u64::MAX,
                last: u64::MAX
            })
        );
    }

    #[test]
    fn purging_keeps_the_retained_batches() {
        assert_eq!(purge_below(150, 100), 51);
        assert_eq!(purge_below(3, 100), 0);
        assert_eq!(purge_below(3, 0), 3);
    }
}
