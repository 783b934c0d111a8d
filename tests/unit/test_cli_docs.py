"""What the docs tell a person to type is what the command line takes: every
``casetrail`` command in a code block names its subcommands and only options they have;
an option written on its own in the prose (`` `--business-key customerId` ``) is one
some casetrail command has; and ``keys create --help`` names every scope it accepts."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from casetrail.cli.main import app
from casetrail.contract.auth import SCOPES
from tests.support import ROOT

COMMANDS = typer.main.get_command(app)
OTHER_PROGRAMS = frozenset({"--http", "--token-env", "--transport", "--from"})
"""Options the docs show for programs beside casetrail (an MCP server's, a bench's, a
release script's), written on their own in the prose."""


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _options(command: Any) -> set[str]:
    found: set[str] = set()
    for param in getattr(command, "params", []):
        found |= {*param.opts, *param.secondary_opts}
    for sub in getattr(command, "commands", {}).values():
        found |= _options(sub)
    return found


def _commands_in_blocks(path: Path) -> Iterator[tuple[int, list[str]]]:
    inside = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip().startswith("```"):
            inside = not inside
            continue
        text = line.strip().removeprefix("$ ")
        if inside and text.startswith("casetrail "):
            try:
                yield number, shlex.split(text.split(" #")[0].rstrip("\\ "))[1:]
            except ValueError:  # a quote closed on a later line: its flags are checked there
                continue


def test_every_command_in_a_code_block_takes_the_options_it_is_shown_with() -> None:
    wrong = []
    for path in _docs():
        for number, words in _commands_in_blocks(path):
            command, used = COMMANDS, 0
            while used < len(words) and words[used] in getattr(command, "commands", {}):
                command, used = command.commands[words[used]], used + 1  # type: ignore[attr-defined]
            if hasattr(command, "commands"):
                continue  # a group named alone (its --help)
            takes = _options(command) | {"--help"}
            wrong += [f"{path.relative_to(ROOT)}:{number}: casetrail "
                      f"{' '.join(words[:used])} has no {flag}"
                      for flag in (w.split("=")[0] for w in words[used:] if w.startswith("--"))
                      if flag not in takes]
    assert not wrong, "\n".join(wrong)


def test_an_option_named_in_the_prose_is_one_casetrail_takes() -> None:
    known = _options(COMMANDS) | OTHER_PROGRAMS
    wrong = [f"{path.relative_to(ROOT)}: `{span}`"
             for path in _docs() for span in re.findall(r"`(--[^`\n]+)`", path.read_text())
             for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", span)
             if flag not in known]
    assert not wrong, "\n".join(wrong)


def test_keys_create_names_every_scope_it_accepts() -> None:
    create = COMMANDS.commands["keys"].commands["create"]  # type: ignore[attr-defined]
    [scopes] = [p for p in create.params if p.name == "scopes"]
    assert all(scope in scopes.help for scope in SCOPES), scopes.help
