"""What each pytest-xdist worker of the suite keeps to itself.

``uv run pytest`` runs the suite in several worker processes (pytest-xdist, ``-n`` in
pyproject.toml). Most of what a test touches is private to its process already: the SQLite
file and the PostgreSQL and MariaDB test databases are named after the pid, the servers the
tests start (memcached, Valkey, Sentinel, the clusters, the fault tests' redis-servers) take
free ports. Two things are shared by name and are made per worker here, before the settings
read them:

- **Redis.** Tests flush databases 9 to 12 of the test Redis before each test. The first
  worker (``gw0``) uses the configured one (``DEDUP_JOBS_TEST_REDIS``, or 127.0.0.1:6379);
  every other worker starts a private ``redis-server`` (no persistence) on a free loopback
  port, stopped by its pid when the worker exits (and by the kernel, through
  ``PR_SET_PDEATHSIG``, if the worker is killed).
- **The Celery queue** (``DEDUP_JOBS_TEST_QUEUE``): ``dedup_tests_gw1`` and so on, so that one
  worker's Celery workers never take another's messages (on Redis and on RabbitMQ).

Processes the tests spawn (Celery workers, the example project) inherit both through the
environment (``DEDUP_JOBS_XDIST_REDIS``), and start nothing of their own.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

#: set once the worker's Redis is chosen; read by tests/settings.py in every process below it
REDIS_ENV = "DEDUP_JOBS_XDIST_REDIS"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _answers(port: int, pid: int) -> bool:
    """True when the server on ``port`` is ours (its INFO names our pid)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"INFO server\r\n")
            data = b""
            while b"process_id:" not in data or b"\r\n" not in data.split(b"process_id:")[-1]:
                chunk = sock.recv(65536)
                if not chunk:
                    return False
                data += chunk
        return f"process_id:{pid}\r\n".encode() in data
    except OSError:
        return False


def _start_redis() -> str:
    binary = shutil.which(os.environ.get("DEDUP_JOBS_TEST_REDIS_SERVER", "redis-server"))
    if binary is None:
        raise RuntimeError(
            "pytest-xdist worker: no redis-server binary on PATH for its private Redis "
            "(set DEDUP_JOBS_TEST_REDIS_SERVER, or run with -n 0)")
    directory = tempfile.mkdtemp(prefix="dedup-xdist-redis-")
    for _attempt in range(5):  # a free port may be taken between bind() and the server's
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", directory, "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + 10
        while process.poll() is None and time.monotonic() < deadline:
            if _answers(port, process.pid):
                atexit.register(_stop, process, directory)
                return f"redis://127.0.0.1:{port}"
            time.sleep(0.02)
        _stop(process, directory=None)
    raise RuntimeError(f"pytest-xdist worker: {binary} did not start on a free port")


def _stop(process: subprocess.Popen[bytes], directory: str | None) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    if directory:
        shutil.rmtree(directory, ignore_errors=True)


def set_up() -> None:
    """Choose this worker's Redis and queue (a no-op outside pytest-xdist, and in processes
    the tests spawn, which inherit the choice)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or REDIS_ENV in os.environ:
        return
    queue = os.environ.get("DEDUP_JOBS_TEST_QUEUE", "dedup_tests")
    os.environ["DEDUP_JOBS_TEST_QUEUE"] = f"{queue}_{worker}"
    if worker == "gw0":
        os.environ[REDIS_ENV] = os.environ.get("DEDUP_JOBS_TEST_REDIS", "redis://127.0.0.1:6379")
    else:
        os.environ[REDIS_ENV] = _start_redis()
