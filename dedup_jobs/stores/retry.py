"""The stores' retry of an optimistic decision: read, decide, write, and decide again when
the lock changed hands between the read and the write (a guarded write that found it changed,
a "must create" that found the row made meanwhile, a row released in between).

:func:`decide` runs one attempt at a time, at most :data:`ATTEMPTS` times; an attempt answers,
raises (a late dispatch, S7: as it would without the retry), or returns :data:`AGAIN`. Past the
limit the decision is :class:`~dedup_jobs.exceptions.StoreUnavailable`, with the message of
:func:`changed_hands`. The attempt holds whatever it needs per round (a transaction, a deadline
check on the server's clock); what it shares across rounds (a cursor, a mutex) stays around
the call.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Final, Literal, TypeVar

from dedup_jobs.exceptions import StoreUnavailable

#: attempts of one decision while its lock keeps changing hands between the read and the write
ATTEMPTS: Final = 5

T = TypeVar("T")


class _Again(enum.Enum):
    AGAIN = "again"


#: what an attempt returns when the lock changed under it: decide again on what is there now
AGAIN: Final = _Again.AGAIN
#: the type of :data:`AGAIN`, for an attempt's annotation: ``Acquired | Again``
Again = Literal[_Again.AGAIN]


def changed_hands(alias: str, key: str, *, kind: str = "lock") -> StoreUnavailable:
    """The error of a decision that gave up after :data:`ATTEMPTS` attempts on ``key``."""
    return StoreUnavailable(alias, f"{kind} {key!r} changed hands {ATTEMPTS} times in a row")


def decide(alias: str, key: str, attempt: Callable[[], T | Again], *,
           kind: str = "lock") -> T:
    """The first answer of ``attempt`` other than :data:`AGAIN`, within :data:`ATTEMPTS`
    calls; then :func:`changed_hands` (of store ``alias``, naming ``key``). What an attempt
    raises goes through as it is, and ends the retry."""
    for _ in range(ATTEMPTS):
        answer = attempt()
        if answer is not AGAIN:
            return answer
    raise changed_hands(alias, key, kind=kind)
