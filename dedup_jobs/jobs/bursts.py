"""Ending a debounce burst from outside its run: the undo of a dispatch that failed (S7) and an
operator's release of a burst whose message is lost (D9: ``clear_stale_locks``, the admin's
*Debounced jobs* page, the example project's demo).

Both take the burst by a compare-and-delete on its message id (the store's claim, with a time
far past any due time), so a newer burst of the same id is never touched, and both leave no
caller waiting: an undo hands the dispatches absorbed meanwhile to a message of their own
(they run, with the latest arguments), a release ends them REVOKED with its reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery.exceptions import TaskRevokedError

from dedup_jobs import clock
from dedup_jobs.jobs import chains
from dedup_jobs.jobs.absorbed import REVOKED, record_outcome
from dedup_jobs.jobs.base import logger
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import CLAIMED, STATE_GRACE, BaseStore, Due

if TYPE_CHECKING:
    from dedup_jobs.jobs.debounced import DebouncedJob

#: the claim of a burst taken from outside its run: any burst is due by then
FAR = 10 * STATE_GRACE


def take(store: BaseStore, key: JobKey, message_id: str) -> Due | None:
    """The burst at ``key`` whose message is ``message_id``, out of the store; None when the
    key holds no burst of that message (gone, claimed, or a newer burst)."""
    due = store.claim_due(key, message_id, now=clock.now() + FAR)
    return due if due.action == CLAIMED else None


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


def undo(task: DebouncedJob, store: BaseStore, key: JobKey, task_id: str,
         publish: Any) -> bool:
    """S7: the dispatch ``task_id`` raised StoreUnavailable, yet its lost reply may have
    started a burst with ``task_id`` as its never-published message. Take that burst back;
    the dispatches absorbed into it meanwhile still run: ``publish(winner, due, others)``
    sends the latest of them as a claimed message (a later dispatch starts a new burst), so
    the failed dispatch is neither the message nor the source of the arguments. Absorbed
    into another dispatch's burst instead, it is withdrawn from it. True when something
    was undone."""
    due = take(store, key, task_id)
    if due is None:
        # absorbed into another dispatch's burst: it goes, with its arguments
        return store.withdraw(key, task_id)
    others = [i for i in due.absorbed if i != task_id]
    if not others:
        return True
    reason = f"debounce burst dropped: its message {task_id} was never published"
    winner = due.latest_id
    if winner and winner != task_id:
        try:
            publish(winner, due, [i for i in others if i != winner])
        except Exception:
            logger.warning("%s: the burst %s had no message and the one sent for dispatches "
                           "%s failed too.", task.name, key.key, others, exc_info=True)
            revoke(task, due, reason, skip=task_id)
            return True
        logger.warning("%s: the burst %s had no message (its first dispatch %s failed); "
                       "dispatches %s were absorbed into it: they run as %s.",
                       task.name, key.key, task_id, others, winner)
    else:
        revoke(task, due, reason, skip=task_id)
    return True
