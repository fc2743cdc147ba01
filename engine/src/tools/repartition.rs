//! `weir checkpoint repartition DIR --partitions N`: rewrites every stateful operator's state
//! into N shuffle partitions offline, so that the next run uses N (Spark fixes the count when
//! the checkpoint is created).
//!
//! ```text
//! state/<old>/<p>/<store>  at the last committed batch's version, every partition scanned
//!   -> each key's shuffle key (the state key without its event-time prefix) hashed into N;
//!      a join's event-time index entry is split by its rows' join keys, and each new
//!      partition gets its own row count
//!   -> state/<new>/<q>/<store> version 1, one commit per new partition
//! state/_metadata          the operators with N partitions, their state in the new folders from
//!                          the next batch on (the commit point); the old folders are deleted
//! ```
//!
//! Recorded as a reset (`resets/<n>`, kind `repartition`); stopped half-way, it is refused by
//! runs until it is run again. On an object store (`s3://`) the state is rewritten in a local
//! copy and the new folders are uploaded before the record of the operators changes.

use std::collections::{BTreeMap, BTreeSet};

use arrow::row::{RowConverter, SortField};
use weir_common::Location;
use weir_state::{KeyRange, RocksDbStateStoreProvider, StateStoreProvider, StoreId, WriteBatch};

use super::reset::{
    OperatorChange, ResetKind, ResetRecord, ResetReport, delete_unused_state, next_reset,
};
use crate::checkpoint::Checkpoint;
use crate::stateful::{
    EVENT_TIME_KEY, OperatorInfo, Placement, StateLayout, StateMetadata, join_state,
};
use crate::{Error, Result};

fn unsupported(message: String) -> Error {
    Error::user("STATE_REPARTITION_UNSUPPORTED", "0A000", message)
}

fn state_err(e: weir_state::Error) -> Error {
    Error::User(e.into())
}

/// Where each state key of `op` goes among `partitions`: the shuffle hashes the operator's key
/// columns, which are the state key without its event-time prefix.
fn new_partitions(op: &OperatorInfo, keys: &[&[u8]], partitions: usize) -> Result<Vec<usize>> {
    let fields: Vec<SortField> = op
        .key_schema
        .fields()
        .iter()
        .map(|f| SortField::new(f.data_type().clone()))
        .collect();
    let skip = usize::from(
        op.key_schema
            .fields()
            .first()
            .is_some_and(|f| f.name() == EVENT_TIME_KEY),
    );
    // A global aggregate's one key is empty; the shuffle sends it by the empty key too.
    if fields.len() == skip {
        return Ok(vec![weir_state::key_partition(&[], partitions); keys.len()]);
    }
    let arrow = |e: arrow::error::ArrowError| Error::Internal(format!("re-keying state: {e}"));
    let state = RowConverter::new(fields.clone()).map_err(arrow)?;
    let parser = state.parser();
    let columns = state
        .convert_rows(keys.iter().map(|k| parser.parse(k)))
        .map_err(arrow)?;
    let shuffle = RowConverter::new(fields[skip..].to_vec()).map_err(arrow)?;
    let rows = shuffle.convert_columns(&columns[skip..]).map_err(arrow)?;
    let out: Vec<usize> = rows
        .iter()
        .map(|r| weir_state::key_partition(r.as_ref(), partitions))
        .collect();
    if out.len() != keys.len() {
        return Err(Error::Internal(format!(
            "re-keying state: {} keys gave {} partitions",
            keys.len(),
            out.len()
        )));
    }
    Ok(out)
}

/// The most shuffle partitions a repartition writes: each is a state store instance per store
/// of each operator, with its own files (about 16 KB even when empty).
pub const MAX_PARTITIONS: usize = 10_000;

/// Disk a rewritten state store instance takes beyond its data (RocksDB's own files), counted
/// generously when checking for free space.
const INSTANCE_OVERHEAD_BYTES: u64 = 64 << 10;

/// Rewrites the state of the checkpoint at `location` into `partitions` shuffle partitions.
pub async fn repartition(location: Location, partitions: usize) -> Result<ResetReport> {
    if !(1..=MAX_PARTITIONS).contains(&partitions) {
        return Err(Error::user(
            "STREAMING_INVALID_OPTION",
            "42616",
            format!(
                "--partitions must be from 1 to {MAX_PARTITIONS} (each partition is a state \
                 store instance per store, with files of its own); {partitions} was given."
            ),
        ));
    }
    Checkpoint::open_read_only(location.clone()).await?;
    let mut checkpoint = Checkpoint::open(location, false).await?;
    let result = run(&checkpoint, partitions).await;
    checkpoint.release().await;
    result
}

async fn run(checkpoint: &Checkpoint, partitions: usize) -> Result<ResetReport> {
    let resets = checkpoint.resets().await?;
    let (n, unfinished) = next_reset(&resets);
    if let Some(r) = unfinished
        && r.kind != ResetKind::Repartition
    {
        return Err(Error::user(
            "CHECKPOINT_RESET_INCOMPLETE",
            "55000",
            format!("resets/{n} of the checkpoint did not finish: run that reset again first."),
        ));
    }
    let last = checkpoint.resume_point().await?.last_committed();
    let stored = checkpoint
        .read_state_metadata()
        .await?
        .map(|m| m.operators)
        .unwrap_or_default();
    let Some(last) = last.filter(|_| !stored.is_empty()) else {
        return Err(unsupported(
            "The checkpoint holds no committed state to repartition: start the query with the \
             partition count it should have (weir.sql.shuffle.partitions)."
                .into(),
        ));
    };
    if let Some(op) = stored.iter().find(|o| o.kind().is_none()) {
        return Err(unsupported(format!(
            "Repartitioning rewrites the state of aggregations, session-window aggregations, \
             deduplications and stream-stream joins; operator {} is a {}, whose state it does \
             not know.",
            op.operator_id, op.operator_name
        )));
    }
    if unfinished.is_none() && stored.iter().all(|o| o.num_partitions == partitions) {
        return Err(unsupported(format!(
            "The checkpoint's state already has {partitions} partitions."
        )));
    }
    // The new folders, chosen now so that a failure can remove exactly them.
    let taken: BTreeSet<u32> = checkpoint.state_folder_ids().await?.into_iter().collect();
    let fresh = fresh_ids(&stored, &taken);
    let mut record = match unfinished {
        Some(r) => r.clone(),
        None => ResetRecord {
            kind: ResetKind::Repartition,
            time: crate::execution::progress::format_timestamp(
                chrono::Utc::now().timestamp_millis(),
            ),
            query_id_before: checkpoint.id(),
            query_id_after: checkpoint.id(),
            next_batch: last + 1,
            operators: vec![],
            sources: vec![],
            sink: "kept".into(),
            done: false,
        },
    };
    let scratch =
        crate::stateful::run_scratch_dir("weir-repartition", checkpoint.id(), uuid::Uuid::new_v4());
    // On an object store the state is rewritten in a local copy, and the new folders uploaded.
    let mirror = match checkpoint.state_dir() {
        Some(_) => None,
        None => Some(
            crate::checkpoint::state_mirror::StateMirror::download(
                checkpoint.location().child(crate::checkpoint::STATE),
                scratch.join("state"),
            )
            .await?,
        ),
    };
    let state_dir = match (checkpoint.state_dir(), &mirror) {
        (Some(d), _) => d,
        (None, Some(m)) => m.local().to_path_buf(),
        (None, None) => return Err(Error::Internal("no state folder to repartition".into())),
    };
    let rewritten = match check_space(&stored, &state_dir, &scratch, partitions) {
        Err(e) => Err(e),
        Ok(()) => tokio::task::spawn_blocking({
            let (stored, fresh) = (stored.clone(), fresh.clone());
            let local = scratch.join("db");
            move || rewrite(&stored, &fresh, state_dir, local, last, partitions)
        })
        .await
        .map_err(|e| Error::Internal(format!("the repartition task failed: {e}")))
        .and_then(|r| r),
    };
    let done = match (rewritten, &mirror) {
        (Ok(r), Some(m)) => m.sync().await.map(|()| r),
        (r, _) => r,
    };
    let _ = std::fs::remove_dir_all(&scratch);
    let (operators, changes) = match done {
        Ok(r) => r,
        Err(e) => {
            // Nothing refers to the new folders yet: remove them, and the checkpoint is as it
            // was.
            for id in &fresh {
                let _ = checkpoint
                    .delete_folder(&format!("{}/{id}", crate::checkpoint::STATE))
                    .await;
            }
            return Err(e);
        }
    };
    // The record goes in just before the commit point: a run refuses the checkpoint only
    // while its record of operators is being replaced.
    if unfinished.is_none() {
        checkpoint.write_reset(n, &record).await?;
    }
    checkpoint
        .replace_state_metadata(&StateMetadata {
            operators: operators.clone(),
        })
        .await?;
    delete_unused_state(checkpoint, &operators).await?;
    if unfinished.is_none() {
        record.operators = changes;
    }
    record.done = true;
    checkpoint.write_reset(n, &record).await?;
    Ok(ResetReport {
        location: checkpoint.location().display().to_string(),
        reset: n,
        record,
    })
}

/// A new state folder ID for each operator of `stored`, none of them in `taken` or used by an
/// operator.
fn fresh_ids(stored: &[OperatorInfo], taken: &BTreeSet<u32>) -> Vec<u32> {
    let mut taken = taken.clone();
    taken.extend(stored.iter().map(OperatorInfo::state_id));
    stored
        .iter()
        .map(|_| {
            let fresh = (0..).find(|i| !taken.contains(i)).unwrap_or(u32::MAX);
            taken.insert(fresh);
            fresh
        })
        .collect()
}

/// Bytes of the files under `dir`.
fn bytes_under(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => todo.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// Refuses a repartition the disks cannot hold: the rewritten state takes about the state's
/// size again in the checkpoint and in the scratch folder, plus each new store instance's own
/// files. Checked before anything is written.
fn check_space(
    stored: &[OperatorInfo],
    state_dir: &std::path::Path,
    scratch: &std::path::Path,
    partitions: usize,
) -> Result<()> {
    check_space_with(stored, state_dir, scratch, partitions, |dir| {
        let fs = rustix::fs::statvfs(dir).ok()?;
        Some(fs.f_bavail.saturating_mul(fs.f_frsize))
    })
}

/// [`check_space`] with `free` telling the bytes free on a folder's filesystem.
fn check_space_with(
    stored: &[OperatorInfo],
    state_dir: &std::path::Path,
    scratch: &std::path::Path,
    partitions: usize,
    free: impl Fn(&std::path::Path) -> Option<u64>,
) -> Result<()> {
    let state: u64 = stored
        .iter()
        .map(|o| bytes_under(&state_dir.join(o.state_id().to_string())))
        .sum();
    let instances: u64 = stored
        .iter()
        .map(|o| (o.store_names.len() * partitions) as u64)
        .sum();
    let needed = state
        .saturating_mul(2)
        .saturating_add(instances.saturating_mul(INSTANCE_OVERHEAD_BYTES));
    let scratch_parent = scratch.parent().unwrap_or(scratch);
    for dir in [state_dir, scratch_parent] {
        let Some(free) = free(dir) else {
            continue;
        };
        if free < needed {
            return Err(Error::user(
                "STATE_REPARTITION_INSUFFICIENT_SPACE",
                "53100",
                format!(
                    "Repartitioning into {partitions} partitions needs about {} MB of disk at \
                     '{}' ({} store instances and {} MB of state), but {} MB are free. Free \
                     some space or choose fewer partitions; nothing was changed.",
                    needed >> 20,
                    dir.display(),
                    instances,
                    state >> 20,
                    free >> 20
                ),
            ));
        }
    }
    Ok(())
}

/// Reads each operator's state after batch `last` and writes it into `partitions` partitions in
/// new folders (`fresh`, one per operator); returns the operators' new record and what was done.
fn rewrite(
    stored: &[OperatorInfo],
    fresh: &[u32],
    state_dir: std::path::PathBuf,
    scratch: std::path::PathBuf,
    last: u64,
    partitions: usize,
) -> Result<(Vec<OperatorInfo>, Vec<OperatorChange>)> {
    let provider = RocksDbStateStoreProvider::new(state_dir, scratch);
    let (mut operators, mut changes) = (vec![], vec![]);
    for (op, &fresh) in stored.iter().zip(fresh) {
        for store in &op.store_names {
            let mut entries = vec![];
            for p in 0..op.num_partitions as u32 {
                let s = provider
                    .open(
                        &StoreId::new(op.state_id(), p, store.as_str()),
                        op.state_version(last + 1),
                    )
                    .map_err(state_err)?;
                entries.extend(s.scan(&KeyRange::all()).map_err(state_err)?);
            }
            let placement = op
                .kind()
                .map_or(Placement::ByKey, |k| k.format().placement(store));
            let buckets = if placement == Placement::EveryPartition {
                // The same entries in every partition (a truncate floor): the highest value of
                // each key, everywhere.
                let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
                for (k, v) in entries {
                    let kept = merged.entry(k).or_default();
                    if v > *kept {
                        *kept = v;
                    }
                }
                vec![merged; partitions]
            } else if placement == Placement::JoinIndex {
                // A join's event-time index entry lists rows of many join keys: it is split.
                join_state::split_index(&entries, partitions, |keys| {
                    new_partitions(op, keys, partitions)
                })?
                .ok_or_else(|| {
                    Error::user(
                        "STATE_STORE_FILE_CORRUPT",
                        "XX001",
                        format!(
                            "A value of the join's store {store} (operator {}) is damaged.",
                            op.operator_id
                        ),
                    )
                })?
            } else {
                // An index keyed by an event time, then the state key, goes by the state key.
                let skip = if placement == Placement::ByKeyAfterTime {
                    weir_state::table::TIME_PREFIX
                } else {
                    0
                };
                let keys: Vec<&[u8]> = entries
                    .iter()
                    .map(|(k, _)| {
                        let key = match placement {
                            // A join side's entry goes by its join key.
                            Placement::JoinRows => join_state::join_key(k),
                            _ => k.get(skip..),
                        };
                        key.ok_or_else(|| {
                            Error::Internal(format!("a key of store {store} is too short"))
                        })
                    })
                    .collect::<Result<_>>()?;
                let targets = new_partitions(op, &keys, partitions)?;
                let mut buckets = vec![BTreeMap::new(); partitions];
                for ((k, v), q) in entries.into_iter().zip(targets) {
                    // A key lives in one partition: in two, one would be lost here.
                    if buckets[q].insert(k, v).is_some() {
                        return Err(Error::user(
                            "STATE_STORE_FILE_CORRUPT",
                            "XX001",
                            format!(
                                "A key of the store {store} of operator {} is in two of its \
                                 partitions; its state is damaged. Restore the checkpoint's \
                                 state/ folder from a backup.",
                                op.operator_id
                            ),
                        ));
                    }
                }
                buckets
            };
            for (q, bucket) in buckets.into_iter().enumerate() {
                let count = bucket.len() as i64;
                let mut batch = WriteBatch::new();
                for (k, v) in bucket {
                    batch.put(k, v);
                }
                let mut s = provider
                    .open(&StoreId::new(fresh, q as u32, store.as_str()), 0)
                    .map_err(state_err)?;
                s.apply(batch.with_key_delta(count)).map_err(state_err)?;
                s.commit().map_err(state_err)?;
            }
        }
        let mut moved = op.clone();
        moved.num_partitions = partitions;
        // The next batch (last + 1) reads version 1, the rewritten state.
        moved.layout = Some(StateLayout {
            state_id: fresh,
            base_batch: last,
        });
        changes.push(OperatorChange {
            action: format!("repartitioned {} -> {partitions}", op.num_partitions),
            operator_id: Some(op.operator_id),
            operator_name: op.operator_name.clone(),
            state_id: fresh,
            first_batch: Some(last + 1),
        });
        operators.push(moved);
    }
    Ok((operators, changes))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn a_repartition_the_disk_cannot_hold_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut op = OperatorInfo::placeholder();
        op.store_names = vec!["default".into()];
        // 1 MB of state in the operator's folder.
        let store = dir.path().join("state/0/0/default");
        std::fs::create_dir_all(&store).unwrap();
        std::fs::write(store.join("1.changelog"), vec![0u8; 1 << 20]).unwrap();
        let state = dir.path().join("state");
        let scratch = dir.path().join("scratch/x");
        let with_free = |free: u64, partitions: usize| {
            check_space_with(&[op.clone()], &state, &scratch, partitions, |_| Some(free))
        };
        // 2 MB for the state twice, and 64 KB for each of 1,000 new instances: about 66 MB.
        let err = with_free(60 << 20, 1000).unwrap_err();
        assert_eq!(
            err.error_class(),
            "STATE_REPARTITION_INSUFFICIENT_SPACE",
            "{err}"
        );
        assert!(err.to_string().contains("1000 store instances"), "{err}");
        with_free(70 << 20, 1000).unwrap();
        let err = with_free(2 << 20, 10).unwrap_err();
        assert_eq!(
            err.error_class(),
            "STATE_REPARTITION_INSUFFICIENT_SPACE",
            "{err}"
        );
        // Unknown free space (statvfs failed) does not refuse.
        check_space_with(&[op.clone()], &state, &scratch, 1000, |_| None).unwrap();
        // The real check on this machine passes for a small repartition.
        check_space(&[op], &state, &scratch, 2).unwrap();
    }

    #[test]
    fn a_key_goes_where_the_shuffle_sends_its_columns_without_the_event_time_prefix() {
        let mut op = OperatorInfo::placeholder();
        op.key_schema = Schema::new(vec![
            Field::new(EVENT_TIME_KEY, DataType::Int64, true),
            Field::new("k", DataType::Utf8, true),
        ]);
        let times: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3, 4]));
        let ks: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "c", "d"]));
        let state = RowConverter::new(vec![
            SortField::new(DataType::Int64),
            SortField::new(DataType::Utf8),
        ])
        .unwrap();
        let rows = state.convert_columns(&[times, Arc::clone(&ks)]).unwrap();
        let keys: Vec<&[u8]> = rows.iter().map(|r| r.data()).collect();
        let shuffle = RowConverter::new(vec![SortField::new(DataType::Utf8)]).unwrap();
        let expected: Vec<usize> = shuffle
            .convert_columns(&[ks])
            .unwrap()
            .iter()
            .map(|r| weir_state::key_partition(r.as_ref(), 5))
            .collect();
        assert_eq!(new_partitions(&op, &keys, 5).unwrap(), expected);
    }
}
