"""The worker's lock check of a unique kind (W1/W3/W5/R2): one store call, ``store.start``
(``store.start_exclusive`` under ``without_overlapping``), whose answer is one value,
:class:`~dedup_jobs.stores.answers.StartAnswer`; and how long a message waits when the
answer says it must (put off, deferred for an overlap).

What the front-end does with each answer (run, skip, put off, drop, defer, wait for a
take-over) is in ``jobs/admission.py``; the re-send of a check whose reply was lost is the
lease's (``engine/lease.py``)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from dedup_jobs import clock
from dedup_jobs.conf import app_settings
from dedup_jobs.engine.message import Message
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.answers import Started
from dedup_jobs.stores.base import BaseStore, new_request_id, running_key

#: dedup header: how many times the message was deferred for an overlapping run (R2)
DEFERRED = "deferred"
#: dedup header of a copy deferred because its exclusive check could not reach the store
#: (W7): that check's delivery nonce, so the copy re-sends the very same call (S7) and finds
#: the running marker the lost call may have taken as its own
NONCE = "nonce"


@dataclass(frozen=True, kw_only=True)
class Check:
    """The lock check of one delivery; called again with the same nonce it is the same call
    (S7): the lease re-sends it through the store that answers (W4)."""

    key: JobKey
    owner: str
    delivery: str  # this delivery's nonce (W5), kept by the lease (W6)
    exclusive: bool  # R2: the check takes the key's running marker too
    release: bool  # until-processing: the check releases the lock
    redelivered: bool

    @property
    def marker(self) -> JobKey | None:
        """R2: the running marker this run holds when the check lets it run."""
        return running_key(self.key) if self.exclusive else None

    def __call__(self, through: BaseStore) -> Started:
        lease = app_settings.LEASE_SECONDS
        if self.exclusive:
            return through.start_exclusive(self.key, running_key(self.key), self.owner, lease,
                                           now=clock.now(), delivery=self.delivery)
        return through.start(self.key, self.owner, lease, now=clock.now(),
                             release=self.release, delivery=self.delivery,
                             redelivered=self.redelivered)

    def holds_after(self, through: BaseStore) -> bool:
        """W4: re-sent, does the answer leave the running job something to hold (the lock or
        the running marker, renewed and released like any)? A release at start
        (until-processing) leaves nothing: the re-send itself released the lock."""
        return self(through).run and not (self.release and not self.exclusive)


def check_for(message: Message, key: JobKey, *, without_overlapping: bool,
              release_on_start: bool) -> Check:
    """The lock check of ``message``; a copy deferred for the store re-sends its first
    check's nonce (:data:`NONCE`)."""
    return Check(key=key, owner=message.owner,
                 delivery=str(message.carried(NONCE) or new_request_id()),
                 exclusive=without_overlapping and release_on_start,
                 release=release_on_start, redelivered=message.redelivered)


def put_off_wait() -> float:
    """W5: a copy of a message whose first delivery is running is checked again after a
    third of the lease."""
    return float(app_settings.LEASE_SECONDS) / 3


def overlap_wait(message: Message) -> float:
    """R2: a countdown that doubles with each deferral (:data:`DEFERRED`), from 0.5 s up to a
    third of the lease, plus up to 0.25 s of jitter."""
    deferred = int(message.carried(DEFERRED) or 0)
    countdown = min(app_settings.LEASE_SECONDS / 3, 0.5 * 2 ** deferred)
    return float(countdown) + random.uniform(0, 0.25)
