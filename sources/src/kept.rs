//! Files a source keeps in its checkpoint folder (`sources/<i>/`): a starting position resolved
//! on the first run (Kafka, Delta), a start time (rate). Each is written once, create-only, as
//! `v2`, its body, and a `#fnv64=` checksum line, so that damage anywhere in it (a changed digit
//! still parses) is found. Files of earlier weirs, `v1` then the body or bare JSON, still read.

use weir_common::Location;
use weir_common::location::Created;

use crate::{Error, Result};

const VERSION: &str = "v2";

/// A kept file: its folder and name, and what it is, for messages ("The Kafka source's starting
/// offsets").
pub(crate) struct KeptFile<'a> {
    pub(crate) dir: &'a Location,
    pub(crate) name: &'a str,
    pub(crate) what: &'a str,
}

impl KeptFile<'_> {
    fn damaged(&self, why: &str) -> Error {
        Error::Corrupt(format!(
            "{} '{}/{}' in the checkpoint is damaged: {why}. Restore it from a backup, reset the \
             checkpoint (weir checkpoint reset DIR --full), or use a new checkpoint location.",
            self.what,
            self.dir.display(),
            self.name
        ))
    }

    /// The file's body, checked; `None` when there is no file.
    pub(crate) async fn read(&self) -> Result<Option<String>> {
        match self.dir.get(self.name).await? {
            Some(bytes) => self.parse(&bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Writes `body` unless the file exists; returns the body of the file that counts (another
    /// run's, when it wrote first).
    pub(crate) async fn keep(&self, body: String) -> Result<String> {
        let text = weir_common::sealed::seal(format!("{VERSION}\n{body}"));
        match self.dir.put_if_absent(self.name, text.into()).await? {
            Created::Yes => Ok(body),
            Created::AlreadyExisted => self
                .read()
                .await?
                .ok_or_else(|| self.damaged("it vanished right after it was written")),
        }
    }

    fn parse(&self, bytes: &[u8]) -> Result<String> {
        let text = std::str::from_utf8(bytes).map_err(|_| self.damaged("it is not text"))?;
        // Bare JSON: written by a weir before the version line.
        if text.starts_with('{') {
            return Ok(text.to_string());
        }
        let (first, _) = text.split_once('\n').unwrap_or((text, ""));
        let checked = match first.trim_end() {
            VERSION => true,
            "v1" => false,
            v if v.starts_with('v') && v[1..].parse::<u32>().is_ok() => {
                return Err(self.damaged(&format!(
                    "it has format version '{v}', which this weir does not read (it reads \
                     {VERSION})"
                )));
            }
            _ => return Err(self.damaged("its first line is not a format version")),
        };
        let body = weir_common::sealed::unseal(text)
            .map_err(|_| self.damaged("its checksum does not match its content"))?;
        if checked && body.len() == text.len() {
            return Err(self.damaged("it has lost its checksum line (it was cut short)"));
        }
        Ok(body
            .split_once('\n')
            .map_or("", |(_, rest)| rest)
            .to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Location) -> KeptFile<'_> {
        KeptFile {
            dir,
            name: "initial",
            what: "The test's position",
        }
    }

    #[tokio::test]
    async fn a_kept_body_reads_back_and_the_first_write_wins() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Location::local(tmp.path()).unwrap();
        let f = file(&dir);
        assert_eq!(f.read().await.unwrap(), None);
        assert_eq!(f.keep("{\"a\":1}".into()).await.unwrap(), "{\"a\":1}");
        assert_eq!(f.keep("{\"a\":2}".into()).await.unwrap(), "{\"a\":1}");
        assert_eq!(f.read().await.unwrap().as_deref(), Some("{\"a\":1}"));
    }

    #[tokio::test]
    async fn damage_anywhere_is_refused_by_name_and_old_files_still_read() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Location::local(tmp.path()).unwrap();
        let f = file(&dir);
        f.keep("{\"topic\":{\"0\":12}}".into()).await.unwrap();
        let good = std::fs::read_to_string(tmp.path().join("initial")).unwrap();
        let cut = good.rsplit_once('\n').unwrap().0.to_string();
        for damaged in [
            // a changed digit still parses
            good.replace("12", "13"),
            // the checksum line lost
            cut,
            good[..good.len() / 2].to_string(),
            good.replacen("v2", "v9", 1),
            good.replacen("v2", "~~", 1),
        ] {
            std::fs::write(tmp.path().join("initial"), &damaged).unwrap();
            let e = f.read().await.unwrap_err().to_string();
            assert!(
                e.contains("initial") && e.contains("new checkpoint location"),
                "{damaged}: {e}"
            );
        }
        for (old, body) in [
            ("{\"topic\":{\"0\":12}}", "{\"topic\":{\"0\":12}}"),
            ("v1\n1700000000000", "1700000000000"),
        ] {
            std::fs::write(tmp.path().join("initial"), old).unwrap();
            assert_eq!(f.read().await.unwrap().as_deref(), Some(body));
        }
    }
}
