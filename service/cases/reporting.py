"""The case report (``GET /cases/{id}/report``, ``casetrail report``): one PDF per case,
made from the case's evidence bundle and the verdict on it (service/audit/report.py). A
report is an export: logged like one, sensitive values in clear only for ``pii:read``.
Rendering is CPU work: it runs off the event loop, a few at once, and beyond that the
caller is told to come back (429 with Retry-After)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from casetrail.adapters.store import principal_names
from casetrail.cases.errors import NotInstalled, OverQuota
from casetrail.cases.reading import case_view, checked, owned, sensitive_values
from casetrail.cases.services import CaseServices
from casetrail.contract.auth import Principal
from casetrail.extras import missing

RENDERING_AT_ONCE = 2
"""Reports rendered at once per API process (each takes a core while it renders)."""
_rendering = asyncio.BoundedSemaphore(RENDERING_AT_ONCE)


@dataclass(frozen=True)
class Report:
    pdf: bytes
    bundle_sha256: str
    """SHA-256 of the evidence bundle the PDF embeds (and prints)."""


async def report(services: CaseServices, principal: Principal, case_id: uuid.UUID) -> Report:
    """The case's report. ``OverQuota`` while ``RENDERING_AT_ONCE`` others render;
    ``NotInstalled`` without casetrail's optional part ``pdf``."""
    await owned(services, principal, case_id)
    if why := missing("pdf"):
        raise NotInstalled(why)
    from casetrail.audit.report import render
    if _rendering.locked():
        raise OverQuota(f"{RENDERING_AT_ONCE} reports are being rendered; try again shortly",
                        retry_after=2)
    async with _rendering:
        row, verdict = await checked(services, principal, case_id)
        bundle = await services.evidence.bundle(case_id, row)
        assert bundle is not None  # the case exists
        values, _ = await sensitive_values(services, principal, row)
        view = case_view(row)
        view["startedByName"] = (await principal_names(services.pool, [row["started_by"]])
                                 ).get(row["started_by"])
        await services.secrets.log_access(principal.subject, row["tenant_id"], case_id,
                                          "export")
        pdf, digest = await asyncio.to_thread(render, bundle, verdict.as_json(), view, values)
    return Report(pdf, digest)
