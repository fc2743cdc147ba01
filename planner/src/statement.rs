//! weir's statements on top of DataFusion's SQL dialect.
//!
//! A script is split into statements at top-level semicolons. Each statement is either
//! weir's own (`CREATE STREAMING TABLE`, `INSERT INTO` a streaming table) or plain DataFusion
//! SQL. Everywhere, `STREAM name` and `STREAM name(args)` in a FROM clause are rewritten to the
//! call form `STREAM(name(args))`, which DataFusion's parser accepts and
//! [`crate::StreamRelationPlanner`] plans.
//!
//! ```text
//! CREATE [OR REFRESH] STREAMING TABLE [IF NOT EXISTS] name
//!     [USING format] [LOCATION 'path'] [OPTIONS (key [=] value, ...)]
//!     [AS query]
//! INSERT INTO name query
//! ```

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use weir_common::{ClassifiedError, Options};

/// A `CREATE STREAMING TABLE` statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateStreamingTable {
    /// The table's name: the query name, and the memory sink's table name.
    pub name: String,
    /// `OR REFRESH` / `OR REPLACE` was given.
    pub or_refresh: bool,
    /// `IF NOT EXISTS` was given.
    pub if_not_exists: bool,
    /// `USING format`.
    pub format: Option<String>,
    /// `LOCATION 'path'`.
    pub location: Option<String>,
    /// `OPTIONS (...)`: sink options plus `checkpointLocation`, `trigger`, `outputMode`.
    pub options: Options,
    /// The query after `AS`, with `STREAM` already rewritten; `None` declares the table only.
    pub query: Option<String>,
    /// The column list after the name (`(id BIGINT, name STRING)`), as written; pipelines
    /// only.
    pub columns: Option<String>,
    /// `PARTITIONED BY (a, b)`; pipelines only.
    pub partitioned_by: Vec<String>,
    /// `FLOW AUTO CDC FROM ... KEYS ... SEQUENCE BY ...` (DBSQL's form) instead of `AS query`:
    /// the table is kept by AUTO CDC; its flow is named after it.
    pub auto_cdc: Option<Box<crate::pipeline::CreateAutoCdcFlow>>,
}

/// One statement of a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Statement {
    /// `CREATE STREAMING TABLE ...`.
    CreateStreamingTable(CreateStreamingTable),
    /// `INSERT INTO table query`: a streaming query if `table` is a streaming table, plain SQL
    /// (`sql`) otherwise.
    Insert {
        /// The target table.
        table: String,
        /// The query whose rows are inserted.
        query: String,
        /// The whole statement, for DataFusion when the target is not a streaming table.
        sql: String,
    },
    /// Anything else: DataFusion SQL.
    Sql(String),
}

pub(crate) fn syntax(message: impl Into<String>) -> ClassifiedError {
    ClassifiedError::new("PARSE_SYNTAX_ERROR", "42601", message)
}

pub(crate) fn tokenize(sql: &str) -> Result<Vec<Token>, ClassifiedError> {
    Tokenizer::new(&GenericDialect {}, sql)
        .tokenize()
        .map_err(|e| syntax(format!("Syntax error: {e}.")))
}

pub(crate) fn text(tokens: &[Token]) -> String {
    tokens
        .iter()
        .map(|t| t.to_string())
        .collect::<String>()
        .trim()
        .to_string()
}

pub(crate) fn is_ws(t: &Token) -> bool {
    matches!(t, Token::Whitespace(_))
}

pub(crate) fn is_word(t: &Token, w: &str) -> bool {
    matches!(t, Token::Word(word) if word.quote_style.is_none() && word.value.eq_ignore_ascii_case(w))
}

/// Splits `script` into statements and parses each.
pub fn parse_script(script: &str) -> Result<Vec<Statement>, ClassifiedError> {
    split_statements(tokenize(script)?)
        .into_iter()
        .map(parse_tokens)
        .collect()
}

/// `tokens` cut at top-level semicolons, empty statements left out.
pub(crate) fn split_statements(tokens: Vec<Token>) -> Vec<Vec<Token>> {
    let mut out = vec![];
    let mut depth = 0i32;
    let mut current: Vec<Token> = vec![];
    for t in tokens {
        match t {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            _ => {}
        }
        if t == Token::SemiColon && depth == 0 {
            if current.iter().any(|t| !is_ws(t)) {
                out.push(std::mem::take(&mut current));
            }
            current.clear();
        } else {
            current.push(t);
        }
    }
    if current.iter().any(|t| !is_ws(t)) {
        out.push(current);
    }
    out
}

/// Every rewrite weir makes to a statement's tokens before DataFusion parses it: `STREAM x`,
/// watermark clauses, `DISTINCT ON (...) WITHIN WATERMARK`.
pub(crate) fn rewrite_all(tokens: Vec<Token>) -> Result<Vec<Token>, ClassifiedError> {
    rewrite_watermarks(rewrite_tokens(rewrite_within_watermark(tokens)))
}

/// Parses one statement.
pub fn parse_statement(sql: &str) -> Result<Statement, ClassifiedError> {
    let mut all = parse_script(sql)?;
    match all.len() {
        1 => Ok(all.remove(0)),
        0 => Err(syntax("The SQL text holds no statement.")),
        n => Err(syntax(format!("Expected one statement, found {n}."))),
    }
}

/// Rewrites `STREAM x` / `STREAM x(args)` in FROM clauses to `STREAM(x)` / `STREAM(x(args))`,
/// and a Databricks watermark clause after it, `STREAM(x) WATERMARK col DELAY OF INTERVAL 10
/// SECONDS`, to `STREAM(x, watermark => 'col', delay => '10 SECONDS')`.
pub fn rewrite_stream_keyword(sql: &str) -> Result<String, ClassifiedError> {
    Ok(text(&rewrite_watermarks(rewrite_tokens(
        rewrite_within_watermark(tokenize(sql)?),
    ))?))
}

const INTERVAL_UNITS: &[&str] = &[
    "millisecond",
    "milliseconds",
    "second",
    "seconds",
    "minute",
    "minutes",
    "hour",
    "hours",
    "day",
    "days",
];

fn rewrite_watermarks(tokens: Vec<Token>) -> Result<Vec<Token>, ClassifiedError> {
    let sig: Vec<usize> = (0..tokens.len()).filter(|&i| !is_ws(&tokens[i])).collect();
    let mut out = tokens.clone();
    // Rewrites from the last clause backwards, so earlier indices stay valid.
    let mut edits = vec![];
    for (k, &i) in sig.iter().enumerate() {
        if !is_word(&tokens[i], "stream")
            || sig.get(k + 1).map(|&j| &tokens[j]) != Some(&Token::LParen)
        {
            continue;
        }
        // The STREAM( ... ) call's closing parenthesis.
        let mut depth = 0;
        let mut close = None;
        for (m, &j) in sig.iter().enumerate().skip(k + 1) {
            match tokens[j] {
                Token::LParen => depth += 1,
                Token::RParen => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(m);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(close) = close else { continue };
        let at = |m: usize| sig.get(m).map(|&j| &tokens[j]);
        if !at(close + 1).is_some_and(|t| is_word(t, "watermark")) {
            continue;
        }
        let bad = || {
            syntax(
                "A watermark clause reads WATERMARK column DELAY OF INTERVAL 10 SECONDS (or \
                 INTERVAL '10 seconds').",
            )
        };
        let column = match at(close + 2) {
            Some(Token::Word(w)) => w.value.clone(),
            _ => return Err(bad()),
        };
        if !(at(close + 3).is_some_and(|t| is_word(t, "delay"))
            && at(close + 4).is_some_and(|t| is_word(t, "of")))
        {
            return Err(bad());
        }
        let mut m = close + 5;
        if at(m).is_some_and(|t| is_word(t, "interval")) {
            m += 1;
        }
        let mut delay = match at(m) {
            Some(Token::SingleQuotedString(s)) => s.clone(),
            Some(Token::Number(n, _)) => n.clone(),
            _ => return Err(bad()),
        };
        if let Some(Token::Word(w)) = at(m + 1)
            && INTERVAL_UNITS
                .iter()
                .any(|u| w.value.eq_ignore_ascii_case(u))
        {
            delay = format!("{delay} {}", w.value);
            m += 1;
        }
        edits.push((sig[close], sig[m], column, delay));
    }
    for (close, last, column, delay) in edits.into_iter().rev() {
        let insert = vec![
            Token::Comma,
            Token::make_word("watermark", None),
            Token::RArrow,
            Token::SingleQuotedString(column),
            Token::Comma,
            Token::make_word("delay", None),
            Token::RArrow,
            Token::SingleQuotedString(delay),
            Token::RParen,
        ];
        out.splice(close..=last, insert);
    }
    Ok(out)
}

const CLAUSES: &[&str] = &[
    "select",
    "where",
    "group",
    "having",
    "order",
    "limit",
    "on",
    "union",
    "window",
    "qualify",
    "set",
    "values",
    "using",
    "except",
    "intersect",
];

fn rewrite_tokens(tokens: Vec<Token>) -> Vec<Token> {
    let sig: Vec<usize> = (0..tokens.len()).filter(|&i| !is_ws(&tokens[i])).collect();
    let mut in_from = false;
    let mut out: Vec<Token> = Vec::with_capacity(tokens.len() + 4);
    let mut skip_until = 0usize;
    for (k, &i) in sig.iter().enumerate() {
        // Copy whitespace between the previous significant token and this one.
        let prev_end = if k == 0 { 0 } else { sig[k - 1] + 1 };
        if i >= skip_until {
            out.extend(tokens[prev_end..i].iter().cloned());
        }
        let t = &tokens[i];
        if i < skip_until {
            continue;
        }
        if is_word(t, "from") || is_word(t, "join") {
            in_from = true;
        } else if CLAUSES.iter().any(|c| is_word(t, c)) {
            in_from = false;
        }
        let after_from = k > 0 && {
            let p = &tokens[sig[k - 1]];
            is_word(p, "from") || is_word(p, "join") || (*p == Token::Comma && in_from)
        };
        let next = sig.get(k + 1).map(|&j| &tokens[j]);
        let next_is_name = matches!(next, Some(Token::Word(w))
            if w.keyword == Keyword::NoKeyword || !CLAUSES.iter().any(|c| w.value.eq_ignore_ascii_case(c)));
        if is_word(t, "stream") && after_from && next_is_name {
            // STREAM name [ '(' ... ')' ]  ->  STREAM( name [ '(' ... ')' ] )
            out.push(t.clone());
            out.push(Token::LParen);
            let name_k = k + 1;
            let mut last = sig[name_k];
            // Dotted names.
            let mut j = name_k;
            while sig.get(j + 2).is_some() && tokens[sig[j + 1]] == Token::Period {
                j += 2;
                last = sig[j];
            }
            if let Some(&open) = sig.get(j + 1)
                && tokens[open] == Token::LParen
            {
                let mut depth = 0;
                for (idx, tok) in tokens.iter().enumerate().skip(open) {
                    match tok {
                        Token::LParen => depth += 1,
                        Token::RParen => {
                            depth -= 1;
                            if depth == 0 {
                                last = idx;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
            }
            out.extend(tokens[sig[name_k]..=last].iter().cloned());
            out.push(Token::RParen);
            skip_until = last + 1;
            continue;
        }
        out.push(t.clone());
    }
    if let Some(&last) = sig.last()
        && last + 1 >= skip_until
    {
        out.extend(tokens[last + 1..].iter().cloned());
    }
    out
}

/// Rewrites `DISTINCT ON (k1, k2) WITHIN WATERMARK` (weir's SQL for Spark's
/// `dropDuplicatesWithinWatermark`) to `DISTINCT ON (k1, k2, '<marker>')`, which
/// [`crate::dedupe::rewrite_distinct_on`] turns into a deduplication within the watermark.
fn rewrite_within_watermark(tokens: Vec<Token>) -> Vec<Token> {
    let sig: Vec<usize> = (0..tokens.len()).filter(|&i| !is_ws(&tokens[i])).collect();
    let at = |k: usize| sig.get(k).map(|&j| &tokens[j]);
    let mut edits = vec![];
    for k in 0..sig.len() {
        if !(at(k).is_some_and(|t| is_word(t, "distinct"))
            && at(k + 1).is_some_and(|t| is_word(t, "on"))
            && at(k + 2) == Some(&Token::LParen))
        {
            continue;
        }
        let mut depth = 0;
        let Some(close) = (k + 2..sig.len()).find(|&m| {
            match at(m) {
                Some(Token::LParen) => depth += 1,
                Some(Token::RParen) => depth -= 1,
                _ => {}
            }
            depth == 0
        }) else {
            continue;
        };
        if at(close + 1).is_some_and(|t| is_word(t, "within"))
            && at(close + 2).is_some_and(|t| is_word(t, "watermark"))
        {
            edits.push((sig[close], sig[close + 2]));
        }
    }
    let mut out = tokens;
    for (close, last) in edits.into_iter().rev() {
        out.splice(
            close..=last,
            [
                Token::Comma,
                Token::SingleQuotedString(crate::dedupe::WITHIN_WATERMARK_MARKER.into()),
                Token::RParen,
            ],
        );
    }
    out
}

pub(crate) fn parse_tokens(tokens: Vec<Token>) -> Result<Statement, ClassifiedError> {
    let tokens = rewrite_all(tokens)?;
    let sig: Vec<usize> = (0..tokens.len()).filter(|&i| !is_ws(&tokens[i])).collect();
    let at = |k: usize| sig.get(k).map(|&i| &tokens[i]);
    let word = |k: usize, w: &str| at(k).is_some_and(|t| is_word(t, w));

    if word(0, "insert") && word(1, "into") {
        let (table, next) = object_name(&tokens, &sig, 2)?;
        let start = sig.get(next).copied().unwrap_or(tokens.len());
        return Ok(Statement::Insert {
            table,
            query: text(&tokens[start..]),
            sql: text(&tokens),
        });
    }
    if !word(0, "create") {
        return Ok(Statement::Sql(text(&tokens)));
    }
    let mut k = 1;
    let mut or_refresh = false;
    if word(k, "or") && (word(k + 1, "refresh") || word(k + 1, "replace")) {
        or_refresh = true;
        k += 2;
    }
    if !(word(k, "streaming") && word(k + 1, "table")) {
        return Ok(Statement::Sql(text(&tokens)));
    }
    k += 2;
    let mut if_not_exists = false;
    if word(k, "if") && word(k + 1, "not") && word(k + 2, "exists") {
        if_not_exists = true;
        k += 3;
    }
    let (name, mut k) = object_name(&tokens, &sig, k)?;
    let mut stmt = CreateStreamingTable {
        name,
        or_refresh,
        if_not_exists,
        format: None,
        location: None,
        options: Options::new(),
        query: None,
        columns: None,
        partitioned_by: vec![],
        auto_cdc: None,
    };
    if at(k) == Some(&Token::LParen) {
        let (inner, next) = parenthesized(&tokens, &sig, k)?;
        stmt.columns = Some(inner);
        k = next;
    }
    loop {
        match at(k) {
            None => break,
            Some(t) if is_word(t, "partitioned") && word(k + 1, "by") => {
                let (inner, next) = parenthesized(&tokens, &sig, k + 2)?;
                stmt.partitioned_by = inner
                    .split(',')
                    .map(|c| c.trim().to_string())
                    .filter(|c| !c.is_empty())
                    .collect();
                if stmt.partitioned_by.is_empty() {
                    return Err(syntax(
                        "PARTITIONED BY needs columns: PARTITIONED BY (a, b).",
                    ));
                }
                k = next;
            }
            Some(t) if is_word(t, "flow") && word(k + 1, "auto") && word(k + 2, "cdc") => {
                stmt.auto_cdc = Some(Box::new(crate::pipeline::parse_auto_cdc(
                    &tokens,
                    &sig,
                    k + 3,
                    stmt.name.clone(),
                    Some(stmt.name.clone()),
                )?));
                break;
            }
            Some(t) if is_word(t, "as") => {
                let start = sig.get(k + 1).copied().unwrap_or(tokens.len());
                let q = text(&tokens[start..]);
                if q.is_empty() {
                    return Err(syntax(
                        "CREATE STREAMING TABLE ... AS needs a query after AS.",
                    ));
                }
                stmt.query = Some(q);
                break;
            }
            Some(t) if is_word(t, "using") => {
                match at(k + 1) {
                    Some(Token::Word(w)) => stmt.format = Some(w.value.clone()),
                    Some(Token::SingleQuotedString(s)) => stmt.format = Some(s.clone()),
                    _ => return Err(syntax("USING needs a format name, e.g. USING parquet.")),
                }
                k += 2;
            }
            Some(t) if is_word(t, "location") => {
                match at(k + 1) {
                    Some(Token::SingleQuotedString(s)) | Some(Token::DoubleQuotedString(s)) => {
                        stmt.location = Some(s.clone())
                    }
                    _ => {
                        return Err(syntax(
                            "LOCATION needs a quoted path, e.g. LOCATION '/data/out'.",
                        ));
                    }
                }
                k += 2;
            }
            Some(t) if is_word(t, "options") || is_word(t, "tblproperties") => {
                k = parse_options(&tokens, &sig, k + 1, &mut stmt.options)?;
            }
            Some(t) if is_word(t, "comment") => k += 2,
            Some(other) => {
                return Err(syntax(format!(
                    "Unexpected '{other}' in CREATE STREAMING TABLE {}: expected USING, LOCATION, \
                     OPTIONS, AS or FLOW AUTO CDC (and, in a pipeline, PARTITIONED BY).",
                    stmt.name
                )));
            }
        }
    }
    Ok(Statement::CreateStreamingTable(stmt))
}

/// The text inside the parentheses opening at significant token `k`, and the significant
/// token after the closing one.
pub(crate) fn parenthesized(
    tokens: &[Token],
    sig: &[usize],
    k: usize,
) -> Result<(String, usize), ClassifiedError> {
    if sig.get(k).map(|&i| &tokens[i]) != Some(&Token::LParen) {
        return Err(syntax("Expected '(' here."));
    }
    let mut depth = 0;
    for (m, &i) in sig.iter().enumerate().skip(k) {
        match tokens[i] {
            Token::LParen => depth += 1,
            Token::RParen => {
                depth -= 1;
                if depth == 0 {
                    return Ok((text(&tokens[sig[k] + 1..i]), m + 1));
                }
            }
            _ => {}
        }
    }
    Err(syntax("A '(' is never closed."))
}

pub(crate) fn object_name(
    tokens: &[Token],
    sig: &[usize],
    mut k: usize,
) -> Result<(String, usize), ClassifiedError> {
    let mut parts = vec![];
    loop {
        match sig.get(k).map(|&i| &tokens[i]) {
            Some(Token::Word(w)) => parts.push(w.value.clone()),
            other => {
                return Err(syntax(format!(
                    "Expected a table name, found '{}'.",
                    other.map_or("end of statement".to_string(), |t| t.to_string())
                )));
            }
        }
        k += 1;
        if sig.get(k).map(|&i| &tokens[i]) == Some(&Token::Period) {
            k += 1;
        } else {
            return Ok((parts.join("."), k));
        }
    }
}

/// `( key [=] value, ... )` where keys are names (dotted allowed) or quoted strings.
fn parse_options(
    tokens: &[Token],
    sig: &[usize],
    mut k: usize,
    options: &mut Options,
) -> Result<usize, ClassifiedError> {
    let at = |k: usize| sig.get(k).map(|&i| &tokens[i]);
    if at(k) != Some(&Token::LParen) {
        return Err(syntax(
            "OPTIONS needs a parenthesized list: OPTIONS (key 'value', ...).",
        ));
    }
    k += 1;
    loop {
        let mut key = match at(k) {
            Some(Token::RParen) => return Ok(k + 1),
            Some(Token::Word(w)) => w.value.clone(),
            Some(Token::SingleQuotedString(s)) | Some(Token::DoubleQuotedString(s)) => s.clone(),
            other => {
                return Err(syntax(format!(
                    "Expected an option name in OPTIONS, found '{}'.",
                    other.map_or("end of statement".to_string(), |t| t.to_string())
                )));
            }
        };
        k += 1;
        while at(k) == Some(&Token::Period) {
            if let Some(Token::Word(w)) = at(k + 1) {
                key = format!("{key}.{}", w.value);
                k += 2;
            } else {
                return Err(syntax(format!(
                    "Unfinished option name '{key}.' in OPTIONS."
                )));
            }
        }
        if at(k) == Some(&Token::Eq) {
            k += 1;
        }
        let value = match at(k) {
            Some(Token::SingleQuotedString(s)) | Some(Token::DoubleQuotedString(s)) => s.clone(),
            Some(Token::Number(n, _)) => n.clone(),
            Some(Token::Word(w)) => w.value.clone(),
            other => {
                return Err(syntax(format!(
                    "Expected a value for option '{key}', found '{}'.",
                    other.map_or("end of statement".to_string(), |t| t.to_string())
                )));
            }
        };
        if let Err(first) = options.insert_new(key.clone(), value) {
            return Err(ClassifiedError::new(
                "DUPLICATE_KEY",
                "23505",
                format!(
                    "Found duplicate keys '{key}' in OPTIONS (also given as '{first}'; option \
                     names ignore case). Give each option once."
                ),
            ));
        }
        k += 1;
        match at(k) {
            Some(Token::Comma) => k += 1,
            Some(Token::RParen) => return Ok(k + 1),
            other => {
                return Err(syntax(format!(
                    "Expected ',' or ')' in OPTIONS, found '{}'.",
                    other.map_or("end of statement".to_string(), |t| t.to_string())
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_keyword_becomes_the_call_form() {
        assert_eq!(
            rewrite_stream_keyword(
                "SELECT * FROM STREAM rate(rowsPerSecond => 10) WHERE value > 1"
            )
            .unwrap(),
            "SELECT * FROM STREAM(rate(rowsPerSecond => 10)) WHERE value > 1"
        );
        assert_eq!(
            rewrite_stream_keyword("select a from stream events e join t on e.k = t.k").unwrap(),
            "select a from stream(events) e join t on e.k = t.k"
        );
        assert_eq!(
            rewrite_stream_keyword("SELECT * FROM STREAM(rate()) , STREAM x").unwrap(),
            "SELECT * FROM STREAM(rate()) , STREAM(x)"
        );
        // A column called stream is left alone.
        assert_eq!(
            rewrite_stream_keyword("SELECT a, stream FROM t").unwrap(),
            "SELECT a, stream FROM t"
        );
    }

    #[test]
    fn a_databricks_watermark_clause_becomes_stream_arguments() {
        assert_eq!(
            rewrite_stream_keyword(
                "SELECT * FROM STREAM rate() WATERMARK timestamp DELAY OF INTERVAL 10 SECONDS AS r \
                 JOIN STREAM(x) WATERMARK ts DELAY OF INTERVAL '1 minute' ON true"
            )
            .unwrap(),
            "SELECT * FROM STREAM(rate(),watermark=>'timestamp',delay=>'10 SECONDS') AS r \
             JOIN STREAM(x,watermark=>'ts',delay=>'1 minute') ON true"
        );
        let err =
            rewrite_stream_keyword("SELECT * FROM STREAM x WATERMARK ts DELAY 5").unwrap_err();
        assert_eq!(err.class, "PARSE_SYNTAX_ERROR", "{err}");
    }

    #[test]
    fn create_streaming_table_with_every_clause() {
        let s = parse_statement(
            "CREATE OR REFRESH STREAMING TABLE evens USING parquet LOCATION '/tmp/out' \
             OPTIONS (checkpointLocation '/tmp/ck', trigger = 'processingTime=1 second', compression zstd) \
             AS SELECT value FROM STREAM rate(rowsPerSecond => 5) WHERE value % 2 = 0",
        )
        .unwrap();
        let Statement::CreateStreamingTable(c) = s else {
            panic!("{s:?}")
        };
        assert_eq!(c.name, "evens");
        assert!(c.or_refresh);
        assert_eq!(c.format.as_deref(), Some("parquet"));
        assert_eq!(c.location.as_deref(), Some("/tmp/out"));
        assert_eq!(c.options.get("checkpointlocation"), Some("/tmp/ck"));
        assert_eq!(c.options.get("trigger"), Some("processingTime=1 second"));
        assert_eq!(c.options.get("compression"), Some("zstd"));
        assert_eq!(
            c.query.as_deref(),
            Some("SELECT value FROM STREAM(rate(rowsPerSecond => 5)) WHERE value % 2 = 0")
        );
    }

    #[test]
    fn a_script_splits_at_top_level_semicolons() {
        let all = parse_script(
            "CREATE STREAMING TABLE t USING memory;\n\
             INSERT INTO t SELECT * FROM STREAM rate();\n SELECT ';' ; ",
        )
        .unwrap();
        assert_eq!(all.len(), 3);
        assert!(matches!(&all[0], Statement::CreateStreamingTable(c) if c.query.is_none()));
        assert!(matches!(&all[1], Statement::Insert { table, query, .. }
            if table == "t" && query == "SELECT * FROM STREAM(rate())"));
        assert_eq!(all[2], Statement::Sql("SELECT ';'".into()));
    }

    #[test]
    fn a_bad_clause_is_a_syntax_error_naming_what_was_expected() {
        let err =
            parse_statement("CREATE STREAMING TABLE t USING parquet PARTITION BY (a) AS SELECT 1")
                .unwrap_err();
        assert_eq!(err.class, "PARSE_SYNTAX_ERROR");
        assert!(
            err.message
                .contains("expected USING, LOCATION, OPTIONS, AS or FLOW AUTO CDC"),
            "{}",
            err.message
        );
    }
}
