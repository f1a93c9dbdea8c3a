"""The stored call of a debounce burst is kombu's JSON of it, byte for byte, whatever it
holds (encode_call keeps one encoder instead of kombu's dumps building one per call)."""

from __future__ import annotations

import datetime
import decimal
import uuid
from typing import Any

import pytest
from kombu.utils.json import dumps

from dedup_jobs.stores.answers import decode_call, encode_call

CALLS: list[tuple[Any, Any, Any]] = [
    ((), None, None),
    ((1, "two", 3.5, None, True), {"x": [1, {"y": "é\u2028"}]}, None),
    ((datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
      datetime.date(2026, 1, 2)),
     {"d": decimal.Decimal("1.10"), "u": uuid.UUID(int=7), "b": b"\xff\x00", "s": b"text"},
     None),
    ([1], {}, [{"task": "t", "args": [2], "options": {"k": float("inf")}}]),
]


@pytest.mark.parametrize(("args", "kwargs", "chain"), CALLS)
def test_same_text_as_kombu(args: Any, kwargs: Any, chain: Any) -> None:
    call = [list(args or ()), dict(kwargs or {})] + ([list(chain)] if chain else [])
    text = encode_call(args, kwargs, chain)
    assert text == dumps(call)
    decoded, decoded_kwargs = decode_call(text)
    assert list(decoded) == list(decode_call(dumps(call))[0])
    assert decoded_kwargs == decode_call(dumps(call))[1]


def test_unencodable_raises_as_kombu_does() -> None:
    with pytest.raises(TypeError):
        dumps([[object()], {}])
    with pytest.raises(TypeError):
        encode_call((object(),), None)
