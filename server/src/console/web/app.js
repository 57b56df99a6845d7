// The Drover console: a hash router over the JSON under /ui/api/, kept
// live by the event stream /ui/api/events. Plain DOM, no dependencies.
// The token (when the replica requires one) lives in sessionStorage only
// and goes out as `Authorization: Bearer` on every call, the stream too
// (read with fetch: EventSource cannot send headers), but never over plain
// http:// to a host other than loopback (see tokenExposed).
"use strict";

const TOKEN_KEY = "drover.token";
const $ = (id) => document.getElementById(id);
let view = null; // { refresh(), onEvent(kind, data), pollMs? }
let poller = null; // the interval refreshing a view that polls

// ---- small helpers --------------------------------------------------------

/** An element with attributes and children (strings become text: no HTML injection). */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c !== undefined && c !== null) el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

/** CLUSTER_STATE_RUNNING -> RUNNING, OPERATION_KIND_UPGRADE -> UPGRADE, ROLLOUT_PAUSED -> PAUSED. */
const short = (name) => (name || "")
  .replace(/^(CLUSTER_STATE|OPERATION_STATE|OPERATION_KIND|TASK_TYPE|ROLLOUT_STATE|ROLLOUT|TARGET_STATE|TARGET|ON_BUSY)_/, "");
const badge = (name, id) => h("span", { class: "badge " + short(name), id }, short(name));
const time = (t) => (t ? new Date(t).toLocaleString() : "—");
const enc = encodeURIComponent;
const labels = (map) => Object.entries(map || {}).map(([k, v]) => `${k}=${v}`).join(", ");

/** How long ago `t` was: 45s, 12m, 3h, 2d. */
function age(t) {
  if (!t) return "—";
  const s = Math.max(0, (Date.now() - new Date(t)) / 1000);
  const [n, unit] = s < 60 ? [s, "s"] : s < 3600 ? [s / 60, "m"] : s < 86400 ? [s / 3600, "h"] : [s / 86400, "d"];
  return Math.floor(n) + unit;
}

function progress(op) {
  if (!op || !op.progress) return op ? short(op.state) : "";
  const p = op.progress;
  const pct = p.total_steps ? Math.round((100 * p.step) / p.total_steps) : 0;
  return h("span", {}, h("span", { class: "bar" }, h("span", { style: `width:${pct}%` })),
    `${p.step}/${p.total_steps} ${p.step_name}`);
}

function table(headers, rows) {
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))));
}

// ---- the API ---------------------------------------------------------------

class Unauthorized extends Error {}

/**
 * Why no token may go from this page, or "": over plain http:// to a host
 * other than loopback it would cross the network in clear text.
 */
function tokenExposed() {
  const host = location.hostname;
  const loopback = host === "localhost" || host === "[::1]" || host === "::1" || /^127\./.test(host);
  if (location.protocol !== "http:" || loopback) return "";
  return `Refused: this page came over plain http:// from ${host}, so a token would cross the network ` +
    "in clear text. Serve the admin port over TLS (--tls-cert and --tls-key) and open it with https://.";
}

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token && !tokenExposed() ? { Authorization: "Bearer " + token } : {};
}

async function api(path, init) {
  const response = await fetch("/ui/api/" + path, { ...init, headers: { ...authHeaders(), ...(init || {}).headers } });
  if (response.status === 401) throw new Unauthorized();
  const body = await response.json();
  if (!response.ok) throw new Error(`${response.status} ${body.code}: ${body.message}`);
  return body;
}

/** A rollout's action: JSON (the server refuses any other body type, so an HTML form elsewhere cannot act). */
const act = (name, action, body) => api(`rollouts/${enc(name)}/${action}`, {
  method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body || {}),
});

/** A POST of a JSON body under /ui/api/ (an action on a cluster or an operation, a bulk cancel). */
const post = (path, body) => api(path, {
  method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body || {}),
});

/** A button that asks (naming what it will do), then acts, then reports how it went. */
function actionButton(id, label, question, run, report) {
  return h("button", { id, onclick: async () => {
    if (!(await confirmAction(question))) return;
    try {
      await run();
      report(`${label}: done.`);
    } catch (e) {
      report(`${label} refused: ${e.message || e}`);
    }
  } }, label);
}

/** The buttons of a cluster page: only the actions this token may take that apply now. */
function clusterButtons(c, current, allowed, report) {
  const name = c.name, s = c.spec || {};
  const on = (action) => () => post(`clusters/${enc(name)}/${action}`);
  const choices = [
    ["pause", "Pause", !s.paused,
      `Pause cluster ${name}: Drover starts nothing on its own for it (no remediation, task run or rollout step) until unpaused. Your own requests still run.`],
    ["unpause", "Unpause", s.paused,
      `Unpause cluster ${name}: remediation, task runs and rollout steps go on.`],
    ["suspend-tasks", "Suspend tasks", !s.tasks_suspended,
      `Suspend the task runs of cluster ${name}: no scheduled run starts (a run already going goes on) until resumed.`],
    ["resume-tasks", "Resume tasks", !!s.tasks_suspended,
      `Resume the task runs of cluster ${name}: due runs start.`],
    ["recover", "Recover", (c.status || {}).state === "CLUSTER_STATE_ALERT" && !current,
      `Recover cluster ${name}: the provider repairs what is down (RepairNodes), then every node must be ready; the cluster goes Recovering, then Running.`],
  ];
  const buttons = choices.filter(([action, , applies]) => applies && allowed.includes(action))
    .map(([action, label, , question]) => actionButton("action-" + action, label, question, on(action), report));
  if (current && allowed.includes("cancel")) {
    buttons.push(actionButton("action-cancel", `Cancel ${short(current.kind)}`,
      `Cancel operation ${current.id} (${short(current.kind)}) on cluster ${name}: it stops at its next step and ends CANCELLED.`,
      () => post(`operations/${enc(name)}/${enc(current.id)}/cancel`), report));
  }
  return buttons;
}

/** The fleet's bulk cancel: the count first, confirmed by the person, then the cancel (refused if the count changed). */
function bulkCancelButton(label, report) {
  return h("button", { id: "bulk-cancel", onclick: async () => {
    const q = "bulk/cancel?" + new URLSearchParams({ label }).toString();
    try {
      const preview = await api(q);
      if (preview.count === 0) return report(`No running operation on the clusters labelled ${label}.`);
      const question = `Cancel the ${preview.count} running operations of the clusters labelled ${label}: ${preview.operations.map((o) => o.cluster).join(", ")}.`;
      if (!(await confirmAction(question))) return;
      const done = await post(q, { count: preview.count });
      const failed = done.cancelled.filter((o) => o.error);
      report(`Cancelled ${done.cancelled.length - failed.length} of ${done.cancelled.length}` + (failed.length ? `; refused: ${failed.map((o) => `${o.cluster}: ${o.error}`).join("; ")}` : "."));
    } catch (e) {
      report(`Bulk cancel refused: ${e.message || e}`);
    }
  } }, "Cancel running operations…");
}

/** Asks in the page's dialog (not window.confirm: it names the action and may carry an option). */
function confirmAction(text, option) {
  const dialog = $("confirm");
  $("confirm-text").textContent = text;
  $("confirm-option").hidden = !option;
  $("confirm-option-text").textContent = option || "";
  $("confirm-check").checked = false;
  return new Promise((resolve) => {
    dialog.onclose = () => resolve(dialog.returnValue === "ok" ? { checked: $("confirm-check").checked } : null);
    dialog.returnValue = "";
    dialog.showModal();
  });
}

function showLogin(message) {
  clearInterval(poller); // until signed in again: every poll would be refused
  $("main").replaceChildren();
  $("login").hidden = false;
  $("login-error").textContent = message || tokenExposed();
  $("logout").hidden = true;
}

$("login").addEventListener("submit", (e) => {
  e.preventDefault();
  const exposed = tokenExposed();
  if (exposed) {
    // Not even kept: nothing here may send it.
    $("token").value = "";
    $("login-error").textContent = exposed;
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
  $("token").value = "";
  start();
});

$("logout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin();
});

// ---- views ------------------------------------------------------------------

function fleetView(params) {
  let result = ""; // what the last bulk action answered
  const report = (message) => { result = message; schedule(); };
  const state = params.get("state") || "";
  const label = params.get("label") || "";
  const page = Number(params.get("page") || 0);
  const link = (changes) => {
    const p = new URLSearchParams({ state, label, page: 0, ...changes });
    return "#/?" + p.toString();
  };
  return {
    async refresh() {
      const started = performance.now();
      const q = new URLSearchParams({ state, label, page, page_size: 100 });
      const fleet = await api("fleet?" + q.toString());
      const counts = Object.entries(fleet.counts).map(([s, n]) =>
        h("a", { href: link({ state: s }), class: s === state ? "on" : null }, `${short(s)} ${n}`));
      const pages = Math.max(1, Math.ceil(fleet.matched / fleet.page_size));
      const rows = fleet.clusters.map((c) => [
        h("a", { href: "#/clusters/" + enc(c.name) }, c.name),
        badge(c.state),
        c.current_version && c.current_version !== c.version ? `${c.current_version} → ${c.version}` : c.version,
        fleet.owners_shown ? c.owner || "—" : h("span", { class: "muted" }, "admin only"),
        c.operation ? h("span", {}, short(c.operation.kind) + " ", progress(c.operation)) : "",
        Object.entries(c.labels).map(([k, v]) => `${k}=${v}`).join(", "),
      ]);
      const labelInput = h("input", { value: label, placeholder: "label k=v,k2=v2", id: "label-filter" });
      $("main").replaceChildren(
        h("h1", {}, `Fleet: ${fleet.total} clusters`),
        h("div", { class: "chips" }, h("a", { href: link({ state: "" }), class: state ? null : "on" }, "all"), counts),
        h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); location.hash = link({ label: labelInput.value }); } },
          labelInput, h("button", {}, "Filter"),
          h("span", {}, `${fleet.matched} match · page ${page + 1} of ${pages} `),
          page > 0 ? h("a", { href: link({ page: page - 1 }) }, "‹ prev") : "",
          " ",
          page + 1 < pages ? h("a", { href: link({ page: page + 1 }) }, "next ›") : ""),
        h("div", { class: "actions", id: "fleet-actions" }, label && fleet.may_cancel ? bulkCancelButton(label, report) : ""),
        h("p", { id: "action-result", class: "muted" }, result),
        table(["Cluster", "State", "Version", "Owner", "Operation", "Labels"], rows));
      document.body.dataset.fleetMs = Math.round(performance.now() - started);
      document.body.dataset.fleetRows = rows.length;
    },
    onEvent: () => schedule(),
  };
}

// A node's health as the API judged it at the read, with why.
function nodeHealth(n) {
  switch (n.health) {
    case "NODE_HEALTH_UNHEALTHY":
      return h("span", { class: "error node-health" }, `unhealthy: ${n.health_reason}`);
    case "NODE_HEALTH_NOT_READY":
      return h("span", { class: "node-health" }, `not ready: ${n.health_reason}`);
    default:
      return h("span", { class: "node-health" }, n.ready ? "healthy" : "not ready");
  }
}

function clusterView(name) {
  let result = ""; // what the last action here answered
  const report = (message) => { result = message; schedule(); };
  return {
    // Node health is judged at each read (a timeout passes without a
    // write), and a status write sends no event: read again every 5 s.
    pollMs: 5000,
    async refresh() {
      const d = await api("clusters/" + enc(name));
      const c = d.cluster, s = c.spec, st = c.status || {};
      const current = d.operations.find((o) => o.id === st.current_operation);
      const nodes = (st.nodes || []).map((n) => [n.id, n.role, n.power_state, n.version,
        nodeHealth(n), Object.entries(n.facts || {}).map(([k, v]) => `${k}=${v}`).join(", ")]);
      const rem = st.remediation || {};
      const remediated = (rem.nodes || []).map((r) => [r.node_id, String(r.attempts || 0),
        String(r.retries_left || 0), time(r.last_started_at)]);
      const tasks = d.tasks.map((t) => {
        const run = (t.status || {}).last_run;
        const state = run ? (run.status || "").replace(/^TASK_RUN_STATUS_/, "") : "";
        // A run going shows how far it has got, as its provider last said.
        const p = state === "RUNNING" && run.progress;
        const going = p ? [p.percent != null ? `${p.percent}%` : "", p.message].filter(Boolean).join(" ") : "";
        return [t.spec.name, short(t.spec.type),
          run ? [time(run.started_at), state, run.error || "", going].filter(Boolean).join(" ") : "never",
          time((t.status || {}).next_activation), (t.status || {}).error || ""];
      });
      const ops = d.operations.map((o) => [
        h("a", { href: `#/operations/${enc(name)}/${enc(o.id)}` }, o.id),
        short(o.kind), badge(o.state), progress(o.state === "OPERATION_STATE_RUNNING" ? o : null),
        time(o.created_at), time(o.finished_at), o.error ? o.error.message : ""]);
      $("main").replaceChildren(
        h("h1", {}, `Cluster ${c.name} `, badge(st.state, "cluster-state"),
          s.paused ? h("span", { class: "badge", id: "cluster-paused" }, "paused") : ""),
        h("div", { class: "actions", id: "cluster-actions" }, clusterButtons(c, current, d.actions || [], report)),
        h("p", { id: "action-result", class: "muted" }, result),
        h("div", { id: "current-operation" }, current
          ? h("span", {}, `${short(current.kind)} `, progress(current)) : "no operation running"),
        h("h2", {}, "State history"),
        h("div", { class: "timeline", id: "timeline" }, d.history.map((e) =>
          h("div", {}, badge(e.state), " ", time(e.at), e.operation ? ` (${e.operation.slice(-8)})` : ""))),
        h("h2", {}, "Spec"),
        h("dl", {}, h("dt", {}, "Version"), h("dd", { id: "spec-version" }, s.version),
          h("dt", {}, "Running version"), h("dd", { id: "current-version" }, st.current_version || "—"),
          h("dt", {}, "Nodes"), h("dd", {}, `${s.control_nodes} control, ${s.worker_nodes} workers (${s.node_offering})`),
          h("dt", {}, "Labels"), h("dd", {}, Object.entries(s.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "—"),
          h("dt", {}, "Generation"), h("dd", {}, `${c.generation} (observed ${st.observed_generation ?? "—"})`),
          h("dt", {}, "Task runs"), h("dd", { id: "tasks-suspended" }, s.tasks_suspended
            ? `suspended${s.tasks_suspended.until ? " until " + time(s.tasks_suspended.until) : " until resumed"}` : "scheduled"),
          h("dt", {}, "Message"), h("dd", {}, st.message || "—")),
        h("h2", {}, "Nodes"), table(["Node", "Role", "Power", "Version", "Health", "Facts"], nodes),
        h("h2", {}, "Remediation"),
        h("p", { id: "remediation-message", class: rem.short_circuited ? "error" : "muted" },
          rem.message || "nothing held back"),
        remediated.length ? table(["Node", "Attempts", "Retries left", "Last"], remediated) : "",
        h("h2", {}, "Tasks"), table(["Task", "Type", "Last run", "Next activation", "Error"], tasks),
        h("h2", {}, "Operations"), table(["Id", "Kind", "State", "Progress", "Created", "Finished", "Error"], ops));
    },
    onEvent(kind, data) {
      if ((kind === "cluster" && data.name === name) || (kind === "operation" && data.cluster === name) || kind === "reset") schedule();
    },
  };
}

function operationView(cluster, id) {
  return {
    async refresh() {
      const d = await api(`operations/${enc(cluster)}/${enc(id)}`);
      const o = d.operation;
      const steps = d.steps.map((s, i) => {
        const next = d.steps[i + 1] ? d.steps[i + 1].seen_at : o.finished_at;
        const took = next ? ((new Date(next) - new Date(s.seen_at)) / 1000).toFixed(1) + " s" : "running";
        return [`${s.step}/${s.total_steps}`, s.step_name, time(s.seen_at), took];
      });
      $("main").replaceChildren(
        h("h1", {}, `Operation ${o.id} `, badge(o.state, "operation-state")),
        h("p", {}, "Cluster ", h("a", { href: "#/clusters/" + enc(cluster) }, cluster)),
        h("dl", {}, h("dt", {}, "Kind"), h("dd", {}, short(o.kind)),
          h("dt", {}, "States"), h("dd", {}, `${short(o.from_state)} → ${short(o.entered_state)}`),
          h("dt", {}, "Progress"), h("dd", {}, progress(o)),
          h("dt", {}, "Created"), h("dd", {}, time(o.created_at)),
          h("dt", {}, "Started"), h("dd", {}, time(o.started_at)),
          h("dt", {}, "Finished"), h("dd", {}, time(o.finished_at)),
          h("dt", {}, "Request id"), h("dd", {}, o.request_id || "—"),
          h("dt", {}, "Error"), h("dd", { class: "error" }, o.error ? `${o.error.code}: ${o.error.message}` : "—")),
        h("h2", {}, "Steps (as this replica saw them begin)"),
        table(["Step", "Name", "Seen at", "Took"], steps),
        h("h2", {}, "Runs (owners that ran it)"),
        table(["Replica", "Epoch"], (o.runs || []).map((r) => [r.replica, r.epoch])));
    },
    onEvent(kind, data) {
      if ((kind === "operation" && data.id === id) || kind === "reset") schedule();
    },
  };
}

function membersView() {
  return {
    async refresh() {
      const d = await api("members");
      const owned = d.members.reduce((n, m) => n + Number(m.clusters_owned), 0);
      const rows = d.members.map((m) => {
        const pct = d.clusters ? Math.round((100 * Number(m.clusters_owned)) / d.clusters) : 0;
        return [m.id, m.address, m.version, `${m.lease_ttl_left_seconds} s`,
          h("span", {}, h("span", { class: "bar" }, h("span", { style: `width:${pct}%` })), `${m.clusters_owned} (${pct}%)`),
          m.draining ? "draining" : ""];
      });
      $("main").replaceChildren(
        h("h1", {}, `Members: ${d.members.length}`),
        h("p", {}, `${d.clusters} clusters, ${d.clusters - owned} without an owner right now.`),
        table(["Replica", "Address", "Version", "Lease TTL left", "Clusters owned", ""], rows));
    },
    onEvent: (kind) => kind === "reset" && schedule(),
  };
}

function rolloutsView() {
  return {
    async refresh() {
      const d = await api("rollouts");
      const rows = d.rollouts.map((r) => {
        const st = r.status || {}, stages = st.stages || [];
        const sum = (k) => stages.reduce((n, s) => n + Number(s[k] || 0), 0);
        const done = sum("succeeded") + sum("skipped"), targets = sum("targets");
        const pct = targets ? Math.round((100 * done) / targets) : 0;
        return [h("a", { href: "#/rollouts/" + enc(r.name) }, r.name), badge(st.state),
          h("span", {}, h("span", { class: "bar" }, h("span", { style: `width:${pct}%` })), `${done}/${targets}`),
          sum("failed") ? h("span", { class: "error" }, sum("failed")) : "0",
          age(r.created_at), st.owner || "—"];
      });
      $("main").replaceChildren(h("h1", {}, `Rollouts: ${d.rollouts.length}`),
        table(["Rollout", "State", "Progress (succeeded+skipped / targets)", "Failed", "Age", "Owner"], rows));
    },
    onEvent: (kind) => kind === "reset" && schedule(),
    // Listing loads every rollout whole: every few seconds is enough here.
    pollMs: 5000,
  };
}

/** Failures first, then what is moving, then what waits, then what is done. */
const TARGET_ORDER = ["TARGET_FAILED", "TARGET_RUNNING", "TARGET_PENDING", "TARGET_SKIPPED", "TARGET_SUCCEEDED"];
const CLUSTERS_SHOWN = 1000;
const TERMINAL = ["ROLLOUT_SUCCEEDED", "ROLLOUT_FAILED", "ROLLOUT_CANCELLED"];

function rolloutSpec(r) {
  const s = r.spec || {};
  return h("dl", { id: "rollout-spec" },
    h("dt", {}, "Action"), h("dd", {}, s.version ? `upgrade to ${s.version}` : `node offering ${s.node_offering}`),
    h("dt", {}, "Targets"), h("dd", {}, (s.clusters || []).length ? s.clusters.join(", ") : `clusters labelled ${labels(s.selector)}`),
    h("dt", {}, "Max failures"), h("dd", {}, s.max_failures || "0"),
    h("dt", {}, "When a cluster is busy"), h("dd", {}, short(s.on_busy) === "SKIP" ? "skip it" : "wait for it"),
    h("dt", {}, "Created"), h("dd", {}, `${time(r.created_at)} (${age(r.created_at)} ago)`),
    h("dt", {}, "Owner"), h("dd", {}, (r.status || {}).owner || "—"));
}

function stageRows(r) {
  const specs = (r.spec || {}).stages || [];
  return ((r.status || {}).stages || []).map((s, i) => {
    const spec = specs[i] || {};
    return [s.name, s.targets, s.pending, s.running, s.succeeded,
      s.failed ? h("span", { class: "error" }, s.failed) : 0, s.skipped,
      time(s.started_at), time(s.finished_at), spec.max_concurrency || "1",
      spec.soak_seconds ? `${spec.soak_seconds} s` : "—", spec.approval_required ? "required" : "—"];
  });
}

/** The stage an approval would start: the first not started, if it needs one. */
function gatedStage(r) {
  const specs = (r.spec || {}).stages || [];
  const i = ((r.status || {}).stages || []).findIndex((s) => !s.started_at);
  return i >= 0 && specs[i] && specs[i].approval_required ? { spec: specs[i], status: r.status.stages[i] } : null;
}

/** The buttons for the actions this token may take that apply in this state. */
function actionButtons(r, allowed, report) {
  const name = r.name, state = (r.status || {}).state, gate = gatedStage(r);
  const running = ((r.status || {}).stages || []).reduce((n, s) => n + Number(s.running || 0), 0);
  const live = !TERMINAL.includes(state);
  const choices = [
    ["pause", "Pause", live && state !== "ROLLOUT_PAUSED",
      () => [`Pause rollout ${name}: it starts no new cluster until resumed (running operations go on).`]],
    ["resume", "Resume", state === "ROLLOUT_PAUSED",
      () => [`Resume rollout ${name}: it starts clusters again, up to each stage's max_concurrency, and forgives the failures so far.`]],
    ["approve", gate ? `Approve stage ${gate.spec.name}` : "Approve", state === "ROLLOUT_WAITING_APPROVAL" && gate,
      () => [`Approve stage ${gate.spec.name} of rollout ${name}: its ${gate.status.targets} clusters start, up to ${gate.spec.max_concurrency || "1"} at a time.`],
      () => ({ stage: gate.spec.name })],
    ["cancel", "Cancel", live,
      () => [`Cancel rollout ${name}: it starts no further cluster and ends CANCELLED.`, `Also cancel the running operations (${running} running now)`],
      (checked) => ({ cancel_running: checked })],
  ];
  return choices.filter(([action, , applies]) => applies && allowed.includes(action))
    .map(([action, label, , ask, body]) => h("button", { id: "action-" + action, onclick: async () => {
      const [text, option] = ask();
      const answer = await confirmAction(text, option);
      if (!answer) return;
      try {
        await act(name, action, body ? body(answer.checked) : {});
        report(`${label}: done.`);
      } catch (e) {
        report(`${label} refused: ${e.message || e}`);
      }
    } }, label));
}

function rolloutView(name) {
  let result = ""; // what the last action here answered
  const report = (message) => { result = message; schedule(); };
  return {
    async refresh() {
      const d = await api("rollouts/" + enc(name));
      const r = d.rollout, st = r.status || {};
      const order = (c) => TARGET_ORDER.indexOf(c.state);
      const clusters = [...(st.clusters || [])].sort((a, b) => order(a) - order(b)).slice(0, CLUSTERS_SHOWN);
      const rows = clusters.map((c) => [h("a", { href: "#/clusters/" + enc(c.cluster) }, c.cluster), badge(c.state), c.stage,
        c.operation_id ? h("a", { href: `#/operations/${enc(c.cluster)}/${enc(c.operation_id)}` }, c.operation_id) : "—",
        c.message || ""]);
      $("main").replaceChildren(
        h("h1", {}, `Rollout ${r.name} `, badge(st.state, "rollout-state")),
        h("p", { id: "rollout-message" }, st.message || ""),
        h("div", { class: "actions", id: "rollout-actions" }, actionButtons(r, d.actions, report)),
        h("p", { id: "action-result", class: "muted" }, result),
        rolloutSpec(r),
        h("h2", {}, "Stages"),
        h("div", { id: "rollout-stages" }, table(["Stage", "Targets", "Pending", "Running", "Succeeded", "Failed", "Skipped",
          "Started", "Finished", "Max concurrency", "Soak", "Approval"], stageRows(r))),
        h("h2", {}, `Clusters (${(st.clusters || []).length}, failures first)`),
        table(["Cluster", "State", "Stage", "Operation", "Message"], rows));
    },
    onEvent: (kind) => kind === "reset" && schedule(),
    // Polled, not pushed: a rollout's changes are spread over keys the
    // event feed does not follow (its record, status and each target's
    // progress), few pages show one, and a read is a handful of etcd ranges.
    pollMs: 1000,
  };
}

// ---- routing and refresh ---------------------------------------------------------

function route() {
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "clusters" && parts[1]) return clusterView(parts[1]);
  if (parts[0] === "operations" && parts[2]) return operationView(parts[1], parts[2]);
  if (parts[0] === "members") return membersView();
  if (parts[0] === "rollouts" && parts[1]) return rolloutView(parts[1]);
  if (parts[0] === "rollouts") return rolloutsView();
  return fleetView(new URLSearchParams(query || ""));
}

let timer = null;
/** Refreshes the view soon, once for a burst of events. */
function schedule() {
  if (!timer) timer = setTimeout(() => { timer = null; render(); }, 200);
}

async function render() {
  try {
    await view.refresh();
    $("login").hidden = true;
    $("logout").hidden = !sessionStorage.getItem(TOKEN_KEY);
  } catch (e) {
    if (e instanceof Unauthorized) showLogin(sessionStorage.getItem(TOKEN_KEY) ? "That token was refused." : "");
    else $("main").replaceChildren(h("p", { class: "error" }, String(e.message || e)));
  }
}

// ---- the live stream -----------------------------------------------------------

let streaming = false;
async function follow() {
  if (streaming) return;
  streaming = true;
  for (let attempt = 0; ; attempt++) {
    try {
      const response = await fetch("/ui/api/events", { headers: authHeaders() });
      if (response.status === 401) { streaming = false; return; }
      if (!response.ok) throw new Error("status " + response.status);
      lost(false);
      attempt = 0;
      await readEvents(response.body.getReader());
    } catch (e) { /* reported below */ }
    lost(true);
    await new Promise((r) => setTimeout(r, Math.min(1000 * 2 ** attempt, 10000)));
  }
}

function lost(isLost) {
  $("live").textContent = isLost ? "live updates lost" : "live";
  $("live").className = "live " + (isLost ? "off" : "on");
  $("banner").hidden = !isLost;
  $("banner").textContent = isLost ? "Live updates lost: reconnecting… (what you see may be stale)" : "";
  if (!isLost) schedule(); // changes may have been missed while away
}

async function readEvents(reader) {
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let kind = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) kind = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data && view) view.onEvent(kind, JSON.parse(data));
    }
  }
}

/** Shows the routed view; polls it while it is shown if it asks to. */
function show() {
  clearInterval(poller);
  view = route();
  poller = view.pollMs ? setInterval(() => document.hidden || schedule(), view.pollMs) : null;
  return render();
}

function start() {
  show().then(() => { if ($("login").hidden) follow(); });
}

window.addEventListener("hashchange", show);
start();
