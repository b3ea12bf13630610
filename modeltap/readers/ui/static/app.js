// modeltap's records viewer. Plain JavaScript, no build step, nothing from a CDN.
// It polls the API (ui/app.py) so it follows the databases `modeltap serve` is writing: the server
// filters, searches, sorts and pages the sessions, and each poll asks only for the sessions that
// changed since the revisions the page has seen. Recorded text (prompts, replies, tool output) is
// only ever set with textContent, never parsed as HTML.
"use strict";

// Often enough to feel live; each poll is one small query on the server.
const POLL_MS = 1500;
// Sessions per page; "more" asks for this many more.
const PAGE = 50;

const state = {
  sessions: [],        // the page, in the order asked for
  stores: [],
  outcomes: [],
  revisions: null,     // {store: revision} the page is up to date with; null: fetch the page whole
  filters: { q: "", outcome: "", sort: "time" },
  limit: PAGE,
  selected: null,      // {id, store}
  sessionKey: null,    // what the selected session looked like when its turns were fetched
  details: null,       // the selected session's row
  turns: [],
  open: new Set(),     // turn numbers whose detail is shown
  full: new Map(),     // turn number -> its full request and response, once fetched
};

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "style") node.style.cssText = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child != null) node.append(child);
  return node;
}

// replaceChildren() writes a null child as the text "null": leave out the parts a session lacks.
function fill(node, ...children) {
  node.replaceChildren(...children.filter((child) => child != null));
}

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  if (!response.ok) throw new Error(`${url}: ${response.status} ${await response.text()}`);
  return response.json();
}

function fmtTime(ts) {
  return ts ? new Date(ts * 1000).toLocaleTimeString() : "-";
}

function fmtMs(ms) {
  return ms == null ? "-" : ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms} ms`;
}

function num(value) {
  return value == null ? "-" : String(value);
}

function callText(call) {
  return `${call.name}(${call.arguments ?? ""})`;
}

function fmtReward(reward) {
  return reward == null ? "-" : String(Number(reward.toPrecision(3)));
}

function outcomeBadge(s) {
  if (!s.outcome) return null;
  const bad = s.outcome !== "scored";
  return el("span", { class: "badge outcome" + (bad ? " error" : " good"), text: `${s.outcome} · reward ${fmtReward(s.reward)}` });
}

// -- sessions -----------------------------------------------------------------------------------

function sameSession(a, b) {
  return a && b && a.id === b.id && a.store === b.store;
}

function renderControls() {
  const select = document.getElementById("filter-outcome");
  if (select.options.length === 1 && state.outcomes.length) {
    for (const o of state.outcomes) select.append(el("option", { value: o, text: o }));
  }
}

function renderSessions(doc) {
  const waiting = doc.waiting.length ? ` (waiting for ${doc.waiting.join(", ")}…)` : "";
  document.getElementById("store").textContent = doc.stores.join(", ") + waiting;
  renderControls();
  const list = document.getElementById("session-list");
  list.replaceChildren();
  if (!state.sessions.length) {
    const filtered = state.filters.q || state.filters.outcome;
    list.append(el("p", { class: "muted", text: filtered ? "No session matches." : "No sessions recorded yet." }));
    return;
  }
  const several = state.stores.length > 1;
  for (const s of state.sessions) {
    const labels = Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(" ");
    const tokens = `${num(s.prompt_tokens)} → ${num(s.completion_tokens)} tokens`;
    const item = el(
      "button",
      {
        class: "session-item" + (sameSession(s, state.selected) ? " selected" : ""),
        "data-session-id": s.id,
        "data-store": s.store,
        onclick: () => selectSession({ id: s.id, store: s.store }),
      },
      el("div", { class: "id", text: s.id }),
      el("div", { class: "meta", text: `${fmtTime(s.first ?? s.created)} · ${s.exchanges} turn(s) · ${tokens}` }),
      labels ? el("div", { class: "meta", text: labels }) : null,
      several ? el("div", { class: "meta store-name", text: s.store }) : null,
      outcomeBadge(s),
      s.errors ? el("span", { class: "badge error", text: `${s.errors} error(s)` }) : null,
      s.token_drift ? el("span", { class: "badge drift", text: `token drift #${s.token_drift.turn}` }) : null,
    );
    list.append(item);
  }
  if (state.sessions.length >= state.limit) {
    list.append(el("button", { class: "more", onclick: () => { state.limit += PAGE; refetch(); } }, `Show ${PAGE} more`));
  }
}

function sessionKey(selected) {
  const s = state.sessions.find((x) => sameSession(x, selected));
  return s ? `${s.rev}` : null;
}

async function selectSession(selected) {
  if (!sameSession(state.selected, selected)) {
    state.open.clear();
    state.full.clear();
  }
  state.selected = selected;
  location.hash = new URLSearchParams({ session: selected.id, store: selected.store ?? "" }).toString();
  for (const item of document.querySelectorAll(".session-item")) {
    item.classList.toggle("selected", sameSession({ id: item.dataset.sessionId, store: item.dataset.store }, selected));
  }
  await loadTurns();
}

function sessionURL(selected, tail = "") {
  const query = selected.store ? `?store=${encodeURIComponent(selected.store)}` : "";
  return `/api/sessions/${encodeURIComponent(selected.id)}${tail}${query}`;
}

async function loadTurns() {
  const selected = state.selected;
  const key = sessionKey(selected);
  const doc = await getJSON(sessionURL(selected, "/turns"));
  if (!sameSession(selected, state.selected)) return;
  state.selected = { id: doc.session, store: doc.store };
  state.turns = doc.turns;
  state.details = doc.details;
  state.sessionKey = key;
  renderSession();
}

// -- one session --------------------------------------------------------------------------------

function renderSession() {
  const main = document.getElementById("session");
  const id = state.selected;
  const turns = state.turns;
  const maxTokens = Math.max(1, ...turns.map((t) => (t.prompt_tokens ?? 0) + (t.completion_tokens ?? 0)));
  const maxLatency = Math.max(1, ...turns.map((t) => t.latency_ms ?? 0));
  const errors = turns.filter((t) => t.error).length;
  const drift = turns.find((t) => t.token_drift)?.token_drift;
  const withIds = turns.some((t) => t.token_ids?.source);
  const labels = Object.entries(state.details?.labels ?? turns[0]?.labels ?? {});
  fill(
    main,
    el("h2", { text: id.id }),
    labels.length
      ? el("div", { class: "session-labels" }, ...labels.map(([k, v]) => el("span", { class: "label", text: `${k}=${v}` })))
      : null,
    el(
      "div",
      { class: "summary muted" },
      `${turns.length} turn(s) · ${errors} error(s) · export: `,
      el("a", { href: sessionURL(id, "/export/har"), text: "HAR" }),
      el("a", { href: sessionURL(id, "/export/jsonl"), text: "JSONL" }),
      el("a", { href: sessionURL(id, "/export/messages"), text: "messages" }),
      withIds ? el("a", { href: sessionURL(id, "/export/tokens"), text: "tokens" }) : null,
      state.stores.length > 1 ? ` · ${id.store}` : null,
    ),
    renderRollout(state.details),
    drift ? el("p", { class: "drift-note", text: `Token history breaks at turn #${drift.turn}: ${drift.text}.` }) : null,
    legend(),
    el("div", { id: "timeline" }, ...turns.map((t) => renderTurn(t, maxTokens, maxLatency))),
  );
}

function renderRollout(details) {
  if (!details || !details.outcome) return null;
  const rollout = details.rollout ?? {};
  const facts = [];
  if (rollout.scores?.length) facts.push(`scores ${rollout.scores.join(" ")}`);
  if (rollout.duration_s != null) facts.push(`${rollout.duration_s.toFixed(1)} s`);
  if (rollout.exit_status != null) facts.push(`exit status ${rollout.exit_status}`);
  return el(
    "div",
    { class: "rollout" },
    outcomeBadge(details),
    el("span", { class: "facts", text: facts.join(" · ") }),
    rollout.log_tail ? el("details", {}, el("summary", { text: "log (tail)" }), el("pre", { text: rollout.log_tail })) : null,
  );
}

function legend() {
  const swatch = (cls, label) => [el("i", { class: cls, style: `background: var(--${cls})` }), label];
  return el(
    "div",
    { class: "legend" },
    "tokens:", ...swatch("prompt", "prompt"), ...swatch("completion", "completion"),
    " · latency:", ...swatch("ttfb", "to first byte"), ...swatch("rest", "rest"),
  );
}

function bar(parts, title) {
  return el("div", { class: "bar", title }, ...parts.map(([cls, pct]) => el("span", { class: cls, style: `width: ${pct}%` })));
}

function renderTurn(t, maxTokens, maxLatency) {
  const prompt = t.prompt_tokens ?? 0;
  const completion = t.completion_tokens ?? 0;
  const latency = t.latency_ms ?? 0;
  const ttfb = Math.min(t.ttfb_ms ?? 0, latency);
  const tokens = bar(
    [["prompt", (100 * prompt) / maxTokens], ["completion", (100 * completion) / maxTokens]],
    `${num(t.prompt_tokens)} prompt + ${num(t.completion_tokens)} completion tokens`,
  );
  const timing = bar(
    [["ttfb", (100 * ttfb) / maxLatency], ["rest", (100 * (latency - ttfb)) / maxLatency]],
    `${fmtMs(t.latency_ms)} (first byte ${fmtMs(t.ttfb_ms)})`,
  );
  const note = el("div", { class: "turn-note" });
  if (t.error) note.append(el("span", { class: "err", text: `${t.error.class}: ${t.error.message ?? ""}` }));
  else if (t.tool_calls.length) for (const c of t.tool_calls) note.append(el("span", { class: "call", text: `→ ${callText(c)} ` }));
  else if (t.reply) note.append(el("span", { text: t.reply }));
  const row = el(
    "div",
    { class: "turn-row", onclick: () => toggle(t.turn) },
    el("span", { class: "n", text: `#${t.turn}` }),
    el("span", { text: (t.endpoint ?? t.path) + (t.streamed ? " (stream)" : "") }),
    el("span", { class: "badge" + (t.status >= 400 || !t.status ? " error" : ""), text: num(t.status) }),
    el("div", {}, tokens, el("div", { class: "bar-label", text: `${num(t.prompt_tokens)} → ${num(t.completion_tokens)}` })),
    el("div", {}, timing, el("div", { class: "bar-label", text: fmtMs(t.latency_ms) })),
    el("span", { class: "muted", text: t.finish_reason ?? "-" }),
    note,
  );
  const classes = "turn" + (t.error ? " failed" : "") + (t.token_drift ? " drift" : "");
  const node = el("div", { class: classes, "data-turn": String(t.turn) }, row);
  if (t.token_drift) node.append(renderDrift(t.token_drift));
  if (state.open.has(t.turn)) node.append(renderDetail(t));
  return node;
}

// The ids around a token-history break, the previous turn's prompt + completion beside this prompt,
// decoded where the record has their text, the first differing id marked.
function renderDrift(drift) {
  const side = (title, part) => {
    const tokens = part.ids.map((id, i) => {
      const at = part.start + i;
      const text = part.text ? part.text[i] : String(id);
      const cls = "tok" + (at === drift.position ? " diverge" : at > drift.position ? " after" : "");
      return el("span", { class: cls, title: `#${at}: id ${id}`, text: JSON.stringify(text).slice(1, -1) || "·" });
    });
    return el("div", { class: "drift-side" }, el("div", { class: "muted", text: title }), el("div", { class: "tokens" }, ...tokens));
  };
  return el(
    "div",
    { class: "drift-box" },
    el("div", { class: "drift-title", text: `Token drift at id ${drift.position}: ${drift.text} (continues #${drift.continues_turn}, ${drift.source} ids)` }),
    el(
      "div",
      { class: "drift-sides" },
      side(`expected: #${drift.continues_turn}'s prompt + completion`, drift.expected),
      side(`got: this turn's prompt`, drift.got),
    ),
  );
}

function tokenFacts(ids) {
  if (!ids) return null;
  if (!ids.source) return ids.ask === "rendered" ? "token ids: none, they could not be rendered" : `token ids: none came back (asked ${ids.ask})`;
  const continues = ids.continues != null ? ` · continues #${ids.continues} sharing ${ids.shared}` : "";
  return `token ids ${ids.source}: prompt ${ids.prompt_length}, completion ${ids.completion_length}${continues}`;
}

function toggle(number) {
  if (state.open.has(number)) state.open.delete(number);
  else state.open.add(number);
  renderSession();
}

function messageText(m) {
  if (typeof m !== "object" || m === null) return JSON.stringify(m);
  const pieces = [];
  const content = m.content ?? m.output;
  if (typeof content === "string") pieces.push(content);
  else if (Array.isArray(content)) {
    for (const block of content) {
      if (typeof block?.text === "string") pieces.push(block.text);
      else if (block?.type === "tool_use") pieces.push(`→ ${block.name}(${JSON.stringify(block.input)})`);
      else if (block?.type === "tool_result") pieces.push(`⇐ ${block.tool_use_id}: ${typeof block.content === "string" ? block.content : JSON.stringify(block.content)}`);
      else pieces.push(`[${block?.type}]`);
    }
  }
  for (const call of m.tool_calls ?? []) pieces.push(`→ ${call.function?.name}(${call.function?.arguments ?? ""})`);
  if (m.type === "function_call") pieces.push(`→ ${m.name}(${m.arguments ?? ""})`);
  if (m.tool_call_id) pieces.unshift(`⇐ ${m.tool_call_id}:`);
  return pieces.join("\n");
}

function section(title, ...children) {
  return children.length ? [el("h3", { text: title }), ...children] : [];
}

function renderDetail(t) {
  const messages = t.new_messages.map((m) =>
    el("div", { class: "message" }, el("span", { class: "role", text: m.role ?? m.type ?? "?" }), el("pre", { text: messageText(m) })),
  );
  const calls = t.tool_calls.map((c) =>
    el("div", { class: "tool-call" }, el("div", { class: "name", text: `${c.name}  ${c.id ?? ""}` }), el("pre", { text: pretty(c.arguments) })),
  );
  const results = t.tool_results.map((r) =>
    el("div", { class: "tool-result" }, el("div", { class: "muted", text: `${r.id}${r.is_error ? " (error)" : ""}` }), el("pre", { text: r.content })),
  );
  const facts = [
    `${t.method} ${t.path} → ${num(t.status)}`,
    `model ${t.model ?? "-"} · finish ${t.finish_reason ?? "-"} · tokens ${num(t.prompt_tokens)} → ${num(t.completion_tokens)}` +
      (t.counted_prompt_tokens != null ? ` (counted ${t.counted_prompt_tokens})` : ""),
    `started ${fmtTime(t.started)} · first byte ${fmtMs(t.ttfb_ms)} · total ${fmtMs(t.latency_ms)}` +
      (t.retry_count ? ` · SDK retry ${t.retry_count}` : ""),
    t.continues != null && t.continues !== t.turn - 1 ? `continues #${t.continues}` : null,
    t.user_agent ? `client ${t.user_agent}` : null,
    tokenFacts(t.token_ids),
  ].filter(Boolean);
  const full = el("div", { class: "full-bodies" });
  if (state.full.has(t.turn)) fillFull(full, state.full.get(t.turn));
  const detail = el(
    "div",
    { class: "detail" },
    el("pre", { class: "muted", text: facts.join("\n") }),
    ...section(`New messages (${messages.length})`, ...messages),
    ...section("Tool calls", ...calls),
    ...section("Tool results", ...results),
    ...section("Reply", ...(t.reply ? [el("pre", { text: t.reply })] : [])),
    ...section("Budget", ...(t.budget ? [el("pre", { text: pretty(t.budget) })] : [])),
    ...section("Error", ...(t.error ? [el("pre", { class: "error-box", text: `${t.error.class}: ${t.error.message ?? ""}` })] : [])),
    ...(t.tool_call_parse_failure ? [el("p", { class: "error-box", text: "finish reason says tool call, but no tool call was parsed" })] : []),
    el("button", { class: "full", onclick: (e) => { e.stopPropagation(); showFull(t.turn, full); } }, "Full request and response"),
    full,
  );
  return detail;
}

function pretty(value) {
  if (typeof value === "string") {
    try { return JSON.stringify(JSON.parse(value), null, 2); } catch { return value; }
  }
  return JSON.stringify(value, null, 2);
}

async function showFull(number, target) {
  const turn = await getJSON(sessionURL(state.selected, `/turns/${number}`));
  state.full.set(number, turn);
  fillFull(target, turn);
}

function fillFull(target, turn) {
  fill(
    target,
    ...section("Request", el("pre", { text: pretty(turn.request) })),
    ...section(
      turn.sent_because ? `Sent upstream (${turn.sent_because})` : "Sent upstream",
      ...(turn.sent ? [el("pre", { text: pretty(turn.sent) })] : []),
    ),
    ...section("Response", el("pre", { text: pretty(turn.response) })),
  );
}

// -- polling ------------------------------------------------------------------------------------

function listURL() {
  const params = new URLSearchParams({ limit: String(state.limit), sort: state.filters.sort });
  if (state.filters.q) params.set("q", state.filters.q);
  if (state.filters.outcome) params.set("outcome", state.filters.outcome);
  if (state.revisions) params.set("since", JSON.stringify(state.revisions));
  return `/api/sessions?${params}`;
}

function order(a, b) {
  if (state.filters.sort === "reward") {
    const ra = a.reward ?? -Infinity;
    const rb = b.reward ?? -Infinity;
    if (ra !== rb) return rb - ra;
  }
  return b.created - a.created;
}

// A page with the changed sessions in it: each replaces its old row or joins the page, and the
// page keeps its order and length (a session pushed past the end leaves it until "more").
function merged(changed) {
  const page = state.sessions.filter((s) => !changed.some((c) => sameSession(c, s)));
  return [...page, ...changed].sort(order).slice(0, state.limit);
}

let polling = null;
let generation = 0;  // counts filter changes: an answer to a page asked for before one is stale

async function poll() {
  const live = document.getElementById("live");
  try {
    const asked = generation;
    const wasFull = state.revisions === null;
    const doc = await getJSON(listURL());
    if (asked !== generation) return;  // the filters changed meanwhile; the poll queued after it refetches
    state.stores = doc.stores;
    state.outcomes = doc.outcomes;
    state.revisions = doc.revisions;
    const changed = doc.full || wasFull || doc.sessions.length > 0;
    state.sessions = doc.full ? doc.sessions : merged(doc.sessions);
    if (changed || !document.getElementById("session-list").childElementCount) renderSessions(doc);
    if (state.selected && sessionKey(state.selected) !== state.sessionKey) await loadTurns();
    live.classList.remove("stale");
    live.textContent = "live";
  } catch (error) {
    live.classList.add("stale");
    live.textContent = "disconnected";
    console.error(error);
  }
}

// Filters changed: the next poll fetches the page whole, now.
function refetch() {
  generation += 1;
  state.revisions = null;
  polling = polling.then(poll);
}

function bindControls() {
  const search = document.getElementById("filter-q");
  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { state.filters.q = search.value.trim(); state.limit = PAGE; refetch(); }, 250);
  });
  for (const [id, key] of [["filter-outcome", "outcome"], ["filter-sort", "sort"]]) {
    document.getElementById(id).addEventListener("change", (e) => { state.filters[key] = e.target.value; state.limit = PAGE; refetch(); });
  }
}

async function start() {
  bindControls();
  polling = poll();
  await polling;
  const wanted = new URLSearchParams(location.hash.slice(1));
  if (wanted.get("session")) await selectSession({ id: wanted.get("session"), store: wanted.get("store") || null });
  setInterval(() => { polling = polling.then(poll); }, POLL_MS);
}

start();
