"""The ``casetrail`` command line (``main``), its command groups in a module each, and
``up``, ``demo`` and ``tail`` (``demo``)."""

from __future__ import annotations

import sys


def run() -> None:
    """The ``casetrail`` command: an installed package's unusable model provider stops
    it with one line naming the package (exit 2), never a traceback."""
    from casetrail.errors import ProviderPluginError

    try:
        from casetrail.cli.main import main
    except ProviderPluginError as exc:
        print(f"casetrail: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    main()
