"""``casetrail setup``: what the broker needs that AMQP cannot declare, set up idempotently.

A queue's arguments cannot change once it exists (every redeclare with other
arguments fails), so limits an operator may tune live in RabbitMQ *policies*, which
only the broker's own tools set: ``rabbitmqctl`` on this machine, or the management
HTTP API (``CASETRAIL_RABBITMQ_MANAGEMENT_URL``, e.g. in docker-compose, where the
broker runs in its own container). (The component identities of the least-privilege
design will be created here too.)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import httpx

from service.bus.topology import Topology
from service.config import Settings
from service.errors import PermanentError


@dataclass(frozen=True)
class Policy:
    name: str
    pattern: str
    definition: dict[str, object]

    def rabbitmqctl(self, vhost: str) -> list[str]:
        return ["rabbitmqctl", "-q", "set_policy", "-p", vhost, self.name, self.pattern,
                json.dumps(self.definition), "--apply-to", "queues"]


def broker_policies(settings: Settings) -> list[Policy]:
    """The start queue's length limit: beyond it the broker refuses start commands
    (reject-publish) and ``POST /cases`` answers 503, so a flood cannot fill the disk."""
    topology = Topology(settings.namespace)
    return [Policy(f"{settings.namespace}-case-start-limit",
                   f"^{re.escape(topology.case_start_queue)}$",
                   {"max-length": settings.start_queue_max_length,
                    "overflow": "reject-publish"})]


def _apply_over_http(settings: Settings, policies: list[Policy]) -> list[str]:
    """PUT each policy to the management API (idempotent: a PUT replaces it)."""
    base = urlsplit(settings.rabbitmq_management_url or "")
    auth = (unquote(base.username or ""), unquote(base.password or ""))
    root = urlunsplit((base.scheme, base.hostname + (f":{base.port}" if base.port else "")
                       if base.hostname else "", base.path.rstrip("/"), "", ""))
    vhost = quote(settings.amqp_vhost(), safe="")
    done = []
    with httpx.Client(auth=auth, timeout=30) as client:
        for policy in policies:
            reply = client.put(f"{root}/api/policies/{vhost}/{quote(policy.name, safe='')}",
                               json={"pattern": policy.pattern, "definition": policy.definition,
                                     "apply-to": "queues"})
            if reply.status_code not in (201, 204):
                raise PermanentError(f"setting policy {policy.name} over HTTP failed: "
                                     f"{reply.status_code} {reply.text[:200]}")
            done.append(policy.name)
    return done


def apply_broker_policies(settings: Settings) -> list[str]:
    """Set every policy (idempotent), over the management API when its URL is
    configured, else with ``rabbitmqctl``; the names set."""
    if settings.rabbitmq_management_url:
        try:
            return _apply_over_http(settings, broker_policies(settings))
        except httpx.HTTPError as exc:
            raise PermanentError(f"the management API did not answer: {exc}") from None
    if shutil.which("rabbitmqctl") is None:
        raise PermanentError(
            "rabbitmqctl is not on this machine: set the policies with your broker's tools "
            "(README, 'Quotas'), or run setup where the broker runs")
    vhost = settings.amqp_vhost()
    done = []
    for policy in broker_policies(settings):
        result = subprocess.run(policy.rabbitmqctl(vhost), capture_output=True, text=True,
                                timeout=60, check=False)
        if result.returncode != 0:
            raise PermanentError(f"rabbitmqctl set_policy {policy.name} failed: "
                                 f"{result.stderr.strip() or result.stdout.strip()}")
        done.append(policy.name)
    return done
