//! `weir shell` as a process fed on its standard input: multi-line statements, a streaming
//! SELECT printing batches until SIGINT (Ctrl-C) stops that query and the shell goes on, and
//! the same against a running `weir serve`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::support;

/// A shell process, its input, and its output lines as they come.
struct Shell {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Shell {
    fn start(args: &[&str]) -> Self {
        let mut child = support::weir_command()
            .arg("shell")
            .args(args)
            .env("HOME", std::env::temp_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Self {
            child,
            stdin,
            lines,
            seen: vec![],
        }
    }

    fn send(&mut self, text: &str) {
        self.stdin.write_all(text.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
    }

    /// Waits for an output line containing `text`.
    fn expect(&mut self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.seen.iter().any(|l| l.contains(text)) {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no line with {text:?} in:\n{}", self.seen.join("\n")),
            }
        }
    }

    /// Ctrl-C.
    fn interrupt(&self) {
        let ok = std::process::Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    /// Sends `\q` and waits for the shell to leave; whether it exited 0, and everything it wrote.
    fn quit(mut self) -> (bool, String) {
        self.send("\\q\n");
        let status = self.child.wait().unwrap();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        (status.success(), self.seen.join("\n"))
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_shell_runs_multi_line_statements_and_a_streaming_select_until_ctrl_c() {
    let mut shell = Shell::start(&[]);
    shell.send("SELECT a + 41\n  AS answer\n  FROM (VALUES (1)) AS t(a);\n");
    shell.expect("| 42     |");
    shell.expect("1 row(s)");
    // A mistake is reported and the shell goes on.
    shell.send("SELEKT nothing;\n");
    shell.expect("error:");
    shell.send("SELECT value FROM STREAM rate(rowsPerSecond => 20);\n");
    shell.expect("Ctrl-C stops it");
    shell.expect("Batch: 2");
    shell.interrupt();
    shell.expect("Stopped query");
    shell.send("SELECT 6 * 7 AS after_the_stream;\n");
    shell.expect("after_the_stream");
    let (ok, out) = shell.quit();
    assert!(ok, "{out}");
    assert!(out.contains("| 42 "), "{out}");
}

#[cfg(feature = "server")]
#[test]
fn the_shell_runs_statements_on_a_server_and_returns_from_a_streaming_select_at_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let server = crate::server::Server::start(&dir.path().join("data"), &[]);
    let url = format!("http://{}", server.addr);
    let mut shell = Shell::start(&["--server", &url]);
    shell.expect("weir shell on");
    shell.send("SELECT 6 * 7\n AS answer;\n");
    shell.expect("| 42     |");
    shell.send("SELECT value FROM STREAM rate(rowsPerSecond => 20);\n");
    shell.expect("Streaming query started on the server");
    shell.expect("Batch: 2");
    shell.interrupt();
    shell.expect("Stopped.");
    // A statement writing a table becomes a hosted query.
    let out = dir.path().join("out");
    shell.send(&format!(
        "CREATE STREAMING TABLE numbers USING json LOCATION '{}' AS SELECT value FROM STREAM \
         rate_micro_batch(rowsPerBatch => 5);\n",
        out.display()
    ));
    shell.expect("Submitted as query");
    let (_, list) = server.get("/api/v1/queries");
    assert_eq!(list["queries"].as_array().unwrap().len(), 1, "{list}");
    // Its health is SQL in the server's session.
    let id = list["queries"][0]["id"].as_str().unwrap().to_string();
    server.wait_for_batch(&id, 1);
    shell.send("SELECT min(\"batchId\") + 1000 AS first_batch FROM streaming_health('numbers');\n");
    shell.expect("first_batch");
    shell.expect("| 1000 ");
    let (ok, text) = shell.quit();
    assert!(ok, "{text}");
}
