"""Running processes: one component until a signal, or the whole stack as children.

``casetrail up`` and ``casetrail demo`` start each component as its own
process (as they would run in production) and stop every one of them on
Ctrl-C or SIGTERM: children get SIGTERM, then SIGKILL after a grace period,
and they are tied to the parent's life (``PR_SET_PDEATHSIG``) so even a
killed parent leaves no orphans.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

log = logging.getLogger("casetrail.supervisor")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the signal handlers still stop children
        pass


async def run_until_signal(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``main(stop)``; SIGINT or SIGTERM sets ``stop`` for a clean shutdown."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await main(stop)


def component_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "casetrail.cli", *args]


@dataclass
class Stack:
    """The components of casetrail as child processes."""

    commands: Sequence[Sequence[str]]
    grace_seconds: float = 20.0
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> None:
        for command in self.commands:
            child = subprocess.Popen(list(command), preexec_fn=_die_with_parent)  # noqa: PLW1509
            self.children.append(child)
            log.info("started %s (pid %d)", " ".join(command[3:]), child.pid)

    def failed(self) -> list[str]:
        """Children that have exited on their own."""
        return [
            f"{' '.join(str(a) for a in c.args[3:])} exited with {c.returncode}"  # type: ignore[index]
            for c in self.children if c.poll() is not None
        ]

    def stop(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_seconds
        for child in self.children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("pid %d did not stop in time; killing it", child.pid)
                child.kill()
                child.wait()


def stack_commands(port: int, capabilities: Sequence[str]) -> list[list[str]]:
    return [
        component_command("api", "--port", str(port)),
        component_command("worker"),
        component_command("consumer"),
        component_command("ledger"),
        component_command("capability-worker", *capabilities),
        # The whole log audited, a pass every ten minutes (docs/operations.md).
        component_command("audit", "--every", "600"),
    ]
