"""The transparency log end to end: the ledger as a real process in a namespace of its
own, the in-process stack feeding it, its checkpoints on the bus and over REST, proofs,
bundles, a witness (the real command), and a superuser who deletes or rewrites the record
afterwards — caught by the witness and by verify-bundle of an earlier bundle."""

from __future__ import annotations

import asyncio
import base64
import re
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aio_pika
import httpx
import orjson
import pytest
from playwright.async_api import Browser, Route, expect

from casetrail.adapters.store import ApiKeyStore, CaseStore, KeyRegistry
from casetrail.adapters.store.ledger import LedgerStore
from casetrail.audit.evidence import Evidence, TrustedKey, verify_bundle
from casetrail.components.supervisor import component_command
from casetrail.config import Settings
from casetrail.contract.integrity import GENESIS, Signer, canonical
from casetrail.ledger import merkle
from casetrail.ledger.log_key import log_signer, write_log_key
from casetrail.ledger.note import (
    COSIGNATURE_V1,
    Note,
    NoteSigner,
    cosign,
    open_checkpoint,
)
from casetrail.trail.keyfile import worker_signer
from tests.support.browser import DOCS, signed_in
from tests.support.helpers import wait_until
from tests.support.logged import (
    Logged,
    as_superuser,
    export,
    logged_everything,
    run_cases,
    witness_once,
)
from tests.support.merkle import mth
from tests.support.stack import (
    free_port,
    in_process_stack,
    kill_leftovers,
    namespace_of_its_own,
    spawn,
    stop_cleanly,
)


@pytest.fixture(scope="module")
async def logged(settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection,
                 tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Logged]:
    keys = tmp_path_factory.mktemp("witness")
    witness = NoteSigner.generate("witness.test/w1", COSIGNATURE_V1)
    write_log_key(keys / "witness-key", witness)
    async with namespace_of_its_own(settings, "ledger",
                                    ledger_witnesses=[witness.verifier.text()]) as (own, pool,
                                                                                    key):
        channel = await amqp.channel()
        exchange = await channel.get_exchange(f"{own.namespace}.events")
        checkpoints = await channel.declare_queue(exclusive=True)
        await checkpoints.bind(exchange, "ledger.#")
        children: dict[str, subprocess.Popen[bytes]] = {}
        try:
            async with in_process_stack(own, amqp, pool, worker_concurrency=4) as stack, \
                    httpx.AsyncClient(base_url=stack.base_url, timeout=10,
                                      headers={"Authorization": f"Bearer {key}"}) as client:
                running = Logged(own, pool, stack, client, children,
                                 log_signer(own).verifier, keys / "witness-key",
                                 witness.verifier, checkpoints)
                await running.start_ledger()
                yield running
                await stop_cleanly(children)
        finally:
            kill_leftovers(children)
            await channel.close()


async def test_every_stored_event_is_a_leaf_of_a_signed_published_checkpoint(
    logged: Logged,
) -> None:
    await run_cases(logged, 3)
    size, note = await logged_everything(logged)
    head, _ = open_checkpoint(note, logged.log_key)
    # The leaves are the stored events' hashes; the root is RFC 6962's over them.
    rows = await logged.pool.fetch(
        "SELECT l.leaf_index, e.event_id, e.hash FROM ledger_leaves l "
        "JOIN event_log e USING (event_id) ORDER BY l.leaf_index")
    assert [r["leaf_index"] for r in rows] == list(range(size))
    assert {r["event_id"] for r in rows} == {r["event_id"] for r in await logged.pool.fetch(
        "SELECT event_id FROM event_log")}

    assert head.root == mth([bytes.fromhex(r["hash"]) for r in rows])
    # Each event's inclusion proof, served publicly, checks out.
    http = httpx.AsyncClient(base_url=logged.stack.base_url)
    async with http:
        for row in rows:
            proof = (await http.get(f"/ledger/leaves/{row['hash']}/proof")).json()
            path = [base64.b64decode(h) for h in proof["proof"]]
            assert proof["leafIndex"] == row["leaf_index"] and proof["treeSize"] == size
            assert merkle.verify_inclusion(merkle.leaf_hash(bytes.fromhex(row["hash"])),
                                           row["leaf_index"], size, path, head.root)
        # Every checkpoint is consistent with the latest.
        history = (await http.get("/ledger/checkpoints", params={"since": 0})).json()
        assert history["checkpoints"][-1]["treeSize"] == size
        for earlier in history["checkpoints"]:
            old, _ = open_checkpoint(earlier["note"], logged.log_key)
            proof = (await http.get("/ledger/proofs/consistency",
                                    params={"from": old.size, "to": size})).json()
            assert merkle.verify_consistency(old.size, old.root, size, head.root,
                                             [base64.b64decode(h) for h in proof["proof"]])
        assert logged.log_key.text() in (await http.get("/ledger/key")).text
        by_index = (await http.get("/ledger/proofs/inclusion",
                                   params={"leafIndex": 0, "treeSize": size})).json()
        assert merkle.verify_inclusion(merkle.leaf_hash(bytes.fromhex(rows[0]["hash"])), 0,
                                       size, [base64.b64decode(h) for h in by_index["proof"]],
                                       head.root)
        wrong = await http.get("/ledger/proofs/inclusion", params={"leafIndex": size + 5})
        assert wrong.status_code == 404 and f"leaf {size + 5}" in wrong.text
    # Each checkpoint went out on the bus, from the ledger's own broker user.
    message = await logged.checkpoints.get(timeout=5, fail=True)
    assert message is not None
    assert message.routing_key == "ledger.checkpoint"
    assert message.user_id == logged.settings.broker_user("ledger")
    assert open_checkpoint(message.body.decode(), logged.log_key)[0].size <= size


async def test_nobody_without_the_case_counts_its_events_through_the_log(
    logged: Logged,
) -> None:
    """Event ids derive from the case id: a public proof lookup by event id told anyone
    holding a case id how many events it has. The public lookup is by hash; by event id
    it is the case's own route, under the case's access rules."""
    case_id = (await run_cases(logged, 1))[0]
    await logged_everything(logged)
    row = await logged.pool.fetchrow(
        "SELECT event_id, hash FROM event_log WHERE case_id = $1 AND seq = 1",
        uuid.UUID(case_id))
    assert row is not None
    event_id, event_hash = row["event_id"], row["hash"]
    async with httpx.AsyncClient(base_url=logged.stack.base_url) as anyone:
        assert (await anyone.get(f"/ledger/events/{event_id}/proof")).status_code == 404
        probe = await anyone.get(f"/cases/{case_id}/events/{event_id}/proof")
        assert probe.status_code == 401
        by_hash = await anyone.get(f"/ledger/leaves/{event_hash}/proof")
        assert by_hash.status_code == 200 and by_hash.json()["eventHash"] == event_hash
        assert (await anyone.get(f"/ledger/leaves/{'0' * 64}/proof")).status_code == 404
        assert (await anyone.get("/ledger/leaves/not-a-hash/proof")).status_code == 422
    own = await logged.client.get(f"/cases/{case_id}/events/{event_id}/proof")
    assert own.status_code == 200, own.text
    assert own.json()["eventHash"] == event_hash
    assert own.json()["leafIndex"] == by_hash.json()["leafIndex"]
    _, other = await ApiKeyStore(logged.pool).create("other-tenant", ("cases:read",), "nosy")
    async with httpx.AsyncClient(base_url=logged.stack.base_url,
                                 headers={"Authorization": f"Bearer {other}"}) as nosy:
        assert (await nosy.get(f"/cases/{case_id}/events/{event_id}/proof")).status_code \
            == 404


async def test_the_viewer_checks_the_decisions_inclusion_proof_in_the_browser(
    logged: Logged, browser: Browser,
) -> None:
    case_id = (await run_cases(logged, 1))[0]
    size, _ = await logged_everything(logged)
    key = logged.client.headers["Authorization"].removeprefix("Bearer ")
    page = await signed_in(browser, logged.stack, key, f"/ui/cases/{case_id}")
    logged_fact = page.locator("#f-logged")
    await expect(logged_fact).to_contain_text("proof checks", timeout=15_000)
    await expect(logged_fact).to_contain_text(f"in checkpoint {size:,} at leaf")
    await page.locator("section.case-head").screenshot(path=str(DOCS / "viewer-logged.png"))

    # A proof altered on its way to the browser is caught there.
    async def altered(route: Route) -> None:
        served = await route.fetch()
        proof = await served.json()
        assert proof["proof"], "a one-leaf tree has no path to alter"
        proof["proof"][0] = base64.b64encode(bytes(32)).decode()
        await route.fulfill(response=served, json=proof)

    proofs = re.compile(r"/ledger/leaves/[0-9a-f]{64}/proof$")
    await page.route(proofs, altered)
    await page.reload()
    await expect(logged_fact).to_contain_text("inclusion proof does not check",
                                              timeout=15_000)

    # So is a sound proof of another event (this case's first) served in its place.
    first = await logged.pool.fetchval(
        "SELECT hash FROM event_log WHERE case_id = $1 AND seq = 0", uuid.UUID(case_id))

    async def swapped(route: Route) -> None:
        await route.fulfill(response=await route.fetch(
            url=f"{logged.stack.base_url}/ledger/leaves/{first}/proof"))

    await page.unroute(proofs)
    await page.route(proofs, swapped)
    await page.reload()
    await expect(logged_fact).to_contain_text("inclusion proof does not check",
                                              timeout=15_000)
    await page.close()


async def test_a_witness_accepts_cosigns_and_bundles_carry_proofs_and_the_cosignature(
    logged: Logged, tmp_path: Path,
) -> None:
    case_id = (await run_cases(logged, 1))[0]
    size, _ = await logged_everything(logged)
    state = tmp_path / "witness.json"
    witness = await asyncio.to_thread(subprocess.run, component_command(
        "witness", "--log", logged.stack.base_url, "--log-key", logged.log_key.text(),
        "--state", str(state), "--cosign-key", str(logged.witness_key), "--once"),
        capture_output=True, text=True, env=logged.settings.environment(), timeout=60)
    assert witness.returncode == 0, witness.stderr
    assert f"size {size}" in witness.stdout
    served = (await logged.client.get("/ledger/checkpoint")).text
    assert f"\u2014 {logged.witness.name} " in served
    # The bundle: every event with its tlog-proof in that checkpoint, cosignature and all.
    reply = await logged.client.get(f"/cases/{case_id}/bundle")
    bundle = reply.json()
    assert all("logProof" in e for e in bundle["events"])
    assert bundle["log"]["checkpoint"] == served
    signer = worker_signer(logged.settings)
    report = verify_bundle(bundle, [signer.public_key], [logged.log_key], [logged.witness])
    assert report.verified and report.log is not None
    assert report.log["eventsInLog"] == len(bundle["events"])
    assert report.log["witnesses"] == [logged.witness.name]
    # A proof bent by one bit, or a log key not the log's, is caught.
    bent = orjson.loads(orjson.dumps(bundle))
    proof = bent["events"][1]["logProof"].split("\n")
    proof[2] = base64.b64encode(bytes(32)).decode()
    bent["events"][1]["logProof"] = "\n".join(proof)
    assert [p.code for p in verify_bundle(bent, [signer.public_key],
                                          [logged.log_key]).problems] == ["bad_log_proof"]
    stranger = NoteSigner.generate(logged.log_key.name).verifier
    assert "bad_checkpoint" in {p.code for p in verify_bundle(
        bundle, [signer.public_key], [stranger]).problems}
    # A cosignature from a witness the log does not know is refused.
    unknown = NoteSigner.generate("witness.test/stranger", COSIGNATURE_V1)
    note = Note.parse(served)
    note = Note(note.text, note.signatures[:1])  # the log's own signature only
    refused = await logged.client.post(
        "/ledger/cosignatures", content=note.with_signatures(cosign(note, unknown, 1)).render())
    assert refused.status_code == 422 and "witness" in refused.text


async def test_a_witness_left_running_is_a_component_with_its_own_metrics(
    logged: Logged, tmp_path: Path,
) -> None:
    """``casetrail witness`` without ``--once`` keeps following the log as a component:
    its metrics port says the tree size it last accepted and how its looks went, and it
    stops cleanly on SIGTERM."""
    await run_cases(logged, 1)
    size, _ = await logged_everything(logged)
    port = free_port()
    witness = spawn(logged.settings, "witness", "--log", logged.stack.base_url, "--log-key",
                    logged.log_key.text(), "--state", str(tmp_path / "witness.json"),
                    "--interval", "0.5", CASETRAIL_WITNESS_METRICS_PORT=str(port))
    try:
        async def accepted() -> bool:
            try:
                async with httpx.AsyncClient() as client:
                    text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            except httpx.TransportError:
                return False
            return f"casetrail_witness_tree_size {float(size)}" in text and \
                'casetrail_witness_checks_total{outcome="unchanged"}' in text

        await wait_until(accepted, timeout=30, interval=0.3)
        witness.terminate()
        await asyncio.to_thread(witness.wait, 30)
    finally:
        kill_leftovers({"witness": witness})
    said = Path(witness.log_path).read_text()  # type: ignore[attr-defined]  # noqa: ASYNC240
    assert witness.returncode == 0, said
    assert "accepted" in said and f"size {size}" in said


REBUILD = (
    # The tree rebuilt from what the store holds now, and signed again with the log key.
    "TRUNCATE ledger_queue, ledger_leaves, ledger_tiles, ledger_cosignatures, "
    "ledger_checkpoints",
    "INSERT INTO ledger_queue (event_id, case_id, hash) SELECT event_id, case_id, hash "
    "FROM event_log ORDER BY recorded_at, case_id, attempt, seq",
)


async def test_a_keys_retirement_comes_from_the_auditor_and_time_from_a_witness(
    logged: Logged, tmp_path: Path,
) -> None:
    """A thief of a retired key used to set the bundle's notValidAfter to null (or
    backdate occurredAt) and pass `verify-bundle --trust KEY`. Trust, and until when,
    is now the auditor's (`--trust KEY@T`); a retired key's event verifies only when a
    trusted witness cosigned a checkpoint holding it before T."""
    case_id = (await run_cases(logged, 1))[0]
    await logged_everything(logged)
    cosigned = await asyncio.to_thread(subprocess.run, component_command(
        "witness", "--log", logged.stack.base_url, "--log-key", logged.log_key.text(),
        "--state", str(tmp_path / "w.json"), "--cosign-key", str(logged.witness_key),
        "--once"), capture_output=True, text=True, env=logged.settings.environment(),
        timeout=60)
    assert cosigned.returncode == 0, cosigned.stderr
    bundle = (await logged.client.get(f"/cases/{case_id}/bundle")).json()
    key = worker_signer(logged.settings).public_key
    after, before = datetime.now(UTC) + timedelta(days=1), datetime(2020, 1, 1, tzinfo=UTC)
    # Retired after the witness saw the trail: verified, with the witness's word on time.
    assert verify_bundle(bundle, [TrustedKey(key, after)], [logged.log_key],
                         [logged.witness]).verified
    # Retired before: refused, whatever the bundle claims of the key or of the time.
    bundle["keys"] = [{**k, "notValidAfter": None} for k in bundle["keys"]]
    report = verify_bundle(bundle, [TrustedKey(key, before)], [logged.log_key],
                           [logged.witness])
    assert not report.verified and {p.code for p in report.problems} == {"retired_key"}
    # No trusted witness: nothing shows when the events were signed.
    assert "retired_key" in {p.code for p in verify_bundle(
        bundle, [TrustedKey(key, after)], [logged.log_key]).problems}
    # The same from the command line: KEY@T, and a trust file of such lines.
    path = tmp_path / "bundle.json"
    path.write_bytes(orjson.dumps(bundle))
    trust_file = tmp_path / "trusted-keys"
    trust_file.write_text(f"# the worker's key, retired in 2020\n"
                          f"{base64.b64encode(key).decode()}@2020-01-01T00:00:00Z\n")
    for trust in (f"{base64.b64encode(key).decode()}@2020-01-01T00:00:00Z", str(trust_file)):
        refused = await asyncio.to_thread(subprocess.run, component_command(
            "verify-bundle", str(path), "--trust", trust, "--trust-log", logged.log_key.text(),
            "--trust-witness", logged.witness.text()), capture_output=True, text=True,
            env=logged.settings.environment(), timeout=60)
        assert refused.returncode == 1 and "retired_key" in refused.stdout + refused.stderr


async def verify_bundle_today(logged: Logged, bundle: Path) -> subprocess.CompletedProcess[str]:
    signer = worker_signer(logged.settings)
    return await asyncio.to_thread(subprocess.run, component_command(
        "verify-bundle", str(bundle), "--trust", base64.b64encode(signer.public_key).decode(),
        "--trust-log", logged.log_key.text(), "--log", logged.stack.base_url),
        capture_output=True, text=True, env=logged.settings.environment(), timeout=60)


async def test_deleting_or_rewriting_the_record_afterwards_is_caught(
    logged: Logged, tmp_path: Path,
) -> None:
    deleted, shortened, rewritten = await run_cases(logged, 3)
    size, _ = await logged_everything(logged)
    accepted = tmp_path / "accepted.json"
    assert (await witness_once(logged, accepted)).returncode == 0
    bundles = {c: await export(logged, c, tmp_path / f"{c}.json")
               for c in (deleted, shortened, rewritten)}
    for path in bundles.values():
        today = await verify_bundle_today(logged, path)
        assert today.returncode == 0 and "today still extends the bundle's checkpoint" in \
            today.stdout, today.stdout  # it says the consistency check ran
    evidence = Evidence(CaseStore(logged.pool), KeyRegistry(logged.pool),
                        LedgerStore(logged.pool))

    # 1. The last two events of a case removed, the tree left alone: the store no longer
    #    holds what the log holds, and verify says so.
    gone = await logged.pool.fetch(
        "SELECT event_id FROM event_log WHERE case_id = $1 ORDER BY seq DESC LIMIT 2",
        uuid.UUID(shortened))
    await as_superuser(logged.pool, "DELETE FROM event_log WHERE event_id = ANY($1::uuid[])",
                        args=([r["event_id"] for r in gone],))
    report = await evidence.verify(uuid.UUID(shortened))
    assert report is not None and "removed_after_logging" in {p.code for p in report.problems}

    # 2. A whole case deleted and the tree rebuilt without it (and without the cut
    #    events). The ledger will not sign it: its high-water mark, kept off the
    #    database, is larger than the rebuilt tree.
    await logged.stop_ledger()
    await as_superuser(logged.pool, f"DELETE FROM event_log WHERE case_id = '{deleted}'",
                        f"DELETE FROM cases WHERE case_id = '{deleted}'", *REBUILD)
    await logged.start_ledger()
    said = await logged.halted("behind")
    assert f"the stored tree has 0 leaves but the log signed {logged.settings.origin()} " \
           f"size {size}" in said, said[-2000:]
    await logged.stop_halted_ledger()
    #    Signed with the log key by an attacker who also removed the ledger's anchors:
    #    smaller than the tree the witness accepted.
    await logged.forget_high_water()
    await logged.start_ledger()
    await wait_until(lambda: _checkpoint_below(logged, size), timeout=30)
    verdict = await witness_once(logged, _copy(accepted, tmp_path / "w2.json"))
    assert verdict.returncode == 1, verdict.stdout + verdict.stderr
    assert "rolled back" in verdict.stderr and f"size {size}" in verdict.stderr
    today = await verify_bundle_today(logged, bundles[deleted])
    assert today.returncode == 1 and "log_inconsistent" in today.stdout + today.stderr
    # The rebuilt tree lacks the cut events too: the earlier bundle of that case shows it.
    today = await verify_bundle_today(logged, bundles[shortened])
    assert today.returncode == 1 and "log_inconsistent" in today.stdout + today.stderr

    # 3. A trail rewritten (the decision changed), re-signed with the stolen event key and
    #    chained again, the tree rebuilt and grown past the accepted size: it forked.
    await logged.stop_ledger()
    await _rewrite(logged, rewritten, worker_signer(logged.settings))
    await as_superuser(logged.pool, *REBUILD)
    report = await evidence.verify(uuid.UUID(rewritten))
    assert report is not None and report.verified  # the chain alone cannot tell
    await logged.forget_high_water()
    await logged.start_ledger()
    await run_cases(logged, 2)
    grown, _ = await logged_everything(logged)
    assert grown > size
    verdict = await witness_once(logged, _copy(accepted, tmp_path / "w3.json"))
    assert verdict.returncode == 1, verdict.stdout + verdict.stderr
    assert "forked" in verdict.stderr and f"size {size}" in verdict.stderr \
        and f"size {grown}" in verdict.stderr
    today = await verify_bundle_today(logged, bundles[rewritten])
    assert today.returncode == 1 and "log_inconsistent" in today.stdout + today.stderr
    # The earlier bundle itself still verifies offline: it is the evidence of what was.
    signer = worker_signer(logged.settings)
    earlier = orjson.loads(bundles[rewritten].read_bytes())
    assert verify_bundle(earlier, [signer.public_key], [logged.log_key]).verified


async def _checkpoint_below(logged: Logged, size: int) -> bool:
    reply = await logged.client.get("/ledger/checkpoint")
    return reply.status_code == 200 and \
        open_checkpoint(reply.text, logged.log_key)[0].size < size


def _copy(source: Path, target: Path) -> Path:
    shutil.copy(source, target)
    return target


async def _rewrite(logged: Logged, case_id: str, signer: Signer) -> None:
    """Change the case's decision in its terminal event and re-sign its chain from there,
    and the case row's to match, so that the case on its own still verifies."""
    rows = await logged.pool.fetch(
        "SELECT event_id, seq, body FROM event_log WHERE case_id = $1 ORDER BY attempt, seq",
        uuid.UUID(case_id))
    prev, args, answer = GENESIS, [], None
    for row in rows:
        envelope = orjson.loads(row["body"])
        if envelope["eventType"] == "CASE_COMPLETED":
            answer = envelope["payload"]["answer"]
            answer["decision"] = "approve" if answer.get("decision") != "approve" else "decline"
        body = canonical(envelope)
        sealed = signer.seal(prev, body)
        prev = sealed.hash
        args.append((sealed.prev_hash, sealed.hash, sealed.sig, body,
                     envelope["payload"], row["event_id"]))
    async with logged.pool.acquire() as conn, conn.transaction():
        await conn.execute("ALTER TABLE event_log DISABLE TRIGGER USER")
        await conn.executemany(
            "UPDATE event_log SET prev_hash = $1, hash = $2, sig = $3, body = $4, "
            "payload = $5 WHERE event_id = $6", args)
        await conn.execute("ALTER TABLE event_log ENABLE TRIGGER USER")
        await conn.execute("UPDATE cases SET answer = $1 WHERE case_id = $2", answer,
                           uuid.UUID(case_id))


async def test_the_ledger_refuses_to_sign_over_a_tree_altered_underneath_it(
    logged: Logged,
) -> None:
    """The ledger is its own first witness: at start it checks that its last checkpoint
    is still the stored tree's root, and exits 2 naming the problem when it is not."""
    await run_cases(logged, 1)
    await logged_everything(logged)
    await logged.stop_ledger()
    tile = await logged.pool.fetchrow(
        "SELECT level, tile_index, hashes FROM ledger_tiles ORDER BY level, tile_index LIMIT 1")
    assert tile is not None
    bent = bytes([tile["hashes"][0] ^ 1]) + bytes(tile["hashes"][1:])
    await as_superuser(logged.pool, "UPDATE ledger_tiles SET hashes = $1 WHERE level = $2 "
                        "AND tile_index = $3", args=(bent, tile["level"], tile["tile_index"]))
    try:
        refused = await asyncio.to_thread(
            subprocess.run, component_command("ledger"), capture_output=True, text=True,
            env=logged.settings.environment(), timeout=60)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert "the tree was altered" in refused.stderr
    finally:
        await as_superuser(logged.pool, "UPDATE ledger_tiles SET hashes = $1 WHERE level = $2 "
                            "AND tile_index = $3",
                            args=(bytes(tile["hashes"]), tile["level"], tile["tile_index"]))
        await logged.start_ledger()


async def test_a_tree_size_beyond_any_log_is_a_422_naming_the_field(logged: Logged) -> None:
    """A schema fuzzer found GET /ledger/checkpoints?since=<29 digits> answering 500
    (the number reached Postgres as a bigint); every size and index is bounded."""
    huge = "9" * 29
    async with httpx.AsyncClient(base_url=logged.stack.base_url) as anyone:
        for path, field, params in (
                ("/ledger/checkpoints", "since", {"since": huge}),
                ("/ledger/proofs/inclusion", "treeSize", {"leafIndex": "0", "treeSize": huge}),
                ("/ledger/proofs/inclusion", "leafIndex", {"leafIndex": huge}),
                ("/ledger/proofs/consistency", "from", {"from": huge})):
            reply = await anyone.get(path, params=params)
            assert reply.status_code == 422, (path, reply.status_code, reply.text)
            assert reply.headers["content-type"] == "application/problem+json"
            assert ["query", field] in [e["loc"][:2] for e in reply.json()["errors"]], path
        note = f"{logged.settings.origin()}\n{huge}\n{'A' * 43}=\n\n\u2014 w AAAA\n"
        cosigned = await anyone.post("/ledger/cosignatures", content=note.encode())
        assert cosigned.status_code == 422 and "beyond any this log can hold" in cosigned.text


async def test_an_event_queued_twice_is_one_leaf(logged: Logged) -> None:
    """An operator who queues a logged event again (or the backfill meeting the trigger)
    does not make it a second leaf, and the log goes on."""
    case_id = (await run_cases(logged, 1))[0]
    size, _ = await logged_everything(logged)
    again = await logged.pool.fetch(
        "SELECT event_id, case_id, hash FROM event_log WHERE case_id = $1", uuid.UUID(case_id))
    await logged.pool.executemany(
        "INSERT INTO ledger_queue (event_id, case_id, hash) VALUES ($1, $2, $3)",
        [tuple(r.values()) for r in again])
    more = await run_cases(logged, 1)
    grown, _ = await logged_everything(logged)
    assert grown == size + await logged.pool.fetchval(
        "SELECT count(*) FROM event_log WHERE case_id = $1", uuid.UUID(more[0]))
    assert await logged.pool.fetchval("SELECT count(*) FROM ledger_queue") == 0
    assert await logged.pool.fetchval(
        "SELECT count(*) FROM ledger_leaves WHERE case_id = $1", uuid.UUID(case_id)) == len(again)
