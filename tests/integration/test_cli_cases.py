"""``casetrail cases start|list|show|cancel`` against the real stack: the operations the
API calls, with the API's scopes and tenancy, and the CLI's exit-code rule (0 done,
1 refused, 2 not found or could not)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import orjson

from casetrail.adapters.store import ApiKeyStore
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings
from tests.support.helpers import wait_for_sql
from tests.support.stack import InProcessStack, module_stack

stack = module_stack(worker_concurrency=4)


def cli(settings: Settings, *args: str, key: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    env = settings.environment()
    env.pop("CASETRAIL_API_KEY", None)
    if key is not None:
        env["CASETRAIL_API_KEY"] = key
    return subprocess.run([sys.executable, "-m", "casetrail.cli", "cases", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


async def run(settings: Settings, *args: str, key: str | None = None
              ) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cli, settings, *args, key=key)


async def test_the_operator_starts_lists_shows_a_case_and_a_repeat_is_the_same_case(
    settings: Settings, stack: InProcessStack, pool: asyncpg.Pool, tmp_path: Path,
) -> None:
    application = tmp_path / "application.json"
    application.write_bytes(orjson.dumps(SAMPLE_APPLICATIONS[0]))
    started = await run(settings, "start", "loan-officer", "--input", str(application),
                        "--tenant", "cli-bank", "--idempotency-key", "cli-1")
    assert started.returncode == 0, started.stderr
    case = orjson.loads(started.stdout)
    assert case["tenant"] == "cli-bank" and case["status"] == "queued"
    assert case["replayed"] is False
    case_id = case["caseId"]
    again = await run(settings, "start", "loan-officer", "--input", str(application),
                      "--tenant", "cli-bank", "--idempotency-key", "cli-1")
    repeated = orjson.loads(again.stdout)  # the same case, however far it has got
    assert repeated["caseId"] == case_id and repeated["replayed"] is True
    await wait_for_sql(pool, "SELECT status = 'completed' FROM cases WHERE case_id = $1",
                       uuid.UUID(case_id))
    shown = await run(settings, "show", case_id)
    assert shown.returncode == 0, shown.stderr
    view = orjson.loads(shown.stdout)
    assert view["status"] == "completed" and view["answer"]["decision"] == "approve"
    assert view["integrity"]["verified"] is True
    assert view["input"]["applicantName"] == SAMPLE_APPLICATIONS[0]["applicantName"]  # admin
    assert await pool.fetchval("SELECT started_by FROM cases WHERE case_id = $1",
                               uuid.UUID(case_id)) == "operator"
    listed = await run(settings, "list", "--tenant", "cli-bank", "--json")
    assert [item["caseId"] for item in orjson.loads(listed.stdout)["items"]] == [case_id]
    assert (await run(settings, "list", "--tenant", "elsewhere", "--json")
            ).stdout.count(case_id) == 0
    ended = await run(settings, "cancel", case_id)
    assert ended.returncode == 1 and "has already ended" in ended.stderr


async def test_an_api_key_acts_with_its_own_tenant_and_scopes(
    settings: Settings, stack: InProcessStack, pool: asyncpg.Pool, tmp_path: Path,
) -> None:
    keys = ApiKeyStore(pool)
    _, reader = await keys.create("cli-reader", ("cases:read",), "cli test")
    _, starter = await keys.create("cli-starter", ("cases:start", "cases:read"), "cli test")
    application = tmp_path / "application.json"
    application.write_bytes(orjson.dumps(SAMPLE_APPLICATIONS[1]))
    refused = await run(settings, "start", "loan-officer", "--input", str(application),
                        key=reader)
    assert refused.returncode == 1 and "lacks the scope 'cases:start'" in refused.stderr
    started = await run(settings, "start", "loan-officer", "--input", str(application),
                        key=starter)
    assert started.returncode == 0, started.stderr
    case = orjson.loads(started.stdout)
    assert case["tenant"] == "cli-starter"
    # Another tenant's case is not found, as over REST (its existence not confirmed).
    hidden = await run(settings, "show", case["caseId"], key=reader)
    assert hidden.returncode == 2 and f"no case {case['caseId']}" in hidden.stderr
    forged = await run(settings, "show", case["caseId"], key="ct_not-a-real-key")
    assert forged.returncode == 1 and "unknown, revoked or expired" in forged.stderr


async def test_bad_input_is_refused_naming_the_field_and_nothing_is_kept(
    settings: Settings, stack: InProcessStack, pool: asyncpg.Pool, tmp_path: Path,
) -> None:
    before = await pool.fetchval("SELECT count(*) FROM cases")
    bad = tmp_path / "bad.json"
    bad.write_bytes(orjson.dumps({**SAMPLE_APPLICATIONS[0], "loanAmount": -5}))
    refused = await run(settings, "start", "loan-officer", "--input", str(bad))
    assert refused.returncode == 1 and "body.input.loanAmount" in refused.stderr
    unknown = await run(settings, "start", "no-such-agent", "--input", str(bad))
    assert unknown.returncode == 1 and "unknown agent 'no-such-agent'" in unknown.stderr
    missing = await run(settings, "show", str(uuid.uuid4()))
    assert missing.returncode == 2
    assert await pool.fetchval("SELECT count(*) FROM cases") == before
