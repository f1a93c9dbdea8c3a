"""The options of a unique Django task (K1), checked when the decorator runs, and the key of
one call: ``{KEY_PREFIX}:unique:{module path}:{id}``, built like a Celery job's (the id from
``unique_id`` or the bound arguments named by ``unique_on``; an id no store can hold raises
``InvalidJobId`` before any store call, A4)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dedup_jobs import keys
from dedup_jobs.conf import app_settings, is_seconds, not_finite
from dedup_jobs.exceptions import InvalidJobConfiguration, InvalidJobId
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import BaseStore

ON_DUPLICATE_CHOICES = ("return", "raise")
#: options of the Celery kinds that Django tasks do not take yet, and why
NOT_YET = {
    "without_overlapping": "R2 defers a message by re-publishing it, which Django's task "
                           "backends cannot do for a started task",
    "observe_only": "observe-only mode is not built for Django tasks yet",
}


@dataclass(frozen=True, kw_only=True)
class UniqueOptions:
    """What ``@unique(...)`` / ``@unique_until_processing(...)`` were given, checked."""

    label: str  # the task's module path: its name in keys, logs, metrics and the admin
    signature: inspect.Signature  # the call's parameters (``context`` left out)
    release_on_start: bool = False
    unique_for: float | None = None
    unique_on: tuple[str, ...] | None = None
    unique_id: Callable[..., Any] | None = None
    unique_via: str | Callable[[], str] | None = None
    on_duplicate: str = "return"

    def lock_ttl(self) -> float:
        return float(self.unique_for or app_settings.DEFAULT_UNIQUE_FOR)

    def store_alias(self) -> str:
        via = self.unique_via() if callable(self.unique_via) else self.unique_via
        return str(via) if via else app_settings.STORE

    def key(self, args: Sequence[Any], kwargs: dict[str, Any],
            store: BaseStore) -> keys.JobKey:
        """The key of a call with these (JSON-normalized) arguments."""
        source = "unique_id()"
        if self.unique_id is not None:
            value = self.unique_id(*args, **kwargs)
            ident = keys.hook_id(value)
            if ident is None:
                raise InvalidJobId(self.label, source, value, keys.HOOK_TYPE_PROBLEM)
        else:
            chosen = f"unique_on = {self.unique_on!r}" if self.unique_on else "all arguments"
            source = f"the default key ({chosen}; pass unique_id= to choose the id)"
            ident = keys.default_id(self.label, _shim(self.signature), args, kwargs,
                                    self.unique_on, "unique_id")
        problem = keys.id_problem(ident)
        if problem is None:
            key = keys.build_key("unique", self.label, ident)
            problem = store.key_problem(key)
            if problem is None:
                return key
        raise InvalidJobId(self.label, source, ident, problem)

    def store(self) -> BaseStore:
        return get_store(self.store_alias())


@functools.lru_cache(maxsize=512)
def _shim(signature: inspect.Signature) -> Callable[..., Any]:
    """A function with ``signature``, for the key builder (which reads a function's)."""
    def call(*args: Any, **kwargs: Any) -> None:  # pragma: no cover - never called
        raise NotImplementedError

    call.__signature__ = signature  # type: ignore[attr-defined]
    return call


def call_signature(func: Callable[..., Any], takes_context: bool) -> inspect.Signature:
    """The parameters a call of the task passes (a context-taking task's ``context`` is the
    framework's, not the caller's)."""
    signature = inspect.signature(func)
    if takes_context:
        params = list(signature.parameters.values())[1:]
        signature = signature.replace(parameters=params)
    return signature


def checked(label: str, signature: inspect.Signature, given: dict[str, Any],
            *, release_on_start: bool) -> UniqueOptions:
    """The options, or InvalidJobConfiguration naming the value and what to do."""
    for name, why in NOT_YET.items():
        if given.get(name):
            raise InvalidJobConfiguration(
                f"{label}: {name} = {given[name]!r} is not supported on Django tasks yet "
                f"({why}). Leave it out, or use a Celery job for it.")
    for name in NOT_YET:
        given.pop(name, None)
    known = {"unique_for", "unique_on", "unique_id", "unique_via", "on_duplicate"}
    unknown = sorted(set(given) - known)
    if unknown:
        raise InvalidJobConfiguration(
            f"{label}: unknown option(s) {', '.join(unknown)}. A unique Django task takes "
            f"{', '.join(sorted(known))}.")
    unique_for = given.get("unique_for")
    if unique_for is not None and (not is_seconds(unique_for) or unique_for <= 0):
        raise InvalidJobConfiguration(
            f"{label}: unique_for = {unique_for!r} must be a number of seconds above 0"
            f"{not_finite(unique_for)}.")
    on_duplicate = given.get("on_duplicate", "return")
    if on_duplicate not in ON_DUPLICATE_CHOICES:
        hint = (" (\"replace\" needs a queued task to be revoked, which Django's task "
                "backends cannot do)" if on_duplicate == "replace" else "")
        raise InvalidJobConfiguration(
            f"{label}: on_duplicate = {on_duplicate!r} must be one of "
            f"{ON_DUPLICATE_CHOICES!r}{hint}.")
    unique_on = given.get("unique_on")
    if unique_on is not None:
        if isinstance(unique_on, str) or not all(isinstance(f, str) for f in unique_on):
            raise InvalidJobConfiguration(
                f"{label}: unique_on = {unique_on!r} must be a tuple of argument names, "
                f"e.g. ({unique_on!r},).")
        params = signature.parameters.values()
        names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        unknown = [f for f in unique_on if f not in names]
        if unknown and not any(p.kind is p.VAR_KEYWORD for p in params):
            raise InvalidJobConfiguration(
                f"{label}: unique_on names {unknown!r}, which the task does not take. Its "
                f"arguments are {names!r}.")
        unique_on = tuple(unique_on)
    for name in ("unique_id", "unique_via"):
        value = given.get(name)
        if value is not None and not callable(value) and not (
                name == "unique_via" and isinstance(value, str)):
            wanted = ("a function of the call" if name == "unique_id"
                      else "a store alias or a function returning one")
            raise InvalidJobConfiguration(f"{label}: {name} = {value!r} must be {wanted}.")
    return UniqueOptions(label=label, signature=signature, release_on_start=release_on_start,
                         unique_for=unique_for, unique_on=unique_on,
                         unique_id=given.get("unique_id"), unique_via=given.get("unique_via"),
                         on_duplicate=on_duplicate)
