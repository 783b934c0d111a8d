"""Prometheus metrics: every name casetrail exports, and each component's /metrics server.

Names start with ``casetrail_``; labels are bounded (agents, models, tools,
outcomes, queues, reasons — never a case id). Durations are in seconds, with
buckets that fit what they measure: milliseconds for the bus and the database,
seconds for models. Each component serves its own registry on its own port
(``CASETRAIL_<COMPONENT>_METRICS_PORT``), never on the API's port.

The dashboard (``docs/operations/grafana-dashboard.json``) and the alert rules
(``docs/operations/prometheus-alerts.yml``) are built on these names;
tests/unit/test_operations.py checks every expression in them with promtool and
against this module.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass
from functools import lru_cache
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from casetrail.config import Component, Settings
from casetrail.errors import PermanentError

log = logging.getLogger("casetrail.metrics")

BUS_SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Publish confirms and commits: sub-millisecond to a few seconds."""
MODEL_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
TOOL_SECONDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
HTTP_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_SIZES = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2000)

# --- the API -----------------------------------------------------------------------
HTTP_REQUESTS = Counter(
    "casetrail_http_requests", "HTTP requests answered, by route template and status.",
    ["method", "route", "status"])
HTTP_SECONDS_HISTOGRAM = Histogram(
    "casetrail_http_request_duration_seconds", "Time to answer an HTTP request (to its "
    "first byte for a stream).", ["method", "route"], buckets=HTTP_SECONDS)
CASES_ACCEPTED = Counter(
    "casetrail_cases_accepted", "Cases POST /cases accepted (recorded and queued), by agent.",
    ["agent"])

# --- the worker --------------------------------------------------------------------
CASES_STARTED = Counter(
    "casetrail_cases_started", "Attempts started (CASE_STARTED published), by agent; "
    "attempt is first or retry.", ["agent", "attempt"])
CASES_ENDED = Counter(
    "casetrail_cases_ended", "Terminal events published, by agent and outcome "
    "(completed, failed, timed_out, cancelled).", ["agent", "outcome"])
CYCLES = Counter("casetrail_cycles", "REACT_CYCLE events published, by agent.", ["agent"])
REVIEWS_WAITING = Gauge(
    "casetrail_reviews_waiting", "Cases waiting for a person (review or answer), by agent, "
    "every tenant; counted by each worker every sweep.", ["agent"])
REVIEWS_OVERDUE = Gauge(
    "casetrail_reviews_overdue", "Cases waiting for a person past their review deadline, "
    "by agent (a deadline never decides a case: people do).", ["agent"])
REVIEW_OLDEST_WAIT_SECONDS = Gauge(
    "casetrail_review_oldest_wait_seconds", "How long the longest-waiting case has waited "
    "for a person, by agent.", ["agent"])
PERSON_ACTIONS_REFUSED = Counter(
    "casetrail_person_actions_refused", "Actions kept for a case waiting for a person that "
    "the worker refused to act on, by reason (unsigned, bad_signature, mismatch, "
    "wrong_wait, four_eyes, invalid_decision): written without the API's action key, or "
    "breaking the wait's rules. Each is moved to case_actions_refused and the wait "
    "re-opens.", ["reason"])
PROJECTION_MISMATCHES = Counter(
    "casetrail_projection_mismatches", "Reads of a case (GET /cases/{id}, the viewer, the "
    "report, verify, the audit) that found the case row showing another status, answer, "
    "outcome or total than its signed trail says: a row written outside the owner's fold, "
    "by whoever owns the database. The case is shown as not verifying "
    "(projection_mismatch).")
EXPIRIES_UNVERIFIED = Counter(
    "casetrail_expiries_unverified", "Reads of a case with a tombstone whose signed "
    "CASE_EXPIRED does not verify it (missing, altered, not the tombstone's): a tombstone "
    "written outside the retention pass. The case is answered as not found, never as "
    "expired, and the audit names it.")
MODEL_REQUEST_SECONDS = Histogram(
    "casetrail_model_request_duration_seconds", "One model request as the worker saw it, "
    "by provider, model and outcome (ok, retryable, error).",
    ["provider", "model", "outcome"], buckets=MODEL_SECONDS)
MODEL_RETRIES = Counter(
    "casetrail_model_retries", "Model requests retried after a transient failure.",
    ["provider", "model"])
MODEL_TOKENS = Counter(
    "casetrail_model_tokens", "Tokens billed by the provider, by agent, model and type "
    "(input, output).", ["agent", "model", "type"])
TOOL_CALL_SECONDS = Histogram(
    "casetrail_tool_call_duration_seconds", "One tool call, retries included, by tool, "
    "source (worker, local) and outcome (ok, error).", ["tool", "source", "outcome"],
    buckets=TOOL_SECONDS)
MCP_CIRCUIT_STATE = Gauge(
    "casetrail_mcp_circuit_state", "Each MCP server's circuit, as its capability worker "
    "keeps it: 0 closed (a session is open), 1 half-open (trying again), 2 open (down: its "
    "calls fail at once).", ["server"])
MCP_CATALOG_AGE_SECONDS = Gauge(
    "casetrail_mcp_catalog_age_seconds", "Age of the catalog of each MCP server this "
    "worker offers cases (kept fresh in the background; stale when its server is down).",
    ["server"])
LIVE_CASES = Gauge("casetrail_live_cases", "Cases this worker holds now.")
SLOTS_BUSY = Gauge("casetrail_worker_slots_busy", "Of this worker's slots "
                   "(CASETRAIL_WORKER_CONCURRENCY), those held by a case at work; when all "
                   "are, start commands wait in hand for one.")
STRANDED_CASES_RESENT = Counter(
    "casetrail_stranded_cases_resent", "Start commands a worker's sweeper sent again for "
    "cases stranded: claimed, not ended, their lease lapsed (service/components/sweeper.py).")

# --- every publisher ---------------------------------------------------------------
PUBLISH_CONFIRM_SECONDS = Histogram(
    "casetrail_publish_confirm_seconds", "From publish to the broker's confirm, by "
    "exchange.", ["exchange"], buckets=BUS_SECONDS)
DEAD_LETTERED = Counter(
    "casetrail_dead_lettered", "Messages this component set aside on the dead-letter "
    "exchange, by reason.", ["reason"])

# --- the consumer ------------------------------------------------------------------
BATCH_SIZE = Histogram(
    "casetrail_consumer_batch_size", "Messages per batch the consumer handled.",
    buckets=BATCH_SIZES)
COMMIT_SECONDS = Histogram(
    "casetrail_consumer_commit_seconds", "Writing one batch to Postgres, to its commit.",
    buckets=BUS_SECONDS)
EVENTS_STORED = Counter("casetrail_events_stored", "Events newly stored in event_log.")
EVENTS_DUPLICATE = Counter(
    "casetrail_events_duplicate", "Events delivered again and already stored (harmless).")
CONSUMER_LAG = Gauge(
    "casetrail_consumer_lag_seconds", "Age, at its commit, of the oldest event of the last "
    "batch stored: how far the record trails the worker.")

# --- the bus, as the components see it ---------------------------------------------
QUEUE_MESSAGES = Gauge(
    "casetrail_queue_messages", "Messages waiting in a casetrail queue (case-start, "
    "event-log, dead-letters), probed every few seconds.", ["queue"])
DEAD_LETTERS_HELD_SECONDS = Gauge(
    "casetrail_dead_letters_held_seconds", "How long the dead-letter queue has held "
    "messages without being emptied, as far as this consumer has watched it (0 when "
    "empty).")

# --- the capability workers ---------------------------------------------------------
TOOL_REQUESTS_SERVED = Counter(
    "casetrail_tool_requests_served", "Tool requests a capability worker answered, by "
    "capability and outcome (ok, error, remembered, expired).", ["capability", "outcome"])

# --- the ledger (transparency log) ---------------------------------------------------
WITNESS_TREE_SIZE = Gauge("casetrail_witness_tree_size", "The size of the log's tree in "
                          "the last checkpoint this witness accepted (it should keep growing).")
WITNESS_CHECKS = Counter("casetrail_witness_checks", "The witness's looks at the log, by "
                         "outcome: accepted (a larger tree), unchanged, unreachable, "
                         "misbehaved (forked, shrank or rolled back).", ["outcome"])
WITNESS_MISBEHAVING = Gauge("casetrail_witness_misbehaving", "1 once this witness saw the "
                            "log roll back or fork (it keeps running, refusing to cosign).")
LEDGER_LEAVES = Counter("casetrail_ledger_leaves", "Stored events appended to the "
                        "transparency log's tree.")
LEDGER_TREE_SIZE = Gauge("casetrail_ledger_tree_size", "Leaves in the tree.")
LEDGER_CHECKPOINT_SIZE = Gauge("casetrail_ledger_checkpoint_size", "Tree size of the "
                               "last signed checkpoint.")
LEDGER_CHECKPOINTS = Counter("casetrail_ledger_checkpoints", "Checkpoints signed.")
LEDGER_BACKLOG = Gauge("casetrail_ledger_backlog", "Stored events not yet in the tree "
                       "(after the last append).")
LEDGER_HALTED = Gauge("casetrail_ledger_halted", "1 while the ledger refuses to append or "
                      "sign, by reason: behind (its database was rolled back), forked, "
                      "no_anchor (its high-water mark is lost).", ["reason"])
AUDIT_FINDINGS = Gauge("casetrail_audit_findings", "What the last pass of `casetrail audit` "
                       "found, by kind (removed_after_logging, altered, not_logged, "
                       "checkpoint_inconsistent, trigger_disabled, "
                       "partition_unguarded, erasure_unrecorded, refused_valid_action).", ["kind"])
AUDIT_PASSES = Counter("casetrail_audit_passes", "Passes of `casetrail audit` over the log, "
                       "by outcome (clean, findings, failed).", ["outcome"])
AUDIT_CASES_CHECKED = Counter("casetrail_audit_cases_checked", "Cases whose trails the "
                              "audit verified.")
LOG_SERVED_HALTED = Gauge(
    "casetrail_log_served_halted", "1 while the API finds its database's latest checkpoint "
    "behind (or forked from) the largest the log signed on the log-head stream: the log's "
    "routes answer 503 naming the halt and /readyz says so in its log field.")
AUDIT_CASES_SCRUBBED = Counter(
    "casetrail_audit_cases_scrubbed", "Stored cases the audit's scrub re-verified in turn "
    "(besides the newly logged and failing ones): its rate against the number of cases "
    "is how long the whole log takes to be checked again.")
AUDIT_CASES_EXPIRED = Gauge("casetrail_audit_cases_expired", "Expired cases the last pass "
                            "of `casetrail audit` checked against their tombstones.")
RETENTION_EXPIRED = Counter("casetrail_retention_expired", "Cases expired under their "
                            "retention policy (CASE_EXPIRED appended, events deleted).")
RETENTION_EVENTS_REMOVED = Counter("casetrail_retention_events_removed", "Events deleted "
                                   "by expiry (every leaf stays in the log).")
RETENTION_ERASED = Counter("casetrail_retention_erased", "Cases whose personal data was "
                           "erased on their policy's earlier deadline.")
RETENTION_ARCHIVED = Counter("casetrail_retention_archived", "Cases whose bundle was "
                             "archived before they expire (their policy archives).")
RETENTION_ARCHIVE_FAILURES = Counter("casetrail_retention_archive_failures", "Passes that "
                                     "could not write the archive (no case of a policy "
                                     "that archives expires meanwhile).")
RETENTION_BLOCKED = Gauge("casetrail_retention_blocked", "1 while the retention pass does "
                          "not run: the database lacks holds, releases, policies or "
                          "erasures its journal holds (a restore not reconciled yet).")
RETENTION_REFUSED = Counter("casetrail_retention_refused", "Persons' acts about retention "
                            "the pass would not act on, by what (policy: a version or "
                            "approval no action key signed; release: a hold released only by "
                            "unsigned releases, kept held).", ["what"])
RETENTION_PAST_TIME = Gauge("casetrail_retention_past_time_cases", "Cases past their time "
                            "under their policy, not held and not expired yet.")
RETENTION_HELD = Gauge("casetrail_retention_held_cases", "Cases past their time that a "
                       "legal hold keeps.")
RETENTION_OLDEST_PAST_SECONDS = Gauge("casetrail_retention_oldest_past_time_seconds",
                                      "How long ago the oldest unheld case's time ran out "
                                      "(0 when none is past it).")
LEDGER_APPEND_SECONDS = Histogram(
    "casetrail_ledger_append_seconds", "Appending one batch of leaves, to its commit.",
    buckets=BUS_SECONDS)


@dataclass(frozen=True)
class AgentMetrics:
    """One agent's and model's labelled children, looked up once (the engine's hot path
    touches them every cycle)."""

    started_first: Counter
    started_retry: Counter
    cycles: Counter
    input_tokens: Counter
    output_tokens: Counter
    model_ok: Histogram
    model_retryable: Histogram
    model_error: Histogram
    retries: Counter
    provider: str
    agent: str

    def ended(self, outcome: str) -> None:
        CASES_ENDED.labels(self.agent, outcome).inc()


MAX_MODEL_LABELS = 100
"""Distinct model names labelled; a case may name any model, so beyond this many the
rest count as ``(other)`` (a label per name would let callers grow the series)."""
_models: set[str] = set()


@lru_cache(maxsize=1024)
def for_agent(agent: str, provider: str, model: str) -> AgentMetrics:
    if model not in _models:
        if len(_models) >= MAX_MODEL_LABELS:
            model = "(other)"
        else:
            _models.add(model)
    return AgentMetrics(
        started_first=CASES_STARTED.labels(agent, "first"),
        started_retry=CASES_STARTED.labels(agent, "retry"),
        cycles=CYCLES.labels(agent),
        input_tokens=MODEL_TOKENS.labels(agent, model, "input"),
        output_tokens=MODEL_TOKENS.labels(agent, model, "output"),
        model_ok=MODEL_REQUEST_SECONDS.labels(provider, model, "ok"),
        model_retryable=MODEL_REQUEST_SECONDS.labels(provider, model, "retryable"),
        model_error=MODEL_REQUEST_SECONDS.labels(provider, model, "error"),
        retries=MODEL_RETRIES.labels(provider, model),
        provider=provider, agent=agent,
    )


@lru_cache(maxsize=256)
def publish_confirm(exchange: str) -> Histogram:
    return PUBLISH_CONFIRM_SECONDS.labels(exchange or "(default)")


@lru_cache(maxsize=1024)
def tool_call(tool: str, source: str, ok: bool) -> Histogram:
    return TOOL_CALL_SECONDS.labels(tool, source, "ok" if ok else "error")


DEFAULT_PORTS: dict[Component, int] = {"api": 9101, "worker": 9102, "consumer": 9103,
                                        "capability": 9104, "ledger": 9105, "witness": 9106,
                                        "auditor": 9107}


def serve(settings: Settings, component: Component) -> WSGIServer:
    """Serve this process's metrics at ``http://<metrics host>:<port>/metrics`` in a
    thread, and log where. Port ``0``: any free port. With no port set, the
    component's default, or a free one when another process holds it (a second
    consumer on the host); a port set explicitly that is taken is an error."""
    field = f"{component}_metrics_port"
    configured: int | None = getattr(settings, field)
    port = DEFAULT_PORTS[component] if configured is None else configured
    try:
        server, _ = start_http_server(port, addr=settings.metrics_host)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or configured is not None:
            raise PermanentError(f"cannot serve metrics on {settings.metrics_host}:{port} "
                                 f"(CASETRAIL_{field.upper()}): {exc.strerror}") from None
        log.warning("metrics port %d is taken; using a free one", port)
        server, _ = start_http_server(0, addr=settings.metrics_host)
    log.info("%s metrics at http://%s:%d/metrics", component, settings.metrics_host,
             server.server_port)
    return server
