"""The container files and the README agree with the CLI that really exists.

No Docker engine runs here, so these check what can be checked: every compose
service runs a real ``casetrail`` subcommand (and that subcommand starts), the
start order waits on health, the image is non-root, and the README documents
the same commands.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.main import get_command

from casetrail.agents import CAPABILITIES
from casetrail.cli.main import app
from tests.support import ROOT

COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
README = (ROOT / "README.md").read_text()
SUBCOMMANDS = set(get_command(app).commands)  # type: ignore[attr-defined]
OURS = {name: svc for name, svc in COMPOSE["services"].items() if "command" in svc}
CAPABILITY_WORKERS = {name: svc for name, svc in OURS.items()
                      if svc["command"][0] == "capability-worker"}
GROUPS = {"signer", "ledger"}


def test_the_cli_has_the_designed_subcommands() -> None:
    assert {"migrate", "up", "api", "worker", "consumer", "capability-worker", "demo", "tail",
            "trail", "dead-letters"} <= SUBCOMMANDS


def test_compose_has_every_component() -> None:
    assert {"rabbitmq", "postgres", "setup", "api", "worker", "consumer",
            "ledger"} <= set(COMPOSE["services"])
    # Every capability served, each by a service of its own.
    assert sorted(name for svc in CAPABILITY_WORKERS.values() for name in svc["command"][1:]) \
        == sorted(CAPABILITIES)


@pytest.mark.parametrize("name", sorted(OURS))
def test_each_compose_service_runs_a_real_documented_subcommand(name: str) -> None:
    command = OURS[name]["command"]
    assert command[0] in SUBCOMMANDS
    # A command group (``signer``, ``ledger``) names its subcommand next, if any.
    path = command[:2] if command[0] in GROUPS else command[:1]
    assert f"casetrail {' '.join(path)}" in README
    shown = subprocess.run([sys.executable, "-m", "casetrail.cli", *path, "--help"],
                           capture_output=True, text=True, timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    for option in (a for a in command[1:] if a.startswith("--")):
        assert option in shown.stdout, f"{name}: {option} is not an option of {command[0]}"


COMPONENTS = {"api": "API", "worker": "WORKER", "consumer": "CONSUMER", "ledger": "LEDGER"}


def test_start_order_waits_on_health_and_setup() -> None:
    for name in ("rabbitmq", "postgres", "api"):
        assert "healthcheck" in COMPOSE["services"][name]
    for name in [*COMPONENTS, *CAPABILITY_WORKERS]:
        depends = OURS[name]["depends_on"]
        assert depends["rabbitmq"]["condition"] == "service_healthy"
        assert depends["postgres"]["condition"] == "service_healthy"
        assert depends["setup"]["condition"] == "service_completed_successfully"


def test_compose_sets_up_the_identities_through_the_management_api() -> None:
    setup = OURS["setup"]
    assert setup["command"] == ["setup"]
    assert "@rabbitmq:15672" in setup["environment"]["CASETRAIL_RABBITMQ_MANAGEMENT_URL"]
    assert COMPOSE["services"]["rabbitmq"]["image"].split(":")[1].endswith("-management")
    for prefix in COMPONENTS.values():
        assert f"CASETRAIL_{prefix}_AMQP_URL" in setup["environment"]
    given = json.loads(setup["environment"]["CASETRAIL_CAPABILITY_AMQP_URLS"])
    assert set(given) == set(CAPABILITIES)
    # Setup registers the public half of each capability's sealing key.
    keys = json.loads(setup["environment"]["CASETRAIL_CAPABILITY_SEALING_KEYS"])
    assert set(keys) == set(CAPABILITIES)


def test_each_component_holds_only_its_own_identity() -> None:
    """The bootstrap (admin) URLs go to setup alone; a component's environment names
    its own user and password, nobody else's."""
    for name, prefix in COMPONENTS.items():
        environment = OURS[name]["environment"]
        assert "CASETRAIL_AMQP_URL" not in environment
        assert "CASETRAIL_DATABASE_URL" not in environment
        text = " ".join(f"{k}={v}" for k, v in environment.items())
        assert f"CASETRAIL_{prefix}_AMQP_URL" in environment
        assert f"${{CASETRAIL_{prefix}_PASSWORD:?}}" in text
        for other in set(COMPONENTS.values()) - {prefix}:
            assert other not in text.replace(f"CASETRAIL_{prefix}_", ""), (name, other)
        # The master key (sensitive values) goes to the two that seal and open them.
        assert ("CASETRAIL_MASTER_KEY" in environment) == (name in ("api", "worker"))


def test_the_auditor_holds_only_its_own_database_role() -> None:
    """No component connects as the bootstrap (superuser) URL, the auditor included: it
    reads the log and appends its passes as its own role; setup makes that role."""
    environment = OURS["auditor"]["environment"]
    assert not {"CASETRAIL_DATABASE_URL", "CASETRAIL_AMQP_URL",
                "CASETRAIL_MASTER_KEY"} & set(environment)
    assert environment["CASETRAIL_AUDITOR_DATABASE_URL"].startswith(
        "postgresql://casetrail_auditor:${CASETRAIL_AUDITOR_PASSWORD:?}@")
    assert OURS["setup"]["environment"]["CASETRAIL_AUDITOR_DATABASE_URL"] == \
        environment["CASETRAIL_AUDITOR_DATABASE_URL"]
    for name, service in OURS.items():
        if name != "setup":
            assert "CASETRAIL_DATABASE_URL" not in service.get("environment", {}), name


def test_each_capability_worker_holds_only_its_capabilitys_identity() -> None:
    for name, service in CAPABILITY_WORKERS.items():
        environment = service["environment"]
        served = service["command"][1:]
        urls = json.loads(environment["CASETRAIL_CAPABILITY_AMQP_URLS"])
        assert sorted(urls) == sorted(served), name
        for capability, url in urls.items():
            variable = f"CASETRAIL_CAPABILITY_{capability.upper().replace('-', '_')}_PASSWORD"
            assert url.startswith(f"amqp://casetrail-capability-{capability}:${{{variable}:?}}@")
        keys = json.loads(environment["CASETRAIL_CAPABILITY_SEALING_KEYS"])
        assert sorted(keys) == sorted(served), name  # its own sealing key, nobody else's
        for capability, key in keys.items():
            variable = f"CASETRAIL_CAPABILITY_{capability.upper().replace('-', '_')}_SEALING_KEY"
            assert key == f"${{{variable}:?}}"
        assert not {"CASETRAIL_AMQP_URL", "CASETRAIL_MASTER_KEY"} & set(environment)
        assert not any(k.endswith("_DATABASE_URL") for k in environment)  # no database


def test_compose_is_hardened() -> None:
    raw = (ROOT / "docker-compose.yml").read_text()
    assert "guest:" not in raw and "guest@" not in raw  # no URL with the guest user
    for name, service in COMPOSE["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
        if name in OURS:
            assert service["read_only"] is True
            assert service["cap_drop"] == ["ALL"]
            assert "no-new-privileges:true" in service["security_opt"]
        else:  # a base image, pinned to an exact release (3.10.25, v2.42.0), not a major
            tag = service["image"].split(":")[1]
            assert re.match(r"^v?\d+\.\d+", tag), (name, tag)
    assert "${CASETRAIL_POSTGRES_PASSWORD:?" in raw
    assert "${CASETRAIL_RABBITMQ_ADMIN_PASSWORD:?" in raw


@pytest.mark.parametrize(("component", "maker", "variable"), [
    ("worker", "signing-key", "CASETRAIL_SIGNING_KEY_FILE"),
    ("ledger", "log-key", "CASETRAIL_LOG_KEY_FILE"),
    ("api", "action-key", "CASETRAIL_ACTION_KEY_FILE"),
    ("auditor", "audit-key", "CASETRAIL_AUDIT_KEY_FILE"),
])
def test_each_signer_signs_with_a_key_only_it_mounts(
    component: str, maker: str, variable: str,
) -> None:
    service = OURS[component]
    assert service["depends_on"][maker]["condition"] == "service_completed_successfully"
    key_file = service["environment"][variable]
    assert service["volumes"][0] == f"{maker}:/keys:ro"
    assert key_file.startswith("/keys/") and key_file in OURS[maker]["command"]
    others = [s for n, s in OURS.items() if n not in (component, maker)]
    assert all(f"{maker}:" not in " ".join(s.get("volumes", [])) for s in others)


@pytest.mark.parametrize(("component", "variable", "volume"), [
    ("ledger", "CASETRAIL_LEDGER_STATE_FILE", "ledger-state"),
    ("auditor", "CASETRAIL_AUDIT_STATE_FILE", "audit-state"),
])
def test_state_kept_off_the_database_is_in_a_writable_volume_of_its_own(
    component: str, variable: str, volume: str,
) -> None:
    """The ledger's high-water mark and the auditor's last pass are each kept in a
    volume that only their component mounts (docs/operations.md, "Backup and
    restore"), owned by the image's user."""
    service = OURS[component]
    state = service["environment"][variable]
    assert state.startswith("/state/") and f"{volume}:/state" in service["volumes"]
    assert volume in COMPOSE["volumes"]
    assert all(f"{volume}:" not in " ".join(s.get("volumes", []))
               for n, s in OURS.items() if n != component)
    assert "/state" in (ROOT / "Dockerfile").read_text()


def test_the_workers_archive_is_a_writable_volume_of_its_own() -> None:
    """The retention pass archives bundles to CASETRAIL_ARCHIVE_DIR: a named volume the
    worker writes (docs/operations.md, "Archives"), a mount point the image's user owns."""
    worker = OURS["worker"]
    assert worker["environment"]["CASETRAIL_ARCHIVE_DIR"] == "/archive"
    assert "archive:/archive" in worker["volumes"] and "archive" in COMPOSE["volumes"]
    assert "/archive" in (ROOT / "Dockerfile").read_text()


def test_dockerfile_is_slim_non_root_and_runs_the_cli() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    stages = dockerfile.split("\nFROM ")
    final = stages[-1]
    assert final.startswith("python:3.11.11-slim")  # an exact version
    assert "build-essential" not in final and "gcc" not in final
    assert "USER casetrail" in final
    assert 'ENTRYPOINT ["casetrail"]' in final
    assert "COPY migrations" in final and "CASETRAIL_MIGRATIONS_DIR=/app/migrations" in dockerfile


def test_readme_front_door_and_ci_call_make_test() -> None:
    assert "make demo" in README and "make test" in README
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "ensure-services" in makefile and "ruff" in makefile and "mypy" in makefile


def test_the_wheel_the_image_installs_carries_the_viewer(tmp_path: Path) -> None:
    """The image installs the wheel, not the checkout: the viewer's files must be in it."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--wheel-dir", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("casetrail-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    ui = {p.name for p in (ROOT / "service" / "api" / "ui").iterdir()}
    assert {f"casetrail/api/ui/{name}" for name in ui} <= names
    # ... the public authoring API that plugins import, and the event-log consumer ...
    assert {"casetrail/__init__.py", "casetrail/py.typed", "casetrail/testing.py",
            "casetrail/consumers/event_log.py"} <= names
    # ... and nothing else at the top level: one package, ``casetrail``.
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert {name.split("/")[0] for name in names} == {
        "casetrail", f"casetrail-{version}.dist-info"}
    top_level = next(n for n in names if n.endswith("dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["casetrail"]


def test_every_package_folder_is_installed() -> None:
    """pyproject.toml lists the packages (service/ and consumers/ install as casetrail):
    a new folder left out of the list would be missing from the wheel."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    folders = {"casetrail" + "".join(f".{part}" for part in p.parent.relative_to(
        ROOT / "service").parts) for p in (ROOT / "service").rglob("__init__.py")}
    folders |= {"casetrail.consumers" + "".join(f".{part}" for part in p.parent.relative_to(
        ROOT / "consumers").parts) for p in (ROOT / "consumers").rglob("__init__.py")}
    assert listed == folders
