"""S5: the store-contract tests of a single Redis, run on a Redis 7 and a Valkey 8 cluster.

Which tests, by rule rather than by a hand-kept list (issue 23): every ``test_*`` function of
the contract modules (CONTRACT_MODULES below: the store-facing modules that take their stores
from tests/conftest.py's ALL_STORE_PARAMS, and tests/test_idempotent.py's Redis-only S7) that
takes its store (``store_name``, ``family_store``, or a module's ``store`` fixture built on
one of them) is collected here, unless NOT_ON_A_CLUSTER names it with the reason. A test added
to a contract module reaches both clusters without anyone touching this file.

Each contract module becomes one class here (``TestStores`` for tests/test_stores.py, ...),
its tests the very functions of the module, so that two modules may share a test name. They
run with this directory's ``store_name`` fixture (tests/cluster/conftest.py: the CACHES alias
"cluster" on django-valkey's cluster cache, on each cluster in turn) and the ``store`` and
``family_store`` fixtures below, which hand the same cluster store to the tests that take
those. The source modules' own fixtures (autouse ones too) and ``pytestmark`` do not come
along: a test is collected only if it takes one of CLUSTER_FIXTURES and no other fixture of
its module's own. test_the_contract_tests_are_collected_or_excluded (pytest's own collection
of the classes against the rule) fails for a contract test that is neither collected nor
excluded (one reaching the store through a fixture of its module's own, say), for a stale
exclusion, and for a module taking ALL_STORE_PARAMS that is neither a contract module nor
left out with its reason (NOT_CONTRACT_MODULES)."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.test import override_settings

from dedup_jobs.stores import get_store


def is_fixture(value: object) -> bool:
    """A pytest fixture function: its definition object (pytest 8.4 and later) or the marked
    function of older releases."""
    try:
        from _pytest.fixtures import FixtureFunctionDefinition
    except ImportError:  # pytest < 8.4
        return hasattr(value, "_pytestfixturefunction")
    return isinstance(value, FixtureFunctionDefinition)


#: the modules whose store-taking tests make the store contract (CONTRIBUTING.md, "The store
#: contract suite"); tests/test_idempotent.py takes the Redis family (``family_store``)
CONTRACT_MODULES = (
    "tests.test_stores",
    "tests.test_debounce_store",
    "tests.test_debounce_stale",
    "tests.test_flow_store",
    "tests.test_cancel_store",
    "tests.test_dispatch_many",
    "tests.test_idempotent",
    "tests.test_idempotent_stores",
    "tests.test_start_fates",
    "tests.test_throttle_store",
    "tests.test_id_hooks",
)

#: modules taking ALL_STORE_PARAMS that are not contract modules, and why
NOT_CONTRACT_MODULES = {
    "tests.test_fates_property": "adds both clusters to its own stores (S5 under every fate)",
}

#: the fixtures that hand a test its store, as tests/conftest.py and the contract modules name
#: them: a test reaching one of them (through its module's fixtures too) is a contract test
STORE_FIXTURES = frozenset({"store_name", "family_store"})

#: the store fixtures this directory supplies: a contract test is collected if it takes one
#: directly (and no fixture of its module's own that would be lost here)
CLUSTER_FIXTURES = frozenset({"store_name", "family_store", "store"})

_SINGLE_SERVER_CLIENT = ("takes server_client, a redis-py client of one server (MONITOR, "
                         "FLUSHDB, SET behind the store's back); a cluster has no such client")
_DATABASE_ONLY = "the database store's own (store_name parametrised over DATABASE_STORE_PARAMS)"

#: every contract test the clusters do not run, by "module.test", with the reason: the one
#: place that leaves a store-taking test of a contract module out
NOT_ON_A_CLUSTER = {
    # tests/test_stores.py: the Redis family's single server
    "tests.test_stores.test_redis_round_trips_per_decision":
        "counts round trips with MONITOR on one server; the cluster's count (one EVALSHA per "
        "decision, INFO commandstats of every primary) is tests/cluster/test_cluster.py",
    "tests.test_stores.test_redis_until_processing_start_is_one_round_trip":
        "counts round trips with MONITOR on one server (tests/cluster/test_cluster.py counts "
        "the cluster's)",
    "tests.test_stores.test_redis_index_lists_held_locks_without_keys":
        "MONITORs one server for KEYS/SCAN; the cluster's listing merges one index per group "
        "(tests/cluster/test_cluster.py pages 3,000 locks)",
    "tests.test_stores.test_redis_error_replies_are_store_unavailable": _SINGLE_SERVER_CLIENT,
    "tests.test_stores.test_database_store_without_time_zones": _DATABASE_ONLY,
    # tests/test_debounce_store.py
    "tests.test_debounce_store.test_redis_one_round_trip_per_dispatch_and_claim":
        "counts round trips with MONITOR on one server (tests/cluster/test_cluster.py counts "
        "the cluster's)",
    # tests/test_debounce_stale.py
    "tests.test_debounce_stale.test_burst_whose_message_was_lost_runs_on_the_next_dispatch":
        "a real Celery worker on django-redis and the database store (its own store_name "
        "params); the cluster's worker is tests/cluster/test_cluster_workers.py",
    "tests.test_debounce_stale.test_late_message_of_a_stale_burst_does_not_run_twice":
        "a real Celery worker on django-redis and the database store (its own store_name "
        "params); the cluster's worker is tests/cluster/test_cluster_workers.py",
    # tests/test_flow_store.py
    "tests.test_flow_store.test_flow_expiry_is_the_servers_clock": _DATABASE_ONLY,
    "tests.test_flow_store.test_flow_lock_lasts_its_ttl_by_the_servers_clock": _DATABASE_ONLY,
    # tests/test_idempotent.py
    "tests.test_idempotent.test_a_server_clock_ahead_costs_one_retry_then_none":
        _SINGLE_SERVER_CLIENT,
    "tests.test_idempotent.test_until_processing_start_resent_after_the_lock_was_lost":
        _SINGLE_SERVER_CLIENT,
    "tests.test_idempotent.test_undo_of_a_lost_lock_still_revokes_its_id": _SINGLE_SERVER_CLIENT,
    # tests/test_throttle_store.py
    "tests.test_throttle_store.test_the_stores_left_out_cannot_throttle":
        "runs on the stores of CANNOT_THROTTLE (its own store_name params); a cluster throttles",
    "tests.test_throttle_store.test_database_expiry_is_the_servers_clock": _DATABASE_ONLY,
}


def _fixtures_taken(test: Callable[..., Any]) -> set[str]:
    """The fixtures ``test`` asks for by name: its arguments and its usefixtures marks."""
    names = set(inspect.signature(test).parameters)
    for mark in getattr(test, "pytestmark", ()):
        if mark.name == "usefixtures":
            names.update(mark.args)
    return names


def _reaches_a_store(names: set[str], module: ModuleType, seen: frozenset[str] = frozenset()
                     ) -> bool:
    """Whether the fixtures ``names`` are, or are built on, a store fixture, through the
    fixtures ``module`` defines or imports and tests/conftest.py's."""
    import tests.conftest

    if names & STORE_FIXTURES:
        return True
    for name in names - seen:
        for where in (module, tests.conftest):
            fixture = getattr(where, name, None)
            if is_fixture(fixture):
                if _reaches_a_store(_fixtures_taken(fixture), module, seen | names):
                    return True
                break
    return False


def contract_tests(module: ModuleType) -> dict[str, Callable[..., Any]]:
    """Every ``test_*`` function defined in ``module`` that reaches a store fixture."""
    return {name: test for name, test in vars(module).items()
            if name.startswith("test_") and inspect.isfunction(test)
            and test.__module__ == module.__name__
            and _reaches_a_store(_fixtures_taken(test), module)}


def runs_on_a_cluster(test: Callable[..., Any]) -> bool:
    """A contract test the clusters run: not excluded, and every fixture it takes that its
    module defines is one this directory supplies too."""
    module = importlib.import_module(test.__module__)
    own = {name for name in _fixtures_taken(test)
           if is_fixture(getattr(module, name, None))}
    return (f"{test.__module__}.{test.__name__}" not in NOT_ON_A_CLUSTER
            and bool(_fixtures_taken(test) & CLUSTER_FIXTURES) and own <= CLUSTER_FIXTURES)


def class_name(module_name: str) -> str:
    """tests.test_idempotent_stores -> TestIdempotentStores."""
    words = module_name.rsplit(".", 1)[-1].removeprefix("test_").split("_")
    return "Test" + "".join(word.capitalize() for word in words)


for _module_name in CONTRACT_MODULES:
    _module = importlib.import_module(_module_name)
    globals()[class_name(_module_name)] = type(class_name(_module_name), (), {
        "__doc__": f"The contract tests of {_module_name.replace('.', '/')}.py on each cluster.",
        **{name: staticmethod(test) for name, test in contract_tests(_module).items()
           if runs_on_a_cluster(test)},
    })


@pytest.fixture
def store(store_name: str) -> Iterator[Any]:
    """The contract modules' ``store`` fixture (tests/test_idempotent.py, ...): the cluster
    store (S1 on S5), with a lease of 60 s."""
    with override_settings(DEDUP_JOBS={"STORE": store_name, "LEASE_SECONDS": 60}):
        yield get_store(store_name)


@pytest.fixture
def family_store(store_name: str) -> str:
    """tests/conftest.py's S1 fixture (each Redis-protocol backend of one server): here the
    cluster store, which is the Redis store on a cluster."""
    return store_name


def test_the_contract_tests_are_collected_or_excluded(request: pytest.FixtureRequest) -> None:
    """Issue 23: every store-taking test of a contract module runs on the clusters (pytest
    collects it here) or NOT_ON_A_CLUSTER says why not; no exclusion is stale; and every
    module taking ALL_STORE_PARAMS is a contract module or says why it is not."""
    module_node = request.node.parent
    collected: set[str] = set()
    for name in map(class_name, CONTRACT_MODULES):
        collector = pytest.Class.from_parent(module_node, name=name, obj=globals()[name])
        collected.update(f"{item.function.__module__}.{item.function.__name__}"
                         for item in collector.collect() if isinstance(item, pytest.Function))
    contract = {f"{module_name}.{name}" for module_name in CONTRACT_MODULES
                for name in contract_tests(importlib.import_module(module_name))}
    missing = sorted(contract - collected - NOT_ON_A_CLUSTER.keys())
    assert not missing, (
        f"contract tests neither collected on the clusters nor in NOT_ON_A_CLUSTER: {missing} "
        "(take the store through a fixture tests/cluster/ supplies, or exclude with a reason)")
    stale = sorted(NOT_ON_A_CLUSTER.keys() - contract)
    assert not stale, f"NOT_ON_A_CLUSTER names no contract test of CONTRACT_MODULES: {stale}"
    assert collected <= contract - NOT_ON_A_CLUSTER.keys()
    tests_dir = Path(__file__).resolve().parents[1]
    taking_all = {f"tests.{path.stem}" for path in tests_dir.glob("test_*.py")
                  if re.search(r"\bALL_STORE_PARAMS\b", path.read_text())}
    unlisted = sorted(taking_all - set(CONTRACT_MODULES) - NOT_CONTRACT_MODULES.keys())
    assert not unlisted, (
        f"modules taking ALL_STORE_PARAMS, in neither CONTRACT_MODULES nor NOT_CONTRACT_MODULES:"
        f" {unlisted}")
    assert NOT_CONTRACT_MODULES.keys() <= taking_all
