//! `GET /metrics`: the Prometheus text exposition of every hosted query's newest batch,
//! encoded with `prometheus-client`. A scrape builds the families afresh from the queries'
//! `lastProgress`, so a stopped query's series go with it.
//!
//! ```text
//! weir_query_input_rows_per_second{query_id, name}          inputRowsPerSecond
//! weir_query_processed_rows_per_second{query_id, name}      processedRowsPerSecond
//! weir_query_batch_duration_ms{query_id, name}              batchDuration
//! weir_query_operation_duration_ms{..., operation}          durationMs per operation
//! weir_query_state_rows{..., operator}                      numRowsTotal
//! weir_query_state_memory_bytes{..., operator}              memoryUsedBytes
//! weir_query_rows_dropped_by_watermark{..., operator}       numRowsDroppedByWatermark
//! weir_query_watermark_lag_ms{query_id, name}               eventTime max − watermark
//! weir_query_falling_behind{query_id, name}                 1 when input outpaces processing
//! weir_query_batches_behind{query_id, name}                 batches of the newest one's size
//!                                                           between its end and the newest
//!                                                           offset its sources knew of
//! weir_queries{status}                                      hosted queries by status
//! ```

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use weir_engine::StreamingQueryProgress;

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueryLabels {
    query_id: String,
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    query_id: String,
    name: String,
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperatorLabels {
    query_id: String,
    name: String,
    operator: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

/// One hosted query as a scrape sees it.
pub(crate) struct Scraped {
    pub(crate) id: String,
    pub(crate) name: Option<String>,
    pub(crate) status: String,
    pub(crate) last: Option<StreamingQueryProgress>,
}

/// A gauge family labelled by `L`, registered as `name`.
fn gauges<L>(registry: &mut Registry, name: &str, help: &str) -> Family<L, FloatGauge>
where
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
{
    let f = Family::<L, FloatGauge>::default();
    registry.register(name, help, f.clone());
    f
}

/// The exposition of `queries`.
pub(crate) fn exposition(queries: &[Scraped]) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    let r = &mut registry;
    let input = gauges::<QueryLabels>(
        r,
        "weir_query_input_rows_per_second",
        "Rows per second arriving, newest batch",
    );
    let processed = gauges::<QueryLabels>(
        r,
        "weir_query_processed_rows_per_second",
        "Rows per second processed, newest batch",
    );
    let duration =
        gauges::<QueryLabels>(r, "weir_query_batch_duration_ms", "Newest batch's duration");
    let lag = gauges::<QueryLabels>(
        r,
        "weir_query_watermark_lag_ms",
        "Newest event time minus the watermark",
    );
    let behind = gauges::<QueryLabels>(
        r,
        "weir_query_falling_behind",
        "1 when rows arrive faster than the query processes them",
    );
    let batches_behind_family = gauges::<QueryLabels>(
        r,
        "weir_query_batches_behind",
        "Batches of the newest batch's size still to read: its sources' newest offsets less its \
         end offsets",
    );
    let operations = gauges::<OperationLabels>(
        r,
        "weir_query_operation_duration_ms",
        "Newest batch's time per operation (durationMs)",
    );
    let state_rows =
        gauges::<OperatorLabels>(r, "weir_query_state_rows", "Rows in the operator's state");
    let state_memory = gauges::<OperatorLabels>(
        r,
        "weir_query_state_memory_bytes",
        "Memory of the operator's state",
    );
    let dropped = gauges::<OperatorLabels>(
        r,
        "weir_query_rows_dropped_by_watermark",
        "Rows the newest batch dropped behind the watermark",
    );
    let statuses = gauges::<StatusLabels>(r, "weir_queries", "Hosted queries by status");

    for q in queries {
        statuses
            .get_or_create(&StatusLabels {
                status: q.status.clone(),
            })
            .inc_by(1.0);
        let Some(p) = &q.last else { continue };
        let labels = QueryLabels {
            query_id: q.id.clone(),
            name: q.name.clone().unwrap_or_default(),
        };
        input.get_or_create(&labels).set(p.input_rows_per_second);
        processed
            .get_or_create(&labels)
            .set(p.processed_rows_per_second);
        duration.get_or_create(&labels).set(p.batch_duration as f64);
        let falling =
            p.input_rows_per_second > 0.0 && p.processed_rows_per_second < p.input_rows_per_second;
        behind
            .get_or_create(&labels)
            .set(if falling { 1.0 } else { 0.0 });
        batches_behind_family
            .get_or_create(&labels)
            .set(batches_behind(p) as f64);
        if let (Some(max), Some(wm)) = (p.event_time.get("max"), p.event_time.get("watermark"))
            && let (Ok(max), Ok(wm)) = (
                chrono::DateTime::parse_from_rfc3339(max),
                chrono::DateTime::parse_from_rfc3339(wm),
            )
        {
            lag.get_or_create(&labels)
                .set((max - wm).num_milliseconds() as f64);
        }
        for (op, ms) in &p.duration_ms {
            operations
                .get_or_create(&OperationLabels {
                    query_id: labels.query_id.clone(),
                    name: labels.name.clone(),
                    operation: op.clone(),
                })
                .set(*ms as f64);
        }
        for (i, o) in p.state_operators.iter().enumerate() {
            let l = OperatorLabels {
                query_id: labels.query_id.clone(),
                name: labels.name.clone(),
                operator: format!("{i}-{}", o.operator_name),
            };
            state_rows.get_or_create(&l).set(o.num_rows_total as f64);
            state_memory
                .get_or_create(&l)
                .set(o.memory_used_bytes as f64);
            dropped
                .get_or_create(&l)
                .set(o.num_rows_dropped_by_watermark as f64);
        }
    }
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

/// The sum of the numbers in an offset (`{"0": 12, "1": 9}`, `{"topic": {"0": 5}}`, `42`),
/// whatever its source's shape; none when it holds none.
fn offset_sum(v: &serde_json::Value) -> Option<f64> {
    match v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::Object(m) => m.values().filter_map(offset_sum).reduce(|a, b| a + b),
        serde_json::Value::Array(a) => a.iter().filter_map(offset_sum).reduce(|a, b| a + b),
        // Offsets kept as text ("12") count as numbers.
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// How many batches of the newest batch's size lie between where it ended and the newest
/// offset its sources knew of (the largest over its sources); 0 when it read all there was.
/// A source whose offsets hold no numbers does not count.
pub(crate) fn batches_behind(p: &StreamingQueryProgress) -> u64 {
    p.sources
        .iter()
        .filter_map(|s| {
            let end = offset_sum(s.end_offset.as_ref()?)?;
            let latest = offset_sum(s.latest_offset.as_ref()?)?;
            let start = s.start_offset.as_ref().and_then(offset_sum).unwrap_or(end);
            let backlog = latest - end;
            if backlog <= 0.0 {
                return Some(0);
            }
            let step = (end - start).max(1.0);
            Some((backlog / step).ceil() as u64)
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(start: &str, end: &str, latest: &str) -> StreamingQueryProgress {
        let mut p = StreamingQueryProgress::default();
        p.sources.push(weir_engine::SourceProgress {
            start_offset: serde_json::from_str(start).ok(),
            end_offset: serde_json::from_str(end).ok(),
            latest_offset: serde_json::from_str(latest).ok(),
            ..Default::default()
        });
        p
    }

    #[test]
    fn batches_behind_counts_the_newest_batch_size_to_the_newest_offset() {
        // Kafka-like: two partitions, the batch read 10, 25 more are there.
        let p = progress(
            r#"{"t":{"0":0,"1":0}}"#,
            r#"{"t":{"0":5,"1":5}}"#,
            r#"{"t":{"0":20,"1":15}}"#,
        );
        assert_eq!(batches_behind(&p), 3);
        // Caught up.
        assert_eq!(batches_behind(&progress("3", "7", "7")), 0);
        // No offsets with numbers: nothing known.
        assert_eq!(batches_behind(&progress(r#""a""#, r#""b""#, r#""c""#)), 0);
        // A batch that read nothing with data waiting: the backlog in offset units.
        assert_eq!(batches_behind(&progress("7", "7", "9")), 2);
    }
}
