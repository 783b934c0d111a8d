"""A backtest's report for the validation file: one PDF from the backtest's bundle alone
(service/audit/backtest_record.py) and the verdict on it, so it says nothing the signed
record does not: what was run (the champion's and challenger's digests, the model, the
selection, the tool-answer policy), the decision matrix, the agreement with the
reviewers, the cases whose decision changed, then integrity and how to verify it. The
bundle is attached and its SHA-256 printed, as in a case's report (service/audit/report.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from casetrail.audit.report import Pages, bundle_bytes

CHANGED_SHOWN = 300
"""Changed cases listed one a line; the bundle holds every result."""


def render_backtest(bundle: Mapping[str, Any], verdict: Mapping[str, Any]) -> tuple[bytes, str]:
    """The report's PDF and the SHA-256 of the bundle it embeds."""
    attached = bundle_bytes(bundle)
    digest = hashlib.sha256(attached).hexdigest()
    backtest_id = str(bundle["backtestId"])
    signed = orjson.loads(bundle["record"]["body"])
    summary, challenger, selection = signed["summary"], signed["challenger"], \
        signed["selection"]
    model = challenger["model"]
    pdf = Pages(backtest_id, "backtest report")
    pdf.alias_nb_pages()
    pdf.add_page()
    pdf.heading("Backtest report", 17)
    pdf.para(backtest_id, mono=True)
    pdf.facts([
        ("Agent (champion)", f"{signed['agent']}; decided with agentDigest "
         + (", ".join(signed["championDigests"]) or "—")),
        ("Challenger", f"{challenger['agent']} {challenger['version']}, agentDigest "
         f"{challenger['agentDigest']}"),
        ("Model", f"{model['provider']}/{model['name']}"
         + (f" at {model['endpoint']}" if model.get("endpoint") else "")),
        ("Selection", _selection(selection)),
        ("Tool answers", f"{signed['toolPolicy']}: a worker tool call the record does not "
         "hold is refused, counted"),
        ("Asked by", f"{signed['requestedBy']} at {signed['requestedAt']}"),
        ("Run", f"{signed['startedAt']} to {signed['finishedAt']} ({signed['seconds']} s)"
         + (f"; stopped early: {signed['stopped']}" if signed.get("stopped") else "")),
    ])
    pdf.heading("Outcomes")
    agreed = summary["agreementWithReviewers"]
    pdf.facts([
        ("Cases", f"{summary['cases']:,}"),
        ("Decision changed", f"{len(summary['changed']):,}"),
        ("Reviewed (labelled)", f"{summary['reviewed']:,}: a person's final decision"),
        ("Agreement, champion", _share(agreed["champion"])),
        ("Agreement, challenger", _share(agreed["challenger"])),
        ("Calls not in record", f"{summary['unansweredCalls']:,}"),
        ("Challenger's tokens", f"{summary['tokens']:,}"),
    ])
    pdf.heading("Decision matrix (champion → challenger)", 11)
    for cell in summary["matrix"]:
        pdf.para(f"{cell['champion']:>14} → {cell['challenger']:<14} {cell['cases']:>7,}",
                 mono=True)
    _changed(pdf, bundle["results"])
    pdf.heading("Integrity and where to verify it")
    pdf.facts([
        ("Record", ("verified" if verdict.get("verified") else "DOES NOT VERIFY")
         + f"; hash {bundle['record']['integrity']['hash']}"),
        ("Signed by key", str(bundle["record"]["integrity"]["keyId"])),
        ("Transparency log", "a leaf of the kind backtest, with its proof" if
         bundle["record"].get("logProof") else "not yet in a checkpoint"),
    ])
    for problem in (verdict.get("problems") or [])[:20]:
        pdf.para(f"problem: {problem}", size=8.5)
    pdf.attached(f"casetrail-backtest-{backtest_id}.json", digest,
                 "(KEY: the operator's signing public key; --trust-log for the log's key). "
                 "It checks the record's signature, every per-case result against the digest "
                 "the record names, and the record's place in the log.")
    pdf.embed_file(bytes=attached, basename=f"casetrail-backtest-{backtest_id}.json",
                   mime_type="application/json",
                   desc=f"The backtest's bundle (SHA-256 {digest})")
    return bytes(pdf.output()), digest


def _selection(selection: Mapping[str, Any]) -> str:
    parts = [f"{selection['selected']:,} decided cases"]
    if selection.get("since") or selection.get("until"):
        parts.append(f"created {selection.get('since') or '…'} to {selection.get('until') or '…'}")
    if selection.get("casesListed"):
        parts.append(f"from a list (SHA-256 {selection['casesListed']})")
    parts.append(f"at most {selection['limit']:,}")
    left_out = selection.get("leftOut") or []
    if left_out:
        parts.append(f"{len(left_out):,} left out, their record not verifying: "
                     + ", ".join(f"{left['caseId']} ({left['why']})" for left in left_out[:20])
                     + (f", … {len(left_out) - 20:,} more" if len(left_out) > 20 else ""))
    return "; ".join(parts)


def _share(value: float | None) -> str:
    return "no reviewed case" if value is None else f"{value:.1%}"


def _changed(pdf: Pages, results: list[dict[str, Any]]) -> None:
    changed = [r for r in results if r.get("changed")]
    pdf.heading(f"Cases whose decision changed ({len(changed):,})", 11)
    for result in changed[:CHANGED_SHOWN]:
        label = f", reviewer {result['label']}" if result.get("label") else ""
        fields = ", ".join(result.get("changedFields") or [])
        pdf.para(f"{result['caseId']}  {result['champion']} → {result['challenger']}{label}"
                 + (f"  [{fields}]" if fields else ""), mono=True, size=8)
    if len(changed) > CHANGED_SHOWN:
        pdf.para(f"… and {len(changed) - CHANGED_SHOWN:,} more: every result is in the "
                 "attached bundle.")
    problems = [r for r in results if r.get("problem")]
    if problems:
        pdf.heading(f"Cases the challenger could not decide ({len(problems):,})", 11)
        for result in problems[:50]:
            pdf.para(f"{result['caseId']}: {result['problem']}", size=8.5)
