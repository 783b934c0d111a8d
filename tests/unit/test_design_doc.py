"""docs/design.md stays true: the files its tables name exist, the owner's functions it
names exist in the current schema, and it names every event type the contract has."""

from __future__ import annotations

import re

import pytest

from casetrail.contract.events import EVENT_TYPES
from tests.support import ROOT

DESIGN = (ROOT / "docs" / "design.md").read_text()
SCHEMA = (ROOT / "migrations" / "schema" / "current.sql").read_text()
PATH = re.compile(r"`((?:service|consumers|migrations|docs|scripts|examples|tests)/[^`\s]*)`")
FUNCTION = re.compile(r"`([a-z_]+)\(\)`")


def section(title: str) -> str:
    start = DESIGN.index(f"\n## {title}\n")
    end = DESIGN.find("\n## ", start + 1)
    return DESIGN[start:end if end >= 0 else None]


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]


@pytest.mark.parametrize("title", ["The house", "Where a change goes"])
def test_every_path_a_table_names_exists(title: str) -> None:
    rows = table_rows(section(title))
    named = {p.rstrip("/.,") for row in rows for p in PATH.findall(row)}
    assert len(rows) >= 10 and named
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert missing == []


def test_every_owner_function_the_change_table_names_is_in_the_schema() -> None:
    named = {f for row in table_rows(section("Where a change goes"))
             for f in FUNCTION.findall(row)}
    assert "erase_for_retention" in named
    missing = sorted(f for f in named if f"FUNCTION public.{f}(" not in SCHEMA)
    assert missing == []


def test_the_contract_section_names_every_event_type() -> None:
    contract = section("The contract")
    assert [t for t in EVENT_TYPES if f"`{t}`" not in contract] == []
