// rlmon's run page: the runs, a run's key curves (uPlot), an alert. Reads /api/ (docs/page.md);
// polls for new steps and alerts. No build step: plain browser JavaScript.
"use strict";

const QUERY = new URLSearchParams(location.search);
// ?poll=ms, within 0.2 s and a minute (anything else: the default 2 s)
const POLL_ASKED = Number(QUERY.get("poll"));
const POLL_MS = QUERY.get("poll") && Number.isFinite(POLL_ASKED)
  ? Math.min(Math.max(POLL_ASKED, 200), 60000) : 2000;
// with a token configured the page keeps the key the service derives from it (never the token),
// in this origin's storage (scheme, host and port: another port's server never sees it)
const KEY_ITEM = "rlmon.key";
const COLORS = ["#1f5fbf", "#c62828", "#2e7d32", "#8e24aa", "#e08600", "#00838f"];
const STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6];
const view = document.getElementById("view");
const statusEl = document.getElementById("status");
// visit: which navigation is current; a view whose data comes back after a later navigation is
// not drawn (the server answers concurrently: a slow answer must not replace the page navigated to)
const page = { kind: null, key: null, run: null, charts: [], alertsSeen: null, busy: false, visit: 0 };

async function api(name, params) {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== "") qs.set(k, v);
  }
  const headers = authHeaders();
  const resp = await fetch("api/" + name + (qs.toString() ? "?" + qs : ""), { headers });
  const body = await resp.json().catch(() => ({ error: resp.statusText }));
  if (resp.status === 401 && headers.Authorization === authHeaders().Authorization) {
    localStorage.removeItem(KEY_ITEM);  // a key of another token: open /#token=... again
  }
  if (!resp.ok) throw new Error(body.error || resp.statusText);
  return body;
}

function authHeaders() {
  const key = localStorage.getItem(KEY_ITEM);
  return key ? { Authorization: "Bearer " + key } : {};
}

async function takeToken() {
  // /#token=... (never sent to the server) or /?token=...: traded once for the page key, then
  // dropped from the address
  // read as typed and %-decoded, not form-decoded: a token may hold "+" (RFC 6750), never a space
  const hash = location.hash.match(/^#token=([^&]*)/);
  const query = location.search.match(/[?&]token=([^&]*)/);
  const given = hash ? hash[1] : query ? query[1] : "";
  let token;
  try { token = decodeURIComponent(given); } catch (e) { token = given; }
  if (!token) return;
  QUERY.delete("token");
  history.replaceState(null, "", location.pathname + (QUERY.toString() ? "?" + QUERY : "") +
                       (hash ? "#/" : location.hash));
  const resp = await fetch("api/key", { headers: { Authorization: "Bearer " + token } });
  const body = await resp.json().catch(() => ({}));
  if (resp.ok && body.key) localStorage.setItem(KEY_ITEM, body.key);
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function patch(old, fresh) {
  // redraw ``old`` as ``fresh`` keeping every node that did not change: a poll that replaced the
  // whole runs table dropped a click whose press and release straddled it (and any selection)
  if (old.isEqualNode(fresh)) return;
  if (old.nodeType !== Node.ELEMENT_NODE || old.tagName !== fresh.tagName ||
      old.childNodes.length !== fresh.childNodes.length || !sameAttributes(old, fresh)) {
    old.replaceWith(fresh);
    return;
  }
  const pairs = [...old.childNodes].map((node, i) => [node, fresh.childNodes[i]]);
  for (const [a, b] of pairs) patch(a, b);
}

function patchChildren(parent, fresh) {
  // ``parent``'s children redrawn as ``fresh`` (a list of nodes), as ``patch`` does
  if (parent.childNodes.length !== fresh.length) parent.replaceChildren(...fresh);
  else [...parent.childNodes].forEach((node, i) => patch(node, fresh[i]));
}

function sameAttributes(a, b) {
  if (a.attributes.length !== b.attributes.length) return false;
  return [...a.attributes].every(({ name, value }) => b.getAttribute(name) === value);
}

// a non-finite value as the contract names it (JSON carries it as null), shown as the report,
// diagnose and the notifications print it
const NONFINITE_SHOWN = { NaN: "NaN", Infinity: "+Inf", "-Infinity": "-Inf" };

function fmt(value) {
  if (value === null || value === undefined) return "n/a";
  if (typeof value !== "number") return String(value);
  if (value !== 0 && (Math.abs(value) >= 1e5 || Math.abs(value) < 1e-3)) return value.toExponential(3);
  return Number(value.toPrecision(4)).toString();
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "n/a";
  if (seconds < 90) return Math.round(seconds) + " s ago";
  if (seconds < 5400) return Math.round(seconds / 60) + " min ago";
  if (seconds < 172800) return Math.round(seconds / 3600) + " h ago";
  return Math.round(seconds / 86400) + " d ago";
}

function runLink(run, role, text) {
  return el("a", { href: "#/run/" + encodeURIComponent(run) + "?role=" + encodeURIComponent(role) },
            text || run);
}

function runHash(w) {
  // the whole view in the address, so that it can be shared
  const qs = new URLSearchParams();
  if (w.role) qs.set("role", w.role);
  if (w.from !== "" && w.from !== undefined) qs.set("from", w.from);
  if (w.to !== "" && w.to !== undefined) qs.set("to", w.to);
  for (const m of w.m || []) qs.append("m", m);
  for (const r of w.with || []) qs.append("with", r);
  for (const a of w.att || []) qs.append("att", a);
  const cv = curveView(w);
  if (cv.smooth) qs.set("smooth", String(cv.smooth));
  if (cv.log) qs.set("log", "1");
  if (cv.x !== "step") qs.set("x", cv.x);
  return "#/run/" + encodeURIComponent(w.run) + (qs.toString() ? "?" + qs : "");
}

function alertHref(run, role, alert, step) {
  return "#/alert/" + [run, role, alert, step].map(encodeURIComponent).join("/");
}

function setStatus(ok, text) {
  statusEl.className = ok ? "live" : "down";
  statusEl.textContent = text;
}

function showError(err) {
  view.replaceChildren(el("p", { class: "error" }, "rlmon: " + err.message));
}

// --- routing ----------------------------------------------------------------------------------

function parseHash() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, query] = hash.split("?");
  let parts;
  try {
    parts = path.split("/").filter((p) => p !== "").map(decodeURIComponent);
  } catch (err) {  // a malformed %-escape in a pasted address
    return { kind: "bad", error: new Error("this address is not well formed (" + err.message + "): #" + hash) };
  }
  const params = new URLSearchParams(query || "");
  if (parts[0] === "run" && parts.length >= 2) {
    // m: metrics picked by name; with: other runs overlaid; att: attempts of this run overlaid
    return { kind: "run", run: parts[1], role: params.get("role") || "",
             from: params.get("from") || "", to: params.get("to") || "",
             m: params.getAll("m"), with: params.getAll("with"), att: params.getAll("att"),
             smooth: params.get("smooth") || "", log: params.get("log") === "1",
             x: params.get("x") || "step" };
  }
  if (parts[0] === "diff" && parts.length >= 3) return { kind: "diff", a: parts[1], b: parts[2] };
  if (parts[0] === "alert" && parts.length >= 4) {
    return { kind: "alert", run: parts[1], role: parts[2], alert: parts[3], step: parts[4] || "" };
  }
  return { kind: "runs" };
}

async function route() {
  const where = parseHash();
  const visit = ++page.visit;
  for (const chart of page.charts) chart.destroy();
  page.charts = [];
  page.kind = where.kind;
  page.run = null;
  page.runsData = null;
  const current = () => visit === page.visit;
  try {
    if (where.kind === "run") await showRun(where, current);
    else if (where.kind === "alert") await showAlert(where, current);
    else if (where.kind === "diff") await showDiff(where, current);
    else if (where.kind === "bad") throw where.error;
    else await showRuns(current);
  } catch (err) {
    if (current()) showError(err);
  }
}

// --- runs -------------------------------------------------------------------------------------

// the runs table's columns: value (sorting and search), cell (what is shown), role (a role's
// row beneath, where the column means something for one role); "set:<key>": a reported setting
const RUN_COLUMNS = [
  { key: "state", label: "state", value: (r) => worstFirst(r.state), cell: (r, d) => stateBadge(r.state, d),
    role: (s, d) => stateBadge(s.state, d) },
  { key: "start", label: "start", value: (r) => r.start, cell: (r) => when(r.start) },
  { key: "duration", label: "duration", num: true, value: (r) => r.duration_seconds,
    cell: (r) => span(r.duration_seconds) },
  { key: "last_step", label: "last step", num: true, value: (r) => r.last_step,
    cell: (r) => r.last_step, role: (s) => el("span", { class: "last-step" }, s.last_step) },
  { key: "age", label: "last step at", value: (r) => -(r.age_seconds ?? Infinity),
    cell: (r) => age(r.age_seconds), role: (s) => age(s.age_seconds) },
  { key: "gpus", label: "GPUs", num: true, value: (r) => r.gpus ?? r.ranks_expected,
    cell: (r) => r.gpus !== null ? fmt(r.gpus) : el("span", { class: "muted", title:
      "the service has not counted this run's GPUs (read from a store without it)" },
      r.ranks_expected + " ranks"),
    role: (s) => el("span", { class: "ranks", title: "ranks that reported the last step" },
                    s.ranks_reporting + " / " + s.ranks_expected + " ranks") },
  { key: "cost", label: "cost", num: true, value: (r) => r.gpu_hours, cell: (r, d) => cost(r, d.price) },
  { key: "alerts", label: "firing alerts", value: (r) => r.firing.length,
    cell: (r) => alertBadges(r, r.firing), role: (s) => alertBadges(s, s.firing) },
  { key: "framework", label: "framework", value: (r) => r.framework,
    cell: (r) => r.framework || el("span", { class: "muted" }, "not said") },
  { key: "goodput", label: "goodput", num: true, value: (r) => r.goodput,
    cell: (r) => r.goodput === null ? "n/a" : (100 * r.goodput).toFixed(1) + " %" },
  { key: "tags", label: "tags", value: (r) => (r.tags.length ? r.tags.join(",") : null),
    cell: (r) => r.tags.map((t) => el("button", { type: "button", class: "tag", "data-tag": t,
                                                  title: "only the runs tagged " + t }, t)) },
];
const DEFAULT_COLUMNS = ["state", "start", "duration", "last_step", "age", "gpus", "cost", "alerts",
                         "framework", "tags"];

function settingColumn(key) {
  return { key: "set:" + key, label: key, setting: true, value: (r) => r.settings[key] ?? null,
           cell: (r) => r.settings[key] ?? "" };
}

function stateBadge(state, data) {
  return el("span", { class: "badge " + state, title: data.states_known ? "" :
    "this service keeps no liveness state: see the last step's age" }, state);
}

function when(unix) {
  if (unix === null || unix === undefined) return "n/a";
  const d = new Date(unix * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
    pad(d.getHours()) + ":" + pad(d.getMinutes());
}

function span(seconds) {
  if (seconds === null || seconds === undefined) return "n/a";
  if (seconds < 60) return seconds.toFixed(seconds < 10 ? 1 : 0) + " s";
  if (seconds < 3600) return Math.floor(seconds / 60) + " min " + Math.round(seconds % 60) + " s";
  if (seconds < 172800) return Math.floor(seconds / 3600) + " h " + Math.round(seconds % 3600 / 60) + " min";
  return (seconds / 86400).toFixed(1) + " d";
}

function cost(r, price) {
  // the run's GPUs over its duration, as alerts are priced (money with goodput.price_per_gpu_hour)
  if (r.gpu_hours === null) return el("span", { class: "muted" }, "n/a");
  const hours = fmt(r.gpu_hours) + " GPU-h";
  return r.money === null || !price ? hours : hours + " (" + r.money.toFixed(2) + " " + price.currency + ")";
}

function alertBadges(row, firing) {
  return firing.length ? firing.map((a) => el("a", {
    class: "badge " + a.severity, href: alertHref(row.run, a.role || row.role, a.alert, a.step) },
    a.alert)) : el("span", { class: "muted" }, "none");
}

function runsView(params) {
  // what the runs table shows, from the address: sort (a column, "-" first: descending),
  // the search, the state, the columns
  const cols = params.get("cols");
  return { sort: params.get("sort") || "", q: params.get("q") || "", state: params.get("state") || "",
           tag: params.get("tag") || "",
           cols: cols === null ? DEFAULT_COLUMNS : cols.split(",").filter((c) => c) };
}

function shownRunsView() {
  return runsView(new URLSearchParams(location.hash.split("?")[1] || ""));
}

function runsHash(v) {
  const qs = new URLSearchParams();
  if (v.sort) qs.set("sort", v.sort);
  if (v.q) qs.set("q", v.q);
  if (v.state) qs.set("state", v.state);
  if (v.tag) qs.set("tag", v.tag);
  if (v.cols.join(",") !== DEFAULT_COLUMNS.join(",")) qs.set("cols", v.cols.join(","));
  return "#/" + (qs.toString() ? "?" + qs : "");
}

function runMatches(r, q) {
  if (!q) return true;
  const text = [r.run, r.state, r.framework, ...r.roles.map((s) => s.role + " " + s.state),
                ...r.firing.map((a) => a.alert), ...r.tags,
                ...Object.entries(r.settings).map(([k, v]) => k + "=" + v)].join(" ").toLowerCase();
  return q.toLowerCase().split(/\s+/).filter((w) => w).every((w) => text.includes(w));
}

function compareValues(a, b) {
  // nulls last whatever the direction (applied before it)
  if (a === null || a === undefined) return b === null || b === undefined ? 0 : 1;
  if (b === null || b === undefined) return -1;
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b), undefined, { numeric: true });
}

function runsTable(data, v, onChange) {
  const all = [...RUN_COLUMNS, ...data.settings.map(settingColumn)];
  const shown = v.cols.map((k) => all.find((c) => c.key === k)).filter((c) => c);
  const desc = v.sort.startsWith("-");
  const sortKey = v.sort.replace(/^-/, "");
  const sortCol = sortKey === "run" ? { value: (r) => r.run } : all.find((c) => c.key === sortKey);
  let runs = data.runs.filter((r) => (!v.state || r.state === v.state) &&
                                     (!v.tag || r.tags.includes(v.tag)) && runMatches(r, v.q));
  if (sortCol) {
    runs = runs.map((r, i) => [r, i]).sort(([a, i], [b, j]) => {
      const x = sortCol.value(a), y = sortCol.value(b);
      if (x === null || x === undefined || y === null || y === undefined) return compareValues(x, y) || i - j;
      return (desc ? -1 : 1) * compareValues(x, y) || i - j;
    }).map(([r]) => r);
  }
  const header = (key, label, num) => {
    const active = sortKey === key;
    const th = el("th", { "data-col": key, class: (num ? "num " : "") + "sortable" + (active ? " sorted" : ""),
                          title: "sort by " + label },
                  label, active ? (desc ? " \u25bc" : " \u25b2") : "");
    th.onclick = () => onChange(() => ({ sort: active && !desc ? "-" + key : active ? "" : key }));
    return th;
  };
  const head = el("tr", {}, header("run", "run"), shown.map((c) => header(c.key, c.label, c.num)));
  const rows = [];
  for (const r of runs) {
    rows.push(el("tr", { class: "run-row", "data-run": r.run, "data-state": r.state },
      el("td", {}, el("a", { href: "#/run/" + encodeURIComponent(r.run) }, r.run),
         r.attempt ? el("span", { class: "muted" }, " (attempt " + r.attempt + ")") : null),
      shown.map((c) => el("td", { class: c.num ? "num" : null, "data-col": c.key }, c.cell(r, data)))));
    rows[rows.length - 1].querySelectorAll("button.tag").forEach((b) => {
      b.onclick = () => onChange(() => ({ tag: b.dataset.tag }));
    });
    for (const s of r.roles) {
      rows.push(el("tr", { class: "role-row", "data-run": r.run, "data-role": s.role, "data-state": s.state },
        el("td", { class: "role-name" }, runLink(r.run, s.role, s.role),
           s.attempt !== r.attempt ? el("span", { class: "muted" }, " (attempt " + s.attempt + ")") : null),
        shown.map((c) => el("td", { class: c.num ? "num" : null, "data-col": c.key },
                            c.role ? c.role(s, data) : ""))));
    }
  }
  const table = el("table", { id: "runs" }, el("thead", {}, head), el("tbody", {}, rows));
  table.dataset.shown = runs.length;
  return table;
}

function runsControls(data, v, onChange) {
  // search, state filter and the columns to show; each change is kept in the address
  const search = el("input", { type: "search", id: "runs-search", class: "wide", value: v.q,
                               placeholder: "search runs, roles, alerts, settings" });
  search.oninput = () => onChange(() => ({ q: search.value.trim() }));
  const states = [...new Set([...STATE_ORDER, ...data.runs.map((r) => r.state)])];
  const state = el("select", { id: "runs-state" }, el("option", { value: "" }, "any state"),
    states.map((s) => el("option", { value: s }, s)));
  state.value = v.state;
  state.onchange = () => onChange(() => ({ state: state.value }));
  // the runs' tags (a tag in the address that no run carries stays listed: it filters to none)
  const tags = [...new Set([...data.tags, ...(v.tag ? [v.tag] : [])])].sort();
  const tag = el("select", { id: "runs-tag" }, el("option", { value: "" }, "any tag"),
    tags.map((t) => el("option", { value: t }, t)));
  tag.value = v.tag;
  tag.onchange = () => onChange(() => ({ tag: tag.value }));
  const all = [...RUN_COLUMNS, ...data.settings.map(settingColumn)];
  const picker = el("details", { id: "runs-columns", class: "columns" }, el("summary", {}, "columns"),
    el("div", { class: "menu" }, all.map((c) => {
      const box = el("input", { type: "checkbox", "data-col": c.key });
      box.checked = v.cols.includes(c.key);
      box.onchange = () => onChange((now) => ({ cols: box.checked ? [...now.cols, c.key]
                                                                  : now.cols.filter((k) => k !== c.key) }));
      return el("label", { class: c.setting ? "setting" : null }, box, " ", c.label);
    })));
  return el("div", { class: "toolbar", id: "runs-controls" }, search, state, tag, picker,
            el("span", { class: "muted", id: "runs-count" }));
}

const STATE_ORDER = ["running", "slow", "stalled", "frozen", "finished", "failed", "preempted", "dead"];

function worstFirst(state) {
  // sorting by state puts the worst first (as the run's state is its worst role's); a state
  // added later just above running, unknown last
  const order = ["failed", "preempted", "dead", "frozen", "stalled", "slow", "running", "finished"];
  const i = order.indexOf(state);
  return i >= 0 ? i : state === "unknown" ? order.length : order.indexOf("running") - 0.5;
}

function drawRuns(data, navigated) {
  // the table from the address's view; the controls stay (a poll or a keystroke redraws the table
  // only, so the search box keeps its focus)
  const v = shownRunsView();
  const onChange = (change) => {  // change: the current view -> what changes
    const now = shownRunsView();
    history.replaceState(null, "", location.pathname + location.search + runsHash({ ...now, ...change(now) }));
    drawRuns(page.runsData);
  };
  page.runsData = data;
  if (!data.runs.length) {
    view.replaceChildren(el("h1", {}, "runs"), el("p", { class: "muted" }, "no steps in the history store yet"));
    return;
  }
  let controls = document.getElementById("runs-controls");
  const fresh = runsControls(data, v, onChange);
  // the controls are drawn anew when the settings or tags the runs reported change
  const known = data.settings.join(",") + "|" + data.tags.join(",") + "|" + v.tag;
  if (navigated || !controls || controls.dataset.settings !== known) {
    fresh.dataset.settings = known;
    view.replaceChildren(el("h1", {}, "runs"), fresh, el("table", { id: "runs" }));
    controls = fresh;
  } else {  // keep the search box (its focus, its caret); the rest follows the address
    controls.querySelectorAll("input[type=checkbox]").forEach((b) => { b.checked = v.cols.includes(b.dataset.col); });
    controls.querySelector("#runs-state").value = v.state;
    controls.querySelector("#runs-tag").value = v.tag;
    const search = controls.querySelector("#runs-search");
    if (document.activeElement !== search) search.value = v.q;
  }
  const table = runsTable(data, v, onChange);
  patch(document.getElementById("runs"), table);
  document.getElementById("runs-count").textContent =
    table.dataset.shown + " of " + data.runs.length + " runs";
}

async function showRuns(current) {
  const data = await api("runs");
  if (!current()) return;
  page.alertsSeen = data.alerts_seen;
  drawRuns(data, true);
}

// --- a run ------------------------------------------------------------------------------------

// how the curves are drawn (in the address): smoothing (TensorBoard's debiased exponential
// moving average, 0: none), log scale, and the x axis: step, time since the run's start, wall time
const X_AXES = { step: "step", relative: "time since start", wall: "wall time" };
const PLAIN = { smooth: 0, log: false, x: "step" };

function curveView(where) {
  const smooth = Number(where.smooth);
  return { smooth: Number.isFinite(smooth) ? Math.min(Math.max(smooth, 0), 0.99) : 0,
           log: where.log === true || where.log === "1", x: X_AXES[where.x] ? where.x : "step" };
}

function ema(ys, weight) {
  // the raw values where weight is 0; a gap (null) stays a gap and does not reset the average
  if (!weight) return ys;
  let last = 0, n = 0;
  return ys.map((v) => {
    if (v === null || v === undefined || !Number.isFinite(v)) return null;
    last = last * weight + (1 - weight) * v;
    n += 1;
    return last / (1 - Math.pow(weight, n));
  });
}

function pointX(src, i, cv) {
  // a point's place on the x axis: its step, or its step's finalization time (seconds since
  // the source run's first step, or wall time)
  if (cv.x === "step") return src.panel.x[i];
  const t = src.panel.t ? src.panel.t[i] : null;
  if (t === null || t === undefined || (cv.x === "wall" && (src.start === null || src.start === undefined))) return null;
  return cv.x === "wall" ? src.start + t : t;
}

function aligned(panel, sources, cv) {
  // every source's values of the panel's metrics on one x axis (the union of their points'
  // places): a point a source lacks is a gap in its curve only. sources: [{label, panel, start}];
  // a label names the series after its run (overlays)
  const keys = new Set();
  sources.forEach((s) => { if (s.panel) s.panel.x.forEach((_, i) => {
    const k = pointX(s, i, cv);
    if (k !== null) keys.add(k);
  }); });
  const xs = [...keys].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const out = { ...panel, x: xs, y: [], spread: [], nonfinite: [], series: [], stepX: [],
                steps: new Array(xs.length).fill(null) };
  const none = { count: 0, x: [], value: [] };
  sources.forEach((s, si) => {
    const place = new Map();  // step -> index in xs
    if (s.panel) s.panel.x.forEach((step, i) => {
      const k = pointX(s, i, cv);
      if (k === null) return;
      place.set(step, at.get(k));
      if (si === 0) out.steps[at.get(k)] = step;
    });
    out.stepX.push(new Map([...place].map(([step, i]) => [step, xs[i]])));
    panel.metrics.forEach((m, j) => {
      const k = s.panel ? s.panel.metrics.indexOf(m) : -1;
      const ys = new Array(xs.length).fill(null);
      let spread = null;
      if (k >= 0) {
        const from = s.panel.spread && s.panel.spread[k];
        if (from) spread = { min: new Array(xs.length).fill(null), max: new Array(xs.length).fill(null) };
        s.panel.x.forEach((step, n) => {
          const i = place.get(step);
          if (i === undefined) return;
          ys[i] = s.panel.y[k][n];
          if (spread) { spread.min[i] = from.min[n]; spread.max[i] = from.max[n]; }
        });
      }
      out.y.push(ys);
      out.spread.push(spread);
      out.nonfinite.push(k >= 0 ? s.panel.nonfinite[k] : none);
      const color = COLORS[(s.label ? si : j) % COLORS.length];
      out.series.push({ label: s.label ? s.label + ": " + m : m, color,
                        dash: s.label && j ? [[6, 3], [2, 3], [8, 3, 2, 3]][(j - 1) % 3] : undefined });
    });
  });
  return out;
}

function stepToX(stepX, step) {
  // where an alert's step falls on the x axis: its point, else the nearest point's place
  if (stepX.has(step)) return stepX.get(step);
  let best = null, gap = Infinity;
  for (const [s, x] of stepX) {
    if (Math.abs(s - step) < gap) { gap = Math.abs(s - step); best = x; }
  }
  return best;
}

function markerPlugin(panelEl, state) {
  // draws each alert transition as a vertical line; the panel of the alert's metric names it,
  // to the right of its line (labels that would overlap go one row lower)
  return {
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx;
        const drawn = { onsets: [], resolves: [], overlay: [] };
        const placed = [];
        const labels = [];
        const right = u.bbox.left + u.bbox.width;
        ctx.save();
        ctx.lineWidth = 1.5 * devicePixelRatio;
        ctx.font = (11 * devicePixelRatio) + "px sans-serif";
        ctx.textAlign = "left";  // uPlot leaves the y axis' alignment set
        ctx.textBaseline = "top";
        for (const t of state.alerts) {
          const where = state.xOf(t);
          if (where === null) continue;
          const x = Math.round(u.valToPos(where, "x", true));
          if (x < u.bbox.left - 1 || x > right + 1) continue;
          const firing = t.state === "firing";
          ctx.strokeStyle = t.color || (firing ? (t.severity === "critical" ? "#c62828" : "#e08600") : "#2e7d32");
          ctx.setLineDash(firing ? [6, 4] : [2, 4]);
          ctx.beginPath();
          ctx.moveTo(x, u.bbox.top);
          ctx.lineTo(x, u.bbox.top + u.bbox.height);
          ctx.stroke();
          // an overlaid run's transitions in its colour, kept apart from the shown run's
          if (t.source) { if (firing) drawn.overlay.push(t.source + "@" + t.step); }
          else (firing ? drawn.onsets : drawn.resolves).push(t.step);
          if (state.metrics.includes(t.metric)) {
            const text = (t.source ? t.source + ": " : "") + (firing ? "" : "resolved ") + t.alert;
            const width = ctx.measureText(text).width;
            // beside its line, on the right; at the right edge, ending there (still on the
            // line's side of any neighbour)
            const left = Math.min(x + 4 * devicePixelRatio, right - width);
            let row = 0;
            while (placed.some((p) => p.row === row && left < p.end && left + width > p.start)) row += 1;
            placed.push({ row, start: left - 2, end: left + width + 2 });
            const y = u.bbox.top + (2 + 14 * row) * devicePixelRatio;
            ctx.setLineDash([]);
            ctx.fillStyle = "rgba(255,255,255,0.85)";
            ctx.fillRect(left - 1, y - 1, width + 2, 13 * devicePixelRatio);
            ctx.fillStyle = ctx.strokeStyle;
            ctx.fillText(text, left, y);
            labels.push(t.step + ":" + Math.round((left - x) / devicePixelRatio));
          }
        }
        // a NaN or infinite value is a gap in its curve: a triangle at the top marks its step
        const marked = [];
        const size = 5 * devicePixelRatio;
        ctx.setLineDash([]);
        ctx.fillStyle = NONFINITE_COLOR;
        state.nonfinite.forEach((marks, i) => {
          for (const step of marks.x) {
            const where = state.xOf({ step, si: state.sourceOf[i] || 0 });
            if (where === null) continue;
            const x = Math.round(u.valToPos(where, "x", true));
            if (x < u.bbox.left - 1 || x > right + 1) continue;
            ctx.beginPath();
            ctx.moveTo(x - size, u.bbox.top);
            ctx.lineTo(x + size, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + 2 * size);
            ctx.closePath();
            ctx.fill();
            marked.push(step);
          }
        });
        ctx.restore();
        const uniq = (a) => [...new Set(a)].sort((p, q) => p - q).join(",");
        panelEl.dataset.onsets = uniq(drawn.onsets);
        panelEl.dataset.resolves = uniq(drawn.resolves);
        if (drawn.overlay.length) panelEl.dataset.overlayOnsets = [...new Set(drawn.overlay)].join(",");
        panelEl.dataset.nonfinite = uniq(marked);
        // each label's step and its offset from its line, in CSS pixels (for tests and scripts)
        panelEl.dataset.labels = labels.join(",");
      }],
    },
  };
}

const NONFINITE_COLOR = "#b000b0";

function seriesLabel(metric, marks) {
  // the legend says how many values of the shown steps were NaN or infinite
  return marks.count ? metric + " (" + marks.count + " NaN/Inf)" : metric;
}

function relabel(chart) {
  const { panelEl, state } = chart.rlmon;
  const labels = chart.root.querySelectorAll(".u-legend .u-series .u-label");
  state.labels.forEach((m, i) => {
    if (labels[state.offset + i + 1]) labels[state.offset + i + 1].textContent = seriesLabel(m, state.nonfinite[i]);
  });
  panelEl.dataset.nonfiniteCounts = state.nonfinite.map((n) => n.count).join(",");
}

function countPoints(panelEl, data, offset) {
  panelEl.dataset.points = String(data[0].length);
  panelEl.dataset.seriesPoints = data.slice(1 + offset).map((s) => s.filter((v) => v !== null).length).join(",");
}

function drawnData(panel, cv) {
  // uPlot's columns: x, each band's lower and upper edge, the raw values behind a smoothed
  // curve, then the curves themselves (smoothed where asked); on a log scale a value <= 0 is
  // a gap, counted
  let hidden = 0;
  const positive = (ys) => (cv.log ? ys.map((v) => {
    if (v !== null && v <= 0) { hidden += 1; return null; }
    return v;
  }) : ys);
  const bands = [], raw = [], main = [];
  panel.y.forEach((ys, i) => {
    const s = panel.series[i];
    const spread = panel.spread && panel.spread[i];
    if (spread) bands.push({ i, min: positive(spread.min), max: positive(spread.max), color: s.color });
    if (cv.smooth) raw.push({ i, ys: positive(ys), color: s.color });
  });
  const lineHidden = hidden;
  hidden = 0;
  panel.y.forEach((ys) => main.push(positive(cv.smooth ? ema(ys, cv.smooth) : ys)));
  const data = [panel.x, ...bands.flatMap((b) => [b.min, b.max]), ...raw.map((r) => r.ys), ...main];
  return { data, bands, raw, offset: 2 * bands.length + raw.length, hidden: lineHidden + hidden };
}

function tickText(v) {
  // short and whole: 1.2M, not 1,200,000 cut to "000,000" by the axis' width
  if (v === null || v === undefined) return "";
  const a = Math.abs(v);
  if (a >= 1e4) {
    const [d, unit] = a >= 1e12 ? [1e12, "T"] : a >= 1e9 ? [1e9, "G"] : a >= 1e6 ? [1e6, "M"] : [1e3, "k"];
    return Number((v / d).toPrecision(3)) + unit;
  }
  if (a !== 0 && a < 1e-3) return v.toExponential(1);
  return String(Number(v.toPrecision(6)));
}

function duration(seconds) {
  const s = Math.abs(seconds);
  if (s < 120) return Math.round(seconds) + "s";
  if (s < 7200) return Number((seconds / 60).toPrecision(3)) + "min";
  return Number((seconds / 3600).toPrecision(3)) + "h";
}

const AXIS_FONT = "11px sans-serif";

function axisWidth(u, values) {
  // as wide as its longest label, so that none is cut
  if (!values || !values.length) return 40;
  u.ctx.save();
  u.ctx.font = (11 * devicePixelRatio) + "px sans-serif";
  const widest = Math.max(...values.map((v) => u.ctx.measureText(String(v)).width)) / devicePixelRatio;
  u.ctx.restore();
  return Math.ceil(widest) + 18;  // the tick and the gap
}

function makeChart(panel, alerts, width, onZoom, where) {
  let cv = curveView(where || PLAIN);
  // nothing above 0 to draw on a log scale (a loss, a count of 0): this panel stays linear
  const noLog = cv.log && !panel.y.some((ys) => ys.some((v) => v !== null && v > 0));
  if (noLog) cv = { ...cv, log: false };
  const panelEl = el("div", { class: "panel", "data-title": panel.title,
                              "data-metrics": panel.metrics.join(","),
                              "data-picked": panel.picked ? "1" : null });
  const none = { count: 0, x: [], value: [] };
  // one series per metric, or per (run, metric) when runs are overlaid
  const align = (p) => (p.series ? p : aligned(p, [{ label: "", panel: p, start: p.start }], cv));
  let shown = align(panel);
  const drawn = drawnData(shown, cv);
  const state = { alerts, metrics: panel.metrics, labels: shown.series.map((s) => s.label),
                  offset: drawn.offset, sourceOf: shown.series.map((_, i) => Math.floor(i / panel.metrics.length)),
                  xOf: (t) => (cv.x === "step" ? t.step : stepToX(shown.stepX[t.si || 0] || new Map(), t.step)),
                  nonfinite: shown.series.map((s, i) => {
    const n = (shown.nonfinite || [])[i] || none;
    return { count: n.count, x: [...n.x], value: [...n.value] };
  }) };
  const data = drawn.data;
  const few = data[0].length <= 60;
  const faint = (color, alpha) => color + alpha;
  const xTime = cv.x !== "step";
  const opts = {
    title: panel.title + (panel.unit && panel.unit !== "none" && panel.unit !== "" ? " (" + panel.unit + ")" : ""),
    width, height: 200,
    scales: { x: { time: cv.x === "wall" }, y: cv.log ? { distr: 3 } : {} },
    legend: { live: true },
    cursor: { sync: { key: "rlmon-" + cv.x }, drag: { x: true, y: false, setScale: false } },
    series: [{ label: X_AXES[cv.x], value: cv.x === "relative" ? (u, v) => (v === null ? "" : duration(v)) : undefined },
      ...drawn.bands.flatMap((b) => [
        { label: shown.series[b.i].label + " (lowest rank)", stroke: "transparent", width: 0, points: { show: false } },
        { label: shown.series[b.i].label + " (highest rank)", stroke: "transparent", width: 0, points: { show: false } }]),
      ...drawn.raw.map((r) => ({ label: shown.series[r.i].label + " (raw)", stroke: faint(r.color, "40"),
                                 width: 1, spanGaps: true, points: { show: false } })),
      ...shown.series.map((s, i) => ({
        label: seriesLabel(s.label, state.nonfinite[i]), stroke: s.color, dash: s.dash, width: 1.5,
        spanGaps: true, points: { show: few && !cv.smooth, size: 4 } }))],
    bands: drawn.bands.map((b, k) => ({ series: [1 + 2 * k + 1, 1 + 2 * k], fill: faint(b.color, "30") })),
    axes: [{ label: X_AXES[cv.x], size: 40, font: AXIS_FONT, incrs: xTime ? undefined : STEP_INCRS,
             values: cv.x === "relative" ? (u, splits) => splits.map(duration) : undefined },
           { size: axisWidth, font: AXIS_FONT, values: (u, splits) => splits.map(tickText) }],
    plugins: [markerPlugin(panelEl, state)],
    hooks: { setSelect: [(u) => {
      if (u.select.width < 3) return;
      const a = u.posToVal(u.select.left, "x");
      const b = u.posToVal(u.select.left + u.select.width, "x");
      u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
      if (!xTime) { onZoom(Math.floor(a), Math.ceil(b)); return; }
      // the steps of the shown run drawn in the selected time
      const steps = shown.steps.filter((s, i) => s !== null && shown.x[i] >= a && shown.x[i] <= b);
      if (steps.length) onZoom(Math.min(...steps), Math.max(...steps));
    }] },
  };
  countPoints(panelEl, data, drawn.offset);
  panelEl.dataset.bands = String(drawn.bands.length);
  panelEl.dataset.smooth = String(cv.smooth);
  const chart = new uPlot(opts, data, panelEl);
  chart.rlmon = { panelEl, state, panel, cv, update: (fresh) => {
    // the panel with new steps: its columns again (false: drawn otherwise now, draw it anew)
    const next = align(fresh);
    const d = drawnData(next, cv);
    if (d.offset !== drawn.offset) return false;
    shown = next;
    state.nonfinite = next.series.map((_, i) => {
      const n = (next.nonfinite || [])[i] || none;
      return { count: n.count, x: [...n.x], value: [...n.value] };
    });
    relabel(chart);
    countPoints(panelEl, d.data, d.offset);
    chart.setData(d.data);
    return true;
  } };
  // the legend names the curves; the bands' edges and the raw values behind are explained above
  chart.root.querySelectorAll(".u-legend .u-series").forEach((row, i) => {
    if (i >= 1 && i <= drawn.offset) row.style.display = "none";
  });
  relabel(chart);
  const help = panel.help.filter((h) => h).join(" / ");
  const notes = [help, drawn.bands.length ? "band: the lowest and the highest rank's own value" : "",
                 drawn.hidden ? drawn.hidden + " values <= 0 not drawn on the log scale" : "",
                 noLog ? "linear: no value above 0 for a log scale" : ""];
  panelEl.append(el("div", { class: "marks muted", title: help }, notes.filter((n) => n).join(" / ")));
  return chart;
}

function chartWidth() {
  const columns = Math.max(1, Math.floor((view.clientWidth + 12) / 532));
  return Math.floor((view.clientWidth - 12 * (columns - 1)) / columns) - 12;
}

function sourceLabel(src) {
  return src.attempt !== "" ? src.run + " (attempt " + src.attempt + ")" : src.run;
}

async function runCurves(src, where, picked) {
  // the key panels and the metrics picked by name, of one (run, role, attempt)
  const params = { run: src.run, role: where.role, attempt: src.attempt, from: where.from, to: where.to };
  const [key, named] = await Promise.all([
    api("curves", params),
    picked.length ? api("curves", { ...params, metrics: picked.join("\n") }) : null]);
  if (named) key.panels = [...named.panels.map((p) => ({ ...p, picked: true })), ...key.panels];
  return key;
}

function curveControls(where) {
  // smoothing, log scale and the x axis: kept in the address, drawn again from the data read
  const cv = curveView(where);
  const change = (w) => {
    Object.assign(page.run.where, w);
    history.replaceState(null, "", location.pathname + location.search + runHash(page.run.where));
    drawPanels();
  };
  const smooth = el("input", { type: "range", id: "curve-smooth", min: "0", max: "0.99", step: "0.01",
                               value: String(cv.smooth), title: "exponential moving average (the raw values faint behind)" });
  const shownSmooth = el("span", { id: "curve-smooth-value", class: "num" }, cv.smooth.toFixed(2));
  smooth.oninput = () => { shownSmooth.textContent = Number(smooth.value).toFixed(2); change({ smooth: smooth.value }); };
  const log = el("input", { type: "checkbox", id: "curve-log" });
  log.checked = cv.log;
  log.onchange = () => change({ log: log.checked });
  const x = el("select", { id: "curve-x" }, Object.entries(X_AXES).map(([k, label]) => el("option", { value: k }, label)));
  x.value = cv.x;
  x.onchange = () => change({ x: x.value });
  return el("div", { class: "toolbar curve-controls", id: "curve-controls" },
            "smoothing", smooth, shownSmooth, el("label", {}, log, " log scale"), "x axis", x);
}

function runControls(where, data) {
  // the metric picker (search over every metric the role reported) and the overlays; the
  // metrics' names and the other runs come after the panels are drawn (a long run's names are
  // read from its step lines once)
  const go = (w) => { location.hash = runHash({ ...where, ...w }); };
  let names = [];
  const search = el("input", { type: "search", id: "metric-search", class: "wide",
                               placeholder: "search every metric" });
  const list = el("div", { id: "metric-list" });
  search.oninput = () => {
    const q = search.value.trim().toLowerCase();
    const found = q ? names.filter((n) => n.toLowerCase().includes(q) && !where.m.includes(n)) : [];
    list.replaceChildren(...found.slice(0, 40).map((n) => {
      const b = el("button", { class: "metric-option", "data-metric": n }, n);
      b.onclick = () => go({ m: [...where.m, n] });
      return b;
    }), ...(found.length > 40 ? [el("span", { class: "muted" }, "... " + (found.length - 40) + " more")] : []));
  };
  const chip = (text, color, drop, attrs) => {
    const x = el("button", { class: "drop", title: "remove" }, "\u00d7");
    x.onclick = drop;
    return el("span", { class: "chip", ...attrs }, color ? el("span", { class: "swatch", style: "background:" + color }) : null, text, x);
  };
  const picked = where.m.map((m) => chip(m, null, () => go({ m: where.m.filter((n) => n !== m) }),
                                         { "data-metric": m }));
  const runInput = el("input", { id: "overlay-run", class: "wide", list: "overlay-runs",
                                 placeholder: "overlay a run" });
  const runList = el("datalist", { id: "overlay-runs" });
  const add = el("button", { id: "overlay-add" }, "overlay");
  add.onclick = () => { if (runInput.value) go({ with: [...where.with, runInput.value] }); };
  const more = (data.attempts || []).filter((a) => String(a) !== String(data.attempt) && !where.att.includes(String(a)));
  const attempt = more.length ? el("select", { id: "overlay-attempt" }, el("option", { value: "" }, "overlay an attempt"),
                                   more.map((a) => el("option", { value: a }, "attempt " + a))) : null;
  if (attempt) attempt.onchange = () => { if (attempt.value) go({ att: [...where.att, attempt.value] }); };
  const shownRuns = [chip(sourceLabel({ run: data.run, attempt: where.att.length ? String(data.attempt) : "" }),
                          COLORS[0], null, { class: "chip main" })];
  shownRuns[0].querySelector(".drop").remove();
  let i = 1;
  for (const r of where.with) {
    shownRuns.push(chip(r, COLORS[i++ % COLORS.length], () => go({ with: where.with.filter((x) => x !== r) }),
                        { "data-run": r }));
  }
  for (const a of where.att) {
    shownRuns.push(chip("attempt " + a, COLORS[i++ % COLORS.length], () => go({ att: where.att.filter((x) => x !== a) }),
                        { "data-attempt": a }));
  }
  api("metrics", { run: data.run, role: data.role, attempt: data.attempt }).then((d) => {
    names = d.metrics;
    search.placeholder = "search " + names.length + " metrics";
    search.dataset.count = names.length;
    if (search.value) search.oninput();
  }).catch(() => {});
  api("runs").then((d) => {
    const runs = [...new Set(d.runs.map((r) => r.run))];
    runList.replaceChildren(...runs.filter((r) => r !== data.run && !where.with.includes(r))
      .map((r) => el("option", { value: r })));
  }).catch(() => {});
  return el("div", { class: "controls" }, curveControls(where),
    el("div", { class: "toolbar" }, "metrics", search, picked, el("span", { class: "muted" },
       where.m.length ? "" : "(the key panels are shown; pick any metric to add its panel)")),
    list,
    el("div", { class: "toolbar", id: "overlays" }, "runs", shownRuns, runInput, runList, add, attempt,
       where.with.length === 1 ? el("a", { id: "diff-link", href: "#/diff/" + [data.run, where.with[0]]
         .map(encodeURIComponent).join("/") }, "where they part ways") : null));
}

async function showRun(where, current) {
  const main = await runCurves({ run: where.run, attempt: "" }, where, where.m);
  if (!current()) return;
  const role = main.role;
  const full = { ...where, role };
  const sources = [...where.with.map((run) => ({ run, attempt: "" })),
                   ...where.att.map((attempt) => ({ run: where.run, attempt }))];
  const extra = await Promise.all(sources.map((src) => runCurves(src, full, where.m).then(
    (d) => ({ ...src, data: d }), (err) => ({ ...src, error: err }))));
  if (!current()) return;
  const data = main;
  page.run = { where: full, data, lastShown: data.to, zoomed: where.from !== "" || where.to !== "",
               overlays: extra, rerouted: Date.now() };
  const tabs = el("div", { class: "tabs" }, data.roles.map((r) => el("a", {
    href: runHash({ ...where, role: r, m: [], from: "", to: "" }), class: r === data.role ? "active" : null }, r)));
  const from = el("input", { type: "number", id: "zoom-from", value: data.from ?? "" });
  const to = el("input", { type: "number", id: "zoom-to", value: data.to ?? "" });
  const zoomTo = (lo, hi) => { location.hash = runHash({ ...full, from: lo, to: hi }); };
  const apply = el("button", { id: "zoom-apply" }, "zoom");
  apply.onclick = () => zoomTo(from.value, to.value);
  const reset = el("a", { href: runHash({ ...full, from: "", to: "" }), id: "zoom-reset" }, "all steps");
  const shown = el("span", { class: "muted", id: "shown" });
  const toolbar = el("div", { class: "toolbar" }, "steps", from, "to", to, apply, reset, shown);
  const alertList = el("div", { id: "alert-list" });
  const grid = el("div", { class: "grid", id: "panels" });
  const problems = extra.filter((s) => s.error).map((s) => el("p", { class: "error" },
    "rlmon: " + sourceLabel(s) + ": " + s.error.message));
  view.replaceChildren(el("h1", {}, "run ", el("span", { id: "run-name" }, data.run)), tabs,
                       runControls(where, data), toolbar,
                       ...problems, alertList, grid);
  drawPanels();
  renderRunInfo();
}

function drawPanels() {
  // the shown run's panels (with the overlaid runs' values) as the address says to draw them;
  // the smoothing, the scale and the x axis redraw them from the data already read
  const { data, where, overlays } = page.run;
  for (const chart of page.charts) chart.destroy();
  page.charts = [];
  const grid = document.getElementById("panels");
  grid.replaceChildren();
  if (!data.panels.length) grid.append(el("p", { class: "muted" }, "no metrics in this role"));
  const zoomTo = (lo, hi) => { location.hash = runHash({ ...where, from: lo, to: hi }); };
  const width = chartWidth();
  const cv = curveView(where);
  const others = overlays.filter((s) => s.data);
  let alerts = data.alerts;
  let shownPanels = data.panels.map((p) => ({ ...p, start: data.start_time }));
  if (others.length) {
    const labels = [sourceLabel({ run: data.run, attempt: where.att.length ? String(data.attempt) : "" }),
                    ...others.map(sourceLabel)];
    alerts = [...data.alerts, ...others.flatMap((s, i) => s.data.alerts.map((a) => ({
      ...a, source: labels[i + 1], si: i + 1, color: COLORS[(i + 1) % COLORS.length] })))];
    shownPanels = data.panels.map((p) => aligned(p, [{ label: labels[0], panel: p, start: data.start_time },
      ...others.map((s, i) => ({ label: labels[i + 1], start: s.data.start_time,
                                 panel: s.data.panels.find((q) => q.title === p.title) || null }))], cv));
  }
  for (const panel of shownPanels) {
    const chart = makeChart(panel, alerts, width, zoomTo, where);
    grid.append(chart.rlmon.panelEl);
    page.charts.push(chart);
  }
}

function renderRunInfo() {
  const { data } = page.run;
  const shown = document.getElementById("shown");
  shown.textContent = "steps " + fmt(data.from) + " to " + fmt(data.to) + " (" + data.shown_steps +
    " of " + data.steps + " steps; last step " + data.last_step + ")";
  shown.dataset.lastStep = data.last_step;
  const onsets = data.alerts.filter((a) => a.state === "firing");
  patchChildren(document.getElementById("alert-list"), [onsets.length ? el("div", {},
    "alerts: ", onsets.map((a) => el("a", { class: "badge " + a.severity, "data-step": a.step,
                                          href: alertHref(data.run, data.role, a.alert, a.step) },
                                     a.alert + " at step " + a.step))) :
    el("span", { class: "muted" }, "no alert fired in these steps")]);
}

async function refreshRun(stream) {
  // new steps of the shown (run, role): append them (the page shows every step, not a zoom)
  const run = page.run;
  if (!run || run.zoomed || stream.last_step <= run.lastShown) return;
  if (run.overlays.length) {
    // overlaid runs: drawn again with the new steps, at most every 10 s
    if (Date.now() - run.rerouted > 10000) await route();
    return;
  }
  const fresh = await runCurves({ run: run.data.run, attempt: "" },
                                { ...run.where, from: run.lastShown + 1, to: "" }, run.where.m);
  if (page.run !== run) return;
  const titles = (d) => d.panels.map((p) => p.title).join("|");
  const tooMany = page.charts.some((c) => c.data[0].length + fresh.shown_steps > 4 * 2 * run.data.points) ||
    page.charts.length !== fresh.panels.length;
  if (titles(fresh) !== titles(run.data) || tooMany) { await route(); return; }
  run.data.alerts.push(...fresh.alerts);
  let redraw = false;
  fresh.panels.forEach((p, i) => {
    const model = run.data.panels[i];
    const before = model.x.length;
    model.x.push(...p.x);
    model.t = [...(model.t || new Array(before).fill(null)), ...(p.t || new Array(p.x.length).fill(null))];
    p.y.forEach((ys, j) => { model.y[j].push(...ys); });
    model.spread = (model.spread || []).length ? model.spread : p.metrics.map(() => null);
    p.metrics.forEach((_, j) => {
      const add = (p.spread || [])[j];
      const known = model.spread[j];
      if (!add && !known) return;
      const nulls = (n) => new Array(n).fill(null);
      model.spread[j] = {
        min: [...(known ? known.min : nulls(before)), ...(add ? add.min : nulls(p.x.length))],
        max: [...(known ? known.max : nulls(before)), ...(add ? add.max : nulls(p.x.length))] };
    });
    p.nonfinite.forEach((n, j) => {
      const known = model.nonfinite[j];
      known.count += n.count;
      known.x.push(...n.x);
      known.value.push(...n.value);
    });
    const chart = page.charts[i];
    chart.rlmon.state.alerts = run.data.alerts;
    if (!chart.rlmon.update({ ...model, start: run.data.start_time })) redraw = true;
  });
  if (redraw) drawPanels();
  Object.assign(run.data, { to: fresh.to, last_step: fresh.last_step, steps: fresh.steps,
                            shown_steps: run.data.shown_steps + fresh.shown_steps });
  run.lastShown = fresh.to;
  renderRunInfo();
}

// --- an alert ---------------------------------------------------------------------------------

function facts(pairs) {
  return el("dl", { class: "facts" }, pairs.filter(([, v]) => v !== "" && v !== null &&
    v !== undefined).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

function samplesTable(samples) {
  if (!samples.length) return el("p", { class: "muted", id: "samples" }, "no samples stored at this step");
  const rows = [];
  for (const s of samples) {
    s.items.forEach((item, n) => rows.push(el("tr", { class: "sample", "data-metric": s.metric },
      el("td", { class: "num" }, n + 1), el("td", {}, s.metric), el("td", { class: "num" }, fmt(item.score)),
      el("td", {}, item.id), el("td", {}, el("pre", { class: "payload" }, item.payload)))));
  }
  return el("table", { id: "samples" }, el("thead", {}, el("tr", {},
    ["#", "metric", "score", "id", "payload"].map((h) => el("th", {}, h)))), el("tbody", {}, rows));
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function spanColor(name) {
  let h = 0;
  for (const c of name) h = (h * 31 + c.charCodeAt(0)) % 360;
  return "hsl(" + h + ",55%,62%)";
}

function timelineView(timeline) {
  // one row per rank: its step, and its spans by depth (the Perfetto trace has them all)
  const ranks = timeline.ranks;
  const start = Math.min(...ranks.map((r) => r.start));
  const end = Math.max(...ranks.map((r) => r.end));
  const labelW = 150, width = Math.max(chartWidth(), 600), rowH = 26;
  const scale = (ns) => labelW + (width - labelW - 10) * (ns - start) / Math.max(end - start, 1);
  const root = svg("svg", { width, height: rowH * ranks.length + 24, id: "timeline-svg" });
  ranks.forEach((r, i) => {
    const y = i * rowH + 4;
    const label = Object.entries(r.rank).filter(([a, n]) => n || a === "dp" || a === "cp")
      .map(([a, n]) => a + "=" + n).join(" ");
    root.append(svg("text", { x: 4, y: y + 15 }, label));
    const bar = svg("rect", { x: scale(r.start), y: y + 2, width: Math.max(scale(r.end) - scale(r.start), 1),
                              height: rowH - 8, fill: "#eef1f5", class: "rank-step" });
    bar.append(svg("title", {}, "step: " + ((r.end - r.start) / 1e6).toFixed(1) + " ms"));
    root.append(bar);
    // parents before children: a later rect covers an earlier one
    const spans = [...r.spans].sort((p, q) => p[3] - q[3] || p[1] - q[1]);
    for (const [name, s, e, depth] of spans) {
      const rect = svg("rect", { x: scale(s), y: y + 4 + 3 * depth, width: Math.max(scale(e) - scale(s), 1),
                                 height: rowH - 12 - 3 * depth, fill: spanColor(name), class: "span",
                                 "data-name": name, "data-depth": depth });
      rect.append(svg("title", {}, name + ": " + ((e - s) / 1e6).toFixed(1) + " ms"));
      root.append(rect);
    }
  });
  let x = labelW;
  const names = [...new Set(ranks.flatMap((r) => r.spans.map((s) => s[0])))];
  root.append(svg("text", { x, y: rowH * ranks.length + 18 },
                  "0 to " + ((end - start) / 1e6).toFixed(1) + " ms:"));
  x += 110;
  for (const name of names) {
    root.append(svg("rect", { x, y: rowH * ranks.length + 9, width: 10, height: 10, fill: spanColor(name) }));
    root.append(svg("text", { x: x + 14, y: rowH * ranks.length + 18 }, name));
    x += 24 + 7 * name.length;
  }
  return root;
}

async function escalation(a) {
  // the alert's severity now (a warning that escalated is critical): the alert's answer says it
  // with the severity it fired at; else its latest firing transition from the onset to its resolve
  if (a.first_severity !== undefined) {
    return { severity: a.severity, from: a.first_severity !== a.severity ? a.first_severity : "",
             step: a.escalated_at ?? null };
  }
  const transitions = await api("curves", { run: a.run, role: a.role, attempt: a.attempt, from: a.onset,
                                            to: a.resolved ?? "", metrics: a.metric || undefined })
    .then((d) => d.alerts).catch(() => []);
  const firings = transitions.filter((t) => t.alert === a.alert && t.state === "firing" && t.step >= a.onset);
  const last = firings[firings.length - 1];
  if (!last || last.severity === a.severity) return { severity: a.severity, from: "", step: null };
  return { severity: last.severity, from: a.severity, step: last.step };
}

function costText(a) {
  // what the condition has cost so far: the answer's words, else its GPU-hours (and money)
  const c = a.cost;
  if (!c) return "";
  if (c.note) return c.note;
  return c.gpu_hours != null ? fmt(c.gpu_hours) + " GPU-hours" + (c.money != null ? " (" + fmt(c.money) + ")" : "") : "";
}

async function showAlert(where, current) {
  const a = await api("alert", { run: where.run, role: where.role, alert: where.alert, step: where.step });
  if (!current()) return;
  const now = await escalation(a);
  if (!current()) return;
  const state = a.firing ? el("span", { class: "badge firing", id: "alert-state" }, "firing since step " + a.onset)
    : a.ended_with_run ? el("span", { class: "badge firing", id: "alert-state" },
                            "fired at step " + a.onset + ", still firing when the run ended at step " + a.resolved)
    : a.handed_to ? el("span", { class: "badge firing", id: "alert-state" },
                       "fired at step " + a.onset + ", handed over to " + a.handed_to + " at step " + a.resolved +
                       " (its level rule fires now)")
    : el("span", { class: "badge resolved", id: "alert-state" }, "fired at step " + a.onset + ", resolved at step " + a.resolved);
  const severity = now.from ? now.severity + " (escalated from " + now.from +
    (now.step !== null ? " at step " + now.step : "") + ")" : now.severity;
  const change = Array.isArray(a.what_to_change) ? a.what_to_change.join("\n") : a.what_to_change;
  const parts = [
    el("h1", {}, a.alert + " ", el("span", { class: "badge " + now.severity, id: "alert-severity" }, now.severity),
       " ", state),
    el("p", {}, runLink(a.run, a.role, "run " + a.run + " / " + a.role)),
    facts([["severity", severity], ["condition", a.condition],
           ["critical condition", a.critical_condition], ["summary", a.summary], ["metric", a.metric],
           ["value at onset", a.nonfinite ? NONFINITE_SHOWN[a.nonfinite] : fmt(a.value)],
           ["what it measures", a.help],
           ["what to check", a.what_to_check],
           ["what to change", change ? el("span", { id: "what-to-change", class: "prewrap" }, change) : ""],
           ["what moved first", a.first_moved ? el("span", { id: "first-moved" }, a.first_moved) : ""],
           ["cost so far", costText(a) ? el("span", { id: "alert-cost" }, costText(a)) : ""],
           ["run state", a.liveness ? a.liveness.state + " since " +
             new Date(a.liveness.since * 1000).toLocaleString() : ""],
           ["where the ranks are", a.liveness && a.liveness.detail ?
             el("pre", { class: "payload", id: "liveness-detail" }, a.liveness.detail) : ""]]),
  ];
  const around = el("div", { class: "panel", id: "around" });
  parts.push(el("h2", {}, "values around the onset"), around);
  parts.push(el("h2", {}, "worst samples at step " + a.onset), samplesTable(a.samples));
  const tl = el("div", { class: "timeline", id: "timeline" });
  parts.push(el("h2", {}, "step " + a.onset + " per rank ",
                el("a", { href: "api/" + a.trace.replace(/^\/api\//, ""), id: "perfetto",
                          download: a.run + "-step" + a.onset + ".pftrace" }, "Perfetto trace"),
                el("span", { class: "muted" }, " (open at ui.perfetto.dev)")), tl);
  view.replaceChildren(...parts);
  const perfetto = document.getElementById("perfetto");
  perfetto.onclick = async (event) => {  // a link cannot send the key: fetch it, then save it
    if (!localStorage.getItem(KEY_ITEM)) return;
    event.preventDefault();
    const resp = await fetch(perfetto.getAttribute("href"), { headers: authHeaders() });
    const url = URL.createObjectURL(await resp.blob());
    const save = el("a", { href: url, download: perfetto.getAttribute("download") });
    save.click();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  };
  if (a.timeline) tl.append(timelineView(a.timeline));
  else tl.append(el("p", { class: "muted" }, "no timeline stored for this step"));
  if (a.around && a.around.x.length) {
    const chart = makeChart({ title: a.metric, unit: "", metrics: [a.metric], help: [],
                              x: a.around.x, y: [a.around.y],
                              nonfinite: [a.around.nonfinite] },
                            [{ step: a.onset, alert: a.alert, state: "firing", severity: a.severity, metric: a.metric },
                             ...(a.resolved !== null && !a.ended_with_run && !a.handed_to ? [{ step: a.resolved, alert: a.alert, state: "resolved",
                                                          severity: a.severity, metric: a.metric }] : [])],
                            Math.min(chartWidth(), 900), () => {});
    around.replaceWith(chart.rlmon.panelEl);
    chart.rlmon.panelEl.id = "around";
    page.charts.push(chart);
  } else {
    around.append(el("p", { class: "muted" }, "no values of " + (a.metric || "a metric") + " stored"));
  }
}

// --- two runs compared -----------------------------------------------------------------------

function diffValue(m, run) {
  // a non-finite value travels as null: the run that logged it says which
  const value = run === "A" ? m.a_value : m.b_value;
  if (value === null && (m.nonfinite === run || m.nonfinite === "both")) return "NaN or Inf";
  return fmt(value);
}

function howFar(m) {
  // what the departure is, as rlmon diff describes it (MetricDivergence.describe)
  if (m.nonfinite === "both") return "non-finite in both runs, but not alike";
  if (m.nonfinite) return "NaN or Inf in " + (m.nonfinite === "A" ? "the first" : "the second") + " run only";
  if (m.telemetry) return (m.exact ? "differs value for value" : fmt(m.score) + "x the bar") +
    "; the machines differ, not the training";
  if (m.shared_start) return "logged identically until this step (the same seed and data), then differs";
  if (m.exact) return "no noise in either run: a setting or a schedule";
  if (m.discrete) return fmt(m.score) + "x the bar; a series that moves rarely, in steps";
  return fmt(m.score) + "x the bar";
}

async function showDiff(where, current) {
  // where two runs part ways beyond their own noise (rlmon diff), and their curves side by side
  const d = await api("diff", { a: where.a, b: where.b });
  if (!current()) return;
  // as rlmon diff sorts them (service/diff/divergence.py): the training metrics that part ways,
  // the schedules and constants that differ (no noise in either run), the machines' telemetry
  const training = d.metrics.filter((m) => !m.telemetry);
  const schedule = (m) => m.exact && !m.shared_start && !m.nonfinite;
  const row = (m) => el("tr", { class: "diverged", "data-metric": m.metric },
    el("td", {}, m.metric), el("td", { class: "num" }, m.onset),
    // the values are where the test confirmed the departure, a few steps after its onset
    el("td", { class: "num", "data-col": "value-step" }, m.value_step ?? m.onset),
    el("td", { class: "num" }, diffValue(m, "A")), el("td", { class: "num" }, diffValue(m, "B")),
    el("td", {}, howFar(m)));
  const rows = training.filter((m) => m.diverged && !schedule(m)).map(row);
  const schedules = training.filter((m) => m.diverged && schedule(m)).map(row);
  const machine = d.metrics.filter((m) => m.telemetry);
  const machineApart = machine.filter((m) => m.diverged).map(row);
  const head = (last) => el("thead", {}, el("tr", {},
    ["metric", "parts at step", "values at step", d.a.run, d.b.run, last].map((h) => el("th", {}, h))));
  const settings = d.settings.map((x) => el("tr", {}, el("td", {}, x.key), el("td", {}, fmt(x.a)),
                                                 el("td", {}, fmt(x.b))));
  const grid = el("div", { class: "grid", id: "panels" });
  view.replaceChildren(
    el("h1", {}, runLink(d.a.run, "", d.a.run), " vs ", runLink(d.b.run, "", d.b.run)),
    el("p", { id: "diff-headline", "data-step": d.step ?? "", "data-metric": d.metric ?? "" }, d.headline),
    el("p", { id: "diff-compared", class: "muted" }, d.compared),
    el("p", {}, el("a", { href: runHash({ run: d.a.run, with: [d.b.run] }) }, "overlay them on the run page")),
    rows.length ? el("table", { id: "diff-metrics" }, head("how far"), el("tbody", {}, rows))
      : el("p", { class: "muted" }, "no metric parts ways beyond the runs' own noise"),
    ...(schedules.length ? [el("h2", {}, "schedules and constants that differ"),
                            el("table", { id: "diff-schedules" }, head("why"), el("tbody", {}, schedules))] : []),
    ...(machine.length ? [el("h2", {}, "host and hardware telemetry"),
                          el("p", { id: "diff-telemetry", class: "muted", "data-series": machine.length,
                                    "data-apart": machineApart.length },
                             machine.length + " series, the machines', not the training's: " + machineApart.length + " differ"),
                          ...(machineApart.length ? [el("table", { id: "diff-telemetry-metrics" }, head("how far"),
                                                        el("tbody", {}, machineApart))] : [])] : []),
    ...(settings.length ? [el("h2", {}, "settings that differ"),
                           el("table", { id: "diff-settings" }, el("tbody", {}, settings))] : []),
    grid);
  const width = chartWidth();
  for (const [name, c] of Object.entries(d.curves)) {
    const panel = aligned({ title: name, unit: "", metrics: [name], help: [] }, [d.a, d.b].map((r, i) => {
      const pts = i ? c.b : c.a;
      return { label: r.run, panel: { metrics: [name], x: pts.map((p) => p[0]), y: [pts.map((p) => p[1])],
                                      nonfinite: [{ count: 0, x: [], value: [] }] } };
    }), PLAIN);
    const onsets = training.filter((m) => m.metric === name && m.diverged).map((m) => ({
      step: m.onset, alert: "parts ways", state: "firing", severity: "warning", metric: name }));
    const chart = makeChart(panel, onsets, width, () => {});
    grid.append(chart.rlmon.panelEl);
    page.charts.push(chart);
  }
}

// --- live -------------------------------------------------------------------------------------

async function poll() {
  if (page.busy) return;
  page.busy = true;
  const visit = page.visit;
  try {
    const data = await api("runs");
    setStatus(true, "live, updated " + new Date().toLocaleTimeString());
    const changed = page.alertsSeen !== null && data.alerts_seen !== page.alertsSeen;
    if (page.kind === "runs" && page.visit === visit) {  // not over a later navigation's table
      drawRuns(data);
    } else if (page.kind === "run" && page.run) {
      const shown = page.run.data;
      const run = data.runs.find((r) => r.run === shown.run);
      const stream = run && run.roles.find((s) => s.role === shown.role);
      if (stream) await refreshRun(stream);
    } else if (page.kind === "alert" && changed) {
      await route();
    }
    page.alertsSeen = data.alerts_seen;
  } catch (err) {
    setStatus(false, "service unreachable: " + err.message);
  } finally {
    page.busy = false;
  }
}

window.rlmonCharts = () => page.charts;  // the uPlot instances shown (for tests and scripts)
window.rlmonPollMs = POLL_MS;
const start = () => takeToken().catch(() => {}).then(route);
window.addEventListener("hashchange", start);
start().then(() => setStatus(true, "live"));
setInterval(poll, POLL_MS);
