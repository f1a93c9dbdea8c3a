"""Real Celery workers (subprocesses) for the scenarios that need one, and waiting helpers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.redisutil import client, commandstats
from benchmarks.settings import QUEUE, RESULT_DB

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "benchmarks" / ".worker.log"


@contextmanager
def worker(
    *,
    concurrency: int = 2,
    lease: float = 3.0,
    pool: str = "prefork",
    include: str = "",
    env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """``celery worker`` (``pool``, prefork by default) on the benchmark queue, importing the
    modules ``include`` names too (comma-separated); SIGKILLed at the end if alive."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "benchmarks.settings",
        "BENCH_LEASE": str(lease),
        **(env or {}),
    }
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "benchmarks.app",
        "worker",
        "-P",
        pool,
        "-c",
        str(concurrency),
        "-l",
        "WARNING",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-Q",
        QUEUE,
        "-n",
        f"bench-{os.getpid()}-{time.time_ns()}@%h",
        *(["-I", include] if include else []),
    ]
    with open(LOG, "ab") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_ready(proc)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _wait_ready(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Ready once the worker's consumer blocks on the queue (BRPOP seen by the server)."""
    seen = commandstats()["brpop"]
    wait_for(
        lambda: proc.poll() is not None or commandstats()["brpop"] > seen,
        timeout,
        what="worker start",
    )
    if proc.poll() is not None:
        raise RuntimeError(f"the benchmark worker exited ({proc.returncode}); see {LOG}")


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker and its pool processes at once (no cleanup runs anywhere)."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 30.0,
    interval: float = 0.02,
    *,
    what: str = "condition",
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout}s")
        time.sleep(interval)


def runs(contender: str) -> int:
    return int(client(RESULT_DB).llen(f"runs:{contender}"))


def finished() -> int:
    """Messages the workers finished (run or skipped) since the last clean()."""
    return int(client(RESULT_DB).llen("finished"))


def published_since(lpush_before: int) -> int:
    """Messages published since ``lpush_before`` (every publish is one LPUSH on the broker,
    whoever sends it: this process, or a worker publishing the next link of a chain)."""
    return commandstats()["lpush"] - lpush_before


def settle(lpush_before: int, timeout: float = 30.0) -> None:
    """Wait until every message published since then has been finished by a worker."""
    wait_for(
        lambda: finished() >= published_since(lpush_before), timeout, what="all messages finished"
    )
    time.sleep(0.3)
    wait_for(
        lambda: finished() >= published_since(lpush_before), timeout, what="all messages finished"
    )
