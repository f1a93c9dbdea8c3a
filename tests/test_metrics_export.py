"""A5, counting off the decision path: a decision appends to the tally's pending counts and
nothing more; folds, exporter syncs and history flushes happen elsewhere. These tests pin what
that must keep: exact counts from many threads, readers that see every count made before
them, a forked child that does not flush its parent's counts again, prometheus_client fed
by a collector (one process) or by a sync into its multi-process files (prefork), and the
Redis-family stores timing each script they send."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dedup_jobs import metrics
from dedup_jobs.metrics import tally
from dedup_jobs.metrics.tally import LATENCY_BUCKETS
from tests import jobs
from tests.workers import ROOT

JOB = "tests.export"


def test_counts_from_many_threads_are_exact() -> None:
    """8 threads x 5,000 decisions and store calls at once: every one is counted, once."""
    tally.take()
    totals, calls = tally.snapshot()
    before = totals.get((JOB, "ran"), 0)
    slot = LATENCY_BUCKETS.index(0.001)  # 0.7 ms falls in the 1 ms bucket
    before_calls = calls.get(("export", "acquire"), [0.0] * 16)[slot]

    def count() -> None:
        for _ in range(5000):
            metrics.decision(JOB, "ran", "k")
            metrics.store_call("export", "acquire", 0.0007)

    threads = [threading.Thread(target=count) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    totals, calls = tally.snapshot()
    assert totals[(JOB, "ran")] - before == 40_000
    assert calls[("export", "acquire")][slot] - before_calls == 40_000
    taken = tally.take()
    assert taken.decisions[(JOB, "ran")] == 40_000
    assert taken.keys[(JOB, "k")] == 40_000


def test_a_reader_sees_every_count_made_before_it() -> None:
    """Nothing waits for the metrics thread (it folds every 0.1 s): a snapshot (what the
    exporters read) and a take (what the history flushes) fold the pending counts first."""
    tally.take()
    metrics.decision(JOB, "skipped")
    assert tally.snapshot()[0][(JOB, "skipped")] >= 1
    metrics.decision(JOB, "skipped")
    assert tally.take().decisions[(JOB, "skipped")] == 2


FORKED = """
import os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
import django
django.setup()
from dedup_jobs import metrics
from dedup_jobs.metrics import tally
for _ in range(4):
    metrics.decision("tests.parent", "ran")  # not flushed at the fork
pid = os.fork()
if pid == 0:
    metrics.decision("tests.child", "ran")
    print("child", sorted(tally.take().decisions.items()), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("parent", sorted(tally.take().decisions.items()), flush=True)
"""


def test_a_forked_child_flushes_only_its_own_counts() -> None:
    """A prefork child starts with a copy of its parent's counters: what the parent counted
    (folded or still pending) is the parent's to flush, not the child's as well."""
    out = subprocess.run([sys.executable, "-c", FORKED], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert lines["child"] == "[(('tests.child', 'ran'), 1)]"
    assert lines["parent"] == "[(('tests.parent', 'ran'), 4)]"


def test_prometheus_reads_the_tally_when_scraped() -> None:
    """One process: the default registry's collector reads the running totals at scrape
    time; the store-call histogram's count is the number of calls."""
    from prometheus_client import REGISTRY

    metrics.exporters()

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = sample("dedup_jobs_decisions_total", job=JOB, outcome="replaced")
    calls = sample("dedup_jobs_store_call_seconds_count", store="export-scrape", call="renew")
    for _ in range(7):
        metrics.decision(JOB, "replaced")
        metrics.store_call("export-scrape", "renew", 0.003)
    assert sample("dedup_jobs_decisions_total", job=JOB, outcome="replaced") == before + 7
    assert sample("dedup_jobs_store_call_seconds_count", store="export-scrape",
                  call="renew") == calls + 7
    assert sample("dedup_jobs_store_call_seconds_bucket", store="export-scrape", call="renew",
                  le="0.0025") == 0
    assert sample("dedup_jobs_store_call_seconds_bucket", store="export-scrape", call="renew",
                  le="0.005") == calls + 7


def test_whole_buckets_are_added_to_a_prometheus_histogram() -> None:
    """The multi-process sync adds bucket counts to a Histogram child's own values (private
    ``_buckets``/``_sum``, checked against prometheus_client 0.26): this fails if they
    change."""
    from prometheus_client import CollectorRegistry, Histogram

    from dedup_jobs.metrics.prometheus import add_to_histogram

    registry = CollectorRegistry()
    child = Histogram("pinned_seconds", "pinned", ["store"], buckets=LATENCY_BUCKETS,
                      registry=registry).labels("s")
    width = len(LATENCY_BUCKETS) + 2
    before = [0.0] * width
    counts = [0.0] * width
    counts[0], counts[3], counts[-2], counts[-1] = 2, 5, 1, 12.5  # +Inf: 1; sum 12.5
    add_to_histogram(child, counts, before)
    assert registry.get_sample_value("pinned_seconds_bucket", {"store": "s", "le": "0.0005"}) == 2
    assert registry.get_sample_value("pinned_seconds_bucket", {"store": "s", "le": "0.005"}) == 7
    assert registry.get_sample_value("pinned_seconds_bucket", {"store": "s", "le": "+Inf"}) == 8
    assert registry.get_sample_value("pinned_seconds_count", {"store": "s"}) == 8
    assert registry.get_sample_value("pinned_seconds_sum", {"store": "s"}) == 12.5


MULTIPROCESS = """
import os
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
import django
django.setup()
from dedup_jobs import metrics
for _ in range(5):
    metrics.decision("tests.multi", "dispatched")
    metrics.store_call("multi", "acquire", 0.0002)
metrics.sync()
metrics.decision("tests.multi", "deduplicated")  # left for the sync at exit
"""


def test_multiprocess_mode_syncs_into_its_files(tmp_path: Path) -> None:
    """PROMETHEUS_MULTIPROC_DIR set: the process's counts reach its files by a sync (the
    metrics thread's, and the last one at exit), and one MultiProcessCollector reads them."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    out = subprocess.run([sys.executable, "-c", MULTIPROCESS], cwd=ROOT, capture_output=True,
                         text=True, timeout=60,
                         env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    value = registry.get_sample_value
    assert value("dedup_jobs_decisions_total",
                 {"job": "tests.multi", "outcome": "dispatched"}) == 5
    assert value("dedup_jobs_decisions_total",
                 {"job": "tests.multi", "outcome": "deduplicated"}) == 1
    assert value("dedup_jobs_store_call_seconds_bucket",
                 {"store": "multi", "call": "acquire", "le": "0.0005"}) == 5


@pytest.mark.redis
def test_redis_stores_time_every_script_they_send() -> None:
    """The Redis family times its calls where each script is sent (no wrapper): a dispatch
    and its duplicate are two ``acquire`` calls of the store."""
    from dedup_jobs.stores import get_store

    store = get_store("redis")
    assert type(store).times_its_calls
    assert not hasattr(type(store).acquire, "__dedup_timed__")
    before = tally.snapshot()[1].get(("redis", "acquire"), [0.0] * 16)
    jobs.unique_sleep.delay("export-timed")
    jobs.unique_sleep.delay("export-timed")
    after = tally.snapshot()[1][("redis", "acquire")]
    assert sum(after[:-1]) - sum(before[:-1]) == 2
    assert after[-1] > before[-1]


@pytest.mark.redis
def test_a_failed_script_counts_a_store_error_of_its_job() -> None:
    """A Redis-family call that raises StoreUnavailable counts a ``store_error`` of the key's
    job, its seconds in the histogram, and the error as the store's last one."""
    from django.conf import settings
    from django.test import override_settings

    from dedup_jobs import clock
    from dedup_jobs.exceptions import StoreUnavailable
    from dedup_jobs.keys import build_key
    from dedup_jobs.stores import get_store

    dead = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}
    tally.take()
    with override_settings(CACHES={**settings.CACHES, "dead": dead}):
        store = get_store("dead")
        with pytest.raises(StoreUnavailable):
            store.acquire(build_key("unique", JOB, "dead"), "owner", 5, now=clock.now())
    taken = tally.take()
    assert taken.decisions[(JOB, "store_error")] == 1
    assert sum(taken.latency["dead"]) == 1
    assert taken.last_error is not None and taken.last_error[1] == "dead"
