//! Helpers shared by the integration tests' modules.

#![allow(
    dead_code,
    clippy::expect_used,
    reason = "each test crate uses only some of the helpers; a test fails loudly on any error"
)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weir::WeirSession;
use weir::datafusion::arrow::util::display::array_value_to_string;

/// Tests of `$body`, an `async fn(StateBackend)`, on each state backend: `$name::on_rocksdb`
/// and `$name::in_memory`.
macro_rules! on_each_backend {
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test]
            async fn on_rocksdb() {
                super::$body(weir::StateBackend::default()).await;
            }

            #[tokio::test]
            async fn in_memory() {
                super::$body(weir::StateBackend::Memory).await;
            }
        }
    };
}
pub(crate) use on_each_backend;

/// The `weir` binary under test: the one place the tests start the CLI.
pub fn weir_command() -> Command {
    Command::new(env!("CARGO_BIN_EXE_weir"))
}

/// Runs `weir args...` to its end: whether it succeeded, its standard output and its standard
/// error.
pub fn weir(args: &[&str]) -> (bool, String, String) {
    let out = weir_command().args(args).output().expect("start weir");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `weir run -e sql --checkpoint ck` until it reports the pause point `stage` of `batch`
/// (`WEIR_TEST_PAUSE_AT`), then SIGKILLs it.
pub fn run_and_kill_at(sql: &str, ck: &str, stage: &str, batch: u64) {
    run_and_kill_at_with_env(sql, ck, stage, batch, &[]);
}

/// [`run_and_kill_at`] with more environment variables (an S3 server's `AWS_*`).
pub fn run_and_kill_at_with_env(
    sql: &str,
    ck: &str,
    stage: &str,
    batch: u64,
    env: &[(String, String)],
) {
    kill_at(
        &[
            "run",
            "-e",
            sql,
            "--checkpoint",
            ck,
            "--max-batches",
            "1000",
        ],
        stage,
        batch,
        env,
    );
}

/// Runs `weir <args>` until it reports the pause point `stage` of `batch`, then SIGKILLs it.
pub fn kill_at(args: &[&str], stage: &str, batch: u64, env: &[(String, String)]) {
    let mut child = weir_command()
        .args(args)
        .env("WEIR_TEST_PAUSE_AT", format!("{stage}:{batch}"))
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start weir");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = vec![];
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) if line.starts_with("WEIR_PAUSED") => break,
            Ok(line) => seen.push(line),
            Err(_) => {}
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("weir exited ({status}) before pausing at {stage}:{batch}: {seen:?}");
        }
        assert!(
            Instant::now() < deadline,
            "weir never paused at {stage}:{batch}: {seen:?}"
        );
    }
    child.kill().expect("SIGKILL"); // Child::kill sends SIGKILL on Unix.
    child.wait().expect("reap weir");
}

/// The rows of batch SQL `sql`, each as its cells' text joined by commas.
pub async fn text_rows(session: &WeirSession, sql: &str) -> Vec<String> {
    let batches = session
        .context()
        .sql(sql)
        .await
        .expect("plan the query")
        .collect()
        .await
        .expect("run the query");
    let mut out = vec![];
    for b in &batches {
        for r in 0..b.num_rows() {
            let cells: Vec<String> = b
                .columns()
                .iter()
                .map(|c| array_value_to_string(c, r).expect("display a cell"))
                .collect();
            out.push(cells.join(","));
        }
    }
    out
}

/// Every file under `dir`, sorted.
pub fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Every file under `dir` (relative to it) with its content.
pub fn contents(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    files(dir)
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            (rel, std::fs::read(&p).unwrap())
        })
        .collect()
}

pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for (rel, bytes) in contents(from) {
        let path = to.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
}
