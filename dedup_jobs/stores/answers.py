"""What the stores answer and keep: the answer of each decision (Acquired, Started, Renewed,
Admission, Debounced, Due), what the admin lists (LockInfo, DebounceState, ThrottleState, Page),
the states and constants they carry, and the stored call of a debounce burst. No store logic:
:mod:`dedup_jobs.stores.base` holds the store contract, :mod:`dedup_jobs.stores.protocols` the
capabilities."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar

from kombu.utils.json import JSONEncoder, loads

from dedup_jobs.conf import app_settings
from dedup_jobs.keys import JobKey

QUEUED = "queued"
RUNNING = "running"


@dataclass(frozen=True, kw_only=True)
class LockInfo:
    """A held lock, as the admin and the management command see it."""

    key: str
    task_name: str
    ident: str
    owner: str
    state: str  # QUEUED or RUNNING
    acquired_at: float  # epoch seconds
    expires_at: float | None  # epoch seconds, None if the store cannot tell
    store: str


T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Page(Generic[T]):
    """One page of held locks or pending debounces for the admin: ``total`` is None when the
    store found the page without counting every match (``has_more`` says if more follow)."""

    items: list[T]
    total: int | None
    has_more: bool


@dataclass(frozen=True, slots=True)
class AcquireCall:
    """One dispatch of a batch (L3, :meth:`BaseStore.acquire_many`): what
    :meth:`BaseStore.acquire` takes."""

    key: JobKey
    owner: str
    ttl: float
    request: str


@dataclass(frozen=True, kw_only=True)
class Acquired:
    """The answer of :meth:`BaseStore.acquire`."""

    acquired: bool
    holder: str  # the owner token now holding the lock (the caller's when acquired)
    replaced: str | None = None  # R1 (take_over): the queued owner the caller took over from
    #: L2 (take_over with ``cancel``): the running owner the caller asked to stop (None: no
    #: other run of the key, or another dispatch had asked it already)
    cancelled: str | None = None


class StartAnswer(Enum):
    """The worker-side check's answer as one value (what :attr:`Started.answer` reads)."""

    RUN = "run"  # W1: the lock is free or the caller's: the body runs
    SKIP = "skip"  # W3: another owner holds the lock
    LIVE = "live"  # W5: another delivery of this very message is running: put off
    DONE = "done"  # W5: a redelivered copy whose own first run just ended: dropped
    OVERLAP = "overlap"  # R2: another run of the key is in progress: deferred
    TAKEN_OVER = "taken_over"  # R1/S7: another dispatch took the lock over (not confirmed)


@dataclass(frozen=True, kw_only=True)
class Started:
    """The answer of :meth:`BaseStore.start`, the worker-side check. The stores fill the
    fields their scripts return; a decision reads :attr:`answer`, one value, and ``holder``,
    ``took``, ``released`` and ``taken_over`` for what it reports."""

    run: bool
    holder: str | None  # the other owner when run is False
    took: bool = False  # the lock was free and the caller now holds it
    released: bool = False  # release=True and the caller's lock was deleted
    live: bool = False  # W5: another delivery of the same message is running (its lease lives)
    overlap: bool = False  # R2 (start_exclusive): another run of the key is in progress
    done: bool = False  # W5: a redelivered copy whose own first run just released the lock
    #: R1/S7: ``holder`` took the lock over from the caller this many seconds ago (None: it
    #: did not, or the store cannot tell); its dispatch may yet fail (engine/takeover.py)
    taken_over: float | None = None

    @property
    def answer(self) -> StartAnswer:
        """The answer as one value; the order settles a store that set two flags."""
        if self.done:
            return StartAnswer.DONE
        if self.live:
            return StartAnswer.LIVE
        if self.overlap:
            return StartAnswer.OVERLAP
        if self.taken_over is not None:
            return StartAnswer.TAKEN_OVER
        return StartAnswer.RUN if self.run else StartAnswer.SKIP


@dataclass(frozen=True, kw_only=True)
class Renewed:
    """The answer of :meth:`BaseStore.renew`, the lease of a running job."""

    held: bool  # the caller holds the lock now (extended, or taken back)
    retaken: bool = False  # the key was free (flushed, evicted, expired, released): taken back
    holder: str | None = None  # the other owner when held is False
    #: L2: a dispatch asked this run to stop (``cancel_running``): its owner, to run next
    cancel: str | None = None


@dataclass(frozen=True, kw_only=True)
class Released:
    """The answer of a slot release that may call a waiter (T2, a store whose ``can_wake``
    is true: ``throttle_release_waking``): true when the slot was freed; ``wake``: the task id
    of the waiter whose turn the release moved to now (its held message is due at once)."""

    freed: bool
    wake: str | None = None

    def __bool__(self) -> bool:
        return self.freed


@dataclass(frozen=True, kw_only=True)
class DebounceState:
    """A pending debounce (one burst not yet run), as the admin lists it."""

    key: str
    task_name: str
    ident: str  # the readable debounce id
    count: int  # dispatches absorbed in this burst so far
    first_dispatch_at: float  # epoch seconds
    last_dispatch_at: float  # epoch seconds
    runs_at: float  # epoch seconds: last dispatch + debounce_for, capped by the deadline
    deadline: float | None  # first dispatch + max_wait; None without max_wait
    message_id: str  # task id of the burst's one broker message (its first dispatch)
    latest_id: str  # task id of the latest dispatch, whose arguments the run will use
    args: tuple[Any, ...]  # the latest dispatch's positional arguments
    kwargs: dict[str, Any]  # the latest dispatch's keyword arguments
    store: str

    def overdue(self, now: float) -> bool:
        """D9: due more than the grace ago and still not claimed: its message is taken as
        lost (the next dispatch starts a new burst; operators may release it)."""
        return now > self.runs_at + stale_grace()


@dataclass(frozen=True, kw_only=True)
class Debounced:
    """The answer of :meth:`BaseStore.debounce` (one dispatch)."""

    new: bool  # the first dispatch of a burst: the caller publishes the burst's message
    message_id: str  # the burst's message id (the caller's own id when new)
    superseded: str | None = None  # the previous latest dispatch, superseded by the caller


class Answer(str, Enum):
    """An answer that is one of a few words: equal to its word (the stores' scripts and SQL
    return the words), printed as it."""

    def __str__(self) -> str:
        return str(self.value)


class ThrottleAnswer(Answer):
    """Why :meth:`BaseStore.throttle_admit` admitted nothing (``Admission.reason``)."""

    ADMITTED = ""  # admitted: no reason
    CONCURRENCY = "concurrency"  # T2: every slot is taken: wait for one
    THROTTLE = "throttle"  # T3: the rate allows no start now: wait for one
    #: a re-sent or late admission whose grant is over (released, or taken over by a later
    #: admission of the same task): nothing was granted, nothing changed (S7)
    RELEASED = "released"


RELEASED = ThrottleAnswer.RELEASED


@dataclass(frozen=True, kw_only=True)
class Admission:
    """The answer of :meth:`BaseStore.throttle_admit` (T2-T4)."""

    admitted: bool
    #: deferred: CONCURRENCY or THROTTLE; RELEASED: this nonce's grant was released or
    #: superseded already (a re-sent or late admission changes nothing, issue 21's fates)
    reason: ThrottleAnswer = ThrottleAnswer.ADMITTED
    until: float = 0.0  # deferred: when to try again (epoch seconds, the store's clock)
    #: admitted into a slot its owner (this task id) held already: a retry that kept it, or
    #: another delivery of this message still running (W5: a copy put off leaves it be)
    held: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", ThrottleAnswer(self.reason))


@dataclass(frozen=True, kw_only=True)
class ThrottleState:
    """A throttle key as the admin's Throttles page lists it (T5)."""

    key: str
    task_name: str
    ident: str  # the readable throttle id
    limit: str  # e.g. "concurrency 2, 10/s"
    running: int  # concurrency slots held now
    starts: int  # starts in the current window of the rate
    deferred: int  # deferred messages waiting for a slot or a start
    store: str


#: seconds a deferred message may come back late before its turn passes to the next one
THROTTLE_GRACE = 2.0


#: seconds: a debounce message whose timer fires this much before the burst is due runs
DUE_TOLERANCE = 0.025

#: seconds a claimed burst's record is kept, so that a re-sent claim of the same message (a
#: lost reply, a worker that retries the claim) gets the same answer (S7)
CLAIM_RECORD_SECONDS = 600.0


def running_key(key: JobKey) -> JobKey:
    """R2: where the running marker of ``key`` lives (a suffix, so it shares the lock key's
    hash tag on a Redis Cluster: both are passed as KEYS to one script)."""
    return JobKey(key=f"{key.key}:run", task_name=key.task_name, ident=key.ident)


def new_request_id() -> str:
    """A random id for one store request, so that a re-send of it is known (S7)."""
    return os.urandom(12).hex()


#: seconds the state of a debounce burst outlives its due time, so that a message delayed by
#: a worker outage still finds it (after that a new dispatch starts a new burst)
STATE_GRACE = 3600.0


class ClaimAnswer(Answer):
    """What :meth:`BaseStore.claim_due` answers a debounce message (``Due.action``)."""

    CLAIMED = "claimed"  # the burst is the caller's: run with the latest arguments
    WAIT = "wait"  # not due yet (a later dispatch moved it): re-schedule to wait_until
    MISSING = "missing"  # no state (flushed, evicted, expired): run the message as it is
    OTHER = "other"  # the state belongs to another message (a newer burst): run as it is
    #: the message of a stale burst (D9) whose ids a newer burst adopted: that burst's run
    #: records the outcome under this message's id, so the message itself does not run
    ADOPTED = "adopted"


CLAIMED, WAIT, MISSING, OTHER, ADOPTED = ClaimAnswer


def stale_grace() -> float:
    """D9: seconds past its due time after which a burst no worker claimed is stale (its
    message is taken as lost) and the next dispatch of its id starts a new burst."""
    return app_settings.LEASE_SECONDS


@dataclass(frozen=True, kw_only=True)
class Due:
    """The answer of :meth:`BaseStore.claim_due`, the worker-side decision of a debounce
    message."""

    action: ClaimAnswer
    wait_until: float | None = None  # WAIT: when the burst is due (epoch seconds)
    latest_id: str | None = None  # CLAIMED: the dispatch whose arguments run
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    absorbed: tuple[str, ...] = ()  # CLAIMED: every dispatch id of the burst, in order

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", ClaimAnswer(self.action))


class CallArgs(tuple[Any, ...]):
    """The positional arguments of a stored call, carrying the dispatch's chain continuation
    in ``chain`` (D8: the links Celery passes in ``options["chain"]``, the next one last;
    None when the dispatch was not a chain link). Carried on the arguments so that every
    store hands it from the payload to ``Due.args`` without knowing of it."""

    chain: list[dict[str, Any]] | None = None


def encode_call(
    args: Sequence[Any] | None,
    kwargs: dict[str, Any] | None,
    chain: Sequence[dict[str, Any]] | None = None,
) -> str:
    """The latest call as stored: kombu's JSON of ``[args, kwargs]``, or of
    ``[args, kwargs, chain]`` for a chain link (D8)."""
    call: list[Any] = [list(args or ()), dict(kwargs or {})]
    if chain:
        call.append(list(chain))
    return _ENCODER.encode(call)


#: kombu's ``dumps(value)`` is ``json.dumps(value, cls=kombu's JSONEncoder)``, which builds
#: this very encoder (json's default options) for every call: built once here instead (its
#: ``default`` reads kombu's registered types at each call, as before)
_ENCODER = JSONEncoder()


def encode_json(value: Any) -> str:
    """kombu's ``dumps(value)``, with the encoder built once (see ``_ENCODER``)."""
    return _ENCODER.encode(value)


def decode_call(payload: str | bytes) -> tuple[CallArgs, dict[str, Any]]:
    """``(args, kwargs)`` of a stored call; ``args.chain`` is its chain continuation. A
    payload stored before chains were debounced (two elements) decodes with no chain."""
    args, kwargs, *rest = loads(payload)
    call = CallArgs(args)
    if rest and rest[0]:
        call.chain = list(rest[0])
    return call, dict(kwargs)
