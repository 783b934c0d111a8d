"""Your agent, not ours: an agent and its capability written with the public
``casetrail`` API in a package of their own, found through entry points or
``CASETRAIL_AGENTS``, run end to end by separate processes on the real broker and
database; a broken or colliding plugin stops a component at start, naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from pydantic import BaseModel

from casetrail import Agent, DeclarationError, LocalTool, McpTool, ModelRef, capability
from casetrail.agents import PluginError, discover
from casetrail.config import Settings

OVERDRAFT = "tests.plugins.overdraft:OVERDRAFT"
REQUEST = {"accountId": "ACC-1230", "holderName": "Jo Bloggs", "requestedLimit": 500}


def installed(root: Path, name: str, entries: dict[str, list[str]]) -> Path:
    """``root`` holding an installed distribution ``name`` 1.2 with these entry points
    (group → ``name = module:attr`` lines), as pip would leave it."""
    info = root / f"{name.replace('-', '_')}-1.2.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{line}\n" for line in lines) + "\n"
        for group, lines in entries.items()))
    return root


def casetrail(settings: Settings, *args: str, path: Path | None = None,
              **env: str) -> subprocess.CompletedProcess[str]:
    extra = {"PYTHONPATH": str(path)} if path is not None else {}
    return subprocess.run([sys.executable, "-m", "casetrail.cli", *args],
                          env=settings.environment(**extra, **env), capture_output=True,
                          text=True, timeout=60, check=False)


def test_an_installed_plugin_is_listed_with_the_package_it_came_from(
    settings: Settings, tmp_path: Path,
) -> None:
    path = installed(tmp_path, "overdraft-plugin",
                     {"casetrail.agents": [f"overdraft = {OVERDRAFT}"]})
    listed = casetrail(settings, "agents", "--json", path=path)
    assert listed.returncode == 0, listed.stderr
    found = orjson.loads(listed.stdout)
    agent = next(a for a in found["agents"] if a["name"] == "overdraft-review")
    assert agent["version"] == "0.3.0"
    assert agent["tools"] == ["overdraft-history", "monthly-fee"]
    assert agent["from"].startswith("package overdraft-plugin 1.2 (entry point "
                                    "casetrail.agents:overdraft")
    capabilities = {c["name"]: c["from"] for c in found["capabilities"]}
    assert capabilities["overdraft-history"] == agent["from"]
    assert capabilities["credit-score"] == "casetrail (built-in)"


def test_a_broken_plugin_stops_every_component_at_start_naming_its_package(
    settings: Settings, tmp_path: Path,
) -> None:
    path = installed(tmp_path, "broken-plugin", {"casetrail.agents": [
        "broken = tests.plugins.broken:AGENT"]})
    for command in (["agents"], ["worker"], ["capability-worker"], ["api", "--port", "0"]):
        refused = casetrail(settings, *command, path=path)
        assert refused.returncode == 2, (command, refused.stderr)
        assert "package broken-plugin 1.2" in refused.stderr, command
        assert "this release of the plugin is broken" in refused.stderr, command
        assert "Traceback" not in refused.stderr, command


def test_two_plugins_declaring_one_name_are_refused_naming_both(
    settings: Settings, tmp_path: Path,
) -> None:
    installed(tmp_path, "first-plugin", {"casetrail.agents": [f"a = {OVERDRAFT}"]})
    installed(tmp_path, "second-plugin", {"casetrail.agents": [f"b = {OVERDRAFT}"]})
    refused = casetrail(settings, "agents", path=tmp_path)
    assert refused.returncode == 2
    assert "'overdraft-review' is declared twice" in refused.stderr
    assert "first-plugin" in refused.stderr and "second-plugin" in refused.stderr


async def test_a_plugin_author_tests_the_agent_in_process_with_the_packages_helper() -> None:
    """``casetrail.testing.run_case``: the same engine, answer schema and checks, no
    stack."""
    from casetrail.testing import run_case
    from tests.plugins.overdraft import OVERDRAFT as AGENT

    run = await run_case(AGENT, REQUEST)
    assert run.status == "completed"
    assert run.answer == {"decision": "approve", "bouncedPayments12m": 0, "monthlyFee": 10}
    assert [c["name"] for c in run.checks] == ["history-consulted", "history-of-the-holder"]
    assert all(c["passed"] for c in run.checks), run.checks
    assert [call["toolName"] for cycle in run.cycles for call in cycle["toolCalls"]] == [
        "overdraft-history", "monthly-fee"]
    referred = await run_case(AGENT, {**REQUEST, "accountId": "ACC-1231"})  # one bounce
    assert referred.answer is not None and referred.answer["decision"] == "refer"


def test_the_holder_check_refuses_another_holders_history_and_names_it() -> None:
    from casetrail import CheckContext
    from tests.plugins.overdraft import history_of_the_holder

    def looked_up(name: str) -> CheckContext:
        return CheckContext(input=REQUEST, answer={"decision": "approve"}, tool_calls=(
            {"toolName": "overdraft-history",
             "toolArgs": {"accountId": "ACC-1230", "holderName": name}},))

    assert history_of_the_holder(looked_up("Jo Bloggs")) == (True, "the holder's own history")
    passed, detail = history_of_the_holder(looked_up("[pii:holderName]"))
    assert not passed and "[pii:holderName]" in detail


class Args(BaseModel):
    text: str


def test_a_declaration_that_cannot_run_is_refused_with_the_reason() -> None:
    with pytest.raises(DeclarationError, match="has no script"):
        Agent(name="no-brain", version="1", description="d", instructions="i",
              input=Args, answer=Args).profile()
    assert Agent(name="real-model", version="1", description="d", instructions="i",
                 input=Args, answer=Args, model=ModelRef(provider="openai", name="gpt-4o-mini")
                 ).profile().script is None
    with pytest.raises(DeclarationError, match="answer must be a pydantic model"):
        Agent(name="no-answer", version="1", description="d", instructions="i", input=Args,
              answer=dict, model=ModelRef(provider="openai", name="m")).profile()  # type: ignore[arg-type]
    brain = ModelRef(provider="openai", name="m")
    def echo(args: Args) -> str:
        return args.text

    for reserved in (McpTool("final", "answer"), McpTool("ask", "a_person"),
                     LocalTool(echo, name="final_answer", description="d")):
        with pytest.raises(DeclarationError, match="the engine offers"):
            Agent(name="shadowing", version="1", description="d", instructions="i",
                  input=Args, answer=Args, model=brain, tools=[reserved]).profile()
    with pytest.raises(DeclarationError, match="one argument annotated with a pydantic model"):
        LocalTool(lambda text: text, name="echo", description="echo")
    with pytest.raises(DeclarationError, match="needs a description"):
        def undocumented(args: Args) -> str:
            return args.text
        LocalTool(undocumented)
    with pytest.raises(DeclarationError, match="must be async"):
        def synchronous(args: Args) -> str:
            return args.text
        capability("echo")(synchronous)  # type: ignore[arg-type]
    with pytest.raises(PluginError, match=r"CASETRAIL_AGENTS entry 'tests\.plugins\.nothing:X'"):
        discover(["tests.plugins.nothing:X"])






PROVIDER = "tests.plugins.own_provider"
PROBE = (
    "import os\n"
    "from casetrail.agents import AGENTS\n"
    "from casetrail.config import Settings\n"
    "from casetrail.contract.events import ModelRef\n"
    "from casetrail.contract.model_providers import PROVIDERS\n"
    "from casetrail.providers import ModelFactory\n"
    "ref = ModelRef(provider='acme', name='acme-large')\n"
    "agent = AGENTS['loan-officer']\n"
    "keyless = ModelFactory(Settings())(ref, agent)\n"
    "os.environ['ACME_API_KEY'] = 'k'\n"
    "made = ModelFactory(Settings())(ref, agent)\n"
    "print(','.join(PROVIDERS), type(keyless).__name__, type(made).__name__, made.name)\n"
    "print(keyless._reason)\n"
    "print(PROVIDERS['acme'].request_headers('k'))\n"
)


def test_a_model_provider_of_a_package_of_its_own_is_spoken_like_a_built_in_one(
    settings: Settings, tmp_path: Path,
) -> None:
    path = installed(tmp_path, "acme-models", {"casetrail.model_providers": [
        f"acme = {PROVIDER}:ACME"]})
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                           timeout=60, check=False,
                           env=settings.environment(PYTHONPATH=f"{path}:{Path.cwd()}"))
    assert probe.returncode == 0, probe.stderr
    providers, reason, headers = probe.stdout.splitlines()
    assert providers.split() == ["openai,anthropic,acme", "UnavailableProvider",
                                 "OpenAIChatModel", "acme-large"]
    assert reason == "no Acme Models API key is configured (CASETRAIL_ACME_API_KEY or " \
                     "ACME_API_KEY)"
    assert headers == "{'acme-tenant': 'casetrail', 'Authorization': 'Bearer k'}"


@pytest.mark.parametrize(("entry", "why"), [
    (f"taken = {PROVIDER}:TAKEN", "the provider name 'openai' is taken"),
    (f"odd = {PROVIDER}:NOT_A_SPEC", "names a dict, not a casetrail ProviderSpec"),
    (f"gone = {PROVIDER}:MISSING", "cannot be loaded"),
])
def test_an_unusable_model_provider_stops_the_command_naming_its_package(
    settings: Settings, tmp_path: Path, entry: str, why: str,
) -> None:
    path = installed(tmp_path, "acme-models", {"casetrail.model_providers": [entry]})
    refused = casetrail(settings, "agents", path=path)
    assert refused.returncode == 2, refused.stderr
    assert "package acme-models" in refused.stderr and why in refused.stderr
    assert "Traceback" not in refused.stderr
