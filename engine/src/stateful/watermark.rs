//! The physical side of event-time watermarks: [`WatermarkExec`] passes a batch's rows through
//! and records the event times it saw, from which the engine computes the next batch's
//! watermark; [`WeirQueryPlanner`] plans the planner's `WatermarkNode` as one.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, BooleanArray, Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow::compute::{cast, filter, filter_record_batch, max, min};
use arrow::datatypes::{DataType, TimeUnit};
use async_trait::async_trait;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{LogicalPlan, UserDefinedLogicalNode};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PhysicalExpr, PlanProperties,
};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use futures::StreamExt;
use weir_planner::dedupe::DeduplicateNode;
use weir_planner::join::StreamJoinNode;
use weir_planner::watermark::WatermarkNode;

use super::BatchState;

/// Event times one watermark operator saw in one batch, in microseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EventTimeStats {
    pub(crate) min_us: i64,
    pub(crate) max_us: i64,
    pub(crate) sum_us: i128,
    pub(crate) count: u64,
    /// The operator's delay, milliseconds.
    pub(crate) delay_ms: i64,
}

impl EventTimeStats {
    pub(crate) fn merge(&mut self, o: &Self) {
        self.min_us = self.min_us.min(o.min_us);
        self.max_us = self.max_us.max(o.max_us);
        self.sum_us += o.sum_us;
        self.count += o.count;
    }
}

/// Adds one batch's event times (per watermark operator) to `seen`: per operator, the largest
/// event time seen so far (µs) and its delay (ms).
pub(crate) fn record_event_times(
    seen: &mut BTreeMap<usize, (i64, i64)>,
    batch: &BTreeMap<usize, EventTimeStats>,
) {
    for (id, s) in batch {
        let e = seen.entry(*id).or_insert((s.max_us, s.delay_ms));
        e.0 = e.0.max(s.max_us);
    }
}

/// The watermark for the next batch, Spark's rule: per watermark operator, the largest event
/// time it has seen (`seen`, from [`record_event_times`]) minus its delay; the query's is the
/// minimum over the operators that have seen data (`max_policy`: the maximum, Spark's
/// `multipleWatermarkPolicy max`); and it never moves back from `current_ms`.
pub(crate) fn next_watermark_ms(
    current_ms: i64,
    seen: &BTreeMap<usize, (i64, i64)>,
    max_policy: bool,
) -> i64 {
    let candidates = seen
        .values()
        .map(|(max_us, delay_ms)| max_us.div_euclid(1000).saturating_sub(*delay_ms));
    let combined = if max_policy {
        candidates.max()
    } else {
        candidates.min()
    };
    combined.map_or(current_ms, |wm| current_ms.max(wm))
}

/// The event times of `column` as microseconds, nulls left null.
pub(crate) fn event_micros(column: &dyn Array) -> Result<Int64Array> {
    let c = cast(column, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
    let t = c
        .as_any()
        .downcast_ref::<TimestampMicrosecondArray>()
        .ok_or_else(|| DataFusionError::Internal("event time cast failed".into()))?;
    Ok(Int64Array::new(t.values().clone(), t.nulls().cloned()))
}

/// Drops the rows of `batch` whose event time (`times`, µs, one per row) is at or behind
/// `late_us`: too late for a stateful operator (rows without a time are kept). Returns the
/// rows kept, their times, and how many were dropped.
pub(crate) fn drop_late(
    batch: &RecordBatch,
    times: &Int64Array,
    late_us: i64,
) -> Result<(RecordBatch, Int64Array, u64)> {
    let keep: BooleanArray = times
        .iter()
        .map(|t| Some(t.is_none_or(|t| t > late_us)))
        .collect();
    let kept = filter_record_batch(batch, &keep)?;
    let kept_times = filter(times, &keep)?;
    let kept_times = kept_times
        .as_any()
        .downcast_ref::<Int64Array>()
        .cloned()
        .ok_or_else(|| DataFusionError::Internal("event time filter failed".into()))?;
    let dropped = (batch.num_rows() - kept.num_rows()) as u64;
    Ok((kept, kept_times, dropped))
}

/// The event-time figures of `batch`'s `column` (none when every time is null), with
/// arrow's kernels: this runs on every row of a watermarked stream.
fn stats_of(batch: &RecordBatch, column: usize, delay_ms: i64) -> Result<Option<EventTimeStats>> {
    let times = event_micros(batch.column(column))?;
    let (Some(min_us), Some(max_us)) = (min(&times), max(&times)) else {
        return Ok(None);
    };
    // A sum of microsecond times overflows i64 after a few thousand rows.
    let sum_us: i128 = if times.null_count() == 0 {
        times.values().iter().map(|&t| i128::from(t)).sum()
    } else {
        times.iter().flatten().map(i128::from).sum()
    };
    Ok(Some(EventTimeStats {
        min_us,
        max_us,
        sum_us,
        count: (times.len() - times.null_count()) as u64,
        delay_ms,
    }))
}

/// Passes rows through; with a batch attached, records their event times as watermark
/// operator `id` of the batch.
#[derive(Debug)]
pub(crate) struct WatermarkExec {
    input: Arc<dyn ExecutionPlan>,
    /// The event-time column's name and position in the input.
    pub(crate) column: String,
    index: usize,
    pub(crate) delay_ms: i64,
    batch: Option<(usize, Arc<BatchState>)>,
}

impl WatermarkExec {
    fn try_new(input: Arc<dyn ExecutionPlan>, column: &str, delay_ms: i64) -> Result<Self> {
        let index = input.schema().index_of(column)?;
        Ok(Self {
            input,
            column: column.to_string(),
            index,
            delay_ms,
            batch: None,
        })
    }

    /// The same operator recording into `batch` as watermark operator `id`.
    pub(crate) fn attached(&self, id: usize, batch: Arc<BatchState>) -> Self {
        Self {
            input: Arc::clone(&self.input),
            column: self.column.clone(),
            index: self.index,
            delay_ms: self.delay_ms,
            batch: Some((id, batch)),
        }
    }
}

impl DisplayAs for WatermarkExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "EventTimeWatermarkExec: column={}, delay={}ms",
            self.column, self.delay_ms
        )
    }
}

impl ExecutionPlan for WatermarkExec {
    fn name(&self) -> &str {
        "EventTimeWatermarkExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("watermark without input".into()))?;
        let mut w = Self::try_new(input, &self.column, self.delay_ms)?;
        w.batch.clone_from(&self.batch);
        Ok(Arc::new(w))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let Some((id, batch)) = self.batch.clone() else {
            return Ok(input);
        };
        let (index, delay_ms) = (self.index, self.delay_ms);
        let schema = input.schema();
        let stream = input.map(move |b| {
            let b = b?;
            if let Some(s) = stats_of(&b, index, delay_ms)? {
                batch.record_event_times(id, s);
            }
            Ok(b)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// Plans weir's logical nodes: watermarks, deduplication, joins of streams, top-N, AUTO CDC
/// and changelogs.
struct WatermarkPlanner;

#[async_trait]
impl ExtensionPlanner for WatermarkPlanner {
    async fn plan_extension(
        &self,
        planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn datafusion::catalog::Session,
        ctx: &datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if let (Some(j), [l, r], [left, right]) = (
            node.as_any().downcast_ref::<StreamJoinNode>(),
            logical_inputs,
            physical_inputs,
        ) {
            let keys = |side: &LogicalPlan, exprs: Vec<&datafusion::logical_expr::Expr>| {
                exprs
                    .into_iter()
                    .map(|e| planner.create_physical_expr(e, side.schema(), session, ctx))
                    .collect::<Result<Vec<_>>>()
            };
            let left_keys = keys(l, j.on.iter().map(|(a, _)| a).collect())?;
            let right_keys = keys(r, j.on.iter().map(|(_, b)| b).collect())?;
            let filter = j
                .filter
                .as_ref()
                .map(|f| planner.create_physical_expr(f, &j.schema, session, ctx))
                .transpose()?;
            return Ok(Some(Arc::new(super::join::StreamJoinExec::new(
                super::join::Planned {
                    left: Arc::clone(left),
                    right: Arc::clone(right),
                    left_keys,
                    right_keys,
                    filter,
                    join_type: j.join_type,
                    time_bound: j.time_bound.clone(),
                    schema: Arc::new(j.schema.as_arrow().clone()),
                },
            ))));
        }
        if let (Some(t), [l], [input]) = (
            node.as_any()
                .downcast_ref::<weir_planner::top_n::TopNNode>(),
            logical_inputs,
            physical_inputs,
        ) {
            let partition_by = t
                .partition_by
                .iter()
                .map(|e| planner.create_physical_expr(e, l.schema(), session, ctx))
                .collect::<Result<Vec<_>>>()?;
            let order_by = t
                .order_by
                .iter()
                .map(|s| {
                    let e = planner.create_physical_expr(&s.expr, l.schema(), session, ctx)?;
                    Ok(datafusion::physical_expr::PhysicalSortExpr::new(
                        e,
                        arrow::compute::SortOptions::new(!s.asc, s.nulls_first),
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            return Ok(Some(Arc::new(super::top_n::TopNExec::try_new(
                Arc::clone(input),
                partition_by,
                order_by,
                t.n,
                Arc::new(t.schema.as_arrow().clone()),
            )?)));
        }
        let [input] = physical_inputs else {
            return Ok(None);
        };
        if node
            .as_any()
            .downcast_ref::<weir_planner::changelog::ChangelogNode>()
            .is_some()
        {
            return Ok(Some(Arc::new(super::changelog::ChangelogExec::new(
                Arc::clone(input),
            ))));
        }
        if let Some(w) = node.as_any().downcast_ref::<WatermarkNode>() {
            return Ok(Some(Arc::new(WatermarkExec::try_new(
                Arc::clone(input),
                &w.column.name,
                w.delay_ms,
            )?)));
        }
        if let Some(a) = node
            .as_any()
            .downcast_ref::<weir_planner::auto_cdc::AutoCdcNode>()
        {
            return Ok(Some(Arc::new(super::auto_cdc::AutoCdcExec::try_new(
                Arc::clone(input),
                a,
            )?)));
        }
        if let Some(d) = node.as_any().downcast_ref::<DeduplicateNode>() {
            let keys: Vec<String> = d.keys.iter().map(|k| k.name.clone()).collect();
            return Ok(Some(Arc::new(super::dedupe::DedupeExec::try_new(
                Arc::clone(input),
                &keys,
                d.within_watermark,
            )?)));
        }
        Ok(None)
    }
}

/// DataFusion's physical planner, plus weir's logical nodes.
#[derive(Debug, Default)]
pub(crate) struct WeirQueryPlanner;

#[async_trait]
impl QueryPlanner for WeirQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn datafusion::catalog::Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(WatermarkPlanner)])
            .create_physical_plan(logical_plan, session)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batchs_event_time_figures_skip_nulls_and_sum_past_i64() {
        let big = i64::MAX / 2;
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new(
                "t",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ),
        ]));
        let batch = |times: Vec<Option<i64>>| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(TimestampMicrosecondArray::from(times))],
            )
            .unwrap()
        };
        let s = stats_of(&batch(vec![Some(big), None, Some(-5), Some(big)]), 0, 7)
            .unwrap()
            .unwrap();
        assert_eq!(
            (s.min_us, s.max_us, s.sum_us, s.count, s.delay_ms),
            (-5, big, 2 * i128::from(big) - 5, 3, 7)
        );
        let s = stats_of(&batch(vec![Some(3), Some(1)]), 0, 0)
            .unwrap()
            .unwrap();
        assert_eq!((s.min_us, s.max_us, s.sum_us, s.count), (1, 3, 4, 2));
        assert!(stats_of(&batch(vec![None, None]), 0, 0).unwrap().is_none());
        assert!(stats_of(&batch(vec![]), 0, 0).unwrap().is_none());
    }

    fn stats(max_us: i64, delay_ms: i64) -> EventTimeStats {
        EventTimeStats {
            min_us: max_us,
            max_us,
            sum_us: i128::from(max_us),
            count: 1,
            delay_ms,
        }
    }

    #[test]
    fn the_watermark_is_the_slowest_operators_max_minus_its_delay_and_never_moves_back() {
        let mut seen = BTreeMap::new();
        // Operator 0: 10 s with a 2 s delay; operator 1: 7 s with a 1 s delay.
        record_event_times(
            &mut seen,
            &BTreeMap::from([(0, stats(10_000_000, 2_000)), (1, stats(7_000_000, 1_000))]),
        );
        assert_eq!(next_watermark_ms(0, &seen, false), 6_000);
        assert_eq!(next_watermark_ms(0, &seen, true), 8_000);
        // An older batch for operator 0 keeps its maximum; operator 1 moves on.
        record_event_times(
            &mut seen,
            &BTreeMap::from([(0, stats(1_000_000, 2_000)), (1, stats(20_000_000, 1_000))]),
        );
        assert_eq!(next_watermark_ms(6_000, &seen, false), 8_000);
        assert_eq!(next_watermark_ms(6_000, &seen, true), 19_000);
        // It never moves back, and without data it stays.
        assert_eq!(next_watermark_ms(30_000, &seen, false), 30_000);
        assert_eq!(next_watermark_ms(5, &BTreeMap::new(), false), 5);
    }

    #[test]
    fn event_times_before_1970_round_down_and_extreme_ones_do_not_overflow() {
        let mut seen = BTreeMap::new();
        record_event_times(&mut seen, &BTreeMap::from([(0, stats(-1_500, 0))]));
        assert_eq!(next_watermark_ms(i64::MIN, &seen, false), -2);
        let mut seen = BTreeMap::new();
        record_event_times(&mut seen, &BTreeMap::from([(0, stats(i64::MIN, i64::MAX))]));
        assert_eq!(next_watermark_ms(i64::MIN, &seen, false), i64::MIN);
    }
}
