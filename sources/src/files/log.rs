//! The file source's log in the checkpoint: entry `n` (`sources/<i>/<n>`) lists the files of the
//! source's n-th batch, a `v1` line and then one JSON line per file, as Spark's
//! `FileStreamSourceLog`. Entries are written create-only before the batch's offsets, so a file
//! is read by exactly one batch, also across restarts.

use std::collections::BTreeMap;

use weir_common::{Created, Location};

use super::listing::FileMeta;
use crate::{Error, Result};

/// The version written: its entries end with a checksum line, which they must have. `v1`
/// entries (without one) still read.
const VERSION: &str = "v2";
const V1: &str = "v1";

/// The log of one file source.
#[derive(Debug)]
pub struct SourceLog {
    dir: Location,
    entries: BTreeMap<i64, Vec<FileMeta>>,
}

impl SourceLog {
    /// Reads every entry in `dir`.
    pub async fn open(dir: Location) -> Result<Self> {
        let mut entries = BTreeMap::new();
        for (name, _) in dir.list_files("").await? {
            let Ok(n) = name.parse::<i64>() else {
                continue;
            };
            if let Some(bytes) = dir.get(&name).await? {
                entries.insert(n, parse(&dir, &name, &bytes)?);
            }
        }
        Ok(Self { dir, entries })
    }

    pub fn display(&self) -> &str {
        self.dir.display()
    }

    /// Every file of every entry.
    pub fn all_files(&self) -> impl Iterator<Item = &FileMeta> {
        self.entries.values().flatten()
    }

    /// Refuses a log that lacks an entry up to `n` (a batch through `n` is committed): the
    /// files of a lost entry would be taken for new ones and read again.
    pub fn check_complete_through(&self, n: i64) -> Result<()> {
        match (0..=n).find(|i| !self.entries.contains_key(i)) {
            None => Ok(()),
            Some(missing) => Err(Error::Corrupt(format!(
                "The file source's log entry '{}/{missing}' is missing, but the checkpoint's \
                 batches read it (the log holds entries through {n}): its files would be read \
                 again. Restore the file from a backup, reset the checkpoint (weir checkpoint \
                 reset DIR --full), or use a new checkpoint location.",
                self.dir.display()
            ))),
        }
    }

    /// The files of entry `n`, if it exists.
    pub async fn entry(&mut self, n: i64) -> Result<Option<Vec<FileMeta>>> {
        if let Some(e) = self.entries.get(&n) {
            return Ok(Some(e.clone()));
        }
        // Another writer (a run that lost the fence) may have added it since we opened.
        let name = n.to_string();
        match self.dir.get(&name).await? {
            None => Ok(None),
            Some(bytes) => {
                let files = parse(&self.dir, &name, &bytes)?;
                self.entries.insert(n, files.clone());
                Ok(Some(files))
            }
        }
    }

    /// Writes entry `n` with `files` unless it exists; returns the files entry `n` holds.
    pub async fn add(&mut self, n: i64, files: Vec<FileMeta>) -> Result<Vec<FileMeta>> {
        let mut text = String::from(VERSION);
        for f in &files {
            text.push('\n');
            text.push_str(
                &serde_json::to_string(f)
                    .map_err(|e| Error::Corrupt(format!("cannot serialize a log line: {e}")))?,
            );
        }
        let text = weir_common::sealed::seal(text);
        match self.dir.put_if_absent(&n.to_string(), text.into()).await? {
            Created::Yes => {
                self.entries.insert(n, files.clone());
                Ok(files)
            }
            Created::AlreadyExisted => self.entry(n).await?.ok_or_else(|| {
                Error::Corrupt(format!(
                    "The file source's log entry {n} in '{}' vanished while it was written.",
                    self.dir.display()
                ))
            }),
        }
    }
}

fn parse(dir: &Location, name: &str, bytes: &[u8]) -> Result<Vec<FileMeta>> {
    let corrupt = |what: String| {
        Error::Corrupt(format!(
            "The file source's log entry '{}/{name}' is damaged: {what}. Restore it from a \
             backup, reset the checkpoint (weir checkpoint reset DIR --full), or use a new \
             checkpoint location.",
            dir.display()
        ))
    };
    let text = std::str::from_utf8(bytes).map_err(|_| corrupt("it is not UTF-8".into()))?;
    let mut lines = text.lines();
    let checked = match lines.next() {
        Some(VERSION) => true,
        Some(V1) => false,
        Some(v) if v.starts_with('v') => {
            return Err(corrupt(format!(
                "it has format version '{v}', which this weir does not read (it reads {VERSION})"
            )));
        }
        _ => return Err(corrupt("its first line is not a format version".into())),
    };
    let body = weir_common::sealed::unseal(text)
        .map_err(|_| corrupt("its checksum does not match its content".into()))?;
    if checked && body.len() == text.len() {
        return Err(corrupt(
            "it has lost its checksum line (it was cut short)".into(),
        ));
    }
    body.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| corrupt(format!("line '{l}': {e}"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_entry_is_written_once_and_read_back_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let loc = Location::local(dir.path()).unwrap();
        let mut log = SourceLog::open(loc.clone()).await.unwrap();
        let a = FileMeta {
            path: "a.json".into(),
            size: 3,
            timestamp: 10,
        };
        let b = FileMeta {
            path: "b.json".into(),
            ..a.clone()
        };
        assert_eq!(log.add(0, vec![a.clone()]).await.unwrap(), vec![a.clone()]);
        // A second writer of entry 0 gets the first one's files.
        let mut other = SourceLog::open(loc.clone()).await.unwrap();
        assert_eq!(
            other.add(0, vec![b.clone()]).await.unwrap(),
            vec![a.clone()]
        );
        let reopened = SourceLog::open(loc.clone()).await.unwrap();
        assert_eq!(reopened.all_files().collect::<Vec<_>>(), vec![&a]);

        // Cut at a line end, an entry loses its checksum line: refused. A v1 entry has none.
        let text = std::fs::read_to_string(dir.path().join("0")).unwrap();
        let cut = &text[..text.rfind('\n').unwrap()];
        std::fs::write(dir.path().join("1"), cut).unwrap();
        let err = SourceLog::open(loc.clone()).await.unwrap_err();
        assert!(err.to_string().contains("checksum line"), "{err}");
        std::fs::write(dir.path().join("1"), cut.replacen("v2", "v1", 1)).unwrap();
        assert!(SourceLog::open(loc.clone()).await.is_ok());

        std::fs::write(dir.path().join("1"), "v9\n{}").unwrap();
        let err = SourceLog::open(loc).await.unwrap_err();
        assert_eq!(err.error_class(), "CHECKPOINT_FILE_CORRUPT");
        assert!(err.to_string().contains("format version 'v9'"), "{err}");
    }
}
