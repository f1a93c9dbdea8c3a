"""Reading a Redis store: one lock or burst, every lock or burst by index, admin pages."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from dedup_jobs.conf import app_settings
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey, name_part
from dedup_jobs.stores.base import (
    QUEUED,
    STATE_GRACE,
    DebounceState,
    LockInfo,
    Page,
    decode_call,
)
from dedup_jobs.stores.redis.connection import _text
from dedup_jobs.stores.redis.scripts import TRIM_BATCH
from dedup_jobs.stores.search import Search

#: index entries examined per ZSCAN call when the admin searches
SCAN_COUNT = 2000


class RedisListing:
    """The reading half of :class:`~dedup_jobs.stores.redis.store.RedisStore`."""

    alias: str
    client: Any
    _errors: tuple[type[BaseException], ...]

    def physical(self, key: str) -> str:
        raise NotImplementedError

    if TYPE_CHECKING:  # RedisConnection's (the cluster store's routes by slot)
        def _send(self, name: str, keys: list[str], args: Any) -> Any: ...

    def place(self, key: JobKey, index: str = "unique") -> tuple[str, str]:
        raise NotImplementedError

    def index_keys(self, index: str = "unique") -> list[str]:
        raise NotImplementedError

    def logical(self, key: str) -> str:
        """The logical key (``{KEY_PREFIX}:{kind}:{task name}:{id}``) of a key read back from
        the store, from its ``KEY_PREFIX`` on: as it is on a single Redis (the cluster store
        takes its hash tag out)."""
        return key

    def _debounce_state(self, physical: str, fields: dict[bytes, bytes]) -> DebounceState | None:
        if not fields or b"message" not in fields:
            return None
        data = {_text(k): _text(v) for k, v in fields.items()}
        args, kwargs = decode_call(data["payload"])
        run_at = int(data["run_at"]) / 1000
        deadline = int(data["deadline"]) / 1000 if data.get("deadline") else None
        prefix_at = physical.find(f"{app_settings.KEY_PREFIX}:debounce:")
        return DebounceState(
            key=self.logical(physical[prefix_at:] if prefix_at >= 0 else physical),
            task_name=data.get("task", ""), ident=data.get("id", ""),
            count=int(data.get("count", "1")),
            first_dispatch_at=int(data["first"]) / 1000,
            last_dispatch_at=int(data["last"]) / 1000,
            runs_at=run_at if deadline is None else min(run_at, deadline),
            deadline=deadline, message_id=data["message"], latest_id=data["latest"],
            args=args, kwargs=kwargs, store=self.alias,
        )

    def get_debounce(self, key: JobKey) -> DebounceState | None:
        physical = self.place(key, "debounce")[0]
        try:
            return self._debounce_state(physical, self.client.hgetall(physical))
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc

    def iter_debounces(self, *, batch_size: int = 500) -> Iterator[DebounceState]:
        """Walk the debounce index, soonest due first, ``batch_size`` per pipelined read (on
        a cluster: every shard of it, merged)."""
        walks = [self._walk(index, batch_size, self._debounce_state)
                 for index in self.index_keys("debounce")]
        yield from heapq.merge(*walks, key=lambda state: state.runs_at)

    def _walk(self, index: str, batch_size: int, parse: Any) -> Iterator[Any]:
        start = 0
        try:
            while True:
                members = self.client.zrange(index, start, start + batch_size - 1)
                if not members:
                    return
                pipe = self.client.pipeline(transaction=False)
                for member in members:
                    pipe.hgetall(member)
                for member, fields in zip(members, pipe.execute(), strict=True):
                    item = parse(_text(member), fields)
                    if item is not None:
                        yield item
                start += batch_size
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc

    # -- reading ------------------------------------------------------------------------
    def _info(self, physical: str, fields: dict[bytes, bytes]) -> LockInfo | None:
        if not fields or b"owner" not in fields:
            return None
        data = {_text(k): _text(v) for k, v in fields.items()}
        prefix_at = physical.find(f"{app_settings.KEY_PREFIX}:unique:")
        return LockInfo(
            key=self.logical(physical[prefix_at:] if prefix_at >= 0 else physical),
            task_name=data.get("task", ""),
            ident=data.get("id", ""),
            owner=data["owner"],
            state=data.get("state", QUEUED),
            acquired_at=int(data.get("acquired", "0")) / 1000,
            expires_at=int(data["expires"]) / 1000 if "expires" in data else None,
            store=self.alias,
        )

    def get(self, key: JobKey) -> LockInfo | None:
        physical = self.place(key)[0]
        try:
            return self._info(physical, self.client.hgetall(physical))
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc

    def iter_locks(self, *, batch_size: int = 500) -> Iterator[LockInfo]:
        """Every held lock, ``batch_size`` index entries per ZSCAN and one pipelined read of
        their hashes. ZSCAN's cursor survives deletions, so callers may release as they go
        (a lock may, rarely, be yielded twice while Redis rehashes the index). On a cluster,
        one shard of the index after the other."""
        try:
            for index in self.index_keys("unique"):
                cursor = 0
                while True:
                    cursor, entries = self.client.zscan(index, cursor, count=batch_size)
                    yield from self._read([member for member, _score in entries])
                    if cursor == 0:
                        break
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc

    def _read(self, members: list[Any], parse: Any = None) -> list[Any]:
        """The hashes at ``members`` (physical keys), parsed, in one pipelined round trip."""
        if not members:
            return []
        parse = parse or self._info
        pipe = self.client.pipeline(transaction=False)
        for member in members:
            pipe.hgetall(member)
        answers = pipe.execute()
        items = (parse(_text(m), fields) for m, fields in zip(members, answers, strict=True))
        return [item for item in items if item is not None]

    def lock_page(
        self, *, offset: int, limit: int, task_name: str = "", search: str = "", now: float
    ) -> Page[LockInfo]:
        return self._page("unique", self._info, offset=offset, limit=limit,
                          task_name=task_name, search=search, min_score=int(now * 1000))

    def debounce_page(
        self, *, offset: int, limit: int, task_name: str = "", search: str = "", now: float
    ) -> Page[DebounceState]:
        # a burst is scored by its due time; its state is gone STATE_GRACE after it, and its
        # entry with it once a (bounded) trim reaches it: left out meanwhile
        return self._page("debounce", self._debounce_state,
                          offset=offset, limit=limit, task_name=task_name, search=search,
                          min_score=int((now - STATE_GRACE) * 1000))

    def _page(self, kind: str, parse: Any, *, offset: int, limit: int,
              task_name: str, search: str, min_score: int | None) -> Page[Any]:
        """Without a filter: count and range of the index by score in one pipeline, then one
        pipelined read of the page (on a cluster: each shard's count and first
        ``offset + limit`` entries in one pipeline, merged by score, then the page). With a
        job or a search: ZSCAN MATCH over the index (never KEYS; every shard of it), in the
        passes of :meth:`_patterns`, each batch checked in Python against the search
        (:mod:`dedup_jobs.stores.search`), stopping as soon as the page is full.
        ``min_score`` leaves out entries that expired (locks are scored by expiry)."""
        low: Any = "-inf" if min_score is None else min_score
        wanted = Search.of(search)
        if task_name and wanted is not None and wanted.matches(task_name, ""):
            wanted = None  # the job's name matches: so does every lock of the job
        indexes = self.index_keys(kind)
        try:
            if not task_name and wanted is None:
                total, members = self._ranked(indexes, low, offset, limit)
                return Page(items=self._read(members, parse), total=total,
                            has_more=offset + limit < total)
            marker = f"{app_settings.KEY_PREFIX}:{kind}:"
            matches: list[tuple[bytes, float]] = []
            seen: set[bytes] = set()
            complete = True
            passes = itertools.product(indexes, self._patterns(marker, task_name, wanted))
            for index, pattern in passes:
                cursor = 0
                while complete:
                    cursor, entries = self.client.zscan(index, cursor, match=pattern,
                                                        count=SCAN_COUNT)
                    fresh = [
                        (member, score) for member, score in entries
                        if (min_score is None or score >= min_score) and member not in seen
                    ]
                    seen.update(member for member, _score in fresh)
                    if wanted is not None:
                        fresh = self._searched(fresh, wanted, marker, task_name)
                    matches.extend(fresh)
                    complete = len(matches) <= offset + limit
                    if cursor == 0:
                        break
            page = sorted(matches[offset:offset + limit], key=lambda entry: entry[1])
            items = self._read([member for member, _score in page], parse)
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc
        return Page(items=items, total=len(matches) if complete else None,
                    has_more=len(matches) > offset + limit)

    def _ranked(self, indexes: list[str], low: Any, offset: int,
                limit: int) -> tuple[int, list[Any]]:
        """How many entries score ``low`` or more over ``indexes``, and the members ranked
        ``offset`` to ``offset + limit`` among them by (score, member), in one pipeline."""
        pipe = self.client.pipeline(transaction=False)
        for index in indexes:
            pipe.zcount(index, low, "+inf")
        if len(indexes) == 1:
            pipe.zrangebyscore(indexes[0], low, "+inf", start=offset, num=limit)
            total, members = pipe.execute()
            return int(total), members
        for index in indexes:
            pipe.zrangebyscore(index, low, "+inf", start=0, num=offset + limit,
                               withscores=True)
        answers = pipe.execute()
        total = sum(int(count) for count in answers[:len(indexes)])
        merged = heapq.merge(*answers[len(indexes):], key=lambda entry: (entry[1], entry[0]))
        return total, [member for member, _score in itertools.islice(merged, offset,
                                                                       offset + limit)]

    def _patterns(self, marker: str, task_name: str, wanted: Search | None) -> list[bytes]:
        """MATCH patterns (bytes: Redis matches bytes) whose passes together return every
        index entry that may match, each then checked exactly in Python. ASCII keys fold
        like ASCII, so an ASCII search is matched inside Redis with ``[aA]`` classes; keys
        with any other byte (UTF-8 of a non-ASCII job name or id) and keys with a hashed id
        (whose readable id is only in the hash) come in passes of their own, few in most
        stores."""
        prefix = glob_escape(self.physical(marker))
        prefix += glob_escape(f"{name_part(task_name)}:") if task_name else ""
        start = prefix.encode("utf-8")
        if wanted is None:
            return [start + b"*"]
        patterns = []
        if wanted.folded.isascii():
            patterns.append(start + b"*" + glob_icase(wanted.folded).encode("ascii") + b"*")
            if ":" in wanted.folded or "%" in wanted.folded:
                patterns.append(start + b"*%*")  # a task name with ":" or "%" is escaped
        patterns.append(start + b"*[\x80-\xff]*")
        patterns.append(start + b"*:sha256-*")
        return patterns

    def _searched(self, entries: list[tuple[bytes, float]], wanted: Search, marker: str,
                  task_name: str) -> list[tuple[bytes, float]]:
        """The index entries whose job name or readable id matches ``wanted``. Decided from
        the key where it tells the job name and id apart; otherwise (an id with a ``:``, a
        hashed id, a key function that hides the key) from the hash's ``task`` and ``id``
        fields, one pipelined HMGET for the batch."""
        found: list[tuple[bytes, float]] = []
        unsure: list[tuple[bytes, float]] = []
        for member, score in entries:
            text = self.logical(_text(member))
            at = text.find(marker)
            if at < 0:
                unsure.append((member, score))
                continue
            tail = text[at + len(marker):]
            if not wanted.may_match_key(tail):
                continue
            parts = Search.split_key(tail, task_name)
            if parts is None:
                unsure.append((member, score))
            elif wanted.matches(*parts):
                found.append((member, score))
        if unsure:
            pipe = self.client.pipeline(transaction=False)
            for member, _score in unsure:
                pipe.hmget(member, "task", "id")
            for entry, (task, ident) in zip(unsure, pipe.execute(), strict=True):
                if task is None and ident is None:
                    continue  # gone meanwhile
                task_text, id_text = _text(task or b""), _text(ident or b"")
                if (not task_name or task_text == task_name) and wanted.matches(task_text,
                                                                                  id_text):
                    found.append(entry)
        return found

    def trim_index(self) -> int:
        """Drop index entries of locks that expired (their keys are gone already), in calls
        of TRIM_INDEX (at most TRIM_BATCH entries each): never one long stall of the server
        however many expired together."""
        removed = 0
        for index in self.index_keys("unique"):
            while True:
                trimmed = int(self._send("TRIM_INDEX", [index], ()))
                removed += trimmed
                if trimmed < TRIM_BATCH:
                    break
        return removed


def glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob pattern (MATCH)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def glob_icase(text: str) -> str:
    """ASCII ``text`` as a case-insensitive Redis glob: letters become ``[aA]`` classes."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else glob_escape(c) for c in text)
