"""A unique Django task: a dataclass subclass of the task's own class (so it is still a
``Task`` of its framework and backend, K1) whose ``enqueue``, ``aenqueue`` and ``call`` go
through the decisions. Made once per task class (:func:`unique_class`); ``using()`` keeps the
options (they are a field); a pickled task is rebuilt from its module path."""

from __future__ import annotations

import datetime
from dataclasses import field, fields
from typing import Any

from asgiref.sync import sync_to_async

from dedup_jobs.django_tasks import backends, compat, enqueue, run
from dedup_jobs.django_tasks.options import UniqueOptions
from dedup_jobs.django_tasks.results import holder_result, marked
from dedup_jobs.exceptions import DuplicateJob, InvalidJobConfiguration

#: the options ``using()`` may change, which a pickled task carries
USING = ("priority", "queue_name", "run_after", "backend")


class TaskMixin:
    """What every dedup_jobs task class overrides alike."""

    __slots__ = ()

    async def aenqueue(self, *args: Any, **kwargs: Any) -> Any:
        # The decision is made in the thread that enqueues (the receiver reads it there).
        return await sync_to_async(self.enqueue)(*args, **kwargs)  # type: ignore[attr-defined]

    def __reduce__(self) -> Any:
        """Pickled, a task is rebuilt from its module path and its ``using()`` changes."""
        changes = {name: getattr(self, name) for name in USING}
        return (_rebuild, (self.module_path, changes))  # type: ignore[attr-defined]


class UniqueTaskMixin(TaskMixin):
    """The overrides of a unique task (``dedup``: its options, a dataclass field)."""

    __slots__ = ()
    dedup: UniqueOptions

    def enqueue(self, *args: Any, **kwargs: Any) -> Any:
        """Enqueue unless another result holds the key: then the holder's result, marked
        ``deduplicated`` (``on_duplicate="raise"``: DuplicateJob)."""
        options = self.dedup
        store = options.store()
        normalized_args, normalized_kwargs = compat.normalize(self, args, kwargs)
        key = options.key(normalized_args, normalized_kwargs, store)
        decision = enqueue.Decision(task=self, label=options.label, key=key, store=store,
                                    ttl=options.lock_ttl(normalized_args, normalized_kwargs)
                                    + _wait(self))
        backend = self.get_backend()  # type: ignore[attr-defined]
        try:
            with enqueue.deciding(decision), enqueue.atomic_for(backend):
                result = super().enqueue(*args, **kwargs)  # type: ignore[misc]
        except enqueue.Refused as refused:
            if decision.owner is not None:
                backends.discard(backend, decision.owner)
            decision.duplicate(refused.holder)
            if options.on_duplicate == "raise":
                raise DuplicateJob(options.label, key.key, refused.holder) from None
            return marked(holder_result(self, refused.holder), deduplicated=True)
        except BaseException:
            # U6/S4: no lock without its task, and no task queued for an enqueue that
            # raised (django-tasks-rq queues the job before task_enqueued; a row of
            # django-tasks-db is rolled back with the transaction)
            if decision.owner is not None:
                backends.discard(backend, decision.owner)
            decision.release()
            raise
        decision.done()
        return marked(result, deduplicated=False)

    def call(self, *args: Any, **kwargs: Any) -> Any:
        started = run.started_result(self)
        if started is None:
            return super().call(*args, **kwargs)  # type: ignore[misc]
        return run.run_checked(self, self.dedup, started,
                               lambda: super(UniqueTaskMixin, self).call(  # type: ignore[misc]
                                   *args, **kwargs))



def _rebuild(module_path: str, changes: dict[str, Any]) -> Any:
    from django.utils.module_loading import import_string

    return import_string(module_path).using(**changes)


def _wait(task: Any) -> float:
    """Seconds until a deferred task (``run_after``) may run: its lock lives that much
    longer."""
    run_after = getattr(task, "run_after", None)
    if run_after is None:
        return 0.0
    now = datetime.datetime.now(tz=run_after.tzinfo or None)
    return max(0.0, float((run_after - now).total_seconds()))


#: every unique task made in this process (the system checks read it)
made: list[Any] = []


def unique_class(task_class: type, mixin: type = UniqueTaskMixin) -> type:
    """``task_class`` with the overrides of ``mixin`` and a ``dedup`` field."""
    return compat.extended(task_class, "dedup", object, field(kw_only=True),
                           mixins=(mixin,), module=__name__)


def wrap(task: Any, options: Any, mixin: type = UniqueTaskMixin) -> Any:
    """The unique (or, with another ``mixin``, debounced) form of ``task``."""
    if hasattr(task, "dedup"):
        raise InvalidJobConfiguration(
            f"{options.label}: the task has a dedup_jobs decorator already; use one.")
    values = {f.name: getattr(task, f.name) for f in fields(task) if f.init}
    wrapped = unique_class(type(task), mixin)(**values, dedup=options)
    made.append(wrapped)
    return wrapped
