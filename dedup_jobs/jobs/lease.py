"""Leases: a running job's lock is renewed from a daemon thread of the worker process, so it
never expires while that process lives and is gone within LEASE_SECONDS after it dies."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from dedup_jobs import clock
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import BaseStore

logger = logging.getLogger("dedup_jobs")


#: seconds the renewal thread sleeps when no job is running
IDLE_WAIT = 5.0


@dataclass(kw_only=True)
class _Lease:
    store: BaseStore
    key: JobKey
    owner: str
    ttl: float
    due: float = field(default=0.0)  # time.monotonic() of the next renewal


class LeaseKeeper:
    """One renewal thread per process (re-created after a fork), shared by all running jobs:
    works with the prefork, threads and solo pools. Each lease is renewed every third of its
    length, so the lock outlives a late renewal or two but not the process."""

    def __init__(self) -> None:
        self._leases: dict[int, _Lease] = {}
        self._mutex = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._next_token = 0

    @contextmanager
    def hold(self, store: BaseStore, key: JobKey, owner: str, ttl: float) -> Iterator[None]:
        """Renew ``owner``'s lock at ``key`` for ``ttl`` seconds at a time while the block runs."""
        lease = _Lease(store=store, key=key, owner=owner, ttl=ttl, due=time.monotonic() + ttl / 3)
        with self._mutex:
            self._next_token += 1
            token = self._next_token
            self._leases[token] = lease
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
                current = list(self._leases.items())
            now = time.monotonic()
            next_due = min((lease.due for _, lease in current), default=now + IDLE_WAIT)
            if next_due > now:
                self._wake.wait(min(next_due - now, IDLE_WAIT))
                self._wake.clear()
                continue
            self._renew([(token, lease) for token, lease in current if lease.due <= now], now)

    def _renew(self, due: list[tuple[int, _Lease]], now: float) -> None:
        used_database = False
        for token, lease in due:
            lease.due = now + lease.ttl / 3
            used_database = used_database or lease.store.alias == "database"
            try:
                renewed = lease.store.renew(lease.key, lease.owner, lease.ttl, now=clock.now())
            except Exception:
                logger.warning(
                    "Lease renewal of %s failed; trying again in %.1fs.",
                    lease.key.key,
                    lease.ttl / 3,
                    exc_info=True,
                )
                continue
            if renewed:
                continue
            with self._mutex:
                running = token in self._leases
            if running:
                # Released under it (admin, command) or expired: never take it back.
                lease.due = math.inf
                logger.warning(
                    "The lock %s of running task %s is gone or held by another owner; it is "
                    "no longer renewed.",
                    lease.key.key,
                    lease.owner,
                )
        if used_database:
            from django.db import connections

            connections.close_all()


leases = LeaseKeeper()
os.register_at_fork(after_in_child=leases._after_fork)
