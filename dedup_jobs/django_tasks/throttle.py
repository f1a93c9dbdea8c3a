"""A throttled Django task (K2, T1-T4): at most ``concurrency`` runs of one throttle key at
once, at most ``throttle`` starts of it per second, minute or hour.

The enqueue touches no store (T4: a throttle is decided at admission). Where the worker
decides: :meth:`ThrottledTaskMixin.call` → the engine's
:func:`~dedup_jobs.engine.throttle_admission.admit` → ``store.throttle_admit`` (one store
call). Admitted: the body runs holding its concurrency slot, leased (a killed worker's slot
frees within ``LEASE_SECONDS``) and released at the end. Deferred: the same call is enqueued
again with ``run_after`` set to when the store says a slot or a start is due, and this run
ends with :class:`~dedup_jobs.exceptions.TaskDeferred`, naming the new result (a started task
cannot be put back in the queue); a deferral is never a drop. The call enqueued again carries
its first result's id in the keyword argument :data:`OWNER` (the store plans a waiter's turn
by owner), which the function never sees. The store cannot answer (W7):
the call waits for it the same way, unless ``LIMITS_ON_STORE_ERROR = "run"``."""

from __future__ import annotations

import datetime
from typing import Any

from dedup_jobs.django_tasks import backends, run
from dedup_jobs.django_tasks.options import ThrottleOptions
from dedup_jobs.django_tasks.results import marked
from dedup_jobs.django_tasks.tasks import TaskMixin
from dedup_jobs.engine.message import Message
from dedup_jobs.engine.throttle import call_limits, holding
from dedup_jobs.engine.throttle_admission import admit
from dedup_jobs.exceptions import InvalidJobConfiguration, TaskDeferred

#: the keyword argument a deferred call is enqueued again with: the owner it waits as (the
#: first result's id); taken out before the function is called
OWNER = "_dedup_throttle_owner"


class ThrottledTaskMixin(TaskMixin):
    """The overrides of a throttled task (``dedup``: its options, a dataclass field)."""

    __slots__ = ()
    dedup: ThrottleOptions

    def enqueue(self, *args: Any, **kwargs: Any) -> Any:
        backend = self.get_backend()  # type: ignore[attr-defined]
        if not getattr(backend, "supports_defer", False):
            raise InvalidJobConfiguration(
                f"{self.dedup.label}: throttled on the task backend {self.backend!r} "  # type: ignore[attr-defined]
                f"({backends.class_path(backend)}), which cannot defer a task "
                f"(supports_defer is False): a deferred call could not wait. Use a backend "
                f"that can, e.g. django-tasks-db's DatabaseBackend.")
        # marked like every dedup_jobs enqueue's (a throttle never deduplicates)
        return marked(super().enqueue(*args, **kwargs), deduplicated=False)  # type: ignore[misc]

    def call(self, *args: Any, **kwargs: Any) -> Any:
        started = run.started_result(self)
        owner = kwargs.pop(OWNER, None)  # never the function's
        if started is None:
            return super().call(*args, **kwargs)  # type: ignore[misc]
        options = self.dedup
        store = options.store()
        call_kwargs = {k: v for k, v in started.kwargs.items() if k != OWNER}
        key = options.key(started.args, call_kwargs, store)
        # The first result's id, through every deferral: the store plans a waiter's turn
        # (T2) by its owner, and a new id per deferral would queue behind its own old turns.
        message = Message(name=options.label, sender=self, owner=str(owner or started.id))
        again: list[tuple[str, str]] = []

        def enqueue_again(countdown: float) -> None:
            run_after = (datetime.datetime.now(tz=datetime.UTC)
                         + datetime.timedelta(seconds=countdown))
            later = self.using(run_after=run_after)  # type: ignore[attr-defined]
            result = super(ThrottledTaskMixin, later).enqueue(  # type: ignore[misc]
                *started.args, **call_kwargs, **{OWNER: message.owner})
            again.append((str(result.id), run_after.isoformat()))

        concurrency, rate = call_limits(options.label, options.concurrency, options.throttle,
                                        started.args, call_kwargs)
        if not concurrency and rate is None:  # L1: no limit for this call
            return super().call(*args, **kwargs)  # type: ignore[misc]
        throttled = admit(message, key, store.alias, store, concurrency=concurrency,
                          rate=rate, again=enqueue_again)
        if throttled.waits:
            new_id, run_after = again[-1]
            raise TaskDeferred(options.label, key.key, new_id, run_after)
        with holding(throttled.slot, self, None):
            return super().call(*args, **kwargs)  # type: ignore[misc]
