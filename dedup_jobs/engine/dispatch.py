"""Where a unique kind's dispatch takes its lock (U1, R1, L2, S7): one store call,
``store.acquire`` (``store.take_over`` under ``on_duplicate = "replace"``,
``store.cancel_take`` under ``"cancel_running"``), and what its answer means: publish, or
deduplicate onto the holder.

The front-end (``jobs/unique.py`` ``apply_async``) makes the :class:`Dispatch`, asks it, and
acts on the answer: it publishes, returns the holder's result, raises ``DuplicateJob``, tells
a replaced holder (``jobs/replace.py``), or, when the store cannot answer, undoes what this
very request may have done (``engine/rollback.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import AcquireCall, Acquired, BaseStore, new_request_id, running_key


@dataclass(frozen=True, kw_only=True)
class Dispatched:
    """The answer of a dispatch's lock call."""

    publish: bool  # the lock is the caller's: its message is published
    holder: str  # the owner holding the lock now (the caller's own id when publish)
    replaced: str | None = None  # R1: the queued holder the caller took the lock over from
    cancelled: str | None = None  # L2: the running copy the caller asked to stop
    #: False: published without a lock (the store could not answer, ON_STORE_ERROR="enqueue")
    locked: bool = True


@dataclass(frozen=True, kw_only=True)
class Dispatch:
    """One dispatch of ``task_id`` under ``key``. Its ``request`` id makes a re-send of the
    call known to the store (S7): a generated task id is its own request id (a re-send of it
    answers "taken"); an explicit id, which another dispatch may carry too, gets a fresh one,
    so that dispatch is a duplicate and an undo touches only what this request did."""

    key: JobKey
    task_id: str
    ttl: float  # seconds the lock lives (unique_for, plus the message's countdown or eta)
    generated: bool  # the task id was generated for this dispatch
    replace: bool  # R1: take the lock over from a queued holder
    #: L2: also ask the key's running copy to stop (its lock is released at start, and the
    #: run holds the running marker: the dispatch takes the lock as ``replace`` does)
    cancel: bool = False
    request: str = field(default="")

    def __post_init__(self) -> None:
        if not self.request:
            object.__setattr__(self, "request",
                               self.task_id if self.generated else new_request_id())

    def ask(self, store: BaseStore, *, now: float) -> Dispatched:
        """The one store call; StoreUnavailable when it cannot answer (never sent, its reply
        lost or late): the caller undoes ``request`` or publishes without a lock."""
        if self.cancel:
            answer = store.cancel_take(self.key, running_key(self.key), self.task_id,
                                       self.ttl, now=now, request=self.request)
        elif self.replace:
            answer = store.take_over(self.key, self.task_id, self.ttl, now=now,
                                     request=self.request)
        else:
            answer = store.acquire(self.key, self.task_id, self.ttl, now=now,
                                   request=self.request)
        return self.read(answer)

    def read(self, answer: Acquired) -> Dispatched:
        """What the store's answer to this dispatch means."""
        # A freshly generated id held already means this very call ran twice (the client
        # re-sent it after a lost reply): the lock is ours. (The Redis family answers such a
        # re-send "taken" itself, by the request id, for any id.)
        mine = answer.acquired or (self.generated and answer.holder == self.task_id)
        return Dispatched(publish=mine, holder=answer.holder,
                          replaced=answer.replaced if mine else None,
                          cancelled=answer.cancelled if mine else None)


def ask_many(dispatches: Sequence[Dispatch], store: BaseStore, *, now: float) -> list[Dispatched]:
    """L3: the lock calls of a batch of plain dispatches (neither ``replace`` nor ``cancel``)
    in one store call, ``store.acquire_many`` (one round trip where the store can), answered
    in order; a later dispatch of a key an earlier one took is its duplicate. StoreUnavailable
    as :meth:`Dispatch.ask`, for the whole batch: the caller undoes every request of it."""
    calls = [AcquireCall(key=d.key, owner=d.task_id, ttl=d.ttl, request=d.request)
             for d in dispatches]
    # a plugged store that is no BaseStore may lack acquire_many: BaseStore's, one by one
    many = getattr(store, "acquire_many", None)
    answers = (many(calls, now=now) if many is not None
               else BaseStore.acquire_many(store, calls, now=now))
    return [d.read(a) for d, a in zip(dispatches, answers, strict=True)]
