"""Counting what the Redis server receives while throttled messages drain (the tests'
budgets of section 8 and benchmarks/throttle.py)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings

from dedup_jobs.stores.redis import scripts

#: commands of a connection's set-up (and the counter's own marker), not decisions
HANDSHAKE = ("echo", "script", "select", "client", "hello", "auth", "ping")


class ServerCounts:
    """Commands the Redis server received while the block ran (MONITOR, in a thread): the
    store's EVALSHAs by script, the throttle admissions with their server times, and the
    LPUSHes of the broker onto the tests' queue."""

    def __init__(self, store_db: int, broker_db: int, queue: str,
                 url: str | None = None) -> None:
        url = url or settings.REDIS_URL  # a server's URL, without a database
        self._watcher = redis.Redis.from_url(url)
        self._marker = redis.Redis.from_url(f"{url}/{store_db}")
        self.store_db, self.broker_db, self.queue = store_db, broker_db, queue
        self.scripts: Counter[str] = Counter()
        self.other_store: Counter[str] = Counter()
        self.published = 0
        #: the wakes (T2): broadcasts of ``dedup_jobs_wake`` onto the workers' control channel
        self.wakes = 0
        #: (server time, command) of every throttle admission (THROTTLE_ADMIT) in the store
        #: database: the owner's task id is among the command's arguments
        self.admissions: list[tuple[float, str]] = []
        self._names = {sha: name for name, sha in scripts.SHA.items()}

    def run(self, action: Callable[[], None]) -> None:
        ready = threading.Event()
        marker = f"dedup-jobs-end-{time.monotonic_ns()}"

        def watch() -> None:
            with self._watcher.monitor() as monitor:
                ready.set()
                for event in monitor.listen():
                    command = event["command"]
                    if marker in command:
                        return
                    if event.get("client_type") == "lua":
                        continue
                    db, words = int(event.get("db", -1)), command.split(" ")
                    name = words[0].lower()
                    if db == self.store_db and name == "evalsha":
                        script = self._names.get(words[1], words[1])
                        self.scripts[script] += 1
                        if script == "THROTTLE_ADMIT":
                            self.admissions.append((float(event["time"]), command))
                    elif db == self.store_db and name not in HANDSHAKE:
                        self.other_store[name] += 1
                    elif db == self.broker_db and name == "lpush" and words[1] == self.queue:
                        self.published += 1
                    elif db == self.broker_db and name == "publish" and "pidbox" in words[1]:
                        self.wakes += 1

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        ready.wait(5)
        time.sleep(0.2)
        try:
            action()
        finally:
            self._marker.echo(marker)
            thread.join(30)


def admitted_at(admissions: list[tuple[float, str]], task_ids: list[str]) -> list[float]:
    """When the store admitted each of ``task_ids`` (server time): its last admission call
    (a deferred message calls again, with the same task id, until one admits it)."""
    return [max(at for at, command in admissions if task_id in command)
            for task_id in task_ids]


def scheduled(app: Any) -> set[str]:
    """The task ids the workers hold for a countdown (``inspect scheduled``)."""
    replies = app.control.inspect(timeout=1.0).scheduled() or {}
    return {entry["request"]["id"] for held in replies.values() for entry in held}
