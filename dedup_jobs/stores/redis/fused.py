"""Where a fused dispatch takes its lock and pushes its message (issue 26, docs/semantics.md#fused):
the store half of it, :meth:`RedisFused.acquire_fused` (one script, ``FUSED`` in
``fused_scripts.py``), and its undo after a failure, :meth:`RedisFused.undo_fused`. The broker
half, which hands over the queue's key and the message, is ``dedup_jobs/jobs/transport.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.answers import Acquired
from dedup_jobs.stores.redis.connection import _ms, _text


@dataclass(frozen=True, kw_only=True)
class FusedCall:
    """A unique dispatch's lock and its message, as the broker would push it."""

    key: JobKey
    owner: str
    ttl: float  # seconds
    request: str  # the dispatch's request id (S7)
    queue: str  # the queue's key in the broker's database (priority suffix included)
    database: int  # the broker's database number
    payload: str  # the message, serialised as kombu's Redis transport pushes it


class RedisFused:
    """The fused dispatch on a Redis store of one server (not on a cluster: its queue and its
    lock would live on different nodes; not through Sentinel: its pool picks the server)."""

    alias: str
    _server: str | None = None

    # provided by RedisStore / RedisConnection
    client: Any
    _keeping: Any
    _eval: Any
    _send_many: Any
    acquired_answers: Callable[..., list[Acquired]]
    place: Any
    deadline_ms: Any
    learn_skew: Any
    _tombstone_ms: Any
    _reply: Any
    _errors: Any

    def fused_database(self) -> int | None:
        """The store's database number when a fused dispatch can run on it, else None."""
        pool = self._keeping(self.client)
        if pool is None:
            return None
        return int(pool.connection_kwargs.get("db") or 0)

    def server_id(self) -> str:
        """The store's Redis server as the server names itself (INFO's run_id, read once):
        the broker's connection is on the same server when its run_id is this one. "" when
        the server cannot be named (INFO refused or renamed): then nothing is fused."""
        if self._server is None:
            try:
                self._server = str(self.client.info("server")["run_id"])
            except (self._reply, KeyError, TypeError):
                # INFO refused (an ACL user without @dangerous), renamed, or no run_id: the
                # server cannot be named, so nothing is fused on it ("")
                self._server = ""
            except self._errors as exc:
                raise StoreUnavailable(self.alias, exc) from exc
        return self._server

    def acquire_fused(self, call: FusedCall) -> Acquired:
        """The lock of ``call`` and, when it is taken, its message pushed: one round trip.
        StoreUnavailable as :meth:`acquire` (never sent, reply lost past the one re-send,
        reply late): then the lock and the message are both there or neither is."""
        for _attempt in range(2):
            keys, args = self._fused_command(call, self.deadline_ms())
            answer = _text(self._eval("FUSED", keys, args, call.key.task_name))
            if answer[0] != "L":
                return Acquired(acquired=answer[0] == "1", holder=answer[1:])
            self.learn_skew(int(answer[1:]))  # refused as late, answered in time: clock skew
        raise StoreUnavailable(self.alias, "the server refused the fused dispatch as late twice")

    def acquire_fused_many(self, calls: list[FusedCall]) -> list[Acquired]:
        """L3 fused: :meth:`acquire_fused` for every call of a batch, pipelined on one
        connection (one round trip; the scripts run one after the other, so a key twice in
        the batch is taken by its first call). A call refused as late is made again alone.
        StoreUnavailable when the batch's reply is lost past the one re-send or late: any
        call of the batch may have run (its ``answered`` holds the answers read before a
        late call's own re-send failed)."""
        if not calls:
            return []
        deadline = self.deadline_ms()
        batch = [self._fused_command(call, deadline) for call in calls]
        replies = self._send_many("FUSED", batch, calls[0].key.task_name)
        return self.acquired_answers(calls, replies, self.acquire_fused)

    def _fused_command(self, call: FusedCall,
                       deadline: int) -> tuple[list[str], tuple[Any, ...]]:
        """The keys and arguments of ``call``'s FUSED script (``fused_scripts.py``)."""
        physical, index = self.place(call.key)
        return [physical, index, call.queue, f"{physical}:pub"], (
            call.owner, _ms(call.ttl), deadline, call.key.task_name, call.key.ident,
            call.request, self.fused_database(), call.database, call.payload,
            self._tombstone_ms())

    def undo_fused(self, call: FusedCall) -> bool:
        """S7: take back what a failed fused dispatch did: its message off the queue if no
        worker has taken it yet, then its lock. True when the message was taken back (the
        dispatch left nothing); False when there was none (never pushed: nobody can have
        been deduplicated onto it) or a worker has it (the job runs, with its lock)."""
        physical, index = self.place(call.key)
        return bool(self._eval(
            "UNFUSE", [physical, index, call.queue, f"{physical}:undo"],
            (call.owner, call.request, self.fused_database(), call.database, call.payload,
             self._tombstone_ms()), call.key.task_name))
