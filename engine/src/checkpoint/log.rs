//! The text formats of the offsets log (the write-ahead log) and the commits log.
//!
//! ```text
//! offsets/<N>                                   commits/<N>
//! v1                                            v1
//! {"batchWatermarkMs":0,"batchTimestampMs":..., {"nextBatchWatermarkMs":0}
//!  "conf":{...}}
//! {"start":<offset json>,"end":<offset json>}   (one line per source, by position)
//! ```
//!
//! Spark logs only end offsets; weir logs both ends of every source so an entry alone says
//! exactly which rows the batch read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use weir_sources::Offset;

/// Newest format version of both logs (and of the state and reset records). Version 2 files
/// end with a checksum line, which they must have; version 1 files have none.
pub const LOG_VERSION: u32 = 2;

/// Batch-wide facts of an offsets entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchMetadata {
    /// The event-time watermark the batch runs with.
    pub batch_watermark_ms: i64,
    /// When the batch was planned (epoch ms).
    pub batch_timestamp_ms: i64,
    /// Session settings that must stay fixed across restarts.
    #[serde(default)]
    pub conf: BTreeMap<String, String>,
}

/// One source's range in a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceRange {
    /// Where the batch starts reading (exclusive of rows already read).
    pub start: Offset,
    /// Where the batch stops reading.
    pub end: Offset,
    /// Which source this is ([`weir_sources::SourceProvider::identity`]), checked on restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The name the user gave the source: with source evolution, a restart finds the source's
    /// offsets by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// An entry of the offsets log: everything needed to re-run batch N exactly.
#[derive(Debug, Clone, PartialEq)]
pub struct OffsetEntry {
    /// Batch-wide facts.
    pub metadata: BatchMetadata,
    /// One range per source, by position in the query.
    pub sources: Vec<SourceRange>,
}

/// An entry of the commits log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitEntry {
    /// The watermark the next batch runs with.
    pub next_batch_watermark_ms: i64,
}

/// Why a log entry could not be read.
pub type DecodeError = String;

pub(crate) fn version_line(text: &str) -> Result<(u32, std::str::Lines<'_>), DecodeError> {
    let mut lines = text.lines();
    let first = lines.next().ok_or("is empty")?;
    let v: u32 = first
        .strip_prefix('v')
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| {
            format!(
                "does not start with a version line (found '{}')",
                truncate(first)
            )
        })?;
    if v > LOG_VERSION {
        return Err(format!(
            "has format version v{v}, newer than this weir reads (v{LOG_VERSION}): it was written \
             by a newer weir; run that version"
        ));
    }
    Ok((v, lines))
}

pub(crate) use weir_common::sealed::{seal, unseal};

/// The lines after the version line of a [`seal`]ed log file, checked: a newer format is
/// reported as such before the checksum is looked at.
pub(crate) fn checked_lines(text: &str) -> Result<std::str::Lines<'_>, DecodeError> {
    let (version, _) = version_line(text)?;
    let body = unseal(text)?;
    // A version 2 file cut at a line end would lose its checksum line and pass as unchecked.
    if version >= 2 && body.len() == text.len() {
        return Err("has lost its checksum line (it was cut short)".into());
    }
    version_line(body).map(|(_, lines)| lines)
}

fn truncate(s: &str) -> String {
    s.chars().take(40).collect()
}

impl OffsetEntry {
    /// The entry as file content.
    pub fn encode(&self) -> String {
        let mut s = format!("v{LOG_VERSION}\n");
        s += &serde_json::to_string(&self.metadata).unwrap_or_default();
        for r in &self.sources {
            s.push('\n');
            s += &serde_json::to_string(r).unwrap_or_default();
        }
        seal(s)
    }

    /// Reads an entry from file content.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let text = std::str::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_string())?;
        let mut lines = checked_lines(text)?;
        let meta_line = lines.next().ok_or("ends after its version line")?;
        let metadata: BatchMetadata = serde_json::from_str(meta_line)
            .map_err(|e| format!("has an unreadable batch metadata line ({e})"))?;
        let sources = lines
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str::<SourceRange>(l)
                    .map_err(|e| format!("has an unreadable offsets line for source {i} ({e})"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { metadata, sources })
    }
}

impl CommitEntry {
    /// The entry as file content.
    pub fn encode(&self) -> String {
        seal(format!(
            "v{LOG_VERSION}\n{}",
            serde_json::to_string(self).unwrap_or_default()
        ))
    }

    /// Reads an entry from file content.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let text = std::str::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_string())?;
        let mut lines = checked_lines(text)?;
        let line = lines.next().ok_or("ends after its version line")?;
        serde_json::from_str(line).map_err(|e| format!("has an unreadable commit line ({e})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> OffsetEntry {
        OffsetEntry {
            metadata: BatchMetadata {
                batch_watermark_ms: 0,
                batch_timestamp_ms: 1_700_000_000_000,
                conf: BTreeMap::from([("weir.sql.shuffle.partitions".into(), "2".into())]),
            },
            sources: vec![SourceRange {
                start: Offset::long(3),
                end: Offset(serde_json::json!({"offset": 10, "timestamp": 1000})),
                source: Some("rate-micro-batch".into()),
                name: Some("clicks".into()),
            }],
        }
    }

    #[test]
    fn offsets_entries_round_trip_in_a_readable_format() {
        let text = entry().encode();
        assert!(text.starts_with("v2\n{\"batchWatermarkMs\":0,"), "{text}");
        let body = unseal(&text).unwrap();
        assert!(
            body.ends_with(
                "{\"start\":3,\"end\":{\"offset\":10,\"timestamp\":1000},\"source\":\"rate-micro-batch\",\"name\":\"clicks\"}"
            ),
            "{text}"
        );
        assert!(text.contains("\n#fnv64="), "{text}");
        assert_eq!(OffsetEntry::decode(text.as_bytes()).unwrap(), entry());
        // A version 2 entry cut at a line end is refused; version 1 entries (written before
        // sources were named and before the checksum line) still read.
        assert!(
            OffsetEntry::decode(body.as_bytes())
                .unwrap_err()
                .contains("checksum line")
        );
        let body = body.replacen("v2", "v1", 1);
        let unnamed = body.replace(",\"source\":\"rate-micro-batch\",\"name\":\"clicks\"", "");
        assert_eq!(
            OffsetEntry::decode(unnamed.as_bytes()).unwrap().sources[0].source,
            None
        );
    }

    #[test]
    fn damaged_or_newer_entries_are_refused_with_a_reason() {
        let text = entry().encode();
        let cut = &text.as_bytes()[..text.len() / 2];
        assert!(
            OffsetEntry::decode(cut)
                .unwrap_err()
                .contains("lost its checksum line")
        );
        // Damage inside a value still parses as JSON; the checksum finds it.
        let garbled = text
            .replace("rocksdb", "rocksXX")
            .replace("shuffle", "shuffXX");
        assert!(
            OffsetEntry::decode(garbled.as_bytes())
                .unwrap_err()
                .contains("checksum"),
            "{garbled}"
        );
        assert!(OffsetEntry::decode(b"").unwrap_err().contains("empty"));
        assert!(
            OffsetEntry::decode(b"v9\n{}")
                .unwrap_err()
                .contains("newer")
        );
        assert!(
            CommitEntry::decode(b"garbage")
                .unwrap_err()
                .contains("version line")
        );
        let c = CommitEntry {
            next_batch_watermark_ms: 5,
        };
        assert_eq!(CommitEntry::decode(c.encode().as_bytes()).unwrap(), c);
    }
}
