"""The wake (T2), Celery's side: a freed concurrency slot goes to a waiter at once rather
than at its planned turn.

A waiter deferred for a slot is published again with a countdown; a Celery worker takes such
a message at once and holds it in its timer until the countdown ends. The turn is planned
from the runs' average length, so a run that ends sooner leaves its slot idle until then.
The release that frees the slot names the waiter of the earliest turn further than
``WAKE_AFTER`` away, while fewer waiters are on their way than slots are free, in the same
round trip (it moves the waiter's turn to now on the store), and :func:`waker`'s function
broadcasts ``dedup_jobs_wake`` with its task id.
The worker holding that message (:func:`dedup_jobs_wake`, a remote control command, run in
the worker's event loop) moves its timer entry to now: it is admitted as any waiter back for
its turn. Nothing else changes: no message is added or dropped; a wake that finds no worker
holding the message (still queued, already run, remote control off) changes nothing but the
turn on the store, and the waiter comes back for its countdown as before, with one
exception: the waiter's deferred message may still be on its way (published just before the
release), so a worker that does not hold it remembers the wake for :data:`MISSED_FOR`
seconds and moves that message when it comes (:func:`_arrived`, on ``task_received``). Only
a re-publish (:data:`AGAIN`) of the try the message carries is moved: a retry of the run the
waiter became, reaching such a worker, keeps its countdown.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from celery.signals import task_received
from celery.worker import state as worker_state
from celery.worker.control import control_command
from kombu.utils.compat import detect_environment

logger = logging.getLogger("dedup_jobs")

COMMAND = "dedup_jobs_wake"
#: seconds a worker remembers a wake for a message it does not hold (yet): the waiter's
#: deferred message, published just before the release, can be overtaken by the wake. Short:
#: a later message of the same task id (a retry of the run the waiter became) keeps its
#: countdown once the window has passed.
MISSED_FOR = 2.0
#: at most this many remembered wakes (the oldest forgotten first)
MISSED_MAX = 1024
#: the header DedupJob.publish_again marks its re-publish with: the retries of the try it
#: re-publishes (a retry copies the header on, with one more retry: it is not moved)
AGAIN = "dedup_jobs_again"
#: task id -> monotonic deadline; touched only on the worker's event loop (the remote
#: control command and ``task_received`` both run there)
_missed: dict[str, float] = {}


def wakeable(app: Any) -> bool:
    """Can ``app``'s workers be woken? Their remote control is on, their broker's transport
    is asynchronous (the worker runs an event loop, whose timer the command moves) and has a
    fanout exchange (the broadcast; Celery starts no remote control without one), and they
    do not run under eventlet or gevent. Read once per app."""
    found = getattr(app, "_dedup_wakeable", None)
    if found is None:
        found = bool(app.conf.worker_enable_remote_control) and detect_environment() == "default"
        if found:
            try:
                implements = app.connection_for_read().transport.implements
                found = bool(implements.asynchronous) and "fanout" in implements.exchange_type
            except Exception:  # no broker to name: no wake (the plain plan)
                found = False
        app._dedup_wakeable = found
    return bool(found)


def waker(app: Any) -> Callable[[str], None]:
    """The wake of ``app``'s workers: broadcast :data:`COMMAND` for a task id (one broker
    message, no reply awaited). It never raises: a wake that cannot be sent leaves the
    waiter to its countdown."""
    found = getattr(app, "_dedup_waker", None)
    if found is not None:
        return found  # type: ignore[no-any-return]

    def wake(task_id: str) -> None:
        try:
            app.control.broadcast(COMMAND, arguments={"task_id": task_id})
        except Exception:  # a wake only saves time; the countdown stays
            logger.debug("could not wake the waiter %s; it comes back for its turn",
                         task_id, exc_info=True)

    app._dedup_waker = wake
    return wake


@control_command(args=[("task_id", str)], signature="<task_id>")
def dedup_jobs_wake(state: Any, task_id: str) -> dict[str, str]:
    """dedup_jobs: run a throttled waiter held for its countdown now (its slot is free)."""
    timer = state.consumer.timer
    if timer is None or isinstance(timer, threading.Thread):
        # a timer on a thread of its own could fire the entry while it is moved: left be
        return {"ok": "not on an event loop"}
    if _move(timer, task_id):
        return {"ok": "woken"}
    _remember(task_id, time.monotonic())
    return {"ok": "not held here"}


def _move(timer: Any, task_id: str) -> bool:
    """Move ``task_id``'s message held in ``timer`` for its countdown to now: False if it is
    not (or no longer) waiting there."""
    scheduled = getattr(worker_state, "scheduled_requests", None)
    if scheduled is None:  # Celery before 5.7 keeps no index of the requests it holds
        request, entry = _held(timer, task_id)
        if request is not None and not _re_published(request):
            return False
    else:
        # by id among the held requests: ``worker_state.requests`` may have lost it (the
        # deferred delivery, ending after its copy arrived, popped the id)
        request = next((held for held in tuple(scheduled)
                        if held.id == task_id and _re_published(held)), None)
        entry = getattr(request, "_eta_timer_entry", None)
    if entry is None or entry.canceled or not any(e.entry is entry for e in timer._queue):
        # not (or no longer) waiting in the timer: its countdown ended (with a rate limit,
        # Celery keeps it scheduled in its bucket until it starts; moved again, it would run
        # twice)
        return False
    timer.cancel(entry)
    moved = timer.call_after(0, entry.fun, entry.args, entry.kwargs, priority=6)
    if scheduled is not None:
        request._eta_timer_entry = moved
    return True


def _remember(task_id: str, now: float) -> None:
    """Remember a wake that found no message to move, until ``now + MISSED_FOR``."""
    if len(_missed) >= MISSED_MAX:
        for stale in [held for held, deadline in _missed.items() if deadline < now]:
            del _missed[stale]
        while len(_missed) >= MISSED_MAX:
            del _missed[next(iter(_missed))]
    _missed[task_id] = now + MISSED_FOR


def _arrived(sender: Any = None, request: Any = None, **_: Any) -> None:
    """``task_received``: the first message of a remembered wake's task id, if it comes in
    time with a countdown and is a re-publish of the try it carries (:data:`AGAIN`), is moved
    to now once Celery has put it in the timer (the strategy does so right after this
    signal). Any message of that id ends the memory."""
    if not _missed:
        return
    deadline = _missed.pop(str(getattr(request, "id", "")), None)
    if deadline is None or deadline < time.monotonic() or not getattr(request, "eta", None):
        return
    if not _re_published(request):
        return  # not a waiter's re-publish: a retry (one more try), or the user's own publish
    timer = getattr(sender, "timer", None)
    if timer is not None and not isinstance(timer, threading.Thread):
        timer.call_after(0, _move, (timer, request.id), priority=6)


task_received.connect(_arrived, weak=False)


def _re_published(request: Any) -> bool:
    """Is ``request`` a waiter's re-publish of the try it carries (:data:`AGAIN`), not a
    retry of it (one more try) nor a message the project published itself with that id?"""
    headers = getattr(request, "request_dict", None) or {}
    retries = headers.get("retries")
    return retries is not None and headers.get(AGAIN) == retries


def _held(timer: Any, task_id: str) -> tuple[Any, Any]:
    """The request of ``task_id`` held in ``timer``, and its entry (None, None: not held)."""
    for event in timer.queue:
        entry = event.entry
        request = entry.args[0] if entry.args else None
        if getattr(request, "id", None) == task_id:
            return request, entry
    return None, None
