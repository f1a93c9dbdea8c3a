"""Debounce state in the database store: the ``PendingDebounce`` model.

PostgreSQL and SQLite decide a dispatch in one statement (``INSERT … ON CONFLICT … DO UPDATE
… RETURNING``) and claim a due burst in one (``DELETE … RETURNING``); other backends (MySQL,
MariaDB) lock the row in a transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import IntegrityError, connections, transaction

from dedup_jobs import clock
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import (
    CLAIMED,
    DUE_TOLERANCE,
    MISSING,
    OTHER,
    WAIT,
    Debounced,
    DebounceState,
    Due,
    decode_call,
)
from dedup_jobs.stores.database.models import PendingDebounce

UPSERT_VENDORS = ("postgresql", "sqlite")

# One dispatch. A row that expired ({stale}) is a burst whose message is long gone: start over.
# Returns the burst's message id and the dispatch it superseded ("" when it started a burst).
DEBOUNCE_UPSERT = """
INSERT INTO {t} ("key", task_name, ident, message_id, latest_id, superseded_id, payload, count,
                 first_dispatch_at, last_dispatch_at, run_at, deadline, runs_at, expires_at,
                 absorbed)
VALUES (%s, %s, %s, %s, %s, '', %s, 1, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT ("key") DO UPDATE SET
  message_id = CASE WHEN {stale} THEN EXCLUDED.message_id ELSE {t}.message_id END,
  superseded_id = CASE WHEN {stale} THEN '' ELSE {t}.latest_id END,
  latest_id = EXCLUDED.latest_id,
  payload = EXCLUDED.payload,
  count = CASE WHEN {stale} THEN 1 ELSE {t}.count + 1 END,
  task_name = EXCLUDED.task_name,
  ident = EXCLUDED.ident,
  first_dispatch_at = CASE WHEN {stale} THEN EXCLUDED.first_dispatch_at
                           ELSE {t}.first_dispatch_at END,
  last_dispatch_at = EXCLUDED.last_dispatch_at,
  run_at = EXCLUDED.run_at,
  deadline = CASE WHEN {stale} THEN EXCLUDED.deadline ELSE {t}.deadline END,
  runs_at = CASE WHEN {stale} THEN EXCLUDED.runs_at
                 WHEN {t}.deadline IS NOT NULL AND {t}.deadline < EXCLUDED.run_at
                 THEN {t}.deadline ELSE EXCLUDED.run_at END,
  expires_at = EXCLUDED.expires_at,
  absorbed = CASE WHEN {stale} THEN EXCLUDED.absorbed
                  ELSE {t}.absorbed || ',' || EXCLUDED.absorbed END
RETURNING message_id, superseded_id
"""
STALE = "{t}.expires_at <= EXCLUDED.last_dispatch_at"

# Claim a due burst of this message: the row goes, its latest arguments and ids come back.
CLAIM_DELETE = """
DELETE FROM {t} WHERE "key" = %s AND message_id = %s AND runs_at <= %s
RETURNING latest_id, payload, absorbed
"""


class DatabaseDebounceMixin:
    """The debounce half of :class:`~dedup_jobs.stores.database.store.DatabaseStore`."""

    alias: str

    @property
    def using(self) -> str:
        raise NotImplementedError

    def _dt(self, timestamp: float) -> Any:
        raise NotImplementedError

    def _guard(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def debounce(
        self,
        key: JobKey,
        task_id: str,
        payload: str,
        *,
        now: float,
        debounce_for: float,
        max_wait: float | None,
        ttl: float,
    ) -> Debounced:
        run_at = now + debounce_for
        deadline = None if max_wait is None else now + max_wait
        runs_at = run_at if deadline is None else min(run_at, deadline)
        values = {
            "task_name": key.task_name,
            "ident": key.ident,
            "message_id": task_id,
            "latest_id": task_id,
            "payload": payload,
            "first": now,
            "last": now,
            "run_at": run_at,
            "deadline": deadline,
            "runs_at": runs_at,
            "expires_at": run_at + ttl,
            "absorbed": task_id,
        }
        if connections[self.using].vendor in UPSERT_VENDORS:
            message, superseded = self._guard(self._debounce_upsert, key, values)
        else:
            message, superseded = self._guard(self._debounce_locked, key, values)
        return Debounced(new=not superseded, message_id=message, superseded=superseded or None)

    def _debounce_upsert(self, key: JobKey, v: dict[str, Any]) -> tuple[str, str]:
        connection = connections[self.using]
        table = connection.ops.quote_name(PendingDebounce._meta.db_table)
        sql = DEBOUNCE_UPSERT.format(t=table, stale=STALE.format(t=table))
        dt = self._dt
        params = [
            key.key,
            v["task_name"],
            v["ident"],
            v["message_id"],
            v["latest_id"],
            v["payload"],
            dt(v["first"]),
            dt(v["last"]),
            dt(v["run_at"]),
            None if v["deadline"] is None else dt(v["deadline"]),
            dt(v["runs_at"]),
            dt(v["expires_at"]),
            v["absorbed"],
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            ((message, superseded),) = cursor.fetchall()
        return str(message), str(superseded or "")

    def _debounce_locked(self, key: JobKey, v: dict[str, Any]) -> tuple[str, str]:
        """Portable path: create the row, or lock it and absorb the dispatch."""
        rows = PendingDebounce.objects.using(self.using)
        to_dt = clock.to_datetime
        fresh = {
            "task_name": v["task_name"],
            "ident": v["ident"],
            "message_id": v["message_id"],
            "latest_id": v["latest_id"],
            "superseded_id": "",
            "payload": v["payload"],
            "count": 1,
            "first_dispatch_at": to_dt(v["first"]),
            "last_dispatch_at": to_dt(v["last"]),
            "run_at": to_dt(v["run_at"]),
            "deadline": None if v["deadline"] is None else to_dt(v["deadline"]),
            "runs_at": to_dt(v["runs_at"]),
            "expires_at": to_dt(v["expires_at"]),
            "absorbed": v["absorbed"],
        }
        for _ in range(5):
            with transaction.atomic(using=self.using):
                row = rows.select_for_update().filter(key=key.key).first()
                if row is None:
                    try:
                        with transaction.atomic(using=self.using):
                            rows.create(key=key.key, **fresh)
                        return v["message_id"], ""
                    except IntegrityError:
                        continue
                if row.expires_at <= fresh["last_dispatch_at"]:
                    rows.filter(pk=row.pk).update(**fresh)
                    return v["message_id"], ""
                run_at = fresh["run_at"]
                rows.filter(pk=row.pk).update(
                    superseded_id=row.latest_id,
                    latest_id=v["latest_id"],
                    payload=v["payload"],
                    count=row.count + 1,
                    last_dispatch_at=fresh["last_dispatch_at"],
                    run_at=run_at,
                    runs_at=run_at if row.deadline is None else min(run_at, row.deadline),
                    expires_at=fresh["expires_at"],
                    absorbed=f"{row.absorbed},{v['latest_id']}",
                )
                return row.message_id, row.latest_id
        return v["message_id"], ""  # the row kept flapping: publish (fail open)

    def claim_due(self, key: JobKey, message_id: str, *, now: float) -> Due:
        return self._guard(self._claim, key, message_id, now)  # type: ignore[no-any-return]

    def _claim(self, key: JobKey, message_id: str, now: float) -> Due:
        connection = connections[self.using]
        rows = PendingDebounce.objects.using(self.using)
        limit = now + DUE_TOLERANCE
        if connection.vendor in UPSERT_VENDORS:
            table = connection.ops.quote_name(PendingDebounce._meta.db_table)
            with connection.cursor() as cursor:
                cursor.execute(CLAIM_DELETE.format(t=table), [key.key, message_id, self._dt(limit)])
                claimed = cursor.fetchall()
            if claimed:
                return _claimed(*claimed[0])
            row = rows.filter(key=key.key).only("message_id", "runs_at").first()
        else:
            with transaction.atomic(using=self.using):
                row = rows.select_for_update().filter(key=key.key).first()
                if (
                    row is not None
                    and row.message_id == message_id
                    and row.runs_at <= clock.to_datetime(limit)
                ):
                    rows.filter(pk=row.pk).delete()
                    return _claimed(row.latest_id, row.payload, row.absorbed)
        if row is None:
            return Due(action=MISSING)
        if row.message_id != message_id:
            return Due(action=OTHER)
        return Due(action=WAIT, wait_until=row.runs_at.timestamp())

    def _state(self, row: PendingDebounce) -> DebounceState:
        args, kwargs = decode_call(row.payload)
        return DebounceState(
            key=row.key,
            task_name=row.task_name,
            ident=row.ident,
            count=row.count,
            first_dispatch_at=row.first_dispatch_at.timestamp(),
            last_dispatch_at=row.last_dispatch_at.timestamp(),
            runs_at=row.runs_at.timestamp(),
            deadline=None if row.deadline is None else row.deadline.timestamp(),
            message_id=row.message_id,
            latest_id=row.latest_id,
            args=args,
            kwargs=kwargs,
            store=self.alias,
        )

    def get_debounce(self, key: JobKey) -> DebounceState | None:
        def read() -> DebounceState | None:
            row = PendingDebounce.objects.using(self.using).pending().filter(key=key.key).first()
            return None if row is None else self._state(row)

        return self._guard(read)  # type: ignore[no-any-return]

    def iter_debounces(self, *, batch_size: int = 500) -> Iterator[DebounceState]:
        rows = PendingDebounce.objects.using(self.using).pending().order_by("runs_at", "pk")
        for row in rows.iterator(chunk_size=batch_size):
            yield self._state(row)


def _claimed(latest_id: str, payload: str, absorbed: str) -> Due:
    args, kwargs = decode_call(payload)
    return Due(
        action=CLAIMED,
        latest_id=str(latest_id),
        args=args,
        kwargs=kwargs,
        absorbed=tuple(i for i in str(absorbed).split(",") if i),
    )
