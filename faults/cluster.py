"""A three-node RabbitMQ cluster on this machine, for the fault suite and the benchmarks.

Three nodes of the installed RabbitMQ (``casetrail-c1@localhost`` … ``-c3``), each with
its own AMQP port (5681 to 5683), distribution port, data and log directories under
``/tmp/casetrail-cluster``, and configuration files of their own, so the machine's own
broker (5672, ``rabbit@localhost``, /etc/rabbitmq) is left alone. They run as the
``rabbitmq`` user and so share its Erlang cookie. The Erlang VMs start small (one
scheduler, no busy-waiting) so three idle nodes do not eat two cores.

    python -m faults.cluster start | stop | status

``start`` forms the cluster (``join_cluster``) and waits until all three are running
members; ``stop`` stops the nodes and removes their directories.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BASE = Path("/tmp/casetrail-cluster")
NODES = 3
FIRST_PORT = 5681
ADMIN = ("casetrail-admin", "casetrail-admin")
"""The cluster's bootstrap user (the machine's ``guest`` is its own broker's)."""
USER = "rabbitmq"


@dataclass(frozen=True)
class Node:
    index: int

    @property
    def name(self) -> str:
        return f"casetrail-c{self.index}@localhost"

    @property
    def port(self) -> int:
        return FIRST_PORT + self.index - 1

    @property
    def dist_port(self) -> int:
        return 25680 + self.index

    @property
    def directory(self) -> Path:
        return BASE / f"c{self.index}"

    @property
    def url(self) -> str:
        return f"amqp://{ADMIN[0]}:{ADMIN[1]}@127.0.0.1:{self.port}/"

    def environment(self) -> dict[str, str]:
        d = self.directory
        return {
            # (without XDG_CONFIG_HOME: Erlang would read .erlang from the suite's own)
            **{k: v for k, v in os.environ.items()
               if not k.startswith("RABBITMQ_") and k != "XDG_CONFIG_HOME"},
            "HOME": "/var/lib/rabbitmq",
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_PID_FILE": str(d / "pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS":
                "+S 1:1 +sbwt none +sbwtdcpu none +sbwtdio none",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def prepare(self) -> None:
        d = self.directory
        for sub in ("mnesia", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            "loopback_users = none\n"
            # A partition: the minority pauses (the quorum queues' majority goes on).
            "cluster_partition_handling = pause_minority\n"
            f"default_user = {ADMIN[0]}\ndefault_pass = {ADMIN[1]}\n"
            "default_user_tags.administrator = true\n"
            "default_permissions.configure = .*\ndefault_permissions.read = .*\n"
            "default_permissions.write = .*\n")
        (d / "rabbitmq-env.conf").write_text("")
        (d / "enabled_plugins").write_text("[].\n")
        shutil.chown(BASE, USER, USER)
        for path in [d, *d.rglob("*")]:
            shutil.chown(path, USER, USER)

    def run(self, *args: str, check: bool = True, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
        """``rabbitmqctl -n <node> ARGS`` (as the rabbitmq user, with its cookie)."""
        return subprocess.run(
            ["runuser", "-u", USER, "--", "/usr/lib/rabbitmq/bin/rabbitmqctl", "-n",
             self.name, *args], env=self.environment(), capture_output=True, text=True,
            check=check, timeout=timeout)

    def start(self) -> None:
        self.prepare()
        subprocess.run(["runuser", "-u", USER, "--", "/usr/lib/rabbitmq/bin/rabbitmq-server",
                        "-detached"], env=self.environment(), check=True, timeout=60,
                       cwd="/var/lib/rabbitmq")
        self.await_startup()

    def await_startup(self, timeout: float = 180) -> None:
        """Wait until the node runs RabbitMQ (``-detached`` returns before the VM even
        answers, and ``await_startup`` fails until it does)."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.run("await_startup", check=False, timeout=timeout)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start: {done.stderr[-500:]}")
            time.sleep(0.5)

    def kill(self) -> None:
        """kill -9 the node's Erlang VM."""
        pid = (self.directory / "pid").read_text().strip()
        subprocess.run(["kill", "-9", pid], check=False)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop(self) -> None:
        self.run("stop", check=False, timeout=120)

    def restart(self) -> None:
        """Start it again (after ``kill`` or ``stop``), with its data."""
        self.start()


def nodes() -> list[Node]:
    return [Node(i) for i in range(1, NODES + 1)]


def urls(user: str | None = None, password: str | None = None) -> str:
    """The cluster's AMQP URLs, comma-separated (``CASETRAIL_AMQP_URL``)."""
    user, password = user or ADMIN[0], password or ADMIN[1]
    return ",".join(f"amqp://{user}:{password}@127.0.0.1:{n.port}/" for n in nodes())


def running_members() -> set[str]:
    out = nodes()[0].run("cluster_status", "--formatter", "json", check=False)
    if out.returncode != 0:
        return set()
    import json

    return set(json.loads(out.stdout).get("running_nodes", []))


def start() -> None:
    stop()
    first, *others = nodes()
    first.start()
    for node in others:
        node.start()
        node.run("stop_app")
        node.run("join_cluster", first.name)
        node.run("start_app")
        node.await_startup()
    wanted = {n.name for n in nodes()}
    deadline = time.monotonic() + 60
    while running_members() != wanted:
        if time.monotonic() > deadline:
            raise RuntimeError(f"cluster not formed: {running_members()}")
        time.sleep(0.5)


def _listening(port: int) -> list[str]:
    """Pids of the processes listening on ``port`` (a node left from an earlier run)."""
    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True,
                         text=True, check=False).stdout
    return sorted(set(re.findall(r"pid=(\d+)", out)))


def stop() -> None:
    for node in nodes():
        if (node.directory / "pid").exists():
            node.stop()
        for pid in {*_listening(node.port), *_listening(node.dist_port)}:
            subprocess.run(["kill", "-9", pid], check=False)
    shutil.rmtree(BASE, ignore_errors=True)


if __name__ == "__main__":
    action = sys.argv[1] if len(sys.argv) > 1 else "status"
    if action == "start":
        start()
        print(f"cluster up: {urls()}")
    elif action == "stop":
        stop()
    else:
        print(sorted(running_members()) or "not running")
