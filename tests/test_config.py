"""Job options are validated when the class is created; settings by system checks (A3)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from dedup_jobs import DebouncedJob, UniqueJob, UniqueUntilProcessingJob
from dedup_jobs.exceptions import DedupError, InvalidJobConfiguration


def make(base: type, name: str = "t.job", **options: Any) -> type:
    def run(self: Any, product_id: int, region: str = "eu") -> None:
        return None

    return type("Job", (base,), {"name": name, "run": run, **options})


@pytest.mark.parametrize("value", [0, -1, "60", True, 1e10])
def test_unique_for_must_be_positive_seconds(value: Any) -> None:
    """A3/Section 1: unique_for <= 0 (or not a number) fails at class creation."""
    with pytest.raises(InvalidJobConfiguration, match=f"unique_for = {value!r}"):
        make(UniqueJob, unique_for=value)


def test_unknown_unique_on_name_is_refused() -> None:
    """Section 1: unknown names in unique_on fail at class creation, naming them."""
    with pytest.raises(InvalidJobConfiguration, match=r"\['product'\].*'product_id', 'region'"):
        make(UniqueJob, unique_on=("product",))
    make(UniqueJob, unique_on=("product_id",))


def test_unique_on_must_be_a_tuple_of_names() -> None:
    with pytest.raises(InvalidJobConfiguration, match="must be a tuple"):
        make(UniqueJob, unique_on="product_id")


@pytest.mark.parametrize(("base", "option", "more"), [
    (UniqueJob, "unique_on", {}),
    (DebouncedJob, "debounce_on", {"debounce_for": 1}),
    (UniqueJob, "throttle_on", {"concurrency": 1}),
])
@pytest.mark.parametrize("value", [123, {"product_id"}])
def test_key_fields_that_are_no_tuple_of_names_are_refused_by_name(
        base: type, option: str, more: dict[str, Any], value: Any) -> None:
    """A non-iterable (or a set, whose order is not stable across processes) is refused at
    class creation naming the value, not with a bare TypeError at dispatch."""
    with pytest.raises(InvalidJobConfiguration, match=rf"{option} = {value!r}.*tuple"):
        make(base, **{option: value, **more})


def test_on_duplicate_choice() -> None:
    with pytest.raises(InvalidJobConfiguration, match="on_duplicate = 'ignore'"):
        make(UniqueJob, on_duplicate="ignore")


def test_unique_and_debounced_at_once_is_refused() -> None:
    """U0: a class that is both unique and debounced fails at class creation."""
    with pytest.raises(InvalidJobConfiguration, match="both unique and debounced"):
        type("Both", (UniqueJob, DebouncedJob), {"name": "t.both"})
    with pytest.raises(InvalidJobConfiguration, match="both unique and debounced"):
        make(UniqueUntilProcessingJob, debounce_for=30)


def test_decorator_style_options_are_validated() -> None:
    """Section 1: @task(base=UniqueJob, ...) options are checked when Celery builds the class."""
    app = Celery("validation", set_as_current=False)

    with pytest.raises(InvalidJobConfiguration, match="unique_for = -5"):

        @app.task(base=UniqueJob, unique_for=-5, shared=False)
        def bad(x: int) -> int:
            return x

        bad.name  # noqa: B018 - Celery builds the class lazily


def test_invalid_configuration_is_improperly_configured_and_dedup_error() -> None:
    """Section 1: InvalidJobConfiguration subclasses ImproperlyConfigured."""
    assert issubclass(InvalidJobConfiguration, ImproperlyConfigured)
    assert issubclass(InvalidJobConfiguration, DedupError)


def ids(**settings: Any) -> set[str]:
    with override_settings(**settings):
        return {m.id for m in run_checks() if m.id and m.id.startswith("dedup_jobs.")}


def test_default_test_settings_pass_the_checks() -> None:
    """A3: a correct configuration reports nothing (W002 for locmem is silenced here)."""
    assert ids() == set()


@pytest.mark.parametrize(
    ("dedup", "expected"),
    [
        ("not a dict", "dedup_jobs.E001"),
        ({"STROE": "redis"}, "dedup_jobs.E002"),
        ({"DEFAULT_UNIQUE_FOR": 0}, "dedup_jobs.E003"),
        ({"LEASE_SECONDS": -1}, "dedup_jobs.E003"),
        ({"STORE_TIMEOUT": 0}, "dedup_jobs.E003"),
        ({"ON_STORE_ERROR": "ignore"}, "dedup_jobs.E003"),
        ({"LIMITS_ON_STORE_ERROR": "skip"}, "dedup_jobs.E003"),
        ({"SHOW_ARGS": "no"}, "dedup_jobs.E003"),
        ({"STORE": "nowhere"}, "dedup_jobs.E004"),
    ],
)
def test_bad_settings_are_reported(dedup: Any, expected: str) -> None:
    """A3: bad DEDUP_JOBS keys or values are system-check errors with their own id."""
    assert expected in ids(DEDUP_JOBS=dedup)


def test_check_message_names_key_and_value() -> None:
    """A3: the message names the exact key and bad value, with a hint."""
    with override_settings(DEDUP_JOBS={"ON_STORE_ERROR": "ignore"}):
        [message] = [m for m in run_checks() if m.id == "dedup_jobs.E003"]
    assert "ON_STORE_ERROR" in message.msg and "'ignore'" in message.msg
    assert message.hint and "'raise' or 'enqueue'" in message.hint


def test_limits_on_store_error_takes_defer_or_run() -> None:
    """W7/A3: LIMITS_ON_STORE_ERROR "defer" and "run" pass the checks; another value is
    E003 naming the key, the value and both choices."""
    for value in ("defer", "run"):
        assert "dedup_jobs.E003" not in ids(DEDUP_JOBS={"LIMITS_ON_STORE_ERROR": value})
    with override_settings(DEDUP_JOBS={"LIMITS_ON_STORE_ERROR": "skip"}):
        [message] = [m for m in run_checks() if m.id == "dedup_jobs.E003"]
    assert "LIMITS_ON_STORE_ERROR" in message.msg and "'skip'" in message.msg
    assert message.hint and "'defer'" in message.hint and "'run'" in message.hint


def test_store_checks() -> None:
    """A3/S2: DummyCache is an error; database and file caches warn; locmem warns."""
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "dummy": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"},
        "db": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "c"},
        "file": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": "/tmp/dedup-jobs-file-cache",
        },
    }
    assert "dedup_jobs.E004" in ids(CACHES=caches, DEDUP_JOBS={"STORE": "dummy"})
    assert "dedup_jobs.W001" in ids(CACHES=caches, DEDUP_JOBS={"STORE": "db"})
    assert "dedup_jobs.W001" in ids(CACHES=caches, DEDUP_JOBS={"STORE": "file"})
    assert "dedup_jobs.W002" in ids(
        CACHES=caches, DEDUP_JOBS={"STORE": "default"}, SILENCED_SYSTEM_CHECKS=[]
    )


def test_database_alias_checks() -> None:
    """A3: an unknown DATABASE_ALIAS is an error; one with ATOMIC_REQUESTS a warning (W004)."""
    from django.conf import settings

    assert "dedup_jobs.E003" in ids(DEDUP_JOBS={"STORE": "database", "DATABASE_ALIAS": "nope"})
    atomic = {**settings.DATABASES, "default": {**settings.DATABASES["default"],
                                                "ATOMIC_REQUESTS": True}}
    assert "dedup_jobs.W004" in ids(DATABASES=atomic, DEDUP_JOBS={"STORE": "database"})
    assert "dedup_jobs.W004" not in ids(DEDUP_JOBS={"STORE": "database"})


@pytest.mark.django_db(transaction=True)
def test_missing_migrations_are_reported() -> None:
    """A3: the database store without its table is a database check warning (not an error:
    migrate runs database checks before creating the table)."""
    from django.db import connection

    with override_settings(DEDUP_JOBS={"STORE": "database"}):
        assert not [m for m in run_checks(databases=["default"]) if m.id == "dedup_jobs.W003"]
        with connection.schema_editor() as editor:
            from dedup_jobs.models import JobLock

            editor.delete_model(JobLock)
        try:
            found = [m for m in run_checks(databases=["default"]) if m.id == "dedup_jobs.W003"]
        finally:
            with connection.schema_editor() as editor:
                editor.create_model(JobLock)
    assert found and "migrate dedup_jobs" in str(found[0].hint)


@pytest.mark.parametrize("options", [{}, {"SOCKET_TIMEOUT": 30}])
def test_redis_cache_without_a_bounded_timeout_is_warned(options: dict[str, Any]) -> None:
    """S8/A3: a Redis cache store whose socket timeout is unbounded or above STORE_TIMEOUT is
    W005 (dedup_jobs bounds its own calls; the cache's own calls could hang)."""
    from django.conf import settings

    caches = {**settings.CACHES, "redis": {**settings.CACHES["redis"], "OPTIONS": options}}
    assert "dedup_jobs.W005" in ids(CACHES=caches)
    bounded = {**caches, "redis": {**caches["redis"], "OPTIONS": {"SOCKET_TIMEOUT": 2}}}
    assert "dedup_jobs.W005" not in ids(CACHES=bounded)


@pytest.mark.parametrize("options", [{}, {"timeout": 30, "connect_timeout": 1},
                                     {"timeout": 1}])
def test_memcached_cache_without_a_bounded_timeout_is_warned(options: dict[str, Any]) -> None:
    """S8/A3: a PyMemcacheCache store whose pymemcache ``timeout`` or ``connect_timeout`` is
    unset (Django sets neither: pymemcache then waits forever) or above STORE_TIMEOUT is
    W005, naming the option and the fix; both set within it is quiet."""
    from django.conf import settings

    cache = {"BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
             "LOCATION": "127.0.0.1:11211", "OPTIONS": options}
    caches = {**settings.CACHES, "mc": cache}
    with override_settings(CACHES=caches, DEDUP_JOBS={"STORE": "mc"}):
        warned = [m for m in run_checks() if m.id == "dedup_jobs.W005"]
    assert len(warned) == 1 and "'mc'" in warned[0].msg and "PyMemcacheCache" in warned[0].msg
    assert "'timeout'" in warned[0].hint
    bounded = {**caches, "mc": {**cache, "OPTIONS": {"timeout": 2, "connect_timeout": 2}}}
    assert "dedup_jobs.W005" not in ids(CACHES=bounded, DEDUP_JOBS={"STORE": "mc"})


NOT_FINITE = [float("nan"), float("inf"), float("-inf")]


@pytest.mark.parametrize("value", NOT_FINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(("base", "option", "extra"), [
    (UniqueJob, "unique_for", {}),
    (UniqueUntilProcessingJob, "unique_for", {}),
    (DebouncedJob, "debounce_for", {}),
    (DebouncedJob, "max_wait", {"debounce_for": 30}),
    (UniqueJob, "concurrency", {}),
    (DebouncedJob, "concurrency", {"debounce_for": 30}),
])
def test_nan_and_infinite_options_are_refused_at_class_creation(
    base: type, option: str, extra: dict[str, Any], value: float
) -> None:
    """A4: a numeric option that is NaN or infinite fails at class creation with
    InvalidJobConfiguration naming the option and the value (not at dispatch with a bare
    ValueError or OverflowError)."""
    with pytest.raises(InvalidJobConfiguration, match=f"{option} = {value!r}"):
        make(base, **extra, **{option: value})


def numeric_settings() -> list[str]:
    """Every DEDUP_JOBS setting whose default is a number (a bool is not)."""
    from dedup_jobs.conf import DEFAULTS

    return sorted(name for name, default in DEFAULTS.items()
                  if isinstance(default, (int, float)) and not isinstance(default, bool))


@pytest.mark.parametrize("value", NOT_FINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", numeric_settings())
def test_nan_and_infinite_settings_are_e003(name: str, value: float) -> None:
    """A3 / A4: every numeric DEDUP_JOBS setting that is NaN or infinite is the system-check
    error E003 naming the setting and the value."""
    from django.conf import settings

    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, name: value}):
        found = [m for m in run_checks() if m.id == "dedup_jobs.E003"]
    assert [m.msg.split("]")[0] for m in found] == [f"DEDUP_JOBS[{name!r}"], found
    assert repr(value) in found[0].msg


def test_manage_py_check_refuses_a_nan_lease() -> None:
    """A3 / A4: ``manage.py check`` fails on LEASE_SECONDS = NaN and STORE_TIMEOUT =
    Infinity, naming both."""
    import io

    from django.conf import settings
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    bad = {**settings.DEDUP_JOBS, "LEASE_SECONDS": float("nan"),
           "STORE_TIMEOUT": float("Infinity")}
    with override_settings(DEDUP_JOBS=bad), pytest.raises(SystemCheckError) as caught:
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())
    assert "LEASE_SECONDS'] = nan" in str(caught.value)
    assert "STORE_TIMEOUT'] = inf" in str(caught.value)
