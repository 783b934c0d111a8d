"""The transparency log: how fast stored events enter the tree, and how fast an inclusion
proof is served from a very large one.

- ``append``: N stored events wait in ``ledger_queue`` (queued as the consumer's trigger
  queues them); ``casetrail ledger`` (its own process and role) appends them all. The
  rate counts from its first leaf to its last, so process start-up is apart.
- ``proofs``: a tree of N leaves (10,000,000 in ``make bench-all``), seeded once into a
  cached database (``casetrail_bench_ledger_<N>``: its tiles, ~N/255 rows, and one signed
  checkpoint); ``casetrail api`` serves ``GET /ledger/proofs/inclusion`` for random
  leaves, one request at a time; each answer is checked against the checkpoint's root.

Usage: python -m bench.ledger append [N] | proofs [N] [requests]
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import random
import sys
import time
import uuid
from typing import Any

import asyncpg
import httpx

from bench.harness import (
    Processes,
    bench_settings,
    cpu_seconds,
    namespace,
    peak_rss_mb,
    percentiles,
    wait_ready,
    wait_rows,
)
from casetrail.adapters.store.migrate import database_name
from casetrail.adapters.store.tree import TREE_SIZE_SQL
from casetrail.ledger import merkle
from casetrail.ledger.note import Checkpoint, NoteSigner, sign
from casetrail.ops.setup import setup

PROOF_PORT = 8799


def _hashes(start: int, count: int) -> list[bytes]:
    return [hashlib.sha256(i.to_bytes(8, "big")).digest() for i in range(start, start + count)]


async def append(count: int) -> dict[str, Any]:
    settings = bench_settings()
    async with namespace(settings) as pool:
        rows = [(uuid.uuid4(), uuid.uuid4(), h.hex()) for h in _hashes(0, count)]
        await pool.copy_records_to_table("ledger_queue", records=rows,
                                         columns=["event_id", "case_id", "hash"])
        stack = Processes(settings)
        started = time.time()
        ledger = stack.spawn("ledger", "ledger")
        try:
            first = None
            while True:
                done = await pool.fetchval(TREE_SIZE_SQL)
                now = time.time()
                if first is None and done:
                    first = (now, done)
                if done >= count:
                    break
                if ledger.poll() is not None or now - started > 600:
                    raise RuntimeError(f"the ledger stopped at {done} of {count} leaves")
                await asyncio.sleep(0.02)
            cpu = cpu_seconds(ledger.pid)
            rss = peak_rss_mb(ledger.pid)
            signed = await _wait_checkpoint(pool, count)
        finally:
            stack.stop()
    assert first is not None
    seconds = now - first[0]
    return {"leaves": count, "seconds": round(seconds, 2),
            "leavesPerSecond": round((count - first[1]) / seconds),
            "startupSeconds": round(first[0] - started, 2), "ledgerCpuSeconds": round(cpu, 2),
            "ledgerPeakRssMb": round(rss), "checkpointSeconds": round(signed - now, 2)}


async def _wait_checkpoint(pool: asyncpg.Pool, size: int) -> float:
    await wait_rows(pool, "SELECT count(*) FROM ledger_checkpoints WHERE tree_size >= $1", 1,
                    60, size)
    return time.time()


async def _seeded(settings: Any, size: int) -> bytes:
    """The cached database holds a tree of ``size`` leaves; its root."""
    admin = settings.database_url.rsplit("/", 1)[0] + "/postgres"
    conn = await asyncpg.connect(admin)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1",
                                     database_name(settings.database_url))
    finally:
        await conn.close()
    await setup(settings)  # idempotent: roles, migrations, grants
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    assert pool is not None
    try:
        root = await pool.fetchval("SELECT root_hash FROM ledger_checkpoints "
                                   "WHERE tree_size = $1", size)
        if exists and root is not None:
            return bytes(root)
        print(f"seeding a tree of {size:,} leaves (once) ...", flush=True)
        edge, step = merkle.Edge(), 100_000
        for start in range(0, size, step):
            tiles = edge.append([merkle.leaf_hash(h) for h in
                                 _hashes(start, min(step, size - start))])
            await pool.executemany(
                "INSERT INTO ledger_tiles (level, tile_index, hashes) VALUES ($1, $2, $3) "
                "ON CONFLICT (level, tile_index) DO UPDATE SET hashes = EXCLUDED.hashes",
                [(level, index, data) for (level, index), data in tiles.items()])
        root = edge.root()
        signer = NoteSigner.generate(settings.origin())
        note = sign(Checkpoint(settings.origin(), size, root).text(), signer).render()
        await pool.execute("INSERT INTO ledger_checkpoints (tree_size, root_hash, note) "
                           "VALUES ($1, $2, $3)", size, root, note)
        return root
    finally:
        await pool.close()


async def proofs(size: int, requests: int) -> dict[str, Any]:
    """Inclusion proofs from a tree of ``size`` leaves, one request at a time."""
    base = bench_settings(api_port=PROOF_PORT)
    url = base.database_url.rsplit("/", 1)[0] + f"/casetrail_bench_ledger_{size}"
    settings = base.model_copy(update={"database_url": url,
                                       "namespace": f"casetrail-bench-ledger-{size}",
                                       "secrets_file": f".casetrail/bench-ledger-{size}.json"})
    root = await _seeded(settings, size)
    tiles = await _count_tiles(settings.database_url)
    stack = Processes(settings)
    stack.spawn("api", "api", "--port", str(PROOF_PORT))
    latencies, rng = [], random.Random(6962)
    try:
        await wait_ready(f"http://127.0.0.1:{PROOF_PORT}")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{PROOF_PORT}") as client:
            for i in range(requests + 50):
                index = rng.randrange(size)
                began = time.perf_counter()
                reply = await client.get("/ledger/proofs/inclusion",
                                         params={"leafIndex": index, "treeSize": size})
                elapsed = time.perf_counter() - began
                reply.raise_for_status()
                if i >= 50:  # the first 50 warm the connection and the API
                    latencies.append(elapsed * 1000)
                if i % 50 == 0:  # checked against the root
                    leaf = merkle.leaf_hash(_hashes(index, 1)[0])
                    path = [base64.b64decode(h) for h in reply.json()["proof"]]
                    if not merkle.verify_inclusion(leaf, index, size, path, root):
                        raise RuntimeError(f"the proof of leaf {index} does not verify")
        api_cpu = cpu_seconds(stack.children["api"].pid)
    finally:
        stack.stop()
    figures = percentiles(latencies)
    return {"treeSize": size, "tileRows": tiles, "requests": requests,
            **{f"{k}Ms": round(v, 2) for k, v in figures.items()},
            "apiCpuSeconds": round(api_cpu, 2)}


async def _count_tiles(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        count: int = await conn.fetchval("SELECT count(*) FROM ledger_tiles")
        return count
    finally:
        await conn.close()


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "append"
    os.environ.setdefault("CASETRAIL_LOG_LEVEL", "WARNING")
    if what == "append":
        print(asyncio.run(append(int(sys.argv[2]) if len(sys.argv) > 2 else 200_000)))
    else:
        print(asyncio.run(proofs(int(sys.argv[2]) if len(sys.argv) > 2 else 10_000_000,
                                 int(sys.argv[3]) if len(sys.argv) > 3 else 2000)))
