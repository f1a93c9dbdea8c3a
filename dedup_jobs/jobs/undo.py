"""S7: where the lock of a UniqueJob dispatch that failed (StoreUnavailable, maybe after its
call ran and only the reply was lost) is undone, once the store answers again: handed to the
rollback thread (``engine/rollback.py``), and the never-published task marked REVOKED."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dedup_jobs.engine.dispatch import Dispatch
from dedup_jobs.engine.rollback import rollbacks
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import BaseStore, running_key

if TYPE_CHECKING:
    from dedup_jobs.stores.redis.fused import FusedCall


def undo_lock(
    job: Any, store: BaseStore, key: JobKey, owner: str, ttl: float, *,
    request: str | None = None, generated: bool = True, cancel: bool = False,
) -> None:
    """S7: the dispatch ``request`` of ``owner`` failed with StoreUnavailable, maybe after its
    call ran (a lost reply): once the store answers, undo what that very request did
    (``store.undo``: its lock deleted, or a taken-over lock given back to the holder it
    replaced, R1) and mark ``owner`` REVOKED, so a caller deduplicated onto it meanwhile gets
    an answer. A generated id is marked even if the lock is gone (flushed, expired) or the
    store never answers within ``ttl``; an explicit one, which another, published dispatch
    may carry too, only when this request's own lock was found. ``cancel`` (L2): the
    request to stop that the dispatch may have left on the key's running copy is withdrawn
    too (``store.undo_cancel``)."""
    def revoke() -> None:
        if not job.ignore_result:
            job.backend.mark_as_revoked(
                owner, reason=f"never published: its dispatch failed (store {store.alias!r} "
                              f"unavailable)")

    def undo() -> bool:
        removed = (store.undo_cancel(key, running_key(key), owner, request) if cancel
                   else store.undo(key, owner, request))
        if removed or generated:
            revoke()
        return removed

    rollbacks.add(f"lock {key.key} of never-published task {owner}", undo, store=store,
                  lifetime=ttl, give_up=revoke if generated else None)


def release_unpublished(job: Any, store: BaseStore, dispatch: Dispatch) -> None:
    """U6: the publish of ``dispatch`` failed after its lock was taken: the lock is released
    (a replaced holder stays revoked, R1; L2: the request to stop is withdrawn) and the id,
    never published, is marked REVOKED as :func:`undo_lock` marks one, so that a caller
    deduplicated onto it meanwhile gets an answer. If the store cannot answer now, the
    rollback thread does both (:func:`undo_lock`)."""
    key, owner = dispatch.key, dispatch.task_id
    try:
        released = store.release(key, owner)
        if dispatch.cancel:  # the request to stop withdrawn (nothing else to undo)
            store.undo_cancel(key, running_key(key), owner, dispatch.request)
    except StoreUnavailable:
        undo_lock(job, store, key, owner, dispatch.ttl, request=dispatch.request,
                  generated=dispatch.generated, cancel=dispatch.cancel)
        return
    if (released or dispatch.generated) and not job.ignore_result:
        job.backend.mark_as_revoked(owner, reason="never published: the broker refused its "
                                                  "message")


def undo_fused(job: Any, store: Any, call: FusedCall, *, revoke: bool) -> None:
    """S7: a fused dispatch (``jobs/fused.py``) failed with StoreUnavailable, maybe after its
    script ran: once the store answers, its message is taken back off the queue if no worker
    has it yet, and then its lock (``store.undo_fused``); only then is its id marked REVOKED
    (``revoke``: not when the caller published it again without a lock, ON_STORE_ERROR =
    "enqueue"), so a caller deduplicated onto it meanwhile gets an answer. A message a worker
    has taken runs, with its lock, and its result answers those callers."""
    def undo() -> bool:
        removed = bool(store.undo_fused(call))
        if removed and revoke and not job.ignore_result:
            job.backend.mark_as_revoked(
                call.owner, reason=f"never published: its dispatch failed (store "
                                   f"{store.alias!r} unavailable)")
        return removed

    rollbacks.add(f"fused message and lock {call.key.key} of task {call.owner}", undo,
                  store=store, lifetime=call.ttl)
