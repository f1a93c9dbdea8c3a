"""The database store: the ``JobLock`` model, with "must create" semantics.

PostgreSQL and SQLite acquire and start in one statement (``INSERT … ON CONFLICT … DO UPDATE …
RETURNING``) and renew a held lock in one ``UPDATE``; other backends (MySQL, MariaDB) lock the
row in a transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import closing
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction

from dedup_jobs import clock
from dedup_jobs.conf import app_settings
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import (
    QUEUED,
    RUNNING,
    Acquired,
    BaseStore,
    DebounceState,
    LockInfo,
    Page,
    Started,
)
from dedup_jobs.stores.database.debounce import DatabaseDebounceMixin
from dedup_jobs.stores.database.flow import DatabaseFlowMixin
from dedup_jobs.stores.database.models import JobLock, PendingDebounce
from dedup_jobs.stores.database.renew import DatabaseRenewMixin
from dedup_jobs.stores.search import Search

UPSERT_VENDORS = ("postgresql", "sqlite")
#: rows read per fetch when the admin searches
SEARCH_CHUNK = 2000

UPSERT = """
INSERT INTO {t} ("key", task_name, ident, owner, state, acquired_at, expires_at, nonce)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT ("key") DO UPDATE SET
  owner = CASE WHEN {cond} THEN EXCLUDED.owner ELSE {t}.owner END,
  state = CASE WHEN {cond} THEN EXCLUDED.state ELSE {t}.state END,
  task_name = CASE WHEN {cond} THEN EXCLUDED.task_name ELSE {t}.task_name END,
  ident = CASE WHEN {cond} THEN EXCLUDED.ident ELSE {t}.ident END,
  acquired_at = CASE WHEN {keep} THEN {t}.acquired_at
                     WHEN {cond} THEN EXCLUDED.acquired_at ELSE {t}.acquired_at END,
  expires_at = CASE WHEN {cond} THEN EXCLUDED.expires_at ELSE {t}.expires_at END,
  nonce = CASE WHEN {keep} AND {t}.nonce = EXCLUDED.nonce THEN {t}.nonce
               WHEN {keep} THEN 'held-' || EXCLUDED.nonce
               WHEN {cond} THEN EXCLUDED.nonce ELSE {t}.nonce END
RETURNING owner, nonce
"""
# One statement: insert, or overwrite the row when it is free (expired) or, for a re-entrant
# acquire / worker start, already ours ({cond}). The per-call nonce tells the outcomes apart:
# returned as sent → taken now (row was free); "held-" + nonce → it was already ours ({keep});
# anything else → another owner holds it, or (worker start, our owner in the row) another
# delivery of the same message runs it: the row's nonce is that delivery's (W5, LIVE).
FREE = "{t}.expires_at <= EXCLUDED.acquired_at"
MINE = "({t}.owner = EXCLUDED.owner AND NOT {t}.expires_at <= EXCLUDED.acquired_at)"
LIVE = (
    "({t}.state = 'running' AND {t}.nonce <> EXCLUDED.nonce"
    " AND {t}.nonce <> 'held-' || EXCLUDED.nonce)"
)


class DatabaseStore(DatabaseFlowMixin, DatabaseRenewMixin, DatabaseDebounceMixin, BaseStore):
    can_list = True

    def __init__(self, alias: str = "database") -> None:
        super().__init__(alias)

    def key_problem(self, key: JobKey) -> str | None:
        """The key and task name must fit their columns (PostgreSQL and MySQL enforce the
        lengths; SQLite would keep them, but a job must not depend on that)."""
        debounce = key.key.startswith(f"{app_settings.KEY_PREFIX}:debounce:")
        model = PendingDebounce if debounce else JobLock
        for value, column in ((key.task_name, "task_name"), (key.key, "key")):
            limit = getattr(model._meta.get_field(column), "max_length", None)
            if limit is not None and len(value) > limit:
                return (
                    f"makes the {column} {len(value)} characters long, more than the "
                    f"{limit} the database store's {model.__name__}.{column} column holds. "
                    f"Use a shorter task name (or DEDUP_JOBS['KEY_PREFIX'])."
                )
        return None

    @property
    def using(self) -> str:
        return app_settings.DATABASE_ALIAS

    def _dt(self, timestamp: float) -> Any:
        return connections[self.using].ops.adapt_datetimefield_value(clock.db_datetime(timestamp))

    def _one_statement(self) -> bool:
        """PostgreSQL, and SQLite from 3.35 (RETURNING), acquire with one upsert."""
        connection = connections[self.using]
        if connection.vendor == "sqlite":
            import sqlite3

            return sqlite3.sqlite_version_info >= (3, 35)
        return connection.vendor in UPSERT_VENDORS

    def _delete_mine(self, key: JobKey, owner: str) -> bool:
        """Compare-and-delete in one raw DELETE: QuerySet.delete() turns into
        select-then-delete-by-pk when any pre/post_delete receiver is connected, and the row
        (and its pk) may pass to a new owner in between."""
        connection = connections[self.using]
        table = connection.ops.quote_name(JobLock._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(f'DELETE FROM {table} WHERE "key" = %s AND owner = %s', [key.key, owner])
            return bool(cursor.rowcount)

    def _upsert(
        self,
        key: JobKey,
        owner: str,
        state: str,
        now: float,
        ttl: float,
        *,
        overwrite_mine: bool,
        keep_acquired_if_mine: bool,
        delivery: str | None = None,
    ) -> tuple[str, str]:
        """Returns (owner now in the row, "taken" | "held" | "live" | "other"). With a
        ``delivery`` (worker start), a row of ours running under another delivery is left as
        it is ("live")."""
        connection = connections[self.using]
        table = connection.ops.quote_name(JobLock._meta.db_table)
        free = FREE.format(t=table)
        mine = MINE.format(t=table)
        if delivery is not None:
            mine = f"({mine} AND NOT {LIVE.format(t=table)})"
        cond = f"({free} OR {mine})" if overwrite_mine else f"({free})"
        keep = mine if keep_acquired_if_mine else "(1 = 0)"
        sql = UPSERT.format(t=table, cond=cond, keep=keep)
        nonce = delivery or uuid.uuid4().hex
        params = [
            key.key,
            key.task_name,
            key.ident,
            owner,
            state,
            self._dt(now),
            self._dt(now + ttl),
            nonce,
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            # fetchall, not fetchone: SQLite holds the write lock until RETURNING is drained.
            ((holder, returned),) = cursor.fetchall()
        outcome = (
            "taken" if returned == nonce
            else "held" if returned == f"held-{nonce}"
            else "live" if delivery is not None and holder == owner
            else "other"
        )
        return str(holder), outcome

    def _guard(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except IntegrityError:
            raise
        except DatabaseError as exc:
            raise StoreUnavailable(self.alias, exc) from exc

    # -- decisions ----------------------------------------------------------------------

    def acquire(
        self, key: JobKey, owner: str, ttl: float, *, now: float, reentrant: bool = False
    ) -> Acquired:
        return self._guard(self._acquire, key, owner, ttl, now, reentrant)  # type: ignore[no-any-return]

    def _acquire(
        self, key: JobKey, owner: str, ttl: float, now: float, reentrant: bool
    ) -> Acquired:
        if self._one_statement():
            holder, outcome = self._upsert(
                key, owner, QUEUED, now, ttl, overwrite_mine=reentrant, keep_acquired_if_mine=False
            )
            return Acquired(acquired=outcome == "taken", holder=holder)
        return self._locked_take(key, owner, QUEUED, now, ttl, reentrant=reentrant)[0]

    def _locked_take(
        self, key: JobKey, owner: str, state: str, now: float, ttl: float, *, reentrant: bool,
        delivery: str | None = None,
    ) -> tuple[Acquired, bool]:
        """Portable path: create, or lock the row and overwrite it when free (or ours, unless
        another ``delivery`` runs it: then the answer is not acquired, with ``owner`` as the
        holder). Returns the answer and whether the row was free before."""
        values = {
            "task_name": key.task_name,
            "ident": key.ident,
            "owner": owner,
            "state": state,
            "acquired_at": clock.db_datetime(now),
            "expires_at": clock.db_datetime(now + ttl),
            "nonce": delivery or uuid.uuid4().hex,
        }
        for _ in range(5):
            try:
                with transaction.atomic(using=self.using):
                    JobLock.objects.using(self.using).create(key=key.key, **values)
                return Acquired(acquired=True, holder=owner), True
            except IntegrityError:
                pass
            with transaction.atomic(using=self.using):
                row = (
                    JobLock.objects.using(self.using)
                    .select_for_update()
                    .filter(key=key.key)
                    .first()
                )
                if row is None:
                    continue
                free = row.expires_at <= clock.db_datetime(now)
                live = (delivery is not None and row.state == RUNNING
                        and row.nonce not in (delivery, f"held-{delivery}"))
                if free or (reentrant and row.owner == owner and not live):
                    if not free and state == RUNNING:
                        values["acquired_at"] = row.acquired_at
                    JobLock.objects.using(self.using).filter(pk=row.pk).update(**values)
                    return Acquired(acquired=True, holder=owner), free
                return Acquired(acquired=False, holder=row.owner), False
        raise StoreUnavailable(self.alias, f"lock {key.key!r} changed hands 5 times in a row")

    def start(
        self, key: JobKey, owner: str, lease: float, *, now: float, release: bool,
        delivery: str | None = None,
    ) -> Started:
        return self._guard(  # type: ignore[no-any-return]
            self._start, key, owner, lease, now, release, delivery or uuid.uuid4().hex)

    def _start(
        self, key: JobKey, owner: str, lease: float, now: float, release: bool, delivery: str
    ) -> Started:
        rows = JobLock.objects.using(self.using)
        if release:
            if self._delete_mine(key, owner):
                return Started(run=True, holder=None, released=True)
            holder = (
                rows.held(clock.db_datetime(now))
                .filter(key=key.key)
                .values_list("owner", flat=True)
                .first()
            )
            if holder is not None and holder != owner:
                return Started(run=False, holder=holder)
            return Started(run=True, holder=None)
        if self._one_statement():
            holder, outcome = self._upsert(
                key, owner, RUNNING, now, lease, overwrite_mine=True, keep_acquired_if_mine=True,
                delivery=delivery,
            )
            if outcome in ("other", "live"):
                return Started(run=False, holder=holder, live=outcome == "live")
            return Started(run=True, holder=None, took=outcome == "taken")
        answer, was_free = self._locked_take(
            key, owner, RUNNING, now, lease, reentrant=True, delivery=delivery)
        if not answer.acquired:
            return Started(run=False, holder=answer.holder, live=answer.holder == owner)
        return Started(run=True, holder=None, took=was_free)

    def release(self, key: JobKey, owner: str) -> bool:
        return self._guard(self._delete_mine, key, owner)  # type: ignore[no-any-return]

    # -- reading ------------------------------------------------------------------------

    def _info(self, row: JobLock) -> LockInfo:
        return LockInfo(
            key=row.key,
            task_name=row.task_name,
            ident=row.ident,
            owner=row.owner,
            state=row.state,
            acquired_at=row.acquired_at.timestamp(),
            expires_at=row.expires_at.timestamp(),
            store=self.alias,
        )

    def get(self, key: JobKey) -> LockInfo | None:
        def read() -> LockInfo | None:
            row = JobLock.objects.using(self.using).held().filter(key=key.key).first()
            return None if row is None else self._info(row)

        return self._guard(read)  # type: ignore[no-any-return]

    def iter_locks(self, *, batch_size: int = 500) -> Iterator[LockInfo]:
        """Every held lock, by primary key, one query per batch (keyset pagination, so
        callers may release as they go)."""
        return self._iter_rows(expired=False, batch_size=batch_size)

    def iter_expired(self, *, batch_size: int = 500) -> Iterator[LockInfo]:
        """Rows whose lock expired: free for the next acquire, left behind until then."""
        return self._iter_rows(expired=True, batch_size=batch_size)

    def _iter_rows(self, *, expired: bool, batch_size: int) -> Iterator[LockInfo]:
        last = 0
        while True:
            def batch(after: int) -> list[JobLock]:
                rows = JobLock.objects.using(self.using)
                rows = rows.expired() if expired else rows.held()
                return list(rows.filter(pk__gt=after).order_by("pk")[:batch_size])

            found: list[JobLock] = self._guard(batch, last)
            if not found:
                return
            last = found[-1].pk
            yield from (self._info(row) for row in found)

    def lock_page(
        self, *, offset: int, limit: int, task_name: str = "", search: str = "", now: float
    ) -> Page[LockInfo]:
        """A count and a slice of the held rows (two indexed queries)."""
        rows = JobLock.objects.using(self.using).held(clock.db_datetime(now))
        return self._page(rows.order_by("expires_at", "pk"), self._info, offset=offset,
                          limit=limit, task_name=task_name, search=search)

    def debounce_page(
        self, *, offset: int, limit: int, task_name: str = "", search: str = "", now: float
    ) -> Page[DebounceState]:
        rows = PendingDebounce.objects.using(self.using).pending(clock.to_datetime(now))
        return self._page(rows.order_by("runs_at", "pk"), self._state, offset=offset,
                          limit=limit, task_name=task_name, search=search)

    def _page(self, rows: Any, parse: Any, *, offset: int, limit: int, task_name: str,
              search: str) -> Page[Any]:
        """Without a search: a count and a slice (two indexed queries). With one: the job
        names and ids streamed in page order, matched in Python as every store matches
        (:mod:`dedup_jobs.stores.search`; SQL ``LIKE`` folds case by the database's rules),
        stopping once the page is full, then the page's rows by primary key."""
        wanted = Search.of(search)

        def read() -> Page[Any]:
            narrowed = rows.filter(task_name=task_name) if task_name else rows
            if wanted is None:
                total = narrowed.count()
                items = [parse(row) for row in narrowed[offset:offset + limit]]
                return Page(items=items, total=total, has_more=offset + limit < total)
            found: list[int] = []
            complete = True
            names = narrowed.values_list("pk", "task_name", "ident")
            with closing(names.iterator(chunk_size=SEARCH_CHUNK)) as stream:
                for pk, name, ident in stream:
                    if wanted.matches(name, ident):
                        found.append(pk)
                        if len(found) > offset + limit:
                            complete = False
                            break
            chosen = found[offset:offset + limit]
            items = [parse(row) for row in narrowed.filter(pk__in=chosen)] if chosen else []
            return Page(items=items, total=len(found) if complete else None,
                        has_more=len(found) > offset + limit)

        return self._guard(read)  # type: ignore[no-any-return]

    def release_queued(self, key: JobKey, owner: str) -> bool:
        """One raw compare-and-delete (see :meth:`_delete_mine`), also refusing a running row."""
        return self._guard(  # type: ignore[no-any-return]
            self._delete_mine_where, key, owner, "state <> %s", RUNNING)

    def release_expired(self, key: JobKey, owner: str, *, now: float) -> bool:
        """Delete the row at ``key`` if ``owner`` still has it and it is still expired."""
        return self._guard(  # type: ignore[no-any-return]
            self._delete_mine_where, key, owner, "expires_at <= %s", self._dt(now))

    def _delete_mine_where(self, key: JobKey, owner: str, condition: str, value: Any) -> bool:
        connection = connections[self.using]
        table = connection.ops.quote_name(JobLock._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f'DELETE FROM {table} WHERE "key" = %s AND owner = %s AND {condition}',
                [key.key, owner, value],
            )
            return bool(cursor.rowcount)
