"""Unique Django tasks on ImmediateBackend (SPEC §11, K1/K2): the enqueue's lock, the
holder's result for a duplicate, the release, the options' errors. Real workers, the
database backend and the atomic enqueue are in tests/test_django_tasks_workers.py."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from dedup_jobs.django_tasks import unique, unique_until_processing
from dedup_jobs.exceptions import (
    DuplicateJob,
    InvalidJobConfiguration,
    InvalidJobId,
    StoreUnavailable,
)
from dedup_jobs.signals import lock_acquired, lock_released, unique_job_skipped
from tests import django_tasks_jobs as tasks
from tests import jobs
from tests.django_tasks_jobs import task
from tests.test_dispatch import DEAD_CACHES


def key_of(task_: Any, *args: Any, **kwargs: Any) -> Any:
    options = task_.dedup
    return options.key(list(args), kwargs, options.store())


def test_enqueue_runs_and_releases() -> None:
    """K1: the decorated task is still a Task; enqueue runs it, marked not deduplicated,
    and the lock is gone once it finished, so the next enqueue runs again."""
    assert isinstance(tasks.indexed, type(tasks.plain).__mro__[-2])  # still a Task
    first = tasks.indexed.enqueue(7, note="a")
    assert first.deduplicated is False
    assert (first.status, first.return_value) == ("SUCCESSFUL", 7)
    assert tasks.indexed.dedup.store().get(key_of(tasks.indexed, 7)) is None
    second = tasks.indexed.enqueue(7, note="b")
    assert second.deduplicated is False
    assert jobs.runs("indexed:7") == ["'a'", "'b'"]


def test_duplicate_returns_the_holders_result() -> None:
    """K1/U2: while another result holds the key, enqueue runs nothing and returns the
    holder's TaskResult, marked deduplicated; the signal names the task as sender."""
    key = key_of(tasks.indexed, 8)
    store = tasks.indexed.dedup.store()
    assert store.acquire(key, "holder-1", 60, now=0).acquired
    seen: list[Any] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        seen.append((sender, kwargs["holder_id"], kwargs["stage"]))

    unique_job_skipped.connect(receiver)
    try:
        result = tasks.indexed.enqueue(8)
    finally:
        unique_job_skipped.disconnect(receiver)
    assert (result.id, result.deduplicated, result.status) == ("holder-1", True, "READY")
    assert jobs.runs("indexed:8") == []
    assert seen == [(tasks.indexed, "holder-1", "dispatch")]
    assert store.get(key).owner == "holder-1"


def test_on_duplicate_raise_names_the_holder() -> None:
    key = key_of(tasks.raising, 9)
    tasks.raising.dedup.store().acquire(key, "holder-2", 60, now=0)
    with pytest.raises(DuplicateJob, match="holder-2"):
        tasks.raising.enqueue(9, note="other notes, same product")
    assert jobs.runs("raising:9") == []


def test_failure_releases_and_the_next_enqueue_runs() -> None:
    """K2: released when the task fails, too."""
    first = tasks.failing.enqueue("f")
    assert first.status == "FAILED"
    assert tasks.failing.dedup.store().get(key_of(tasks.failing, "f")) is None
    assert tasks.failing.enqueue("f").status == "FAILED"
    assert jobs.runs("failing:f") == ["'f'", "'f'"]


def test_signals_name_the_task() -> None:
    """K4: lock_acquired and lock_released are sent with the task as sender."""
    seen: list[Any] = []

    def receiver(signal: Any, sender: Any, **kwargs: Any) -> None:
        seen.append((sender, kwargs.get("reason")))

    lock_acquired.connect(receiver)
    lock_released.connect(receiver)
    try:
        tasks.until_processing.enqueue("s")
    finally:
        lock_acquired.disconnect(receiver)
        lock_released.disconnect(receiver)
    assert seen == [(tasks.until_processing, "processing"),
                    (tasks.until_processing, None)], seen


def test_context_is_not_part_of_the_key() -> None:
    """A context-taking task's key comes from the caller's arguments (here unique_id)."""
    result = tasks.with_context.enqueue(3, extra=1)
    assert result.deduplicated is False
    assert jobs.runs("with_context:3") == [repr(result.id)]
    assert key_of(tasks.with_context, 3).key.endswith(":account-3")


def test_using_keeps_the_options_and_pickling_rebuilds() -> None:
    other = tasks.indexed.using(priority=5)
    assert other.dedup is tasks.indexed.dedup and other.priority == 5
    again = pickle.loads(pickle.dumps(other))
    assert again == other
    assert again.enqueue(11).deduplicated is False


def test_a_plain_call_runs_without_the_store() -> None:
    """A call not started by a worker runs the function plainly."""
    assert tasks.indexed.call(12) == 12
    assert tasks.indexed.dedup.store().get(key_of(tasks.indexed, 12)) is None


def test_aenqueue() -> None:
    key = key_of(tasks.indexed, 13)
    tasks.indexed.dedup.store().acquire(key, "holder-3", 60, now=0)
    result = asyncio.run(tasks.indexed.aenqueue(13))
    assert (result.id, result.deduplicated) == ("holder-3", True)


def test_an_id_no_store_holds_raises_before_anything() -> None:
    """A4: the id from unique_id() holds NUL: raised before the backend sees the task."""
    with pytest.raises(InvalidJobId, match="NUL"):
        tasks.with_context.enqueue("\x00")
    assert jobs.runs("with_context:\x00") == []


@override_settings(CACHES=DEAD_CACHES, DEDUP_JOBS={"STORE": "dead"})
def test_store_unavailable_raises_and_nothing_runs() -> None:
    with pytest.raises(StoreUnavailable, match="'dead' is unavailable"):
        tasks.indexed.enqueue(15)
    assert jobs.runs("indexed:15") == []


@override_settings(CACHES=DEAD_CACHES, DEDUP_JOBS={"STORE": "dead", "ON_STORE_ERROR": "enqueue"})
def test_store_unavailable_enqueue_runs_without_a_lock() -> None:
    result = tasks.indexed.enqueue(16)
    assert result.deduplicated is False
    assert jobs.runs("indexed:16") == ["16"]


def _function(product_id: int) -> None:
    pass


@pytest.mark.parametrize(("options", "message"), [
    ({"unique_for": -1}, "unique_for = -1 must be a number of seconds above 0"),
    ({"on_duplicate": "replace"}, "on_duplicate = 'replace' must be one of"),
    ({"on_duplicate": "cancel_running"}, "use it on a Celery UniqueJob"),
    ({"unique_on": "product_id"}, "unique_on = 'product_id' must be a tuple"),
    ({"unique_on": ("sku",)}, "unique_on names ['sku'], which the task does not take"),
    ({"unique_id": 3}, "unique_id = 3 must be a function of the call"),
    ({"without_overlapping": True}, "without_overlapping = True is not supported"),
    ({"debounce_for": 3}, "unknown option(s) debounce_for"),
])
def test_bad_options_name_the_value(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidJobConfiguration) as raised:
        unique(**options)(task()(_function))
    assert message in str(raised.value)


def test_a_function_that_is_not_a_task() -> None:
    with pytest.raises(TypeError, match="put the dedup_jobs decorator above @task"):
        unique_until_processing()(_function)
    with pytest.raises(InvalidJobConfiguration, match="has a dedup_jobs decorator already"):
        unique()(tasks.indexed)


def test_a_backend_that_bypasses_task_call_is_a_warning() -> None:
    """K3/W010: a unique task on a backend whose worker does not call Task.call."""
    from django.core import checks
    from django.test import override_settings

    from dedup_jobs.checks import check_django_tasks

    assert [m.id for m in check_django_tasks()] == []
    package = type(tasks.plain).__module__.rsplit(".", 1)[0]  # django.tasks or django_tasks
    with override_settings(TASKS={
        "default": {"BACKEND": f"{package}.backends.immediate.ImmediateBackend"},
        "db": {"BACKEND": "tests.django_tasks_jobs.UncheckedBackend"},
    }):
        found = [m for m in check_django_tasks() if m.id == "dedup_jobs.W010"]
    assert found and all(m.level == checks.WARNING for m in found)
    (mine,) = [m for m in found if "tests.django_tasks_jobs.on_unchecked " in m.msg]
    assert "'db'" in mine.msg and "UncheckedBackend" in mine.msg


@pytest.mark.parametrize("fate", ["unsent", "lost"])
def test_a_worker_check_without_an_answer_runs_and_leaves_no_lock(
    fate: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """W4 at the worker: the check's store call is never sent, or runs with its reply lost.
    The body runs, the lease re-sends the check until the store answers, and the lock is
    released when the body ends: none is left behind, and the next enqueue runs."""
    store = tasks.indexed.dedup.store()
    real = store.start
    calls: list[str] = []

    def start(*args: Any, **kwargs: Any) -> Any:
        calls.append(fate)
        if len(calls) == 1:
            if fate == "lost":
                real(*args, **kwargs)
            raise StoreUnavailable(store.alias, f"injected: {fate}")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "start", start)
    result = tasks.indexed.enqueue(17)
    assert (result.status, result.deduplicated) == ("SUCCESSFUL", False)
    assert jobs.runs("indexed:17") == ["17"]
    assert store.get(key_of(tasks.indexed, 17)) is None
    assert tasks.indexed.enqueue(17).status == "SUCCESSFUL"
    assert jobs.runs("indexed:17") == ["17", "17"]


def test_a_debounced_task_needs_a_backend_that_defers() -> None:
    """K3: debounced on ImmediateBackend (no supports_defer): the enqueue raises naming the
    backend, nothing runs; the system check reports it as an error (E016)."""
    from django.core import checks

    from dedup_jobs.checks import check_django_tasks

    with pytest.raises(InvalidJobConfiguration, match="cannot defer a task"):
        tasks.debounced_tail.using(backend="default").enqueue("i", 1)
    assert jobs.runs("debounced_tail:i") == []
    assert [m.id for m in check_django_tasks()] == []  # on "db", DatabaseBackend
    immediate = settings.TASKS["default"]
    with override_settings(TASKS={"default": immediate, "db": immediate}):
        found = [m for m in check_django_tasks() if m.id == "dedup_jobs.E016"
                 and "tests.django_tasks_jobs.debounced_tail " in m.msg]
    assert [m.level for m in found] == [checks.ERROR]


@pytest.mark.parametrize(("options", "message"), [
    ({}, "debounce_for = None must be a number of seconds above 0"),
    ({"debounce_for": 5, "max_wait": 2}, "max_wait = 2 must be a number of seconds no smaller"),
    ({"debounce_for": 5, "debounce_on": ("sku",)}, "debounce_on names ['sku']"),
    ({"debounce_for": 5, "unique_for": 3}, "unknown option(s) unique_for"),
])
def test_bad_debounce_options_name_the_value(options: dict[str, Any], message: str) -> None:
    from dedup_jobs.django_tasks import debounced

    with pytest.raises(InvalidJobConfiguration) as raised:
        debounced(**options)(task()(_function))
    assert message in str(raised.value)


def test_a_throttled_task_needs_a_backend_that_defers() -> None:
    """K3: throttled on ImmediateBackend: the enqueue raises naming the backend (a deferred
    call could not wait), nothing runs; E016 names it too."""
    from dedup_jobs.checks import check_django_tasks

    with pytest.raises(InvalidJobConfiguration, match="throttled on the task backend 'default'"):
        tasks.throttled_held.using(backend="default").enqueue("i", "x")
    assert jobs.runs("throttled_held:i") == []
    immediate = settings.TASKS["default"]
    with override_settings(TASKS={"default": immediate, "db": immediate}):
        found = [m.msg for m in check_django_tasks() if m.id == "dedup_jobs.E016"]
    assert any(m.startswith("The throttled Django task tests.django_tasks_jobs.throttled_held")
               for m in found), found


def test_bad_throttle_options_name_the_value() -> None:
    from dedup_jobs.django_tasks import throttled

    with pytest.raises(InvalidJobConfiguration, match="needs concurrency=N"):
        throttled()(task()(_function))
    with pytest.raises(InvalidJobConfiguration, match="throttle = '5 per second'"):
        throttled(throttle="5 per second")(task()(_function))


def test_metrics_count_django_task_decisions() -> None:
    """K4: decisions are counted under the task's module path, like a job's under its name."""
    from dedup_jobs import metrics

    name = "tests.django_tasks_jobs.raising"

    def counted() -> dict[str, int]:
        metrics.tally.fold()
        return {outcome: n for (job, outcome), n in metrics.tally.totals.items() if job == name}

    before = counted()
    tasks.raising.enqueue(18)
    tasks.raising.dedup.store().acquire(key_of(tasks.raising, 18), "holder-4", 60, now=0)
    with pytest.raises(DuplicateJob):
        tasks.raising.enqueue(18)
    after = counted()
    assert after.get("dispatched", 0) - before.get("dispatched", 0) == 1
    assert after.get("deduplicated", 0) - before.get("deduplicated", 0) == 1
