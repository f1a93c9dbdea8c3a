"""Leases: a running job's lock is renewed from a daemon thread of the worker process, so it
never expires while that process lives and is gone within LEASE_SECONDS after it dies."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from dedup_jobs import clock
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import BaseStore

logger = logging.getLogger("dedup_jobs")


@dataclass(kw_only=True)
class _Lease:
    store: BaseStore
    key: JobKey
    owner: str
    ttl: float
    due: float = field(default=0.0)


class LeaseKeeper:
    """One renewal thread per process (re-created after a fork), shared by all running jobs:
    works with the prefork, threads and solo pools."""

    def __init__(self) -> None:
        self._leases: dict[int, _Lease] = {}
        self._mutex = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._next_token = 0

    @contextmanager
    def hold(self, store: BaseStore, key: JobKey, owner: str, ttl: float) -> Iterator[None]:
        with self._mutex:
            self._next_token += 1
            token = self._next_token
            self._leases[token] = _Lease(
                store=store, key=key, owner=owner, ttl=ttl, due=clock.now() + ttl / 3
            )
            self._ensure_thread()
        self._wake.set()
        try:
            yield
        finally:
            with self._mutex:
                self._leases.pop(token, None)

    def _after_fork(self) -> None:
        # The parent's thread and mutex state did not come along into the child.
        self._mutex = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self._leases = {}

    def active(self) -> int:
        with self._mutex:
            return len(self._leases)

    def _ensure_thread(self) -> None:
        pid = os.getpid()
        if self._thread is not None and self._pid == pid and self._thread.is_alive():
            return
        self._pid = pid
        self._thread = threading.Thread(target=self._loop, name="dedup-jobs-lease", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._mutex:
                leases = list(self._leases.values())
            now = clock.now()
            wait = min((lease.due for lease in leases), default=now + 5.0) - now
            if wait > 0:
                self._wake.wait(min(wait, 5.0))
                self._wake.clear()
                continue
            used_database = False
            for lease in leases:
                if lease.due > now:
                    continue
                lease.due = now + lease.ttl / 3
                try:
                    if not lease.store.renew(lease.key, lease.owner, lease.ttl, now=now):
                        logger.warning(
                            "Lease of %s held by %s could not be renewed: the lock is gone or "
                            "held by another owner.", lease.key.key, lease.owner,
                        )
                except Exception:
                    logger.warning("Lease renewal of %s failed", lease.key.key, exc_info=True)
                used_database = used_database or lease.store.alias == "database"
            if used_database:
                from django.db import connections

                connections.close_all()


leases = LeaseKeeper()
os.register_at_fork(after_in_child=leases._after_fork)
