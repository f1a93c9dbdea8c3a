"""Flow control on the generic cache store (R1 ``take_over``, R2 ``start_exclusive``), kept
apart from ``cache.py``. Each decision runs under the store's short ``add``-based mutex of the
key (so two take-overs or exclusive starts of a key never interleave) and through the store's
``calls``, so its cache calls share one STORE_TIMEOUT (S8) and, on memcached, every overwrite
or delete is guarded by the ``cas`` token of the read it decided on: a plain
:meth:`CacheStore.acquire` takes no mutex, and a lock that expired and was taken by ``add``
between the read and the write is decided on again, never overwritten. (``add`` itself never
overwrites.) Other caches have no ``cas``: there the write is a plain ``set``/``delete``, as
in the rest of the store."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from dedup_jobs import clock
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import QUEUED, RUNNING, Acquired, Started
from dedup_jobs.stores.retry import AGAIN, Again, decide

if TYPE_CHECKING:
    from dedup_jobs.stores.cache_host import CacheHost as Host
else:
    Host = object

#: replaced holders a take-over keeps (newest first): a replace storm stays cheap; an undo
#: past them deletes the lock, as one without a chain does (the Redis scripts keep as many)
CHAIN = 16


def _kept(value: dict[str, Any] | None, depth: int = CHAIN) -> dict[str, Any] | None:
    """``value`` with at most ``depth`` holders in its chain (itself included)."""
    if value is None or depth <= 0:
        return None
    return {**value, "previous": _kept(value.get("previous"), depth - 1)}


def replaced_chain(value: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    """The queued locks a take-over replaced, newest first (each rides in the next one's
    ``previous`` until the lock runs or is released)."""
    value = None if value is None else value.get("previous")
    while value is not None:
        yield value
        value = value.get("previous")


def taken_over_age(current: dict[str, Any], owner: str, now: float) -> float | None:
    """R1/S7: seconds since a take-over replaced ``owner``'s queued lock, if ``current``
    (another owner's) carries it; None when ``owner`` was not replaced."""
    if any(entry["owner"] == owner for entry in replaced_chain(current)):
        return max(0.0, now - float(current["acquired"]))
    return None


class CacheFlowMixin(Host):
    """``take_over`` and ``start_exclusive`` for :class:`CacheStore`."""


    def take_over(
        self, key: JobKey, owner: str, ttl: float, *, now: float, request: str | None = None
    ) -> Acquired:
        calls = self.calls
        deadline = self.deadline_ms()
        with calls.decision(), self._mutex(key):

            def attempt() -> Acquired | Again:
                current, token = calls.gets(key.key)
                if current is not None and current["owner"] == owner:
                    return Acquired(acquired=True, holder=owner,
                                    replaced=current.get("replaced") or None)  # re-sent (S7)
                if current is not None and current["state"] == RUNNING:
                    return Acquired(acquired=False, holder=str(current["owner"]))
                replaced = None if current is None else str(current["owner"])
                self._in_time(deadline)  # S7: a late take-over changes nothing
                # the replaced holder's lock rides along: an undo gives it back (S7, R1)
                value = {**self._value(key, owner, QUEUED, now, ttl), "replaced": replaced or "",
                         "req": request or "", "previous": _kept(current)}
                if current is None:
                    if calls.add(key.key, value, ttl):
                        return Acquired(acquired=True, holder=owner)
                    return AGAIN  # a plain acquire took it in between: decide on that lock
                if calls.cas(key.key, value, token, ttl):
                    return Acquired(acquired=True, holder=owner, replaced=replaced)
                # changed or gone since the read (expired, taken by a plain acquire)
                return AGAIN

            return decide(self.alias, key.key, attempt)

    def cancel_take(
        self, key: JobKey, running: JobKey, owner: str, ttl: float, *, now: float,
        request: str | None = None,
    ) -> Acquired:
        """L2: :meth:`take_over`, then the running marker asked to stop. Two steps, each
        cas-guarded: once the lock is the caller's, only the caller could take the marker
        (its start needs the lock), so between them the marker can only be released by its
        run or expire: asked or not, the answer says which."""
        taken = self.take_over(key, owner, ttl, now=now, request=request)
        if not taken.acquired:
            return taken
        calls = self.calls

        def attempt() -> str | Again | None:
            marker, token = calls.gets(running.key)
            if marker is None or marker["owner"] == owner:
                return None
            before = marker.get("cancel")
            if before == owner:
                return str(marker["owner"])  # this request made again (S7)
            left = float(marker["expires"]) - clock.now()
            if left <= 0:
                return None
            if calls.cas(running.key, {**marker, "cancel": owner}, token, left):
                return None if before else str(marker["owner"])
            return AGAIN

        with calls.decision():
            cancelled = decide(self.alias, running.key, attempt)
        return Acquired(acquired=True, holder=owner, replaced=taken.replaced,
                        cancelled=cancelled)

    def undo_cancel(self, key: JobKey, running: JobKey, owner: str,
                    request: str | None) -> bool:
        """S7: the request to stop withdrawn (if it is still ``owner``'s), then :meth:`undo`."""
        calls = self.calls

        def attempt() -> bool | Again:
            marker, token = calls.gets(running.key)
            if marker is None or marker.get("cancel") != owner:
                return False
            left = float(marker["expires"]) - clock.now()
            kept = {k: v for k, v in marker.items() if k != "cancel"}
            return True if left <= 0 or calls.cas(running.key, kept, token, left) else AGAIN

        with calls.decision():
            decide(self.alias, running.key, attempt)
        return self.undo(key, owner, request)

    def undo(self, key: JobKey, owner: str, request: str | None) -> bool:
        """S7: undo the failed dispatch ``request`` of ``owner``: its own lock is deleted, or
        for a take-over given back to the queued lock it replaced; a take-over of it by a
        later dispatch drops it from that lock's chain, so a later undo never gives the key
        back to a dispatch that failed (chained take-overs)."""
        calls, tombstone, undone = self.calls, f"{key.key}:undo", f"{owner}|{request or ''}"

        def mine(entry: dict[str, Any]) -> bool:
            return bool(entry["owner"] == owner and (
                not request or entry.get("req", "") in ("", request)))

        with calls.decision(), self._mutex(key):

            def attempt() -> bool | Again:
                current, token = calls.gets(key.key)
                outcome = None if current is None else self._undo_once(key, current, token, mine)
                if outcome is True:
                    # S7: this undo made again (its reply lost) answers as the first did
                    calls.set_many({tombstone: undone}, self._tombstone_seconds())
                    return True
                if outcome is None:  # nothing of this request's here (any more)
                    return bool(calls.get(tombstone) == undone)
                return AGAIN  # False: the lock changed since the read: decide again

            return decide(self.alias, key.key, attempt)

    def _undo_once(self, key: JobKey, current: dict[str, Any], token: Any,
                   mine: Any) -> bool | None:
        """One cas-guarded try of :meth:`undo` on the lock ``current`` (read with ``token``):
        True when it gave the lock back, deleted it or dropped ``mine`` from its chain, False
        when the lock changed since the read, None when nothing of ``mine`` is there."""
        calls = self.calls
        if mine(current):
            if current["state"] == RUNNING:
                return None  # it runs (a re-send of an explicit id's dispatch)
            back = current.get("previous")
            left = 0.0 if back is None else float(back["expires"]) - clock.now()
            if back is not None and left > 0:
                return bool(calls.cas(key.key, back, token, left))
            return bool(calls.cas_delete(key.key, token))
        newer = current
        for entry in replaced_chain(current):
            if mine(entry):
                newer["previous"] = entry.get("previous")
                left = float(current["expires"]) - clock.now()
                if left <= 0:
                    return None  # expiring with its whole chain
                return bool(calls.cas(key.key, current, token, left))
            newer = entry
        return None

    def start_exclusive(
        self, key: JobKey, running: JobKey, owner: str, lease: float, *, now: float,
        delivery: str | None = None,
    ) -> Started:
        delivery = delivery or str(uuid4())
        calls, deadline = self.calls, self.deadline_ms()
        with calls.decision(), self._mutex(key):

            def attempt() -> Started | Again:
                marker = calls.get(running.key)
                if (marker is not None and marker["owner"] == owner
                        and marker.get("run") == delivery):
                    return Started(run=True, holder=None, took=True)  # a re-send (S7)
                current, token = calls.gets(key.key)
                if current is not None and current["owner"] != owner:
                    # L2: a cancel_running dispatch may have taken the lock over (R1)
                    return Started(run=False, holder=str(current["owner"]),
                                   taken_over=taken_over_age(current, owner, now))
                if marker is not None:
                    if marker["owner"] == owner:
                        return Started(run=False, holder=owner, live=True)
                    return Started(run=False, holder=str(marker["owner"]), overlap=True)
                value = {**self._value(running, owner, RUNNING, now, lease), "run": delivery,
                         "took": True}
                self._in_time(deadline)  # S7: a late check takes no marker (see start())
                if not calls.add(running.key, value, lease):
                    return AGAIN  # another run took the marker in between: decide on it
                released = False
                if current is not None:
                    # ours: a lock taken meanwhile by another owner (ours expired) stays
                    released = bool(calls.cas_delete(key.key, token))
                return Started(run=True, holder=None, took=True, released=released)

            return decide(self.alias, running.key, attempt)
