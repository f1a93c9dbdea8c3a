"""A debounced Django task (K2, D1-D3): a burst of enqueues of one key is enqueued once, with
``run_after`` (``debounce_for`` later), and runs once, with the last enqueue's arguments, no
later than ``max_wait`` after the burst's first enqueue.

Where an enqueue is decided: :meth:`DebouncedTaskMixin.enqueue` → the framework's
``task_enqueued`` (``enqueue.on_enqueued``) → :meth:`Burst.take` → ``store.debounce`` (one
store call, with the result id). The first enqueue of a burst keeps its task (row, job): the
burst's one message. A later one is absorbed (its arguments become the burst's) and its own
task is taken back in the same transaction (django-tasks-db) or deleted (django-tasks-rq);
it returns the burst's ``TaskResult``, marked ``deduplicated``: every enqueue of the burst
holds the one result that finishes when the burst runs.

Where the worker decides: :meth:`DebouncedTaskMixin.call` → :func:`run_burst` →
``store.claim_due`` (one store call). Due: the burst is claimed (a later enqueue starts a new
one) and runs with its latest arguments. Not due yet (a later enqueue moved it): the worker
waits until it is, since a started task cannot be put back in the queue. The store cannot
answer: asked again a few times, then the task runs with its own arguments (never dropped).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dedup_jobs import clock, metrics
from dedup_jobs.conf import app_settings
from dedup_jobs.django_tasks import backends, compat, enqueue, run
from dedup_jobs.django_tasks.options import DebounceOptions
from dedup_jobs.django_tasks.results import holder_result, marked
from dedup_jobs.django_tasks.tasks import TaskMixin
from dedup_jobs.engine import debounce
from dedup_jobs.engine.limits import seconds_at_worker
from dedup_jobs.engine.rollback import rollbacks
from dedup_jobs.exceptions import InvalidJobConfiguration, StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import job_debounced, notify
from dedup_jobs.stores.answers import ADOPTED, CLAIMED, STATE_GRACE, WAIT, encode_call
from dedup_jobs.stores.base import BaseStore

#: a claim that cannot reach the store is tried this often, this many seconds apart, before
#: the task runs with its own arguments (W4: the claim is idempotent, S7)
CLAIM_TRIES = 3
CLAIM_RETRY_SECONDS = 1.0


@dataclass(kw_only=True)
class Burst:
    """One enqueue of a debounced task: its key, and what the store answered."""

    task: Any
    label: str
    key: JobKey
    store: BaseStore
    payload: str
    options: DebounceOptions
    owner: str | None = None
    started: bool = False  # this enqueue's task is the burst's message
    absorbed_into: str | None = None  # the burst's message, when absorbed
    debounce_for: float = 0.0  # this call's (L1)
    max_wait: float | None = None

    def take(self, owner: str) -> None:
        """The one store call (``enqueue.on_enqueued``); raises StoreUnavailable."""
        self.owner = owner
        try:
            answer = self.store.debounce(
                self.key, owner, self.payload, now=clock.now(),
                debounce_for=self.debounce_for, max_wait=self.max_wait,
                ttl=STATE_GRACE)
        except StoreUnavailable:
            if app_settings.ON_STORE_ERROR == "enqueue":
                enqueue.logger.warning(
                    "%s[%s]: store %r unavailable, enqueued without debouncing "
                    "(ON_STORE_ERROR='enqueue').", self.label, owner, self.store.alias,
                    exc_info=True)
                return
            self.undo()
            raise
        if answer.superseded:
            metrics.decision(self.label, "superseded", self.key.key)
            notify(job_debounced, self.task, debounce_id=self.key.ident,
                   superseded_id=answer.superseded, by_id=owner, key=self.key.key)
        if answer.new:
            self.started = True
        else:
            self.absorbed_into = answer.message_id

    def undo(self) -> None:
        """S7 (and a failed enqueue): take back the burst this enqueue started, or withdraw
        it from the one it was absorbed into, once the store answers."""
        rollbacks.add(f"debounce burst {self.key.key} of never-enqueued task {self.owner}",
                      self._take_back, store=self.store, lifetime=STATE_GRACE)

    def abandon(self) -> None:
        """The enqueue failed after the store answered: take its trace back now (the
        caller's next enqueue sees the burst as it was), or once the store answers."""
        try:
            self._take_back()
        except StoreUnavailable:
            self.undo()

    def _take_back(self) -> bool:
        store, key, owner = self.store, self.key, self.owner
        assert owner is not None
        return debounce.take(store, key, owner) is not None or store.withdraw(key, owner)


class DebouncedTaskMixin(TaskMixin):
    """The overrides of a debounced task (``dedup``: its options, a dataclass field)."""

    __slots__ = ()
    dedup: DebounceOptions

    def enqueue(self, *args: Any, **kwargs: Any) -> Any:
        options = self.dedup
        backend = self.get_backend()  # type: ignore[attr-defined]
        problem = backends.debounce_problem(backend)
        if problem:
            raise InvalidJobConfiguration(
                f"{options.label}: debounced on the task backend "
                f"{self.backend!r} ({backends.class_path(backend)}), which {problem}. "  # type: ignore[attr-defined]
                f"Use django-tasks-db's DatabaseBackend or django-tasks-rq's RQBackend.")
        store = options.store()
        normalized_args, normalized_kwargs = compat.normalize(self, args, kwargs)
        quiet, cap = options.times(normalized_args, normalized_kwargs)
        if quiet is None:  # L1: no debounce for this call (its worker finds no burst: runs)
            result = super().enqueue(*args, **kwargs)  # type: ignore[misc]
            metrics.decision(options.label, "dispatched")
            return marked(result, deduplicated=False)
        burst = Burst(task=self, label=options.label, options=options, store=store,
                      key=options.key(normalized_args, normalized_kwargs, store),
                      payload=encode_call(normalized_args, normalized_kwargs),
                      debounce_for=quiet, max_wait=cap)
        run_after = (datetime.datetime.now(tz=datetime.UTC)
                     + datetime.timedelta(seconds=quiet))
        deferred = self.using(run_after=run_after)  # type: ignore[attr-defined]
        try:
            with enqueue.deciding(burst), enqueue.atomic_for(backend):  # type: ignore[arg-type]
                result = super(DebouncedTaskMixin, deferred).enqueue(  # type: ignore[misc]
                    *args, **kwargs)
                if burst.absorbed_into is not None and burst.owner is not None:
                    backends.discard(backend, burst.owner, atomic=True)
        except BaseException:
            # S4/S7: an enqueue that raised leaves no task queued (django-tasks-rq queues
            # the job before task_enqueued) and no trace in the burst: neither the burst it
            # started nor, absorbed, its arguments as the burst's latest
            if burst.owner is not None:
                backends.discard(backend, burst.owner)
            if burst.started or burst.absorbed_into is not None:
                burst.abandon()
            raise
        metrics.decision(options.label, "dispatched")
        if burst.absorbed_into is not None:
            return marked(holder_result(self, burst.absorbed_into), deduplicated=True)
        return marked(result, deduplicated=False)

    def call(self, *args: Any, **kwargs: Any) -> Any:
        started = run.started_result(self)
        if started is None:
            return super().call(*args, **kwargs)  # type: ignore[misc]
        context = args[:1] if self.takes_context else ()  # type: ignore[attr-defined]
        base = super()

        def runner(call_args: Any, call_kwargs: dict[str, Any]) -> Any:
            return base.call(*context, *call_args, **call_kwargs)  # type: ignore[attr-defined]

        return run_burst(self.dedup, started, runner)


def run_burst(options: DebounceOptions, result: Any,
              runner: Callable[[Any, dict[str, Any]], Any]) -> Any:
    """The burst of ``result`` (its message) at the worker: claimed and run with the latest
    arguments when due; waited for until then."""
    owner = str(result.id)
    try:
        store = options.store()
        key = options.key(result.args, result.kwargs, store)
    except Exception:
        # W4/D7: a task enqueued around the decorator whose key cannot be computed runs
        enqueue.logger.warning("%s[%s]: no debounce key could be computed; running with "
                               "this task's own arguments.", options.label, owner,
                               exc_info=True)
        return runner(result.args, result.kwargs)
    # the longest wait between two looks at a burst that is not due yet
    nap = seconds_at_worker(options.label, "debounce_for", options.debounce_for, result.args,
                            result.kwargs, 1.0)
    tries = 0
    while True:
        try:
            due = store.claim_due(key, owner, now=clock.now())
        except StoreUnavailable:
            tries += 1
            if tries >= CLAIM_TRIES:
                enqueue.logger.warning(
                    "%s[%s]: store %r unavailable at the claim; running with this task's "
                    "own arguments.", options.label, owner, store.alias, exc_info=True)
                return runner(result.args, result.kwargs)
            time.sleep(CLAIM_RETRY_SECONDS)
            continue
        if due.action == WAIT:
            time.sleep(max(0.0, min(float(due.wait_until or 0) - clock.now(),
                                    nap)))
            continue
        if due.action == CLAIMED:
            metrics.decision(options.label, "ran", key.key)
            return runner(list(due.args), dict(due.kwargs))
        if due.action == ADOPTED:
            enqueue.logger.info("%s[%s]: a newer burst adopted this stale one; it runs "
                                "there.", options.label, owner)
            return None
        # MISSING (flushed, evicted, expired) or OTHER (a newer burst): run as it is
        return runner(result.args, result.kwargs)
