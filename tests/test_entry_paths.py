"""W1 to W4: the worker-side guard on every way a message reaches a worker, with a real prefork
subprocess worker, once on the real Redis broker and once on the real RabbitMQ broker.

Each test holds a key with a running ("gated") copy, sends a copy of the same key along the
entry path under test, and asserts how many times the key's body ran.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import celery
import pytest
from celery import chain, chord, group, states
from celery.exceptions import TaskRevokedError
from django.conf import settings
from django.test import override_settings

from dedup_jobs.jobs.base import HEADER
from tests import jobs_guard as jg
from tests.guard_support import (
    BROKERS,
    QUEUE,
    guard_worker,
    kill_worker,
    lock_of,
    other_app,
    publishing_to,
    report,
    reset_queue,
    token,
    wait_ready,
    worker_logs,
)
from tests.settings_guard import DEAD_CACHE
from tests.workers import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]

CELERY_5_5 = celery.VERSION[:2] < (5, 6)
#: Celery 5.5 features the tests below rely on (docs/versions.md, "Celery 5.5")
NEEDS_CELERY_5_6_CHORD = pytest.mark.skipif(
    CELERY_5_5,
    reason="Celery 5.5 applies a chord body without its chord's group id, so a body whose key "
    "is held cannot be told from a frozen signature at dispatch (docs/versions.md)",
)
NEEDS_RETRY_ON_WORKER_LOST = pytest.mark.skipif(
    CELERY_5_5, reason="Task.retry_on_worker_lost is new in Celery 5.6"
)

#: LEASE_SECONDS of the module's worker: long enough that "released at once" (within 2 s)
#: can never be the lease running out.
LEASE_SECONDS = 15

BROKER_PARAMS = [
    pytest.param("redis", id="redis-broker"),
    # every entry path once more through RabbitMQ: the slow matrix step (`-m matrix`); the
    # RabbitMQ broker stays in every run through tests/test_debounce_rabbitmq.py
    pytest.param("rabbitmq", marks=[pytest.mark.rabbitmq, pytest.mark.matrix],
                 id="rabbitmq-broker"),
]


@pytest.fixture(scope="module", params=BROKER_PARAMS)
def broker(request: pytest.FixtureRequest) -> Iterator[str]:
    """One prefork worker per broker for the whole module; the test app publishes to it."""
    from tests.celery_app import app
    from tests.conftest import need

    name: str = request.param
    need("redis")
    if name == "rabbitmq":
        need("rabbitmq")
    reset_queue(app, BROKERS[name])
    env = {"DEDUP_JOBS_TEST_LEASE_SECONDS": str(LEASE_SECONDS)}
    with guard_worker(app, name, env=env), publishing_to(app, BROKERS[name]):
        yield name


def runs_of(tok: str) -> list[str]:
    return jg.runs(tok)


def started(tok: str, count: int = 1) -> None:
    wait_for(lambda: len(jg.runs(tok)) >= count)


def final_meta(app: Any, task_id: str) -> dict[str, Any] | None:
    """The stored outcome of ``task_id`` once it is ready (read from Redis, no cache)."""
    meta: dict[str, Any] = app.backend.get_task_meta(task_id, cache=False)
    return meta if meta["status"] in states.READY_STATES else None


def hold(t: str, item: int) -> Any:
    """A running copy of key (t, item) that holds the lock until the test opens gate t."""
    before = len(jg.runs(t))
    holder = jg.guard_gated.delay(t, item, gate=t)
    started(t, before + 1)
    return holder


# -- delay / apply_async / signature -----------------------------------------------------


def test_delay(broker: str) -> None:
    """U2/W2 delay: a delay() while a copy runs is deduplicated (0 executions); a delay()
    while the key is free runs once and releases. Key executions: 2."""
    t = token()
    holder = hold(t, 1)
    dup = jg.guard_gated.delay(t, 1)
    assert dup.deduplicated is True and dup.id == holder.id
    jg.open_gate(t)
    assert holder.get(timeout=20) == 1
    wait_for(lambda: lock_of(jg.guard_gated, t, 1) is None)
    assert jg.guard_gated.delay(t, 1).get(timeout=20) == 1
    report("delay", broker, 2, len(runs_of(t)))
    assert runs_of(t) == ["1", "1"]


def test_apply_async(broker: str) -> None:
    """U2/W2 apply_async: positional and keyword calls share a key; the duplicate is not
    published (0 executions); the free dispatch runs once. Key executions: 2."""
    t = token()
    holder = jg.guard_gated.apply_async((t, 1), {"gate": t})
    started(t)
    dup = jg.guard_gated.apply_async(kwargs={"token": t, "item": 1})
    assert dup.deduplicated is True and dup.id == holder.id
    jg.open_gate(t)
    assert holder.get(timeout=20) == 1
    wait_for(lambda: lock_of(jg.guard_gated, t, 1) is None)
    assert jg.guard_gated.apply_async(kwargs={"token": t, "item": 1}).get(timeout=20) == 1
    report("apply_async", broker, 2, len(runs_of(t)))
    assert runs_of(t) == ["1", "1"]


def test_signature(broker: str) -> None:
    """U2/W2 signatures: s().delay(), signature().apply_async() and a frozen signature are
    deduplicated while a copy runs (0 executions). Key executions: 2."""
    t = token()
    holder = jg.guard_gated.s(t, 1, gate=t).delay()
    started(t)
    frozen = jg.guard_gated.s(t, 1)
    frozen.freeze()
    for dup in (jg.guard_gated.signature((t, 1)).apply_async(), frozen.apply_async()):
        assert dup.deduplicated is True and dup.id == holder.id
    jg.open_gate(t)
    assert holder.get(timeout=20) == 1
    wait_for(lambda: lock_of(jg.guard_gated, t, 1) is None)
    assert jg.guard_gated.si(t, 1).apply_async().get(timeout=20) == 1
    report("signature", broker, 2, len(runs_of(t)))
    assert runs_of(t) == ["1", "1"]


# -- chain ----------------------------------------------------------------------------------


def test_chain_first_link(broker: str) -> None:
    """W2/W3 chain, first link: a chain whose first link's key is held ends REVOKED at the
    worker (its id was frozen by the chain, so it is published and skipped); the later link
    does not run but reaches REVOKED too, so chain.get() does not hang. Then a free chain runs
    both links once."""
    t = token()
    holder = hold(t, 1)
    result = chain(jg.guard_gated.si(t, 1), jg.guard_gated.si(t, 2)).apply_async()
    with pytest.raises(TaskRevokedError):
        result.get(timeout=20)
    assert result.parent.state == "REVOKED"
    assert holder.id in str(result.parent.result)
    jg.open_gate(t)
    assert holder.get(timeout=20) == 1
    assert runs_of(t) == ["1"]
    wait_for(lambda: lock_of(jg.guard_gated, t, 1) is None)
    assert (
        chain(jg.guard_gated.si(t, 1), jg.guard_gated.si(t, 2)).apply_async().get(timeout=20) == 2
    )
    report(
        "chain (first link)", broker, {"1": 2, "2": 1}, {i: runs_of(t).count(i) for i in ("1", "2")}
    )
    assert sorted(runs_of(t)) == ["1", "1", "2"]
    assert lock_of(jg.guard_gated, t, 1) is None and lock_of(jg.guard_gated, t, 2) is None


def test_chain_later_link(broker: str) -> None:
    """W2/W3 chain, later link: the first link runs; the later link, whose key is held, is
    skipped at the worker and ends REVOKED naming the holder; chain.get() does not hang."""
    t = token()
    holder = hold(t, 2)
    result = chain(jg.guard_gated.si(t, 1), jg.guard_gated.si(t, 2)).apply_async()
    with pytest.raises(TaskRevokedError):
        result.get(timeout=20)
    assert result.state == "REVOKED" and holder.id in str(result.result)
    assert result.parent.get(timeout=20) == 1
    jg.open_gate(t)
    assert holder.get(timeout=20) == 2
    report(
        "chain (later link)", broker, {"1": 1, "2": 1}, {i: runs_of(t).count(i) for i in ("1", "2")}
    )
    assert sorted(runs_of(t)) == ["1", "2"]


# -- group and chord -----------------------------------------------------------------------


def test_group(broker: str) -> None:
    """W2/W3 group: a duplicate inside one group, and a member whose key another copy holds,
    are SUCCESS with result None; group.get() completes. Executions: one per key."""
    t = token()
    outside = jg.guard_gated.delay(t, 3, gate=f"{t}-outside")
    started(t)
    result = group(
        jg.guard_gated.s(t, 1, gate=t),
        jg.guard_gated.s(t, 1),
        jg.guard_gated.s(t, 2),
        jg.guard_gated.s(t, 3),
    ).apply_async()
    # The in-group duplicate and the member held from outside finish while their holders run.
    wait_ready(result.results[1])
    wait_ready(result.results[3])
    jg.open_gate(t)
    assert result.get(timeout=20) == [1, None, 2, None]
    jg.open_gate(f"{t}-outside")
    assert outside.get(timeout=20) == 3
    report(
        "group", broker, {"1": 1, "2": 1, "3": 1}, {i: runs_of(t).count(i) for i in ("1", "2", "3")}
    )
    assert sorted(runs_of(t)) == ["1", "2", "3"]


def test_chord_header(broker: str) -> None:
    """W2/W3 chord header: a duplicate inside the header is SUCCESS/None, the body still runs
    once with [1, None, 2]; nothing waits."""
    t = token()
    result = chord(
        [jg.guard_gated.s(t, 1, gate=t), jg.guard_gated.s(t, 1), jg.guard_gated.s(t, 2)],
        jg.guard_collect.s(t),
    ).apply_async()
    wait_ready(result.parent.results[1])
    jg.open_gate(t)
    assert result.get(timeout=20) == [1, None, 2]
    report(
        "chord (header)",
        broker,
        {"1": 1, "2": 1, "body": 1},
        {"1": runs_of(t).count("1"), "2": runs_of(t).count("2"), "body": len(runs_of(f"{t}:body"))},
    )
    assert sorted(runs_of(t)) == ["1", "2"]
    assert runs_of(f"{t}:body") == ["[1, None, 2]"]


@NEEDS_CELERY_5_6_CHORD
def test_chord_body(broker: str) -> None:
    """W2/W3 chord body: a body whose key another copy holds is skipped at the worker and is
    SUCCESS/None, so the chord result is ready; the body ran only as the holder."""
    t = token()
    holder = jg.guard_collect.delay(["holder"], t, gate=t)
    wait_for(lambda: runs_of(f"{t}:body"))
    result = chord(
        [jg.guard_gated.s(t, 1), jg.guard_gated.s(t, 2)], jg.guard_collect.s(t)
    ).apply_async()
    assert result.get(timeout=20) is None
    assert result.parent.get(timeout=20) == [1, 2]
    jg.open_gate(t)
    assert holder.get(timeout=20) == ["holder"]
    report(
        "chord (body)",
        broker,
        {"header": 2, "body": 1},
        {"header": len(runs_of(t)), "body": len(runs_of(f"{t}:body"))},
    )
    assert sorted(runs_of(t)) == ["1", "2"]
    assert runs_of(f"{t}:body") == ["['holder']"]


# -- messages without the header ------------------------------------------------------------


def test_send_task_by_name(app: Any, broker: str) -> None:
    """W1/W3 app.send_task by name (no header): while a copy runs it is skipped at the worker
    (REVOKED naming the holder); the holder's lock survives it, so a third dispatch is still
    deduplicated; sent while free it runs once and releases. Key executions: 2."""
    t = token()
    holder = hold(t, 1)
    stray = app.send_task("tests.guard_gated", (t, 1))
    with pytest.raises(TaskRevokedError, match=holder.id):
        stray.get(timeout=20)
    assert lock_of(jg.guard_gated, t, 1).owner == holder.id
    third = jg.guard_gated.delay(t, 1)
    assert third.deduplicated is True and third.id == holder.id
    jg.open_gate(t)
    assert holder.get(timeout=20) == 1
    wait_for(lambda: lock_of(jg.guard_gated, t, 1) is None)
    assert app.send_task("tests.guard_gated", kwargs={"token": t, "item": 1}).get(timeout=20) == 1
    assert lock_of(jg.guard_gated, t, 1) is None
    report("app.send_task", broker, 2, len(runs_of(t)))
    assert runs_of(t) == ["1", "1"]


def test_signature_from_app_without_the_class(app: Any, broker: str) -> None:
    """W1 a signature built by name in a second Celery app that lacks the class: skipped while
    a copy runs (REVOKED), runs once when free. Key executions: 2."""
    t = token()
    other = other_app(broker)
    try:
        holder = hold(t, 1)
        assert "tests.guard_gated" not in other.tasks
        stray = other.signature("tests.guard_gated", args=(t, 1)).apply_async()
        assert stray.id != holder.id
        with pytest.raises(TaskRevokedError, match=holder.id):
            app.AsyncResult(stray.id).get(timeout=20)
        jg.open_gate(t)
        assert holder.get(timeout=20) == 1
        wait_for(lambda: lock_of(jg.guard_gated, t, 1) is None)
        later = other.signature("tests.guard_gated", args=(t, 1)).apply_async()
        assert app.AsyncResult(later.id).get(timeout=20) == 1
    finally:
        other.close()
    report("signature from an app without the class", broker, 2, len(runs_of(t)))
    assert runs_of(t) == ["1", "1"]


def test_manual_resend_of_finished_task(app: Any, broker: str) -> None:
    """W2 a manual re-send (same id, same header) of a finished task: the key is free, so it
    runs once more and releases; re-sent again while another copy holds the key, it is
    skipped (REVOKED naming the holder). Key executions: first + re-send + holder = 3."""
    t = token()
    first = jg.guard_gated.delay(t, 1)
    assert first.get(timeout=20) == 1
    header = jg.guard_gated.job_key((t, 1), {}).as_header(jg.guard_gated.store_alias())

    def resend() -> dict[str, Any]:
        """Re-publish the finished message; its outcome, read from the result store itself
        (a result object for a reused id may still hold the earlier outcome)."""
        app.AsyncResult(first.id).forget()
        app.send_task("tests.guard_gated", (t, 1), task_id=first.id, headers={HEADER: header})
        meta: dict[str, Any] = wait_for(lambda: final_meta(app, first.id))
        return meta

    again = resend()
    assert (again["status"], again["result"]) == ("SUCCESS", 1)
    wait_for(lambda: lock_of(jg.guard_gated, t, 1) is None)
    holder = hold(t, 1)
    skipped = resend()
    assert skipped["status"] == "REVOKED" and holder.id in str(skipped["result"])
    jg.open_gate(t)
    assert holder.get(timeout=20) == 1
    report("manual re-send of a finished task", broker, 3, len(runs_of(t)))
    assert runs_of(t) == ["1", "1", "1"]


# -- retry ----------------------------------------------------------------------------------


def test_retry(app: Any, broker: str) -> None:
    """U4/W2 retry: the retry keeps the lock and is not blocked by it; during the retry a
    delay() is deduplicated to the retrying task and a send_task copy is skipped at the
    worker. Attempts: 2 (0 and 1); duplicates: 0."""
    t = token()
    result = jg.guard_retry.delay(t, gate=t)
    started(t)
    dup = jg.guard_retry.delay(t)
    assert dup.deduplicated is True and dup.id == result.id
    stray = app.send_task("tests.guard_retry", (t,))
    with pytest.raises(TaskRevokedError, match=result.id):
        stray.get(timeout=20)
    jg.open_gate(t)
    assert result.get(timeout=20) == 1
    wait_for(lambda: lock_of(jg.guard_retry, t) is None)
    report("retry", broker, 2, len(runs_of(t)))
    assert runs_of(t) == ["0", "1"]


# -- only the owner releases ----------------------------------------------------------------


def test_run_that_lost_its_lock_never_releases_the_new_owners(broker: str) -> None:
    """U4 (only the owner releases): a run whose lock was removed under it (admin release)
    and taken by a new dispatch finishes without deleting or shortening the new owner's lock;
    its lease does not take the lock back. Key executions: 2."""
    t = token()
    first = hold(t, 1)
    store = jg.guard_gated.store()
    key = jg.guard_gated.job_key((t, 1), {})
    assert store.release(key, first.id)
    second = jg.guard_gated.delay(t, 1, gate=f"{t}-second")
    assert second.deduplicated is False
    started(t, 2)
    before = store.get(key)
    # The first run's lease comes due (every LEASE_SECONDS/3), finds another owner, stops.
    line = worker_log_line(f"running task {first.id} is held by another owner")
    assert "WARNING" in line
    jg.open_gate(t)
    assert first.get(timeout=20) == 1
    after = store.get(key)
    assert after is not None and after.owner == second.id
    assert after.expires_at is not None and before is not None
    assert after.expires_at >= before.expires_at
    jg.open_gate(f"{t}-second")
    assert second.get(timeout=20) == 1
    wait_for(lambda: store.get(key) is None)
    report("bypass run finishing (only the owner releases)", broker, 2, len(runs_of(t)))
    assert runs_of(t) == ["1", "1"]


# -- crash and redelivery -------------------------------------------------------------------


def test_acks_late_redelivered_after_sigkill(app: Any, broker: str) -> None:
    """W2 acks_late redelivery: the worker is SIGKILLed mid-run; the message comes back to a
    new worker with the same id, which holds the lock (or finds it free) and runs it to the
    end. A dispatch during the crash is deduplicated. Starts: 2, completions: 1."""
    t = token()
    # Its own queue and workers, away from the module's worker.
    queue = f"{QUEUE}-crash"
    reset_queue(app, BROKERS[broker], queue)
    env = {"DEDUP_JOBS_TEST_VISIBILITY": "3"}
    with guard_worker(app, broker, env=env, concurrency=1, queue=queue) as proc:
        result = jg.guard_acks_late.apply_async((t,), {"gate": t}, queue=queue)
        wait_for(lambda: runs_of(t) == ["'start'"])
        kill_worker(proc)
    assert lock_of(jg.guard_acks_late, t) is not None
    dup = jg.guard_acks_late.apply_async((t,), queue=queue)
    assert dup.deduplicated is True and dup.id == result.id
    jg.open_gate(t)
    with guard_worker(app, broker, env=env, concurrency=1, queue=queue):
        assert result.get(timeout=30) == t
        wait_for(lambda: lock_of(jg.guard_acks_late, t) is None)
    report(
        "acks_late redelivered after SIGKILL",
        broker,
        {"start": 2, "done": 1},
        {"start": runs_of(t).count("'start'"), "done": runs_of(t).count("'done'")},
    )
    assert runs_of(t) == ["'start'", "'start'", "'done'"]


# -- dropped messages: revoked, expired, time limits (U4) ---------------------------------


def test_revoked_while_running_releases(app: Any, broker: str) -> None:
    """U4: revoke(terminate=True, signal=SIGKILL) of a running job releases its lock at once
    (the worker's main process releases; the killed process cannot); a later dispatch runs."""
    t = token()
    result = hold(t, 1)
    with app.connection_for_write(BROKERS[broker]) as conn:
        result.revoke(terminate=True, signal="SIGKILL", connection=conn)
    wait_ready(result)
    assert result.state == "REVOKED"
    # Well within the lease (15 s): released by the worker, not expired.
    wait_for(lambda: lock_of(jg.guard_gated, t, 1) is None, timeout=2.0)
    jg.open_gate(t)
    assert jg.guard_gated.delay(t, 1).get(timeout=20) == 1
    assert runs_of(t) == ["1", "1"]


def test_expired_before_running_releases(broker: str) -> None:
    """U4: a message that expires before the worker runs it is revoked and releases its
    lock; its body never runs."""
    t = token()
    result = jg.guard_gated.apply_async((t, 1), countdown=1.0, expires=0.5)
    assert lock_of(jg.guard_gated, t, 1).owner == result.id
    wait_ready(result)
    assert result.state == "REVOKED"
    wait_for(lambda: lock_of(jg.guard_gated, t, 1) is None, timeout=2.0)
    assert runs_of(t) == []


@pytest.mark.parametrize(
    ("job", "error"),
    [
        pytest.param(jg.guard_hard_limit, "TimeLimitExceeded", id="hard"),
        pytest.param(jg.guard_soft_limit, "SoftTimeLimitExceeded", id="soft"),
    ],
)
def test_time_limit_releases(broker: str, job: Any, error: str) -> None:
    """U4: a job stopped by its time limit fails and its lock is released at once: by the job
    as it fails (soft), by the worker's main process (hard: the job ignores SIGTERM and is
    SIGKILLed, so it cannot) -- not left for the lease (15 s) to expire."""
    t = token()
    result = job.delay(t)
    wait_ready(result)
    assert result.state == "FAILURE"
    assert type(result.result).__name__ == error
    wait_for(lambda: lock_of(job, t) is None, timeout=2.0)
    assert runs_of(t) == ["'start'"]


# -- W4: when in doubt, run -----------------------------------------------------------------


def worker_log_line(needle: str) -> str:
    """The first line of the worker logs that contains ``needle`` (waits for it)."""

    def find() -> str | None:
        text = "".join(path.read_text(errors="replace") for path in worker_logs())
        return next((line for line in text.splitlines() if needle in line), None)

    line: str = wait_for(find)
    return line


def test_store_unreachable_at_worker_runs_and_warns(broker: str) -> None:
    """W4: the store named in the message header is unreachable at the worker (a Redis port
    where nothing listens; the dispatch used ON_STORE_ERROR="enqueue"): the job runs anyway
    and the worker logs a WARNING on dedup_jobs naming the task and its id."""
    t = token()
    with override_settings(
        CACHES={**settings.CACHES, "dead": DEAD_CACHE},
        DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "dead", "ON_STORE_ERROR": "enqueue"},
    ):
        result = jg.guard_gated.delay(t, 1)
    assert result.get(timeout=20) == 1
    assert runs_of(t) == ["1"]
    line = worker_log_line(f"tests.guard_gated[{result.id}]: store 'dead' unavailable")
    assert "WARNING" in line


def test_headerless_message_without_key_runs_and_warns(app: Any, broker: str) -> None:
    """W4: a message without the header whose key cannot be computed (unique_id raises) runs
    and the worker logs a WARNING naming the task and its id."""
    t = token()
    result = app.send_task("tests.guard_keyless", (t, -1))
    assert result.get(timeout=20) == -1
    assert runs_of(t) == ["-1"]
    line = worker_log_line(f"tests.guard_keyless[{result.id}]")
    assert "WARNING" in line and "no dedup key" in line


def test_pool_process_killed_releases(broker: str) -> None:
    """U4/U5: the pool process running a job is SIGKILLed (as the OOM killer does) while the
    worker lives: the job fails with WorkerLostError and the worker's main process releases
    its lock, long before the lease (15 s) would run out."""
    t = token()
    result = jg.guard_pid.delay(t, gate=t)
    wait_for(lambda: runs_of(t))
    os.kill(int(runs_of(t)[0]), signal.SIGKILL)
    held = lock_of(jg.guard_pid, t)  # no renewal after the kill: this is its last expiry
    wait_ready(result)
    assert result.state == "FAILURE"
    assert type(result.result).__name__ == "WorkerLostError"
    wait_for(lambda: lock_of(jg.guard_pid, t) is None, timeout=2.0)
    assert held is not None and held.expires_at is not None
    assert time.time() < held.expires_at - 2, "the lock expired instead of being released"


@NEEDS_RETRY_ON_WORKER_LOST
def test_retry_on_worker_lost_is_not_swallowed(broker: str) -> None:
    """U4: with retry_on_worker_lost, the retry Celery publishes after the pool process dies
    (same task id) is not deduplicated against the dead run's lock: it runs, succeeds and
    releases. Executions: 2 (the killed attempt and the retry)."""
    t = token()
    result = jg.guard_pid_retry.delay(t, gate=t)
    wait_for(lambda: runs_of(t))
    os.kill(int(runs_of(t)[0]), signal.SIGKILL)
    assert result.get(timeout=20) == 1
    wait_for(lambda: lock_of(jg.guard_pid_retry, t) is None)
    report("retry_on_worker_lost after a pool process is killed", broker, 2, len(runs_of(t)))
    assert len(runs_of(t)) == 2
