"""``casetrail archive verify``: an archive checked offline, with nothing but its files
and the keys the auditor trusts (docs/bundle.md, "Archives").

Each manifest must be signed by a trusted signing key and list files that are there
with the digest it names; each bundle must verify as ``verify-bundle`` checks one
(its log proofs against the log's checkpoint, with ``--trust-log``); a bundle file no
manifest lists is reported too (written by a pass that crashed before its manifest,
or put there by hand).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from casetrail.audit.archive import MANIFEST_FORMAT, manifest_message
from casetrail.audit.archive_store import ArchiveStore
from casetrail.audit.evidence import BundleError, TrustedKey, verify_bundle
from casetrail.contract.integrity import key_id, message_signature_valid
from casetrail.ledger.note import Verifier


@dataclass(frozen=True)
class ArchiveProblem:
    file: str
    kind: str
    """``manifest`` (unreadable or not signed by a trusted key), ``missing``, ``digest``,
    ``bundle`` (does not verify), ``unlisted``."""
    detail: str


@dataclass
class ArchiveReport:
    manifests: int = 0
    bundles: int = 0
    verified: int = 0
    problems: list[ArchiveProblem] = field(default_factory=list)
    checked: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """Each verified bundle (its file and content), for a check against today's log."""

    @property
    def clean(self) -> bool:
        return not self.problems and self.manifests > 0

    def as_json(self) -> dict[str, Any]:
        return {"clean": self.clean, "manifests": self.manifests, "bundles": self.bundles,
                "verified": self.verified,
                "problems": [{"file": p.file, "kind": p.kind, "detail": p.detail}
                             for p in self.problems]}


def _manifest_problem(manifest: Any, trusted: Sequence[TrustedKey]) -> str | None:
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT \
            or not isinstance(manifest.get("bundles"), list):
        return f"not a {MANIFEST_FORMAT} manifest"
    signature = manifest.get("signature")
    if not isinstance(signature, dict) or not isinstance(signature.get("sig"), str):
        return "not signed"
    keys = {key_id(t.public_key): t.public_key for t in trusted}
    key = keys.get(signature.get("keyId", ""))
    if key is None:
        return f"signed with key {signature.get('keyId')!r}, which you do not trust"
    if not message_signature_valid(key, manifest_message(manifest), signature["sig"]):
        return "its signature does not hold: the manifest was changed after it was signed"
    return None


def verify_archive(store: ArchiveStore, trusted: Sequence[TrustedKey],
                   log_keys: Sequence[Verifier] = (), witnesses: Sequence[Verifier] = (),
                   action_keys: Sequence[bytes] | None = None) -> ArchiveReport:
    """Check every manifest and bundle in the archive ``store``."""
    report = ArchiveReport()
    listed: set[str] = set()
    for name in store.names("manifests"):
        report.manifests += 1
        try:
            manifest = orjson.loads(store.read(name) or b"")
        except (OSError, orjson.JSONDecodeError) as exc:
            report.problems.append(ArchiveProblem(name, "manifest", f"unreadable: {exc}"))
            continue
        why = _manifest_problem(manifest, trusted)
        if why is not None:
            report.problems.append(ArchiveProblem(name, "manifest", why))
            continue
        for entry in manifest["bundles"]:
            file = entry.get("file") if isinstance(entry, dict) else None
            if not isinstance(file, str) or file in listed:
                continue
            listed.add(file)
            _check_bundle(store, file, entry, report, trusted, log_keys, witnesses,
                          action_keys)
    for name in store.names("bundles"):
        if name not in listed:
            report.problems.append(ArchiveProblem(
                name, "unlisted", "no manifest you trust lists this bundle"))
    return report


def _check_bundle(store: ArchiveStore, file: str, entry: dict[str, Any],
                  report: ArchiveReport, trusted: Sequence[TrustedKey],
                  log_keys: Sequence[Verifier], witnesses: Sequence[Verifier],
                  action_keys: Sequence[bytes] | None) -> None:
    report.bundles += 1
    data = store.read(file)
    if data is None:
        report.problems.append(ArchiveProblem(file, "missing", "listed, and not there"))
        return
    if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        report.problems.append(ArchiveProblem(
            file, "digest", "its SHA-256 is not the one its manifest names: changed"))
        return
    try:
        bundle = orjson.loads(data)
        if bundle.get("caseId") != entry.get("caseId"):
            raise BundleError(f"holds case {bundle.get('caseId')}, not {entry.get('caseId')}")
        verdict = verify_bundle(bundle, trusted, log_keys, witnesses, action_keys)
    except (orjson.JSONDecodeError, BundleError, AttributeError) as exc:
        report.problems.append(ArchiveProblem(file, "bundle", str(exc)))
        return
    if not verdict.verified:
        why = (f"{verdict.problems[0].code}: {verdict.problems[0].message}"
               if verdict.problems else "it holds no events")
        report.problems.append(ArchiveProblem(file, "bundle", f"does not verify: {why}"))
        return
    report.verified += 1
    report.checked.append((file, bundle))
