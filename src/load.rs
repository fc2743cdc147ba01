//! `weir bench --workload server-load`: one `weir serve` (in this process, on a loopback port)
//! hosting `--queries` streaming queries on rate sources, half stateless and half windowed
//! counts with a watermark, each reading 1,000 rows per second with a 1-second trigger, while
//! a client sends `--rps` API requests per second for `--seconds` (the query list, a query,
//! its progress since its last batch, the Prometheus metrics, in turn). It reports the API's
//! latency per endpoint (p50, p99, max), the process's peak and final memory, and whether every
//! query kept up: read what its source produced (no batch behind at the end) and processed at
//! least as fast as rows arrived.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

/// What the load run is given.
pub struct LoadConfig {
    pub queries: usize,
    pub rps: u64,
    pub seconds: u64,
    pub json: bool,
}

/// Rows each query's source produces per second.
const ROWS_PER_SECOND: u64 = 1000;

fn rss_bytes() -> u64 {
    weir::bench::proc_status_bytes("VmRSS:")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub async fn run(cfg: LoadConfig) -> anyhow::Result<()> {
    let data = tempfile_dir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let listen: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(weir_server::serve(
        weir_server::ServerConfig {
            listen,
            data: data.clone(),
            token: None,
        },
        async {
            let _ = stop_rx.await;
        },
    ));
    let base = format!("http://{listen}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while client
        .get(format!("{base}/api/v1/queries"))
        .send()
        .await
        .is_err()
    {
        anyhow::ensure!(Instant::now() < deadline, "the server did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss_idle = rss_bytes();
    eprintln!(
        "weir bench server-load: starting {} queries on http://{listen} ...",
        cfg.queries
    );
    let mut ids = vec![];
    for i in 0..cfg.queries {
        let sql = if i % 2 == 0 {
            format!(
                "SELECT value, value * 2 AS doubled FROM STREAM rate(rowsPerSecond => \
                 {ROWS_PER_SECOND})"
            )
        } else {
            format!(
                "SELECT window(timestamp, '5 seconds') AS w, value % 100 AS k, count(*) AS n \
                 FROM STREAM rate(rowsPerSecond => {ROWS_PER_SECOND}) \
                 WATERMARK timestamp DELAY OF INTERVAL 2 SECONDS \
                 GROUP BY window(timestamp, '5 seconds'), value % 100"
            )
        };
        let body = serde_json::json!({ "sql": sql, "name": format!("load-{i}"),
            "trigger": "1 second" });
        let r = client
            .post(format!("{base}/api/v1/queries"))
            .body(body.to_string())
            .header("Content-Type", "application/json")
            .send()
            .await?;
        let status = r.status();
        let v: Value = serde_json::from_slice(&r.bytes().await?)?;
        anyhow::ensure!(status.is_success(), "query {i} refused: {v}");
        ids.push(v["id"].as_str().unwrap_or_default().to_string());
    }
    let rss_started = rss_bytes();
    eprintln!(
        "weir bench server-load: {} queries running; {} requests/s for {} s ...",
        ids.len(),
        cfg.rps,
        cfg.seconds
    );
    let endpoints = ["list", "query", "progress", "metrics"];
    let mut latencies: Vec<Vec<f64>> = vec![vec![]; endpoints.len()];
    let mut failures = 0u64;
    let mut peak = rss_started;
    let mut ticks = tokio::time::interval(Duration::from_micros(1_000_000 / cfg.rps.max(1)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut sent = 0u64;
    let mut in_flight = tokio::task::JoinSet::new();
    let mut last_report = Instant::now();
    while started.elapsed() < Duration::from_secs(cfg.seconds) {
        ticks.tick().await;
        let kind = (sent % endpoints.len() as u64) as usize;
        let id = &ids[(sent / endpoints.len() as u64) as usize % ids.len()];
        let path = match kind {
            0 => "/api/v1/queries".to_string(),
            1 => format!("/api/v1/queries/{id}"),
            2 => format!("/api/v1/queries/{id}/progress?since=0"),
            _ => "/metrics".to_string(),
        };
        sent += 1;
        let request = client.get(format!("{base}{path}"));
        in_flight.spawn(async move {
            let t = Instant::now();
            let ok = match request.send().await {
                Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
                Err(_) => false,
            };
            (kind, t.elapsed().as_secs_f64() * 1000.0, ok)
        });
        while let Some(done) = in_flight.try_join_next() {
            let (kind, ms, ok) = done?;
            latencies[kind].push(ms);
            failures += u64::from(!ok);
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            peak = peak.max(rss_bytes());
            eprintln!(
                "  {:>3} s: {sent} requests, RSS {} MiB",
                started.elapsed().as_secs(),
                rss_bytes() / (1 << 20)
            );
            last_report = Instant::now();
        }
        if sent.is_multiple_of(50) {
            peak = peak.max(rss_bytes());
        }
    }
    while let Some(done) = in_flight.join_next().await {
        let (kind, ms, ok) = done?;
        latencies[kind].push(ms);
        failures += u64::from(!ok);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let rss_end = rss_bytes();
    peak = peak.max(rss_end);

    // Did every query keep up?
    let r = client.get(format!("{base}/api/v1/queries")).send().await?;
    let list: Value = serde_json::from_slice(&r.bytes().await?)?;
    let queries = list["queries"].as_array().cloned().unwrap_or_default();
    let mut kept_up = 0;
    let mut worst: Option<(String, String)> = None;
    for q in &queries {
        let behind = q["batchesBehind"].as_u64().unwrap_or(u64::MAX);
        let input = q["avgInputRowsPerSecond"].as_f64().unwrap_or(0.0);
        let processed = q["avgProcessedRowsPerSecond"].as_f64().unwrap_or(0.0);
        let active = q["status"] == "active" || q["status"] == "waiting for data";
        if active && behind == 0 && processed >= input {
            kept_up += 1;
        } else if worst.is_none() {
            worst = Some((
                q["name"].as_str().unwrap_or_default().to_string(),
                format!(
                    "status {}, {behind} batches behind, input {input:.0} rows/s, processed \
                     {processed:.0} rows/s",
                    q["status"]
                ),
            ));
        }
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(60), server).await;
    let _ = std::fs::remove_dir_all(&data);

    let mut all: Vec<f64> = latencies.iter().flatten().copied().collect();
    all.sort_by(f64::total_cmp);
    let rows: Vec<(String, usize, f64, f64, f64)> = endpoints
        .iter()
        .zip(latencies.iter_mut())
        .map(|(name, l)| {
            l.sort_by(f64::total_cmp);
            (
                name.to_string(),
                l.len(),
                percentile(l, 0.5),
                percentile(l, 0.99),
                l.last().copied().unwrap_or(f64::NAN),
            )
        })
        .chain(std::iter::once((
            "all".to_string(),
            all.len(),
            percentile(&all, 0.5),
            percentile(&all, 0.99),
            all.last().copied().unwrap_or(f64::NAN),
        )))
        .collect();
    if cfg.json {
        let report = serde_json::json!({
            "queries": cfg.queries, "requestsPerSecondAsked": cfg.rps,
            "requestsPerSecond": sent as f64 / elapsed, "seconds": elapsed,
            "failures": failures,
            "latencyMs": rows.iter().map(|(n, c, p50, p99, max)| serde_json::json!({
                "endpoint": n, "requests": c, "p50": p50, "p99": p99, "max": max })).collect::<Vec<_>>(),
            "rssIdleBytes": rss_idle, "rssWithQueriesBytes": rss_started,
            "rssPeakBytes": peak, "rssEndBytes": rss_end,
            "queriesKeptUp": kept_up, "queriesSeen": queries.len(),
        });
        println!("{report}");
    } else {
        println!(
            "server-load: {} queries ({} rows/s each, 1 s trigger), {:.1} requests/s for {:.0} s, {} failed",
            cfg.queries,
            ROWS_PER_SECOND,
            sent as f64 / elapsed,
            elapsed,
            failures
        );
        println!();
        println!("| endpoint | requests | p50 ms | p99 ms | max ms |");
        println!("|---|---|---|---|---|");
        for (n, c, p50, p99, max) in &rows {
            println!("| {n} | {c} | {p50:.2} | {p99:.2} | {max:.2} |");
        }
        println!();
        println!(
            "memory (RSS): {} MiB idle, {} MiB with the queries started, {} MiB peak, {} MiB at the end",
            rss_idle / (1 << 20),
            rss_started / (1 << 20),
            peak / (1 << 20),
            rss_end / (1 << 20)
        );
        println!(
            "queries that kept up (no batch behind, processed ≥ input): {kept_up} of {}",
            queries.len()
        );
        if let Some((name, why)) = worst {
            println!("  first that did not: {name}: {why}");
        }
    }
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("weir-server-load-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).context("cannot make the server's data folder")?;
    Ok(dir)
}
