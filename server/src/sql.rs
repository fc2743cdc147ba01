//! `POST /api/v1/sql {sql}`: one statement in the server's session, for `weir shell --server`.
//!
//! ```text
//! batch query (SELECT, WITH, VALUES, TABLE)   {"results": [{"kind": "rows", "text", "columns",
//!                                              "rows"}]}
//! streaming SELECT (reads a STREAM)           server-sent events, `batch` per micro-batch
//!                                              ({batchId, text}); the query (temporary
//!                                              checkpoint) stops when the client goes away;
//!                                              `error` if it fails
//! statement starting a streaming query        409 STREAMING_QUERY_MUST_BE_SUBMITTED: it is to
//!                                              run on the server, POST /api/v1/queries
//! other statements (DDL, SET, ...)            {"results": [{"kind": "done"}]}
//! ```
//!
//! The statements share the server's session: a view created here is seen by later statements
//! and by queries submitted afterwards.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use datafusion::arrow::array::RecordBatch;
use datafusion::dataframe::DataFrame;
use serde::Deserialize;
use serde_json::{Value, json};
use weir_engine::{ScriptOptions, StatementResult, StreamingQuery};

use crate::{ApiError, AppState};

/// The body of `POST /api/v1/sql`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SqlRequest {
    sql: String,
}

/// Whether `sql` is a query (its rows are the answer) rather than a statement.
fn is_query(sql: &str) -> bool {
    let first = sql
        .trim_start_matches(|c: char| c.is_whitespace() || c == '(')
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or_default()
        .to_ascii_uppercase();
    matches!(first.as_str(), "SELECT" | "WITH" | "VALUES" | "TABLE")
}

fn rows_json(batches: &[RecordBatch]) -> Result<Value, ApiError> {
    let internal = |e: &dyn std::fmt::Display| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL_ERROR",
            "XX000",
            format!("The rows could not be written: {e}."),
        )
    };
    let text = datafusion::arrow::util::pretty::pretty_format_batches(batches)
        .map_err(|e| internal(&e))?
        .to_string();
    let mut writer = arrow::json::ArrayWriter::new(Vec::new());
    for b in batches {
        writer.write(b).map_err(|e| internal(&e))?;
    }
    writer.finish().map_err(|e| internal(&e))?;
    let data = writer.into_inner();
    let rows: Value = if data.is_empty() {
        json!([])
    } else {
        serde_json::from_slice(&data).map_err(|e| internal(&e))?
    };
    let columns: Vec<String> = batches
        .first()
        .map(|b| {
            b.schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect()
        })
        .unwrap_or_default();
    Ok(json!({ "kind": "rows", "text": text, "columns": columns, "rows": rows }))
}

pub(crate) async fn sql(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: SqlRequest = crate::body(raw)?;
    let text = req.sql.trim().trim_end_matches(';').trim();
    let session = &state.session;
    // Plain SQL (weir's rewrites applied: STREAM, named arguments): a streaming query's
    // batches come as events; anything else runs now.
    if let weir_planner::statement::Statement::Sql(sql) =
        weir_planner::statement::parse_statement(text)
            .map_err(|e| ApiError::of(&weir_engine::Error::from(e)))?
    {
        let plan = session.plan_sql(&sql).await.map_err(|e| ApiError::of(&e))?;
        if !weir_planner::streaming_tables(&plan).is_empty() {
            return stream(session, DataFrame::new(session.context().state(), plan)).await;
        }
        let df_error = |e| ApiError::of(&weir_engine::Error::from(e));
        let df = session
            .context()
            .execute_logical_plan(plan)
            .await
            .map_err(df_error)?;
        let batches = df.collect().await.map_err(df_error)?;
        let result = if is_query(&sql) {
            rows_json(&batches)?
        } else {
            json!({ "kind": "done" })
        };
        return Ok(axum::Json(json!({ "results": [result] })).into_response());
    }
    let opts = ScriptOptions {
        default_sink: Some("noop".into()),
        ..Default::default()
    };
    // A statement that starts a streaming query writing a table runs on the server as a
    // hosted query, with a checkpoint that survives it.
    let must_submit = || {
        ApiError::new(
            StatusCode::CONFLICT,
            "STREAMING_QUERY_MUST_BE_SUBMITTED",
            "42K0E",
            "This statement starts a streaming query that writes a table: it runs on the \
             server, so submit it with POST /api/v1/queries (weir shell does), and watch it \
             at /#/query/<id>.",
        )
    };
    match weir_planner::statement::parse_statement(text)
        .map_err(|e| ApiError::of(&weir_engine::Error::from(e)))?
    {
        weir_planner::statement::Statement::CreateStreamingTable(decl)
            if decl.query.is_some() || decl.auto_cdc.is_some() =>
        {
            return Err(must_submit());
        }
        weir_planner::statement::Statement::Insert { query, .. } => {
            let plan = session
                .plan_sql(&query)
                .await
                .map_err(|e| ApiError::of(&e))?;
            if !weir_planner::streaming_tables(&plan).is_empty() {
                return Err(must_submit());
            }
        }
        _ => {}
    }
    let mut results = vec![];
    for r in session
        .run_script(text, &opts)
        .await
        .map_err(|e| ApiError::of(&e))?
    {
        match r {
            StatementResult::Rows(rows) => results.push(rows_json(&rows)?),
            StatementResult::Query(q) => q.stop().await,
            _ => results.push(json!({ "kind": "done" })),
        }
    }
    Ok(axum::Json(json!({ "results": results })).into_response())
}

/// Stops the query when the response (the client's connection) is dropped.
struct StopOnDrop(StreamingQuery);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let q = self.0.clone();
        tokio::spawn(async move { q.stop().await });
    }
}

/// A streaming SELECT: its micro-batches as server-sent events until the client goes away.
async fn stream(session: &weir_engine::WeirSession, df: DataFrame) -> Result<Response, ApiError> {
    let (tx, rx) = tokio::sync::mpsc::channel::<(u64, String)>(8);
    let query = session
        .write_stream(df)
        .foreach_batch(move |id, batches| {
            let tx = tx.clone();
            async move {
                let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                    .map(|t| t.to_string())
                    .map_err(|e| e.to_string())?;
                tx.send((id, text))
                    .await
                    .map_err(|_| "the client went away".to_string())
            }
        })
        .start()
        .await
        .map_err(|e| ApiError::of(&e))?;
    let guard = StopOnDrop(query);
    let events = futures::stream::unfold(Some((rx, guard)), |s| async move {
        let (mut rx, guard) = s?;
        match rx.recv().await {
            Some((id, text)) => Some((
                Ok::<_, std::convert::Infallible>(
                    Event::default()
                        .event("batch")
                        .id(id.to_string())
                        .data(json!({ "batchId": id, "text": text }).to_string()),
                ),
                Some((rx, guard)),
            )),
            // The query ended: say why if it failed.
            None => {
                let e = guard.0.exception()?;
                let data = json!({ "errorClass": e.cause.error_class(),
                    "sqlState": e.cause.sql_state(), "message": e.cause.to_string() });
                Some((
                    Ok(Event::default().event("error").data(data.to_string())),
                    None,
                ))
            }
        }
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}
