"""``casetrail up``, ``casetrail demo`` and ``casetrail tail``."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import orjson

from casetrail.adapters.bus.connection import IncomingMessage, connect
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import ApiKeyStore, CaseStore, KeyRegistry, create_pool
from casetrail.adapters.store.ledger import LedgerStore
from casetrail.agents import CAPABILITIES
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.audit.evidence import Evidence, verify_bundle
from casetrail.audit.rendering import AUDITOR_SQL, format_event, format_trail
from casetrail.components.supervisor import Stack, stack_commands
from casetrail.config import Settings, local_dir
from casetrail.contract.auth import Scope
from casetrail.contract.events import EVENT_TYPES, PARKING_EVENT_TYPE, TERMINAL_EVENT_TYPES
from casetrail.contract.integrity import public_key_text
from casetrail.ledger.log_key import ensure_local_log_key, log_signer
from casetrail.ledger.witness import LogClient, LogMisbehaved, LogUnreachable, Witness
from casetrail.ops.keys_on_hand import refuse_new_keys
from casetrail.ops.setup import setup
from casetrail.ops.waiting import wait_for_services
from casetrail.trail.keyfile import (
    action_signer,
    ensure_local_action_key,
    ensure_local_signer,
    worker_signer,
)

EXPECTED_DECISIONS = ("approve", "refer", "decline")
AML_SAMPLE = {
    "customerId": "C-2002",
    "customerName": "Lena Brandt",
    "country": "DE",
    "transfers": [
        {"amount": 9400, "counterpartyCountry": "AE", "date": "2026-11-02"},
        {"amount": 9650, "counterpartyCountry": "AE", "date": "2026-11-05"},
        {"amount": 9800, "counterpartyCountry": "AE", "date": "2026-11-09"},
        {"amount": 1200, "counterpartyCountry": "FR", "date": "2026-11-12"},
    ],
}

TOOL_CALLS_SQL = (
    "SELECT cycle_index, tool_name, tool_source, duration_ms, tool_args, tool_result\n"
    "FROM react_tool_calls WHERE case_id = $1 ORDER BY attempt, seq, call_index;"
)


def _say(text: str = "") -> None:
    print(text, flush=True)


async def _wait_ready(base_url: str, stack: Stack, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    async with httpx.AsyncClient(base_url=base_url, timeout=2.0) as client:
        while True:
            if failed := stack.failed():
                raise RuntimeError("a component stopped: " + "; ".join(failed))
            try:
                if (await client.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the API at {base_url} was not ready within {timeout:g}s")
            await asyncio.sleep(0.3)


async def run_stack(settings: Settings) -> int:
    """``casetrail up``: the whole stack as child processes until Ctrl-C or SIGTERM."""
    await wait_for_services(settings)
    await refuse_new_keys(settings)
    settings = ensure_local_action_key(ensure_local_log_key(ensure_local_signer(settings)))
    report = await setup(settings)
    _say(f"migrations: {', '.join(report.migrations) or 'up to date'}; components run as "
         f"their own identities ({report.secrets_file})")
    stack = Stack(stack_commands(settings.api_port, sorted(CAPABILITIES)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stack.start()
    _say(f"casetrail is up: http://{settings.api_host}:{settings.api_port} "
         f"(namespace {settings.namespace}); Ctrl-C stops it")
    code = 0
    while not stop.is_set():
        if failed := stack.failed():
            _say("stopping, because " + "; ".join(failed))
            code = 1
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    await asyncio.to_thread(stack.stop)
    _say("casetrail stopped")
    return code


def _label(case_id: str, names: dict[str, str]) -> str:
    return names.get(case_id, case_id[:8])


async def run_demo(settings: Settings) -> int:
    """Stack up, sample cases in, cycles shown live, trails read back from Postgres."""
    _say("== casetrail demo ==")
    settings, key, reviewer = await _prepare(settings)
    stack = Stack(stack_commands(settings.api_port, sorted(CAPABILITIES)))
    stack.start()
    base_url = f"http://127.0.0.1:{settings.api_port}"
    connection = None
    try:
        await _wait_ready(base_url, stack)
        _say(f"stack ready: api {base_url}, worker, consumer, capability workers "
             f"({', '.join(sorted(CAPABILITIES))})\n")
        connection = await connect(settings.amqp_url, "casetrail-demo")
        channel = await connection.channel()
        events = await Topology(settings.namespace).declare_events_exchange(channel)
        live = await channel.declare_queue(exclusive=True, auto_delete=True)
        await live.bind(events, routing_key=Topology.EVERY_EVENT)
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def on_event(message: IncomingMessage) -> None:
            inbox.put_nowait(orjson.loads(message.body))

        await live.consume(on_event, no_ack=True)
        names: dict[str, str] = {}
        submissions = [("loan-officer", app, app["applicantName"]) for app in SAMPLE_APPLICATIONS]
        submissions.append(("aml-screening", AML_SAMPLE, AML_SAMPLE["customerName"]))
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=base_url, timeout=10.0, headers=headers) as client:
            for agent, case_input, who in submissions:
                reply = await client.post("/cases", json={"agent": agent, "input": case_input},
                                          headers={"Idempotency-Key": str(uuid.uuid4())})
                reply.raise_for_status()
                case_id = reply.json()["caseId"]
                names[case_id] = f"{agent}:{who}"
                _say(f"POST /cases {agent} for {who} -> 202 caseId={case_id}")
            _say("\n-- live from the bus (exchange "
                 f"{settings.namespace}.events, binding case.#) --\n"
                 "   (names and customer ids are personal data: the trail holds "
                 "placeholders such as [pii:applicantName]; a pii:read key sees the values)")
            await _watch(inbox, names, base_url, reviewer)
            for case_id in names:
                await _until_recorded(client, case_id)
        return _show_api_use(await _show_trails(settings, names, base_url), key, base_url,
                             settings.public_url or base_url, names)
    finally:
        if connection is not None:
            await connection.close()
        await asyncio.to_thread(stack.stop)


async def _watch(inbox: asyncio.Queue[dict[str, Any]], names: dict[str, str], base_url: str,
                 reviewer: str) -> None:
    """Print the sample cases' events as they arrive, until each has ended; what waits
    for a person is reviewed by the demo's reviewer."""
    ended: set[str] = set()
    deadline = asyncio.get_running_loop().time() + 60
    while ended != set(names):
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise RuntimeError("the sample cases did not all end within 60s")
        event = await asyncio.wait_for(inbox.get(), remaining)
        if event["caseId"] not in names:
            continue
        _say(f"{_label(event['caseId'], names)}")
        _say(format_event(event))
        if event["eventType"] in TERMINAL_EVENT_TYPES:
            ended.add(event["caseId"])
        elif event["eventType"] == PARKING_EVENT_TYPE:
            await _review(base_url, reviewer, event, names)


DEMO_TENANT = "default"


def _show_viewer(base_url: str, names: dict[str, str]) -> None:
    _say("\nEach case in the trail viewer (sign in with the key above; `make up` keeps the "
         "stack running):")
    for case_id, label in names.items():
        _say(f"  {label:<32} {base_url}/ui/cases/{case_id}")
    _say(f"  all cases, with search:          {base_url}/ui/")


def _show_api_use(code: int, key: str, base_url: str, public_url: str,
                  names: dict[str, str]) -> int:
    case_id = next(iter(names))
    _say(f"\nThe API wants a key (this demo made one for tenant {DEMO_TENANT}):\n"
         f"  curl -s -H 'Authorization: Bearer {key}' {base_url}/cases/{case_id}\n"
         f"  curl -s -H 'Authorization: Bearer {key}' {base_url}/cases/{case_id}/verify\n"
         "Make your own: casetrail keys create --tenant acme --scopes "
         "cases:start,cases:read,cases:cancel")
    _show_viewer(public_url, names)
    return code


async def _prepare(settings: Settings) -> tuple[Settings, str, str]:
    """A signing key for the worker, the identities and schema (``casetrail setup``), an
    API key for the demo's requests (tenant ``default``, the scopes a case needs), and
    one for the person who reviews what waits for one (another person: four eyes)."""
    await wait_for_services(settings)
    await refuse_new_keys(settings)
    settings = ensure_local_action_key(ensure_local_log_key(ensure_local_signer(settings)))
    await setup(settings)
    pool = await create_pool(settings.database_url, max_size=1)
    try:
        keys = ApiKeyStore(pool)
        _, key = await keys.create(
            DEMO_TENANT, (Scope.START, Scope.READ, Scope.CANCEL), "casetrail demo")
        _, reviewer = await keys.create(DEMO_TENANT, (Scope.REVIEW, Scope.READ),
                                        "casetrail demo reviewer", None, DEMO_REVIEWER)
    finally:
        await pool.close()
    return settings, key, reviewer


DEMO_REVIEWER = "demo-reviewer"


async def _review(base_url: str, reviewer: str, event: dict[str, Any],
                  names: dict[str, str]) -> None:
    """The demo's reviewer confirms what waits for a person, as a person would through
    POST /cases/{id}/review; the worker records it and ends the case."""
    case_id = event["caseId"]
    reasons = ", ".join(event["payload"].get("reviewReasons") or ())
    async with httpx.AsyncClient(base_url=base_url, timeout=10.0, headers={
            "Authorization": f"Bearer {reviewer}"}) as client:
        for _ in range(100):  # until the wait is stored (it was just published)
            reply = await client.post(f"/cases/{case_id}/review", json={
                "verdict": "confirm",
                "reason": f"Read the reasoning and the checks ({reasons}); the decision "
                          "stands."})
            if reply.status_code != 409:
                break
            await asyncio.sleep(0.1)
        reply.raise_for_status()
    _say(f"{_label(case_id, names)}\n  POST /cases/{case_id[:8]}…/review as "
         f"{DEMO_REVIEWER} (cases:review, a person) -> 202 confirm")


async def _until_recorded(client: httpx.AsyncClient, case_id: str) -> None:
    """Wait until the consumer has committed the case's terminal event."""
    for _ in range(300):
        if (await client.get(f"/cases/{case_id}")).json()["status"] not in ("queued", "running"):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"case {case_id} ended on the bus but not in Postgres within 30s")


async def _show_trails(settings: Settings, names: dict[str, str], base_url: str) -> int:
    pool = await create_pool(settings.database_url, max_size=2)
    store = CaseStore(pool)
    decisions: list[tuple[str, str, str, int]] = []
    try:
        _say("\n-- the persisted trail, from Postgres --")
        _say("The auditor's query (CaseStore.find_by_case_and_types):\n" + AUDITOR_SQL)
        for case_id, name in names.items():
            trail = [e.as_json() for e in await store.find_by_case_and_types(
                uuid.UUID(case_id), list(EVENT_TYPES))]
            _say(f"\n{name}")
            _say(format_trail(case_id, trail))
            row = await store.get_case(uuid.UUID(case_id))
            assert row is not None
            decision = (row["answer"] or {}).get("decision", row["status"])
            decisions.append((name, row["status"], str(decision), row["cycles"]))
        first = next(iter(names))
        _say(f"\nOne row per tool call (view react_tool_calls), case {names[first]}:\n"
             + TOOL_CALLS_SQL)
        for call in await pool.fetch(TOOL_CALLS_SQL.replace("\n", " "), uuid.UUID(first)):
            _say(f"  cycle {call['cycle_index']}  {call['tool_name']:<22} "
                 f"{call['tool_source']:<6} {call['duration_ms']:>5} ms  "
                 f"{orjson.dumps(call['tool_result']).decode()}")
        ledger = LedgerStore(pool)
        intact = await _show_integrity(settings, Evidence(store, KeyRegistry(pool), ledger),
                                       names)
        intact = await _show_log(settings, ledger, names, base_url) and intact
        intact = intact and await _show_bundle(settings, Evidence(store, KeyRegistry(pool),
                                                                  ledger), names)
    finally:
        await pool.close()
    _say("\n-- outcome --")
    for name, status, decision, cycles in decisions:
        _say(f"  {name:<40} {status:<10} {decision:<10} {cycles} cycles")
    loans = [d for n, _, d, _ in decisions if n.startswith("loan-officer")]
    if not intact:
        _say("a demo trail did not verify")
        return 1
    if tuple(loans) != EXPECTED_DECISIONS:
        _say(f"unexpected loan decisions {loans}; expected {list(EXPECTED_DECISIONS)}")
        return 1
    _say("\nEvery cycle above was published to RabbitMQ as it happened and is now in "
         "Postgres.\nTry: casetrail trail " + next(iter(names)))
    return 0


async def _show_integrity(settings: Settings, evidence: Evidence, names: dict[str, str]
                          ) -> bool:
    """Verify every demo trail, then export one bundle and check it offline."""
    _say("\n-- integrity: hash chains and Ed25519 signatures --")
    intact = True
    for case_id, name in names.items():
        report = await evidence.verify(uuid.UUID(case_id))
        assert report is not None
        intact = intact and report.verified and report.complete
        verdict = "verified, complete" if report.verified and report.complete \
            else f"NOT verified: {report.first_problem()}"
        for review in report.reviews:
            verdict += (f"; {review['verdict']} by {review['reviewer']['subject']} "
                        f"({review['reviewer']['via']})")
        _say(f"  {name:<40} {report.events} events  {verdict}")
    return intact


async def _show_log(settings: Settings, ledger: LedgerStore, names: dict[str, str],
                    base_url: str) -> bool:
    """Wait for a checkpoint holding every demo event, show it, and have a witness check
    it against the log's key (consistent with the checkpoint the witness saw first)."""
    _say("\n-- transparency log: every stored event a leaf of one Merkle tree --")
    log_key = log_signer(settings).verifier
    witness = Witness(log_key, local_dir() / f"{settings.namespace}.demo-witness.json",
                      LogClient(base_url))
    witness.state_file.unlink(missing_ok=True)
    latest = None
    ids = [uuid.UUID(c) for c in names]
    for _ in range(200):
        stored = await ledger.pool.fetchval(
            "SELECT count(*) FROM event_log WHERE case_id = ANY($1::uuid[])", ids)
        leaves = await ledger.pool.fetchrow(
            "SELECT count(*) AS n, max(leaf_index) AS last FROM ledger_leaves "
            "WHERE case_id = ANY($1::uuid[])", ids)
        latest = await ledger.latest()
        if latest is not None and leaves is not None and leaves["n"] == stored \
                and latest.size > leaves["last"]:
            break
        await asyncio.sleep(0.1)
    else:
        _say("  the ledger signed no checkpoint holding the demo's events within 20s")
        return False
    _say(f"GET {base_url}/ledger/checkpoint (C2SP tlog-checkpoint, signed note):")
    _say("".join(f"  {line}\n" for line in latest.served.splitlines()).rstrip())
    try:
        head, _ = await witness.observe()
    except (LogMisbehaved, LogUnreachable) as exc:
        _say(f"  witness: {exc}")
        return False
    _say(f"  witness: accepted {head.describe()}")
    _say(f"  watch it yourself: casetrail witness --log {base_url} --log-key "
         f"{log_key.text()}")
    return True


async def _show_bundle(settings: Settings, evidence: Evidence, names: dict[str, str]) -> bool:
    """Export one bundle (with its log proofs) and check it offline."""
    first = next(iter(names))
    bundle = await evidence.bundle(uuid.UUID(first))
    assert bundle is not None
    path = local_dir() / f"{settings.namespace}-{first}.bundle.json"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(orjson.dumps(bundle, option=orjson.OPT_INDENT_2))
    signer, actions = worker_signer(settings), action_signer(settings)
    log_key = log_signer(settings).verifier
    offline = verify_bundle(orjson.loads(path.read_bytes()), [signer.public_key], [log_key],
                            action_keys=[actions.public_key])
    logged = (offline.log or {}).get("eventsInLog", 0)
    _say(f"\n  bundle of {names[first]}: {path} -> verify-bundle: "
         + (f"verified, {logged} events proven in the log" if offline.verified
            else f"NOT verified: {offline.first_problem()}"))
    _say(f"  check it yourself: casetrail verify-bundle {path} --trust "
         f"{public_key_text(signer.public_key)} --trust-action "
         f"{public_key_text(actions.public_key)} --trust-log {log_key.text()}")
    return offline.verified


async def tail_events(settings: Settings, case: str | None, types: Sequence[str],
                      raw: bool) -> None:
    """``casetrail tail``: print events live from the bus until Ctrl-C."""
    unknown = [t for t in types if t not in EVENT_TYPES]
    if unknown:
        print(f"unknown event types {unknown}; known: {', '.join(EVENT_TYPES)}", file=sys.stderr)
        raise SystemExit(2)
    connection = await connect(settings.amqp_url, "casetrail-tail")
    channel = await connection.channel()
    exchange = await Topology(settings.namespace).declare_events_exchange(channel)
    queue = await channel.declare_queue(exclusive=True, auto_delete=True)
    for key in [Topology.events_of(case_id=case, event_type=t) for t in types] or [
            Topology.events_of(case_id=case)]:
        await queue.bind(exchange, routing_key=key)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async def show(message: IncomingMessage) -> None:
        if raw:
            print(message.body.decode(), flush=True)
        else:
            event = orjson.loads(message.body)
            print(f"case {event['caseId']}\n{format_event(event)}", flush=True)

    await queue.consume(show, no_ack=True)
    print(f"tailing {exchange.name} ({', '.join(types) or 'all events'}"
          f"{', case ' + case if case else ''}); Ctrl-C to stop", file=sys.stderr)
    await stop.wait()
    await connection.close()


__all__ = ["run_demo", "run_stack", "tail_events"]
