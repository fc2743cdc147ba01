//! The statements of a pipeline's SQL files, in Databricks' forms, and what a flow's query
//! reads.
//!
//! ```text
//! CREATE [OR REFRESH] STREAMING TABLE t [(columns)] [PARTITIONED BY (c, ...)] [... AS query]
//! CREATE [OR REFRESH] MATERIALIZED VIEW mv [(columns)] [PARTITIONED BY (...)] [COMMENT '..'] AS query
//! CREATE [OR REPLACE] TEMPORARY [LIVE] VIEW v [COMMENT '..'] AS query
//! CREATE FLOW f [COMMENT '..'] AS INSERT INTO [ONCE] t BY NAME query
//! anything else                     kept as a script statement (the pipeline refuses it)
//! ```
//!
//! Queries come out with weir's rewrites applied (`STREAM x` → `STREAM(x)`, watermark clauses),
//! ready for DataFusion. [`dataset_reads`] lists the names a query reads as tables, streamed
//! (`STREAM(name)`) or not: the pipeline's graph is built from them.

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, ObjectName, Query, TableFactor, Visit, Visitor,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;
use weir_common::ClassifiedError;

use crate::statement::{
    CreateStreamingTable, Statement, is_word, object_name, parenthesized, parse_tokens,
    rewrite_all, split_statements, syntax, text, tokenize,
};

/// `CREATE MATERIALIZED VIEW`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateMaterializedView {
    /// The view's name.
    pub name: String,
    /// The column list after the name, as written.
    pub columns: Option<String>,
    /// `PARTITIONED BY (...)`.
    pub partitioned_by: Vec<String>,
    /// The batch query it holds the result of.
    pub query: String,
    /// The earlier table versions it reads.
    pub time_travel: Vec<TimeTravel>,
}

/// `CREATE TEMPORARY VIEW`: a named query, not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateTemporaryView {
    /// The view's name.
    pub name: String,
    /// Its query (streaming or not).
    pub query: String,
}

/// `CREATE FLOW f AS INSERT INTO [ONCE] t BY NAME query`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateFlow {
    /// The flow's name: its checkpoint's folder.
    pub name: String,
    /// The streaming table it writes.
    pub target: String,
    /// A once flow: one batch, the first time (and after a full refresh).
    pub once: bool,
    /// The rows it inserts.
    pub query: String,
    /// The earlier table versions it reads (a once flow's backfill).
    pub time_travel: Vec<TimeTravel>,
}

/// Where a table is read as of (Delta's time travel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AsOf {
    /// `VERSION AS OF n`.
    Version(i64),
    /// `TIMESTAMP AS OF 'time'`, as written.
    Timestamp(String),
}

/// `table VERSION AS OF n` / `table TIMESTAMP AS OF 'time'` in a query, which reads `alias`
/// instead: the pipeline registers the alias as that version of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeTravel {
    /// The name the query reads now.
    pub alias: String,
    /// The table as written.
    pub table: String,
    /// Which version.
    pub as_of: AsOf,
}

/// Rewrites every `name VERSION AS OF n` and `name TIMESTAMP AS OF 'time'` in `tokens` to a
/// name of its own, listed with the version it stands for.
fn rewrite_time_travel(
    tokens: Vec<Token>,
) -> Result<(Vec<Token>, Vec<TimeTravel>), ClassifiedError> {
    let sig: Vec<usize> = (0..tokens.len())
        .filter(|&i| !matches!(tokens[i], Token::Whitespace(_)))
        .collect();
    let at = |k: usize| sig.get(k).map(|&i| &tokens[i]);
    let word = |k: usize, w: &str| at(k).is_some_and(|t| is_word(t, w));
    let mut edits = vec![];
    let mut travels: Vec<TimeTravel> = vec![];
    for k in 1..sig.len() {
        let kind = if word(k, "version") {
            "version"
        } else if word(k, "timestamp") {
            "timestamp"
        } else {
            continue;
        };
        if !(word(k + 1, "as") && word(k + 2, "of")) {
            continue;
        }
        // The table name before: words joined by periods.
        let mut first = k - 1;
        if !matches!(at(first), Some(Token::Word(_))) {
            continue;
        }
        while first >= 2
            && at(first - 1) == Some(&Token::Period)
            && matches!(at(first - 2), Some(Token::Word(_)))
        {
            first -= 2;
        }
        let table = text(&tokens[sig[first]..=sig[k - 1]]);
        let as_of = match (kind, at(k + 3)) {
            ("version", Some(Token::Number(n, _))) => AsOf::Version(n.parse().map_err(|_| {
                syntax(format!(
                    "VERSION AS OF needs a whole version number, not {n}."
                ))
            })?),
            ("timestamp", Some(Token::SingleQuotedString(t))) => AsOf::Timestamp(t.clone()),
            _ => {
                return Err(syntax(format!(
                    "{table} {} AS OF needs {}.",
                    kind.to_ascii_uppercase(),
                    if kind == "version" {
                        "a version number: VERSION AS OF 3"
                    } else {
                        "a quoted time: TIMESTAMP AS OF '2026-12-01 00:00:00'"
                    }
                )));
            }
        };
        let alias = format!(
            "__weir_{}_as_of_{}",
            table.replace('.', "_").to_ascii_lowercase(),
            travels.len()
        );
        edits.push((sig[first], sig[k + 3], alias.clone()));
        travels.push(TimeTravel {
            alias,
            table,
            as_of,
        });
    }
    let mut out = tokens;
    for (start, end, alias) in edits.into_iter().rev() {
        out.splice(start..=end, [Token::make_word(&alias, None)]);
    }
    Ok((out, travels))
}

/// Which columns an AUTO CDC clause names: `COLUMNS`, `TRACK HISTORY ON`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnSelection {
    /// Every column (the clause was left out, or `*`).
    All,
    /// Only these.
    Only(Vec<String>),
    /// Every column but these (`* EXCEPT (...)`).
    AllExcept(Vec<String>),
}

/// `CREATE FLOW f AS AUTO CDC [ONCE] INTO t FROM source KEYS (...) ... SEQUENCE BY col ...`
/// (Databricks' form; the rules it follows are in `../shared/reference/auto-cdc.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateAutoCdcFlow {
    /// The flow's name.
    pub name: String,
    /// The streaming table it keeps up to date.
    pub target: String,
    /// A once flow (an initial snapshot): one batch, the first time.
    pub once: bool,
    /// The relation the changes come from, as written after FROM (`STREAM(src)` for a
    /// stream).
    pub source: String,
    /// The key columns.
    pub keys: Vec<String>,
    /// `IGNORE NULL UPDATES`.
    pub ignore_null_updates: bool,
    /// `APPLY AS DELETE WHEN condition`.
    pub delete_when: Option<String>,
    /// `APPLY AS TRUNCATE WHEN condition` (SCD type 1 only).
    pub truncate_when: Option<String>,
    /// `SEQUENCE BY expression`: the order of the changes.
    pub sequence_by: String,
    /// `COLUMNS ...`: the target's columns.
    pub columns: ColumnSelection,
    /// `STORED AS SCD TYPE 1 | 2` (1 when left out).
    pub scd_type: u8,
    /// `TRACK HISTORY ON ...` (SCD type 2): the columns whose change opens a new version.
    pub track_history: ColumnSelection,
}

const AUTO_CDC_CLAUSES: [&str; 7] = [
    "keys", "ignore", "apply", "sequence", "columns", "stored", "track",
];

fn invalid_auto_cdc(message: String) -> ClassifiedError {
    ClassifiedError::new("INVALID_AUTO_CDC_FLOW", "42K06", message)
}

/// Parses the part of `CREATE FLOW name AS AUTO CDC` from significant token `k` (just after
/// `CDC`) on; with `into` (DBSQL's `CREATE STREAMING TABLE t FLOW AUTO CDC FROM ...`), the
/// target is given and the part starts at FROM.
pub(crate) fn parse_auto_cdc(
    tokens: &[Token],
    sig: &[usize],
    mut k: usize,
    name: String,
    into: Option<String>,
) -> Result<CreateAutoCdcFlow, ClassifiedError> {
    let at = |k: usize| sig.get(k).map(|&i| &tokens[i]);
    let word = |k: usize, w: &str| at(k).is_some_and(|t| is_word(t, w));
    let form = |what: &str| {
        syntax(format!(
            "CREATE FLOW {name} AS AUTO CDC: {what}. The form is AUTO CDC [ONCE] INTO table FROM \
             source KEYS (k, ...) [IGNORE NULL UPDATES] [APPLY AS DELETE WHEN cond] [APPLY AS \
             TRUNCATE WHEN cond] SEQUENCE BY col [COLUMNS (a, b) | COLUMNS * EXCEPT (a, b)] \
             [STORED AS SCD TYPE 1 | 2] [TRACK HISTORY ON (a, b) | TRACK HISTORY ON * EXCEPT \
             (a, b)]"
        ))
    };
    let once = into.is_none() && word(k, "once");
    if once {
        k += 1;
    }
    let target = match into {
        Some(t) => t,
        None => {
            if !word(k, "into") {
                return Err(form("INTO table is missing"));
            }
            let (target, next) = object_name(tokens, sig, k + 1)?;
            k = next;
            target
        }
    };
    if !word(k, "from") {
        return Err(form("FROM source is missing"));
    }
    k += 1;
    // Where the clause at `k` ends: the next clause keyword outside parentheses.
    let clause_end = |mut k: usize| -> usize {
        let mut depth = 0i32;
        while let Some(t) = at(k) {
            match t {
                Token::LParen => depth += 1,
                Token::RParen => depth -= 1,
                Token::Word(_) if depth == 0 && AUTO_CDC_CLAUSES.iter().any(|c| is_word(t, c)) => {
                    return k;
                }
                _ => {}
            }
            k += 1;
        }
        k
    };
    let span = |from: usize, to: usize| -> String {
        if from >= to {
            return String::new();
        }
        text(&tokens[sig[from]..=sig[to - 1]])
    };
    let end = clause_end(k);
    let source = span(k, end);
    if source.is_empty() {
        return Err(form("FROM names no source"));
    }
    k = end;
    let list = |k: usize| -> Result<(Vec<String>, usize), ClassifiedError> {
        let (inner, next) = parenthesized(tokens, sig, k)?;
        let names: Vec<String> = inner
            .split(',')
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect();
        Ok((names, next))
    };
    let selection = |k: usize| -> Result<(ColumnSelection, usize), ClassifiedError> {
        if at(k) == Some(&Token::Mul) {
            if word(k + 1, "except") {
                let (names, next) = list(k + 2)?;
                return Ok((ColumnSelection::AllExcept(names), next));
            }
            return Ok((ColumnSelection::All, k + 1));
        }
        let (names, next) = list(k)?;
        Ok((ColumnSelection::Only(names), next))
    };
    let mut keys = None;
    let mut ignore_null_updates = false;
    let mut delete_when = None;
    let mut truncate_when = None;
    let mut sequence_by = None;
    let mut columns = ColumnSelection::All;
    let mut scd_type = 1;
    let mut track_history = None;
    while at(k).is_some() {
        if word(k, "keys") {
            let (names, next) = list(k + 1)?;
            if names.is_empty() {
                return Err(form("KEYS names no column"));
            }
            keys = Some(names);
            k = next;
        } else if word(k, "ignore") && word(k + 1, "null") && word(k + 2, "updates") {
            ignore_null_updates = true;
            k += 3;
        } else if word(k, "apply") && word(k + 1, "as") && word(k + 3, "when") {
            let end = clause_end(k + 4);
            let condition = span(k + 4, end);
            if condition.is_empty() {
                return Err(form("APPLY AS ... WHEN needs a condition"));
            }
            if word(k + 2, "delete") {
                delete_when = Some(condition);
            } else if word(k + 2, "truncate") {
                truncate_when = Some(condition);
            } else {
                return Err(form("APPLY AS takes DELETE or TRUNCATE"));
            }
            k = end;
        } else if word(k, "sequence") && word(k + 1, "by") {
            let end = clause_end(k + 2);
            let by = span(k + 2, end);
            if by.is_empty() {
                return Err(form("SEQUENCE BY needs a column"));
            }
            sequence_by = Some(by);
            k = end;
        } else if word(k, "columns") {
            let (s, next) = selection(k + 1)?;
            columns = s;
            k = next;
        } else if word(k, "stored")
            && word(k + 1, "as")
            && word(k + 2, "scd")
            && word(k + 3, "type")
        {
            scd_type = match at(k + 4) {
                Some(Token::Number(n, _)) if n == "1" => 1,
                Some(Token::Number(n, _)) if n == "2" => 2,
                _ => return Err(form("STORED AS SCD TYPE takes 1 or 2")),
            };
            k += 5;
        } else if word(k, "track") && word(k + 1, "history") && word(k + 2, "on") {
            let (s, next) = selection(k + 3)?;
            track_history = Some(s);
            k = next;
        } else {
            return Err(form(&format!(
                "unexpected '{}'",
                at(k).map(ToString::to_string).unwrap_or_default()
            )));
        }
    }
    let keys = keys.ok_or_else(|| form("KEYS (...) is missing"))?;
    let sequence_by = sequence_by.ok_or_else(|| form("SEQUENCE BY is missing"))?;
    if scd_type == 2 && truncate_when.is_some() {
        return Err(invalid_auto_cdc(format!(
            "Flow '{name}': APPLY AS TRUNCATE is supported only for SCD type 1; an SCD type 2 \
             table keeps its history. Remove the clause or store the table as SCD TYPE 1."
        )));
    }
    if scd_type == 1 && track_history.is_some() {
        return Err(invalid_auto_cdc(format!(
            "Flow '{name}': TRACK HISTORY ON applies to SCD type 2 (an SCD type 1 table keeps \
             no history). Add STORED AS SCD TYPE 2 or remove the clause."
        )));
    }
    Ok(CreateAutoCdcFlow {
        name,
        target,
        once,
        source,
        keys,
        ignore_null_updates,
        delete_when,
        truncate_when,
        sequence_by,
        columns,
        scd_type,
        track_history: track_history.unwrap_or(ColumnSelection::All),
    })
}

/// One statement of a pipeline's SQL file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PipelineStatement {
    /// `CREATE STREAMING TABLE`.
    StreamingTable(CreateStreamingTable),
    /// `CREATE MATERIALIZED VIEW`.
    MaterializedView(CreateMaterializedView),
    /// `CREATE TEMPORARY VIEW`.
    TemporaryView(CreateTemporaryView),
    /// `CREATE FLOW`.
    Flow(CreateFlow),
    /// `CREATE FLOW ... AS AUTO CDC`.
    AutoCdcFlow(CreateAutoCdcFlow),
    /// Anything else.
    Other(Statement),
}

/// Splits a pipeline file's `script` into statements and parses each.
pub fn parse_pipeline_script(script: &str) -> Result<Vec<PipelineStatement>, ClassifiedError> {
    split_statements(tokenize(script)?)
        .into_iter()
        .map(parse_one)
        .collect()
}

fn parse_one(tokens: Vec<Token>) -> Result<PipelineStatement, ClassifiedError> {
    let tokens = rewrite_all(tokens)?;
    let (tokens, time_travel) = rewrite_time_travel(tokens)?;
    let sig: Vec<usize> = (0..tokens.len())
        .filter(|&i| !matches!(tokens[i], Token::Whitespace(_)))
        .collect();
    let at = |k: usize| sig.get(k).map(|&i| &tokens[i]);
    let word = |k: usize, w: &str| at(k).is_some_and(|t| is_word(t, w));
    if !word(0, "create") {
        return Ok(PipelineStatement::Other(parse_tokens(tokens)?));
    }
    let mut k = 1;
    if word(k, "or") && (word(k + 1, "refresh") || word(k + 1, "replace")) {
        k += 2;
    }
    // The query after the first top-level AS from significant token `k` on.
    let query_after = |mut k: usize, what: &str| -> Result<String, ClassifiedError> {
        while let Some(t) = at(k) {
            if is_word(t, "as") {
                let start = sig.get(k + 1).copied().unwrap_or(tokens.len());
                let q = text(&tokens[start..]);
                if q.is_empty() {
                    break;
                }
                return Ok(q);
            }
            if *t == Token::LParen {
                k = parenthesized(&tokens, &sig, k)?.1;
            } else {
                k += 1;
            }
        }
        Err(syntax(format!("{what} needs AS and a query.")))
    };
    if word(k, "materialized") && word(k + 1, "view") {
        let (name, mut k) = object_name(&tokens, &sig, k + 2)?;
        let mut columns = None;
        if at(k) == Some(&Token::LParen) {
            let (inner, next) = parenthesized(&tokens, &sig, k)?;
            columns = Some(inner);
            k = next;
        }
        let mut partitioned_by = vec![];
        if word(k, "partitioned") && word(k + 1, "by") {
            let (inner, next) = parenthesized(&tokens, &sig, k + 2)?;
            partitioned_by = inner.split(',').map(|c| c.trim().to_string()).collect();
            k = next;
        }
        let query = query_after(k, &format!("CREATE MATERIALIZED VIEW {name}"))?;
        return Ok(PipelineStatement::MaterializedView(
            CreateMaterializedView {
                name,
                columns,
                partitioned_by,
                query,
                time_travel,
            },
        ));
    }
    if word(k, "temporary") {
        let mut v = k + 1;
        if word(v, "live") {
            v += 1;
        }
        if word(v, "view") {
            let (name, next) = object_name(&tokens, &sig, v + 1)?;
            let query = query_after(next, &format!("CREATE TEMPORARY VIEW {name}"))?;
            return Ok(PipelineStatement::TemporaryView(CreateTemporaryView {
                name,
                query,
            }));
        }
    }
    if k == 1 && word(1, "flow") {
        let (name, mut k) = object_name(&tokens, &sig, 2)?;
        if word(k, "comment") {
            k += 2;
        }
        let form = || {
            syntax(format!(
                "CREATE FLOW {name} reads CREATE FLOW {name} AS INSERT INTO [ONCE] table BY NAME \
                 query."
            ))
        };
        if word(k, "as") && word(k + 1, "auto") && word(k + 2, "cdc") {
            return Ok(PipelineStatement::AutoCdcFlow(parse_auto_cdc(
                &tokens,
                &sig,
                k + 3,
                name,
                None,
            )?));
        }
        if !(word(k, "as") && word(k + 1, "insert") && word(k + 2, "into")) {
            return Err(form());
        }
        k += 3;
        let once = word(k, "once");
        if once {
            k += 1;
        }
        let (target, k) = object_name(&tokens, &sig, k)?;
        if !(word(k, "by") && word(k + 1, "name")) {
            return Err(syntax(format!(
                "CREATE FLOW {name}: the INSERT INTO {target} must say BY NAME (the query's \
                 columns go to the table's columns of the same name)."
            )));
        }
        let start = sig.get(k + 2).copied().unwrap_or(tokens.len());
        let query = text(&tokens[start..]);
        if query.is_empty() {
            return Err(form());
        }
        return Ok(PipelineStatement::Flow(CreateFlow {
            name,
            target,
            once,
            query,
            time_travel,
        }));
    }
    if let Some(t) = time_travel.first() {
        return Err(syntax(format!(
            "{} {}: only a once flow or a materialized view reads a table as of an earlier \
             version (a backfill); a streaming table's query reads the stream.",
            t.table,
            match &t.as_of {
                AsOf::Version(v) => format!("VERSION AS OF {v}"),
                AsOf::Timestamp(ts) => format!("TIMESTAMP AS OF '{ts}'"),
            }
        )));
    }
    Ok(match parse_tokens(tokens)? {
        Statement::CreateStreamingTable(t) => PipelineStatement::StreamingTable(t),
        other => PipelineStatement::Other(other),
    })
}

/// A table a query reads, by name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Read {
    /// The name as written (dotted parts joined by '.').
    pub name: String,
    /// Read as a stream (`STREAM name`), or as a table.
    pub streaming: bool,
}

/// The tables `query` (with weir's rewrites applied) reads by name: `FROM t`, `JOIN t`,
/// `STREAM(t)`; not sources (`STREAM rate(...)`) and not the query's own CTEs.
pub fn dataset_reads(query: &str) -> Result<Vec<Read>, ClassifiedError> {
    let statements = Parser::parse_sql(&GenericDialect {}, query)
        .map_err(|e| syntax(format!("Syntax error: {e}.")))?;
    let mut reads = Reads::default();
    for s in &statements {
        let _ = s.visit(&mut reads);
    }
    let Reads { found, ctes } = reads;
    Ok(found
        .into_iter()
        .filter(|r| !ctes.contains(&r.name.to_ascii_lowercase()))
        .collect())
}

#[derive(Default)]
struct Reads {
    found: BTreeSet<Read>,
    ctes: BTreeSet<String>,
}

fn name_of(name: &ObjectName) -> String {
    name.0
        .iter()
        .map(|p| p.to_string().trim_matches('"').to_string())
        .collect::<Vec<_>>()
        .join(".")
}

impl Visitor for Reads {
    type Break = ();

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        if let Some(with) = &query.with {
            for cte in &with.cte_tables {
                self.ctes.insert(cte.alias.name.value.to_ascii_lowercase());
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<()> {
        let TableFactor::Table { name, args, .. } = factor else {
            return ControlFlow::Continue(());
        };
        match args {
            None => {
                self.found.insert(Read {
                    name: name_of(name),
                    streaming: false,
                });
            }
            Some(args) if name_of(name).eq_ignore_ascii_case("stream") => {
                let streamed = args.args.first().and_then(|a| match a {
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Identifier(i))) => {
                        Some(i.value.clone())
                    }
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::CompoundIdentifier(
                        parts,
                    ))) => Some(
                        parts
                            .iter()
                            .map(|p| p.value.clone())
                            .collect::<Vec<_>>()
                            .join("."),
                    ),
                    _ => None,
                });
                if let Some(name) = streamed {
                    self.found.insert(Read {
                        name,
                        streaming: true,
                    });
                }
            }
            // A table function (a source): not a dataset.
            Some(_) => {}
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(sql: &str) -> PipelineStatement {
        let mut all = parse_pipeline_script(sql).unwrap();
        assert_eq!(all.len(), 1, "{sql}");
        all.remove(0)
    }

    #[test]
    fn each_dataset_and_flow_form_is_read() {
        let PipelineStatement::StreamingTable(t) = one(
            "CREATE OR REFRESH STREAMING TABLE customers (id BIGINT, name STRING) \
             PARTITIONED BY (region, day)",
        ) else {
            panic!("a streaming table")
        };
        assert_eq!(t.name, "customers");
        assert_eq!(t.columns.as_deref(), Some("id BIGINT, name STRING"));
        assert_eq!(t.partitioned_by, ["region", "day"]);
        assert!(t.query.is_none());

        let PipelineStatement::MaterializedView(mv) = one(
            "CREATE MATERIALIZED VIEW totals COMMENT 'per region' AS SELECT region, count(*) AS n \
             FROM customers GROUP BY region",
        ) else {
            panic!("a materialized view")
        };
        assert_eq!(mv.name, "totals");
        assert!(mv.query.starts_with("SELECT region"), "{}", mv.query);

        let PipelineStatement::TemporaryView(v) =
            one("CREATE TEMPORARY LIVE VIEW recent AS SELECT * FROM STREAM raw WHERE x > 1")
        else {
            panic!("a temporary view")
        };
        assert_eq!(v.name, "recent");
        assert_eq!(v.query, "SELECT * FROM STREAM(raw) WHERE x > 1");

        let PipelineStatement::Flow(f) =
            one("CREATE FLOW us AS INSERT INTO all_orders BY NAME SELECT * FROM STREAM orders_us")
        else {
            panic!("a flow")
        };
        assert_eq!(
            (f.name.as_str(), f.target.as_str(), f.once),
            ("us", "all_orders", false)
        );
        assert_eq!(f.query, "SELECT * FROM STREAM(orders_us)");
        let PipelineStatement::Flow(f) = one(
            "CREATE FLOW backfill COMMENT 'old rows' AS INSERT INTO ONCE all_orders BY NAME \
             SELECT * FROM archive",
        ) else {
            panic!("a once flow")
        };
        assert!(f.once);
        assert!(matches!(
            one("SET spark.sql.shuffle.partitions = 4"),
            PipelineStatement::Other(_)
        ));
    }

    #[test]
    fn a_backfill_reads_earlier_versions_under_names_of_their_own() {
        let PipelineStatement::Flow(f) = one(
            "CREATE FLOW backfill AS INSERT INTO ONCE customers BY NAME \
             SELECT * FROM customers VERSION AS OF 3 \
             UNION ALL SELECT * FROM sales.old TIMESTAMP AS OF '2026-12-01 10:00:00'",
        ) else {
            panic!("a once flow")
        };
        assert_eq!(
            f.query,
            "SELECT * FROM __weir_customers_as_of_0 \
             UNION ALL SELECT * FROM __weir_sales_old_as_of_1"
        );
        assert_eq!(
            f.time_travel,
            [
                TimeTravel {
                    alias: "__weir_customers_as_of_0".into(),
                    table: "customers".into(),
                    as_of: AsOf::Version(3)
                },
                TimeTravel {
                    alias: "__weir_sales_old_as_of_1".into(),
                    table: "sales.old".into(),
                    as_of: AsOf::Timestamp("2026-12-01 10:00:00".into())
                },
            ]
        );
        for sql in [
            "CREATE FLOW f AS INSERT INTO ONCE t BY NAME SELECT * FROM t VERSION AS OF 'x'",
            "CREATE STREAMING TABLE s AS SELECT * FROM t VERSION AS OF 2",
        ] {
            assert_eq!(
                parse_pipeline_script(sql).unwrap_err().class,
                "PARSE_SYNTAX_ERROR",
                "{sql}"
            );
        }
    }

    #[test]
    fn an_auto_cdc_flow_is_read_clause_by_clause() {
        let PipelineStatement::AutoCdcFlow(f) = one(
            "CREATE FLOW customers_incremental_flow AS AUTO CDC INTO customers \
             FROM STREAM customers_cdc_clean KEYS (customer_id) \
             APPLY AS DELETE WHEN operation = 'DELETE' \
             APPLY AS TRUNCATE WHEN operation = 'TRUNCATE' \
             SEQUENCE BY sequenceNum COLUMNS * EXCEPT (operation, sequenceNum) \
             STORED AS SCD TYPE 1",
        ) else {
            panic!("an AUTO CDC flow")
        };
        assert_eq!(
            f,
            CreateAutoCdcFlow {
                name: "customers_incremental_flow".into(),
                target: "customers".into(),
                once: false,
                source: "STREAM(customers_cdc_clean)".into(),
                keys: vec!["customer_id".into()],
                ignore_null_updates: false,
                delete_when: Some("operation = 'DELETE'".into()),
                truncate_when: Some("operation = 'TRUNCATE'".into()),
                sequence_by: "sequenceNum".into(),
                columns: ColumnSelection::AllExcept(vec!["operation".into(), "sequenceNum".into()]),
                scd_type: 1,
                track_history: ColumnSelection::All,
            }
        );
        let PipelineStatement::AutoCdcFlow(f) = one(
            "CREATE FLOW snapshot AS AUTO CDC ONCE INTO customers FROM customers_snapshot \
             KEYS (id, region) IGNORE NULL UPDATES SEQUENCE BY 0 COLUMNS (id, region, name) \
             STORED AS SCD TYPE 2 TRACK HISTORY ON * EXCEPT (name)",
        ) else {
            panic!("an AUTO CDC once flow")
        };
        assert!(f.once && f.ignore_null_updates);
        assert_eq!(f.keys, ["id", "region"]);
        assert_eq!((f.sequence_by.as_str(), f.scd_type), ("0", 2));
        assert_eq!(
            f.columns,
            ColumnSelection::Only(vec!["id".into(), "region".into(), "name".into()])
        );
        assert_eq!(
            f.track_history,
            ColumnSelection::AllExcept(vec!["name".into()])
        );

        for (sql, class) in [
            (
                "CREATE FLOW f AS AUTO CDC INTO t FROM STREAM s SEQUENCE BY v",
                "PARSE_SYNTAX_ERROR",
            ),
            (
                "CREATE FLOW f AS AUTO CDC INTO t FROM STREAM s KEYS (k)",
                "PARSE_SYNTAX_ERROR",
            ),
            (
                "CREATE FLOW f AS AUTO CDC INTO t FROM STREAM s KEYS (k) SEQUENCE BY v \
                 STORED AS SCD TYPE 3",
                "PARSE_SYNTAX_ERROR",
            ),
            (
                "CREATE FLOW f AS AUTO CDC INTO t FROM STREAM s KEYS (k) \
                 APPLY AS TRUNCATE WHEN op = 'T' SEQUENCE BY v STORED AS SCD TYPE 2",
                "INVALID_AUTO_CDC_FLOW",
            ),
            (
                "CREATE FLOW f AS AUTO CDC INTO t FROM STREAM s KEYS (k) SEQUENCE BY v \
                 TRACK HISTORY ON (a)",
                "INVALID_AUTO_CDC_FLOW",
            ),
        ] {
            assert_eq!(
                parse_pipeline_script(sql).unwrap_err().class,
                class,
                "{sql}"
            );
        }
    }

    #[test]
    fn malformed_flows_and_views_are_syntax_errors() {
        for sql in [
            "CREATE FLOW f AS INSERT INTO t SELECT 1",
            "CREATE FLOW f AS SELECT 1",
            "CREATE FLOW f AS INSERT INTO t BY NAME",
            "CREATE MATERIALIZED VIEW mv",
            "CREATE TEMPORARY VIEW v AS",
        ] {
            let e = parse_pipeline_script(sql).unwrap_err();
            assert_eq!(e.class, "PARSE_SYNTAX_ERROR", "{sql}");
        }
    }

    #[test]
    fn a_query_reads_tables_and_streams_but_not_sources_or_its_ctes() {
        let reads = dataset_reads(
            "WITH recent AS (SELECT * FROM STREAM(raw.events)) \
             SELECT * FROM recent JOIN dims d ON true \
             JOIN STREAM(rate(rowsPerSecond => 1)) r ON true \
             WHERE x IN (SELECT x FROM allowed)",
        )
        .unwrap();
        assert_eq!(
            reads,
            [
                Read {
                    name: "allowed".into(),
                    streaming: false
                },
                Read {
                    name: "dims".into(),
                    streaming: false
                },
                Read {
                    name: "raw.events".into(),
                    streaming: true
                },
            ]
        );
    }
}
