"""L3 fused (issue 26, items 1 and 2): ``dispatch_many`` of a unique job whose single
dispatches are fused (tests/fused_app.py: the broker on kombu's Redis transport through
dedup_jobs' channel, on the store's server) takes every lock and pushes every winner's
message in one round trip. Each message is the one Celery builds for its call: the first is
Celery's own, the others are checked against Celery's, field for field and byte for byte
(``jobs/fused_many.py``). Real Redis, a real (in-process) worker."""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import pytest
from celery import signals
from celery._state import _task_stack

from dedup_jobs.engine.dispatch import Dispatch
from dedup_jobs.jobs import fused_many
from dedup_jobs.stores import get_store
from tests.fused_app import FusedApp, keep_default_app, prefixed
from tests.guard_support import token
from tests.test_dispatch_many import _fewest_reads
from tests.test_fused import _commands_about, _queued
from tests.workers import thread_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]


@pytest.fixture(autouse=True)
def _default_app() -> Iterator[None]:
    with keep_default_app():
        yield


def _messages(fapp: FusedApp) -> dict[str, str]:
    """The queued messages as pushed, by task id."""
    raw = [m.decode() for m in fapp.counter.lrange(fapp.queue, 0, -1)]
    return {json.loads(m)["headers"]["id"]: m for m in raw}


def _celerys(job: Any, task_id: str, args: Any, kwargs: Any) -> str:
    """The message Celery itself builds for this call (stopped at the channel, not sent), its
    arguments as ``dispatch_many`` hands them on (a tuple, a dict: jobs/calls.py)."""
    args, kwargs = tuple(args), dict(kwargs)
    alias = job.store_alias()
    store = get_store(alias)
    key = job.job_key(args, kwargs, store)
    d = Dispatch(key=key, task_id=task_id, ttl=60.0, generated=True, replace=False)
    call, _message, _result = fused_many._captured(job, store, d, args, kwargs, alias, {})
    return call.payload


def _untagged(payload: str) -> str:
    """The message with its delivery tag (a fresh uuid per message, by kombu) blanked."""
    message = json.loads(payload)
    assert len(message["properties"].pop("delivery_tag")) == 36
    return json.dumps(message)


@contextmanager
def _inside_a_task(job: Any) -> Iterator[None]:
    """As if dispatched by a running task: Celery's current worker task is ``job``, with a
    request of its own (root and parent ids)."""
    _task_stack.push(job)
    job.push_request(id="parent-task-id", root_id="root-task-id", called_directly=False)
    try:
        yield
    finally:
        job.pop_request()
        _task_stack.pop()


CALLS = [
    (("{t}", 1), {}),
    (["{t}", 2], {}),
    (("{t}",), {"value": 3}),
    ((), {"token": "{t}", "value": "é ünïcode ☃"}),
    (("{t}", {"nested": [1, 2.5, None, True], "when": datetime.datetime(2026, 12, 6, 9, 0)}),
     {}),
    (("{t}", "x" * 3000), {}),  # its argsrepr cut at Celery's limit
    (("{t}",), {"value": "y" * 3000}),  # its kwargsrepr too
]


@pytest.mark.parametrize("inside", [False, True], ids=["from-a-client", "inside-a-task"])
def test_every_message_of_a_batch_is_the_one_celery_builds(fapp: FusedApp,
                                                            inside: bool) -> None:
    fapp.unique.delay(token(), 0)  # the script loaded, the channel's server known
    fapp.counter.delete(fapp.queue)
    calls = []
    for args, kwargs in CALLS:
        t = token()
        calls.append((type(args)(a.format(t=t) if isinstance(a, str) and a == "{t}" else a
                                 for a in args),
                      {k: v.format(t=t) if v == "{t}" else v for k, v in kwargs.items()}))
    with _inside_a_task(fapp.quiet) if inside else nullcontext():
        results = fapp.unique.dispatch_many(calls)
        queued = _messages(fapp)
        assert [r.deduplicated for r in results] == [False] * len(calls)
        assert sorted(queued) == sorted(r.id for r in results)
        if inside:  # added to the parent's trail, as Celery adds each result
            assert fapp.quiet.request.children == results
        for (args, kwargs), result in zip(calls, results, strict=True):
            assert _untagged(queued[result.id]) == _untagged(
                _celerys(fapp.unique, result.id, args, kwargs))
        if inside:
            assert all(json.loads(m)["headers"]["parent_id"] == "parent-task-id"
                       for m in queued.values())
    with thread_worker(fapp.app):
        assert [r.get(timeout=10) for r in results] == [
            kwargs.get("value", args[1] if len(args) > 1 else None)
            for args, kwargs in calls]


def test_a_fused_batch_is_one_round_trip_and_pushes_only_its_winners(fapp: FusedApp) -> None:
    fapp.quiet.delay(token(), 0)  # the script loaded, the channel's server known
    held = token()
    first = fapp.quiet.delay(held, 1)
    tokens = [token() for _ in range(6)]
    calls = [((t, n), {}) for n, t in enumerate(tokens)] + [((held, 9), {}), ((tokens[0], 9), {})]
    before = _queued(fapp)
    got: list[Any] = []
    commands = _commands_about([fapp.queue, held, *tokens],
                               lambda: got.extend(fapp.quiet.dispatch_many(calls)))
    # one command per call on the server (the script), nothing pushed by the client
    assert commands == ["EVALSHA"] * len(calls)
    assert [r.deduplicated for r in got] == [False] * 6 + [True, True]
    assert got[6].id == first.id and got[7].id == got[0].id
    assert _queued(fapp) == before + 6
    # SPEC section 8's row, counted on the server: the batch read in one go
    reads, answers = _fewest_reads(fapp.counter, lambda n: fapp.quiet.dispatch_many(
        [((token(), k), {}) for k in range(8)]))
    assert reads == 1 and [r.deduplicated for r in answers] == [False] * 8


def test_a_publish_handler_sees_every_message_and_the_batch_stays_one_round_trip(
    fapp: FusedApp,
) -> None:
    seen: list[str] = []

    def handler(headers: dict[str, Any] | None = None, **kw: Any) -> None:
        assert headers is not None
        seen.append(headers["id"])
        headers["stamped-by-handler"] = headers["id"]

    fapp.quiet.delay(token(), 0)
    fapp.counter.delete(fapp.queue)
    signals.before_task_publish.connect(handler, weak=False)
    try:
        tokens = [token() for _ in range(5)]
        results = fapp.quiet.dispatch_many([((t, n), {}) for n, t in enumerate(tokens)])
    finally:
        signals.before_task_publish.disconnect(handler)
    queued = _messages(fapp)
    assert sorted(seen) == sorted(queued) == sorted(r.id for r in results)
    # each message built by Celery (the handler's per-message header kept), none copied
    assert all(json.loads(m)["headers"]["stamped-by-handler"] == i for i, m in queued.items())


def test_a_countdown_is_the_batchs_and_a_worker_runs_each_message_once(fapp: FusedApp) -> None:
    fapp.unique.delay(token(), 0)
    fapp.counter.delete(fapp.queue)
    tokens = [token() for _ in range(10)]
    results = fapp.unique.dispatch_many([((t, n), {}) for n, t in enumerate(tokens)],
                                        countdown=0.5)
    etas = {json.loads(m)["headers"]["eta"] for m in _messages(fapp).values()}
    assert len(etas) == 1 and None not in etas
    with thread_worker(fapp.app):
        assert [r.get(timeout=15) for r in results] == list(range(10))
        store = get_store(fapp.unique.store_alias())
        wait_for(lambda: all(store.get(fapp.unique.job_key((t, 0), {})) is None
                             for t in tokens), timeout=10)
    assert [fapp.runs(t) for t in tokens] == [1] * 10


def test_a_batch_whose_messages_cannot_be_fused_goes_the_two_round_trip_way(
    fapp: FusedApp, caplog: Any
) -> None:
    # kombu's global key prefix: the queue's key is the transport's business; nothing of the
    # batch was sent when the channel refused its first message
    caplog.set_level(logging.INFO, logger="dedup_jobs")
    with prefixed(fapp) as other:
        tokens = [token() for _ in range(4)]
        results = other.unique.dispatch_many([((t, n), {}) for n, t in enumerate(tokens)]
                                             + [((tokens[0], 9), {})])
        assert "global_keyprefix" in caplog.text
        assert [r.deduplicated for r in results] == [False] * 4 + [True]
        assert fapp.counter.llen(f"pfx:{other.queue}") == 4
        with thread_worker(other.app):
            assert [r.get(timeout=10) for r in results] == [0, 1, 2, 3, 0]
