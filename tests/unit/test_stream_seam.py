"""A case stream's seam: while it doubts, a quiet live feed sends it back to the record,
less often each time; once a live event has followed what it sent, never again."""

from __future__ import annotations

import asyncio
import time

from casetrail.adapters.bus.watch import LiveEvent, Watcher
from casetrail.api.streams import GAP_FIRST_PAUSE_SECONDS, Frame, _live, _Seam


async def _allowed() -> bool:
    return True


async def _what_a_quiet_feed_yields(seam: _Seam, seconds: float,
                                    watcher: Watcher | None = None) -> list[tuple[float, object]]:
    """What ``_live`` yields over ``seconds`` with nothing published, and when."""
    seen: list[tuple[float, object]] = []
    started = time.monotonic()

    async def follow() -> None:
        async for item in _live(watcher or Watcher(), 60.0, _allowed, "case x", seam):
            seen.append((time.monotonic() - started, item))

    task = asyncio.create_task(follow())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return seen


async def test_a_doubting_stream_looks_at_the_record_less_often_each_time() -> None:
    seam = _Seam(time.monotonic() + 5.0)
    seen = await _what_a_quiet_feed_yields(seam, 0.7)
    looks = [at for at, item in seen if item is None]
    # 20 ms, then 40, 80, 160, 320: five looks by 620 ms at the most (a busy machine
    # only makes each spell longer), where a fixed 20 ms would have made 35.
    assert 3 <= len(looks) <= 5, looks
    assert seam.pause == GAP_FIRST_PAUSE_SECONDS * 2 ** len(looks)
    spells = [b - a for a, b in zip([0.0, *looks], looks, strict=False)]
    for n, spell in enumerate(spells):
        assert spell >= 0.9 * GAP_FIRST_PAUSE_SECONDS * 2 ** n, spells


async def test_a_settled_stream_never_looks_at_the_record_again() -> None:
    seam = _Seam(time.monotonic() + 5.0)
    seam.settle()
    assert not seam.doubts(time.monotonic())
    watcher = Watcher()
    watcher.offer(LiveEvent("x", 1, 3, "REACT_CYCLE", {}))
    seen = await _what_a_quiet_feed_yields(seam, 0.3, watcher)
    # The live event, then silence: no look at the record, no keep-alive before 60 s.
    assert [item for _, item in seen if not isinstance(item, Frame)] == [
        LiveEvent("x", 1, 3, "REACT_CYCLE", {})]


async def test_the_doubt_ends_on_its_own() -> None:
    seam = _Seam(time.monotonic() + 0.1)
    seen = await _what_a_quiet_feed_yields(seam, 0.6)
    looks = [at for at, item in seen if item is None]
    # 20 ms, 60 ms: the third spell would end at 140 ms, past the doubt's 100 ms (the
    # spell under way when the doubt ends may still end in one more look).
    assert 2 <= len(looks) <= 3, looks
    assert all(at < 0.3 for at in looks), looks
