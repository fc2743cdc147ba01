//! `weir serve` as a process on a free loopback port, driven over HTTP: submit, list, watch,
//! stop; malformed requests get JSON 4xx errors; the token; and a server killed with SIGKILL and
//! started again resumes its queries from their checkpoints, losing and doubling nothing.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support;

/// A running `weir serve` and its address.
pub(crate) struct Server {
    child: Child,
    pub(crate) addr: String,
}

impl Server {
    /// Starts `weir serve --listen 127.0.0.1:0 --data DATA ARGS` and waits for its address.
    pub(crate) fn start(data: &Path, args: &[&str]) -> Self {
        let mut child = support::weir_command()
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("weir serve listening on http://")
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        Self { child, addr }
    }

    /// `METHOD path` with `body` (and `token`): the status and the JSON body.
    fn call(&self, method: &str, path: &str, body: &str, token: Option<&str>) -> (u16, Value) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n{auth}Content-Type: \
             application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status: u16 = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no status in {out:?}"));
        let text = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (status, serde_json::from_str(text).unwrap_or(Value::Null))
    }

    /// The data of the first `n` server-sent events of `GET path`.
    fn events(&self, path: &str, n: usize) -> Vec<Value> {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        // HTTP/1.0: the body is not chunked, so each event line arrives whole.
        write!(s, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).unwrap();
        let mut out = vec![];
        for line in BufReader::new(s).lines() {
            let line = line.unwrap();
            if let Some(data) = line.strip_prefix("data: ") {
                out.push(serde_json::from_str(data).unwrap());
                if out.len() == n {
                    break;
                }
            }
        }
        out
    }

    /// `GET path`: the status and the body as text.
    pub(crate) fn text(&self, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (
            status,
            out.split_once("\r\n\r\n")
                .map_or("", |(_, b)| b)
                .to_string(),
        )
    }

    pub(crate) fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, "", None)
    }

    pub(crate) fn post(&self, path: &str, body: &str) -> (u16, Value) {
        self.call("POST", path, body, None)
    }

    /// Waits until query `id` has committed batch `batch` (or later); its newest batch.
    pub(crate) fn wait_for_batch(&self, id: &str, batch: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, q) = self.get(&format!("/api/v1/queries/{id}"));
            if let Some(b) = q["lastProgress"]["batchId"].as_u64()
                && b >= batch
            {
                return b;
            }
            assert!(Instant::now() < deadline, "batch {batch} never came: {q}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn submit_body(out: &Path) -> String {
    serde_json::json!({
        "sql": format!(
            "CREATE STREAMING TABLE numbers USING json LOCATION '{}' AS \
             SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 5, numPartitions => 1)",
            out.display()
        ),
        "name": "numbers",
        "trigger": "100 milliseconds",
    })
    .to_string()
}

/// The values the JSON sink at `out` holds, sorted.
fn values(out: &Path) -> Vec<i64> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let session = weir::WeirSession::new();
        support::text_rows(
            &session,
            &format!(
                "CREATE EXTERNAL TABLE o STORED AS JSON LOCATION '{}'",
                out.display()
            ),
        )
        .await;
        support::text_rows(&session, "SELECT value FROM o ORDER BY value")
            .await
            .iter()
            .map(|v| v.parse().unwrap())
            .collect()
    })
}

#[test]
fn queries_are_submitted_watched_and_stopped_over_http_with_json_errors() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let out = dir.path().join("out");
    let (status, created) = server.post("/api/v1/queries", &submit_body(&out));
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    server.wait_for_batch(&id, 2);

    let (status, list) = server.get("/api/v1/queries");
    assert_eq!(status, 200);
    assert_eq!(list["queries"][0]["id"], id.as_str());
    assert_eq!(list["queries"][0]["name"], "numbers");
    let (_, one) = server.get(&format!("/api/v1/queries/{id}"));
    assert!(
        ["active", "waiting for data"].contains(&one["status"].as_str().unwrap()),
        "{one}"
    );
    assert_eq!(
        one["lastProgress"]["name"], "numbers",
        "Spark's progress JSON"
    );
    let (_, progress) = server.get(&format!("/api/v1/queries/{id}/progress?since=0"));
    let batches: Vec<u64> = progress["recentProgress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["batchId"].as_u64().unwrap())
        .collect();
    assert!(
        !batches.is_empty() && batches.iter().all(|&b| b > 0),
        "{progress}"
    );
    // Prometheus metrics of the newest batch, parsed as Prometheus parses them.
    let (status, metrics) = server.text("/metrics");
    assert_eq!(status, 200);
    let scrape = prometheus_parse::Scrape::parse(metrics.lines().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|e| panic!("{e}: {metrics}"));
    let sample = |name: &str, label: (&str, &str)| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && s.labels.get(label.0) == Some(label.1))
            .map(|s| match s.value {
                prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
    };
    assert!(
        sample("weir_query_processed_rows_per_second", ("name", "numbers"))
            .is_some_and(|v| v >= 0.0),
        "{metrics}"
    );
    assert!(
        sample(
            "weir_query_operation_duration_ms",
            ("operation", "triggerExecution")
        )
        .is_some(),
        "{metrics}"
    );
    assert!(
        sample("weir_queries", ("status", "active"))
            .or(sample("weir_queries", ("status", "waiting for data")))
            == Some(1.0),
        "{metrics}"
    );

    // Server-sent events: each batch after `since`, Spark's JSON, in order.
    let streamed = server.events(&format!("/api/v1/queries/{id}/progress/stream?since=1"), 3);
    let ids: Vec<u64> = streamed
        .iter()
        .map(|p| p["batchId"].as_u64().unwrap())
        .collect();
    assert_eq!(ids.len(), 3);
    assert!(
        ids[0] >= 2 && ids.windows(2).all(|w| w[1] == w[0] + 1),
        "{ids:?}"
    );
    let (_, health) = server.get(&format!("/api/v1/queries/{id}/health"));
    assert!(
        health["health"][0]["fallingBehind"].is_boolean(),
        "{health}"
    );

    let (status, stopped) = server.post(&format!("/api/v1/queries/{id}/stop"), "");
    assert_eq!(status, 200);
    assert_eq!(stopped["status"], "stopped");
    // The stopped query's checkpoint, inspected and validated over HTTP.
    let checkpoint = one["checkpoint"].as_str().unwrap().to_string();
    let (status, inspected) = server.get(&format!("/api/v1/checkpoints/inspect?path={checkpoint}"));
    assert_eq!(status, 200, "{inspected}");
    assert!(
        inspected["lastCommitted"].as_u64().is_some_and(|b| b >= 2),
        "{inspected}"
    );
    assert_eq!(inspected["queryId"], one["queryId"], "{inspected}");
    let validate = |sql: String| {
        server.post(
            "/api/v1/checkpoints/validate",
            &serde_json::json!({ "path": checkpoint, "sql": sql }).to_string(),
        )
    };
    let (status, same) = validate(
        serde_json::from_str::<Value>(&submit_body(&out)).unwrap()["sql"]
            .as_str()
            .unwrap()
            .to_string(),
    );
    assert_eq!(
        (status, same["accepted"].as_bool()),
        (200, Some(true)),
        "{same}"
    );
    let (status, other) = validate(format!(
        "CREATE STREAMING TABLE numbers USING json LOCATION '{}' AS \
         SELECT DISTINCT ON (value) value FROM STREAM rate_micro_batch(rowsPerBatch => 5, numPartitions => 1)",
        out.display()
    ));
    assert_eq!(
        (status, other["accepted"].as_bool()),
        (200, Some(false)),
        "{other}"
    );
    let (status, e) = server.get("/api/v1/checkpoints/inspect?path=/nonexistent/weir/ck");
    assert!((400..500).contains(&status), "{status} {e}");
    assert!(e["errorClass"].as_str().is_some(), "{e}");
    let written = values(&out);
    assert_eq!(written, (0..written.len() as i64).collect::<Vec<_>>());

    // The OpenAPI description names every endpoint the tests call.
    let (status, api) = server.get("/api/v1/openapi.json");
    assert_eq!((status, api["openapi"].as_str()), (200, Some("3.1.0")));
    for path in [
        "/api/v1/queries",
        "/api/v1/queries/{id}",
        "/api/v1/queries/{id}/progress",
        "/api/v1/queries/{id}/progress/stream",
        "/api/v1/queries/{id}/health",
        "/api/v1/queries/{id}/stop",
        "/api/v1/queries/{id}/restart",
        "/api/v1/checkpoints/inspect",
        "/api/v1/checkpoints/validate",
        "/api/2.0/pipelines",
        "/api/2.0/pipelines/{id}",
        "/api/2.0/pipelines/{id}/updates",
        "/api/2.0/pipelines/{id}/updates/{update_id}",
        "/api/2.0/pipelines/{id}/stop",
        "/api/2.0/pipelines/{id}/events",
        "/metrics",
    ] {
        assert!(api["paths"][path].is_object(), "{path} in {api}");
    }

    // The client's mistakes: 4xx with weir's error class, never a 500.
    let (status, e) = server.get("/api/v1/queries/nope");
    assert_eq!(
        (status, e["errorClass"].as_str()),
        (404, Some("STREAMING_QUERY_NOT_FOUND"))
    );
    let (status, e) = server.post("/api/v1/queries", "{not json");
    assert_eq!(
        (status, e["errorClass"].as_str()),
        (400, Some("INVALID_REQUEST_BODY"))
    );
    let (status, e) = server.post("/api/v1/queries", r#"{"sql": "SELECT 1", "colour": 1}"#);
    assert_eq!(
        (status, e["errorClass"].as_str()),
        (400, Some("INVALID_REQUEST_BODY"))
    );
    let (status, e) = server.post("/api/v1/queries", r#"{"sql": "SELEKT nothing"}"#);
    assert_eq!(status, 400, "{e}");
    assert!(
        e["errorClass"].as_str().is_some() && e["sqlState"].as_str().is_some(),
        "{e}"
    );
    let (status, e) = server.post("/api/v1/queries", r#"{"sql": "SELECT 1"}"#);
    assert_eq!(
        (status, e["errorClass"].as_str()),
        (400, Some("NOT_A_STREAMING_QUERY"))
    );
    let big = format!(r#"{{"sql": "{}"}}"#, "x".repeat(2 << 20));
    let (status, e) = server.post("/api/v1/queries", &big);
    assert_eq!(
        (status, e["errorClass"].as_str()),
        (413, Some("REQUEST_TOO_LARGE"))
    );
    let (status, e) = server.get("/nowhere");
    assert_eq!((status, e["errorClass"].as_str()), (404, Some("NOT_FOUND")));
}

#[test]
fn a_server_killed_and_started_again_resumes_its_queries_losing_and_doubling_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = dir.path().join("out");
    let first = Server::start(&data, &[]);
    let (status, created) = first.post("/api/v1/queries", &submit_body(&out));
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let before = first.wait_for_batch(&id, 3);
    drop(first); // SIGKILL

    let second = Server::start(&data, &[]);
    let (_, q) = second.get(&format!("/api/v1/queries/{id}"));
    assert_eq!(q["name"], "numbers", "{q}");
    let after = second.wait_for_batch(&id, before + 3);
    assert!(after > before);
    let (status, _) = second.post(&format!("/api/v1/queries/{id}/stop"), "");
    assert_eq!(status, 200);
    let written = values(&out);
    assert!(written.len() as u64 >= (after + 1) * 5, "{written:?}");
    assert_eq!(
        written,
        (0..written.len() as i64).collect::<Vec<_>>(),
        "every value once"
    );
    // Stopped stays stopped when the server starts again.
    drop(second);
    let third = Server::start(&data, &[]);
    let (_, q) = third.get(&format!("/api/v1/queries/{id}"));
    assert_eq!(q["status"], "stopped", "{q}");
}

#[test]
fn a_token_is_required_when_the_server_has_one_and_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &["--token", "s3cret"]);
    let (status, e) = server.get("/api/v1/queries");
    assert_eq!(
        (status, e["errorClass"].as_str()),
        (401, Some("UNAUTHORIZED"))
    );
    let (status, _) = server.call("GET", "/api/v1/queries", "", Some("wrong"));
    assert_eq!(status, 401);
    let (status, list) = server.call("GET", "/api/v1/queries", "", Some("s3cret"));
    assert_eq!(status, 200, "{list}");
    // The web UI's own files load without the token (the page then asks for it); the API
    // behind them does not.
    let (status, page) = server.text("/");
    assert_eq!(status, 200);
    assert!(page.contains("/ui/app.js"), "{page}");
    let (status, script) = server.text("/ui/app.js");
    assert_eq!(status, 200);
    assert!(script.contains("askToken"));
    assert_eq!(server.text("/ui/uPlot.iife.min.js").0, 200);
    assert_eq!(server.text("/ui/nothing.js").0, 404);
    assert_eq!(server.text("/metrics").0, 401);

    let (ok, _, err) = support::weir(&[
        "serve",
        "--listen",
        "0.0.0.0:0",
        "--data",
        dir.path().join("other").to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("SERVER_TOKEN_REQUIRED"), "{err}");
}

impl Server {
    /// Waits until update `update` of pipeline `id` is in one of `states`; the update.
    pub(crate) fn wait_for_update(&self, id: &str, update: &str, states: &[&str]) -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (status, u) = self.get(&format!("/api/2.0/pipelines/{id}/updates/{update}"));
            assert_eq!(status, 200, "{u}");
            if states.iter().any(|s| u["update"]["state"] == *s) {
                return u["update"].clone();
            }
            assert!(
                Instant::now() < deadline,
                "update never got to {states:?}: {u}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn pipelines_are_created_updated_with_databricks_selections_and_their_events_read_over_http() {
    use crate::pipelines::{PIPELINE, project, rows};
    let dir = tempfile::tempdir().unwrap();
    let project = project(dir.path(), PIPELINE);
    let server = Server::start(&dir.path().join("data"), &[]);
    let spec = project.join("weir-pipeline.yml");
    let (status, created) = server.post(
        "/api/2.0/pipelines",
        &serde_json::json!({ "spec": spec }).to_string(),
    );
    assert_eq!(status, 200, "{created}");
    let id = created["pipeline_id"].as_str().unwrap().to_string();
    // The same name twice is refused.
    let (status, e) = server.post(
        "/api/2.0/pipelines",
        &serde_json::json!({ "spec": spec }).to_string(),
    );
    assert_eq!(
        (status, e["errorClass"].as_str()),
        (409, Some("PIPELINE_ALREADY_EXISTS"))
    );
    let (_, list) = server.get("/api/2.0/pipelines");
    assert_eq!(list["statuses"][0]["name"], "p", "{list}");
    assert_eq!(list["statuses"][0]["state"], "IDLE", "{list}");

    // The graph, read from the files.
    let (_, p) = server.get(&format!("/api/2.0/pipelines/{id}"));
    let flows: Vec<&str> = p["graph"]["flows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(flows, ["raw", "evens", "odds", "seed", "total"], "{p}");
    assert_eq!(p["graph"]["flows"][1]["reads"], serde_json::json!(["raw"]));

    // An update of everything (an empty body, as Databricks takes it).
    let (status, started) = server.post(&format!("/api/2.0/pipelines/{id}/updates"), "");
    assert_eq!(status, 200, "{started}");
    let first = started["update_id"].as_str().unwrap().to_string();
    let u = server.wait_for_update(&id, &first, &["COMPLETED", "FAILED"]);
    assert_eq!(u["state"], "COMPLETED", "{u}");
    assert_eq!(u["flows"]["seed"], "COMPLETED", "{u}");
    assert_eq!(u["live_flows"]["raw"]["status"], "COMPLETED", "{u}");
    assert_eq!(u["live_flows"]["raw"]["input_rows"], 4, "{u}");
    assert_eq!(
        rows(
            &project,
            &["all_rows"],
            "SELECT value FROM all_rows ORDER BY value"
        ),
        ["-1", "0", "1", "2", "3"]
    );

    // Its events, from the event log, newest first.
    let (_, ev) = server.get(&format!(
        "/api/2.0/pipelines/{id}/events?update_id={first}&max_results=1000"
    ));
    let events = ev["events"].as_array().unwrap();
    assert_eq!(
        events[0]["details"]["update_progress"]["state"], "COMPLETED",
        "{ev}"
    );
    assert_eq!(
        events.last().unwrap()["event_type"],
        "create_update",
        "{ev}"
    );
    assert!(
        events.iter().any(|e| e["origin"]["flow_name"] == "evens"
            && e["details"]["flow_progress"]["status"] == "RUNNING"
            && e["details"]["flow_progress"]["progress"]["numInputRows"] == 4
            && e["details"]["flow_progress"]["progress"]["sink"]["numOutputRows"] == 2),
        "{ev}"
    );

    // Selections the pipeline cannot mean are refused before anything runs.
    for (body, class) in [
        (
            r#"{"refresh_selection": ["nope"]}"#,
            "TABLE_OR_VIEW_NOT_FOUND",
        ),
        (
            r#"{"reset_checkpoint_selection": ["nope"]}"#,
            "PIPELINE_FLOW_NOT_FOUND",
        ),
        (
            r#"{"full_refresh": true, "refresh_selection": ["raw"]}"#,
            "CONFLICTING_PIPELINE_REFRESH_OPTIONS",
        ),
        (r#"{"full_refresh": "yes"}"#, "INVALID_REQUEST_BODY"),
    ] {
        let (status, e) = server.post(&format!("/api/2.0/pipelines/{id}/updates"), body);
        assert_eq!(
            (status, e["errorClass"].as_str()),
            (400, Some(class)),
            "{body}: {e}"
        );
    }
    let (status, e) = server.post("/api/2.0/pipelines/nope/updates", "");
    assert_eq!(
        (status, e["errorClass"].as_str()),
        (404, Some("PIPELINE_NOT_FOUND"))
    );

    // A selective update: only `total` is refreshed (fully); nothing else reads a batch.
    let (_, started) = server.post(
        &format!("/api/2.0/pipelines/{id}/updates"),
        r#"{"full_refresh_selection": ["total"]}"#,
    );
    let second = started["update_id"].as_str().unwrap().to_string();
    let u = server.wait_for_update(&id, &second, &["COMPLETED", "FAILED"]);
    assert_eq!(u["state"], "COMPLETED", "{u}");
    assert_eq!(u["flows"]["raw"], "EXCLUDED", "{u}");
    assert_eq!(u["flows"]["total"], "COMPLETED", "{u}");
    assert_eq!(
        rows(&project, &["total"], "SELECT n, s FROM total"),
        ["4,6"]
    );

    // A reset of one flow's checkpoint, then an update of everything.
    let (_, started) = server.post(
        &format!("/api/2.0/pipelines/{id}/updates"),
        r#"{"reset_checkpoint_selection": ["evens"], "cause": "API_CALL"}"#,
    );
    let third = started["update_id"].as_str().unwrap().to_string();
    let u = server.wait_for_update(&id, &third, &["COMPLETED", "FAILED"]);
    assert_eq!(u["state"], "COMPLETED", "{u}");
    assert_eq!(
        u["reset_checkpoint_selection"],
        serde_json::json!(["evens"])
    );
    let (_, updates) = server.get(&format!("/api/2.0/pipelines/{id}/updates"));
    assert_eq!(updates["updates"].as_array().unwrap().len(), 3, "{updates}");
    assert_eq!(updates["updates"][0]["update_id"], third.as_str());
}

#[test]
fn a_continuous_pipeline_runs_until_stopped_and_a_killed_server_knows_its_pipelines_again() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(
        lib.join("t.sql"),
        "CREATE STREAMING TABLE numbers AS \
         SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 3);",
    )
    .unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, &[]);
    // Created from Databricks' fields rather than a spec file.
    let body = serde_json::json!({
        "name": "cont",
        "storage": dir.path().join("store"),
        "root_path": dir.path(),
        "libraries": [{ "glob": { "include": "lib/**" } }],
        "configuration": { "pipelines.trigger.interval": "100 milliseconds" },
        "continuous": true,
    });
    let (status, created) = server.post("/api/2.0/pipelines", &body.to_string());
    assert_eq!(status, 200, "{created}");
    let id = created["pipeline_id"].as_str().unwrap().to_string();
    let (_, started) = server.post(&format!("/api/2.0/pipelines/{id}/updates"), "{}");
    let update = started["update_id"].as_str().unwrap().to_string();
    // It runs continuously: the flow's batches keep coming, and a second update waits.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, p) = server.get(&format!("/api/2.0/pipelines/{id}"));
        if p["flows"]["numbers"]["last_progress"]["batchId"].as_u64() >= Some(3) {
            assert_eq!(p["state"], "RUNNING", "{p}");
            break;
        }
        assert!(Instant::now() < deadline, "no batches: {p}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, e) = server.post(&format!("/api/2.0/pipelines/{id}/updates"), "");
    assert_eq!(
        (status, e["errorClass"].as_str()),
        (409, Some("PIPELINE_UPDATE_ALREADY_RUNNING"))
    );
    let (status, _) = server.post(&format!("/api/2.0/pipelines/{id}/stop"), "");
    assert_eq!(status, 200);
    let u = server.wait_for_update(&id, &update, &["CANCELED", "FAILED", "COMPLETED"]);
    assert_eq!(u["state"], "CANCELED", "{u}");

    // Killed during an update: started again, it knows the pipeline, and the update that was
    // running is CANCELED.
    let (_, started) = server.post(&format!("/api/2.0/pipelines/{id}/updates"), "");
    let killed = started["update_id"].as_str().unwrap().to_string();
    server.wait_for_update(&id, &killed, &["RUNNING"]);
    drop(server); // SIGKILL
    let server = Server::start(&data, &[]);
    let (_, p) = server.get(&format!("/api/2.0/pipelines/{id}"));
    assert_eq!(p["name"], "cont", "{p}");
    assert_eq!(p["latest_updates"][0]["update_id"], killed.as_str(), "{p}");
    assert_eq!(p["latest_updates"][0]["state"], "CANCELED", "{p}");
    // The stopped update's events, now from the event log.
    let (_, ev) = server.get(&format!(
        "/api/2.0/pipelines/{id}/events?update_id={update}"
    ));
    assert_eq!(
        ev["events"][0]["details"]["update_progress"]["state"], "CANCELED",
        "{ev}"
    );
    assert!(
        !ev["events"][0]["id"].as_str().unwrap().starts_with(&update),
        "read from the log, not memory: {ev}"
    );
    let (status, _) = server.call("DELETE", &format!("/api/2.0/pipelines/{id}"), "", None);
    assert_eq!(status, 200);
    let (status, _) = server.get(&format!("/api/2.0/pipelines/{id}"));
    assert_eq!(status, 404);
}
