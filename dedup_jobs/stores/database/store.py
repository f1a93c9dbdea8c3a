"""The database store: the ``JobLock`` model, with "must create" semantics.

PostgreSQL and SQLite acquire and start in one statement (``INSERT … ON CONFLICT … DO UPDATE …
RETURNING``), MariaDB in one too (``INSERT … ON DUPLICATE KEY UPDATE … RETURNING``), MySQL 8 in
that upsert and a read of its row in one transaction, and all renew a held lock in one
``UPDATE`` (:mod:`dedup_jobs.stores.database.statements`); other databases lock the row in a
transaction (:mod:`dedup_jobs.stores.database.portable`). Every expiry is the database
server's clock, in the statement that decides (:mod:`dedup_jobs.stores.database.servertime`):
the ``now`` the callers pass is not used for locks (S3).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from django.db import DatabaseError, IntegrityError, connections

from dedup_jobs import clock
from dedup_jobs.conf import app_settings
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import (
    QUEUED,
    RUNNING,
    Acquired,
    BaseStore,
    Renewed,
    Started,
)
from dedup_jobs.stores.database import statements as sql
from dedup_jobs.stores.database.debounce import DatabaseDebounceMixin
from dedup_jobs.stores.database.flow import DatabaseFlowMixin, cancel_of, was_replaced
from dedup_jobs.stores.database.listing import DatabaseReadingMixin
from dedup_jobs.stores.database.models import JobLock, PendingDebounce
from dedup_jobs.stores.database.portable import RowLockingMixin
from dedup_jobs.stores.database.servertime import server_epoch, server_later, server_now
from dedup_jobs.stores.database.throttle import DatabaseThrottleMixin
from dedup_jobs.stores.retry import AGAIN, Again, decide

logger = logging.getLogger("dedup_jobs")

#: times a decision that lost a deadlock is tried (InnoDB rolled it back whole: nothing stays)
DEADLOCK_TRIES = 5


def _deadlock(exc: DatabaseError) -> bool:
    """MySQL/MariaDB's ER_LOCK_DEADLOCK (1213), PostgreSQL's deadlock_detected (40P01)."""
    cause = exc.__cause__
    return bool(exc.args and exc.args[0] == 1213) or getattr(cause, "sqlstate", None) == "40P01"


class DatabaseStore(DatabaseThrottleMixin, DatabaseFlowMixin, RowLockingMixin,
                    DatabaseDebounceMixin, DatabaseReadingMixin, BaseStore):
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

    def _dialect(self) -> str | None:
        return sql.dialect(connections[self.using])

    def _names(self) -> dict[str, str]:
        return sql.names(connections[self.using], JobLock._meta.db_table)

    def _delete_mine(self, key: JobKey, owner: str) -> bool:
        """Compare-and-delete in one raw DELETE: QuerySet.delete() turns into
        select-then-delete-by-pk when any pre/post_delete receiver is connected, and the row
        (and its pk) may pass to a new owner in between."""
        return self._delete_mine_where(key, owner, "1 = 1", [])

    def _delete_mine_where(
        self, key: JobKey, owner: str, condition: str, params: list[Any]
    ) -> bool:
        names = self._names()
        with connections[self.using].cursor() as cursor:
            cursor.execute(
                "DELETE FROM {t} WHERE {k} = %s AND owner = %s AND ".format(**names) + condition,
                [key.key, owner, *params],
            )
            return bool(cursor.rowcount)

    def _deadline_param(self, deadline_ms: int) -> Any:
        """The caller's deadline as the statements compare it with the server's now."""
        connection = connections[self.using]
        return connection.ops.adapt_datetimefield_value(clock.db_datetime(deadline_ms / 1000))

    def _refused(self, deadline_ms: int) -> StoreUnavailable:
        """S7: a dispatch statement refused as late (it changed nothing). Answered while the
        caller's clock says it is in time: the server's clock is ahead; learn by how much,
        so that the caller's next try carries a deadline the server reads right."""
        mine = time.time() * 1000
        if mine <= deadline_ms:
            server = server_epoch(connections[self.using]) * 1000
            self.skew_ms = max(self.skew_ms, int(server - mine) + 1)
        return self.late(deadline_ms)

    def _take(
        self, key: JobKey, owner: str, state: str, ttl: float, *, overwrite_mine: bool,
        keep_acquired_if_mine: bool, delivery: str | None = None, deadline: int | None = None,
        request: str | None = None,
    ) -> tuple[str, str, str]:
        """Returns (owner now in the row, "taken" | "held" | "live" | "other", the row's
        take-over chain: ``JobLock.chain``). With a
        ``delivery`` (worker start), a row of ours running under another delivery is left as
        it is ("live"). With a ``deadline`` (epoch ms, a dispatch), a statement the server
        runs past it changes nothing and raises StoreUnavailable (S7). A ``request`` (a
        dispatch's) is the row's nonce: the same request made again answers "taken" (S7)."""
        form = self._dialect()
        if form is None:
            return self._locked_take(key, owner, state, ttl, overwrite_mine=overwrite_mine,
                                     keep_acquired_if_mine=keep_acquired_if_mine,
                                     delivery=delivery, deadline=deadline, request=request)
        connection = connections[self.using]
        names = self._names()
        t, text = names["t"], sql.template(form)
        free = sql.FREE[text].format(t=t)
        mine = sql.MINE[text].format(t=t)
        if delivery is not None:
            mine = f"({mine} AND NOT {sql.LIVE[text].format(t=t)})"
        cond = f"({free} OR {mine})" if overwrite_mine else f"({free})"
        keep = mine if keep_acquired_if_mine else "(1 = 0)"
        now, now_params = server_now(connection)
        until, until_params = server_later(connection, ttl)
        values = sql.LOCK_VALUES.format(now=now, until=until)
        if deadline is not None:
            values = sql.in_time(values, now, form)
        statement = sql.UPSERT[text].format(
            columns=sql.LOCK_COLUMNS.format(**names), values=values,
            cond=cond, keep=keep, free=free, **names,
        )
        nonce = delivery or request or uuid.uuid4().hex
        params = [key.key, key.task_name, key.ident, owner, state, *now_params, *until_params,
                  nonce]
        if deadline is not None:
            params += [*now_params, self._deadline_param(deadline)]
        rows = sql.decide(connection, form, statement, params, names=names, key=key.key,
                          result=sql.LOCK_RESULT)
        if not rows and deadline is not None:
            raise self._refused(deadline)
        ((holder, returned, chain),) = rows
        outcome = (
            "taken" if returned == nonce
            else "held" if returned == f"held-{nonce}"
            else "live" if delivery is not None and holder == owner
            else "other"
        )
        return str(holder), outcome, str(chain or "")

    def _dispatch(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        """S7: a decision that carries the caller's deadline (``func`` takes ``deadline``,
        epoch ms on the server's clock): a dispatch's, a worker check's, a renewal's
        take-back; through :meth:`_guard`. Refused as late while the caller was in
        time, the server's clock runs ahead: tried once more with the skew learnt."""
        for attempt in (1, 2):
            skew = self.skew_ms
            try:
                return self._guard(func, *args, deadline=self.deadline_ms(), **kwargs)
            except StoreUnavailable:
                if attempt == 2 or self.skew_ms == skew:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _guard(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one decision; a database error is StoreUnavailable. A decision that lost a
        deadlock (rolled back whole) is run again, unless it ran inside the caller's own
        transaction (rolled back with it: the caller must see the error)."""
        for attempt in range(1, DEADLOCK_TRIES + 1):
            try:
                return func(*args, **kwargs)
            except IntegrityError:
                raise
            except DatabaseError as exc:
                retry = (_deadlock(exc) and attempt < DEADLOCK_TRIES
                         and not connections[self.using].in_atomic_block)
                if not retry:
                    raise StoreUnavailable(self.alias, exc) from exc
                logger.debug("store %r: deadlock, deciding again (attempt %d): %s",
                             self.alias, attempt + 1, exc)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- decisions ----------------------------------------------------------------------

    def acquire(
        self, key: JobKey, owner: str, ttl: float, *, now: float, reentrant: bool = False,
        request: str | None = None,
    ) -> Acquired:
        holder, outcome, _chain = self._dispatch(self._take, key, owner, QUEUED, ttl,
                                         overwrite_mine=reentrant, keep_acquired_if_mine=False,
                                         request=request if request and len(request) <= 40
                                         else None)
        return Acquired(acquired=outcome == "taken", holder=holder)

    def start(
        self, key: JobKey, owner: str, lease: float, *, now: float, release: bool,
        delivery: str | None = None, redelivered: bool = False,
    ) -> Started:
        return self._dispatch(  # type: ignore[no-any-return]
            self._start, key, owner, lease, release, delivery or uuid.uuid4().hex)

    def _start(
        self, key: JobKey, owner: str, lease: float, release: bool, delivery: str, *,
        deadline: int,
    ) -> Started:
        """S7: the check carries the worker's deadline (W4 ran the body, W7 deferred it by
        then): past it, it releases and takes nothing (StoreUnavailable); its re-send does."""
        if release:
            now, now_params = server_now(connections[self.using])
            if self._delete_mine_where(key, owner, f"{now} <= %s",
                                       [*now_params, self._deadline_param(deadline)]):
                return Started(run=True, holder=None, released=True)
            holder = (
                JobLock.objects.using(self.using).held()
                .filter(key=key.key)
                .values_list("owner", flat=True)
                .first()
            )
            if holder == owner:  # ours, not deleted: past the deadline
                raise self._refused(deadline)
            if holder is not None:
                return Started(run=False, holder=holder,
                               taken_over=self._taken_over(key, holder, owner))
            return Started(run=True, holder=None)
        holder, outcome, chain = self._take(key, owner, RUNNING, lease, overwrite_mine=True,
                                            keep_acquired_if_mine=True, delivery=delivery,
                                            deadline=deadline)
        if outcome == "other":
            taken_over = (self._taken_over(key, holder, owner) if was_replaced(chain, owner)
                          else None)
            return Started(run=False, holder=holder, taken_over=taken_over)
        if outcome == "live":
            return Started(run=False, holder=holder, live=True)
        return Started(run=True, holder=None, took=outcome == "taken")

    def release(self, key: JobKey, owner: str) -> bool:
        return self._guard(self._release_lock, key, owner)  # type: ignore[no-any-return]

    def _release_lock(self, key: JobKey, owner: str) -> bool:
        """One UPDATE (statements.RELEASE): True also to the same release made again (S7)."""
        connection = connections[self.using]
        now, now_params = server_now(connection)
        ago, ago_params = server_later(connection, -(2 * app_settings.STORE_TIMEOUT + 1))
        with connection.cursor() as cursor:
            cursor.execute(sql.RELEASE.format(now=now, ago=ago, **self._names()),
                           [*now_params, key.key, owner, *now_params, *ago_params])
            return bool(cursor.rowcount)

    def renew(
        self, key: JobKey, owner: str, ttl: float, *, now: float, delivery: str | None = None
    ) -> Renewed:
        nonce = f"held-{delivery}" if delivery else uuid.uuid4().hex
        form = self._dialect()
        if form is None:
            return self._dispatch(self._locked_renew, key, owner, ttl, nonce)  # type: ignore[no-any-return]
        return self._dispatch(self._renew, key, owner, ttl, nonce, form)  # type: ignore[no-any-return]

    def _renew(self, key: JobKey, owner: str, ttl: float, nonce: str, form: str, *,
               deadline: int) -> Renewed:
        """Extend the caller's row (one UPDATE, the usual case); if it is not held by the
        caller, take it if free (one upsert); else name the holder (the upsert's row on
        MariaDB and MySQL, one SELECT on PostgreSQL and SQLite). Each statement is atomic; a
        row that changed hands in between is decided again. S7: the take-back carries the
        caller's deadline (a late one takes nothing: the run may have ended and released).
        L2: the usual UPDATE leaves a row with a request to stop alone; the caller's row found
        held that way is extended by a second UPDATE, the request read (a stale one, naming
        an earlier run, cleared)."""
        connection = connections[self.using]
        names = self._names()
        now, now_params = server_now(connection)
        until, until_params = server_later(connection, ttl)
        extend = sql.EXTEND_UNASKED.format(now=now, until=until, **names)
        text = sql.template(form)
        take = sql.TAKE_FREE[text].format(
            columns=sql.LOCK_COLUMNS.format(**names),
            values=sql.in_time(sql.LOCK_VALUES.format(now=now, until=until), now, form),
            free=sql.FREE[text].format(t=names["t"]), **names,
        )
        held = "SELECT owner, cancel FROM {t} WHERE {k} = %s AND expires_at > {now}".format(
            now=now, **names)
        with connection.cursor() as cursor:

            def attempt() -> Renewed | Again:
                cursor.execute(extend, [*until_params, *until_params, key.key, owner,
                                        *now_params])
                if cursor.rowcount:
                    return Renewed(held=True)
                rows = sql.decide(connection, form, take, [
                    key.key, key.task_name, key.ident, owner, RUNNING, *now_params,
                    *until_params, nonce, *now_params, self._deadline_param(deadline),
                ], names=names, key=key.key, result=sql.LOCK_RESULT)
                if rows and tuple(rows[0][:2]) == (owner, nonce):
                    return Renewed(held=True, retaken=True)
                # ON DUPLICATE KEY: the row it left alone, held
                holder, asked = (rows[0][0], None) if rows else (None, None)
                if holder is None or holder == owner:
                    cursor.execute(held, [key.key, *now_params])
                    row = cursor.fetchone()
                    holder, asked = (None, None) if row is None else row
                if holder == owner:  # L2: held, and asked to stop (or a stale request)
                    cancel = cancel_of(asked, owner)
                    again = sql.EXTEND if cancel else sql.EXTEND_CLEARED
                    cursor.execute(again.format(now=now, until=until, **names), [
                        *until_params, *until_params, key.key, owner, *now_params])
                    return Renewed(held=True, cancel=cancel) if cursor.rowcount else AGAIN
                if holder is not None:
                    return Renewed(held=False, holder=str(holder))
                if self._server_past(deadline):  # free, not taken back: late (S7)
                    raise self._refused(deadline)
                return AGAIN  # changed hands in between: decide again

            return decide(self.alias, key.key, attempt)

    def release_queued(self, key: JobKey, owner: str) -> bool:
        """One raw compare-and-delete (see :meth:`_delete_mine`), also refusing a running row."""
        return self._guard(  # type: ignore[no-any-return]
            self._delete_mine_where, key, owner, "state <> %s", [RUNNING])

    def release_expired(self, key: JobKey, owner: str, *, now: float) -> bool:
        """Delete the row at ``key`` if ``owner`` still has it and it is still expired (by
        the server's clock)."""
        now_sql, params = server_now(connections[self.using])
        return self._guard(  # type: ignore[no-any-return]
            self._delete_mine_where, key, owner, f"expires_at <= {now_sql}", params)
