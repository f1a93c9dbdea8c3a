"""What really happened to the demo's jobs, recorded from dedup_jobs' and Celery's signals.

The demo prints nothing it did not observe: every line of its timeline is an event recorded
here (or a figure read back from the database afterwards).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from celery.signals import after_task_publish, before_task_publish, task_postrun, task_prerun

from dedup_jobs.signals import job_debounced, lock_acquired, lock_released, unique_job_skipped

ACQUIRED = "lock acquired"
SKIPPED = "deduplicated"
SUPERSEDED = "superseded"
RELEASED = "lock released"
PUBLISHED = "published"
STARTED = "worker started"
FINISHED = "worker finished"


@dataclass(frozen=True, kw_only=True)
class Event:
    at: float  # time.monotonic()
    kind: str
    task_name: str
    # the task the event is about (SKIPPED: the holder it was merged into; SUPERSEDED: the
    # dispatch that was superseded)
    task_id: str
    detail: str = ""


class Timeline:
    """Collects the events of the given task names, thread-safely, while connected, in the
    order they happened (``at``), which is not always the order their signals arrive."""

    def __init__(self, task_names: Iterable[str]) -> None:
        self.task_names = set(task_names)
        self.events: list[Event] = []
        self._changed = threading.Condition()
        # per thread: (task id, when) of the publish in progress, see _on_acquired
        self._publishing = threading.local()

    # -- recording ----------------------------------------------------------------------

    def _add(
        self, kind: str, task_name: str, task_id: str, detail: str = "", at: float | None = None
    ) -> None:
        if task_name not in self.task_names:
            return
        event = Event(
            at=time.monotonic() if at is None else at,
            kind=kind,
            task_name=task_name,
            task_id=task_id,
            detail=detail,
        )
        with self._changed:
            bisect.insort(self.events, event, key=lambda e: e.at)
            self._changed.notify_all()

    def _on_before_publish(self, sender: Any = None, headers: Any = None, **kwargs: Any) -> None:
        self._publishing.started = (str((headers or {}).get("id", "")), time.monotonic())

    def _on_acquired(self, sender: Any, owner: str, **kwargs: Any) -> None:
        # At dispatch dedup_jobs takes the lock, publishes, and sends lock_acquired once the
        # message is out (a failed publish gives the lock back). The lock was held before the
        # publish began: date the event then, so the timeline shows it before the publish.
        started = getattr(self._publishing, "started", None)
        self._publishing.started = None
        at = started[1] if started is not None and started[0] == owner else None
        self._add(ACQUIRED, sender.name, owner, at=at)

    def _on_skipped(self, sender: Any, holder_id: str, stage: str, **kwargs: Any) -> None:
        self._add(SKIPPED, sender.name, holder_id, stage)

    def _on_debounced(self, sender: Any, superseded_id: str, by_id: str, **kwargs: Any) -> None:
        self._add(SUPERSEDED, sender.name, superseded_id, by_id)

    def _on_released(self, sender: Any, owner: str, reason: str, **kwargs: Any) -> None:
        self._add(RELEASED, sender.name, owner, reason)

    def _on_published(self, sender: Any = None, headers: Any = None, **kwargs: Any) -> None:
        headers = headers or {}
        self._add(PUBLISHED, str(headers.get("task", sender)), str(headers.get("id", "")))

    def _on_prerun(self, task_id: str, task: Any, **kwargs: Any) -> None:
        self._publishing.started = None  # a worker's own re-publish is no dispatch's
        self._add(STARTED, task.name, task_id)

    def _on_postrun(
        self, task_id: str, task: Any, state: Any = None, retval: Any = None, **kwargs: Any
    ) -> None:
        self._publishing.started = None
        self._add(FINISHED, task.name, task_id, f"{state}: {retval!r}")

    _SIGNALS = (
        (lock_acquired, "_on_acquired"),
        (unique_job_skipped, "_on_skipped"),
        (job_debounced, "_on_debounced"),
        (lock_released, "_on_released"),
        (before_task_publish, "_on_before_publish"),
        (after_task_publish, "_on_published"),
        (task_prerun, "_on_prerun"),
        (task_postrun, "_on_postrun"),
    )

    def __enter__(self) -> Timeline:
        for signal, method in self._SIGNALS:
            signal.connect(getattr(self, method), weak=False, dispatch_uid=f"demo.{method}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signal, _method in self._SIGNALS:
            signal.disconnect(dispatch_uid=f"demo.{_method}")

    # -- reading ------------------------------------------------------------------------

    def of(self, task_name: str, since: float, kind: str | None = None) -> list[Event]:
        with self._changed:
            return [
                e
                for e in self.events
                if e.task_name == task_name and e.at >= since and (kind is None or e.kind == kind)
            ]

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until ``predicate()`` holds (re-checked on every new event); False on
        timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.1))
        return True

    def settled(self, task_name: str, since: float) -> Callable[[], bool]:
        """A predicate: every published message of the task has finished, and every lock
        taken for it has been released."""

        def check() -> bool:
            events = [e for e in self.events if e.task_name == task_name and e.at >= since]
            ids = {
                kind: {e.task_id for e in events if e.kind == kind}
                for kind in (PUBLISHED, FINISHED, ACQUIRED, RELEASED)
            }
            return (
                bool(ids[PUBLISHED])
                and ids[PUBLISHED] <= ids[FINISHED]
                and ids[ACQUIRED] <= ids[RELEASED]
            )

        return check


# -- rendering ----------------------------------------------------------------------------


def short(task_id: str) -> str:
    return task_id[:8]


def describe(event: Event) -> str:
    task = short(event.task_id)
    if event.kind == ACQUIRED:
        return f"lock acquired by task {task}"
    if event.kind == PUBLISHED:
        return f"message published for task {task}"
    if event.kind == STARTED:
        return f"worker started task {task}"
    if event.kind == FINISHED:
        return f"worker finished task {task}: {event.detail}"
    if event.kind == RELEASED:
        return f"lock of task {task} released ({event.detail})"
    return f"{event.kind} {task} {event.detail}"


def render(
    events: list[Event], t0: float, *, burst: tuple[float, int] | None = None,
    names: dict[str, str] | None = None,
) -> list[str]:
    """One line per event, times relative to ``t0``, except that a run of deduplicated
    dispatches merged into the same holder is one line. ``burst`` = (end, dispatches);
    ``names`` labels task ids (e.g. "dispatch 1"): two 8-character ids alike at a glance
    are then not taken for one task."""
    names = names or {}
    lines: list[tuple[float, str]] = []
    pending: list[Event] = []

    def flush() -> None:
        if not pending:
            return
        first, last = pending[0], pending[-1]
        span = f"+{first.at - t0:.3f}s"
        if len(pending) > 1:
            span += f"..+{last.at - t0:.3f}s"
        noun = "dispatch" if len(pending) == 1 else "dispatches"
        where = "" if first.detail == "dispatch" else f" (at the {first.detail})"
        text = (
            f"{span}  {len(pending)} {noun} deduplicated{where}: "
            f"returned AsyncResult({short(first.task_id)})"
        )
        lines.append((first.at, text))
        pending.clear()

    superseded: list[Event] = []
    published: set[str] = set()

    def flush_superseded() -> None:
        if not superseded:
            return
        first, last = superseded[0], superseded[-1]
        span = f"+{first.at - t0:.3f}s"
        if len(superseded) > 1:
            span += f"..+{last.at - t0:.3f}s"
        noun = "dispatch" if len(superseded) == 1 else "dispatches"
        text = (
            f"{span}  {len(superseded)} {noun} superseded by the next one (job_debounced); "
            f"nothing published"
        )
        lines.append((first.at, text))
        superseded.clear()

    for event in events:
        if event.kind == SKIPPED:
            if pending and pending[-1].task_id != event.task_id:
                flush()
            pending.append(event)
            continue
        if event.kind == SUPERSEDED:
            superseded.append(event)
            continue
        flush()
        flush_superseded()
        if event.kind == FINISHED and event.detail.startswith("IGNORED"):
            continue  # a debounce message that re-published itself: shown by its publish
        text = describe(event)
        if event.task_id in names:
            task = short(event.task_id)
            text = text.replace(task, f"{task} ({names[event.task_id]})", 1)
        if event.kind == PUBLISHED:
            if event.task_id in published:
                text = (
                    f"task {short(event.task_id)} not due yet (later dispatches moved the "
                    f"burst): the worker re-published it for when it is"
                )
            published.add(event.task_id)
        lines.append((event.at, f"+{event.at - t0:.3f}s  {text}"))
    flush()
    flush_superseded()
    if burst is not None:
        end, total = burst
        lines.append((end, f"+{end - t0:.3f}s  burst over: {total} dispatches in {end - t0:.3f}s"))
    return [text for _at, text in sorted(lines, key=lambda line: line[0])]
