"""What the broker itself lists, read with ``rabbitmqctl`` as an operator would."""

from __future__ import annotations

import subprocess
from typing import Any

import orjson

from casetrail.ops.setup import rabbitmqctl_environment


def rabbitmqctl_json(*args: str) -> list[dict[str, Any]]:
    """``rabbitmqctl -q <args> --formatter json``, parsed."""
    listed = subprocess.run(["rabbitmqctl", "-q", *args, "--formatter", "json"],
                            capture_output=True, text=True, check=True, timeout=60,
                            env=rabbitmqctl_environment())
    return orjson.loads(listed.stdout)  # type: ignore[no-any-return]
