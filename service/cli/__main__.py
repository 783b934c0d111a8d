"""``python -m casetrail.cli``: the ``casetrail`` command line."""

from casetrail.cli.main import main

main()
