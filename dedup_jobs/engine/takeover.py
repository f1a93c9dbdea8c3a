"""R1 and S7 at the worker: a queued message whose lock another dispatch took over.

A take-over (``on_duplicate = "replace"``) passes the lock to the new dispatch in one store
call; only when that call's reply reaches the dispatch does it mark the replaced message
REVOKED and publish its own (jobs/replace.py). If the reply is lost, the dispatch raises
StoreUnavailable, publishes nothing, and its undo (engine/rollback.py, the store's UNDO) gives
the lock back to the replaced message as soon as the store answers. A worker that takes the
replaced message in between must therefore not skip it as "held by" an id that may never be
published: it asks whether the take-over is confirmed, and otherwise waits.

- The replaced message's result is REVOKED: the dispatch that took over got its answer and
  published (R1): the message never runs.
- Not REVOKED: the outcome is open. The message is published again with a countdown (same
  task id, the seconds it has waited so far in its dedup header) and checked once more; by
  then either the lock is its own again (the undo gave it back: it runs) or its result is
  REVOKED. It waits in all up to ``STORE_TIMEOUT + LEASE_SECONDS`` from the first check
  whose store call was answered: a failed dispatch's undo lands within ``LEASE_SECONDS`` of
  the store's return (S7), a successful one marks the message within its own call.
- After that wait the take-over stands (its dispatch died before it could mark anything, or
  the job keeps no result): the message is skipped as held by the new owner (W3), as
  before.

The normal path pays nothing: the store reports a take-over (``Started.taken_over``) only on
the skip path, and the result is read only then.
"""

from __future__ import annotations

from collections.abc import Callable

from dedup_jobs.conf import app_settings
from dedup_jobs.engine.message import Message, logger

#: what a message whose lock was taken over does (see :func:`decide`)
REPLACED, WAIT, SKIP = "replaced", "wait", "skip"
#: dedup header: seconds a message has waited for the outcome of a take-over of its lock
WAITED = "takeover_waited"


def grace() -> float:
    """Seconds a replaced message waits, once the store answers it, for the dispatch that
    took its lock over to mark it REVOKED or for that dispatch's undo (S7)."""
    return float(app_settings.STORE_TIMEOUT) + float(app_settings.LEASE_SECONDS)


def decide(message: Message, age: float, revoked: Callable[[], bool]) -> tuple[str, float]:
    """What ``message`` does, whose lock was taken over ``age`` seconds ago; ``revoked()``
    asks the front-end whether the dispatch that took over marked it REVOKED (R1; False when
    the job keeps no result or it cannot be read). (REPLACED, 0) never runs; (WAIT,
    countdown) is checked again after ``countdown`` seconds (the seconds it has waited so far
    travel in its dedup header, :data:`WAITED`); (SKIP, 0) is skipped as held by the new
    owner."""
    if revoked():
        return REPLACED, 0.0
    left = grace() - waited(message)
    if left <= 0:
        return SKIP, 0.0
    countdown = min(left, max(0.05, app_settings.LEASE_SECONDS / 3))
    logger.info("%s[%s]: its lock was taken over %.2fs ago by a dispatch not confirmed yet "
                "(its reply may be lost, S7); this message waits %.2fs.", message.name,
                message.owner, age, countdown)
    return WAIT, countdown


def waited(message: Message) -> float:
    """Seconds ``message`` has waited for the outcome of a take-over so far."""
    return float(message.carried(WAITED) or 0)
