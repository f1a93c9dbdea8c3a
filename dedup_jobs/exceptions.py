"""Exceptions raised by dedup_jobs. All share :class:`DedupError`, except
:class:`InvalidJobConfiguration`, which is Django's ``ImproperlyConfigured`` as well."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured


class DedupError(Exception):
    """Base class of every dedup_jobs error."""


class StoreUnavailable(DedupError):
    """The lock store could not be reached; nothing was published and nothing locked."""

    def __init__(self, store: str, error: BaseException | str) -> None:
        self.store = store
        self.error = error
        #: L3: the answers a batch's calls got before this failure (the first ones, in order)
        self.answered: list[Any] = []
        # the class names what the client library parsed off the reply (ReadOnlyError for
        # READONLY, MovedError for MOVED, BusyLoadingError for LOADING)
        said = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        super().__init__(
            f"dedup_jobs store {store!r} is unavailable ({said}). Nothing was published. "
            f"Check the connection of that store, or set DEDUP_JOBS['ON_STORE_ERROR'] = 'enqueue' "
            f"to publish without a lock while the store is down."
        )


class DuplicateJob(DedupError):
    """Raised by a dispatch of a job with ``on_duplicate = "raise"`` while its lock is held."""

    def __init__(self, task_name: str, key: str, holder_id: str) -> None:
        self.task_name = task_name
        self.key = key
        self.holder_id = holder_id
        super().__init__(
            f"{task_name}: a copy with the same unique id is already queued or running "
            f"(lock {key!r} held by task {holder_id}). Nothing was published."
        )


class InvalidJobConfiguration(DedupError, ImproperlyConfigured):
    """A job class has options that cannot work; raised when the class is created."""


class InvalidJobId(DedupError, ValueError):
    """A dispatch's id (from ``unique_id()``/``debounce_id()``/``throttle_id()`` or the default
    key built from the arguments) that its store cannot hold, or a hook's value that is not a
    ``str`` or an ``int``: raised before any store call, so nothing is locked and nothing is
    published, whatever ``ON_STORE_ERROR`` says (SPEC A4)."""

    def __init__(self, task_name: str, source: str, ident: object, problem: str) -> None:
        self.task_name = task_name
        self.source = source
        self.ident = ident  # a str, or what an id hook returned instead of one
        shown = repr(ident)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        if not isinstance(ident, str):
            shown += f" ({type(ident).__name__})"
        super().__init__(
            f"{task_name}: {source} gave the id {shown}, which {problem} "
            f"Nothing was locked or published."
        )


class TaskDeferred(DedupError):
    """Ends the run of a throttled Django task that its limit deferred (T2/T3): the same call
    was enqueued again, as ``new_id``, to start at ``run_after``. The deferred result is
    FAILED with this error, naming the result that carries the call on."""

    def __init__(self, task_name: str, key: str, new_id: str, run_after: str) -> None:
        self.task_name = task_name
        self.key = key
        self.new_id = new_id
        super().__init__(
            f"{task_name}: {key!r} could not start now (its concurrency or throttle limit "
            f"was reached, or the store did not answer); the call was enqueued again as task "
            f"{new_id}, to start at {run_after}. Nothing was lost: follow that result.")
