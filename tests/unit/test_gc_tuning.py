"""The garbage-collector settings the long-running components start with."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from casetrail.components import gc_tuning
from casetrail.config import Settings


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_tune_freezes_what_exists_and_raises_the_first_threshold(restore_gc: None) -> None:
    _, older, oldest = gc.get_threshold()
    gc_tuning.tune(12_345)
    assert gc.get_threshold() == (12_345, older, oldest)
    assert gc.get_freeze_count() > 1000  # the imported modules' objects, at least


def test_zero_leaves_the_interpreter_alone(restore_gc: None) -> None:
    before = gc.get_threshold()
    gc_tuning.tune(0)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_threshold_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().gc_threshold == gc_tuning.DEFAULT_THRESHOLD
    monkeypatch.setenv("CASETRAIL_GC_THRESHOLD", "0")
    assert Settings().gc_threshold == 0
    monkeypatch.setenv("CASETRAIL_GC_THRESHOLD", "-1")
    with pytest.raises(ValueError, match="gc_threshold"):
        Settings()


async def _frozen() -> int:
    return gc.get_freeze_count()


def test_only_long_running_commands_tune_the_collector(restore_gc: None) -> None:
    from casetrail.cli.common import run

    assert run(_frozen()) == 0
    assert run(_frozen(), long_running=True) > 1000
