"""D8: the stored payload carries a chain link's later links; payloads stored before that
still decode; a chain remembered under a dispatch id comes back when the run records its
outcome over it, on the Redis result backend and on any other."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, states
from kombu.utils.json import dumps

from dedup_jobs.jobs.absorbed import SUCCESS, record_outcome, remember_chain
from dedup_jobs.stores.base import decode_call, encode_call

LINKS = [{"task": "tests.chain_step", "args": ["tail"], "options": {"task_id": "tail-id"}}]


def test_payload_of_a_chain_link_round_trips() -> None:
    """D8: encode_call keeps a chain link's later links with its arguments."""
    args, kwargs = decode_call(encode_call([1, "a"], {"b": 2}, LINKS))
    assert (args, kwargs, args.chain) == ((1, "a"), {"b": 2}, LINKS)


def test_payload_without_a_chain_decodes_as_before() -> None:
    """D8: a payload of two elements (written by an older version, or a plain dispatch)
    decodes to the same arguments with no chain; a plain dispatch's payload is unchanged."""
    old = dumps([[1], {"b": 2}])
    args, kwargs = decode_call(old)
    assert (args, kwargs, args.chain) == ((1,), {"b": 2}, None)
    assert encode_call([1], {"b": 2}) == old


@pytest.fixture
def memory_backend() -> Iterator[Any]:
    """A result backend that is not Redis (Celery's in-memory cache backend)."""
    app = Celery("payload-tests", backend="cache+memory://", set_as_current=False)
    yield app.backend


@pytest.mark.redis
def test_redis_backend_hands_back_remembered_chains(app: Any) -> None:
    """D8: on the Redis result backend the outcome's writes return the chains remembered
    under the ids they overwrite (no extra round trip), and the outcome is stored."""
    backend = app.backend
    remember_chain(backend, "d-1", LINKS)
    assert backend.get_task_meta("d-1")["status"] == states.PENDING
    found = record_outcome(backend, ["d-1", "d-2"], 5, SUCCESS)
    assert found == {"d-1": LINKS}
    assert [backend.get_task_meta(i)["result"] for i in ("d-1", "d-2")] == [5, 5]


def test_other_backends_hand_back_remembered_chains(memory_backend: Any) -> None:
    """D8: on a result backend other than Redis the same holds (one read per id)."""
    remember_chain(memory_backend, "d-1", LINKS)
    found = record_outcome(memory_backend, ["d-1", "d-2"], 5, SUCCESS)
    assert found == {"d-1": LINKS}
    assert memory_backend.get_task_meta("d-1")["result"] == 5


@pytest.mark.redis
def test_remembering_never_overwrites_a_result(app: Any, memory_backend: Any) -> None:
    """D8: a chain is remembered only under an id without a result (a re-sent frozen chain
    does not hide the result its head already has)."""
    for backend in (app.backend, memory_backend):
        backend.store_result("done", 1, SUCCESS)
        remember_chain(backend, "done", LINKS)
        assert backend.get_task_meta("done")["status"] == SUCCESS


def test_no_result_backend_remembers_nothing_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """D8/D4: without a result backend a chain dispatch remembers nothing and the run's
    outcome finds nothing, without a warning per dispatch or per id."""
    backend = Celery("no-results", set_as_current=False).backend
    with caplog.at_level("WARNING", logger="dedup_jobs"):
        remember_chain(backend, "d-1", LINKS)
        assert record_outcome(backend, ["d-1", "d-2"], 5, SUCCESS) == {}
    assert caplog.records == []
