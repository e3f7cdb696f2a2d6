// duetime dashboard: reads the /v1 API with the key the user gives, draws tables and charts.
// Everything shown is set as text (never as HTML), so names and errors cannot inject markup.
"use strict";

const KEY = "duetime-api-key";
const REFRESH_MS = 5000;
const SVG = "http://www.w3.org/2000/svg";
let selected = null;
let timer = null;

function $(id) { return document.getElementById(id); }

async function api(method, path, body) {
  const init = { method, headers: { Authorization: "Bearer " + sessionStorage.getItem(KEY) } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const answer = await fetch(path, init);
  const text = await answer.text();
  const data = text ? JSON.parse(text) : null;
  if (!answer.ok) {
    const error = new Error((data && (data.detail || data.title)) || answer.statusText);
    error.status = answer.status;
    throw error;
  }
  return data;
}

function cell(row, value, className) {
  const td = document.createElement("td");
  if (value instanceof Node) td.appendChild(value); else td.textContent = value ?? "";
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function button(label, className, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.className = className;
  b.addEventListener("click", onClick);
  return b;
}

function fill(tableId, emptyId, items, addRow) {
  const body = $(tableId).querySelector("tbody");
  body.replaceChildren();
  for (const item of items) {
    const row = document.createElement("tr");
    addRow(row, item);
    body.appendChild(row);
  }
  $(emptyId).hidden = items.length > 0;
}

function svgNode(name, attrs, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// Bars of values (one per minute) under a y axis scaled to their largest value.
function barChart(svg, values, firstLabel, lastLabel) {
  svg.replaceChildren();
  const top = Math.max(1, ...values);
  const width = 560 / values.length;
  values.forEach((v, i) => {
    const h = (v / top) * 120;
    const bar = svgNode("rect", { class: "bar", x: 35 + i * width, y: 135 - h,
      width: Math.max(width - 1, 1), height: h, "data-value": v });
    bar.appendChild(svgNode("title", {}, `${v}`));
    svg.appendChild(bar);
  });
  axes(svg, top, firstLabel, lastLabel);
}

// Lines of series ({name, values}) over the same minutes; null values leave gaps.
function lineChart(svg, series, firstLabel, lastLabel) {
  svg.replaceChildren();
  const all = series.flatMap(s => s.values).filter(v => v !== null);
  const top = Math.max(1, ...all);
  for (const s of series) {
    const step = 560 / Math.max(s.values.length - 1, 1);
    let points = [];
    const flush = () => {
      if (points.length) svg.appendChild(svgNode("polyline", { class: s.name, points: points.join(" ") }));
      points = [];
    };
    s.values.forEach((v, i) => {
      if (v === null) { flush(); return; }
      const x = (35 + i * step).toFixed(1), y = (135 - (v / top) * 120).toFixed(1);
      points.push(`${x},${y}`);
      const dot = svgNode("circle", { class: s.name + " dot", cx: x, cy: y, r: 2.5 });
      dot.appendChild(svgNode("title", {}, `${s.name}: ${v} ms`));
      svg.appendChild(dot);
    });
    flush();
  }
  axes(svg, top, firstLabel, lastLabel);
}

function axes(svg, top, firstLabel, lastLabel) {
  svg.appendChild(svgNode("line", { class: "axis", x1: 35, y1: 135, x2: 595, y2: 135 }));
  svg.appendChild(svgNode("line", { class: "axis", x1: 35, y1: 15, x2: 35, y2: 135 }));
  svg.appendChild(svgNode("text", { x: 2, y: 20 }, String(top)));
  svg.appendChild(svgNode("text", { x: 2, y: 135 }, "0"));
  svg.appendChild(svgNode("text", { x: 35, y: 152 }, firstLabel));
  svg.appendChild(svgNode("text", { x: 595, y: 152, "text-anchor": "end" }, lastLabel));
}

function clock(iso) { return new Date(iso).toLocaleTimeString(); }

async function showTopics() {
  const { topics } = await api("GET", "/v1/topics");
  const stats = await Promise.all(topics.map(t =>
    api("GET", `/v1/topics/${encodeURIComponent(t.name)}/stats`).catch(() => null)));
  fill("topics", "no-topics", topics.map((t, i) => [t, stats[i]]), (row, [t, s]) => {
    row.dataset.topic = t.name;
    if (t.name === selected) row.classList.add("selected");
    cell(row, button(t.name, "link topic-link", () => select(t.name)));
    cell(row, t.delivery.mode === "webhook" ? "webhook" : "pull");
    for (const state of ["scheduled", "leased", "delivered", "cancelled", "dead"]) {
      cell(row, s ? s.counts[state] : "?", "count-" + state);
    }
  });
  if (selected && !topics.some(t => t.name === selected)) {
    selected = null;
    $("topic-detail").hidden = true;
  }
}

async function showTopic() {
  if (!selected) return;
  const base = `/v1/topics/${encodeURIComponent(selected)}`;
  const [stats, lag, campaigns, dead] = await Promise.all([
    api("GET", base + "/stats?window=minute"), api("GET", base + "/lag?minutes=60"),
    api("GET", base + "/campaigns"), api("GET", base + "/dead-letters?limit=50")]);
  $("topic-name").textContent = selected;
  const upcoming = stats.upcoming.map(w => w.count);
  $("upcoming-total").textContent = upcoming.reduce((a, b) => a + b, 0);
  $("upcoming-chart").dataset.total = $("upcoming-total").textContent;
  barChart($("upcoming-chart"), upcoming, clock(stats.upcoming[0].from), clock(stats.upcoming.at(-1).to));
  const handed = lag.minutes.reduce((a, m) => a + m.count, 0);
  $("lag-count").textContent = handed;
  $("lag-chart").dataset.count = handed;
  lineChart($("lag-chart"), [{ name: "p50", values: lag.minutes.map(m => m.p50_ms) },
                              { name: "p99", values: lag.minutes.map(m => m.p99_ms) }],
            clock(lag.minutes[0].from), clock(lag.minutes.at(-1).to));
  fill("campaigns", "no-campaigns", campaigns.campaigns, (row, c) => campaignRow(row, c, base));
  fill("dead", "no-dead", dead.messages, (row, m) => {
    row.dataset.id = m.id;
    cell(row, m.id);
    cell(row, new Date(m.updated_at).toLocaleString());
    cell(row, m.attempts);
    cell(row, m.last_error, "error-text");
    cell(row, button("Retry", "retry", () => act("POST", `${base}/messages/${encodeURIComponent(m.id)}/retry`,
                                                 undefined, `${m.id} scheduled again`)));
  });
  $("topic-detail").hidden = false;
}

function campaignRow(row, c, base) {
  const n = c.counts;
  const total = n.scheduled + n.leased + n.delivered + n.cancelled + n.dead;
  const done = n.delivered + n.cancelled + n.dead;
  const bar = document.createElement("span");
  bar.className = "progress";
  bar.title = `${done} of ${total} done`;
  const inner = document.createElement("span");
  inner.style.width = total ? `${(100 * done / total).toFixed(1)}%` : "0";
  bar.appendChild(inner);
  row.dataset.campaign = c.campaign;
  cell(row, c.campaign);
  cell(row, bar).append(` ${total ? Math.floor(100 * done / total) : 0}%`);
  for (const state of ["scheduled", "delivered", "cancelled", "dead"]) cell(row, n[state], "count-" + state);
  cell(row, c.cancelled ? "cancelled" : c.paused ? "paused" : "running", "state");
  const actions = document.createElement("span");
  const url = `${base}/campaigns/${encodeURIComponent(c.campaign)}`;
  if (!c.cancelled) {
    actions.append(c.paused
      ? button("Resume", "resume", () => act("PATCH", url, { paused: false }, `${c.campaign} resumed`))
      : button("Pause", "pause", () => act("PATCH", url, { paused: true }, `${c.campaign} paused`)));
    actions.append(" ", button("Cancel", "cancel", () => {
      if (confirm(`Cancel every message of ${c.campaign} not yet delivered?`)) {
        act("DELETE", url, undefined, `${c.campaign}: cancel started`);
      }
    }));
  }
  cell(row, actions);
}

async function act(method, path, body, done) {
  try {
    await api(method, path, body);
    $("action-status").textContent = done;
  } catch (error) {
    $("action-status").textContent = "Failed: " + error.message;
  }
  await refresh();
}

function select(name) {
  selected = name;
  for (const row of $("topics").querySelectorAll("tbody tr")) {
    row.classList.toggle("selected", row.dataset.topic === name);
  }
  refresh();
}

async function refresh() {
  try {
    await showTopics();
    await showTopic();
    $("refreshed").textContent = "as of " + new Date().toLocaleTimeString();
    document.body.dataset.refreshed = Date.now();
  } catch (error) {
    if (error.status === 401) { signOut("That key is not valid (any more)."); return; }
    $("refreshed").textContent = "not refreshed: " + error.message;
  }
}

async function signIn(key) {
  sessionStorage.setItem(KEY, key);
  try {
    await api("GET", "/v1/topics");
  } catch (error) {
    signOut(error.status === 401 ? "That key is not valid." : "The API answered: " + error.message);
    return;
  }
  $("sign-in-panel").hidden = true;
  $("board").hidden = false;
  $("sign-out").hidden = false;
  $("sign-in-error").textContent = "";
  await refresh();
  timer = setInterval(refresh, REFRESH_MS);
}

function signOut(message) {
  sessionStorage.removeItem(KEY);
  clearInterval(timer);
  selected = null;
  $("board").hidden = true;
  $("topic-detail").hidden = true;
  $("sign-out").hidden = true;
  $("sign-in-panel").hidden = false;
  $("sign-in-error").textContent = message || "";
}

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in").addEventListener("submit", event => {
    event.preventDefault();
    signIn($("api-key").value.trim());
  });
  $("sign-out").addEventListener("click", () => signOut());
  if (sessionStorage.getItem(KEY)) signIn(sessionStorage.getItem(KEY));
});
