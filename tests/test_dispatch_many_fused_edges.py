"""The fused batch (``jobs/fused_many.py``) at its edges, from its red-team: every option of a
batch gives each message what Celery's own ``apply_async`` gives it (the caller's headers
over Celery's, a router that sends calls apart, the job's own options); an argument Celery
cannot serialise raises Celery's error and leaves nothing; a duplicate is no child of the
task that dispatched it; publish signals are sent once per message sent; a batch is split
into round trips by calls and by bytes, and one that fails is undone. Real Redis, the
``fapp`` fixture (tests/conftest.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kombu.exceptions import EncodeError

from dedup_jobs.engine.dispatch import Dispatch
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.jobs import fused_many
from dedup_jobs.stores import get_store
from tests.fused_app import FusedApp, keep_default_app
from tests.guard_support import token
from tests.test_dispatch_many_fused import _inside_a_task, _messages

pytestmark = [pytest.mark.redis, pytest.mark.worker]


@pytest.fixture(autouse=True)
def _default_app() -> Iterator[None]:
    with keep_default_app():
        yield


def _celery_message(job: Any, task_id: str, args: Any, kwargs: Any,
                    options: dict[str, Any]) -> dict[str, Any]:
    """Celery's own message for this call with these options (stopped at the channel)."""
    args, kwargs = tuple(args), dict(kwargs)
    alias = job.store_alias()
    store = get_store(alias)
    d = Dispatch(key=job.job_key(args, kwargs, store), task_id=task_id, ttl=60.0,
                 generated=True, replace=False)
    call, _m, _r = fused_many._captured(job, store, d, args, kwargs, alias, dict(options))
    return _norm(call.payload)


def _norm(payload: str) -> dict[str, Any]:
    m = json.loads(payload)
    m["properties"].pop("delivery_tag")
    m["headers"].pop("eta", None)
    m["headers"].pop("expires", None)
    m["properties"].pop("expiration", None)
    return m


def _warm(fapp: FusedApp) -> None:
    fapp.unique.delay(token(), 0)
    fapp.counter.delete(fapp.queue)


def _diffs(fapp: FusedApp, job: Any, options: dict[str, Any], n: int = 4) -> list[str]:
    _warm(fapp)
    calls = [((token(), k), {}) for k in range(n)]
    results = job.dispatch_many(calls, **options)
    raw = {}
    for key in fapp.counter.keys(f"{fapp.queue}*") + fapp.counter.keys("other-q*"):
        for m in fapp.counter.lrange(key, 0, -1):
            raw[json.loads(m)["headers"]["id"]] = (key.decode(), m.decode())
    out = []
    for (args, kwargs), r in zip(calls, results, strict=True):
        queue, got = raw[r.id]
        want = _celery_message(job, r.id, args, kwargs, options)
        mine = _norm(got)
        if queue.split("\x06")[0] != mine["properties"]["delivery_info"]["routing_key"]:
            out.append(f"call {args[1]} pushed onto {queue!r}")
        for part in ("headers", "properties"):
            for k in set(mine[part]) | set(want[part]):
                if mine[part].get(k) != want[part].get(k):
                    out.append(f"call {args[1]} {part}[{k}]: fused {mine[part].get(k)!r} "
                               f"celery {want[part].get(k)!r}")
        if mine["body"] != want["body"]:
            out.append(f"call {args[1]} body differs")
    for key in fapp.counter.keys("other-q*"):
        fapp.counter.delete(key)
    return out


@pytest.mark.parametrize("options", [
    {"priority": 5}, {"queue": "other-q"}, {"expires": 60}, {"headers": {"x": 1}},
    {"ignore_result": True}, {"time_limit": 10, "soft_time_limit": 5}, {"retries": 2},
    {"root_id": "r1", "parent_id": "p1"}, {"shadow": "named"}, {"reply_to": "rr"},
    {"stamped_headers": ["s"], "s": "v"}, {"serializer": "json"}, {"countdown": 5},
    {"headers": {"argsrepr": "<redacted>", "kwargsrepr": "<redacted>"}},
], ids=lambda o: ",".join(o))
def test_every_option_gives_each_message_what_celery_gives_it(
    fapp: FusedApp, options: dict[str, Any]
) -> None:
    assert _diffs(fapp, fapp.unique, options) == []


def test_the_jobs_own_options_too(fapp: FusedApp) -> None:
    from dedup_jobs.jobs.unique import UniqueJob

    def body(self: Any, token: str, value: int) -> int:
        return value

    job = fapp.app.task(base=UniqueJob, bind=True, name=f"{fapp.app.main}.tl",
                        unique_for=60, shared=False, unique_on=("token",), priority=3,
                        time_limit=30, soft_time_limit=20, expires=120,
                        queue="other-q")(body)
    assert _diffs(fapp, job, {}) == []


def test_a_router_that_sends_calls_apart_is_honoured(fapp: FusedApp) -> None:
    inner = fapp.app.amqp.router

    class ByValue:  # odd values to another queue
        def route(self, options: Any, name: Any, args: Any = (), kwargs: Any = None,
                  task_type: Any = None) -> Any:
            if args and args[1] % 2:
                options = {**options, "queue": "other-q"}
            return inner.route(options, name, args, kwargs, task_type)

    assert _diffs(fapp, fapp.unique, {"router": ByValue()}) == []


def test_an_argument_celery_cannot_serialise_raises_its_error_and_leaves_nothing(
    fapp: FusedApp,
) -> None:
    _warm(fapp)
    with pytest.raises(EncodeError):  # what Celery raises for a single dispatch
        fapp.unique.apply_async((token(), object()))
    tokens = [token() for _ in range(10)]
    calls = [((t, object() if n == 4 else n), {}) for n, t in enumerate(tokens)]
    with pytest.raises(EncodeError):
        fapp.unique.dispatch_many(calls)
    store = get_store(fapp.unique.store_alias())
    assert [t for t in tokens if store.get(fapp.unique.job_key((t, 0), {}))] == []
    assert fapp.counter.llen(fapp.queue) == 0


def test_a_duplicate_is_no_child_of_the_task_that_dispatched_it(fapp: FusedApp) -> None:
    _warm(fapp)
    held = token()
    fapp.quiet.delay(held, 0)
    fresh = token()
    with _inside_a_task(fapp.quiet):
        fapp.quiet.dispatch_many([((held, 1), {}), ((fresh, 2), {}), ((fresh, 3), {})])
        batch = [c.id for c in fapp.quiet.request.children]
        fapp.quiet.delay(held, 4)  # a single fused dispatch, a duplicate
        single = [c.id for c in fapp.quiet.request.children]
    queued = set(_messages(fapp))
    assert len(batch) == 1 and set(batch) <= queued
    assert single == batch


def test_a_header_that_renames_the_messages_is_not_fused(fapp: FusedApp) -> None:
    # headers={"id": ...} gives the message another id than its dispatch's: the channel could
    # not tell it; the batch takes the two-round-trip way, and publishes each call once
    _warm(fapp)
    tokens = [token() for _ in range(3)]
    fapp.unique.dispatch_many([((t, n), {}) for n, t in enumerate(tokens)],
                              headers={"id": "custom"})
    assert fapp.counter.llen(fapp.queue) == 3


def test_publish_signals_are_sent_once_per_message_sent(fapp: FusedApp) -> None:
    """task_routes sends one call to a topic exchange, which the channel would refuse after
    the calls before it were built: the batch is not fused, and each message is built once."""
    from celery import signals
    from django.conf import settings
    from kombu import Exchange, Queue

    from tests.fused_app import BROKER_DB, fused_app

    topic = Queue("edge-topic-q", Exchange("edge-topic", type="topic"), routing_key="rt")

    def route(name: Any, args: Any, kwargs: Any, options: Any, task: Any = None,
              **kw: Any) -> Any:
        return {"queue": topic} if args and args[1] == 2 else None

    other = fused_app(f"{settings.REDIS_URL}/{BROKER_DB}", fapp.counter, task_routes=(route,))
    before: list[str] = []
    after: list[str] = []

    def on_before(headers: Any = None, **kw: Any) -> None:
        before.append(headers["id"])

    def on_after(headers: Any = None, **kw: Any) -> None:
        after.append(headers["id"])

    other.unique.delay(token(), 0)
    signals.before_task_publish.connect(on_before, weak=False)
    signals.after_task_publish.connect(on_after, weak=False)
    try:
        results = other.unique.dispatch_many([((token(), n), {}) for n in range(3)])
    finally:
        signals.before_task_publish.disconnect(on_before)
        signals.after_task_publish.disconnect(on_after)
        other.close()
        fapp.counter.delete("edge-topic-q")
    ids = sorted(r.id for r in results)
    assert sorted(before) == ids and sorted(after) == ids


def test_a_batch_is_split_into_round_trips_by_calls_and_by_bytes(
    fapp: FusedApp, monkeypatch: Any
) -> None:
    _warm(fapp)
    store = get_store(fapp.unique.store_alias())
    trips: list[list[int]] = []  # the payload sizes of each round trip
    real = store.acquire_fused_many
    monkeypatch.setattr(store, "acquire_fused_many", lambda calls: (
        trips.append([len(c.payload) for c in calls]), real(calls))[1])
    monkeypatch.setattr(fused_many, "CHUNK", 4)
    monkeypatch.setattr(fused_many, "CHUNK_BYTES", 7000)
    small = [((token(), n), {}) for n in range(9)]
    big = [((token(), "b" * 3000), {}) for _ in range(5)]  # about 4 KB a message
    results = fapp.unique.dispatch_many(small + big)
    assert sum(len(t) for t in trips) == 14 and len(trips) >= 7
    for trip, after in zip(trips, [*trips[1:], []], strict=True):
        # within the limits (a message over the bytes alone), and no room for the next call
        assert len(trip) <= 4 and (len(trip) == 1 or sum(trip) <= 7000)
        assert not after or len(trip) == 4 or sum(trip) + after[0] > 7000
    assert sorted(_messages(fapp)) == sorted(r.id for r in results)


def test_a_round_trip_that_fails_undoes_its_calls_and_earlier_ones_stand(
    fapp: FusedApp, monkeypatch: Any
) -> None:
    from tests.workers import wait_for

    _warm(fapp)
    store = get_store(fapp.unique.store_alias())
    real = store.acquire_fused_many
    seen: list[int] = []

    def flaky(calls: Any) -> Any:
        seen.append(len(calls))
        if len(seen) == 2:
            real(calls)  # ran, its reply "late"
            raise StoreUnavailable("redis", "late")
        return real(calls)

    monkeypatch.setattr(store, "acquire_fused_many", flaky)
    monkeypatch.setattr(fused_many, "CHUNK", 50)
    tokens = [token() for _ in range(120)]
    with pytest.raises(StoreUnavailable):
        fapp.unique.dispatch_many([((t, n), {}) for n, t in enumerate(tokens)])

    def locked() -> list[int]:
        return [i for i, t in enumerate(tokens) if store.get(fapp.unique.job_key((t, 0), {}))]

    # the undo of the failed round trip's calls runs on the rollback thread
    wait_for(lambda: locked() == list(range(50)) and fapp.counter.llen(fapp.queue) == 50,
             timeout=20)
    assert seen == [50, 50]


def test_calls_refused_as_late_are_made_again_alone(fapp: FusedApp, monkeypatch: Any) -> None:
    _warm(fapp)
    store = get_store(fapp.unique.store_alias())
    held = token()
    first = fapp.unique.delay(held, 0)
    monkeypatch.setattr(store, "skew_ms", -60_000)  # every script of the batch refused as 'L'
    a, b = token(), token()
    results = fapp.unique.dispatch_many([((a, 1), {}), ((held, 2), {}), ((a, 3), {}),
                                         ((b, 4), {})])
    assert [r.deduplicated for r in results] == [False, True, True, False]
    assert results[1].id == first.id and results[2].id == results[0].id
    assert sorted(_messages(fapp)) == sorted([first.id, results[0].id, results[3].id])
