//! Reset records, `resets/<n>`: what each checkpoint reset did, written first (`done: false`)
//! and marked done last. A run refuses a checkpoint whose last reset is not done
//! (`CHECKPOINT_RESET_INCOMPLETE`); the resets themselves are tools (`crate::tools::reset`,
//! `crate::tools::repartition`).

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{Checkpoint, RESETS};
use crate::{Error, Result};

/// Which recovery a reset was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ResetKind {
    /// Everything cleared: the query starts over.
    FullRefresh,
    /// The checkpoint fitted to a changed query, continuing where it was.
    Selective,
    /// The state rewritten into another number of shuffle partitions.
    Repartition,
}

/// What a reset did to one stateful operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorChange {
    /// `kept`, `reset` (starts empty) or `dropped` (the query no longer has it).
    pub action: String,
    /// Its ID in the query after the reset (`None` when dropped).
    pub operator_id: Option<u32>,
    /// `aggregate`, `dedupe`, ...
    pub operator_name: String,
    /// The folder its state is kept in (`state/<stateId>`).
    pub state_id: u32,
    /// For a reset operator: the first batch of its new state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_batch: Option<u64>,
}

/// A source a selective reset started anew.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceReset {
    /// Its position in the offsets log's entries.
    pub position: usize,
    /// Its name, if named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The source it replaces.
    pub previous: Option<String>,
    /// The source now.
    pub source: String,
    /// Where it starts (its offset before the next batch).
    pub start: serde_json::Value,
    /// `derived` (from the committed offsets of the source it replaces) or `startingPosition`
    /// (its own starting options).
    pub how: String,
    /// A gap or overlap against the committed offsets, when the start leaves one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// The record of one reset, `resets/<n>` in the checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResetRecord {
    /// Which recovery.
    pub kind: ResetKind,
    /// When it started (UTC).
    pub time: String,
    /// The query ID before the reset.
    pub query_id_before: Uuid,
    /// The query ID after it (a full refresh gives a new one).
    pub query_id_after: Uuid,
    /// The batch the query runs next.
    pub next_batch: u64,
    /// What happened to each stateful operator's state.
    pub operators: Vec<OperatorChange>,
    /// The sources a selective reset started anew, and where.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourceReset>,
    /// What happened to the sink's output.
    pub sink: String,
    /// Whether every step is done.
    pub done: bool,
}

/// The command that finishes an unfinished reset of `kind`.
pub(crate) fn how_to_finish(kind: ResetKind) -> &'static str {
    match kind {
        ResetKind::FullRefresh => "weir checkpoint reset DIR --full",
        ResetKind::Selective => "weir checkpoint reset DIR --query QUERY.sql",
        ResetKind::Repartition => "weir checkpoint repartition DIR --partitions N",
    }
}

fn encode(record: &ResetRecord) -> Result<String> {
    let json = serde_json::to_string(record).map_err(|e| Error::Internal(e.to_string()))?;
    Ok(super::log::seal(format!(
        "v{}\n{json}",
        super::log::LOG_VERSION
    )))
}

impl Checkpoint {
    /// The checkpoint's resets, oldest first.
    pub async fn resets(&self) -> Result<Vec<(u64, ResetRecord)>> {
        let mut out = vec![];
        for n in self.ids(RESETS).await? {
            let rel = format!("{RESETS}/{n}");
            let Some(bytes) = self.location.get(&rel).await? else {
                continue;
            };
            let corrupt = |problem: String| Error::Corrupt {
                file: self.file(&rel),
                problem,
            };
            let text =
                std::str::from_utf8(&bytes).map_err(|_| corrupt("is not UTF-8 text".into()))?;
            let mut lines = super::log::checked_lines(text).map_err(corrupt)?;
            let json = lines
                .next()
                .ok_or_else(|| corrupt("has no record after its version line".into()))?;
            let record = serde_json::from_str(json)
                .map_err(|e| corrupt(format!("is not a reset record ({e})")))?;
            out.push((n, record));
        }
        Ok(out)
    }

    /// Refuses a checkpoint whose last reset (of `resets`, as [`Checkpoint::resets`] read them)
    /// did not finish.
    pub(crate) fn check_resets_done(&self, resets: &[(u64, ResetRecord)]) -> Result<()> {
        if let Some((n, r)) = resets.last()
            && !r.done
        {
            let how = how_to_finish(r.kind);
            return Err(Error::user(
                "CHECKPOINT_RESET_INCOMPLETE",
                "55000",
                format!(
                    "The checkpoint '{}' is in the middle of a reset (resets/{n} is not done: the \
                     reset was stopped before it finished), so its files may not fit together. \
                     Run the reset again to finish it ({how}).",
                    self.location.display()
                ),
            ));
        }
        Ok(())
    }

    /// Writes reset record `n`: create-only when it starts, replaced when it is done.
    pub(crate) async fn write_reset(&self, n: u64, record: &ResetRecord) -> Result<()> {
        self.check_lease()?;
        let rel = format!("{RESETS}/{n}");
        if record.done {
            self.location
                .put(&rel, Bytes::from(encode(record)?))
                .await?;
        } else {
            self.create(rel, encode(record)?, n).await?;
        }
        Ok(())
    }
}

/// Writes the record of a full refresh that starts on a checkpoint whose metadata cannot be
/// read (unless a refresh is already under way).
pub(crate) async fn record_refresh_start(location: &weir_common::Location) -> Result<()> {
    let mut ids: Vec<u64> = location
        .list_files(RESETS)
        .await?
        .into_iter()
        .filter_map(|(name, _)| name.parse().ok())
        .collect();
    ids.sort_unstable();
    let next = ids.last().map_or(0, |n| n.saturating_add(1));
    if let Some(last) = ids.last()
        && let Some(bytes) = location.get(&format!("{RESETS}/{last}")).await?
        && String::from_utf8_lossy(&bytes).contains("\"done\":false")
    {
        return Ok(());
    }
    let record = ResetRecord {
        kind: ResetKind::FullRefresh,
        time: crate::execution::progress::format_timestamp(chrono::Utc::now().timestamp_millis()),
        query_id_before: Uuid::nil(),
        query_id_after: Uuid::nil(),
        next_batch: 0,
        operators: vec![],
        sources: vec![],
        sink: String::new(),
        done: false,
    };
    location
        .put_if_absent(&format!("{RESETS}/{next}"), Bytes::from(encode(&record)?))
        .await?;
    Ok(())
}

/// The number of the next reset record, or of the unfinished one to finish.
pub(crate) fn next_reset(resets: &[(u64, ResetRecord)]) -> (u64, Option<&ResetRecord>) {
    match resets.last() {
        Some((n, r)) if !r.done => (*n, Some(r)),
        Some((n, _)) => (n.saturating_add(1), None),
        None => (0, None),
    }
}
