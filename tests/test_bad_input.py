"""Bad input gets an error that names it (SPEC A4) on every store: ids a store cannot hold,
admin search in any script and only within the job or the id, out-of-range admin pages."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings

from dedup_jobs import DebouncedJob, UniqueJob, clock
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import encode_call
from tests import admin_helpers, jobs
from tests.admin_helpers import PASSWORD, make_user
from tests.memcached_server import MemcachedServer

listed_store = admin_helpers.listed_store  # the fixture, shared by the admin/command tests
#: the 24-cell page-parsing matrix runs on one Redis backend (the code is the same on all)
listed_store_main = admin_helpers.listed_store_main

pytestmark = pytest.mark.redis  # the broker

LOCKS = "/admin/dedup_jobs/joblock/"
DEBOUNCES = "/admin/dedup_jobs/pendingdebounce/"
CLASSES = "/admin/dedup_jobs/jobclass/"


class RawUniqueId(UniqueJob):
    """Its unique_id() is the text it is given, as it is."""

    name = "tests.raw_unique_id"
    unique_for = 60

    def unique_id(self, text: str) -> str:
        return text

    def run(self, text: str) -> str:
        return text


class RawDebounceId(DebouncedJob):
    """Its debounce_id() is the text it is given, as it is."""

    name = "tests.raw_debounce_id"
    debounce_for = 30

    def debounce_id(self, text: str) -> str:
        return text

    def run(self, text: str) -> str:
        return text


class LongName(UniqueJob):
    """A task name longer than the database store's task_name column (255)."""

    name = "tests.long_name_" + "x" * 300
    unique_for = 60

    def run(self, item: int) -> int:
        return item


def _register() -> tuple[Any, Any, Any]:
    from tests.celery_app import app

    return tuple(app.register_task(cls()) for cls in (RawUniqueId, RawDebounceId, LongName))


raw_unique_id, raw_debounce_id, long_name = _register()


def queued(app: Any) -> int:
    """Messages waiting in the test queue on the real Redis broker."""
    with app.connection_for_read() as conn:
        return int(conn.default_channel.client.llen(app.conf.task_default_queue))


def held(store_name: str) -> int | None:
    """Held locks plus pending debounces of the store, where it can list them."""
    store = get_store(settings.DEDUP_JOBS["STORE"])
    if not store.can_list:
        return None
    now = clock.now()
    locks = store.lock_page(offset=0, limit=10, now=now)
    bursts = store.debounce_page(offset=0, limit=10, now=now)
    return len(locks.items) + len(bursts.items)


# -- ids a store cannot hold --------------------------------------------------------------


@pytest.mark.parametrize("on_error", ["raise", "enqueue"])
def test_nul_in_unique_id_is_refused_by_name(app: Any, store_name: str, on_error: str) -> None:
    """A4: a NUL character in a custom unique_id() raises a ValueError naming the job, the
    hook and the value, before any store call: never StoreUnavailable, and nothing is
    published, also with ON_STORE_ERROR="enqueue"."""
    with (
        override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "ON_STORE_ERROR": on_error}),
        pytest.raises(ValueError) as caught,
    ):
        raw_unique_id.delay("invoice\x00-7")
    assert not isinstance(caught.value, StoreUnavailable)
    message = str(caught.value)
    assert "tests.raw_unique_id" in message and "unique_id()" in message
    assert repr("invoice\x00-7") in message and "NUL" in message
    assert queued(app) == 0
    assert held(store_name) in (0, None)
    # The same job with a good id still works.
    assert raw_unique_id.delay("invoice-7").deduplicated is False


def test_nul_in_debounce_id_is_refused_by_name(app: Any, store_name: str) -> None:
    """A4: a NUL character in a custom debounce_id() raises a ValueError naming the job,
    debounce_id() and the value; nothing is published, no burst is left."""
    with (
        override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "ON_STORE_ERROR": "enqueue"}),
        pytest.raises(ValueError) as caught,
    ):
        raw_debounce_id.delay("product\x00")
    message = str(caught.value)
    assert "tests.raw_debounce_id" in message and "debounce_id()" in message
    assert repr("product\x00") in message
    assert queued(app) == 0
    assert held(store_name) in (0, None)


def test_unpaired_surrogate_in_an_argument_is_refused_by_name(app: Any, store_name: str) -> None:
    """A4: an argument no store can encode (an unpaired surrogate, as os.fsdecode leaves for
    undecodable bytes) in the default key raises a ValueError naming the job and the key's
    source, never StoreUnavailable; nothing is published."""
    with pytest.raises(ValueError) as caught:
        jobs.unique_sleep.delay("caf\udce9")
    assert not isinstance(caught.value, StoreUnavailable)
    message = str(caught.value)
    assert "tests.unique_sleep" in message and "surrogate" in message
    assert "unique_on" in message or "unique_id()" in message
    assert queued(app) == 0


@pytest.mark.postgres
def test_task_name_too_long_for_the_database_store_is_refused(app: Any) -> None:
    """A4: a key the database store's columns cannot hold (a task name over 255 characters,
    PostgreSQL enforces it) is an error naming the job, not StoreUnavailable."""
    with (
        override_settings(
            DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "database", "DATABASE_ALIAS": "postgres",
                        "ON_STORE_ERROR": "enqueue"}
        ),
        pytest.raises(ValueError) as caught,
    ):
        long_name.delay(1)
    assert not isinstance(caught.value, StoreUnavailable)
    assert "255" in str(caught.value) and long_name.name[:40] in str(caught.value)
    assert queued(app) == 0


def hashed_key(key: str, key_prefix: str, version: int) -> str:
    """A cache KEY_FUNCTION that hashes, as memcached users often set."""
    import hashlib

    return hashlib.sha256(f"{key_prefix}:{version}:{key}".encode()).hexdigest()


@pytest.fixture
def memcached(memcached_server: MemcachedServer) -> str:
    """The session's private memcached (tests/conftest.py), emptied; its location."""
    memcached_server.flush()
    return memcached_server.location


@pytest.mark.parametrize("job", ["unique", "debounce"])
def test_id_memcached_cannot_hold_is_refused_by_name(app: Any, memcached: str, job: str) -> None:
    """A4: on a memcached store, an id with a space (a key memcached refuses) raises a
    ValueError naming the job, the hook and the value before any store call; with a
    KEY_FUNCTION that hashes the same id works."""
    cache = {"BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
             "LOCATION": memcached}
    task = raw_unique_id if job == "unique" else raw_debounce_id
    with override_settings(CACHES={**settings.CACHES, "mc": cache},
                           DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "mc",
                                       "ON_STORE_ERROR": "enqueue"}):
        with pytest.raises(ValueError) as caught:
            task.delay("two words")
        message = str(caught.value)
        assert task.name in message and f"{job}_id()" in message
        assert "'two words'" in message and "memcached" in message
        assert queued(app) == 0
    hashing = {**cache, "KEY_FUNCTION": f"{__name__}.hashed_key"}
    with override_settings(CACHES={**settings.CACHES, "mc": hashing},
                           DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "mc"}):
        task.delay("two words")
        assert queued(app) == 1


# -- admin search -------------------------------------------------------------------------


def login() -> Client:
    make_user("viewer", "view_joblock")
    client = Client()
    assert client.login(username="viewer", password=PASSWORD)
    return client


def owners(html: str) -> list[str]:
    return sorted(re.findall(r'<td class="owner" title="([^"]*)">', html))


IDS = {
    "o-emile-upper": ("tests.unique_sleep", "name=ÉMILE"),
    "o-emile-lower": ("tests.unique_sleep", "name=émile"),
    "o-strasse": ("tests.unique_sleep", "street=Straße"),
    "o-STRASSE": ("tests.unique_sleep", "street=STRASSE"),
    "o-moscow": ("tests.unique_add", "city=МОСКВА"),  # noqa: RUF001 - Cyrillic on purpose
    "o-moscow-lower": ("tests.unique_add", "город=москва"),
    "o-plain": ("tests.unique_add", "a=1"),
    "o-url": ("tests.unique_add", "url=HTTP://Example.COM:8080/x"),
}


def take(alias: str, locks: dict[str, tuple[str, str]]) -> None:
    store = get_store(alias)
    for owner, (task, ident) in locks.items():
        assert store.acquire(build_key("unique", task, ident), owner, 600, now=clock.now()).acquired


@pytest.mark.parametrize(
    ("search", "expected"),
    [
        ("émile", ["o-emile-lower", "o-emile-upper"]),
        ("ÉMILE", ["o-emile-lower", "o-emile-upper"]),
        ("Émile", ["o-emile-lower", "o-emile-upper"]),
        ("strasse", ["o-STRASSE", "o-strasse"]),
        ("STRAẞE", ["o-STRASSE", "o-strasse"]),
        ("москва", ["o-moscow", "o-moscow-lower"]),
        ("ГОРОД", ["o-moscow-lower"]),
        ("e\u0301mile", ["o-emile-lower", "o-emile-upper"]),  # decomposed é
        ("example.com:80", ["o-url"]),  # an id with ":" in it
        ("UNIQUE_ADD", ["o-moscow", "o-moscow-lower", "o-plain", "o-url"]),
    ],
)
def test_search_is_caseless_in_any_script(listed_store: str, search: str,
                                          expected: list[str]) -> None:
    """A4: admin search is case-insensitive for any script (Unicode case folding: é/É,
    ß/SS/ẞ, Cyrillic), on the job name or the id, with the same results on every store."""
    take(listed_store, IDS)
    html = login().get(LOCKS, {"q": search}).content.decode()
    assert owners(html) == expected


@pytest.mark.parametrize(
    "search",
    ["unique_sleep:item", "sleep:item=1", "dedup_jobs", ":unique:", "t:1:"],
)
def test_search_never_matches_across_job_and_id(listed_store: str, search: str) -> None:
    """A4: search matches within the job name or within the id, never text that spans the
    two ("job:id") nor the key's prefixes, on every store."""
    take(listed_store, {"o-1": ("tests.unique_sleep", "item=1")})
    html = login().get(LOCKS, {"q": search}).content.decode()
    assert owners(html) == []
    assert "No held locks match" in html


def test_key_prefilter_never_drops_a_match() -> None:
    """A4: the Redis store decides from the key which locks may match before reading any
    hash; for text of every kind (case pairs, ß, ligatures, full-width letters, combining
    marks, colons) a lock that matches is never dropped, and a key split into job and id
    is split right."""
    import random
    import sys

    from dedup_jobs.stores.search import Search, fold

    rng = random.Random(4)
    special = [chr(c) for c in range(sys.maxunicode + 1)
               if not 0xD800 <= c <= 0xDFFF and fold(chr(c)) != chr(c)]
    alphabet = special + list("abcXYZ:=,.-_ 019") + ["\u0301", "\u0308", "\u0345"]
    for _ in range(20_000):
        task = "".join(rng.choices(alphabet, k=rng.randint(1, 6))).replace(":", ".")
        ident = "".join(rng.choices(alphabet, k=rng.randint(0, 8)))
        source = fold(rng.choice([task, ident]))
        if not source:
            continue
        start = rng.randrange(len(source))
        needle = source[start:start + rng.randint(1, 4)]
        wanted = Search.of(needle)
        if wanted is None or not wanted.matches(task, ident):
            continue
        tail = f"{task}:{ident}"
        assert wanted.may_match_key(tail), (task, ident, needle)
        parts = Search.split_key(tail)
        assert parts is None or parts == (task, ident)
        assert Search.split_key(tail, task) == (task, ident)


def test_search_within_a_job_filter(listed_store: str) -> None:
    """A4: a search together with the job filter narrows within that job; a search that
    matches the filtered job's own name keeps every lock of the job."""
    take(listed_store, IDS)
    client = login()
    by_id = client.get(LOCKS, {"job": "tests.unique_sleep", "q": "émile"}).content.decode()
    assert owners(by_id) == ["o-emile-lower", "o-emile-upper"]
    by_name = client.get(LOCKS, {"job": "tests.unique_sleep", "q": "SLEEP"}).content.decode()
    assert owners(by_name) == ["o-STRASSE", "o-emile-lower", "o-emile-upper", "o-strasse"]
    other = client.get(LOCKS, {"job": "tests.unique_add", "q": "émile"}).content.decode()
    assert owners(other) == []


def test_search_finds_a_hashed_id_by_its_readable_form(listed_store: str) -> None:
    """A4: an id longer than 200 characters is hashed in the key; search still finds it by
    the readable id, on every store."""
    ident = "report=" + "x" * 230 + "-Québec"
    take(listed_store, {"o-long": ("tests.unique_sleep", ident), "o-1": ("tests.unique_sleep",
                                                                          "item=1")})
    html = login().get(LOCKS, {"q": "QUÉBEC"}).content.decode()
    assert owners(html) == ["o-long"]


def test_search_pages_are_complete_and_disjoint(listed_store: str) -> None:
    """A4: a search matching more than a page pages through every match once."""
    store = get_store(listed_store)
    for i in range(230):
        word = "Éclair" if i % 2 else "other"
        store.acquire(build_key("unique", "tests.unique_sleep", f"{word}={i}"), f"o-{i}", 600,
                      now=clock.now())
    client = login()
    seen: list[str] = []
    for number in (1, 2):
        seen += owners(client.get(LOCKS, {"q": "éCLAIR", "p": number}).content.decode())
    assert sorted(seen) == sorted(f"o-{i}" for i in range(230) if i % 2)


def test_debounce_search_is_caseless_in_any_script(listed_store: str) -> None:
    """A4: the Debounced jobs page searches the same way: any script, job or id."""
    store = get_store(listed_store)
    for ident in ("name=ÉMILE", "name=other"):
        store.debounce(build_key("debounce", "tests.debounce_record", ident), f"m-{ident}",
                       encode_call((1,), {}), now=clock.now(), debounce_for=600,
                       max_wait=None, ttl=600)
    html = login().get(DEBOUNCES, {"q": "émile"}).content.decode()
    assert "name=ÉMILE" in html and "name=other" not in html
    across = login_again().get(DEBOUNCES, {"q": "record:name"}).content.decode()
    assert "name=ÉMILE" not in across and "name=other" not in across


def login_again() -> Client:
    client = Client()
    assert client.login(username="viewer", password=PASSWORD)
    return client


# -- admin pagination ---------------------------------------------------------------------


@pytest.mark.parametrize("page", [LOCKS, DEBOUNCES])
@pytest.mark.parametrize("search", ["", "item"])
@pytest.mark.parametrize("p", ["1" + "0" * 30, "10**30", "-1", "0", "abc", "9" * 5000])
def test_out_of_range_page_is_a_404_or_the_last_page(listed_store_main: str, page: str,
                                                     search: str, p: str) -> None:
    """A4: a page number that is not a page (past the end, huge, negative, not a number)
    shows the last page or a 404, never "store unavailable"."""
    admin_helpers.fill(listed_store_main, 130)
    store = get_store(listed_store_main)
    for i in range(3):
        store.debounce(build_key("debounce", "tests.debounce_record", f"item={i}"), f"m-{i}",
                       encode_call((i,), {}), now=clock.now(), debounce_for=600,
                       max_wait=None, ttl=600)
    response = login().get(page, {"q": search, "p": p} if search else {"p": p})
    body = response.content.decode()
    assert "unavailable" not in body
    assert response.status_code in (302, 404), response.status_code
    if response.status_code == 302:
        followed = login_again().get(response["Location"])
        assert followed.status_code == 200
        assert "unavailable" not in followed.content.decode()


@pytest.mark.parametrize("page", [LOCKS, DEBOUNCES])
def test_page_past_the_end_redirects_to_the_last_page(listed_store: str, page: str) -> None:
    """A4: a page past the last one redirects to the last page (keeping search and store);
    an empty listing's page 2 redirects to the first page."""
    client = login()
    empty = client.get(page, {"p": "2", "store": listed_store})
    assert empty.status_code == 302 and "p=" not in empty["Location"]
    admin_helpers.fill(listed_store, 130)
    store = get_store(listed_store)
    for i in range(130):
        store.debounce(build_key("debounce", "tests.debounce_record", f"item={i}"), f"m-{i}",
                       encode_call((i,), {}), now=clock.now(), debounce_for=600,
                       max_wait=None, ttl=600)
    past = client.get(page, {"p": "7", "q": "item", "store": listed_store})
    assert past.status_code == 302
    assert "p=2" in past["Location"] and "q=item" in past["Location"]
    assert f"store={listed_store}" in past["Location"]
    last = client.get(past["Location"])
    assert last.status_code == 200 and "page 2 of 2" in last.content.decode()


@pytest.mark.django_db
def test_job_classes_page_ignores_a_bad_page_number() -> None:
    """A4: the Job classes page has no pages: any ?p= shows it, never an error."""
    for p in ("1" + "0" * 30, "-1", "abc"):
        assert login_again_or_new().get(CLASSES, {"p": p}).status_code == 200


def login_again_or_new() -> Client:
    from django.contrib.auth.models import User

    if not User.objects.filter(username="viewer").exists():
        make_user("viewer", "view_joblock")
    return login_again()


@pytest.mark.django_db(transaction=True)
def test_empty_page_within_the_count_shows_without_redirecting(redis_client: Any) -> None:
    """A4: an empty page that the count still covers (Redis evicted the locks' hashes, their
    index entries remain) is shown as it is: no redirect to itself, never an error."""
    keys = admin_helpers.fill("redis", 101)
    store: Any = get_store("redis")
    redis_client.delete(*(store.physical(key.key) for key in keys))
    response = login().get(LOCKS, {"p": "2", "store": "redis"})
    assert response.status_code == 200
    assert "unavailable" not in response.content.decode()
