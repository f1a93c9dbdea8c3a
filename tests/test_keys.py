"""Keys: {KEY_PREFIX}:unique:{task name}:{unique id}, bound arguments, hashing."""

from __future__ import annotations

import datetime
from collections.abc import Callable

import pytest
from django.test import override_settings

from dedup_jobs.keys import MAX_ID_LENGTH, build_key
from tests import jobs


def test_positional_and_keyword_calls_share_a_key() -> None:
    """Section 1: the default key binds arguments to run's signature, defaults applied."""
    task = jobs.unique_sleep
    assert task.job_key((1,), {}) == task.job_key((), {"item": 1})
    assert task.job_key((1,), {}) == task.job_key((1, 0.0), {})
    assert task.job_key((1,), {}).key == "dedup_jobs:unique:tests.unique_sleep:item=1,seconds=0.0"
    assert task.job_key((1,), {}) != task.job_key((2,), {})


def test_unique_on_keeps_only_named_arguments() -> None:
    """Section 1: unique_on names the arguments that form the key."""
    task = jobs.unique_add
    assert task.job_key((1, 2), {}) == task.job_key((1,), {"b": 99})
    assert task.job_key((1, 2), {}).key.endswith(":a=1")


def test_unique_id_hook_overrides_unique_on() -> None:
    """Section 1: unique_id() gives the id part of the key."""
    task = jobs.RecalculateInvoice()
    assert task.job_key((5,), {"note": "x"}).key == (
        "dedup_jobs:unique:tests.recalculate_invoice:invoice-5"
    )


def test_key_prefix_setting() -> None:
    """Section 1: KEY_PREFIX is the first part of every key."""
    with override_settings(DEDUP_JOBS={"KEY_PREFIX": "shop"}):
        assert jobs.unique_sleep.job_key((1,), {}).key.startswith("shop:unique:tests.unique_sleep:")


def test_long_ids_are_hashed_stably_and_stay_readable() -> None:
    """Section 1: an id longer than 200 characters is replaced by a stable hash; the readable
    form is kept for the admin."""
    long_id = "x" * (MAX_ID_LENGTH + 1)
    first, second = build_key("unique", "t", long_id), build_key("unique", "t", long_id)
    assert first.key == second.key
    assert long_id not in first.key
    assert first.key.startswith("dedup_jobs:unique:t:sha256-")
    assert first.ident == long_id
    assert build_key("unique", "t", "x" * MAX_ID_LENGTH).key.endswith("x" * MAX_ID_LENGTH)
    assert build_key("unique", "t", long_id + "y").key != first.key


def test_non_serialisable_argument_names_the_argument() -> None:
    """Section 1: a non-serialisable argument gives a TypeError naming the argument and
    pointing to unique_id()."""
    with pytest.raises(TypeError) as info:
        jobs.unique_sleep.job_key((object(),), {})
    message = str(info.value)
    assert "'item'" in message
    assert "unique_id()" in message


def test_non_serialisable_argument_is_raised_at_dispatch_with_nothing_published() -> None:
    """Section 1: the TypeError surfaces at delay(), before anything is locked or published."""
    with pytest.raises(TypeError, match="unique_id"):
        jobs.unique_sleep.delay(datetime.datetime(2026, 1, 1))


def test_arguments_that_do_not_fit_run_raise_type_error() -> None:
    """Dispatching with arguments run() does not take fails like calling it would."""
    with pytest.raises(TypeError):
        jobs.unique_sleep.job_key((1, 2, 3), {})


def _signature_kinds(a: object, b: object = 2, c: object = "x") -> None:
    return None


def _with_star(a: object, *rest: object, b: object = 2) -> None:
    return None


@pytest.mark.parametrize(
    ("func", "args", "fields"),
    [
        (_signature_kinds, (1,), None),
        (_signature_kinds, (1, 5), None),
        (_signature_kinds, (1, 5, "y"), None),
        (_signature_kinds, (1, 5, "y"), ("c", "a")),
        (_signature_kinds, (1,), ("c",)),
        (_signature_kinds, ({"k": [1, 2]},), ("a", "b")),
        (_with_star, (1, 2, 3), None),
        (_with_star, (1,), ("b", "a")),
    ],
)
def test_positional_calls_get_the_same_id_as_binding(
    func: Callable[..., None], args: tuple[object, ...], fields: tuple[str, ...] | None
) -> None:
    """The dispatch path builds the id of a positional-only call without binding the
    arguments: it must be exactly the id Signature.bind gives (and so the same as the call
    with keyword arguments)."""
    from dedup_jobs.keys import bind_arguments, default_id

    fast = default_id("t", func, args, {}, fields, "unique_id")
    bound = bind_arguments(func, args, None)
    names = list(fields) if fields else list(bound)
    by_binding = ",".join(f"{name}={json_value(bound[name])}" for name in names)
    assert fast == by_binding
    if func is _signature_kinds:
        as_keywords = dict(zip(("a", "b", "c"), args, strict=False))
        assert default_id("t", func, (), as_keywords, fields, "unique_id") == fast


def test_positional_calls_that_do_not_fit_still_raise() -> None:
    """Too few or too many positional arguments are not given an id by the fast path."""
    from dedup_jobs.keys import default_id

    with pytest.raises(TypeError):
        default_id("t", _signature_kinds, (), {}, None, "unique_id")
    with pytest.raises(TypeError):
        default_id("t", _signature_kinds, (1, 2, 3, 4), {}, None, "unique_id")


def json_value(value: object) -> str:
    import json

    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
