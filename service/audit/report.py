"""A case report: one PDF per case for the file, an auditor's reading of the record.

Rendered from the case's evidence bundle alone (the signed event bodies, the keys, the
log's proofs) and the verdict on it, so the report says nothing the record does not:
the decision first (decided by whom, why, the checks, the reviews), then integrity and
the transparency log, how to verify it, and every cycle with its tool calls. The bundle
is embedded as a file attachment, and its SHA-256 is printed: the report's claims can
be checked offline with ``casetrail verify-bundle`` against that very file. A bundle made
at another moment differs (it carries its export time and the latest checkpoint).

No I/O but the fonts: DejaVu (Debian's ``fonts-dejavu-core``) for all of Unicode, else
the PDF core fonts with characters beyond Latin-1 replaced. fpdf2 writes the PDF.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from fpdf import FPDF
from fpdf.enums import WrapMode, XPos, YPos

from casetrail.audit.rendering import answered_by
from casetrail.contract.events import TERMINAL_EVENT_TYPES
from casetrail.engine.tools import without_bytes
from casetrail.ledger.note import Checkpoint, Note, NoteError
from casetrail.privacy.sensitive import restore

FONTS = Path("/usr/share/fonts/truetype/dejavu")
MAX_JSON = 4000
"""Characters of one argument or result shown; the bundle holds it whole."""


def bundle_bytes(bundle: Mapping[str, Any]) -> bytes:
    """The attached bundle's bytes, as ``GET /cases/{id}/bundle`` writes them."""
    return orjson.dumps(bundle)


class Pages(FPDF):
    def __init__(self, case_id: str, kind: str = "case report") -> None:
        super().__init__(format="A4")
        self.case_id, self.kind = case_id, kind
        self.unicode = (FONTS / "DejaVuSans.ttf").exists()
        if self.unicode:
            self.add_font("Sans", "", FONTS / "DejaVuSans.ttf")
            self.add_font("Sans", "B", FONTS / "DejaVuSans-Bold.ttf")
            self.add_font("Mono", "", FONTS / "DejaVuSansMono.ttf")
        self.set_auto_page_break(True, margin=15)
        self.set_title(f"casetrail {kind} {case_id}")
        self.set_creator("casetrail")

    def face(self, style: str = "", size: float = 9.5, mono: bool = False) -> None:
        if self.unicode:
            self.set_font("Mono" if mono else "Sans", "" if mono else style, size)
        else:
            self.set_font("courier" if mono else "helvetica", style, size)

    def text_of(self, text: str) -> str:
        return text if self.unicode else text.encode("latin-1", "replace").decode("latin-1")

    def footer(self) -> None:
        self.set_y(-10)
        self.face(size=7.5)
        self.set_text_color(110)
        self.cell(0, 5, self.text_of(f"casetrail {self.kind} · {self.case_id} · page "
                                     f"{self.page_no()}/{{nb}}"), align="C")
        self.set_text_color(0)

    def heading(self, text: str, size: float = 12.5) -> None:
        self.ln(2)
        self.face("B", size)
        self.multi_cell(0, 6.5, self.text_of(text), new_x=XPos.LMARGIN, new_y=YPos.NEXT)
        self.face()

    def para(self, text: str, *, mono: bool = False, size: float = 9.5) -> None:
        self.face(size=size, mono=mono)
        self.multi_cell(0, 4.6 if not mono else 4.0, self.text_of(text),
                        new_x=XPos.LMARGIN, new_y=YPos.NEXT, align="L",
                        wrapmode=WrapMode.CHAR if mono else WrapMode.WORD)
        self.face()

    def attached(self, filename: str, digest: str, how: str) -> None:
        """Where the bundle a report was made from is, its SHA-256, how to check it."""
        self.para(f"The bundle this report was made from is attached to this PDF as "
                  f"{filename}. Its SHA-256:")
        self.para(digest, mono=True)
        self.para("Check it offline (no database, no broker): save the attachment, then "
                  f"`casetrail verify-bundle {filename} --trust KEY` {how}")

    def facts(self, rows: list[tuple[str, str]]) -> None:
        for label, value in rows:
            self.face("B")
            self.cell(42, 5, self.text_of(label))
            self.face()
            self.multi_cell(0, 5, self.text_of(value), new_x=XPos.LMARGIN, new_y=YPos.NEXT,
                            align="L")


def _json(value: Any) -> str:
    text = orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    return text if len(text) <= MAX_JSON else text[:MAX_JSON] + "\n… (shortened here; whole "\
        "in the attached bundle)"


def render(bundle: Mapping[str, Any], verdict: Mapping[str, Any], case: Mapping[str, Any],
           values: Mapping[str, str] | None = None) -> tuple[bytes, str]:
    """The report's PDF and the SHA-256 of the bundle it embeds. ``bundle`` as
    ``Evidence.bundle`` makes it; ``verdict`` as ``GET /cases/{id}/verify`` says it;
    ``case``: the case view (who started it, by name); ``values``: the sensitive values
    to show in clear (only for a reader with ``pii:read``), else placeholders stay."""
    attached = bundle_bytes(bundle)
    digest = hashlib.sha256(attached).hexdigest()
    case_id = str(bundle["caseId"])
    events = [restore(orjson.loads(e["body"]), values or {}) for e in bundle["events"]
              if e.get("body")]
    started = next((e for e in events if e["eventType"] == "CASE_STARTED"), None)
    ends = [e for e in events if e["eventType"] in TERMINAL_EVENT_TYPES]
    end = ends[-1] if ends else None
    waits = [e for e in events if e["eventType"] == "CASE_AWAITING_REVIEW"]
    pdf = Pages(case_id)
    pdf.alias_nb_pages()
    pdf.add_page()
    pdf.heading("Case report", 17)
    pdf.para(case_id, mono=True)
    payload = (end or (waits[-1] if waits else {})).get("payload", {})
    answer = payload.get("answer") if isinstance(payload.get("answer"), dict) else None
    first = started["payload"] if started else {}
    pdf.facts([
        ("Agent", f"{bundle['case']['agent']} {first.get('agentVersion', '')}".strip()),
        ("Tenant", str(bundle.get("tenantId", ""))),
        ("Started by", str(case.get("startedByName") or first.get("startedBy") or "—")),
        ("Status", str(bundle["case"]["status"]).replace("_", " ")),
        ("Started", str(started["occurredAt"]) if started else "—"),
        ("Ended", str(end["occurredAt"]) if end else "not ended"),
        ("Report made", str(bundle.get("exportedAt", ""))),
    ])
    _decision(pdf, payload, answer, end)
    _reviews(pdf, events, waits)
    pdf.heading("Integrity and where to verify it")
    problems = verdict.get("problems") or []
    pdf.facts([
        ("Trail", ("verified" if verdict.get("verified") else "DOES NOT VERIFY") +
         (", complete" if verdict.get("complete") else ", not complete")),
        ("Events", str(len(events))),
        ("Transparency log", _logged(bundle)),
        ("Signing keys", ", ".join(str(k.get("keyId")) for k in bundle.get("keys") or [])
         or "—"),
    ])
    for problem in problems[:20]:
        pdf.para(f"problem: {problem}", size=8.5)
    pdf.attached(f"casetrail-{case_id}.bundle.json", digest,
                 "(KEY: the operator's signing public key), or docs/verify_bundle.py. A "
                 "bundle exported at another moment differs: it carries its export time and "
                 "the latest checkpoint.")
    pdf.heading("The record, event by event")
    for event in events:
        _event(pdf, event)
    pdf.embed_file(bytes=attached, basename=f"casetrail-{case_id}.bundle.json",
                   mime_type="application/json",
                   desc=f"The evidence bundle (SHA-256 {digest})")
    return bytes(pdf.output()), digest


def _decision(pdf: Pages, payload: Mapping[str, Any], answer: Mapping[str, Any] | None,
              end: Mapping[str, Any] | None) -> None:
    """The decision first: what, by whom, why, and the agent's checks."""
    pdf.heading("Decision")
    if answer is not None:
        pdf.facts([("Decision", str(answer.get("decision", "—"))),
                   ("Decided by", str(payload.get("decidedBy", "agent" if end else "—")))])
        if answer.get("rationale"):
            pdf.para(str(answer["rationale"]))
        if answer.get("reasonCodes"):
            pdf.para("Reason codes: " + ", ".join(map(str, answer["reasonCodes"])))
    elif end is not None:
        pdf.para(f"{end['eventType']}: {payload.get('reasonCode', '')} "
                 f"{payload.get('message', '')}".strip())
    else:
        pdf.para("No decision yet.")
    checks = payload.get("checks") or []
    if checks:
        pdf.heading("Checks", 11)
        for check in checks:
            verdict_text = "passed" if check.get("passed") else "FAILED"
            pdf.para(f"{verdict_text}  {check['name']} v{check['version']}"
                     f"{' (blocking)' if check.get('blocking') else ''}: {check.get('detail', '')}")


def _reviews(pdf: Pages, events: list[dict[str, Any]], waits: list[dict[str, Any]]) -> None:
    """Each wait for a person, and each person's review: who (as authenticated), what,
    why, when."""
    reviews = [e for e in events if e["eventType"] == "CASE_REVIEWED"]
    pdf.heading("Reviews", 11)
    if not reviews and not waits:
        pdf.para("No person reviewed this case; none was asked to.")
    for wait in waits:
        pdf.para(f"{wait['occurredAt']}: waited for a person ("
                 f"{', '.join(wait['payload'].get('reviewReasons', []))}).")
    for review in reviews:
        r = review["payload"]
        who = r["reviewer"]
        by = f"{who['subject']} (via {who['via']}" + (f" {who['keyId']}" if who.get(
            "keyId") else "") + (f", {who['name']}" if who.get("name") else "") + ")"
        decided = f" → {r['decision'].get('decision')}" if r.get("decision") else ""
        pdf.para(f"{r.get('reviewedAt', review['occurredAt'])}: {r['verdict']}{decided} by "
                 f"{by}. Reason: {r['reason']}")


def _logged(bundle: Mapping[str, Any]) -> str:
    log = bundle.get("log")
    proofs = sum(1 for e in bundle["events"] if e.get("logProof"))
    if not log:
        return "not in the log yet (the bundle carries no checkpoint)"
    try:
        note = Note.parse(str(log.get("checkpoint")))
        checkpoint = Checkpoint.parse(note.text)
    except NoteError as exc:
        return f"{proofs} event(s) with an inclusion proof; the checkpoint is unreadable: {exc}"
    signers = ", ".join(dict.fromkeys(s.name for s in note.signatures))
    return (f"{proofs} event(s) with an inclusion proof, in the checkpoint of tree size "
            f"{checkpoint.size:,} (log {checkpoint.origin}, root "
            f"{base64.b64encode(checkpoint.root).decode()}; signed by {signers})")


def _event(pdf: Pages, event: Mapping[str, Any]) -> None:
    p = event["payload"]
    kind = event["eventType"]
    pdf.heading(f"{event['attempt']}.{event['seq']}  {kind}  ({event['occurredAt']})", 10)
    if kind == "CASE_STARTED":
        model = p.get("model", {})
        pdf.para(f"model {model.get('provider')}/{model.get('name')}; restart reason "
                 f"{p.get('restartReason') or '—'}; tools offered: "
                 f"{', '.join(t.get('name', '?') for t in p.get('toolsOffered', []))}")
        pdf.para(_json(p.get("input")), mono=True, size=7.5)
    elif kind == "REACT_CYCLE":
        usage = p.get("tokenUsage", {})
        pdf.para(f"cycle {p.get('cycleIndex', 0) + 1}; tokens {usage.get('inputTokens')} in, "
                 f"{usage.get('outputTokens')} out")
        pdf.para(str(p.get("reasoningText") or "(no text)"))
        for call in p.get("toolCalls", []):
            pdf.face("B", 9)
            by = answered_by(call)
            pdf.multi_cell(0, 4.6, pdf.text_of(
                f"tool {call['toolName']} ({call.get('toolSource')}"
                + (f"; {by}" if by else "") + "), "
                f"{call.get('durationMs', '?')} ms" + (" — ERROR" if call.get("error") else "")),
                new_x=XPos.LMARGIN, new_y=YPos.NEXT)
            pdf.para("arguments " + _json(call.get("toolArgs")), mono=True, size=7.5)
            shown = call.get("error") if call.get("error") else without_bytes(
                call.get("toolResult"))
            pdf.para(("error " if call.get("error") else "result ") + _json(shown), mono=True,
                     size=7.5)
        if p.get("answer") is not None:
            pdf.para("answer " + _json(p["answer"]), mono=True, size=7.5)
    else:
        pdf.para(_json(p), mono=True, size=7.5)
