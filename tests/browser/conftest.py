"""This tier runs against the real services: the namespace, pools, connections and the
browser come from tests/support/fixtures.py."""

from tests.support.fixtures import *  # noqa: F403
