"""The store protocols: what a store must do for each capability the job kinds use.

A store is a :class:`~dedup_jobs.stores.base.BaseStore` subclass (it brings the deadline,
the metrics timing and the defaults); what it *can* do is the set of protocols below that it
implements. :class:`BaseStore` declares every method, the optional ones raising
``NotImplementedError``, so a method counts as implemented when the class (or a base or
mixin of its own) defines it: :func:`missing` names the ones that are not.

=============  ================================================  =============================
capability     protocol                                          used by
=============  ================================================  =============================
``locks``      :class:`LockStore`                                UniqueJob, UniqueUntilProcessingJob
``replace``    :class:`ReplaceStore`                             ``on_duplicate = "replace"``
``overlap``    :class:`OverlapStore`                             ``without_overlapping = True``
``cancel``     :class:`CancelStore`                              ``on_duplicate = "cancel_running"``
``debounce``   :class:`DebounceStore`                            DebouncedJob
``throttle``   :class:`ThrottleStore`                            ``concurrency`` / ``throttle``
``listing``    :class:`ListingStore`                             the admin, ``clear_stale_locks``
=============  ================================================  =============================

A store of your own is named in ``DEDUP_JOBS["STORES"]`` by dotted path
(:mod:`dedup_jobs.stores.plugged`); the system check E015 says which capability a job needs
that its store lacks (docs/stores.md, "A store of your own").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from dedup_jobs.keys import JobKey
    from dedup_jobs.stores.answers import (
        Acquired,
        Admission,
        Debounced,
        DebounceState,
        Due,
        LockInfo,
        Page,
        Renewed,
        Started,
        ThrottleState,
    )


@runtime_checkable
class LockStore(Protocol):
    """U, P, W: one lock per key, taken at dispatch, checked and leased at the worker."""

    def acquire(self, key: JobKey, owner: str, ttl: float, *, now: float,
                reentrant: bool = False, request: str | None = None) -> Acquired: ...

    def undo(self, key: JobKey, owner: str, request: str | None) -> bool: ...

    def start(self, key: JobKey, owner: str, lease: float, *, now: float, release: bool,
              delivery: str | None = None, redelivered: bool = False) -> Started: ...

    def release(self, key: JobKey, owner: str) -> bool: ...

    def renew(self, key: JobKey, owner: str, ttl: float, *, now: float,
              delivery: str | None = None) -> Renewed: ...

    def get(self, key: JobKey) -> LockInfo | None: ...


@runtime_checkable
class ReplaceStore(Protocol):
    """R1: a dispatch takes the lock over from a queued holder."""

    def take_over(self, key: JobKey, owner: str, ttl: float, *, now: float,
                  request: str | None = None) -> Acquired: ...


@runtime_checkable
class OverlapStore(Protocol):
    """R2: the until-processing check that keeps runs of one key from overlapping."""

    def start_exclusive(self, key: JobKey, running: JobKey, owner: str, lease: float, *,
                        now: float, delivery: str | None = None) -> Started: ...


@runtime_checkable
class CancelStore(Protocol):
    """L2: a dispatch takes the lock (over) and asks the key's running copy to stop."""

    def cancel_take(self, key: JobKey, running: JobKey, owner: str, ttl: float, *,
                    now: float, request: str | None = None) -> Acquired: ...

    def undo_cancel(self, key: JobKey, running: JobKey, owner: str,
                    request: str | None) -> bool: ...


@runtime_checkable
class DebounceStore(Protocol):
    """D: one burst per key, one message per burst, the latest arguments run."""

    def debounce(self, key: JobKey, task_id: str, payload: str, *, now: float,
                 debounce_for: float, max_wait: float | None, ttl: float) -> Debounced: ...

    def claim_due(self, key: JobKey, message_id: str, *, now: float) -> Due: ...

    def withdraw(self, key: JobKey, task_id: str) -> bool: ...

    def get_debounce(self, key: JobKey) -> DebounceState | None: ...


@runtime_checkable
class ThrottleStore(Protocol):
    """T: concurrency slots and rate windows, one atomic round trip per admission."""

    def throttle_admit(self, key: JobKey, owner: str, *, delivery: str, concurrency: int,
                       rate_limit: int, rate_period: float, lease: float) -> Admission: ...

    def throttle_release(self, key: JobKey, owner: str) -> bool: ...

    def throttle_renew(self, key: JobKey, owner: str, ttl: float, *,
                       limit: int) -> Renewed: ...

    def throttle_page(self, *, offset: int, limit: int, task_name: str = "",
                      search: str = "", now: float) -> Page[ThrottleState]: ...


@runtime_checkable
class ListingStore(Protocol):
    """A1/A2: what the admin pages and ``clear_stale_locks`` read and remove."""

    def iter_locks(self, *, batch_size: int = 500) -> Iterator[LockInfo]: ...

    def lock_page(self, *, offset: int, limit: int, task_name: str = "", search: str = "",
                  now: float) -> Page[LockInfo]: ...

    def release_queued(self, key: JobKey, owner: str) -> bool: ...

    def iter_debounces(self, *, batch_size: int = 500) -> Iterator[DebounceState]: ...

    def debounce_page(self, *, offset: int, limit: int, task_name: str = "",
                      search: str = "", now: float) -> Page[DebounceState]: ...


#: capability -> its protocol
CAPABILITIES: dict[str, type] = {
    "locks": LockStore,
    "replace": ReplaceStore,
    "overlap": OverlapStore,
    "cancel": CancelStore,
    "debounce": DebounceStore,
    "throttle": ThrottleStore,
    "listing": ListingStore,
}


def methods(capability: str) -> tuple[str, ...]:
    """The methods of ``capability``'s protocol, in declaration order."""
    protocol = CAPABILITIES[capability]
    return tuple(name for name in vars(protocol)
                 if not name.startswith("_") and callable(vars(protocol)[name]))


#: the methods BaseStore declares with a default that raises NotImplementedError (the others
#: are abstract, or have a default that works: ``undo`` releases the owner's lock)
OPTIONAL = frozenset({
    "take_over", "start_exclusive", "cancel_take", "undo_cancel", "throttle_admit",
    "throttle_release", "throttle_renew", "throttle_page", "iter_locks", "lock_page",
    "release_queued", "withdraw", "iter_debounces", "debounce_page",
})


def missing(cls: type, capability: str) -> list[str]:
    """The methods of ``capability`` that ``cls`` does not implement: absent, abstract, or
    :class:`~dedup_jobs.stores.base.BaseStore`'s own default that raises
    ``NotImplementedError``. An empty list: ``cls`` has the capability."""
    from dedup_jobs.stores.base import BaseStore

    absent = []
    for name in methods(capability):
        method = getattr(cls, name, None)
        if (method is None or not callable(method)
                or getattr(method, "__isabstractmethod__", False)
                or (name in OPTIONAL
                    and _unwrapped(method) is _unwrapped(getattr(BaseStore, name)))):
            absent.append(name)
    return absent


def supports(cls: type, capability: str) -> bool:
    """``cls`` implements every method of ``capability``'s protocol."""
    return not missing(cls, capability)


def _unwrapped(method: object) -> object:
    """The function under the metrics timing wrapper (BaseStore.__init_subclass__)."""
    while hasattr(method, "__wrapped__"):
        method = method.__wrapped__
    return method
