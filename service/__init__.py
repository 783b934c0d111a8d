"""casetrail: tool-using LLM agents whose every reasoning cycle survives as evidence."""

from importlib import metadata

try:
    CASETRAIL_VERSION: str = metadata.version("casetrail")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    CASETRAIL_VERSION = "0+unknown"
