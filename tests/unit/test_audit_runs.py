"""The audit's passes as signed records (casetrail.audit.audit_runs): a chain read back
whole is believed; each way of tampering with it is named."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from casetrail.audit.audit_runs import (
    RunRecord,
    read_chain,
    remember,
    remembered,
    removed_since,
    seal_run,
)
from casetrail.contract.integrity import GENESIS, Integrity, Signer

SIGNER = Signer.generate()
KEYS = {SIGNER.key_id: SIGNER.public_key}


def _fields(to_leaf: int) -> dict[str, Any]:
    now = datetime(2026, 12, 7, 20, 0, tzinfo=UTC)
    return {"startedAt": now.isoformat(), "finishedAt": now.isoformat(), "fullPass": False,
            "fromLeaf": 0, "toLeaf": to_leaf, "casesChecked": 1,
            "findings": [{"kind": "altered", "detail": "x", "caseId": "c"}],
            "scrubbedTo": None, "casesScrubbed": 0, "scrubLapped": False}


def _row(run_id: int, record: RunRecord) -> dict[str, Any]:
    """A kept run as the store reads it back (its columns restating its body)."""
    f, seal = record.fields, record.integrity
    return {"run_id": run_id, "started_at": datetime.fromisoformat(f["startedAt"]),
            "finished_at": datetime.fromisoformat(f["finishedAt"]),
            "full_pass": f["fullPass"], "from_leaf": f["fromLeaf"], "to_leaf": f["toLeaf"],
            "cases_checked": f["casesChecked"], "findings": f["findings"],
            "scrubbed_to": None, "cases_scrubbed": 0, "scrub_lapped": False,
            "chain_seq": record.chain_seq, "body": record.body, "prev_hash": seal.prev_hash,
            "hash": seal.hash, "key_id": seal.key_id, "sig": seal.sig}


def _chain(n: int, signer: Signer = SIGNER) -> list[dict[str, Any]]:
    rows, prev = [], GENESIS
    for i in range(n):
        record = seal_run(signer, i, prev, _fields(10 * (i + 1)))
        rows.append(_row(i + 1, record))
        prev = record.integrity.hash
    return rows


def test_a_whole_chain_is_believed_and_the_next_run_follows_its_end() -> None:
    rows = _chain(3)
    chain = read_chain(rows, KEYS)
    assert not chain.problems and chain.untrusted is None
    assert chain.last is not None and chain.last["toLeaf"] == 30
    assert (chain.next_seq, chain.prev_hash) == (3, rows[-1]["hash"])


def test_runs_kept_before_the_chain_began_are_passed_over() -> None:
    legacy = {"run_id": 0, "body": None, "chain_seq": None}
    assert read_chain([legacy], KEYS).untrusted is None  # the first pass after an upgrade
    chain = read_chain([legacy, *_chain(2)], KEYS)
    assert not chain.problems and chain.last is not None


def test_each_way_of_tampering_is_named() -> None:
    rows = _chain(4)
    rows[0]["body"] = rows[0]["body"].replace(b'"toLeaf":10', b'"toLeaf":11')
    rows[1]["findings"] = []
    del rows[2]
    rows.append({"run_id": 9, "body": None, "chain_seq": None})
    chain = read_chain(rows, KEYS)
    assert chain.problems == {1: ["hash_mismatch", "columns_mismatch"],
                              2: ["columns_mismatch"], 4: ["chain_broken"], 9: ["unsigned"]}
    assert chain.last is None and chain.untrusted is not None and "9" in chain.untrusted


def test_a_run_under_another_key_is_not_believed() -> None:
    rows = _chain(2)
    forged = seal_run(Signer.generate(), 2, rows[-1]["hash"], _fields(30))
    chain = read_chain([*rows, _row(3, forged)], KEYS)
    assert chain.problems == {3: ["unknown_key"]} and chain.last is None


def test_runs_removed_from_the_end_are_found_from_what_the_auditor_remembers(
    tmp_path: Path,
) -> None:
    rows, state = _chain(3), tmp_path / "auditor.json"
    assert removed_since(remembered(state), rows) is None  # nothing remembered yet
    remember(state, seal_run(SIGNER, 2, rows[1]["hash"], _fields(31)))
    assert removed_since(remembered(state), rows) == \
        "audit run 2 of the chain is not the one the auditor kept (another hash)"
    remember(state, RunRecord(2, rows[2]["body"], _integrity(rows[2]), {}))
    assert removed_since(remembered(state), rows) is None
    removed = removed_since(remembered(state), rows[:1])
    assert removed is not None and "2 run(s) removed" in removed
    gone = removed_since(remembered(state), [*rows[:2], {**rows[2], "chain_seq": 3}])
    assert gone == "audit run 2 of the chain, which the auditor kept, is no longer stored"
    state.write_text("{not json")
    unreadable = removed_since(remembered(state), rows)
    assert unreadable is not None and "cannot be read" in unreadable


def _integrity(row: dict[str, Any]) -> Integrity:
    return Integrity(row["prev_hash"], row["hash"], row["key_id"], row["sig"])
