"""A5: every decision counted once, by job and outcome, in the process that makes it, and no
store round trip added. Read back from prometheus_client (the dispatching process's registry,
and the prefork worker's multi-process directory) and from an in-memory OpenTelemetry reader."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from tests import jobs_metrics
from tests.guard_support import BROKERS, guard_worker, publishing_to, reset_queue, token
from tests.jobs import runs
from tests.workers import ROOT, wait_for

JOB = "tests.metrics_unique"
KEYS, DISPATCHES, HEADERLESS = 50, 200, 10
#: the commands a store's decisions are made of (S1: every decision is one script call)
STORE_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "script|load", "script")

pytestmark = [pytest.mark.redis, pytest.mark.rabbitmq, pytest.mark.worker]


@pytest.fixture(scope="module")
def otel_reader() -> Any:
    """An in-memory OpenTelemetry reader on the global meter provider (set once)."""
    from opentelemetry import metrics as otel
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    otel.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


def otel_counts(reader: Any) -> dict[tuple[str, str], int]:
    found: dict[tuple[str, str], int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != "dedup_jobs.decisions":
                    continue
                for point in metric.data.data_points:
                    attrs = point.attributes
                    found[(attrs["job"], attrs["outcome"])] = int(point.value)
    return found


def prom_counts(registry: Any) -> dict[str, float]:
    counts: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "dedup_jobs_decisions_total" and sample.labels["job"] == JOB:
                counts[sample.labels["outcome"]] = counts.get(
                    sample.labels["outcome"], 0) + sample.value
    return counts


def store_commands() -> int:
    stats = redis.Redis.from_url(settings.REDIS_URL).info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in STORE_COMMANDS)


def warm_up_scripts() -> None:
    """Run the store's scripts once, so that neither run is charged their one-off SCRIPT LOAD
    (after a SCRIPT FLUSH or on a fresh server)."""
    from dedup_jobs import clock
    from dedup_jobs.stores import get_store

    store = get_store("redis")
    key = jobs_metrics.metrics_unique.job_key(("warm-up", 0), {})
    store.acquire(key, "warm", 5, now=clock.now())
    store.start(key, "warm", 5, now=clock.now(), release=False)
    store.release(key, "warm")


@pytest.fixture
def queue() -> Iterator[str]:
    from tests.celery_app import app

    name = f"{os.environ.get('DEDUP_JOBS_TEST_QUEUE', 'dedup_tests')}_metrics"
    reset_queue(app, BROKERS["rabbitmq"], name)
    yield name


def run_scenario(queue: str, prom_dir: Path, metrics_on: bool) -> tuple[str, int]:
    """HEADERLESS copies sent by name (no dedup header), then DISPATCHES dispatches over KEYS
    keys, all before the worker starts: KEYS published, the rest deduplicated; the worker (one
    prefork child, so in order) skips the headerless copies (their keys are held by the
    dispatched messages) and runs the KEYS messages. Returns the token and the store commands
    the server received meanwhile."""
    from tests.celery_app import app

    tok = token()
    warm_up_scripts()
    before = store_commands()
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "METRICS": metrics_on}), \
            publishing_to(app, BROKERS["rabbitmq"]):
        for item in range(HEADERLESS):
            app.send_task(JOB, (tok, item), queue=queue)
        for n in range(DISPATCHES):
            jobs_metrics.metrics_unique.apply_async((tok, n % KEYS), queue=queue)
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings_metrics",
           "DEDUP_JOBS_TEST_METRICS": "1" if metrics_on else "0",
           "PROMETHEUS_MULTIPROC_DIR": str(prom_dir)}
    with guard_worker(app, "rabbitmq", concurrency=1, queue=queue, env=env):
        wait_for(lambda: len(runs(tok)) >= KEYS, timeout=60)
        locks = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
        wait_for(lambda: not any(tok.encode() in k for k in locks.keys("*unique*")), timeout=30)
    return tok, store_commands() - before


@pytest.mark.matrix  # two prefork workers, ~30 s: the slow matrix step of CI
def test_counters_move_by_exactly_the_decisions_made(
    queue: str, tmp_path: Path, otel_reader: Any
) -> None:
    """A5: 200 dispatches over 50 keys and 10 headerless copies through a real prefork worker:
    the dispatching process counts 50 dispatched and 150 deduplicated (prometheus_client and
    OpenTelemetry), the worker's multi-process files 50 ran and 10 skipped; with metrics off
    nothing is counted, and the store commands the Redis server received (INFO commandstats)
    are the same with metrics on and off (budget: 0 extra round trips per decision)."""
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    prom_before, otel_before = prom_counts(REGISTRY), otel_counts(otel_reader)
    on_dir, off_dir = tmp_path / "on", tmp_path / "off"
    on_dir.mkdir()
    off_dir.mkdir()

    tok, on_commands = run_scenario(queue, on_dir, metrics_on=True)
    assert sorted(int(v) for v in runs(tok)) == list(range(KEYS))
    prom_mid, otel_mid = prom_counts(REGISTRY), otel_counts(otel_reader)
    dispatch_side = {"dispatched": KEYS, "deduplicated": DISPATCHES - KEYS}
    assert {k: prom_mid.get(k, 0) - prom_before.get(k, 0) for k in prom_mid} == dispatch_side
    assert {o: otel_mid.get((JOB, o), 0) - otel_before.get((JOB, o), 0)
            for (j, o) in otel_mid if j == JOB} == dispatch_side
    worker = CollectorRegistry()
    MultiProcessCollector(worker, path=str(on_dir))
    assert prom_counts(worker) == {"ran": KEYS, "skipped": HEADERLESS}

    tok, off_commands = run_scenario(queue, off_dir, metrics_on=False)
    assert sorted(int(v) for v in runs(tok)) == list(range(KEYS))
    assert prom_counts(REGISTRY) == prom_mid
    # (this job's counts only: a lease thread left by an earlier test may count its own)
    assert ({k: v for k, v in otel_counts(otel_reader).items() if k[0] == JOB}
            == {k: v for k, v in otel_mid.items() if k[0] == JOB})
    worker = CollectorRegistry()
    MultiProcessCollector(worker, path=str(off_dir))
    assert prom_counts(worker) == {}

    # the dispatches' acquires, the worker's checks and releases: the same with and without
    assert on_commands == off_commands
    assert on_commands >= DISPATCHES + KEYS + HEADERLESS


BLOCKER = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("prometheus_client", "opentelemetry"):
            raise ModuleNotFoundError(name)
        return None
if {block}:
    sys.meta_path.insert(0, Blocker())
import os
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
import django
django.setup()
from django.test.utils import override_settings
from tests.celery_app import app
from tests import jobs_metrics
from dedup_jobs import metrics
app.conf.broker_url = "memory://"
app.conf.task_always_eager = False
with override_settings(DEDUP_JOBS={{"STORE": "locmem", "METRICS": {on}}}):
    from dedup_jobs.stores import get_store
    jobs_metrics.metrics_unique.apply_async(("t", 1), connection=app.connection_for_write("memory://"))
    jobs_metrics.metrics_unique.apply_async(("t", 1), connection=app.connection_for_write("memory://"))
taken = metrics.tally.take()
# (redis-py imports opentelemetry by itself when it is installed: only ours are looked at)
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "prometheus_client"
                or m in ("dedup_jobs.metrics.prometheus", "dedup_jobs.metrics.otel"))
print(dict(taken.decisions), loaded)
"""


@pytest.mark.parametrize(("block", "on"), [(True, True), (False, False)],
                         ids=["extras-missing", "metrics-off"])
def test_nothing_imported_without_the_extras(block: bool, on: bool) -> None:
    """A5: without prometheus_client and opentelemetry installed (their import refused) the
    decisions are still counted in-process and neither library, nor our exporters, is
    imported; with DEDUP_JOBS["METRICS"] = False (libraries installed) neither exporter nor
    prometheus_client is imported and nothing is counted."""
    out = subprocess.run([sys.executable, "-c", BLOCKER.format(block=block, on=on)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"})
    assert out.returncode == 0, out.stderr[-3000:]
    counted = (f"{{('{JOB}', 'dispatched'): 1, ('{JOB}', 'deduplicated'): 1}}" if on else "{}")
    assert out.stdout.strip() == f"{counted} []"
