"""Ending a debounce burst from outside its run: the undo of a dispatch that failed (S7) and an
operator's release of a burst whose message is lost (D9: ``clear_stale_locks``, the admin's
*Debounced jobs* page, the example project's demo).

Both take the burst by a compare-and-delete on its message id (``engine/debounce.py``: the
store's claim, with a time far past any due time), so a newer burst of the same id is never
touched, and both leave no caller waiting: an undo hands the dispatches absorbed meanwhile to
a message of their own (they run, with the latest arguments), a release ends them REVOKED
with its reason. This module is the Celery half: results marked, chains ended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery.exceptions import TaskRevokedError

from dedup_jobs.engine import debounce
from dedup_jobs.engine.debounce import take
from dedup_jobs.jobs import chains
from dedup_jobs.jobs.absorbed import REVOKED, record_outcome
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import BaseStore, Due

if TYPE_CHECKING:
    from dedup_jobs.jobs.debounced import DebouncedJob

def release(task: DebouncedJob, store: BaseStore, key: JobKey, message_id: str,
            reason: str) -> bool:
    """An operator's release: the burst of ``message_id`` goes, and every dispatch it had
    absorbed (its message's own id too: that message is taken as lost) ends REVOKED with
    ``reason``, with the later links of their chains. False: it was gone or changed."""
    due = take(store, key, message_id)
    if due is None:
        return False
    revoke(task, due, reason)
    return True


def release_pending(task: DebouncedJob, args: Any = (), kwargs: Any = None, *,
                    reason: str) -> bool:
    """Release the pending burst of ``task(*args, **kwargs)``'s debounce id, whatever its
    message (an operator's clean start: the example project's demo). False: none."""
    key = task.job_key(tuple(args), dict(kwargs or {}))
    store = task.store()
    state = store.get_debounce(key)
    return state is not None and release(task, store, key, state.message_id, reason)


def revoke(task: DebouncedJob, due: Due, reason: str, *, skip: str = "") -> None:
    """End the dispatches of the claimed burst ``due`` (all but ``skip``) REVOKED."""
    found = {} if task.ignore_result else record_outcome(
        task.backend, [i for i in due.absorbed if i != skip], TaskRevokedError(reason), REVOKED)
    if due.latest_id and due.latest_id != skip:
        found[due.latest_id] = chains.links_of(due.args) or []
    for dispatch, links in found.items():
        chains.revoke_links(task.backend, links,
                            f"the chain of dispatch {dispatch} does not go on: {reason}")


def revoke_owed(task: DebouncedJob, owed: list[str], reason: str) -> None:
    """End ``owed``, the dispatches a claimed burst's message still answers for (a retry's
    header names them), REVOKED with ``reason``, with the later links of their chains: that
    message was revoked or expired, and the burst's state went when it was claimed."""
    if task.ignore_result or not owed:
        return
    found = record_outcome(task.backend, owed, TaskRevokedError(reason), REVOKED)
    for dispatch, links in found.items():
        chains.revoke_links(task.backend, links,
                            f"the chain of dispatch {dispatch} does not go on: {reason}")


def undo(task: DebouncedJob, store: BaseStore, key: JobKey, task_id: str,
         publish: Any) -> bool:
    """S7: undo the failed dispatch ``task_id`` (``engine/debounce.py``): ``publish(winner,
    due, others)`` sends the latest absorbed dispatch as the burst's claimed message; when
    there is none, or that fails too, the absorbed dispatches end REVOKED."""
    return debounce.undo(task.name, store, key, task_id, publish=publish,
                         revoke=lambda due, reason: revoke(task, due, reason, skip=task_id))
