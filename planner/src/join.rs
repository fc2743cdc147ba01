//! Stream-stream joins: a join whose two inputs are streams becomes a [`StreamJoinNode`], which
//! the engine runs as a symmetric hash join keeping each side's rows in state.
//!
//! The node keeps the equi-join keys and the rest of the condition. From the rest it reads the
//! event-time range between the sides (`rt BETWEEN lt - INTERVAL 1 SECOND AND lt + INTERVAL 1
//! SECOND`, or the same with `>=`/`<=`) as bounds on `right time - left time`, from which the
//! engine knows when a stored row can no longer match a future one.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchemaRef, Result, ScalarValue, plan_err};
use datafusion::logical_expr::{
    BinaryExpr, Expr, Extension, Filter, JoinType, LogicalPlan, Operator,
    UserDefinedLogicalNodeCore, Volatility, build_join_schema,
    utils::{conjunction, split_conjunction},
};
use weir_common::ClassifiedError;

use crate::analysis::is_streaming;

/// Bounds on `right event time - left event time` that the join condition implies, in
/// microseconds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct TimeBound {
    /// The left side's event-time column.
    pub left: String,
    /// The right side's event-time column.
    pub right: String,
    /// `right - left >= lower`, if the condition says so.
    pub lower_us: Option<i64>,
    /// `right - left <= upper`, if the condition says so.
    pub upper_us: Option<i64>,
}

/// A join of two streams.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamJoinNode {
    /// Left stream.
    pub left: LogicalPlan,
    /// Right stream.
    pub right: LogicalPlan,
    /// Equi-join keys, (left, right).
    pub on: Vec<(Expr, Expr)>,
    /// The rest of the condition.
    pub filter: Option<Expr>,
    /// Inner, left, right or full (outer).
    pub join_type: JoinType,
    /// The event-time range between the sides, read from `filter`.
    pub time_bound: Option<TimeBound>,
    /// Left columns then right columns.
    pub schema: DFSchemaRef,
    /// Whether the optimizer may drop the columns of each side that neither the join nor what
    /// follows it reads, before the join (so they are not stored in its state): true for the
    /// queries of checkpoints created since 2026-12-07, whose stored rows hold only the columns
    /// read (see [`rewrite_stream_joins`]).
    pub prune_inputs: bool,
}

impl PartialOrd for StreamJoinNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        (
            &self.left,
            &self.right,
            &self.on,
            &self.filter,
            &self.time_bound,
        )
            .partial_cmp(&(
                &other.left,
                &other.right,
                &other.on,
                &other.filter,
                &other.time_bound,
            ))
    }
}

impl StreamJoinNode {
    /// The node of `plan`, if it is one.
    pub fn of(plan: &LogicalPlan) -> Option<&StreamJoinNode> {
        match plan {
            LogicalPlan::Extension(e) => e.node.as_any().downcast_ref::<StreamJoinNode>(),
            _ => None,
        }
    }
}

impl UserDefinedLogicalNodeCore for StreamJoinNode {
    fn name(&self) -> &str {
        "StreamStreamJoin"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.left, &self.right]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        let mut out: Vec<Expr> = self
            .on
            .iter()
            .flat_map(|(l, r)| [l.clone(), r.clone()])
            .collect();
        out.extend(self.filter.clone());
        out
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let on: Vec<String> = self.on.iter().map(|(l, r)| format!("{l} = {r}")).collect();
        write!(
            f,
            "StreamStreamJoin: {} on=[{}]",
            self.join_type,
            on.join(", ")
        )?;
        if let Some(filter) = &self.filter {
            write!(f, " filter={filter}")?;
        }
        Ok(())
    }

    /// The columns of each side that the join's output columns `output_columns` come from; the
    /// optimizer adds those the keys and the condition read (the event times of its time range
    /// among them), and each side's watermark keeps its event-time column.
    fn necessary_children_exprs(&self, output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        if !self.prune_inputs {
            return None;
        }
        let left_width = self.left.schema().fields().len();
        let right_width = self.right.schema().fields().len();
        let (mut left, mut right) = (vec![], vec![]);
        for &i in output_columns {
            if i < left_width {
                left.push(i);
            } else if i < left_width + right_width {
                right.push(i - left_width);
            } else {
                return None;
            }
        }
        Some(vec![left, right])
    }

    fn with_exprs_and_inputs(
        &self,
        mut exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        if inputs.len() != 2 {
            return plan_err!("StreamStreamJoin takes two inputs");
        }
        let right = inputs.pop().unwrap_or_else(|| unreachable!());
        let left = inputs.pop().unwrap_or_else(|| unreachable!());
        let filter = if self.filter.is_some() {
            exprs.pop()
        } else {
            None
        };
        if exprs.len() != self.on.len() * 2 {
            return plan_err!("StreamStreamJoin got the wrong number of key expressions");
        }
        let mut on = vec![];
        let mut it = exprs.into_iter();
        while let (Some(l), Some(r)) = (it.next(), it.next()) {
            on.push((l, r));
        }
        // The optimizer gives sides with fewer columns when it prunes them: the output is
        // then theirs.
        let schema = if left.schema() == self.left.schema() && right.schema() == self.right.schema()
        {
            Arc::clone(&self.schema)
        } else {
            Arc::new(build_join_schema(
                left.schema(),
                right.schema(),
                &self.join_type,
            )?)
        };
        Ok(Self {
            left,
            right,
            on,
            filter,
            join_type: self.join_type,
            time_bound: self.time_bound.clone(),
            schema,
            prune_inputs: self.prune_inputs,
        })
    }
}

fn refuse(message: String) -> ClassifiedError {
    ClassifiedError::new(
        "UNSUPPORTED_STREAMING_OPERATION.STREAM_STREAM_JOIN",
        "0A000",
        message,
    )
}

/// A column plus a constant offset in microseconds: `t`, `t + INTERVAL ...`, `t - INTERVAL ...`.
fn column_offset(e: &Expr) -> Option<(Column, i64)> {
    match e {
        Expr::Column(c) => Some((c.clone(), 0)),
        Expr::Cast(c) => column_offset(&c.expr),
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let (c, base) = column_offset(left)?;
            let d = interval_us(right)?;
            match op {
                Operator::Plus => Some((c, base.checked_add(d)?)),
                Operator::Minus => Some((c, base.checked_sub(d)?)),
                _ => None,
            }
        }
        _ => None,
    }
}

fn interval_us(e: &Expr) -> Option<i64> {
    match e {
        Expr::Literal(ScalarValue::IntervalMonthDayNano(Some(i)), _) if i.months == 0 => {
            i64::from(i.days)
                .checked_mul(86_400_000_000)?
                .checked_add(i.nanoseconds / 1000)
        }
        Expr::Literal(ScalarValue::IntervalDayTime(Some(i)), _) => i64::from(i.days)
            .checked_mul(86_400_000_000)?
            .checked_add(i64::from(i.milliseconds) * 1000),
        Expr::Cast(c) => interval_us(&c.expr),
        _ => None,
    }
}

/// Reads the event-time range between the sides from `filter`'s conjuncts.
fn time_bound(filter: Option<&Expr>, left: &LogicalPlan, right: &LogicalPlan) -> Option<TimeBound> {
    let filter = filter?;
    let side = |c: &Column| {
        if left.schema().has_column(c) {
            Some(true)
        } else if right.schema().has_column(c) {
            Some(false)
        } else {
            None
        }
    };
    let mut bound: Option<TimeBound> = None;
    let mut comparisons = vec![];
    for e in split_conjunction(filter) {
        match e {
            Expr::Between(b) if !b.negated => {
                comparisons.push(((*b.expr).clone(), Operator::GtEq, (*b.low).clone()));
                comparisons.push(((*b.expr).clone(), Operator::LtEq, (*b.high).clone()));
            }
            Expr::BinaryExpr(BinaryExpr { left, op, right })
                if matches!(
                    op,
                    Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq
                ) =>
            {
                comparisons.push(((**left).clone(), *op, (**right).clone()))
            }
            _ => {}
        }
    }
    for (a, op, b) in comparisons {
        let (Some((ca, oa)), Some((cb, ob))) = (column_offset(&a), column_offset(&b)) else {
            continue;
        };
        // (A + oa) op (B + ob), one column per side: as `r - l` op' constant.
        let (l, r, op, constant) = match (side(&ca), side(&cb)) {
            (Some(false), Some(true)) => (cb, ca, op, ob - oa),
            (Some(true), Some(false)) => {
                let flipped = match op {
                    Operator::Lt => Operator::Gt,
                    Operator::LtEq => Operator::GtEq,
                    Operator::Gt => Operator::Lt,
                    _ => Operator::LtEq,
                };
                (ca, cb, flipped, oa - ob)
            }
            _ => continue,
        };
        let b = bound.get_or_insert_with(|| TimeBound {
            left: l.name.clone(),
            right: r.name.clone(),
            lower_us: None,
            upper_us: None,
        });
        if b.left != l.name || b.right != r.name {
            continue;
        }
        match op {
            Operator::Lt | Operator::LtEq => {
                b.upper_us = Some(b.upper_us.map_or(constant, |u| u.min(constant)));
            }
            _ => b.lower_us = Some(b.lower_us.map_or(constant, |u| u.max(constant))),
        }
    }
    bound
}

/// Where a one-sided conjunct of a join's condition (`on`) or of the filter above it (`WHERE`)
/// may also be applied before the join: on an inner join, either side; above an outer join,
/// its preserved side (a row the `WHERE` drops would only have become output rows the `WHERE`
/// drops); in an outer join's condition, the side that is not preserved (its rows that fail
/// can meet nothing, and unmatched they are not output). A full join preserves both, so
/// nothing moves; the rules are Spark's `PushPredicateThroughJoin`'s and DataFusion's.
fn pushable_sides(join_type: JoinType, from_condition: bool) -> [bool; 2] {
    match (join_type, from_condition) {
        (JoinType::Inner, _) => [true, true],
        (JoinType::Left, false) | (JoinType::Right, true) => [true, false],
        (JoinType::Right, false) | (JoinType::Left, true) => [false, true],
        _ => [false, false],
    }
}

impl StreamJoinNode {
    /// This join with each of `conjuncts` (from its condition, or from the filter right above
    /// it) that reads one side only applied to that side before the join as well, where
    /// [`pushable_sides`] allows, so rows that cannot pass it are neither stored nor paired
    /// (Nexmark q20's `WHERE a.category = 10` paired every bid with its auction and then
    /// dropped four pairs in five). DataFusion's filter pushdown cannot do it: it pushes a
    /// predicate into every input of an extension node or none. The conjuncts stay where they
    /// were too, so a row stored before this existed (in a checkpoint written without it) is
    /// still filtered out. As in Spark, a side's watermark then counts only the rows that pass
    /// (the optimizer moves a filter that does not read the event time below the watermark).
    fn with_sides_filtered(mut self, conjuncts: Vec<&Expr>, from_condition: bool) -> Result<Self> {
        let allowed = pushable_sides(self.join_type, from_condition);
        let left_width = self.left.schema().fields().len();
        let mut pushed: [Vec<Expr>; 2] = [vec![], vec![]];
        for e in conjuncts {
            if let Some(side) = self.one_side(e, left_width)
                && allowed[side]
            {
                pushed[side].push(e.clone());
            }
        }
        let [to_left, to_right] = pushed;
        if let Some(p) = conjunction(to_left) {
            self.left = LogicalPlan::Filter(Filter::try_new(p, Arc::new(self.left))?);
        }
        if let Some(p) = conjunction(to_right) {
            self.right = LogicalPlan::Filter(Filter::try_new(p, Arc::new(self.right))?);
        }
        Ok(self)
    }

    /// The side (0 left, 1 right) whose columns alone `e` reads, when it can move there: each
    /// column resolved in the join's own schema (so a bare name one side has unqualified and
    /// the other qualified goes where the join resolved it), no subquery (whose references to
    /// the other side `column_refs` does not see), and only immutable functions (`now()` gives
    /// another answer when the row is stored than when it is paired in a later batch).
    fn one_side(&self, e: &Expr, left_width: usize) -> Option<usize> {
        let movable = !e
            .exists(|x| {
                Ok(match x {
                    Expr::ScalarSubquery(_)
                    | Expr::Exists(_)
                    | Expr::InSubquery(_)
                    | Expr::OuterReferenceColumn(..) => true,
                    Expr::ScalarFunction(f) => {
                        f.func.signature().volatility != Volatility::Immutable
                    }
                    _ => x.is_volatile_node(),
                })
            })
            .unwrap_or(true);
        if !movable {
            return None;
        }
        let mut sides = e.column_refs().into_iter().map(|c| {
            self.schema
                .index_of_column(c)
                .ok()
                .map(|i| usize::from(i >= left_width))
        });
        let first = sides.next()??;
        sides.all(|s| s == Some(first)).then_some(first)
    }
}

/// A filter over a stream-stream join with the conjuncts that read one side also applied to
/// that side before the join, where the join type allows (see [`StreamJoinNode::with_sides_filtered`]).
fn filter_sides_first(f: &Filter) -> Result<Transformed<LogicalPlan>> {
    let node = match f.input.as_ref() {
        LogicalPlan::Extension(e) => e.node.as_any().downcast_ref::<StreamJoinNode>(),
        _ => None,
    };
    let Some(node) = node else {
        return Ok(Transformed::no(LogicalPlan::Filter(f.clone())));
    };
    let joined = node
        .clone()
        .with_sides_filtered(split_conjunction(&f.predicate), false)?;
    if joined == *node {
        return Ok(Transformed::no(LogicalPlan::Filter(f.clone())));
    }
    let input = LogicalPlan::Extension(Extension {
        node: Arc::new(joined),
    });
    Ok(Transformed::yes(LogicalPlan::Filter(Filter::try_new(
        f.predicate.clone(),
        Arc::new(input),
    )?)))
}

/// Replaces each join of two streams with a [`StreamJoinNode`]; refuses join types the
/// engine cannot run on streams. `prune_inputs`: let the optimizer drop, before each join, the
/// columns of its sides that nothing reads, as Spark's optimizer does (its state then holds
/// only those read: Nexmark q7's bids lose `channel` and `url`, a third of each stored row).
/// A checkpoint created without it stores whole rows, which its state's schema says.
pub fn rewrite_stream_joins(
    plan: LogicalPlan,
    prune_inputs: bool,
) -> std::result::Result<LogicalPlan, ClassifiedError> {
    let mut problem = None;
    let rewritten = plan
        .transform_up(|node| {
            if let LogicalPlan::Filter(f) = &node {
                return filter_sides_first(f);
            }
            let LogicalPlan::Join(j) = &node else {
                return Ok(Transformed::no(node));
            };
            if !(is_streaming(&j.left) && is_streaming(&j.right)) {
                return Ok(Transformed::no(node));
            }
            if !matches!(
                j.join_type,
                JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full
            ) {
                problem = Some(refuse(format!(
                    "A {} join of two streams is not supported; use an inner or outer join.",
                    j.join_type
                )));
                return Ok(Transformed::no(node));
            }
            // Equalities between one side and the other become keys, as DataFusion's optimizer
            // would make them.
            let mut on = j.on.clone();
            let mut rest = vec![];
            for e in j.filter.iter().flat_map(split_conjunction) {
                if let Expr::BinaryExpr(BinaryExpr {
                    left,
                    op: Operator::Eq,
                    right,
                }) = e
                {
                    let refs_only = |e: &Expr, p: &LogicalPlan| {
                        let cols = e.column_refs();
                        !cols.is_empty() && cols.iter().all(|c| p.schema().has_column(c))
                    };
                    if refs_only(left, &j.left) && refs_only(right, &j.right) {
                        on.push(((**left).clone(), (**right).clone()));
                        continue;
                    }
                    if refs_only(left, &j.right) && refs_only(right, &j.left) {
                        on.push(((**right).clone(), (**left).clone()));
                        continue;
                    }
                }
                rest.push(e.clone());
            }
            let filter = conjunction(rest);
            let time_bound = time_bound(filter.as_ref(), &j.left, &j.right);
            let node = StreamJoinNode {
                left: j.left.as_ref().clone(),
                right: j.right.as_ref().clone(),
                on,
                filter: filter.clone(),
                join_type: j.join_type,
                time_bound,
                schema: Arc::clone(&j.schema),
                prune_inputs,
            };
            let node = match &filter {
                Some(f) => node.with_sides_filtered(split_conjunction(f), true)?,
                None => node,
            };
            Ok(Transformed::yes(LogicalPlan::Extension(Extension {
                node: Arc::new(node),
            })))
        })
        .map_err(|e| ClassifiedError::new("INVALID_QUERY", "42000", e.to_string()))?;
    match problem {
        Some(p) => Err(p),
        None => Ok(rewritten.data),
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use datafusion::logical_expr::{LogicalPlanBuilder, col, lit};
    use datafusion::prelude::Expr;

    use super::*;

    fn side(t: &str) -> LogicalPlan {
        let schema = Schema::new(vec![Field::new(
            t,
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        )]);
        LogicalPlanBuilder::empty(false)
            .build()
            .and_then(|_| datafusion::logical_expr::table_scan(Some(t), &schema, None)?.build())
            .unwrap()
    }

    fn secs(s: i64) -> Expr {
        lit(ScalarValue::IntervalMonthDayNano(Some(
            datafusion::arrow::datatypes::IntervalMonthDayNano::new(0, 0, s * 1_000_000_000),
        )))
    }

    #[test]
    fn a_time_range_between_the_sides_is_read_as_bounds() {
        let (l, r) = (side("lt"), side("rt"));
        let between = col("rt").between(col("lt") - secs(1), col("lt") + secs(2));
        let b = time_bound(Some(&between), &l, &r).unwrap();
        assert_eq!((b.left.as_str(), b.right.as_str()), ("lt", "rt"));
        assert_eq!(
            (b.lower_us, b.upper_us),
            (Some(-1_000_000), Some(2_000_000))
        );
        // The same written the other way round, with the left column on the left.
        let flipped = col("lt")
            .lt_eq(col("rt") + secs(1))
            .and(col("lt").gt_eq(col("rt") - secs(2)));
        let b = time_bound(Some(&flipped), &l, &r).unwrap();
        assert_eq!(
            (b.lower_us, b.upper_us),
            (Some(-1_000_000), Some(2_000_000))
        );
        assert_eq!(time_bound(Some(&col("lt").eq(col("rt"))), &l, &r), None);
    }
}
