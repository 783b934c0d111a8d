"""The installed casetrail's version, which every event's envelope and every outbound
request names. It lives in the contract, the lowest layer, so that the engine and the
providers read it without importing the package root (which holds the authoring API)."""

from __future__ import annotations

from importlib import metadata

try:
    CASETRAIL_VERSION: str = metadata.version("casetrail")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    CASETRAIL_VERSION = "0+unknown"

__all__ = ["CASETRAIL_VERSION"]
