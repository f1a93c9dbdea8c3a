"""The store contract: where locks live and how a decision is made in one round trip."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

from dedup_jobs.keys import JobKey

QUEUED = "queued"
RUNNING = "running"


@dataclass(frozen=True, kw_only=True)
class LockInfo:
    """A held lock, as the admin and the management command see it."""

    key: str
    task_name: str
    ident: str
    owner: str
    state: str  # QUEUED or RUNNING
    acquired_at: float  # epoch seconds
    expires_at: float | None  # epoch seconds, None if the store cannot tell
    store: str


@dataclass(frozen=True, kw_only=True)
class Acquired:
    """The answer of :meth:`BaseStore.acquire`."""

    acquired: bool
    holder: str  # the owner token now holding the lock (the caller's when acquired)


@dataclass(frozen=True, kw_only=True)
class Started:
    """The answer of :meth:`BaseStore.start`, the worker-side check."""

    run: bool
    holder: str | None  # the other owner when run is False
    took: bool = False  # the lock was free and the caller now holds it
    released: bool = False  # release=True and the caller's lock was deleted


class BaseStore(ABC):
    """One lock store. Every method is one decision, atomic where ``atomic`` is True."""

    #: the store can list held locks (admin, clear_stale_locks) without scanning the keyspace
    can_list: bool = False
    #: every decision is atomic across processes (an honest flag for the system checks)
    atomic: bool = True
    #: why the store cannot list, shown by the admin when ``can_list`` is False
    cannot_list_reason: str = ""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.alias!r}>"

    @abstractmethod
    def acquire(
        self, key: JobKey, owner: str, ttl: float, *, now: float, reentrant: bool = False
    ) -> Acquired:
        """Take the lock for ``ttl`` seconds if it is free (or, with ``reentrant``, already
        held by ``owner``: then refresh it). Otherwise report the holder."""

    @abstractmethod
    def start(
        self, key: JobKey, owner: str, lease: float, *, now: float, release: bool
    ) -> Started:
        """The worker-side check before ``run``. Held by another owner: don't run. Held by
        ``owner`` or free: run, and either mark the lock running for ``lease`` seconds
        (taking it if free) or, with ``release``, delete ``owner``'s lock."""

    @abstractmethod
    def release(self, key: JobKey, owner: str) -> bool:
        """Compare-and-delete: delete the lock only if ``owner`` holds it."""

    @abstractmethod
    def renew(self, key: JobKey, owner: str, ttl: float, *, now: float) -> bool:
        """Extend ``owner``'s lock to expire no sooner than ``now + ttl``; never shortens it."""

    @abstractmethod
    def get(self, key: JobKey) -> LockInfo | None:
        """The lock at ``key``, or None."""

    def iter_locks(self, *, batch_size: int = 500) -> Iterator[LockInfo]:
        """Every held lock, streamed in batches (only where ``can_list``)."""
        raise NotImplementedError(self.cannot_list_reason or f"{self!r} cannot list locks")

    def check(self) -> list[str]:
        """Problems with this store's configuration, as text for the system checks."""
        return []
