"""What a case operation refuses, by kind: each front says it in its own way (the API
as an RFC 9457 problem with its status, service/api/problems.py; the CLI as a message
and an exit code)."""

from __future__ import annotations

from dataclasses import dataclass

from casetrail.errors import CasetrailError


class CaseProblem(CasetrailError):
    """An operation refused, with the reason in words (``detail``)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NotFound(CaseProblem):
    """No such case for this caller (another tenant's case is not found either)."""


class Expired(NotFound):
    """The case expired under its retention policy: its events and row are gone; its
    ``CASE_EXPIRED`` and tombstone remain (``verify`` checks them)."""


class NotInstalled(CaseProblem):
    """What was asked needs an optional part of casetrail this deployment lacks (the
    detail names it: ``casetrail.extras``)."""


class Conflict(CaseProblem):
    """Refused by the case's state or by an earlier request."""


class NotYet(Conflict):
    """Not ready yet, and will be without anybody doing anything: ask again (409 with
    Retry-After)."""

    retry_after = 2


class Forbidden(CaseProblem):
    """The caller lacks a scope this use needs (named)."""


@dataclass(frozen=True)
class Issue:
    """One invalid field: where (``loc``, as in the request: body, query, header) and
    why."""

    loc: tuple[str | int, ...]
    msg: str


class Invalid(CaseProblem):
    """Fields that are not acceptable, each with the reason."""

    def __init__(self, *issues: Issue) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, i.loc))}: {i.msg}" for i in issues))
        self.issues = issues


class OverQuota(CaseProblem):
    """The tenant's quota is used up: ``retry_after`` seconds until it may try again."""

    def __init__(self, detail: str, retry_after: int) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class NotAccepted(CaseProblem):
    """The broker did not accept a case's start command; nothing was kept."""
