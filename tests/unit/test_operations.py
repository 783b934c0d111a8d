"""The shipped dashboard and alert rules name only metrics casetrail exports, and the
dashboard shows them all (that they parse and fire is tests/integration/test_promql.py,
which needs promtool)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

import casetrail.telemetry.metrics  # noqa: F401 - registers every casetrail_ metric
from casetrail.adapters.bus.probe import DEAD_LETTERS, QueueProbe
from casetrail.config import Settings
from casetrail.telemetry import metrics
from tests.support.operations import OPERATIONS, alert_expressions, dashboard_expressions

NAME = re.compile(r"\bcasetrail_[a-z_]+\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
            "gauge": ("",)}


def exported() -> dict[str, str]:
    """Every series name casetrail exports → its metric family."""
    names: dict[str, str] = {}
    for family in REGISTRY.collect():
        if family.name.startswith("casetrail_"):
            for suffix in SUFFIXES[family.type]:
                names[family.name + suffix] = family.name
    return names


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_the_expressions_name_only_exported_metrics(source: str) -> None:
    expressions = dashboard_expressions() if source == "dashboard" else alert_expressions()
    used = {name for e in expressions for name in NAME.findall(e)}
    assert used and used <= exported().keys(), sorted(used - exported().keys())


def test_the_dashboard_shows_every_metric() -> None:
    shown = {exported()[n] for e in dashboard_expressions() for n in NAME.findall(e)}
    assert shown == set(exported().values()), sorted(set(exported().values()) - shown)


def test_the_dead_letter_wait_counts_from_when_the_queue_last_was_empty() -> None:
    probe = QueueProbe(connection=None, queues={})  # type: ignore[arg-type]  # not run
    held = REGISTRY.get_sample_value
    probe.observe(DEAD_LETTERS, 0, now=100.0)
    assert held("casetrail_dead_letters_held_seconds") == 0
    probe.observe(DEAD_LETTERS, 2, now=110.0)
    probe.observe(DEAD_LETTERS, 1, now=170.0)
    assert held("casetrail_dead_letters_held_seconds") == 60.0
    assert held("casetrail_queue_messages", {"queue": DEAD_LETTERS}) == 1
    probe.observe(DEAD_LETTERS, 0, now=200.0)
    probe.observe(DEAD_LETTERS, 3, now=230.0)
    assert held("casetrail_dead_letters_held_seconds") == 0.0


def test_model_names_beyond_the_limit_share_one_label() -> None:
    for n in range(metrics.MAX_MODEL_LABELS + 5):
        metrics.for_agent("probe-agent", "openai", f"model-{n}").cycles.inc()
    labelled = {s.labels["model"] for family in REGISTRY.collect()
                if family.name == "casetrail_model_tokens" for s in family.samples
                if s.labels.get("agent") == "probe-agent"}
    assert "(other)" in labelled and len(labelled) <= metrics.MAX_MODEL_LABELS + 1


def test_the_compose_prometheus_config_scrapes_every_component() -> None:
    config = yaml.safe_load((OPERATIONS / "prometheus.yml").read_text())
    jobs = {job["job_name"]: set(job["static_configs"][0]["targets"])
            for job in config["scrape_configs"]}
    compose = yaml.safe_load((OPERATIONS.parent.parent / "docker-compose.yml").read_text())
    capability_workers = {name for name, service in compose["services"].items()
                          if service.get("command", [""])[0] == "capability-worker"}
    # A witness runs on an auditor's machine, not in this stack: it has no scrape job here.
    assert jobs == {f"casetrail-{c}": {f"{host}:{metrics.DEFAULT_PORTS[c]}" for host in (
        capability_workers if c == "capability" else {c})}
        for c in metrics.DEFAULT_PORTS if c != "witness"}


def test_docs_list_every_metric() -> None:
    listed = (OPERATIONS.parent / "operations.md").read_text()
    assert all(f"`{name}" in listed for name in set(exported().values()))


def test_a_taken_default_metrics_port_falls_back_and_a_taken_chosen_one_is_refused(
    settings: Settings,
) -> None:
    """Two consumers on one host: the second, left at the default port, takes a free one;
    a port set explicitly that is taken is a clear error, not a silent move."""
    import socket

    from casetrail.errors import PermanentError

    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", metrics.DEFAULT_PORTS["consumer"]))
        holder.listen()
    except OSError:  # someone (a demo stack's consumer) holds it already: as good
        pass
    try:
        fallback = metrics.serve(settings.model_copy(update={"consumer_metrics_port": None}),
                                 "consumer")
        try:
            assert fallback.server_port not in (0, metrics.DEFAULT_PORTS["consumer"])
            chosen = settings.model_copy(update={"consumer_metrics_port": fallback.server_port})
            with pytest.raises(PermanentError, match="CASETRAIL_CONSUMER_METRICS_PORT"):
                metrics.serve(chosen, "consumer")
        finally:
            fallback.shutdown()
            fallback.server_close()
    finally:
        holder.close()


def test_the_command_line_finds_its_files_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`casetrail reviews list` from another directory said "no identity for the api":
    a stack's files live in the user's configuration directory; a project's .casetrail/
    (in the working directory or above) is found only as a fallback, and the two
    holding different files is an error, never a guess."""
    from casetrail.config import local_file
    from casetrail.errors import PermanentError

    monkeypatch.delenv("CASETRAIL_HOME", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    home = tmp_path / "config" / "casetrail"
    deep = tmp_path / "project" / "src" / "agents"
    deep.mkdir(parents=True)
    assert local_file("ns.identities.json", deep) == home / "ns.identities.json"  # new here
    old = tmp_path / "project" / ".casetrail"
    old.mkdir()
    (old / "ns.identities.json").write_text("{}")
    assert local_file("ns.identities.json", deep) == (old / "ns.identities.json").resolve()
    home.mkdir(parents=True)
    (home / "ns.identities.json").write_text("{}")  # the same file in both: one file
    assert local_file("ns.identities.json", deep) == home / "ns.identities.json"
    (home / "ns.identities.json").write_text('{"other": 1}')
    with pytest.raises(PermanentError, match=r"both hold ns\.identities\.json, and they differ"):
        local_file("ns.identities.json", deep)
    monkeypatch.setenv("CASETRAIL_HOME", str(tmp_path / "elsewhere"))
    assert local_file("ns.identities.json", deep) == tmp_path / "elsewhere" / "ns.identities.json"
