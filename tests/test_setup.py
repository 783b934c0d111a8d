"""``casetrail setup`` sets the broker policies, idempotently, named after the namespace
(so a test stack's never touch a live one's)."""

from __future__ import annotations

import asyncio
import base64
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


def test_setup_sets_the_policy_through_the_management_api(settings: Settings) -> None:
    """Where the broker runs elsewhere (docker-compose), the same policy goes to the
    management HTTP API; a local server speaking its wire format records the PUT."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from typing import Any

    received: list[tuple[str, str | None, Any]] = []

    class Management(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append((self.path, self.headers.get("Authorization"), body))
            self.send_response(201)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Management)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = settings.environment(CASETRAIL_RABBITMQ_MANAGEMENT_URL=(
            f"http://admin:s%40cret@127.0.0.1:{server.server_address[1]}"))
        done = subprocess.run([sys.executable, "-m", "service.cli", "setup"], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    (path, authorization, body), = received
    assert path == f"/api/policies/%2F/{settings.namespace}-case-start-limit"
    assert authorization == "Basic " + base64.b64encode(b"admin:s@cret").decode()
    assert body == {"pattern": f"^{re.escape(settings.namespace + '.case-start')}$",
                    "definition": {"max-length": 100_000, "overflow": "reject-publish"},
                    "apply-to": "queues"}
