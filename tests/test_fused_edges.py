"""The fused dispatch at its edges (issue 26, docs/semantics.md#fused), found by a red-team of
it, each test failing on the first version: a publish made inside the dispatch (a
before_task_publish handler) is not the dispatch's message; a server that refuses INFO (an
ACL user without @dangerous) is not fused on, and dispatches still work and deduplicate; a
push the server refuses leaves no lock. Real Redis, the broker in database 12 of the store's
server, an app of its own (tests/fused_app.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.signals import before_task_publish
from django.conf import settings
from kombu.exceptions import OperationalError

from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.jobs.unique import UniqueJob
from dedup_jobs.stores import get_store
from tests.fused_app import BROKER_DB, FusedApp, fused_app, keep_default_app
from tests.guard_support import token

pytestmark = [pytest.mark.redis, pytest.mark.worker]



@pytest.fixture(autouse=True)
def _default_app() -> Iterator[None]:
    with keep_default_app():
        yield


def _messages(fapp: FusedApp) -> list[dict[str, Any]]:
    """The headers of every message waiting on the app's queue (oldest first)."""
    raw = fapp.counter.lrange(fapp.queue, 0, -1)
    return [json.loads(m)["headers"] for m in reversed(raw)]


# -- 1. the contextvar leaks into a publish made by a before_task_publish handler ----------

def test_a_publish_inside_before_task_publish_is_not_fused_onto_the_unique_lock(
    fapp: FusedApp,
) -> None:
    """Promise: every message but the unique dispatch's own is published as kombu's Redis
    transport publishes it; a duplicate pushes nothing. A ``before_task_publish`` handler
    that publishes another (plain) task while the unique message is being sent (audit,
    fan-out, outbox...) runs while PENDING is set: the channel fuses *that* message onto the
    unique job's lock. When the key is held, the handler's message is silently dropped (the
    script answers "duplicate" and pushes nothing) and the duplicate's own message is then
    pushed as a plain one."""
    plain = f"{fapp.app.main}.audit"
    unique_name = fapp.unique.name

    def audit(sender: Any = None, headers: Any = None, **_: Any) -> None:
        if sender == unique_name:
            fapp.app.send_task(plain, (headers["id"],))

    t = token()
    first = fapp.unique.delay(t, 1)  # before the handler: the key is now held
    assert [h["task"] for h in _messages(fapp)] == [unique_name]
    before_task_publish.connect(audit, weak=False)
    try:
        again = fapp.unique.delay(t, 2)  # a duplicate; the handler publishes an audit task
    finally:
        before_task_publish.disconnect(audit)
    assert again.deduplicated is True and again.id == first.id
    tasks = [h["task"] for h in _messages(fapp)]
    # kombu's transport: the audit message is queued, the duplicate pushes nothing
    assert tasks == [unique_name, plain], tasks


def test_a_publish_inside_before_task_publish_free_key(fapp: FusedApp) -> None:
    """The same leak with the key free: the audit message is the one the FUSED script pushes
    (under the unique job's lock), the unique message itself goes out as a plain LPUSH. The
    undo of a failed call would then LREM the *audit* payload, not the job's."""
    plain = f"{fapp.app.main}.audit"
    unique_name = fapp.unique.name
    seen: list[str] = []
    store = get_store(fapp.unique.store_alias())
    real = store.acquire_fused

    def spy(call: Any) -> Any:
        seen.append(json.loads(call.payload)["headers"]["task"])
        return real(call)

    store.acquire_fused = spy  # type: ignore[method-assign]

    def audit(sender: Any = None, headers: Any = None, **_: Any) -> None:
        if sender == unique_name:
            fapp.app.send_task(plain, (headers["id"],))

    before_task_publish.connect(audit, weak=False)
    try:
        fapp.unique.delay(token(), 1)
    finally:
        before_task_publish.disconnect(audit)
        del store.acquire_fused
    assert seen == [unique_name], f"the FUSED script was handed: {seen}"


def test_a_unique_dispatch_inside_before_task_publish_keeps_its_own_message(
    fapp: FusedApp,
) -> None:
    """The same leak through a unique job of the two-round-trip kind (``on_duplicate =
    "replace"``, never fused itself): it takes its own lock, then its publish is handed to
    the FUSED script under the *outer* job's key and owner. With the outer key held, its
    message is dropped: its own lock is left with nothing queued."""
    unique_name = fapp.unique.name

    def body(self: Any, n: int) -> int:
        return n

    replacing = fapp.app.task(base=UniqueJob, bind=True, name=f"{fapp.app.main}.replacing",
                              unique_for=60, shared=False, on_duplicate="replace")(body)
    started: list[Any] = []
    n = int(token()[:6], 16)

    def nested(sender: Any = None, **_: Any) -> None:
        if sender == unique_name:
            started.append(replacing.delay(n))

    t = token()
    fapp.unique.delay(t, 1)  # the outer key is held
    before_task_publish.connect(nested, weak=False)
    try:
        fapp.unique.delay(t, 2)
    finally:
        before_task_publish.disconnect(nested)
    [inner] = started
    lock = get_store(replacing.store_alias()).get(replacing.job_key((n,), {}))
    assert lock is not None and lock.owner == inner.id  # its own lock is taken
    tasks = [h["task"] for h in _messages(fapp)]
    assert tasks.count(replacing.name) == 1, (
        f"{replacing.name}[{inner.id}] holds its lock but its message is not queued: {tasks}")


# -- 2. a broker user without INFO (ACL -@dangerous): every unique dispatch fails -----------

@pytest.fixture
def limited_broker() -> Iterator[str]:
    """A broker URL on the same server, as an ACL user that may do everything a Celery
    producer/consumer needs, but not the @dangerous commands (INFO is one): a common
    hardening of a shared Redis."""
    admin = redis.Redis.from_url(settings.REDIS_URL)
    user, password = f"rt-{token()}", "pw-redteam"
    admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*",
                          "+@all", "-@dangerous")
    host = settings.REDIS_URL.split("://", 1)[1]
    yield f"redis://{user}:{password}@{host}/{BROKER_DB}"
    admin.execute_command("ACL", "DELUSER", user)


def test_a_broker_user_without_info_still_dispatches(limited_broker: str) -> None:
    """Promise: a message that cannot be fused falls back to two round trips (the channel
    raises Unfusable before anything is sent). The channel compares the servers by INFO's
    run_id on the *broker's* connection; an ACL user without INFO (kombu's own transport
    publishes fine with it) gets NOPERM there, which is neither Unfusable nor
    StoreUnavailable: every unique dispatch of the app raises."""
    counter = redis.Redis.from_url(f"{settings.REDIS_URL}/{BROKER_DB}")
    made = fused_app(limited_broker, counter, broker_transport_options={"max_retries": 1})
    try:
        # kombu's own path (not a unique dispatch) publishes with this user
        made.app.send_task(f"{made.app.main}.plain", (1,))
        assert counter.llen(made.queue) == 1
        result = made.unique.delay(token(), 1)
        assert result.deduplicated is False
        assert counter.llen(made.queue) == 2
    finally:
        counter.delete(made.queue)
        made.app.close()


def test_a_store_user_without_info_still_deduplicates(limited_broker: str) -> None:
    """The same on the store's side: the store compares by INFO too, and wraps its NOPERM as
    StoreUnavailable, so every dispatch of every fused job raises StoreUnavailable (no undo
    needed, nothing was sent), although ACQUIRE, EVALSHA and the store itself work; with
    ON_STORE_ERROR = "enqueue" every dispatch is published without a lock: no job is ever
    deduplicated, permanently (server_id is retried on every dispatch)."""
    from tests.faults.store import faulty_store

    store_url = limited_broker.rsplit("/", 1)[0] + "/9"
    counter = redis.Redis.from_url(f"{settings.REDIS_URL}/{BROKER_DB}")
    made = fused_app(f"{settings.REDIS_URL}/{BROKER_DB}", counter)
    try:
        with faulty_store(store_url, store_timeout=2.0, socket_timeout=2.0,
                          ON_STORE_ERROR="enqueue"):
            assert get_store(made.unique.store_alias()).acquire  # the store itself works
            t = token()
            first = made.unique.delay(t, 1)
            again = made.unique.delay(t, 2)
            assert (first.deduplicated, again.deduplicated) == (False, True)
            assert counter.llen(made.queue) == 1, "a duplicate was published"
    finally:
        counter.delete(made.queue)
        made.app.close()


# -- 3. the script fails after taking the lock: a lock with no message --------------------

def test_a_push_refused_by_the_server_leaves_no_lock(fapp: FusedApp) -> None:
    """Promise: the lock and the message, both or neither. A Lua script is not rolled back
    when a command inside it fails: FUSED writes the lock, the index and the receipt, then
    LPUSHes; if the LPUSH is refused (here WRONGTYPE: a key of another type under the
    queue's name), the lock stays. The error is wrapped as StoreUnavailable, whose undo
    (UNFUSE) finds no message (LREM 0) and leaves the lock and marks nothing REVOKED. On the
    two-round-trip path the same refused LPUSH releases the lock (U6). Every later dispatch
    of the key is a duplicate of a task that was never queued, and its result never
    resolves (until unique_for expires)."""
    fapp.quiet.delay(token(), 0)  # the queue declared (kombu caches it), the servers compared
    t = token()
    fapp.counter.delete(fapp.queue)
    fapp.counter.set(fapp.queue, "not a list")
    store = get_store(fapp.unique.store_alias())
    key = fapp.unique.job_key((t, 0), {})
    try:
        with pytest.raises(StoreUnavailable) as raised:
            fapp.unique.delay(t, 1)
        lock = store.get(key)
        assert lock is None, (
            f"{type(raised.value).__name__} raised, but the lock of {lock.owner} stays with "
            f"no message queued")
    finally:
        fapp.counter.delete(fapp.queue)
        held = store.get(key)
        if held is not None:
            store.release(key, held.owner)


def test_the_two_round_trip_path_for_contrast(fapp: FusedApp, monkeypatch: Any) -> None:
    monkeypatch.setattr("dedup_jobs.jobs.fused.why_not_fused", lambda *a: "switched off")
    fapp.quiet.delay(token(), 0)
    t = token()
    fapp.counter.delete(fapp.queue)
    fapp.counter.set(fapp.queue, "not a list")
    store = get_store(fapp.unique.store_alias())
    try:
        with pytest.raises((redis.ResponseError, OperationalError)):  # kombu: WRONGTYPE
            fapp.unique.delay(t, 1)
        assert store.get(fapp.unique.job_key((t, 0), {})) is None
    finally:
        fapp.counter.delete(fapp.queue)

