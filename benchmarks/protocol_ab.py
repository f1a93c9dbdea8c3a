"""``python -m benchmarks.protocol_ab [--baseline REV]``: this tree's dispatch latency next to a
baseline revision's (default: 5d8114d, main before the fault-tolerant store protocol of issue
11), in one run, against one real Redis (store and broker).

Two child processes, one importing ``dedup_jobs`` from this tree and one from the baseline
(extracted with ``git archive`` into a temporary directory), run the same driver: a
``UniqueJob`` on a django-redis store, ``delay()`` with no worker. Each round, each child runs
one batch of first dispatches (a fresh key per call) and one batch of duplicates (a held key),
the children taking turns in an order that alternates round by round. Printed: the median µs
per call of each side, the ratio of those medians (this tree / baseline: computable from the
two figures beside it), and the min-max of the per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "5d8114d"
REDIS = os.environ.get("DEDUP_JOBS_BENCH_REDIS", "redis://127.0.0.1:6379")

SETTINGS = f"""
SECRET_KEY = "ab"
USE_TZ = True
INSTALLED_APPS = ["dedup_jobs"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}}}
CACHES = {{"default": {{"BACKEND": "django_redis.cache.RedisCache",
                        "LOCATION": "{REDIS}/13",
                        "OPTIONS": {{"SOCKET_TIMEOUT": 5, "SOCKET_CONNECT_TIMEOUT": 5}}}}}}
DEDUP_JOBS = {{"STORE": "default"}}
CELERY_BROKER_URL = "{REDIS}/14"
CELERY_TASK_DEFAULT_QUEUE = "ab"
"""

DRIVER = """
import gc, os, sys, time
os.environ["DJANGO_SETTINGS_MODULE"] = "ab_settings"
import django
django.setup()
from celery import Celery
app = Celery("ab", set_as_current=True)
app.config_from_object("django.conf:settings", namespace="CELERY")
from dedup_jobs import UniqueJob

@app.task(base=UniqueJob, unique_for=600, name="ab.job", ignore_result=True, shared=False)
def job(x):
    return x

serial = 0
for line in sys.stdin:
    what, n = line.split()
    n = int(n)
    if what == "dup":
        job.delay(-1)  # holds the key (or already held): every call below is a duplicate
    ids = list(range(serial, serial + n)) if what == "first" else [-1] * n
    serial += n
    gc.disable()
    started = time.perf_counter()
    for i in ids:
        job.delay(i)
    elapsed = time.perf_counter() - started
    gc.enable()
    print(elapsed / n * 1e6, flush=True)
"""


def _extract(rev: str, into: Path) -> None:
    archive = subprocess.run(["git", "archive", "--format=tar", rev, "dedup_jobs"], cwd=ROOT,
                             check=True, capture_output=True).stdout
    with tempfile.TemporaryFile() as tar:
        tar.write(archive)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as files:
            files.extractall(into, filter="data")


def _child(tree: Path, work: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{work}{os.pathsep}{tree}"}
    return subprocess.Popen([sys.executable, "-c", DRIVER], cwd=work, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _ask(child: subprocess.Popen[str], what: str, n: int) -> float:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(f"{what} {n}\n")
    child.stdin.flush()
    return float(child.stdout.readline())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.protocol_ab", description=__doc__)
    parser.add_argument("--baseline", default=BASELINE, help=f"git revision (default {BASELINE})")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=300)
    args = parser.parse_args(argv)
    import redis

    store, broker = redis.Redis.from_url(f"{REDIS}/13"), redis.Redis.from_url(f"{REDIS}/14")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        work, base = Path(tmp, "work"), Path(tmp, "baseline")
        work.mkdir()
        base.mkdir()
        (work / "ab_settings.py").write_text(SETTINGS)
        _extract(args.baseline, base)
        sides = {"baseline": _child(base, work), "this tree": _child(ROOT, work)}
        samples: dict[str, dict[str, list[float]]] = {
            name: {"first": [], "dup": []} for name in sides}
        try:
            for child in sides.values():  # warm-up: connections, scripts, imports
                store.flushdb()
                _ask(child, "first", 50)
                _ask(child, "dup", 50)
            for round_ in range(args.rounds):
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                for name in order:
                    store.flushdb()
                    broker.flushdb()
                    samples[name]["first"].append(_ask(sides[name], "first", args.batch))
                    samples[name]["dup"].append(_ask(sides[name], "dup", args.batch))
        finally:
            for child in sides.values():
                assert child.stdin is not None
                child.stdin.close()
                child.wait(timeout=30)
            store.flushdb()
            broker.flushdb()
    print(f"dispatch latency, {args.rounds} rounds x {args.batch} calls, baseline "
          f"{args.baseline} vs this tree {head} (µs per call, median over rounds)\n")
    print("| figure | baseline | this tree | this / baseline | per-round ratio min-max |")
    print("| --- | --- | --- | --- | --- |")
    worse = False
    for figure, label in (("first", "first dispatch"), ("dup", "duplicate")):
        old, new = samples["baseline"][figure], samples["this tree"][figure]
        ratios = [n / o for n, o in zip(new, old, strict=True)]
        m_old, m_new = statistics.median(old), statistics.median(new)
        print(f"| {label} | {m_old:.0f} | {m_new:.0f} | {m_new / m_old:.2f} | "
              f"{min(ratios):.2f}-{max(ratios):.2f} |")
        worse = worse or m_new / m_old > 1.05
    print(f"\nno worse than the baseline (within 5 %): {'no' if worse else 'yes'}")
    return 1 if worse else 0


if __name__ == "__main__":
    raise SystemExit(main())
