"""The store contract: where locks live and how a decision is made in one round trip."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.answers import (
    ADOPTED,
    CLAIM_RECORD_SECONDS,
    CLAIMED,
    DUE_TOLERANCE,
    MISSING,
    OTHER,
    QUEUED,
    RELEASED,
    RUNNING,
    STATE_GRACE,
    THROTTLE_GRACE,
    WAIT,
    AcquireCall,
    Acquired,
    Admission,
    CallArgs,
    Debounced,
    DebounceState,
    Due,
    LockInfo,
    Page,
    Released,
    Renewed,
    Started,
    ThrottleState,
    decode_call,
    encode_call,
    new_request_id,
    running_key,
    stale_grace,
)

# The answers are re-exported: `from dedup_jobs.stores.base import Acquired` keeps working.
__all__ = [
    "ADOPTED",
    "CLAIMED",
    "CLAIM_RECORD_SECONDS",
    "DUE_TOLERANCE",
    "MISSING",
    "OTHER",
    "QUEUED",
    "RELEASED",
    "RUNNING",
    "STATE_GRACE",
    "THROTTLE_GRACE",
    "TIMED_CALLS",
    "WAIT",
    "AcquireCall",
    "Acquired",
    "Admission",
    "BaseStore",
    "CallArgs",
    "DebounceState",
    "Debounced",
    "Due",
    "LockInfo",
    "Page",
    "Released",
    "Renewed",
    "Started",
    "ThrottleState",
    "decode_call",
    "encode_call",
    "new_request_id",
    "running_key",
    "stale_grace",
]

#: the decision methods of a store: each is timed, and its StoreUnavailable counted, by
#: :func:`dedup_jobs.metrics.timed` (A5), in every subclass that defines one, unless the
#: store times its own calls (``times_its_calls``: the Redis family, in ``_eval``)
TIMED_CALLS = ("acquire", "start", "release", "renew", "take_over", "start_exclusive",
               "debounce", "claim_due", "release_queued")


class BaseStore(ABC):
    """One lock store. Every method is one decision, atomic where ``atomic`` is True."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        from dedup_jobs.metrics import timed

        if cls.times_its_calls:
            return
        for name in TIMED_CALLS:
            method = getattr(cls, name, None)  # its own, a mixin's or an inherited one
            if callable(method) and not getattr(method, "__dedup_timed__", False):
                setattr(cls, name, timed(method))

    #: the store times each of its calls for the metrics itself (else TIMED_CALLS are wrapped)
    times_its_calls: bool = False
    #: the store can list held locks (admin, clear_stale_locks) without scanning the keyspace
    can_list: bool = False
    #: every decision is atomic across processes (an honest flag for the system checks)
    atomic: bool = True
    #: why the store cannot list, shown by the admin when ``can_list`` is False
    cannot_list_reason: str = ""

    #: ms the store's clock runs ahead of the caller's (learnt where the store can tell)
    skew_ms: int = 0

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def deadline_ms(self) -> int:
        """S7: when the caller of a dispatch decision (acquire, take_over, debounce) sent now
        gives up, in epoch ms on the store's clock: a decision that reaches its write after
        it changes nothing (the caller has raised StoreUnavailable and undone the call)."""
        from dedup_jobs.conf import app_settings

        return int((time.time() + app_settings.STORE_TIMEOUT) * 1000) + self.skew_ms

    def late(self, deadline_ms: int, now_ms: float | None = None) -> StoreUnavailable:
        """The error of a dispatch decision refused past ``deadline_ms`` (nothing changed)."""
        at = time.time() * 1000 if now_ms is None else now_ms
        return StoreUnavailable(self.alias, f"the call reached the store {at - deadline_ms:.0f}"
                                            " ms past its caller's deadline: nothing changed")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.alias!r}>"

    def key_problem(self, key: JobKey) -> str | None:
        """Why this store cannot hold ``key`` (a sentence ending with what to do), or None.
        Checked at dispatch before any store call, so it must not touch the store (A4)."""
        return None

    def close(self) -> None:
        """Give back what the store holds between decisions (it is being dropped)."""
        return None

    def for_thread(self) -> BaseStore:
        """A store like this one for the calling thread alone, sharing no connection with
        other threads. The lease's OS thread uses it under gevent or eventlet, where a
        socket can only wait in the thread (hub) that made it. Made in the calling thread,
        so Django's per-thread caches and database connections are that thread's own."""
        return type(self)(self.alias)

    @abstractmethod
    def acquire(
        self, key: JobKey, owner: str, ttl: float, *, now: float, reentrant: bool = False,
        request: str | None = None,
    ) -> Acquired:
        """Take the lock for ``ttl`` seconds if it is free (or, with ``reentrant``, already
        held by ``owner``: then refresh it). Otherwise report the holder. ``request`` names
        this dispatch: a store that keeps it (the Redis family) answers a re-send of the same
        request "taken", also for an explicit task id, and :meth:`undo` removes only the lock
        this request took (S7). Without one, a second call by ``owner`` is a duplicate."""

    def acquire_many(self, calls: Sequence[AcquireCall], *, now: float) -> list[Acquired]:
        """L3: :meth:`acquire` for each of ``calls`` in order, as one store round trip where
        the store can (the Redis family on one server: one pipelined write of every EVALSHA,
        one read of the answers), else one call each (this default). A later call of a key
        an earlier one took is a duplicate of it. StoreUnavailable when any answer is missing
        (never sent, lost, late), its ``answered`` the answers of the calls before it (none
        from a pipelined batch): the caller undoes every request of the batch (S7), or, to
        publish without locks, keeps the answers it got."""
        answers: list[Acquired] = []
        for c in calls:
            try:
                answers.append(self.acquire(c.key, c.owner, c.ttl, now=now, request=c.request))
            except StoreUnavailable as exc:
                exc.answered = answers  # the calls before it were answered
                raise
        return answers

    def undo(self, key: JobKey, owner: str, request: str | None) -> bool:
        """S7: undo what the dispatch ``request`` of ``owner`` may have done before it failed
        with StoreUnavailable (its reply lost): its lock, or, for a take-over, the lock given
        back to the queued holder it replaced. True when something was undone, also to the
        undo made again (a short tombstone). Every store matches the request and gives a
        take-over back (the Redis family, the cache stores, the database store); this default,
        for a store that keeps neither, releases ``owner``'s lock."""
        return self.release(key, owner)

    @abstractmethod
    def start(
        self, key: JobKey, owner: str, lease: float, *, now: float, release: bool,
        delivery: str | None = None, redelivered: bool = False,
    ) -> Started:
        """The worker-side check before ``run``. Held by another owner: don't run. Held by
        ``owner`` or free: run, and either mark the lock running for ``lease`` seconds
        (taking it if free) or, with ``release``, delete ``owner``'s lock. ``delivery`` names
        this delivery of the message (a nonce): ``owner``'s lock already running under
        another delivery answers ``live`` (W5) and is left as it is. A store that remembers
        releases for a moment (the Redis family) answers ``done`` to a ``redelivered`` copy
        whose own run has just released the key (W5: the window before Celery stores that
        run's result); the others let it run, the result backend decides before."""

    @abstractmethod
    def release(self, key: JobKey, owner: str) -> bool:
        """Compare-and-delete: delete the lock only if ``owner`` holds it."""

    @abstractmethod
    def renew(
        self, key: JobKey, owner: str, ttl: float, *, now: float, delivery: str | None = None
    ) -> Renewed:
        """The lease of ``owner``'s running job, atomically. Held by ``owner``: extend the lock
        to expire no sooner than ``now + ttl`` (never shorten it). Free (flushed, evicted,
        expired, released under the job): take it back for ``owner``, state running, with
        the task name and readable id of ``key``, for ``ttl`` seconds (``retaken``), marked
        as run by ``delivery`` (the nonce its ``start`` was given, W5). Held by another
        owner: change nothing and report it."""

    # -- flow control (R1, R2) ----------------------------------------------------------

    def take_over(
        self, key: JobKey, owner: str, ttl: float, *, now: float, request: str | None = None
    ) -> Acquired:
        """R1, atomically: free → take it (as :meth:`acquire`); held *queued* by another
        owner → the lock passes to ``owner`` for ``ttl`` seconds and the answer names the
        replaced owner; held *running* → not acquired, the holder reported. A re-send of the
        same ``request`` answers as the first did (S7)."""
        raise NotImplementedError(f"{self!r} cannot replace a queued lock")

    def start_exclusive(
        self, key: JobKey, running: JobKey, owner: str, lease: float, *, now: float,
        delivery: str | None = None,
    ) -> Started:
        """R2, the until-processing worker check with ``without_overlapping``, atomically:
        the lock at ``key`` held by another owner → skip (``holder``). The running marker at
        ``running`` held by another owner → ``overlap`` (``holder`` = the running owner),
        ``key`` left as it is (the waiting message keeps its lock); held by ``owner`` under
        another ``delivery`` → ``live`` (W5). Otherwise: delete ``owner``'s lock at ``key``
        (``released``) and take the marker, running, for ``lease`` seconds (renewed and
        released like a lock, through :meth:`renew` and :meth:`release` on ``running``)."""
        raise NotImplementedError(f"{self!r} cannot keep runs from overlapping")

    def cancel_take(
        self, key: JobKey, running: JobKey, owner: str, ttl: float, *, now: float,
        request: str | None = None,
    ) -> Acquired:
        """L2 (``on_duplicate = "cancel_running"``), atomically: :meth:`take_over` of
        ``key`` (free → taken, held queued by another owner → taken over, ``replaced``), and
        when that took it, the running marker at ``running`` held by another owner is asked
        to stop: its ``cancel`` is set to ``owner`` (read back by :meth:`renew` of the
        marker, ``Renewed.cancel``), and ``cancelled`` names the marker's owner unless another
        dispatch had asked it already. A re-send of the same ``request`` answers as the first
        did (S7)."""
        raise NotImplementedError(f"{self!r} cannot cancel a running job")

    def undo_cancel(self, key: JobKey, running: JobKey, owner: str,
                    request: str | None) -> bool:
        """S7: the undo of a :meth:`cancel_take` that failed: :meth:`undo` of ``key``, and the
        request to stop that ``owner`` left on the marker at ``running`` withdrawn."""
        raise NotImplementedError(f"{self!r} cannot cancel a running job")

    # -- throttling (T2-T5) ----------------------------------------------------------------

    #: the store can throttle (T4: one atomic round trip per admission)
    can_throttle: bool = False

    def throttle_admit(
        self, key: JobKey, owner: str, *, delivery: str, concurrency: int, rate_limit: int,
        rate_period: float, lease: float,
    ) -> Admission:
        """T2/T3, atomically, on the store's clock: admit ``owner`` (a task id) to run under
        the throttle key ``key``, or defer it. ``concurrency`` (0: none): a slot free (or
        ``owner``'s already: a retry, a re-send) → taken for ``lease`` seconds (renewed by
        :meth:`throttle_renew`, freed by :meth:`throttle_release`) unless a waiter's
        planned turn needs it; all taken → deferred, ``until`` = its planned turn (behind
        earlier waiters' turns; a waiter back for its turn takes any free slot), at most a
        third of ``lease`` later (see docs/throttling.md, Concurrency). ``rate_limit`` per
        ``rate_period`` seconds (0: none): fewer than that many starts in the last period
        and nobody waiting ahead → the start is recorded (as ``delivery``, so a re-send
        answers the same, S7); else a start time is reserved for ``owner`` and ``until``
        names it."""
        raise NotImplementedError(f"{self!r} cannot throttle")

    def throttle_release(self, key: JobKey, owner: str) -> bool:
        """Free ``owner``'s concurrency slot of ``key`` (True if it held one)."""
        raise NotImplementedError(f"{self!r} cannot throttle")

    def throttle_renew(self, key: JobKey, owner: str, ttl: float, *, limit: int) -> Renewed:
        """The lease of a slot: extend ``owner``'s slot to ``ttl`` seconds from now; gone
        (expired) → taken back if fewer than ``limit`` are held (``retaken``); else not held."""
        raise NotImplementedError(f"{self!r} cannot throttle")

    def throttle_page(
        self, *, offset: int, limit: int, task_name: str = "", search: str = "", now: float
    ) -> Page[ThrottleState]:
        """Throttle keys ``offset`` to ``offset + limit`` (most recently used first),
        narrowed as :meth:`lock_page` (T5)."""
        raise NotImplementedError(f"{self!r} cannot throttle")

    @abstractmethod
    def get(self, key: JobKey) -> LockInfo | None:
        """The lock at ``key``, or None."""

    def iter_locks(self, *, batch_size: int = 500) -> Iterator[LockInfo]:
        """Every held lock, streamed in batches (only where ``can_list``)."""
        raise NotImplementedError(self.cannot_list_reason or f"{self!r} cannot list locks")

    def lock_page(
        self, *, offset: int, limit: int, task_name: str = "", search: str = "", now: float
    ) -> Page[LockInfo]:
        """Held locks ``offset`` to ``offset + limit`` (soonest expiry first), narrowed to one
        job and/or a case-insensitive search in job name and id (only where ``can_list``)."""
        raise NotImplementedError(self.cannot_list_reason or f"{self!r} cannot list locks")

    def release_queued(self, key: JobKey, owner: str) -> bool:
        """Compare-and-delete for operators: delete the lock only if ``owner`` holds it and
        it is still queued, never once its job is running (only where ``can_list``)."""
        raise NotImplementedError(self.cannot_list_reason or f"{self!r} cannot list locks")

    # -- debounce -----------------------------------------------------------------------

    @abstractmethod
    def debounce(
        self, key: JobKey, task_id: str, payload: str, *, now: float, debounce_for: float,
        max_wait: float | None, ttl: float,
    ) -> Debounced:
        """One dispatch of a debounced job, atomically. No pending burst at ``key``: start
        one (the caller publishes its message). Otherwise absorb the dispatch: it becomes
        the latest (``payload`` = its arguments, from :func:`encode_call`), runs-at moves to
        ``now + debounce_for``, and the previous latest is reported as superseded. The
        state lives ``ttl`` seconds past its runs-at/deadline. A burst due more than
        :func:`stale_grace` before ``now`` is stale (D9): the dispatch starts a new burst
        instead, which adopts the stale one's ids (its claim hands them over too)."""

    @abstractmethod
    def claim_due(self, key: JobKey, message_id: str, *, now: float) -> Due:
        """The burst's message is at the worker. Due (runs-at or deadline reached) and the
        burst is this message's: delete the state and hand over the latest arguments and
        every absorbed id (CLAIMED), so that later dispatches start a new burst. Not due:
        WAIT. No state: MISSING. Another message's burst: OTHER, or ADOPTED when that
        burst adopted this message's stale one (D9)."""

    def withdraw(self, key: JobKey, task_id: str) -> bool:
        """S7, the undo of a dispatch that raised StoreUnavailable after its debounce ran (a
        lost reply) and absorbed it: the pending burst forgets ``task_id``; if it was the
        latest, the arguments of the dispatch before it are the burst's again. False when
        the burst holds no such absorbed dispatch (gone, claimed, or its own message)."""
        raise NotImplementedError(f"{self!r} cannot withdraw a dispatch")

    @abstractmethod
    def get_debounce(self, key: JobKey) -> DebounceState | None:
        """The pending burst at ``key``, or None."""

    def iter_debounces(self, *, batch_size: int = 500) -> Iterator[DebounceState]:
        """Every pending burst, soonest run first where the store can tell, streamed in
        batches (only where ``can_list``)."""
        raise NotImplementedError(self.cannot_list_reason or f"{self!r} cannot list debounces")

    def debounce_page(
        self, *, offset: int, limit: int, task_name: str = "", search: str = "", now: float
    ) -> Page[DebounceState]:
        """Pending bursts ``offset`` to ``offset + limit`` (soonest run first), narrowed as
        :meth:`lock_page` (only where ``can_list``)."""
        raise NotImplementedError(self.cannot_list_reason or f"{self!r} cannot list debounces")

    def check(self) -> list[str]:
        """Problems with this store's configuration, as text for the system checks."""
        return []
