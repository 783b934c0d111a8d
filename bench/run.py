"""``make bench``: every benchmark in one run on this machine; prints one table, writes
the figures as JSON (machine, date, commit) and docs/benchmarks.md with two plots.

Usage: python -m bench.run [--quick | --replot]
"""

from __future__ import annotations

import asyncio
import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from bench import raw, scenarios
from bench.e2e import end_to_end
from bench.harness import ROOT, bench_settings, namespace
from service.config import Settings

PEER_PYTHON = ROOT / "bench" / ".venv-peer" / "bin" / "python"
TARGETS = {
    "e2e": 2500, "peerRatio": 15, "ingest": 15000, "p99At1000": 100, "concurrencyShare": 0.9,
    "workerRss": 300, "apiRps": 800,
}


def machine() -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT, check=False).stdout.strip()
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return {"cpus": os.cpu_count(), "cpu": model, "memoryGb": round(
        os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(), "kernel": platform.release(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit}


async def peer(settings: Settings, cases: int, cycles: int) -> dict[str, Any]:
    url = settings.database_url + "_peer"
    admin = await asyncpg.connect(settings.database_url.rsplit("/", 1)[0] + "/postgres")
    name = url.rsplit("/", 1)[1]
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        result = await asyncio.to_thread(
            subprocess.run, [str(PEER_PYTHON), str(ROOT / "bench" / "peer_langgraph.py"), url,
                             str(cases), str(cycles), "50"],
            capture_output=True, text=True, timeout=1800, check=True)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    figures: dict[str, Any] = orjson.loads(result.stdout.strip().splitlines()[-1])
    return figures


async def run(quick: bool) -> dict[str, Any]:
    scale = 0.2 if quick else 1.0
    cases, cycles = int(1000 * scale), 10
    results: dict[str, Any] = {"machine": machine()}
    print("end to end ...", flush=True)
    results["endToEnd"] = await end_to_end(cases, cycles, settings=bench_settings(api_port=8790))
    print("peer (LangGraph + AsyncPostgresSaver) ...", flush=True)
    results["peer"] = await peer(bench_settings(), cases, cycles)
    print("raw limits ...", flush=True)
    settings = bench_settings()
    async with namespace(settings):
        results["rawBus"] = await raw.publish_confirmed(settings, int(20000 * scale))
        results["rawCopy"] = await raw.copy_rows(settings, int(50000 * scale))
    print("latency at offered load ...", flush=True)
    results["latency"] = await scenarios.latency_at(bench_settings(), [200, 500, 1000, 1500],
                                                    seconds=8 * scale if quick else 8)
    print("concurrency with 500 ms turns ...", flush=True)
    results["concurrency"] = await scenarios.concurrency_sweep(
        bench_settings(), [100, 250, 500, 1000] if not quick else [100, 1000])
    print("consumer ingest alone ...", flush=True)
    results["ingest"] = [
        await scenarios.consumer_ingest(bench_settings(), int(100_000 * scale), consumers=n)
        for n in (1, 2)]
    print("POST /cases ...", flush=True)
    results["api"] = await scenarios.api_posts(bench_settings(api_port=8797),
                                               requests=int(3000 * scale) or 300)
    return results


def table(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    e2e = r["endToEnd"]["cyclesPerSecond"]
    at1000 = next(x for x in r["latency"] if x["offeredPerSecond"] == 1000)
    top = max(r["concurrency"], key=lambda x: x["concurrentCases"])
    rows = [
        ("end-to-end durable cycles/s", f"{e2e:,.0f}", f"≥ {TARGETS['e2e']:,}",
         "REST → worker → bus → consumer → Postgres"),
        ("  x LangGraph + AsyncPostgresSaver", f"{e2e / r['peer']['cyclesPerSecond']:.1f}x",
         f"≥ {TARGETS['peerRatio']}x", f"peer {r['peer']['cyclesPerSecond']:,.0f} cycles/s"),
        ("  share of raw confirmed publish",
         f"{e2e / r['rawBus']['publishConfirmedPerSecond']:.0%}", "",
         f"raw {r['rawBus']['publishConfirmedPerSecond']:,} msg/s"),
        ("  share of raw batched-ack consume",
         f"{e2e / r['rawBus']['consumePerSecond']:.0%}", "",
         f"raw {r['rawBus']['consumePerSecond']:,} msg/s"),
        ("  share of raw COPY", f"{e2e / r['rawCopy']['copyRowsPerSecond']:.1%}", "",
         f"raw {r['rawCopy']['copyRowsPerSecond']:,} rows/s"),
        ("publish → committed p99 at 200/s",
         f"{next(x for x in r['latency'] if x['offeredPerSecond'] == 200)['p99Ms']} ms", "", ""),
        ("publish → committed p99 at 1,000/s", f"{at1000['p99Ms']} ms",
         f"≤ {TARGETS['p99At1000']} ms", f"p50 {at1000['p50Ms']} ms"),
        (f"{top['concurrentCases']:,} concurrent 500 ms-turn cases", f"{top['shareOfIdeal']:.1%}",
         f"≥ {TARGETS['concurrencyShare']:.0%}",
         f"{top['cyclesPerSecond']:,} of {top['idealCyclesPerSecond']:,} cycles/s, "
         f"{top['cycles'] // top['concurrentCases']} cycles a case"),
        ("  worker peak RSS", f"{top['workerPeakRssMb']} MB", f"≤ {TARGETS['workerRss']} MB", ""),
        *((f"consumer ingest alone, {x['consumers']} process{'es' if x['consumers'] > 1 else ''}",
           f"{x['eventsPerSecond']:,} events/s", f"≥ {TARGETS['ingest']:,}",
           f"{x['events']:,} queued events; {x['eventsPerSecondWithStartup']:,}/s "
           "counting start-up") for x in r["ingest"]),
        ("POST /cases (1 uvicorn worker)", f"{r['api']['requestsPerSecond']:,.0f} req/s",
         f"≥ {TARGETS['apiRps']}", f"p99 {r['api']['p99Ms']:.0f} ms at concurrency "
         f"{r['api']['concurrency']}"),
    ]
    return rows


def plots(r: dict[str, Any], docs: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def draw(path: Path, title: str, xlabel: str, ylabel: str,
             lines: list[tuple[list[Any], list[Any], dict[str, Any]]], log: bool = False) -> None:
        fig, ax = plt.subplots(figsize=(6, 4))
        for xs, ys, style in lines:
            ax.plot(xs, ys, **style)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    offered = [x["offeredPerSecond"] for x in r["latency"]]
    draw(docs / "bench-latency.png", "casetrail: latency against offered load",
         "offered load (REACT_CYCLE events/s)", "publish → committed (ms, log scale)",
         [(offered, [x[key] for x in r["latency"]], {"marker": "o", "label": label})
          for key, label in (("p50Ms", "p50"), ("p95Ms", "p95"), ("p99Ms", "p99"))],
         log=True)
    levels = [x["concurrentCases"] for x in r["concurrency"]]
    draw(docs / "bench-concurrency.png", "casetrail: throughput against concurrency",
         "concurrent cases on one worker", "cycles/s",
         [(levels, [x["cyclesPerSecond"] for x in r["concurrency"]],
           {"marker": "o", "label": "measured"}),
          (levels, [x["idealCyclesPerSecond"] for x in r["concurrency"]],
           {"linestyle": "--", "label": "ideal (500 ms a turn)"})])


def main() -> None:
    if "--replot" in sys.argv:  # redraw the plots from the last run's figures
        plots(orjson.loads((ROOT / "bench" / "results" / "latest.json").read_bytes()),
              ROOT / "docs")
        return
    quick = "--quick" in sys.argv
    results = asyncio.run(run(quick))
    rows = table(results)
    width = max(len(r[0]) for r in rows)
    print()
    for name, value, target, note in rows:
        print(f"{name:<{width}}  {value:>16}  {target:>10}  {note}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    stamp = results["machine"]["date"].replace(":", "").replace("-", "")[:15]
    path = out / f"{stamp}-{results['machine']['commit']}.json"
    path.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    (out / "latest.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print(f"\nfigures: {path.relative_to(ROOT)}")
    if not quick:
        docs = ROOT / "docs"
        plots(results, docs)
        print("plots: docs/bench-latency.png, docs/bench-concurrency.png")


if __name__ == "__main__":
    main()
