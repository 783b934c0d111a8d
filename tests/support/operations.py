"""The shipped operations files (docs/operations/): the dashboard's and the alert rules'
expressions, and promtool, which the integration tier runs on them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from tests.support import ROOT

OPERATIONS = ROOT / "docs" / "operations"
ALERTS = OPERATIONS / "prometheus-alerts.yml"
DASHBOARD = OPERATIONS / "grafana-dashboard.json"
PROMTOOL = os.environ.get("CASETRAIL_PROMTOOL", "promtool")


def promtool(*args: str, cwd: Path = OPERATIONS) -> str:
    done = subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def dashboard_expressions() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]


def alert_expressions() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
