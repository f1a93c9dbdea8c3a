"""Celery signal handlers: release the lock of a message the worker drops without running it."""

from __future__ import annotations

from typing import Any

from celery.signals import task_revoked, worker_process_shutdown

from dedup_jobs.jobs.base import HEADER, DedupJob


def _message_header(request: Any) -> Any:
    """The dedup header of a dropped message. Sent by the worker's main process with the
    message's Context, whose attributes include the message headers."""
    message_headers = getattr(request, "request_dict", None) or {}
    return (
        (message_headers.get("headers") or {}).get(HEADER)
        or message_headers.get(HEADER)
        or getattr(request, HEADER, None)
        or (getattr(request, "headers", None) or {}).get(HEADER)
    )


def _revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    """U4: a revoked, expired or terminated message releases its own lock (compare-and-delete
    by its task id); a debounced burst whose message is revoked is cancelled (its state
    goes)."""
    task = getattr(request, "task", None)
    if not isinstance(task, DedupJob):
        task = sender  # a discarded message's Context names its task, the sender is it
    if not isinstance(task, DedupJob) or request is None or not request.id:
        return
    from dedup_jobs.jobs.debounced import DebouncedJob
    from dedup_jobs.jobs.unique import UniqueJob

    header = _message_header(request)
    if isinstance(task, DebouncedJob):
        if isinstance(header, dict):
            task.cancel_burst(request.id, header, getattr(request, "chain", None))
        return
    if isinstance(task, UniqueJob):
        task.release_dropped(
            request.id, header, getattr(request, "args", None), getattr(request, "kwargs", None),
            ran=bool(kwargs.get("terminated")),  # revoked or expired before it ran: not run
        )


def _process_shutdown(**kwargs: Any) -> None:
    """A prefork child leaves through ``os._exit`` (no atexit): flush its metrics first."""
    from dedup_jobs.metrics.history import flush_at_exit

    flush_at_exit()


def connect() -> None:
    task_revoked.connect(_revoked, weak=False, dispatch_uid="dedup_jobs.revoked")
    worker_process_shutdown.connect(_process_shutdown, weak=False,
                                    dispatch_uid="dedup_jobs.metrics.flush")
