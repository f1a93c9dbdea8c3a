"""Building the key of a dispatch: ``{KEY_PREFIX}:{kind}:{task name}:{id}``.

The default id binds the call's arguments to the signature of ``run`` (defaults applied), so
``f(1)`` and ``f(x=1)`` share a key. An id hook (``unique_id()``, ``debounce_id()``,
``throttle_id()``) returns a ``str`` or an ``int`` (:func:`hook_id`). An id longer than
``MAX_ID_LENGTH`` is replaced by a stable hash; the readable form travels beside it so the
admin can still show it.

Keys are unambiguous (A4): the task-name part holds no ``:`` (:func:`name_part` writes a
``:`` of the name as ``%3A`` and a ``%`` as ``%25``), so the first ``:`` after it ends the
name and everything after is the id, whatever the id holds. A name without ``:`` or ``%``
(every usual Celery task name) is written as it is: its keys are the keys it always had.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dedup_jobs.conf import app_settings

MAX_ID_LENGTH = 200
MAX_READABLE_LENGTH = 500


@dataclass(frozen=True, kw_only=True)
class JobKey:
    """Where one dispatch's lock or debounce state lives."""

    key: str  # the logical key, before the cache's own KEY_PREFIX/VERSION
    task_name: str
    ident: str  # the readable id (may be truncated for display)

    def as_header(self, via: str) -> dict[str, str]:
        return {"key": self.key, "task": self.task_name, "id": self.ident, "via": via}


@functools.lru_cache(maxsize=512)
def signature_of(func: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature``, computed once per function (or bound method) and reused."""
    return inspect.signature(func)


_MISSING = object()
_PLAIN_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD,)


@functools.lru_cache(maxsize=512)
def _plain_parameters(func: Callable[..., Any]) -> tuple[tuple[str, Any], ...] | None:
    """``(name, default)`` of every parameter when all of them can be passed by position or
    by name (the usual ``def run(self, a, b=1)``), else None (then ``Signature.bind`` does it)."""
    params = signature_of(func).parameters.values()
    if any(p.kind not in _PLAIN_KINDS for p in params):
        return None
    return tuple(
        (p.name, _MISSING if p.default is inspect.Parameter.empty else p.default) for p in params
    )


def bind_arguments(
    func: Callable[..., Any], args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The call's arguments by parameter name in signature order, defaults applied (raises
    TypeError if they do not fit the signature, like calling the function would)."""
    args = args or ()
    kwargs = kwargs or {}
    plain = _plain_parameters(func)
    if plain is not None and len(args) <= len(plain):
        # Fast path with the same result as Signature.bind. Anything it cannot vouch for
        # (a missing argument, an unknown or doubled keyword) goes to Signature.bind, which
        # raises the usual TypeError.
        arguments = dict(zip((name for name, _ in plain), args, strict=False))
        named = 0
        for name, default in plain[len(args) :]:
            if name in kwargs:
                named += 1
                arguments[name] = kwargs[name]
            elif default is _MISSING:
                break
            else:
                arguments[name] = default
        else:
            if named == len(kwargs):
                return arguments
    bound = signature_of(func).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


#: canonical JSON: sorted keys, no spaces, unicode kept (one encoder, built once)
_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_json_string: Callable[[str], str] = json.encoder.encode_basestring


def _encode(task_name: str, name: str, value: Any, hook: str) -> str:
    kind = type(value)
    if kind is int:  # exactly what the encoder writes, without its machinery
        return int.__repr__(value)
    if kind is str:
        return _json_string(value)
    try:
        return _JSON.encode(value)
    except (TypeError, ValueError) as exc:
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise TypeError(
            f"{task_name}: cannot build the key from argument {name!r} = {shown} "
            f"({type(value).__name__} is not JSON-serialisable). Define {hook}() on the job "
            f"to return a string id, or leave {name!r} out of its key fields."
        ) from exc


@functools.lru_cache(maxsize=512)
def _positional_plan(
    func: Callable[..., Any], fields: tuple[str, ...] | None
) -> tuple[int, int, tuple[tuple[str, int, Any], ...]] | None:
    """For a call with positional arguments only: (fewest arguments, most arguments, and
    per key field its name, position and default), or None when binding must do it."""
    plain = _plain_parameters(func)
    if plain is None:
        return None
    names = [name for name, _ in plain]
    wanted = fields or tuple(names)
    if any(name not in names for name in wanted):
        return None
    required = sum(1 for _, default in plain if default is _MISSING)
    at = {name: index for index, name in enumerate(names)}
    return required, len(plain), tuple((name, at[name], plain[at[name]][1]) for name in wanted)


def default_id(
    task_name: str,
    func: Callable[..., Any],
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    fields: Sequence[str] | None,
    hook: str,
) -> str:
    """``name=value`` pairs of the bound arguments (only ``fields`` when given), values as
    canonical JSON, joined with commas."""
    if not kwargs:
        # The usual dispatch, f.delay(a, b): no binding needed, the same id.
        args = args or ()
        plan = _positional_plan(func, tuple(fields) if fields else None)
        if plan is not None and plan[0] <= len(args) <= plan[1]:
            given = len(args)
            return ",".join([
                f"{name}={_encode(task_name, name, args[at] if at < given else default, hook)}"
                for name, at, default in plan[2]
            ])
    arguments = bind_arguments(func, args, kwargs)
    names = list(fields) if fields else list(arguments)
    return ",".join(f"{name}={_encode(task_name, name, arguments[name], hook)}" for name in names)


def fields_problem(option: str, fields: Any) -> str | None:
    """What is wrong with a ``unique_on`` / ``debounce_on`` / ``throttle_on`` value (a tuple
    or list of argument names), or None (None itself: every argument)."""
    if fields is None:
        return None
    if isinstance(fields, tuple | list) and all(isinstance(f, str) for f in fields):
        return None
    example = f"({fields!r},)" if isinstance(fields, str) else "('product_id',)"
    return (f"{option} = {fields!r} must be a tuple of argument names, e.g. {example} "
            f"(or None for every argument).")


def id_problem(ident: str) -> str | None:
    """Why no store can hold ``ident`` (ends with what to do), or None. PostgreSQL text
    refuses NUL; an unpaired surrogate (what ``os.fsdecode`` leaves for undecodable bytes)
    cannot be written as UTF-8 by any store, nor sent in a message header."""
    if "\x00" in ident:
        return (
            "holds a NUL character (U+0000): PostgreSQL text cannot store it, so no store "
            "accepts it. Return an id without NUL characters (strip them, or use a hash)."
        )
    if not ident.isascii():
        try:
            ident.encode("utf-8")
        except UnicodeEncodeError as exc:
            return (
                f"holds an unpaired surrogate ({ident[exc.start]!r} at position {exc.start}): "
                f"it is not valid text, so no store can write it. Decode the bytes it came "
                f"from properly (or pass them as a hex or base64 string)."
            )
    return None


#: what an id hook must return, for its error message (A4)
HOOK_TYPE_PROBLEM = (
    "is not a str or an int: an id hook must return one of those (None, bytes, floats, "
    "bools and other objects have no single text form, so two different values could "
    "share a key). Return a str (decode bytes, format the value) or an int."
)


def hook_id(value: Any) -> str | None:
    """The id text of what an id hook returned: a ``str`` as it is, an ``int`` (not a
    ``bool``) in decimal; None for anything else (the caller raises naming the hook)."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int.__repr__(value)
    return None


_ESCAPED = re.compile("%(25|3A)")


def name_part(task_name: str) -> str:
    """The task-name part of a key: the name as it is, unless it holds ``:`` or ``%``, which
    are written ``%3A`` and ``%25`` (so the part holds no ``:``, and no two names share it)."""
    if ":" in task_name or "%" in task_name:
        return task_name.replace("%", "%25").replace(":", "%3A")
    return task_name


def task_name_of(part: str) -> str:
    """The task name a key's task-name part was written from (:func:`name_part` undone)."""
    if "%" not in part:
        return part
    return _ESCAPED.sub(lambda found: ":" if found.group(1) == "3A" else "%", part)


#: a stored id that is a hash (keys.build_key); a short id of this form is hashed too, so
#: that it never shares a key with the long id whose hash it spells
_HASH_FORM = re.compile(r"sha256-[0-9a-f]{64}\Z")


def build_key(kind: str, task_name: str, ident: str) -> JobKey:
    ident = str(ident)
    stored = ident
    if len(ident) > MAX_ID_LENGTH or (ident[:7] == "sha256-" and _HASH_FORM.match(ident)):
        stored = "sha256-" + hashlib.sha256(ident.encode("utf-8")).hexdigest()
    readable = ident
    if len(ident) > MAX_READABLE_LENGTH:
        readable = ident[: MAX_READABLE_LENGTH - 1] + "…"
    # every usual task name is written as it is, without a call
    task_part = name_part(task_name) if ":" in task_name or "%" in task_name else task_name
    return JobKey(
        key=f"{app_settings.KEY_PREFIX}:{kind}:{task_part}:{stored}",
        task_name=task_name,
        ident=readable,
    )
