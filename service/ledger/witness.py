"""``casetrail witness``: watches the log from outside and refuses to let it change its past.

It follows the log's checkpoints (``GET /ledger/checkpoint``, by polling), checks each one's
signature against the log key it was given, and that it extends the last one it accepted
(an RFC 9162 consistency proof from ``GET /ledger/proofs/consistency``, checked here).
What it accepted is kept in a local state file, so a restart cannot be talked into an
older tree. A checkpoint that is smaller (rolled back), of the same size with another
root, or that the log cannot prove consistent (forked) is refused, both checkpoints named:
``--once`` exits 1; a witness left running keeps looking and keeps saying so (an ERROR
line each look, ``casetrail_witness_misbehaving`` 1, alert CasetrailLogMisbehaved), never
cosigns it, and exits 1 when stopped. With a cosigner key it cosigns what it accepted (C2SP
``cosignature/v1``) and hands the cosignature to the log, which keeps it with the
checkpoint so bundles carry it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from casetrail.ledger import merkle
from casetrail.ledger.high_water import write_json_durably
from casetrail.ledger.note import (
    Checkpoint,
    Note,
    NoteError,
    NoteSigner,
    Verifier,
    cosign,
    open_checkpoint,
    open_with_any,
)
from casetrail.telemetry import metrics
from casetrail.trail.verification import Problem

log = logging.getLogger("casetrail.witness")


class LogUnreachable(RuntimeError):
    """The log did not answer (exit 2: nothing could be checked)."""


class LogMisbehaved(RuntimeError):
    """The log showed a checkpoint that contradicts one accepted before (exit 1)."""


def verifier_key(text_or_path: str) -> Verifier:
    """A ``--log-key`` / ``--trust-log`` value: a verifier key or a file holding one."""
    path = Path(text_or_path)
    return Verifier.parse(path.read_text() if path.is_file() else text_or_path)


@dataclass(frozen=True)
class LogClient:
    base_url: str
    timeout: float = 10.0

    async def _get(self, path: str, **params: Any) -> httpx.Response:
        try:
            async with httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout,
                                         follow_redirects=False) as http:
                reply = await http.get(path, params=params)
        except httpx.HTTPError as exc:
            raise LogUnreachable(f"{self.base_url}{path}: {exc!r}") from None
        if reply.status_code != 200:
            raise LogUnreachable(f"{self.base_url}{path} answered {reply.status_code}: "
                                 f"{reply.text[:200]}")
        return reply

    async def checkpoint(self) -> str:
        return (await self._get("/ledger/checkpoint")).text

    async def consistency(self, old: int, new: int) -> list[bytes]:
        reply = await self._get("/ledger/proofs/consistency", **{"from": old, "to": new})
        return [base64.b64decode(h) for h in reply.json()["proof"]]

    async def cosign(self, note: str) -> None:
        try:
            async with httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout) as http:
                reply = await http.post("/ledger/cosignatures", content=note.encode(),
                                        headers={"Content-Type": "text/plain"})
        except httpx.HTTPError as exc:
            raise LogUnreachable(f"POST {self.base_url}/ledger/cosignatures: {exc!r}") from None
        if reply.status_code not in (200, 201):
            raise LogUnreachable(f"the log refused the cosignature ({reply.status_code}): "
                                 f"{reply.text[:200]}")


async def consistent(client: LogClient, old: Checkpoint, new: Checkpoint) -> str | None:
    """``None`` when ``new`` extends ``old``; else what is wrong, naming both."""
    if new.size < old.size:
        return f"the log rolled back: accepted {old.describe()}, now shows {new.describe()}"
    if new.size == old.size:
        return None if new.root == old.root else (
            f"the log forked: accepted {old.describe()}, now shows {new.describe()}")
    proof = await client.consistency(old.size, new.size)
    if merkle.verify_consistency(old.size, old.root, new.size, new.root, proof):
        return None
    return (f"the log forked: {new.describe()} does not extend the accepted "
            f"{old.describe()} (its consistency proof fails)")


async def check_log_today(base_url: str, bundle: dict[str, Any], log_keys: Sequence[Verifier]
                          ) -> list[Problem]:
    """``verify-bundle --log``: the log's current checkpoint must extend the bundle's."""
    note = (bundle.get("log") or {}).get("checkpoint")
    if not isinstance(note, str):
        return [Problem(None, None, "not_in_log", "the bundle carries no checkpoint")]
    client = LogClient(base_url)
    try:
        then, _ = open_with_any(note, log_keys)
        today, _ = open_with_any(await client.checkpoint(), log_keys)
    except NoteError as exc:
        return [Problem(None, None, "bad_checkpoint", "the log's checkpoint today or the "
                        f"bundle's is not signed by a trusted log key: {exc}")]
    wrong = await consistent(client, then, today)
    return [Problem(None, None, "log_inconsistent", wrong)] if wrong else []


@dataclass
class Witness:
    """Accepts checkpoints that extend what it accepted before; remembers them on disk."""

    log_key: Verifier
    state_file: Path
    client: LogClient
    cosigner: NoteSigner | None = None
    clock: Callable[[], float] = time.time

    def accepted(self) -> Checkpoint | None:
        try:
            state = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise LogUnreachable(f"cannot read the witness state {self.state_file}: "
                                 f"{exc}") from None
        return Checkpoint.parse(Note.parse(state["checkpoint"]).text)

    def _remember(self, note: str) -> None:
        write_json_durably(self.state_file, {"logKey": self.log_key.text(), "checkpoint": note,
                                             "acceptedAt": int(self.clock())}, ".witness-")

    async def observe(self) -> tuple[Checkpoint, bool]:
        """Fetch and check the log's checkpoint; ``(checkpoint, new)``. Raises
        ``LogMisbehaved`` naming both checkpoints when it contradicts the accepted one."""
        note_text = await self.client.checkpoint()
        try:
            head, note = open_checkpoint(note_text, self.log_key)
        except NoteError as exc:
            raise LogMisbehaved(f"the log's checkpoint does not verify: {exc}") from None
        before = self.accepted()
        if before is not None:
            wrong = await consistent(self.client, before, head)
            if wrong:
                raise LogMisbehaved(wrong)
            if head.size == before.size:
                return head, False
        self._remember(note_text)
        if self.cosigner is not None:
            signature = cosign(note, self.cosigner, int(self.clock()))
            await self.client.cosign(note.with_signatures(signature).render())
        return head, True


async def run_witness(witness: Witness, once: bool, interval: float,
                      stop: asyncio.Event) -> None:
    """Check the log now (``once``) or until ``stop``. ``LogMisbehaved`` ends a single
    look at once; a witness left running reports it on every look and raises it when
    stopped, so that a log that rolled back cannot silence its witness."""
    seen: LogMisbehaved | None = None
    while True:
        try:
            head, new = await witness.observe()
        except LogUnreachable as exc:
            metrics.WITNESS_CHECKS.labels("unreachable").inc()
            if once:
                raise
            log.warning("%s; trying again", exc)
        except LogMisbehaved as exc:
            metrics.WITNESS_CHECKS.labels("misbehaved").inc()
            metrics.WITNESS_MISBEHAVING.set(1)
            if once:
                raise
            log.error("%s; refusing to accept or cosign it", exc)
            seen = exc
        else:
            metrics.WITNESS_CHECKS.labels("accepted" if new else "unchanged").inc()
            metrics.WITNESS_TREE_SIZE.set(head.size)
            if new:
                print(f"accepted {head.describe()}", flush=True)
        if once or stop.is_set():
            if seen is not None:
                raise seen
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
