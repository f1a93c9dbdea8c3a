"""The fused dispatch (issue 26) in the fates property test (tests/test_fates_property.py), on
the stores that run it (the Redis store of one server): a dispatch of the U key whose lock and
message are one script, ``store.acquire_fused``, under the five fates of its call. Its
messages are in a real Redis list, the broker's queue (another database of the store's
server), until ``broker_delivers`` hands one to the model's worker; ``queued()`` counts them.
A failed fused dispatch hands the real undo (``jobs/undo.py`` ``undo_fused``) to the model's
rollback stand-in; its id counts as undone only when the undo took its message back (a worker
that has the message runs it)."""

from __future__ import annotations

from typing import Any

import redis
from hypothesis.stateful import precondition, rule

from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.jobs import undo
from dedup_jobs.stores.redis.fused import FusedCall
from tests.fates_model import UNIQUE_FOR, fates


class FusedRules:
    """Rules of the fused dispatch, mixed into the state machine."""

    store: Any
    keys: dict[str, Any]
    queue: list[tuple[str, str]]
    undos: list[Any]
    failed: set[str]
    undone: set[str]
    awaited: set[str]
    fates: Any
    new_id: Any
    onto: Any

    def setup_fused(self, run: str) -> None:
        database = getattr(self.store, "fused_database", None)
        self.fused_db = database() if database is not None else None
        self.can_fuse = self.fused_db is not None
        self.fused_queue = f"fates:{run}:queue"
        if self.can_fuse:
            kwargs = self.store.client.connection_pool.connection_kwargs
            self.broker_db = 14 if self.fused_db != 14 else 15  # a database no test flushes
            self.broker = redis.Redis(host=kwargs.get("host"), port=kwargs.get("port"),
                                      db=self.broker_db, decode_responses=True)

    def fused_queued(self) -> set[str]:
        """The fused messages the broker holds (not yet delivered)."""
        if not self.can_fuse:
            return set()
        return set(self.broker.lrange(self.fused_queue, 0, -1))

    @precondition(lambda self: self.can_fuse)
    @rule(fate=fates)
    def dispatch_fused(self, fate: str) -> None:
        """U1/U2 and S7 on the fused path: the lock and the message in one call."""
        tid, store = self.new_id("g"), self.store
        call = FusedCall(key=self.keys["U"], owner=tid, ttl=UNIQUE_FOR, request=tid,
                         queue=self.fused_queue, database=self.broker_db, payload=tid)
        try:
            answer = self.fates.call(fate, f"FUSED U {tid}", lambda: store.acquire_fused(call),
                                     tid)
        except StoreUnavailable:
            self.failed.add(tid)
            undo.undo_fused(self, store, call, revoke=True)
            _what, taken_back = self.undos[-1]

            def counted() -> bool:
                removed = bool(taken_back())
                if removed:
                    self.undone.add(tid)
                return removed

            self.undos[-1] = (f"fused {tid}", counted)
            return
        if answer.acquired or answer.holder == tid:
            self.awaited.add(tid)  # its message is on the broker's queue
            return
        self.onto(answer.holder, tid, "deduplicated")
        self.awaited.add(answer.holder)

    @precondition(lambda self: self.can_fuse and self.broker.llen(self.fused_queue))
    @rule()
    def broker_delivers(self) -> None:
        """The broker hands the oldest fused message to a worker."""
        self.deliver_fused(1)

    def deliver_fused(self, most: int | None = None) -> None:
        while self.can_fuse and (most is None or most > 0):
            tid = self.broker.rpop(self.fused_queue)
            if tid is None:
                return
            self.queue.append((str(tid), "U"))
            most = None if most is None else most - 1

    def drop_fused_queue(self) -> None:
        if self.can_fuse:
            self.broker.delete(self.fused_queue)
            self.broker.close()
