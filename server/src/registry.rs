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
        let mut out = vec![];
        for e in std::fs::read_dir(&self.dir)? {
            let path = e?.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let text = std::fs::read(&path)?;
            let entry: QueryEntry = serde_json::from_slice(&text).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{} is not a query entry ({e}); move it away to start without it",
                        path.display()
                    ),
                )
            })?;
            out.push(entry);
        }
        out.sort_by(|a, b| a.created.cmp(&b.created));
        Ok(out)
    }

    /// Writes `entry`, replacing the one of its id.
    pub(crate) fn put(&self, entry: &QueryEntry) -> std::io::Result<()> {
        let path = self.dir.join(format!("{}.json", entry.id));
        let tmp = self.dir.join(format!(".{}.json.tmp", entry.id));
        let text = serde_json::to_vec_pretty(entry).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path)
    }
}
