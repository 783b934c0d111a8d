"""The shipped dashboard, alert rules and Prometheus config, read by promtool
(scripts/ensure-promtool): every PromQL expression parses, the alert rules' own unit
tests pass, and the compose stack's scrape config is valid."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.operations import ALERTS, dashboard_expressions, promtool


def test_the_alert_rules_are_valid_and_their_unit_tests_pass() -> None:
    assert "SUCCESS" in promtool("check", "rules", ALERTS.name)
    assert "SUCCESS" in promtool("test", "rules", "prometheus-alerts.test.yml")


def test_every_dashboard_expression_is_valid_promql(tmp_path: Path) -> None:
    expressions = dashboard_expressions()
    assert len(expressions) >= 20
    # Grafana's $__rate_interval is not PromQL: a duration stands in for it.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"casetrail:panel_{n}", "expr": e.replace("$__rate_interval", "5m")}
        for n, e in enumerate(expressions)]}]}
    (tmp_path / "panels.yml").write_text(yaml.safe_dump(rules))
    assert f"SUCCESS: {len(expressions)} rules found" in promtool(
        "check", "rules", "panels.yml", cwd=tmp_path)


def test_the_compose_prometheus_config_is_valid() -> None:
    assert "SUCCESS" in promtool("check", "config", "prometheus.yml")
