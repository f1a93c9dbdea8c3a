"""Deciding which held locks (and debounce bursts) are stale, for ``clear_stale_locks`` (SPEC
A2, D9).

A lock is stale when its owner task is finished according to the result backend, or (only
with ``older_than``) when it is older than that and its owner is neither reported by a worker
(``inspect`` active/reserved/scheduled) nor waiting in a broker queue. A *running* lock is
never stale here: its lease keeps it alive only while its worker lives, and it disappears on
its own within ``LEASE_SECONDS`` after the worker stops.

Everything works on batches (a few hundred locks), so memory stays bounded however many locks
a store holds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from celery import states
from kombu.utils.encoding import bytes_to_str

from dedup_jobs import clock
from dedup_jobs.stores.base import BaseStore, DebounceState

logger = logging.getLogger("dedup_jobs")

#: messages read from a broker list per LRANGE when looking for owners
QUEUE_CHUNK = 1000


class BackendUnavailable(Exception):
    """The result backend could not be read."""


class OwnerStates:
    """The state of owner task ids in the result backend, one read per batch of owners on
    every backend a Django team runs: a multi-key read on the key-value backends (Redis:
    ``MGET``; Celery's cache backend, in memory or on memcached: ``get_multi``, which answers
    with the keys it found; django-celery-results' ``django-cache``: the Django cache's
    ``get_many``), one query on django-celery-results' ``django-db`` backend. Any other
    backend is read one owner at a time (``AsyncResult(owner).state``)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.backend = app.backend
        self.enabled = type(self.backend).__name__ != "DisabledBackend"

    def finished(self, owners: list[str]) -> dict[str, str]:
        """``{owner: state}`` for the owners whose task is in a ready state."""
        if not self.enabled or not owners:
            return {}
        try:
            found = self._states(owners)
        except Exception as exc:
            raise BackendUnavailable(f"{type(self.backend).__name__}: {exc}") from exc
        return {owner: state for owner, state in found.items() if state in states.READY_STATES}

    def _states(self, owners: list[str]) -> dict[str, str]:
        backend = self.backend
        model = getattr(backend, "TaskModel", None)  # django-celery-results' django-db
        if model is not None:
            rows = model._default_manager.filter(task_id__in=owners)
            return {str(task_id): str(status)
                    for task_id, status in rows.values_list("task_id", "status")}
        if hasattr(backend, "get_key_for_task"):
            values = _read_many(backend, [backend.get_key_for_task(owner) for owner in owners])
            if values is not None:
                return {
                    owner: str(backend.decode_result(value).get("status", states.PENDING))
                    for owner, value in zip(owners, values, strict=True)
                    if value is not None
                }
        return {owner: str(self.app.AsyncResult(owner).state) for owner in owners}


def _read_many(backend: Any, keys: list[Any]) -> list[Any] | None:
    """The stored value at each of ``keys`` (None where there is none), in one read; None
    when the backend has no multi-key read."""
    try:
        raw = backend.mget(keys)
    except NotImplementedError:
        cache = getattr(backend, "cache_backend", None)  # django-celery-results' django-cache
        if cache is None:
            return None
        raw = cache.get_many([bytes_to_str(key) for key in keys])
    if isinstance(raw, Mapping):  # a cache answers with the keys it found, in no order
        found = {bytes_to_str(key): value for key, value in raw.items()}
        return [found.get(bytes_to_str(key)) for key in keys]
    return list(raw)


class Presence:
    """Where an owner task id may still be: reported by a worker, or waiting in a queue."""

    def __init__(self, app: Any, *, timeout: float) -> None:
        self.app = app
        self.timeout = timeout
        self._worker_ids: set[str] | None = None
        self._queues: set[str] = set()
        self.notes: list[str] = []

    def worker_ids(self) -> set[str]:
        """Task ids every replying worker reports as active, reserved or scheduled."""
        if self._worker_ids is None:
            inspect = self.app.control.inspect(timeout=self.timeout)
            ids: set[str] = set()
            for method in ("active", "reserved", "scheduled"):
                for requests in (getattr(inspect, method)() or {}).values():
                    for request in requests:
                        ids.add(str((request.get("request") or request).get("id")))
            for queues in (inspect.active_queues() or {}).values():
                self._queues.update(str(q["name"]) for q in queues)
            self._worker_ids = ids
        return self._worker_ids

    def queue_names(self) -> list[str]:
        self.worker_ids()
        names = set(self.app.amqp.queues) | {self.app.conf.task_default_queue} | self._queues
        return sorted(names)

    def unseen(self, owners: Iterable[str]) -> tuple[set[str], set[str]]:
        """Split ``owners`` into (nowhere to be seen, maybe still queued or running)."""
        wanted = set(owners)
        candidates = wanted - self.worker_ids()
        if not candidates:
            return set(), wanted
        gone = candidates - self._in_queues(candidates)
        return gone, wanted - gone

    def _in_queues(self, owners: set[str]) -> set[str]:
        """Owners whose message waits on the broker. Redis: read the lists and the unacked
        hash. Other transports cannot be browsed: a non-empty queue counts as holding all."""
        found: set[str] = set()
        with self.app.connection_for_read() as conn:
            channel = conn.default_channel
            if conn.transport.driver_type != "redis":
                for name in self.queue_names():
                    try:
                        count = channel.queue_declare(queue=name, passive=True).message_count
                    except Exception:
                        channel = conn.channel()  # a missing queue closes the channel
                        continue
                    if count:
                        self.notes.append(
                            f"queue {name!r} holds {count} message(s) that this transport "
                            f"cannot browse: locks older than --older-than were kept"
                        )
                        return set(owners)
                return found
            client = channel.client
            for name in self.queue_names():
                for pri in channel.priority_steps:
                    found |= self._scan_list(client, channel._q_for_pri(name, pri), owners)
            for _field, value in client.hscan_iter(channel.unacked_key, count=QUEUE_CHUNK):
                found |= _owner_in(_loads(value, first=True), owners)
        return found

    @staticmethod
    def _scan_list(client: Any, name: str, owners: set[str]) -> set[str]:
        found: set[str] = set()
        start = 0
        while True:
            chunk = client.lrange(name, start, start + QUEUE_CHUNK - 1)
            for raw in chunk:
                found |= _owner_in(_loads(raw), owners)
            if len(chunk) < QUEUE_CHUNK:
                return found
            start += QUEUE_CHUNK


def pending_bursts(
    store: BaseStore, *, job: str | None = None, batch_size: int = 500
) -> Iterator[tuple[DebounceState, bool]]:
    """D9: every pending debounce burst of ``store`` (of the job ``job`` only, if given), each
    with whether it is overdue: due more than LEASE_SECONDS ago and never claimed, so its
    message is taken as lost. Streamed in batches (only where the store can list)."""
    now = clock.now()
    for state in store.iter_debounces(batch_size=batch_size):
        if job is None or state.task_name == job:
            yield state, state.overdue(now)


def _loads(raw: Any, *, first: bool = False) -> Any:
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return value[0] if first and isinstance(value, list) and value else value


def _owner_in(message: Any, owners: set[str]) -> set[str]:
    if not isinstance(message, dict):
        return set()
    headers = message.get("headers") or {}
    properties = message.get("properties") or {}
    task_id = headers.get("id") or properties.get("correlation_id")
    return {task_id} if task_id in owners else set()
