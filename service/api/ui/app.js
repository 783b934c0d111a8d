// casetrail trail viewer. Plain module, no build step, nothing from elsewhere.
// Every value from the API is written as text (textContent), never as markup.
// The API key lives in this tab's sessionStorage only and goes out in the
// Authorization header, streams included (fetch, not EventSource).

import { backtestPage, backtestsPage } from "./backtests.js";

const KEY = "casetrail.apiKey";
// The contract's words, served by the API from the same definitions the code uses.
const VOCABULARY = await (await fetch("/ui/assets/vocabulary.json")).json();
const TERMINAL = new Set(VOCABULARY.terminalEventTypes);
const STATUSES = VOCABULARY.statuses;
const STATUS_OF_EVENT = VOCABULARY.statusOfEvent;
const TERMINAL_STATUSES = new Set(VOCABULARY.terminalEventTypes.map((t) => STATUS_OF_EVENT[t]));
const DECISION_TONE = {
  approve: "ok", clear: "ok", refer: "warn", escalate: "warn", decline: "bad", "file-sar": "bad",
};
const STATUS_TONE = {
  queued: "none", running: "info", awaiting_review: "warn", completed: "ok", failed: "bad",
  timed_out: "bad", cancelled: "warn",
};
const REVIEW_REASONS = {
  decision: "the agent sends this decision to a person", failed_check: "a blocking check failed",
  tenant_policy: "this tenant reviews every case", question: "the model asked a person",
  second_review: "a reviewer overrode the agent: a second person confirms, changes or returns it",
};
const main = document.getElementById("main");
let identity = null;  // who the key acts as (GET /me): a reviewer sees the review form

// Puts a page's content in place and clears the busy mark route() sets, so the old
// content is never taken for the new.
function display(...children) {
  main.replaceChildren(...children);
  main.removeAttribute("aria-busy");
}

// The same, unless the reader has moved on (a newer route aborted this one): a slow
// answer for an old page never replaces the page asked for since.
function show(signal, ...children) {
  if (signal.aborted) return false;
  display(...children);
  return true;
}

class Unauthorized extends Error {}

// --- small DOM helpers ----------------------------------------------------
function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "text") node.textContent = value;
    else if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const badge = (text, tone) => el("span", { class: `badge ${tone || "none"}`, text });
const statusBadge = (status) => badge(status.replaceAll("_", " "), STATUS_TONE[status]);
const decisionBadge = (decision) =>
  decision ? badge(decision, DECISION_TONE[decision] || "info") : el("span", { class: "muted", text: "—" });
// A value the case row shows that its signed trail does not say (projection_mismatch)
// is never shown as genuine: struck through, beside a warning.
const mismatched = (view) => Boolean(view.integrity && (view.integrity.problems || []).includes("projection_mismatch"));
const served = (view, shown) => (mismatched(view)
  ? el("span", { class: "unsigned-value" }, badge("not the signed value", "bad"), " ",
       el("s", { title: "as stored; the signed trail says otherwise" }, shown))
  : shown);
// JSON in the record's own key order: the signed body is RFC 8785, whose keys are
// sorted by UTF-16 code units, as JavaScript's default sort compares strings (the API's
// JSON comes from jsonb, which orders keys by length first).
const ordered = (value) => (Array.isArray(value) ? value.map(ordered)
  : value && typeof value === "object"
    ? Object.fromEntries(Object.keys(value).sort().map((k) => [k, ordered(value[k])])) : value);
const json = (value) => JSON.stringify(ordered(value), null, 2);
// Reasoning is Markdown: rendered with raw HTML off (any HTML in it becomes text),
// links only with safe schemes (markdown-it's own check), nothing loaded from elsewhere.
const MARKDOWN = window.markdownit({ html: false, linkify: false, typographer: false, breaks: true });
function markdown(text, className = "reasoning") {
  const box = el("div", { class: `${className} markdown` });
  box.innerHTML = MARKDOWN.render(text || "(no text)");
  for (const link of box.querySelectorAll("a")) link.rel = "noopener noreferrer";
  return box;
}
const when = (iso) => (iso ? new Date(iso).toLocaleString() : "—");
const ms = (value) => (value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${value} ms`);

// --- the API --------------------------------------------------------------
function authHeaders(extra = {}) {
  return { ...extra, Authorization: `Bearer ${sessionStorage.getItem(KEY) || ""}` };
}

async function api(path, body) {
  const init = { headers: authHeaders({ Accept: "application/json" }) };
  if (body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 401) throw new Unauthorized();
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail ?? detail; } catch { /* not JSON */ }
    throw new Error(`${response.status}: ${detail}`);
  }
  return response.json();
}

// Server-Sent Events over fetch: calls onEvent({id, event, data}) per event.
async function readStream(path, lastEventId, onEvent, signal) {
  const headers = authHeaders({ Accept: "text/event-stream" });
  if (lastEventId) headers["Last-Event-ID"] = lastEventId;
  const response = await fetch(path, { headers, signal });
  if (response.status === 401) throw new Unauthorized();
  if (!response.ok) throw new Error(`stream: ${response.status}`);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const message = { id: null, event: "message", data: [] };
      for (const line of block.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "data") message.data.push(text);
        else if (field === "id") message.id = text;
        else if (field === "event") message.event = text;
      }
      if (message.data.length) onEvent({ ...message, data: JSON.parse(message.data.join("\n")) });
    }
  }
}

// --- session ----------------------------------------------------------------
// The header names the tenant and the credential the viewer reads as, so a
// reviewer with several keys always knows whose cases these are.
function showWho(found) {
  identity = found;
  const who = document.getElementById("who");
  who.textContent = `${found.tenant} · ${found.person ? found.person + " · " : ""}${found.subject}`;
  who.title = `Scopes: ${found.scopes.join(", ") || "none"}`;
}
const reviews = () => Boolean(identity && identity.person && identity.scopes.includes("cases:review"));

function signInPage(problem) {
  document.getElementById("signout").hidden = true;
  document.getElementById("who").textContent = "";
  document.getElementById("who").title = "";
  const input = el("input", { id: "api-key", type: "password", autocomplete: "off",
                              spellcheck: "false", required: true, placeholder: "ct_…" });
  const error = el("p", { class: "error", role: "alert", hidden: !problem, text: problem || "" });
  const form = el("form", { class: "signin", "aria-labelledby": "signin-title" },
    el("h1", { id: "signin-title", text: "Sign in" }),
    el("label", { for: "api-key", text: "API key" }), input, error,
    el("button", { class: "primary", type: "submit", text: "Sign in" }),
    el("p", { text: "The key stays in this browser tab (session storage) and is sent only " +
                    "to this server, in a header. Closing the tab forgets it." }));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, input.value.trim());
    try {
      showWho(await api("/me"));
      route();
    } catch (exc) {
      sessionStorage.removeItem(KEY);
      error.hidden = false;
      error.textContent = exc instanceof Unauthorized
        ? "That key was not accepted (unknown, revoked or expired)." : String(exc.message);
    }
  });
  display(form);
  input.focus();
}

function signOut() {
  sessionStorage.removeItem(KEY);
  history.pushState(null, "", "/ui/");
  signInPage();
}

// --- the case list ------------------------------------------------------------
async function listPage(signal) {
  const params = new URLSearchParams(location.search);
  const agents = (await api("/agents")).agents.map((a) => a.name);
  const field = (label, control) => el("label", {}, label, control);
  const select = (name, options) => el("select", { name, id: `f-${name}` },
    el("option", { value: "", text: "any" }),
    options.map((o) => el("option", { value: o, text: o, selected: params.get(name) === o })));
  const local = (iso) => (iso ? new Date(new Date(iso).getTime() -
    new Date(iso).getTimezoneOffset() * 60000).toISOString().slice(0, 16) : "");
  const form = el("form", { class: "filters", role: "search", "aria-label": "Filter cases" },
    field("Applicant / customer id", el("input", { name: "key", id: "f-key",
      value: params.get("key") || "", placeholder: "e.g. A-1001", autocomplete: "off" })),
    field("Agent", select("agent", agents)),
    field("Status", select("status", STATUSES)),
    field("Decision", el("input", { name: "decision", id: "f-decision", value: params.get("decision") || "",
                                    placeholder: "e.g. approve", autocomplete: "off" })),
    field("Checks", el("select", { name: "checks", id: "f-checks-filter" },
      el("option", { value: "", text: "any" }),
      el("option", { value: "failed", text: "a check failed", selected: params.get("checks") === "failed" }))),
    field("Created from", el("input", { name: "since", id: "f-since", type: "datetime-local",
                                        value: local(params.get("since")) })),
    field("Created before", el("input", { name: "until", id: "f-until", type: "datetime-local",
                                          value: local(params.get("until")) })),
    el("div", { class: "actions" },
      el("button", { class: "primary", type: "submit", text: "Search" }),
      el("button", { type: "reset", text: "Clear" })));
  const apply = (reset) => {
    const wanted = new URLSearchParams();
    if (!reset) {
      for (const [name, value] of new FormData(form)) {
        if (!value) continue;
        wanted.set(name, name === "since" || name === "until" ? new Date(value).toISOString() : value);
      }
    }
    history.pushState(null, "", `/ui/${wanted.size ? "?" + wanted : ""}`);
    route();
  };
  form.addEventListener("submit", (event) => { event.preventDefault(); apply(false); });
  form.addEventListener("reset", (event) => { event.preventDefault(); apply(true); });

  const body = el("tbody");
  const table = el("table", { class: "cases" },
    el("thead", {}, el("tr", {},
      el("th", { scope: "col", text: "Case" }), el("th", { scope: "col", text: "Agent" }),
      el("th", { scope: "col", text: "Status" }), el("th", { scope: "col", text: "Decision" }),
      el("th", { scope: "col", class: "num wide", text: "Cycles" }),
      el("th", { scope: "col", class: "num wide", text: "Tokens" }),
      el("th", { scope: "col", class: "wide", text: "Started by" }),
      el("th", { scope: "col", text: "Created" }))), body);
  const more = el("button", { type: "button", text: "Load more", hidden: true });

  let cursor = null;
  const load = async () => {
    const query = new URLSearchParams(params);
    query.set("limit", "50");
    if (cursor) query.set("cursor", cursor);
    const page = await api(`/cases?${query}`);
    if (signal.aborted) return;
    for (const item of page.items) {
      if (!body.querySelector(`tr[data-case-id="${item.caseId}"]`)) body.append(caseRow(item));
    }
    if (!body.children.length) {
      body.append(el("tr", {}, el("td", { colspan: 8, class: "empty", text: "No cases match." })));
    }
    cursor = page.nextCursor;
    more.hidden = !cursor;
  };
  more.addEventListener("click", () => load().catch(fail));
  await load();
  const live = el("p", { class: "muted live-list", role: "status", text: "" });
  show(signal, el("h1", { text: "Cases" }),
       el("p", {}, el("a", { href: "/ui/reviews", text: "Cases awaiting review →" }), " ",
          el("a", { href: "/ui/backtests", text: "Backtests →" })),
       form, live, table, el("div", { class: "more" }, more));
  followList(body, params, live, signal);
}

// A case as people know it: its business keys (the applicant's id, the claim number)
// where the agent declares them, then the start of its id.
function caseLink(item) {
  const known = Object.values(item.keys || {}).join(" · ");
  return el("a", { class: "id", href: `/ui/cases/${item.caseId}`, title: item.caseId },
            known ? el("span", { class: "known", text: known }) : null,
            el("code", { text: item.caseId.slice(0, 8) }));
}

function caseRow(item) {
  return el("tr", { "data-case-id": item.caseId },
    el("td", {}, caseLink(item)),
    el("td", { text: item.agent }),
    el("td", { class: "status" }, statusBadge(item.status)),
    el("td", { class: "decision" }, decisionBadge(item.decision)),
    el("td", { class: "num wide cycles", text: item.cycles }),
    el("td", { class: "num wide",
               text: (item.tokenUsage.inputTokens + item.tokenUsage.outputTokens).toLocaleString() }),
    el("td", { class: "wide", text: item.startedByName || item.startedBy || "—", title: item.startedBy || "" }),
    el("td", { text: when(item.createdAt) }));
}

// The list follows the tenant's events live: a listed case's status, decision and
// cycles change in place; a case started since shows at the top (first page only).
function followList(body, params, live, signal) {
  let fresh = null;
  const top = async () => {
    fresh = null;
    const query = new URLSearchParams(params);
    query.set("limit", "20");
    const page = await api(`/cases?${query}`);
    if (signal.aborted) return;
    const empty = body.querySelector("td.empty");
    if (empty) empty.parentElement.remove();
    for (const item of page.items.reverse()) {
      if (!body.querySelector(`tr[data-case-id="${item.caseId}"]`)) body.prepend(caseRow(item));
    }
  };
  const onEvent = ({ data }) => {
    const row = body.querySelector(`tr[data-case-id="${data.caseId}"]`);
    if (!row) {
      if (data.eventType === "CASE_STARTED" && data.attempt === 1 && !params.has("cursor") && !fresh) {
        fresh = setTimeout(() => top().catch(() => {}), 500);  // once the case is searchable
      }
      return;
    }
    const status = STATUS_OF_EVENT[data.eventType];
    if (status) row.querySelector("td.status").replaceChildren(statusBadge(status));
    if (data.eventType === "REACT_CYCLE") {
      const cycles = row.querySelector("td.cycles");
      cycles.textContent = String(Number(cycles.textContent) + 1);
    }
    const answer = data.payload && data.payload.answer;
    if (answer && answer.decision) row.querySelector("td.decision").replaceChildren(decisionBadge(answer.decision));
  };
  readStream("/events/stream", null, onEvent, signal)
    .then(() => { live.textContent = ""; })
    .catch((exc) => { if (exc instanceof Unauthorized) fail(exc); else if (!signal.aborted) live.textContent = "Live updates stopped; reload to see changes."; });
  live.textContent = "Live: changes show as they happen.";
}

// --- the review queue ------------------------------------------------------------
async function reviewsPage(signal) {
  const { reviews: waiting } = await api("/reviews");
  const body = el("tbody", {}, waiting.map((item) => el("tr", { "data-case-id": item.caseId },
    el("td", {}, caseLink(item)),
    el("td", { text: item.agent }), el("td", {}, decisionBadge(item.decision)),
    el("td", { text: item.reviewReasons.map((r) => REVIEW_REASONS[r] || r).join("; ") }),
    el("td", {}, item.checks.some((c) => !c.passed) ? checksSummary(item.checks, `/ui/cases/${item.caseId}#waiting`)
                                                    : el("span", { class: "muted", text: "all passed" })),
    el("td", { class: "wide", text: item.startedByName || item.startedBy || "—", title: item.startedBy || "" }),
    el("td", {}, el("span", { text: when(item.waitingSince) }), " ", dueBadge(item)))));
  if (!waiting.length) body.append(el("tr", {}, el("td", { colspan: 7, class: "empty", text: "Nothing waits for review." })));
  show(signal, el("p", { class: "muted" }, el("a", { href: "/ui/", text: "← All cases" })),
       el("h1", { text: "Awaiting review" }),
       el("p", { class: "muted", text: "Oldest first. A case waits here holding no worker until a person " +
                                      "confirms, overrides or returns it; whoever started a case never reviews it." }),
       el("table", { class: "cases reviews" },
         el("thead", {}, el("tr", {}, ["Case", "Agent", "Decision", "Why a person decides", "Checks",
                                       "Started by", "Waiting since"].map((h) => el("th", { scope: "col", text: h })))),
         body));
}

// --- one case -------------------------------------------------------------------
// An MCP result that is not all text is a list of blocks (service/mcp/content.py): text,
// embedded resources, binaries (media type, size, SHA-256, the bytes as base64) and
// resource links. A raster image is drawn from its bytes; every binary is named by its
// digest, which verify checks with the rest of the event.
const RASTER = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
const isBlocks = (result) => Array.isArray(result) && result.length > 0 &&
  result.every((b) => b && typeof b === "object" && typeof b.type === "string");

function binaryBlock(block) {
  const head = el("p", { class: "blob", text: `${block.type} · ${block.mimeType || "binary"} · ` +
    `${(block.bytes ?? 0).toLocaleString("en")} bytes · sha256 ${block.sha256 || "?"}` +
    (block.uri ? ` · ${block.uri}` : "") });
  if (block.type !== "image" || !RASTER.has(block.mimeType) || !block.data) return head;
  const raw = Uint8Array.from(atob(block.data), (c) => c.charCodeAt(0));
  const url = URL.createObjectURL(new Blob([raw], { type: block.mimeType }));
  return el("figure", {}, el("img", { src: url, alt: `image the tool returned, sha256 ${block.sha256}` }),
            el("figcaption", {}, head));
}

function resultBlock(block) {
  if (block.type === "text") return el("pre", { text: block.text });
  if (block.data !== undefined) return binaryBlock(block);
  if (block.type === "resource") {
    return el("details", { open: true },
      el("summary", { text: `resource ${block.uri} (${block.mimeType || "text"})` }),
      el("pre", { text: block.text ?? "" }));
  }
  if (block.type === "resource_link") {
    return el("p", { class: "link" }, "link ", el("code", { text: block.uri }),
      ` ${block.name}` + (block.mimeType ? ` (${block.mimeType})` : "") +
      (block.description ? ` — ${block.description}` : ""));
  }
  return el("pre", { text: json(block) });
}

function resultOf(call) {
  if (call.mcp && isBlocks(call.toolResult)) {
    return el("div", { class: "blocks" }, call.toolResult.map(resultBlock));
  }
  return el("pre", { text: json(call.toolResult) });
}

function toolCard(call) {
  const failed = call.error !== undefined;
  const card = el("div", { class: `tool${failed ? " failed" : ""}`, "data-tool": call.toolName },
    el("div", { class: "tool-head" },
      el("span", { class: "name", text: call.toolName }),
      badge(call.toolSource, call.toolSource === "worker" ? "info" : "none"),
      call.mcp ? el("span", { class: "mcp", title: `inputSchema sha256 ${call.mcp.schemaDigest}`,
                              text: `MCP ${call.mcp.server} · ${call.mcp.tool}` }) : null,
      call.a2a ? el("span", { class: "mcp a2a",
                              title: [call.a2a.cardDigest && `card sha256 ${call.a2a.cardDigest}`,
                                      call.a2a.state].filter(Boolean).join(" · "),
                              text: ["A2A", call.a2a.agent, call.a2a.skill,
                                     call.a2a.taskId && `task ${call.a2a.taskId}`]
                                .filter(Boolean).join(" · ") }) : null,
      el("span", { text: ms(call.durationMs) }),
      failed ? badge("error", "bad") : badge("ok", "ok"),
      call.toolCallId ? el("code", { text: call.toolCallId }) : null),
    el("details", { open: true }, el("summary", { text: "Arguments" }),
      el("pre", { text: call.rawArgs ?? json(call.toolArgs) })),
    failed
      ? el("p", { class: "error", text: call.error })
      : el("details", { open: true }, el("summary", { text: "Result" }), resultOf(call)));
  if (call.attempts && call.attempts.length) {
    card.append(el("ol", { class: "attempts", "aria-label": "Attempts" },
      call.attempts.map((a) => el("li", {
        text: `attempt ${a.attempt}: ${a.outcome}, ${ms(a.durationMs)}` +
              (a.worker ? ` on ${a.worker}` : "") + (a.error ? ` — ${a.error}` : "") }))));
  }
  return card;
}

function cycleCard(event) {
  const p = event.payload;
  const tokens = p.tokenUsage;
  return el("article", { class: "card cycle", id: `e-${event.attempt}-${event.seq}`,
                         "data-cycle": p.cycleIndex, "aria-label": `Cycle ${p.cycleIndex + 1}` },
    el("header", {},
      el("strong", { text: `Cycle ${p.cycleIndex + 1}` }),
      p.model ? el("span", { text: p.model }) : null,
      p.finishReason ? el("span", { text: `finish: ${p.finishReason}` }) : null,
      el("span", { text: `${tokens.inputTokens} in / ${tokens.outputTokens} out tokens` }),
      el("span", { text: when(event.occurredAt) })),
    markdown(p.reasoningText),
    (p.modelRetries || []).map((r) => el("p", { class: "muted",
      text: `model retried after ${ms(r.waitedMs)}: ${r.reason}` })),
    el("div", { class: "tools" }, p.toolCalls.map(toolCard)),
    p.answer ? el("details", { open: true, class: "answer" }, el("summary", { text: "Final answer" }),
      el("pre", { text: json(p.answer) })) : null,
    p.answerRejected ? el("div", { class: "tool failed answer-refused" },
      el("div", { class: "tool-head" }, el("span", { class: "name", text: "Answer refused" }),
        badge("sent back to the model", "bad")),
      el("pre", { text: typeof p.answerRejected.answer === "string"
        ? p.answerRejected.answer : json(p.answerRejected.answer) }),
      el("ul", { class: "error" }, p.answerRejected.errors.map((e) => el("li", { text: e }))))
      : null);
}

function checksTable(checks) {
  return el("table", { class: "checks", "aria-label": "Checks" },
    el("thead", {}, el("tr", {}, ["Check", "Version", "Result", "Blocking", "Detail"].map(
      (h) => el("th", { scope: "col", text: h })))),
    el("tbody", {}, checks.map((c) => el("tr", { "data-check": c.name },
      el("td", { text: c.name }), el("td", { text: c.version }),
      el("td", {}, c.passed ? badge("passed", "ok") : badge("failed", "bad")),
      el("td", { text: c.blocking ? "yes" : "no" }), el("td", { text: c.detail })))));
}

function startedCard(event) {
  const p = event.payload;
  return el("article", { class: "card started", id: `e-${event.attempt}-${event.seq}` },
    el("header", {}, el("strong", { text: "Started" }), el("span", { text: when(event.occurredAt) }),
      el("span", { text: `${p.model.provider} / ${p.model.name}` }),
      el("span", { text: `agent ${p.agent} v${p.agentVersion}` })),
    p.restartReason ? el("p", { class: "muted", text: `Restarted: ${p.restartReason}` }) : null,
    el("p", { class: "muted", text: "Tools offered: " +
      p.toolsOffered.map((t) => `${t.name} (${t.source})`).join(", ") }),
    el("details", {}, el("summary", { text: "Input" }), el("pre", { text: json(p.input) })));
}

function terminalCard(event) {
  const p = event.payload;
  const kind = event.eventType.replace("CASE_", "").toLowerCase();
  const title = { completed: "Completed", failed: "Failed", timed_out: "Timed out",
                  cancelled: "Cancelled" }[kind];
  const card = el("article", { class: `card terminal ${kind}`, id: "outcome", tabindex: "-1" },
    el("header", {}, el("strong", { text: title }),
      kind === "completed" && p.answer && p.answer.decision ? decisionBadge(p.answer.decision) : null,
      p.decidedBy ? el("span", { text: `decided by the ${p.decidedBy}` }) : null,
      el("span", { text: `${p.cyclesCompleted} cycles` }),
      el("span", { text: when(event.occurredAt) })));
  if (kind === "completed") card.append(el("pre", { text: json(p.answer) }));
  if (p.checks && p.checks.length) card.append(checksTable(p.checks));
  if (p.message) card.append(el("p", { text: p.message }));
  if (p.reasonCode) card.append(el("p", { class: "muted", text: `reason: ${p.reasonCode}` }));
  if (kind === "cancelled") {
    card.append(el("p", { class: "muted", text:
      `by ${p.cancelledBy || "unknown"}${p.reason ? ": " + p.reason : ""}` +
      (p.whileQueued ? " (before it started)" : "") }));
  }
  return card;
}

function checksSummary(checks, href = "#outcome") {
  const failed = checks.filter((c) => !c.passed);
  const text = failed.length ? `failed: ${failed.map((c) => c.name).join(", ")}`
                             : `${checks.length} of ${checks.length} passed`;
  return el("a", { href }, badge(text, failed.length ? "bad" : "ok"));
}

const reviewerText = (r) => `${r.subject} (${r.via === "key" ? `key ${r.keyId}${r.name ? ", " + r.name : ""}` : "OIDC"})`;

// The model's question waiting for a person (with the rest of its turn), and (for a
// reviewer) the form to answer it.
function questionCard(event, caseId, waiting) {
  const q = event.payload.question;
  const due = el("span", { class: "due-slot" });
  const card = el("article", { class: "card waiting", id: "waiting", tabindex: "-1" },
    el("header", {}, el("strong", { text: "Waiting for a person's answer" }),
      el("span", { text: when(event.occurredAt) }), due),
    markdown(q.reasoningText),
    el("blockquote", { class: "question", text: q.question }),
    q.toolCalls.length ? el("div", { class: "tools" }, q.toolCalls.map(toolCard)) : null);
  if (waiting) fillDue(due, caseId);
  if (!reviews()) {
    card.append(el("p", { class: "muted", text: "Answering needs a person's key with cases:review." }));
    return card;
  }
  const text = el("textarea", { id: "q-answer", name: "answer", rows: 3, required: true });
  const error = el("p", { class: "error", role: "alert", hidden: true });
  const form = el("form", { class: "review", "aria-labelledby": "answer-title" },
    el("h3", { id: "answer-title", text: "Your answer" }),
    el("label", { for: "q-answer", text: "Answer (the model reads it; the trail records it with your name)" }),
    text, error, el("button", { class: "primary", type: "submit", text: "Send my answer" }));
  form.addEventListener("submit", (submitted) => {
    submitted.preventDefault();
    error.hidden = true;
    postFromForm(form, error, `/cases/${caseId}/answer`,
                 { callId: q.callId, answer: text.value.trim() },
                 "Your answer is kept; the case goes on from it.");
  });
  card.append(form);
  return card;
}

// The agent's answer waiting for a person, and (for a reviewer) the form to decide it.
// Overdue (past the review deadline: it never decides, a person still does), or when due.
function dueBadge(item) {
  if (!item.dueAt) return null;
  return item.overdue ? el("span", { class: "badge warn overdue", text: `Overdue since ${when(item.dueAt)}` })
                      : el("span", { class: "muted due", text: `due ${when(item.dueAt)}` });
}

// The review's due time, from the queue, once known (the trail does not hold it).
async function fillDue(slot, caseId) {
  try {
    const item = await api(`/reviews/${caseId}`);
    const cards = document.querySelectorAll("article.waiting");
    if (cards[cards.length - 1] === slot.closest("article")) slot.replaceChildren(dueBadge(item) || "");
  } catch (exc) {
    if (exc instanceof Unauthorized) fail(exc);  // otherwise: no longer waiting, nothing to show
  }
}

// ``waiting``: the case may still wait (it had not ended when the page read it): only then
// is the review queue asked for its due time (an ended case's review is gone: a 404).
function waitingCard(event, caseId, waiting) {
  const p = event.payload;
  if (p.question) return questionCard(event, caseId, waiting);
  const second = p.reviewReasons.includes("second_review");
  const due = el("span", { class: "due-slot" });
  const card = el("article", { class: "card waiting", id: "waiting", tabindex: "-1" },
    el("header", {}, el("strong", { text: second ? "Awaiting a second reviewer" : "Awaiting review" }),
      p.answer && p.answer.decision ? decisionBadge(p.answer.decision) : null,
      el("span", { text: `${p.cyclesCompleted} cycles` }), el("span", { text: when(event.occurredAt) }), due),
    el("p", { text: "A person decides: " + p.reviewReasons.map((r) => REVIEW_REASONS[r] || r).join("; ") + "." }),
    el("details", { open: true }, el("summary", { text: second ? "The override waiting for a second person" : "The agent's answer" }),
       el("pre", { text: json(p.answer) })));
  if (waiting) fillDue(due, caseId);
  if (p.checks && p.checks.length) card.append(checksTable(p.checks));
  if (reviews()) card.append(reviewForm(caseId, p.answer));
  else card.append(el("p", { class: "muted", text: "Reviewing needs a person's key with cases:review." }));
  return card;
}

function reviewForm(caseId, answer) {
  const verdicts = [["confirm", "Confirm the agent's decision"], ["override", "Override it"],
                    ["return", "Return it to the model with a note"]];
  const decision = el("textarea", { id: "r-decision", name: "decision", rows: 8, spellcheck: "false",
                                    class: "mono" });
  decision.value = json(answer);
  const decisionBox = el("div", { class: "decision-box", hidden: true },
    el("label", { for: "r-decision", text: "Your decision (JSON, valid for the agent's answer schema)" }), decision);
  const reason = el("textarea", { id: "r-reason", name: "reason", rows: 3, required: true });
  const error = el("p", { class: "error", role: "alert", hidden: true });
  const form = el("form", { class: "review", "aria-labelledby": "review-title" },
    el("h3", { id: "review-title", text: "Your review" }),
    el("fieldset", {}, el("legend", { text: "Verdict" }),
      verdicts.map(([value, label], i) => el("label", { class: "choice" },
        el("input", { type: "radio", name: "verdict", value, checked: i === 0, required: true }), label))),
    decisionBox,
    el("label", { for: "r-reason", text: "Reason (recorded in the trail, with your name)" }), reason,
    error, el("button", { class: "primary", type: "submit", text: "Record my review" }));
  form.addEventListener("change", () => {
    decisionBox.hidden = new FormData(form).get("verdict") !== "override";
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const verdict = new FormData(form).get("verdict");
    const body = { verdict, reason: reason.value.trim() };
    error.hidden = true;
    try {
      if (verdict === "override") body.decision = JSON.parse(decision.value);
    } catch (exc) {
      error.textContent = `The decision is not JSON: ${exc.message}`;
      error.hidden = false;
      return;
    }
    await postFromForm(form, error, `/cases/${caseId}/review`, body,
                       "Your review is kept; the case goes on from it (its trail records it next).");
  });
  return form;
}

// A person's review or answer sent from its form: the form gives way to `kept` once
// the API has kept it; a refusal is said in `error` and the form can be sent again.
async function postFromForm(form, error, path, body, kept) {
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    await api(path, body);
    form.replaceChildren(el("p", { role: "status", class: "muted", text: kept }));
  } catch (exc) {
    if (exc instanceof Unauthorized) { fail(exc); return; }
    error.textContent = exc.message;
    error.hidden = false;
    button.disabled = false;
  }
}

function reviewedCard(event) {
  const p = event.payload;
  const verdict = { confirm: "Confirmed", override: "Overridden", return: "Returned to the model" }[p.verdict];
  return el("article", { class: "card reviewed", id: `e-${event.attempt}-${event.seq}` },
    el("header", {}, el("strong", { text: verdict }), el("span", { text: `by ${reviewerText(p.reviewer)}` }),
      el("span", { text: when(p.reviewedAt) })),
    el("p", { class: "reasoning", text: p.reason }),
    p.decision ? el("details", { open: true }, el("summary", { text: "The reviewer's decision" }),
                    el("pre", { text: json(p.decision) })) : null);
}

function fact(label, id, value) {
  return el("div", {}, el("dt", { text: label }), el("dd", { id }, value));
}

// The decision first, as a reviewer reads it: the decision, why (the answer's rationale
// and reason codes), and the identifiers people know the case by (the agent's keys).
function decisionSummary(answer) {
  if (!answer || typeof answer !== "object") return [el("span", { class: "muted", text: "No decision yet." })];
  const codes = Array.isArray(answer.reasonCodes) ? answer.reasonCodes : [];
  return [
    el("p", {}, decisionBadge(answer.decision)),
    answer.rationale ? el("p", { class: "rationale", text: answer.rationale }) : null,
    codes.length ? el("p", { class: "codes" }, "Reason codes: ", codes.flatMap((c, i) => [i ? " " : "", el("code", { text: c })])) : null,
  ].filter(Boolean);
}

async function casePage(caseId, signal) {
  const view = await api(`/cases/${caseId}`);
  const agentInfo = (await api("/agents")).agents.find((a) => a.name === view.agent);
  const keys = ((agentInfo && agentInfo.keys) || []).filter((k) => view.input && view.input[k] !== undefined);
  const summary = el("div", { id: "s-decision" }, mismatched(view)
    ? [el("p", { class: "problem", text: "What is stored for this case is not what its signed trail records: "
                 + "the trail below is what was signed." }), el("s", {}, decisionSummary(view.answer))]
    : decisionSummary(view.answer));
  if (!identity) showWho(await api("/me"));  // whether this key may review
  const setFact = (id, value) => document.getElementById(id).replaceChildren(value);
  const chart = el("div", { class: "chart", role: "img", "aria-label": "Tokens per cycle" });
  const live = el("p", { class: "live", role: "status" });
  const timeline = el("div", { class: "timeline" });
  const problems = el("section", { class: "problems", role: "alert", hidden: true });
  const download = bundleButton(caseId);
  const reportDownload = reportButton(caseId);
  const stopping = mayCancel() && !TERMINAL_STATUSES.has(view.status) ? cancelButton(caseId) : null;
  if (!show(signal,
    el("section", { class: "case-head", "aria-label": "Case" },
      el("div", {},
        el("p", { class: "muted" }, el("a", { href: "/ui/", text: "← All cases" })),
        el("h1", { text: keys.length ? keys.map((k) => view.input[k]).join(" · ") : caseId }),
        keys.length ? el("p", { class: "id muted", text: `${keys.join(", ")} · case ${caseId}` }) : null,
        el("dl", { class: "facts" },
          fact("Agent", "f-agent", view.agent), fact("Tenant", "f-tenant", "—"),
          fact("Started by", "f-by", "—"), fact("Status", "f-status", served(view, statusBadge(view.status))),
          fact("Decision", "f-decision", served(view, decisionBadge(view.answer && view.answer.decision))),
          fact("Checks", "f-checks", el("span", { class: "muted", text: "—" })),
          fact("Decided by", "f-decided", el("span", { class: "muted", text: "—" })),
          fact("Cycles", "f-cycles", String(view.cycles)),
          fact("Tokens in / out", "f-tokens",
               `${view.tokenUsage.inputTokens} / ${view.tokenUsage.outputTokens}`),
          fact("Attempts", "f-attempts", String(view.attempts)),
          fact("Integrity", "f-integrity", integrityBadge(view.integrity)),
          view.held ? fact("Legal hold", "f-hold", badge("held: kept until released", "warn")) : null,
          fact("Transparency log", "f-logged", el("span", { class: "muted", text: "—" })),
          fact("Created", "f-created", when(view.createdAt))),
        el("p", { class: "head-actions" }, download, " ", reportDownload, stopping)),
      el("div", { class: "chart-box" }, el("div", { class: "label", text: "Tokens per cycle" }), chart,
        el("div", { class: "legend" }, el("i", { class: "in" }), "in", el("i", { class: "out" }), "out"))),
    el("section", { class: "card summary", id: "summary", "aria-labelledby": "summary-title" },
      el("h2", { id: "summary-title", text: "Decision" }), summary),
    live, problems, timeline)) return;

  const bars = [];
  const totals = { cycles: 0, input: 0, output: 0 };
  const drawBars = () => {
    const top = Math.max(1, ...bars.map((b) => b.input + b.output));
    chart.replaceChildren(...bars.map((b) => el("div", {
      class: "bar-pair", title: `cycle ${b.label}: ${b.input} in, ${b.output} out` },
      el("div", { class: "out", style: null }), el("div", { class: "in" }))));
    [...chart.children].forEach((pair, i) => {
      pair.children[0].style.height = `${(bars[i].output / top) * 100}%`;
      pair.children[1].style.height = `${(bars[i].input / top) * 100}%`;
    });
  };
  const attempts = new Map();
  const section = (n) => {
    if (!attempts.has(n)) {
      const node = el("section", { class: "attempt", "data-attempt": n, "aria-label": `Attempt ${n}` },
        el("h2", { text: `Attempt ${n}` }));
      attempts.set(n, node);
      timeline.append(node);
    }
    return attempts.get(n);
  };
  let lastId = null;
  let ended = false;
  const reviewers = [];
  const onEvent = ({ id, data: event }) => {
    lastId = id;
    const p = event.payload;
    if (event.eventType === "CASE_STARTED") {
      setFact("f-tenant", event.tenantId);
      setFact("f-by", view.startedByName || p.startedBy || "—");
      setFact("f-attempts", String(event.attempt));
      setFact("f-status", statusBadge("running"));
      section(event.attempt).append(startedCard(event));
    } else if (event.eventType === "REACT_CYCLE") {
      totals.cycles += 1; totals.input += p.tokenUsage.inputTokens; totals.output += p.tokenUsage.outputTokens;
      bars.push({ label: `${event.attempt}.${p.cycleIndex + 1}`, input: p.tokenUsage.inputTokens,
                  output: p.tokenUsage.outputTokens });
      drawBars();
      setFact("f-cycles", String(p.cycleIndex + 1));
      setFact("f-tokens", `${totals.input} / ${totals.output}`);
      section(event.attempt).append(cycleCard(event));
    } else if (event.eventType === "CASE_AWAITING_REVIEW") {
      setFact("f-status", statusBadge("awaiting_review"));
      setFact("f-decision", decisionBadge(p.answer && p.answer.decision));
      if (p.answer) summary.replaceChildren(...decisionSummary(p.answer));
      if (p.checks && p.checks.length) setFact("f-checks", checksSummary(p.checks, "#waiting"));
      showLive(p.question ? "Waiting for a person's answer (no worker holds the case meanwhile)…"
                          : "Waiting for a person's review (no worker holds the case meanwhile)…", false);
      section(event.attempt).append(waitingCard(event, caseId, !TERMINAL_STATUSES.has(view.status)));
    } else if (event.eventType === "CASE_REVIEWED") {
      reviewers.push(p.reviewer.subject);
      setFact("f-decided", `${p.verdict} by ${reviewerText(p.reviewer)}`);
      const form = document.querySelector("form.review");
      if (form) form.replaceWith(el("p", { class: "muted", text: `Reviewed by ${p.reviewer.subject}.` }));
      section(event.attempt).append(reviewedCard(event));
    } else if (TERMINAL.has(event.eventType)) {
      ended = true;
      setFact("f-status", statusBadge(STATUS_OF_EVENT[event.eventType]));
      setFact("f-decision", decisionBadge(p.answer && p.answer.decision));
      if (p.answer) summary.replaceChildren(...decisionSummary(p.answer));
      if (p.checks && p.checks.length) setFact("f-checks", checksSummary(p.checks));
      if (p.decidedBy) {
        setFact("f-decided", p.decidedBy === "reviewer" && reviewers.length
          ? `reviewer: ${reviewers.join(", ")}` : p.decidedBy);
      }
      section(event.attempt).append(terminalCard(event));
    } else if (event.eventType === "CASE_ERASED") {
      timeline.append(el("p", { class: "muted", text: `Sensitive values erased by ${p.erasedBy}` }));
    } else if (event.eventType === "CASE_HELD") {
      timeline.append(el("p", { class: "muted", text: `Legal hold placed by ${p.placedBy}: ${p.reason}` }));
    } else if (event.eventType === "CASE_RELEASED") {
      timeline.append(el("p", { class: "muted", text: p.releasedBy.length
        ? `Legal hold released by ${p.releasedBy.join(" and ")}` : "Legal hold ended" }));
    } else {  // a type with no card of its own: its type and payload, as recorded
      section(event.attempt).append(el("article", { class: "card", id: `e-${event.attempt}-${event.seq}` },
        el("header", {}, el("strong", { text: event.eventType }), el("span", { text: when(event.occurredAt) })),
        el("details", {}, el("summary", { text: "Payload" }), el("pre", { text: json(p) }))));
    }
  };
  function showLive(text, pulsing) {
    live.replaceChildren(pulsing ? el("span", { class: "dot", "aria-hidden": "true" }) : "", text);
  }
  showLive("Following the case live…", true);
  let failures = 0;
  while (!ended) {
    try {
      await readStream(`/cases/${caseId}/stream`, lastId, onEvent, signal);
      failures = 0;
    } catch (exc) {
      if (signal.aborted) return;
      if (exc instanceof Unauthorized) throw exc;
      failures += 1;
      showLive(`Connection lost (${exc.message}); reconnecting…`, false);
      await new Promise((resolve) => setTimeout(resolve, Math.min(10000, 500 * 2 ** failures)));
    }
  }
  // The stream can be ahead of the record by a moment: wait for the stored case.
  let final = await api(`/cases/${caseId}`);
  for (let tries = 0; ["queued", "running"].includes(final.status) && tries < 20; tries += 1) {
    await new Promise((resolve) => setTimeout(resolve, 250));
    final = await api(`/cases/${caseId}`);
  }
  if (signal.aborted) return;
  setFact("f-status", served(final, statusBadge(final.status)));
  setFact("f-decision", served(final, decisionBadge(final.answer && final.answer.decision)));
  setFact("f-cycles", String(final.cycles));
  setFact("f-tokens", `${final.tokenUsage.inputTokens} / ${final.tokenUsage.outputTokens}`);
  setFact("f-attempts", String(final.attempts));
  setFact("f-integrity", integrityBadge(final.integrity));
  showLive(`Ended ${when(final.endedAt)}.`, false);
  if (stopping) stopping.remove();
  download.classList.remove("pending");
  reportDownload.classList.remove("pending");
  if (final.integrity && !final.integrity.verified) await showProblems(caseId, problems, signal);
  await showLogged(caseId, (value) => setFact("f-logged", value), signal);
}

// Cancel a case that has not ended (scope cases:cancel): it stops before its next model
// call, or at once when it waits for a person; the trail records who cancelled it.
const mayCancel = () => Boolean(identity && ["cases:cancel", "admin"].some((s) => identity.scopes.includes(s)));
function cancelButton(caseId) {
  const button = el("button", { type: "button", class: "danger", text: "Cancel case" });
  button.addEventListener("click", async () => {
    if (!window.confirm("Cancel this case? It stops before its next model call; the trail records that you cancelled it.")) return;
    button.disabled = true;
    try {
      await api(`/cases/${caseId}/cancel`, { reason: "cancelled in the trail viewer" });
      button.textContent = "Cancelling…";
    } catch (exc) {
      if (exc instanceof Unauthorized) { fail(exc); return; }
      button.disabled = false;
      button.textContent = `Cancel case (${exc.message})`;
    }
  });
  return button;
}

// The offline evidence: the events exactly as signed and the keys, for
// `casetrail verify-bundle` or docs/verify_bundle.py. Fetched with the key in the
// header (never in a URL) and saved from memory. Shown once the case has ended.
function bundleButton(caseId) {
  return downloadButton("Download evidence bundle", `/cases/${caseId}/bundle`,
                        `case-${caseId}.bundle.json`, "The bundle");
}

// The case report: one PDF with the decision first and the bundle attached.
function reportButton(caseId) {
  return downloadButton("Download report (PDF)", `/cases/${caseId}/report`,
                        `casetrail-${caseId}.pdf`, "The report");
}

function downloadButton(label, path, filename, what) {
  const button = el("button", { type: "button", text: label });
  const problem = el("span", { class: "error", role: "alert", hidden: true });
  button.addEventListener("click", async () => {
    button.disabled = true;
    problem.hidden = true;
    try {
      const response = await fetch(path, { headers: authHeaders() });
      if (response.status === 401) throw new Unauthorized();
      if (!response.ok) throw new Error(`${what} could not be made (${response.status}).`);
      const url = URL.createObjectURL(await response.blob());
      const save = el("a", { href: url, download: filename, hidden: true });
      document.body.append(save);
      save.click();
      save.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
    } catch (exc) {
      if (exc instanceof Unauthorized) {
        fail(exc);
        return;
      }
      problem.textContent = exc.message;
      problem.hidden = false;
    } finally {
      button.disabled = false;
    }
  });
  return el("span", { class: "pending" }, button, " ", problem);
}

// What the server's check of the trail found wrong, each problem also marked on the
// event it names, so a reviewer sees which cycle was altered or is missing.
async function showProblems(caseId, box, signal) {
  const report = await api(`/cases/${caseId}/verify`);
  if (signal.aborted || report.verified) return;
  const items = report.problems.map((problem) => {
    const where = problem.seq === null || problem.seq === undefined ? "the record"
      : `attempt ${problem.attempt}, event ${problem.seq}`;
    const card = document.getElementById(`e-${problem.attempt}-${problem.seq}`);
    if (card) {
      card.classList.add("tampered");
      card.setAttribute("tabindex", "-1");
      card.append(el("p", { class: "problem", text: `${problem.code}: ${problem.message}` }));
    }
    return el("li", {},
      card ? el("button", { type: "button", class: "link", text: where,
                            onclick: () => { card.scrollIntoView({ block: "center" }); card.focus(); } })
           : where,
      ` — ${problem.code}: ${problem.message}`);
  });
  box.replaceChildren(el("h2", { text: "This trail does not verify" }), el("ul", {}, items));
  box.hidden = false;
}

// --- the transparency log ---------------------------------------------------------
// The decision's event (the terminal one: its chain hash covers every event before it
// in the attempt) is looked up in the log, and its inclusion proof is checked here,
// in the browser: a leaf of the recorded event's hash, a path to the checkpoint's
// root hash (RFC 9162, 2.1.3.2). The checkpoint's signatures are checked by witnesses
// and by `casetrail verify-bundle`.
const fromBase64 = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
const fromHex = (hex) => Uint8Array.from(hex.match(/../g) || [], (pair) => parseInt(pair, 16));

async function sha256(...parts) {
  const joined = new Uint8Array(parts.reduce((n, part) => n + part.length, 0));
  let at = 0;
  for (const part of parts) {
    joined.set(part, at);
    at += part.length;
  }
  return new Uint8Array(await crypto.subtle.digest("SHA-256", joined));
}

async function provesInclusion(leafData, index, size, path, root) {
  if (!(index >= 0 && index < size)) return false;
  const half = (n) => Math.floor(n / 2);
  let fn = index;
  let sn = size - 1;
  let r = await sha256(Uint8Array.of(0), leafData);
  for (const sibling of path) {
    if (sn === 0) return false;
    if (fn % 2 === 1 || fn === sn) {
      r = await sha256(Uint8Array.of(1), sibling, r);
      while (fn % 2 === 0 && fn !== 0) { fn = half(fn); sn = half(sn); }
    } else {
      r = await sha256(Uint8Array.of(1), r, sibling);
    }
    fn = half(fn);
    sn = half(sn);
  }
  return sn === 0 && r.length === root.length && r.every((byte, i) => byte === root[i]);
}

async function showLogged(caseId, setLogged, signal) {
  try {
    // The terminal event as recorded, with its chain hash: the proof must be of that hash.
    const { events } = await api(`/cases/${caseId}/events?types=${[...TERMINAL].join(",")}`);
    const decided = events.at(-1);
    if (signal.aborted || !decided || !decided.integrity) return;
    await lookUpLogged(decided.integrity.hash, setLogged, signal);
  } catch (exc) {
    if (!signal.aborted) setLogged(badge("log unavailable", "warn"));
  }
}

async function lookUpLogged(eventHash, setLogged, signal) {
  let response;
  for (let tries = 0; ; tries += 1) {
    // Looked up by the hash the trail shows (public: it tells nothing to whoever
    // lacks the hash), then checked against that hash here.
    response = await fetch(`/ledger/leaves/${eventHash}/proof`, { signal });
    if (signal.aborted) return;
    if (response.status !== 404) break;
    // Checkpoints are made every few seconds: look again for a while.
    setLogged(badge("not in the log yet", "info"));
    if (tries >= 20) return;
    await new Promise((resolve) => setTimeout(resolve, 3000));
  }
  if (!response.ok) {
    setLogged(badge(`log unavailable (${response.status})`, "warn"));
    return;
  }
  const proof = await response.json();
  const lines = proof.checkpoint.split("\n");
  const origin = lines[0];
  const witnesses = lines.filter((line) => line.startsWith("\u2014 ") &&
                                           line.split(" ")[1] !== origin).length;
  const where = `in checkpoint ${proof.treeSize.toLocaleString()} at leaf ` +
    `${proof.leafIndex.toLocaleString()}; ${witnesses} witness${witnesses === 1 ? "" : "es"}`;
  if (!globalThis.crypto || !crypto.subtle) {  // not a secure context (plain HTTP)
    setLogged(el("span", {}, badge("in the log", "info"), ` ${where}; proof not checked ` +
                  "here (needs HTTPS)"));
    return;
  }
  const holds = proof.eventHash === eventHash &&
    await provesInclusion(fromHex(eventHash), proof.leafIndex,
                          proof.treeSize, proof.proof.map(fromBase64), fromBase64(lines[2]));
  if (signal.aborted) return;
  setLogged(holds ? el("span", { title: "The inclusion proof was checked in this browser" },
                       badge("proof checks", "ok"), ` ${where}`)
                  : badge("inclusion proof does not check", "bad"));
}

function integrityBadge(integrity) {
  if (!integrity) return badge("unknown", "none");
  if (!integrity.verified) return badge("does not verify", "bad");
  return integrity.complete ? badge("verified, complete", "ok") : badge("verified so far", "info");
}

// --- routing --------------------------------------------------------------------
function fail(exc) {
  if (exc instanceof Unauthorized) {
    sessionStorage.removeItem(KEY);
    signInPage("Your key is no longer accepted; sign in again.");
    return;
  }
  display(el("p", { class: "error", role: "alert", text: `Could not load: ${exc.message}` }));
}

let leaving = new AbortController();

function route() {
  leaving.abort();  // stops the previous page's stream
  leaving = new AbortController();
  if (!sessionStorage.getItem(KEY)) {
    signInPage();
    return;
  }
  document.getElementById("signout").hidden = false;
  if (!document.getElementById("who").textContent) {
    api("/me").then(showWho, () => { /* the page's own requests report the problem */ });
  }
  const match = location.pathname.match(/^\/ui\/cases\/([0-9a-f-]{36})$/);
  const backtest = location.pathname.match(/^\/ui\/backtests\/([0-9a-f-]{36})$/);
  const signal = leaving.signal;
  main.setAttribute("aria-busy", "true");
  const ui = { el, api, show, badge, decisionBadge, when, cycleCard, json, downloadButton };
  const page = match ? casePage(match[1], signal)
    : backtest ? backtestPage(backtest[1], signal, ui)
    : location.pathname === "/ui/backtests" ? backtestsPage(signal, ui)
    : location.pathname === "/ui/reviews" ? reviewsPage(signal) : listPage(signal);
  page.catch((exc) => signal.aborted || fail(exc));
}

document.getElementById("signout").addEventListener("click", signOut);
window.addEventListener("popstate", route);
route();
