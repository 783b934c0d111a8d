"""The configured remote A2A agents as capabilities, for the registry.

A module of its own so that the package (its request type, which ``remote.py``
imports) never imports ``remote.py`` back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from casetrail.engine.tools import Capability


def a2a_capabilities(agents: Sequence[Any]) -> list[Capability[Any]]:
    """The capabilities of the configured remote agents (``A2aAgent`` settings), for the
    registry; the SDK's client is loaded only by a capability worker that serves one."""
    from casetrail.a2a.remote import serving

    return [serving(agent) for agent in agents]

