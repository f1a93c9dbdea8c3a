"""Fixtures of the fault-injection tests (the pieces live in servers.py, proxy.py, store.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.proxy import Proxy, redis_proxy
from tests.faults.servers import RedisServer, private_redis

__all__ = ["private_redis", "store_proxy"]


@pytest.fixture
def store_proxy(private_redis: RedisServer) -> Iterator[Proxy]:
    """A :class:`~tests.faults.proxy.Proxy` in front of this test's private redis-server."""
    with redis_proxy(private_redis.host, private_redis.port) as proxy:
        yield proxy
