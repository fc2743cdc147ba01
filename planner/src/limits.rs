//! Bounds on what one SQL statement may make the planner do. DataFusion plans expressions by
//! recursion (and some of its passes are quadratic in an expression's depth), so a sum of
//! 10,000 terms overflows the stack, and 3,000 take tens of seconds to plan: a statement whose
//! expressions nest deeper than [`MAX_EXPRESSION_DEPTH`] is refused before DataFusion plans it.
//!
//! ```text
//! SQL text ─► parse (sqlparser: a chain `a + a + ...` is a loop, not recursion)
//!          ─► depth check (a visit that stops at the limit)    on a thread with a large stack,
//!          ─► DataFusion planning                               where a refused tree is dropped
//! ```

use std::ops::ControlFlow;

use datafusion::execution::SessionState;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{Expr, Visit, Visitor};
use weir_common::ClassifiedError;

/// The deepest an expression of a statement may nest: operators, function calls and
/// subexpressions each count one level. A sum of this many terms plans in about a second.
pub const MAX_EXPRESSION_DEPTH: usize = 1000;

/// The stack of the thread that parses and checks a statement: deep enough to parse, visit up
/// to the limit and drop a refused tree of a statement of any length a file can hold.
const PARSE_STACK_BYTES: usize = 512 << 20;

/// Parses one statement of `sql` with the session's dialect and refuses it when an expression
/// nests deeper than [`MAX_EXPRESSION_DEPTH`].
pub fn parse_statement(state: &SessionState, sql: &str) -> datafusion::error::Result<DFStatement> {
    let dialect = state.config().options().sql_parser.dialect;
    std::thread::scope(|scope| {
        let parsed = std::thread::Builder::new()
            .name("weir-parse".into())
            .stack_size(PARSE_STACK_BYTES)
            .spawn_scoped(scope, || {
                let statement = state.sql_to_statement(sql, &dialect)?;
                check_expression_depth(&statement)
                    .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
                Ok(statement)
            })
            .map_err(|e| {
                datafusion::error::DataFusionError::Execution(format!(
                    "cannot start the SQL parser's thread: {e}"
                ))
            })?;
        parsed.join().unwrap_or_else(|_| {
            Err(datafusion::error::DataFusionError::Execution(
                "the SQL parser failed".into(),
            ))
        })
    })
}

/// Refuses `statement` when one of its expressions nests deeper than
/// [`MAX_EXPRESSION_DEPTH`]. The visit stops at the limit, so it never goes deeper itself.
pub fn check_expression_depth(statement: &DFStatement) -> Result<(), ClassifiedError> {
    let mut depth = Depth { now: 0 };
    let deep = match statement {
        DFStatement::Statement(s) => s.visit(&mut depth).is_break(),
        DFStatement::Explain(e) => match e.statement.as_ref() {
            DFStatement::Statement(s) => s.visit(&mut depth).is_break(),
            _ => false,
        },
        DFStatement::CopyTo(c) => match &c.source {
            datafusion::sql::parser::CopyToSource::Query(q) => q.visit(&mut depth).is_break(),
            datafusion::sql::parser::CopyToSource::Relation(_) => false,
        },
        _ => false,
    };
    if deep {
        return Err(ClassifiedError::new(
            "EXPRESSION_NESTING_TOO_DEEP",
            "54001",
            format!(
                "An expression of this statement nests deeper than {MAX_EXPRESSION_DEPTH} \
                 levels (a chain of operators such as a + b + c counts one level per operator). \
                 Split it: compute parts in a subquery or a view, or sum a column of values \
                 (SELECT sum(v) FROM ...) instead of writing every term."
            ),
        ));
    }
    Ok(())
}

struct Depth {
    now: usize,
}

impl Visitor for Depth {
    type Break = ();

    fn pre_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
        self.now += 1;
        if self.now > MAX_EXPRESSION_DEPTH {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    fn post_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
        self.now -= 1;
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    use super::*;

    fn sum_of(terms: usize) -> String {
        format!("SELECT {} AS s", vec!["1"; terms].join(" + "))
    }

    #[test]
    fn a_long_sum_is_refused_before_planning_and_a_wide_one_is_not() {
        let state = SessionContext::new().state();
        assert!(parse_statement(&state, &sum_of(MAX_EXPRESSION_DEPTH - 10)).is_ok());
        for terms in [MAX_EXPRESSION_DEPTH + 10, 10_000, 200_000] {
            let err = parse_statement(&state, &sum_of(terms)).unwrap_err();
            assert!(
                err.to_string().contains("EXPRESSION_NESTING_TOO_DEEP"),
                "{terms}: {err}"
            );
        }
        // Many values side by side are not deep.
        let wide = format!(
            "SELECT 1 WHERE 1 IN ({})",
            (0..20_000)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert!(parse_statement(&state, &wide).is_ok());
    }
}
