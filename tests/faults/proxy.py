"""A small TCP proxy (threads, loopback) between Redis clients and a server, that passes,
delays, loses or swallows replies.

Modes for every connection: :meth:`Proxy.pass_through` (the default),
:meth:`Proxy.delay_replies` (every reply ``D`` seconds late), :meth:`Proxy.blackhole` (requests
are read and thrown away: nothing runs, nothing is answered; :attr:`Proxy.swallowed` keeps
them), :meth:`Proxy.refuse` (the server is down: every connection is closed as soon as it is
made; :attr:`Proxy.refused` counts them). One-shot faults armed for the next
request that contains some bytes (a key, a token): :meth:`Proxy.drop_next_reply` — a "lost
reply": the request reaches the server and runs, its reply is thrown away and the client's
connection is closed, so the client sees a connection error although the command ran — and
:meth:`Proxy.delay_next_reply` — a "late reply": only that reply is held back ``D`` seconds
(the client has usually timed out and moved to another connection by then) — and
:meth:`Proxy.before_next_reply` — an interleaving: ``callback`` runs when the reply to that
request came from the server, before the client gets it (the request has run; the client
learns its answer only after whatever ``callback`` did to the server meanwhile).
:attr:`Proxy.requests` counts the requests forwarded (round trips, for a client that waits
for each answer).

The proxy reads whatever one ``recv`` returns as one request or reply. That is exact for a
client that sends one command and waits for its answer (the lock store), and good enough for
a drop (the connection is closed anyway).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

HOST = "127.0.0.1"
PASS, DELAY, BLACKHOLE, REFUSE = "pass", "delay", "blackhole", "refuse"


@dataclass
class Fault:
    """A one-shot fault: ``action`` is "drop", "cut", "delay" or "hook"; ``fired_at`` (monotonic)
    is set when the matching reply was dropped, held back or hooked; ``request`` is the
    request it hit."""

    action: str
    match: bytes | None
    seconds: float = 0.0
    callback: Callable[[], None] | None = None
    error: Exception | None = None  # what the hook's callback raised, if anything
    fired: threading.Event = field(default_factory=threading.Event)
    fired_at: float | None = None
    request: bytes = b""

    def wait(self, timeout: float = 10.0) -> bool:
        return self.fired.wait(timeout)


class _Link:
    """One client connection and its own connection to the server."""

    def __init__(self, proxy: Proxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = socket.create_connection(proxy.upstream, timeout=10)
        self.upstream.settimeout(None)
        self.pending: list[Fault] = []  # faults bound to the next replies, in order
        self.lock = threading.Lock()
        self.closed = False
        for target, name in ((self._requests, "requests"), (self._replies, "replies")):
            threading.Thread(target=target, name=f"proxy-{name}", daemon=True).start()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for sock in (self.client, self.upstream):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.proxy._forget(self)

    def _requests(self) -> None:
        try:
            while True:
                data = self.client.recv(65536)
                if not data:
                    break
                if self.proxy.mode == BLACKHOLE:
                    self.proxy.swallowed.append(data)
                    continue
                self.proxy.requests += 1
                fault = self.proxy._take_fault(data)
                if fault is not None:
                    fault.request = data
                    with self.lock:
                        self.pending.append(fault)
                self.upstream.sendall(data)
        except OSError:
            pass
        self.close()

    def _replies(self) -> None:
        try:
            while True:
                data = self.upstream.recv(65536)
                if not data:
                    break
                with self.lock:
                    fault = self.pending.pop(0) if self.pending else None
                if fault is not None and fault.action == "drop":
                    fault.fired_at = time.monotonic()
                    fault.fired.set()
                    break  # the reply is lost and the client's connection with it
                if fault is not None and fault.action == "cut":
                    self.client.sendall(data[:len(data) // 2])  # a batch's first answers
                    fault.fired_at = time.monotonic()
                    fault.fired.set()
                    break  # the rest is lost and the client's connection with it
                if fault is not None and fault.action == "hook":
                    assert fault.callback is not None
                    try:
                        fault.callback()
                    except Exception as exc:  # the test reads it from the fault
                        fault.error = exc
                    finally:
                        fault.fired_at = time.monotonic()
                        fault.fired.set()
                elif fault is not None:
                    fault.fired_at = time.monotonic()
                    fault.fired.set()
                    time.sleep(fault.seconds)
                elif self.proxy.mode == DELAY:
                    time.sleep(self.proxy.delay)
                self.client.sendall(data)
        except OSError:
            pass
        self.close()


class Proxy:
    """Listens on a free loopback port and forwards each connection to ``upstream``."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.mode = PASS
        self.delay = 0.0
        self.requests = 0  # requests forwarded so far, on every connection
        self.swallowed: list[bytes] = []  # requests thrown away by blackhole()
        self.refused = 0  # connections closed at once by refuse()
        self._faults: list[Fault] = []
        self._links: set[_Link] = set()
        self._mutex = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, 0))
        self._listener.listen(64)
        self.host = HOST
        self.port: int = self._listener.getsockname()[1]
        self._open = True
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def url(self, db: int = 0) -> str:
        return f"redis://{self.host}:{self.port}/{db}"

    # -- modes ----------------------------------------------------------------------------
    def pass_through(self) -> None:
        self.mode, self.delay = PASS, 0.0

    def delay_replies(self, seconds: float) -> None:
        """Every reply, on every connection, ``seconds`` late (the commands run on time)."""
        self.mode, self.delay = DELAY, seconds

    def blackhole(self) -> None:
        """Requests are read and never forwarded: nothing runs, nothing is answered."""
        self.mode = BLACKHOLE

    def refuse(self) -> None:
        """The server is down: every connection, open or new, is closed (a client sees its
        connection reset or closed at once, as when nothing listens or the server went
        away)."""
        self.mode = REFUSE
        self.drop_connections()

    def drop_next_reply(self, match: bytes | None = None) -> Fault:
        """Lose the reply to the next request containing ``match`` (any request if None)
        after the server ran it, and close that client connection."""
        return self._arm(Fault("drop", match))

    def cut_next_reply(self, match: bytes | None = None) -> Fault:
        """Forward the first half of the reply bytes to the next request containing
        ``match`` (a pipelined batch's first answers), then close that client connection."""
        return self._arm(Fault("cut", match))

    def delay_next_reply(self, seconds: float, match: bytes | None = None) -> Fault:
        """Hold back only the reply to the next request containing ``match``."""
        return self._arm(Fault("delay", match, seconds))

    def before_next_reply(self, callback: Callable[[], None], match: bytes | None = None) -> Fault:
        """Run ``callback`` once the reply to the next request containing ``match`` came from
        the server, before forwarding it to the client (a competitor acting between the
        client's read and its next write)."""
        return self._arm(Fault("hook", match, callback=callback))

    def _arm(self, fault: Fault) -> Fault:
        with self._mutex:
            self._faults.append(fault)
        return fault

    def _take_fault(self, request: bytes) -> Fault | None:
        with self._mutex:
            for fault in self._faults:
                if fault.match is None or fault.match in request:
                    self._faults.remove(fault)
                    return fault
        return None

    # -- plumbing -------------------------------------------------------------------------
    def _accept(self) -> None:
        while self._open:
            try:
                client, _addr = self._listener.accept()
            except OSError:
                return
            if self.mode == REFUSE:
                self.refused += 1
                client.close()
                continue
            try:
                link = _Link(self, client)
            except OSError:
                client.close()
                continue
            with self._mutex:
                self._links.add(link)

    def _forget(self, link: _Link) -> None:
        with self._mutex:
            self._links.discard(link)

    def drop_connections(self) -> None:
        """Close every connection made so far (new ones are accepted)."""
        with self._mutex:
            links = list(self._links)
        for link in links:
            link.close()

    def close(self) -> None:
        self._open = False
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() under way
        with suppress(OSError):
            self._listener.close()
        self.drop_connections()


@contextmanager
def redis_proxy(host: str, port: int) -> Iterator[Proxy]:
    """A :class:`Proxy` to ``host:port`` for the duration of the block."""
    proxy = Proxy((host, port))
    try:
        yield proxy
    finally:
        proxy.close()
