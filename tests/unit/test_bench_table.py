"""The benchmark table is rebuilt from recorded figures: a change to ``bench/run.py``
must still read both the three-round files and the older one-run files."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.harness import median_run
from bench.run import spread, table
from tests.support import ROOT

RESULTS = ROOT / "bench" / "results"
THREE_ROUNDS = RESULTS / "20261129T235138-c3cbe2a.json"
ONE_RUN = RESULTS / "20261129T223855-3921926.json"


def _rows(path: Path) -> dict[str, tuple[str, str, str]]:
    figures: dict[str, Any] = orjson.loads(path.read_bytes())
    return {name.strip(): (value, target, note) for name, value, target, note in table(figures)}


def test_median_run_picks_the_middle_run_and_the_lower_middle_of_an_even_count() -> None:
    runs = [{"rate": 3.0, "id": "c"}, {"rate": 1.0, "id": "a"}, {"rate": 2.0, "id": "b"}]
    assert median_run(runs, "rate")["id"] == "b"
    assert median_run(runs[:2], "rate")["id"] == "a"
    assert spread([2.0, 1.0, 3.0]) == "median of 3 runs, 1 to 3"
    assert spread([5.0]) == "one run"


def test_three_round_figures_show_medians_and_their_range() -> None:
    figures = orjson.loads(THREE_ROUNDS.read_bytes())
    rows = _rows(THREE_ROUNDS)
    rates = [run["cyclesPerSecond"] for run in figures["endToEndRuns"]]
    value, target, note = rows["end-to-end durable cycles/s"]
    assert value == f"{statistics.median(rates):,.0f}"
    assert target == "≥ 2,500"
    assert f"median of 3 runs, {min(rates):,.0f} to {max(rates):,.0f}" in note
    ratio, _, _ = rows["x LangGraph + AsyncPostgresSaver"]
    assert ratio == f"{statistics.median(figures['peerRatios']):.1f}x"
    share, _, share_note = rows["1,000 concurrent 500 ms-turn cases"]
    shares = [run["shareOfIdeal"] for run in figures["concurrencyTopRuns"]]
    assert share == f"{statistics.median(shares):.1%}"
    assert "median of 3 runs" in share_note


@pytest.mark.parametrize("path", [ONE_RUN, THREE_ROUNDS], ids=["one run", "three rounds"])
def test_every_target_has_a_row(path: Path) -> None:
    rows = _rows(path)
    targets = {name: row[1] for name, row in rows.items() if row[1]}
    assert set(targets) == {
        "end-to-end durable cycles/s", "x LangGraph + AsyncPostgresSaver",
        "publish → committed p99 at 1,000/s", "1,000 concurrent 500 ms-turn cases",
        "worker peak RSS", "consumer ingest alone, 1 process",
        "consumer ingest alone, 2 processes", "POST /cases (1 uvicorn worker)",
    }


def test_growth_rows_give_the_cpu_of_a_cycle_for_each_shape_of_work() -> None:
    from bench.run import _growth_rows

    rows = _growth_rows({"growth": [
        {"work": "200 cycles a case", "cycles": 10_000, "cyclesPerSecond": 1756.0,
         "cpuSeconds": {"api": 0.11, "worker-0": 4.21, "consumer": 2.63}},
        {"work": "tool results of 100 KB", "cycles": 2_000, "cyclesPerSecond": 219.0,
         "cpuSeconds": {"api": 0.45, "postgres": 6.61}}]})
    assert [row[:2] for row in rows] == [("CPU per cycle, 200 cycles a case", "695 µs"),
                                         ("CPU per cycle, tool results of 100 KB", "3,530 µs")]
    assert "worker-0 421" in rows[0][3] and "postgres 3,305" in rows[1][3]
    assert _growth_rows({}) == []


def test_growth_history_and_resume_rows_read_their_figures() -> None:
    """The rows of how a cycle's cost grows (work, a long history, resuming) come from
    their own figures, per process and in total."""
    figures: dict[str, Any] = orjson.loads(THREE_ROUNDS.read_bytes())
    run = {"cycles": 10_000, "cyclesPerSecond": 900.0,
           "cpuSeconds": {"api": 1.0, "worker-0": 3.0, "postgres": 2.0}}
    figures["growth"] = [{"work": "200 cycles a case", **run}]
    figures["history"] = [{"work": "an event_log holding 25,000,000 events",
                           "eventsBefore": 25_000_000, **run}]
    figures["resume"] = [{"cycles": 200, "cases": 20, "events": 202, "wallP50Ms": 23.1,
                          "wallP99Ms": 56.9, "workerCpuP50Ms": 21.3,
                          "workerCpuPerCycleUs": 107}]
    rows = {name.strip(): (value, note) for name, value, _, note in table(figures)}
    for work in ("200 cycles a case", "an event_log holding 25,000,000 events"):
        value, note = rows[f"CPU per cycle, {work}"]
        assert value == "600 µs"
        assert "api 100, worker-0 300, postgres 200" in note
    value, note = rows["resuming a case of 200 cycles"]
    assert value == "23.1 ms"
    assert "202 events" in note and "107 µs a cycle" in note


def test_the_retention_rows_give_the_expiry_rate_and_the_table_after_it() -> None:
    from bench.run import _retention_rows

    rows = _retention_rows({"retention": {
        "events": 1_000_000, "cases": 100_000, "eventsRemoved": 1_000_000,
        "expirySeconds": 160.2, "eventsRemovedPerSecond": 6_242,
        "bytesPerEventOnDisk": 2_172, "tableBytesBefore": 2_172 * 2**20,
        "tableBytesAfterExpiryAndVacuum": 2_200 * 2**20,
        "tableBytesAfterPartitionDrop": 9 * 2**20, "partitionDropSeconds": 1.25,
        "tableBytesAfterWritingAsManyAgain": 2_240 * 2**20, "growthAfterRewriteRatio": 1.031}})
    assert rows[0][:2] == ("expiring 1,000,000 events", "160.2 s")
    assert "6,242 events/s" in rows[0][3]
    assert rows[1][1] == "2,172 B/event" and "1.031x" in rows[1][3]
    assert "9 MB once the month is dropped (1.25 s)" in rows[1][3]
    assert _retention_rows({}) == []
