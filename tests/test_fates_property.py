"""S7, W4, W7, R1, R2, T2, D4: every store call of every decision under its three fates.

One Hypothesis state machine, run on every store (django-redis, Django's RedisCache,
django-valkey, a Redis 7 and a Valkey 8 cluster, the database store on SQLite, PostgreSQL and
MariaDB, memcached, locmem), each for the kinds it supports (take_over, start_exclusive and
throttling asked of the store itself). Each store call takes a fate, injected at the client
(tests/fates_model.py): ok, resent (reply lost, the client's re-send answers), never sent,
executed with its reply lost, or executed late (it lands at a later step, past its caller's
deadline). Kinds: U a UniqueJob (dispatched by acquire; a generated or an explicit task id), R
one with ``on_duplicate="replace"`` (take_over), P a UniqueUntilProcessingJob, X one with
``without_overlapping`` (start_exclusive; some of its dispatches made as L2's
``on_duplicate="cancel_running"`` makes them, cancel_take, whose request to stop the running
copy its renewals read), T a ThrottledJob with ``concurrency=2``, D a DebouncedJob (debounce,
claim_due), and on the Redis store of one server the fused dispatch of the U key
(acquire_fused: the lock and the message in one script, its messages in a real Redis list
until the broker delivers them; and acquire_fused_many, a batch of them in one call, L3;
tests/fates_fused.py).

The front-end is modelled as the code does it: a dispatch that raised StoreUnavailable hands
its undo to engine/rollback.py (the real ``unique.undo_lock``, matching owner and request id,
and ``bursts.undo``, whose hand-over publishes the latest absorbed dispatch as the burst's
claimed message, its run answering the others); a message whose lock was taken over by a
dispatch not confirmed yet waits (engine/takeover.py) until REVOKED or given its lock back. At
the worker, a unique kind whose check failed runs (W4) and its lease thread re-sends the same
call (same owner and nonce) until the store answers, then renews or releases what it was
granted; a limit admission that failed defers (W7, engine/store_errors.py): the
without_overlapping copy re-sends the same check (its nonce in the header), the throttle copy
asks again; a release whose reply was lost is re-sent. On a store that can wake, the T
release is the waking one (throttle_release_waking): a waiter it names must be a T message
waiting for its turn, and its turn moves to now (the wake reaching its worker).
``store_answers_again`` is the store coming back: every undo and re-send runs.

Invariants after every step: never two bodies of one U or X key at once, never more than 2 of
the T key; once the store answers, every lock and marker belongs to a queued or running
message (or runs out within LEASE_SECONDS), every burst's message is queued or running, no
slot is held for a run that is not running, and what a running body was granted is still its
own; a late call never leaves anything for a run that has ended; no dispatch is deduplicated,
absorbed or skipped onto an id whose dispatch failed and was undone, nor onto an id that never
runs. At the end every message has run and every result a caller waits on is ready, and the
store holds nothing. (D7's state loss is not injected here: tests/test_protocol_property.py.)

``uv run pytest tests/test_fates_property.py`` runs FATES_EXAMPLES (200) derandomized examples
per store (the slower stores under ``-m matrix``), every fate on every store (a store listed
in ``fates_model.OPEN`` is dealt only the fates listed there: none is, since the database
store holds all five); DEDUP_JOBS_FATES=ok,lost deals only those; DEDUP_JOBS_FATES_SEARCH=N
explores N random examples instead. Each run prints examples and fates per store and its time.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator
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
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.jobs import bursts, undo, unique
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import BaseStore, encode_call, running_key
from dedup_jobs.stores.database import statements
from tests.cluster.conftest import redis_cluster, use_cluster, valkey_cluster  # noqa: F401
from tests.conftest import ALL_STORE_PARAMS, _use_store
from tests.fates_fused import FusedRules
from tests.fates_model import (
    DEALT,
    DEBOUNCE_FOR,
    EXAMPLES,
    LEASE,
    READY,
    SEARCH,
    SLACK,
    SLOT_LEASE,
    SLOTS,
    STATE_GRACE,
    UNIQUE_FOR,
    WAITED,
    Body,
    Fates,
    Resend,
    fates,
    picks,
    supports,
)
from tests.fates_worker import WorkerRules


class StoreFates(FusedRules, WorkerRules, RuleBasedStateMachine):
    """Also the stand-in for rollback.py's queue (``add``), for the job an undo revokes through
    (``backend.mark_as_revoked``) and for the DebouncedJob whose ``_drop_burst`` it runs."""

    ignore_result = False
    name = "tests.fates"

    def __init__(self, store: BaseStore, store_name: str, monkeypatch: pytest.MonkeyPatch):
        super().__init__()
        self.outer = sys.exc_info()[1]
        self.store, self.fates = store, Fates(store, store_name)
        run = uuid.uuid4().hex[:10]
        self.keys = {kind: build_key("unique", "tests.fates", f"{run}-{kind}")
                     for kind in ("U", "R", "P", "X")}
        self.tkey = build_key("throttle", "tests.fates", f"{run}-T")
        self.dkey = build_key("debounce", "tests.fates", f"{run}-D")
        self.can_replace = supports(store, "take_over")
        self.can_cancel = supports(store, "cancel_take")
        self.can_exclude = supports(store, "start_exclusive")
        self.can_throttle = store.can_throttle
        self.queue: list[tuple[str, str]] = []  # (task id, kind)
        self.bodies: list[Body] = []
        self.results: dict[str, str] = {}
        self.awaited: set[str] = set()
        self.absorbed_by: dict[str, str] = {}  # a debounce dispatch -> its burst's message
        self.claimed: dict[str, list[str]] = {}  # a handed-over burst message -> its ids
        self.nonces: dict[str, str] = {}  # W7: a deferred X copy's check nonce (header)
        self.waited: dict[str, float] = {}  # R1/S7: seconds waited for a take-over
        self.name = "tests.fates"
        self.ignore_result = False
        self.failed: set[str] = set()  # dispatches that raised StoreUnavailable
        self.undone: set[str] = set()  # ... whose undo has run
        self.undos: list[tuple[str, Callable[[], Any]]] = []
        self.resends: list[Resend] = []
        self.turns: dict[str, float] = {}  # a deferred T message's turn (the store's clock)
        self.backend = self
        self.serial = 0
        for module in (unique, undo):  # undo_lock and the release hand undos here
            monkeypatch.setattr(module, "rollbacks", self)
        self.setup_fused(run)

    # -- stand-ins -----------------------------------------------------------------------

    def add(self, what: str, call: Callable[[], Any], *, store: object, lifetime: float,
            give_up: Callable[[], None] | None = None) -> None:
        self.undos.append((what, call))

    def encode_result(self, result: Any, state: str) -> Any:
        return result

    def store_result(self, task_id: str, result: Any, state: str, traceback: Any = None,
                     **_extra: Any) -> None:
        self.results[task_id] = state

    def get_task_meta(self, task_id: str) -> dict[str, Any]:
        return {"status": self.results.get(task_id, "PENDING"), "result": None}

    def mark_as_revoked(self, task_id: str, reason: str = "", request: Any = None) -> None:
        self.results[task_id] = "REVOKED"

    def new_id(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}"

    def queued(self) -> set[str]:
        return {tid for tid, _kind in self.queue} | self.fused_queued()

    def running(self) -> set[str]:
        return {b.tid for b in self.bodies}

    def will_run(self, tid: str) -> bool:
        return tid in self.queued() or tid in self.running() or self.results.get(tid) in READY

    def settled(self) -> bool:
        """The store answers: no undo and no re-send is waiting for it."""
        return not self.undos and not self.resends

    def onto(self, holder: str, tid: str, how: str) -> None:
        """S7/U2/D4: ``tid`` was deduplicated/absorbed/skipped onto ``holder``."""
        assert holder not in self.undone, (
            f"S7: {tid} {how} onto {holder}, whose dispatch raised StoreUnavailable and "
            f"whose undo already ran")
        assert holder in self.failed or self.will_run(holder), (
            f"S7: {tid} {how} onto {holder}, which is not queued, not running and has no "
            f"result (it never runs)")

    # -- dispatch ------------------------------------------------------------------------

    @rule(kind=st.sampled_from(["U", "R", "P", "X"]), explicit=st.booleans(), fate=fates,
          cancel=st.booleans())
    def dispatch(self, kind: str, explicit: bool, fate: str, cancel: bool) -> None:
        """U1/U2/R1/L2 and S7: acquire (or, the replace job R, take_over; an X dispatch with
        ``cancel``, cancel_take) with a generated or an explicit id."""
        kind = "P" if kind == "X" and not self.can_exclude else kind
        kind = "U" if kind == "R" and not self.can_replace else kind
        cancel = cancel and kind == "X" and self.can_cancel
        replace = kind == "R" or cancel
        key, tid, now = self.keys[kind], self.new_id("e" if explicit else "g"), clock.now()
        store = self.store
        # jobs/unique.py: a generated id is its own request id; an explicit one gets a new one
        request = self.new_id("r") if explicit else tid
        if cancel:
            def call() -> Any:
                return store.cancel_take(key, running_key(key), tid, UNIQUE_FOR, now=now,
                                         request=request)
        elif replace:
            def call() -> Any:
                return store.take_over(key, tid, UNIQUE_FOR, now=now, request=request)
        else:
            def call() -> Any:
                return store.acquire(key, tid, UNIQUE_FOR, now=now, request=request)
        what = f"{'CANCEL_TAKE' if cancel else 'TAKE_OVER' if replace else 'ACQUIRE'} {kind} {tid}"
        try:
            answer = self.fates.call(fate, what, call, tid)
        except StoreUnavailable:
            self.failed.add(tid)
            unique.undo_lock(self, store, key, tid, UNIQUE_FOR,  # type: ignore[arg-type]
                             request=request, generated=not explicit, cancel=cancel)
            self.undos[-1] = (tid, self.undos[-1][1])
            return
        # jobs/unique.py: a generated id that is already the holder is its own re-sent acquire
        if answer.acquired or (not explicit and answer.holder == tid):
            if answer.replaced:  # R1: the queued holder's message is revoked and never runs
                self.queue = [m for m in self.queue if m[0] != answer.replaced]
                self.results[answer.replaced] = "REVOKED"
            self.queue.append((tid, kind))
            self.awaited.add(tid)
            return
        self.onto(answer.holder, tid, "deduplicated")
        self.awaited.add(answer.holder)

    @precondition(lambda self: self.can_throttle)
    @rule()
    def dispatch_throttled(self) -> None:
        """T4: a throttle-only job touches the store only at admission."""
        tid = self.new_id("g")
        self.queue.append((tid, "T"))
        self.awaited.add(tid)

    @rule(fate=fates)
    def debounce(self, fate: str) -> None:
        """D1/D4 and S7: one debounce dispatch; a failed one's burst is dropped by its undo."""
        tid, now, store, key = self.new_id("d"), clock.now(), self.store, self.dkey

        def call() -> Any:
            return store.debounce(key, tid, encode_call((tid,), {}), now=now,
                                  debounce_for=DEBOUNCE_FOR, max_wait=None, ttl=STATE_GRACE)
        try:
            answer = self.fates.call(fate, f"DEBOUNCE {tid}", call, tid)
        except StoreUnavailable:
            self.failed.add(tid)
            self.undos.append((tid, lambda: bursts.undo(
                self, store, key, tid, self.hand_over)))  # type: ignore[arg-type]
            return
        self.awaited.add(tid)
        if answer.new:
            self.queue.append((tid, "D"))
            return
        self.onto(answer.message_id, tid, "absorbed")
        self.absorbed_by[tid] = answer.message_id

    def hand_over(self, winner: str, due: Any, others: list[str]) -> None:
        """jobs/debounced.py ``_undo``: the failed dispatch's burst had absorbed others; its
        latest one is published as the burst's message, claimed already; its run answers
        the others (``_run_burst``)."""
        self.queue.append((winner, "C"))
        self.claimed[winner] = [winner, *others]
        for tid in (winner, *others):
            self.absorbed_by[tid] = winner

    # -- the store -----------------------------------------------------------------------

    @precondition(lambda self: self.fates.late)
    @rule(pick=picks)
    def late_call_lands(self, pick: int) -> None:
        """A late call reaches the store after its caller gave up (S7: a dispatch script
        with a deadline changes nothing)."""
        late, answer = self.fates.land(pick % len(self.fates.late))
        # the fused script refuses past the deadline (or finds the holder): it never pushes
        # (a fused batch's answers are a list, one per call)
        answers = answer if isinstance(answer, list) else [answer]
        assert not late.what.startswith("FUSED") or isinstance(answer, StoreUnavailable) or (
            not any(a.acquired for a in answers)), (
            f"S7: the late {late.what} took the lock and pushed its message")
        owners = late.what.split()[2:] if late.what.startswith("FUSED_MANY") else [late.owner]
        for owner in owners:
            self.left_nothing(late, owner, answer)

    def left_nothing(self, late: Any, owner: str, answer: Any) -> None:
        """S7/W4: what the late call of ``owner`` left, once its caller gave up."""
        if (owner in self.running() or (owner in self.failed and owner not in self.undone)
                or any(r.owner == owner for r in self.resends)):
            return  # its run still renews what it holds; its undo or re-send is to come
        for name, info in self.entries():
            # a queued message's lock is its own; so is the running marker a lost check took
            # for a deferred copy that carries that check's nonce (W7: its re-send answers
            # "run" with it, the marker runs out with its lease if the copy never comes)
            if info is not None and info.owner == owner and not (
                    owner in self.queued() and (name != "X:run" or owner in self.nonces)):
                raise AssertionError(
                    f"S7/W4: the late {late.what} landed after its caller gave up and left "
                    f"{name} held by {owner}, which is not running ({answer!r})")
        state = self.store.get_debounce(self.dkey)
        assert state is None or state.message_id != owner or owner in self.queued(), (
            f"S7: the late {late.what} started a burst whose message is never published")

    @precondition(lambda self: not self.settled())
    @rule()
    def store_answers_again(self) -> None:
        """The store answers: every undo (rollback.py) and every re-send (W4) runs."""
        self.run_undos()
        while self.resends:
            resend = self.resends.pop(0)
            resend.apply(resend.call())

    def run_undos(self) -> None:
        while self.undos:
            tid, undo = self.undos.pop(0)
            undo()
            self.undone.add(tid)

    def entries(self) -> Iterator[tuple[str, Any]]:
        for kind, key in self.keys.items():
            yield kind, self.store.get(key)
        if self.can_exclude:
            yield "X:run", self.store.get(running_key(self.keys["X"]))

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def limits_hold(self) -> None:
        """U3/W1, R2, T2: never two runs of a U or X key at once, never more than SLOTS of T."""
        for kind, most in (("U", 1), ("R", 1), ("X", 1), ("T", SLOTS)):
            here = [b.tid for b in self.bodies if b.kind == kind]
            assert len(here) <= most, f"{len(here)} runs of the {kind} key at once: {here}"

    @invariant()
    def nothing_outlives_its_run(self) -> None:
        """S7/U6/W4: once the store answers, a lock or marker belongs to a queued or running
        message, or runs out within LEASE_SECONDS; a burst's message is queued or running;
        a running body's grant is its own."""
        if not self.settled():
            return
        queued, running = self.queued(), self.running()
        for name, info in self.entries():
            if info is None:
                continue
            mine = running if name == "X:run" else queued | running
            if info.owner in mine:
                continue
            left = None if info.expires_at is None else info.expires_at - clock.now()
            assert left is not None and left <= LEASE + SLACK, (
                f"S7/W4: {name} held by {info.owner} ({info.state}), which is neither queued "
                f"nor running, for {left} s more")
        for body in self.bodies:
            if body.holds and body.kind in ("U", "R", "X"):
                key = running_key(self.keys["X"]) if body.kind == "X" else self.keys[body.kind]
                info = self.store.get(key)
                assert info is not None and info.owner == body.tid, (
                    f"W1/W4: running {body.tid} does not hold its {body.kind} grant: {info}")
        state = self.store.get_debounce(self.dkey)
        assert state is None or state.message_id in queued | running, (
            f"S7/D4: a burst whose message {state and state.message_id} is never run "
            f"(absorbed {state and state.count})")

    @invariant()
    def every_awaited_result_comes(self) -> None:
        if not self.settled():
            return
        for tid in self.awaited:
            message = self.absorbed_by.get(tid, tid)
            assert (self.results.get(tid) in READY or self.will_run(message)), (
                f"S7/D4: a caller waits on {tid} (via {message}), which nobody will run or mark")

    def teardown(self) -> None:
        """Every late call lands, the store answers, every message and body ends."""
        if sys.exc_info()[1] is not self.outer:
            self.drop_fused_queue()
            return
        while self.fates.late:
            self.late_call_lands(0)
        self.store_answers_again()
        for _round in range(200):
            while self.bodies:
                self.finish(0, "ok")
            self.store_answers_again()
            self.deliver_fused()
            if not self.queue:
                break
            self.wait_for_turn(self.queue[0][0])
            self.start(0, "ok")
        assert not self.queue, f"the queue never drains: {self.queue}"
        self.drop_fused_queue()
        waiting = {t: self.results.get(t) for t in self.awaited
                   if self.results.get(t) not in READY}
        assert not waiting, f"S7/D4: results never ready: {waiting}"
        left = {name: info for name, info in self.entries() if info is not None}
        assert not left, f"left after every message ended: {left}"
        assert self.store.get_debounce(self.dkey) is None, "a burst left after every run"
        if self.can_throttle:  # every slot is free again: SLOTS probes are all admitted
            probes = [self.store.throttle_admit(
                self.tkey, f"probe{i}", delivery=f"probe{i}", concurrency=SLOTS, rate_limit=0,
                rate_period=1.0, lease=SLOT_LEASE).admitted for i in range(SLOTS)]
            for i in range(SLOTS):
                self.store.throttle_release(self.tkey, f"probe{i}")
            assert all(probes), f"T2/T4: a concurrency slot left after every run: {probes}"


#: every store, each for the kinds it supports: the store-facing suites' list
#: (tests/conftest.py ALL_STORE_PARAMS, so a store added there is dealt every fate here too),
#: the database store's row-locking path on SQLite, and both clusters. The database store
#: (about 0.8 s an example on SQLite and PostgreSQL, against 0.1 s on Redis) and the clusters
#: are the slow matrix (`uv run pytest -m matrix`, a CI step of its own), so this module's
#: share of the README's command stays near 90 s.
PARAMS = [
    *(pytest.param(*p.values, marks=[*p.marks, pytest.mark.matrix], id=p.id)
      if str(p.id).startswith("database") else p for p in ALL_STORE_PARAMS),
    # the row-locking path on SQLite too (portable.py; one writer at a time there)
    pytest.param("database", marks=pytest.mark.matrix, id="database-sqlite-portable"),
    pytest.param("cluster-redis", marks=pytest.mark.matrix, id="redis-cluster"),
    pytest.param("cluster-valkey", marks=pytest.mark.matrix, id="valkey-cluster"),
]


@pytest.fixture(params=PARAMS)
def store_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """The store under test, made DEDUP_JOBS["STORE"] (clusters: tests/cluster/conftest.py)."""
    name: str = request.param
    if name.startswith("cluster-"):
        found = request.getfixturevalue(f"{name.removeprefix('cluster-')}_cluster")
        found.flush()
        with use_cluster(found):
            yield "cluster"
        return
    yield from _use_store(request)


PROPERTY = settings(
    max_examples=SEARCH or EXAMPLES,
    stateful_step_count=25,
    deadline=None,
    derandomize=not SEARCH,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=False,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


@pytest.mark.timeout(1200)  # passing takes seconds per store; shrinking a failure, minutes
def test_every_store_call_under_every_fate(
    store_name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
    record_property: Any,
) -> None:
    """S7, W4, W7, R1, R2, T2, D4: every decision's store calls never sent, executed with the
    reply lost, or executed late, in any order, on this store: no limit exceeded, nothing left
    for a run that is not running once the store answers, no dispatch onto an id that never
    runs, every result ready."""
    label = request.node.callspec.id
    if label.endswith("-portable"):
        monkeypatch.setattr(statements, "dialect", lambda connection: None)
    store = get_store("database" if store_name.startswith("database") else store_name)
    made: list[int] = []

    def machine() -> StoreFates:
        made.append(1)
        return StoreFates(store, label, monkeypatch)

    DEALT.pop(label, None)
    WAITED[0] = 0.0
    started = time.perf_counter()
    try:
        run_state_machine_as_test(machine, settings=PROPERTY)
    finally:
        seconds = time.perf_counter() - started
        dealt = dict(sorted(DEALT.get(label, {}).items()))
        line = (f"fates[{label}]: {len(made)} examples, calls by fate {dealt}, {seconds:.1f} s "
                f"({WAITED[0]:.1f} s of it waiting for throttle turns)")
        print(line)
        record_property("fates", line)
