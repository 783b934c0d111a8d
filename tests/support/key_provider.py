"""A key provider of the kind an operator plugs in (casetrail.trail.key_source): here,
keys held in memory, as a secrets manager would release them."""

from __future__ import annotations

KEYS: dict[str, bytes] = {}


class MemoryProvider:
    def private_key(self, name: str) -> bytes:
        return KEYS[name]


def make() -> MemoryProvider:
    return MemoryProvider()
