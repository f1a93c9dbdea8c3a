"""The worker rules of tests/test_fates_property.py's state machine: the check of each kind
(START, START_EXCLUSIVE, THROTTLE_ADMIT, CLAIM), the lease's renewals and the release, with
what the front-end does when a call fails (SPEC W4: run and re-send; W7: defer and re-send)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hypothesis.stateful import precondition, rule

from dedup_jobs import clock
from dedup_jobs.engine import takeover
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores.base import ADOPTED, CLAIMED, WAIT, running_key
from dedup_jobs.stores.throttling import WAKE_AFTER
from tests.fates_model import (
    DEBOUNCE_FOR,
    LEASE,
    SLOT_LEASE,
    SLOTS,
    WAITED,
    Body,
    Resend,
    fates,
    picks,
)


class WorkerRules:
    """Mixed into StoreFates (its state: store, fates, keys, queue, bodies, results, resends,
    turns)."""

    store: Any
    fates: Any
    keys: dict[str, Any]
    tkey: Any
    dkey: Any
    queue: list[tuple[str, str]]
    bodies: list[Body]
    results: dict[str, str]
    failed: set[str]
    resends: list[Resend]
    turns: dict[str, float]
    new_id: Callable[[str], str]
    run_undos: Callable[[], None]
    claimed: dict[str, list[str]]
    nonces: dict[str, str]
    waited: dict[str, float]
    onto: Callable[[str, str, str], None]
    undone: set[str]
    will_run: Callable[[str], bool]

    def check_call(self, tid: str, kind: str, nonce: str) -> tuple[str, Callable[[], Any]]:
        store, now = self.store, clock.now()
        if kind in ("U", "R", "P"):
            return f"START {kind} {tid}", lambda: store.start(
                self.keys[kind], tid, LEASE, now=now, release=kind == "P", delivery=nonce)
        if kind == "X":
            key = self.keys["X"]
            return f"START_EXCLUSIVE {tid}", lambda: store.start_exclusive(
                key, running_key(key), tid, LEASE, now=now, delivery=nonce)
        if kind == "T":
            return f"THROTTLE_ADMIT {tid}", lambda: store.throttle_admit(
                self.tkey, tid, delivery=nonce, concurrency=SLOTS, rate_limit=0,
                rate_period=1.0, lease=SLOT_LEASE)
        return f"CLAIM {tid}", lambda: store.claim_due(
            self.dkey, tid, now=now + 10 * DEBOUNCE_FOR)

    def release_call(self, body: Body) -> Callable[[], Any]:
        store, tid = self.store, body.tid
        if body.kind in ("U", "R"):
            return lambda: store.release(self.keys[body.kind], tid)
        if body.kind == "X":
            return lambda: store.release(running_key(self.keys["X"]), tid)
        if getattr(store, "can_wake", False):  # T2: the release may call a waiter (wake)
            return lambda: store.throttle_release_waking(self.tkey, tid, WAKE_AFTER)
        return lambda: store.throttle_release(self.tkey, tid)

    def woken(self, answer: Any) -> None:
        """T2, the wake: a release that named a waiter calls a T message that is waiting for
        its turn (never one running, ended or unknown); its worker runs it now (the turn
        moved to now; admission still decides)."""
        wake = getattr(answer, "wake", None)
        if not wake:
            return
        assert (wake, "T") in self.queue, (
            f"T2: a release woke {wake}, which is not a T message waiting for its turn")
        self.turns[wake] = time.time()

    @precondition(lambda self: self.queue)
    @rule(pick=picks, fate=fates)
    def start(self, pick: int, fate: str) -> None:
        """W1/W3/W5, R2, T2, D1: the worker's check of a message, as the kind decides."""
        tid, kind = self.queue.pop(pick % len(self.queue))
        if kind == "C":  # a handed-over burst's message, claimed already: it runs (D4)
            self.bodies.append(Body(tid, "D", "", holds=False, ids=self.claimed.pop(tid)))
            return
        if self.waited.get(tid) and self.undos:
            # R1/S7: a copy waiting for a take-over comes back a third of the lease later,
            # the store answering: the rollback thread has run the undos meanwhile
            self.run_undos()
        # W7: a copy deferred for the store re-sends its check with the same nonce (header)
        nonce = self.nonces.pop(tid, None) or self.new_id("n")
        what, call = self.check_call(tid, kind, nonce)
        try:
            answer = self.fates.call(fate, what, call, tid)
        except StoreUnavailable:
            self.check_failed(tid, kind, nonce, what, call)
            return
        self.checked(tid, kind, nonce, answer)

    def check_failed(self, tid: str, kind: str, nonce: str, what: str,
                     call: Callable[[], Any]) -> None:
        if kind == "D":  # the debounce check is tried again later (its claim record, S7)
            self.queue.append((tid, kind))
            return
        if kind in ("U", "P"):  # W4: when in doubt, run; the lease thread re-sends the check
            body = Body(tid, kind, nonce, holds=False, ids=[tid])
            self.bodies.append(body)
            self.resends.append(Resend(what, tid, call, lambda a: self.reconciled(body, a)))
            return
        # W7: a limit admission that failed defers (store_errors.defer_for_store), and so does
        # a replace job's check (R1: its take-over may find the store thinking it queued): the
        # same task id is published again; the exclusive and the replace check's copy carries
        # its nonce (jobs/admission.py check_lock), the throttle check's asks again
        self.queue.append((tid, kind))
        if kind in ("X", "R"):
            self.nonces[tid] = nonce

    def reconciled(self, body: Body, answer: Any) -> None:
        """W4: the re-sent check answered: renew what was granted while the run lives,
        release it once the run has ended (or, W7, never started)."""
        granted = answer.admitted if body.kind == "T" else (
            answer.run and body.kind != "P")
        if not granted:
            return
        if body in self.bodies:
            body.holds = True
            return
        self.resends.append(Resend(f"RELEASE after {body.tid}", body.tid, self.release_call(body),
                                   self.woken))

    def checked(self, tid: str, kind: str, nonce: str, answer: Any) -> None:
        if kind == "D":
            if answer.action == WAIT:
                self.queue.append((tid, kind))
                return
            if answer.action == ADOPTED:  # D9: a newer burst answers this message's ids
                return
            ids = [tid, *answer.absorbed] if answer.action == CLAIMED else [tid]
            self.bodies.append(Body(tid, kind, nonce, holds=False, ids=ids))
            return
        if kind == "T":
            if answer.admitted:
                self.bodies.append(Body(tid, kind, nonce, holds=True, ids=[tid]))
            else:  # T2: re-published for its turn
                self.queue.append((tid, kind))
                self.turns[tid] = answer.until
            return
        if answer.live or answer.overlap:  # W5, R2: put off, the same id published again
            self.queue.append((tid, kind))
            return
        if answer.taken_over is not None and self.taken_over(tid, kind):
            return
        if not answer.run:
            self.results[tid] = "REVOKED"  # W3: skipped
            assert answer.holder not in self.failed, (
                f"R1/S7: {tid} skipped as held by {answer.holder}, whose dispatch raised "
                f"StoreUnavailable")
            self.onto(answer.holder, tid, "skipped")
            return
        self.bodies.append(Body(tid, kind, nonce, holds=kind != "P", ids=[tid]))

    def taken_over(self, tid: str, kind: str) -> bool:
        """engine/takeover.py ``decide``: the lock of ``tid`` was taken over; REVOKED by the
        dispatch that took it (R1): never runs; else re-published (WAIT) until the grace is
        spent, then skipped as held by the new owner (False: the skip follows)."""
        if self.results.get(tid) == "REVOKED":
            return True
        left = takeover.grace() - self.waited.get(tid, 0.0)
        if left <= 0:
            return False
        self.waited[tid] = self.waited.get(tid, 0.0) + min(left, max(0.05, LEASE / 3))
        self.queue.append((tid, kind))
        return True

    @precondition(lambda self: self.bodies)
    @rule(pick=picks, fate=fates)
    def renew(self, pick: int, fate: str) -> None:
        """U5/T4/R2: the lease thread renews the lock, running marker or slot it holds."""
        body = self.bodies[pick % len(self.bodies)]
        if not body.holds or body.kind in ("P", "D"):
            return
        store, tid, now = self.store, body.tid, clock.now()
        if body.kind == "T":
            def call() -> Any:
                return store.throttle_renew(self.tkey, tid, SLOT_LEASE, limit=SLOTS)
        else:
            key = running_key(self.keys["X"]) if body.kind == "X" else self.keys[body.kind]

            def call() -> Any:
                return store.renew(key, tid, LEASE, now=now, delivery=body.nonce)
        try:
            answer = self.fates.call(fate, f"RENEW {body.kind} {tid}", call, tid)
        except StoreUnavailable:
            return  # the next renewal, LEASE_SECONDS / 3 later
        assert answer.held, f"U5/T4: the lease of running {tid} was lost: {answer}"
        asker = getattr(answer, "cancel", None)
        if asker is not None:  # L2: a dispatch asked this run to stop
            assert asker not in self.undone, (
                f"L2/S7: running {tid} is asked to stop by {asker}, whose dispatch raised "
                f"StoreUnavailable and whose undo already ran")
            assert asker in self.failed or self.will_run(asker), (
                f"L2: running {tid} is asked to stop by {asker}, which never runs")

    @precondition(lambda self: self.bodies)
    @rule(pick=picks, fate=fates)
    def finish(self, pick: int, fate: str) -> None:
        """U4/T4/R2: the body ends; it releases what it holds (a lost release is re-sent)."""
        body = self.bodies.pop(pick % len(self.bodies))
        for tid in body.ids:
            self.results[tid] = "SUCCESS"
        if not body.holds or body.kind in ("P", "D"):
            return  # nothing held, or the re-sent check releases what it finds (W4)
        call = self.release_call(body)
        what = f"RELEASE {body.kind} {body.tid}"
        try:
            released = self.fates.call(fate, what, call, body.tid)
        except StoreUnavailable:
            self.resends.append(Resend(what, body.tid, call, self.woken))
            return
        assert released, f"U4/S7: {body.tid} finished without releasing its {body.kind} grant"
        self.woken(released)

    def wait_for_turn(self, tid: str) -> None:
        """A deferred message comes back at its turn (at most SLOT_LEASE / 3 ahead, T2)."""
        turn = min(self.turns.pop(tid, 0.0), time.time() + SLOT_LEASE)
        started = time.time()
        while time.time() < turn:
            time.sleep(0.01)
        WAITED[0] += time.time() - started
