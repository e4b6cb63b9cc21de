// The dashboard's script: polls this node's /ui/api/ reads and /metrics
// once a second and redraws, and follows the lock prefix's events live
// with a watch (/v1/watch as Server-Sent Events). Plain DOM, no framework;
// data only ever goes into textContent, never into markup.
"use strict";

const POLL_MS = 1000;
const RATE_POINTS = 60;
const EVENTS_SHOWN = 50;
const $ = (id) => document.getElementById(id);

const view = {
  prefix: "",
  lockPages: [""], // cursors of the pages seen; the last is the current one
  lockNext: null,
  sessionPages: ["0"],
  sessionNext: null,
  historyLock: null,
  leaderAddress: null,
  rates: [], // {grants, expiries} per second
  lastCounters: null,
  events: [], // the newest watch events, newest first
};

const tokenInput = $("token");
tokenInput.value = sessionStorage.getItem("deadbolt-token") || "";
tokenInput.addEventListener("change", () => {
  sessionStorage.setItem("deadbolt-token", tokenInput.value);
  refresh();
  watchEvents();
});

// Every request carries the token, when one is given.
async function get(path, asText) {
  const headers = {};
  if (tokenInput.value) headers["Authorization"] = "Bearer " + tokenInput.value;
  const response = await fetch(path, { headers, cache: "no-store" });
  if (!response.ok) {
    let message = response.status + " " + response.statusText;
    try {
      const body = await response.json();
      if (body.error) message = body.error.kind + ": " + body.error.message;
    } catch (_) { /* not JSON */ }
    throw new Error(path.split("?")[0] + ": " + message);
  }
  return asText ? response.text() : response.json();
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function fill(tbody, rows, render) {
  tbody.replaceChildren(...rows.map((item) => {
    const tr = document.createElement("tr");
    render(tr, item);
    return tr;
  }));
}

function duration(ms) {
  if (ms === null || ms === undefined) return null;
  return ms >= 10000 ? Math.round(ms / 1000) + " s" : (ms / 1000).toFixed(1) + " s";
}

function leaseLeft(ms, leading) {
  return duration(ms) ?? (leading ? "-" : "on the leader");
}

function showCluster(c) {
  const s = c.status;
  $("node").textContent = "node " + s.node_id + " (" + s.role + "), applied index " + s.applied_index;
  view.leaderAddress = c.leader_address;
  $("leader").textContent = s.leader_id ? "node " + s.leader_id + " at " + c.leader_address : "none (election under way?)";
  $("leader").dataset.leaderId = s.leader_id || "";
  $("term").textContent = s.term;
  $("peer-auth").textContent = s.peer_authentication;
  $("counts").textContent = c.locks + " locks held, " + c.sessions + " sessions, next token " + c.next_token;
  const matched = new Map(c.matched || []);
  // A member's release and compatibility numbers (docs/upgrading.md).
  const described = v => v ? v.release + " (data " + v.data_format + ", backup " + v.backup_format +
    ", peer " + v.peer_protocol + ", API " + v.client_api + ", level " + (v.feature_level || 1) + ")" : null;
  const releases = new Map((c.releases || []).map(r => [r.node_id, described(r.versions)]));
  $("release").textContent = s.versions ? s.versions.release : "-";
  // A member of release 0.1.0 does not send it: level 1.
  $("cluster-version").textContent = s.cluster_version || 1;
  fill($("members"), s.members, (tr, m) => {
    tr.dataset.node = m.node_id;
    const leads = m.node_id === s.leader_id;
    if (leads) tr.className = "leader";
    cell(tr, m.node_id);
    cell(tr, m.address);
    cell(tr, leads ? "leader" : (m.voter ? "follower" : "learner"));
    cell(tr, m.voter ? "yes" : "no");
    // The leader's own log, or what it knows each follower acknowledged.
    const index = leads && s.node_id === s.leader_id ? s.last_log_index : matched.get(m.node_id);
    cell(tr, index === undefined || index === null ? "-" : index, "num");
    let health = "-";
    if (c.matched) {
      const behind = s.last_log_index - (index || 0);
      health = behind <= 100 ? "ok" : behind + " entries behind";
    }
    cell(tr, health);
    cell(tr, releases.get(m.node_id) || "-");
  });
}

function showLocks(page) {
  const leading = page.leading;
  fill($("locks"), page.rows, (tr, l) => {
    tr.dataset.lock = l.lock;
    cell(tr, l.lock);
    cell(tr, l.holder, "num");
    cell(tr, l.token, "num");
    cell(tr, l.lock_delay ? "lock-delay" : leaseLeft(l.lease_left_ms, leading), "num");
    const queue = l.waiters.join(", ") + (l.waiter_count > l.waiters.length ? " … (" + l.waiter_count + ")" : "");
    cell(tr, queue || "-");
    const button = document.createElement("button");
    button.className = "link";
    button.textContent = "history";
    button.addEventListener("click", () => { view.historyLock = l.lock; refresh(); });
    tr.appendChild(document.createElement("td")).appendChild(button);
  });
  view.lockNext = page.next;
  $("next").disabled = page.next === null;
  $("prev").disabled = view.lockPages.length < 2;
  $("lock-page").textContent = "page " + view.lockPages.length + (page.rows.length ? "" : ": no locks held" + (view.prefix ? " under this prefix" : ""));
}

function showSessions(page) {
  fill($("sessions"), page.rows, (tr, s) => {
    tr.dataset.session = s.session;
    cell(tr, s.session, "num");
    cell(tr, duration(s.ttl_ms), "num");
    cell(tr, leaseLeft(s.lease_left_ms, page.leading), "num");
    cell(tr, s.held, "num");
    cell(tr, s.waiting, "num");
  });
  view.sessionNext = page.next;
  $("sessions-next").disabled = page.next === null;
  $("sessions-prev").disabled = view.sessionPages.length < 2;
}

function showHistory(rows) {
  $("history-lock").textContent = view.historyLock ? "of " + view.historyLock : "(pick a lock)";
  fill($("history"), rows, (tr, h) => {
    cell(tr, h.seq, "num");
    cell(tr, h.at_ms ? new Date(h.at_ms).toISOString() : "-");
    cell(tr, h.session, "num");
    cell(tr, h.token, "num");
    cell(tr, h.what);
  });
}

// Counters from the Prometheus text: `name value` lines without labels.
function counter(text, name) {
  const line = text.split("\n").find((l) => l.startsWith(name + " "));
  return line ? Number(line.split(" ")[1]) : 0;
}

function showRates(metrics) {
  const now = performance.now();
  const counters = {
    at: now,
    grants: counter(metrics, "deadbolt_grants_total"),
    expiries: counter(metrics, "deadbolt_session_expiries_total"),
  };
  const last = view.lastCounters;
  view.lastCounters = counters;
  if (!last) return;
  const seconds = (now - last.at) / 1000;
  // A restarted node starts its counters from zero: no negative rates.
  const rate = (key) => Math.max(0, counters[key] - last[key]) / seconds;
  view.rates.push({ grants: rate("grants"), expiries: rate("expiries") });
  if (view.rates.length > RATE_POINTS) view.rates.shift();
  const latest = view.rates[view.rates.length - 1];
  $("rate-text").textContent = latest.grants.toFixed(1) + " grants/s, " + latest.expiries.toFixed(1) + " expiries/s (last " + view.rates.length + " s)";
  const canvas = $("rates");
  const g = canvas.getContext("2d");
  g.clearRect(0, 0, canvas.width, canvas.height);
  const top = Math.max(1, ...view.rates.map((r) => Math.max(r.grants, r.expiries)));
  const line = (key, color) => {
    g.strokeStyle = color;
    g.beginPath();
    view.rates.forEach((r, i) => {
      const x = (i / (RATE_POINTS - 1)) * canvas.width;
      const y = canvas.height - 2 - (r[key] / top) * (canvas.height - 4);
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
  };
  line("grants", "#06c");
  line("expiries", "#c60");
}

function showEvent(e) {
  view.events.unshift(e);
  if (view.events.length > EVENTS_SHOWN) view.events.pop();
  fill($("events"), view.events, (tr, e) => {
    cell(tr, e.id, "num");
    cell(tr, e.kind);
    cell(tr, e.name);
    cell(tr, e.session_id || "-", "num");
    cell(tr, e.identity || "-");
    cell(tr, e.token || "-", "num");
    const detail = [e.mode, e.permits ? e.permits + " permits" : "", e.value === null ? "" : JSON.stringify(e.value)];
    cell(tr, detail.filter(Boolean).join(" ") || "-");
  });
}

// The prefix's events as they happen: one watch, read through fetch
// (EventSource cannot send the token), resumed after the last event seen
// when the stream breaks, and started anew when the prefix or token
// changes or the history it needs is gone (compacted).
let watching = null;
async function watchEvents() {
  if (watching) watching.abort();
  const stream = new AbortController();
  watching = stream;
  view.events = [];
  $("events").replaceChildren();
  let lastId = null;
  while (!stream.signal.aborted) {
    try {
      const headers = { Accept: "text/event-stream" };
      if (tokenInput.value) headers["Authorization"] = "Bearer " + tokenInput.value;
      if (lastId) headers["Last-Event-ID"] = lastId;
      const path = "/v1/watch?prefix=true&name=" + encodeURIComponent(view.prefix);
      const response = await fetch(path, { headers, signal: stream.signal });
      if (!response.ok) throw new Error("watch: " + response.status + " " + response.statusText);
      $("events-state").textContent = "live";
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const fields = {};
          for (const line of buffer.slice(0, end).split("\n")) {
            const colon = line.indexOf(":");
            if (colon > 0) fields[line.slice(0, colon)] = line.slice(colon + 1).trim();
          }
          buffer = buffer.slice(end + 2);
          if (fields.event === "compacted") lastId = null; // start again from now
          else if (fields.id && fields.data) {
            lastId = fields.id;
            showEvent(JSON.parse(fields.data));
          }
        }
      }
    } catch (err) {
      if (stream.signal.aborted) return;
      $("events-state").textContent = String(err.message || err) + "; reconnecting";
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

let refreshing = false;
async function refresh() {
  if (refreshing) return;
  refreshing = true;
  const lockAfter = view.lockPages[view.lockPages.length - 1];
  const sessionAfter = view.sessionPages[view.sessionPages.length - 1];
  const lockQuery = "prefix=" + encodeURIComponent(view.prefix) + "&after=" + encodeURIComponent(lockAfter);
  try {
    const [cluster, locks, sessions, metrics] = await Promise.all([
      get("/ui/api/cluster"),
      get("/ui/api/locks?" + lockQuery),
      get("/ui/api/sessions?after=" + encodeURIComponent(sessionAfter)),
      get("/metrics", true),
    ]);
    showCluster(cluster);
    showLocks(locks);
    showSessions(sessions);
    showRates(metrics);
    if (view.historyLock) showHistory(await get("/ui/api/history?lock=" + encodeURIComponent(view.historyLock)));
    else showHistory([]);
    $("error").textContent = "";
    $("updated").textContent = new Date().toLocaleTimeString();
  } catch (err) {
    $("error").textContent = String(err.message || err);
  } finally {
    refreshing = false;
  }
}

$("prefix").addEventListener("input", () => {
  view.prefix = $("prefix").value;
  view.lockPages = [""];
  refresh();
  watchEvents();
});
$("next").addEventListener("click", () => { if (view.lockNext !== null) { view.lockPages.push(view.lockNext); refresh(); } });
$("prev").addEventListener("click", () => { if (view.lockPages.length > 1) { view.lockPages.pop(); refresh(); } });
$("sessions-next").addEventListener("click", () => { if (view.sessionNext !== null) { view.sessionPages.push(view.sessionNext); refresh(); } });
$("sessions-prev").addEventListener("click", () => { if (view.sessionPages.length > 1) { view.sessionPages.pop(); refresh(); } });

refresh();
setInterval(refresh, POLL_MS);
watchEvents();
