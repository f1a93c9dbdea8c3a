"""A private memcached for the tests: Debian's ``memcached`` binary on a free loopback port
(``memcached -l 127.0.0.1 -p PORT -U 0``), a child of the test process, stopped by its pid.

:func:`memcached_process` starts one (the session fixture ``memcached_server`` in
tests/conftest.py shares one for the whole run; an outage test starts its own). A missing
binary or a missing ``pymemcache`` client skips the test with a reason naming it, or fails it
with ``DEDUP_JOBS_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import pytest

REQUIRE = os.environ.get("DEDUP_JOBS_REQUIRE_SERVICES") == "1"
HOST = "127.0.0.1"
BACKEND = "django.core.cache.backends.memcached.PyMemcacheCache"


def _missing(message: str) -> None:
    if REQUIRE:
        pytest.fail(f"{message} and DEDUP_JOBS_REQUIRE_SERVICES=1")
    pytest.skip(message)


def memcached_binary() -> str:
    """The ``memcached`` executable (Debian's package); skip or fail when it is missing."""
    found = shutil.which(os.environ.get("DEDUP_JOBS_TEST_MEMCACHED", "memcached"))
    if not found:
        _missing("memcached is not installed (no memcached binary on PATH; "
                 "apt-get install memcached)")
    assert found is not None
    try:
        import pymemcache  # noqa: F401
    except ImportError:
        _missing("the memcached client pymemcache is not installed (uv sync)")
    return found


@dataclass
class MemcachedServer:
    """A running private memcached: where it listens and its process."""

    host: str
    port: int
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def location(self) -> str:
        return f"{self.host}:{self.port}"

    def cache(self, **extra: Any) -> dict[str, Any]:
        """A ``CACHES`` entry for this server (no OPTIONS: the store bounds its own calls)."""
        return {"BACKEND": BACKEND, "LOCATION": self.location, "KEY_PREFIX": "t", **extra}

    def answers(self, timeout: float = 0.2) -> bool:
        """True when *this* process answers on the port: its ``stats`` name its pid (another
        process's memcached may hold the port, e.g. a parallel test process's, when ours
        could not bind it)."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout) as sock:
                sock.sendall(b"stats\r\n")
                data = b""
                while not data.endswith(b"END\r\n"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        return False
                    data += chunk
            return f"STAT pid {self.pid}\r\n".encode() in data
        except OSError:
            return False

    def flush(self) -> None:
        with socket.create_connection((self.host, self.port), timeout=5) as sock:
            sock.sendall(b"flush_all\r\n")
            assert sock.recv(64) == b"OK\r\n"

    def stop(self) -> None:
        """SIGCONT (it may be stopped), then SIGTERM by pid; SIGKILL if it lingers."""
        if self.process.poll() is not None:
            return
        with suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.process.wait(timeout=5)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def memcached_process() -> Iterator[MemcachedServer]:
    """Start a private memcached on a free loopback port (TCP only); stop it by pid."""
    binary = memcached_binary()
    user = pwd.getpwuid(os.geteuid()).pw_name  # memcached refuses root without -u
    for _attempt in range(3):  # the free port may be taken between bind() and memcached
        port = _free_port()
        process = subprocess.Popen(
            [binary, "-l", HOST, "-p", str(port), "-U", "0", "-u", user, "-m", "64"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        server = MemcachedServer(HOST, port, process)
        deadline = time.monotonic() + 10
        while process.poll() is None and time.monotonic() < deadline:
            if server.answers():
                break
            time.sleep(0.02)
        if process.poll() is None and server.answers():
            break
        server.stop()
    else:
        error = process.stderr.read().decode(errors="replace") if process.stderr else ""
        pytest.fail(f"memcached did not start on a free port: {error[-2000:]}")
    try:
        yield server
    finally:
        server.stop()
        if process.stderr:
            process.stderr.close()
