"""Text a case may hold: Postgres cannot store a NUL character, and UTF-8 cannot
encode a lone surrogate; both are refused as invalid fields, before anything is kept."""

from __future__ import annotations

from typing import Any

from casetrail.cases.errors import Invalid, Issue

UNSTORABLE = "text may not contain NUL characters or lone surrogates"


def unstorable_at(value: Any, loc: tuple[str | int, ...]) -> tuple[str | int, ...] | None:
    """Where ``value`` holds such text, or ``None``."""
    if isinstance(value, str):
        if "\x00" in value:
            return loc
        try:
            value.encode()
        except UnicodeEncodeError:
            return loc
        return None
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if (found := unstorable_at(key, loc) if isinstance(key, str) else None) is not None:
            return found
        if (found := unstorable_at(item, (*loc, key))) is not None:
            return found
    return None


def refuse_unstorable(value: Any, *loc: str | int) -> None:
    """``Invalid`` when ``value`` (found at ``loc``) holds text that cannot be kept."""
    if (found := unstorable_at(value, loc)) is not None:
        raise Invalid(Issue(found, UNSTORABLE))
