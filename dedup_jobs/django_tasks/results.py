"""What a unique task's ``enqueue`` returns: the framework's ``TaskResult`` (the backend's own
subclass, with everything it carries), marked ``deduplicated``: False for the enqueue that
took the lock, True for the holder's result returned to a duplicate (K1)."""

from __future__ import annotations

from dataclasses import field, fields
from typing import Any

from dedup_jobs.django_tasks import compat


def marked(result: Any, *, deduplicated: bool) -> Any:
    """A copy of ``result`` marked ``deduplicated``."""
    values = {f.name: getattr(result, f.name) for f in fields(result) if f.init}
    copy = compat.extended(type(result), "deduplicated", bool, field(default=False))(
        **values, deduplicated=deduplicated)
    for f in fields(result):
        if not f.init:  # _return_value and the like
            object.__setattr__(copy, f.name, getattr(result, f.name))
    return copy


def holder_result(task: Any, holder: str) -> Any:
    """The holder's ``TaskResult``: read from the backend when it keeps results, else one
    that names it (status READY: what a duplicate knows of it)."""
    backend = task.get_backend()
    if getattr(backend, "supports_get_result", False):
        try:
            return backend.get_result(holder)
        except compat.result_missing(task):
            pass  # finished and cleaned up meanwhile, or an ImmediateBackend-like backend
    base = compat.base_of(compat.package_of(task))
    return base.TaskResult(
        task=task, id=holder, status=compat.result_status(task).READY, enqueued_at=None,
        started_at=None, finished_at=None, last_attempted_at=None, args=[], kwargs={},
        backend=task.backend, errors=[], worker_ids=[])
