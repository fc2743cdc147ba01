//! The web UI of `weir serve` in a real headless Chromium (Debian's `chromium`, driven through
//! `chromedriver`'s WebDriver API): the pages load with no console error, the query page's
//! charts draw points for a running stateful query, a stop through the page stops the query, and
//! the pipeline page draws the graph and starts a full refresh after asking. Screenshots go to
//! the test's output folder (`$CARGO_TARGET_TMPDIR/weir-ui`), not the repository.

use std::io::{Read, Write};

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use crate::server::Server;

/// `METHOD path body` against `addr`: the status and the JSON body.
fn http(addr: &str, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Read the head, then the body by its length (chromedriver may keep the connection).
    let mut reader = std::io::BufReader::new(s);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut reader, &mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())
            .flatten()
    });
    let mut text = vec![];
    match length {
        Some(n) => {
            text.resize(n, 0);
            reader.read_exact(&mut text).unwrap();
        }
        None => {
            reader.read_to_end(&mut text).unwrap();
        }
    }
    let text = String::from_utf8_lossy(&text);
    let json = text
        .find('{')
        .and_then(|i| text.rfind('}').map(|j| &text[i..=j]))
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

/// A chromedriver process and one browser session in it.
struct Browser {
    driver: Child,
    addr: String,
    session: String,
    profile: tempfile::TempDir,
}

impl Browser {
    fn start() -> Self {
        let driver_path =
            std::env::var("WEIR_CHROMEDRIVER").unwrap_or("/usr/bin/chromedriver".into());
        let chromium = std::env::var("WEIR_CHROMIUM").unwrap_or("/usr/bin/chromium".into());
        assert!(
            std::path::Path::new(&driver_path).exists() && std::path::Path::new(&chromium).exists(),
            "the UI test needs Debian's chromium and chromium-driver ({chromium}, {driver_path}); \
             scripts/test installs them when missing (apt-get install chromium chromium-driver)"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}");
        // From here on, dropping the browser stops chromedriver (and its Chromium), also when
        // the session does not start.
        let mut browser = Self {
            driver,
            addr: addr.clone(),
            session: String::new(),
            profile: tempfile::tempdir().unwrap(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile = browser.profile.path().to_path_buf();
        let (status, created) = http(
            &addr,
            "POST",
            "/session",
            &json!({ "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": [
                        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync",
                        "--disable-dev-shm-usage", "--window-size=1400,2400",
                        format!("--user-data-dir={}", profile.display()),
                    ],
                },
                "goog:loggingPrefs": { "browser": "ALL" },
            } } }),
        );
        assert_eq!(status, 200, "no browser session: {created}");
        browser.session = created["value"]["sessionId"].as_str().unwrap().to_string();
        browser
    }

    fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let (status, v) = http(
            &self.addr,
            method,
            &format!("/session/{}{path}", self.session),
            &body,
        );
        assert_eq!(status, 200, "{method} {path}: {v}");
        v["value"].clone()
    }

    fn open(&self, url: &str) {
        self.call("POST", "/url", json!({ "url": url }));
    }

    fn script(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            json!({ "script": script, "args": [] }),
        )
    }

    /// Runs `script` until it returns true.
    fn wait_for(&self, what: &str, script: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.script(script) != Value::Bool(true) {
            assert!(
                Instant::now() < deadline,
                "the page never showed {what}; it shows: {}",
                self.script("return document.body.innerText")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn click(&self, css: &str) {
        let e = self.call(
            "POST",
            "/element",
            json!({ "using": "css selector", "value": css }),
        );
        let id = e
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(|v| v.as_str())
            .unwrap()
            .to_string();
        self.call("POST", &format!("/element/{id}/click"), json!({}));
    }

    /// Saves a screenshot of the page as `name`.png in the test output folder; its path.
    fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.call("GET", "/screenshot", Value::Null);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("weir-ui");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, bytes).unwrap();
        println!("screenshot: {}", path.display());
        path
    }

    /// The browser console's errors so far (and the page's uncaught errors).
    fn console_errors(&self) -> Vec<String> {
        let logs = self.call("POST", "/se/log", json!({ "type": "browser" }));
        let mut errors: Vec<String> = logs
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].to_string())
            .collect();
        if let Value::Array(page) = self.script("return window.weirErrors || []") {
            errors.extend(page.iter().map(Value::to_string));
        }
        errors
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = http(
                &self.addr,
                "DELETE",
                &format!("/session/{}", self.session),
                &Value::Null,
            );
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// For each chart of the query page: its title, its points, and how many of its canvas's pixels
/// are coloured (so points and lines were drawn, not only the grey axes and grid).
const CHARTS_DRAWN: &str = r#"
return window.weirCharts.map((c) => {
  const d = c.ctx.getImageData(0, 0, c.ctx.canvas.width, c.ctx.canvas.height).data;
  let painted = 0;
  for (let i = 0; i < d.length; i += 4) {
    // Axes and grid are grey; series are coloured.
    if (Math.max(d[i], d[i + 1], d[i + 2]) - Math.min(d[i], d[i + 1], d[i + 2]) > 60 && d[i + 3] > 100) painted++;
  }
  const values = c.data.slice(1).flat().filter((v) => v !== null && v !== undefined).length;
  return { title: c.weirSpec.title, points: c.data[0].length, values, painted };
});
"#;

#[test]
fn the_web_ui_shows_a_running_query_charts_and_stops_it_and_drives_a_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let base = format!("http://{}", server.addr);
    // A windowed count with a watermark: every chart has something to draw.
    let sql = format!(
        "CREATE STREAMING TABLE counts USING json LOCATION '{}' AS \
         SELECT window(timestamp, '1 second') AS w, count(*) AS n \
         FROM STREAM rate(rowsPerSecond => 500) \
         WATERMARK timestamp DELAY OF INTERVAL 1 SECOND \
         GROUP BY window(timestamp, '1 second')",
        dir.path().join("out").display()
    );
    let (status, created) = server.post(
        "/api/v1/queries",
        &json!({ "sql": sql, "name": "windowed counts", "trigger": "200 milliseconds" })
            .to_string(),
    );
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    server.wait_for_batch(&id, 2);

    let browser = Browser::start();
    // The query list.
    browser.open(&format!("{base}/#/"));
    browser.wait_for(
        "the query in the list",
        "return [...document.querySelectorAll('#queries tbody tr')].some((r) => r.textContent.includes('windowed counts') && /active|waiting/.test(r.textContent))",
    );

    // The query page: every chart draws its points.
    browser.open(&format!("{base}/#/query/{id}"));
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let charts = browser.script(CHARTS_DRAWN);
        let list = charts.as_array().unwrap();
        let drawn = list.len() == 10
            && list.iter().all(|c| {
                c["points"].as_u64() >= Some(5)
                    && c["values"].as_u64() >= Some(3)
                    && c["painted"].as_u64() >= Some(20)
            });
        if drawn {
            break;
        }
        assert!(Instant::now() < deadline, "charts not drawn: {charts}");
        std::thread::sleep(Duration::from_millis(300));
    }
    browser.wait_for(
        "the operators from the checkpoint",
        "const t = document.querySelector('#operators'); return !!t && t.textContent.includes('aggregate')",
    );
    let shot = browser.screenshot("query-page");
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);

    // Stop through the page, confirming in its dialog.
    browser.click("#stop");
    browser.wait_for(
        "the confirmation",
        "return document.getElementById('confirm').open",
    );
    browser.click("#confirm-yes");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, q) = server.get(&format!("/api/v1/queries/{id}"));
        if q["status"] == "stopped" {
            break;
        }
        assert!(Instant::now() < deadline, "the query did not stop: {q}");
        std::thread::sleep(Duration::from_millis(100));
    }
    browser.wait_for(
        "the stopped status",
        "return document.querySelector('h1 .status').textContent === 'stopped'",
    );

    // A pipeline: its graph, and a full refresh asked for and confirmed.
    let project = crate::pipelines::project(dir.path(), crate::pipelines::PIPELINE);
    let (_, created) = server.post(
        "/api/2.0/pipelines",
        &json!({ "spec": project.join("weir-pipeline.yml") }).to_string(),
    );
    let pipeline = created["pipeline_id"].as_str().unwrap().to_string();
    let (_, started) = server.post(&format!("/api/2.0/pipelines/{pipeline}/updates"), "");
    let first = started["update_id"].as_str().unwrap().to_string();
    server.wait_for_update(&pipeline, &first, &["COMPLETED"]);
    browser.open(&format!("{base}/#/pipeline/{pipeline}"));
    browser.wait_for(
        "the graph with every flow",
        "return document.querySelectorAll('#graph g.flow').length === 5 && document.querySelectorAll('#graph g.dataset').length === 3",
    );
    browser.wait_for(
        "the update's events",
        "const t = document.querySelector('#events'); return !!t && t.textContent.includes('Update has COMPLETED')",
    );
    browser.click("#full-refresh-all");
    browser.wait_for(
        "the confirmation",
        "return document.getElementById('confirm').open",
    );
    browser.screenshot("pipeline-page-confirm");
    browser.click("#confirm-yes");
    let deadline = Instant::now() + Duration::from_secs(60);
    let refresh = loop {
        let (_, u) = server.get(&format!("/api/2.0/pipelines/{pipeline}/updates"));
        let newest = u["updates"][0].clone();
        if newest["update_id"] != first.as_str() && newest["state"] == "COMPLETED" {
            break newest;
        }
        assert!(Instant::now() < deadline, "no full refresh: {u}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(refresh["full_refresh"], true, "{refresh}");
    browser.wait_for(
        "the refresh in the updates",
        "return document.querySelector('#updates tbody').textContent.includes('full refresh')",
    );
    browser.screenshot("pipeline-page");

    let errors = browser.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:?}");
    // The check sees an error when there is one.
    browser.script("console.error('probe'); return true");
    assert!(browser.console_errors().iter().any(|e| e.contains("probe")));
}
