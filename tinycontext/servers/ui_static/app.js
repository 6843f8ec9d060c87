// The memory browser: plain JS over /ui/api (see tinycontext/servers/ui.py). Data only ever reaches
// the page through textContent, never as HTML.
"use strict";

const TOKEN_KEY = "tinycontext-token";
const PAGE_SIZE = 50;
const state = { offset: 0, next: null, bulkCount: null, memory: null, loaded: false };

const $ = (selector) => document.querySelector(selector);

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  return node;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    if (cell instanceof Node) td.appendChild(cell);
    else td.textContent = cell === null || cell === undefined ? "" : String(cell);
    if (typeof cell === "number") td.className = "num";
    tr.appendChild(td);
  }
  return tr;
}

function fill(tbody, rows, empty, columns) {
  tbody.replaceChildren(...rows);
  if (!rows.length) {
    const td = el("td", empty, { colspan: String(columns) });
    td.className = "muted";
    const tr = document.createElement("tr");
    tr.appendChild(td);
    tbody.appendChild(tr);
  }
}

function say(text, kind) {
  const box = $("#message");
  box.textContent = text || "";
  box.className = kind || "error";
  box.hidden = !text;
}

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.code;
  }
}

// Every call carries the UI header (the server refuses calls without it: a foreign page cannot add
// it without a CORS preflight) and, when the server has one, the token this tab was given.
async function api(method, path, body) {
  const headers = { "X-TinyContext-UI": "1" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch("/ui/api" + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body),
                                                   credentials: "omit", cache: "no-store" });
  if (response.status === 401) {
    $("#token-form").hidden = false;
    $("#token").focus();
  }
  if (!response.ok) {
    let detail = null;
    try { detail = await response.json(); } catch (e) { /* not JSON: the status says enough */ }
    throw new ApiError(response.status, detail);
  }
  return response;
}

const getJSON = async (path) => (await api("GET", path)).json();
const postJSON = async (path, body) => (await api("POST", path, body)).json();

// Runs a handler, showing its error; ``keep``: leave the last message up (a view change after an action).
function guarded(action, keep) {
  return async (event) => {
    if (event) event.preventDefault();
    try {
      if (!keep) say("");
      await action(event);
    } catch (err) {
      if (err.status !== 401) say(err.message);
      else say("Sign in with the server's API token to continue.");
    }
  };
}

function splitList(text) {
  return text.split(",").map((s) => s.trim()).filter(Boolean);
}

function when(iso) {
  return iso ? iso.replace("T", " ").slice(0, 16) : "";
}

function score(value) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(4);
}

// Marks a memory that a newer fact superseded (valid_until set); null for a current one.
function supersededBadge(memory) {
  if (!memory.valid_until && !memory.superseded_by) return null;
  const what = [memory.valid_until ? "valid until " + when(memory.valid_until) : null,
                memory.superseded_by ? "superseded by memory " + memory.superseded_by : null].filter(Boolean).join("; ");
  return el("span", "superseded", { class: "badge", title: what, "aria-label": "superseded: " + what });
}

// A memory's text as a link to its page, with its superseded badge.
function memoryLink(memory) {
  const cell = el("span");
  cell.appendChild(el("a", memory.content.length > 160 ? memory.content.slice(0, 157) + "…" : memory.content,
                      { href: "#memory/" + memory.id }));
  const badge = supersededBadge(memory);
  if (badge) cell.appendChild(badge);
  return cell;
}

// -- sessions ------------------------------------------------------------------------------------

async function loadOverview() {
  const data = await getJSON("/overview");
  $("#summary").textContent = `${data.memories} memories, ${data.tokens} tokens in ${data.sessions.length} sessions · ` +
    `search: ${data.mode}${data.embedder ? " (" + data.embedder + ")" : ""}`;
  for (const select of document.querySelectorAll(".session-select")) {
    const chosen = select.value;
    select.replaceChildren(el("option", "All sessions", { value: "" }),
                           ...data.sessions.map((s) => el("option", s.session_id, { value: s.session_id })));
    select.value = data.sessions.some((s) => s.session_id === chosen) ? chosen : "";
  }
  state.loaded = true;
  fill($("#sessions-table tbody"), data.sessions.map((s) => {
    const browse = el("button", "Browse", { type: "button", "aria-label": `Browse session ${s.session_id}` });
    browse.addEventListener("click", () => { $("#f-session").value = s.session_id; location.hash = "#browse"; runList(0); });
    const download = el("button", "Export", { type: "button", "aria-label": `Export session ${s.session_id}` });
    download.addEventListener("click", guarded(() => exportJsonl(s.session_id)));
    const actions = el("span");
    actions.append(browse, " ", download);
    return row([s.session_id, s.memories, s.tokens, when(s.created_at), actions]);
  }), "No sessions yet: save a memory first.", 5);
}

async function exportJsonl(sessionId) {
  const query = sessionId ? "?session_id=" + encodeURIComponent(sessionId) : "";
  const blob = await (await api("GET", "/export" + query)).blob();
  const link = el("a", null, { href: URL.createObjectURL(blob), download: `tinycontext-export${sessionId ? "-" + sessionId : ""}.jsonl` });
  document.body.appendChild(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  say(`Exported ${sessionId ? "session " + sessionId : "all sessions"}.`, "ok");
}

// -- search --------------------------------------------------------------------------------------

async function runSearch() {
  const budget = $("#search-budget").value;
  const body = { query: $("#q").value, detail: $("#search-detail").value, include_superseded: $("#search-superseded").checked };
  if ($("#search-session").value) body.session_id = $("#search-session").value;
  if (budget) body.max_tokens = Number(budget);
  const data = await postJSON("/search", body);
  const answer = data.answer;
  $("#search-cost").textContent = `The agent's answer (${answer.detail}) costs ${answer.text_tokens} tokens as text, ` +
    `${answer.structured_tokens} as structured content, of max_tokens=${answer.max_tokens}; it holds ` +
    `${answer.ids.length} of ${data.ranked.length} ranked memories${answer.truncated ? " (the budget cut some)" : ""}. ` +
    `Search: ${data.mode}.` + (data.below_floor ? ` ${data.below_floor} below the relevance floor.` : "") +
    (data.below_cliff ? ` ${data.below_cliff} after the score cliff.` : "") +
    (data.superseded ? ` ${data.superseded} superseded ${data.superseded === 1 ? "fact" : "facts"} left out (recall prefers current facts).` : "");
  fill($("#search-table tbody"), data.ranked.map((m) => {
    const tr = row([m.rank, m.in_answer ? "yes" : "no", memoryLink(m), score(m.scores.bm25), score(m.scores.dense),
                    score(m.scores.rrf), m.tokens]);
    if (m.in_answer) tr.className = "chosen";
    return tr;
  }), "No memory matches.", 7);
  $("#answer-text").textContent = answer.text;
  $("#search-results").hidden = false;
}

// -- browse and bulk delete ----------------------------------------------------------------------

function filterBody() {
  const body = {};
  const session = $("#f-session").value;
  if (session) body.session_id = session;
  const tags = splitList($("#f-tags").value);
  if (tags.length) body.tags = tags;
  const speaker = $("#f-speaker").value.trim();
  if (speaker) body.speaker = speaker;
  const filters = {};
  const metadata = {};
  for (const pair of splitList($("#f-metadata").value)) {
    const at = pair.indexOf("=");
    if (at < 1) throw new ApiError(400, { message: `Metadata filter ${JSON.stringify(pair)} is not key=value.` });
    metadata[pair.slice(0, at).trim()] = pair.slice(at + 1).trim();
  }
  if (Object.keys(metadata).length) filters.metadata = metadata;
  const created = {};
  if ($("#f-from").value) created.gte = $("#f-from").value;
  if ($("#f-to").value) created.lt = $("#f-to").value;
  if (Object.keys(created).length) filters.created_at = created;
  if (Object.keys(filters).length) body.filters = filters;
  return body;
}

async function runList(offset) {
  const body = { ...filterBody(), order: $("#f-order").value, offset, limit: PAGE_SIZE };
  const data = await postJSON("/list", body);
  state.offset = offset;
  state.next = data.next_offset;
  $("#list-summary").textContent = data.total ? `${data.total} memories match; showing ${offset + 1}–${offset + data.memories.length}.`
                                              : "No memories match.";
  fill($("#list-table tbody"), data.memories.map((m) => row([m.id, memoryLink(m), (m.tags || []).join(", "), m.session_id,
                                                             m.speaker || "", when(m.updated_at || m.created_at)])),
       "No memories match.", 6);
  $("#prev-page").disabled = offset === 0;
  $("#next-page").disabled = state.next === null || state.next === undefined;
  resetBulk();
}

function resetBulk() {
  state.bulkCount = null;
  $("#bulk-result").textContent = "";
  $("#bulk-delete").disabled = true;
  $("#bulk-delete").textContent = "Delete matching memories";
}

async function bulkCount() {
  const data = await postJSON("/delete_memories", { ...filterBody(), dry_run: true });
  state.bulkCount = data.matched;
  $("#bulk-result").textContent = `Dry run: ${data.matched} memories match; nothing was deleted.`;
  $("#bulk-delete").textContent = `Delete ${data.matched} matching memories`;
  $("#bulk-delete").disabled = data.matched === 0;
}

async function bulkDelete() {
  if (state.bulkCount === null) return;
  if (!window.confirm(`Delete ${state.bulkCount} memories and their history? This cannot be undone.`)) return;
  const data = await postJSON("/delete_memories", { ...filterBody(), dry_run: false, confirm: state.bulkCount });
  say(`Deleted ${data.deleted} memories.`, "ok");
  await Promise.all([loadOverview(), runList(0)]);
}

// -- one memory ----------------------------------------------------------------------------------

async function showMemory(id) {
  const memory = await getJSON("/memory/" + encodeURIComponent(id));
  state.memory = memory;
  const facts = [["Session", memory.session_id], ["Version", memory.version], ["Tokens", memory.tokens],
                 ["Saved", when(memory.created_at)], ["Changed", memory.version > 1 ? when(memory.updated_at) : null], ["Speaker", memory.speaker],
                 ["Occurred", memory.occurred_at], ["Episode", memory.episode],
                 ["Valid from", when(memory.valid_from)], ["Valid until", when(memory.valid_until)],
                 ["Superseded by", memory.superseded_by ? el("a", "memory " + memory.superseded_by, { href: "#memory/" + memory.superseded_by }) : null]];
  $("#memory-facts").replaceChildren(...facts.filter(([, v]) => v !== null && v !== undefined && v !== "").flatMap(([k, v]) => {
    const dd = el("dd");
    if (v instanceof Node) dd.appendChild(v);
    else dd.textContent = String(v);
    return [el("dt", k), dd];
  }));
  const badge = supersededBadge(memory);
  $("#memory-title").replaceChildren(`Memory ${memory.id}`, ...(badge ? [badge] : []));
  $("#edit-content").value = memory.content;
  $("#edit-tags").value = (memory.tags || []).join(", ");
  $("#edit-metadata").value = JSON.stringify(memory.metadata || {}, null, 1);
  fill($("#history-table tbody"), [...(memory.history || [])].reverse().map((h) => row([h.version, h.content, (h.tags || []).join(", "),
                                                                                       when(h.created_at), when(h.superseded_at)])),
       "No edits yet: this is the first version.", 5);
}

async function saveMemory() {
  let metadata;
  try {
    metadata = JSON.parse($("#edit-metadata").value || "{}");
  } catch (err) {
    throw new ApiError(400, { message: "Metadata must be a JSON object: " + err.message });
  }
  const memory = await postJSON("/memory/" + state.memory.id, {
    content: $("#edit-content").value, tags: splitList($("#edit-tags").value), metadata, expected_version: state.memory.version });
  await showMemory(memory.id);
  say(`Saved version ${memory.version}.`, "ok");
}

async function deleteMemory() {
  const id = state.memory.id;
  if (!window.confirm(`Delete memory ${id} and its history? This cannot be undone.`)) return;
  await api("DELETE", "/memory/" + id);
  say(`Deleted memory ${id}.`, "ok");
  location.hash = "#browse";
}

// -- views ---------------------------------------------------------------------------------------

async function route() {
  const [view, id] = (location.hash.slice(1) || "sessions").split("/");
  const name = ["sessions", "search", "browse", "memory"].includes(view) ? view : "sessions";
  // Load first, show after: a form is never visible (and editable) before its data has arrived.
  if (!state.loaded || name === "sessions") await loadOverview();  // the summary and the session lists
  if (name === "memory") await showMemory(id);
  else if (name === "browse") await runList(0);
  for (const section of document.querySelectorAll("[data-view-section]")) section.hidden = section.id !== "view-" + name;
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.view === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (name === "search") $("#q").focus();
}

document.addEventListener("DOMContentLoaded", () => {
  $("#token-form").addEventListener("submit", guarded(async () => {
    sessionStorage.setItem(TOKEN_KEY, $("#token").value);
    $("#token").value = "";
    $("#token-form").hidden = true;
    await route();
  }));
  $("#search-form").addEventListener("submit", guarded(runSearch));
  $("#filter-form").addEventListener("submit", guarded(() => runList(0)));
  $("#prev-page").addEventListener("click", guarded(() => runList(Math.max(0, state.offset - PAGE_SIZE))));
  $("#next-page").addEventListener("click", guarded(() => runList(state.next)));
  $("#bulk-count").addEventListener("click", guarded(bulkCount));
  $("#bulk-delete").addEventListener("click", guarded(bulkDelete));
  $("#filter-form").addEventListener("input", resetBulk);
  $("#edit-form").addEventListener("submit", guarded(saveMemory));
  $("#delete-memory").addEventListener("click", guarded(deleteMemory));
  $("#export-all").addEventListener("click", guarded(() => exportJsonl(null)));
  window.addEventListener("hashchange", guarded(route, true));
  guarded(route)();
});
