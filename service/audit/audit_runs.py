"""The audit's own passes as evidence (docs/design.md, "One command audits the whole log").

Each pass ``casetrail audit`` keeps is a signed record: the canonical JSON of what it
read and found (``casetrail-audit-run/1``), hashed and chained as an event is
(``hash = SHA-256(prevHash "\\n" body)``, the first run after sixty-four zeros) and signed
under the auditor's own key, registered in ``audit_keys``. The next pass reads where to
go on from (the leaf it stopped at, the cases that failed, where its scrub stopped) out
of the last run's signed bytes, never its columns, and only when the whole chain
verifies. The auditor also remembers the last run it kept off the database (a state
file beside its key), so that runs removed from the end of the chain are found too.

What a kept run can be found to be (``read_chain``): ``unsigned`` (kept after the chain
began, with no signature: only with the chain's trigger switched off),
``chain_broken`` (it does not name the hash of the run before it: one was removed or
slipped in), ``hash_mismatch`` / ``unknown_key`` / ``bad_signature`` (its bytes are not
the ones signed, or not under a registered auditor's key), ``columns_mismatch`` (the
columns SQL readers see say other than its signed bytes).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from casetrail.adapters.store.keys import KeyRegistry
from casetrail.audit.backtest_record import seal_problems
from casetrail.config import Settings
from casetrail.contract.integrity import GENESIS, Integrity, Signer, canonical
from casetrail.errors import PermanentError
from casetrail.ledger.high_water import state_file_for as state_file_beside
from casetrail.ledger.high_water import write_json_durably
from casetrail.trail.keyfile import audit_key_spec, audit_signer

RUN_FORMAT = "casetrail-audit-run/1"

_COLUMNS = {"startedAt": "started_at", "finishedAt": "finished_at", "fullPass": "full_pass",
            "fromLeaf": "from_leaf", "toLeaf": "to_leaf", "casesChecked": "cases_checked",
            "findings": "findings", "scrubbedTo": "scrubbed_to",
            "casesScrubbed": "cases_scrubbed", "scrubLapped": "scrub_lapped"}
"""Each field of a run's body and the column that restates it."""


@dataclass(frozen=True)
class RunRecord:
    """A pass as the auditor signs it: its body and the integrity sealing it."""

    chain_seq: int
    body: bytes
    integrity: Integrity
    fields: dict[str, Any]


def seal_run(signer: Signer, chain_seq: int, prev_hash: str,
             fields: dict[str, Any]) -> RunRecord:
    """The signed record of a pass (``fields``: its body's fields, as ``_COLUMNS`` names
    them), the ``chain_seq``-th of the chain, after ``prev_hash``."""
    body = canonical({"format": RUN_FORMAT, "chainSeq": chain_seq, **fields})
    return RunRecord(chain_seq, body, signer.seal(prev_hash, body), fields)


@dataclass(frozen=True)
class ChainRead:
    """The kept runs as read and checked: the last one to go on from (its signed body,
    ``None`` when there is none to believe), the problems of each run that has any, and
    the chain's end (seq, hash) the next run follows."""

    last: dict[str, Any] | None
    last_id: int | None
    problems: dict[int, list[str]]
    next_seq: int
    prev_hash: str
    untrusted: str | None = None
    """Why the last run is not believed (then the pass checks the whole log)."""


def read_chain(rows: Sequence[dict[str, Any]], keys: dict[str, bytes]) -> ChainRead:
    """Check every kept run (``rows`` in the order kept, with their columns), oldest
    first, under the registered auditor's ``keys``."""
    problems: dict[int, list[str]] = {}
    prev, seq, began = GENESIS, 0, False
    last: dict[str, Any] | None = None
    for row in rows:
        if row["body"] is None:
            if began:  # after the chain began, a run is only ever kept signed
                problems[row["run_id"]] = ["unsigned"]
            last = None
            continue
        began, found = True, []
        if row["prev_hash"] != prev or row["chain_seq"] != seq:
            found.append("chain_broken")
        found += seal_problems(row, keys)
        body = _body(row)
        if body is None or _columns_differ(row, body):
            found.append("columns_mismatch")
        if found:
            problems[row["run_id"]] = found
        last = body if not found else None
        prev, seq = row["hash"], row["chain_seq"] + 1
    last_id = rows[-1]["run_id"] if rows else None
    untrusted = None
    if rows and last is None and (began or problems):
        untrusted = (f"audit run {last_id} is not one the auditor signed "
                     f"({', '.join(problems.get(last_id or 0, ['unreadable']))})")
    return ChainRead(last, last_id, problems, seq, prev, untrusted)


def _body(row: dict[str, Any]) -> dict[str, Any] | None:
    try:
        body = orjson.loads(bytes(row["body"]))
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) and body.get("format") == RUN_FORMAT else None


def _columns_differ(row: dict[str, Any], body: dict[str, Any]) -> bool:
    for field, column in _COLUMNS.items():
        stored = row[column]
        if isinstance(stored, datetime):
            stored = stored.isoformat()
        elif isinstance(stored, uuid.UUID):
            stored = str(stored)
        if stored != body.get(field):
            return True
    return False


@dataclass(frozen=True)
class Auditor:
    """What signs the passes and remembers the last one kept."""

    signer: Signer
    state: Path

    @classmethod
    def of(cls, settings: Settings) -> Auditor:
        return cls(audit_signer(settings), state_file_for(settings))

    async def registered(self, keys: KeyRegistry) -> None:
        """``PermanentError`` unless the auditor's key is registered and not retired: a
        pass signed under another would be a finding at the next."""
        key = await keys.registered(self.signer.key_id, self.signer.public_key)
        if key is None or key.not_valid_after is not None:
            raise PermanentError(
                f"the auditor's key {self.signer.key_id} is "
                f"{'retired' if key else 'not registered'} in audit_keys: register the "
                "auditor's key with `casetrail signer register --audit FILE` (setup does it "
                "for CASETRAIL_AUDIT_KEY_FILE)")


def state_file_for(settings: Settings) -> Path:
    """Where the auditor remembers the last run it kept: ``CASETRAIL_AUDIT_STATE_FILE``,
    else beside its key's file (``<key>.<namespace>.state.json``)."""
    return state_file_beside(audit_key_spec(settings) or "", settings.namespace,
                             settings.audit_state_file, "CASETRAIL_AUDIT_STATE_FILE",
                             "the auditor remembers the last pass it kept")


@dataclass(frozen=True)
class Remembered:
    """The last run the auditor kept, as it remembers it: (seq, hash), or why it cannot
    say."""

    seq: int | None = None
    hash: str | None = None
    unreadable: str | None = None


def remembered(path: Path) -> Remembered:
    try:
        state = json.loads(path.read_text())
        return Remembered(int(state["chainSeq"]), str(state["hash"]))
    except FileNotFoundError:
        return Remembered()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Remembered(unreadable=f"the auditor's state file {path} cannot be read "
                          f"({exc})")


def remember(path: Path, record: RunRecord) -> None:
    """Keep (seq, hash) of the run just kept, replacing the file atomically."""
    write_json_durably(path, {"chainSeq": record.chain_seq, "hash": record.integrity.hash},
                       ".audit-state-")


def removed_since(memory: Remembered, rows: Sequence[dict[str, Any]]) -> str | None:
    """Why the kept chain is not the one the auditor remembers keeping: its end removed
    (or the database restored from an older backup), or the remembered run replaced."""
    if memory.seq is None:
        return memory.unreadable
    signed = {r["chain_seq"]: r["hash"] for r in rows if r["chain_seq"] is not None}
    if memory.seq not in signed:
        kept = max(signed, default=-1)
        if kept > memory.seq:  # later runs (another auditor's) kept, this one gone
            return (f"audit run {memory.seq} of the chain, which the auditor kept, is no "
                    "longer stored")
        return (f"the auditor last kept audit run {memory.seq} of the chain, but the chain "
                f"ends at {kept}: {memory.seq - kept} run(s) removed (or the database "
                "was restored from an older backup)")
    if signed[memory.seq] != memory.hash:
        return (f"audit run {memory.seq} of the chain is not the one the auditor kept "
                "(another hash)")
    return None
