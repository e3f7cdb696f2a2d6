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
    error.errors = data && data.errors;
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
    for (const state of ["scheduled", "paused", "leased", "delivered", "cancelled", "dead"]) {
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
  const total = n.scheduled + n.paused + n.leased + n.delivered + n.cancelled + n.dead;
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

// Find messages: one by id (GET of the message), else the search's filters, 50 a page with
// "More" following next_page_token. refresh() leaves the panel alone; `finding` numbers the
// searches, so an answer that arrives after a newer search (or another topic) is dropped.
const FIND_LIMIT = 50;
const EMPTY_PAGES = 10;  // pages with no match (more may follow) read on at once
let finding = 0;
let opened = 0;  // clicks on found rows: only the last one's answer is shown
let nextPage = null;

function shown(value) { return value === null || value === undefined ? "-" : String(value); }

function labelText(labels) {
  const pairs = Object.entries(labels || {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return pairs.length ? pairs.map(([k, v]) => `${k}:${v}`).join(", ") : "-";
}

// A problem's detail and its per-field errors ({"label": ["..."]}, lists keyed by index too).
function problemText(error) {
  const flat = v => Array.isArray(v) ? v.flatMap(flat)
    : v && typeof v === "object" ? Object.values(v).flatMap(flat) : [String(v)];
  const fields = Object.entries(error.errors || {}).map(([f, v]) => `${f}: ${flat(v).join(" ")}`);
  return [error.message, ...fields].join(" ");
}

function messagesPath(topic) { return `/v1/topics/${encodeURIComponent(topic)}/messages`; }

function findFailed(error, text) {
  if (error.status === 401) { signOut("That key is not valid (any more)."); return; }
  $("find-status").textContent = text || "Failed: " + problemText(error);
}

function clearFind() {
  finding++;
  nextPage = null;
  $("found").querySelector("tbody").replaceChildren();
  $("found").hidden = true;
  $("find-more").hidden = true;
  $("message-detail").hidden = true;
  $("find-status").textContent = "";
}

async function find() {
  clearFind();
  const topic = selected, ticket = finding;
  const id = $("find-id").value.trim();
  if (id) {
    try {
      const m = await api("GET", `${messagesPath(topic)}/${encodeURIComponent(id)}`);
      if (ticket !== finding) return;
      addFound([m], topic, ticket);
      $("find-status").textContent = "1 found";
      showMessage(m);
    } catch (error) {
      if (ticket !== finding) return;
      findFailed(error, error.status === 404 ? `No message ${id} on this topic.` : "");
    }
    return;
  }
  const query = new URLSearchParams({ limit: FIND_LIMIT });
  for (const [name, input] of [["recipient", "find-recipient"], ["label", "find-label"],
                               ["state", "find-state"]]) {
    const value = $(input).value.trim();
    if (value) query.set(name, value);
  }
  await findPages(topic, ticket, query, null);
}

async function findPages(topic, ticket, query, token) {
  $("find-more").hidden = true;
  try {
    for (let read = 0; read < EMPTY_PAGES; read++) {
      const q = new URLSearchParams(query);
      if (token) q.set("page_token", token);
      const page = await api("GET", `${messagesPath(topic)}?${q}`);
      if (ticket !== finding) return;
      addFound(page.messages, topic, ticket);
      token = page.next_page_token;
      if (page.messages.length || !token) break;
    }
  } catch (error) {
    if (ticket === finding) findFailed(error);
    return;
  }
  const count = $("found").querySelectorAll("tbody tr").length;
  nextPage = token ? { topic, ticket, query, token } : null;
  $("find-more").hidden = !token;
  $("find-status").textContent = count ? `${count} shown${token ? ", more may follow" : ""}`
    : token ? "None yet: More reads on" : "None found";
}

function addFound(messages, topic, ticket) {
  const body = $("found").querySelector("tbody");
  for (const m of messages) {
    const row = document.createElement("tr");
    row.dataset.id = m.id;
    cell(row, m.id);
    cell(row, m.state, "state");
    cell(row, m.deliver_at);
    cell(row, shown(m.recipient));
    cell(row, labelText(m.labels));
    cell(row, shown(m.campaign));
    row.addEventListener("click", () => openMessage(topic, ticket, m.id, row));
    body.appendChild(row);
  }
  $("found").hidden = false;
}

async function openMessage(topic, ticket, id, row) {
  const click = ++opened;
  try {
    const m = await api("GET", `${messagesPath(topic)}/${encodeURIComponent(id)}`);
    if (ticket !== finding || click !== opened) return;
    for (const r of $("found").querySelectorAll("tbody tr")) {
      r.classList.toggle("selected", r === row);
    }
    showMessage(m);
  } catch (error) {
    if (ticket !== finding || click !== opened) return;
    findFailed(error, error.status === 404 ? `No message ${id} on this topic (any more).` : "");
  }
}

function showMessage(m) {
  const list = $("detail-fields");
  list.replaceChildren();
  const fields = ["state", "attempts", "created_at", "deliver_at", "requested_deliver_at",
                  "updated_at", "recipient", "campaign", "labels", "last_error", "cancel_reason"];
  for (const name of fields) {
    if (name === "requested_deliver_at" && !(name in m)) continue;
    const term = document.createElement("dt");
    term.textContent = name;
    const value = document.createElement("dd");
    value.dataset.field = name;
    value.textContent = name === "labels" ? labelText(m.labels) : shown(m[name]);
    list.append(term, value);
  }
  $("detail-id").textContent = m.id;
  $("message-detail").hidden = false;
}

function select(name) {
  if (name !== selected) clearFind();
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
  clearFind();
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
  $("find").addEventListener("submit", event => {
    event.preventDefault();
    if (selected) find();
  });
  $("find-more").addEventListener("click", () => {
    if (nextPage && nextPage.ticket === finding) {
      findPages(nextPage.topic, nextPage.ticket, nextPage.query, nextPage.token);
    }
  });
  if (sessionStorage.getItem(KEY)) signIn(sessionStorage.getItem(KEY));
});
