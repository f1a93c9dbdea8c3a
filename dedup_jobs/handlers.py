"""Celery signal handlers: release the lock of a message the worker drops without running."""

from __future__ import annotations

from typing import Any

from celery.signals import task_revoked

from dedup_jobs.jobs.base import HEADER, DedupJob, logger


def _revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    """U4: a revoked (or expired) message releases its own lock, compare-and-delete; a
    debounced burst whose message is revoked is cancelled (its state goes)."""
    task = getattr(request, "task", None)
    if not isinstance(task, DedupJob):
        task = sender  # a discarded message's Context names its task, the sender is it
    if not isinstance(task, DedupJob) or request is None:
        return
    from dedup_jobs.jobs.debounced import DebouncedJob
    from dedup_jobs.jobs.unique import UniqueJob
    from dedup_jobs.signals import lock_released

    message_headers = getattr(request, "request_dict", None) or {}
    header = (
        (message_headers.get("headers") or {}).get(HEADER)
        or message_headers.get(HEADER)
        # A message discarded on arrival (revoked, expired) comes with its Context, which
        # carries the message headers as attributes.
        or getattr(request, HEADER, None)
        or (getattr(request, "headers", None) or {}).get(HEADER)
    )
    if not isinstance(header, dict):
        return
    if isinstance(task, DebouncedJob):
        task.cancel_burst(request.id, header)
        return
    if not isinstance(task, UniqueJob):
        return
    key = task.key_from_header(header)
    try:
        if task.store(str(header["via"])).release(key, request.id):
            lock_released.send(sender=type(task), key=key.key, owner=request.id,
                               store=str(header["via"]), reason="failure")
    except Exception:
        logger.warning("Could not release %s of revoked task %s", key.key, request.id,
                       exc_info=True)


def connect() -> None:
    task_revoked.connect(_revoked, weak=False, dispatch_uid="dedup_jobs.revoked")
