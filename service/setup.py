"""``casetrail setup``: what the broker needs that AMQP cannot declare, set up idempotently.

A queue's arguments cannot change once it exists (every redeclare with other
arguments fails), so limits an operator may tune live in RabbitMQ *policies*, which
only the broker's own tools set: here ``rabbitmqctl`` on this machine. (The
component identities of the least-privilege design will be created here too.)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass

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


def apply_broker_policies(settings: Settings) -> list[str]:
    """Set every policy with ``rabbitmqctl`` (idempotent); the names set."""
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
