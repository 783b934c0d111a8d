"""Clients of a cluster: several AMQP URLs, connect to the first node that answers, move
on when a node does not (faults/test_cluster.py kills real nodes of a real cluster)."""

from __future__ import annotations

import aio_pika
import pytest
from yarl import URL

from casetrail.adapters.bus.connection import ClusterConnection, connect
from casetrail.config import Settings, amqp_nodes
from casetrail.errors import BusUnavailable
from casetrail.ops.setup import _with_user
from tests.support.stack import free_port


def test_the_reconnect_hook_it_wraps_is_aio_pikas() -> None:
    """ClusterConnection moves to the next node when aio-pika's attempt fails: the
    attempt is a private method, so its name is checked against the installed version."""
    assert callable(getattr(aio_pika.RobustConnection, ClusterConnection._ATTEMPT, None))


def test_a_cluster_url_list_is_parsed_and_rewritten_per_node() -> None:
    urls = "amqp://admin:pw@10.0.0.1:5672/,amqp://admin:pw@10.0.0.2:5672/ "
    assert amqp_nodes(urls) == ["amqp://admin:pw@10.0.0.1:5672/", "amqp://admin:pw@10.0.0.2:5672/"]
    assert _with_user(urls.strip(), "ns-worker", "s3cret") == (
        "amqp://ns-worker:s3cret@10.0.0.1:5672/,amqp://ns-worker:s3cret@10.0.0.2:5672/")
    assert Settings(amqp_url=urls.strip().replace(":5672/", ":5672/v1")).amqp_vhost() == "v1"


async def test_connects_to_the_first_node_that_answers(settings: Settings) -> None:
    dead = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    connection = await connect(f"{dead},{settings.amqp_url}", "cluster-client-test")
    try:
        assert isinstance(connection, ClusterConnection)
        assert connection.url.port == URL(settings.amqp_url).port  # the live node
        channel = await connection.channel()
        await channel.declare_queue(exclusive=True)
    finally:
        await connection.close()
    with pytest.raises(BusUnavailable, match="any RabbitMQ node"):
        await connect(f"{dead},{dead}", "cluster-client-test")
