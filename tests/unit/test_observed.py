"""What a scripted brain reads of the tools' results (``casetrail.observed``): parsed
JSON, errors as exceptions, text as text, and an MCP server's JSON answered as text
content parsed as the docs say, while the record keeps it as the server returned it."""

from __future__ import annotations

import orjson

from casetrail import observed
from casetrail.engine.chat import ToolResultMessage


def _seen(result: object, *, error: bool = False) -> object:
    content = f"ERROR: {result}" if error else orjson.dumps(result).decode()
    return observed([ToolResultMessage("c1", "tool", content, is_error=error)])["tool"]


def test_json_results_errors_and_text_read_as_they_are() -> None:
    assert _seen({"score": 742}) == {"score": 742}
    assert _seen("approved") == "approved"
    assert _seen("{not json") == "{not json"
    assert _seen("[3]") == [3]  # a JSON array answered as text
    failed = _seen("timed out", error=True)
    assert isinstance(failed, RuntimeError) and str(failed) == "timed out"


def test_an_mcp_servers_json_as_text_content_is_parsed() -> None:
    """The record keeps the server's text ('{"coverageLimit": 20000}'); the brain reads
    the object, as it would have from structured content."""
    assert _seen('{"coverageLimit": 20000}') == {"coverageLimit": 20000}
    assert _seen(' \n{"a": [1, 2]}') == {"a": [1, 2]}
    assert _seen('"quoted"') == '"quoted"'  # JSON text that is no object stays text
