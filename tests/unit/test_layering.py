"""The architecture, checked: what the API process loads, and that aiormq's private
members are touched only by the fast path. The layers themselves are import-linter
contracts (pyproject.toml, `lint-imports` in `make test`)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support import ROOT

PRODUCTION = [*sorted((ROOT / "service").rglob("*.py")),
              *sorted((ROOT / "consumers").rglob("*.py"))]


def test_the_api_process_loads_no_worker_capability_worker_or_consumer_code() -> None:
    code = (
        "import sys\n"
        "from casetrail.api import create_app\n"
        "from casetrail.config import Settings\n"
        "create_app(Settings())\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('casetrail')))\n"
    )
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True, cwd=ROOT).stdout.split())
    assert "casetrail.api.app" in loaded  # the probe really built the app
    # (casetrail.adapters.bus.deliveries is allowed: the API consumes its own queue of live
    # events for the streams through it, the one way casetrail consumes a queue.)
    forbidden = {"casetrail.components.worker", "casetrail.components.capability_worker",
                 "casetrail.adapters.bus.rpc", "casetrail.engine.loop", "casetrail.cli.demo"}
    assert not loaded & forbidden, sorted(loaded & forbidden)
    assert not any(m.startswith("casetrail.consumers") for m in loaded)


def test_no_private_aiormq_member_is_used_outside_the_fast_path_module() -> None:
    private = re.compile(
        r"\._(on_confirm_frame|on_close_frame|on_deliver_frame|get_frame|read_content)\b"
        r"|\b(confirmations|message_id_delivery_tag|write_queue|delivery_tag \+=)\b"
        r"|FrameReceiver"
    )
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in PRODUCTION if path.name != "fastpath.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert offenders == []
