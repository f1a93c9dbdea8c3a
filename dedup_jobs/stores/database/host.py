"""What the halves of :class:`~dedup_jobs.stores.database.store.DatabaseStore` (its flow,
throttle, debounce, row-locking and reading mixins) use of one another, typed once.

Each mixin is a :class:`DatabaseHost` for the type checker only (it subclasses it under
``TYPE_CHECKING``, ``object`` at run time): a call from one half into another is checked
against the signature here, and the store class that joins them is checked to provide every
method with a compatible one."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from dedup_jobs.exceptions import StoreUnavailable
    from dedup_jobs.keys import JobKey
    from dedup_jobs.stores.answers import DebounceState
    from dedup_jobs.stores.database.models import PendingDebounce

T = TypeVar("T")


class DatabaseHost(Protocol):
    alias: str

    @property
    def using(self) -> str: ...

    def deadline_ms(self) -> int: ...

    def late(self, deadline_ms: int, now_ms: float | None = None) -> StoreUnavailable: ...

    def _guard(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...

    def _dispatch(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...

    def _dialect(self) -> str | None: ...

    def _names(self) -> dict[str, str]: ...

    def _take(
        self, key: JobKey, owner: str, state: str, ttl: float, *, overwrite_mine: bool,
        keep_acquired_if_mine: bool, delivery: str | None = None, deadline: int | None = None,
        request: str | None = None,
    ) -> tuple[str, str, str]: ...

    def _refused(self, deadline_ms: int) -> StoreUnavailable: ...

    def _deadline_param(self, deadline_ms: int) -> Any: ...

    def _delete_mine(self, key: JobKey, owner: str) -> bool: ...

    def _server_past(self, deadline: int) -> bool: ...

    def _state(self, row: PendingDebounce) -> DebounceState: ...

