//! Streaming analysis of a DataFusion logical plan: find the streaming scans, give each run
//! its own copies of them, and refuse operations a streaming query cannot do, before anything
//! runs.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::error::Result;
use datafusion::logical_expr::{Distinct, Expr, JoinType, LogicalPlan, TableScan};
use weir_common::ClassifiedError;
use weir_sinks::OutputMode;

use crate::StreamingTable;

fn as_streaming(scan: &TableScan) -> Option<Arc<StreamingTable>> {
    let provider = source_as_provider(&scan.source).ok()?;
    let any: Arc<dyn std::any::Any + Send + Sync> = provider;
    Arc::downcast::<StreamingTable>(any).ok()
}

/// Whether `plan` reads a stream anywhere (subqueries included).
pub fn is_streaming(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && as_streaming(scan).is_some()
        {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// The streaming tables of `plan`, each once, in plan-traversal order: a source's position
/// in this list is its identity in the offsets log.
pub fn streaming_tables(plan: &LogicalPlan) -> Vec<Arc<StreamingTable>> {
    let mut out: Vec<Arc<StreamingTable>> = vec![];
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && let Some(t) = as_streaming(scan)
            && !out.iter().any(|o| Arc::ptr_eq(o, &t))
        {
            out.push(t);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    out
}

/// `plan` with every streaming table replaced by a fresh copy (no rows), so that one run of a
/// query never shares its per-batch rows with another. A table read twice stays one table.
pub fn with_fresh_streaming_tables(plan: LogicalPlan) -> Result<LogicalPlan> {
    let mut replaced: HashMap<usize, Arc<StreamingTable>> = HashMap::new();
    plan.transform_up_with_subqueries(|node| {
        let LogicalPlan::TableScan(scan) = &node else {
            return Ok(Transformed::no(node));
        };
        let Some(table) = as_streaming(scan) else {
            return Ok(Transformed::no(node));
        };
        let key = Arc::as_ptr(&table) as usize;
        let fresh = Arc::clone(
            replaced
                .entry(key)
                .or_insert_with(|| Arc::new(table.fresh())),
        );
        let mut scan = scan.clone();
        scan.source = provider_as_source(fresh);
        Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
    })
    .map(|t| t.data)
}

/// The checks of one streaming aggregation.
fn check_aggregation(node: &LogicalPlan, mode: OutputMode) -> Option<ClassifiedError> {
    let nested = node
        .inputs()
        .iter()
        .any(|i| reaches_updating_aggregation(i));
    // In append mode, with every aggregation grouped by event time (checked with the output
    // mode), the inner one emits each group once, final, when the watermark passes it: the
    // outer one sees rows, not updates (Spark's chained time-window aggregations). In update
    // and complete mode an aggregation over a plain one reads its changelog (see
    // `changelog`); anything else would see every update of the one below as a new row.
    if nested && mode != OutputMode::Append {
        return Some(refuse(
            "UNSUPPORTED_STREAMING_OPERATION.MULTIPLE_STREAMING_AGGREGATIONS",
            "In update or complete output mode, a streaming aggregation can read another only \
             when the one below aggregates the stream itself (GROUP BY, not DISTINCT, a top-N \
             or a session window, and not over a third aggregation) and the path between them \
             is projections, filters and aliases: the outer one then takes back each row the \
             inner one updates. Otherwise it would count every update of the one below as a \
             new row. Restructure the query so, give both aggregations event-time windows and \
             use append mode, or aggregate the sink's output in a batch query."
                .into(),
        ));
    }
    let LogicalPlan::Aggregate(agg) = node else {
        return None;
    };
    if agg
        .group_expr
        .iter()
        .any(|e| matches!(e, Expr::GroupingSet(_)))
    {
        return Some(refuse(
            "UNSUPPORTED_STREAMING_OPERATION.GROUPING_SETS",
            "GROUPING SETS, CUBE and ROLLUP are not supported in a streaming aggregation; group \
             by plain columns or expressions."
                .into(),
        ));
    }
    None
}

fn refuse(class: &'static str, message: String) -> ClassifiedError {
    ClassifiedError::new(class, "0A000", message)
}

/// Whether an aggregation below `plan` emits updates that `plan` would read as rows: one not
/// turned into a changelog (see `changelog`).
fn reaches_updating_aggregation(plan: &LogicalPlan) -> bool {
    if crate::changelog::ChangelogNode::of(plan).is_some() {
        return false;
    }
    (is_aggregation(plan) && is_streaming(plan))
        || plan.inputs().into_iter().any(reaches_updating_aggregation)
}

/// Whether `node` aggregates (GROUP BY, DISTINCT) or ranks (a top-N): an operator whose
/// output rows, outside append mode, are updates of earlier ones.
pub(crate) fn is_aggregation(node: &LogicalPlan) -> bool {
    matches!(
        node,
        LogicalPlan::Aggregate(_) | LogicalPlan::Distinct(Distinct::All(_))
    ) || crate::top_n::TopNNode::of(node).is_some()
}

/// Whether `plan` aggregates a stream (GROUP BY, aggregate functions or DISTINCT over it): the
/// query then needs stateful streaming aggregation.
pub fn has_streaming_aggregation(plan: &LogicalPlan) -> bool {
    plan.exists(|n| Ok(is_aggregation(n) && is_streaming(n)))
        .unwrap_or(false)
}

/// Whether `e` is a watermarked column, or `window(...)` or `session_window(...)` over one
/// (`session_time` is the time column of the aggregate's session window).
pub(crate) fn is_event_time_key(
    e: &Expr,
    watermarked: &[String],
    session_time: Option<&String>,
) -> bool {
    match e {
        Expr::Column(c) if c.name == crate::window::SLIDING_WINDOW_COLUMN => {
            !watermarked.is_empty()
        }
        Expr::Column(c) if c.name == crate::session_window::SESSION_WINDOW_COLUMN => {
            session_time.is_some_and(|t| watermarked.contains(t))
        }
        Expr::Column(c) => watermarked.contains(&c.name),
        Expr::Alias(a) => is_event_time_key(&a.expr, watermarked, session_time),
        Expr::ScalarFunction(f) if f.name() == "window" => {
            matches!(f.args.first(), Some(Expr::Column(c)) if watermarked.contains(&c.name))
        }
        _ => false,
    }
}

/// Whether every streaming aggregation of `plan` groups by a watermarked event time (a
/// watermarked column or a window over one), so append mode can emit each group once.
fn every_aggregation_has_event_time_key(plan: &LogicalPlan) -> bool {
    let mut all = true;
    let _ = plan.apply(|n| {
        if is_aggregation(n) && is_streaming(n) {
            let ok = match n {
                LogicalPlan::Aggregate(agg) => {
                    let watermarked = crate::watermark::watermarked_columns(&agg.input);
                    let session_time = crate::session_window::session_time_column(&agg.input);
                    agg.group_expr
                        .iter()
                        .any(|e| is_event_time_key(e, &watermarked, session_time.as_ref()))
                }
                _ => match crate::top_n::TopNNode::of(n) {
                    Some(t) => {
                        let watermarked = crate::watermark::watermarked_columns(&t.input);
                        t.partition_by
                            .iter()
                            .any(|e| is_event_time_key(e, &watermarked, None))
                    }
                    None => false,
                },
            };
            all &= ok;
        }
        Ok(TreeNodeRecursion::Continue)
    });
    all
}

/// Whether a join of two streams in `plan` sends its rows towards the sink without an
/// aggregation or top-N between (`under`: one is above `plan`): then its rows are the output,
/// which append mode alone describes. Below an aggregation or top-N, they are input rows like
/// any other, and update or complete mode is the aggregation's.
fn has_join_emitting_to_sink(plan: &LogicalPlan, under: bool) -> bool {
    if crate::join::StreamJoinNode::of(plan).is_some() && !under {
        return true;
    }
    let under = under || (is_aggregation(plan) && is_streaming(plan));
    plan.inputs()
        .into_iter()
        .any(|i| has_join_emitting_to_sink(i, under))
}

/// Whether a streaming aggregation of `plan` groups by a session window.
fn has_session_window(plan: &LogicalPlan) -> bool {
    plan.exists(|n| {
        Ok(matches!(n, LogicalPlan::Aggregate(a) if is_streaming(n)
            && a.group_expr.iter().any(|e| e.exists(|e| Ok(matches!(e,
                Expr::Column(c) if c.name == crate::session_window::SESSION_WINDOW_COLUMN)))
                .unwrap_or(false))))
    })
    .unwrap_or(false)
}

/// Whether `plan` needs state across batches: a streaming aggregation, deduplication, join of
/// streams or AUTO CDC.
pub fn has_stateful_operator(plan: &LogicalPlan) -> bool {
    has_streaming_aggregation(plan)
        || plan
            .exists(|n| {
                Ok((crate::dedupe::DeduplicateNode::of(n).is_some()
                    || crate::top_n::TopNNode::of(n).is_some()
                    || crate::join::StreamJoinNode::of(n).is_some()
                    || crate::auto_cdc::AutoCdcNode::of(n).is_some())
                    && is_streaming(n))
            })
            .unwrap_or(false)
}

/// Refuses what a streaming query cannot do in output mode `mode`. `plan` must read at least
/// one stream.
pub fn check_streaming_plan(plan: &LogicalPlan, mode: OutputMode) -> Result<(), ClassifiedError> {
    let aggregates = has_streaming_aggregation(plan);
    match mode {
        OutputMode::Complete if !aggregates => {
            return Err(ClassifiedError::new(
                "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION",
                "42KDE",
                "Complete output mode needs a streaming aggregation (it rewrites the whole \
                 result each batch); this query has none. Use append mode.",
            ));
        }
        OutputMode::Append if aggregates && !every_aggregation_has_event_time_key(plan) => {
            return Err(ClassifiedError::new(
                "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION",
                "42KDE",
                "Append output mode is not supported for a streaming aggregation without a \
                 watermark on a grouping key: a group's result is final only when the watermark \
                 passes its event time, and without one no group is ever final. Declare a \
                 watermark on the event-time column (WATERMARK col DELAY OF INTERVAL ..., or \
                 with_watermark) and group by it or by window(col, ...); or use update mode \
                 (each batch emits the groups it changed) or complete mode (the whole result).",
            ));
        }
        OutputMode::Update if has_session_window(plan) => {
            return Err(ClassifiedError::new(
                "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION",
                "42KDE",
                "Update output mode is not supported for a session-window aggregation (as in \
                 Spark): a later row can merge sessions already emitted into one, which an \
                 update cannot take back. Use append mode (each session once, when the \
                 watermark closes it) or complete mode.",
            ));
        }
        OutputMode::Update | OutputMode::Complete if has_join_emitting_to_sink(plan, false) => {
            return Err(ClassifiedError::new(
                "STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION",
                "42KDE",
                "A join of two streams emits each joined row once, so it runs in append output \
                 mode only (as in Spark), unless an aggregation or a top-N over its rows is what \
                 the sink gets.",
            ));
        }
        _ => {}
    }
    let mut error = None;
    let _ = plan.apply(|node| {
        if !is_streaming(node) {
            return Ok(TreeNodeRecursion::Jump);
        }
        let mut reads_stream_in_subquery = false;
        let _ = node.apply_subqueries(|sub| {
            reads_stream_in_subquery |= is_streaming(sub);
            Ok(TreeNodeRecursion::Continue)
        });
        if reads_stream_in_subquery {
            error = Some(refuse(
                "UNSUPPORTED_STREAMING_OPERATION.STREAMING_SUBQUERY",
                "A subquery (IN, EXISTS or scalar) that reads a stream is not supported: each \
                 batch would see only that batch's rows of it. Join the streams instead, or read \
                 a static table in the subquery."
                    .into(),
            ));
            return Ok(TreeNodeRecursion::Stop);
        }
        let problem = match node {
            LogicalPlan::Limit(_) | LogicalPlan::Sort(_)
                if mode == OutputMode::Complete && has_streaming_aggregation(node) =>
            {
                // As Spark: over the whole result that complete mode emits, ORDER BY and LIMIT
                // are plain batch operations.
                None
            }
            LogicalPlan::Limit(_) => Some(refuse(
                "UNSUPPORTED_STREAMING_OPERATION.LIMIT",
                "LIMIT is not supported on a streaming query: a stream has no end to count to. \
                 Remove the LIMIT, or bound the input (rowsPerBatch, maxRowsPerTrigger) instead."
                    .into(),
            )),
            LogicalPlan::Sort(_) => Some(refuse(
                "UNSUPPORTED_STREAMING_OPERATION.SORT",
                "ORDER BY is not supported on a streaming query (Spark allows it only after an \
                 aggregation in complete output mode). Sort when you read the sink's output."
                    .into(),
            )),
            // weir rewrites DISTINCT ON over a stream to deduplication before this check.
            LogicalPlan::Distinct(Distinct::On(_)) => Some(refuse(
                "UNSUPPORTED_STREAMING_OPERATION.DISTINCT_ON",
                "This SELECT DISTINCT ON could not be turned into streaming deduplication.".into(),
            )),
            node if is_aggregation(node) => check_aggregation(node, mode),
            LogicalPlan::Window(_) => Some(ClassifiedError::new(
                "NON_TIME_WINDOW_NOT_SUPPORTED_IN_STREAMING",
                "42KDE",
                "Window functions (OVER ...) are not supported on a streaming query: a stream has \
                 no end to order or frame over. Use time windows (coming with stateful \
                 streaming), or run the window function over the sink's output in a batch query.",
            )),
            LogicalPlan::RecursiveQuery(_) => Some(refuse(
                "UNSUPPORTED_STREAMING_OPERATION.RECURSIVE_QUERY",
                "Recursive queries are not supported on a stream.".into(),
            )),
            LogicalPlan::Union(u) => {
                let streaming = u.inputs.iter().filter(|i| is_streaming(i)).count();
                (streaming != u.inputs.len()).then(|| {
                    refuse(
                        "UNSUPPORTED_STREAMING_OPERATION.UNION_WITH_STATIC",
                        "UNION of a stream with a static table is not supported (as in Spark): \
                         every input of the UNION must be a stream."
                            .into(),
                    )
                })
            }
            LogicalPlan::Join(j) => {
                let (l, r) = (is_streaming(&j.left), is_streaming(&j.right));
                if l && r {
                    // weir rewrites joins of two streams before this check.
                    Some(refuse(
                        "UNSUPPORTED_STREAMING_OPERATION.STREAM_STREAM_JOIN",
                        "This join of two streams could not be planned as a stream-stream join."
                            .into(),
                    ))
                } else {
                    let ok = match j.join_type {
                        JoinType::Inner => true,
                        JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => l,
                        JoinType::Right | JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => r,
                        JoinType::Full => false,
                    };
                    (!ok).then(|| {
                        refuse(
                            "UNSUPPORTED_STREAMING_OPERATION.STREAM_STATIC_JOIN",
                            format!(
                                "A {} join with the stream on the {} side is not supported: the \
                                 static side's unmatched rows would have to wait for the end of an \
                                 endless stream. Use an inner join, or an outer join that keeps the \
                                 stream's side.",
                                j.join_type,
                                if l { "left" } else { "right" }
                            ),
                        )
                    })
                }
            }
            _ => None,
        };
        if let Some(p) = problem {
            error = Some(p);
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    match error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
