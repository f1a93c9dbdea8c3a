"""Real Celery workers for the tests: in-process (a thread, solo or threads pool) and in a
subprocess (prefork, killable)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celery.contrib.testing.worker import start_worker
from kombu.asynchronous import set_event_loop

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def thread_worker(app: Any, *, pool: str = "solo", concurrency: int = 1) -> Iterator[Any]:
    """A worker running in a thread of the test process, consuming the test queue.

    Each one gets its own event loop: Celery's Hub bootstep reuses a process-global loop
    whose timer belongs to the worker that made it, and on Celery 5.5 a later worker's
    countdown/ETA messages then never fire (kombu's ``set_event_loop(None)`` between workers
    is what a new process would start with)."""
    set_event_loop(None)
    try:
        with start_worker(
            app, pool=pool, concurrency=concurrency, perform_ping_check=False,
            shutdown_timeout=30, loglevel="WARNING",
        ) as worker:
            yield worker
    finally:
        set_event_loop(None)


@contextmanager
def process_worker(
    *, pool: str = "prefork", concurrency: int = 2, env: dict[str, str] | None = None,
    broker: str | None = None, extra: tuple[str, ...] = (),
) -> Iterator[subprocess.Popen[bytes]]:
    """``celery worker`` in a subprocess; killed (SIGKILL) at the end if still alive."""
    environ = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
               "DEDUP_JOBS_TEST_FIXUP": "1", **(env or {})}
    if broker:
        environ["CELERY_BROKER_URL"] = broker
    cmd = [
        sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker", "-P", pool,
        "-c", str(concurrency), "-l", "WARNING", "--without-gossip", "--without-mingle",
        "--without-heartbeat", "-Q", environ.get("DEDUP_JOBS_TEST_QUEUE", "dedup_tests"),
        "-n", f"test-{os.getpid()}-{time.monotonic_ns()}@%h", *extra,
    ]
    log = open(ROOT / f".worker-{os.getpid()}.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(cmd, cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()


def wait_for(predicate: Any, timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Poll until predicate() is truthy; fail loudly (never hang) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate}")
        time.sleep(interval)
