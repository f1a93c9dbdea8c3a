"""Where a unique Django task's ``enqueue`` takes its lock (K2, U1, S7): one store call, the
engine's :class:`~dedup_jobs.engine.dispatch.Dispatch`, with the backend's result id as owner.

The result id exists only once the backend has made the result, so the lock is taken in the
framework's ``task_enqueued`` signal, which every backend sends right after (django-tasks-db:
after the row's INSERT; ImmediateBackend: before it runs the task). The task's ``enqueue``
(``tasks.py``) opens a :class:`Decision` for the call; the signal's receiver
(:func:`on_enqueued`) asks the store. A duplicate, or a store that cannot answer, raises out
of the backend's ``enqueue``:

- django-tasks-db's ``DatabaseBackend``: ``enqueue`` runs inside one ``transaction.atomic`` on
  the database of the task rows (:func:`atomic_for`), so the raise rolls the row back. With
  the database store on that same database the lock is written in that same transaction:
  a failure anywhere leaves neither (K, "atomic enqueue"), nothing to heal.
- ImmediateBackend: the signal comes before the task runs; the raise stops it.

A lock whose enqueue then fails (the commit, a later receiver) is released (U6); a call whose
reply was lost is undone by its request id once the store answers (S7,
``engine/rollback.py``)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dedup_jobs import clock, metrics
from dedup_jobs.conf import app_settings
from dedup_jobs.engine.dispatch import Dispatch
from dedup_jobs.engine.rollback import rollbacks
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import lock_acquired, lock_released, notify, unique_job_skipped
from dedup_jobs.stores.base import BaseStore

logger = logging.getLogger("dedup_jobs")

_local = threading.local()

TAKEN = "taken"  # the lock is the enqueue's
UNLOCKED = "unlocked"  # the store could not answer; enqueued without a lock (ON_STORE_ERROR)


class Refused(Exception):
    """Raised out of the backend's ``enqueue``: another owner holds the lock."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


@dataclass(kw_only=True)
class Decision:
    """One ``enqueue`` of a unique task: its key, and what the store answered."""

    task: Any  # the task being enqueued: the sender of every signal about it
    label: str
    key: JobKey
    store: BaseStore
    ttl: float
    owner: str | None = None  # the result id, once the backend made it
    outcome: str = ""
    request: str = ""

    def take(self, owner: str) -> None:
        """The one store call; raises Refused or StoreUnavailable."""
        self.owner = owner
        dispatch = Dispatch(key=self.key, task_id=owner, ttl=self.ttl, generated=True,
                            replace=False)
        self.request = dispatch.request
        try:
            answer = dispatch.ask(self.store, now=clock.now())
        except StoreUnavailable:
            if app_settings.ON_STORE_ERROR == "enqueue":
                logger.warning("%s[%s]: store %r unavailable, enqueued without a lock "
                               "(ON_STORE_ERROR='enqueue').", self.label, owner,
                               self.store.alias, exc_info=True)
                self.outcome = UNLOCKED
                return
            self.undo()
            raise
        if not answer.publish:
            raise Refused(answer.holder)
        self.outcome = TAKEN

    def undo(self) -> None:
        """S7: the lock call may have run (a lost reply): undo what this request did once
        the store answers."""
        store, key, owner, request = self.store, self.key, self.owner, self.request
        assert owner is not None
        rollbacks.add(f"lock {key.key} of never-enqueued task {owner}",
                      lambda: bool(store.undo(key, owner, request)), store=store,
                      lifetime=self.ttl)

    def release(self) -> None:
        """U6: the enqueue failed after the lock was taken: no lock without a task."""
        if self.outcome != TAKEN or self.owner is None:
            return
        try:
            self.store.release(self.key, self.owner)
        except StoreUnavailable:
            self.undo()

    def done(self) -> None:
        """Report an enqueue that went through."""
        if self.outcome == TAKEN:
            notify(lock_acquired, self.task, key=self.key.key, owner=self.owner,
                   store=self.store.alias)
        metrics.decision(self.label, "dispatched")

    def duplicate(self, holder: str) -> None:
        """Report a duplicate."""
        metrics.decision(self.label, "deduplicated", self.key.key)
        notify(unique_job_skipped, self.task, task_id=self.owner, holder_id=holder,
               key=self.key.key, stage="dispatch")


@contextlib.contextmanager
def deciding(decision: Decision) -> Iterator[Decision]:
    """Make ``decision`` the one the ``task_enqueued`` receiver of this thread answers."""
    before = getattr(_local, "decision", None)
    _local.decision = decision
    try:
        yield decision
    finally:
        _local.decision = before


def on_enqueued(sender: Any, task_result: Any, **kwargs: Any) -> None:
    """``task_enqueued``: take the lock of the enqueue under way in this thread, if it is this
    task's (a task enqueued without the decorator's ``enqueue`` takes nothing)."""
    decision = getattr(_local, "decision", None)
    if decision is None or decision.owner is not None:
        return
    if task_result.task.module_path != decision.label:
        return
    decision.take(str(task_result.id))


def atomic_for(backend: Any) -> contextlib.AbstractContextManager[Any]:
    """One transaction on the database of django-tasks-db's rows (nothing for another
    backend): the row and the lock stand or fall together."""
    cls = type(backend)
    if not any(base.__module__.startswith("django_tasks_db") for base in cls.__mro__):
        return contextlib.nullcontext()
    from django.db import router, transaction
    from django_tasks_db.models import DBTaskResult

    return transaction.atomic(using=router.db_for_write(DBTaskResult))


def released(task: Any, label: str, store: BaseStore, key: JobKey, owner: str,
             reason: str, ttl: float) -> None:
    """Compare-and-delete ``owner``'s lock; re-sent until the store answers (W4)."""
    try:
        done = store.release(key, owner)
    except StoreUnavailable:
        logger.warning("%s[%s]: could not release %s; released as soon as the store answers.",
                       label, owner, key.key, exc_info=True)
        rollbacks.add(f"{key.key} of finished task {owner}",
                      lambda: bool(store.release(key, owner)), store=store,
                      lifetime=ttl + app_settings.LEASE_SECONDS)
        return
    if done:
        notify(lock_released, task, key=key.key, owner=owner, store=store.alias,
               reason=reason)
