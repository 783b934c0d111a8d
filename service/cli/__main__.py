"""``python -m casetrail.cli``: the ``casetrail`` command line."""

from casetrail.cli import run

run()
