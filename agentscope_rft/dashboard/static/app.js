// agentscope-rft dashboard: plain JavaScript and SVG, no build step, no network beyond the API.
"use strict";

const COLORS = ["#2f6fdb", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c",
  "#5c940d", "#364fc7", "#a61e4d"];
const HEALTH_COLORS = { warn: "#e67700", stop: "#c92a2a", rollback: "#862e9c" };
const state = {
  token: null, runs: [], selected: new Set(), metrics: {}, episodeRun: null, episodes: [],
  episode: null, timer: null,
};

// ---------------------------------------------------------------- helpers
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== null && value !== undefined) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}
const fmt = (v, digits = 3) => (v === null || v === undefined || Number.isNaN(v)) ? "–" :
  (typeof v === "number" ? (Math.abs(v) >= 1000 ? v.toFixed(0) : +v.toPrecision(digits)) : v);
const when = (t) => t ? new Date(t * 1000).toLocaleString() : "–";
function showMessage(text) {
  const box = document.getElementById("message");
  box.textContent = text || "";
  box.hidden = !text;
}
async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  if (options.body) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { ...options, headers });
  const data = response.headers.get("content-type")?.includes("json") ?
    await response.json() : await response.text();
  if (!response.ok) throw new Error((data && data.error) || response.statusText);
  return data;
}
const q = (params) => new URLSearchParams(Object.fromEntries(
  Object.entries(params).filter(([, v]) => v !== null && v !== undefined && v !== ""))).toString();

// ---------------------------------------------------------------- tabs
function showTab(name) {
  for (const section of document.querySelectorAll(".tab")) {
    section.hidden = section.id !== "tab-" + name;
  }
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.tab === name);
  }
  if (name === "curves") drawCurves();
}
window.addEventListener("hashchange", () => showTab(location.hash.slice(1) || "runs"));

// ---------------------------------------------------------------- runs
async function loadRuns() {
  const data = await api("/api/runs");
  state.runs = data.runs;
  document.getElementById("root").textContent =
    `${data.runs.length} run(s) in ${data.root}`;
  if (state.selected.size === 0) data.runs.forEach((r) => state.selected.add(r.id));
  renderRuns();
  renderConfigDiff();
  fillEpisodeRuns();
}

function renderRuns() {
  const body = document.querySelector("#runs-table tbody");
  body.replaceChildren();
  let group = null;
  for (const run of state.runs) {
    if (run.group && run.group !== group) {
      const members = state.runs.filter((r) => r.group === run.group);
      body.append(el("tr", { class: "group-row" }, el("td", {}),
        el("td", { colspan: 7 }, `seed group ${run.group} (${members.length} seeds)`)));
    }
    group = run.group;
    const box = el("input", { type: "checkbox", "data-run": run.id, onchange: (e) => {
      if (e.target.checked) state.selected.add(run.id); else state.selected.delete(run.id);
      renderConfigDiff(); refreshMetrics();
    } });
    box.checked = state.selected.has(run.id);
    const best = run.best ? `${fmt(run.best.value)} (${run.best.metric}, step ${run.best.step})` : "–";
    const last = run.last_validation ?
      `${fmt(run.last_validation.value)} (${run.last_validation.phase}, step ${run.last_validation.step})` : "–";
    const name = el("a", { href: "#episodes", onclick: () => { state.episodeRun = run.id; fillEpisodeRuns(); loadEpisodes(); } },
      run.group ? `${run.id} (seed ${run.seed ?? "?"})` : run.id);
    body.append(el("tr", { "data-run-row": run.id },
      el("td", {}, box),
      el("td", {}, name, run.error ? el("div", { class: "break" }, run.error) : null),
      el("td", { title: run.status_detail }, el("span", { class: "badge " + run.status }, run.status)),
      el("td", {}, `${run.steps_done} / ${run.total_steps ?? "?"}`),
      el("td", {}, last), el("td", {}, best),
      el("td", {}, run.health_events ? `${run.health_events} event(s)` : "–"),
      el("td", {}, when(run.started))));
  }
}

function renderConfigDiff() {
  const box = document.getElementById("config-diff");
  const runs = state.runs.filter((r) => state.selected.has(r.id));
  if (runs.length < 2) { box.textContent = "Select two or more runs."; box.className = "muted"; return; }
  const keys = [...new Set(runs.flatMap((r) => Object.keys(r.config)))].sort();
  const differing = keys.filter((k) => new Set(runs.map((r) => JSON.stringify(r.config[k]))).size > 1)
    .filter((k) => k !== "run.dir" && k !== "run.name");
  box.className = "";
  if (!differing.length) { box.textContent = "The selected runs have the same config (name and folder aside)."; return; }
  box.replaceChildren(el("table", { id: "config-diff-table" },
    el("thead", {}, el("tr", {}, el("th", {}, "key"), runs.map((r) => el("th", {}, r.id)))),
    el("tbody", {}, differing.map((k) => el("tr", {}, el("td", {}, k),
      runs.map((r) => el("td", {}, r.config[k] === undefined ? "–" : JSON.stringify(r.config[k]))))))));
}

// ---------------------------------------------------------------- curves
async function refreshMetrics() {
  const ids = [...state.selected];
  await Promise.all(ids.map(async (id) => {
    try { state.metrics[id] = await api("/api/run/metrics?" + q({ run_id: id })); }
    catch (err) { state.metrics[id] = { records: [], health: [], error: err.message }; }
  }));
  fillMetricNames();
  if (!document.getElementById("tab-curves").hidden) drawCurves();
}

function metricName(record, name) { return record.phase === "train" ? name : `${record.phase}/${name}`; }

function fillMetricNames() {
  const select = document.getElementById("metric");
  const names = new Set();
  for (const id of state.selected) {
    for (const r of state.metrics[id]?.records || []) {
      for (const name of Object.keys(r.metrics)) names.add(metricName(r, name));
    }
  }
  const current = select.value || "reward/mean";
  const sorted = [...names].sort();
  select.replaceChildren(...sorted.map((n) => el("option", { value: n }, n)));
  select.value = sorted.includes(current) ? current : (sorted[0] || "");
}

function seriesOf(id, metric, xaxis) {
  const data = state.metrics[id];
  if (!data) return [];
  const points = new Map();
  const t0 = Math.min(...data.records.filter((r) => r.time).map((r) => r.time));
  for (const r of data.records) {
    for (const [name, value] of Object.entries(r.metrics)) {
      if (metricName(r, name) !== metric || value === null) continue;
      const x = xaxis === "time" ? (r.time - t0) / 60 : r.step;
      points.set(r.step, { x, y: value, step: r.step });  // the last value of a step wins
    }
  }
  return [...points.values()].sort((a, b) => a.step - b.step);
}

function smooth(points, weight) {
  if (!weight) return points;
  let last = 0, debias = 0;
  return points.map((p) => {
    last = last * weight + (1 - weight) * p.y; debias = debias * weight + (1 - weight);
    return { ...p, y: last / debias };
  });
}

function groupStats(seriesList) {
  const bySteps = new Map();
  for (const series of seriesList) {
    for (const p of series) {
      if (!bySteps.has(p.step)) bySteps.set(p.step, []);
      bySteps.get(p.step).push(p);
    }
  }
  return [...bySteps.entries()].sort((a, b) => a[0] - b[0]).map(([step, ps]) => {
    const mean = ps.reduce((s, p) => s + p.y, 0) / ps.length;
    const std = Math.sqrt(ps.reduce((s, p) => s + (p.y - mean) ** 2, 0) / ps.length);
    return { step, x: ps.reduce((s, p) => s + p.x, 0) / ps.length, y: mean, std, n: ps.length };
  });
}

function drawCurves() {
  const chart = document.getElementById("chart");
  const legend = document.getElementById("legend");
  chart.replaceChildren(); legend.replaceChildren();
  const metric = document.getElementById("metric").value;
  const xaxis = document.getElementById("xaxis").value;
  const weight = Number(document.getElementById("smoothing").value);
  const grouped = document.getElementById("group-seeds").checked;
  const runs = state.runs.filter((r) => state.selected.has(r.id));
  // Lines: one per run, or one per seed group (mean ± std) when grouping.
  const lines = [];
  const seen = new Set();
  for (const run of runs) {
    if (grouped && run.group) {
      if (seen.has(run.group)) continue;
      seen.add(run.group);
      const members = runs.filter((r) => r.group === run.group);
      const stats = groupStats(members.map((m) => seriesOf(m.id, metric, xaxis)));
      const smoothed = smooth(stats, weight);
      lines.push({ label: `${run.group} (mean ± std of ${members.length})`, raw: stats,
        points: smoothed.map((p, i) => ({ ...p, std: stats[i].std })), band: true,
        health: members.flatMap((m) => state.metrics[m.id]?.health || []), runId: members[0].id });
    } else {
      const raw = seriesOf(run.id, metric, xaxis);
      lines.push({ label: run.id, raw, points: smooth(raw, weight), band: false,
        health: state.metrics[run.id]?.health || [], runId: run.id });
    }
  }
  const all = lines.flatMap((l) => l.points.flatMap((p) => l.band ? [
    { x: p.x, y: p.y - p.std }, { x: p.x, y: p.y + p.std }] : [p]).concat(l.raw));
  if (!all.length) {
    chart.append(svg("text", { x: 40, y: 60 }, metric ? `no values of ${metric} yet` : "no metrics yet"));
    // Why, per run: a recording has no curves; a metrics file that does not read says so.
    runs.forEach((run, i) => {
      const why = state.metrics[run.id]?.note || state.metrics[run.id]?.error;
      if (why) chart.append(svg("text", { x: 40, y: 90 + 22 * i }, `${run.id}: ${why}`));
    });
    return;
  }
  const W = 960, H = 420, L = 60, R = 20, T = 16, B = 40;
  let [x0, x1] = [Math.min(...all.map((p) => p.x)), Math.max(...all.map((p) => p.x))];
  let [y0, y1] = [Math.min(...all.map((p) => p.y)), Math.max(...all.map((p) => p.y))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  for (let i = 0; i <= 5; i++) {
    const yv = y0 + (y1 - y0) * i / 5, xv = x0 + (x1 - x0) * i / 5;
    chart.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: sy(yv), y2: sy(yv) }));
    chart.append(svg("text", { x: L - 6, y: sy(yv) + 4, "text-anchor": "end" }, fmt(yv)));
    chart.append(svg("text", { x: sx(xv), y: H - B + 16, "text-anchor": "middle" }, fmt(xv)));
  }
  chart.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  chart.append(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  chart.append(svg("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" },
    xaxis === "time" ? "wall time (minutes)" : "step"));
  chart.append(svg("text", { x: W - R, y: T - 4, "text-anchor": "end" }, metric));
  const path = (pts) => pts.map((p, i) => `${i ? "L" : "M"}${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}`).join("");
  lines.forEach((line, k) => {
    const color = COLORS[k % COLORS.length];
    if (line.band && line.points.length) {
      const upper = line.points.map((p) => ({ x: p.x, y: p.y + p.std }));
      const lower = line.points.map((p) => ({ x: p.x, y: p.y - p.std })).reverse();
      chart.append(svg("path", { class: "band", fill: color, d: path(upper) + path(lower).replace(/^M/, "L") + "Z" }));
    }
    if (weight && line.raw.length) chart.append(svg("path", { class: "raw", stroke: color, d: path(line.raw) }));
    if (line.points.length) {
      chart.append(svg("path", { class: "series", stroke: color, "data-run": line.runId, d: path(line.points) }));
    }
    if (line.points.length === 1) {
      chart.append(svg("circle", { cx: sx(line.points[0].x), cy: sy(line.points[0].y), r: 3, fill: color }));
    }
    const marks = svg("g", { class: "health" });
    for (const event of line.health) {
      const at = line.points.find((p) => p.step === event.step) || line.points.find((p) => p.step > event.step);
      const x = xaxis === "step" ? event.step : at?.x;
      if (x === undefined || x < x0 || x > x1) continue;
      const hc = HEALTH_COLORS[event.action] || "#555";
      const mark = svg("g", { class: "health-event", "data-action": event.action },
        svg("line", { x1: sx(x), x2: sx(x), y1: T, y2: H - B, stroke: hc }),
        svg("circle", { cx: sx(x), cy: T + 6, r: 5, fill: hc }),
        svg("title", {}, `step ${event.step}: ${event.action} (${event.rule}) ${event.message || ""}`));
      marks.append(mark);
    }
    chart.append(marks);
    legend.append(el("span", {}, el("i", { style: `background:${color}` }), line.label));
  });
}

// ---------------------------------------------------------------- episodes
function fillEpisodeRuns() {
  const select = document.getElementById("episode-run");
  const current = state.episodeRun || select.value || state.runs[0]?.id;
  select.replaceChildren(...state.runs.map((r) => el("option", { value: r.id }, r.id)));
  if (current) select.value = current;
  state.episodeRun = select.value;
  document.getElementById("export-reviews").href = "/api/run/reviews.jsonl?" +
    q({ run_id: state.episodeRun, token: state.token });
}

async function loadEpisodes() {
  if (!state.episodeRun) return;
  const step = document.getElementById("episode-step").value;
  const phase = document.getElementById("episode-phase").value;
  try {
    const data = await api("/api/run/episodes?" + q({ run_id: state.episodeRun, step, phase }));
    state.episodes = data.episodes;
    renderEpisodes(data.total);
  } catch (err) { showMessage(err.message); }
}

function renderEpisodes(total) {
  const task = document.getElementById("episode-task").value.trim();
  const status = document.getElementById("episode-status").value;
  const sort = document.getElementById("episode-sort").value;
  let rows = state.episodes.filter((e) => (!task || String(e.task_id).includes(task)) &&
    (!status || e.status === status));
  const key = sort.replace("-", "");
  rows = rows.slice().sort((a, b) => {
    const [u, v] = [a[key], b[key]];
    const order = typeof u === "number" && typeof v === "number" ? u - v : String(u).localeCompare(String(v));
    return sort.startsWith("-") ? -order : order;
  });
  document.getElementById("episode-count").textContent =
    `${rows.length} shown of ${total ?? rows.length} episode(s) in ${state.episodeRun}`;
  const body = document.querySelector("#episodes-table tbody");
  body.replaceChildren(...rows.map((e) => el("tr", { class: "clickable", "data-rollout": e.rollout_id,
    onclick: () => openEpisode(state.episodeRun, e.rollout_id) },
    el("td", {}, e.step), el("td", {}, e.phase), el("td", {}, e.task_id), el("td", {}, fmt(e.reward)),
    el("td", {}, e.status), el("td", {}, e.agents.join(", ")), el("td", {}, e.calls),
    el("td", {}, e.length), el("td", { class: "break" }, e.error || ""),
    el("td", {}, e.reviewed ? "reviewed" : ""))));
}

// ---------------------------------------------------------------- trajectory
async function openEpisode(runId, rolloutId) {
  location.hash = "trajectory";
  try {
    state.episode = await api("/api/run/episode?" + q({ run_id: runId, rollout_id: rolloutId }));
    state.episode.runId = runId;
    renderEpisode();
  } catch (err) { showMessage(err.message); }
}

function renderEpisode() {
  const data = state.episode, ep = data.episode;
  document.getElementById("trajectory-empty").hidden = true;
  document.getElementById("trajectory").hidden = false;
  document.getElementById("episode-title").textContent =
    `${ep.rollout_id} — task ${ep.task_id}, step ${ep.step} (${ep.phase})`;
  document.getElementById("episode-facts").replaceChildren(el("span", {},
    `reward ${fmt(ep.reward)} · status ${ep.status}${ep.truncated ? " (" + ep.truncated + ")" : ""} · ` +
    `success ${ep.success} · attempts ${ep.attempts} · ${ep.calls.length} call(s)`),
    ...(ep.error ? [el("pre", { class: "break" }, ep.error)] : []));
  const other = document.getElementById("prefer-other");
  other.replaceChildren(...data.same_task.map((e) =>
    el("option", { value: e.rollout_id }, `${e.rollout_id} (reward ${fmt(e.reward)})`)));
  document.getElementById("prefer-box").hidden = !data.same_task.length;
  document.getElementById("review-list").replaceChildren(...data.reviews.map(describeReview));
  document.getElementById("calls").replaceChildren(...ep.calls.map((c, i) => el("li", {},
    (c.messages || []).map(([role, name, text]) => el("div", { class: `message message-${role}` },
      el("span", { class: "message-role" }, name ? `${role} (${name})` : role), text)),
    el("span", { class: "call-agent" }, c.agent || "-"),
    ` · ${c.prompt_tokens} prompt + ${c.completion_tokens} completion tokens · ${c.finish_reason} · policy v${c.policy_version}`,
    c.reasoning ? el("div", { class: "call-reasoning" }, c.reasoning) : null,
    c.content ? el("div", { class: "call-content" }, c.content) : null,
    (c.tool_calls || []).map(([name, args]) => el("div", { class: "tool" }, `→ ${name}(${args})`)))));
  renderSamples();
}

function describeReview(r) {
  const what = r.kind === "rating" ? `score ${r.score}` + (r.call !== null ? ` for call ${r.call} of ${r.sample_id}` : "") :
    r.kind === "correction" ? `correction of call ${r.call} of ${r.sample_id}: “${r.text}”` :
      `prefers ${r.chosen} over ${r.rejected}`;
  return el("li", { class: "review-item" }, `${r.kind}: ${what}`, r.comment ? ` — ${r.comment}` : "");
}

function shadeOf(mode, i, sample, maxAdv) {
  if (!sample.loss_mask[i]) return "";
  if (mode === "advantage") {
    const a = sample.advantages ? sample.advantages[i] : 0;
    const alpha = maxAdv ? Math.min(1, Math.abs(a) / maxAdv) * 0.55 : 0;
    return a >= 0 ? `rgba(43,138,62,${alpha})` : `rgba(201,42,42,${alpha})`;
  }
  if (mode === "logprob") {
    const p = Math.exp(sample.logprobs[i]);
    return `rgba(230,119,0,${((1 - p) * 0.6).toFixed(3)})`;
  }
  const trainer = sample.trainer_logprobs;
  if (!trainer) return "";
  const gap = Math.abs(trainer[i] - sample.logprobs[i]);
  return `rgba(134,46,156,${Math.min(0.6, gap).toFixed(3)})`;
}

function renderSamples() {
  const data = state.episode;
  const box = document.getElementById("samples");
  box.replaceChildren();
  if (!data.samples.length) {
    box.append(el("p", { class: "muted" }, data.samples_logged ?
      "No training sample of this episode was logged (eval episodes have none; a step logs at most monitor.sample_log samples)." :
      "This run has no samples.jsonl (monitor.sample_log: 0, or a run made before the sample log)."));
    return;
  }
  const gap = document.querySelector('#shade option[value="gap"]');
  gap.hidden = !data.samples.some((s) => s.trainer_logprobs);
  const mode = document.getElementById("shade").value;
  for (const sample of data.samples) {
    const maxAdv = Math.max(0, ...(sample.advantages || []).map(Math.abs));
    const starts = new Map(sample.call_spans.map(([s, e], k) => [s, k]));
    const tokens = el("div", { class: "tokens" });
    sample.tokens.forEach((text, i) => {
      if (starts.has(i)) {
        const k = starts.get(i);
        tokens.append(el("span", { class: "call-start", title: "review this call",
          onclick: () => openCallReview(sample, k, tokens) }, `call ${k} ✎`));
      }
      const trained = !!sample.loss_mask[i];
      const adv = sample.advantages ? sample.advantages[i] : null;
      const title = `#${i} id ${sample.token_ids[i]}` + (trained ?
        ` · logprob ${fmt(sample.logprobs[i])} · advantage ${fmt(adv)}` : " · masked (not trained)") +
        (sample.trainer_logprobs ? ` · trainer logprob ${fmt(sample.trainer_logprobs[i])}` : "");
      tokens.append(el("span", { class: "tok " + (trained ? "trained" : "masked"),
        style: `background:${shadeOf(mode, i, sample, maxAdv)}`, title }, text));
      const reward = sample.token_rewards ? sample.token_rewards[i] : 0;
      if (reward) tokens.append(el("span", { class: "tok-reward", title: "per-step reward" }, `r=${fmt(reward)}`));
    });
    const trained = sample.loss_mask.reduce((s, m) => s + m, 0);
    box.append(el("div", { class: "sample", "data-sample": sample.sample_id },
      el("div", { class: "sample-head" },
        el("b", {}, sample.sample_id), ` · agent ${sample.agent_name || "-"} · ${sample.token_ids.length} tokens, ${trained} trained · ` +
        `${sample.num_calls} call(s) · reward ${fmt(sample.reward)} · policy v${sample.policy_version} · stop ${sample.stop_reason}` +
        (sample.advantages ? ` · advantage ${fmt(sample.advantages[sample.call_spans[0]?.[0] ?? 0])}` : " · advantage not recorded"),
        sample.break_reason ? el("div", { class: "break" },
          `starts a new sample: it did not continue the agent's previous one (${sample.break_reason})`) : null),
      tokens));
  }
}

function openCallReview(sample, call, anchor) {
  anchor.parentElement.querySelector(".call-review")?.remove();
  const [start, end] = sample.call_spans[call];
  const original = sample.tokens.slice(start, end).join("");
  const text = el("textarea", { class: "correction-text" });
  text.value = original;
  const comment = el("input", { placeholder: "comment", size: 40 });
  const send = (body) => submitReview({ rollout_id: state.episode.episode.rollout_id,
    sample_id: sample.sample_id, call, comment: comment.value, ...body });
  anchor.parentElement.insertBefore(el("div", { class: "call-review" },
    el("div", {}, `Call ${call} of ${sample.sample_id}: rate it, or write the answer it should have given.`),
    el("button", { onclick: () => send({ kind: "rating", thumbs: "up" }) }, "▲ good call"),
    el("button", { onclick: () => send({ kind: "rating", thumbs: "down" }) }, "▼ bad call"), " ", comment,
    text, el("button", { class: "submit-correction", onclick: () => send({ kind: "correction", text: text.value }) },
      "Submit corrected answer")), anchor);
}

async function submitReview(body) {
  const status = document.getElementById("review-status");
  try {
    const review = await api("/api/run/reviews?" + q({ run_id: state.episode.runId }),
      { method: "POST", body: JSON.stringify(body) });
    status.textContent = `saved ${review.kind} ${review.id}`;
    status.className = "saved";
    showMessage("");
    await openEpisode(state.episode.runId, state.episode.episode.rollout_id);
    document.getElementById("review-status").textContent = `saved ${review.kind} ${review.id}`;
  } catch (err) {
    status.textContent = "not saved: " + err.message;
    status.className = "break";
  }
}

function episodeRating(extra) {
  const score = document.getElementById("review-score").value;
  submitReview({ kind: "rating", rollout_id: state.episode.episode.rollout_id,
    task_id: state.episode.episode.task_id, comment: document.getElementById("review-comment").value,
    ...(score !== "" ? { score: Number(score) } : {}), ...extra });
}

// ---------------------------------------------------------------- start
function live() {
  clearInterval(state.timer);
  if (!document.getElementById("live").checked) return;
  state.timer = setInterval(async () => {
    try {
      await loadRuns();  // a run started meanwhile appears
      const running = state.runs.some((r) => r.status === "running" && state.selected.has(r.id));
      if (running) await refreshMetrics();
    } catch (err) { showMessage(err.message); }
  }, 3000);
}

async function start() {
  const params = new URLSearchParams(location.search);
  state.token = params.get("token") || sessionStorage.getItem("dashboard-token");
  if (state.token) sessionStorage.setItem("dashboard-token", state.token);
  document.getElementById("auth").textContent = state.token ? "" :
    "read-only: open the URL the dashboard printed (with ?token=) to review";
  document.querySelectorAll("nav a").forEach((a) => a.classList.remove("active"));
  showTab(location.hash.slice(1) || "runs");
  for (const id of ["metric", "xaxis", "group-seeds"]) document.getElementById(id).onchange = drawCurves;
  document.getElementById("smoothing").oninput = (e) => {
    document.getElementById("smoothing-value").textContent = e.target.value; drawCurves();
  };
  document.getElementById("episode-run").onchange = (e) => { state.episodeRun = e.target.value; loadEpisodes(); };
  for (const id of ["episode-phase", "episode-step"]) document.getElementById(id).onchange = loadEpisodes;
  for (const id of ["episode-task", "episode-status", "episode-sort"]) {
    document.getElementById(id).oninput = () => renderEpisodes();
  }
  document.getElementById("shade").onchange = renderSamples;
  document.getElementById("live").onchange = live;
  document.getElementById("review-submit").onclick = () => episodeRating({});
  document.getElementById("thumbs-up").onclick = () => episodeRating({ thumbs: "up", score: undefined });
  document.getElementById("thumbs-down").onclick = () => episodeRating({ thumbs: "down", score: undefined });
  document.getElementById("prefer-submit").onclick = () => submitReview({ kind: "preference",
    chosen: state.episode.episode.rollout_id, rejected: document.getElementById("prefer-other").value,
    task_id: state.episode.episode.task_id, comment: document.getElementById("review-comment").value });
  try {
    await loadRuns();
    await refreshMetrics();
    await loadEpisodes();
    drawCurves();
  } catch (err) { showMessage(err.message); }
  live();
}
start();
