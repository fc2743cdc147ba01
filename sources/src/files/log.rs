//! The file source's log in the checkpoint: entry `n` (`sources/<i>/<n>`) lists the files of the
//! source's n-th batch, a version line and then one JSON line per file, as Spark's
//! `FileStreamSourceLog`. Entries are written create-only before the batch's offsets, so a file
//! is read by exactly one batch, also across restarts.
//!
//! ```text
//! <n>           v2, one {"path","size","timestamp"} line per file, #fnv64= checksum
//! <n>.compact   every COMPACT_INTERVAL entries (n + 1 a multiple of it), as Spark compacts:
//!               v2, {"compactedThrough":n}, one line per file of entries 0..=n with its
//!               "batchId", checksum. Written create-only before the entries and older compact
//!               files it holds are deleted, so a restart reads one file per interval, not one
//!               per batch.
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use weir_common::{Created, Location};

use super::listing::FileMeta;
use crate::{Error, Result};

/// The version written: its entries end with a checksum line, which they must have. `v1`
/// entries (without one) still read.
const VERSION: &str = "v2";
const V1: &str = "v1";

/// Every this many entries, the log is compacted into one file (Spark's default
/// `spark.sql.streaming.fileSource.log.compactInterval`).
const COMPACT_INTERVAL: i64 = 10;

const COMPACT_SUFFIX: &str = ".compact";

/// A compact file's first line after its version.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CompactHeader {
    compacted_through: i64,
}

/// A file of a compact file, with the entry it came from.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CompactLine {
    #[serde(flatten)]
    file: FileMeta,
    batch_id: i64,
}

/// The log of one file source.
#[derive(Debug)]
pub struct SourceLog {
    dir: Location,
    entries: BTreeMap<i64, Vec<FileMeta>>,
    /// The entries the newest compact file holds: 0 through this.
    compacted_through: Option<i64>,
}

impl SourceLog {
    /// Reads the newest compact file and every entry after it in `dir`.
    pub async fn open(dir: Location) -> Result<Self> {
        let (mut plain, mut compact) = (vec![], vec![]);
        for (name, _) in dir.list_files("").await? {
            if let Ok(n) = name.parse::<i64>() {
                plain.push(n);
            } else if let Some(Ok(n)) = name.strip_suffix(COMPACT_SUFFIX).map(str::parse::<i64>) {
                compact.push(n);
            }
        }
        let mut entries = BTreeMap::new();
        let compacted_through = match compact.iter().max() {
            Some(&k) => {
                let name = format!("{k}{COMPACT_SUFFIX}");
                let bytes = dir.get(&name).await?.ok_or_else(|| {
                    Error::Corrupt(format!(
                        "The file source's log file '{}/{name}' vanished while it was read.",
                        dir.display()
                    ))
                })?;
                entries = parse_compact(&dir, &name, k, &bytes)?;
                Some(k)
            }
            None => None,
        };
        // Entries a compact file holds may still be there (a run stopped before deleting them).
        for n in plain.into_iter().filter(|n| compacted_through < Some(*n)) {
            let name = n.to_string();
            if let Some(bytes) = dir.get(&name).await? {
                entries.insert(n, parse(&dir, &name, &bytes)?);
            }
        }
        Ok(Self {
            dir,
            entries,
            compacted_through,
        })
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
        let held = |i: &i64| self.entries.contains_key(i) || Some(*i) <= self.compacted_through;
        match (0..=n).find(|i| !held(i)) {
            None => Ok(()),
            Some(missing) => Err(Error::Corrupt(format!(
                "The file source's log entry '{}/{missing}' is missing{}, but the checkpoint's \
                 batches read it (the log holds entries through {n}): its files would be read \
                 again. Restore the file from a backup, reset the checkpoint (weir checkpoint \
                 reset DIR --full), or use a new checkpoint location.",
                self.dir.display(),
                // The newest compact file the log should have, had it kept every entry.
                match (
                    self.compacted_through,
                    (n + 1) / COMPACT_INTERVAL * COMPACT_INTERVAL - 1
                ) {
                    (Some(k), _) => format!(" (the newest compact file holds 0..={k})"),
                    (None, k) if k >= missing => format!(
                        ", and so is the compact file that would hold it ({k}{COMPACT_SUFFIX})"
                    ),
                    (None, _) => String::new(),
                }
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

    /// Writes entry `n` with `files` unless it exists; returns the files entry `n` holds. Every
    /// [`COMPACT_INTERVAL`] entries, the log is compacted.
    pub async fn add(&mut self, n: i64, files: Vec<FileMeta>) -> Result<Vec<FileMeta>> {
        let mut text = String::from(VERSION);
        for f in &files {
            text.push('\n');
            text.push_str(&json(f)?);
        }
        let text = weir_common::sealed::seal(text);
        let held = match self.dir.put_if_absent(&n.to_string(), text.into()).await? {
            Created::Yes => {
                self.entries.insert(n, files.clone());
                files
            }
            Created::AlreadyExisted => self.entry(n).await?.ok_or_else(|| {
                Error::Corrupt(format!(
                    "The file source's log entry {n} in '{}' vanished while it was written.",
                    self.dir.display()
                ))
            })?,
        };
        if (n + 1) % COMPACT_INTERVAL == 0 && self.compacted_through < Some(n) {
            self.compact(n).await?;
        }
        Ok(held)
    }

    /// Writes `<n>.compact` with every entry through `n`, then deletes those entries and older
    /// compact files.
    async fn compact(&mut self, n: i64) -> Result<()> {
        if let Some(missing) =
            (0..=n).find(|i| !self.entries.contains_key(i) && Some(*i) > self.compacted_through)
        {
            return Err(Error::Corrupt(format!(
                "The file source's log lacks entry {missing} in '{}' while compacting through \
                 {n}. Restore the file, or use a new checkpoint location.",
                self.dir.display()
            )));
        }
        let mut text = String::from(VERSION);
        text.push('\n');
        text.push_str(&json(&CompactHeader {
            compacted_through: n,
        })?);
        for (&batch_id, files) in self.entries.range(..=n) {
            for f in files {
                text.push('\n');
                text.push_str(&json(&CompactLine {
                    file: f.clone(),
                    batch_id,
                })?);
            }
        }
        let text = weir_common::sealed::seal(text);
        // Another run may have written it: its entries are the same (create-only).
        self.dir
            .put_if_absent(&format!("{n}{COMPACT_SUFFIX}"), text.into())
            .await?;
        let older = self.compacted_through;
        self.compacted_through = Some(n);
        for i in older.map_or(0, |k| k + 1)..=n {
            self.dir.delete(&i.to_string()).await?;
        }
        if let Some(k) = older {
            self.dir.delete(&format!("{k}{COMPACT_SUFFIX}")).await?;
        }
        Ok(())
    }
}

fn json<T: Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value)
        .map_err(|e| Error::Corrupt(format!("cannot serialize a log line: {e}")))
}

/// The lines of a log file after its version line, its version and checksum checked.
fn body<'a>(
    dir: &Location,
    name: &str,
    bytes: &'a [u8],
) -> Result<(impl Iterator<Item = &'a str>, impl Fn(String) -> Error)> {
    let file = format!("{}/{name}", dir.display());
    let corrupt = move |what: String| {
        Error::Corrupt(format!(
            "The file source's log file '{file}' is damaged: {what}. Restore it from a backup, \
             reset the checkpoint (weir checkpoint reset DIR --full), or use a new checkpoint \
             location."
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
    Ok((
        body.lines().skip(1).filter(|l| !l.trim().is_empty()),
        corrupt,
    ))
}

fn parse(dir: &Location, name: &str, bytes: &[u8]) -> Result<Vec<FileMeta>> {
    let (lines, corrupt) = body(dir, name, bytes)?;
    lines
        .map(|l| serde_json::from_str(l).map_err(|e| corrupt(format!("line '{l}': {e}"))))
        .collect()
}

/// A compact file's entries, by batch.
fn parse_compact(
    dir: &Location,
    name: &str,
    through: i64,
    bytes: &[u8],
) -> Result<BTreeMap<i64, Vec<FileMeta>>> {
    let (mut lines, corrupt) = body(dir, name, bytes)?;
    let header: CompactHeader = lines
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| corrupt("it has no {\"compactedThrough\":n} line".into()))?;
    if header.compacted_through != through {
        return Err(corrupt(format!(
            "it says it holds entries through {}, its name through {through}",
            header.compacted_through
        )));
    }
    let mut entries: BTreeMap<i64, Vec<FileMeta>> = BTreeMap::new();
    for l in lines {
        let c: CompactLine =
            serde_json::from_str(l).map_err(|e| corrupt(format!("line '{l}': {e}")))?;
        if !(0..=through).contains(&c.batch_id) {
            return Err(corrupt(format!("line '{l}' is of no entry it holds")));
        }
        entries.entry(c.batch_id).or_default().push(c.file);
    }
    Ok(entries)
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

    fn file(n: i64) -> FileMeta {
        FileMeta {
            path: format!("f{n}.json"),
            size: n as u64,
            timestamp: n,
        }
    }

    /// The names in `dir`, sorted.
    fn names(dir: &std::path::Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn every_tenth_entry_compacts_the_log_and_a_reopened_log_holds_every_entry() {
        let dir = tempfile::tempdir().unwrap();
        let loc = Location::local(dir.path()).unwrap();
        let mut log = SourceLog::open(loc.clone()).await.unwrap();
        for n in 0..25 {
            log.add(n, vec![file(n), file(100 + n)]).await.unwrap();
        }
        // One compact file through 19, then entries 20..24.
        assert_eq!(
            names(dir.path()),
            ["19.compact", "20", "21", "22", "23", "24"]
        );
        let mut reopened = SourceLog::open(loc.clone()).await.unwrap();
        reopened.check_complete_through(24).unwrap();
        assert_eq!(reopened.all_files().count(), 50);
        for n in [0, 9, 10, 19, 20, 24] {
            assert_eq!(
                reopened.entry(n).await.unwrap(),
                Some(vec![file(n), file(100 + n)]),
                "entry {n}"
            );
        }
        // Adding to the reopened log goes on: 29 compacts 0..=29 and removes 19.compact.
        for n in 25..30 {
            reopened.add(n, vec![file(n)]).await.unwrap();
        }
        assert_eq!(names(dir.path()), ["29.compact"]);
        let again = SourceLog::open(loc.clone()).await.unwrap();
        assert_eq!(again.all_files().count(), 55);

        // A changed digit in the compact file is refused by name; a lost one, whose entries
        // are gone too, leaves the log incomplete.
        let text = std::fs::read_to_string(dir.path().join("29.compact")).unwrap();
        std::fs::write(
            dir.path().join("29.compact"),
            text.replace("f7.json", "f8.json"),
        )
        .unwrap();
        let err = SourceLog::open(loc.clone()).await.unwrap_err().to_string();
        assert!(
            err.contains("29.compact") && err.contains("checksum"),
            "{err}"
        );
        std::fs::remove_file(dir.path().join("29.compact")).unwrap();
        let lost = SourceLog::open(loc).await.unwrap();
        let err = lost.check_complete_through(29).unwrap_err().to_string();
        assert!(err.contains("29.compact"), "{err}");
    }

    #[tokio::test]
    async fn entries_left_by_a_compaction_stopped_half_way_are_read_from_the_compact_file() {
        let dir = tempfile::tempdir().unwrap();
        let loc = Location::local(dir.path()).unwrap();
        let mut log = SourceLog::open(loc.clone()).await.unwrap();
        for n in 0..10 {
            log.add(n, vec![file(n)]).await.unwrap();
        }
        // As if the run had stopped before deleting entry 3: an entry the compact file holds.
        std::fs::write(dir.path().join("3"), "v9\nnot read").unwrap();
        let reopened = SourceLog::open(loc).await.unwrap();
        reopened.check_complete_through(9).unwrap();
        assert_eq!(reopened.all_files().count(), 10);
    }
}
