"""Stores of your own by dotted path (issue 23): DEDUP_JOBS["STORES"], the protocols a store
implements (dedup_jobs.stores.protocols), and the system checks that say what is wrong —
E003 (the setting's shape), E004 (a path that does not import, a class that is not a store)
and E015 (a job whose store lacks a method the job uses). The store contract suite itself
runs on tests/plugin_store.py through the ``plugin-sharded`` parameter (tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from dedup_jobs import checks
from dedup_jobs.checks_capabilities import check_capabilities
from dedup_jobs.exceptions import InvalidJobConfiguration
from dedup_jobs.keys import JobKey
from dedup_jobs.stores import get_store, store_class_for
from dedup_jobs.stores.base import BaseStore
from dedup_jobs.stores.cache import CacheStore
from dedup_jobs.stores.database.store import DatabaseStore
from dedup_jobs.stores.protocols import CAPABILITIES, missing, supports
from dedup_jobs.stores.redis import RedisStore
from tests.plugin_store import ShardedStore


class LocksOnly(BaseStore):
    """Locks and debounce (BaseStore's abstract methods), by delegation to the Redis store;
    no take-over, no exclusive start, no withdraw, no throttle, no listing."""

    def _inner(self) -> BaseStore:
        return get_store("redis")

    def acquire(self, key: JobKey, owner: str, ttl: float, **kw: Any) -> Any:
        return self._inner().acquire(key, owner, ttl, **kw)

    def start(self, key: JobKey, owner: str, lease: float, **kw: Any) -> Any:
        return self._inner().start(key, owner, lease, **kw)

    def release(self, key: JobKey, owner: str) -> bool:
        return self._inner().release(key, owner)

    def renew(self, key: JobKey, owner: str, ttl: float, **kw: Any) -> Any:
        return self._inner().renew(key, owner, ttl, **kw)

    def get(self, key: JobKey) -> Any:
        return self._inner().get(key)

    def debounce(self, key: JobKey, task_id: str, payload: str, **kw: Any) -> Any:
        return self._inner().debounce(key, task_id, payload, **kw)

    def claim_due(self, key: JobKey, message_id: str, **kw: Any) -> Any:
        return self._inner().claim_due(key, message_id, **kw)

    def get_debounce(self, key: JobKey) -> Any:
        return self._inner().get_debounce(key)


NotAStore = object  # a dotted path to something that is not a BaseStore subclass


def _stores(alias: str, path: str) -> dict[str, Any]:
    return {"STORE": alias, "STORES": {alias: path}}


def test_the_protocols_each_store_implements() -> None:
    """Every capability on the Redis and database stores and on the third party's sharded
    store; the cache store has all but throttling and listing; a locks-only store lacks the
    methods of the others, named one by one."""
    for cls in (RedisStore, DatabaseStore, ShardedStore):
        assert {c: missing(cls, c) for c in CAPABILITIES} == {c: [] for c in CAPABILITIES}
    assert [c for c in CAPABILITIES if not supports(CacheStore, c)] == ["throttle", "listing"]
    assert missing(LocksOnly, "locks") == []
    assert missing(LocksOnly, "replace") == ["take_over"]
    assert missing(LocksOnly, "overlap") == ["start_exclusive"]
    assert missing(LocksOnly, "debounce") == ["withdraw"]
    assert missing(LocksOnly, "throttle") == ["throttle_admit", "throttle_release",
                                              "throttle_renew", "throttle_page"]


def test_a_dotted_path_names_the_store_class() -> None:
    """An alias of DEDUP_JOBS["STORES"] resolves to its class, made with the alias; it wins
    over a CACHES alias of the same name ("default", a LocMemCache here)."""
    with override_settings(DEDUP_JOBS=_stores("default", "tests.plugin_store.ShardedStore")):
        assert store_class_for("default") is ShardedStore
        store = get_store("default")
        assert type(store) is ShardedStore and store.alias == "default"
        assert [type(shard).__name__ for shard in store._shards()] == ["RedisStore", "RedisStore"]


@pytest.mark.parametrize(("path", "says"), [
    ("tests.no_such_module.Store", "cannot be imported (No module named 'tests.no_such_module')"),
    ("tests.plugin_store.NoSuchStore", "cannot be imported"),
    ("tests.test_plugged_store.NotAStore", "which is not a subclass of "
                                           "dedup_jobs.stores.BaseStore"),
    ("ShardedStore", "is not a dotted path"),
])
def test_a_bad_dotted_path_is_a_clear_error(path: str, says: str) -> None:
    """E004 and the error at dispatch name the alias, the path and what to do."""
    with override_settings(DEDUP_JOBS=_stores("mine", path)):
        with pytest.raises(InvalidJobConfiguration) as raised:
            get_store("mine")
        assert f"DEDUP_JOBS['STORES']['mine'] = {path!r}" in str(raised.value)
        assert says in str(raised.value)
        errors = [m for m in checks.check_stores() if m.id == "dedup_jobs.E004"]
        assert len(errors) == 1 and f"{path!r}" in errors[0].msg and says in errors[0].msg


@pytest.mark.parametrize("value", [["tests.plugin_store.ShardedStore"], {"mine": 3}, {"": "a.b"}])
def test_stores_of_the_wrong_shape_are_e003(value: Any) -> None:
    with override_settings(DEDUP_JOBS={"STORES": value}):
        errors = [m for m in checks.check_settings() if m.id == "dedup_jobs.E003"]
        assert len(errors) == 1 and "DEDUP_JOBS['STORES']" in errors[0].msg, errors


def test_a_job_whose_store_lacks_a_method_it_uses_is_e015(app: Any) -> None:
    """E015 per job and capability, naming the store, the protocol and the missing methods:
    the replace, without_overlapping, debounced and throttled jobs of the suite on a
    locks-only store; none for a plain unique job, and none on the sharded store."""
    app.loader.import_default_modules()  # the suite's jobs, as a worker imports them
    app.finalize()
    with override_settings(DEDUP_JOBS=_stores("mine", "tests.test_plugged_store.LocksOnly")):
        found = check_capabilities()
    by_job: dict[str, list[str]] = {}
    for message in found:
        assert message.id == "dedup_jobs.E015"
        by_job.setdefault(message.msg.split(":", 1)[0], []).append(message.msg)
    text = "\n".join(m.msg for m in found)
    assert ("its store 'mine' (tests.test_plugged_store.LocksOnly) lacks the 'replace' "
            "capability it uses: ReplaceStore needs take_over.") in text
    assert "lacks the 'overlap' capability it uses: OverlapStore needs start_exclusive." in text
    assert "lacks the 'debounce' capability it uses: DebounceStore needs withdraw." in text
    assert ("lacks the 'throttle' capability it uses: ThrottleStore needs throttle_admit, "
            "throttle_release, throttle_renew, throttle_page.") in text
    assert "tests.unique_sleep" not in by_job  # a plain UniqueJob: locks only
    with override_settings(DEDUP_JOBS=_stores("mine", "tests.plugin_store.ShardedStore")):
        assert check_capabilities() == []
