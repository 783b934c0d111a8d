"""Archives: each expiring case's bundle, written before its events go, under a signed
manifest per batch (docs/design.md, "Keeping records as long as the law says";
docs/bundle.md, "Archives").

An archive is a directory (a mounted WORM volume or object-store mount by default) or an
S3 bucket (``casetrail.audit.archive_store``):

    bundles/<tenant>/<case id>-<sha256 prefix>.json   one case's bundle
    manifests/<UTC time>-<batch id>.json              one a batch, signed

A file is written once under a name of its own and never rewritten: made durable
(the file, then its directory, fsynced) before the manifest that lists it, and the
manifest before the case's ``CASE_EXPIRED`` names both. A crash in between leaves a
bundle and manifest nothing names, which still verify; the next pass writes new ones.

Personal data stays out of the clear: events carry placeholders, and a case's sealed
values travel as their ciphertext only. The data key stays in the database, so erasure
and expiry, which destroy it, reach every archived copy as well.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from casetrail.adapters.store import CaseSecrets
from casetrail.audit.archive_store import ArchiveStore
from casetrail.audit.evidence import Evidence
from casetrail.contract.integrity import Signer, canonical

log = logging.getLogger("casetrail.archive")

MANIFEST_FORMAT = "casetrail-archive/1"
MANIFEST_DOMAIN = b"casetrail-archive-manifest/1\n"
"""What a manifest's signature covers comes after this: a message no event signature
(over a 32-byte chain hash) can be mistaken for."""


def manifest_message(manifest: dict[str, Any]) -> bytes:
    """The bytes a manifest's signature covers: its canonical JSON (RFC 8785) without
    the signature itself."""
    return MANIFEST_DOMAIN + canonical({k: v for k, v in manifest.items()
                                        if k != "signature"})


@dataclass(frozen=True)
class Archived:
    """Where one case's bundle went (named in its ``CASE_EXPIRED``)."""

    case_id: uuid.UUID
    file: str
    """Relative to the archive: ``bundles/<tenant>/<case id>-<sha256 prefix>.json``."""
    sha256: str
    manifest: str
    """Relative to the archive: the manifest that lists it."""

    def as_payload(self) -> dict[str, str]:
        return {"file": self.file, "sha256": self.sha256, "manifest": self.manifest}


@dataclass(frozen=True)
class ArchiveWriter:
    """Writes bundles and their signed manifest into an archive."""

    store: ArchiveStore
    signer: Signer
    written_by: str

    def write(self, bundles: Sequence[dict[str, Any]]) -> list[Archived]:
        """Each bundle's file, then the manifest listing them (blocking: run it in a
        thread)."""
        batch = uuid.uuid4().hex[:12]
        now = datetime.now(UTC)
        manifest_name = f"manifests/{now.strftime('%Y%m%dT%H%M%S%fZ')}-{batch}.json"
        entries = []
        for bundle in bundles:
            data = orjson.dumps(bundle)
            digest = hashlib.sha256(data).hexdigest()
            name = f"bundles/{bundle['tenantId']}/{bundle['caseId']}-{digest[:16]}.json"
            self.store.put_new(name, data)
            entries.append({"file": name, "caseId": bundle["caseId"],
                            "tenantId": bundle["tenantId"], "sha256": digest,
                            "bytes": len(data), "events": len(bundle["events"])})
        manifest: dict[str, Any] = {
            "format": MANIFEST_FORMAT, "batch": batch, "writtenBy": self.written_by,
            "writtenAt": now.isoformat().replace("+00:00", "Z"), "bundles": entries}
        manifest["signature"] = {"keyId": self.signer.key_id,
                                 "sig": self.signer.sign_message(manifest_message(manifest))}
        self.store.put_new(manifest_name, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
        return [Archived(uuid.UUID(e["caseId"]), e["file"], e["sha256"], manifest_name)
                for e in entries]


@dataclass(frozen=True)
class CaseArchiver:
    """Makes expiring cases' bundles and archives them, once the transparency log holds
    every event of the case (so that the archive verifies offline against it)."""

    evidence: Evidence
    secrets: CaseSecrets
    writer: ArchiveWriter

    async def archive(self, case_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Archived]:
        """The cases archived now; a case the log has not taken whole yet is left for
        the next pass (logged)."""
        bundles = []
        for case_id in case_ids:
            bundle = await self.evidence.bundle(case_id)
            if bundle is None:
                continue
            unlogged = sum(1 for e in bundle["events"] if "logProof" not in e)
            if unlogged or "log" not in bundle:
                log.info("case %s is archived once the log holds all its events (%d not "
                         "yet)", case_id, unlogged or len(bundle["events"]))
                continue
            bundle["sealed"] = await self._sealed(case_id)
            bundles.append(bundle)
        if not bundles:
            return {}
        written = await asyncio.to_thread(self.writer.write, bundles)
        return {a.case_id: a for a in written}

    async def _sealed(self, case_id: uuid.UUID) -> dict[str, Any] | None:
        """The case's sealed values as ciphertext only (never the wrapped data key)."""
        state = await self.secrets.state(case_id)
        if state is None:
            return None
        return {"placeholders": list(state.placeholders),
                "erasedAt": None if state.erased_at is None else state.erased_at.isoformat(),
                **({"masterKeyId": state.sealed.master_key_id,
                    "ciphertext": base64.b64encode(state.sealed.ciphertext).decode()}
                   if state.sealed is not None else {})}
