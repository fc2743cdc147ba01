//! `weir serve`: one process hosting any number of streaming queries, driven over HTTP, with a
//! registry under `--data` so that a server killed and started again restarts every query that
//! was running from its checkpoint.
//!
//! ```text
//! POST /api/v1/queries {sql, name?, checkpoint?, trigger?}
//!        ─► registry entry <data>/queries/<id>.json (running) ─► session.run_script(sql)
//! GET  /api/v1/queries            each query's status
//! GET  /api/v1/queries/{id}       status, lastProgress (Spark's JSON), exception
//! GET  /api/v1/queries/{id}/progress?since=N     recentProgress after batch N
//! GET  /api/v1/queries/{id}/progress/stream?since=N   server-sent events, one per batch
//! GET  /api/v1/queries/{id}/health               streaming_health's records
//! POST /api/v1/queries/{id}/stop | /restart      the entry says stopped | running
//! POST /api/v1/sql {sql}                         one statement for `weir shell` (sql.rs)
//! GET  /api/v1/checkpoints/inspect?path=DIR       what `weir checkpoint inspect --json` prints
//! GET  /metrics                                  Prometheus exposition (metrics.rs)
//! GET  /api/v1/openapi.json                      this API as an OpenAPI 3.1 description
//! GET  /  and /ui/*                              the web UI (ui.rs), inside the binary
//! POST /api/v1/checkpoints/validate {path, sql}   what `weir checkpoint validate --json` prints
//! /api/2.0/pipelines...                          pipelines, in Databricks' shape (pipelines.rs)
//! start: every entry marked running is started again (its checkpoint resumes it)
//! ```
//!
//! Errors are JSON (`errorClass`, `sqlState`, `message`) with a 4xx status for the client's
//! mistakes. Listening on anything but loopback needs a bearer token.

mod metrics;
mod pipelines;
mod registry;
mod sql;
mod ui;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use weir_engine::{ScriptOptions, StatementResult, StreamingQuery, Trigger, WeirSession};

pub use registry::QueryEntry;
use registry::Registry;

/// The environment variable holding the bearer token when `--token` is not given.
pub const TOKEN_ENV: &str = "WEIR_SERVER_TOKEN";

/// The largest request body accepted.
const BODY_LIMIT: usize = 1 << 20;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where it listens.
    pub listen: SocketAddr,
    /// Where it keeps its registry and the checkpoints it assigns.
    pub data: PathBuf,
    /// The bearer token requests must carry; required unless `listen` is loopback.
    pub token: Option<String>,
}

/// An error as the API returns it.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    class: String,
    sql_state: String,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, class: &str, sql_state: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            class: class.into(),
            sql_state: sql_state.into(),
            message: message.into(),
        }
    }

    fn not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "STREAMING_QUERY_NOT_FOUND",
            "42704",
            format!("The server has no query '{id}': GET /api/v1/queries lists them."),
        )
    }

    /// A weir error: the client's (4xx) unless it is internal.
    fn of(e: &weir_engine::Error) -> Self {
        let status = if e.sql_state().starts_with("XX") || e.sql_state().starts_with("58") {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::BAD_REQUEST
        };
        Self::new(status, e.error_class(), e.sql_state(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "errorClass": self.class,
            "sqlState": self.sql_state,
            "message": self.message,
        });
        (self.status, axum::Json(body)).into_response()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[{}] {} SQLSTATE: {}",
            self.class, self.message, self.sql_state
        )
    }
}

impl std::error::Error for ApiError {}

/// A query the server knows: its registry entry and, while it runs, its handle.
struct Hosted {
    entry: QueryEntry,
    handle: Option<StreamingQuery>,
    /// Why it could not start, if it could not.
    start_error: Option<Arc<weir_engine::Error>>,
}

struct AppState {
    session: WeirSession,
    registry: Registry,
    data: PathBuf,
    token: Option<String>,
    queries: Mutex<BTreeMap<String, Hosted>>,
    pipelines: pipelines::Pipelines,
}

/// Runs the server until `shutdown` completes: restarts the registry's running queries, then
/// serves the API. The queries stop with the server (their entries stay running, so the next
/// start resumes them).
pub async fn serve(
    config: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ApiError> {
    if !config.listen.ip().is_loopback() && config.token.is_none() {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "SERVER_TOKEN_REQUIRED",
            "28000",
            format!(
                "weir serve listens on {}, which is not loopback: give a bearer token with \
                 --token or ${TOKEN_ENV}, or listen on 127.0.0.1.",
                config.listen
            ),
        ));
    }
    let registry = Registry::open(&config.data).map_err(storage)?;
    let state = Arc::new(AppState {
        session: WeirSession::new(),
        registry,
        data: config.data.clone(),
        token: config.token.clone(),
        queries: Mutex::new(BTreeMap::new()),
        pipelines: pipelines::Pipelines::open(&config.data).map_err(storage)?,
    });
    for entry in state.registry.entries().map_err(storage)? {
        let (handle, start_error) = if entry.running {
            match start(&state.session, &entry).await {
                Ok(q) => (Some(q), None),
                Err(e) => {
                    tracing::warn!(query = %entry.id, error = %e, "a query of the registry did not restart");
                    (None, Some(Arc::new(e)))
                }
            }
        } else {
            (None, None)
        };
        state.queries.lock().await.insert(
            entry.id.clone(),
            Hosted {
                entry,
                handle,
                start_error,
            },
        );
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "SERVER_LISTEN_FAILED",
                "58030",
                format!("weir serve cannot listen on {}: {e}.", config.listen),
            )
        })?;
    let local = listener.local_addr().ok();
    // Tests and scripts read the address (the port may be 0: any free one).
    println!(
        "weir serve listening on http://{}",
        local.unwrap_or(config.listen)
    );
    let app = router(Arc::clone(&state));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "SERVER_FAILED",
                "58030",
                e.to_string(),
            )
        })?;
    for hosted in state.queries.lock().await.values() {
        if let Some(q) = &hosted.handle {
            q.stop().await;
        }
    }
    state.pipelines.stop_all().await;
    Ok(())
}

fn storage(e: std::io::Error) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "SERVER_DATA_ERROR",
        "58030",
        format!("weir serve cannot read or write its data folder: {e}."),
    )
}

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/api/v1/queries", post(submit).get(list))
        .route("/api/v1/queries/{id}", get(describe))
        .route("/api/v1/queries/{id}/progress", get(progress))
        .route("/api/v1/queries/{id}/progress/stream", get(progress_stream))
        .route("/api/v1/queries/{id}/health", get(health))
        .route("/api/v1/queries/{id}/stop", post(stop))
        .route("/api/v1/queries/{id}/restart", post(restart))
        .route("/api/v1/sql", post(sql::sql))
        .route("/api/v1/checkpoints/inspect", get(inspect))
        .route("/", get(ui::index))
        .route("/ui/{name}", get(ui::asset))
        .route("/metrics", get(scrape))
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/checkpoints/validate", post(validate))
        .route(
            "/api/2.0/pipelines",
            post(pipelines::create).get(pipelines::list),
        )
        .route(
            "/api/2.0/pipelines/{id}",
            get(pipelines::describe).delete(pipelines::delete),
        )
        .route(
            "/api/2.0/pipelines/{id}/updates",
            post(pipelines::start_update).get(pipelines::list_updates),
        )
        .route(
            "/api/2.0/pipelines/{id}/updates/{update_id}",
            get(pipelines::get_update),
        )
        .route("/api/2.0/pipelines/{id}/stop", post(pipelines::stop))
        .route("/api/2.0/pipelines/{id}/events", get(pipelines::events))
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                "42704",
                "No such endpoint: the API is under /api/v1/queries, /api/v1/checkpoints and \
                 /api/2.0/pipelines (GET /api/v1/openapi.json describes it).",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            authorize,
        ))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// Refuses a request without the server's bearer token, when it has one.
async fn authorize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    if let Some(token) = &state.token
        && !ui::is_ui(request.uri().path())
    {
        let given = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(token.as_str()) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "UNAUTHORIZED",
                "28000",
                "This server needs its bearer token: send Authorization: Bearer <token>.",
            )
            .into_response();
        }
    }
    next.run(request).await
}

/// The body of `POST /api/v1/queries`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitRequest {
    sql: String,
    name: Option<String>,
    checkpoint: Option<String>,
    trigger: Option<String>,
}

/// Reads a JSON body, refusing a malformed or oversized one as JSON.
fn body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|r| {
        ApiError::new(
            r.status(),
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                "REQUEST_TOO_LARGE"
            } else {
                "INVALID_REQUEST_BODY"
            },
            "42000",
            format!("The request body cannot be read: {r} (at most {BODY_LIMIT} bytes)."),
        )
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST_BODY",
            "42000",
            format!(
                "The request body is not the JSON this endpoint takes: {e}. Send {{\"sql\": \
                 \"...\", \"name\"?, \"checkpoint\"?, \"trigger\"?}}."
            ),
        )
    })
}

/// Starts `entry`'s query in `session`: its one streaming statement, with its checkpoint.
async fn start(
    session: &WeirSession,
    entry: &QueryEntry,
) -> Result<StreamingQuery, weir_engine::Error> {
    let trigger = entry.trigger.as_deref().map(Trigger::parse).transpose()?;
    let opts = ScriptOptions {
        checkpoint: Some(entry.checkpoint.clone()),
        trigger,
        default_sink: Some("noop".into()),
        ..Default::default()
    };
    let mut queries: Vec<StreamingQuery> = session
        .run_script(&entry.sql, &opts)
        .await?
        .into_iter()
        .filter_map(|r| match r {
            StatementResult::Query(q) => Some(q),
            _ => None,
        })
        .collect();
    match queries.len() {
        1 => Ok(queries.remove(0)),
        n => {
            for q in &queries {
                q.stop().await;
            }
            Err(weir_engine::Error::user(
                "NOT_A_STREAMING_QUERY",
                "42K0E",
                format!(
                    "A query submitted to the server starts one streaming query; this SQL \
                     starts {n}. Submit each on its own."
                ),
            ))
        }
    }
}

async fn submit(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: SubmitRequest = body(raw)?;
    let id = uuid::Uuid::new_v4().to_string();
    let entry = QueryEntry {
        checkpoint: req.checkpoint.unwrap_or_else(|| {
            state
                .data
                .join("checkpoints")
                .join(&id)
                .display()
                .to_string()
        }),
        id: id.clone(),
        name: req.name,
        sql: req.sql,
        trigger: req.trigger,
        running: true,
        created: chrono::Utc::now().to_rfc3339(),
    };
    let handle = start(&state.session, &entry)
        .await
        .map_err(|e| ApiError::of(&e))?;
    state.registry.put(&entry).map_err(storage)?;
    let body = json!({ "id": id, "queryId": handle.id().to_string() });
    state.queries.lock().await.insert(
        id,
        Hosted {
            entry,
            handle: Some(handle),
            start_error: None,
        },
    );
    Ok((StatusCode::CREATED, axum::Json(body)).into_response())
}

/// Why a hosted query failed, if it did: its run's error, or why it could not start.
fn failure(h: &Hosted) -> Option<Arc<weir_engine::Error>> {
    h.handle
        .as_ref()
        .and_then(|q| q.exception().map(|e| e.cause))
        .or_else(|| h.start_error.clone())
}

/// A query's status word, its status message and its newest batch's progress.
fn state_of(
    h: &Hosted,
    failed: bool,
) -> (
    &'static str,
    String,
    Option<weir_engine::StreamingQueryProgress>,
) {
    match &h.handle {
        _ if failed => ("failed", "The query failed.".to_string(), None),
        Some(q) if q.is_active() => {
            let s = q.status();
            let state = if s.is_data_available || s.is_trigger_active {
                "active"
            } else {
                "waiting for data"
            };
            (state, s.message, q.last_progress())
        }
        Some(q) => ("stopped", "Stopped.".to_string(), q.last_progress()),
        None => ("stopped", "Stopped.".to_string(), None),
    }
}

/// A query's status as the API shows it.
fn status_of(h: &Hosted) -> Value {
    let exception = failure(h).map(|e| {
        json!({
            "errorClass": e.error_class(),
            "sqlState": e.sql_state(),
            "message": e.to_string(),
        })
    });
    // As Spark's streaming tab: the rates averaged over the recent batches.
    let recent = h
        .handle
        .as_ref()
        .map(|q| q.recent_progress())
        .unwrap_or_default();
    let average = |f: fn(&weir_engine::StreamingQueryProgress) -> f64| {
        let values: Vec<f64> = recent.iter().map(f).filter(|v| v.is_finite()).collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    };
    let avg_input = average(|p| p.input_rows_per_second);
    let avg_processed = average(|p| p.processed_rows_per_second);
    let (state, message, last) = state_of(h, exception.is_some());
    json!({
        "id": h.entry.id,
        "name": h.entry.name,
        "queryId": h.handle.as_ref().map(|q| q.id().to_string()),
        "sql": h.entry.sql,
        "checkpoint": h.entry.checkpoint,
        "status": state,
        "message": message,
        "batchesBehind": last.as_ref().map(metrics::batches_behind),
        "avgInputRowsPerSecond": avg_input,
        "avgProcessedRowsPerSecond": avg_processed,
        "lastProgress": last.map(|p| serde_json::to_value(p).unwrap_or(Value::Null)),
        "exception": exception,
    })
}

async fn list(State(state): State<Arc<AppState>>) -> axum::Json<Value> {
    let queries = state.queries.lock().await;
    axum::Json(json!({ "queries": queries.values().map(status_of).collect::<Vec<_>>() }))
}

async fn describe(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let queries = state.queries.lock().await;
    let h = queries.get(&id).ok_or_else(|| ApiError::not_found(&id))?;
    Ok(axum::Json(status_of(h)))
}

#[derive(Debug, Deserialize)]
struct Since {
    since: Option<u64>,
}

async fn progress(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(since): Query<Since>,
) -> Result<axum::Json<Value>, ApiError> {
    let queries = state.queries.lock().await;
    let h = queries.get(&id).ok_or_else(|| ApiError::not_found(&id))?;
    let recent: Vec<Value> = h
        .handle
        .as_ref()
        .map(|q| q.recent_progress())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| since.since.is_none_or(|s| p.batch_id > s))
        .filter_map(|p| serde_json::to_value(p).ok())
        .collect();
    Ok(axum::Json(json!({ "recentProgress": recent })))
}

/// How often the progress stream looks for a new batch.
const STREAM_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Server-sent events: each new progress record (after batch `since`) as an event `progress`
/// whose id is its batch and whose data is Spark's JSON; the stream ends when the query stops.
async fn progress_stream(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(since): Query<Since>,
) -> Result<Response, ApiError> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let handle = {
        let queries = state.queries.lock().await;
        let h = queries.get(&id).ok_or_else(|| ApiError::not_found(&id))?;
        h.handle.clone().filter(|q| q.is_active())
    };
    let Some(handle) = handle else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "STREAMING_QUERY_NOT_ACTIVE",
            "55000",
            format!(
                "Query '{id}' is not running, so it has no progress to stream: POST \
                 /api/v1/queries/{id}/restart, or read /api/v1/queries/{id}/progress."
            ),
        ));
    };
    let events = futures::stream::unfold((handle, since.since), |(q, last)| async move {
        loop {
            let next = q
                .recent_progress()
                .into_iter()
                .find(|p| last.is_none_or(|l| p.batch_id > l));
            if let Some(p) = next {
                let event = Event::default()
                    .event("progress")
                    .id(p.batch_id.to_string())
                    .data(p.json());
                return Some((
                    Ok::<_, std::convert::Infallible>(event),
                    (q, Some(p.batch_id)),
                ));
            }
            if !q.is_active() {
                return None;
            }
            tokio::time::sleep(STREAM_POLL).await;
        }
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

async fn health(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let queries = state.queries.lock().await;
    let h = queries.get(&id).ok_or_else(|| ApiError::not_found(&id))?;
    let records = h
        .handle
        .as_ref()
        .and_then(|q| state.session.health(&q.id().to_string()))
        .unwrap_or_default();
    Ok(axum::Json(json!({ "health": records })))
}

/// Query `id`, its run stopped if it had one.
async fn stopped<'a>(
    queries: &'a mut BTreeMap<String, Hosted>,
    id: &str,
) -> Result<&'a mut Hosted, ApiError> {
    let h = queries.get_mut(id).ok_or_else(|| ApiError::not_found(id))?;
    if let Some(q) = &h.handle {
        q.stop().await;
    }
    Ok(h)
}

async fn stop(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let mut queries = state.queries.lock().await;
    let h = stopped(&mut queries, &id).await?;
    h.entry.running = false;
    state.registry.put(&h.entry).map_err(storage)?;
    Ok(axum::Json(status_of(h)))
}

async fn restart(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let mut queries = state.queries.lock().await;
    let h = stopped(&mut queries, &id).await?;
    let handle = start(&state.session, &h.entry)
        .await
        .map_err(|e| ApiError::of(&e))?;
    h.handle = Some(handle);
    h.start_error = None;
    h.entry.running = true;
    state.registry.put(&h.entry).map_err(storage)?;
    Ok(axum::Json(status_of(h)))
}

#[derive(Debug, Deserialize)]
struct CheckpointPath {
    path: Option<String>,
}

/// `weir checkpoint inspect DIR --json`: reads the checkpoint, writes nothing.
async fn inspect(Query(q): Query<CheckpointPath>) -> Result<axum::Json<Value>, ApiError> {
    let path = q.path.ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST_BODY",
            "42000",
            "Give the checkpoint as ?path=DIR.",
        )
    })?;
    let location =
        weir_common::Location::parse_existing_with(&path, std::iter::empty::<(&str, &str)>())
            .map_err(|e| ApiError::of(&weir_engine::Error::from(e)))?;
    let report = weir_engine::tools::inspect::inspect(location)
        .await
        .map_err(|e| ApiError::of(&e))?;
    Ok(axum::Json(
        serde_json::to_value(report).unwrap_or(Value::Null),
    ))
}

/// The body of `POST /api/v1/checkpoints/validate`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ValidateRequest {
    path: String,
    sql: String,
}

/// `weir checkpoint validate DIR QUERY.sql --json`: would the SQL restart from the checkpoint?
/// Writes nothing; the report's `accepted` answers.
async fn validate(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let req: ValidateRequest = body(raw)?;
    let opts = ScriptOptions {
        checkpoint: Some(req.path),
        default_sink: Some("noop".into()),
        ..Default::default()
    };
    let results = state
        .session
        .validate_script(&req.sql, &opts)
        .await
        .map_err(|e| ApiError::of(&e))?;
    let report = results
        .into_iter()
        .find_map(|r| match r {
            StatementResult::Validated(r) => Some(r),
            _ => None,
        })
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "NOT_A_STREAMING_QUERY",
                "42K0E",
                "The SQL starts no streaming query: there is nothing to validate against the \
                 checkpoint.",
            )
        })?;
    Ok(axum::Json(
        serde_json::to_value(report.as_ref()).unwrap_or(Value::Null),
    ))
}

/// `GET /metrics`.
async fn scrape(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let scraped: Vec<metrics::Scraped> = state
        .queries
        .lock()
        .await
        .values()
        .map(|h| {
            // Only the status word: no JSON, no averages over the recent batches.
            let (status, _, _) = state_of(h, failure(h).is_some());
            metrics::Scraped {
                id: h.entry.id.clone(),
                name: h.entry.name.clone(),
                status: status.to_string(),
                last: h.handle.as_ref().and_then(|q| q.last_progress()),
            }
        })
        .collect();
    let text = metrics::exposition(&scraped).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL_ERROR",
            "XX000",
            format!("The metrics could not be written: {e}."),
        )
    })?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// `GET /api/v1/openapi.json`: the API as OpenAPI 3.1.
async fn openapi() -> axum::Json<Value> {
    axum::Json(openapi_description())
}

/// The API's OpenAPI 3.1 description.
pub fn openapi_description() -> Value {
    let error = json!({ "description": "An error", "content": { "application/json": {
        "schema": { "$ref": "#/components/schemas/Error" } } } });
    let query = json!({ "description": "The query", "content": { "application/json": {
        "schema": { "$ref": "#/components/schemas/Query" } } } });
    let id = json!([{ "name": "id", "in": "path", "required": true,
        "schema": { "type": "string" } }]);
    let since = json!({ "name": "since", "in": "query", "required": false,
        "schema": { "type": "integer", "minimum": 0 },
        "description": "Only batches after this one" });
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "weir serve",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Streaming queries over HTTP. Errors carry weir's error class and \
                SQLSTATE. Off loopback, every request needs Authorization: Bearer <token>."
        },
        "paths": {
            "/api/v1/queries": {
                "post": {
                    "summary": "Start a streaming query (its SQL's one streaming statement)",
                    "requestBody": { "required": true, "content": { "application/json": {
                        "schema": { "$ref": "#/components/schemas/Submit" } } } },
                    "responses": {
                        "201": { "description": "Started: the server's id and the query's id" },
                        "400": error, "413": error
                    }
                },
                "get": {
                    "summary": "Every query with its status",
                    "responses": { "200": { "description": "{\"queries\": [Query]}" } }
                }
            },
            "/api/v1/queries/{id}": {
                "get": { "summary": "One query: status, lastProgress, exception",
                    "parameters": id, "responses": { "200": query, "404": error } }
            },
            "/api/v1/queries/{id}/progress": {
                "get": { "summary": "recentProgress (Spark's progress JSON)",
                    "parameters": [id[0], since],
                    "responses": { "200": { "description": "{\"recentProgress\": [...]}" },
                        "404": error } }
            },
            "/api/v1/queries/{id}/progress/stream": {
                "get": { "summary": "Server-sent events, one `progress` event per batch",
                    "parameters": [id[0], since],
                    "responses": { "200": { "description": "text/event-stream" },
                        "404": error, "409": error } }
            },
            "/api/v1/queries/{id}/health": {
                "get": { "summary": "streaming_health's records", "parameters": id,
                    "responses": { "200": { "description": "{\"health\": [...]}" },
                        "404": error } }
            },
            "/api/v1/queries/{id}/stop": {
                "post": { "summary": "Stop; it stays stopped when the server starts again",
                    "parameters": id, "responses": { "200": query, "404": error } }
            },
            "/api/v1/queries/{id}/restart": {
                "post": { "summary": "Start again from its checkpoint", "parameters": id,
                    "responses": { "200": query, "400": error, "404": error } }
            },
            "/api/v1/checkpoints/inspect": {
                "get": { "summary": "weir checkpoint inspect --json",
                    "parameters": [{ "name": "path", "in": "query", "required": true,
                        "schema": { "type": "string" } }],
                    "responses": { "200": { "description": "The checkpoint's report" },
                        "400": error } }
            },
            "/api/v1/checkpoints/validate": {
                "post": { "summary": "weir checkpoint validate --json: would the SQL restart?",
                    "requestBody": { "required": true, "content": { "application/json": {
                        "schema": { "type": "object", "required": ["path", "sql"],
                            "properties": { "path": { "type": "string" },
                                "sql": { "type": "string" } } } } } },
                    "responses": { "200": { "description": "The report; accepted answers" },
                        "400": error } }
            },
            "/metrics": {
                "get": { "summary": "Prometheus / OpenMetrics text of every query's newest batch",
                    "responses": { "200": { "description": "application/openmetrics-text" } } }
            },
            "/api/v1/sql": {
                "post": { "summary": "One statement in the server's session (weir shell): a \
                        batch query's rows; a streaming SELECT's batches as server-sent events \
                        until the client goes away; 409 for a statement that starts a \
                        streaming query (submit it to /api/v1/queries)",
                    "requestBody": { "required": true, "content": { "application/json": {
                        "schema": { "type": "object", "required": ["sql"],
                            "properties": { "sql": { "type": "string" } } } } } },
                    "responses": { "200": { "description": "{\"results\": [...]} or \
                        text/event-stream" }, "400": error, "409": error } }
            },
            "/api/2.0/pipelines": {
                "post": {
                    "summary": "Create a pipeline from its spec file or Databricks' fields",
                    "requestBody": { "required": true, "content": { "application/json": {
                        "schema": { "$ref": "#/components/schemas/CreatePipeline" } } } },
                    "responses": { "200": { "description": "{\"pipeline_id\": ...}" },
                        "400": error, "409": error }
                },
                "get": { "summary": "Every pipeline with its state and latest updates",
                    "responses": { "200": { "description": "{\"statuses\": [...]}" } } }
            },
            "/api/2.0/pipelines/{id}": {
                "get": { "summary": "State, spec, graph (datasets and flows), latest updates, \
                        the newest update's flows live", "parameters": id,
                    "responses": { "200": { "description": "The pipeline" }, "404": error } },
                "delete": { "summary": "Forget the pipeline (its storage stays)",
                    "parameters": id,
                    "responses": { "200": { "description": "{}" }, "404": error,
                        "409": error } }
            },
            "/api/2.0/pipelines/{id}/updates": {
                "post": { "summary": "Start an update (what `weir pipeline run` runs)",
                    "parameters": id,
                    "requestBody": { "required": false, "content": { "application/json": {
                        "schema": { "$ref": "#/components/schemas/StartUpdate" } } } },
                    "responses": { "200": { "description": "{\"update_id\": ...}" },
                        "400": error, "404": error, "409": error } },
                "get": { "summary": "The pipeline's updates, newest first", "parameters": id,
                    "responses": { "200": { "description": "{\"updates\": [...]}" },
                        "404": error } }
            },
            "/api/2.0/pipelines/{id}/updates/{update_id}": {
                "get": { "summary": "One update: its state, selections, flows",
                    "parameters": [id[0], { "name": "update_id", "in": "path",
                        "required": true, "schema": { "type": "string" } }],
                    "responses": { "200": { "description": "{\"update\": {...}}" },
                        "404": error } }
            },
            "/api/2.0/pipelines/{id}/stop": {
                "post": { "summary": "Stop the running update (a continuous one)",
                    "parameters": id,
                    "responses": { "200": { "description": "{\"stopping_update_id\"}" },
                        "404": error } }
            },
            "/api/2.0/pipelines/{id}/events": {
                "get": { "summary": "The event log's events, newest first",
                    "parameters": [id[0],
                        { "name": "max_results", "in": "query", "required": false,
                            "schema": { "type": "integer", "minimum": 0 } },
                        { "name": "update_id", "in": "query", "required": false,
                            "schema": { "type": "string" } }],
                    "responses": { "200": { "description": "{\"events\": [...]}" },
                        "404": error } }
            },
            "/api/v1/openapi.json": {
                "get": { "summary": "This description",
                    "responses": { "200": { "description": "OpenAPI 3.1" } } }
            }
        },
        "components": { "schemas": {
            "Error": { "type": "object", "required": ["errorClass", "sqlState", "message"],
                "properties": { "errorClass": { "type": "string" },
                    "sqlState": { "type": "string" }, "message": { "type": "string" } } },
            "Submit": { "type": "object", "required": ["sql"], "additionalProperties": false,
                "properties": { "sql": { "type": "string" }, "name": { "type": "string" },
                    "checkpoint": { "type": "string" },
                    "trigger": { "type": "string", "examples": ["1 second", "availableNow"] } } },
            "CreatePipeline": { "type": "object", "additionalProperties": false,
                "description": "Either spec, or name, storage and libraries",
                "properties": { "spec": { "type": "string" }, "name": { "type": "string" },
                    "storage": { "type": "string" },
                    "libraries": { "type": "array", "items": { "type": "object" } },
                    "configuration": { "type": "object",
                        "additionalProperties": { "type": "string" } },
                    "root_path": { "type": "string" }, "continuous": { "type": "boolean" } } },
            "StartUpdate": { "type": "object", "additionalProperties": false,
                "properties": { "full_refresh": { "type": "boolean" },
                    "refresh_selection": { "type": "array", "items": { "type": "string" } },
                    "full_refresh_selection": { "type": "array",
                        "items": { "type": "string" } },
                    "reset_checkpoint_selection": { "type": "array",
                        "items": { "type": "string" } },
                    "cause": { "type": "string" } } },
            "Query": { "type": "object", "properties": {
                "id": { "type": "string" }, "name": { "type": ["string", "null"] },
                "queryId": { "type": ["string", "null"] }, "sql": { "type": "string" },
                "checkpoint": { "type": "string" },
                "status": { "enum": ["active", "waiting for data", "stopped", "failed"] },
                "batchesBehind": { "type": ["integer", "null"] },
                "avgInputRowsPerSecond": { "type": ["number", "null"] },
                "avgProcessedRowsPerSecond": { "type": ["number", "null"] },
                "message": { "type": "string" },
                "lastProgress": { "type": ["object", "null"] },
                "exception": { "oneOf": [{ "$ref": "#/components/schemas/Error" },
                    { "type": "null" }] } } }
        } }
    })
}
