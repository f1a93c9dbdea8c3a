"""Reading the database store's rows, kept apart from ``store.py``: one lock, every held or
expired lock (keyset pagination), and the admin's pages of locks and pending bursts. Expiry is
the database server's clock (``held()``, ``pending()``: S3)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import TYPE_CHECKING, Any

from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import DebounceState, LockInfo, Page
from dedup_jobs.stores.database.models import JobLock, PendingDebounce
from dedup_jobs.stores.search import Search

if TYPE_CHECKING:
    from dedup_jobs.stores.database.host import DatabaseHost as Host
else:
    Host = object


#: rows read per fetch when the admin searches
SEARCH_CHUNK = 2000


class DatabaseReadingMixin(Host):
    """The reading half of :class:`~dedup_jobs.stores.database.store.DatabaseStore`."""


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

        return self._guard(read)

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
        rows = JobLock.objects.using(self.using).held()
        return self._page(rows.order_by("expires_at", "pk"), self._info, offset=offset,
                          limit=limit, task_name=task_name, search=search)

    def debounce_page(
        self, *, offset: int, limit: int, task_name: str = "", search: str = "", now: float
    ) -> Page[DebounceState]:
        rows = PendingDebounce.objects.using(self.using).pending()
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

        return self._guard(read)

