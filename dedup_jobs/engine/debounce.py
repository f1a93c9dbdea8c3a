"""The debounce decisions that end a burst from outside its run (D9, S7): a burst taken out of
the store by its message id, and the undo of a dispatch that failed.

Both take the burst by a compare-and-delete on its message id (the store's claim, with a time
far past any due time), so a newer burst of the same id is never touched. What the front-end
does with the dispatches the burst had absorbed (publish the latest of them as a claimed
message, or end them REVOKED) it passes in: ``jobs/bursts.py``."""

from __future__ import annotations

import logging
from collections.abc import Callable

from dedup_jobs import clock
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.answers import CLAIMED, STATE_GRACE, Due
from dedup_jobs.stores.base import BaseStore

logger = logging.getLogger("dedup_jobs")

#: the claim of a burst taken from outside its run: any burst is due by then
FAR = 10 * STATE_GRACE


def take(store: BaseStore, key: JobKey, message_id: str) -> Due | None:
    """The burst at ``key`` whose message is ``message_id``, out of the store; None when the
    key holds no burst of that message (gone, claimed, or a newer burst)."""
    due = store.claim_due(key, message_id, now=clock.now() + FAR)
    return due if due.action == CLAIMED else None


def undo(name: str, store: BaseStore, key: JobKey, task_id: str, *,
         publish: Callable[[str, Due, list[str]], None],
         revoke: Callable[[Due, str], None]) -> bool:
    """S7: the dispatch ``task_id`` raised StoreUnavailable, yet its lost reply may have
    started a burst with ``task_id`` as its never-published message. Take that burst back;
    the dispatches absorbed into it meanwhile still run: ``publish(winner, due, others)``
    sends the latest of them as a claimed message (a later dispatch starts a new burst), so
    the failed dispatch is neither the message nor the source of the arguments; if that
    fails too, ``revoke(due, reason)`` ends them (all but ``task_id``). Absorbed into another
    dispatch's burst instead, it is withdrawn from it. True when something was undone."""
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
                           "%s failed too.", name, key.key, others, exc_info=True)
            revoke(due, reason)
            return True
        logger.warning("%s: the burst %s had no message (its first dispatch %s failed); "
                       "dispatches %s were absorbed into it: they run as %s.",
                       name, key.key, task_id, others, winner)
    else:
        revoke(due, reason)
    return True
