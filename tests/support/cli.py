"""Running the ``casetrail`` command line as a test would: in a subprocess, with the
namespace's settings, and ``verify-bundle`` with nothing but the bundle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from casetrail.config import Settings
from tests.support import ROOT

DOCS = ROOT / "docs"


STANDALONE_VERIFIER = DOCS / "verify_bundle.py"


def run_cli(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "casetrail.cli", *args], capture_output=True,
                          text=True, env={**settings.environment(), **env}, timeout=60,
                          check=False)


def check_bundle(settings: Settings, path: Path, *trust: str
                 ) -> subprocess.CompletedProcess[str]:
    """``verify-bundle`` with the broker and the database out of reach (closed ports)."""
    return run_cli(settings, "verify-bundle", str(path), *(a for t in trust
                                                            for a in ("--trust", t)),
                   CASETRAIL_AMQP_URL="amqp://nobody:nothing@127.0.0.1:1/",
                   CASETRAIL_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none")
