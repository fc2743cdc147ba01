//! `weir checkpoint reset`: the recovery strategies for a checkpoint that no longer fits its
//! query, made explicit and recorded.
//!
//! ```text
//! full refresh     offsets/ commits/ state/ sources/ deleted, the sink's output cleared,
//!                  a new query ID: the query starts over from its sources' starting positions
//! selective reset  the new query planned against the checkpoint: unchanged stateful operators
//!                  keep their state, changed, added or removed ones start empty (or go), and
//!                  every source continues from its committed offsets, so the sink's output
//!                  is kept and continued with no row lost or doubled
//! ```
//!
//! Each reset writes `resets/<n>` first (`done: false`) and marks it done last. A run refuses a
//! checkpoint whose last reset is not done (`CHECKPOINT_RESET_INCOMPLETE`), and running the
//! reset again finishes it: every step can be repeated.

use std::collections::BTreeSet;

use serde::Serialize;

pub use crate::checkpoint::resets::{OperatorChange, ResetKind, ResetRecord, SourceReset};
pub(crate) use crate::checkpoint::resets::{how_to_finish, next_reset};
use crate::checkpoint::{self, Checkpoint};
use crate::stateful::{OperatorInfo, StateLayout};
use crate::{Error, Result};

/// What a reset did: its record and number.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResetReport {
    /// The checkpoint's location.
    pub location: String,
    /// The record's number (`resets/<n>`).
    pub reset: u64,
    /// The record.
    #[serde(flatten)]
    pub record: ResetRecord,
}

impl ResetReport {
    /// The report as text for a terminal.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let r = &self.record;
        let mut out = String::new();
        let kind = match r.kind {
            ResetKind::FullRefresh => "full refresh",
            ResetKind::Selective => "selective reset",
            ResetKind::Repartition => "repartition",
        };
        let _ = writeln!(out, "checkpoint  {}", self.location);
        let _ = writeln!(out, "reset       {kind}, recorded as resets/{}", self.reset);
        if r.query_id_before == r.query_id_after {
            let _ = writeln!(out, "query id    {}", r.query_id_after);
        } else {
            let _ = writeln!(
                out,
                "query id    {} (was {})",
                r.query_id_after, r.query_id_before
            );
        }
        let _ = writeln!(out, "next batch  {}", r.next_batch);
        let _ = writeln!(out, "sink        {}", r.sink);
        for s in &r.sources {
            let _ = writeln!(
                out,
                "source      [{}] {}{} starts at {} ({}{})",
                s.position,
                s.name.as_ref().map_or(String::new(), |n| format!("'{n}' ")),
                s.source,
                s.start,
                if s.how == "derived" {
                    "derived from the committed offsets"
                } else {
                    "its starting position"
                },
                s.previous
                    .as_ref()
                    .map_or(String::new(), |p| format!(", was {p}"))
            );
            if let Some(w) = &s.warning {
                let _ = writeln!(out, "  WARNING   this start {w}");
            }
        }
        if !r.operators.is_empty() {
            let _ = writeln!(out, "state");
        }
        for op in &r.operators {
            let at = op
                .operator_id
                .map_or(String::new(), |id| format!(" as operator {id}"));
            let from = match (op.first_batch, op.action.as_str()) {
                (Some(b), "reset") => format!(", empty from batch {b}"),
                (Some(b), _) => format!(", from batch {b}"),
                (None, _) => String::new(),
            };
            let _ = writeln!(
                out,
                "  {:<8} {}{at} (state/{}{from})",
                op.action, op.operator_name, op.state_id
            );
        }
        out
    }
}

/// The operators' state after a selective reset, and what it does to each.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatePlan {
    /// The checkpoint's new record of the operators (with their layouts).
    pub(crate) operators: Vec<OperatorInfo>,
    /// What happens to each operator's state.
    pub(crate) changes: Vec<OperatorChange>,
}

/// Matches the query's operators `now` with the checkpoint's `stored` ones, in plan order: an
/// operator whose state has the same meaning and shape keeps it (in its folder, wherever its
/// position moved), any other starts empty at `next_batch` in a new folder (no ID in `taken`,
/// the folders present), and stored operators left unmatched are dropped.
pub(crate) fn plan_state(
    stored: &[OperatorInfo],
    now: &[OperatorInfo],
    next_batch: u64,
    taken: &BTreeSet<u32>,
) -> StatePlan {
    let mut taken = taken.clone();
    taken.extend(stored.iter().map(OperatorInfo::state_id));
    taken.extend(now.iter().map(|o| o.operator_id));
    let mut fresh = || {
        let id = (0..).find(|i| !taken.contains(i)).unwrap_or(u32::MAX);
        taken.insert(id);
        id
    };
    let mut used = vec![false; stored.len()];
    let mut from = 0;
    let mut operators = vec![];
    let mut changes = vec![];
    for op in now {
        let mut op = op.clone();
        let found = (from..stored.len()).find(|&k| stored[k].same_state_as(&op));
        match found {
            Some(k) => {
                from = k + 1;
                used[k] = true;
                let state_id = stored[k].state_id();
                let base_batch = stored[k].layout.map_or(0, |l| l.base_batch);
                op.layout =
                    (state_id != op.operator_id || base_batch != 0).then_some(StateLayout {
                        state_id,
                        base_batch,
                    });
                changes.push(OperatorChange {
                    action: "kept".into(),
                    operator_id: Some(op.operator_id),
                    operator_name: op.operator_name.clone(),
                    state_id,
                    first_batch: None,
                });
            }
            None => {
                let state_id = fresh();
                op.layout = Some(StateLayout {
                    state_id,
                    base_batch: next_batch,
                });
                changes.push(OperatorChange {
                    action: "reset".into(),
                    operator_id: Some(op.operator_id),
                    operator_name: op.operator_name.clone(),
                    state_id,
                    first_batch: Some(next_batch),
                });
            }
        }
        operators.push(op);
    }
    for (old, _) in stored.iter().zip(&used).filter(|(_, u)| !**u) {
        changes.push(OperatorChange {
            action: "dropped".into(),
            operator_id: None,
            operator_name: old.operator_name.clone(),
            state_id: old.state_id(),
            first_batch: None,
        });
    }
    StatePlan { operators, changes }
}

/// Deletes the state folders no operator of `operators` uses.
pub(crate) async fn delete_unused_state(
    checkpoint: &Checkpoint,
    operators: &[OperatorInfo],
) -> Result<()> {
    let used: BTreeSet<u32> = operators.iter().map(OperatorInfo::state_id).collect();
    for id in checkpoint.state_folder_ids().await? {
        if !used.contains(&id) {
            checkpoint
                .delete_folder(&format!("{}/{id}", checkpoint::STATE))
                .await?;
        }
    }
    Ok(())
}

/// Full refresh of the checkpoint at `checkpoint` (opened for writing): deletes its batches,
/// state and sources' files, deals with the sink's output (`clear`, given the sink record:
/// clears or keeps it), and gives it a new query ID. With `keep_sink_data` a damaged sink
/// record is no obstacle.
pub(crate) async fn full_refresh<F, Fut>(
    checkpoint: &mut Checkpoint,
    keep_sink_data: bool,
    clear: F,
) -> Result<ResetReport>
where
    F: FnOnce(checkpoint::SinkRecord) -> Fut,
    Fut: std::future::Future<Output = Result<String>>,
{
    let resets = checkpoint.resets().await?;
    let (n, unfinished) = next_reset(&resets);
    if let Some(r) = unfinished
        && r.kind != ResetKind::FullRefresh
    {
        return Err(Error::user(
            "CHECKPOINT_RESET_INCOMPLETE",
            "55000",
            format!(
                "resets/{n} of the checkpoint '{}' is a reset that did not finish: finish it \
                 first ({}), then refresh.",
                checkpoint.location().display(),
                how_to_finish(r.kind)
            ),
        ));
    }
    // The sink record says what to clear: a damaged one is refused unless the output is kept.
    let sink_record = match checkpoint.read_sink().await {
        Ok(r) => r,
        Err(_) if keep_sink_data => None,
        Err(e) => return Err(e),
    };
    // The state record only feeds the report: a damaged or half-deleted one is no obstacle.
    let stored = checkpoint.read_state_metadata().await.unwrap_or(None);
    let mut record = ResetRecord {
        kind: ResetKind::FullRefresh,
        time: crate::execution::progress::format_timestamp(chrono::Utc::now().timestamp_millis()),
        query_id_before: unfinished.map_or(checkpoint.id(), |r| r.query_id_before),
        query_id_after: checkpoint.id(),
        next_batch: 0,
        operators: stored
            .iter()
            .flat_map(|m| &m.operators)
            .map(|o| OperatorChange {
                action: "dropped".into(),
                operator_id: None,
                operator_name: o.operator_name.clone(),
                state_id: o.state_id(),
                first_batch: None,
            })
            .collect(),
        sources: vec![],
        sink: String::new(),
        done: false,
    };
    if unfinished.is_none() {
        checkpoint.write_reset(n, &record).await?;
    }
    // The logs first: from here until the record is done, a run is refused.
    for dir in [
        checkpoint::COMMITS,
        checkpoint::OFFSETS,
        checkpoint::STATE,
        checkpoint::SOURCES,
    ] {
        checkpoint.delete_folder(dir).await?;
    }
    weir_common::failpoint::pause_point("reset_mid", n);
    record.sink = match sink_record {
        Some(s) => clear(s).await?,
        None => "none recorded (or its record was damaged); its output is kept".into(),
    };
    checkpoint.delete_sink_record().await?;
    record.query_id_after = checkpoint.renew_id().await?;
    record.done = true;
    checkpoint.write_reset(n, &record).await?;
    Ok(ResetReport {
        location: checkpoint.location().display().to_string(),
        reset: n,
        record,
    })
}

/// A sink record as words.
pub(crate) fn describe(s: &checkpoint::SinkRecord) -> String {
    match &s.identity {
        Some(i) => format!("{} at {i}", s.format),
        None => s.format.clone(),
    }
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn op(id: u32, name: &str, fingerprint: &str) -> OperatorInfo {
        OperatorInfo {
            operator_id: id,
            operator_name: name.into(),
            num_partitions: 2,
            store_names: vec!["default".into()],
            key_schema: Schema::new(vec![Field::new("k", DataType::Int64, true)]),
            value_schema: Schema::new(vec![Field::new("v", DataType::Int64, true)]),
            fingerprint: vec![fingerprint.into()],
            layout: None,
        }
    }

    fn actions(p: &StatePlan) -> Vec<(String, Option<u32>, u32)> {
        p.changes
            .iter()
            .map(|c| (c.action.clone(), c.operator_id, c.state_id))
            .collect()
    }

    #[test]
    fn a_removed_operator_is_dropped_and_the_next_keeps_its_folder() {
        let stored = [op(0, "dedupe", "key k"), op(1, "aggregate", "count(1)")];
        let now = [op(0, "aggregate", "count(1)")];
        let p = plan_state(&stored, &now, 7, &BTreeSet::new());
        assert_eq!(
            actions(&p),
            [("kept".into(), Some(0), 1), ("dropped".into(), None, 0)]
        );
        // The aggregate is operator 0 now, and reads its old folder from version 7 on.
        assert_eq!(p.operators[0].state_id(), 1);
        assert_eq!(p.operators[0].state_version(7), 7);
    }

    #[test]
    fn a_changed_or_added_operator_starts_empty_in_a_new_folder() {
        let stored = [op(0, "aggregate", "count(1)")];
        let now = [op(0, "dedupe", "key k"), op(1, "aggregate", "sum(v)")];
        // Folder 3 holds leftovers of an earlier reset: not reused.
        let p = plan_state(&stored, &now, 5, &BTreeSet::from([3]));
        assert_eq!(
            actions(&p),
            [
                ("reset".into(), Some(0), 2),
                ("reset".into(), Some(1), 4),
                ("dropped".into(), None, 0)
            ]
        );
        assert_eq!(
            p.operators[1].state_version(5),
            0,
            "empty at the reset's batch"
        );
        assert_eq!(p.operators[1].state_version(9), 4);
    }

    #[test]
    fn planning_again_after_a_reset_keeps_everything() {
        let stored = [op(0, "dedupe", "key k"), op(1, "aggregate", "count(1)")];
        let now = [op(0, "aggregate", "sum(v)")];
        let first = plan_state(&stored, &now, 5, &BTreeSet::new());
        let mut planned = now.to_vec();
        planned[0].layout = None;
        let again = plan_state(&first.operators, &planned, 9, &BTreeSet::new());
        assert_eq!(again.operators, first.operators);
        assert!(again.changes.iter().all(|c| c.action == "kept"));
    }
}
