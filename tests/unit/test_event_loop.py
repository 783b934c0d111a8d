"""The long-running components' event loop: uvloop unless the operator asks otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from casetrail.cli import common
from casetrail.components import gc_tuning
from casetrail.config import Settings, get_settings


async def _loop_name() -> str:
    return type(asyncio.get_running_loop()).__module__


@pytest.fixture(autouse=True)
def fresh_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The collector's tuning (its own tests) would freeze this test process's heap.
    monkeypatch.setattr(gc_tuning, "tune", lambda threshold: None)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CASETRAIL_EVENT_LOOP", raising=False)
    assert Settings().event_loop == "uvloop"
    assert common.run(_loop_name(), long_running=True).startswith("uvloop")


def test_asyncio_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASETRAIL_EVENT_LOOP", "asyncio")
    assert common.run(_loop_name(), long_running=True).startswith("asyncio")
    # A short command is not a component: it keeps the faster loop.
    assert common.run(_loop_name()).startswith("uvloop")


def test_an_unknown_loop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASETRAIL_EVENT_LOOP", "trio")
    with pytest.raises(ValueError, match="event_loop"):
        Settings()
