"""Backtests on recorded cases: the demo's loan cases decided by the scripted loan
officer, then run again by a challenger — the same code (nothing changes), a stricter
lending policy (one decision changes), through the command line — with the record
answering every worker tool call and nothing written."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import subprocess
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import asyncpg
import httpx
import jsonschema
import orjson
import pypdf
import pytest

from casetrail.adapters.store import ApiKeyStore, CaseStore, KeyRegistry, component_pool
from casetrail.adapters.store.audit_log import AuditStore
from casetrail.adapters.store.backtests import BacktestStore
from casetrail.adapters.store.ledger import LedgerStore
from casetrail.adapters.store.pool import create_pool
from casetrail.agents import AGENTS, loan_officer
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.audit.audit_runs import Auditor
from casetrail.audit.backtest import NOT_IN_RECORD, RecordedAnswers, backtest_case, summary
from casetrail.audit.backtest_record import verify_backtest_bundle
from casetrail.audit.evidence import Evidence
from casetrail.audit.replay import recorded
from casetrail.audit.whole_log import WholeLog
from casetrail.cases.errors import Conflict
from casetrail.cases.gate import RolloutGate, why_shut
from casetrail.components.backtests import BacktestRunner
from casetrail.components.ledger_recover import leaves_in_bundles
from casetrail.components.sequencer import Sequencer, ledger_state
from casetrail.config import Settings
from casetrail.contract.integrity import Signer
from casetrail.engine.scripted import ScriptedModel
from casetrail.ledger.log_key import log_signer
from casetrail.ledger.note import Verifier
from casetrail.trail.keyfile import worker_signer
from tests.support.cli import STANDALONE_VERIFIER
from tests.support.helpers import ended, wait_for_sql
from tests.support.logged import as_superuser
from tests.support.retention import decided_samples, person
from tests.support.stack import module_stack, serve_api

stack = module_stack(worker_concurrency=4)
SINCE: list[datetime] = []


@pytest.fixture(scope="module")
async def decided(stack: Any, auth_headers: dict[str, str], pool: asyncpg.Pool
                  ) -> dict[uuid.UUID, Any]:
    """Three sample applications decided (approve, refer, decline): case id → trail."""
    SINCE.append(datetime.now(UTC))
    trails = await decided_samples(stack.base_url, auth_headers, pool)
    return {case_id: recorded(trail) for case_id, trail in trails.items()}


async def _run(decided: dict[uuid.UUID, Any]) -> dict[str, Any]:
    officer = AGENTS["loan-officer"]
    assert officer.script is not None
    model = ScriptedModel(officer.script, name="challenger")
    return summary([await backtest_case(c, trail, officer, model, officer.default_model)
                    for c, trail in decided.items()])


async def test_the_same_code_decides_every_case_the_same_from_the_record(
    decided: dict[uuid.UUID, Any], pool: asyncpg.Pool,
) -> None:
    stored = await pool.fetchval("SELECT count(*) FROM event_log")
    found = await _run(decided)
    assert found["matrix"] == [
        {"champion": "approve", "challenger": "approve", "cases": 1},
        {"champion": "decline", "challenger": "decline", "cases": 1},
        {"champion": "refer", "challenger": "refer", "cases": 1}]
    assert found["changed"] == [] and found["unansweredCalls"] == 0  # the record answered
    assert found["tokens"] > 0
    assert await pool.fetchval("SELECT count(*) FROM event_log") == stored  # nothing written


async def test_a_stricter_policy_shows_the_decision_it_changes(
    decided: dict[uuid.UUID, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Maria Okafor's score is 742: approved at 700, referred at 750."""
    monkeypatch.setattr(loan_officer, "AUTO_APPROVE_SCORE", 750)
    found = await _run(decided)
    maria = next(iter(decided))
    assert found["changed"] == [str(maria)], found
    [changed] = [r for r in found["results"] if r["changed"]]
    assert (changed["champion"], changed["challenger"]) == ("approve", "refer")
    assert "decision" in changed["changedFields"]


async def test_a_call_the_record_does_not_hold_is_refused_and_counted(
    decided: dict[uuid.UUID, Any],
) -> None:
    officer = AGENTS["loan-officer"]
    trail = next(iter(decided.values()))
    calls = [c for e in trail if e.event_type == "REACT_CYCLE"
             for c in e.payload.get("toolCalls") or []]
    answers = RecordedAnswers(officer.tools, calls)
    [scored] = [c for c in calls if c["toolName"] == "credit-score"]
    held = await answers.execute("credit-score", scored["toolArgs"], call_id="x:0:0")
    assert held.result == scored["toolResult"]
    again = await answers.execute("credit-score", scored["toolArgs"], call_id="x:1:0")
    other = await answers.execute("credit-score", {"applicantId": "Z-0000"}, call_id="x:2:0")
    assert again.error == other.error == NOT_IN_RECORD  # each recorded call answers once
    assert len(answers.unanswered) == 2 and "Z-0000" in answers.unanswered[1]


async def test_under_the_live_policy_a_read_only_tool_answers_what_the_record_lacks(
    decided: dict[uuid.UUID, Any], stack: Any,
) -> None:
    """credit-score is declared read-only: a call the record lacks goes to its capability
    worker over the bus, counted and listed; a tool not declared so is still refused."""
    officer = AGENTS["loan-officer"]
    trail = next(iter(decided.values()))
    calls = [c for e in trail if e.event_type == "REACT_CYCLE"
             for c in e.payload.get("toolCalls") or []]
    answers = RecordedAnswers(officer.tools, calls, live=stack.worker.runtime)
    asked = await answers.execute("credit-score", {"applicantId": "A-1003"}, call_id="x:9:0")
    assert asked.error is None and asked.result["score"] == 561, asked  # the bureau's
    assert asked.attempts[0].worker != "backtest"  # a capability worker answered
    refused = await answers.execute("payments", {"amount": 1}, call_id="x:9:1")
    assert refused.error == NOT_IN_RECORD
    assert answers.asked_live == ['credit-score {"applicantId":"A-1003"}']
    assert answers.unanswered == ['payments {"amount":1}']


async def test_the_cli_prints_the_comparison(
    decided: dict[uuid.UUID, Any], settings: Settings,
) -> None:
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "casetrail.cli", "backtest", "--agent",
                         "loan-officer", "--since", SINCE[0].isoformat(), "--json"],
        env=settings.environment(), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    found = orjson.loads(done.stdout)
    assert found["status"] == "done" and found["record"]["hash"], found  # a worker ran it
    assert found["summary"]["cases"] == 3 and found["summary"]["changed"] == [], found
    assert found["challenger"]["agentDigest"] == AGENTS["loan-officer"].digest
    here = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "casetrail.cli", "backtest", "--agent",
                         "loan-officer", "--since", SINCE[0].isoformat(), "--here"],
        env=settings.environment(), capture_output=True, text=True, timeout=120, check=False)
    assert here.returncode == 0, here.stdout + here.stderr
    assert "not recorded (--here)" in here.stdout and "changed 0" in here.stdout
    none = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "casetrail.cli", "backtest", "--agent",
                         "loan-officer", "--since", "2999-01-01T00:00:00Z"],
        env=settings.environment(), capture_output=True, text=True, timeout=120, check=False)
    assert none.returncode == 2, none.stdout + none.stderr  # nothing to run


async def test_the_cli_takes_a_list_of_cases_a_window_and_budgets(
    decided: dict[uuid.UUID, Any], settings: Settings, tmp_path: Path,
) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "casetrail.cli", "backtest", "--agent",
                               "loan-officer", *args], env=settings.environment(),
                              capture_output=True, text=True, timeout=120, check=False)

    first, *rest = decided
    listed = tmp_path / "cases.txt"
    listed.write_text(f"# the validation sample\n{first}\n\n{rest[1]}  # a decline\n")
    evidence, pdf = tmp_path / "evidence.json", tmp_path / "validation.pdf"
    asked = asyncio.create_task(asyncio.to_thread(
        cli, "--cases", str(listed), "--json", "--bundle", str(evidence), "--report", str(pdf)))
    while not asked.done():  # the ledger's work, while the command waits for the proof
        await _ledger_appends(settings)
        await asyncio.sleep(0.3)
    done = await asked
    assert done.returncode == 0, done.stdout + done.stderr
    kept = orjson.loads(evidence.read_bytes())
    assert kept["record"]["logProof"]  # with its proof: it verifies against the log's key
    trusted = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "casetrail.cli", "verify-bundle",
                         str(evidence), "--trust",
                         base64.b64encode(worker_signer(settings).public_key).decode(),
                         "--trust-log", kept["log"]["verifierKeys"][-1]],
        env=settings.environment(), capture_output=True, text=True, timeout=60, check=False)
    assert trusted.returncode == 0 and "checked: the record is in the log" in trusted.stdout, \
        trusted.stdout + trusted.stderr
    assert orjson.loads(evidence.read_bytes())["format"] == "casetrail-backtest/1"
    assert pdf.read_bytes().startswith(b"%PDF")
    found = orjson.loads(done.stdout)
    assert [r["caseId"] for r in found["results"]] == [str(first), str(rest[1])], found
    assert found["selection"]["casesListed"] is not None  # the list's digest, signed
    # A window that ends before the cases were made holds none of them.
    before = await asyncio.to_thread(cli, "--since", SINCE[0].isoformat(), "--until",
                                     SINCE[0].isoformat(), "--json")
    assert before.returncode == 2, before.stdout + before.stderr
    # A token budget smaller than one case's: the first case runs, no other starts.
    spent = await asyncio.to_thread(cli, "--since", SINCE[0].isoformat(), "--concurrency",
                                    "1", "--max-tokens", "1")
    assert spent.returncode == 0, spent.stdout + spent.stderr
    assert spent.stdout.startswith("1 of 3 cases") and "stopped early: the token budget" \
        in spent.stdout, spent.stdout
    assert "backtest: 1 of 3 cases" in spent.stderr  # progress, read from the worker's notes
    listed.write_text("not-a-case\n")
    bad = await asyncio.to_thread(cli, "--cases", str(listed))
    assert bad.returncode == 2 and "line 1: not a case id" in bad.stderr, bad.stderr
    late = await asyncio.to_thread(cli, "--until", "yesterday")
    assert late.returncode == 2 and "--until is not an RFC 3339 time" in late.stderr


async def test_a_dataset_export_validates_against_its_schema_and_round_trips(
    decided: dict[uuid.UUID, Any], settings: Settings, stack: Any, pool: asyncpg.Pool,
    tmp_path: Path,
) -> None:
    """The refer is reviewed (confirmed) by a person first: it carries the label."""
    approve, refer, decline = decided
    async with await person(pool, stack.base_url, "rita", "cases:review", "cases:read") as rita:
        reviewed = await rita.post(f"/cases/{refer}/review", json={
            "verdict": "confirm", "reason": "The bureau's file is thin: refer stands."})
        assert reviewed.status_code == 202, reviewed.text
        assert (await ended(rita, refer, statuses=("awaiting_review",)))["status"] == \
            "completed"
    await asyncio.sleep(0.3)  # the terminal event reaches Postgres
    schema = orjson.loads((Path(__file__).parents[2] / "docs" / "dataset.schema.json")
                          .read_bytes())

    def export(*args: str) -> list[dict[str, Any]]:
        out = tmp_path / "cases.jsonl"
        done = subprocess.run(
            [sys.executable, "-m", "casetrail.cli", "dataset", "export", "--agent",
             "loan-officer", "--since", SINCE[0].isoformat(), "-o", str(out), *args],
            env=settings.environment(), capture_output=True, text=True, timeout=120,
            check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        raw = out.read_bytes()
        lines = [orjson.loads(line) for line in raw.splitlines()]
        assert b"".join(orjson.dumps(line) + b"\n" for line in lines) == raw  # round trip
        for line in lines:
            jsonschema.validate(line, schema, format_checker=jsonschema.FormatChecker())
        return lines

    every = export()
    assert [line["caseId"] for line in every] == [str(c) for c in (approve, refer, decline)]
    by_case = {line["caseId"]: line for line in every}
    labelled = by_case[str(refer)]
    assert labelled["output"]["decision"] == "refer" == labelled["expectedOutput"]["decision"]
    assert labelled["review"]["verdict"] == "confirm" and labelled["review"]["reviewer"] == \
        "rita" and "thin" in labelled["review"]["reason"]
    assert by_case[str(approve)]["expectedOutput"] is None
    scored = [c for c in by_case[str(approve)]["toolCalls"] if c["toolName"] == "credit-score"]
    assert scored and scored[0]["toolResult"] is not None
    # No sensitive value in clear: the applicant's name is its placeholder.
    name = SAMPLE_APPLICATIONS[0]["applicantName"]
    assert name not in orjson.dumps(every).decode()
    assert by_case[str(approve)]["input"]["applicantName"] == "[pii:applicantName]"
    assert [line["caseId"] for line in export("--reviewed-only")] == [str(refer)]
    # In clear only when asked, for a caller with pii:read (the operator here), logged.
    read_before = await pool.fetchval("SELECT count(*) FROM access_log WHERE case_id = $1",
                                      approve)
    clear = {line["caseId"]: line for line in export("--personal-data")}
    assert clear[str(approve)]["input"]["applicantName"] == name
    assert await pool.fetchval("SELECT count(*) FROM access_log WHERE case_id = $1",
                               approve) == read_before + 1


async def test_a_backtest_asked_over_rest_is_kept_signed_logged_and_verifies_offline(
    decided: dict[uuid.UUID, Any], stack: Any, pool: asyncpg.Pool, settings: Settings,
    tmp_path: Path,
) -> None:
    """A worker runs it; nothing reaches the cases or their log; its record is chained
    after the last, enters the transparency log as a leaf of its own kind, and its
    bundle verifies offline — and fails once one byte of a result or the record changes."""
    events, cases = (await pool.fetchval("SELECT count(*) FROM event_log"),
                     await pool.fetchval("SELECT count(*) FROM cases"))
    async with await person(pool, stack.base_url, "vera", "backtests:run", "cases:read") as vera, \
            await person(pool, stack.base_url, "carl", "cases:start") as carl:
        refused = await carl.post("/backtests", json={"agent": "loan-officer"})
        assert refused.status_code == 403, refused.text
        unknown = await vera.post("/backtests", json={"agent": "no-such-agent"})
        assert unknown.status_code == 422 and "no-such-agent" in unknown.text, unknown.text
        old = await vera.post("/backtests", json={"agent": "loan-officer",
                                                  "challenger": "loan-officer@0.0.1"})
        assert old.status_code == 422 and "challenger" in old.text, old.text
        asked = await vera.post("/backtests", json={
            "agent": "loan-officer", "since": SINCE[0].isoformat(), "concurrency": 2})
        assert asked.status_code == 202, asked.text
        location = asked.headers["location"]
        assert asked.json()["status"] == "queued" and asked.json()["requestedBy"] == "vera"
        view = await _done(vera, location)
        assert view["progress"] == {"done": 3, "selected": 3}
        assert view["summary"]["cases"] == 3 and view["summary"]["changed"] == []
        assert view["challenger"]["agentDigest"] == AGENTS["loan-officer"].digest
        assert view["championDigests"] == [AGENTS["loan-officer"].digest]
        assert [r["caseId"] for r in view["results"]] == [str(c) for c in decided]
        listed = (await vera.get("/backtests")).json()["backtests"]
        assert listed[0]["backtestId"] == view["backtestId"]
        backtest_id = uuid.UUID(view["backtestId"])
        # Nothing of the cases changed: no event, no case.
        assert await pool.fetchval("SELECT count(*) FROM event_log") == events
        assert await pool.fetchval("SELECT count(*) FROM cases") == cases
        # The record waits in the ledger's queue as a leaf of its own kind: its bundle
        # is not handed out without its log proof until a checkpoint holds it.
        assert await pool.fetchval("SELECT kind FROM ledger_queue WHERE event_id = $1",
                                   backtest_id) == "backtest"
        early = await vera.get(f"{location}/bundle")
        assert early.status_code == 409 and early.headers["retry-after"] == "2", early.text
        assert "not in a signed checkpoint yet" in early.json()["detail"], early.text
        await _ledger_appends(settings)
        assert await pool.fetchval("SELECT kind FROM ledger_leaves WHERE event_id = $1",
                                   backtest_id) == "backtest"
        found = await vera.get(f"{location}/bundle")
        assert found.status_code == 200, found.text
        bundle = found.json()
    await _verifies_offline_until_a_byte_changes(bundle, settings, tmp_path)
    # A source for `ledger recover`: the record's leaf, by its index, of its kind.
    kept = tmp_path / "recover"
    kept.mkdir()
    (kept / "backtest.json").write_bytes(orjson.dumps(bundle))
    [leaf] = leaves_in_bundles(kept).values()
    assert (leaf.index, leaf.event_id, leaf.kind) == (
        await pool.fetchval("SELECT leaf_index FROM ledger_leaves WHERE event_id = $1",
                            backtest_id), backtest_id, "backtest")
    # The record and its results are kept for good, and the chain admits no stranger.
    with pytest.raises(asyncpg.RaiseError, match="append-only"):
        await pool.execute("UPDATE backtest_records SET sig = sig WHERE backtest_id = $1",
                           backtest_id)
    with pytest.raises(asyncpg.RaiseError, match="append-only"):
        await pool.execute("DELETE FROM backtest_results WHERE backtest_id = $1", backtest_id)
    with pytest.raises(asyncpg.PostgresError, match="must follow the last one"):
        await pool.execute(
            "INSERT INTO backtest_records (backtest_id, chain_seq, body, prev_hash, hash, "
            "key_id, sig) SELECT backtest_id, chain_seq + 1, body, $2, $2, key_id, sig "
            "FROM backtest_records WHERE backtest_id = $1", backtest_id, "0" * 64)


async def test_a_case_whose_record_does_not_verify_is_left_out_and_named(
    decided: dict[uuid.UUID, Any], stack: Any, pool: asyncpg.Pool, settings: Settings,
) -> None:
    """A case whose events were deleted by hand (its row kept) is selected, but not
    scored: the signed record names it, with why, and its matrix holds no "None"."""
    first = next(iter(decided))
    async with await person(pool, stack.base_url, "gus", "backtests:run", "cases:read",
                            "cases:start") as gus:
        started = await gus.post("/cases", json={"agent": "loan-officer",
                                                 "input": SAMPLE_APPLICATIONS[2]})
        assert started.status_code == 202, started.text
        gutted = uuid.UUID(started.json()["caseId"])
        assert (await ended(gus, gutted))["status"] == "completed"
        await wait_for_sql(pool, "SELECT EXISTS (SELECT 1 FROM event_log WHERE case_id = "
                           f"'{gutted}' AND event_type = 'CASE_COMPLETED')")
        await pool.execute("CREATE TABLE gutted_events AS SELECT * FROM event_log "
                           "WHERE case_id = $1", gutted)
        try:
            await as_superuser(pool, "DELETE FROM event_log WHERE case_id = $1 AND "
                               "event_type <> 'CASE_STARTED'", args=(gutted,))
            asked = await gus.post("/backtests", json={
                "agent": "loan-officer", "cases": [str(first), str(gutted)]})
            assert asked.status_code == 202, asked.text
            view = await _done(gus, asked.headers["location"])
        finally:
            await as_superuser(pool, "INSERT INTO event_log SELECT * FROM gutted_events "
                               "ON CONFLICT DO NOTHING")
            await pool.execute("DROP TABLE gutted_events")
    assert [r["caseId"] for r in view["results"]] == [str(first)], view
    [left] = view["selection"]["leftOut"]
    assert left["caseId"] == str(gutted) and "does not verify" in left["why"], left
    assert all("None" not in (c["champion"], c["challenger"])
               for c in view["summary"]["matrix"]), view["summary"]
    assert view["progress"] == {"done": 1, "selected": 2}  # scored of selected
    # Its cases were a list its asker picked: the signed record says so, and no gate
    # opens on it, whatever its agreement.
    assert view["selection"]["picked"] is True
    body = await pool.fetchval("SELECT body FROM backtest_records WHERE backtest_id = $1",
                               uuid.UUID(view["backtestId"]))
    assert "picked" in (why_shut(orjson.loads(body), 0.0, 1) or ""), body
    await _ledger_appends(settings)  # its record a leaf, as the audit below expects


async def _done(client: httpx.AsyncClient, location: str, tries: int = 300
                ) -> dict[str, Any]:
    """The backtest at ``location`` once a worker has run it."""
    for _ in range(tries):
        view: dict[str, Any] = (await client.get(location)).json()
        if view["status"] not in ("queued", "running"):
            break
        await asyncio.sleep(0.1)
    assert view["status"] == "done", view
    return view


async def test_a_gated_agent_takes_cases_only_after_its_version_passed_a_backtest(
    decided: dict[uuid.UUID, Any], settings: Settings, pool: asyncpg.Pool,
) -> None:
    """An API whose operator gates loan-officer (agreement with reviewers >= 0.99) and
    claims-triage: the backtest above (the reviewed refer confirmed, the challenger
    agreeing) opens loan-officer's gate; claims-triage, never backtested, is refused
    with a problem naming what it needs."""
    agreed = await pool.fetchval(
        "SELECT max((convert_from(body, 'UTF8')::jsonb #>> "
        "'{summary,agreementWithReviewers,challenger}')::float8) FROM backtest_records")
    assert agreed == 1.0  # what the gate reads, from the signed records kept above
    # That backtest's selection is a window nobody picked, holding one reviewed case:
    # below the default minimum it opens nothing; with a minimum of one, it opens.
    gates = {"loan-officer": 0.99, "aml-screening": 0.5}
    async with serve_api(settings.model_copy(update={"backtest_gates": gates})) as base_url, \
            await person(pool, base_url, "gus", "cases:start", "cases:read") as gus:
        few = await gus.post("/cases", json={"agent": "loan-officer",
                                             "input": SAMPLE_APPLICATIONS[0]})
        assert few.status_code == 409 and "at least 50 reviewed cases" in few.text, few.text
    gated = settings.model_copy(update={"backtest_gates": gates,
                                        "backtest_gate_min_reviewed": 1})
    async with serve_api(gated) as base_url, \
            await person(pool, base_url, "gus", "cases:start", "cases:read") as gus:
        opened = await gus.post("/cases", json={"agent": "loan-officer",
                                                "input": SAMPLE_APPLICATIONS[0]})
        assert opened.status_code == 202, opened.text
        shut = await gus.post("/cases", json={"agent": "aml-screening", "input": {}})
        assert shut.status_code == 409, shut.text
        problem = shut.json()
        assert "backtest" in problem["detail"] and AGENTS["aml-screening"].digest in \
            problem["detail"] and "aml-screening@" in problem["detail"], problem


async def test_a_record_that_does_not_verify_opens_no_gate(
    decided: dict[uuid.UUID, Any], settings: Settings, pool: asyncpg.Pool,
) -> None:
    """A record written straight into the database (as anyone holding a role that may
    insert records could), naming aml-screening's digest and full agreement: signed by an
    unregistered key, or its body changed after signing, it opens no gate, nor does one
    signed by the worker's key over a hand-picked list or fewer reviewed cases than the
    minimum; the same record over a window of enough reviewed cases, signed by the
    registered worker key, does (inside a transaction rolled back,
    so the chain the other tests audit is untouched)."""
    agent = AGENTS["aml-screening"]

    def record(cases_listed: str | None, reviewed: int) -> bytes:
        return orjson.dumps({"challenger": {"agentDigest": agent.digest}, "results": [],
                             "selection": {"casesListed": cases_listed, "picked":
                                           cases_listed is not None, "since": None},
                             "summary": {"agreementWithReviewers": {"challenger": 1.0},
                                         "reviewed": reviewed}})

    body = record(None, 50)
    async with pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        try:
            backtest_id = uuid.uuid4()
            await conn.execute("INSERT INTO backtests (backtest_id, agent, request, "
                               "requested_by) VALUES ($1, 'aml-screening', '{}', 'x')",
                               backtest_id)
            store = BacktestStore(cast(asyncpg.Pool, conn))

            async def opens_with(signer: Signer, signed: bytes, kept: bytes) -> bool:
                """The record ``signer`` sealed over ``signed``, kept as ``kept``, chained
                last: does it open the gate? (Undone before the next.)"""
                savepoint = conn.transaction()
                await savepoint.start()
                try:
                    last = await conn.fetchrow("SELECT chain_seq, hash FROM backtest_records "
                                               "ORDER BY chain_seq DESC LIMIT 1")
                    assert last is not None  # the backtests above kept theirs
                    seal = signer.seal(last["hash"], signed)
                    await conn.execute(
                        "INSERT INTO backtest_records (backtest_id, chain_seq, body, "
                        "prev_hash, hash, key_id, sig) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                        backtest_id, last["chain_seq"] + 1, kept, seal.prev_hash, seal.hash,
                        seal.key_id, seal.sig)
                    # A gate of its own each time: a pass is kept for the gate's life.
                    await RolloutGate({"aml-screening": 0.9}).check(
                        store, KeyRegistry(pool), agent, "default")
                except Conflict:
                    return False
                finally:
                    await savepoint.rollback()
                return True

            assert not await opens_with(Signer.generate(), body, body)  # a key nobody registered
            lowered = body.replace(b"1.0", b"0.1")
            signer = worker_signer(settings)
            assert not await opens_with(signer, lowered, body)  # it signed other bytes
            assert await opens_with(signer, body, body)
            # Signed, agreeing, but on cases its asker picked, or too few reviewed ones.
            picked = record(hashlib.sha256(b"one reviewed case").hexdigest(), 50)
            assert not await opens_with(signer, picked, picked)
            assert not await opens_with(signer, record(None, 49), record(None, 49))
        finally:
            await transaction.rollback()


async def _ledger_appends(settings: Settings) -> None:
    """The ledger's work, once: the queue appended to the tree, a checkpoint signed."""
    ledger_pool = await component_pool(settings.identity("ledger"), 2)
    try:
        sequencer = Sequencer(ledger_pool, log_signer(settings), state=ledger_state(settings))
        await sequencer.start()
        await sequencer.drain()
        await sequencer.checkpoint()
    finally:
        await ledger_pool.close()


async def _verifies_offline_until_a_byte_changes(bundle: dict[str, Any], settings: Settings,
                                                 tmp_path: Path) -> None:
    signer = worker_signer(settings)
    log_key = Verifier.parse(bundle["log"]["verifierKeys"][-1])
    report = verify_backtest_bundle(bundle, [signer.public_key], [log_key])
    assert report.verified, [p.as_json() for p in report.problems]
    assert report.log is not None and report.log["eventsInLog"] == 1
    path = tmp_path / "backtest.json"
    path.write_bytes(orjson.dumps(bundle))
    cli = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "casetrail.cli", "verify-bundle", str(path),
                         "--trust", base64.b64encode(signer.public_key).decode(),
                         "--trust-log", bundle["log"]["verifierKeys"][-1]],
        env=settings.environment(), capture_output=True, text=True, timeout=60, check=False)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    # It speaks of a backtest's record and results, and says which checks it ran.
    assert f"its signed record and its {len(bundle['results'])} per-case results" \
        in cli.stdout and "each result against the digest" in cli.stdout, cli.stdout
    assert "checked: the record is in the log" in cli.stdout and "events" not in cli.stdout
    alone = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(STANDALONE_VERIFIER), str(path), "--trust",
                         base64.b64encode(signer.public_key).decode()],
        capture_output=True, text=True, timeout=60, check=False)
    assert alone.returncode == 0 and "verified: a backtest's record" in alone.stdout, \
        alone.stdout + alone.stderr
    # One byte of a result, or of the record, changed: caught.
    bent = orjson.loads(orjson.dumps(bundle))
    bent["results"][0]["challenger"] = "decline"
    assert "results_mismatch" in {p.code for p in verify_backtest_bundle(
        bent, [signer.public_key]).problems}
    bent = orjson.loads(orjson.dumps(bundle))
    bent["record"]["body"] = bent["record"]["body"].replace('"limit":1000', '"limit":1001')
    assert "hash_mismatch" in {p.code for p in verify_backtest_bundle(
        bent, [signer.public_key]).problems}
    path.write_bytes(orjson.dumps(bent))
    alone = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(STANDALONE_VERIFIER), str(path), "--trust",
                         base64.b64encode(signer.public_key).decode()],
        capture_output=True, text=True, timeout=60, check=False)
    assert alone.returncode == 1 and "hash_mismatch" in alone.stdout, alone.stdout
    cli = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "casetrail.cli", "verify-bundle", str(path),
                         "--trust", base64.b64encode(signer.public_key).decode()],
        env=settings.environment(), capture_output=True, text=True, timeout=60, check=False)
    assert cli.returncode == 1, cli.stdout + cli.stderr


async def test_the_audit_checks_every_backtest_record_and_finds_a_changed_result(
    decided: dict[uuid.UUID, Any], pool: asyncpg.Pool, settings: Settings,
) -> None:
    """``casetrail audit``'s backtest pass over the records the tests above kept: clean;
    then a result changed in place by the owner (triggers off and on again): found by a
    full pass, and by a pass after one that found it; not by a pass over what was
    logged since (none of these records)."""
    ledger = LedgerStore(pool)
    audit = WholeLog(AuditStore(pool), ledger, Evidence(CaseStore(pool), KeyRegistry(pool),
                                                        ledger), Auditor.of(settings))
    assert await pool.fetchval("SELECT count(*) FROM backtest_records") >= 2
    assert await audit._backtests(0, []) == []
    await wait_for_sql(pool, "SELECT NOT EXISTS (SELECT 1 FROM backtest_records r WHERE NOT "
                       "EXISTS (SELECT 1 FROM ledger_leaves l WHERE l.event_id = r.backtest_id))")
    size = await AuditStore(pool).tree_size()
    backtest_id = await pool.fetchval(
        "SELECT backtest_id FROM backtest_records ORDER BY chain_seq DESC LIMIT 1")
    original = await pool.fetchval(
        "SELECT result FROM backtest_results WHERE backtest_id = $1 AND position = 0",
        backtest_id)

    async def set_result(value: Any) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("ALTER TABLE backtest_results DISABLE TRIGGER USER")
            await conn.execute("UPDATE backtest_results SET result = $2 WHERE backtest_id = $1 "
                               "AND position = 0", backtest_id, value)
            await conn.execute("ALTER TABLE backtest_results ENABLE TRIGGER USER")

    await set_result({**original, "challenger": "decline"})
    try:
        [finding] = await audit._backtests(0, [])
        assert finding.kind == "altered" and str(backtest_id) in finding.detail \
            and "results_mismatch" in finding.detail, finding
        assert finding.as_json()["backtestId"] == str(backtest_id)
        assert await audit._backtests(size, []) == []  # logged before that pass
        assert await audit._backtests(size, [backtest_id]) == [finding]
    finally:
        await set_result(original)
    assert await audit._backtests(0, []) == []


def _policy(args: dict[str, Any], auto_approve: int) -> str:
    """The lending policy's decision, written again here with its auto-approve band as a
    parameter: what the challenger must decide, computed without its code."""
    if args["creditScore"] < 580 or args["dti"] > 0.5 or args["riskScore"] >= 0.25:
        return "decline"
    if args["creditScore"] >= auto_approve and args["dti"] <= 0.36 \
            and args["riskScore"] < 0.1 and args["loanAmount"] <= 50_000:
        return "approve"
    return "refer"


async def _two_hundred_decided(stack: Any, auth_headers: dict[str, str], pool: asyncpg.Pool
                               ) -> tuple[list[str], dict[str, str]]:
    """200 loan applications decided; of the referred, a person confirms some and
    overrides others (to approve). The case ids, and each reviewed case's label."""
    async with httpx.AsyncClient(base_url=stack.base_url, headers=auth_headers,
                                 timeout=30) as client:
        ids = []
        for number in range(200):
            reply = await client.post("/cases", json={"agent": "loan-officer", "input": {
                "applicantId": f"A-{7000 + number}", "applicantName": f"Applicant {number}",
                "loanAmount": 8_000 + 150 * number, "termMonths": 48,
                "monthlyIncome": 9_000, "monthlyDebt": 1_000 + 10 * number,
                "purpose": "used car"}})
            assert reply.status_code == 202, reply.text
            ids.append(reply.json()["caseId"])
        views = [await ended(client, c, timeout=120) for c in ids]
    waiting = [v["caseId"] for v in views if v["status"] == "awaiting_review"]
    assert len(waiting) >= 4, views  # some of each: confirmed, overridden
    labels = {}
    async with await person(pool, stack.base_url, "otto", "cases:review", "cases:read") as otto:
        for index, case_id in enumerate(waiting[: len(waiting) * 2 // 3]):
            body: dict[str, Any] = {"verdict": "confirm", "reason": "Refer stands."}
            if index % 2:
                body = {"verdict": "override", "reason": "Income verified.", "decision": {
                    "decision": "approve", "applicantId": "A-0000", "reasonCodes": [],
                    "rationale": "Verified income covers it."}}
            reply = await otto.post(f"/cases/{case_id}/review", json=body)
            assert reply.status_code == 202, reply.text
            labels[case_id] = "refer" if index % 2 == 0 else "approve"
        for case_id in labels:
            await ended(otto, case_id, statuses=("awaiting_review",))
    return ids, labels


async def test_two_hundred_cases_and_a_stricter_policy_give_the_matrix_computed_here(
    decided: dict[uuid.UUID, Any], stack: Any, auth_headers: dict[str, str],
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch, settings: Settings,
) -> None:
    """200 recorded loan cases, some reviewed (confirmed or overridden): a challenger
    whose policy approves from 750 instead of 700. The matrix, the agreement with the
    reviewers and the changed cases are what the record says they must be."""
    ids, labels = await _two_hundred_decided(stack, auth_headers, pool)
    await asyncio.sleep(0.5)  # the reviewed cases' terminal events reach Postgres
    expected: Counter[tuple[str, str]] = Counter()
    changed: list[str] = []
    agreed: Counter[str] = Counter()
    async with httpx.AsyncClient(base_url=stack.base_url, headers=auth_headers) as client:
        for case_id in ids:
            events = (await client.get(f"/cases/{case_id}/events")).json()["events"]
            [policy] = [c["toolArgs"] for e in events if e["eventType"] == "REACT_CYCLE"
                        for c in e["payload"].get("toolCalls") or []
                        if c["toolName"] == "lending-policy"]
            decided_by_agent = next(e for e in events if e["eventType"] in (
                "CASE_AWAITING_REVIEW", "CASE_COMPLETED"))["payload"]["answer"]["decision"]
            challenger = _policy(policy, 750)
            assert _policy(policy, 700) == decided_by_agent  # the rule, written again
            expected[(decided_by_agent, challenger)] += 1
            if challenger != decided_by_agent:
                changed.append(case_id)
            if case_id in labels:
                agreed["champion"] += decided_by_agent == labels[case_id]
                agreed["challenger"] += challenger == labels[case_id]
        assert changed, "the stricter band changes no case: the test proves nothing"
        events_before = await pool.fetchval(
            "SELECT count(*) FROM event_log WHERE case_id = ANY($1::uuid[])", ids)
    monkeypatch.setattr(loan_officer, "AUTO_APPROVE_SCORE", 750)
    async with await person(pool, stack.base_url, "bo", "backtests:run", "cases:read") as bo:
        asked = await bo.post("/backtests", json={"agent": "loan-officer", "cases": ids,
                                                  "concurrency": 8})
        assert asked.status_code == 202, asked.text
        view = await _done(bo, asked.headers["location"], 600)
        await _ledger_appends(settings)  # the report's bundle comes with its log proof
        made = await bo.get(f"{asked.headers['location']}/report")
    assert made.status_code == 200 and made.headers["content-type"] == "application/pdf"
    reader = pypdf.PdfReader(io.BytesIO(made.content))
    text = " ".join((page.extract_text() or "") for page in reader.pages)
    [(name, [attached])] = list(reader.attachments.items())
    assert hashlib.sha256(attached).hexdigest() == made.headers["x-casetrail-bundle-sha256"]
    assert name == f"casetrail-backtest-{view['backtestId']}.json"
    assert orjson.loads(attached)["backtestId"] == view["backtestId"]
    assert "Backtest report" in text and "verified" in text and "DOES NOT" not in text
    assert f"Decision changed {len(changed)}" in text and changed[0] in text
    assert view["status"] == "done", view
    found = view["summary"]
    assert found["cases"] == 200 and found["unansweredCalls"] == 0
    assert {(m["champion"], m["challenger"]): m["cases"] for m in found["matrix"]} == \
        dict(expected)
    assert sorted(found["changed"]) == sorted(changed)
    assert found["reviewed"] == len(labels)
    assert found["agreementWithReviewers"] == {
        side: round(agreed[side] / len(labels), 4) for side in ("champion", "challenger")}
    assert {r["caseId"]: r["label"] for r in view["results"] if r["label"]} == labels
    assert await pool.fetchval("SELECT count(*) FROM event_log WHERE case_id = ANY($1::uuid[])",
                               ids) == events_before  # nothing written for those cases


async def test_a_backtest_whose_runner_died_is_taken_over_and_another_tenant_sees_none(
    decided: dict[uuid.UUID, Any], stack: Any, pool: asyncpg.Pool,
) -> None:
    """A runner that stops noting progress loses its lease: the next takes the backtest
    over from the start, and the first cannot keep a record for it any more. A key of
    another tenant is told there is no such backtest."""
    store = BacktestStore(pool)
    backtest_id = uuid.uuid4()
    await store.ask(backtest_id, "default", "loan-officer", {
        "agent": "loan-officer", "cases": [str(c) for c in decided], "limit": 10,
        "concurrency": 1, "toolPolicy": "refuse"}, "test")
    # Taken by a runner that then died (its lease already run out)...
    await pool.execute("UPDATE backtests SET status = 'running', runner = 'gone', "
                       "lease_expires_at = now() - interval '1 second' WHERE backtest_id = $1",
                       backtest_id)
    # ... the worker's runner takes it over and finishes it.
    await wait_for_sql(pool, "SELECT status = 'done' FROM backtests WHERE backtest_id = $1",
                       backtest_id, timeout=30)
    row = await store.get(backtest_id)
    assert row is not None and row["cases_done"] == 3 and row["problem"] is None
    kept = await store.keep(backtest_id, "gone", [], lambda prev: (b"{}", Signer.generate()
                                                                   .seal(prev, b"{}")))
    assert kept is None  # the dead runner's late result is not kept
    assert await pool.fetchval("SELECT count(*) FROM backtest_records WHERE backtest_id = $1",
                               backtest_id) == 1
    async with await person(pool, stack.base_url, "ida", "cases:read") as ida:
        mine = await ida.get(f"/backtests/{backtest_id}")
        assert mine.status_code == 200 and mine.json()["progress"]["done"] == 3
    _, key = await ApiKeyStore(pool).create("elsewhere", ("cases:read", "backtests:run"),
                                            "another tenant")
    async with httpx.AsyncClient(base_url=stack.base_url,
                                 headers={"Authorization": f"Bearer {key}"}) as other:
        assert (await other.get(f"/backtests/{backtest_id}")).status_code == 404
        assert (await other.get(f"/backtests/{backtest_id}/bundle")).status_code == 404
        listed = (await other.get("/backtests")).json()["backtests"]
        assert str(backtest_id) not in {b["backtestId"] for b in listed}


class _HeldModel:
    """The loan officer's script, each turn waiting until the test lets it go."""

    def __init__(self) -> None:
        officer = AGENTS["loan-officer"]
        assert officer.script is not None
        self.inner = ScriptedModel(officer.script, name="challenger")
        self.asked = asyncio.Event()
        self.go = asyncio.Event()
        self.turns = 0

    @property
    def name(self) -> str:
        return self.inner.name

    async def request(self, messages: Any, tools: Any) -> Any:
        self.turns += 1
        self.asked.set()
        await self.go.wait()
        return await self.inner.request(messages, tools)


async def _run_held(runner_pool: asyncpg.Pool, pool: asyncpg.Pool, settings: Settings,
                    decided: dict[uuid.UUID, Any]
                    ) -> tuple[uuid.UUID, _HeldModel, asyncio.Task[None]]:
    """A backtest of the decided cases held by the test's runner ``mine`` (the worker's
    own never takes a backtest whose lease runs), which runs it over ``runner_pool`` with
    a lease of 0.9 s; returned once its model was first asked."""
    store = BacktestStore(runner_pool)
    backtest_id = uuid.uuid4()
    await store.ask(backtest_id, "default", "loan-officer", {
        "agent": "loan-officer", "cases": [str(c) for c in decided], "limit": 10,
        "concurrency": 1, "toolPolicy": "refuse",
        # A provider's model is the runner's to make (the scripted one it makes itself).
        "model": {"provider": "openai", "name": "held"}}, "test")
    row = await pool.fetchrow(
        "UPDATE backtests SET status = 'running', runner = 'mine', started_at = now(), "
        "lease_expires_at = now() + interval '1 minute' WHERE backtest_id = $1 "
        "RETURNING backtest_id", backtest_id)
    assert row is not None
    held = await store.get(backtest_id)
    assert held is not None
    model = _HeldModel()
    cases = CaseStore(runner_pool)
    runner = BacktestRunner(store, cases, Evidence(cases, KeyRegistry(runner_pool),
                                                   LedgerStore(runner_pool)),
                            worker_signer(settings),
                            lambda ref, profile: model, "mine", lease_seconds=0.9)
    running = asyncio.create_task(runner.run_claimed(held))
    await asyncio.wait_for(model.asked.wait(), 30)  # the first case's first turn
    return backtest_id, model, running


async def test_a_runner_whose_backtest_was_taken_over_stops_at_once(
    decided: dict[uuid.UUID, Any], pool: asyncpg.Pool, settings: Settings,
) -> None:
    """A runner that finds at its next note of progress that another runner holds its
    backtest stops there, keeping nothing, instead of running every case for a result
    the database would refuse."""
    backtest_id, model, running = await _run_held(pool, pool, settings, decided)
    await pool.execute("UPDATE backtests SET runner = 'thief' WHERE backtest_id = $1",
                       backtest_id)
    # The model never answers: only the lost lease can end the run.
    await asyncio.wait_for(running, 10)
    assert model.turns == 1
    assert await pool.fetchval("SELECT count(*) FROM backtest_records WHERE backtest_id = $1",
                               backtest_id) == 0
    assert await pool.fetchval("SELECT runner FROM backtests WHERE backtest_id = $1",
                               backtest_id) == "thief"
    await pool.execute("UPDATE backtests SET status = 'failed', problem = 'test', "
                       "finished_at = now() "
                       "WHERE backtest_id = $1", backtest_id)


async def test_a_runner_whose_note_of_progress_fails_for_good_stops_and_says_why(
    decided: dict[uuid.UUID, Any], pool: asyncpg.Pool, settings: Settings,
) -> None:
    """A note of progress that fails with anything but a transient error (here Postgres
    refuses the update) stops the run, keeping nothing, and the run raises that error:
    a run that cannot hold its lease is not left going on without one, unseen."""
    backtest_id, model, running = await _run_held(pool, pool, settings, decided)
    await pool.execute(f"""
        CREATE FUNCTION test_refuse_progress() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'progress refused by the test'; END $$;
        CREATE TRIGGER test_refuse_progress BEFORE UPDATE ON backtests FOR EACH ROW
            WHEN (OLD.backtest_id = '{backtest_id}') EXECUTE FUNCTION test_refuse_progress();
        """)
    try:
        # The model never answers: only the failed note can end the run.
        with pytest.raises(asyncpg.RaiseError, match="progress refused by the test"):
            await asyncio.wait_for(running, 10)
    finally:
        await pool.execute("DROP TRIGGER test_refuse_progress ON backtests; "
                           "DROP FUNCTION test_refuse_progress()")
    assert model.turns == 1
    assert await pool.fetchval("SELECT count(*) FROM backtest_records WHERE backtest_id = $1",
                               backtest_id) == 0
    await pool.execute("UPDATE backtests SET status = 'failed', problem = 'test', "
                       "finished_at = now() WHERE backtest_id = $1", backtest_id)


async def test_a_runner_whose_database_went_away_holds_its_backtest_and_finishes(
    decided: dict[uuid.UUID, Any], pool: asyncpg.Pool, settings: Settings,
) -> None:
    """The runner's connections to the database are cut while it runs: its notes of
    progress fail until the pool reconnects, and then hold the lease again — the run is
    not left without one — and it ends with its record kept."""
    runner_pool = await create_pool(settings.database_url, max_size=2,
                                    name="casetrail-test-backtest-runner")
    try:
        backtest_id, model, running = await _run_held(runner_pool, pool, settings, decided)
        cut = await pool.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'casetrail-test-backtest-runner'")
        assert cut >= 1
        await asyncio.sleep(2.0)  # more than twice the lease: only new notes can hold it
        assert await pool.fetchval(
            "SELECT lease_expires_at > now() AND runner = 'mine' FROM backtests "
            "WHERE backtest_id = $1", backtest_id) is True
        assert not running.done()
        model.go.set()
        await asyncio.wait_for(running, 60)
        assert await pool.fetchval("SELECT count(*) FROM backtest_records "
                                   "WHERE backtest_id = $1", backtest_id) == 1
    finally:
        await runner_pool.close()
