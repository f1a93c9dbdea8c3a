"""Debounce on the generic cache store: the state's mutex, its dispatch ids and the undo of a
failed dispatch (``withdraw``), kept apart from ``cache.py``. The state is a dict at the
debounce key; each dispatch id sits in a key of its own (``{key}:ids:{message id}:{n}``, the
adopted ids of a stale burst first), so a dispatch costs O(1) whatever the burst's size."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from dedup_jobs import clock
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey

if TYPE_CHECKING:
    from dedup_jobs.stores.cache_host import CacheHost as Host
else:
    Host = object

MUTEX_SECONDS = 5.0  # a crashed holder's debounce mutex frees itself after this


def due_of(state: dict[str, Any]) -> float:
    """When the burst ``state`` is due: its runs-at, capped by its max-wait deadline."""
    deadline = state["deadline"]
    run_at: float = state["run_at"]
    return run_at if deadline is None else min(run_at, deadline)


class CacheDebounceMixin(Host):
    """The debounce helpers of :class:`~dedup_jobs.stores.cache.CacheStore`."""


    @contextmanager
    def _mutex(self, key: JobKey) -> Iterator[None]:
        name, token = f"{key.key}:mutex", str(uuid4())
        give_up = time.monotonic() + MUTEX_SECONDS
        pause = 0.0005
        while not self.calls.add(name, token, MUTEX_SECONDS):
            if time.monotonic() > give_up:
                raise StoreUnavailable(self.alias, f"debounce mutex {name!r} stayed taken")
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
        try:
            yield
        finally:
            # compare-and-delete: a mutex that expired under us and was taken by another
            # dispatcher stays theirs (on memcached; elsewhere a read then a delete)
            current, cas_token = self.calls.gets(name)
            if current == token:
                self.calls.cas_delete(name, cas_token)

    @staticmethod
    def _seen_key(key: JobKey, task_id: str) -> str:
        """Where dispatch ``task_id``'s answer is kept while its burst may be re-sent to (S7):
        (the burst's message id, the dispatch it superseded or None)."""
        return f"{key.key}:seen:{task_id}"

    @staticmethod
    def _ids_key(key: JobKey, message: str, n: int) -> str:
        return f"{key.key}:ids:{message}:{n}"

    def _id_names(self, key: JobKey, state: dict[str, Any]) -> list[str]:
        last = state.get("base", 0) + state["count"]
        return [self._ids_key(key, state["message"], n) for n in range(1, last + 1)]

    def _ids(self, key: JobKey, state: dict[str, Any]) -> list[str]:
        """Every dispatch id of the burst ``state``, in order (adopted ones first)."""
        names = self._id_names(key, state)
        found = self.calls.get_many(names)
        return [found[name] for name in names if name in found]

    def withdraw(self, key: JobKey, task_id: str) -> bool:
        with self.calls.decision(), self._mutex(key):
            state = self.calls.get(key.key)
            if state is None or state["message"] == task_id:
                return False
            names = self._id_names(key, state)
            found = self.calls.get_many(names)
            mine = [name for name in names if found.get(name) == task_id]
            if not mine:
                return False
            self.calls.delete_many([*mine, self._seen_key(key, task_id)])
            if state["latest"] == task_id and state.get("previous"):
                latest, payload = state["previous"]
                state = {**state, "latest": latest, "payload": payload, "previous": None}
                self.calls.set_many({key.key: state}, max(1.0, state["expires"] - clock.now()))
            return True
