//! What the server runs, kept under `<data>/queries/<id>.json` (one file per query, replaced
//! whole through a temporary file and a rename), so a server started again knows its queries.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One query of the server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct QueryEntry {
    /// The server's id for it.
    pub id: String,
    /// A name given when it was submitted.
    pub name: Option<String>,
    /// Its SQL: one streaming statement (and any statements it needs before it).
    pub sql: String,
    /// Its checkpoint (one the server assigned under `<data>/checkpoints`, unless given).
    pub checkpoint: String,
    /// Its trigger (`'1 second'`, `availableNow`, ...), if not the SQL's own.
    pub trigger: Option<String>,
    /// Whether it should run: a server that starts again restarts it.
    pub running: bool,
    /// When it was submitted (RFC 3339).
    pub created: String,
}

/// The registry folder.
#[derive(Debug)]
pub(crate) struct Registry {
    dir: PathBuf,
}

impl Registry {
    /// The registry under `data`, made if missing.
    pub(crate) fn open(data: &Path) -> std::io::Result<Self> {
        let dir = data.join("queries");
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    /// Every entry, oldest first; a file that does not read as an entry is an error naming it.
    pub(crate) fn entries(&self) -> std::io::Result<Vec<QueryEntry>> {
        let mut out: Vec<QueryEntry> = read_all(&self.dir, "query")?;
        out.sort_by(|a, b| a.created.cmp(&b.created));
        Ok(out)
    }

    /// Writes `entry`, replacing the one of its id.
    pub(crate) fn put(&self, entry: &QueryEntry) -> std::io::Result<()> {
        write(&self.dir, &entry.id, entry)
    }
}

/// Every `*.json` file of `dir` read as a `what` entry; one that does not read is an error
/// naming it.
pub(crate) fn read_all<T: serde::de::DeserializeOwned>(
    dir: &Path,
    what: &str,
) -> std::io::Result<Vec<T>> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let text = std::fs::read(&path)?;
        out.push(serde_json::from_slice(&text).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} is not a {what} entry ({e}); move it away to start without it",
                    path.display()
                ),
            )
        })?);
    }
    Ok(out)
}

/// Writes `entry` as `<dir>/<id>.json`, whole, through a temporary file and a rename.
pub(crate) fn write<T: Serialize>(dir: &Path, id: &str, entry: &T) -> std::io::Result<()> {
    let path = dir.join(format!("{id}.json"));
    let tmp = dir.join(format!(".{id}.json.tmp"));
    let text = serde_json::to_vec_pretty(entry).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}
