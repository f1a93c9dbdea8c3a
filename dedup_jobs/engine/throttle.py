"""Throttling options of every dedup kind (SPEC section 10, T1-T3): ``concurrency``,
``throttle``, ``throttle_on`` / ``throttle_id()``, ``throttle_via``.

What lives here: the options and their validation, the rate parser, the throttle key of a
message (``{KEY_PREFIX}:throttle:{task name}:{throttle id}``, built by
:func:`dedup_jobs.keys.build_key` like every other key) and the holding of a concurrency slot
while the body runs (leased like a lock, released at the end, kept across a retry). Where a
message is admitted or deferred: :func:`dedup_jobs.engine.throttle_admission.admit`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dedup_jobs import keys
from dedup_jobs.conf import app_settings
from dedup_jobs.engine.lease import leases
from dedup_jobs.engine.rollback import rollbacks
from dedup_jobs.exceptions import InvalidJobConfiguration, InvalidJobId, StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.answers import Released
from dedup_jobs.stores.throttling import WAKE_AFTER

#: seconds per period letter of Celery's rate syntax
PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*([smh])\s*$")


@dataclass(frozen=True, kw_only=True)
class Rate:
    """``throttle = "K/s"``: at most ``limit`` starts in any window of ``period`` seconds."""

    limit: int
    period: float

    def __str__(self) -> str:
        letter = {v: k for k, v in PERIODS.items()}[self.period]
        return f"{self.limit}/{letter}"


def rate_problem(value: Any) -> str | None:
    """Why ``throttle = value`` cannot work (a sentence naming it), or None (also for a
    method, L1: its values are checked per call, :meth:`ThrottleOptions.limits_for`)."""
    if value is None or callable(value):
        return None
    if not isinstance(value, str) or _RATE.match(value) is None:
        return (f"throttle = {value!r} is not a rate: write \"K/s\", \"K/m\" or \"K/h\" "
                f"(K a whole number of starts above 0, e.g. \"10/s\"), as Celery's rate_limit.")
    if int(_RATE.match(value).group(1)) < 1:  # type: ignore[union-attr]
        return f"throttle = {value!r} allows no start at all: K must be 1 or more."
    return None


def parse_rate(value: str | None) -> Rate | None:
    """The rate of a ``throttle`` option (None: no rate limit). Raises ValueError naming a
    value that is not one."""
    if value is None:
        return None
    problem = rate_problem(value)
    if problem is not None:
        raise ValueError(problem)
    found = _RATE.match(value)
    assert found is not None
    return Rate(limit=int(found.group(1)), period=PERIODS[found.group(2)])


def concurrency_problem(value: Any) -> str | None:
    """Why ``concurrency = value`` cannot work, or None (also for a method, L1)."""
    if value is None or callable(value):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return (f"concurrency = {value!r} must be a whole number of runs at once, 1 or "
                f"more (None: no concurrency limit).")
    return None


class ThrottleOptions:
    """The throttle options, mixed into every dedup kind (T1). Both limits are off (None)
    unless set; with neither, a job is not throttled and pays nothing for it."""

    #: T2: at most this many runs of one throttle key at once, across all workers (L1: or a
    #: method taking the call's arguments; None from it: no limit for that call)
    concurrency: Any = None
    #: T3: "K/s", "K/m" or "K/h": at most K starts per period of one throttle key (L1: or a
    #: method, as ``concurrency``)
    throttle: Any = None
    #: argument names that form the throttle id (default: none, one limit for the job)
    throttle_on: tuple[str, ...] | None = None
    #: a CACHES alias or "database" (attribute, or a method returning it); default the STORE
    throttle_via: Any = None

    name: str

    @classmethod
    def validate_throttle(cls, label: str) -> None:
        """Raise InvalidJobConfiguration for throttle options that cannot work."""
        for problem in (concurrency_problem(cls.concurrency), rate_problem(cls.throttle)):
            if problem:
                raise InvalidJobConfiguration(f"{label}: {problem}")
        problem = keys.fields_problem("throttle_on", cls.throttle_on)
        if problem:
            raise InvalidJobConfiguration(f"{label}: {problem}")

    def throttled(self) -> bool:
        return self.concurrency is not None or self.throttle is not None

    def limits_for(self, args: Sequence[Any] | None,
                   kwargs: Mapping[str, Any] | None) -> tuple[int, Rate | None]:
        """L1: the limits of one call (see :func:`call_limits`)."""
        return call_limits(self.name, self.concurrency, self.throttle, args, kwargs)

    def retry_keeps_slot(self, ending: tuple[Any, Any], args: Any, kwargs: Any) -> bool:
        """T2 with L1: does a retry with ``args``/``kwargs`` go on in the slot of the attempt
        that is ending (its ``(args, kwargs)``: ``ending``)? Only under the same throttle
        key with a concurrency limit; otherwise that slot is released when the attempt
        ends, as after a run, for the retry's admission never frees it."""
        try:
            same = self.throttle_key(*ending) == self.throttle_key(args, kwargs)
            concurrency, _rate = self.limits_for(args, kwargs)
        except Exception:  # the retry's own admission refuses it, naming the value
            return False
        return same and bool(concurrency)

    def throttle_alias(self) -> str:
        via = self.throttle_via
        if callable(via):
            via = via()
        return str(via) if via else app_settings.STORE

    def throttle_key(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> JobKey:
        """T1: the throttle key of a call: ``throttle_id()``, else the ``throttle_on``
        arguments, else the task name alone (one limit for the whole job)."""
        hook = getattr(self, "throttle_id", None)
        if hook is not None:
            source = "throttle_id()"
            value = hook(*(args or ()), **(kwargs or {}))
            found = keys.hook_id(value)
            if found is None:  # A4: None, bytes, objects... raise naming the hook
                raise InvalidJobId(self.name, source, value, keys.HOOK_TYPE_PROBLEM)
            ident = found
        elif self.throttle_on:
            run: Any = getattr(self, "run")  # noqa: B009
            ident = keys.default_id(self.name, run, args, kwargs, self.throttle_on,
                                    "throttle_id")
            source = f"throttle_on = {tuple(self.throttle_on)!r}"
        else:
            ident, source = self.name, "the task name"
        problem = keys.id_problem(ident)
        if problem is not None:
            raise InvalidJobId(self.name, source, ident, problem)
        return keys.build_key("throttle", self.name, ident)


def call_limits(job: str, concurrency: Any, throttle: Any, args: Sequence[Any] | None,
                kwargs: Mapping[str, Any] | None) -> tuple[int, Rate | None]:
    """L1: the limits of one call of ``job``: ``(concurrency, rate)``, 0 and None for no
    limit. A limit given as a function (a job's method) is called with the call's arguments;
    a value it returns that cannot be a limit raises InvalidJobConfiguration naming the job,
    the method and the value (a static limit was checked when the job was made)."""
    return (int(_limit_of(job, "concurrency", concurrency, args, kwargs,
                          concurrency_problem) or 0),
            parse_rate(_limit_of(job, "throttle", throttle, args, kwargs, rate_problem)))


def _limit_of(job: str, name: str, value: Any, args: Sequence[Any] | None,
              kwargs: Mapping[str, Any] | None, problem_of: Callable[[Any], str | None]) -> Any:
    if not callable(value):
        return value
    found = value(*(args or ()), **(kwargs or {}))
    problem = "it is not a limit." if callable(found) else problem_of(found)
    if problem is not None:
        shown = "a function" if callable(found) else repr(found)
        raise InvalidJobConfiguration(
            f"{job}: {name}() returned {shown} for this call: {problem} Return a limit, or "
            f"None for no {name} limit for this call.")
    return found


@dataclass(frozen=True, kw_only=True)
class Slot:
    """A concurrency slot a run holds (T2): leased while the body runs, released after."""

    store: Any  # BaseStore
    key: JobKey
    owner: str
    limit: int
    #: W4: the admission whose reply was lost (the slot may or may not be held), re-sent by
    #: the lease thread until the store answers; it returns whether a slot was granted
    resend: Callable[[Any], bool] | None = None
    #: admitted into a slot its task id held already (a retry's, or a live first delivery's:
    #: a copy put off by W5 leaves it to that run, see ``admission.PutOff``)
    held: bool = False


#: the front-end's way to bring a waiter's held message forward (T2, the wake): called with
#: the waiter's task id when a release called it; it must not raise
Wake = Callable[[str], None]


def release_slot(job_name: str, slot: Slot | None, wake: Wake | None = None) -> None:
    """Free ``slot`` (None: nothing to free): its run ended, or it does not run after all.
    With ``wake``, on a store that can wake (``can_wake``), the same round trip may call a
    waiter (the earliest turn more than ``WAKE_AFTER`` away, while fewer waiters are on
    their way than slots are free), and ``wake`` brings its message forward. A release
    that cannot reach the store is re-sent until it answers (W4), by the rollback thread,
    for as long as the slot could live (a lease); a re-sent release wakes nobody (the
    waiter comes back for its turn, as planned)."""
    if slot is None:
        return
    try:
        if wake is not None and getattr(slot.store, "can_wake", False):
            answer: Released = slot.store.throttle_release_waking(slot.key, slot.owner,
                                                                  WAKE_AFTER)
            if answer.wake:
                wake(answer.wake)
        else:
            slot.store.throttle_release(slot.key, slot.owner)
    except StoreUnavailable:
        logging.getLogger("dedup_jobs").warning(
            "%s[%s]: could not release its slot of %s; released as soon as the store "
            "answers (it frees within LEASE_SECONDS anyway).",
            job_name, slot.owner, slot.key.key, exc_info=True)
        rollbacks.add(f"the concurrency slot of {slot.key.key} held by task {slot.owner}",
                      lambda: bool(slot.store.throttle_release(slot.key, slot.owner)),
                      store=slot.store, lifetime=app_settings.LEASE_SECONDS)


@contextmanager
def holding(slot: Slot | None, sender: Any, request: Any,
            keep_on: tuple[type[BaseException], ...] = (),
            wake: Wake | None = None) -> Iterator[None]:
    """Run the block holding ``slot`` (None: nothing to hold): renewed by the lease thread
    every third of LEASE_SECONDS (a SIGKILLed worker's slot frees within LEASE_SECONDS),
    released when the block ends, except by a retry (the retry, same task id, keeps it, as
    a unique lock is kept; if the retry does not come back in time its lease runs out): the
    front-end names its retry exceptions in ``keep_on``."""
    if slot is None:
        yield
        return
    keep = False
    lease: Any = None
    try:
        with leases.hold(slot.store, slot.key, slot.owner, app_settings.LEASE_SECONDS,
                         sender=sender, slot_limit=slot.limit, resend=slot.resend) as lease:
            yield
    except keep_on:
        keep = True
        raise
    finally:
        kept = getattr(request, "dedup_slot_kept", None)
        keep = keep or bool(getattr(request, "dedup_handed_over", False) or kept)
        if kept is False:  # a retry whose arguments leave this slot (retry_keeps_slot)
            keep = False
        # W4: a re-sent admission that granted no slot leaves nothing to free
        keep = keep or (lease is not None and lease.granted is False)
        if not keep:
            release_slot(str(getattr(sender, "name", sender)), slot, wake)
