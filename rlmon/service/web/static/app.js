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
             m: params.getAll("m"), with: params.getAll("with"), att: params.getAll("att") };
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

function runsTable(data) {
  const head = el("tr", {}, ["run", "role", "state", "last step", "last step at", "ranks reporting",
                             "firing alerts", "goodput"].map((h) => el("th", {}, h)));
  const rows = data.runs.map((r) => el("tr", { "data-run": r.run, "data-role": r.role },
    el("td", {}, runLink(r.run, r.role)),
    el("td", {}, r.role + (r.attempt ? " (attempt " + r.attempt + ")" : "")),
    el("td", {}, el("span", { class: "badge " + r.state,
                              title: data.states_known ? "" :
                                "this service keeps no liveness state: see the last step's age" },
                    r.state)),
    el("td", { class: "num last-step" }, r.last_step),
    el("td", {}, age(r.age_seconds)),
    el("td", { class: "num" }, r.ranks_reporting + " / " + r.ranks_expected),
    el("td", {}, r.firing.length ? r.firing.map((a) => el("a", {
        class: "badge " + a.severity, href: alertHref(r.run, r.role, a.alert, a.step) },
        a.alert)) : el("span", { class: "muted" }, "none")),
    el("td", { class: "num" }, r.goodput === null ? "n/a" : (100 * r.goodput).toFixed(1) + " %")));
  return el("table", { id: "runs" }, el("thead", {}, head), el("tbody", {}, rows));
}

async function showRuns(current) {
  const data = await api("runs");
  if (!current()) return;
  page.alertsSeen = data.alerts_seen;
  const body = data.runs.length ? runsTable(data)
    : el("p", { class: "muted" }, "no steps in the history store yet");
  view.replaceChildren(el("h1", {}, "runs"), body);
}

// --- a run ------------------------------------------------------------------------------------

function markerPlugin(panelEl, state) {
  // draws each alert transition as a vertical line; the panel of the alert's metric names it
  return {
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx;
        const drawn = { onsets: [], resolves: [], overlay: [] };
        ctx.save();
        ctx.lineWidth = 1.5 * devicePixelRatio;
        for (const t of state.alerts) {
          const x = Math.round(u.valToPos(t.step, "x", true));
          if (x < u.bbox.left - 1 || x > u.bbox.left + u.bbox.width + 1) continue;
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
            ctx.setLineDash([]);
            ctx.fillStyle = ctx.strokeStyle;
            ctx.font = (11 * devicePixelRatio) + "px sans-serif";
            ctx.fillText((t.source ? t.source + ": " : "") + (firing ? "" : "resolved ") + t.alert,
                         x + 4, u.bbox.top + 12 * devicePixelRatio);
          }
        }
        // a NaN or infinite value is a gap in its curve: a triangle at the top marks its step
        const marked = [];
        const size = 5 * devicePixelRatio;
        ctx.setLineDash([]);
        ctx.fillStyle = NONFINITE_COLOR;
        state.nonfinite.forEach((marks) => {
          for (const step of marks.x) {
            const x = Math.round(u.valToPos(step, "x", true));
            if (x < u.bbox.left - 1 || x > u.bbox.left + u.bbox.width + 1) continue;
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
    if (labels[i + 1]) labels[i + 1].textContent = seriesLabel(m, state.nonfinite[i]);
  });
  panelEl.dataset.nonfiniteCounts = state.nonfinite.map((n) => n.count).join(",");
}

function chartData(panel) {
  return [panel.x, ...panel.y];
}

function countPoints(panelEl, data) {
  panelEl.dataset.points = String(data[0].length);
  panelEl.dataset.seriesPoints = data.slice(1).map((s) => s.filter((v) => v !== null).length).join(",");
}

function makeChart(panel, alerts, width, onZoom) {
  const panelEl = el("div", { class: "panel", "data-title": panel.title,
                              "data-metrics": panel.metrics.join(","),
                              "data-picked": panel.picked ? "1" : null });
  const none = { count: 0, x: [], value: [] };
  // one series per metric, or per (run, metric) when runs are overlaid (panel.series)
  const series = panel.series || panel.metrics.map((m, i) => ({ label: m, color: COLORS[i % COLORS.length] }));
  const state = { alerts, metrics: panel.metrics, labels: series.map((s) => s.label),
                  nonfinite: series.map((s, i) => {
    const n = (panel.nonfinite || [])[i] || none;
    return { count: n.count, x: [...n.x], value: [...n.value] };
  }) };
  const data = chartData(panel);
  const few = data[0].length <= 60;
  const opts = {
    title: panel.title + (panel.unit && panel.unit !== "none" && panel.unit !== "" ? " (" + panel.unit + ")" : ""),
    width, height: 200,
    scales: { x: { time: false } },
    legend: { live: true },
    cursor: { sync: { key: "rlmon-steps" }, drag: { x: true, y: false, setScale: false } },
    series: [{ label: "step" }, ...series.map((s, i) => ({
      label: seriesLabel(s.label, state.nonfinite[i]), stroke: s.color, dash: s.dash, width: 1.5,
      spanGaps: true, points: { show: few, size: 4 } }))],
    axes: [{ label: "step", size: 40, incrs: STEP_INCRS }, { size: 64 }],
    plugins: [markerPlugin(panelEl, state)],
    hooks: { setSelect: [(u) => {
      if (u.select.width < 3) return;
      const lo = Math.floor(u.posToVal(u.select.left, "x"));
      const hi = Math.ceil(u.posToVal(u.select.left + u.select.width, "x"));
      u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
      onZoom(lo, hi);
    }] },
  };
  countPoints(panelEl, data);
  const chart = new uPlot(opts, data, panelEl);
  chart.rlmon = { panelEl, state, panel };
  relabel(chart);
  const help = panel.help.filter((h) => h).join(" / ");
  panelEl.append(el("div", { class: "marks muted", title: help }, help));
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

function overlaid(panel, sources) {
  // the panel of the shown run with every overlaid run's values of the same metrics, aligned by
  // step (one x axis: the union of their steps), each run in its own colour
  const xs = [...new Set(sources.flatMap((s) => (s.panel ? s.panel.x : [])))].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const out = { ...panel, x: xs, y: [], nonfinite: [], series: [] };
  const none = { count: 0, x: [], value: [] };
  sources.forEach((s, si) => {
    panel.metrics.forEach((m, j) => {
      const ys = new Array(xs.length).fill(null);
      const k = s.panel ? s.panel.metrics.indexOf(m) : -1;
      if (k >= 0) s.panel.x.forEach((x, n) => { ys[at.get(x)] = s.panel.y[k][n]; });
      out.y.push(ys);
      out.nonfinite.push(k >= 0 ? s.panel.nonfinite[k] : none);
      out.series.push({ label: s.label + ": " + m, color: COLORS[si % COLORS.length],
                        dash: j ? [[6, 3], [2, 3], [8, 3, 2, 3]][(j - 1) % 3] : undefined });
    });
  });
  return out;
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
    }), found.length > 40 ? el("span", { class: "muted" }, "... " + (found.length - 40) + " more") : null);
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
  return el("div", { class: "controls" },
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
  if (!data.panels.length) grid.append(el("p", { class: "muted" }, "no metrics in this role"));
  const width = chartWidth();
  const others = extra.filter((s) => s.data);
  let alerts = data.alerts;
  if (others.length) {
    const labels = [sourceLabel({ run: data.run, attempt: where.att.length ? String(data.attempt) : "" }),
                    ...others.map(sourceLabel)];
    alerts = [...data.alerts, ...others.flatMap((s, i) => s.data.alerts.map((a) => ({
      ...a, source: labels[i + 1], color: COLORS[(i + 1) % COLORS.length] })))];
    data.shownPanels = data.panels.map((p) => overlaid(p, [{ label: labels[0], panel: p },
      ...others.map((s, i) => ({ label: labels[i + 1],
                                 panel: s.data.panels.find((q) => q.title === p.title) || null }))]));
  }
  for (const panel of data.shownPanels || data.panels) {
    const chart = makeChart(panel, alerts, width, zoomTo);
    grid.append(chart.rlmon.panelEl);
    page.charts.push(chart);
  }
  renderRunInfo();
}

function renderRunInfo() {
  const { data } = page.run;
  const shown = document.getElementById("shown");
  shown.textContent = "steps " + fmt(data.from) + " to " + fmt(data.to) + " (" + data.shown_steps +
    " of " + data.steps + " steps; last step " + data.last_step + ")";
  shown.dataset.lastStep = data.last_step;
  const onsets = data.alerts.filter((a) => a.state === "firing");
  document.getElementById("alert-list").replaceChildren(onsets.length ? el("div", {},
    "alerts: ", onsets.map((a) => el("a", { class: "badge " + a.severity, "data-step": a.step,
                                          href: alertHref(data.run, data.role, a.alert, a.step) },
                                     a.alert + " at step " + a.step))) :
    el("span", { class: "muted" }, "no alert fired in these steps"));
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
  const tooMany = page.charts.some((c) => c.data[0].length + fresh.shown_steps > 4 * 2 * run.data.points);
  if (titles(fresh) !== titles(run.data) || tooMany) { await route(); return; }
  run.data.alerts.push(...fresh.alerts);
  fresh.panels.forEach((p, i) => {
    const chart = page.charts[i];
    const data = chart.data.map((col, j) => col.concat(j === 0 ? p.x : p.y[j - 1]));
    chart.rlmon.state.alerts = run.data.alerts;
    p.nonfinite.forEach((n, j) => {
      const known = chart.rlmon.state.nonfinite[j];
      known.count += n.count;
      known.x.push(...n.x);
      known.value.push(...n.value);
    });
    relabel(chart);
    countPoints(chart.rlmon.panelEl, data);
    chart.setData(data);
  });
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

async function showAlert(where, current) {
  const a = await api("alert", { run: where.run, role: where.role, alert: where.alert, step: where.step });
  if (!current()) return;
  const state = a.firing ? el("span", { class: "badge firing" }, "firing since step " + a.onset)
    : el("span", { class: "badge resolved" }, "fired at step " + a.onset + ", resolved at step " + a.resolved);
  const parts = [
    el("h1", {}, a.alert + " ", el("span", { class: "badge " + a.severity }, a.severity), " ", state),
    el("p", {}, runLink(a.run, a.role, "run " + a.run + " / " + a.role)),
    facts([["condition", a.condition], ["summary", a.summary], ["metric", a.metric],
           ["value at onset", fmt(a.value)], ["what it measures", a.help],
           ["what to check", a.what_to_check],
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
                             ...(a.resolved !== null ? [{ step: a.resolved, alert: a.alert, state: "resolved",
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

async function showDiff(where, current) {
  // where two runs part ways beyond their own noise (rlmon diff), and their curves side by side
  const d = await api("diff", { a: where.a, b: where.b });
  if (!current()) return;
  const rows = d.metrics.filter((m) => m.diverged).map((m) => el("tr", { class: "diverged", "data-metric": m.metric },
    el("td", {}, m.metric), el("td", { class: "num" }, m.onset),
    el("td", { class: "num" }, fmt(m.a_value)), el("td", { class: "num" }, fmt(m.b_value)),
    el("td", {}, m.exact ? "no noise in either run: a setting or a schedule" : fmt(m.score) + "x the bar")));
  const settings = d.settings.map((x) => el("tr", {}, el("td", {}, x.key), el("td", {}, fmt(x.a)),
                                                 el("td", {}, fmt(x.b))));
  const grid = el("div", { class: "grid", id: "panels" });
  view.replaceChildren(
    el("h1", {}, runLink(d.a.run, "", d.a.run), " vs ", runLink(d.b.run, "", d.b.run)),
    el("p", { id: "diff-headline", "data-step": d.step ?? "", "data-metric": d.metric ?? "" }, d.headline),
    el("p", {}, el("a", { href: runHash({ run: d.a.run, with: [d.b.run] }) }, "overlay them on the run page")),
    rows.length ? el("table", { id: "diff-metrics" }, el("thead", {}, el("tr", {},
      ["metric", "parts at step", d.a.run, d.b.run, "how far"].map((h) => el("th", {}, h)))), el("tbody", {}, rows))
      : el("p", { class: "muted" }, "no metric parts ways beyond the runs' own noise"),
    settings.length ? el("h2", {}, "settings that differ") : null,
    settings.length ? el("table", { id: "diff-settings" }, el("tbody", {}, settings)) : null,
    grid);
  const width = chartWidth();
  for (const [name, c] of Object.entries(d.curves)) {
    const panel = overlaid({ title: name, unit: "", metrics: [name], help: [] }, [d.a, d.b].map((r, i) => {
      const pts = i ? c.b : c.a;
      return { label: r.run, panel: { metrics: [name], x: pts.map((p) => p[0]), y: [pts.map((p) => p[1])],
                                      nonfinite: [{ count: 0, x: [], value: [] }] } };
    }));
    const onsets = d.metrics.filter((m) => m.metric === name && m.diverged).map((m) => ({
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
      const table = document.getElementById("runs");
      const fresh = data.runs.length ? runsTable(data) : null;
      if (fresh && table) table.replaceWith(fresh);
      else if (fresh) view.replaceChildren(el("h1", {}, "runs"), fresh);
    } else if (page.kind === "run" && page.run) {
      const shown = page.run.data;
      const stream = data.runs.find((r) => r.run === shown.run && r.role === shown.role);
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
