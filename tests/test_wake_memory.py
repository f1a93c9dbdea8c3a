"""The worker's memory of a wake that overtook its message (jobs/wake.py, ``_remember`` and
``_arrived``): what it keeps, for how long, and which message it moves (a waiter's
re-publish, marked by DedupJob.publish_again, not a retry of it). The move itself, on a
real worker, is in tests/test_throttle_wake.py (test_a_wake_that_overtakes_its_message_...)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from dedup_jobs.jobs import wake


class Timer:
    """Records what ``_arrived`` asks the event loop's timer to do."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def call_after(self, secs: float, fun: Any, args: tuple[Any, ...], **kwargs: Any) -> None:
        self.calls.append((secs, fun, args))


@pytest.fixture(autouse=True)
def _empty() -> Iterator[None]:
    wake._missed.clear()
    yield
    wake._missed.clear()


def _arrive(task_id: str, *, eta: bool = True, timer: Any = None,
            headers: dict[str, Any] | None = None) -> Timer:
    """A message of ``task_id`` received (by default a re-publish of a first try, as
    DedupJob.publish_again sends it)."""
    timer = Timer() if timer is None else timer
    request = SimpleNamespace(id=task_id, eta=datetime.now(timezone.utc) if eta else None,
                              request_dict={"retries": 0, wake.AGAIN: 0} if headers is None
                              else headers)
    wake._arrived(sender=SimpleNamespace(timer=timer), request=request)
    return timer


def test_the_first_message_with_a_countdown_is_moved_once() -> None:
    wake._remember("w", time.monotonic())
    timer = _arrive("w")
    assert [(secs, fun, args[1]) for secs, fun, args in timer.calls] == [(0, wake._move, "w")]
    assert _arrive("w").calls == []  # the next message of the id keeps its countdown
    assert _arrive("other").calls == []


@pytest.mark.parametrize("headers", [
    pytest.param({"retries": 0}, id="a plain publish"),
    pytest.param({"retries": 1, wake.AGAIN: 0}, id="a retry of the woken run"),
    pytest.param({wake.AGAIN: 0}, id="no retries header"),
])
def test_only_a_re_publish_of_the_same_try_is_moved(headers: dict[str, Any]) -> None:
    """A message of the id that is not publish_again's for the try it carries (a user's own
    publish with a countdown, a retry whose headers were copied from a re-published
    message) keeps its countdown, and ends the memory."""
    wake._remember("w", time.monotonic())
    assert _arrive("w", headers=headers).calls == []
    assert "w" not in wake._missed
    wake._remember("w", time.monotonic())
    assert len(_arrive("w", headers={"retries": 3, wake.AGAIN: 3}).calls) == 1


def test_a_wake_older_than_missed_for_moves_nothing() -> None:
    wake._remember("w", time.monotonic() - wake.MISSED_FOR - 0.01)
    assert _arrive("w").calls == []
    assert "w" not in wake._missed


def test_a_message_without_a_countdown_ends_the_memory() -> None:
    wake._remember("w", time.monotonic())
    assert _arrive("w", eta=False).calls == []
    assert _arrive("w").calls == []


def test_a_timer_on_a_thread_is_left_be() -> None:
    wake._remember("w", time.monotonic())
    thread_timer = threading.Thread(target=lambda: None)
    _arrive("w", timer=thread_timer)  # no call_after on a thread: nothing to record, no error
    assert "w" not in wake._missed


def test_the_memory_is_bounded_the_oldest_forgotten_first() -> None:
    now = time.monotonic()
    for i in range(wake.MISSED_MAX + 10):
        wake._remember(f"w{i}", now)
    assert len(wake._missed) == wake.MISSED_MAX
    assert "w0" not in wake._missed and f"w{wake.MISSED_MAX + 9}" in wake._missed
    wake._missed.clear()
    for i in range(wake.MISSED_MAX):
        wake._remember(f"old{i}", now - wake.MISSED_FOR - 1)  # all stale
    wake._remember("new", now)
    assert list(wake._missed) == ["new"]  # stale ones go before any live one


def test_publish_again_marks_its_try_and_a_retry_of_it_does_not_match(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The publishing side of the mark, with Celery's own code: DedupJob.publish_again
    (every waiter's re-publish) sets AGAIN to the retries its message carries, and
    ``retry()`` of the run such a message became copies the header on with one more try,
    so the wake's memory moves the first and never the second."""
    from celery.contrib.django.task import DjangoTask

    from tests import jobs_throttle

    task = jobs_throttle.one_at_once
    sent: list[tuple[str | None, dict[str, Any]]] = []

    def capture(self: Any, args: Any = None, kwargs: Any = None, task_id: str | None = None,
                **options: Any) -> None:
        sent.append((task_id, options))

    monkeypatch.setattr(DjangoTask, "apply_async", capture)

    def matches(options: dict[str, Any]) -> bool:
        wake._missed.clear()
        wake._remember("w", time.monotonic())
        headers = {"retries": options["retries"], **options["headers"]}
        return len(_arrive("w", headers=headers).calls) == 1

    task.push_request(id="w", retries=1, args=[], kwargs={"tag": 1}, headers={},
                      delivery_info={"exchange": "", "routing_key": "celery"},
                      called_directly=False, is_eager=False)
    try:
        task.publish_again((), {"tag": 1}, 5.0)  # the waiter's re-publish
        (_, again), = sent
        assert again["headers"][wake.AGAIN] == again["retries"] == 1
        assert matches(again)
        task.request.headers = again["headers"]  # the run that message became
        task.retry(countdown=60, throw=False)
    finally:
        task.pop_request()
    (_, retry), = sent[1:]
    assert retry["headers"][wake.AGAIN] == 1 and retry["retries"] == 2, retry
    assert not matches(retry)
