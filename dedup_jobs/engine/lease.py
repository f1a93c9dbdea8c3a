"""Leases: a running job's lock is renewed from an OS thread of the worker process, so it
never expires while that process lives and is gone within LEASE_SECONDS after it dies.

A renewal that finds the lock gone (store flushed, key evicted, a failover that lost it, a
release under the job) takes it back for the same owner (W6); one that finds another owner
sends ``lock_lost``, logs a WARNING and stops, leaving that owner's lock alone. Under gevent
and eventlet the thread is a real OS thread (see ``native``), renews through stores of its own
(:meth:`BaseStore.for_thread`) and hands its log records and signals to a green thread of the
worker, since code run by the OS thread must not touch the hub's sockets or green locks.

A grant whose outcome is unknown (W4: the worker's check or admission timed out, its reply
lost or late, so the store may or may not have run it) is held the same way with a
``resend``: the thread re-sends that same idempotent call (S7, same delivery nonce) at once
and then every third of the lease until the store answers; what the answer granted is renewed
from then on (``granted`` True), a refusal stops the lease (``granted`` False: nothing of it
to renew or release). A message delivered once never has a ``resend``: it pays nothing."""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from dedup_jobs import clock, metrics
from dedup_jobs.engine import native
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import lock_lost, notify
from dedup_jobs.stores.base import BaseStore

logger = logging.getLogger("dedup_jobs")


#: seconds the renewal thread sleeps at most (with no job running: the renewal interval of the
#: last lease, if shorter)
IDLE_WAIT = 5.0
#: seconds between two deliveries of the lease's log records and signals under gevent/eventlet
DELIVER_EVERY = 0.2

#: a log record or a signal, as a call to make later
Deferred = Callable[[], object]


@dataclass(kw_only=True)
class _Lease:
    store: BaseStore
    key: JobKey
    owner: str
    ttl: float
    sender: Any  # the task class (a Django task: the task): sender of lock_lost
    delivery: str | None  # the nonce of this delivery's start (W5), kept when taken back
    slot_limit: int = 0  # T2: a concurrency slot of a throttle key (of this many), not a lock
    due: float = field(default=0.0)  # time.monotonic() of the next renewal
    #: W4: the call whose reply was lost, re-sent (through the given store) until the store
    #: answers; it returns whether it granted what this lease renews. None once answered.
    resend: Callable[[BaseStore], bool] | None = None
    #: None while the outcome is unknown; False: not granted (nothing to renew or release)
    granted: bool | None = True
    #: L2: the owner of a dispatch that asked this run to stop (read back by a renewal)
    cancel: str | None = None


class LeaseKeeper:
    """One renewal thread per process (re-created after a fork), shared by all running jobs:
    prefork, threads, solo, gevent and eventlet pools. Each lease is renewed every third of
    its length, so the lock outlives a late renewal or two but not the process."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        # Real locks even when the process is monkey-patched: a green thread only ever holds
        # _mutex for a few dict operations (it never yields while holding it).
        allocate = native.original_thread().allocate_lock
        self._mutex = allocate()
        self._bell = native.Bell(allocate())
        self._leases: dict[int, _Lease] = {}
        self._next_token = 0
        self._in_flight: int | None = None  # the token being renewed right now
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._green = ""  # "gevent"/"eventlet" once the thread runs in a patched process
        self._events: deque[Deferred] = deque()  # log records and signals for the green side
        self._delivering = False
        self._own: dict[int, tuple[BaseStore, BaseStore]] = {}  # the thread's own stores
        # time.monotonic() at which the thread's current wait ends (-inf: it is not waiting
        # and looks at every lease before it waits again): a new lease due no sooner needs
        # no wake-up call, so a stream of short jobs does not wake the thread once per job
        self._wake_at = -math.inf
        # How long the thread waits with no lease running: the renewal interval of the last
        # lease (at most IDLE_WAIT), so that the next short job's lease, due as soon, is due
        # no sooner than the thread wakes anyway and needs no wake-up call either
        self._idle_wait = IDLE_WAIT

    def _after_fork(self) -> None:
        # The parent's thread and mutex state did not come along into the child.
        self._reset()

    def active(self) -> int:
        with self._mutex:
            return len(self._leases)

    @contextmanager
    def hold(
        self, store: BaseStore, key: JobKey, owner: str, ttl: float, *, sender: Any,
        delivery: str | None = None, slot_limit: int = 0,
        resend: Callable[[BaseStore], bool] | None = None, renew_at_once: bool = False,
    ) -> Iterator[_Lease]:
        """Renew ``owner``'s lock at ``key`` for ``ttl`` seconds at a time while the block
        runs (with ``slot_limit``: ``owner``'s concurrency slot of the throttle key ``key``,
        T2). When the block ends no renewal of it is under way or will start, so the caller
        may release the lock right after (a renewal never takes back a finished job's lock).
        With ``resend`` the grant is unknown (W4): it is re-sent first (see the module's
        text); the lease yielded tells in ``granted`` what the caller has to release.
        ``renew_at_once``: the grant came from a re-sent call, whose answer (the first
        one's, S7) may not have extended it, so little of it may be left: it is renewed here,
        before the block runs, not on the lease thread racing it."""
        now = time.monotonic()
        inline = renew_at_once and resend is None
        lease = _Lease(store=store, key=key, owner=owner, ttl=ttl, sender=sender,
                       delivery=delivery, slot_limit=slot_limit,
                       due=now if resend is not None else now + ttl / 3,
                       resend=resend,
                       granted=None if resend is not None else True)
        with self._mutex:
            self._next_token += 1
            token = self._next_token
            self._leases[token] = lease
            deliver = self._ensure_thread()
            self._idle_wait = min(IDLE_WAIT, ttl / 3)
            wake = lease.due < self._wake_at
        if deliver:
            threading.Thread(target=self._keep_delivering, daemon=True).start()
        if wake:
            self._bell.ring()
        try:
            if inline:
                self._renew(token, lease)
            yield lease
        finally:
            self._stop(token)
            self._deliver()

    def _stop(self, token: int) -> None:
        while True:
            with self._mutex:
                self._leases.pop(token, None)
                if self._in_flight != token:
                    return
            time.sleep(0.002)  # green under gevent/eventlet: the hub runs meanwhile

    # -- the green side (gevent, eventlet) ---------------------------------------------------

    def _deliver(self) -> None:
        """Run the log records and signals the OS thread left for the hub's side."""
        while True:
            try:
                event = self._events.popleft()
            except IndexError:
                return
            event()

    def _keep_delivering(self) -> None:
        """A green thread delivering while leases run (also while a job's body yields)."""
        while True:
            self._deliver()
            with self._mutex:
                if not self._leases and not self._events:
                    self._delivering = False
                    return
            time.sleep(DELIVER_EVERY)

    # -- the renewal thread -------------------------------------------------------------------

    def _ensure_thread(self) -> bool:
        """Start the thread if this process has none (called holding _mutex). True when the
        caller must start a green delivering thread (outside _mutex: starting one yields)."""
        pid = os.getpid()
        alive = self._pid == pid and (self._thread is None or self._thread.is_alive())
        if not alive:
            self._pid = pid
            self._green = native.green()
            if self._green:
                self._thread = None  # a real OS thread, unknown to the patched threading
                native.original_thread().start_new_thread(self._loop, ())
            else:
                self._thread = threading.Thread(
                    target=self._loop, name="dedup-jobs-lease", daemon=True
                )
                self._thread.start()
        if self._green and not self._delivering:
            self._delivering = True
            return True
        return False

    def _loop(self) -> None:
        while True:
            try:
                self._tick()
            except Exception:  # never let the thread die: every lease depends on it
                self._emit([partial(logger.error, "The lease thread failed; going on.",
                                    exc_info=sys.exc_info())])
                with self._mutex:
                    self._wake_at = time.monotonic() + 1.0
                self._bell.wait(1.0)

    def _tick(self) -> None:
        with self._mutex:
            current = list(self._leases.items())
            now = time.monotonic()
            next_due = min((lease.due for _, lease in current), default=now + self._idle_wait)
            wait = min(next_due - now, IDLE_WAIT)
            # Set with the copy, under _mutex: a lease added after it rings if due sooner.
            self._wake_at = now + wait if wait > 0 else -math.inf
        if wait > 0:
            self._bell.wait(wait)
            return
        used_database = False
        for token, lease in current:
            if lease.due > now:
                continue
            lease.due = now + lease.ttl / 3
            used_database = used_database or lease.store.alias == "database"
            self._renew(token, lease)
        if used_database:
            from django.db import connections

            connections.close_all()  # this thread's own connections

    def _renew(self, token: int, lease: _Lease) -> None:
        with self._mutex:
            if token not in self._leases:
                return  # the job ended meanwhile: never renew (or take back) its lock
            self._in_flight = token
        events: list[Deferred] = []
        try:
            events = self._decide(lease)
        finally:
            with self._mutex:
                self._in_flight = None
                if self._green:
                    # queued before the job's hold() can end, which then delivers them
                    self._events.extend(events)
                    events = []
        for event in events:
            event()

    def _emit(self, events: list[Deferred]) -> None:
        if self._green:
            self._events.extend(events)  # delivered by the green side (see _deliver)
        else:
            for event in events:
                event()

    def _decide(self, lease: _Lease) -> list[Deferred]:
        """One renewal; what to log and send about it."""
        if lease.resend is not None:
            return self._reconcile(lease)
        key, owner = lease.key.key, lease.owner
        try:
            if lease.slot_limit:
                renewed = self._store(lease.store).throttle_renew(
                    lease.key, owner, lease.ttl, limit=lease.slot_limit)
            else:
                renewed = self._store(lease.store).renew(
                    lease.key, owner, lease.ttl, now=clock.now(), delivery=lease.delivery
                )
        except Exception:
            # Store errors: try again at the next interval.
            return [partial(
                logger.warning, "Lease renewal of %s (task %s) failed; trying again in %.1fs.",
                key, owner, lease.ttl / 3, exc_info=sys.exc_info(),
            )]
        if renewed.held:
            if renewed.cancel and lease.cancel is None:
                lease.cancel = renewed.cancel
                return [partial(logger.info, "Task %s (%s) was asked to stop by task %s.",
                                owner, key, renewed.cancel)]
            if not renewed.retaken:
                return []
            return [partial(
                logger.info,
                "The lock %s of running task %s was gone (store flushed, key evicted or "
                "released); it is held again.",
                key, owner,
            )]
        lease.due = math.inf  # another owner's now: stop renewing, never touch its lock
        if lease.slot_limit:
            return [partial(
                logger.warning,
                "The concurrency slot of running task %s at %s is not held (%s): its body "
                "keeps running, beside the limit.", owner, key, renewed.holder,
            )]
        return [
            partial(
                logger.warning,
                "The lock %s of running task %s is held by another owner, %s: its body "
                "keeps running, the lock is no longer renewed and is left to its owner.",
                key, owner, renewed.holder,
            ),
            partial(metrics.decision, lease.key.task_name, "lock_lost", key),
            partial(
                notify, lock_lost, lease.sender, key=key, owner=owner,
                store=lease.store.alias, holder=renewed.holder, observed=False,
            ),
        ]

    def _reconcile(self, lease: _Lease) -> list[Deferred]:
        """W4: re-send the call whose reply was lost; what to log about it."""
        assert lease.resend is not None
        key, owner = lease.key.key, lease.owner
        try:
            granted = lease.resend(self._store(lease.store))
        except Exception:
            return [partial(
                logger.warning, "The store still cannot say what the check of task %s at %s "
                "granted; asking again in %.1fs.", owner, key, lease.ttl / 3,
                exc_info=sys.exc_info(),
            )]
        lease.resend, lease.granted = None, granted
        if not granted:
            lease.due = math.inf  # nothing of this run's to renew
            return [partial(logger.info, "The store answered the check of running task %s "
                            "at %s: nothing to hold.", owner, key)]
        lease.due = time.monotonic()  # renewed at once: a re-sent answer may not extend it
        return [partial(logger.warning, "The store answered the check of running task %s "
                        "at %s: %s is held by it again and renewed until it ends.", owner,
                        key, "a concurrency slot" if lease.slot_limit else "the key")]

    def _store(self, store: BaseStore) -> BaseStore:
        """The store to renew through: under gevent/eventlet one of this thread's own."""
        if not self._green:
            return store
        found = self._own.get(id(store))
        if found is None or found[0] is not store:
            if len(self._own) >= 16:  # stores dropped by settings changes
                for shared, own in self._own.values():
                    if own is not shared:
                        own.close()
                self._own.clear()
            found = self._own[id(store)] = (store, store.for_thread())
        return found[1]


leases = LeaseKeeper()
os.register_at_fork(after_in_child=leases._after_fork)
