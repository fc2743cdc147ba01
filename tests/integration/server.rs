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
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    /// Starts `weir serve --listen 127.0.0.1:0 --data DATA ARGS` and waits for its address.
    fn start(data: &Path, args: &[&str]) -> Self {
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
    fn text(&self, path: &str) -> (u16, String) {
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

    fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, "", None)
    }

    fn post(&self, path: &str, body: &str) -> (u16, Value) {
        self.call("POST", path, body, None)
    }

    /// Waits until query `id` has committed batch `batch` (or later); its newest batch.
    fn wait_for_batch(&self, id: &str, batch: u64) -> u64 {
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

    let (ok, _, err) = support::weir(&[
        "serve",
        "--listen",
        "0.0.0.0:0",
        "--data",
        dir.path().join("other").to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("SERVER_TOKEN_REQUIRED"), "{err}");
}
