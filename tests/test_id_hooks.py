"""Ids and keys (SPEC A4, section 1): an id hook (``unique_id()``, ``debounce_id()``,
``throttle_id()``) returns a ``str`` or an ``int``, anything else is refused naming the hook
before any store call; keys are unambiguous, also when a task name or an id holds ``:``,
on every store, in the admin's job filter and on a cluster (tests/cluster/test_contract.py
runs the store test here on both clusters)."""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings

from dedup_jobs import DebouncedJob, ThrottledJob, UniqueJob, clock
from dedup_jobs.exceptions import InvalidJobId, StoreUnavailable
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.search import Search
from tests import admin_helpers
from tests.admin_helpers import PASSWORD, make_user
from tests.conftest import ALL_STORE_PARAMS, store_fixture
from tests.test_bad_input import queued

store_name = store_fixture(ALL_STORE_PARAMS)
listed_store = admin_helpers.listed_store

LOCKS = "/admin/dedup_jobs/joblock/"


class RawUnique(UniqueJob):
    """Its unique_id() returns what it is given, as it is."""

    name = "tests.hook_unique"
    unique_for = 60

    def unique_id(self, value: Any) -> Any:
        return value

    def run(self, value: Any) -> None:
        return None


class RawDebounce(DebouncedJob):
    name = "tests.hook_debounce"
    debounce_for = 30

    def debounce_id(self, value: Any) -> Any:
        return value

    def run(self, value: Any) -> None:
        return None


class RawThrottle(ThrottledJob):
    name = "tests.hook_throttle"
    concurrency = 1

    def throttle_id(self, value: Any) -> Any:
        return value

    def run(self, value: Any) -> None:
        return None


class Collection(UniqueJob):
    """Job ``tests.col``: with id ``x:y`` its key must differ from ``tests.col:x``'s ``y``."""

    name = "tests.col"
    unique_for = 60

    def unique_id(self, value: str) -> str:
        return value

    def run(self, value: str) -> None:
        return None


class CollectionX(Collection):
    name = "tests.col:x"


def _register() -> tuple[Any, ...]:
    from tests.celery_app import app

    return tuple(app.register_task(cls()) for cls in (RawUnique, RawDebounce, RawThrottle,
                                                      Collection, CollectionX))


raw_unique, raw_debounce, raw_throttle, col, col_x = _register()
HOOKS = {raw_unique: "unique_id()", raw_debounce: "debounce_id()",
         raw_throttle: "throttle_id()"}


# -- what an id hook may return -----------------------------------------------------------


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("job", ["unique", "debounce", "throttle"])
@pytest.mark.parametrize("value", [None, b"abc", 1.5, True, ["a"], ("a", 1)],
                         ids=["None", "bytes", "float", "bool", "list", "tuple"])
@pytest.mark.parametrize("on_error", ["raise", "enqueue"])
def test_an_id_hook_returning_no_str_or_int_is_refused_by_name(
    app: Any, job: str, value: Any, on_error: str
) -> None:
    """A4: an id hook that returns anything but a str or an int (None, bytes, a float, a
    bool, a list...) raises a ValueError naming the job, the hook, the value and its type,
    before any store call: never StoreUnavailable, nothing published or locked, also with
    ON_STORE_ERROR="enqueue"."""
    task = {"unique": raw_unique, "debounce": raw_debounce, "throttle": raw_throttle}[job]
    with (
        override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "redis",
                                      "ON_STORE_ERROR": on_error}),
        pytest.raises(InvalidJobId) as caught,
    ):
        task.delay(value)
    assert isinstance(caught.value, ValueError)
    assert not isinstance(caught.value, StoreUnavailable)
    message = str(caught.value)
    assert task.name in message and HOOKS[task] in message, message
    assert repr(value) in message and type(value).__name__ in message, message
    assert "str or an int" in message, message
    assert queued(app) == 0
    store = get_store("redis")
    now = clock.now()
    assert not store.lock_page(offset=0, limit=5, now=now).items
    assert not store.debounce_page(offset=0, limit=5, now=now).items


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_str_and_int_ids_are_taken_as_text(app: Any) -> None:
    """A4: a str id is the id as it is (``"b'abc'"`` no longer collides with ``b"abc"``,
    which is refused); an int is its decimal text (an IntEnum too)."""
    import enum

    class Size(enum.IntEnum):
        BIG = 3

    assert raw_unique.job_key(("b'abc'",), {}).key == "dedup_jobs:unique:tests.hook_unique:b'abc'"
    assert raw_unique.job_key((7,), {}).key.endswith(":tests.hook_unique:7")
    assert raw_unique.job_key((Size.BIG,), {}).key.endswith(":tests.hook_unique:3")
    assert raw_throttle.throttle_key((7,), {}).key.endswith(":tests.hook_throttle:7")
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "redis"}):
        assert raw_unique.delay("b'abc'").deduplicated is False
        with pytest.raises(InvalidJobId):
            raw_unique.delay(b"abc")
        assert raw_throttle.delay(7).id
    assert queued(app) == 2


# -- unambiguous keys ---------------------------------------------------------------------

#: (task name, id) pairs that shared a key when names and ids were joined with ":" as they
#: are; an escape-looking name and id too
COLON_PAIRS = [("tests.col", "x:y"), ("tests.col:x", "y"), ("tests.col%3Ax", "y"),
               ("tests.col", "x%3Ay"), ("tests.col%", "x"), ("tests.col%25", "x")]


def test_keys_of_ordinary_names_are_unchanged() -> None:
    """Section 1: a task name without ":" or "%" is written as it is, so a key taken before
    this encoding is the same key now (nothing held is orphaned by an upgrade); a name with
    ":" has it written as "%3A" (and "%" as "%25")."""
    from dedup_jobs.keys import name_part

    assert build_key("unique", "shop.tasks.sync", "item=1").key == (
        "dedup_jobs:unique:shop.tasks.sync:item=1")
    assert build_key("unique", "tests.col", "x:y").key == "dedup_jobs:unique:tests.col:x:y"
    assert build_key("unique", "tests.col:x", "y").key == "dedup_jobs:unique:tests.col%3Ax:y"
    assert name_part("a%b:c") == "a%25b%3Ac"
    key = build_key("unique", "tests.col:x", "y")
    assert (key.task_name, key.ident) == ("tests.col:x", "y")


def test_no_two_name_and_id_pairs_share_a_key() -> None:
    """A4: over random task names and ids made of ":", "%", "3A", "25" and letters, two
    different (task name, id) pairs never share a key, and the key's tail is split back
    into exactly its task name and id."""
    rng = random.Random(21)
    alphabet = [":", "%", "3A", "25", "a", "b", "."]
    seen: dict[str, tuple[str, str]] = {}
    for _ in range(20_000):
        task = "".join(rng.choices(alphabet, k=rng.randint(1, 5)))
        ident = "".join(rng.choices(alphabet, k=rng.randint(0, 5)))
        key = build_key("unique", task, ident).key
        assert seen.setdefault(key, (task, ident)) == (task, ident), key
        tail = key.removeprefix("dedup_jobs:unique:")
        assert Search.split_key(tail) == (task, ident)
        assert Search.split_key(tail, task) == (task, ident)
    assert len(seen) > 5000


def test_an_id_that_looks_hashed_never_meets_a_hashed_id() -> None:
    """A4: an id longer than 200 characters is stored as "sha256-<hex>"; a short id that is
    exactly that text is hashed too, so the two never share a key."""
    long_id = "x" * 201
    looks = "sha256-" + hashlib.sha256(long_id.encode()).hexdigest()
    assert build_key("unique", "t", long_id).key == f"dedup_jobs:unique:t:{looks}"
    assert build_key("unique", "t", looks).key != build_key("unique", "t", long_id).key
    assert build_key("unique", "t", looks).ident == looks


def test_the_cluster_hash_tag_sits_right_after_the_task_name() -> None:
    """S5 / A4: on a cluster the hash tag goes right after ``{task name}:``, the name as the
    key writes it (``:`` escaped), whatever the id holds."""
    from dedup_jobs.stores.redis.cluster import TAGS, tagged, untagged

    for task, ident in COLON_PAIRS:
        key = build_key("unique", task, ident)
        physical = tagged(key, 5)
        head = key.key[:-len(ident)] if ident else key.key
        assert physical == f"{head}{{{TAGS[5]}}}{ident}", physical
        assert untagged(physical) == key.key


def test_a_search_holding_a_colon_finds_a_name_holding_one() -> None:
    """A4: the admin search matches within the task name as written, ":" included, although
    the key has it escaped."""
    wanted = Search.of("COL:X")
    assert wanted is not None and wanted.matches("tests.col:x", "y")
    tail = build_key("unique", "tests.col:x", "y").key.removeprefix("dedup_jobs:unique:")
    assert wanted.may_match_key(tail)


def test_no_two_pairs_share_a_lock_on_any_store(store_name: str) -> None:
    """A4: on every store, locks of (task name, id) pairs that differ only in where a ":"
    falls are separate locks, each read back with its own task name and id; where the store
    lists, its job filter lists only the job's own locks."""
    store = get_store(settings.DEDUP_JOBS["STORE"])
    now = clock.now()
    for n, (task, ident) in enumerate(COLON_PAIRS):
        answer = store.acquire(build_key("unique", task, ident), f"o-{n}", 60, now=now)
        assert answer.acquired, (task, ident, answer)
    for n, (task, ident) in enumerate(COLON_PAIRS):
        lock = store.get(build_key("unique", task, ident))
        assert lock is not None and lock.owner == f"o-{n}"
        assert (lock.task_name, lock.ident) == (task, ident)
    if not store.can_list:
        return
    for task in {task for task, _ident in COLON_PAIRS}:
        page = store.lock_page(offset=0, limit=20, task_name=task, now=now)
        expected = sorted(f"o-{n}" for n, pair in enumerate(COLON_PAIRS) if pair[0] == task)
        assert sorted(lock.owner for lock in page.items) == expected, task
    # a search within the name, ":" included; never across the name and the id
    found = store.lock_page(offset=0, limit=20, search="COL:X", now=now)
    assert [lock.owner for lock in found.items] == ["o-1"]


def test_no_two_pairs_share_a_burst_on_any_store(store_name: str) -> None:
    """A4 / D1: debounce dispatches of (task name, id) pairs that differ only in where a ":"
    falls each start a burst of their own, read back with their own task name and id; where
    the store lists, the Debounced jobs filter lists only the job's own bursts."""
    from dedup_jobs.stores.base import encode_call

    store = get_store(settings.DEDUP_JOBS["STORE"])
    now = clock.now()
    for n, (task, ident) in enumerate(COLON_PAIRS):
        answer = store.debounce(build_key("debounce", task, ident), f"m-{n}",
                                encode_call((n,), {}), now=now, debounce_for=600,
                                max_wait=None, ttl=600)
        assert answer.new and answer.message_id == f"m-{n}", (task, ident, answer)
    if not store.can_list:
        return
    for task in {task for task, _ident in COLON_PAIRS}:
        page = store.debounce_page(offset=0, limit=20, task_name=task, now=now)
        expected = sorted(f"m-{n}" for n, pair in enumerate(COLON_PAIRS) if pair[0] == task)
        assert sorted(state.message_id for state in page.items) == expected, task
        assert {state.task_name for state in page.items} == {task}


@pytest.mark.redis
def test_a_colon_in_a_name_or_id_is_no_duplicate_at_dispatch(app: Any, store_name: str) -> None:
    """A4: job ``tests.col`` with id ``x:y`` and job ``tests.col:x`` with id ``y`` are two
    jobs with two locks: neither dispatch is deduplicated onto the other."""
    first = col.delay("x:y")
    second = col_x.delay("y")
    assert first.deduplicated is False and second.deduplicated is False
    assert second.id != first.id
    assert queued(app) == 2
    assert col.delay("x:y").id == first.id  # the same job and id still deduplicate


def owners(html: str) -> list[str]:
    return sorted(re.findall(r'<td class="owner" title="([^"]*)">', html))


def test_the_admin_job_filter_lists_only_the_jobs_own_locks(listed_store: str) -> None:
    """A1 / A4: Held locks filtered by job ``tests.col`` lists its lock (id ``x:y``), not the
    lock of job ``tests.col:x`` (id ``y``), and the other way round."""
    store = get_store(listed_store)
    for n, (task, ident) in enumerate(COLON_PAIRS[:2]):
        assert store.acquire(build_key("unique", task, ident), f"o-{n}", 60,
                             now=clock.now()).acquired
    make_user("viewer", "view_joblock")
    client = Client()
    assert client.login(username="viewer", password=PASSWORD)
    assert owners(client.get(LOCKS, {"job": "tests.col"}).content.decode()) == ["o-0"]
    assert owners(client.get(LOCKS, {"job": "tests.col:x"}).content.decode()) == ["o-1"]
    assert owners(client.get(LOCKS, {"job": "tests.col", "q": "y"}).content.decode()) == ["o-0"]


@pytest.mark.redis
def test_clear_stale_locks_job_filter_keeps_the_other_jobs_lock(listed_store: str) -> None:
    """A2 / A4: ``clear_stale_locks --all --yes --job tests.col`` removes the lock of job
    ``tests.col`` (id ``x:y``) and keeps the lock of job ``tests.col:x`` (id ``y``)."""
    import io

    from django.core.management import call_command

    store = get_store(listed_store)
    keys = [build_key("unique", task, ident) for task, ident in COLON_PAIRS[:2]]
    for n, key in enumerate(keys):
        assert store.acquire(key, f"o-{n}", 60, now=clock.now()).acquired
    out = io.StringIO()
    call_command("clear_stale_locks", "--all", "--yes", "--job", "tests.col", stdout=out)
    assert "1 held locks scanned: removed 1." in out.getvalue(), out.getvalue()
    assert store.get(keys[0]) is None
    kept = store.get(keys[1])
    assert kept is not None and kept.owner == "o-1"
