"""The database store's row-locking path, for databases without a one-statement form (MySQL 8,
which has no ``RETURNING``; SQLite before 3.35; MariaDB before 10.5; others).

Each decision creates the row in a transaction of its own ("must create": ``IntegrityError``
when it exists), or locks the existing row (``SELECT … FOR UPDATE``, read together with the
server's clock) and decides on it. The insert never runs in the transaction that locked
(nothing): under InnoDB's REPEATABLE READ a ``FOR UPDATE`` read of a missing key takes a gap
lock, and two such transactions inserting the same key deadlock. A deadlock that happens all
the same is retried by the store's guard.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction

from dedup_jobs import clock
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import RUNNING, Renewed
from dedup_jobs.stores.database.flow import cancel_of
from dedup_jobs.stores.database.models import JobLock, PendingDebounce
from dedup_jobs.stores.database.servertime import ServerNow, server_epoch
from dedup_jobs.stores.retry import AGAIN, ATTEMPTS, Again, decide

if TYPE_CHECKING:
    from dedup_jobs.stores.database.host import DatabaseHost as Host
else:
    Host = object


class RowLockingMixin(Host):
    """The row-locking half of :class:`~dedup_jobs.stores.database.store.DatabaseStore`."""


    def _locked_take(
        self, key: JobKey, owner: str, state: str, ttl: float, *, overwrite_mine: bool,
        keep_acquired_if_mine: bool, delivery: str | None = None, deadline: int | None = None,
        request: str | None = None,
    ) -> tuple[str, str, str]:
        """As the one-statement upsert: (owner now in the row, "taken" | "held" | "live" |
        "other", its take-over chain); with a ``deadline``, nothing written once the server's
        now is past it."""
        rows = JobLock.objects.using(self.using)
        nonce = delivery or request or uuid.uuid4().hex
        values: dict[str, Any] = {
            "task_name": key.task_name, "ident": key.ident, "owner": owner, "state": state,
            "acquired_at": ServerNow(), "expires_at": ServerNow(ttl), "nonce": nonce,
            "chain": "",
        }
        late = None if deadline is None else clock.db_datetime(deadline / 1000)

        def attempt() -> tuple[str, str, str] | Again:
            try:
                with transaction.atomic(using=self.using):
                    if deadline is not None and self._server_past(deadline):
                        raise self._refused(deadline)  # S7: a late dispatch takes nothing
                    rows.create(key=key.key, **values)
                return owner, "taken", ""
            except IntegrityError:
                pass
            with transaction.atomic(using=self.using):
                row = rows.select_for_update().annotate(server_now=ServerNow()).filter(
                    key=key.key).first()
                if row is None:
                    return AGAIN  # released in between: create it again
                free = row.expires_at <= row.server_now  # type: ignore[attr-defined]
                live = (delivery is not None and row.state == RUNNING
                        and row.nonce not in (nonce, f"held-{nonce}"))
                mine = row.owner == owner and not free and not live
                if mine and request and row.nonce == request:
                    return owner, "taken", row.chain  # this request made again (S7)
                if not (free or (overwrite_mine and mine)):
                    return (row.owner, "live" if live and row.owner == owner else "other",
                            row.chain)
                if (late is not None and deadline is not None
                        and row.server_now > late):  # type: ignore[attr-defined]
                    raise self._refused(deadline)
                update = dict(values)
                if not free:  # ours: a re-entrant acquire or a worker start keeps the chain
                    update["chain"] = row.chain
                if mine and keep_acquired_if_mine:
                    update["acquired_at"] = row.acquired_at
                    update["nonce"] = nonce if row.nonce == nonce else f"held-{nonce}"
                rows.filter(pk=row.pk).update(**update)
                return owner, "taken" if update["nonce"] == nonce else "held", update["chain"]

        return decide(self.alias, key.key, attempt)

    def _server_past(self, deadline: int) -> bool:
        """The server's now is past ``deadline`` (epoch ms; read in the caller's transaction)."""
        return server_epoch(connections[self.using]) * 1000 > deadline

    def _locked_renew(self, key: JobKey, owner: str, ttl: float, nonce: str, *,
                      deadline: int) -> Renewed:
        """Extend the caller's held lock (never shorten it), take a free or expired key, or
        report the other owner. S7: past the caller's ``deadline`` (the server's clock), the
        take-back writes nothing (the run may have ended and released)."""
        rows = JobLock.objects.using(self.using)
        values: dict[str, Any] = {
            "task_name": key.task_name, "ident": key.ident, "owner": owner, "state": RUNNING,
            "acquired_at": ServerNow(), "expires_at": ServerNow(ttl), "nonce": nonce,
            "chain": "",
        }
        late = clock.db_datetime(deadline / 1000)

        def attempt() -> Renewed | Again:
            with transaction.atomic(using=self.using):
                row = rows.select_for_update().annotate(server_now=ServerNow()).filter(
                    key=key.key).first()
                if row is not None:
                    if row.expires_at <= row.server_now:  # type: ignore[attr-defined]
                        if row.server_now > late:  # type: ignore[attr-defined]
                            raise self._refused(deadline)
                        rows.filter(pk=row.pk).update(**values)
                        return Renewed(held=True, retaken=True)
                    if row.owner != owner:
                        return Renewed(held=False, holder=row.owner)
                    rows.filter(pk=row.pk, expires_at__lt=ServerNow(ttl)).update(
                        expires_at=ServerNow(ttl))
                    return Renewed(held=True, cancel=cancel_of(row.cancel, owner))
            try:
                with transaction.atomic(using=self.using):
                    if self._server_past(deadline):
                        raise self._refused(deadline)
                    rows.create(key=key.key, **values)
                return Renewed(held=True, retaken=True)
            except IntegrityError:
                return AGAIN  # created meanwhile: decide on that row

        return decide(self.alias, key.key, attempt)

    def _debounce_locked(self, key: JobKey, fresh: dict[str, Any], life: float) -> tuple[str, str]:
        """Absorb the dispatch into the locked row, start over on an expired one (by the
        server's clock), or create the row: (the burst's message id, its dispatch ids). A
        dispatch in the row already (made again, S7) changes nothing; past the caller's
        deadline (on the server's clock) nothing is written."""
        rows = PendingDebounce.objects.using(self.using)
        stale_before, deadline = fresh["stale_before"], fresh["deadline_ms"]
        fresh = {name: value for name, value in fresh.items()
                 if name not in ("stale_before", "deadline_ms")}
        fresh["expires_at"] = ServerNow(life)
        # the shared limit, not decide(): a row that kept changing fails open, not unavailable
        for _ in range(ATTEMPTS):
            with transaction.atomic(using=self.using):
                row = rows.select_for_update().annotate(server_now=ServerNow()).filter(
                    key=key.key).first()
                if row is not None:
                    if fresh["latest_id"] in row.absorbed.split(","):
                        return row.message_id, row.absorbed  # made again (S7): as it is
                    if row.server_now > clock.db_datetime(deadline / 1000):  # type: ignore[attr-defined]
                        raise self._refused(deadline)  # S7: a late dispatch changes nothing
                    if (row.expires_at <= row.server_now  # type: ignore[attr-defined]
                            or row.runs_at < stale_before):
                        # expired, or stale (D9): start over, adopting the burst's ids
                        absorbed = f"{row.absorbed},{fresh['absorbed']}"
                        rows.filter(pk=row.pk).update(**{**fresh, "absorbed": absorbed,
                                                          "previous_payload": ""})
                        return fresh["message_id"], absorbed
                    run_at = fresh["run_at"]
                    rows.filter(pk=row.pk).update(
                        superseded_id=row.latest_id,
                        latest_id=fresh["latest_id"],
                        previous_payload=row.payload,
                        payload=fresh["payload"],
                        count=row.count + 1,
                        last_dispatch_at=fresh["last_dispatch_at"],
                        run_at=run_at,
                        runs_at=run_at if row.deadline is None else min(run_at, row.deadline),
                        expires_at=fresh["expires_at"],
                        absorbed=f"{row.absorbed},{fresh['latest_id']}",
                    )
                    return row.message_id, f"{row.absorbed},{fresh['latest_id']}"
            try:
                with transaction.atomic(using=self.using):
                    if self._server_past(deadline):
                        raise self._refused(deadline)
                    rows.create(key=key.key, **fresh)
                return fresh["message_id"], fresh["absorbed"]
            except IntegrityError:
                continue  # created meanwhile: absorb into that row
        # the row kept flapping: publish (fail open)
        return fresh["message_id"], fresh["absorbed"]
