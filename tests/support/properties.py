"""How hard the property tests try: the profile.

``CASETRAIL_PROPERTIES=thorough`` (what `make test` and CI set) runs each property test
with its full count of examples; unset (``quick``, what `make test-unit` runs alone) runs
a tenth of it, at least 100, so the fast tier stays fast without a test being cut: the
same properties, checked on fewer examples.
"""

from __future__ import annotations

import os

PROFILE = os.environ.get("CASETRAIL_PROPERTIES", "quick")
if PROFILE not in ("quick", "thorough"):
    raise ValueError(f"CASETRAIL_PROPERTIES={PROFILE!r}: quick or thorough")


def examples(thorough: int) -> int:
    """``thorough`` examples under the thorough profile; a tenth (at least 100) under quick."""
    return thorough if PROFILE == "thorough" else max(100, thorough // 10)
