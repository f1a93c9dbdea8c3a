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


def _broker_idle(app: Any) -> bool:
    """No message of the test queue waits on the Redis broker, none is delivered unacked."""
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        client = channel.client
        return not client.llen(app.conf.task_default_queue) and not client.hlen(
            channel.unacked_key)


def _requests_in_process() -> int:
    """Requests an in-process worker holds: scheduled (countdown/ETA), reserved, running."""
    from celery.worker import state

    return (len(state.reserved_requests) + len(state.active_requests)
            + len(getattr(state, "scheduled_requests", ())))


def _requests_remote(app: Any) -> int | None:
    """Requests the one subprocess worker reports (inspect); None when it did not answer."""
    inspect = app.control.inspect(timeout=2.0, limit=1)
    total = 0
    for query in (inspect.active, inspect.reserved, inspect.scheduled):
        replies = query()
        if not replies:
            return None
        total += sum(len(requests) for requests in replies.values())
    return total


def _idle(app: Any, remote: bool) -> bool:
    # In the order a message moves (queue, unacked, the worker): a message found nowhere in
    # one pass had already ended when its stage was looked at.
    if not _broker_idle(app):
        return False
    return (_requests_remote(app) if remote else _requests_in_process()) == 0


def wait_idle(app: Any, timeout: float = 20.0, *, remote: bool = False) -> None:
    """Poll until the worker has nothing left to do: nothing on the Redis broker's test
    queue, nothing delivered unacked, no request scheduled, reserved or running in the worker
    (in this process, or the one subprocess worker through ``inspect`` with ``remote``).
    Twice in a row: a run that ended during the first pass may have published a message
    (a chain's next link, a retry, a re-schedule) behind it. A test that asserts something
    did *not* run waits here instead of for a fixed time: once idle, nothing more can run."""
    deadline = time.monotonic() + timeout
    idle_passes = 0
    while idle_passes < 2:
        idle_passes = idle_passes + 1 if _idle(app, remote) else 0
        if idle_passes < 2:
            if time.monotonic() > deadline:
                raise AssertionError(f"the worker was not idle within {timeout}s")
            time.sleep(0.05)
