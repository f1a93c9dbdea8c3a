"""Flow control on the database store (R1 ``take_over``, R2 ``start_exclusive``), kept apart
from ``store.py`` so the lock statements there stay as they are. Every expiry is the database
server's clock, in the statement that decides (:mod:`~dedup_jobs.stores.database.servertime`,
S3); the ``now`` the callers pass is not used.

R1 on PostgreSQL and SQLite (3.35+) is one statement: the upsert of ``store.py`` whose conflict
branch also overwrites a row held *queued* by another owner, leaving the replaced owner in the
row's ``nonce`` ("r" + owner: the only way ``RETURNING``, which returns the new row, can tell
it). MariaDB and MySQL (whose ``ON DUPLICATE KEY UPDATE`` assigns left to right, so a
condition on the owner cannot survive the owner's own assignment) and other databases take the
row as a plain acquire does (``_take``), then, held by another owner, lock it
(``SELECT … FOR UPDATE``, read with the server's clock) and decide on it in a transaction. R2 is
one transaction: read the lock and the running marker (``{key}:run``, a ``JobLock`` row like any
lock) under ``FOR UPDATE``, take the marker with the store's ``_take``, delete the caller's lock.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import IntegrityError, connections, transaction

from dedup_jobs import clock
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import QUEUED, RUNNING, Acquired, Started
from dedup_jobs.stores.database import statements as sql
from dedup_jobs.stores.database.models import JobLock
from dedup_jobs.stores.database.servertime import ServerNow, server_later, server_now

#: the ``nonce`` column is 40 characters: an owner id up to 39 fits after the "r"
NONCE_ROOM = 39
#: attempts when the row keeps changing hands between the take and the row lock
ATTEMPTS = 5

TAKE_OVER = """
INSERT INTO {t} {columns} {values}
ON CONFLICT ({k}) DO UPDATE SET
  owner = CASE WHEN {take} THEN EXCLUDED.owner ELSE {t}.owner END,
  state = CASE WHEN {take} THEN EXCLUDED.state ELSE {t}.state END,
  task_name = CASE WHEN {take} THEN EXCLUDED.task_name ELSE {t}.task_name END,
  ident = CASE WHEN {take} THEN EXCLUDED.ident ELSE {t}.ident END,
  acquired_at = CASE WHEN {take} THEN EXCLUDED.acquired_at ELSE {t}.acquired_at END,
  expires_at = CASE WHEN {take} THEN EXCLUDED.expires_at ELSE {t}.expires_at END,
  nonce = CASE WHEN {free} THEN EXCLUDED.nonce
               WHEN {replace} AND LENGTH({t}.owner) <= {room} THEN 'r' || {t}.owner
               WHEN {replace} THEN 'r?'
               ELSE {t}.nonce END
"""
REPLACE = "({t}.state = 'queued' AND {t}.owner <> EXCLUDED.owner AND NOT {free})"


def _replaced_from(nonce: str) -> str | None:
    """The replaced owner a take-over left in the row's nonce ("r?": too long to keep)."""
    if nonce.startswith("r") and nonce != "r?" and not nonce.startswith("held-"):
        return nonce[1:]
    return None


class DatabaseFlowMixin:
    """``take_over`` and ``start_exclusive`` for :class:`DatabaseStore`."""

    alias: str
    _guard: Any
    _dialect: Any
    _names: Any
    _take: Any
    _dispatch: Any
    _refused: Any
    _deadline_param: Any
    _delete_mine: Any

    @property
    def using(self) -> str:
        raise NotImplementedError

    def take_over(
        self, key: JobKey, owner: str, ttl: float, *, now: float, request: str | None = None
    ) -> Acquired:
        if self._dialect() == "on_conflict":
            return self._dispatch(self._take_over_upsert, key, owner, ttl)  # type: ignore[no-any-return]
        return self._dispatch(self._take_over_locked, key, owner, ttl)  # type: ignore[no-any-return]

    def _take_over_upsert(self, key: JobKey, owner: str, ttl: float, deadline: int) -> Acquired:
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
            take=f"({free} OR {replace})", free=free, replace=replace, room=NONCE_ROOM,
            **names,
        )
        nonce = uuid.uuid4().hex
        params = [key.key, key.task_name, key.ident, owner, QUEUED, *now_params, *until_params,
                  nonce, *now_params, self._deadline_param(deadline)]
        rows = sql.decide(connection, "on_conflict", statement, params, names=names,
                          key=key.key, result=sql.LOCK_RESULT)
        if not rows:
            raise self._refused(deadline)
        ((holder, returned),) = rows
        if holder != owner:
            return Acquired(acquired=False, holder=str(holder))
        # Ours: taken now (our nonce), replaced now or by our own earlier send (S7): "r…".
        return Acquired(acquired=True, holder=owner, replaced=_replaced_from(str(returned)))

    def _take_over_locked(self, key: JobKey, owner: str, ttl: float, deadline: int) -> Acquired:
        """Take it as a plain acquire does (free or expired: one statement where the database
        has one); held by another owner, lock the row and decide on it by the server's clock.
        The row lock is never taken in the transaction that inserts (see ``portable.py``)."""
        rows = JobLock.objects.using(self.using)
        for _ in range(ATTEMPTS):
            _holder, outcome = self._take(key, owner, QUEUED, ttl, overwrite_mine=False,
                                          keep_acquired_if_mine=False, deadline=deadline)
            if outcome == "taken":
                return Acquired(acquired=True, holder=owner)
            with transaction.atomic(using=self.using):
                row = rows.select_for_update().annotate(server_now=ServerNow()).filter(
                    key=key.key).first()
                if row is None or row.expires_at <= row.server_now:  # type: ignore[attr-defined]
                    continue  # released or expired in between: take it again
                if row.owner == owner:
                    return Acquired(acquired=True, holder=owner,
                                    replaced=_replaced_from(row.nonce))
                if row.state == RUNNING:
                    return Acquired(acquired=False, holder=row.owner)
                if row.server_now > clock.db_datetime(deadline / 1000):  # type: ignore[attr-defined]
                    raise self._refused(deadline)  # S7: a late take-over replaces nobody
                replaced = row.owner
                rows.filter(pk=row.pk).update(
                    owner=owner, state=QUEUED, task_name=key.task_name, ident=key.ident,
                    acquired_at=ServerNow(), expires_at=ServerNow(ttl),
                    nonce=f"r{replaced}" if len(replaced) <= NONCE_ROOM else "r?")
                return Acquired(acquired=True, holder=owner, replaced=replaced)
        raise StoreUnavailable(self.alias, f"lock {key.key!r} changed hands 5 times in a row")

    def start_exclusive(
        self, key: JobKey, running: JobKey, owner: str, lease: float, *, now: float,
        delivery: str | None = None,
    ) -> Started:
        return self._guard(  # type: ignore[no-any-return]
            self._start_exclusive, key, running, owner, lease, delivery or uuid.uuid4().hex)

    def _start_exclusive(
        self, key: JobKey, running: JobKey, owner: str, lease: float, delivery: str
    ) -> Started:
        rows = JobLock.objects.using(self.using)
        for _ in range(ATTEMPTS):
            try:
                with transaction.atomic(using=self.using):
                    held = {
                        row.key: row for row in rows.select_for_update()
                        .filter(key__in=(key.key, running.key), expires_at__gt=ServerNow())
                    }
                    lock, marker = held.get(key.key), held.get(running.key)
                    if marker is not None and marker.owner == owner and marker.nonce in (
                            delivery, f"held-{delivery}"):
                        return Started(run=True, holder=None, took=True)  # a re-send (S7)
                    if lock is not None and lock.owner != owner:
                        return Started(run=False, holder=lock.owner)
                    if marker is not None:
                        if marker.owner == owner:
                            return Started(run=False, holder=owner, live=True)
                        return Started(run=False, holder=marker.owner, overlap=True)
                    holder, outcome = self._take(running, owner, RUNNING, lease,
                                                 overwrite_mine=False,
                                                 keep_acquired_if_mine=False, delivery=delivery)
                    if outcome != "taken":  # another run took the marker first
                        if holder == owner:
                            return Started(run=False, holder=owner, live=True)
                        return Started(run=False, holder=holder, overlap=True)
                    released = lock is not None and self._delete_mine(key, owner)
                    return Started(run=True, holder=None, took=True, released=released)
            except IntegrityError:
                continue  # the marker row was created meanwhile: decide again
        raise StoreUnavailable(self.alias, f"{running.key!r} changed hands 5 times in a row")
