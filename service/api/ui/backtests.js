// casetrail viewer: backtests (docs/backtests.md). The list of a tenant's backtests,
// one backtest's comparison (what was run, the decision matrix, agreement with the
// reviewers, the changed cases), and one changed case side by side: the champion's
// recorded trail and the challenger's run. Every value is written as text, as in app.js,
// whose helpers come in as `ui`.

const STATE_TONE = { queued: "none", running: "info", done: "ok", failed: "bad" };
// A download offered at once (app.js shows a case's only once it has ended).
const ready = (node) => { node.classList.remove("pending"); return node; };
const share = (value) => (value === null || value === undefined ? "no reviewed case"
  : `${(value * 100).toFixed(1)} %`);

export async function backtestsPage(signal, ui) {
  const { el, api, show, badge, when } = ui;
  const { backtests } = await api("/backtests?limit=100");
  const body = el("tbody", {}, backtests.map((b) => el("tr", { "data-backtest-id": b.backtestId },
    el("td", {}, el("a", { class: "id", href: `/ui/backtests/${b.backtestId}` },
                    el("code", { text: b.backtestId.slice(0, 8) }))),
    el("td", { text: b.agent }),
    el("td", { text: b.request.challenger || b.agent }),
    el("td", {}, badge(b.status, STATE_TONE[b.status])),
    el("td", { class: "num", text: `${b.progress.done} / ${b.progress.selected ?? "…"}` }),
    el("td", { class: "wide", text: b.requestedBy }),
    el("td", { text: when(b.requestedAt) }))));
  if (!backtests.length) {
    body.append(el("tr", {}, el("td", { colspan: 7, class: "empty", text: "No backtest yet." })));
  }
  show(signal, el("p", { class: "muted" }, el("a", { href: "/ui/", text: "← All cases" })),
       el("h1", { text: "Backtests" }),
       el("p", { class: "muted", text: "A challenger (an installed agent version) run over " +
         "recorded cases, its tool calls answered from the record; each one kept as a signed " +
         "record in the transparency log. Start one with POST /backtests or casetrail backtest." }),
       el("table", { class: "cases backtests" },
         el("thead", {}, el("tr", {}, ["Backtest", "Agent", "Challenger", "Status", "Cases",
           "Asked by", "Asked"].map((h) => el("th", { scope: "col", text: h })))),
         body));
}

export async function backtestPage(backtestId, signal, ui) {
  const { el, api, show } = ui;
  let view = await api(`/backtests/${backtestId}`);
  while ((view.status === "queued" || view.status === "running") && !signal.aborted) {
    show(signal, ...heading(view, ui), el("p", { class: "live", role: "status",
      text: `${view.status}: ${view.progress.done} of ${view.progress.selected ?? "…"} cases` }));
    await new Promise((resolve) => setTimeout(resolve, 1000));
    view = await api(`/backtests/${backtestId}`);
  }
  const wanted = new URLSearchParams(location.search).get("case");
  const picked = wanted && (view.results || []).find((r) => r.caseId === wanted);
  if (picked) {
    const recorded = await api(`/cases/${picked.caseId}/events?types=REACT_CYCLE`);
    show(signal, ...sideBySide(view, picked, recorded.events, ui));
    return;
  }
  show(signal, ...heading(view, ui), ...(view.status === "done" ? comparison(view, ui)
    : [el("p", { class: "error", role: "alert", text: `Failed: ${view.problem || "?"}` })]));
}

function heading(view, ui) {
  const { el, badge } = ui;
  const challenger = view.challenger;
  const facts = [
    ["Agent", view.agent],
    ["Challenger", challenger ? `${challenger.agent} ${challenger.version}`
      : view.request.challenger || view.agent],
    ["Model", challenger ? `${challenger.model.provider} / ${challenger.model.name}` : "—"],
    ["Status", badge(view.status, STATE_TONE[view.status])],
    ["Asked by", view.requestedBy],
    ["Record", view.record ? el("code", { text: view.record.hash.slice(0, 16),
                                          title: view.record.hash }) : "—"],
  ];
  return [
    el("p", { class: "muted" }, el("a", { href: "/ui/backtests", text: "← All backtests" })),
    el("h1", { text: `Backtest of ${view.agent}` }),
    el("p", { class: "id muted", text: `backtest ${view.backtestId}` }),
    el("dl", { class: "facts" }, facts.map(([label, value]) =>
      el("div", {}, el("dt", { text: label }), el("dd", {}, value)))),
  ];
}

function comparison(view, ui) {
  const { el, decisionBadge, downloadButton } = ui;
  const s = view.summary;
  const decisions = [...new Set(s.matrix.flatMap((m) => [m.champion, m.challenger]))].sort();
  const count = (a, b) => (s.matrix.find((m) => m.champion === a && m.challenger === b) || {}).cases || 0;
  const matrix = el("table", { class: "matrix", "aria-label": "Decision matrix" },
    el("caption", { text: "Champion (rows) by challenger (columns)" }),
    el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "" }),
      decisions.map((d) => el("th", { scope: "col" }, decisionBadge(d))))),
    el("tbody", {}, decisions.map((a) => el("tr", {}, el("th", { scope: "row" }, decisionBadge(a)),
      decisions.map((b) => el("td", { class: `num${a === b ? " same" : count(a, b) ? " moved" : ""}`,
                                      "data-cell": `${a}>${b}`, text: count(a, b) }))))));
  const changed = view.results.filter((r) => r.changed);
  const rows = changed.map((r) => el("tr", { "data-case-id": r.caseId },
    el("td", {}, el("a", { class: "id", href: `/ui/backtests/${view.backtestId}?case=${r.caseId}`,
                           title: r.caseId }, el("code", { text: r.caseId.slice(0, 8) }))),
    el("td", {}, decisionBadge(r.champion)), el("td", {}, decisionBadge(r.challenger)),
    el("td", {}, r.label ? decisionBadge(r.label) : el("span", { class: "muted", text: "—" })),
    el("td", { text: r.changedFields.join(", ") }),
    el("td", {}, el("a", { href: `/ui/cases/${r.caseId}`, text: "recorded trail" }))));
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 6, class: "empty", text: "No decision changed." })));
  return [
    el("dl", { class: "facts outcomes" }, [
      ["Cases", s.cases.toLocaleString("en")], ["Decision changed", String(s.changed.length)],
      ["Reviewed", String(s.reviewed)], ["Agreement, champion", share(s.agreementWithReviewers.champion)],
      ["Agreement, challenger", share(s.agreementWithReviewers.challenger)],
      ["Calls not in the record", String(s.unansweredCalls)], ["Tokens", s.tokens.toLocaleString("en")],
    ].map(([label, value]) => el("div", {}, el("dt", { text: label }), el("dd", { text: value })))),
    el("p", { class: "head-actions" },
      ready(downloadButton("Download report (PDF)", `/backtests/${view.backtestId}/report`,
                           `casetrail-backtest-${view.backtestId}.pdf`, "The report")), " ",
      ready(downloadButton("Download evidence bundle", `/backtests/${view.backtestId}/bundle`,
                           `casetrail-backtest-${view.backtestId}.json`, "The bundle"))),
    el("h2", { text: "Decision matrix" }), matrix,
    el("h2", { text: "Cases whose decision changed" }),
    el("table", { class: "cases changed" },
      el("thead", {}, el("tr", {}, ["Case", "Champion", "Challenger", "Reviewer", "Fields that differ", ""]
        .map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, rows)),
  ];
}

function sideBySide(view, result, recorded, ui) {
  const { el, decisionBadge, cycleCard, json } = ui;
  const fields = new Set(result.changedFields);
  const answer = (value) => el("table", { class: "answer-fields" }, el("tbody", {},
    Object.entries(value || {}).map(([k, v]) => el("tr", { class: fields.has(k) ? "differs" : "", "data-field": k },
      el("th", { scope: "row", text: k }), el("td", {}, el("code", { text: json(v) }))))));
  const run = (result.run || []).map((payload, i) => cycleCard({ payload, attempt: "c", seq: i }));
  return [
    el("p", { class: "muted" }, el("a", { href: `/ui/backtests/${view.backtestId}`, text: "← The backtest" })),
    el("h1", {}, "Case ", el("code", { text: result.caseId.slice(0, 8) }), ": ",
       decisionBadge(result.champion), " → ", decisionBadge(result.challenger)),
    el("p", { class: "muted" }, el("a", { href: `/ui/cases/${result.caseId}`, text: "The recorded trail" }),
       result.label ? ` · a reviewer decided ${result.label}` : ""),
    el("div", { class: "side-by-side" },
      el("section", { "aria-label": "Champion (recorded)" }, el("h2", { text: "Champion, as recorded" }),
        answer(result.answers.champion), recorded.map(cycleCard)),
      el("section", { "aria-label": "Challenger" }, el("h2", { text: "Challenger, in the backtest" }),
        answer(result.answers.challenger), run)),
  ];
}
