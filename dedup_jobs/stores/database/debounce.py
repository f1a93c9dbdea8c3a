"""Debounce state in the database store: the ``PendingDebounce`` model.

PostgreSQL, SQLite and MariaDB decide a dispatch in one statement (``INSERT … ON CONFLICT …
DO UPDATE … RETURNING``, MariaDB's ``INSERT … ON DUPLICATE KEY UPDATE … RETURNING``);
PostgreSQL and SQLite claim a due burst in one (``UPDATE … RETURNING``, see below); MySQL and
MariaDB read the upsert's row back in its transaction (MySQL 8) and claim by locking the row;
other databases lock the row in a transaction (:mod:`dedup_jobs.stores.database.portable`).

A claim keeps the claimed burst's row as its claim record (S7): the row moves to
:func:`claim_record_key` (one per message, so a later burst's claim never hides it), with
``count`` 0 (``pending()`` leaves it out) and an expiry CLAIM_RECORD_SECONDS away, so that the
claim made again by the same message (its reply lost) gets the same answer, not "missing".

A row's expiry is the database server's clock (S3); the burst's own times are the
dispatcher's, as its message's countdown is.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, transaction

from dedup_jobs import clock
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import (
    ADOPTED,
    CLAIM_RECORD_SECONDS,
    CLAIMED,
    DUE_TOLERANCE,
    MISSING,
    OTHER,
    WAIT,
    Debounced,
    DebounceState,
    Due,
    decode_call,
    stale_grace,
)
from dedup_jobs.stores.database import statements as sql
from dedup_jobs.stores.database.models import PendingDebounce
from dedup_jobs.stores.database.servertime import ServerNow, server_later, server_now

if TYPE_CHECKING:
    from dedup_jobs.stores.database.host import DatabaseHost as Host
else:
    Host = object


logger = logging.getLogger("dedup_jobs")

#: seconds between two sweeps of expired claim records by one store object, and the most
#: one sweep deletes (a claim leaves one record per burst: they must not pile up)
SWEEP_EVERY = 60.0
SWEEP_BATCH = 1000


def claim_record_key(key: JobKey, message_id: str) -> str:
    """Where the claim of ``message_id``'s burst at ``key`` is kept (S7); hashed when it would
    not fit the key column."""
    name = f"{key.key}:claimed:{message_id}"
    if len(name) <= PendingDebounce._meta.get_field("key").max_length:  # type: ignore[operator]
        return name
    return f"{key.key[:300]}:claimed:{hashlib.sha256(name.encode()).hexdigest()}"


class DatabaseDebounceMixin(Host):
    """The debounce half of :class:`~dedup_jobs.stores.database.store.DatabaseStore`."""


    def _debounce_locked(self, key: JobKey, fresh: dict[str, Any], life: float) -> tuple[str, str]:
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
        to_dt = clock.db_datetime  # aware (UTC) with USE_TZ, naive local without
        fresh = {
            "deadline_ms": self.deadline_ms(),  # S7: the caller's, on the server's clock
            "stale_before": to_dt(now - stale_grace()),  # D9: due before this: stale
            "task_name": key.task_name,
            "ident": key.ident,
            "message_id": task_id,
            "latest_id": task_id,
            "superseded_id": "",
            "payload": payload,
            "count": 1,
            "first_dispatch_at": to_dt(now),
            "last_dispatch_at": to_dt(now),
            "run_at": to_dt(run_at),
            "deadline": None if deadline is None else to_dt(deadline),
            "runs_at": to_dt(run_at if deadline is None else min(run_at, deadline)),
            "absorbed": task_id,
        }
        life = debounce_for + ttl  # the row expires this long after now, by the server's clock
        form = sql.dialect(connections[self.using])
        if form is not None:
            message, absorbed = self._guard(self._debounce_upsert, key, fresh, life, form)
        else:
            message, absorbed = self._guard(self._debounce_locked, key, fresh, life)
        # The dispatch's own answer, also when it was made again (S7: the row left as it is):
        # its burst's message, and the dispatch before it in the burst, which it superseded.
        ids = absorbed.split(",")
        if message == task_id or task_id not in ids:
            return Debounced(new=True, message_id=message)
        at = ids.index(task_id)
        return Debounced(new=False, message_id=message, superseded=ids[at - 1] if at else None)

    def _debounce_upsert(
        self, key: JobKey, v: dict[str, Any], life: float, form: str
    ) -> tuple[str, str]:
        connection = connections[self.using]
        names = sql.names(connection, PendingDebounce._meta.db_table)
        now, no_params = server_now(connection)
        until, until_params = server_later(connection, life)
        assert not no_params, connection.vendor  # the one-statement vendors need none
        template = sql.DEBOUNCE_UPSERT[sql.template(form)]
        statement = template.format(
            columns=sql.DEBOUNCE_COLUMNS.format(**names),
            values=sql.in_time(sql.DEBOUNCE_VALUES.format(until=until), now, form),
            stale=sql.STALE.format(t=names["t"], now=now),
            **names,
        )
        dt = connection.ops.adapt_datetimefield_value
        params = [
            key.key,
            v["task_name"],
            v["ident"],
            v["message_id"],
            v["latest_id"],
            v["payload"],
            dt(v["first_dispatch_at"]),
            dt(v["last_dispatch_at"]),
            dt(v["run_at"]),
            None if v["deadline"] is None else dt(v["deadline"]),
            dt(v["runs_at"]),
            *until_params,
            v["absorbed"],
            self._deadline_param(v["deadline_ms"]),
            *[dt(v["stale_before"])] * template.count("{stale}"),
        ]
        rows = sql.decide(connection, form, statement, params, names=names, key=key.key,
                          result=sql.DEBOUNCE_RESULT)
        # S7: refused as late, nothing changed (MySQL 8 reads back the row as it was)
        if not rows or v["latest_id"] not in str(rows[0][1]).split(","):
            raise self._refused(v["deadline_ms"])
        ((message, absorbed),) = rows
        return str(message), str(absorbed)

    def claim_due(self, key: JobKey, message_id: str, *, now: float) -> Due:
        due: Due = self._guard(self._claim, key, message_id, now)
        if due.action == CLAIMED:
            self._sweep_claim_records()
        return due

    #: when this store object last swept expired claim records (monotonic seconds)
    _swept: float | None = None

    def _sweep_claim_records(self) -> None:
        """Delete up to SWEEP_BATCH expired claim records, at most once per SWEEP_EVERY
        seconds per store object (the first a while after it is made), off the claim's own
        statement. A failure is only logged: the claim was made, the next sweep tries."""
        moment = time.monotonic()
        if self._swept is None:
            self._swept = moment
        if moment - self._swept < SWEEP_EVERY:
            return
        self._swept = moment
        rows = PendingDebounce.objects.using(self.using).filter(
            count=0, expires_at__lte=ServerNow())
        try:
            pks = list(rows.order_by("expires_at").values_list("pk", flat=True)[:SWEEP_BATCH])
            if pks:
                rows.filter(pk__in=pks).delete()
        except DatabaseError as exc:
            logger.debug("store %r: sweeping claim records failed: %s", self.alias, exc)

    def _claim(self, key: JobKey, message_id: str, now: float) -> Due:
        connection = connections[self.using]
        rows = PendingDebounce.objects.using(self.using)
        limit = now + DUE_TOLERANCE
        record_key = claim_record_key(key, message_id)
        if sql.dialect(connection) == "on_conflict":  # UPDATE … RETURNING
            names = sql.names(connection, PendingDebounce._meta.db_table)
            until, until_params = server_later(connection, CLAIM_RECORD_SECONDS)
            with connection.cursor() as cursor:
                due = connection.ops.adapt_datetimefield_value(clock.db_datetime(limit))
                cursor.execute(sql.CLAIM_MOVE.format(until=until, **names),
                               [record_key, *until_params, key.key, message_id, due])
                claimed = cursor.fetchall()
            if claimed:
                return _claimed(*claimed[0])
            row = rows.filter(key=key.key).only("message_id", "runs_at", "absorbed").first()
        else:
            with transaction.atomic(using=self.using):
                row = rows.select_for_update().filter(key=key.key).first()
                if (
                    row is not None
                    and row.message_id == message_id
                    and row.runs_at <= clock.db_datetime(limit)
                ):
                    rows.filter(pk=row.pk).update(key=record_key, count=0,
                                                  expires_at=ServerNow(CLAIM_RECORD_SECONDS))
                    return _claimed(row.latest_id, row.payload, row.absorbed)
        if row is None or row.message_id != message_id:
            # S7: this claim made again (its reply lost): the first claim's answer
            record = rows.filter(key=record_key, message_id=message_id, count=0,
                                 expires_at__gt=ServerNow()).first()
            if record is not None:
                return _claimed(record.latest_id, record.payload, record.absorbed)
        if row is None:
            return Due(action=MISSING)
        if row.message_id != message_id:
            adopted = message_id in row.absorbed.split(",")
            return Due(action=ADOPTED if adopted else OTHER)
        return Due(action=WAIT, wait_until=row.runs_at.timestamp())

    def withdraw(self, key: JobKey, task_id: str) -> bool:
        return self._guard(self._withdraw, key, task_id)

    def _withdraw(self, key: JobKey, task_id: str) -> bool:
        """S7: an undo, off the dispatch path: the row, locked, then its update."""
        rows = PendingDebounce.objects.using(self.using)
        with transaction.atomic(using=self.using):
            row = rows.select_for_update().filter(key=key.key).first()
            ids = [] if row is None else row.absorbed.split(",")
            if row is None or row.message_id == task_id or task_id not in ids:
                return False
            changes: dict[str, Any] = {"absorbed": ",".join(i for i in ids if i != task_id)}
            if row.latest_id == task_id and row.superseded_id:
                changes.update(latest_id=row.superseded_id, payload=row.previous_payload,
                               previous_payload="")
            rows.filter(pk=row.pk).update(**changes)
            return True

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

        return self._guard(read)

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
