"""The lease of the database store (W6): extend the caller's lock, take a free key back, or
name the other owner.

PostgreSQL and SQLite extend a held lock in one ``UPDATE`` (the usual case) and take a free key
in one upsert; other backends (MySQL, MariaDB) lock the row in a transaction.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import IntegrityError, connections, transaction

from dedup_jobs import clock
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import RUNNING, Renewed
from dedup_jobs.stores.database.models import JobLock

EXTEND = """
UPDATE {t} SET expires_at = CASE WHEN expires_at < %s THEN %s ELSE expires_at END
WHERE "key" = %s AND owner = %s AND expires_at > %s
"""
# The lease of the caller's own lock: extend it, never shorten it (a row still held only).
TAKE_FREE = """
INSERT INTO {t} ("key", task_name, ident, owner, state, acquired_at, expires_at, nonce)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT ("key") DO UPDATE SET
  owner = EXCLUDED.owner, state = EXCLUDED.state, task_name = EXCLUDED.task_name,
  ident = EXCLUDED.ident, acquired_at = EXCLUDED.acquired_at,
  expires_at = EXCLUDED.expires_at, nonce = EXCLUDED.nonce
WHERE {t}.expires_at <= EXCLUDED.acquired_at
RETURNING owner
"""
# The lease taking a free key back (W6): insert, or overwrite an expired row; a row still
# held is left as it is and nothing is returned. The nonce is the running delivery's, as
# START leaves it ("held-" + nonce: the same delivery), so W5 still knows the run.


class DatabaseRenewMixin:
    """The ``renew`` half of :class:`~dedup_jobs.stores.database.store.DatabaseStore`."""

    alias: str

    @property
    def using(self) -> str:
        raise NotImplementedError

    def _dt(self, timestamp: float) -> Any:
        raise NotImplementedError

    def _one_statement(self) -> bool:
        raise NotImplementedError

    def _guard(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def renew(
        self, key: JobKey, owner: str, ttl: float, *, now: float, delivery: str | None = None
    ) -> Renewed:
        nonce = f"held-{delivery}" if delivery else uuid.uuid4().hex
        if self._one_statement():
            return self._guard(self._renew, key, owner, ttl, now, nonce)  # type: ignore[no-any-return]
        return self._guard(self._locked_renew, key, owner, ttl, now, nonce)  # type: ignore[no-any-return]

    def _renew(self, key: JobKey, owner: str, ttl: float, now: float, nonce: str) -> Renewed:
        """PostgreSQL, SQLite: extend the caller's row (one UPDATE, the usual case); if it
        is not held by the caller, take it if free (one upsert); else read the holder.
        Each statement is atomic; a row that changed hands in between is decided again."""
        connection = connections[self.using]
        table = connection.ops.quote_name(JobLock._meta.db_table)
        at, until = self._dt(now), self._dt(now + ttl)
        with connection.cursor() as cursor:
            for _ in range(5):
                cursor.execute(EXTEND.format(t=table), [until, until, key.key, owner, at])
                if cursor.rowcount:
                    return Renewed(held=True)
                cursor.execute(TAKE_FREE.format(t=table), [
                    key.key, key.task_name, key.ident, owner, RUNNING, at, until, nonce,
                ])
                if cursor.fetchall():  # fetchall: see _upsert
                    return Renewed(held=True, retaken=True)
                cursor.execute(
                    f'SELECT owner FROM {table} WHERE "key" = %s AND expires_at > %s',
                    [key.key, at],
                )
                row = cursor.fetchone()
                if row is not None and row[0] != owner:
                    return Renewed(held=False, holder=str(row[0]))
        raise StoreUnavailable(self.alias, f"lock {key.key!r} changed hands 5 times in a row")

    def _locked_renew(
        self, key: JobKey, owner: str, ttl: float, now: float, nonce: str
    ) -> Renewed:
        """Portable path (MySQL, MariaDB): lock the row in a transaction, or create it."""
        rows = JobLock.objects.using(self.using)
        until = clock.db_datetime(now + ttl)
        values = {
            "task_name": key.task_name, "ident": key.ident, "owner": owner, "state": RUNNING,
            "acquired_at": clock.db_datetime(now), "expires_at": until, "nonce": nonce,
        }
        for _ in range(5):
            with transaction.atomic(using=self.using):
                row = rows.select_for_update().filter(key=key.key).first()
                if row is not None:
                    if row.expires_at <= clock.db_datetime(now):
                        rows.filter(pk=row.pk).update(**values)
                        return Renewed(held=True, retaken=True)
                    if row.owner != owner:
                        return Renewed(held=False, holder=row.owner)
                    if row.expires_at < until:
                        rows.filter(pk=row.pk).update(expires_at=until)
                    return Renewed(held=True)
            try:
                with transaction.atomic(using=self.using):
                    rows.create(key=key.key, **values)
                return Renewed(held=True, retaken=True)
            except IntegrityError:
                continue  # created meanwhile: decide on that row
        raise StoreUnavailable(self.alias, f"lock {key.key!r} changed hands 5 times in a row")
