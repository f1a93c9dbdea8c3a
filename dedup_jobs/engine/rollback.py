"""Where a failed dispatch's own entries are cleaned up (SPEC S7).

A dispatch that ends in ``StoreUnavailable`` told its caller that nothing was published and
nothing locked. Its request may still have reached the store: the reply was lost on the way
back, or came after the caller gave up. The dispatch scripts refuse to run past the caller's
deadline, so a request that Redis ran *late* changed nothing; one whose reply was *lost* did
take its lock (or start its burst). So after every such failure the dispatch hands its undo
to this module: a compare-and-delete by its own never-published id (for a debounce dispatch:
taking back the burst it started, or withdrawing it from the burst it was absorbed into, see
``bursts.py``). One daemon thread per process tries each undo until the
store answers, at most ``LEASE_SECONDS / 3`` apart, so the entry is gone within
``LEASE_SECONDS`` of the store's return. Undos are grouped by the store object they call
(not by its alias: a store replaced under the same alias, its server gone, is another
group): each round tries the first pending undo of every group, and the next ones of a group
whose store answered, so a store that stays down (or is gone) costs one failing call per
round and holds up no undo of another store. The normal path pays nothing: an undo exists
only after a failure.

A dispatch that was deduplicated onto the never-published id in the meantime (possible only
while the lost reply's lock stood) would wait forever on a result nobody writes: an undo that
really removed an entry marks that id REVOKED, so such a caller's ``.get()`` returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from dedup_jobs.conf import app_settings

logger = logging.getLogger("dedup_jobs")

#: undo calls kept at most; past that the oldest is dropped with a warning (each entry it
#: would have removed still expires by itself)
MAX_PENDING = 10_000
#: seconds before the first try (the store just failed), doubled after each failure
FIRST_WAIT = 0.05


@dataclass(kw_only=True, eq=False)
class _Undo:
    what: str  # for the log: "lock dedup_jobs:unique:job:id of task abc"
    call: Callable[[], bool]  # True: it removed something; raises while the store is down
    until: float  # time.monotonic() after which the entry has expired by itself
    give_up: Callable[[], None] | None = None  # what is still owed then (a result to mark)
    group: int  # the store it calls (its identity): a failure puts off that store's only
    database: bool = False  # it calls the database store (the thread's connection is closed)


class Rollbacks:
    """The undo calls of failed dispatches, tried in order (per store) from one daemon
    thread."""

    def __init__(self) -> None:
        self._pending: deque[_Undo] = deque()
        self._mutex = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(
        self, what: str, call: Callable[[], bool], *, store: object, lifetime: float,
        give_up: Callable[[], None] | None = None,
    ) -> None:
        """Undo ``what`` by ``call()`` as soon as the store answers; give up after
        ``lifetime`` seconds, when the entry has expired by itself (then ``give_up()``).
        ``store``: the store object ``call`` talks to (undos of one store wait for each
        other; ``call`` holds it, so its identity is not reused while the undo waits)."""
        undo = _Undo(what=what, call=call, until=time.monotonic() + lifetime,
                     give_up=give_up, group=id(store),
                     database=getattr(store, "alias", None) == "database")
        with self._mutex:
            if len(self._pending) >= MAX_PENDING:
                dropped = self._pending.popleft()
                logger.warning("dedup_jobs: too many undos pending; %s expires by itself.",
                               dropped.what)
            self._pending.append(undo)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="dedup-jobs-rollback", daemon=True)
                self._thread.start()
        self._wake.set()

    def pending(self) -> int:
        with self._mutex:
            return len(self._pending)

    def _loop(self) -> None:
        wait: float | None = FIRST_WAIT
        while True:
            self._wake.wait(wait)
            self._wake.clear()
            with self._mutex:
                batch = list(self._pending)
            if not batch:
                wait = None  # idle: sleep until the next add()
                continue
            down = self._round(batch)
            if any(undo.database for undo in batch):
                from django.db import connections

                connections.close_all()  # this thread's own: not held between rounds
            if down:
                # A store still cannot answer: try again later (one failing call per store
                # and round, not one per pending undo, while it is down).
                wait = min((wait or FIRST_WAIT) * 2,
                           max(FIRST_WAIT, app_settings.LEASE_SECONDS / 3))
            else:
                wait = FIRST_WAIT

    def _round(self, batch: list[_Undo]) -> bool:
        """Try each undo of ``batch`` in order, skipping the rest of a group once one of its
        calls failed; True when one did."""
        down: set[int] = set()
        for undo in batch:
            if undo.group in down:
                continue
            if time.monotonic() > undo.until:
                self._done(undo)
                if undo.give_up is not None:
                    try:
                        undo.give_up()
                    except Exception:
                        logger.warning("dedup_jobs: gave up on %s", undo.what, exc_info=True)
                continue
            try:
                removed = undo.call()
            except Exception:
                logger.debug("dedup_jobs: undo of %s failed; trying again", undo.what,
                             exc_info=True)
                down.add(undo.group)
                continue
            if removed:
                logger.warning("dedup_jobs: removed %s, left behind by a store call that "
                               "failed with StoreUnavailable.", undo.what)
            self._done(undo)
        return bool(down)

    def _done(self, undo: _Undo) -> None:
        with self._mutex, contextlib.suppress(ValueError):  # (forgotten by a fork meanwhile)
            self._pending.remove(undo)  # by identity (eq=False)

    def _after_fork(self) -> None:
        # A forked child (a prefork pool process) starts with none: the parent keeps its own.
        self._pending = deque()
        self._mutex = threading.Lock()
        self._wake = threading.Event()
        self._thread = None


rollbacks = Rollbacks()
os.register_at_fork(after_in_child=rollbacks._after_fork)
