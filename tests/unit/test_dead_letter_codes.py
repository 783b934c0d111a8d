"""The dead-letter codes the alerts name are the codes components set messages aside
with: renaming one cannot silently blind an alert."""

from __future__ import annotations

import re

import yaml

from casetrail.contract.dead_letters import DeadLetterCode
from tests.support import ROOT


def test_every_code_an_alert_names_is_one_a_component_uses() -> None:
    rules = yaml.safe_load((ROOT / "docs/operations/prometheus-alerts.yml").read_text())
    named: set[str] = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            for pattern in re.findall(r'casetrail_dead_lettered_total\{reason=~\s*"([^"]+)"',
                                      rule["expr"]):
                named |= set(pattern.split("|"))
    assert named, "no alert names a dead-letter code"
    assert named <= {c.value for c in DeadLetterCode}, named - {c.value for c in DeadLetterCode}
