"""S7, U3, U4, U6, W1, W5: one stateful property of the lock protocol on the real Redis store.

A Hypothesis state machine drives the real ``RedisStore`` (the "redis" cache alias) the way
dispatchers and workers do, with a model of the rest: the broker's queue (messages, each a
task id and whether the broker marked it redelivered), the bodies the workers run, and the
result backend (a dict). No Celery broker: that would be too slow for hundreds of examples.
Two keys are ``UniqueJob`` keys, one a ``UniqueUntilProcessingJob`` key. The rules:

- ``dispatch``: a new task id, ``store.acquire``; published if taken (or if the holder is its own
  id: a re-send of its own acquire), else deduplicated onto the holder (U1, U2);
- ``dispatch_lost_reply``: the acquire runs on the server (or past its deadline: refused) and
  the caller sees ``StoreUnavailable``: nothing published, the real ``undo_lock`` registered;
  ``store_answers_again`` runs the first pending undo (as ``jobs/rollback.py`` would) (S7, U6);
- ``start``: a worker takes a queued message through the admission of ``jobs/admission.py``:
  a redelivered copy of a finished run is dropped; START runs it (W1), skips it (REVOKED) or
  puts it off (W5, back to the queue); ``redeliver`` delivers a running message again, which
  must never run beside the first (W5);
- ``finish`` (RELEASE, result SUCCESS, U4), ``retry`` (reentrant ACQUIRE, the same id
  published again, U4), ``renew`` (the lease, U5), ``crash`` (the body stops, the lock stays,
  the message is redelivered) and ``lease_expires`` (the dead worker's lease runs out);
- ``lock_outlives_unique_for`` (a queued lock expires, U5) and ``flush`` (FLUSHDB);
- ``dispatch``, ``start`` and ``finish`` may send their decision twice (a lost reply and the
  client's re-send), with another client's dispatch in between: the second answer must equal
  the first (S7, U3).

Invariants, after every step:

- at most one body of a unique key runs at once while the store keeps its data (U3, W1, W5);
  after a FLUSHDB a key's check waits until the bodies that ran at the flush have finished;
- once every undo has run (the store answers), every lock's owner is queued or running, or
  is a crashed run's lease that expires by itself (U6, S7);
- once the store answers, every id a caller waits on (published, or deduplicated onto) is
  queued, running, or has a ready result (U2, S7); at the end, after the queue is drained,
  every such result is ready and no lock is left.

Examples are derandomized: CI runs the same 200 every time, so a red run is reproduced by
running this module again (set DEDUP_JOBS_PROPERTY_SEARCH=N to explore N random ones).

Two gaps it found are left out of the machine unless DEDUP_JOBS_PROPERTY_STRICT=1, each pinned
by an xfail(strict=True) test in tests/test_idempotent.py with its minimal example:
1. an until-processing START that found the lock gone (it changed nothing, answered "run"),
   re-sent after another dispatch took the key, answers "skip": accepted here, as acting on
   the re-send is the same as if only it had been sent
   (test_until_processing_start_resent_after_the_lock_was_lost);
2. the store losing a never-published id's lock (FLUSHDB, unique_for) before its undo runs:
   the undo removes nothing and marks nothing, so a dispatch deduplicated onto that id waits
   forever; here no flush or expiry hits a lock whose undo is pending
   (test_undo_of_a_lost_lock_still_revokes_its_id).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dedup_jobs import clock
from dedup_jobs.jobs import unique
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import Started

pytestmark = [pytest.mark.redis, pytest.mark.django_db]

#: (job key, released at start: a UniqueUntilProcessingJob)
KEYS = [
    (build_key("unique", "tests.property", "item=0"), False),
    (build_key("unique", "tests.property", "item=1"), False),
    (build_key("unique", "tests.property", "item=2"), True),
]
UNIQUE_FOR = 600.0
LEASE = 60.0
READY = ("SUCCESS", "REVOKED")
SEARCH = int(os.environ.get("DEDUP_JOBS_PROPERTY_SEARCH", "0"))
STRICT = os.environ.get("DEDUP_JOBS_PROPERTY_STRICT") == "1"
#: the until-processing START's answer when the lock was gone: run, nothing changed
FREE = Started(run=True, holder=None)

key_ids = st.integers(min_value=0, max_value=len(KEYS) - 1)
picks = st.integers(min_value=0, max_value=31)  # which queued message or running body
sends = st.sampled_from(["once", "twice", "twice, another dispatch between"])


@dataclass(frozen=True)
class Message:
    tid: str
    redelivered: bool = False  # the broker marked it (or it carries the mark on, W5)


@dataclass
class Body:
    tid: str
    key: int
    nonce: str
    survivor: bool = False  # it was running when the store lost its data


class ModelBackend:
    """The result backend: the undo's ``mark_as_revoked`` writes into the model."""

    def __init__(self, results: dict[str, str]) -> None:
        self.results = results

    def mark_as_revoked(self, task_id: str, reason: str = "", request: Any = None) -> None:
        self.results[task_id] = "REVOKED"


class ModelJob:
    ignore_result = False

    def __init__(self, results: dict[str, str]) -> None:
        self.backend = ModelBackend(results)


class LockProtocol(RuleBasedStateMachine):
    def __init__(self, store: Any, redis: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__()
        self.outer = sys.exc_info()[1]  # an exception being handled around the whole run
        redis.flushdb()
        self.store, self.redis = store, redis
        self.queue: list[Message] = []
        self.bodies: list[Body] = []
        self.results: dict[str, str] = {}
        self.key_of: dict[str, int] = {}
        self.awaited: set[str] = set()  # ids whose result a caller waits on
        self.dead: list[tuple[int, str, str]] = []  # crashed runs' leases: key, owner, nonce
        self.undos: list[tuple[str, Callable[[], bool]]] = []  # (never-published id, undo)
        self.job = ModelJob(self.results)
        self.serial = 0
        # undo_lock hands its undo to this machine, which runs it when the store answers again
        monkeypatch.setattr(unique, "rollbacks", self)

    # -- helpers ------------------------------------------------------------------------

    def add(
        self, what: str, call: Callable[[], bool], *, lifetime: float,
        give_up: Callable[[], None] | None = None,
    ) -> None:
        self.undos.append(("", call))

    def new_id(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}"

    def physical(self, key: int) -> str:
        return str(self.store.physical(KEYS[key][0].key))

    def lock(self, key: int) -> dict[str, str]:
        raw = self.redis.hgetall(self.physical(key))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def decide(self, key: int, how: str, call: Callable[[], Any]) -> Any:
        """Send a decision once, or twice (a lost reply and the re-send, S7), maybe with another
        client's dispatch of the same key in between: the answers must be equal."""
        first = call()
        if how == "once":
            return first
        if how.endswith("between"):
            self.dispatch_one(key)
        second = call()
        if not STRICT and first == FREE and not second.run:
            return second  # KNOWN GAP 1 (see the module docstring)
        assert second == first, f"a re-send answered {second!r}, the first {first!r} (S7)"
        return second

    def dispatch_one(self, key: int, how: str = "once") -> None:
        tid = self.new_id("t")
        self.key_of[tid] = key

        def acquire() -> tuple[bool, str]:
            answer = self.store.acquire(KEYS[key][0], tid, UNIQUE_FOR, now=clock.now())
            return answer.acquired or answer.holder == tid, answer.holder

        taken, holder = self.decide(key, how, acquire)
        if taken:
            self.queue.append(Message(tid))
            self.awaited.add(tid)
        else:
            self.awaited.add(holder)  # U2: the caller waits on the holder's result

    def take(self, message: Message) -> bool:
        """A worker takes ``message`` (jobs/admission.py); True when its body runs."""
        key, released_at_start = self.key_of[message.tid], KEYS[self.key_of[message.tid]][1]
        return self.take_as(message, key, released_at_start, "once")

    def take_as(self, message: Message, key: int, release: bool, how: str) -> bool:
        tid = message.tid
        if message.redelivered and self.results.get(tid) in READY:
            return False  # W5: a redelivered copy of a finished run is dropped
        nonce = self.new_id("n")
        started = self.decide(key, how, lambda: self.store.start(
            KEYS[key][0], tid, LEASE, now=clock.now(), release=release, delivery=nonce))
        if started.live:
            self.queue.append(message)  # W5: put off, published again with the same id
            return False
        if not started.run:
            self.results[tid] = "REVOKED"  # W3: skipped
            return False
        if not release:
            lock = self.lock(key)
            assert (lock.get("owner"), lock.get("state"), lock.get("run")) == (
                tid, "running", nonce), f"W1: {tid} runs without its lock: {lock}"
        # A copy that runs beside a run the flush left without its lock shares its owner token:
        # that run's release or retry acts on the copy's lock, so the flush's effects reach it.
        survivor = any(b.survivor and b.tid == tid for b in self.bodies)
        self.bodies.append(Body(tid, key, nonce, survivor))
        return True

    def end(self, pick: int) -> Body:
        return self.bodies.pop(pick % len(self.bodies))

    def release(self, body: Body, how: str = "once") -> None:
        if KEYS[body.key][1]:
            return  # until processing: released at start
        request = self.new_id("r")
        released = self.decide(body.key, how, lambda: self.store._call_with_tombstone(
            "RELEASE", KEYS[body.key][0], body.tid, request, self.store._tombstone_ms()))
        if not body.survivor:
            assert released == 1, f"U4: {body.tid} finished without releasing its lock"

    def expire(self, key: int) -> None:
        """The lock's TTL runs out (PEXPIRE 1 ms, then wait until Redis no longer has it)."""
        physical = self.physical(key)
        self.redis.pexpire(physical, 1)
        while self.redis.exists(physical):
            time.sleep(0.0005)

    def queued_ids(self) -> set[str]:
        return {m.tid for m in self.queue} | {b.tid for b in self.bodies}

    # -- dispatch -----------------------------------------------------------------------

    @rule(key=key_ids, how=sends)
    def dispatch(self, key: int, how: str) -> None:
        self.dispatch_one(key, how)

    @rule(key=key_ids, late=st.booleans())
    def dispatch_lost_reply(self, key: int, late: bool) -> None:
        """The caller gets StoreUnavailable: its acquire ran (the reply was lost) or ran past
        its deadline (refused); either way nothing is published and the undo is registered."""
        tid = self.new_id("t")
        self.key_of[tid] = key
        job_key = KEYS[key][0]
        if late:
            before = self.lock(key)
            deadline = int(clock.now() * 1000) - 1000
            answer = self.store._call("ACQUIRE", job_key, tid, int(UNIQUE_FOR * 1000),
                                      deadline, "0", job_key.task_name, job_key.ident)
            assert self.lock(key) == before, f"S7: a late acquire changed the lock ({answer!r})"
        else:
            self.store.acquire(job_key, tid, UNIQUE_FOR, now=clock.now())
        unique.undo_lock(self.job, self.store, job_key, tid, UNIQUE_FOR)  # type: ignore[arg-type]
        self.undos[-1] = (tid, self.undos[-1][1])

    @precondition(lambda self: self.undos)
    @rule()
    def store_answers_again(self) -> None:
        self.undos.pop(0)[1]()

    # -- workers ------------------------------------------------------------------------

    @precondition(lambda self: self.queue)
    @rule(pick=picks, how=sends)
    def start(self, pick: int, how: str) -> None:
        message = self.queue.pop(pick % len(self.queue))
        key = self.key_of[message.tid]
        self.take_as(message, key, KEYS[key][1], how)

    @precondition(lambda self: any(not KEYS[b.key][1] for b in self.bodies))
    @rule(pick=picks)
    def redeliver(self, pick: int) -> None:
        """W5: the broker delivers a running message again (visibility timeout, a consumer
        lost): the copy never runs while the first lives. (A UniqueUntilProcessingJob released
        its lock at start and cannot tell: a documented limit, left out.)"""
        running = [b for b in self.bodies if not KEYS[b.key][1]]
        body = running[pick % len(running)]
        ran = self.take(Message(body.tid, redelivered=True))
        assert body.survivor or not ran, f"W5: a copy of {body.tid} runs beside the first"

    @precondition(lambda self: self.bodies)
    @rule(pick=picks, how=sends)
    def finish(self, pick: int, how: str) -> None:
        body = self.end(pick)
        self.release(body, how)
        self.results[body.tid] = "SUCCESS"

    @precondition(lambda self: self.bodies)
    @rule(pick=picks)
    def retry(self, pick: int) -> None:
        """U4: the retry keeps (or re-takes) its lock and is published with the same id."""
        body = self.end(pick)
        answer = self.store.acquire(KEYS[body.key][0], body.tid, UNIQUE_FOR, now=clock.now(),
                                    reentrant=True)
        if not body.survivor and not KEYS[body.key][1]:
            assert answer.acquired, f"U4: the retry of {body.tid} lost its lock to {answer}"
        self.results[body.tid] = "RETRY"
        self.queue.append(Message(body.tid))

    @precondition(lambda self: self.bodies)
    @rule(pick=picks)
    def renew(self, pick: int) -> None:
        body = self.bodies[pick % len(self.bodies)]
        if KEYS[body.key][1]:
            return
        renewed = self.store.renew(KEYS[body.key][0], body.tid, LEASE, now=clock.now())
        assert renewed or body.survivor, f"U5: the lease of running {body.tid} was lost"

    @precondition(lambda self: self.bodies)
    @rule(pick=picks)
    def crash(self, pick: int) -> None:
        """The worker dies: the body stops, its lock stays until the lease runs out, and the
        broker delivers the message again (acks_late)."""
        body = self.end(pick)
        if not KEYS[body.key][1]:
            self.dead.append((body.key, body.tid, body.nonce))
        self.queue.append(Message(body.tid, redelivered=True))

    @precondition(lambda self: self.dead)
    @rule(pick=picks)
    def lease_expires(self, pick: int) -> None:
        self.lease_runs_out(*self.dead.pop(pick % len(self.dead)))

    def lease_runs_out(self, key: int, tid: str, nonce: str) -> None:
        lock = self.lock(key)
        if (lock.get("owner"), lock.get("state"), lock.get("run")) == (tid, "running", nonce):
            self.expire(key)  # else a flush took it, and maybe another owner holds the key

    # -- the store ----------------------------------------------------------------------

    @rule(key=key_ids)
    def lock_outlives_unique_for(self, key: int) -> None:
        """U5: a lock whose message has not started yet expires after unique_for."""
        lock = self.lock(key)
        if lock.get("state") != "queued":
            return
        if not STRICT and any(lock.get("owner") == tid for tid, _undo in self.undos):
            return  # KNOWN GAP 2: the undo's lock outlives the undo (rollback.py gave up)
        self.expire(key)

    @precondition(lambda self: STRICT or not self.undos)  # KNOWN GAP 2
    @rule()
    def flush(self) -> None:
        self.redis.flushdb()
        for body in self.bodies:
            body.survivor = True
        self.dead.clear()

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def one_body_per_key(self) -> None:
        for key, (job_key, released_at_start) in enumerate(KEYS):
            here = [b for b in self.bodies if b.key == key]
            if released_at_start or any(b.survivor for b in here):
                continue
            assert len(here) <= 1, f"two bodies of {job_key.key} at once: {here}"

    @invariant()
    def no_lock_with_nothing_queued(self) -> None:
        if self.undos:
            return  # the store has not answered yet
        queued = self.queued_ids()
        for key in range(len(KEYS)):
            lock = self.lock(key)
            owner = lock.get("owner")
            if owner is None or owner in queued:
                continue
            assert (key, owner, lock.get("run")) in self.dead, (
                f"U6: a lock of {owner} with nothing queued: {lock}")

    @invariant()
    def every_awaited_result_comes(self) -> None:
        if self.undos:
            return
        queued = self.queued_ids()
        for tid in self.awaited:
            assert tid in queued or self.results.get(tid) in READY, (
                f"S7: a caller waits on {tid}, which nobody will ever run or mark "
                f"(result {self.results.get(tid)!r})")

    def teardown(self) -> None:
        """Drain: the store answers, dead leases run out, every body and message ends."""
        if sys.exc_info()[1] is not self.outer:
            return  # a step failed: report that, not what draining the broken state says
        while self.undos:
            self.store_answers_again()
        while self.dead:
            self.lease_runs_out(*self.dead.pop())
        for body in list(self.bodies):
            self.bodies.remove(body)
            self.release(body)
            self.results[body.tid] = "SUCCESS"
        for _round in range(1000):
            if not self.queue:
                break
            if self.take(self.queue.pop(0)):
                body = self.bodies.pop()
                self.release(body)
                self.results[body.tid] = "SUCCESS"
        assert not self.queue, f"the queue never drains: {self.queue}"
        waiting = {t: self.results.get(t) for t in self.awaited if self.results.get(t) not in READY}
        assert not waiting, f"results never ready: {waiting}"
        left = {k: self.lock(k) for k in range(len(KEYS)) if self.lock(k)}
        assert not left, f"locks left after every message ended: {left}"


PROPERTY = settings(
    max_examples=SEARCH or 200,
    stateful_step_count=30,
    deadline=None,
    derandomize=not SEARCH,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=False,
    # no explain phase: on Python < 3.12 it traces every line of a failing example again
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


def test_lock_protocol(redis_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """S7, U3, U4, U6, W1, W5: dispatch, start, finish, retry, crash, redelivery, lost replies,
    re-sends and flushes in any order: never two bodies of one key at once while the store
    keeps its data; never a lock with nothing queued once the store answers; every result
    a caller waits on becomes ready."""
    store = get_store("redis")
    run_state_machine_as_test(lambda: LockProtocol(store, redis_client, monkeypatch),
                              settings=PROPERTY)

