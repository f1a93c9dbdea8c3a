"""A Redis Sentinel set-up of the tests' own: a primary, a replica and three sentinels of
Debian's redis-server (``redis-server sentinel.conf --sentinel``), each on a free loopback
port with a writable config file of its own, started by :func:`sentinel_setup` and stopped by
pid. ``kill_primary()`` SIGKILLs the primary; ``primary()`` asks a sentinel which server it is
now."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from tests.faults.servers import HOST, RedisServer, free_port, redis_server, redis_server_binary

#: the monitored service's name; each set-up gets its own ("dedup-primary-<port>"), since
#: django-redis keeps connection pools per URL for the life of the process
SERVICE = "dedup-primary"
#: a sentinel calls the primary down after this long without an answer
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000


@dataclass
class SentinelSetup:
    primary_server: RedisServer
    replica: RedisServer
    sentinels: list[tuple[str, int]]
    processes: list[subprocess.Popen[bytes]] = field(repr=False)
    service: str = SERVICE

    def primary(self) -> tuple[str, int] | None:
        """(host, port) of the primary as the first sentinel that answers reports it."""
        for host, port in self.sentinels:
            client = redis.Redis(host=host, port=port, socket_timeout=0.5, retry=None)
            try:
                found = client.sentinel_get_master_addr_by_name(self.service)
            except redis.RedisError:
                continue
            finally:
                client.close()
            if found:
                host = found[0].decode() if isinstance(found[0], bytes) else str(found[0])
                return host, int(found[1])
        return None

    def kill_primary(self) -> None:
        os.kill(self.primary_server.pid, signal.SIGKILL)
        self.primary_server.process.wait(timeout=5)


def _sentinel_conf(directory: Path, port: int, primary: RedisServer, service: str,
                   down_after_ms: int) -> Path:
    conf = directory / f"sentinel-{port}.conf"
    conf.write_text(
        f"port {port}\nbind {HOST}\ndir {directory}\n"
        f"sentinel monitor {service} {primary.host} {primary.port} 2\n"
        f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
        f"sentinel failover-timeout {service} {FAILOVER_TIMEOUT_MS}\n"
        f"sentinel parallel-syncs {service} 1\n"
    )
    return conf


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    pytest.fail(f"the sentinel set-up did not come up: {what}")


@contextmanager
def sentinel_setup(down_after_ms: int = DOWN_AFTER_MS) -> Iterator[SentinelSetup]:
    """A primary, its replica and three sentinels; ``down_after_ms``: how long the
    sentinels wait before they call an unanswering primary down (and fail over)."""
    binary = redis_server_binary()
    with ExitStack() as stack:
        primary = stack.enter_context(redis_server())
        replica = stack.enter_context(redis_server("--replicaof", primary.host,
                                                   str(primary.port)))
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        processes: list[subprocess.Popen[bytes]] = []
        sentinels: list[tuple[str, int]] = []
        service = f"{SERVICE}-{primary.port}"
        try:
            for _ in range(3):
                port = free_port()
                conf = _sentinel_conf(directory, port, primary, service, down_after_ms)
                processes.append(subprocess.Popen(
                    [binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL))
                sentinels.append((HOST, port))
            setup = SentinelSetup(primary, replica, sentinels, processes, service)
            _wait(lambda: replica.client.info("replication").get("master_link_status") == "up",
                  20, "the replica never synced")
            _wait(lambda: setup.primary() == (primary.host, primary.port), 20,
                  "no sentinel reports the primary")
            _wait(lambda: all(_knows_replica(host, port, service) for host, port in sentinels), 30,
                  "the sentinels never saw the replica")
            yield setup
        finally:
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)


#: a CACHES entry's BACKEND, URL scheme and module of its Sentinel client, by library
SENTINEL_BACKENDS = {
    "django-redis": ("django_redis.cache.RedisCache", "redis", "django_redis"),
    "django-valkey": ("django_valkey.cache.ValkeyCache", "valkey", "django_valkey"),
}


def sentinel_cache(setup: SentinelSetup, socket_timeout: float | None = 0.5,
                   library: str = "django-redis") -> dict[str, object]:
    """A CACHES entry on the Sentinel-managed primary through ``library``'s SentinelClient
    (a key of SENTINEL_BACKENDS); ``socket_timeout`` None: the cache sets none (neither for
    the primary nor the sentinels)."""
    backend, scheme, module = SENTINEL_BACKENDS[library]
    timeouts = {} if socket_timeout is None else {"SOCKET_TIMEOUT": socket_timeout,
                                                   "SOCKET_CONNECT_TIMEOUT": socket_timeout}
    return {
        "BACKEND": backend,
        "LOCATION": f"{scheme}://{setup.service}/0",
        "OPTIONS": {
            "CLIENT_CLASS": f"{module}.client.SentinelClient",
            "CONNECTION_FACTORY": f"{module}.pool.SentinelConnectionFactory",
            "SENTINELS": setup.sentinels,
            **timeouts,
        },
    }


def _knows_replica(host: str, port: int, service: str) -> bool:
    client = redis.Redis(host=host, port=port, socket_timeout=0.5, retry=None)
    try:
        return bool(client.sentinel_slaves(service))
    except redis.RedisError:
        return False
    finally:
        client.close()

