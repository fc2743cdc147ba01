//! An aggregation over an updating aggregation (Nexmark q4: the average per category of each
//! auction's running maximum), in update and complete output mode.
//!
//! The inner aggregation emits a changelog: for each group a batch changed, the row it had
//! before (weight -1) and the row it has now (weight +1), in a column [`WEIGHT_COLUMN`]. The
//! outer aggregation sums weighted values, so a retraction takes back what its row added:
//!
//! ```text
//! Aggregate: GROUP BY c; avg(x), count(*)       Projection: c, CASE n0 = 0 THEN NULL ELSE s0 / n0 END,
//!   Projection / Filter / SubqueryAlias ...  ─►               coalesce(n1, 0)
//!     Aggregate: GROUP BY k; max(v) AS x          [Filter: __weir_rows > 0]      (complete mode)
//!       <stream>                                    Aggregate: GROUP BY c; sum(±x) AS s0,
//!                                                       sum(w if x not null) AS n0, sum(w) AS n1,
//!                                                       sum(w) AS __weir_rows
//!                                                     Projection / Filter / SubqueryAlias ... (+ w)
//!                                                       Changelog                 (adds w = ±1)
//!                                                         Aggregate: GROUP BY k; max(v) AS x
//!                                                           <stream>
//! ```
//!
//! `count`, `sum` and `avg` (over integers and floats) retract this way, as Flink's and
//! Feldera's retracting accumulators do; `min` and `max` keep each group's distinct values with
//! their counts (see [`crate::extreme`]); the rest are refused before anything runs. Append mode keeps Spark's chained time-window
//! aggregations, where the inner one emits each group once, final.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, DFSchemaRef, Result, plan_err};
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::logical_expr::expr::{AggregateFunction, Case};
use datafusion::logical_expr::{
    Aggregate, AggregateUDF, Expr, ExprSchemable, Extension, Filter, LogicalPlan, Projection,
    SubqueryAlias, UserDefinedLogicalNodeCore, cast, col, lit,
};
use weir_common::ClassifiedError;
use weir_sinks::OutputMode;

use crate::analysis::is_streaming;

/// The changelog's weight column: -1 for a retracted row, +1 for an inserted one.
pub const WEIGHT_COLUMN: &str = "__weir_weight";

/// The outer aggregation's count of rows per group, net of retractions (complete mode keeps
/// the groups that have some).
const ROWS_COLUMN: &str = "__weir_rows";

/// An aggregation's output as a changelog: its columns and [`WEIGHT_COLUMN`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChangelogNode {
    /// The aggregation.
    pub input: LogicalPlan,
    /// The aggregation's columns and the weight.
    pub schema: DFSchemaRef,
}

impl ChangelogNode {
    /// The changelog of `input`'s rows.
    pub fn try_new(input: LogicalPlan) -> Result<Self> {
        let weight = DFSchema::from_unqualified_fields(
            vec![Field::new(WEIGHT_COLUMN, DataType::Int64, false)].into(),
            Default::default(),
        )?;
        let schema = Arc::new(input.schema().join(&weight)?);
        Ok(Self { input, schema })
    }

    /// The node of `plan`, if it is one.
    pub fn of(plan: &LogicalPlan) -> Option<&ChangelogNode> {
        match plan {
            LogicalPlan::Extension(e) => e.node.as_any().downcast_ref::<ChangelogNode>(),
            _ => None,
        }
    }
}

impl PartialOrd for ChangelogNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        self.input.partial_cmp(&other.input)
    }
}

impl UserDefinedLogicalNodeCore for ChangelogNode {
    fn name(&self) -> &str {
        "Changelog"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "Changelog: {WEIGHT_COLUMN} -1 retracts a row, +1 inserts one"
        )
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        match inputs.pop() {
            Some(input) if inputs.is_empty() => Self::try_new(input),
            _ => plan_err!("Changelog takes one input"),
        }
    }
}

fn refuse(message: String) -> ClassifiedError {
    ClassifiedError::new(
        "UNSUPPORTED_STREAMING_OPERATION.MULTIPLE_STREAMING_AGGREGATIONS",
        "0A000",
        message,
    )
}

fn planning(e: datafusion::error::DataFusionError) -> ClassifiedError {
    ClassifiedError::new(
        "INTERNAL_ERROR",
        "XX000",
        format!("planning an aggregation over an aggregation: {e}"),
    )
}

/// Whether `plan` aggregates a stream.
fn is_streaming_aggregate(plan: &LogicalPlan) -> bool {
    matches!(plan, LogicalPlan::Aggregate(_)) && is_streaming(plan)
}

/// `plan` (the input of an outer aggregation) with the streaming aggregation it reads through
/// projections, filters and aliases turned into a changelog, and the weight column carried up
/// to its output; `None` when no aggregation is below along that path, or when the one below
/// itself reads one (only two levels retract).
fn weighted(plan: &LogicalPlan) -> Result<Option<(LogicalPlan, Column)>> {
    match plan {
        LogicalPlan::Aggregate(a) if is_streaming(plan) => {
            // A session window's sessions merge, which its operator does not retract; and a
            // third level would retract rows of the second that were all taken back.
            let session = a.group_expr.iter().any(|e| {
                e.column_refs()
                    .iter()
                    .any(|c| c.name == crate::session_window::SESSION_WINDOW_COLUMN)
            });
            let nested = a
                .input
                .exists(|n| Ok(crate::analysis::is_aggregation(n) && is_streaming(n)))?;
            if session || nested {
                return Ok(None);
            }
            let node = ChangelogNode::try_new(plan.clone())?;
            Ok(Some((
                LogicalPlan::Extension(Extension {
                    node: Arc::new(node),
                }),
                Column::from_name(WEIGHT_COLUMN),
            )))
        }
        LogicalPlan::Projection(p) => {
            let Some((input, weight)) = weighted(&p.input)? else {
                return Ok(None);
            };
            let mut expr = p.expr.clone();
            expr.push(Expr::Column(weight.clone()));
            let projection = Projection::try_new(expr, Arc::new(input))?;
            Ok(Some((LogicalPlan::Projection(projection), weight)))
        }
        LogicalPlan::Filter(f) => {
            let Some((input, weight)) = weighted(&f.input)? else {
                return Ok(None);
            };
            let filter = Filter::try_new(f.predicate.clone(), Arc::new(input))?;
            Ok(Some((LogicalPlan::Filter(filter), weight)))
        }
        LogicalPlan::SubqueryAlias(s) => {
            let Some((input, _)) = weighted(&s.input)? else {
                return Ok(None);
            };
            let alias = SubqueryAlias::try_new(Arc::new(input), s.alias.clone())?;
            Ok(Some((
                LogicalPlan::SubqueryAlias(alias),
                Column::new(Some(s.alias.clone()), WEIGHT_COLUMN),
            )))
        }
        _ => Ok(None),
    }
}

/// The value of `x` that a row of weight `w` adds to a sum: `x`, or `-x` for a retraction, in a
/// signed type (unsigned integers widen).
fn signed(x: Expr, t: &DataType, w: &Expr) -> Expr {
    let x = match t {
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => cast(x, DataType::Int64),
        DataType::UInt64 => cast(x, DataType::Decimal128(20, 0)),
        _ => x,
    };
    case(
        w.clone().gt(lit(0i64)),
        x.clone(),
        Expr::Negative(Box::new(x)),
    )
}

/// `CASE WHEN condition THEN then ELSE otherwise END`.
fn case(condition: Expr, then: Expr, otherwise: Expr) -> Expr {
    Expr::Case(Case::new(
        None,
        vec![(Box::new(condition), Box::new(then))],
        Some(Box::new(otherwise)),
    ))
}

/// `f(args) FILTER (WHERE filter)`.
fn call(f: Arc<AggregateUDF>, args: Vec<Expr>, filter: Option<Box<Expr>>) -> Expr {
    Expr::AggregateFunction(AggregateFunction::new_udf(
        f,
        args,
        false,
        filter,
        vec![],
        None,
    ))
}

/// `sum(e) FILTER (WHERE filter)`.
fn sum_of(e: Expr, filter: Option<Box<Expr>>) -> Expr {
    call(sum_udaf(), vec![e], filter)
}

/// `e`, or 0 where it is null.
fn or_zero(e: Expr) -> Expr {
    case(e.clone().is_null(), lit(0i64), e)
}

/// The outer aggregation `agg` over `input` (whose rows carry `weight`), with each aggregate
/// function as weighted sums, then a projection to the original columns.
fn retracting(
    agg: &Aggregate,
    input: LogicalPlan,
    weight: Column,
    mode: OutputMode,
) -> std::result::Result<LogicalPlan, ClassifiedError> {
    let w = Expr::Column(weight);
    let ngroup = agg.group_expr.len();
    let mut sums: Vec<Expr> = vec![];
    let mut finals: Vec<Expr> = vec![];
    for (i, e) in agg.aggr_expr.iter().enumerate() {
        let (qualifier, field) = agg.schema.qualified_field(ngroup + i);
        let f = match e {
            Expr::Alias(a) => a.expr.as_ref(),
            e => e,
        };
        let Expr::AggregateFunction(f) = f else {
            return Err(refuse(format!("`{e}` is not an aggregate function")));
        };
        let name = f.func.name().to_ascii_lowercase();
        let p = &f.params;
        if p.distinct || !p.order_by.is_empty() {
            return Err(refuse(format!(
                "`{e}` over an updating aggregation cannot take back a retracted row (DISTINCT \
                 and ORDER BY in an aggregate need every value kept). Use count, sum, avg, min \
                 or max without them, or run this aggregation over the sink's output in a batch \
                 query."
            )));
        }
        let (s_name, n_name) = (format!("__weir_{i}_sum"), format!("__weir_{i}_rows"));
        if let ("max" | "min", [x]) = (name.as_str(), p.args.as_slice()) {
            // The values themselves, each with its count (see `extreme`).
            let f = crate::extreme::RetractingExtreme::udaf(name == "max");
            sums.push(call(f, vec![x.clone(), w.clone()], p.filter.clone()).alias(&s_name));
            finals.push(
                cast(col(Column::from_name(&s_name)), field.data_type().clone())
                    .alias_qualified(qualifier.cloned(), field.name()),
            );
            continue;
        }
        // Rows that count: every argument not null (count(*) has a literal argument).
        let counted = p
            .args
            .iter()
            .filter(|a| !matches!(a, Expr::Literal(..)))
            .map(|a| a.clone().is_not_null())
            .reduce(Expr::and);
        let n_value = match counted {
            Some(c) => case(c, w.clone(), lit(0i64)),
            None => w.clone(),
        };
        sums.push(sum_of(n_value, p.filter.clone()).alias(&n_name));
        let n = or_zero(col(Column::from_name(&n_name)));
        let final_value = match (name.as_str(), p.args.as_slice()) {
            ("count", _) => cast(n, field.data_type().clone()),
            ("sum" | "avg" | "mean", [x]) => {
                let t = x.get_type(input.schema()).map_err(planning)?;
                let numeric = t.is_integer() || t.is_floating();
                let decimal = matches!(t, DataType::Decimal128(..) | DataType::Decimal256(..));
                if !(numeric || (decimal && name == "sum")) {
                    return Err(refuse(format!(
                        "`{e}` over an updating aggregation is not supported for {t} values: \
                         weir takes back retracted rows from sums of integers and floats{}. \
                         Cast the argument to DOUBLE or BIGINT.",
                        if name == "sum" { " and decimals" } else { "" }
                    )));
                }
                sums.push(sum_of(signed(x.clone(), &t, &w), p.filter.clone()).alias(&s_name));
                let s = col(Column::from_name(&s_name));
                let value = if name == "sum" {
                    cast(s, field.data_type().clone())
                } else {
                    cast(
                        cast(s, DataType::Float64) / cast(n.clone(), DataType::Float64),
                        field.data_type().clone(),
                    )
                };
                case(
                    n.eq(lit(0i64)),
                    lit(datafusion::common::ScalarValue::Null),
                    value,
                )
            }
            _ => {
                return Err(refuse(format!(
                    "`{e}` over an updating aggregation is not supported: when a row of the \
                     aggregation below changes, weir takes back the old one, which count, sum, \
                     avg, min and max can do and {name} cannot. Use one of those, give both \
                     aggregations event-time windows and use append output mode, or run this \
                     aggregation over the sink's output in a batch query."
                )));
            }
        };
        finals.push(
            cast(final_value, field.data_type().clone())
                .alias_qualified(qualifier.cloned(), field.name()),
        );
    }
    sums.push(sum_of(w, None).alias(ROWS_COLUMN));
    let aggregate =
        Aggregate::try_new(Arc::new(input), agg.group_expr.clone(), sums).map_err(planning)?;
    let mut plan = LogicalPlan::Aggregate(aggregate);
    let mut columns: Vec<Expr> = (0..ngroup)
        .map(|j| Expr::Column(Column::from(plan.schema().qualified_field(j))))
        .collect();
    columns.extend(finals);
    if mode == OutputMode::Complete {
        // A group whose rows were all retracted is no longer in the result.
        let kept =
            Filter::try_new(col(ROWS_COLUMN).gt(lit(0i64)), Arc::new(plan)).map_err(planning)?;
        plan = LogicalPlan::Filter(kept);
    }
    Ok(LogicalPlan::Projection(
        Projection::try_new(columns, Arc::new(plan)).map_err(planning)?,
    ))
}

/// Each streaming aggregation over another (through projections, filters and aliases) in
/// update or complete output mode, rewritten so the inner one emits a changelog and the outer
/// one takes back retracted rows. Append mode is left as it is.
pub fn rewrite_aggregations_over_updates(
    plan: LogicalPlan,
    mode: OutputMode,
) -> std::result::Result<LogicalPlan, ClassifiedError> {
    if mode == OutputMode::Append {
        return Ok(plan);
    }
    let mut error = None;
    let rewritten = plan
        .transform_up(|node| {
            if error.is_some() || !is_streaming_aggregate(&node) {
                return Ok(Transformed::no(node));
            }
            let LogicalPlan::Aggregate(agg) = &node else {
                return Ok(Transformed::no(node));
            };
            let Some((input, weight)) = weighted(&agg.input)? else {
                return Ok(Transformed::no(node));
            };
            match retracting(agg, input, weight, mode) {
                Ok(plan) => Ok(Transformed::yes(plan)),
                Err(e) => {
                    error = Some(e);
                    Ok(Transformed::no(node))
                }
            }
        })
        .map_err(planning)?;
    match error {
        Some(e) => Err(e),
        None => Ok(rewritten.data),
    }
}
