"""Flow control on the database store (R1 ``take_over``, R2 ``start_exclusive``), kept apart
from ``store.py`` so the lock statements there stay as they are.

R1 on PostgreSQL and SQLite is one statement: the upsert of ``store.py`` whose conflict branch
also overwrites a row held *queued* by another owner, leaving the replaced owner in the row's
``nonce`` ("r" + owner: the only way ``RETURNING``, which returns the new row, can tell it).
Other backends lock the row in a transaction. R2 is one transaction: read the lock and the
running marker (``{key}:run``, a ``JobLock`` row like any lock) under ``FOR UPDATE``, take the
marker with the store's upsert, delete the caller's lock.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction

from dedup_jobs import clock
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import QUEUED, RUNNING, Acquired, Started
from dedup_jobs.stores.database.models import JobLock

#: the ``nonce`` column is 40 characters: an owner id up to 39 fits after the "r"
NONCE_ROOM = 39

TAKE_OVER = """
INSERT INTO {t} ("key", task_name, ident, owner, state, acquired_at, expires_at, nonce)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT ("key") DO UPDATE SET
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
RETURNING owner, nonce
"""
FREE = "{t}.expires_at <= EXCLUDED.acquired_at"
REPLACE = "({t}.state = 'queued' AND {t}.owner <> EXCLUDED.owner AND NOT {free})"


def _replaced_from(nonce: str) -> str | None:
    """The replaced owner a take-over left in the row's nonce ("r?": too long to keep)."""
    if nonce.startswith("r") and nonce != "r?" and not nonce.startswith("held-"):
        return nonce[1:]
    return None


class DatabaseFlowMixin:
    """``take_over`` and ``start_exclusive`` for :class:`DatabaseStore`."""

    alias: str
    if TYPE_CHECKING:
        @property
        def using(self) -> str: ...

    _guard: Any
    _dt: Any
    _one_statement: Any
    _upsert: Any
    _locked_take: Any

    def take_over(self, key: JobKey, owner: str, ttl: float, *, now: float) -> Acquired:
        if self._one_statement():
            return self._guard(self._take_over_upsert, key, owner, ttl, now)  # type: ignore[no-any-return]
        return self._guard(self._take_over_locked, key, owner, ttl, now)  # type: ignore[no-any-return]

    def _take_over_upsert(self, key: JobKey, owner: str, ttl: float, now: float) -> Acquired:
        connection = connections[self.using]
        table = connection.ops.quote_name(JobLock._meta.db_table)
        free = FREE.format(t=table)
        replace = REPLACE.format(t=table, free=free)
        sql = TAKE_OVER.format(t=table, take=f"({free} OR {replace})", free=free,
                               replace=replace, room=NONCE_ROOM)
        nonce = uuid.uuid4().hex
        params = [key.key, key.task_name, key.ident, owner, QUEUED, self._dt(now),
                  self._dt(now + ttl), nonce]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            ((holder, returned),) = cursor.fetchall()
        if holder != owner:
            return Acquired(acquired=False, holder=str(holder))
        # Ours: taken now (our nonce), replaced now or by our own earlier send (S7): "r…".
        return Acquired(acquired=True, holder=owner, replaced=_replaced_from(str(returned)))

    def _take_over_locked(self, key: JobKey, owner: str, ttl: float, now: float) -> Acquired:
        for _ in range(5):
            answer, _free = self._locked_take(key, owner, QUEUED, now, ttl, reentrant=False)
            if answer.acquired or answer.holder == owner:
                return Acquired(acquired=True, holder=owner)
            with transaction.atomic(using=self.using):
                row = (JobLock.objects.using(self.using).select_for_update()
                       .filter(key=key.key).first())
                if row is None or row.expires_at <= clock.db_datetime(now):
                    continue
                if row.owner == owner:
                    return Acquired(acquired=True, holder=owner,
                                    replaced=_replaced_from(row.nonce))
                if row.state == RUNNING:
                    return Acquired(acquired=False, holder=row.owner)
                replaced = row.owner
                JobLock.objects.using(self.using).filter(pk=row.pk).update(
                    owner=owner, state=QUEUED, task_name=key.task_name, ident=key.ident,
                    acquired_at=clock.db_datetime(now),
                    expires_at=clock.db_datetime(now + ttl),
                    nonce=f"r{replaced}" if len(replaced) <= NONCE_ROOM else "r?")
                return Acquired(acquired=True, holder=owner, replaced=replaced)
        raise StoreUnavailable(self.alias, f"lock {key.key!r} changed hands 5 times in a row")

    def start_exclusive(
        self, key: JobKey, running: JobKey, owner: str, lease: float, *, now: float,
        delivery: str | None = None,
    ) -> Started:
        return self._guard(  # type: ignore[no-any-return]
            self._start_exclusive, key, running, owner, lease, now,
            delivery or uuid.uuid4().hex)

    def _start_exclusive(
        self, key: JobKey, running: JobKey, owner: str, lease: float, now: float,
        delivery: str,
    ) -> Started:
        rows = JobLock.objects.using(self.using)
        for _ in range(5):
            try:
                with transaction.atomic(using=self.using):
                    held = {
                        row.key: row for row in rows.select_for_update()
                        .filter(key__in=(key.key, running.key),
                                expires_at__gt=clock.db_datetime(now))
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
                    started = self._take_marker(running, owner, lease, now, delivery)
                    if started is not None:
                        return started
                    released = bool(lock is not None and rows.filter(
                        key=key.key, owner=owner).delete()[0])
                    return Started(run=True, holder=None, took=True, released=released)
            except IntegrityError:
                continue  # the marker row was created meanwhile: decide again
        raise StoreUnavailable(self.alias, f"{running.key!r} changed hands 5 times in a row")

    def _take_marker(
        self, running: JobKey, owner: str, lease: float, now: float, delivery: str
    ) -> Started | None:
        """Take the free marker for ``owner``; a Started when another run took it first."""
        if self._one_statement():
            holder, outcome = self._upsert(
                running, owner, RUNNING, now, lease, overwrite_mine=False,
                keep_acquired_if_mine=False, delivery=delivery)
            if outcome == "other" or (outcome == "live" and holder != owner):
                return Started(run=False, holder=holder, overlap=True)
            return None
        answer, _free = self._locked_take(running, owner, RUNNING, now, lease,
                                          reentrant=False, delivery=delivery)
        if not answer.acquired:
            return Started(run=False, holder=answer.holder, overlap=answer.holder != owner,
                           live=answer.holder == owner)
        return None
