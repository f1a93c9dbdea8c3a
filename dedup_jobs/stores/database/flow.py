"""Flow control on the database store (R1 ``take_over``, R2 ``start_exclusive``) and S7's undo
of a failed dispatch, kept apart from ``store.py`` so the lock statements there stay as they
are. Every expiry is the database server's clock, in the statement that decides
(:mod:`~dedup_jobs.stores.database.servertime`, S3); the ``now`` the callers pass is not used.

R1 replaces a queued holder and keeps it, with its nonce (its dispatch's request), at the head
of the row's ``chain`` (JSON, newest first, at most 16, as the Redis scripts and the cache
stores keep theirs), so that the undo of a take-over whose reply was lost gives the lock back
(S7), and the replaced holder's worker check is told it was taken over
(``Started.taken_over``). On PostgreSQL and SQLite (3.35+) that is one statement: the upsert of
``store.py`` whose conflict branch also overwrites a row held *queued* by another owner and
pushes it onto the chain (``jsonb`` on PostgreSQL, SQLite's JSON functions). MariaDB and MySQL
(whose ``ON DUPLICATE KEY UPDATE`` assigns left to right, so a condition on the owner cannot
survive the owner's own assignment) and other databases take the row as a plain acquire does
(``_take``), then, held by another owner, lock it (``SELECT … FOR UPDATE``, read with the
server's clock) and decide on it in a transaction. R2 is one transaction: read the lock
and the running marker (``{key}:run``, a ``JobLock`` row like any lock) under ``FOR UPDATE``,
take the marker with the store's ``_take``, delete the caller's lock. Both carry the caller's
deadline (S7): past it, they change nothing.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import TYPE_CHECKING

from django.db import IntegrityError, connections, transaction

from dedup_jobs import clock
from dedup_jobs.conf import app_settings
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import QUEUED, RUNNING, Acquired, Started
from dedup_jobs.stores.database import statements as sql
from dedup_jobs.stores.database.models import JobLock
from dedup_jobs.stores.database.servertime import ServerNow, server_later, server_now
from dedup_jobs.stores.retry import AGAIN, Again, decide

if TYPE_CHECKING:
    from dedup_jobs.stores.database.host import DatabaseHost as Host
else:
    Host = object


#: the ``nonce`` column's length: a longer request id is not kept (matched by owner alone)
NONCE_LENGTH = 40
#: replaced holders a take-over keeps (newest first): a replace storm stays cheap; an undo
#: past them deletes the lock, as one without a chain does (the Redis scripts keep as many)
CHAIN = 16


# R1 in one statement (PostgreSQL, SQLite): take a free row, or replace a row held queued by
# another owner ({replace}) and push that holder (owner, nonce) onto the chain ({pushed}, the 16
# newest); a row held running, or ours, is left as it is. Every assignment reads the old row.
TAKE_OVER = """
INSERT INTO {t} {columns} {values}
ON CONFLICT ({k}) DO UPDATE SET
  owner = CASE WHEN {take} THEN EXCLUDED.owner ELSE {t}.owner END,
  state = CASE WHEN {take} THEN EXCLUDED.state ELSE {t}.state END,
  task_name = CASE WHEN {take} THEN EXCLUDED.task_name ELSE {t}.task_name END,
  ident = CASE WHEN {take} THEN EXCLUDED.ident ELSE {t}.ident END,
  acquired_at = CASE WHEN {take} THEN EXCLUDED.acquired_at ELSE {t}.acquired_at END,
  expires_at = CASE WHEN {take} THEN EXCLUDED.expires_at ELSE {t}.expires_at END,
  nonce = CASE WHEN {take} THEN EXCLUDED.nonce ELSE {t}.nonce END,
  chain = CASE WHEN {free} THEN EXCLUDED.chain WHEN {replace} THEN {pushed} ELSE {t}.chain END
"""
REPLACE = "({t}.state = 'queued' AND {t}.owner <> EXCLUDED.owner AND NOT {free})"
PUSHED = {
    "postgresql": "((jsonb_build_array(jsonb_build_array({t}.owner, {t}.nonce)) || CASE WHEN"
                  " {t}.chain = '' THEN '[]'::jsonb ELSE {t}.chain::jsonb END) - {cap})::text",
    "sqlite": "json_remove('[' || json_array({t}.owner, {t}.nonce) || CASE WHEN {t}.chain IN"
              " ('', '[]') THEN ']' ELSE ',' || substr({t}.chain, 2) END, '$[{cap}]')",
}


def parse_chain(text: str) -> list[list[str]]:
    """The ``[owner, nonce]`` entries of a row's ``chain``, newest first."""
    return list(json.loads(text)) if text else []


def was_replaced(chain: str, owner: str) -> bool:
    """``owner``'s queued lock is in ``chain``: a take-over replaced it (R1)."""
    return any(entry[0] == owner for entry in parse_chain(chain))


def undo_key(key: JobKey) -> str:
    """Where the undo of a dispatch at ``key`` leaves its tombstone (an expired row); hashed
    when it would not fit the key column."""
    name = f"{key.key}:undo"
    if len(name) <= JobLock._meta.get_field("key").max_length:  # type: ignore[operator]
        return name
    return f"{key.key[:300]}:undo:{hashlib.sha256(key.key.encode()).hexdigest()}"


def cancel_of(text: str | None, owner: str) -> str | None:
    """L2: who asked ``owner``'s run to stop, from a marker row's ``cancel`` (None: nobody;
    a request naming another run, an earlier one of the key, is stale)."""
    if not text:
        return None
    target, by = json.loads(text)
    return str(by) if target == owner else None


def kept_request(request: str | None) -> str | None:
    """The request id as the row keeps it in its nonce (None: too long, matched by owner)."""
    return request if request and len(request) <= NONCE_LENGTH else None


class DatabaseFlowMixin(Host):
    """``take_over``, ``start_exclusive`` and ``undo`` for :class:`DatabaseStore`."""


    def take_over(
        self, key: JobKey, owner: str, ttl: float, *, now: float, request: str | None = None
    ) -> Acquired:
        if self._dialect() == "on_conflict" and connections[self.using].vendor in PUSHED:
            return self._dispatch(
                self._take_over_upsert, key, owner, ttl, kept_request(request))
        return self._dispatch(
            self._take_over, key, owner, ttl, kept_request(request))

    def _take_over_upsert(self, key: JobKey, owner: str, ttl: float, request: str | None, *,
                          deadline: int) -> Acquired:
        """R1 in one statement (TAKE_OVER), past the caller's deadline nothing (S7)."""
        connection = connections[self.using]
        names = self._names()
        t = names["t"]
        free = sql.FREE["on_conflict"].format(t=t)
        replace = REPLACE.format(t=t, free=free)
        now, now_params = server_now(connection)
        until, until_params = server_later(connection, ttl)
        statement = TAKE_OVER.format(
            columns=sql.LOCK_COLUMNS.format(**names),
            values=sql.in_time(sql.LOCK_VALUES.format(now=now, until=until), now,
                               "on_conflict"),
            take=f"({free} OR {replace})", free=free, replace=replace,
            pushed=PUSHED[connection.vendor].format(t=t, cap=CHAIN), **names,
        )
        nonce = request or uuid.uuid4().hex
        params = [key.key, key.task_name, key.ident, owner, QUEUED, *now_params, *until_params,
                  nonce, *now_params, self._deadline_param(deadline)]
        rows = sql.decide(connection, "on_conflict", statement, params, names=names,
                          key=key.key, result=sql.LOCK_RESULT)
        if not rows:
            raise self._refused(deadline)
        ((holder, returned, chain),) = rows
        if holder != owner:
            return Acquired(acquired=False, holder=str(holder))
        if request and returned != request:  # ours under another request: a duplicate
            return Acquired(acquired=False, holder=owner)
        # taken now (free: no chain), replaced now, or this request made again (S7)
        return Acquired(acquired=True, holder=owner, replaced=_head(str(chain or "")))

    def _take_over(self, key: JobKey, owner: str, ttl: float, request: str | None, *,
                   deadline: int) -> Acquired:
        """Take it as a plain acquire does (free or expired: one statement where the database
        has one; the same request made again answers as the first did, S7); held by another
        owner, lock the row and decide on it by the server's clock. The row lock is never
        taken in the transaction that inserts (see ``portable.py``)."""
        rows = JobLock.objects.using(self.using)

        def attempt() -> Acquired | Again:
            holder, outcome, chain = self._take(key, owner, QUEUED, ttl, overwrite_mine=False,
                                                keep_acquired_if_mine=False, deadline=deadline,
                                                request=request)
            if outcome == "taken":
                return Acquired(acquired=True, holder=owner, replaced=_head(chain))
            if holder == owner and request:  # ours under another request: a duplicate
                return Acquired(acquired=False, holder=owner)
            with transaction.atomic(using=self.using):
                row = rows.select_for_update().annotate(server_now=ServerNow()).filter(
                    key=key.key).first()
                if row is None or row.expires_at <= row.server_now:  # type: ignore[attr-defined]
                    return AGAIN  # released or expired in between: take it again
                if row.owner == owner:  # made again without a request (S7)
                    return Acquired(acquired=True, holder=owner, replaced=_head(row.chain))
                if row.state == RUNNING:
                    return Acquired(acquired=False, holder=row.owner)
                if row.server_now > clock.db_datetime(deadline / 1000):  # type: ignore[attr-defined]
                    raise self._refused(deadline)  # S7: a late take-over replaces nobody
                chain = json.dumps([[row.owner, row.nonce], *parse_chain(row.chain)][:CHAIN])
                rows.filter(pk=row.pk).update(
                    owner=owner, state=QUEUED, task_name=key.task_name, ident=key.ident,
                    acquired_at=ServerNow(), expires_at=ServerNow(ttl),
                    nonce=request or uuid.uuid4().hex, chain=chain)
                return Acquired(acquired=True, holder=owner, replaced=row.owner)

        return decide(self.alias, key.key, attempt)

    def cancel_take(
        self, key: JobKey, running: JobKey, owner: str, ttl: float, *, now: float,
        request: str | None = None,
    ) -> Acquired:
        """L2: :meth:`take_over`, then, in a transaction of its own, the running marker's row
        (read ``FOR UPDATE`` with the server's clock) asked to stop. Once the lock is the
        caller's only the caller could take the marker (its start needs the lock), so
        between the two the marker can only be released by its run or expire."""
        taken = self.take_over(key, owner, ttl, now=now, request=request)
        if not taken.acquired:
            return taken
        cancelled = self._guard(self._ask_to_stop, running, owner)
        return Acquired(acquired=True, holder=owner, replaced=taken.replaced,
                        cancelled=cancelled)

    def _ask_to_stop(self, running: JobKey, owner: str) -> str | None:
        rows = JobLock.objects.using(self.using)
        with transaction.atomic(using=self.using):
            row = rows.select_for_update().filter(key=running.key,
                                                  expires_at__gt=ServerNow()).first()
            if row is None or row.owner == owner:
                return None
            before = cancel_of(row.cancel, row.owner)
            if before == owner:
                return row.owner  # this request made again (S7)
            rows.filter(pk=row.pk).update(cancel=json.dumps([row.owner, owner]))
            return None if before else row.owner

    def undo_cancel(self, key: JobKey, running: JobKey, owner: str,
                    request: str | None) -> bool:
        """S7: the request to stop withdrawn (if it is still ``owner``'s), then :meth:`undo`."""
        self._guard(self._withdraw_cancel, running, owner)
        return self.undo(key, owner, request)

    def _withdraw_cancel(self, running: JobKey, owner: str) -> None:
        rows = JobLock.objects.using(self.using)
        with transaction.atomic(using=self.using):
            row = rows.select_for_update().filter(key=running.key).first()
            if row is not None and cancel_of(row.cancel, row.owner) == owner:
                rows.filter(pk=row.pk).update(cancel=None)

    def undo(self, key: JobKey, owner: str, request: str | None) -> bool:
        """S7: undo the failed dispatch ``request`` of ``owner`` (its nonce in the row): its
        own queued lock is deleted, or, taken over, given back to the holder at the head of
        its chain (with that holder's nonce and the rest of the chain); a take-over of it by a
        later dispatch drops it from that lock's chain, so a later undo never gives the key
        back to a dispatch that failed (chained take-overs). A running lock is left. The
        undo leaves an expired row at ``{key}:undo`` (owner, request), so that the undo made
        again answers True, as the first did, for the release tombstone's life."""
        return self._guard(self._undo, key, owner, kept_request(request))

    def _undo(self, key: JobKey, owner: str, request: str | None) -> bool:
        rows = JobLock.objects.using(self.using)
        tombstone = {"key": undo_key(key), "owner": owner, "nonce": request or ""}
        with transaction.atomic(using=self.using):
            row = rows.select_for_update().filter(key=key.key, expires_at__gt=ServerNow()).first()
            if row is not None and self._undo_row(row, owner, request):
                updated = rows.filter(key=tombstone["key"]).update(
                    owner=owner, nonce=tombstone["nonce"], acquired_at=ServerNow(),
                    expires_at=ServerNow(), state=QUEUED, chain="")
                if not updated:
                    with transaction.atomic(using=self.using):  # a savepoint
                        rows.create(**tombstone, task_name=key.task_name, ident=key.ident,
                                    state=QUEUED, acquired_at=ServerNow(),
                                    expires_at=ServerNow())
                return True
        life = 2 * app_settings.STORE_TIMEOUT + 1
        return rows.filter(**tombstone, acquired_at__gt=ServerNow(-life)).exists()

    def _undo_row(self, row: JobLock, owner: str, request: str | None) -> bool:
        """One undo on the locked ``row``: True when it gave the lock back, deleted it or
        dropped the request from its chain."""
        rows = JobLock.objects.using(self.using).filter(pk=row.pk)
        chain = parse_chain(row.chain)
        if row.owner == owner and (request is None or row.nonce == request):
            if row.state == RUNNING:
                return False  # it runs (a re-send of an explicit id's dispatch)
            if chain:
                (back, nonce), rest = chain[0], chain[1:]
                rows.update(owner=back, nonce=nonce, chain=json.dumps(rest) if rest else "")
            else:
                rows.delete()
            return True
        for at, (entry, nonce) in enumerate(chain):
            if entry == owner and (request is None or nonce == request):
                rest = chain[:at] + chain[at + 1:]
                rows.update(chain=json.dumps(rest) if rest else "")
                return True
        return False

    def _taken_over(self, key: JobKey, holder: str, owner: str) -> float | None:
        """R1/S7: seconds (server's clock) since ``holder``'s take-over replaced ``owner``'s
        queued lock at ``key``, if it did; None otherwise. Read only on the skip path."""
        found = (JobLock.objects.using(self.using).held().filter(key=key.key, owner=holder)
                 .annotate(server_now=ServerNow())
                 .values_list("chain", "acquired_at", "server_now").first())
        if found is None or not was_replaced(found[0], owner):
            return None
        return max(0.0, (found[2] - found[1]).total_seconds())

    def start_exclusive(
        self, key: JobKey, running: JobKey, owner: str, lease: float, *, now: float,
        delivery: str | None = None,
    ) -> Started:
        return self._dispatch(
            self._start_exclusive, key, running, owner, lease, delivery or uuid.uuid4().hex)

    def _start_exclusive(
        self, key: JobKey, running: JobKey, owner: str, lease: float, delivery: str, *,
        deadline: int,
    ) -> Started:
        rows = JobLock.objects.using(self.using)

        def attempt() -> Started | Again:
            try:
                with transaction.atomic(using=self.using):
                    held = {
                        row.key: row for row in rows.select_for_update()
                        .annotate(server_now=ServerNow())
                        .filter(key__in=(key.key, running.key), expires_at__gt=ServerNow())
                    }
                    lock, marker = held.get(key.key), held.get(running.key)
                    if marker is not None and marker.owner == owner and marker.nonce in (
                            delivery, f"held-{delivery}"):
                        return Started(run=True, holder=None, took=True)  # a re-send (S7)
                    if lock is not None and lock.owner != owner:
                        age = (lock.server_now - lock.acquired_at).total_seconds()  # type: ignore[attr-defined]
                        return Started(run=False, holder=lock.owner, taken_over=max(0.0, age)
                                       if was_replaced(lock.chain, owner) else None)
                    if marker is not None:
                        if marker.owner == owner:
                            return Started(run=False, holder=owner, live=True)
                        return Started(run=False, holder=marker.owner, overlap=True)
                    # S7: past the deadline the take refuses, and the whole check is undone
                    holder, outcome, _chain = self._take(
                        running, owner, RUNNING, lease, overwrite_mine=False,
                        keep_acquired_if_mine=False, delivery=delivery, deadline=deadline)
                    if outcome != "taken":  # another run took the marker first
                        if holder == owner:
                            return Started(run=False, holder=owner, live=True)
                        return Started(run=False, holder=holder, overlap=True)
                    released = lock is not None and self._delete_mine(key, owner)
                    return Started(run=True, holder=None, took=True, released=released)
            except IntegrityError:
                return AGAIN  # the marker row was created meanwhile: decide again

        return decide(self.alias, running.key, attempt)


def _head(chain: str) -> str | None:
    """The holder a take-over replaced (the head of its chain), or None."""
    entries = parse_chain(chain)
    return entries[0][0] if entries else None
