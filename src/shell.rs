//! `weir shell`: an interactive SQL shell in the habit of `spark-sql` and `datafusion-cli`.
//!
//! ```text
//! line ─► rustyline (editing, history in ~/.weir_history) ─► buffer until a line ends a
//!         statement (`;` outside quotes) ─► local session | --server URL (POST /api/v1/sql)
//!   batch query          its rows as a table
//!   streaming SELECT     its batches as they come, until Ctrl-C stops that query (not the shell)
//!   streaming statement  local: runs until Ctrl-C; --server: submitted as a hosted query
//! \q, quit, exit, Ctrl-D   leave;  Ctrl-C at the prompt drops the statement being typed
//! ```

use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use rustyline::error::ReadlineError;
use weir::{ScriptOptions, StatementResult, WeirSession};

const HELP: &str = "\
Statements end with ';' and may span lines. A streaming SELECT prints its batches until Ctrl-C,
which stops that query and keeps the shell.
  \\q, quit, exit   leave the shell (Ctrl-D too)
  \\?, help         this text
  Ctrl-C           at the prompt: drop the statement being typed";

/// Where statements run.
enum Target {
    Local(WeirSession),
    Server {
        url: String,
        token: Option<String>,
        client: reqwest::Client,
    },
}

/// Whether `buffer` holds a whole statement: it ends with `;` outside quotes.
fn complete(buffer: &str) -> bool {
    let mut quote: Option<char> = None;
    let mut last = None;
    let mut chars = buffer.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, '\'' | '"' | '`') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            // A comment runs to the end of its line.
            (None, '-') if chars.peek() == Some(&'-') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
                continue;
            }
            _ => {}
        }
        if !c.is_whitespace() {
            last = Some(c);
        }
    }
    quote.is_none() && last == Some(';')
}

/// Runs the shell until the user leaves.
pub async fn run(server: Option<String>, token: Option<String>) -> anyhow::Result<()> {
    let target = match server {
        Some(url) => Target::Server {
            url: url.trim_end_matches('/').to_string(),
            token,
            client: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .build()
                .context("cannot make the HTTP client")?,
        },
        None => Target::Local(WeirSession::new()),
    };
    let mut editor = rustyline::DefaultEditor::new().context("cannot start line editing")?;
    let history = std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".weir_history"));
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    match &target {
        Target::Local(_) => println!("weir shell (local session). \\? for help, \\q to leave."),
        Target::Server { url, .. } => {
            println!("weir shell on {url}. \\? for help, \\q to leave.")
        }
    }
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() {
            "weir> "
        } else {
            "   -> "
        };
        let line = tokio::task::block_in_place(|| editor.readline(prompt));
        match line {
            Ok(line) => {
                let word = line.trim();
                if buffer.is_empty() {
                    match word.to_ascii_lowercase().as_str() {
                        "" => continue,
                        "\\q" | "quit" | "exit" | "quit;" | "exit;" => break,
                        "\\?" | "help" | "help;" => {
                            println!("{HELP}");
                            continue;
                        }
                        _ => {}
                    }
                }
                buffer.push_str(&line);
                buffer.push('\n');
                if complete(&buffer) {
                    let statement = std::mem::take(&mut buffer);
                    let _ = editor.add_history_entry(statement.trim());
                    if let Err(e) = execute(&target, statement.trim()).await {
                        eprintln!("error: {e:#}");
                    }
                }
            }
            Err(ReadlineError::Interrupted) => {
                buffer.clear();
                println!("^C");
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e).context("cannot read the next line"),
        }
    }
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    Ok(())
}

async fn execute(target: &Target, sql: &str) -> anyhow::Result<()> {
    match target {
        Target::Local(session) => local(session, sql).await,
        Target::Server { url, token, client } => remote(client, url, token.as_deref(), sql).await,
    }
}

async fn local(session: &WeirSession, sql: &str) -> anyhow::Result<()> {
    let results = session
        .run_script(sql, &ScriptOptions::default())
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for r in results {
        match r {
            StatementResult::Rows(rows) => {
                let n: usize = rows.iter().map(|b| b.num_rows()).sum();
                println!("{}", arrow::util::pretty::pretty_format_batches(&rows)?);
                println!("{n} row(s)");
            }
            StatementResult::Query(q) => {
                println!("Streaming query {} started: Ctrl-C stops it.", q.id());
                tokio::select! {
                    ended = q.await_termination() => {
                        if let Err(e) = ended {
                            eprintln!("error: {}", e.cause);
                        }
                    }
                    _ = tokio::signal::ctrl_c() => {
                        q.stop().await;
                        println!("Stopped query {}.", q.id());
                    }
                }
                session.streams().flush_listeners().await;
            }
            _ => println!("OK"),
        }
    }
    Ok(())
}

/// The error a server answered, as the shell prints it.
fn server_error(v: &serde_json::Value) -> anyhow::Error {
    // weir's messages carry their class already.
    let message = v["message"]
        .as_str()
        .unwrap_or("the server gave no message");
    match v["errorClass"].as_str() {
        Some(class) if !message.contains(class) => anyhow::anyhow!("[{class}] {message}"),
        _ => anyhow::anyhow!("{message}"),
    }
}

async fn remote(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    sql: &str,
) -> anyhow::Result<()> {
    let post = |path: &str, body: serde_json::Value| {
        let mut r = client
            .post(format!("{url}{path}"))
            .header("Content-Type", "application/json")
            .body(body.to_string());
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r
    };
    let response = post("/api/v1/sql", serde_json::json!({ "sql": sql }))
        .send()
        .await
        .with_context(|| format!("cannot reach weir serve at {url}"))?;
    let status = response.status();
    let event_stream = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if event_stream {
        println!("Streaming query started on the server: Ctrl-C stops it.");
        let mut bytes = response.bytes_stream();
        let mut pending = String::new();
        let mut event = String::new();
        // One listener for the whole stream: a Ctrl-C that comes while a batch prints (between
        // two polls) is kept for the next poll, where a listener made per poll would miss it.
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        loop {
            tokio::select! {
                chunk = bytes.next() => {
                    let Some(chunk) = chunk else { break };
                    pending.push_str(&String::from_utf8_lossy(&chunk?));
                    while let Some(i) = pending.find('\n') {
                        let line: String = pending.drain(..=i).collect();
                        let line = line.trim_end();
                        if let Some(e) = line.strip_prefix("event: ") {
                            event = e.to_string();
                        } else if let Some(data) = line.strip_prefix("data: ") {
                            let v: serde_json::Value = serde_json::from_str(data)?;
                            if event == "error" {
                                return Err(server_error(&v));
                            }
                            println!("-------------------------------------------");
                            println!("Batch: {}", v["batchId"]);
                            println!("-------------------------------------------");
                            println!("{}", v["text"].as_str().unwrap_or_default());
                        }
                    }
                }
                _ = &mut ctrl_c => {
                    // Dropping the response closes the connection: the server stops the query.
                    println!("Stopped.");
                    return Ok(());
                }
            }
        }
        return Ok(());
    }
    let v: serde_json::Value = serde_json::from_slice(&response.bytes().await?)
        .with_context(|| format!("the server answered {status} with no JSON"))?;
    if status == reqwest::StatusCode::CONFLICT
        && v["errorClass"] == "STREAMING_QUERY_MUST_BE_SUBMITTED"
    {
        let submitted = post("/api/v1/queries", serde_json::json!({ "sql": sql }))
            .send()
            .await?;
        let status = submitted.status();
        let s: serde_json::Value = serde_json::from_slice(&submitted.bytes().await?)?;
        if !status.is_success() {
            return Err(server_error(&s));
        }
        let id = s["id"].as_str().unwrap_or_default();
        println!(
            "Submitted as query {id}: it runs on the server until stopped (POST \
             {url}/api/v1/queries/{id}/stop). Watch it at {url}/#/query/{id}"
        );
        return Ok(());
    }
    if !status.is_success() {
        return Err(server_error(&v));
    }
    for r in v["results"].as_array().into_iter().flatten() {
        match r["kind"].as_str() {
            Some("rows") => {
                println!("{}", r["text"].as_str().unwrap_or_default());
                println!(
                    "{} row(s)",
                    r["rows"].as_array().map_or(0, |rows| rows.len())
                );
            }
            _ => println!("OK"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::complete;

    #[test]
    fn a_statement_ends_at_a_semicolon_outside_quotes_and_comments() {
        assert!(complete("SELECT 1;"));
        assert!(complete("SELECT\n  1;  \n"));
        assert!(!complete("SELECT 1"));
        assert!(!complete("SELECT ';"));
        assert!(complete("SELECT ';';"));
        assert!(!complete("SELECT 1 -- not yet;\n"));
        assert!(complete("SELECT 1; -- done\n"));
        assert!(!complete("SELECT \"a;"));
    }
}
