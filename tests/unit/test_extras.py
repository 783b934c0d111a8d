"""casetrail's optional parts (service/extras.py): each one an extra of the package that
`[all]` (and so `[dev]` and the image) installs; without one, what needs it says so,
naming what to install."""

from __future__ import annotations

import re
import sys
import tomllib

import pytest

from casetrail.audit.archive_store import S3Archive
from casetrail.config import McpServer
from casetrail.errors import PermanentError
from casetrail.extras import EXTRAS, missing
from casetrail.mcp.session import read_catalogs
from tests.support import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_every_part_is_an_extra_that_all_and_dev_install() -> None:
    optional = PROJECT["optional-dependencies"]
    assert set(EXTRAS) <= set(optional)
    assert optional["all"] == [f"casetrail[{','.join(EXTRAS)}]"]
    assert "casetrail[all]" in optional["dev"]
    required = " ".join(PROJECT["dependencies"])
    for extra in EXTRAS:  # a part's libraries are never dependencies of the core
        for library in (re.split(r"[<>=\[]", d)[0] for d in optional[extra]):
            assert f'"{library}' not in repr(PROJECT["dependencies"]), library
    assert required
    assert "'.[all]'" in (ROOT / "Dockerfile").read_text()


def test_an_installed_part_is_not_missing() -> None:
    assert [extra for extra in EXTRAS if missing(extra)] == []


async def test_without_the_mcp_part_a_server_says_so_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)
    clock = McpServer(name="clock", transport="stdio", command=["clock-server"])
    read = await read_catalogs([clock])
    assert read == {"clock": "the MCP server clock cannot be reached: tools from MCP "
                             "servers need casetrail's optional part 'mcp', which is not "
                             "installed here: pip install 'casetrail[mcp]'"}


def test_without_the_s3_part_an_archive_in_a_bucket_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if never installed
    assert missing("s3") == ("archives in an S3 bucket need casetrail's optional part 's3', "
                             "which is not installed here: pip install 'casetrail[s3]'")
    with pytest.raises(PermanentError, match=r"pip install 'casetrail\[s3\]'"):
        S3Archive("s3://evidence/casetrail")
