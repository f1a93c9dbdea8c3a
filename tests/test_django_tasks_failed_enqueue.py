"""A Django task's enqueue that fails leaves nothing behind (S4, U6, S7 via K2), bad key
options are refused by name, and a task whose key cannot be computed at the worker runs (W4).
From a red-team of the Django-tasks front-end; each test failed before its fix."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from dedup_jobs.exceptions import StoreUnavailable
from tests import django_tasks_jobs as tasks
from tests.test_dispatch import DEAD_CACHES

RQ_DB = 14
RQ_URL = f"{settings.REDIS_URL}/{RQ_DB}"


def rq_jobs() -> list[str]:
    client = redis.Redis.from_url(RQ_URL)
    return [k.decode() for k in client.scan_iter("rq:job:*") if k.decode().count(":") == 2]


@pytest.fixture
def rq_backend() -> Any:
    redis.Redis.from_url(RQ_URL).flushdb()
    with override_settings(
        INSTALLED_APPS=[*settings.INSTALLED_APPS, "django_rq"],
        RQ_QUEUES={"default": {"URL": RQ_URL}},
        TASKS={**settings.TASKS, "rq": {"BACKEND": "django_tasks_rq.RQBackend",
                                        "QUEUES": ["default"]}},
    ):
        yield
    redis.Redis.from_url(RQ_URL).flushdb()


@pytest.mark.usefixtures("rq_backend")
@override_settings(CACHES=DEAD_CACHES, DEDUP_JOBS={"STORE": "dead"})
def test_rq_unique_store_unavailable_leaves_no_job() -> None:
    """S4 (via K2): store unreachable at enqueue -> StoreUnavailable, *nothing published*.
    On RQBackend the job is queued before task_enqueued; it must be taken back."""
    with pytest.raises(StoreUnavailable):
        tasks.indexed.using(backend="rq").enqueue(501)
    assert rq_jobs() == []


@pytest.mark.usefixtures("rq_backend")
@override_settings(CACHES=DEAD_CACHES, DEDUP_JOBS={"STORE": "dead"})
def test_rq_debounced_store_unavailable_leaves_no_job() -> None:
    """S4/S7 for a debounce dispatch on RQBackend: StoreUnavailable, nothing published."""
    with pytest.raises(StoreUnavailable):
        tasks.debounced_tail.using(backend="rq").enqueue("rt", 1)
    assert rq_jobs() == []


@pytest.mark.parametrize(("decorator", "options"), [
    ("unique", {"unique_on": 123}),
    ("debounced", {"debounce_for": 1, "debounce_on": 5}),
    ("throttled", {"concurrency": 1, "throttle_on": 5}),
])
def test_a_non_iterable_key_fields_option_names_the_value(decorator: str,
                                                          options: dict[str, Any]) -> None:
    """docs/django-tasks.md: "A bad value raises InvalidJobConfiguration when the decorator
    runs, and the message names the value"."""
    from dedup_jobs import django_tasks
    from dedup_jobs.exceptions import InvalidJobConfiguration

    (name, value), = ((k, v) for k, v in options.items() if k.endswith("_on"))
    with pytest.raises(InvalidJobConfiguration, match=f"{name} = {value!r}"):
        getattr(django_tasks, decorator)(**options)(tasks.task()(_function))


def _function(product_id: int) -> None:
    pass


def test_a_task_enqueued_around_the_decorator_whose_key_fails_runs() -> None:
    """W4 via K2: a task enqueued around the decorator (the backend's own enqueue: no key
    computed at enqueue, like a headerless message) whose key cannot be computed at the
    worker runs its body (logged), it is not failed."""
    from tests import jobs

    backend = tasks.with_context.get_backend()
    result = backend.enqueue(tasks.with_context, ["\x00"], {})
    assert result.status == "SUCCESSFUL", [e.traceback.splitlines()[-1] for e in result.errors]
    assert len(jobs.runs("with_context:\x00")) == 1


@pytest.mark.django_db(transaction=True)
@override_settings(DEDUP_JOBS={"STORE": "redis"})
def test_db_debounced_absorbed_enqueue_that_fails_does_not_change_the_burst() -> None:
    """U6/S7 analog for an absorbed debounce dispatch (debounce.py Burst.undo's own doc: "and a
    failed enqueue ... withdraw it from the one it was absorbed into"): an enqueue that raises
    after the burst absorbed it (a later task_enqueued receiver) must not become the
    burst's latest arguments: its caller was told it failed."""
    import time

    from dedup_jobs.stores import get_store
    from tests.django_tasks_jobs import task_enqueued

    on_db = tasks.debounced_tail.using(backend="db")
    first = on_db.enqueue("rt-absorbed", 1)
    assert first.deduplicated is False

    def fail_after(**kwargs: Any) -> None:
        raise RuntimeError("injected: after the debounce call")

    task_enqueued.connect(fail_after, weak=False)
    try:
        with pytest.raises(RuntimeError, match="injected"):
            on_db.enqueue("rt-absorbed", 2)
    finally:
        task_enqueued.disconnect(fail_after)
    store = get_store("redis")
    key = on_db.dedup.key(["rt-absorbed", 1], {}, store)
    due = store.claim_due(key, first.id, now=time.time() + 3600)
    assert list(due.args) == ["rt-absorbed", 1], (due.action, due.args)

