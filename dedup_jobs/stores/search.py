"""How the admin search matches, the same on every store (SPEC A4).

A search matches a lock (or a pending burst) when its text is found inside the job name or
inside the readable id, never in text that spans the two (``"job:id"``) nor in the key's
prefixes. Matching is caseless for every script: both sides are folded with Unicode
compatibility normalisation (NFKC) and full case folding (``str.casefold``), so ``émile``
finds ``ÉMILE``, ``strasse`` finds ``Straße`` and ``STRASSE``, a decomposed ``é`` finds a
composed one, and ``ﬁ`` finds ``fi``.

No database compares like this (SQLite's ``LIKE`` folds ASCII only, PostgreSQL's depends on
the collation) and Redis ``MATCH`` works on bytes, so the stores apply this predicate in
Python to the job names and ids they read.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from dedup_jobs.keys import name_part, task_name_of

#: the id part of a key whose id was too long and is stored as a hash (keys.build_key)
_HASHED_ID = re.compile(r":sha256-[0-9a-f]{64}\Z")


def fold(text: str) -> str:
    """``text`` in the caseless form both sides of a search are compared in."""
    if text.isascii():
        return text.lower()  # the same result, without the Unicode machinery
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


@dataclass(frozen=True)
class Search:
    """One admin search: ``Search.of(text)`` is None for an empty search."""

    folded: str

    @classmethod
    def of(cls, text: str) -> Search | None:
        folded = fold(text.strip())
        return cls(folded) if folded else None

    def matches(self, task_name: str, ident: str) -> bool:
        return self.folded in fold(task_name) or self.folded in fold(ident)

    def may_match_key(self, tail: str) -> bool:
        """Whether a lock whose key ends in ``tail`` (``"{task name part}:{stored id}"``) may
        match: False only when it cannot. An id stored as a hash may match anything."""
        if _HASHED_ID.search(tail):
            return True
        part, _colon, ident = tail.partition(":")
        return self.folded in fold(task_name_of(part)) or self.folded in fold(ident)

    @staticmethod
    def split_key(tail: str, task_name: str = "") -> tuple[str, str] | None:
        """``(task name, id)`` of a key tail (``"{task name part}:{stored id}"``, see
        :func:`dedup_jobs.keys.name_part`: the part holds no ``:``), or None when the id is
        hashed (its readable form is only in the store's record) or the tail has no ``:``."""
        if _HASHED_ID.search(tail):
            return None
        if task_name:
            return task_name, tail[len(name_part(task_name)) + 1 :]
        part, colon, ident = tail.partition(":")
        if not colon:
            return None
        return task_name_of(part), ident
