//! The web UI, shipped inside the binary: `GET /` is the page, `GET /ui/{file}` its script, style
//! and uPlot (MIT, vendored in `server/ui/vendor`, with its license). The page reads the same
//! JSON API as any client, so these files need no token; the API calls they make do.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("../ui/index.html");
const APP: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/style.css");
const UPLOT_JS: &str = include_str!("../ui/vendor/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../ui/vendor/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("../ui/vendor/uPlot.LICENSE");

fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`.
pub(crate) async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/{name}`.
pub(crate) async fn asset(Path(name): Path<String>) -> Response {
    match name.as_str() {
        "app.js" => file("text/javascript; charset=utf-8", APP),
        "style.css" => file("text/css; charset=utf-8", STYLE),
        "uPlot.iife.min.js" => file("text/javascript; charset=utf-8", UPLOT_JS),
        "uPlot.min.css" => file("text/css; charset=utf-8", UPLOT_CSS),
        "uPlot.LICENSE" => file("text/plain; charset=utf-8", UPLOT_LICENSE),
        _ => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}

/// Whether `path` is one of the UI's files, served without the token.
pub(crate) fn is_ui(path: &str) -> bool {
    path == "/" || path.starts_with("/ui/")
}
