//! Top-N per key over a stream: `row_number() OVER (PARTITION BY k ORDER BY o) <= N`, the
//! pattern Flink, RisingWave and Feldera run as a Top-N operator (Nexmark q9, q18, q19).
//!
//! ```text
//! Filter: rn <= 10                         Filter: rn <= 10            (kept: a no-op on its output)
//!   [SubqueryAlias / Projection ...]   ─►    [SubqueryAlias / Projection ...]
//!     WindowAggr: row_number() ...             TopN: partition=[k], order=[o DESC], n=10
//!       <stream>                                 <stream>
//! ```
//!
//! The node's schema is the window node's: the input's columns and the row number, under the
//! window expression's name, so the plan above it is unchanged. The engine keeps each key's
//! best N rows in state and emits, per batch, the rows whose position changed (update mode) or
//! every key's rows (complete mode).

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchemaRef, Result, ScalarValue, plan_err};
use datafusion::logical_expr::expr::{Sort, WindowFunction, WindowFunctionParams};
use datafusion::logical_expr::{
    BinaryExpr, Expr, Extension, LogicalPlan, Operator, UserDefinedLogicalNodeCore,
    WindowFunctionDefinition,
};
use weir_common::ClassifiedError;

use crate::analysis::is_streaming;

/// Largest N a top-N keeps per key: each key's rows are one state value.
pub const MAX_TOP_N: u64 = 10_000;

/// The `n` best rows of `input` per value of `partition_by`, by `order_by`, numbered from 1.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopNNode {
    /// The stream.
    pub input: LogicalPlan,
    /// The key each top N is kept for.
    pub partition_by: Vec<Expr>,
    /// The order within a key.
    pub order_by: Vec<Sort>,
    /// How many rows per key.
    pub n: u64,
    /// The input's columns and the row number.
    pub schema: DFSchemaRef,
}

impl TopNNode {
    /// The node of `plan`, if it is one.
    pub fn of(plan: &LogicalPlan) -> Option<&TopNNode> {
        match plan {
            LogicalPlan::Extension(e) => e.node.as_any().downcast_ref::<TopNNode>(),
            _ => None,
        }
    }
}

impl PartialOrd for TopNNode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        // Plans compare by their parts; the schema follows from them.
        match self.input.partial_cmp(&other.input) {
            Some(std::cmp::Ordering::Equal) => {}
            o => return o,
        }
        match self.partition_by.partial_cmp(&other.partition_by) {
            Some(std::cmp::Ordering::Equal) => {}
            o => return o,
        }
        match self.order_by.partial_cmp(&other.order_by) {
            Some(std::cmp::Ordering::Equal) => {}
            o => return o,
        }
        self.n.partial_cmp(&other.n)
    }
}

impl UserDefinedLogicalNodeCore for TopNNode {
    fn name(&self) -> &str {
        "TopN"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        let mut e = self.partition_by.clone();
        e.extend(self.order_by.iter().map(|s| s.expr.clone()));
        e
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let p: Vec<String> = self.partition_by.iter().map(|e| e.to_string()).collect();
        let o: Vec<String> = self.order_by.iter().map(|s| s.to_string()).collect();
        write!(
            f,
            "TopN: partition_by=[{}], order_by=[{}], n={}",
            p.join(", "),
            o.join(", "),
            self.n
        )
    }

    fn with_exprs_and_inputs(
        &self,
        exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let Some(input) = inputs.pop() else {
            return plan_err!("TopN takes one input");
        };
        let np = self.partition_by.len();
        if exprs.len() != np + self.order_by.len() {
            return plan_err!("TopN: expected {} expressions", np + self.order_by.len());
        }
        let (partition_by, order) = exprs.split_at(np);
        let order_by = self
            .order_by
            .iter()
            .zip(order)
            .map(|(s, e)| Sort::new(e.clone(), s.asc, s.nulls_first))
            .collect();
        Ok(Self {
            input,
            partition_by: partition_by.to_vec(),
            order_by,
            n: self.n,
            schema: Arc::clone(&self.schema),
        })
    }
}

fn unsupported(message: String) -> ClassifiedError {
    ClassifiedError::new(
        "NON_TIME_WINDOW_NOT_SUPPORTED_IN_STREAMING",
        "42KDE",
        message,
    )
}

/// The bound `rn <= N` (or `rn < N + 1`, `rn = 1`, `N >= rn`) puts on column `rn`.
fn bound(predicate: &Expr, rn: &str) -> Option<u64> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = predicate else {
        return None;
    };
    let is_rn = |e: &Expr| matches!(e, Expr::Column(c) if c.name == rn);
    let value = |e: &Expr| match e {
        Expr::Literal(v, _) => match v {
            ScalarValue::Int64(Some(n)) => u64::try_from(*n).ok(),
            ScalarValue::Int32(Some(n)) => u64::try_from(*n).ok(),
            ScalarValue::UInt64(Some(n)) => Some(*n),
            ScalarValue::UInt32(Some(n)) => Some(u64::from(*n)),
            _ => None,
        },
        Expr::Cast(c) => match c.expr.as_ref() {
            Expr::Literal(ScalarValue::Int64(Some(n)), _) => u64::try_from(*n).ok(),
            _ => None,
        },
        _ => None,
    };
    let (op, v) = if is_rn(left) {
        (*op, value(right)?)
    } else if is_rn(right) {
        (op.swap()?, value(left)?)
    } else {
        return None;
    };
    match op {
        Operator::LtEq => Some(v),
        Operator::Lt => v.checked_sub(1),
        Operator::Eq if v == 1 => Some(1),
        _ => None,
    }
}

/// The conjuncts of `e`.
fn conjuncts(e: &Expr) -> Vec<&Expr> {
    match e {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::And,
            right,
        }) => {
            let mut c = conjuncts(left);
            c.extend(conjuncts(right));
            c
        }
        other => vec![other],
    }
}

/// The name a column takes through `plan` (projections and aliases, down to the window node):
/// follows `name` from the filter's input down to `window`'s output; `None` if it is computed.
fn window_below<'a>(plan: &'a LogicalPlan, name: &str) -> Option<(&'a LogicalPlan, String)> {
    match plan {
        LogicalPlan::Window(_) => Some((plan, name.to_string())),
        LogicalPlan::SubqueryAlias(a) => window_below(&a.input, name),
        LogicalPlan::Projection(p) => {
            let i = p.schema.fields().iter().position(|f| f.name() == name)?;
            let inner = match &p.expr[i] {
                Expr::Alias(a) => match a.expr.as_ref() {
                    Expr::Column(c) => c.name.clone(),
                    _ => return None,
                },
                Expr::Column(c) => c.name.clone(),
                _ => return None,
            };
            window_below(&p.input, &inner)
        }
        _ => None,
    }
}

/// The row number of `window`'s expression at `column`: its partition and order.
fn row_number(window: &LogicalPlan, column: &str) -> Option<(Vec<Expr>, Vec<Sort>)> {
    let LogicalPlan::Window(w) = window else {
        return None;
    };
    let i = w.schema.fields().iter().position(|f| f.name() == column)?;
    let ninput = w.input.schema().fields().len();
    let expr = w.window_expr.get(i.checked_sub(ninput)?)?;
    let expr = match expr {
        Expr::Alias(a) => a.expr.as_ref(),
        e => e,
    };
    let Expr::WindowFunction(f) = expr else {
        return None;
    };
    let WindowFunction {
        fun,
        params:
            WindowFunctionParams {
                partition_by,
                order_by,
                ..
            },
    } = f.as_ref();
    let is_row_number =
        matches!(fun, WindowFunctionDefinition::WindowUDF(u) if u.name() == "row_number");
    (is_row_number && w.window_expr.len() == 1 && !order_by.is_empty())
        .then(|| (partition_by.clone(), order_by.clone()))
}

/// Replaces each `row_number() OVER (PARTITION BY ... ORDER BY ...)` over a stream that a
/// filter bounds (`rn <= N`) with a [`TopNNode`]. Any other window function over a stream is
/// left for the streaming checks to refuse.
pub fn rewrite_top_n(plan: LogicalPlan) -> std::result::Result<LogicalPlan, ClassifiedError> {
    let mut problem = None;
    let rewritten = plan
        .transform_down(|node| {
            let LogicalPlan::Filter(filter) = &node else {
                return Ok(Transformed::no(node));
            };
            if !is_streaming(&filter.input) {
                return Ok(Transformed::no(node));
            }
            for c in conjuncts(&filter.predicate) {
                let columns = c.column_refs();
                let [rn] = columns.into_iter().collect::<Vec<_>>()[..] else {
                    continue;
                };
                let Some(n) = bound(c, &rn.name) else {
                    continue;
                };
                let Some((window, column)) = window_below(&filter.input, &rn.name) else {
                    continue;
                };
                let Some((partition_by, order_by)) = row_number(window, &column) else {
                    continue;
                };
                if n == 0 || n > MAX_TOP_N {
                    problem = Some(unsupported(format!(
                        "A top-N over a stream keeps from 1 to {MAX_TOP_N} rows per key; this \
                         one asks for {n}."
                    )));
                    return Ok(Transformed::new(node, false, TreeNodeRecursion::Stop));
                }
                let LogicalPlan::Window(w) = window else {
                    continue;
                };
                let top = LogicalPlan::Extension(Extension {
                    node: Arc::new(TopNNode {
                        input: w.input.as_ref().clone(),
                        partition_by,
                        order_by,
                        n,
                        schema: Arc::clone(&w.schema),
                    }),
                });
                let target = window.clone();
                let replaced = node.transform_down(|inner| {
                    if inner == target {
                        Ok(Transformed::new(top.clone(), true, TreeNodeRecursion::Jump))
                    } else {
                        Ok(Transformed::no(inner))
                    }
                })?;
                return Ok(Transformed::new(
                    replaced.data,
                    true,
                    TreeNodeRecursion::Jump,
                ));
            }
            Ok(Transformed::no(node))
        })
        .map_err(|e| ClassifiedError::new("INVALID_QUERY", "42000", e.to_string()))?;
    match problem {
        Some(p) => Err(p),
        None => Ok(rewritten.data),
    }
}
