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

/// The exposition of `queries`.
pub(crate) fn exposition(queries: &[Scraped]) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    let query = |help: &str, name: &str, registry: &mut Registry| {
        let f = Family::<QueryLabels, FloatGauge>::default();
        registry.register(name, help, f.clone());
        f
    };
    let input = query(
        "Rows per second arriving, newest batch",
        "weir_query_input_rows_per_second",
        &mut registry,
    );
    let processed = query(
        "Rows per second processed, newest batch",
        "weir_query_processed_rows_per_second",
        &mut registry,
    );
    let duration = query(
        "Newest batch's duration",
        "weir_query_batch_duration_ms",
        &mut registry,
    );
    let lag = query(
        "Newest event time minus the watermark",
        "weir_query_watermark_lag_ms",
        &mut registry,
    );
    let behind = query(
        "1 when rows arrive faster than the query processes them",
        "weir_query_falling_behind",
        &mut registry,
    );
    let operations = Family::<OperationLabels, FloatGauge>::default();
    registry.register(
        "weir_query_operation_duration_ms",
        "Newest batch's time per operation (durationMs)",
        operations.clone(),
    );
    let operator = |help: &str, name: &str, registry: &mut Registry| {
        let f = Family::<OperatorLabels, FloatGauge>::default();
        registry.register(name, help, f.clone());
        f
    };
    let state_rows = operator(
        "Rows in the operator's state",
        "weir_query_state_rows",
        &mut registry,
    );
    let state_memory = operator(
        "Memory of the operator's state",
        "weir_query_state_memory_bytes",
        &mut registry,
    );
    let dropped = operator(
        "Rows the newest batch dropped behind the watermark",
        "weir_query_rows_dropped_by_watermark",
        &mut registry,
    );
    let statuses = Family::<StatusLabels, FloatGauge>::default();
    registry.register("weir_queries", "Hosted queries by status", statuses.clone());

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
