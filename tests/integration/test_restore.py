"""The record outlives its operators (docs/operations.md, "Backup and restore"): a database
restored from an older backup while a witness holds newer checkpoints halts the ledger
and never forks the log; a ledger that lost both of its anchors waits for an operator's
acceptance on the record; a stack whose keys are missing refuses to make new ones for a
namespace that has data. Each on the real stack: Postgres with pg_dump and pg_restore,
RabbitMQ streams, the ledger and the witness as real processes."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from pathlib import Path

import aio_pika
import asyncpg
import httpx
import orjson
import pytest

from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import ApiKeyStore, KeyRegistry
from casetrail.adapters.store.tree import TREE_SIZE_SQL
from casetrail.components.sequencer import ledger_state
from casetrail.components.supervisor import component_command
from casetrail.config import Settings
from casetrail.contract.integrity import Signer
from casetrail.ledger.note import open_checkpoint
from tests.support.helpers import wait_until
from tests.support.logged import (
    Logged,
    back_up,
    export,
    logged_everything,
    metric_shows,
    restore,
    run_cases,
    serving,
    witness_once,
)
from tests.support.stack import (
    free_port,
    kill_leftovers,
    namespace_of_its_own,
    spawn,
)


async def test_an_older_backup_restored_halts_the_ledger_and_the_log_never_forks(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection, tmp_path: Path,
) -> None:
    children: dict[str, subprocess.Popen[bytes]] = {}
    async with namespace_of_its_own(settings, "restore") as (own, pool, key):
        try:
            async with serving(own, amqp, pool, key, children) as logged:
                await logged.start_ledger()
                await run_cases(logged, 2)
                backed_up, _ = await logged_everything(logged)
                backup = tmp_path / "b1.dump"
                await back_up(own, backup)
                await run_cases(logged, 2)
                witnessed, _ = await logged_everything(logged)
                assert witnessed > backed_up
                accepted = tmp_path / "witness.json"
                assert (await witness_once(logged, accepted)).returncode == 0
                await logged.stop_ledger()
            # The database restored from the older backup, everything else left as it is.
            await restore(own, pool, backup)
            assert await pool.fetchval("SELECT max(tree_size) FROM ledger_checkpoints") \
                == backed_up
            async with serving(own, amqp, pool, key, children) as logged:
                port = free_port()
                children["ledger"] = spawn(own, "ledger",
                                           CASETRAIL_LEDGER_METRICS_PORT=str(port))
                said = await logged.halted("behind")
                assert f"the stored tree has {backed_up} leaves but the log signed " \
                       f"{own.origin()} size {witnessed}" in said, said[-2000:]
                await wait_until(lambda: metric_shows(
                    port, 'casetrail_ledger_halted{reason="behind"} 1.0'), timeout=30,
                    interval=0.3)
                # New cases are stored; none of them is signed into a second tree of a
                # size the log signed before.
                await run_cases(logged, 3)
                await asyncio.sleep(2)  # several of the ledger's ticks
                assert await pool.fetchval(
                    "SELECT max(tree_size) FROM ledger_checkpoints") == backed_up
                # The API learns of it by itself, from the stream the log's checkpoints
                # are published on: it serves nothing of the log as current, and says why.
                await _the_log_says_it_has_stopped_vouching(logged, backed_up, witnessed)
                verdict = await witness_once(logged, accepted)
                assert verdict.returncode == 2 and "stopped vouching (behind)" in \
                    verdict.stderr, verdict.stderr
                await logged.forget_high_water()
            # Whoever also holds the broker takes the streams away and starts the API again:
            # it has nothing to compare with and serves the restored checkpoint. The witness
            # that kept state sees the rollback; left running it goes on saying so (and its
            # metric) and refuses to cosign, until stopped.
            async with serving(own, amqp, pool, key, children) as logged:
                served, _ = open_checkpoint((await logged.client.get(
                    "/ledger/checkpoint")).text, logged.log_key)
                assert served.size == backed_up
                verdict = await witness_once(logged, accepted)
                assert verdict.returncode == 1 and "rolled back" in verdict.stderr
                witness_port = free_port()
                children["witness"] = spawn(
                    own, "witness", "--log", logged.stack.base_url, "--log-key",
                    logged.log_key.text(), "--state", str(accepted), "--interval", "0.3",
                    CASETRAIL_WITNESS_METRICS_PORT=str(witness_port))
                await wait_until(lambda: metric_shows(
                    witness_port, "casetrail_witness_misbehaving 1.0"), timeout=30,
                    interval=0.3)
                await asyncio.sleep(1)
                witness = children.pop("witness")
                assert witness.poll() is None, "the witness must keep running"
                witness.terminate()
                await asyncio.to_thread(witness.wait, 30)
                assert witness.returncode == 1
                said = await logged.stop_halted_ledger()
                assert "halted (behind)" in said
        finally:
            kill_leftovers(children)


async def _the_log_says_it_has_stopped_vouching(logged: Logged, stored: int,
                                               signed: int) -> None:
    async def halted() -> httpx.Response | None:
        reply = await logged.client.get("/ledger/checkpoint")
        return reply if reply.status_code == 503 else None

    reply = await wait_until(halted, timeout=30)
    detail = reply.json()["detail"]
    assert "stopped vouching (behind)" in detail and f"has {stored} leaves" in detail \
        and f"size {signed}" in detail, detail
    for path in ("/ledger/checkpoints", "/ledger/proofs/inclusion?leafIndex=0",
                 f"/ledger/proofs/consistency?from=1&to={stored}"):
        refused = await logged.client.get(path)
        assert refused.status_code == 503 and "behind" in refused.text, (path, refused.text)
    ready = await logged.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True, ready.text
    assert ready.json()["log"] == {"halted": True, "reason": "behind", "storedSize": stored,
                                   "anchorSize": signed}, ready.text


@pytest.mark.timeout(600)  # 17 MiB of checkpoints published one by one
async def test_a_flood_of_old_checkpoints_does_not_roll_the_anchor_back(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection, tmp_path: Path,
) -> None:
    """The ledger's broker user re-publishes an old genuine checkpoint until the 16 MiB
    log-head stream holds nothing else, and its state file is gone: the whole of both
    streams is read, the largest checkpoint on them is the anchor, and the restored
    database halts the ledger (and the API's log routes) all the same."""
    children: dict[str, subprocess.Popen[bytes]] = {}
    async with namespace_of_its_own(settings, "flood") as (own, pool, key):
        try:
            async with serving(own, amqp, pool, key, children) as logged:
                await logged.start_ledger()
                await run_cases(logged, 1)
                backed_up, old_note = await logged_everything(logged)
                backup = tmp_path / "b1.dump"
                await back_up(own, backup)
                await run_cases(logged, 2)
                signed, _ = await logged_everything(logged)
                await logged.stop_ledger()
                await _flood(own, old_note.encode(), 17 << 20)
                ledger_state(own).path.unlink()
            await restore(own, pool, backup)
            async with serving(own, amqp, pool, key, children) as logged:
                await _the_log_says_it_has_stopped_vouching(logged, backed_up, signed)
                children["ledger"] = spawn(own, "ledger")
                began = time.perf_counter()
                said = await logged.halted("behind", timeout=120)  # both streams, whole
                print(f"the ledger halted {time.perf_counter() - began:.1f}s after its start")
                assert f"size {signed}" in said and "stream" in said, said[-2000:]
                await logged.stop_halted_ledger()
        finally:
            kill_leftovers(children)


async def _flood(own: Settings, body: bytes, total: int, publishers: int = 4) -> None:
    """Publish ``body`` as the ledger's broker user does its checkpoints, until ``total``
    bytes of it are on the streams (from a few connections at once: the broker, not
    one publisher, sets the pace)."""
    identity = own.identity("ledger")
    began = time.perf_counter()

    async def publish(count: int) -> None:
        connection = await aio_pika.connect(identity.amqp_url)
        try:
            channel = await connection.channel(publisher_confirms=False)
            exchange = await channel.get_exchange(Topology(own.namespace).events_exchange,
                                                  ensure=False)
            for _ in range(count):
                await exchange.publish(
                    aio_pika.Message(body, user_id=own.broker_user("ledger")),
                    routing_key=Topology.CHECKPOINT_KEY)
            confirmed = await connection.channel()  # a round trip: all before it is in
            await confirmed.close()
        finally:
            await connection.close()

    each = (total // len(body)) // publishers + 1
    await asyncio.gather(*(publish(each) for _ in range(publishers)))
    print(f"flooded {each * publishers * len(body)} bytes in "
          f"{time.perf_counter() - began:.1f}s")


async def test_a_ledger_without_its_anchors_waits_for_an_acceptance_on_the_record(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    children: dict[str, subprocess.Popen[bytes]] = {}
    async with namespace_of_its_own(settings, "anchors") as (own, pool, key):
        try:
            async with serving(own, amqp, pool, key, children) as logged:
                await logged.start_ledger()
                await run_cases(logged, 1)
                size, _ = await logged_everything(logged)
                await logged.stop_ledger()
                # While an anchor can be read there is nothing to accept.
                refused = await _accept_size(own, size, "a test")
                assert refused.returncode == 2 and "high-water mark is known" in \
                    refused.stderr, refused.stderr
                await logged.forget_high_water()
                assert not ledger_state(own).path.exists()
                await logged.start_ledger()
                said = await logged.halted("no_anchor")
                assert "accept-size" in said
                await logged.stop_halted_ledger()
                accepted = await _accept_size(own, size, "state file lost with host db-2; "
                                              "size from the witness's last cosignature")
                assert accepted.returncode == 0, accepted.stderr
                row = await pool.fetchrow("SELECT tree_size, reason, accepted_by "
                                          "FROM ledger_acceptances")
                assert row is not None and row["tree_size"] == size
                assert "witness" in row["reason"] and row["accepted_by"]
                with pytest.raises(asyncpg.RaiseError, match="append-only"):
                    await pool.execute("DELETE FROM ledger_acceptances")
                await logged.start_ledger()
                await run_cases(logged, 1)
                grown, _ = await logged_everything(logged)
                assert grown > size
        finally:
            kill_leftovers(children)


async def _accept_size(own: Settings, size: int, reason: str
                       ) -> subprocess.CompletedProcess[str]:
    return await _ledger(own, "accept-size", str(size), "--reason", reason, "--by",
                         "operator-test")


async def test_up_never_makes_new_keys_for_a_namespace_that_has_data(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection, tmp_path: Path,
) -> None:
    """The keys of a namespace with signed events and sealed personal data are gone
    (another directory, a lost volume): ``up`` and ``setup`` refuse, naming each key and
    where they looked, and make nothing."""
    children: dict[str, subprocess.Popen[bytes]] = {}
    async with namespace_of_its_own(settings, "keys") as (own, pool, key):
        try:
            async with serving(own, amqp, pool, key, children) as logged:
                await logged.start_ledger()
                await run_cases(logged, 1)
                await logged_everything(logged)
                await logged.stop_ledger()
        finally:
            kill_leftovers(children)
        # The personal data of the case as a backup of another key left it.
        sealed = await pool.execute("UPDATE case_secrets SET master_key_id = "
                                    "'k-of-the-backup'")
        assert sealed == "UPDATE 1"
        env = {k: v for k, v in own.environment().items()
               if k not in ("CASETRAIL_SIGNING_KEY_FILE", "CASETRAIL_ACTION_KEY_FILE",
                            "CASETRAIL_LOG_KEY_FILE")}
        up = await asyncio.to_thread(subprocess.run, component_command("up"),
                                     capture_output=True, text=True, env=env, cwd=tmp_path,
                                     timeout=120)
        assert up.returncode == 2, up.stderr[-2000:]
        for named in ("the worker's signing key", "the API's action key", "the log's key",
                      "signing_keys", "action_keys", "ledger_keys", "k-of-the-backup"):
            assert named in up.stderr, up.stderr
        looked = Path(env["XDG_CONFIG_HOME"]) / "casetrail"  # where a stack keeps its keys
        assert str(looked) in up.stderr
        assert not list(looked.glob(f"{own.namespace}.*"))  # nothing made
        setup = await asyncio.to_thread(subprocess.run, component_command("setup"),
                                        capture_output=True, text=True, env=env,
                                        timeout=120)
        assert setup.returncode == 2 and "the master key" in setup.stderr, setup.stderr
        # A component given a master key none of the data is sealed under refuses to
        # start, rather than answer with placeholders for good.
        worker = await asyncio.to_thread(subprocess.run, component_command("worker"),
                                         capture_output=True, text=True,
                                         env=own.environment(), timeout=120)
        assert worker.returncode == 2 and "master key" in worker.stderr, worker.stderr[-2000:]


async def test_a_restored_backup_brings_back_no_revoked_or_retired_key(
    settings: Settings, tmp_path: Path,
) -> None:
    """An API key revoked and a signing key retired after the backup are active again in
    the restored database; the runbook's `setup` after `pg_restore` revokes and retires
    them again from the journal kept outside it."""
    async with namespace_of_its_own(settings, "revoked") as (own, pool, _):
        key_id, _ = await ApiKeyStore(pool).create("default", ("cases:read",), "leaked")
        spare = Signer.generate()
        await KeyRegistry(pool).register(spare.key_id, spare.public_key)
        backup = tmp_path / "before.dump"
        await back_up(own, backup)
        for command in (("keys", "revoke", key_id), ("signer", "retire", spare.key_id)):
            done = await asyncio.to_thread(
                subprocess.run, component_command(*command), capture_output=True,
                text=True, env=own.environment(), timeout=60)
            assert done.returncode == 0, done.stderr
        retired_at = await pool.fetchval(
            "SELECT not_valid_after FROM signing_keys WHERE key_id = $1", spare.key_id)
        assert retired_at is not None

        await restore(own, pool, backup)
        assert await pool.fetchval("SELECT revoked_at FROM api_keys WHERE key_id = $1",
                                   key_id) is None  # back to life with the backup
        again = await asyncio.to_thread(
            subprocess.run, component_command("setup"), capture_output=True, text=True,
            env=own.environment(), timeout=120)
        assert again.returncode == 0, again.stderr
        assert f"api_key {key_id}" in again.stdout and f"signing_key {spare.key_id}" in \
            again.stdout, again.stdout
        assert await pool.fetchval("SELECT revoked_at FROM api_keys WHERE key_id = $1",
                                   key_id) is not None
        assert await pool.fetchval(
            "SELECT not_valid_after FROM signing_keys WHERE key_id = $1",
            spare.key_id) == retired_at


async def test_a_rollback_is_mended_from_bundles_and_the_witness_accepts_the_log(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection, tmp_path: Path,
) -> None:
    """The leaves a restore lost come back from bundles exported before it: only all of
    them, only if they rebuild the very root the log signed. The log then goes on from
    its high-water mark, the witness that kept state accepts it, and the audit names the
    cases whose records the restore lost."""
    children: dict[str, subprocess.Popen[bytes]] = {}
    exported = tmp_path / "bundles"
    exported.mkdir()
    async with namespace_of_its_own(settings, "mended") as (own, pool, key):
        try:
            async with serving(own, amqp, pool, key, children) as logged:
                await logged.start_ledger()
                await run_cases(logged, 1)
                backed_up, _ = await logged_everything(logged)
                backup = tmp_path / "b1.dump"
                await back_up(own, backup)
                lost = await run_cases(logged, 2)
                witnessed, _ = await logged_everything(logged)
                for case_id in lost:
                    await export(logged, case_id, exported / f"{case_id}.json")
                accepted = tmp_path / "witness.json"
                assert (await witness_once(logged, accepted)).returncode == 0
                await logged.stop_ledger()
            await restore(own, pool, backup)
            async with serving(own, amqp, pool, key, children) as logged:
                await logged.start_ledger()
                await logged.halted("behind")
                await logged.stop_halted_ledger()
                # One case's bundle missing: the range has a gap, nothing is written.
                partial = tmp_path / "partial"
                partial.mkdir()
                (partial / "one.json").write_bytes((exported / f"{lost[0]}.json").read_bytes())
                refused = await _ledger(own, "recover", "--bundles", str(partial))
                assert refused.returncode == 2 and "no event for leaves" in refused.stderr, \
                    refused.stderr
                assert await pool.fetchval(TREE_SIZE_SQL) == backed_up
                mended = await _ledger(own, "recover", "--bundles", str(exported))
                assert mended.returncode == 0, mended.stderr
                assert f"holds {witnessed} leaves again" in mended.stdout
                await logged.start_ledger()
                (new,) = await run_cases(logged, 1)
                new_events = await pool.fetchval(
                    "SELECT count(*) FROM event_log WHERE case_id = $1", uuid.UUID(new))

                async def signed_on() -> bool:  # the mended tree, and the new case, signed
                    reply = await logged.client.get("/ledger/checkpoint")
                    if reply.status_code == 503:  # still behind, until the ledger signs
                        return False
                    served, _ = open_checkpoint(reply.text, logged.log_key)
                    return bool(served.size == witnessed + new_events)

                await wait_until(signed_on, timeout=30, interval=0.2)
                verdict = await witness_once(logged, accepted)
                assert verdict.returncode == 0, verdict.stdout + verdict.stderr
            done = await asyncio.to_thread(
                subprocess.run, component_command("audit", "--json"), capture_output=True,
                text=True, env=own.environment(), timeout=120)
            report = orjson.loads(done.stdout.splitlines()[-1])
            assert done.returncode == 1
            assert {f["caseId"] for f in report["findings"]
                    if f["kind"] == "removed_after_logging"} == set(lost), report
        finally:
            kill_leftovers(children)


async def _ledger(own: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, component_command("ledger", *args), capture_output=True, text=True,
        env=own.environment(), timeout=60)
