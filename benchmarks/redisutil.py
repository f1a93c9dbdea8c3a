"""Redis plumbing of the benchmark: clients, cleaning, INFO commandstats snapshots and a
client-side round-trip counter."""

from __future__ import annotations

import json
from base64 import b64decode
from collections import Counter
from typing import Any

import redis
from django.conf import settings

#: the benchmark's own bookkeeping and connection handshakes, never counted
IGNORED = {
    "info",
    "flushdb",
    "llen",
    "rpop",
    "hello",
    "client|setinfo",
    "client|setname",
    "select",
    "config|resetstat",
}
#: the client name of every bookkeeping connection (skipped by RoundTrips)
BOOKKEEPING = "dedup-bench-bookkeeping"
_clients: dict[int, redis.Redis] = {}


def client(db: int) -> redis.Redis:
    """The benchmark's own client for ``db`` (one per database and process)."""
    found = _clients.get(db)
    if found is None:
        found = _clients[db] = redis.Redis.from_url(
            f"{settings.REDIS_URL}/{db}", client_name=BOOKKEEPING
        )
    return found


def broker() -> redis.Redis:
    return client(settings.BROKER_DB)


def store() -> redis.Redis:
    return client(settings.STORE_DB)


def commandstats() -> Counter[str]:
    """Calls per command since the server started, as INFO commandstats reports them (commands
    run inside a Lua script are counted under their own names too)."""
    counts: Counter[str] = Counter()
    for name, stat in client(0).info("commandstats").items():
        command = name.removeprefix("cmdstat_")
        if command not in IGNORED:
            counts[command] = int(stat["calls"])
    return counts


def clean() -> None:
    """Empty the broker, store and record databases of the benchmark (never any other)."""
    for db in (settings.BROKER_DB, settings.STORE_DB, settings.RESULT_DB):
        client(db).flushdb()


def queue_length() -> int:
    return int(broker().llen(settings.QUEUE))


def pop_message() -> dict[str, Any] | None:
    """Take the oldest message off the benchmark queue and decode it as a worker would."""
    raw = broker().rpop(settings.QUEUE)
    if raw is None:
        return None
    message = json.loads(raw)
    body = message["body"]
    if message["properties"].get("body_encoding") == "base64":
        body = b64decode(body)
    args, kwargs, embed = json.loads(body)
    return {
        **message["headers"],
        **embed,
        "args": args,
        "kwargs": kwargs,
        "delivery_info": message["properties"].get("delivery_info", {}),
        "hostname": "bench@local",
        "is_eager": False,
    }


class RoundTrips:
    """Counts the requests redis-py writes to the server (a pipeline is one), except on the
    benchmark's bookkeeping connections. Installed only while store commands are counted."""

    def __init__(self) -> None:
        self.count = 0
        self._original: Any = None

    def __enter__(self) -> RoundTrips:
        from redis.connection import AbstractConnection

        original = self._original = AbstractConnection.send_packed_command
        counter = self

        def send_packed_command(conn: Any, command: Any, check_health: bool = True) -> Any:
            if getattr(conn, "client_name", None) != BOOKKEEPING:
                counter.count += 1
            return original(conn, command, check_health)

        AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        from redis.connection import AbstractConnection

        AbstractConnection.send_packed_command = self._original  # type: ignore[method-assign]
