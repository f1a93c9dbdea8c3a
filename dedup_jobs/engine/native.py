"""Real OS threads for the lease, also under gevent and eventlet.

Under their monkey-patching a ``threading.Thread`` is a green thread: it runs only when the
job's body yields, so a body that computes for longer than a lease would let its lock expire.
The lease therefore runs on a real OS thread, started and synchronised with the unpatched
``_thread`` functions (``gevent.monkey.get_original``, ``eventlet.patcher.original``).
"""

from __future__ import annotations

import _thread
import contextlib
import sys
from types import SimpleNamespace
from typing import Any


def green() -> str:
    """``"gevent"`` or ``"eventlet"`` when that library monkey-patched threading, else ``""``."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return "gevent"
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None and patcher.is_monkey_patched("thread"):
        return "eventlet"
    return ""


def original_thread() -> Any:
    """The unpatched ``_thread`` functions: ``start_new_thread`` and ``allocate_lock``."""
    kind = green()
    if kind == "gevent":
        from gevent import monkey

        return SimpleNamespace(
            start_new_thread=monkey.get_original("_thread", "start_new_thread"),
            allocate_lock=monkey.get_original("_thread", "allocate_lock"),
        )
    if kind == "eventlet":
        from eventlet import patcher

        return patcher.original("_thread")
    return _thread


class Bell:
    """A wake-up call between threads on one real lock (never a green one, so a green thread
    can ring it and an OS thread wait on it): :meth:`ring` ends the current or next
    :meth:`wait`; rings before a wait count once."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self._lock.acquire()

    def ring(self) -> None:
        with contextlib.suppress(RuntimeError):  # rung already
            self._lock.release()

    def wait(self, timeout: float) -> None:
        self._lock.acquire(timeout=max(0.0, timeout))
