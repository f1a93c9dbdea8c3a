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
from dedup_jobs.engine.limits import debounce_times, seconds_of
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
    unique_for: float | Callable[..., Any] | None = None  # a function of the call (L1)
    unique_on: tuple[str, ...] | None = None
    unique_id: Callable[..., Any] | None = None
    unique_via: str | Callable[[], str] | None = None
    on_duplicate: str = "return"

    @property
    def kind_label(self) -> str:
        return ("unique until processing (Django task)" if self.release_on_start
                else "unique (Django task)")

    def lock_ttl(self, args: Sequence[Any], kwargs: dict[str, Any]) -> float:
        """The lock's lifetime for a call with these arguments (L1: ``unique_for``'s answer
        for them when it is a function), else DEFAULT_UNIQUE_FOR."""
        found = seconds_of(self.label, "unique_for", self.unique_for, args, kwargs)
        return float(app_settings.DEFAULT_UNIQUE_FOR if found is None else found)

    def store_alias(self) -> str:
        via = self.unique_via() if callable(self.unique_via) else self.unique_via
        return str(via) if via else app_settings.STORE

    def key(self, args: Sequence[Any], kwargs: dict[str, Any],
            store: BaseStore) -> keys.JobKey:
        """The key of a call with these (JSON-normalized) arguments."""
        return call_key("unique", self.label, self.signature, self.unique_id,
                        self.unique_on, args, kwargs, store)

    def store(self) -> BaseStore:
        return get_store(self.store_alias())


def call_key(kind: str, label: str, signature: inspect.Signature,
             hook: Callable[..., Any] | None, fields: tuple[str, ...] | None,
             args: Sequence[Any], kwargs: dict[str, Any], store: BaseStore) -> keys.JobKey:
    """``{KEY_PREFIX}:{kind}:{label}:{id}``: the id from ``hook`` (``unique_id``,
    ``debounce_id``) or the bound arguments named by ``fields``; InvalidJobId for an id
    ``store`` cannot hold (A4)."""
    name = f"{kind}_id"
    source = f"{name}()"
    if hook is not None:
        value = hook(*args, **kwargs)
        ident = keys.hook_id(value)
        if ident is None:
            raise InvalidJobId(label, source, value, keys.HOOK_TYPE_PROBLEM)
    else:
        chosen = f"{kind}_on = {fields!r}" if fields else "all arguments"
        source = f"the default key ({chosen}; pass {name}= to choose the id)"
        ident = keys.default_id(label, _shim(signature), args, kwargs, fields, name)
    problem = keys.id_problem(ident)
    if problem is None:
        key = keys.build_key(kind, label, ident)
        problem = store.key_problem(key)
        if problem is None:
            return key
    raise InvalidJobId(label, source, ident, problem)


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


def _key_options(label: str, kind: str, given: dict[str, Any],
                 signature: inspect.Signature) -> tuple[str, ...] | None:
    """``{kind}_on`` (returned), ``{kind}_id`` and ``{kind}_via``, checked."""
    _callable_or_alias(label, f"{kind}_id", given.get(f"{kind}_id"))
    _callable_or_alias(label, f"{kind}_via", given.get(f"{kind}_via"))
    return _fields(label, f"{kind}_on", given.get(f"{kind}_on"), signature)


def _known(label: str, kind: str, given: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(given) - known)
    if unknown:
        raise InvalidJobConfiguration(
            f"{label}: unknown option(s) {', '.join(unknown)}. A {kind} Django task takes "
            f"{', '.join(sorted(known))}.")


def _fields(label: str, option: str, fields: Any,
            signature: inspect.Signature) -> tuple[str, ...] | None:
    """``unique_on`` / ``debounce_on``: a tuple of names the task takes, or None."""
    if fields is None:
        return None
    problem = keys.fields_problem(option, fields)
    if problem:
        raise InvalidJobConfiguration(f"{label}: {problem}")
    params = signature.parameters.values()
    names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    unknown = [f for f in fields if f not in names]
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in params):
        raise InvalidJobConfiguration(
            f"{label}: {option} names {unknown!r}, which the task does not take. Its "
            f"arguments are {names!r}.")
    return tuple(fields)


def _callable_or_alias(label: str, name: str, value: Any) -> None:
    """An id hook must be callable; a ``*_via`` a store alias or a function returning one."""
    if value is None or callable(value) or (name.endswith("_via") and isinstance(value, str)):
        return
    wanted = ("a store alias or a function returning one" if name.endswith("_via")
              else "a function of the call")
    raise InvalidJobConfiguration(f"{label}: {name} = {value!r} must be {wanted}.")


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
    _known(label, "unique", given,
           {"unique_for", "unique_on", "unique_id", "unique_via", "on_duplicate"})
    unique_for = given.get("unique_for")
    if (unique_for is not None and not callable(unique_for)
            and (not is_seconds(unique_for) or unique_for <= 0)):
        raise InvalidJobConfiguration(
            f"{label}: unique_for = {unique_for!r} must be a number of seconds above 0"
            f"{not_finite(unique_for)}.")
    on_duplicate = given.get("on_duplicate", "return")
    if on_duplicate not in ON_DUPLICATE_CHOICES:
        hint = (" (\"replace\" needs a queued task to be revoked, which Django's task "
                "backends cannot do)" if on_duplicate == "replace" else
                " (\"cancel_running\" needs a queued task to be revoked and a running one "
                "to be stopped, which Django's task backends cannot do: use it on a Celery "
                "UniqueJob)" if on_duplicate == "cancel_running" else "")
        raise InvalidJobConfiguration(
            f"{label}: on_duplicate = {on_duplicate!r} must be one of "
            f"{ON_DUPLICATE_CHOICES!r}{hint}.")
    unique_on = _key_options(label, "unique", given, signature)
    return UniqueOptions(label=label, signature=signature, release_on_start=release_on_start,
                         unique_for=unique_for, unique_on=unique_on,
                         unique_id=given.get("unique_id"), unique_via=given.get("unique_via"),
                         on_duplicate=on_duplicate)


@dataclass(frozen=True, kw_only=True)
class DebounceOptions:
    """What ``@debounced(...)`` was given, checked."""

    label: str
    signature: inspect.Signature
    debounce_for: float | Callable[..., Any]  # or a function of the call (L1)
    max_wait: float | Callable[..., Any] | None = None
    debounce_on: tuple[str, ...] | None = None
    debounce_id: Callable[..., Any] | None = None
    debounce_via: str | Callable[[], str] | None = None

    kind_label = "debounced (Django task)"

    def store_alias(self) -> str:
        via = self.debounce_via() if callable(self.debounce_via) else self.debounce_via
        return str(via) if via else app_settings.STORE

    def store(self) -> BaseStore:
        return get_store(self.store_alias())

    def times(self, args: Sequence[Any],
              kwargs: dict[str, Any]) -> tuple[float | None, float | None]:
        """``(debounce_for, max_wait)`` of a call with these arguments (L1: the functions'
        answers for them); debounce_for None: this call is not debounced."""
        return debounce_times(self.label, self.debounce_for, self.max_wait, args, kwargs)

    def key(self, args: Sequence[Any], kwargs: dict[str, Any],
            store: BaseStore) -> keys.JobKey:
        return call_key("debounce", self.label, self.signature, self.debounce_id,
                        self.debounce_on, args, kwargs, store)


def checked_debounce(label: str, signature: inspect.Signature,
                     given: dict[str, Any]) -> DebounceOptions:
    """The options of ``@debounced(...)``, or InvalidJobConfiguration naming the value."""
    _known(label, "debounced", given,
           {"debounce_for", "max_wait", "debounce_on", "debounce_id", "debounce_via"})
    debounce_for: Any = given.get("debounce_for")
    if not callable(debounce_for) and (not is_seconds(debounce_for) or debounce_for <= 0):
        raise InvalidJobConfiguration(
            f"{label}: debounce_for = {debounce_for!r} must be a number of seconds above 0"
            f"{not_finite(debounce_for)}, e.g. @debounced(debounce_for=30), or a function "
            f"of the call's arguments returning them.")
    max_wait = given.get("max_wait")
    if max_wait is not None and not callable(max_wait) and (
            not is_seconds(max_wait) or max_wait <= 0
            or (not callable(debounce_for) and max_wait < debounce_for)):
        raise InvalidJobConfiguration(
            f"{label}: max_wait = {max_wait!r} must be a number of seconds no smaller than "
            f"debounce_for ({debounce_for!r}){not_finite(max_wait)}.")
    fields = _key_options(label, "debounce", given, signature)
    return DebounceOptions(label=label, signature=signature,
                           debounce_for=_seconds_or_function(debounce_for),
                           max_wait=None if max_wait is None else _seconds_or_function(max_wait),
                           debounce_on=fields, debounce_id=given.get("debounce_id"),
                           debounce_via=given.get("debounce_via"))


@dataclass(frozen=True, kw_only=True)
class ThrottleOptions:
    """What ``@throttled(...)`` was given, checked (T1-T3)."""

    label: str
    signature: inspect.Signature
    concurrency: Any = None  # T2: runs of one throttle key at once (L1: or a function)
    throttle: Any = None  # T3: "K/s", "K/m", "K/h" (L1: or a function of the call)
    throttle_on: tuple[str, ...] | None = None
    throttle_id: Callable[..., Any] | None = None
    throttle_via: str | Callable[[], str] | None = None

    kind_label = "throttled (Django task)"

    def store_alias(self) -> str:
        via = self.throttle_via() if callable(self.throttle_via) else self.throttle_via
        return str(via) if via else app_settings.STORE

    def store(self) -> BaseStore:
        return get_store(self.store_alias())

    def key(self, args: Sequence[Any], kwargs: dict[str, Any],
            store: BaseStore) -> keys.JobKey:
        """T1: ``throttle_id()``, else the ``throttle_on`` arguments, else the task alone
        (one limit for the task)."""
        if self.throttle_id is None and not self.throttle_on:
            return keys.build_key("throttle", self.label, self.label)
        return call_key("throttle", self.label, self.signature, self.throttle_id,
                        self.throttle_on, args, kwargs, store)


def checked_throttle(label: str, signature: inspect.Signature,
                     given: dict[str, Any]) -> ThrottleOptions:
    """The options of ``@throttled(...)``, or InvalidJobConfiguration naming the value."""
    from dedup_jobs.engine.throttle import concurrency_problem, rate_problem

    _known(label, "throttled", given,
           {"concurrency", "throttle", "throttle_on", "throttle_id", "throttle_via"})
    concurrency, throttle = given.get("concurrency"), given.get("throttle")
    if concurrency is None and throttle is None:
        raise InvalidJobConfiguration(
            f"{label}: @throttled() needs concurrency=N (runs at once) or throttle='K/s' "
            f"(starts per second, minute or hour), or both.")
    for problem in (concurrency_problem(concurrency), rate_problem(throttle)):
        if problem:
            raise InvalidJobConfiguration(f"{label}: {problem}")
    fields = _key_options(label, "throttle", given, signature)
    return ThrottleOptions(label=label, signature=signature, concurrency=concurrency,
                           throttle=throttle, throttle_on=fields,
                           throttle_id=given.get("throttle_id"),
                           throttle_via=given.get("throttle_via"))


def _seconds_or_function(value: Any) -> Any:
    return value if callable(value) else float(value)
