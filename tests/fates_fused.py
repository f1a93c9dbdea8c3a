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
from hypothesis import strategies as st
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
        call = self._fused_call()
        try:
            answer = self.fates.call(fate, f"FUSED U {call.owner}",
                                     lambda: self.store.acquire_fused(call), call.owner)
        except StoreUnavailable:
            self._fused_failed(call)
            return
        self._fused_answered(call, answer)

    @precondition(lambda self: self.can_fuse)
    @rule(fate=fates, size=st.integers(2, 3))
    def dispatch_fused_many(self, fate: str, size: int) -> None:
        """L3 on the fused path (``jobs/fused_many.py``): a batch of the U key's dispatches,
        every lock and message in one call; a later call of the batch is the first's
        duplicate. A failed batch undoes each of its calls, as the front-end does."""
        calls = [self._fused_call() for _ in range(size)]
        try:
            answers = self.fates.call(
                fate, "FUSED_MANY U " + " ".join(c.owner for c in calls),
                lambda: self.store.acquire_fused_many(calls), calls[0].owner)
        except StoreUnavailable:
            for call in calls:
                self._fused_failed(call)
            return
        assert len(answers) == size
        for call, answer in zip(calls, answers, strict=True):
            self._fused_answered(call, answer)

    def _fused_call(self) -> FusedCall:
        tid = self.new_id("g")
        return FusedCall(key=self.keys["U"], owner=tid, ttl=UNIQUE_FOR, request=tid,
                         queue=self.fused_queue, database=self.broker_db, payload=tid)

    def _fused_failed(self, call: FusedCall) -> None:
        """StoreUnavailable: the real undo handed to the model's rollback stand-in."""
        tid = call.owner
        self.failed.add(tid)
        undo.undo_fused(self, self.store, call, revoke=True)
        _what, taken_back = self.undos[-1]

        def counted() -> bool:
            removed = bool(taken_back())
            if removed:
                self.undone.add(tid)
            return removed

        self.undos[-1] = (f"fused {tid}", counted)

    def _fused_answered(self, call: FusedCall, answer: Any) -> None:
        tid = call.owner
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
