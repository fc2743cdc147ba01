//! Progress records with Spark's JSON field names, so dashboards and habits carry over.

use std::collections::BTreeMap;

use serde::Serialize;
use uuid::Uuid;

/// The progress of one micro-batch (`StreamingQueryProgress`).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StreamingQueryProgress {
    /// The query's ID (kept across restarts).
    pub id: Uuid,
    /// The ID of this run.
    pub run_id: Uuid,
    /// The query name, if any.
    pub name: Option<String>,
    /// When the trigger started, `yyyy-MM-dd'T'HH:mm:ss.SSS'Z'`.
    pub timestamp: String,
    /// The batch ID.
    pub batch_id: u64,
    /// Wall time of the whole batch in milliseconds.
    pub batch_duration: u64,
    /// Rows read from all sources.
    pub num_input_rows: u64,
    /// Input rows per second since the previous trigger started.
    pub input_rows_per_second: f64,
    /// Input rows per second of processing time.
    pub processed_rows_per_second: f64,
    /// Time spent per phase: `latestOffset`, `walCommit`, `getBatch`, `queryPlanning`,
    /// `addBatch`, `commitOffsets`, `triggerExecution`.
    pub duration_ms: BTreeMap<String, u64>,
    /// Event times of the batch (`min`, `max`, `avg`) and its `watermark`, formatted as
    /// timestamps; only in queries with a watermark.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub event_time: BTreeMap<String, String>,
    /// Stateful operators, by operator ID (none in stateless queries).
    pub state_operators: Vec<StateOperatorProgress>,
    /// Each source's progress.
    pub sources: Vec<SourceProgress>,
    /// The sink's progress.
    pub sink: SinkProgress,
}

/// One stateful operator's part of a progress record (Spark's `StateOperatorProgress`): its
/// figures summed over its state store instances (one per shuffle partition and store name).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StateOperatorProgress {
    /// `aggregate`, `dedupe`, `dedupeWithinWatermark`, `sessionWindowAggregate` or
    /// `streamStreamJoin`.
    pub operator_name: String,
    /// Keys in state after the batch.
    pub num_rows_total: u64,
    /// Keys written by the batch.
    pub num_rows_updated: u64,
    /// Time spent reading, merging and writing state, summed over partitions.
    pub all_updates_time_ms: u64,
    /// Keys removed by the batch (evicted by the watermark).
    pub num_rows_removed: u64,
    /// Time spent evicting, summed over partitions.
    pub all_removals_time_ms: u64,
    /// Time spent making the new state version durable, summed over partitions.
    pub commit_time_ms: u64,
    /// Memory the state stores report using.
    pub memory_used_bytes: u64,
    /// Input rows behind the watermark, dropped before they reached state.
    pub num_rows_dropped_by_watermark: u64,
    /// The shuffle partition count the checkpoint fixed.
    pub num_shuffle_partitions: u64,
    /// State store instances the operator used.
    pub num_state_store_instances: u64,
    /// Backend figures.
    pub custom_metrics: BTreeMap<String, i64>,
}

impl StateOperatorProgress {
    /// Adds another partition's figures (the name and partition count are the operator's).
    pub(crate) fn add(&mut self, other: &Self) {
        self.num_rows_total += other.num_rows_total;
        self.num_rows_updated += other.num_rows_updated;
        self.all_updates_time_ms += other.all_updates_time_ms;
        self.num_rows_removed += other.num_rows_removed;
        self.all_removals_time_ms += other.all_removals_time_ms;
        self.commit_time_ms += other.commit_time_ms;
        self.memory_used_bytes += other.memory_used_bytes;
        self.num_rows_dropped_by_watermark += other.num_rows_dropped_by_watermark;
        self.num_state_store_instances += other.num_state_store_instances;
        for (k, v) in &other.custom_metrics {
            *self.custom_metrics.entry(k.clone()).or_default() += v;
        }
    }
}

/// One source's part of a progress record.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceProgress {
    /// The source's description.
    pub description: String,
    /// Offset the batch started from.
    pub start_offset: Option<serde_json::Value>,
    /// Offset the batch read up to.
    pub end_offset: Option<serde_json::Value>,
    /// Newest offset the source knew of.
    pub latest_offset: Option<serde_json::Value>,
    /// Rows read from this source.
    pub num_input_rows: u64,
    /// Input rate since the previous trigger.
    pub input_rows_per_second: f64,
    /// Processing rate.
    pub processed_rows_per_second: f64,
}

/// The sink's part of a progress record.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SinkProgress {
    /// The sink's description.
    pub description: String,
    /// Rows written by this batch.
    pub num_output_rows: i64,
    /// The sink's own figures for the batch, as Spark's (`metrics`; e.g. an AUTO CDC flow's
    /// MERGE: `executionTimeMs`, `numTargetFilesAdded`, ...). Left out when it has none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, String>,
}

impl StreamingQueryProgress {
    /// The record as one line of JSON.
    pub fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The record as indented JSON, as Spark's `prettyJson`.
    pub fn pretty_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// Formats epoch milliseconds as Spark does in progress records.
pub fn format_timestamp(epoch_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(epoch_ms)
        .unwrap_or_default()
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uses_sparks_field_names_and_timestamp_format() {
        let p = StreamingQueryProgress {
            id: Uuid::nil(),
            run_id: Uuid::nil(),
            name: Some("q".into()),
            timestamp: format_timestamp(1_796_219_544_668),
            batch_id: 3,
            batch_duration: 10,
            num_input_rows: 100,
            input_rows_per_second: 1.5,
            processed_rows_per_second: 2.5,
            duration_ms: BTreeMap::from([("triggerExecution".into(), 9)]),
            event_time: BTreeMap::new(),
            state_operators: vec![],
            sources: vec![],
            sink: SinkProgress {
                description: "NoopSink".into(),
                num_output_rows: 50,
                metrics: BTreeMap::new(),
            },
        };
        let v: serde_json::Value = serde_json::from_str(&p.json()).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        for k in [
            "id",
            "runId",
            "name",
            "timestamp",
            "batchId",
            "batchDuration",
            "numInputRows",
            "inputRowsPerSecond",
            "processedRowsPerSecond",
            "durationMs",
            "stateOperators",
            "sources",
            "sink",
        ] {
            assert!(keys.contains(&k), "missing {k} in {keys:?}");
        }
        assert_eq!(v["timestamp"], "2026-12-02T13:52:24.668Z");
        assert_eq!(v["sink"]["numOutputRows"], 50);
        // As Spark: eventTime only in queries with a watermark.
        assert!(!keys.contains(&"eventTime"), "{keys:?}");
        let mut with = p.clone();
        with.event_time = BTreeMap::from([("watermark".into(), format_timestamp(0))]);
        with.state_operators = vec![StateOperatorProgress {
            operator_name: "aggregate".into(),
            ..Default::default()
        }];
        let v: serde_json::Value = serde_json::from_str(&with.json()).unwrap();
        assert_eq!(v["eventTime"]["watermark"], "1970-01-01T00:00:00.000Z");
        let op: Vec<&str> = v["stateOperators"][0]
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        for k in [
            "operatorName",
            "numRowsTotal",
            "numRowsUpdated",
            "allUpdatesTimeMs",
            "numRowsRemoved",
            "allRemovalsTimeMs",
            "commitTimeMs",
            "memoryUsedBytes",
            "numRowsDroppedByWatermark",
            "numShufflePartitions",
            "numStateStoreInstances",
            "customMetrics",
        ] {
            assert!(op.contains(&k), "missing {k} in {op:?}");
        }
    }
}
