"""Throttling on the database store (T2-T5): each admission decision is one transaction that
first locks the throttle key's ``ThrottleKey`` row (an UPDATE: a row lock on PostgreSQL and
MariaDB/MySQL, the write lock on SQLite), so decisions of one key are serialized, then reads
and writes its ``ThrottleEntry`` rows. Times are the database server's clock, read in that
transaction (S3). The rules are those of the Redis script (``stores/redis/throttle_scripts.py``):
concurrency slots are leases; the rate is a sliding window log of starts and reservations."""

from __future__ import annotations

import math
import random
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.db.models import Count, Q

from dedup_jobs import clock
from dedup_jobs.conf import app_settings
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.answers import ThrottleAnswer
from dedup_jobs.stores.base import (
    RELEASED,
    THROTTLE_GRACE,
    Admission,
    Page,
    Renewed,
    ThrottleState,
)
from dedup_jobs.stores.database.models import ThrottleEntry, ThrottleKey
from dedup_jobs.stores.database.servertime import ServerNow
from dedup_jobs.stores.retry import AGAIN, Again, decide
from dedup_jobs.stores.throttling import (
    ASSUMED_RUN,
    HELD_BACK,
    TURN_FACTOR,
    TURN_PAD,
    limit_text,
    margin_ms,
)

if TYPE_CHECKING:
    from dedup_jobs.stores.database.host import DatabaseHost as Host
else:
    Host = object

SLOT, WAIT, START, RES = "slot", "wait", "start", "res"
#: the admission holding a slot (member: "{nonce} {owner}"), and the tombstones a release
#: leaves for a lease (member: "n:" + the released or superseded grant's nonce: a re-sent or
#: late admission with it changes nothing; "o:" + the owner: a re-sent release answers as the
#: first, a late renewal never takes the slot back), as THROTTLE_RELEASE's K:done
GRANT, DONE = "grant", "done"


def _ts(value: datetime) -> float:
    if value.tzinfo is None:
        from django.utils import timezone

        value = timezone.make_aware(value, timezone.get_default_timezone())
    return value.timestamp()


_dt = clock.db_datetime


class DatabaseThrottleMixin(Host):
    """``throttle_*`` for :class:`~dedup_jobs.stores.database.store.DatabaseStore`."""

    can_throttle = True

    def _lock_key(self, key: JobKey, limit: str, period: float, ttl: float) -> tuple[int, float]:
        """Lock the key's row (creating it if needed): (its pk, the server's now)."""
        rows = ThrottleKey.objects.using(self.using)

        def attempt() -> tuple[int, float] | Again:
            if rows.filter(key=key.key).update(expires_at=ServerNow(ttl), limit=limit,
                                               period=period):
                row = rows.annotate(server_now=ServerNow()).values_list(
                    "pk", "server_now").get(key=key.key)
                return int(row[0]), _ts(row[1])
            try:
                with transaction.atomic(using=self.using):
                    rows.create(key=key.key, task_name=key.task_name, ident=key.ident,
                                limit=limit, period=period, expires_at=ServerNow(ttl))
            except IntegrityError:
                pass  # made meanwhile
            return AGAIN  # created, here or meanwhile: lock it

        return decide(self.alias, key.key, attempt, kind="throttle key")

    def throttle_admit(
        self, key: JobKey, owner: str, *, delivery: str, concurrency: int, rate_limit: int,
        rate_period: float, lease: float,
    ) -> Admission:
        return self._dispatch(
            self._admit, key, owner, delivery, concurrency, rate_limit, rate_period, lease)

    def _admit(self, key: JobKey, owner: str, delivery: str, n: int, k: int, p: float,
               lease: float, *, deadline: int) -> Admission:
        """S7: past the caller's ``deadline`` (the server's clock, read as the key's row is
        locked) the admission changes nothing: the worker gave up (W4 ran, W7 deferred)."""
        cap, grace, margin = lease / 3, THROTTLE_GRACE, margin_ms(k, p) / 1000
        ttl = max(lease, p) + cap + 2 * grace
        entries = ThrottleEntry.objects.using(self.using)
        with transaction.atomic(using=self.using):
            pk, now = self._lock_key(key, limit_text(n, k, p), p if k else 0.0, ttl)
            if now * 1000 > deadline:
                raise self._refused(deadline)  # rolled back: the key's row as it was
            mine = entries.filter(throttle_id=pk)
            mine.filter(expires_at__lte=_dt(now)).delete()
            if n and mine.filter(kind=DONE, member=f"n:{delivery}").exists():
                # a grant released (or superseded), sent again or late: changes nothing
                return Admission(admitted=False, reason=RELEASED, until=clock.now())
            if k and mine.filter(kind=START, member=delivery).exists():
                return Admission(admitted=True)  # a re-send (S7)
            holds = False
            if n:
                holds = mine.filter(kind=SLOT, member=owner).exists()
                if not holds:
                    wait = self._wait_for_slot(pk, mine, owner, n, now, lease, margin)
                    if wait is not None:
                        mine.filter(kind=RES, member=owner).delete()
                        return Admission(admitted=False, reason=ThrottleAnswer.CONCURRENCY,
                                         until=clock.now() + wait)
            if k:
                reserved = mine.filter(kind=RES, member=owner).values_list(
                    "at", flat=True).first()
                r = _ts(reserved) if reserved is not None else None
                if r is not None and r > now + margin / 2:
                    mine.filter(kind=WAIT, member=owner).delete()
                    return Admission(admitted=False, reason=ThrottleAnswer.THROTTLE,
                                     until=clock.now() + r - now)
                starts = mine.filter(kind=START, at__gt=_dt(now - p))
                count = starts.count()
                start_at = now
                if not (r is not None and count < k):  # behind every reservation (script)
                    if r is not None:
                        mine.filter(kind=RES, member=owner).delete()
                    latest = [_ts(v) for v in mine.filter(kind__in=(START, RES))
                              .order_by("-at").values_list("at", flat=True)[:k]]
                    if len(latest) >= k:  # the window's rule, paced (see the script)
                        start_at = max(now, latest[k - 1] + p + margin, latest[0] + p / k)
                if start_at > now:
                    self._put(pk, RES, owner, start_at, start_at + p + grace)
                    mine.filter(kind=WAIT, member=owner).delete()
                    return Admission(admitted=False, reason=ThrottleAnswer.THROTTLE,
                                     until=clock.now() + start_at - now)
                mine.filter(kind=RES, member=owner).delete()
                self._put(pk, START, delivery, now, now + p)
            if n:
                if holds:
                    mine.filter(kind=SLOT, member=owner).update(expires_at=_dt(now + lease))
                else:
                    self._put(pk, SLOT, owner, now, now + lease)
                mine.filter(kind=WAIT, member=owner).delete()
                self._grant(pk, mine, owner, delivery, now, lease, ttl)
            return Admission(admitted=True, held=holds)

    def _wait_for_slot(self, pk: int, mine: Any, owner: str, n: int, now: float,
                       lease: float, margin: float) -> float | None:
        """T2, the rules of the script (``THROTTLE_ADMIT``): None when ``owner`` may take a
        free slot, else the seconds until it is tried again (its turn planned, or kept)."""
        cap = lease / 3
        slots = list(mine.filter(kind=SLOT).values_list("at", flat=True))
        waiting = mine.filter(kind=WAIT)
        at = waiting.filter(member=owner).values_list("at", flat=True).first()
        me = _ts(at) if at is not None else None
        avg = ThrottleKey.objects.using(self.using).values_list("avg_run", flat=True).get(pk=pk)
        if avg is None:  # as long again as the oldest running one so far
            avg = max([ASSUMED_RUN, *(now - _ts(v) for v in slots)])
        step = math.ceil((avg * TURN_FACTOR + TURN_PAD) * 1000) / 1000
        others = waiting.exclude(member=owner)
        planned = sorted([*(_ts(v) for v in slots), *(_ts(v) for v in others.order_by(
            "-at").values_list("at", flat=True)[:n])], reverse=True)
        nth = planned[n - 1] if len(planned) >= n else None
        late = others.filter(at__gte=_dt(now - cap), at__lt=_dt(now - max(margin, step))
                             ).order_by("at").values_list("at", flat=True).first()
        missing = _ts(late) if late is not None else None
        free = len(slots) < n

        def plan() -> float:
            due = max(now + margin, (nth if nth is not None else now) + step)
            if missing is not None:
                due = max(due, now + min(cap / 4, HELD_BACK * (now - missing)))
            return due + random.random() * min(1.0, step / 10)

        if me is not None and me <= now + margin / 2:
            if free:
                return None  # back for its turn: any free slot
            due = plan()
        elif free and (missing is not None or nth is None or nth + step <= now):
            return None  # a free slot no turn needs, or any while waiters miss theirs
        else:
            due = me if me is not None else plan()  # an early waiter keeps its turn
        self._put(pk, WAIT, owner, due, due + lease)
        return min(due - now, cap)

    def _grant(self, pk: int, mine: Any, owner: str, delivery: str, now: float, lease: float,
               ttl: float) -> None:
        """The slot of ``owner`` is the grant of ``delivery`` now; an earlier admission of the
        same task that held it is superseded (tombstoned: its re-send grants nothing)."""
        for grant in _grants(mine, owner):
            nonce = grant.split(" ", 1)[0]
            if nonce != delivery:
                self._put(pk, DONE, f"n:{nonce}", now, now + lease)
                mine.filter(kind=GRANT, member=grant).delete()
        # (an owner id too long for the column keeps no grant: the slot is kept by owner alone)
        self._put(pk, GRANT, f"{delivery} {owner}"[:255], now, now + ttl)
        mine.filter(kind=DONE, member=f"o:{owner}").delete()

    def _put(self, pk: int, kind: str, member: str, at: float, expires: float) -> None:
        entries = ThrottleEntry.objects.using(self.using)
        if not entries.filter(throttle_id=pk, kind=kind, member=member).update(
                at=_dt(at), expires_at=_dt(expires)):
            entries.create(throttle_id=pk, kind=kind, member=member, at=_dt(at),
                           expires_at=_dt(expires))

    def throttle_release(self, key: JobKey, owner: str) -> bool:
        return self._guard(self._release_slot, key, owner)

    def _release_slot(self, key: JobKey, owner: str) -> bool:
        rows = ThrottleKey.objects.using(self.using)
        with transaction.atomic(using=self.using):
            found = rows.filter(key=key.key).annotate(server_now=ServerNow()).values_list(
                "pk", "avg_run", "server_now").first()
            if found is None:
                return False
            pk, avg, now = found
            mine = ThrottleEntry.objects.using(self.using).filter(throttle_id=pk)
            slot = mine.filter(kind=SLOT, member=owner)
            started = slot.values_list("at", flat=True).first()
            if started is None or not slot.delete()[0]:
                # a re-sent release answers as the first (S7): its tombstone is there
                return mine.filter(kind=DONE, member=f"o:{owner}",
                                   expires_at__gt=now).exists()
            lease = app_settings.LEASE_SECONDS
            for grant in _grants(mine, owner):
                self._put(pk, DONE, f"n:{grant.split(' ', 1)[0]}", _ts(now), _ts(now) + lease)
                mine.filter(kind=GRANT, member=grant).delete()
            self._put(pk, DONE, f"o:{owner}", _ts(now), _ts(now) + lease)
            took = max(0.001, _ts(now) - _ts(started))
            rows.filter(pk=pk).update(avg_run=took if avg is None else avg * 0.7 + took * 0.3)
            return True

    def throttle_renew(self, key: JobKey, owner: str, ttl: float, *, limit: int) -> Renewed:
        return self._dispatch(
            self._renew_slot, key, owner, ttl, limit)

    def _renew_slot(self, key: JobKey, owner: str, ttl: float, limit: int, *,
                    deadline: int) -> Renewed:
        """Extend the slot; lapsed, take it back if free, not past the caller's ``deadline``
        (S7: a late renewal takes nothing, the run may have ended and released)."""
        slots = ThrottleEntry.objects.using(self.using).filter(throttle__key=key.key, kind=SLOT)
        if slots.filter(member=owner, expires_at__gt=ServerNow()).update(
                expires_at=ServerNow(ttl)):
            ThrottleEntry.objects.using(self.using).filter(  # its grant lives as long
                throttle__key=key.key, kind=GRANT, member__endswith=f" {owner}",
                expires_at__lt=ServerNow(ttl)).update(expires_at=ServerNow(ttl))
            return Renewed(held=True)
        with transaction.atomic(using=self.using):
            row = ThrottleKey.objects.using(self.using).filter(key=key.key)
            if not row.update(expires_at=ServerNow(max(ttl, 60.0))):
                return Renewed(held=False, holder="(the throttle key is gone)")
            if ThrottleEntry.objects.using(self.using).filter(
                    throttle__key=key.key, kind=DONE, member=f"o:{owner}",
                    expires_at__gt=ServerNow()).exists():
                # released by its owner: a late renewal never takes it back (T4)
                return Renewed(held=False, holder="(released by its owner)")
            slots.filter(expires_at__lte=ServerNow()).delete()
            if slots.count() >= limit:
                return Renewed(held=False, holder="(every slot taken)")
            if self._server_past(deadline):
                raise self._refused(deadline)
            pk = row.values_list("pk", flat=True).get()
            ThrottleEntry.objects.using(self.using).create(
                throttle_id=pk, kind=SLOT, member=owner, at=ServerNow(),
                expires_at=ServerNow(ttl))
            return Renewed(held=True, retaken=True)

    # -- the admin's page (T5) ---------------------------------------------------------------

    def throttle_page(
        self, *, offset: int, limit: int, task_name: str = "", search: str = "", now: float
    ) -> Page[ThrottleState]:
        """A page of the key rows (as Held locks: a count and a slice, or a streamed search),
        then the page's counts in one grouped query."""
        rows = ThrottleKey.objects.using(self.using).filter(expires_at__gt=ServerNow())
        page: Page[ThrottleKey] = self._page(  # type: ignore[attr-defined]
            rows.order_by("expires_at", "pk"), lambda row: row, offset=offset, limit=limit,
            task_name=task_name, search=search)

        def counts() -> dict[int, dict[str, int]]:
            found: dict[int, dict[str, int]] = {}
            server = ServerNow()
            live = ThrottleEntry.objects.using(self.using).filter(
                throttle__in=[row.pk for row in page.items], expires_at__gt=server)
            grouped = live.values("throttle_id", "kind").annotate(n=Count("pk", filter=Q(
                kind__in=(SLOT, WAIT, START, RES)))).values_list("throttle_id", "kind", "n")
            for pk, kind, n in grouped:
                found.setdefault(pk, {})[kind] = n
            return found

        found: dict[int, dict[str, int]] = self._guard(counts) if page.items else {}
        items = [ThrottleState(
            key=row.key, task_name=row.task_name, ident=row.ident, limit=row.limit,
            running=found.get(row.pk, {}).get(SLOT, 0), starts=found.get(row.pk, {}).get(START, 0),
            deferred=found.get(row.pk, {}).get(WAIT, 0) + found.get(row.pk, {}).get(RES, 0),
            store=self.alias) for row in page.items]
        return Page(items=items, total=page.total, has_more=page.has_more)


def _grants(mine: Any, owner: str) -> list[str]:
    """The grant entries (``"{nonce} {owner}"``) of ``owner``'s slot."""
    return [m for m in mine.filter(kind=GRANT, member__endswith=f" {owner}")
            .values_list("member", flat=True) if m.split(" ", 1)[1] == owner]
