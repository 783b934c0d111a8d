"""``casetrail setup`` sets the broker policies, idempotently, named after the namespace
(so a test stack's never touch a live one's)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

from service.config import Settings


def _policies() -> dict[str, dict[str, object]]:
    listed = subprocess.run(["rabbitmqctl", "-q", "list_policies", "--formatter", "json"],
                            capture_output=True, text=True, check=True, timeout=60).stdout
    return {p["name"]: p for p in json.loads(listed)}


async def test_setup_bounds_the_start_queue_with_a_policy(settings: Settings) -> None:
    name = f"{settings.namespace}-case-start-limit"
    env = settings.environment(CASETRAIL_START_QUEUE_MAX_LENGTH="1234")
    try:
        for _ in range(2):  # idempotent
            done = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "service.cli", "setup"], env=env,
                capture_output=True, text=True, timeout=60, check=False)
            assert done.returncode == 0, done.stderr
            assert name in done.stdout
        policy = (await asyncio.to_thread(_policies))[name]
        assert policy["pattern"] == f"^{re.escape(settings.namespace + '.case-start')}$"
        definition = policy["definition"]  # rabbitmqctl gives it as JSON text
        assert json.loads(str(definition)) == {"max-length": 1234, "overflow": "reject-publish"}
        assert policy["apply-to"] == "queues"
    finally:
        await asyncio.to_thread(subprocess.run, ["rabbitmqctl", "-q", "clear_policy", name],
                                capture_output=True, check=False)
