//! Pipelines over HTTP, in the shape of Databricks' Pipelines API (`/api/2.0/pipelines`): a
//! pipeline is created from a spec, and each `POST .../updates` runs one update of it (what
//! `weir pipeline run` runs) on the server, watched live through an [`UpdateObserver`].
//!
//! ```text
//! POST /api/2.0/pipelines {spec: FILE} | {name, storage, libraries, configuration, root_path,
//!                          continuous}         ─► <data>/pipelines/<id>.json
//! GET  /api/2.0/pipelines                       {statuses: [...]}
//! GET  /api/2.0/pipelines/{id}                  state, spec, graph (datasets, flows), latest
//!                                               updates, the newest update's flows live
//! DELETE /api/2.0/pipelines/{id}                forgets it (its storage stays)
//! POST /api/2.0/pipelines/{id}/updates {full_refresh, refresh_selection,
//!       full_refresh_selection, reset_checkpoint_selection}   ─► {update_id}; runs in a task
//! GET  /api/2.0/pipelines/{id}/updates[/{update_id}]
//! POST /api/2.0/pipelines/{id}/stop             stops the running update (a continuous one)
//! GET  /api/2.0/pipelines/{id}/events?max_results=N&update_id=U   newest first
//! ```
//!
//! An update's record is written when it starts and when it ends; one left RUNNING by a server
//! that was killed is CANCELED when the server starts again (its flows' checkpoints make the
//! next update carry on where it stopped).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use weir_pipeline::{DatasetKind, FlowKind, Graph, PipelineSpec, UpdateObserver};

use crate::{ApiError, AppState, storage};

/// One pipeline of the server, as its registry file keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PipelineEntry {
    pipeline_id: String,
    name: String,
    /// The spec file; for a spec given as fields, where its relative paths are taken from.
    spec_path: String,
    /// A spec given as fields (JSON, which the spec's YAML reader reads).
    spec_text: Option<String>,
    /// Updates run continuously (Databricks' `continuous`).
    continuous: bool,
    creation_time: String,
    /// Oldest first.
    updates: Vec<UpdateRecord>,
}

/// One update, as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct UpdateRecord {
    update_id: String,
    /// RUNNING, COMPLETED, FAILED, CANCELED.
    state: String,
    creation_time: String,
    end_time: Option<String>,
    full_refresh: bool,
    refresh_selection: Vec<String>,
    full_refresh_selection: Vec<String>,
    reset_checkpoint_selection: Vec<String>,
    /// Databricks' reason for the update, as given.
    #[serde(default)]
    cause: Option<String>,
    /// Each flow's outcome once the update ended.
    flows: BTreeMap<String, String>,
    error: Option<Value>,
}

impl PipelineEntry {
    fn spec(&self) -> Result<PipelineSpec, ApiError> {
        let spec = match &self.spec_text {
            Some(text) => PipelineSpec::parse(text, Path::new(&self.spec_path)),
            None => PipelineSpec::load(Path::new(&self.spec_path)),
        };
        spec.map_err(|e| ApiError::of(&weir_engine::Error::from(e)))
    }
}

/// A flow of the running (or newest) update, as it goes.
#[derive(Debug, Clone, Default, Serialize)]
struct FlowLive {
    status: String,
    /// The newest micro-batch's progress record (Spark's JSON).
    last_progress: Option<Value>,
    batches: u64,
    input_rows: u64,
}

/// What the observer of an update collects.
#[derive(Debug, Default)]
struct Live {
    flows: BTreeMap<String, FlowLive>,
    /// The update's events so far (the event log gets them at each stage's end).
    events: Vec<Value>,
}

struct LiveObserver {
    pipeline_id: String,
    pipeline_name: String,
    live: Arc<std::sync::Mutex<Live>>,
}

impl UpdateObserver for LiveObserver {
    fn on_event(&self, update_id: &str, e: &weir_pipeline::Event) {
        let Ok(mut live) = self.live.lock() else {
            return;
        };
        if let (Some(flow), Some(status)) = (&e.flow, e.details["flow_progress"]["status"].as_str())
        {
            live.flows.entry(flow.clone()).or_default().status = status.to_string();
        }
        let sequence = live.events.len();
        live.events.push(json!({
            "id": format!("{update_id}-{sequence}"),
            "sequence": sequence,
            "timestamp": chrono::DateTime::from_timestamp_micros(e.time_us).map(rfc3339),
            "origin": {
                "pipeline_id": self.pipeline_id,
                "pipeline_name": self.pipeline_name,
                "update_id": update_id,
                "flow_name": e.flow,
            },
            "event_type": e.event_type,
            "level": e.level,
            "message": e.message,
            "error_class": e.error_class,
            "details": e.details,
        }));
    }

    fn on_flow_progress(&self, flow: &str, p: &weir_engine::StreamingQueryProgress) {
        let Ok(mut live) = self.live.lock() else {
            return;
        };
        let f = live.flows.entry(flow.to_string()).or_default();
        if p.num_input_rows > 0 {
            f.batches += 1;
            f.input_rows += p.num_input_rows;
        }
        f.last_progress = serde_json::to_value(p).ok();
    }
}

/// A pipeline the server knows, and its running update if one runs.
pub(crate) struct Hosted {
    entry: PipelineEntry,
    live: Arc<std::sync::Mutex<Live>>,
    running: Option<Running>,
}

struct Running {
    update_id: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Taken when the server stops and waits for it.
    task: Option<tokio::task::JoinHandle<()>>,
}

/// The server's pipelines and their registry folder, `<data>/pipelines`.
pub(crate) struct Pipelines {
    dir: PathBuf,
    hosted: tokio::sync::Mutex<BTreeMap<String, Hosted>>,
}

impl Pipelines {
    /// The pipelines of the registry under `data`; updates a killed server left RUNNING are
    /// CANCELED.
    pub(crate) fn open(data: &Path) -> std::io::Result<Self> {
        let dir = data.join("pipelines");
        std::fs::create_dir_all(&dir)?;
        let mut hosted = BTreeMap::new();
        for mut entry in crate::registry::read_all::<PipelineEntry>(&dir, "pipeline")? {
            let mut changed = false;
            for u in &mut entry.updates {
                if u.state == "RUNNING" {
                    u.state = "CANCELED".into();
                    u.error = Some(json!({ "message": "The server stopped during this update; \
                        the next update carries on from the flows' checkpoints." }));
                    changed = true;
                }
            }
            if changed {
                put(&dir, &entry)?;
            }
            hosted.insert(
                entry.pipeline_id.clone(),
                Hosted {
                    entry,
                    live: Default::default(),
                    running: None,
                },
            );
        }
        Ok(Self {
            dir,
            hosted: tokio::sync::Mutex::new(hosted),
        })
    }

    /// Stops every running update (the server is stopping).
    pub(crate) async fn stop_all(&self) {
        let mut hosted = self.hosted.lock().await;
        let mut tasks = vec![];
        for h in hosted.values_mut() {
            if let Some(r) = &mut h.running {
                if let Some(tx) = r.stop.take() {
                    let _ = tx.send(());
                }
                tasks.extend(r.task.take());
            }
        }
        drop(hosted);
        for t in tasks {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(30), t).await;
        }
    }
}

fn put(dir: &Path, entry: &PipelineEntry) -> std::io::Result<()> {
    crate::registry::write(dir, &entry.pipeline_id, entry)
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "PIPELINE_NOT_FOUND",
        "42704",
        format!("The server has no pipeline '{id}': GET /api/2.0/pipelines lists them."),
    )
}

fn bad_request(class: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, class, "42000", message)
}

/// The body of `POST /api/2.0/pipelines`: a spec file, or Databricks' fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateRequest {
    spec: Option<String>,
    name: Option<String>,
    storage: Option<String>,
    configuration: Option<BTreeMap<String, String>>,
    libraries: Option<Vec<Library>>,
    root_path: Option<String>,
    #[serde(default)]
    continuous: bool,
}

/// A library as Databricks gives it: `{"glob": {"include": ...}}` or `{"file": {"path": ...}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Library {
    glob: Option<Include>,
    file: Option<FilePath>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Include {
    include: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePath {
    path: String,
}

pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    let req: CreateRequest = crate::body(raw)?;
    let id = uuid::Uuid::new_v4().to_string();
    let (spec_path, spec_text) = match (&req.spec, &req.name) {
        (Some(path), None) if req.storage.is_none() && req.libraries.is_none() => {
            let path = std::path::absolute(path).unwrap_or_else(|_| PathBuf::from(path));
            (path.display().to_string(), None)
        }
        (None, Some(name)) => {
            let libraries: Vec<Value> = req
                .libraries
                .unwrap_or_default()
                .into_iter()
                .map(|l| match (l.glob, l.file) {
                    (Some(g), None) => Ok(json!({ "glob": { "include": g.include } })),
                    (None, Some(f)) => Ok(json!({ "glob": { "include": f.path } })),
                    _ => Err(bad_request(
                        "INVALID_PIPELINE_SPEC",
                        "Each library is {\"glob\": {\"include\": \"folder/**\"}} or \
                         {\"file\": {\"path\": \"file.sql\"}}.",
                    )),
                })
                .collect::<Result<_, _>>()?;
            let mut spec = json!({ "name": name, "libraries": libraries });
            if let Some(s) = &req.storage {
                spec["storage"] = json!(s);
            }
            if let Some(c) = &req.configuration {
                spec["configuration"] = json!(c);
            }
            let root = match &req.root_path {
                Some(r) => PathBuf::from(r),
                None => state.data.join("pipelines").join(&id),
            };
            (
                root.join("weir-pipeline.yml").display().to_string(),
                Some(spec.to_string()),
            )
        }
        _ => {
            return Err(bad_request(
                "INVALID_PIPELINE_SPEC",
                "Create a pipeline from its spec file, {\"spec\": \"/path/weir-pipeline.yml\"}, \
                 or from Databricks' fields, {\"name\", \"storage\", \"libraries\", \
                 \"configuration\"?, \"root_path\"?, \"continuous\"?}; not both.",
            ));
        }
    };
    let mut entry = PipelineEntry {
        pipeline_id: id.clone(),
        name: String::new(),
        spec_path,
        spec_text,
        continuous: req.continuous,
        creation_time: chrono::Utc::now().to_rfc3339(),
        updates: vec![],
    };
    let spec = entry.spec()?;
    spec.library_files()
        .map_err(|e| ApiError::of(&weir_engine::Error::from(e)))?;
    entry.name = spec.name.clone();
    let mut hosted = state.pipelines.hosted.lock().await;
    if let Some(other) = hosted
        .values()
        .find(|h| h.entry.name.eq_ignore_ascii_case(&spec.name))
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "PIPELINE_ALREADY_EXISTS",
            "42710",
            format!(
                "The server already has a pipeline named '{}' ({}): update it, or DELETE it \
                 first.",
                spec.name, other.entry.pipeline_id
            ),
        ));
    }
    put(&state.pipelines.dir, &entry).map_err(storage)?;
    hosted.insert(
        id.clone(),
        Hosted {
            entry,
            live: Default::default(),
            running: None,
        },
    );
    Ok(axum::Json(json!({ "pipeline_id": id })))
}

/// The pipeline's state: RUNNING while an update runs, else as its newest update ended.
fn pipeline_state(h: &Hosted) -> &'static str {
    if h.running.is_some() {
        return "RUNNING";
    }
    match h.entry.updates.last().map(|u| u.state.as_str()) {
        Some("FAILED") => "FAILED",
        _ => "IDLE",
    }
}

fn latest_updates(h: &Hosted) -> Vec<Value> {
    h.entry
        .updates
        .iter()
        .rev()
        .take(5)
        .map(|u| {
            json!({ "update_id": u.update_id, "state": u.state,
            "creation_time": u.creation_time })
        })
        .collect()
}

pub(crate) async fn list(State(state): State<Arc<AppState>>) -> axum::Json<Value> {
    let hosted = state.pipelines.hosted.lock().await;
    let statuses: Vec<Value> = hosted
        .values()
        .map(|h| {
            json!({
                "pipeline_id": h.entry.pipeline_id,
                "name": h.entry.name,
                "state": pipeline_state(h),
                "latest_updates": latest_updates(h),
            })
        })
        .collect();
    axum::Json(json!({ "statuses": statuses }))
}

/// The pipeline's datasets and flows, read afresh from its files.
fn graph_of(spec: &PipelineSpec) -> Result<Graph, ApiError> {
    let files = spec
        .library_files()
        .map_err(|e| ApiError::of(&weir_engine::Error::from(e)))?;
    Graph::from_files(&files).map_err(|errors| {
        let first = errors.first().cloned();
        let message = errors
            .iter()
            .map(|e| e.message.clone())
            .collect::<Vec<_>>()
            .join(" ");
        ApiError::new(
            StatusCode::BAD_REQUEST,
            first.as_ref().map_or("INVALID_PIPELINE", |e| e.class),
            first.as_ref().map_or("42000", |e| e.sqlstate),
            format!(
                "{} problem(s) in the pipeline's files: {message}",
                errors.len()
            ),
        )
    })
}

fn graph_json(graph: &Graph) -> Value {
    let datasets: Vec<Value> = graph
        .datasets
        .values()
        .map(|d| json!({ "name": d.name, "kind": d.kind.label() }))
        .collect();
    let flows: Vec<Value> = graph
        .flows
        .iter()
        .map(|f| {
            json!({
                "name": f.name,
                "target": f.target,
                "kind": match (f.kind, f.auto_cdc.is_some()) {
                    (FlowKind::Append, true) => "AUTO CDC",
                    (FlowKind::Append, false) => "APPEND",
                    (FlowKind::Once, true) => "AUTO CDC ONCE",
                    (FlowKind::Once, false) => "ONCE",
                    (FlowKind::Complete, _) => "COMPLETE",
                },
                "reads": f.reads,
            })
        })
        .collect();
    json!({ "datasets": datasets, "flows": flows })
}

pub(crate) async fn describe(
    State(state): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let hosted = state.pipelines.hosted.lock().await;
    let h = hosted.get(&id).ok_or_else(|| not_found(&id))?;
    let spec = h.entry.spec();
    let (graph, graph_error) = match spec
        .as_ref()
        .map_err(ApiError::to_string)
        .and_then(|s| graph_of(s).map_err(|e| e.to_string()))
    {
        Ok(g) => (graph_json(&g), Value::Null),
        Err(e) => (Value::Null, json!(e)),
    };
    let flows = h.live.lock().map(|l| json!(l.flows)).unwrap_or(Value::Null);
    Ok(axum::Json(json!({
        "pipeline_id": h.entry.pipeline_id,
        "name": h.entry.name,
        "state": pipeline_state(h),
        "spec": {
            "path": h.entry.spec_path,
            "storage": spec.as_ref().ok().map(|s| s.storage.clone()),
            "libraries": spec.as_ref().ok().map(|s| s.libraries.clone()),
            "configuration": spec.as_ref().ok().map(|s| s.configuration.clone()),
            "continuous": h.entry.continuous,
        },
        "creation_time": h.entry.creation_time,
        "latest_updates": latest_updates(h),
        "running_update_id": h.running.as_ref().map(|r| r.update_id.clone()),
        "graph": graph,
        "graph_error": graph_error,
        "flows": flows,
    })))
}

pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let mut hosted = state.pipelines.hosted.lock().await;
    let h = hosted.get(&id).ok_or_else(|| not_found(&id))?;
    if h.running.is_some() {
        return Err(update_running(&id));
    }
    std::fs::remove_file(state.pipelines.dir.join(format!("{id}.json"))).map_err(storage)?;
    hosted.remove(&id);
    Ok(axum::Json(json!({})))
}

fn update_running(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "PIPELINE_UPDATE_ALREADY_RUNNING",
        "55000",
        format!(
            "Pipeline '{id}' has an update running: wait for it to end, or POST \
             /api/2.0/pipelines/{id}/stop."
        ),
    )
}

/// The body of `POST /api/2.0/pipelines/{id}/updates` (Databricks' fields).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateRequest {
    #[serde(default)]
    full_refresh: bool,
    #[serde(default)]
    refresh_selection: Vec<String>,
    #[serde(default)]
    full_refresh_selection: Vec<String>,
    #[serde(default)]
    reset_checkpoint_selection: Vec<String>,
    /// Databricks' reason for the update; recorded with it.
    cause: Option<String>,
}

/// How often a continuous update runs its flows' batches, unless the spec's
/// `pipelines.trigger.interval` says.
const CONTINUOUS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) async fn start_update(
    State(state): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<Value>, ApiError> {
    // An empty body is an update of everything.
    let req: UpdateRequest = match &raw {
        Ok(b) if b.iter().all(u8::is_ascii_whitespace) => UpdateRequest::default(),
        _ => crate::body(raw)?,
    };
    let mut hosted = state.pipelines.hosted.lock().await;
    let h = hosted.get_mut(&id).ok_or_else(|| not_found(&id))?;
    if h.running.is_some() {
        return Err(update_running(&id));
    }
    let spec = h.entry.spec()?;
    let graph = graph_of(&spec)?;
    let continuous = if h.entry.continuous {
        let interval = match spec
            .configuration
            .get(weir_pipeline::run::TRIGGER_INTERVAL_SETTING)
        {
            Some(v) => weir_common::parse_duration(v, std::time::Duration::from_millis(1))
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    bad_request(
                        "INVALID_CONF_VALUE",
                        format!("pipelines.trigger.interval '{v}' is not a duration."),
                    )
                })?,
            None => CONTINUOUS_INTERVAL,
        };
        Some(interval)
    } else {
        None
    };
    let update_id = uuid::Uuid::new_v4().to_string();
    let live: Arc<std::sync::Mutex<Live>> = Default::default();
    let options = weir_pipeline::UpdateOptions {
        refresh: req.refresh_selection.clone(),
        full_refresh: req.full_refresh_selection.clone(),
        full_refresh_all: req.full_refresh,
        continuous,
        update_id: Some(update_id.clone()),
        observer: Some(weir_pipeline::Observer(Arc::new(LiveObserver {
            pipeline_id: id.clone(),
            pipeline_name: spec.name.clone(),
            live: Arc::clone(&live),
        }))),
    };
    options
        .check()
        .map_err(|e| ApiError::of(&weir_engine::Error::from(e)))?;
    check_names(&graph, &req)?;
    let record = UpdateRecord {
        update_id: update_id.clone(),
        state: "RUNNING".into(),
        creation_time: chrono::Utc::now().to_rfc3339(),
        end_time: None,
        full_refresh: req.full_refresh,
        refresh_selection: req.refresh_selection,
        full_refresh_selection: req.full_refresh_selection,
        reset_checkpoint_selection: req.reset_checkpoint_selection.clone(),
        cause: req.cause.clone(),
        flows: BTreeMap::new(),
        error: None,
    };
    h.entry.updates.push(record);
    put(&state.pipelines.dir, &h.entry).map_err(storage)?;
    h.live = live;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task_state = Arc::clone(&state);
    let (task_id, task_update) = (id.clone(), update_id.clone());
    let reset = req.reset_checkpoint_selection;
    let task = tokio::spawn(async move {
        let result = async {
            if !reset.is_empty() {
                weir_pipeline::reset_flows(&spec, &graph, &reset).await?;
            }
            let stop = async {
                let _ = stop_rx.await;
            };
            weir_pipeline::run_update_until(&spec, &graph, &options, stop).await
        }
        .await;
        finish(&task_state, &task_id, &task_update, result).await;
    });
    h.running = Some(Running {
        update_id: update_id.clone(),
        stop: Some(stop_tx),
        task: Some(task),
    });
    Ok(axum::Json(json!({ "update_id": update_id })))
}

/// Refuses selections naming what the pipeline does not have, before the update starts.
fn check_names(graph: &Graph, req: &UpdateRequest) -> Result<(), ApiError> {
    for name in req
        .refresh_selection
        .iter()
        .chain(&req.full_refresh_selection)
    {
        let known = graph
            .datasets
            .get(&name.to_ascii_lowercase())
            .is_some_and(|d| d.kind != DatasetKind::TemporaryView);
        if !known {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "TABLE_OR_VIEW_NOT_FOUND",
                "42P01",
                format!(
                    "'{name}' is not a streaming table or materialized view of this pipeline; \
                     GET the pipeline for its graph."
                ),
            ));
        }
    }
    for name in &req.reset_checkpoint_selection {
        if !graph
            .flows
            .iter()
            .any(|f| f.name.eq_ignore_ascii_case(name))
        {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "PIPELINE_FLOW_NOT_FOUND",
                "42704",
                format!("'{name}' is not a flow of this pipeline; GET the pipeline for its flows."),
            ));
        }
    }
    Ok(())
}

/// Records how update `update_id` of pipeline `id` ended.
async fn finish(
    state: &AppState,
    id: &str,
    update_id: &str,
    result: Result<Vec<weir_pipeline::FlowOutcome>, weir_engine::Error>,
) {
    let mut hosted = state.pipelines.hosted.lock().await;
    let Some(h) = hosted.get_mut(id) else {
        return;
    };
    let canceled = h
        .running
        .as_ref()
        .is_some_and(|r| r.stop.is_none() && r.update_id == update_id);
    h.running = None;
    let Some(u) = h
        .entry
        .updates
        .iter_mut()
        .find(|u| u.update_id == update_id)
    else {
        return;
    };
    u.end_time = Some(chrono::Utc::now().to_rfc3339());
    match result {
        Ok(outcomes) => {
            let failed = outcomes.iter().find_map(|o| o.result.as_ref().err());
            u.state = if failed.is_some() {
                "FAILED"
            } else if canceled {
                "CANCELED"
            } else {
                "COMPLETED"
            }
            .into();
            u.error = failed.map(|e| error_json(e));
            u.flows = outcomes
                .iter()
                .map(|o| {
                    let what = match &o.result {
                        Ok(weir_pipeline::FlowRun::Streamed { .. }) => "COMPLETED",
                        Ok(weir_pipeline::FlowRun::Wrote { .. }) => "COMPLETED",
                        Ok(weir_pipeline::FlowRun::AlreadyDone) => "SKIPPED",
                        Ok(weir_pipeline::FlowRun::NotRun) => "STOPPED",
                        Ok(weir_pipeline::FlowRun::NotSelected) => "EXCLUDED",
                        Ok(weir_pipeline::FlowRun::Continuous { .. }) => "STOPPED",
                        Err(_) => "FAILED",
                    };
                    (o.flow.clone(), what.to_string())
                })
                .collect();
        }
        Err(e) => {
            u.state = "FAILED".into();
            u.error = Some(error_json(&e));
        }
    }
    if let Err(e) = put(&state.pipelines.dir, &h.entry) {
        tracing::warn!(pipeline = %id, error = %e, "the pipeline's registry entry was not written");
    }
}

fn error_json(e: &weir_engine::Error) -> Value {
    json!({ "errorClass": e.error_class(), "sqlState": e.sql_state(), "message": e.to_string() })
}

pub(crate) async fn list_updates(
    State(state): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let hosted = state.pipelines.hosted.lock().await;
    let h = hosted.get(&id).ok_or_else(|| not_found(&id))?;
    let updates: Vec<&UpdateRecord> = h.entry.updates.iter().rev().collect();
    Ok(axum::Json(json!({ "updates": updates })))
}

pub(crate) async fn get_update(
    State(state): State<Arc<AppState>>,
    UrlPath((id, update_id)): UrlPath<(String, String)>,
) -> Result<axum::Json<Value>, ApiError> {
    let hosted = state.pipelines.hosted.lock().await;
    let h = hosted.get(&id).ok_or_else(|| not_found(&id))?;
    let u = h
        .entry
        .updates
        .iter()
        .find(|u| u.update_id == update_id)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "PIPELINE_UPDATE_NOT_FOUND",
                "42704",
                format!(
                    "Pipeline '{id}' has no update '{update_id}': GET \
                     /api/2.0/pipelines/{id}/updates lists them."
                ),
            )
        })?;
    let mut update = json!(u);
    // The newest update's flows as they go.
    if h.entry
        .updates
        .last()
        .is_some_and(|l| l.update_id == u.update_id)
        && let Ok(live) = h.live.lock()
    {
        update["live_flows"] = json!(live.flows);
    }
    Ok(axum::Json(json!({ "update": update })))
}

pub(crate) async fn stop(
    State(state): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let mut hosted = state.pipelines.hosted.lock().await;
    let h = hosted.get_mut(&id).ok_or_else(|| not_found(&id))?;
    let stopped = match &mut h.running {
        Some(r) => {
            if let Some(tx) = r.stop.take() {
                let _ = tx.send(());
            }
            Some(r.update_id.clone())
        }
        None => None,
    };
    Ok(axum::Json(json!({ "stopping_update_id": stopped })))
}

#[derive(Debug, Deserialize)]
pub(crate) struct EventsQuery {
    max_results: Option<usize>,
    update_id: Option<String>,
}

/// The pipeline's events, newest first: the event log's, with the running update's own from
/// memory (the log gets them at each stage's end).
pub(crate) async fn events(
    State(state): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<EventsQuery>,
) -> Result<axum::Json<Value>, ApiError> {
    let (spec, live_update, live_events) = {
        let hosted = state.pipelines.hosted.lock().await;
        let h = hosted.get(&id).ok_or_else(|| not_found(&id))?;
        let live_update = h.entry.updates.last().map(|u| u.update_id.clone());
        let live_events = h.live.lock().map(|l| l.events.clone()).unwrap_or_default();
        (h.entry.spec()?, live_update, live_events)
    };
    let mut events = logged_events(&state, &spec, &id).await;
    // The newest update's events come from memory, whole.
    if !live_events.is_empty() {
        events.retain(|e| e["origin"]["update_id"].as_str() != live_update.as_deref());
        events.extend(live_events);
    }
    if let Some(u) = &q.update_id {
        events.retain(|e| e["origin"]["update_id"].as_str() == Some(u.as_str()));
    }
    events.sort_by(|a, b| {
        let key = |e: &Value| {
            (
                e["timestamp"].as_str().unwrap_or_default().to_string(),
                e["sequence"].as_i64().unwrap_or_default(),
            )
        };
        key(b).cmp(&key(a))
    });
    events.truncate(q.max_results.unwrap_or(100).min(10_000));
    Ok(axum::Json(json!({ "events": events })))
}

/// The event log's events as the API shows them; none if the pipeline has no log yet.
async fn logged_events(state: &AppState, spec: &PipelineSpec, id: &str) -> Vec<Value> {
    let sql = format!(
        "SELECT id, sequence, timestamp, update_id, event_type, flow_name, level, message, \
         error_class, details FROM event_log('{}')",
        spec.storage.replace('\'', "''")
    );
    let Ok(df) = state.session.context().sql(&sql).await else {
        return vec![];
    };
    let Ok(batches) = df.collect().await else {
        return vec![];
    };
    let mut writer = arrow::json::ArrayWriter::new(Vec::new());
    for b in &batches {
        if writer.write(b).is_err() {
            return vec![];
        }
    }
    if writer.finish().is_err() {
        return vec![];
    }
    let rows: Vec<Value> = serde_json::from_slice(&writer.into_inner()).unwrap_or_default();
    rows.into_iter()
        .map(|r| {
            let details: Value =
                serde_json::from_str(r["details"].as_str().unwrap_or("{}")).unwrap_or(Value::Null);
            let timestamp = r["timestamp"].as_str().and_then(|t| {
                chrono::DateTime::parse_from_rfc3339(t)
                    .map(|t| t.to_utc())
                    .or_else(|_| {
                        chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S%.f")
                            .map(|t| t.and_utc())
                    })
                    .ok()
                    .map(rfc3339)
            });
            json!({
                "id": r["id"],
                "sequence": r["sequence"],
                "timestamp": timestamp.map_or(r["timestamp"].clone(), Value::from),
                "origin": {
                    "pipeline_id": id,
                    "pipeline_name": spec.name,
                    "update_id": r["update_id"],
                    "flow_name": r["flow_name"],
                },
                "event_type": r["event_type"],
                "level": r["level"],
                "message": r["message"],
                "error_class": r["error_class"],
                "details": details,
            })
        })
        .collect()
}

/// A time as the API writes it: RFC 3339 in UTC with microseconds, so times sort as text.
fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}
