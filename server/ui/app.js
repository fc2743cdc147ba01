// weir serve's web UI: one page, no build step, served from the binary. It reads the same JSON
// API a script would (/api/v1/queries, /api/2.0/pipelines) and draws Spark's streaming charts
// with uPlot.
//
//   #/                 queries: status, rates, latest batch, falling behind; submit a query
//   #/query/{id}       the query's charts over its recent batches, its checkpoint and operators
//   #/pipelines        pipelines
//   #/pipeline/{id}    the dataset and flow graph, flows live, updates and their events
"use strict";

const REFRESH_MS = 1000;
const MAX_POINTS = 300;
let timer = null;
// The charts of the page shown (tests read their data).
window.weirCharts = [];
window.weirErrors = [];
window.addEventListener("error", (e) => window.weirErrors.push(String(e.message)));
window.addEventListener("unhandledrejection", (e) => window.weirErrors.push(String(e.reason)));

// ---- API --------------------------------------------------------------------------------------

async function api(method, path, body) {
  const headers = { "Content-Type": "application/json" };
  const token = localStorage.getItem("weirToken");
  if (token) headers.Authorization = "Bearer " + token;
  const r = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const json = await r.json().catch(() => ({}));
  if (r.status === 401) askToken();
  if (!r.ok) {
    const e = new Error(json.message || r.statusText);
    e.errorClass = json.errorClass;
    throw e;
  }
  return json;
}

function askToken() {
  const d = document.getElementById("token");
  if (d.open) return;
  d.showModal();
  d.addEventListener("close", () => {
    const t = document.getElementById("token-input").value.trim();
    if (t) localStorage.setItem("weirToken", t);
    route();
  }, { once: true });
}

/// Asks `text` in the page's dialog; resolves true when confirmed.
function confirmDialog(text) {
  const d = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  d.returnValue = "";
  d.showModal();
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "yes"), { once: true });
  });
}

// ---- helpers ----------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function fmt(n, digits = 1) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(digits) + " M";
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(digits) + " K";
  return Number.isInteger(n) ? String(n) : n.toFixed(digits);
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}

function status(s) {
  return el("span", { class: "status " + String(s).split(" ")[0] }, s);
}

function errorBox(e) {
  if (!e) return null;
  return el("div", { class: "error" },
    el("strong", {}, e.errorClass || "ERROR"), " ", e.sqlState ? `(SQLSTATE ${e.sqlState}) ` : "",
    "\n", e.message || String(e));
}

function setMain(...nodes) {
  const m = document.getElementById("main");
  m.replaceChildren(...nodes);
}

function fallingBehind(p) {
  return p && p.inputRowsPerSecond > 0 && p.processedRowsPerSecond < p.inputRowsPerSecond;
}

// ---- router -----------------------------------------------------------------------------------

function route() {
  if (timer) clearInterval(timer);
  timer = null;
  window.weirCharts.forEach((c) => c.destroy());
  window.weirCharts = [];
  const hash = location.hash || "#/";
  let m;
  if ((m = hash.match(/^#\/query\/([^/]+)$/))) return queryPage(decodeURIComponent(m[1]));
  if ((m = hash.match(/^#\/pipeline\/([^/]+)$/))) return pipelinePage(decodeURIComponent(m[1]));
  if (hash === "#/pipelines") return pipelinesPage();
  return queriesPage();
}

function every(f) {
  f();
  timer = setInterval(f, REFRESH_MS);
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", route);

// ---- queries ----------------------------------------------------------------------------------

function queriesPage() {
  const body = el("tbody");
  const note = el("p", { class: "muted" });
  const form = submitForm();
  setMain(
    el("h1", {}, "Streaming queries"),
    note,
    el("table", { id: "queries" },
      el("thead", {}, el("tr", {},
        el("th", {}, "Name"), el("th", {}, "Id"), el("th", {}, "Status"),
        el("th", { class: "num" }, "Avg input (rows/s)"), el("th", { class: "num" }, "Avg process (rows/s)"),
        el("th", { class: "num" }, "Latest batch"), el("th", {}, "Falling behind"))),
      body),
    el("h2", {}, "Submit a query"),
    form,
  );
  every(async () => {
    const { queries } = await api("GET", "/api/v1/queries");
    note.textContent = queries.length ? `${queries.length} quer${queries.length === 1 ? "y" : "ies"}, refreshed every second.` : "No queries yet: submit one below or with POST /api/v1/queries.";
    body.replaceChildren(...queries.map((q) => {
      const p = q.lastProgress;
      const behind = fallingBehind(p);
      return el("tr", {},
        el("td", {}, q.name || el("span", { class: "muted" }, "(unnamed)")),
        el("td", {}, el("a", { href: "#/query/" + encodeURIComponent(q.id) }, q.id.slice(0, 8))),
        el("td", {}, status(q.status)),
        el("td", { class: "num" }, fmt(q.avgInputRowsPerSecond)),
        el("td", { class: "num" }, fmt(q.avgProcessedRowsPerSecond)),
        el("td", { class: "num" }, p ? p.batchId : "–"),
        el("td", { class: behind ? "behind" : "" },
          p ? (behind ? "yes" : "no") + (q.batchesBehind ? ` (${q.batchesBehind} batches behind)` : "") : "–"));
    }));
  });
}

function submitForm() {
  const sql = el("textarea", { id: "submit-sql", placeholder: "CREATE STREAMING TABLE t USING json LOCATION '/tmp/out' AS SELECT value FROM STREAM rate_micro_batch(rowsPerBatch => 100)" });
  const name = el("input", { type: "text", id: "submit-name", placeholder: "name (optional)" });
  const trigger = el("input", { type: "text", id: "submit-trigger", placeholder: "trigger, e.g. 1 second" });
  const out = el("div");
  return el("form", {
    class: "submit card",
    onsubmit: async (e) => {
      e.preventDefault();
      out.replaceChildren();
      try {
        const body = { sql: sql.value };
        if (name.value.trim()) body.name = name.value.trim();
        if (trigger.value.trim()) body.trigger = trigger.value.trim();
        const r = await api("POST", "/api/v1/queries", body);
        location.hash = "#/query/" + encodeURIComponent(r.id);
      } catch (err) {
        out.replaceChildren(errorBox(err));
      }
    },
  }, sql, el("div", { class: "buttons" }, name, trigger, el("button", { class: "primary", type: "submit" }, "Start")), out);
}

// The charts of Spark's Structured Streaming tab: [title, unit, series [label, value of a
// progress record]].
const SUM = (f) => (p) => (p.stateOperators || []).length ? p.stateOperators.reduce((a, o) => a + f(o), 0) : null;
const CHARTS = [
  ["Input Rate", "rows/s", [["input", (p) => p.inputRowsPerSecond]]],
  ["Process Rate", "rows/s", [["processed", (p) => p.processedRowsPerSecond]]],
  ["Input Rows", "rows", [["input rows", (p) => p.numInputRows]]],
  ["Batch Duration", "ms", [["batch", (p) => p.batchDuration]]],
  ["Operation Duration", "ms", ["latestOffset", "walCommit", "queryPlanning", "addBatch", "commitOffsets"]
    .map((op) => [op, (p) => (p.durationMs || {})[op] || 0]), true],
  ["Global Watermark Gap", "s", [["gap", (p) => {
    // As Spark: no gap until the watermark has moved off the epoch.
    const wm = p.eventTime && p.eventTime.watermark ? Date.parse(p.eventTime.watermark) : 0;
    return wm > 0 ? (Date.parse(p.timestamp) - wm) / 1000 : null;
  }]]],
  ["Aggregated Number Of Total State Rows", "rows", [["total", SUM((o) => o.numRowsTotal)]]],
  ["Aggregated Number Of Updated State Rows", "rows", [["updated", SUM((o) => o.numRowsUpdated)]]],
  ["Aggregated State Memory Used In Bytes", "bytes", [["memory", SUM((o) => o.memoryUsedBytes)]]],
  ["Aggregated Number Of Rows Dropped By Watermark", "rows", [["dropped", SUM((o) => o.numRowsDroppedByWatermark)]]],
];
const COLORS = ["#2364d2", "#1f8a4c", "#b7791f", "#8e44ad", "#c53030"];

function makeChart(parent, [title, unit, series, stacked]) {
  const box = el("div", { class: "chart" }, el("h3", {}, `${title} (${unit})`));
  parent.append(box);
  const width = Math.max(380, Math.floor(box.getBoundingClientRect().width) - 16);
  const opts = {
    width,
    height: 180,
    legend: { show: true },
    cursor: { drag: { x: false, y: false } },
    scales: { x: { time: true } },
    axes: [{}, { size: 60, values: (u, vals) => vals.map((v) => unit === "bytes" ? bytes(v) : fmt(v)) }],
    series: [{}].concat(series.map(([label], i) => ({
      label,
      stroke: COLORS[i % COLORS.length],
      width: 1.5,
      points: { show: true, size: 4 },
      fill: stacked ? COLORS[i % COLORS.length] + "55" : undefined,
    }))),
  };
  const chart = new uPlot(opts, [[]].concat(series.map(() => [])), box);
  chart.weirSpec = { title, series, stacked };
  return chart;
}

/// Sets each chart's data from the progress records `recent`, oldest first.
function drawCharts(recent) {
  const xs = recent.map((p) => Date.parse(p.timestamp) / 1000);
  for (const chart of window.weirCharts) {
    const { series, stacked } = chart.weirSpec;
    let cols = series.map(([, f]) => recent.map((p) => {
      const v = f(p);
      return v === undefined ? null : v;
    }));
    if (stacked) {
      // Each series on top of the ones after it, drawn from the top down.
      for (let i = cols.length - 2; i >= 0; i--) cols[i] = cols[i].map((v, j) => (v || 0) + (cols[i + 1][j] || 0));
    }
    chart.setData([xs].concat(cols));
  }
}

async function queryPage(id) {
  const facts = el("dl", { class: "facts" });
  const title = el("h1", {}, "Query");
  const err = el("div");
  const buttons = el("div", { class: "buttons" });
  const charts = el("div", { class: "charts" });
  const checkpoint = el("div");
  const latest = el("pre");
  setMain(title, facts, buttons, err, el("h2", {}, "Recent batches"), charts,
    el("h2", {}, "Checkpoint"), checkpoint,
    el("details", {}, el("summary", {}, "Latest progress record (Spark's JSON)"), latest));
  window.weirCharts = CHARTS.map((c) => makeChart(charts, c));
  let recent = [];
  let polls = 0;
  const stop = el("button", {
    id: "stop", class: "danger",
    onclick: async () => {
      if (!(await confirmDialog(`Stop query ${id}? It stays stopped, also when the server starts again; its checkpoint is kept, so Restart resumes it.`))) return;
      try { await api("POST", `/api/v1/queries/${id}/stop`); } catch (e) { err.replaceChildren(errorBox(e)); }
    },
  }, "Stop");
  const restart = el("button", {
    id: "restart",
    onclick: async () => {
      try { await api("POST", `/api/v1/queries/${id}/restart`); recent = []; } catch (e) { err.replaceChildren(errorBox(e)); }
    },
  }, "Restart");
  buttons.append(stop, restart);
  every(async () => {
    let q;
    try { q = await api("GET", `/api/v1/queries/${encodeURIComponent(id)}`); } catch (e) { err.replaceChildren(errorBox(e)); return; }
    title.replaceChildren(q.name || "Query", " ", status(q.status));
    const p = q.lastProgress;
    facts.replaceChildren(
      el("dt", {}, "Id"), el("dd", {}, q.id),
      el("dt", {}, "Query id (checkpoint)"), el("dd", {}, q.queryId || "–"),
      el("dt", {}, "Checkpoint"), el("dd", {}, q.checkpoint),
      el("dt", {}, "Message"), el("dd", {}, q.message),
      el("dt", {}, "Latest batch"), el("dd", {}, p ? `${p.batchId} at ${p.timestamp}, ${p.numInputRows} rows in ${p.batchDuration} ms` : "–"),
      el("dt", {}, "Falling behind"), el("dd", { class: fallingBehind(p) ? "behind" : "" },
        p ? (fallingBehind(p) ? "yes" : "no") + (q.batchesBehind ? `, ${q.batchesBehind} batches behind` : "") : "–"),
      el("dt", {}, "SQL"), el("dd", {}, el("code", {}, q.sql)),
    );
    stop.disabled = q.status === "stopped" || q.status === "failed";
    err.replaceChildren(...[errorBox(q.exception)].filter(Boolean));
    const since = recent.length ? recent[recent.length - 1].batchId : null;
    const more = await api("GET", `/api/v1/queries/${encodeURIComponent(id)}/progress` + (since === null ? "" : `?since=${since}`));
    if (more.recentProgress.length) {
      recent = recent.concat(more.recentProgress).slice(-MAX_POINTS);
      drawCharts(recent);
      latest.textContent = JSON.stringify(recent[recent.length - 1], null, 2);
    }
    // The checkpoint once the first batch is in it, then every ten seconds.
    if (p && polls++ % 10 === 0) {
      try {
        checkpoint.replaceChildren(checkpointView(await api("GET", "/api/v1/checkpoints/inspect?path=" + encodeURIComponent(q.checkpoint))));
      } catch (e) {
        checkpoint.replaceChildren(errorBox(e));
      }
    }
  });
}

function checkpointView(r) {
  const ops = r.operators || [];
  return el("div", {},
    el("dl", { class: "facts" },
      el("dt", {}, "Location"), el("dd", {}, r.location),
      el("dt", {}, "Batches in the offsets log"), el("dd", {}, r.offsets ? `${r.offsets[0]} – ${r.offsets[1]}` : "none"),
      el("dt", {}, "Last committed"), el("dd", {}, r.lastCommitted ?? "none"),
      el("dt", {}, "Pending (runs again on restart)"), el("dd", {}, r.pending ?? "none"),
      el("dt", {}, "Watermark"), el("dd", {}, r.watermarkMs === null || r.watermarkMs === undefined ? "none" : new Date(r.watermarkMs).toISOString()),
      el("dt", {}, "Sources"), el("dd", {}, (r.sources || []).map((s) => el("div", {}, `${s.position}: ${s.source || s.name || "?"} at `, el("code", {}, JSON.stringify(s.committedOffset))))),
    ),
    el("h2", {}, "Stateful operators"),
    ops.length ? el("table", { id: "operators" },
      el("thead", {}, el("tr", {}, el("th", {}, "Operator id"), el("th", {}, "Operator"), el("th", { class: "num" }, "Partitions"),
        el("th", {}, "Key schema"), el("th", {}, "Value schema"), el("th", { class: "num" }, "State size"))),
      el("tbody", {}, ops.map((o) => el("tr", {},
        el("td", {}, o.operatorId), el("td", {}, o.operatorName), el("td", { class: "num" }, o.numPartitions),
        el("td", {}, el("code", {}, o.keySchema)), el("td", {}, el("code", {}, o.valueSchema)),
        el("td", { class: "num" }, bytes(o.stateBytes))))))
      : el("p", { class: "muted" }, "No stateful operators."),
    el("details", {}, el("summary", {}, "weir checkpoint inspect --json"), el("pre", {}, JSON.stringify(r, null, 2))),
  );
}

// ---- pipelines --------------------------------------------------------------------------------

function pipelinesPage() {
  const body = el("tbody");
  const note = el("p", { class: "muted" });
  setMain(el("h1", {}, "Pipelines"), note,
    el("table", { id: "pipelines" }, el("thead", {}, el("tr", {},
      el("th", {}, "Name"), el("th", {}, "Id"), el("th", {}, "State"), el("th", {}, "Latest update"))), body),
    el("p", { class: "muted" }, "Create one with POST /api/2.0/pipelines {\"spec\": \"/path/weir-pipeline.yml\"}."));
  every(async () => {
    const { statuses } = await api("GET", "/api/2.0/pipelines");
    note.textContent = statuses.length ? "" : "No pipelines yet.";
    body.replaceChildren(...statuses.map((p) => el("tr", {},
      el("td", {}, el("a", { href: "#/pipeline/" + encodeURIComponent(p.pipeline_id) }, p.name)),
      el("td", {}, p.pipeline_id.slice(0, 8)),
      el("td", {}, status(p.state)),
      el("td", {}, p.latest_updates.length ? status(p.latest_updates[0].state) : "–"))));
  });
}

/// The pipeline's datasets and flows as an SVG, left to right in dependency order.
function graphView(graph, flows) {
  const NS = "http://www.w3.org/2000/svg";
  const svg = (tag, attrs, ...kids) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    kids.forEach((k) => e.append(k));
    return e;
  };
  const key = (n) => n.toLowerCase();
  const depth = {};
  for (const d of graph.datasets) depth["d:" + key(d.name)] = 0;
  for (const f of graph.flows) depth["f:" + f.name] = 0;
  for (let pass = 0; pass < graph.flows.length + 2; pass++) {
    for (const f of graph.flows) {
      const fd = Math.max(0, ...f.reads.map((r) => (depth["d:" + key(r)] ?? 0) + 1));
      depth["f:" + f.name] = fd;
      depth["d:" + key(f.target)] = Math.max(depth["d:" + key(f.target)], fd + 1);
    }
  }
  const columns = {};
  const nodes = [];
  // Temporary views are not stored: a flow reading one reads what the view reads.
  for (const d of graph.datasets.filter((d) => d.kind !== "VIEW")) nodes.push({ id: "d:" + key(d.name), label: d.name, sub: d.kind.toLowerCase(), kind: "dataset" });
  for (const f of graph.flows) nodes.push({ id: "f:" + f.name, label: f.name, sub: f.kind.toLowerCase() + " flow", kind: "flow", status: (flows[f.name] || {}).status });
  const W = 200, H = 40, GX = 50, GY = 14;
  // Columns without a node (a view's) close up.
  const used = [...new Set(nodes.map((n) => depth[n.id] || 0))].sort((a, b) => a - b);
  for (const n of nodes) depth[n.id] = used.indexOf(depth[n.id] || 0);
  const pos = {};
  for (const n of nodes) {
    const c = depth[n.id] || 0;
    columns[c] = (columns[c] || 0) + 1;
    pos[n.id] = { x: 10 + c * (W + GX), y: 10 + (columns[c] - 1) * (H + GY) };
  }
  const width = 20 + (Math.max(...Object.keys(columns).map(Number)) + 1) * (W + GX);
  const height = 20 + Math.max(...Object.values(columns)) * (H + GY);
  const root = svg("svg", { class: "graph", id: "graph", width, height, viewBox: `0 0 ${width} ${height}` });
  const edge = (a, b) => {
    const p = pos[a], q = pos[b];
    if (!p || !q) return;
    const x1 = p.x + W, y1 = p.y + H / 2, x2 = q.x, y2 = q.y + H / 2;
    root.append(svg("path", { d: `M${x1},${y1} C${x1 + GX / 2},${y1} ${x2 - GX / 2},${y2} ${x2},${y2}` }));
  };
  for (const f of graph.flows) {
    for (const r of f.reads) edge("d:" + key(r), "f:" + f.name);
    edge("f:" + f.name, "d:" + key(f.target));
  }
  for (const n of nodes) {
    const p = pos[n.id];
    const title = svg("title", {});
    title.textContent = n.kind === "flow" ? `flow ${n.label}: ${n.status || "not run in the newest update"}` : `${n.sub} ${n.label}`;
    const label = svg("text", { x: p.x + 8, y: p.y + 16 });
    label.textContent = n.label;
    const sub = svg("text", { x: p.x + 8, y: p.y + 32, fill: "#6b7384" });
    sub.textContent = n.kind === "flow" && n.status ? `${n.sub} · ${n.status.toLowerCase()}` : n.sub;
    root.append(svg("g", { class: `${n.kind} ${n.status || ""}` },
      svg("rect", { x: p.x, y: p.y, width: W, height: H, rx: 5 }), label, sub, title));
  }
  return root;
}

async function pipelinePage(id) {
  const path = `/api/2.0/pipelines/${encodeURIComponent(id)}`;
  const title = el("h1", {}, "Pipeline");
  const facts = el("dl", { class: "facts" });
  const err = el("div");
  const graphBox = el("div", { class: "scroll" });
  const flowsBody = el("tbody");
  const updatesBody = el("tbody");
  const events = el("div");
  const buttons = el("div", { class: "buttons" });
  setMain(title, facts, buttons, err, el("h2", {}, "Datasets and flows"), graphBox,
    el("h2", {}, "Flows of the newest update"),
    el("table", { id: "flows" }, el("thead", {}, el("tr", {},
      el("th", {}, "Reset checkpoint"), el("th", {}, "Flow"), el("th", {}, "Writes"), el("th", {}, "Full refresh"),
      el("th", {}, "Status"), el("th", { class: "num" }, "Batches"), el("th", { class: "num" }, "Input rows"),
      el("th", { class: "num" }, "Input rate"), el("th", { class: "num" }, "Process rate"))), flowsBody),
    el("h2", {}, "Updates"),
    el("table", { id: "updates" }, el("thead", {}, el("tr", {},
      el("th", {}, "Update"), el("th", {}, "State"), el("th", {}, "Created"), el("th", {}, "Selection"))), updatesBody),
    events);
  const checked = { reset: new Set(), refresh: new Set() };
  const start = async (body, question) => {
    if (question && !(await confirmDialog(question))) return;
    try {
      const r = await api("POST", path + "/updates", body);
      err.replaceChildren(el("p", { class: "muted" }, `Update ${r.update_id} started.`));
      checked.reset.clear();
      checked.refresh.clear();
    } catch (e) {
      err.replaceChildren(errorBox(e));
    }
  };
  buttons.append(
    el("button", { id: "update", class: "primary", onclick: () => start({}) }, "Start update"),
    el("button", { id: "full-refresh-all", class: "danger", onclick: () => start({ full_refresh: true },
      "Fully refresh every table of the pipeline? Every table is emptied and every flow's checkpoint dropped; the flows then read their sources from the start.") }, "Full refresh all"),
    el("button", { id: "full-refresh-selected", onclick: () => {
      const names = [...checked.refresh];
      if (!names.length) return err.replaceChildren(errorBox({ message: "Tick the tables to refresh fully in the table below." }));
      start({ full_refresh_selection: names }, `Fully refresh ${names.join(", ")}? Those tables are emptied and their flows' checkpoints dropped.`);
    } }, "Full refresh selected"),
    el("button", { id: "reset-selected", onclick: () => {
      const names = [...checked.reset];
      if (!names.length) return err.replaceChildren(errorBox({ message: "Tick the flows whose checkpoints to reset in the table below." }));
      start({ reset_checkpoint_selection: names }, `Reset the checkpoints of ${names.join(", ")}? Their tables keep their rows; the flows start their sources anew (from their starting options, if they give any).`);
    } }, "Reset selected flows' checkpoints"),
    el("button", { id: "stop-update", onclick: () => api("POST", path + "/stop").catch((e) => err.replaceChildren(errorBox(e))) }, "Stop update"),
  );
  let shownUpdate = null;
  const showEvents = async (updateId) => {
    shownUpdate = updateId;
    const r = await api("GET", `${path}/events?update_id=${encodeURIComponent(updateId)}&max_results=500`);
    events.replaceChildren(el("h2", {}, `Events of update ${updateId.slice(0, 8)}`),
      el("table", { id: "events" }, el("thead", {}, el("tr", {}, el("th", {}, "Time"), el("th", {}, "Flow"), el("th", {}, "Level"), el("th", {}, "Message"))),
        el("tbody", {}, r.events.map((e) => el("tr", {},
          el("td", {}, e.timestamp), el("td", {}, e.origin.flow_name || ""), el("td", {}, e.level), el("td", {}, e.message))))));
  };
  let graphKey = "";
  every(async () => {
    let p;
    try { p = await api("GET", path); } catch (e) { err.replaceChildren(errorBox(e)); return; }
    title.replaceChildren(p.name, " ", status(p.state));
    facts.replaceChildren(
      el("dt", {}, "Id"), el("dd", {}, p.pipeline_id),
      el("dt", {}, "Spec"), el("dd", {}, p.spec.path),
      el("dt", {}, "Storage"), el("dd", {}, p.spec.storage || "–"),
      el("dt", {}, "Continuous"), el("dd", {}, p.spec.continuous ? "yes" : "no"));
    if (p.graph_error) graphBox.replaceChildren(errorBox({ message: p.graph_error }));
    const flows = p.flows || {};
    if (p.graph) {
      const k = JSON.stringify([p.graph, Object.fromEntries(Object.entries(flows).map(([n, f]) => [n, f.status]))]);
      if (k !== graphKey) { graphKey = k; graphBox.replaceChildren(graphView(p.graph, flows)); }
      const tables = new Set();
      flowsBody.replaceChildren(...p.graph.flows.map((f) => {
        const live = flows[f.name] || {};
        const lp = live.last_progress || {};
        const first = !tables.has(f.target.toLowerCase());
        tables.add(f.target.toLowerCase());
        const box = (set, name, disabled) => {
          const b = el("input", { type: "checkbox", "data-name": name, disabled });
          b.checked = set.has(name);
          b.addEventListener("change", () => (b.checked ? set.add(name) : set.delete(name)));
          return b;
        };
        return el("tr", {},
          el("td", {}, box(checked.reset, f.name, !f.kind.startsWith("APPEND") && !f.kind.startsWith("AUTO CDC") || f.kind.endsWith("ONCE"))),
          el("td", {}, f.name, " ", el("span", { class: "muted" }, f.kind)),
          el("td", {}, f.target),
          el("td", {}, first ? box(checked.refresh, f.target) : ""),
          el("td", {}, live.status ? status(live.status) : "–"),
          el("td", { class: "num" }, live.batches ?? "–"),
          el("td", { class: "num" }, live.input_rows ?? "–"),
          el("td", { class: "num" }, fmt(lp.inputRowsPerSecond)),
          el("td", { class: "num" }, fmt(lp.processedRowsPerSecond)));
      }));
    }
    const { updates } = await api("GET", path + "/updates");
    updatesBody.replaceChildren(...updates.slice(0, 20).map((u) => el("tr", {},
      el("td", {}, el("a", { href: "javascript:void 0", onclick: () => showEvents(u.update_id) }, u.update_id.slice(0, 8))),
      el("td", {}, status(u.state), u.error ? el("div", { class: "muted" }, u.error.message) : ""),
      el("td", {}, u.creation_time),
      el("td", {}, [u.full_refresh ? "full refresh" : "",
        u.refresh_selection.length ? "refresh " + u.refresh_selection.join(", ") : "",
        u.full_refresh_selection.length ? "full refresh " + u.full_refresh_selection.join(", ") : "",
        u.reset_checkpoint_selection.length ? "reset " + u.reset_checkpoint_selection.join(", ") : ""].filter(Boolean).join("; ") || "everything"))));
    const newest = updates[0] && updates[0].update_id;
    if (newest && (shownUpdate === null || shownUpdate === newest)) await showEvents(newest);
  });
}
