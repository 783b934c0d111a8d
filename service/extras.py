"""casetrail's optional parts (``pip install 'casetrail[pdf]'``; docs/compatibility.md):
heavy libraries a deployment may do without. Without one, what needs it says so, naming
the part to install (a route answers 501, a command exits 2); the rest runs.

``[all]`` installs every part, ``[dev]`` too; the image installs ``[all]``.
"""

from __future__ import annotations

import importlib

EXTRAS: dict[str, tuple[str, str]] = {
    "pdf": ("fpdf", "the case and backtest reports (PDF)"),
    "s3": ("boto3", "archives in an S3 bucket"),
    "mcp": ("mcp", "tools from MCP servers"),
}
"""Each optional part: the module it provides, and what needs it."""


def missing(extra: str) -> str | None:
    """Why the optional part ``extra`` cannot be used here, or ``None`` when it can."""
    module, needs = EXTRAS[extra]
    try:
        importlib.import_module(module)
    except ImportError:
        return (f"{needs} need casetrail's optional part {extra!r}, which is not installed "
                f"here: pip install 'casetrail[{extra}]'")
    return None
